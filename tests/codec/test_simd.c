/*
 * test_simd.c: every SIMD path this CPU supports produces the scalar path's
 * bytes and floats bit for bit: gift_encode payloads (RNE and stochastic),
 * gift_decode and gift_decode_acc outputs, and the same error codes for
 * NaN/Inf input and bad payloads. Paths the CPU lacks are skipped (reported
 * on stderr); with only the scalar path the suite passes trivially.
 */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gift_codec.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"
#include "gift_test_time.h"

/* Input families: 0 varied, 1 smooth (uniform, mixed sign), 2 subnormal only,
 * 3 huge (~1e30 and up to FLT_MAX), 4 all zeros, 5 ties on the fp8 grid. */
#define N_KINDS 6
static void fill_kind(int kind, float *x, size_t n, uint64_t *s)
{
    switch (kind) {
    case 0:
        fill_varied(x, n, s);
        break;
    case 1:
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((rng_unit(s) - 0.5) * ldexp(1.0, (int)(i % 11) - 5));
        break;
    case 2:
        for (size_t i = 0; i < n; i++)
            x[i] = u2f((uint32_t)rng_next(s) & 0x807FFFFFu);
        break;
    case 3:
        for (size_t i = 0; i < n; i++)
            x[i] = rand_sign(s, (i % 5 == 0) ? FLT_MAX * (float)rng_unit(s)
                                             : 1e30f * (float)(0.5 + rng_unit(s)));
        break;
    case 4:
        for (size_t i = 0; i < n; i++)
            x[i] = (i % 3) ? 0.0f : -0.0f;
        break;
    default:
        for (size_t i = 0; i < n; i++)
            x[i] = (i % 32 == 0) ? 448.0f : (float)((int)(rng_next(s) % 4001) - 2000) * 0x1p-7f;
        break;
    }
}

static const gift_simd_t PATHS[] = {GIFT_SIMD_SCALAR, GIFT_SIMD_AVX2, GIFT_SIMD_AVX512};
#define N_PATHS 3

static int path_ok(gift_simd_t s)
{
    int rc = gift_simd_force(s);
    require_msg(rc == 0 || rc == GIFT_EINVAL, "gift_simd_force(%s) = %d", gift_simd_name(s), rc);
    return rc == 0;
}

static void force(gift_simd_t s)
{
    int rc = gift_simd_force(s);
    require_msg(rc == 0, "gift_simd_force(%s) = %d", gift_simd_name(s), rc);
    require_msg(gift_simd_active() == s, "active path %s after forcing %s",
                gift_simd_name(gift_simd_active()), gift_simd_name(s));
}

static void setup(void) {}

static void teardown(void)
{
    gift_simd_force(gift_simd_best());
}

static const struct {
    gift_format_t fmt;
    uint32_t block;
} COMBOS[] = {
    {GIFT_FMT_F32, 0},   {GIFT_FMT_BF16, 0},   {GIFT_FMT_NVFP4, 0},
    {GIFT_FMT_E4M3, 32}, {GIFT_FMT_E4M3, 128}, {GIFT_FMT_E4M3, 256},
    {GIFT_FMT_E5M2, 32}, {GIFT_FMT_E5M2, 128}, {GIFT_FMT_E5M2, 256},
};
#define N_COMBOS ((int)(sizeof COMBOS / sizeof COMBOS[0]))

/* Exact multiples of the SIMD groups (128 and 256 elements) as well: the
 * look-ahead of the nvfp4 encode ends exactly at the last full group. */
static const size_t NS[] = {1,   3,   15,  17,  31,  33,   63,   65,
                            127, 129, 256, 512, 768, 1023, 4097, 100003};
#define N_NS (sizeof NS / sizeof NS[0])

typedef struct outputs {
    uint8_t *payload;
    float *dec;
    float *acc;
    int rc_enc, rc_dec, rc_acc;
} outputs_t;

/* Runs encode (into a 0xA5-filled buffer), decode of ref_payload (or of the
 * own payload when ref_payload is NULL) and decode_acc on the current path. */
static void run_path(const gift_codec_params_t *p, const gift_layout_t *L, const float *x,
                     const float *acc0, const uint8_t *ref_payload, outputs_t *o)
{
    size_t n = L->n;
    memset(o->payload, 0xA5, L->total);
    o->rc_enc = gift_encode(p, x, n, o->payload, L->total);
    for (size_t i = 0; i < n; i++)
        o->dec[i] = u2f(0x7FC0BEEFu);
    memcpy(o->acc, acc0, sizeof(float) * n);
    o->rc_dec = gift_decode(p, ref_payload ? ref_payload : o->payload, L->total, n, o->dec);
    o->rc_acc = gift_decode_acc(p, ref_payload ? ref_payload : o->payload, L->total, n, o->acc);
}

static void outputs_alloc(outputs_t *o, const gift_layout_t *L)
{
    o->payload = malloc(L->total + 1);
    o->dec = malloc(sizeof(float) * (L->n + 1));
    o->acc = malloc(sizeof(float) * (L->n + 1));
}

static void outputs_free(outputs_t *o)
{
    free(o->payload);
    free(o->dec);
    free(o->acc);
}

static void compare(const char *what, gift_simd_t s, const gift_codec_params_t *p,
                    const gift_layout_t *L, const float *x, const outputs_t *ref,
                    const outputs_t *got)
{
    size_t n = L->n;
    require_msg(got->rc_enc == ref->rc_enc, "%s on %s: encode returned %d, scalar %d", what,
                gift_simd_name(s), got->rc_enc, ref->rc_enc);
    if (ref->rc_enc == 0 && memcmp(got->payload, ref->payload, L->total) != 0) {
        size_t off = 0;
        while (got->payload[off] == ref->payload[off])
            off++;
        if (off < L->scale_bytes)
            ck_abort_msg("%s on %s (%s, block %zu, sr %d, n %zu): payload byte %zu (scale section; "
                         "block %zu) got 0x%02x, scalar 0x%02x",
                         what, gift_simd_name(s), gift_format_name(p->fmt), L->block, p->stochastic,
                         n, off,
                         p->fmt == GIFT_FMT_NVFP4 ? (off < 4 ? (size_t)-1 : off - 4) : off / 4,
                         got->payload[off], ref->payload[off]);
        else if (off >= L->code_off && off < L->code_off + L->code_bytes) {
            size_t k = off - L->code_off;
            size_t el = p->fmt == GIFT_FMT_F32     ? k / 4
                        : p->fmt == GIFT_FMT_BF16  ? k / 2
                        : p->fmt == GIFT_FMT_NVFP4 ? 2 * k
                                                   : k;
            ck_abort_msg(
                "%s on %s (%s, block %zu, sr %d, n %zu): payload byte %zu (code of element "
                "%zu, x=%a) got 0x%02x, scalar 0x%02x",
                what, gift_simd_name(s), gift_format_name(p->fmt), L->block, p->stochastic, n, off,
                el, (double)x[el], got->payload[off], ref->payload[off]);
        } else
            ck_abort_msg("%s on %s (%s, n %zu): payload padding byte %zu got 0x%02x, scalar 0x%02x",
                         what, gift_simd_name(s), gift_format_name(p->fmt), n, off,
                         got->payload[off], ref->payload[off]);
    }
    require_msg(got->rc_dec == ref->rc_dec && got->rc_acc == ref->rc_acc,
                "%s on %s: decode %d / decode_acc %d, scalar %d / %d", what, gift_simd_name(s),
                got->rc_dec, got->rc_acc, ref->rc_dec, ref->rc_acc);
    for (size_t i = 0; i < n; i++) {
        require_msg(
            f2u(got->dec[i]) == f2u(ref->dec[i]),
            "%s on %s (%s, block %zu, n %zu): decode element %zu got %a (0x%08x), scalar %a "
            "(0x%08x)",
            what, gift_simd_name(s), gift_format_name(p->fmt), L->block, n, i, (double)got->dec[i],
            f2u(got->dec[i]), (double)ref->dec[i], f2u(ref->dec[i]));
        require_msg(f2u(got->acc[i]) == f2u(ref->acc[i]),
                    "%s on %s (%s, block %zu, n %zu): decode_acc element %zu got %a, scalar %a",
                    what, gift_simd_name(s), gift_format_name(p->fmt), L->block, n, i,
                    (double)got->acc[i], (double)ref->acc[i]);
    }
}

/* Every path, every input family, every length, RNE and SR. */
START_TEST(test_paths_identical)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    uint64_t s = 4242 + (uint64_t)_i;
    int tested[N_PATHS] = {0};
    double t0 = now_s();
    long cases = 0;

    for (size_t k = 0; k < N_NS; k++)
        for (int kind = 0; kind < N_KINDS; kind++)
            for (int sr = 0; sr < 2; sr++) {
                size_t n = NS[k];
                gift_codec_params_t p;
                gift_layout_t L;
                outputs_t ref, got;
                float *x = malloc(sizeof(float) * n), *acc0 = malloc(sizeof(float) * n);
                char what[64];

                memset(&p, 0, sizeof p);
                p.fmt = fmt;
                p.block = block;
                p.stochastic = sr;
                p.sr.seed = 77;
                p.sr.rank = 5;
                p.sr.key = (uint32_t)k;
                p.sr.chunk = (uint32_t)kind;
                p.sr.step = 3;
                require_msg(gift_layout(&p, n, &L) == 0, "layout");
                fill_kind(kind, x, n, &s);
                for (size_t i = 0; i < n; i++)
                    acc0[i] = (float)(rng_unit(&s) * 2.0 - 1.0);
                outputs_alloc(&ref, &L);
                outputs_alloc(&got, &L);
                snprintf(what, sizeof what, "input family %d", kind);

                force(GIFT_SIMD_SCALAR);
                run_path(&p, &L, x, acc0, NULL, &ref);
                require_msg(ref.rc_enc == 0 && ref.rc_dec == 0 && ref.rc_acc == 0,
                            "scalar: %s n %zu family %d: encode %d decode %d acc %d",
                            gift_format_name(fmt), n, kind, ref.rc_enc, ref.rc_dec, ref.rc_acc);
                for (int pi = 0; pi < N_PATHS; pi++) {
                    if (!path_ok(PATHS[pi]))
                        continue;
                    tested[pi] = 1;
                    force(PATHS[pi]);
                    run_path(&p, &L, x, acc0, ref.payload, &got);
                    compare(what, PATHS[pi], &p, &L, x, &ref, &got);
                    /* and the path's own payload decodes the same (it is equal) */
                    cases++;
                }
                outputs_free(&ref);
                outputs_free(&got);
                free(x);
                free(acc0);
            }
    fprintf(stderr, "%s block %u: paths", gift_format_name(fmt), block);
    for (int pi = 0; pi < N_PATHS; pi++)
        if (tested[pi])
            fprintf(stderr, " %s", gift_simd_name(PATHS[pi]));
    fprintf(stderr, ": %ld cases in %.2f s\n", cases, now_s() - t0);
}
END_TEST

/* Decode of arbitrary valid payloads (every code, random finite scales,
 * including zero and subnormal scales) on every path. */
START_TEST(test_decode_random_payloads)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    uint64_t s = 99 + (uint64_t)_i;

    for (size_t k = 0; k < N_NS; k++) {
        size_t n = NS[k];
        gift_codec_params_t p;
        gift_layout_t L;
        uint8_t *pl;
        float *ref, *got, *acc0, *refacc, *gotacc;

        memset(&p, 0, sizeof p);
        p.fmt = fmt;
        p.block = block;
        require_msg(gift_layout(&p, n, &L) == 0, "layout");
        pl = calloc(1, L.total);
        ref = malloc(sizeof(float) * n);
        got = malloc(sizeof(float) * n);
        acc0 = malloc(sizeof(float) * n);
        refacc = malloc(sizeof(float) * n);
        gotacc = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++)
            acc0[i] = (float)(rng_unit(&s) - 0.5);
        /* scales */
        if (fmt == GIFT_FMT_E4M3 || fmt == GIFT_FMT_E5M2) {
            for (size_t b = 0; b < L.nblocks; b++) {
                uint64_t r = rng_next(&s);
                float sc = (r % 7 == 0) ? 0.0f
                           : (r % 7 == 1)
                               ? u2f((uint32_t)(r >> 8) & 0x7FFFFFu)
                               : mkf(0, (int)((r >> 8) % 200) - 100, (uint32_t)(r >> 20));
                memcpy(pl + 4 * b, &sc, 4);
            }
        } else if (fmt == GIFT_FMT_NVFP4) {
            float st = mkf(0, (int)(rng_next(&s) % 60) - 30, (uint32_t)rng_next(&s));
            memcpy(pl, &st, 4);
            for (size_t b = 0; b < L.nblocks; b++)
                pl[4 + b] = (uint8_t)(rng_next(&s) % 0x7F);
        }
        /* codes */
        for (size_t i = 0; i < L.code_bytes; i++) {
            uint8_t c = (uint8_t)rng_next(&s);
            if (fmt == GIFT_FMT_E4M3 && (c & 0x7F) == 0x7F)
                c &= 0xFE;
            if (fmt == GIFT_FMT_E5M2 && (c & 0x7C) == 0x7C)
                c &= 0xFB;
            pl[L.code_off + i] = c;
        }
        if (fmt == GIFT_FMT_BF16)
            for (size_t i = 0; i < n; i++)
                if ((pl[L.code_off + 2 * i + 1] & 0x7F) == 0x7F && (pl[L.code_off + 2 * i] & 0x80))
                    pl[L.code_off + 2 * i + 1] &= 0xFE;
        if (fmt == GIFT_FMT_F32)
            for (size_t i = 0; i < n; i++) {
                float v = mkf((int)(rng_next(&s) & 1), (int)(rng_next(&s) % 254) - 126,
                              (uint32_t)rng_next(&s));
                memcpy(pl + L.code_off + 4 * i, &v, 4);
            }

        force(GIFT_SIMD_SCALAR);
        memcpy(refacc, acc0, sizeof(float) * n);
        require_msg(gift_decode(&p, pl, L.total, n, ref) == 0,
                    "scalar decode of a valid random payload failed (%s n %zu)",
                    gift_format_name(fmt), n);
        require_msg(gift_decode_acc(&p, pl, L.total, n, refacc) == 0, "scalar decode_acc failed");
        for (int pi = 1; pi < N_PATHS; pi++) {
            int rc1, rc2;
            if (!path_ok(PATHS[pi]))
                continue;
            force(PATHS[pi]);
            memcpy(gotacc, acc0, sizeof(float) * n);
            rc1 = gift_decode(&p, pl, L.total, n, got);
            rc2 = gift_decode_acc(&p, pl, L.total, n, gotacc);
            require_msg(rc1 == 0 && rc2 == 0, "%s: decode %d decode_acc %d",
                        gift_simd_name(PATHS[pi]), rc1, rc2);
            for (size_t i = 0; i < n; i++) {
                require_msg(f2u(got[i]) == f2u(ref[i]),
                            "%s %s block %u n %zu: random payload element %zu got %a, scalar %a",
                            gift_simd_name(PATHS[pi]), gift_format_name(fmt), block, n, i,
                            (double)got[i], (double)ref[i]);
                require_msg(f2u(gotacc[i]) == f2u(refacc[i]),
                            "%s %s n %zu: random payload decode_acc element %zu got %a, scalar %a",
                            gift_simd_name(PATHS[pi]), gift_format_name(fmt), n, i,
                            (double)gotacc[i], (double)refacc[i]);
            }
        }
        free(pl);
        free(ref);
        free(got);
        free(acc0);
        free(refacc);
        free(gotacc);
    }
}
END_TEST

/* NaN/Inf anywhere in the input: every path returns GIFT_ENONFINITE. */
START_TEST(test_nonfinite_same)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    const float bad[] = {NAN, INFINITY, -INFINITY, u2f(0xFF800001u)};
    uint64_t s = 7;

    for (size_t k = 0; k < N_NS; k++)
        for (int sr = 0; sr < 2; sr++) {
            size_t n = NS[k];
            gift_codec_params_t p;
            gift_layout_t L;
            float *x = malloc(sizeof(float) * n);
            uint8_t *pl;
            size_t pos[] = {
                0, n / 2, n - 1, n > 8 ? n - 8 : 0, n > 16 ? 16 : 0, n > 33 ? 33 : n - 1};

            memset(&p, 0, sizeof p);
            p.fmt = fmt;
            p.block = block;
            p.stochastic = sr;
            require_msg(gift_layout(&p, n, &L) == 0, "layout");
            pl = malloc(L.total);
            for (size_t j = 0; j < sizeof pos / sizeof pos[0]; j++)
                for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                    fill_varied(x, n, &s);
                    x[pos[j]] = bad[b];
                    for (int pi = 0; pi < N_PATHS; pi++) {
                        int rc;
                        if (!path_ok(PATHS[pi]))
                            continue;
                        force(PATHS[pi]);
                        rc = gift_encode(&p, x, n, pl, L.total);
                        require_msg(rc == GIFT_ENONFINITE,
                                    "%s: %s sr %d n %zu, x[%zu] = %a: encode returned %d, expected "
                                    "GIFT_ENONFINITE",
                                    gift_simd_name(PATHS[pi]), gift_format_name(fmt), sr, n, pos[j],
                                    (double)bad[b], rc);
                    }
                }
            free(pl);
            free(x);
        }
}
END_TEST

/* A NaN/Inf code or a bad scale: every path returns GIFT_EBADCODE and leaves
 * out and acc untouched. */
START_TEST(test_badcode_same)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    uint64_t s = 13;

    for (size_t k = 0; k < N_NS; k++) {
        size_t n = NS[k];
        gift_codec_params_t p;
        gift_layout_t L;
        float *x = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
        uint8_t *pl, *bad;
        size_t pos[] = {0, n / 2, n - 1, n > 8 ? n - 8 : 0, n > 33 ? 33 : n - 1};

        memset(&p, 0, sizeof p);
        p.fmt = fmt;
        p.block = block;
        require_msg(gift_layout(&p, n, &L) == 0, "layout");
        pl = malloc(L.total);
        bad = malloc(L.total);
        fill_kind(1, x, n, &s);
        force(GIFT_SIMD_SCALAR);
        require_msg(gift_encode(&p, x, n, pl, L.total) == 0, "encode");
        for (size_t j = 0; j < sizeof pos / sizeof pos[0]; j++)
            for (int variant = 0; variant < 2; variant++) {
                memcpy(bad, pl, L.total);
                switch (fmt) {
                case GIFT_FMT_F32: {
                    float v = variant ? -INFINITY : NAN;
                    memcpy(bad + L.code_off + 4 * pos[j], &v, 4);
                    break;
                }
                case GIFT_FMT_BF16: {
                    uint16_t c = variant ? 0x7F80 : 0xFFC1;
                    memcpy(bad + L.code_off + 2 * pos[j], &c, 2);
                    break;
                }
                case GIFT_FMT_E4M3:
                    if (variant) {
                        float sc = NAN;
                        memcpy(bad + 4 * (pos[j] / L.block), &sc, 4);
                    } else
                        bad[L.code_off + pos[j]] = 0xFF;
                    break;
                case GIFT_FMT_E5M2:
                    if (variant) {
                        float sc = -1.0f;
                        memcpy(bad + 4 * (pos[j] / L.block), &sc, 4);
                    } else
                        bad[L.code_off + pos[j]] = (pos[j] & 1) ? 0x7C : 0xFE;
                    break;
                default:
                    bad[4 + pos[j] / 16] = variant ? 0xFF : 0x7F;
                    break;
                }
                for (int pi = 0; pi < N_PATHS; pi++) {
                    int rc;
                    if (!path_ok(PATHS[pi]))
                        continue;
                    force(PATHS[pi]);
                    for (size_t i = 0; i < n; i++)
                        out[i] = 1.5f;
                    rc = gift_decode(&p, bad, L.total, n, out);
                    require_msg(rc == GIFT_EBADCODE,
                                "%s: %s n %zu, bad byte for element %zu: decode %d",
                                gift_simd_name(PATHS[pi]), gift_format_name(fmt), n, pos[j], rc);
                    rc = gift_decode_acc(&p, bad, L.total, n, out);
                    require_msg(rc == GIFT_EBADCODE, "%s: %s n %zu, element %zu: decode_acc %d",
                                gift_simd_name(PATHS[pi]), gift_format_name(fmt), n, pos[j], rc);
                    for (size_t i = 0; i < n; i++)
                        require_msg(out[i] == 1.5f, "%s: %s bad payload: out[%zu] written (%a)",
                                    gift_simd_name(PATHS[pi]), gift_format_name(fmt), i,
                                    (double)out[i]);
                }
            }
        free(pl);
        free(bad);
        free(x);
        free(out);
    }
}
END_TEST

/* Unaligned input and output pointers (the SIMD loads/stores must not assume
 * alignment): same bytes and floats as the scalar path. */
START_TEST(test_unaligned)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    size_t n = 4097;
    uint64_t s = 31;
    gift_codec_params_t p;
    gift_layout_t L;
    float *xbuf = malloc(sizeof(float) * (n + 4)), *x = xbuf + 1;
    float *ref = malloc(sizeof(float) * n), *obuf = malloc(sizeof(float) * (n + 4)),
          *out = obuf + 3;
    uint8_t *refpl, *pl;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    p.block = block;
    require_msg(gift_layout(&p, n, &L) == 0, "layout");
    refpl = malloc(L.total);
    pl = malloc(L.total);
    fill_varied(x, n, &s);
    force(GIFT_SIMD_SCALAR);
    require_msg(gift_encode(&p, x, n, refpl, L.total) == 0, "encode");
    require_msg(gift_decode(&p, refpl, L.total, n, ref) == 0, "decode");
    for (int pi = 1; pi < N_PATHS; pi++) {
        if (!path_ok(PATHS[pi]))
            continue;
        force(PATHS[pi]);
        require_msg(gift_encode(&p, x, n, pl, L.total) == 0, "encode");
        require_msg(memcmp(pl, refpl, L.total) == 0, "%s: unaligned input gives other bytes",
                    gift_simd_name(PATHS[pi]));
        require_msg(gift_decode(&p, pl, L.total, n, out) == 0, "decode");
        for (size_t i = 0; i < n; i++)
            require_msg(f2u(out[i]) == f2u(ref[i]), "%s: unaligned decode element %zu: %a vs %a",
                        gift_simd_name(PATHS[pi]), i, (double)out[i], (double)ref[i]);
    }
    free(xbuf);
    free(ref);
    free(obuf);
    free(refpl);
    free(pl);
}
END_TEST

/* A value near the format's grid, unscaled: an exact code, a midpoint of two
 * neighbouring codes within 2 ulps, or a log-uniform value up to the max. */
static float grid_value(gift_format_t fmt, uint64_t *s)
{
    uint64_t r = rng_next(s);
    uint32_t maxc = fmt == GIFT_FMT_E4M3    ? 0x7E
                    : fmt == GIFT_FMT_E5M2  ? 0x7B
                    : fmt == GIFT_FMT_NVFP4 ? 7
                                            : 0x7F7F;
    float fmax = fmt == GIFT_FMT_E4M3    ? 448.0f
                 : fmt == GIFT_FMT_E5M2  ? 57344.0f
                 : fmt == GIFT_FMT_NVFP4 ? 6.0f
                                         : FLT_MAX;
    uint32_t c = (uint32_t)((r >> 8) % maxc);
    float v0, v1, v;
    switch (fmt) {
    case GIFT_FMT_E4M3:
        v0 = gift_e4m3_to_f32((uint8_t)c);
        v1 = gift_e4m3_to_f32((uint8_t)(c + 1));
        break;
    case GIFT_FMT_E5M2:
        v0 = gift_e5m2_to_f32((uint8_t)c);
        v1 = gift_e5m2_to_f32((uint8_t)(c + 1));
        break;
    case GIFT_FMT_NVFP4:
        v0 = gift_e2m1_to_f32((uint8_t)c);
        v1 = gift_e2m1_to_f32((uint8_t)(c + 1));
        break;
    default:
        v0 = gift_bf16_to_f32((uint16_t)c);
        v1 = gift_bf16_to_f32((uint16_t)(c + 1));
        break;
    }
    switch (r & 3) {
    case 0:
        v = v0;
        break;
    case 1: {
        int k = (int)((r >> 2) & 7) - 3;
        v = (float)(0.5 * ((double)v0 + (double)v1));
        for (; k < 0; k++)
            v = nextafterf(v, 0.0f);
        for (; k > 0; k--)
            v = nextafterf(v, INFINITY);
        break;
    }
    case 2:
        v = (float)((double)fmax * ldexp(rng_unit(s), -(int)((r >> 40) % 24)));
        break;
    default: {
        uint32_t u;
        do
            u = (uint32_t)rng_next(s) & 0x7FFFFFFFu;
        while (u >= 0x7F800000u || u2f(u) > fmax);
        v = u2f(u);
        break;
    }
    }
    return (r & 4) ? -v : v;
}

/* Millions of values around every code and tie, encoded where the scale is
 * exactly 1 (fp8 blocks led by FMAX; nvfp4 tensor amax 2688, blocks led by 6),
 * so the SIMD conversion meets every rounding case of the scalar one. */
START_TEST(test_cvt_sweep)
{
    static const gift_format_t fmts[] = {GIFT_FMT_E4M3, GIFT_FMT_E5M2, GIFT_FMT_NVFP4,
                                         GIFT_FMT_BF16};
    gift_format_t fmt = fmts[_i];
    size_t n = (1u << 16) + 5;
    uint64_t s = 2718 + (uint64_t)_i;
    gift_codec_params_t p;
    gift_layout_t L;
    float *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n);
    uint8_t *refpl, *pl;
    int rounds = 16;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    require_msg(gift_layout(&p, n, &L) == 0, "layout");
    refpl = malloc(L.total);
    pl = malloc(L.total);
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < n; i++) {
            if ((fmt == GIFT_FMT_E4M3 || fmt == GIFT_FMT_E5M2) && i % 128 == 0)
                x[i] = fmt == GIFT_FMT_E4M3 ? 448.0f : -57344.0f;
            else if (fmt == GIFT_FMT_NVFP4 && i % 16 == 0)
                x[i] = i == 0 ? 2688.0f : 6.0f;
            else
                x[i] = grid_value(fmt, &s);
        }
        p.stochastic = round & 1;
        p.sr.step = (uint64_t)round;
        force(GIFT_SIMD_SCALAR);
        require_msg(gift_encode(&p, x, n, refpl, L.total) == 0, "scalar encode");
        require_msg(gift_decode(&p, refpl, L.total, n, ref) == 0, "scalar decode");
        for (int pi = 1; pi < N_PATHS; pi++) {
            if (!path_ok(PATHS[pi]))
                continue;
            force(PATHS[pi]);
            require_msg(gift_encode(&p, x, n, pl, L.total) == 0, "encode");
            if (memcmp(pl, refpl, L.total) != 0) {
                size_t off = 0, el;
                while (pl[off] == refpl[off])
                    off++;
                el = off < L.code_off ? 0
                                      : (off - L.code_off) / (fmt == GIFT_FMT_BF16 ? 2 : 1) *
                                            (fmt == GIFT_FMT_NVFP4 ? 2 : 1);
                ck_abort_msg(
                    "%s %s sr %d: byte %zu got 0x%02x, scalar 0x%02x (element ~%zu, x=%a, x+1=%a)",
                    gift_simd_name(PATHS[pi]), gift_format_name(fmt), p.stochastic, off, pl[off],
                    refpl[off], el, el < n ? (double)x[el] : 0.0,
                    el + 1 < n ? (double)x[el + 1] : 0.0);
            }
            require_msg(gift_decode(&p, pl, L.total, n, got) == 0, "decode");
            for (size_t i = 0; i < n; i++)
                require_msg(f2u(got[i]) == f2u(ref[i]),
                            "%s %s: decode element %zu got %a, scalar %a",
                            gift_simd_name(PATHS[pi]), gift_format_name(fmt), i, (double)got[i],
                            (double)ref[i]);
        }
    }
    free(x);
    free(ref);
    free(got);
    free(refpl);
    free(pl);
}
END_TEST

START_TEST(test_force_restore)
{
    gift_simd_t best = gift_simd_best();
    ck_assert_int_eq(gift_simd_force(GIFT_SIMD_SCALAR), 0);
    ck_assert_int_eq(gift_simd_active(), GIFT_SIMD_SCALAR);
    ck_assert_int_eq(gift_simd_force(best), 0);
    ck_assert_msg(gift_simd_active() == best, "active %s, best %s",
                  gift_simd_name(gift_simd_active()), gift_simd_name(best));
    ck_assert_int_eq(gift_simd_force((gift_simd_t)7), GIFT_EINVAL);
    ck_assert_msg(gift_simd_active() == best, "a refused force changed the path to %s",
                  gift_simd_name(gift_simd_active()));
    for (int pi = 0; pi < N_PATHS; pi++)
        if (PATHS[pi] > best)
            ck_assert_msg(gift_simd_force(PATHS[pi]) == GIFT_EINVAL,
                          "%s forced beyond the best path %s", gift_simd_name(PATHS[pi]),
                          gift_simd_name(best));
}
END_TEST

static Suite *simd_suite(void)
{
    Suite *s = suite_create("codec_simd");
    TCase *tc = tcase_create("paths");

    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, test_paths_identical, 0, N_COMBOS);
    tcase_add_loop_test(tc, test_decode_random_payloads, 0, N_COMBOS);
    tcase_add_loop_test(tc, test_nonfinite_same, 0, N_COMBOS);
    tcase_add_loop_test(tc, test_badcode_same, 0, N_COMBOS);
    tcase_add_loop_test(tc, test_unaligned, 0, N_COMBOS);
    tcase_add_loop_test(tc, test_cvt_sweep, 0, 4);
    tcase_add_test(tc, test_force_restore);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed;
    double t0 = now_s();
    gift_simd_t best = gift_simd_best();

    fprintf(stderr, "SIMD paths on this CPU:");
    for (int pi = 0; pi < N_PATHS; pi++)
        if (gift_simd_force(PATHS[pi]) == 0)
            fprintf(stderr, " %s", gift_simd_name(PATHS[pi]));
    fprintf(stderr, " (best %s)\n", gift_simd_name(best));
    gift_simd_force(best);

    failed = gift_test_run(simd_suite(), CK_NORMAL);
    gift_simd_force(best);
    fprintf(stderr, "test_codec_simd: %.1f s\n", now_s() - t0);
    return failed != 0;
}
