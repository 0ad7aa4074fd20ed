/*
 * test_format.c: the number formats of gift_codec.h against independent
 * references written here from the format definitions (OCP 8-bit floating
 * point, NVIDIA E2M1/NVFP4, bfloat16), and, where the CUDA headers exist,
 * against CUDA's host conversions.
 *
 * The reference encoder does not use bit tricks: it enumerates every finite
 * code of a format, sorts them by value, finds the two neighbours of |x| by
 * binary search and compares |x| with their midpoint in double precision
 * (exact for these formats). Ties go to the code with an even mantissa LSB;
 * values above the largest finite code saturate to it.
 *
 * Block-level tests rebuild whole payloads from the arithmetic written in the
 * header comment of gift_codec.h and compare them byte for byte. They run on
 * the scalar path (the reference); test_simd.c compares the other paths with it.
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

#ifdef GIFT_HAVE_CUDA_FP_HEADERS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#pragma GCC diagnostic pop
#endif

/* ------------------------------------------------------------------ */
/* Small helpers                                                        */
/* ------------------------------------------------------------------ */

static size_t up64(size_t v)
{
    return (v + 63) / 64 * 64;
}

/* ------------------------------------------------------------------ */
/* Reference formats, from first principles                             */
/* ------------------------------------------------------------------ */

enum { SP_NONE = 0, SP_FN = 1, SP_IEEE = 2 };
enum { K_FINITE = 0, K_INF = 1, K_NAN = 2 };

typedef struct ref_fmt {
    const char *name;
    int ebits, mbits, bias, special;
    int n;           /* number of non-negative finite codes */
    double v[32768]; /* their values, ascending */
    uint32_t code[32768];
    uint32_t sign;     /* sign bit */
    double vmax;       /* largest finite value */
    uint32_t cmax;     /* its code */
    float fval[65536]; /* decoded value of every code (NaN/Inf included) */
    int kind[65536];
} ref_fmt_t;

static ref_fmt_t R_E4M3 = {"e4m3", 4, 3, 7, SP_FN, 0, {0}, {0}, 0, 0, 0, {0}, {0}};
static ref_fmt_t R_E5M2 = {"e5m2", 5, 2, 15, SP_IEEE, 0, {0}, {0}, 0, 0, 0, {0}, {0}};
static ref_fmt_t R_E2M1 = {"e2m1", 2, 1, 1, SP_NONE, 0, {0}, {0}, 0, 0, 0, {0}, {0}};
static ref_fmt_t R_BF16 = {"bf16", 8, 7, 127, SP_IEEE, 0, {0}, {0}, 0, 0, 0, {0}, {0}};

/* The value of code c: sign, biased exponent, mantissa; subnormals at e == 0. */
static double ref_value(const ref_fmt_t *t, uint32_t c, int *kind)
{
    uint32_t emask = (1u << t->ebits) - 1, mmask = (1u << t->mbits) - 1;
    uint32_t s = (c >> (t->ebits + t->mbits)) & 1u;
    uint32_t e = (c >> t->mbits) & emask, m = c & mmask;
    double v;

    *kind = K_FINITE;
    if (t->special == SP_FN && e == emask && m == mmask) {
        *kind = K_NAN;
        return NAN;
    }
    if (t->special == SP_IEEE && e == emask) {
        *kind = m ? K_NAN : K_INF;
        return m ? NAN : (s ? -INFINITY : INFINITY);
    }
    if (e == 0)
        v = ldexp((double)m, 1 - t->bias - t->mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -t->mbits), (int)e - t->bias);
    return s ? -v : v;
}

typedef struct vc {
    double v;
    uint32_t c;
} vc_t;

static int vc_cmp(const void *a, const void *b)
{
    const vc_t *x = a, *y = b;
    return (x->v > y->v) - (x->v < y->v);
}

static void ref_build(ref_fmt_t *t)
{
    int bits = 1 + t->ebits + t->mbits;
    uint32_t ncodes = 1u << bits;
    vc_t *tmp = malloc(sizeof(vc_t) * (ncodes / 2));
    int k = 0;

    t->sign = 1u << (bits - 1);
    for (uint32_t c = 0; c < ncodes; c++) {
        int kind;
        double v = ref_value(t, c, &kind);
        t->fval[c] = (float)v;
        t->kind[c] = kind;
        if (c < t->sign && kind == K_FINITE) {
            tmp[k].v = v;
            tmp[k].c = c;
            k++;
        }
    }
    qsort(tmp, (size_t)k, sizeof(vc_t), vc_cmp);
    for (int i = 0; i < k; i++) {
        t->v[i] = tmp[i].v;
        t->code[i] = tmp[i].c;
    }
    t->n = k;
    t->vmax = t->v[k - 1];
    t->cmax = t->code[k - 1];
    free(tmp);
}

/* RNE, ties to the even code, saturating; sign kept (a negative value that
 * rounds to zero gives the negative-zero code). */
static uint32_t ref_encode(const ref_fmt_t *t, float x)
{
    uint32_t s = signbit(x) ? t->sign : 0;
    double a = fabs((double)x), mid;
    int lo = 0, hi = t->n - 1;

    if (a >= t->vmax)
        return s | t->cmax;
    while (hi - lo > 1) {
        int m = (lo + hi) / 2;
        if (t->v[m] <= a)
            lo = m;
        else
            hi = m;
    }
    if (t->v[lo] == a)
        return s | t->code[lo];
    mid = 0.5 * (t->v[lo] + t->v[hi]);
    if (a < mid)
        return s | t->code[lo];
    if (a > mid)
        return s | t->code[hi];
    return s | ((t->code[lo] & 1u) == 0 ? t->code[lo] : t->code[hi]);
}

/* The codes just below and just above |x| (equal when x is a code; both the
 * max code above the max). Stochastic rounding must pick one of the two. */
static void ref_neighbours(const ref_fmt_t *t, float x, uint32_t *clo, uint32_t *chi)
{
    uint32_t s = signbit(x) ? t->sign : 0;
    double a = fabs((double)x);
    int lo = 0, hi = t->n - 1;

    if (a >= t->vmax) {
        *clo = *chi = s | t->cmax;
        return;
    }
    while (hi - lo > 1) {
        int m = (lo + hi) / 2;
        if (t->v[m] <= a)
            lo = m;
        else
            hi = m;
    }
    *clo = s | t->code[lo];
    *chi = (t->v[lo] == a) ? *clo : (s | t->code[hi]);
}

static void tables_init(void)
{
    ref_build(&R_E4M3);
    ref_build(&R_E5M2);
    ref_build(&R_E2M1);
    ref_build(&R_BF16);
}

static const ref_fmt_t *ref_of(gift_format_t fmt)
{
    switch (fmt) {
    case GIFT_FMT_BF16:
        return &R_BF16;
    case GIFT_FMT_E4M3:
        return &R_E4M3;
    case GIFT_FMT_E5M2:
        return &R_E5M2;
    case GIFT_FMT_NVFP4:
        return &R_E2M1;
    default:
        return NULL;
    }
}

/* Which blocks are stored as zero (gift_codec.h): a block whose scale (fp8
 * scale, nvfp4 s_t or eff) is below FLT_MIN. Subnormal scales are flushed so
 * that a GPU twin running with flush-to-zero produces the same bytes. The
 * reference below also knows the looser rule (only a non-finite inverse
 * flushes); ftz_scales = 0 selects it, for experiments. */
static int ftz_scales = 1;

static float fmax_of(gift_format_t fmt)
{
    return fmt == GIFT_FMT_E4M3 ? 448.0f : 57344.0f;
}

/* Fixture: the block-level tests pin the scalar (reference) path. */
static void setup_scalar(void)
{
    ck_assert_int_eq(gift_simd_force(GIFT_SIMD_SCALAR), 0);
}

static void teardown_best(void)
{
    gift_simd_force(gift_simd_best());
}

/* ------------------------------------------------------------------ */
/* Reference tables and decoders                                        */
/* ------------------------------------------------------------------ */

START_TEST(test_ref_tables_sane)
{
    require_msg(R_E4M3.n == 127 && R_E4M3.vmax == 448.0 && R_E4M3.cmax == 0x7E,
                "e4m3: %d finite codes, max %g (0x%02x)", R_E4M3.n, R_E4M3.vmax, R_E4M3.cmax);
    require_msg(R_E5M2.n == 124 && R_E5M2.vmax == 57344.0 && R_E5M2.cmax == 0x7B,
                "e5m2: %d finite codes, max %g (0x%02x)", R_E5M2.n, R_E5M2.vmax, R_E5M2.cmax);
    require_msg(R_E2M1.n == 8 && R_E2M1.vmax == 6.0 && R_E2M1.cmax == 7,
                "e2m1: %d finite codes, max %g", R_E2M1.n, R_E2M1.vmax);
    require_msg(R_BF16.n == 0x7F80 && R_BF16.cmax == 0x7F7F &&
                    R_BF16.vmax == ldexp(255.0 / 128.0, 127),
                "bf16: %d finite codes, max %g (0x%04x)", R_BF16.n, R_BF16.vmax, R_BF16.cmax);
    require_msg(R_E4M3.v[1] == ldexp(1.0, -9), "e4m3 min subnormal %g", R_E4M3.v[1]);
    require_msg(R_E5M2.v[1] == ldexp(1.0, -16), "e5m2 min subnormal %g", R_E5M2.v[1]);
    require_msg(R_BF16.v[1] == ldexp(1.0, -133), "bf16 min subnormal %g", R_BF16.v[1]);
    {
        static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
        for (int i = 0; i < 8; i++)
            require_msg(R_E2M1.v[i] == e2m1[i] && R_E2M1.code[i] == (uint32_t)i, "e2m1 code %d: %g",
                        i, R_E2M1.v[i]);
    }
    /* Sorted by value is the same as sorted by code for the positive half. */
    for (int i = 1; i < R_BF16.n; i++)
        require_msg(R_BF16.v[i] > R_BF16.v[i - 1], "bf16 table not strictly ascending at %d", i);
}
END_TEST

/* Compares a decoder's output for one code with the reference. */
static int decode_matches(const ref_fmt_t *t, uint32_t c, float got)
{
    if (t->kind[c] == K_NAN)
        return isnan(got);
    return f2u(got) == f2u(t->fval[c]);
}

START_TEST(test_decode_e4m3_all)
{
    for (uint32_t c = 0; c < 256; c++) {
        float g = gift_e4m3_to_f32((uint8_t)c);
        require_msg(decode_matches(&R_E4M3, c, g), "e4m3 0x%02x: got %a (0x%08x), expected %a", c,
                    (double)g, f2u(g), (double)R_E4M3.fval[c]);
    }
    require_msg(gift_e4m3_to_f32(0x7E) == 448.0f && gift_e4m3_to_f32(0xFE) == -448.0f, "e4m3 max");
    require_msg(isnan(gift_e4m3_to_f32(0x7F)) && isnan(gift_e4m3_to_f32(0xFF)), "e4m3 NaN codes");
    require_msg(gift_e4m3_to_f32(0x01) == 0x1p-9f, "e4m3 min subnormal");
    require_msg(gift_e4m3_to_f32(0x38) == 1.0f, "e4m3 one");
}
END_TEST

START_TEST(test_decode_e5m2_all)
{
    for (uint32_t c = 0; c < 256; c++) {
        float g = gift_e5m2_to_f32((uint8_t)c);
        require_msg(decode_matches(&R_E5M2, c, g), "e5m2 0x%02x: got %a (0x%08x), expected %a", c,
                    (double)g, f2u(g), (double)R_E5M2.fval[c]);
    }
    require_msg(gift_e5m2_to_f32(0x7B) == 57344.0f, "e5m2 max");
    require_msg(gift_e5m2_to_f32(0x7C) == INFINITY && gift_e5m2_to_f32(0xFC) == -INFINITY,
                "e5m2 inf");
    require_msg(gift_e5m2_to_f32(0x01) == 0x1p-16f, "e5m2 min subnormal");
    require_msg(gift_e5m2_to_f32(0x3C) == 1.0f, "e5m2 one");
}
END_TEST

START_TEST(test_decode_e2m1_all)
{
    static const float pos[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (uint32_t c = 0; c < 16; c++) {
        float e = (c & 8) ? -pos[c & 7] : pos[c & 7];
        for (uint32_t hi = 0; hi < 16; hi++) {
            float g = gift_e2m1_to_f32((uint8_t)(hi << 4 | c));
            require_msg(f2u(g) == f2u(e) && f2u(g) == f2u(R_E2M1.fval[c]),
                        "e2m1 byte 0x%02x: got %a, expected %a", hi << 4 | c, (double)g, (double)e);
        }
    }
}
END_TEST

START_TEST(test_decode_bf16_all)
{
    for (uint32_t c = 0; c < 65536; c++) {
        float g = gift_bf16_to_f32((uint16_t)c);
        require_msg(decode_matches(&R_BF16, c, g), "bf16 0x%04x: got %a (0x%08x), expected %a", c,
                    (double)g, f2u(g), (double)R_BF16.fval[c]);
        if (R_BF16.kind[c] != K_NAN)
            require_msg(f2u(g) == c << 16, "bf16 0x%04x: got 0x%08x", c, f2u(g));
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* Element encoders: lib vs reference vs CUDA                           */
/* ------------------------------------------------------------------ */

typedef uint32_t (*enc_fn)(float);
static uint32_t lib_e4m3(float x)
{
    return gift_f32_to_e4m3(x);
}
static uint32_t lib_e5m2(float x)
{
    return gift_f32_to_e5m2(x);
}
static uint32_t lib_e2m1(float x)
{
    return gift_f32_to_e2m1(x);
}
static uint32_t lib_bf16(float x)
{
    return gift_f32_to_bf16(x);
}

#ifdef GIFT_HAVE_CUDA_FP_HEADERS
static uint32_t cuda_e4m3(float x)
{
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
static uint32_t cuda_e5m2(float x)
{
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}
static uint32_t cuda_e2m1(float x)
{
    float2 f;
    f.x = x;
    f.y = 0.0f;
    return __nv_cvt_float2_to_fp4x2(f, __NV_E2M1, cudaRoundNearest) & 0xFu;
}
#endif

typedef struct conv {
    const ref_fmt_t *t;
    enc_fn lib;
    enc_fn cuda;  /* NULL when unavailable */
    int elo, ehi; /* binary exponent range that covers the format, with margin */
} conv_t;

static conv_t conv_get(int which)
{
    conv_t c = {NULL, NULL, NULL, 0, 0};
    switch (which) {
    case 0:
        c.t = &R_E4M3;
        c.lib = lib_e4m3;
        c.elo = -13;
        c.ehi = 10;
        break;
    case 1:
        c.t = &R_E5M2;
        c.lib = lib_e5m2;
        c.elo = -20;
        c.ehi = 17;
        break;
    case 2:
        c.t = &R_E2M1;
        c.lib = lib_e2m1;
        c.elo = -4;
        c.ehi = 4;
        break;
    default:
        c.t = &R_BF16;
        c.lib = lib_bf16;
        c.elo = -137;
        c.ehi = 127;
        break;
    }
#ifdef GIFT_HAVE_CUDA_FP_HEADERS
    if (which == 0)
        c.cuda = cuda_e4m3;
    if (which == 1)
        c.cuda = cuda_e5m2;
    if (which == 2)
        c.cuda = cuda_e2m1;
#endif
    return c;
}

typedef struct mism {
    long n_lib, n_cuda, n_cuda_lib;
    float x_lib, x_cuda;
    uint32_t lib_got, lib_exp, cuda_got, cuda_exp;
} mism_t;

static void check_one(const conv_t *c, float x, mism_t *m)
{
    uint32_t r = ref_encode(c->t, x), g = c->lib(x);
    if (g != r) {
        if (m->n_lib < 8)
            fprintf(stderr, "  %s: x=%a (%.9g): lib 0x%x, reference 0x%x\n", c->t->name, (double)x,
                    (double)x, g, r);
        if (m->n_lib++ == 0) {
            m->x_lib = x;
            m->lib_got = g;
            m->lib_exp = r;
        }
    }
    if (c->cuda) {
        uint32_t cu = c->cuda(x);
        if (cu != r) {
            if (m->n_cuda < 8)
                fprintf(stderr, "  %s: x=%a (%.9g): CUDA 0x%x, reference 0x%x, lib 0x%x\n",
                        c->t->name, (double)x, (double)x, cu, r, g);
            if (m->n_cuda++ == 0) {
                m->x_cuda = x;
                m->cuda_got = cu;
                m->cuda_exp = r;
            }
        }
        if (cu != g)
            m->n_cuda_lib++;
    }
}

static void report_mism(const conv_t *c, const mism_t *m, long total)
{
    require_msg(m->n_lib == 0,
                "%s: %ld of %ld encodes differ from the reference; first x=%a (%.9g): got 0x%x, "
                "expected 0x%x",
                c->t->name, m->n_lib, total, (double)m->x_lib, (double)m->x_lib, m->lib_got,
                m->lib_exp);
    require_msg(m->n_cuda == 0,
                "%s: CUDA host conversion differs from the reference in %ld of %ld; first x=%a: "
                "CUDA 0x%x, reference 0x%x",
                c->t->name, m->n_cuda, total, (double)m->x_cuda, m->cuda_got, m->cuda_exp);
}

/* Hand-checked codes: these pin the reference itself. */
START_TEST(test_encode_known_codes)
{
    static const struct {
        int which;
        float x;
        uint32_t code;
    } k[] = {
        {0, 1.0f, 0x38},          {0, 448.0f, 0x7E},
        {0, 464.0f, 0x7E},        {0, 1e30f, 0x7E},
        {0, -FLT_MAX, 0xFE},      {0, 0x1p-9f, 0x01},
        {0, 0x1p-10f, 0x00},      {0, 0x1.000002p-10f, 0x01},
        {0, -0x1p-10f, 0x80},     {0, 0x1.8p-9f, 0x02},
        {0, 1.0625f, 0x38},       {0, 1.1875f, 0x3A},
        {0, -0.0f, 0x80},         {0, 0.0f, 0x00},
        {0, 240.0f, 0x77},        {1, 1.0f, 0x3C},
        {1, 57344.0f, 0x7B},      {1, 65536.0f, 0x7B},
        {1, 1e30f, 0x7B},         {1, 0x1p-16f, 0x01},
        {1, 0x1p-17f, 0x00},      {1, -0x1.8p-16f, 0x82},
        {1, 1.125f, 0x3C},        {1, 1.375f, 0x3E},
        {2, 6.0f, 0x7},           {2, 5.0f, 0x6},
        {2, 0.25f, 0x0},          {2, 0.75f, 0x2},
        {2, 1.25f, 0x2},          {2, 1.75f, 0x4},
        {2, 2.5f, 0x4},           {2, 3.5f, 0x6},
        {2, 1e30f, 0x7},          {2, -6.5f, 0xF},
        {2, -0.1f, 0x8},          {2, 0.2500001f, 0x1},
        {3, 1.0f, 0x3F80},        {3, FLT_MAX, 0x7F7F},
        {3, -FLT_MAX, 0xFF7F},    {3, 1.00390625f, 0x3F80},
        {3, 1.01171875f, 0x3F82}, {3, 0x1p-133f, 0x0001},
        {3, 0x1p-134f, 0x0000},   {3, -0.0f, 0x8000},
        {3, 0x1p-149f, 0x0000},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        conv_t c = conv_get(k[i].which);
        uint32_t r = ref_encode(c.t, k[i].x), g = c.lib(k[i].x);
        require_msg(r == k[i].code, "reference %s(%a) = 0x%x, hand value 0x%x", c.t->name,
                    (double)k[i].x, r, k[i].code);
        require_msg(g == k[i].code, "gift_f32_to_%s(%a) = 0x%x, expected 0x%x", c.t->name,
                    (double)k[i].x, g, k[i].code);
        if (c.cuda)
            require_msg(c.cuda(k[i].x) == k[i].code, "CUDA %s(%a) = 0x%x, expected 0x%x", c.t->name,
                        (double)k[i].x, c.cuda(k[i].x), k[i].code);
    }
    require_msg((gift_f32_to_e2m1(-6.0f) & 0xF0u) == 0, "e2m1 code has bits above the nibble: 0x%x",
                gift_f32_to_e2m1(-6.0f));
}
END_TEST

/* Edge cases: every code, every midpoint and its neighbours, subnormal
 * boundaries, the max and beyond, both signs. */
START_TEST(test_encode_edges)
{
    conv_t c = conv_get(_i);
    const ref_fmt_t *t = c.t;
    mism_t m = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    long total = 0;
    float minsub = (float)t->v[1], half = 0.5f * minsub, maxf = (float)t->vmax;
    float past = (float)(t->vmax + 0.5 * (t->vmax - t->v[t->n - 2]));
    const float fixed[] = {0.0f,
                           minsub,
                           half,
                           nextafterf(half, INFINITY),
                           nextafterf(half, 0.0f),
                           0.25f * minsub,
                           1e-45f,
                           FLT_TRUE_MIN,
                           FLT_MIN,
                           maxf,
                           nextafterf(maxf, INFINITY),
                           nextafterf(maxf, 0.0f),
                           past,
                           nextafterf(past, 0.0f),
                           nextafterf(past, INFINITY),
                           2.0f * maxf,
                           1e30f,
                           FLT_MAX,
                           nextafterf(FLT_MAX, 0.0f),
                           1.0f,
                           (float)t->v[t->n / 2]};

    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        check_one(&c, fixed[i], &m);
        check_one(&c, -fixed[i], &m);
        total += 2;
    }
    for (int k = 0; k < t->n; k++) {
        float v = (float)t->v[k];
        float d[] = {v, nextafterf(v, 0.0f), nextafterf(v, INFINITY)};
        for (int j = 0; j < 3; j++) {
            check_one(&c, d[j], &m);
            check_one(&c, -d[j], &m);
            total += 2;
        }
        if (k + 1 < t->n) {
            float mid = (float)(0.5 * (t->v[k] + t->v[k + 1]));
            float e[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY),
                         nextafterf(nextafterf(mid, 0.0f), 0.0f),
                         nextafterf(nextafterf(mid, INFINITY), INFINITY)};
            require_msg((double)mid == 0.5 * (t->v[k] + t->v[k + 1]), "%s midpoint %d not exact",
                        t->name, k);
            for (int j = 0; j < 5; j++) {
                check_one(&c, e[j], &m);
                check_one(&c, -e[j], &m);
                total += 2;
            }
        }
    }
    report_mism(&c, &m, total);
}
END_TEST

/* 10 million random floats per format: a third random finite bit patterns,
 * a third log-uniform over the format's range (subnormals included), a third
 * within 3 ulps of a tie. */
#define N_RANDOM 10000000L
START_TEST(test_encode_random)
{
    conv_t c = conv_get(_i);
    const ref_fmt_t *t = c.t;
    mism_t m = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t s = 0x5EED0000ull + (uint64_t)_i;
    double t0 = now_s();

    for (long i = 0; i < N_RANDOM; i++) {
        float x;
        switch (i % 3) {
        case 0: {
            uint32_t u;
            do
                u = (uint32_t)rng_next(&s);
            while ((u & 0x7F800000u) == 0x7F800000u);
            x = u2f(u);
            break;
        }
        case 1: {
            uint64_t r = rng_next(&s);
            int e = c.elo + (int)((r >> 32) % (uint64_t)(c.ehi - c.elo + 1));
            x = (float)ldexp(1.0 + (double)(uint32_t)r * 0x1p-32, e);
            if (r & 0x80000000u)
                x = -x;
            break;
        }
        default: {
            uint64_t r = rng_next(&s);
            int k = (int)((r >> 8) % (uint64_t)(t->n - 1));
            int steps = (int)(r & 7) - 3;
            x = (float)(0.5 * (t->v[k] + t->v[k + 1]));
            for (; steps < 0; steps++)
                x = nextafterf(x, 0.0f);
            for (; steps > 0; steps--)
                x = nextafterf(x, INFINITY);
            if (r & 0x80000000u)
                x = -x;
            break;
        }
        }
        check_one(&c, x, &m);
    }
    fprintf(stderr, "encode_random %s: %ld values in %.2f s (CUDA reference %s; CUDA!=lib %ld)\n",
            t->name, N_RANDOM, now_s() - t0, c.cuda ? "on" : "off", m.n_cuda_lib);
    report_mism(&c, &m, N_RANDOM);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Block level: layout, payload bytes, decode                           */
/* ------------------------------------------------------------------ */

static void expect_layout(gift_format_t fmt, uint32_t block, size_t n, gift_layout_t *L)
{
    memset(L, 0, sizeof *L);
    L->n = n;
    switch (fmt) {
    case GIFT_FMT_F32:
        L->code_bytes = 4 * n;
        break;
    case GIFT_FMT_BF16:
        L->code_bytes = 2 * n;
        break;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        L->block = block ? block : 128;
        L->nblocks = (n + L->block - 1) / L->block;
        L->scale_bytes = 4 * L->nblocks;
        L->code_bytes = n;
        break;
    default:
        L->block = 16;
        L->nblocks = (n + 15) / 16;
        L->scale_bytes = 4 + L->nblocks;
        L->code_bytes = (n + 1) / 2;
        break;
    }
    L->scale_off = 0;
    L->code_off = up64(L->scale_bytes);
    L->total = up64(L->code_off + L->code_bytes);
}

static void assert_layout(const gift_codec_params_t *p, size_t n, gift_layout_t *got)
{
    gift_layout_t e;
    int rc = gift_layout(p, n, got);
    expect_layout(p->fmt, p->block, n, &e);
    require_msg(rc == 0, "gift_layout(%s, block %u, n %zu) = %d", gift_format_name(p->fmt),
                p->block, n, rc);
    require_msg(got->n == e.n && got->block == e.block && got->nblocks == e.nblocks &&
                    got->scale_off == e.scale_off && got->scale_bytes == e.scale_bytes &&
                    got->code_off == e.code_off && got->code_bytes == e.code_bytes &&
                    got->total == e.total,
                "layout %s block %u n %zu: got n %zu block %zu nblocks %zu scale_off %zu "
                "scale_bytes %zu code_off %zu code_bytes %zu total %zu; expected block %zu "
                "nblocks %zu scale_bytes %zu code_off %zu code_bytes %zu total %zu",
                gift_format_name(p->fmt), p->block, n, got->n, got->block, got->nblocks,
                got->scale_off, got->scale_bytes, got->code_off, got->code_bytes, got->total,
                e.block, e.nblocks, e.scale_bytes, e.code_off, e.code_bytes, e.total);
    require_msg(got->code_off % 64 == 0 && got->total % 64 == 0, "layout not 64-aligned");
}

/* The payload the header's arithmetic produces (RNE). buf holds L->total
 * zeroed bytes. *sb_free is set when the nvfp4 block scales are not defined
 * by the header (tensor scale * 6 == 0: an all-zero or ~1e-42 tensor); the
 * codes must then be zero and the block scale bytes are not compared. */
static void ref_payload(const gift_codec_params_t *p, const gift_layout_t *L, const float *x,
                        uint8_t *buf, int *sb_free)
{
    size_t n = L->n;
    *sb_free = 0;
    switch (p->fmt) {
    case GIFT_FMT_F32:
        memcpy(buf + L->code_off, x, 4 * n);
        break;
    case GIFT_FMT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t c = (uint16_t)ref_encode(&R_BF16, x[i]);
            memcpy(buf + L->code_off + 2 * i, &c, 2);
        }
        break;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2: {
        const ref_fmt_t *t = ref_of(p->fmt);
        float FMAX = fmax_of(p->fmt);
        for (size_t b = 0; b < L->nblocks; b++) {
            size_t i0 = b * L->block, i1 = i0 + L->block < n ? i0 + L->block : n;
            float amax = 0.0f, scale, inv;
            for (size_t i = i0; i < i1; i++)
                if (fabsf(x[i]) > amax)
                    amax = fabsf(x[i]);
            scale = amax / FMAX;
            inv = FMAX / amax;
            if (amax == 0.0f || !isfinite(inv) || (ftz_scales && !(scale >= FLT_MIN))) {
                scale = 0.0f;
            } else {
                for (size_t i = i0; i < i1; i++)
                    buf[L->code_off + i] = (uint8_t)ref_encode(t, x[i] * inv);
            }
            memcpy(buf + 4 * b, &scale, 4);
        }
        break;
    }
    default: {
        float amax_t = 0.0f, st, st6;
        for (size_t i = 0; i < n; i++)
            if (fabsf(x[i]) > amax_t)
                amax_t = fabsf(x[i]);
        st = amax_t / 2688.0f;
        st6 = st * 6.0f;
        if (ftz_scales && !(st >= FLT_MIN))
            break;
        memcpy(buf, &st, 4);
        if (!(st6 > 0.0f)) {
            *sb_free = 1;
            break;
        }
        for (size_t b = 0; b < L->nblocks; b++) {
            size_t i0 = b * 16, i1 = i0 + 16 < n ? i0 + 16 : n;
            float amax_b = 0.0f, eff, inv;
            uint8_t sb;
            for (size_t i = i0; i < i1; i++)
                if (fabsf(x[i]) > amax_b)
                    amax_b = fabsf(x[i]);
            sb = (uint8_t)ref_encode(&R_E4M3, amax_b / st6);
            buf[4 + b] = sb;
            eff = R_E4M3.fval[sb] * st;
            inv = 1.0f / eff;
            if (eff == 0.0f || !isfinite(inv) || (ftz_scales && !(eff >= FLT_MIN)))
                continue;
            for (size_t i = i0; i < i1; i++) {
                uint8_t c = (uint8_t)ref_encode(&R_E2M1, x[i] * inv);
                buf[L->code_off + i / 2] |= (uint8_t)((i & 1) ? c << 4 : c);
            }
        }
        break;
    }
    }
}

/* Decodes a payload as documented: validates every scale and code first.
 * Returns 0 or GIFT_EBADCODE (out untouched). */
static int ref_decode(gift_format_t fmt, const gift_layout_t *L, const uint8_t *pl, float *out)
{
    size_t n = L->n;
    switch (fmt) {
    case GIFT_FMT_F32:
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, pl + L->code_off + 4 * i, 4);
            if (!isfinite(f))
                return GIFT_EBADCODE;
        }
        memcpy(out, pl + L->code_off, 4 * n);
        return 0;
    case GIFT_FMT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t c;
            memcpy(&c, pl + L->code_off + 2 * i, 2);
            if (R_BF16.kind[c] != K_FINITE)
                return GIFT_EBADCODE;
        }
        for (size_t i = 0; i < n; i++) {
            uint16_t c;
            memcpy(&c, pl + L->code_off + 2 * i, 2);
            out[i] = R_BF16.fval[c];
        }
        return 0;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2: {
        const ref_fmt_t *t = ref_of(fmt);
        for (size_t b = 0; b < L->nblocks; b++) {
            float s;
            memcpy(&s, pl + 4 * b, 4);
            if (!isfinite(s) || s < 0.0f)
                return GIFT_EBADCODE;
        }
        for (size_t i = 0; i < n; i++)
            if (t->kind[pl[L->code_off + i]] != K_FINITE)
                return GIFT_EBADCODE;
        for (size_t i = 0; i < n; i++) {
            float s;
            memcpy(&s, pl + 4 * (i / L->block), 4);
            out[i] = t->fval[pl[L->code_off + i]] * s;
        }
        return 0;
    }
    default: {
        float st;
        memcpy(&st, pl, 4);
        if (!isfinite(st) || st < 0.0f)
            return GIFT_EBADCODE;
        for (size_t b = 0; b < L->nblocks; b++)
            if (R_E4M3.kind[pl[4 + b]] != K_FINITE || R_E4M3.fval[pl[4 + b]] < 0.0f)
                return GIFT_EBADCODE;
        for (size_t i = 0; i < n; i++) {
            float eff = R_E4M3.fval[pl[4 + i / 16]] * st;
            uint8_t byte = pl[L->code_off + i / 2];
            out[i] = R_E2M1.fval[(i & 1) ? byte >> 4 : byte & 15] * eff;
        }
        return 0;
    }
    }
}

static const char *section_of(const gift_layout_t *L, gift_format_t fmt, size_t off, size_t *elem)
{
    *elem = (size_t)-1;
    if (off < L->scale_bytes) {
        if (fmt == GIFT_FMT_NVFP4) {
            if (off < 4)
                return "tensor scale";
            *elem = (off - 4) * 16;
            return "nvfp4 block scale (first element index)";
        }
        *elem = off / 4 * L->block;
        return "block scale (first element index)";
    }
    if (off >= L->code_off && off < L->code_off + L->code_bytes) {
        size_t k = off - L->code_off;
        *elem = fmt == GIFT_FMT_F32     ? k / 4
                : fmt == GIFT_FMT_BF16  ? k / 2
                : fmt == GIFT_FMT_NVFP4 ? k * 2
                                        : k;
        return "code (element index)";
    }
    return "padding";
}

/* First differing byte offset, or (size_t)-1. Skips nvfp4 block scales when
 * they are not defined (sb_free). */
static size_t first_diff(const uint8_t *a, const uint8_t *b, const gift_layout_t *L,
                         gift_format_t fmt, int sb_free)
{
    for (size_t i = 0; i < L->total; i++) {
        if (sb_free && fmt == GIFT_FMT_NVFP4 && i >= 4 && i < L->scale_bytes)
            continue;
        if (a[i] != b[i])
            return i;
    }
    return (size_t)-1;
}

/* Per-element error bound of RNE encoding (checked in addition to exactness). */
static void check_error_bounds(const gift_codec_params_t *p, const gift_layout_t *L,
                               const uint8_t *pl, const float *x, const float *d)
{
    size_t n = L->n;
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], err = fabs((double)d[i] - xi), bound;
        switch (p->fmt) {
        case GIFT_FMT_F32:
            require_msg(f2u(d[i]) == f2u(x[i]), "f32 element %zu: %a -> %a", i, xi, (double)d[i]);
            continue;
        case GIFT_FMT_BF16:
            if (fabs(xi) >= R_BF16.vmax) {
                require_msg(fabs((double)d[i]) == R_BF16.vmax,
                            "bf16 element %zu: %a -> %a (not saturated)", i, xi, (double)d[i]);
                continue;
            }
            bound = ldexp(fabs(xi), -8) + ldexp(1.0, -134); /* half an ulp of 7 mantissa bits */
            break;
        case GIFT_FMT_E4M3:
        case GIFT_FMT_E5M2: {
            float s;
            memcpy(&s, pl + 4 * (i / L->block), 4);
            if (s == 0.0f) {
                require_msg(d[i] == 0.0f, "element %zu decodes to %a in a zero-scale block", i,
                            (double)d[i]);
                continue;
            }
            if (s < 0x1p-100f)
                continue; /* subnormal-range scales: exactness is checked elsewhere */
            if (p->fmt == GIFT_FMT_E4M3)
                bound = ldexp(fabs(xi), -4) + ldexp((double)s, -10);
            else
                bound = ldexp(fabs(xi), -3) + ldexp((double)s, -17);
            /* the brief's bound: 2^-4 (2^-3) of the block amax */
            {
                double amax = (double)s * (p->fmt == GIFT_FMT_E4M3 ? 448.0 : 57344.0);
                double b2 = ldexp(amax, p->fmt == GIFT_FMT_E4M3 ? -4 : -3) * (1 + 0x1p-16);
                require_msg(err <= b2,
                            "%s element %zu: x=%a decoded %a, error %g > %g (block amax/%d)",
                            gift_format_name(p->fmt), i, xi, (double)d[i], err, b2,
                            p->fmt == GIFT_FMT_E4M3 ? 16 : 8);
            }
            break;
        }
        default: {
            float st, eff;
            memcpy(&st, pl, 4);
            eff = R_E4M3.fval[pl[4 + i / 16]] * st;
            if (eff == 0.0f || !isfinite(1.0f / eff)) {
                require_msg(d[i] == 0.0f, "nvfp4 element %zu decodes to %a in a zero block", i,
                            (double)d[i]);
                continue;
            }
            if (eff < 0x1p-100f)
                continue;
            bound = 0.25 * eff + 0.25 * fabs(xi) + fmax(0.0, fabs(xi) - 6.0 * eff);
            break;
        }
        }
        bound = bound * (1 + 0x1p-16) + 0x1p-149;
        require_msg(err <= bound, "%s element %zu: x=%a decoded %a, error %g > bound %g",
                    gift_format_name(p->fmt), i, xi, (double)d[i], err, bound);
    }
}

/* Encodes x, compares with the reference payload, decodes and accumulates. */
static void roundtrip_case(gift_format_t fmt, uint32_t block, const float *x, size_t n, int bounds)
{
    gift_codec_params_t p;
    gift_layout_t L;
    uint8_t *pl, *ref;
    float *out, *exp, *acc, *acc_exp;
    int sb_free, rc;
    size_t off, el;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    p.block = block;
    assert_layout(&p, n, &L);

    pl = malloc(L.total + 64);
    ref = calloc(1, L.total + 64);
    out = malloc(sizeof(float) * n);
    exp = malloc(sizeof(float) * n);
    acc = malloc(sizeof(float) * n);
    acc_exp = malloc(sizeof(float) * n);
    memset(pl, 0xA5, L.total + 64);

    rc = gift_encode(&p, x, n, pl, L.total);
    require_msg(rc == 0, "gift_encode(%s, block %u, n %zu) = %d (%s)", gift_format_name(fmt), block,
                n, rc, gift_strerror(rc));
    ref_payload(&p, &L, x, ref, &sb_free);
    off = first_diff(pl, ref, &L, fmt, sb_free);
    if (off != (size_t)-1 && off < L.scale_bytes && !(fmt == GIFT_FMT_NVFP4 && off >= 4)) {
        size_t w = off / 4 * 4, b = w / 4, i0 = b * L.block, i1 = i0 + L.block;
        float gs, es, amax = 0.0f;
        memcpy(&gs, pl + w, 4);
        memcpy(&es, ref + w, 4);
        if (fmt == GIFT_FMT_NVFP4)
            i0 = 0, i1 = n;
        for (size_t i = i0; i < i1 && i < n; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        ck_abort_msg("%s block %u n %zu: %s scale %zu got %a, expected %a (amax %a)",
                     gift_format_name(fmt), block, n, fmt == GIFT_FMT_NVFP4 ? "tensor" : "block", b,
                     (double)gs, (double)es, (double)amax);
    }
    if (off != (size_t)-1) {
        const char *sec = section_of(&L, fmt, off, &el);
        require_msg(0,
                    "%s block %u n %zu: payload byte %zu of %zu (%s %ld) got 0x%02x, expected "
                    "0x%02x; x[elem]=%a",
                    gift_format_name(fmt), block, n, off, L.total, sec, (long)el, pl[off], ref[off],
                    el < n ? (double)x[el] : 0.0);
    }
    if (sb_free)
        for (size_t b = 0; b < L.nblocks; b++)
            require_msg(R_E4M3.kind[pl[4 + b]] == K_FINITE && R_E4M3.fval[pl[4 + b]] >= 0.0f,
                        "nvfp4 zero tensor: block scale %zu is 0x%02x", b, pl[4 + b]);

    /* decode: the minimal length the header allows */
    for (size_t i = 0; i < n; i++)
        out[i] = u2f(0x7FC0DEADu);
    rc = gift_decode(&p, pl, L.code_off + L.code_bytes, n, out);
    require_msg(rc == 0, "gift_decode(%s, n %zu) = %d", gift_format_name(fmt), n, rc);
    ck_assert_int_eq(ref_decode(fmt, &L, pl, exp), 0);
    for (size_t i = 0; i < n; i++)
        if (f2u(out[i]) != f2u(exp[i]))
            require_msg(0,
                        "%s block %u n %zu: decode element %zu: got %a (0x%08x), expected %a; x=%a",
                        gift_format_name(fmt), block, n, i, (double)out[i], f2u(out[i]),
                        (double)exp[i], (double)x[i]);
    if (bounds)
        check_error_bounds(&p, &L, pl, x, out);

    /* decode_acc onto a non-zero accumulator */
    {
        uint64_t s = 77 + n;
        for (size_t i = 0; i < n; i++) {
            acc[i] = (float)(rng_unit(&s) * 4.0 - 2.0);
            acc_exp[i] = acc[i] + exp[i];
        }
    }
    rc = gift_decode_acc(&p, pl, L.total, n, acc);
    require_msg(rc == 0, "gift_decode_acc(%s, n %zu) = %d", gift_format_name(fmt), n, rc);
    for (size_t i = 0; i < n; i++)
        if (f2u(acc[i]) != f2u(acc_exp[i]))
            require_msg(0, "%s n %zu: decode_acc element %zu: got %a, expected %a",
                        gift_format_name(fmt), n, i, (double)acc[i], (double)acc_exp[i]);

    free(pl);
    free(ref);
    free(out);
    free(exp);
    free(acc);
    free(acc_exp);
}

static const size_t ODD_NS[] = {1, 2, 15, 16, 17, 31, 127, 129, 1000, 1000003};
#define N_ODD_NS (sizeof ODD_NS / sizeof ODD_NS[0])

/* Loop index: fmt x block (block sizes only matter for fp8). */
static const struct {
    gift_format_t fmt;
    uint32_t block;
} COMBOS[] = {
    {GIFT_FMT_F32, 0},     {GIFT_FMT_BF16, 0},   {GIFT_FMT_NVFP4, 0},   {GIFT_FMT_E4M3, 0},
    {GIFT_FMT_E4M3, 32},   {GIFT_FMT_E4M3, 64},  {GIFT_FMT_E4M3, 128},  {GIFT_FMT_E4M3, 256},
    {GIFT_FMT_E4M3, 1024}, {GIFT_FMT_E5M2, 0},   {GIFT_FMT_E5M2, 32},   {GIFT_FMT_E5M2, 64},
    {GIFT_FMT_E5M2, 128},  {GIFT_FMT_E5M2, 256}, {GIFT_FMT_E5M2, 1024}, {GIFT_FMT_NVFP4, 48},
};
#define N_COMBOS ((int)(sizeof COMBOS / sizeof COMBOS[0]))

START_TEST(test_block_roundtrip)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    uint64_t s = 1234 + (uint64_t)_i;

    for (size_t k = 0; k < N_ODD_NS; k++) {
        size_t n = ODD_NS[k];
        float *x = malloc(sizeof(float) * n);
        fill_varied(x, n, &s);
        roundtrip_case(fmt, block, x, n, 1);
        /* smooth data: normal-ish values, no special runs */
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((rng_unit(&s) - 0.5) * ldexp(1.0, (int)(i % 7) * 3 - 9));
        roundtrip_case(fmt, block, x, n, 1);
        free(x);
    }
    if (_i == 0)
        fprintf(stderr, "block tests on SIMD path %s\n", gift_simd_name(gift_simd_active()));
}
END_TEST

/* Constructed blocks: zeros, the inverse-scale overflow threshold, ties. */
START_TEST(test_block_special)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    size_t n = 4096 + 7;
    float *x = malloc(sizeof(float) * n);
    uint64_t s = 99;

    /* all zeros, then negative zeros */
    for (size_t i = 0; i < n; i++)
        x[i] = 0.0f;
    roundtrip_case(fmt, block, x, n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] = -0.0f;
    roundtrip_case(fmt, block, x, n, 1);
    /* one non-zero per 300 elements: most blocks all zero */
    for (size_t i = 0; i < n; i++)
        x[i] = (i % 300 == 5) ? rand_sign(&s, (float)rng_unit(&s) + 0.1f) : 0.0f;
    roundtrip_case(fmt, block, x, n, 1);
    /* block maxima at random across the range where FMAX/amax stops being
     * finite and the scales turn subnormal (2^-140 .. 2^-100) */
    {
        float amax = 0.0f;
        for (size_t i = 0; i < n; i++) {
            if (i % 16 == 0)
                amax = (float)ldexp(1.0 + rng_unit(&s), -140 + (int)(rng_next(&s) % 40));
            x[i] = (i % 16 == 0) ? amax : rand_sign(&s, amax * (float)rng_unit(&s));
        }
    }
    roundtrip_case(fmt, block, x, n, 1);
    /* FLT_MAX-sized values */
    for (size_t i = 0; i < n; i++)
        x[i] = (i % 3 == 0) ? -FLT_MAX : FLT_MAX * (float)rng_unit(&s);
    roundtrip_case(fmt, block, x, n, 1);
    /* exact grid values: scale 1 blocks, codes land on exact ties */
    for (size_t i = 0; i < n; i++)
        x[i] = (i % 64 == 0) ? fmax_of(fmt == GIFT_FMT_E5M2 ? GIFT_FMT_E5M2 : GIFT_FMT_E4M3)
                             : (float)((int)(rng_next(&s) % 2001) - 1000) * 0x1p-6f;
    roundtrip_case(fmt, block, x, n, 1);
    free(x);
}
END_TEST

/* The zero-block threshold, on hand-made cases. The header zeroes a block
 * only when amax == 0 or the inverse scale is not finite (nvfp4: eff == 0 or
 * 1/eff not finite); scales below FLT_MIN (subnormal) are kept. */
START_TEST(test_scale_threshold)
{
    static const struct {
        gift_format_t fmt;
        float amax; /* the block's (nvfp4: the tensor's) largest |x| */
    } c[] = {
        {GIFT_FMT_E4M3, 0x1.6cc8aap-118f}, /* inv finite, scale 0x1.a0e554p-127 (subnormal) */
        {GIFT_FMT_E4M3, 0x1.2p-119f},      /* inv = 448/amax just finite */
        {GIFT_FMT_E4M3, 0x1p-121f},        /* inv overflows: zero under both rules */
        {GIFT_FMT_E4M3, 0x1.cp-118f},      /* scale exactly FLT_MIN: kept under both rules */
        {GIFT_FMT_E5M2, 0x1p-111f},        /* scale 0x1.249248p-127 (subnormal) */
        {GIFT_FMT_E5M2, 0x1p-113f},        /* inv overflows: zero under both rules */
        {GIFT_FMT_NVFP4, 1e-36f},          /* s_t 0x1.03434p-131 (subnormal), eff normal */
        {GIFT_FMT_NVFP4, 0x1p-140f},       /* s_t underflows to 0: zero under both rules */
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        float x[32];
        for (int i = 0; i < 32; i++)
            x[i] = c[k].amax * (float)(i + 1) / 32.0f * ((i & 1) ? -1.0f : 1.0f);
        /* the exactness check against the reference (which follows the rule in use) */
        roundtrip_case(c[k].fmt, 32, x, 32, 0);
    }
    /* nvfp4: a block whose eff is subnormal while 1/eff is finite */
    {
        float x[32] = {0};
        x[0] = 1e-34f;
        x[16] = 1e-34f / 3000.0f; /* r = 0x1.31d5acp-3 -> sb 0x22, eff 0x1.fa5f6p-128 */
        x[17] = -0.5f * x[16];
        roundtrip_case(GIFT_FMT_NVFP4, 0, x, 32, 0);
    }
}
END_TEST

/* n = 0 is a valid, empty payload for every format. */
START_TEST(test_empty)
{
    for (int f = 0; f < GIFT_FMT_COUNT_; f++) {
        gift_codec_params_t p;
        gift_layout_t L;
        uint8_t buf[128];
        float x[1] = {1.0f}, out[1] = {5.0f};
        int rc;
        memset(&p, 0, sizeof p);
        p.fmt = (gift_format_t)f;
        assert_layout(&p, 0, &L);
        memset(buf, 0xA5, sizeof buf);
        rc = gift_encode(&p, x, 0, buf, sizeof buf);
        require_msg(rc == 0, "%s n 0: encode %d", gift_format_name(p.fmt), rc);
        rc = gift_decode(&p, buf, L.total, 0, out);
        require_msg(rc == 0 && out[0] == 5.0f, "%s n 0: decode %d, out[0] %a",
                    gift_format_name(p.fmt), rc, (double)out[0]);
        rc = gift_decode_acc(&p, buf, L.total, 0, out);
        require_msg(rc == 0 && out[0] == 5.0f, "%s n 0: decode_acc %d", gift_format_name(p.fmt),
                    rc);
    }
}
END_TEST

/* n comes from users and the wire: a layout whose sizes would wrap is refused
 * (n > SIZE_MAX / 8 gives GIFT_EINVAL), or decode's length check would pass on
 * a wrapped total and the kernels would read n elements past the buffer. */
START_TEST(test_layout_overflow)
{
    static const size_t ns[] = {(SIZE_MAX >> 3) + 1, SIZE_MAX / 4 + 2, SIZE_MAX / 2 + 2,
                                SIZE_MAX - 5, SIZE_MAX};
    uint8_t buf[64] = {0};
    float x[16] = {0};
    for (int f = 0; f < GIFT_FMT_COUNT_; f++) {
        gift_codec_params_t p;
        gift_layout_t L;
        memset(&p, 0, sizeof p);
        p.fmt = (gift_format_t)f;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int rc = gift_layout(&p, ns[k], &L);
            require_msg(rc == GIFT_EINVAL,
                        "%s n %zu: gift_layout returned %d (code_bytes %zu, total %zu)",
                        gift_format_name(p.fmt), ns[k], rc, rc == 0 ? L.code_bytes : 0,
                        rc == 0 ? L.total : 0);
            rc = gift_encode(&p, x, ns[k], buf, sizeof buf);
            require_msg(rc == GIFT_EINVAL, "%s n %zu: gift_encode returned %d",
                        gift_format_name(p.fmt), ns[k], rc);
            rc = gift_decode(&p, buf, sizeof buf, ns[k], x);
            require_msg(rc == GIFT_EINVAL, "%s n %zu: gift_decode returned %d",
                        gift_format_name(p.fmt), ns[k], rc);
            rc = gift_decode_acc(&p, buf, sizeof buf, ns[k], x);
            require_msg(rc == GIFT_EINVAL, "%s n %zu: gift_decode_acc returned %d",
                        gift_format_name(p.fmt), ns[k], rc);
        }
        /* the largest accepted n gives consistent, unwrapped sizes */
        require_msg(gift_layout(&p, SIZE_MAX >> 3, &L) == 0, "%s: n = SIZE_MAX / 8 refused",
                    gift_format_name(p.fmt));
        require_msg(L.total >= L.code_off + L.code_bytes && L.code_off >= L.scale_bytes &&
                        L.code_bytes >= (SIZE_MAX >> 4),
                    "%s n = SIZE_MAX / 8: wrapped layout (code_bytes %zu, total %zu)",
                    gift_format_name(p.fmt), L.code_bytes, L.total);
    }
}
END_TEST

START_TEST(test_layout_blocks)
{
    static const uint32_t good[] = {0, 32, 64, 128, 256, 1024, 4096};
    static const uint32_t bad[] = {16, 48, 1, 31, 33, 96, 100, 129};
    static const size_t ns[] = {1, 63, 64, 65, 127, 128, 129, 1000003};
    gift_layout_t L;
    gift_codec_params_t p;
    float x[64] = {1.0f};
    uint8_t buf[4096] = {0};

    memset(&p, 0, sizeof p);
    for (int f = 0; f < GIFT_FMT_COUNT_; f++)
        for (size_t g = 0; g < sizeof good / sizeof good[0]; g++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                p.fmt = (gift_format_t)f;
                p.block = good[g];
                assert_layout(&p, ns[k], &L);
                require_msg(L.scale_off == 0, "scale_off %zu", L.scale_off);
            }
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        for (int f = GIFT_FMT_E4M3; f <= GIFT_FMT_E5M2; f++) {
            int rc;
            p.fmt = (gift_format_t)f;
            p.block = bad[b];
            rc = gift_layout(&p, 100, &L);
            require_msg(rc == GIFT_EFORMAT, "%s block %u: gift_layout = %d, expected GIFT_EFORMAT",
                        gift_format_name(p.fmt), bad[b], rc);
            rc = gift_encode(&p, x, 64, buf, sizeof buf);
            require_msg(rc == GIFT_EFORMAT, "%s block %u: gift_encode = %d, expected GIFT_EFORMAT",
                        gift_format_name(p.fmt), bad[b], rc);
            rc = gift_decode(&p, buf, sizeof buf, 64, x);
            require_msg(rc == GIFT_EFORMAT, "%s block %u: gift_decode = %d, expected GIFT_EFORMAT",
                        gift_format_name(p.fmt), bad[b], rc);
        }
        /* ignored by f32/bf16/nvfp4 */
        for (int f = GIFT_FMT_F32; f < GIFT_FMT_COUNT_; f++) {
            if (f == GIFT_FMT_E4M3 || f == GIFT_FMT_E5M2)
                continue;
            p.fmt = (gift_format_t)f;
            p.block = bad[b];
            assert_layout(&p, 100, &L);
        }
    }
    p.fmt = GIFT_FMT_COUNT_;
    p.block = 0;
    ck_assert_int_eq(gift_layout(&p, 10, &L), GIFT_EFORMAT);
    ck_assert_int_eq(gift_encode(&p, x, 10, buf, sizeof buf), GIFT_EFORMAT);
    p.fmt = (gift_format_t)-1;
    ck_assert_int_eq(gift_layout(&p, 10, &L), GIFT_EFORMAT);
}
END_TEST

START_TEST(test_enospc)
{
    for (int f = 0; f < GIFT_FMT_COUNT_; f++) {
        static const size_t ns[] = {1, 129, 1000};
        for (size_t k = 0; k < 3; k++) {
            size_t n = ns[k];
            gift_codec_params_t p;
            gift_layout_t L;
            float *x = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
            uint8_t *pl;
            int rc;
            uint64_t s = 5;
            memset(&p, 0, sizeof p);
            p.fmt = (gift_format_t)f;
            assert_layout(&p, n, &L);
            pl = malloc(L.total);
            fill_varied(x, n, &s);
            rc = gift_encode(&p, x, n, pl, L.total - 1);
            require_msg(rc == GIFT_ENOSPC, "%s n %zu cap %zu: %d, expected GIFT_ENOSPC",
                        gift_format_name(p.fmt), n, L.total - 1, rc);
            rc = gift_encode(&p, x, n, pl, 0);
            require_msg(rc == GIFT_ENOSPC, "%s n %zu cap 0: %d", gift_format_name(p.fmt), n, rc);
            rc = gift_encode(&p, x, n, pl, L.total);
            require_msg(rc == 0, "%s n %zu cap %zu: %d", gift_format_name(p.fmt), n, L.total, rc);
            /* a payload shorter than code_off + code_bytes is refused, out untouched */
            for (size_t i = 0; i < n; i++)
                out[i] = 7.0f;
            rc = gift_decode(&p, pl, L.code_off + L.code_bytes - 1, n, out);
            require_msg(rc < 0, "%s n %zu: decode of a short payload returned %d",
                        gift_format_name(p.fmt), n, rc);
            for (size_t i = 0; i < n; i++)
                require_msg(out[i] == 7.0f, "%s: short-payload decode wrote out[%zu] = %a",
                            gift_format_name(p.fmt), i, (double)out[i]);
            rc = gift_decode_acc(&p, pl, L.code_off + L.code_bytes - 1, n, out);
            require_msg(rc < 0, "%s n %zu: decode_acc of a short payload returned %d",
                        gift_format_name(p.fmt), n, rc);
            for (size_t i = 0; i < n; i++)
                require_msg(out[i] == 7.0f, "%s: short-payload decode_acc wrote acc[%zu] = %a",
                            gift_format_name(p.fmt), i, (double)out[i]);
            free(pl);
            free(x);
            free(out);
        }
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* Non-finite input and bad payloads                                    */
/* ------------------------------------------------------------------ */

START_TEST(test_nonfinite_input)
{
    static const size_t ns[] = {1, 17, 1000, 4097};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, u2f(0x7F800001u), u2f(0xFFC12345u)};
    for (int f = 0; f < GIFT_FMT_COUNT_; f++)
        for (int sr = 0; sr < 2; sr++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                size_t n = ns[k];
                size_t pos[] = {0, n / 2, n - 1, n > 16 ? n - 17 : 0};
                gift_codec_params_t p;
                gift_layout_t L;
                float *x = malloc(sizeof(float) * n);
                uint8_t *pl;
                uint64_t s = 3;
                memset(&p, 0, sizeof p);
                p.fmt = (gift_format_t)f;
                p.stochastic = sr;
                p.sr.seed = 1;
                ck_assert_int_eq(gift_layout(&p, n, &L), 0);
                pl = malloc(L.total);
                for (size_t j = 0; j < 4; j++)
                    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                        int rc;
                        fill_varied(x, n, &s);
                        x[pos[j]] = bad[b];
                        rc = gift_encode(&p, x, n, pl, L.total);
                        require_msg(rc == GIFT_ENONFINITE,
                                    "%s sr=%d n %zu: x[%zu] = %a (0x%08x): encode returned %d, "
                                    "expected GIFT_ENONFINITE",
                                    gift_format_name(p.fmt), sr, n, pos[j], (double)bad[b],
                                    f2u(bad[b]), rc);
                    }
                free(pl);
                free(x);
            }
}
END_TEST

/* Encodes valid data, corrupts one byte range, expects GIFT_EBADCODE from
 * decode and decode_acc with out/acc untouched. */
static void expect_badcode(gift_format_t fmt, size_t n, size_t off, const void *bytes, size_t len,
                           const char *what)
{
    gift_codec_params_t p;
    gift_layout_t L;
    float *x = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
    uint8_t *pl;
    uint64_t s = 11;
    int rc;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    ck_assert_int_eq(gift_layout(&p, n, &L), 0);
    pl = malloc(L.total);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rng_unit(&s) - 0.5);
    ck_assert_int_eq(gift_encode(&p, x, n, pl, L.total), 0);
    ck_assert_int_eq(gift_payload_check(&p, pl, L.total, n), 0);
    memcpy(pl + off, bytes, len);
    for (size_t i = 0; i < n; i++)
        out[i] = 3.25f;
    rc = gift_decode(&p, pl, L.total, n, out);
    require_msg(rc == GIFT_EBADCODE,
                "%s n %zu, %s at byte %zu: decode returned %d, expected GIFT_EBADCODE",
                gift_format_name(fmt), n, what, off, rc);
    rc = gift_payload_check(&p, pl, L.total, n);
    require_msg(rc == GIFT_EBADCODE,
                "%s n %zu, %s at byte %zu: gift_payload_check returned %d, expected GIFT_EBADCODE",
                gift_format_name(fmt), n, what, off, rc);
    for (size_t i = 0; i < n; i++)
        require_msg(f2u(out[i]) == f2u(3.25f),
                    "%s, %s: decode wrote out[%zu] = %a on a bad payload", gift_format_name(fmt),
                    what, i, (double)out[i]);
    rc = gift_decode_acc(&p, pl, L.total, n, out);
    require_msg(rc == GIFT_EBADCODE, "%s n %zu, %s at byte %zu: decode_acc returned %d",
                gift_format_name(fmt), n, what, off, rc);
    for (size_t i = 0; i < n; i++)
        require_msg(f2u(out[i]) == f2u(3.25f), "%s, %s: decode_acc changed acc[%zu] to %a",
                    gift_format_name(fmt), what, i, (double)out[i]);
    free(pl);
    free(x);
    free(out);
}

START_TEST(test_bad_payload)
{
    static const size_t ns[] = {1, 129, 1000, 4097};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = ns[k];
        gift_codec_params_t p;
        gift_layout_t L;
        size_t elems[] = {0, n / 2, n - 1};
        memset(&p, 0, sizeof p);

        for (int f = GIFT_FMT_E4M3; f <= GIFT_FMT_E5M2; f++) {
            static const uint8_t e4[] = {0x7F, 0xFF};
            static const uint8_t e5[] = {0x7C, 0xFC, 0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF};
            const uint8_t *codes = f == GIFT_FMT_E4M3 ? e4 : e5;
            size_t nc = f == GIFT_FMT_E4M3 ? sizeof e4 : sizeof e5;
            const float scales[] = {NAN, INFINITY, -INFINITY, -1.0f, -0x1p-149f};
            p.fmt = (gift_format_t)f;
            ck_assert_int_eq(gift_layout(&p, n, &L), 0);
            for (size_t e = 0; e < 3; e++)
                for (size_t c = 0; c < nc; c++)
                    expect_badcode(p.fmt, n, L.code_off + elems[e], &codes[c], 1, "NaN/Inf code");
            for (size_t sc = 0; sc < sizeof scales / sizeof scales[0]; sc++) {
                expect_badcode(p.fmt, n, 0, &scales[sc], 4, "bad scale (block 0)");
                expect_badcode(p.fmt, n, 4 * (L.nblocks - 1), &scales[sc], 4,
                               "bad scale (last block)");
            }
        }
        {
            const float scales[] = {NAN, INFINITY, -1.0f};
            static const uint8_t sbs[] = {0x7F, 0xFF, 0xB8, 0x81};
            p.fmt = GIFT_FMT_NVFP4;
            ck_assert_int_eq(gift_layout(&p, n, &L), 0);
            for (size_t sc = 0; sc < sizeof scales / sizeof scales[0]; sc++)
                expect_badcode(p.fmt, n, 0, &scales[sc], 4, "bad tensor scale");
            for (size_t c = 0; c < sizeof sbs; c++) {
                expect_badcode(p.fmt, n, 4, &sbs[c], 1, "bad block scale (first)");
                expect_badcode(p.fmt, n, 4 + L.nblocks - 1, &sbs[c], 1, "bad block scale (last)");
            }
        }
        {
            static const uint16_t bc[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81};
            p.fmt = GIFT_FMT_BF16;
            ck_assert_int_eq(gift_layout(&p, n, &L), 0);
            for (size_t e = 0; e < 3; e++)
                for (size_t c = 0; c < sizeof bc / sizeof bc[0]; c++)
                    expect_badcode(p.fmt, n, L.code_off + 2 * elems[e], &bc[c], 2,
                                   "bf16 Inf/NaN code");
        }
        {
            const float bf[] = {NAN, INFINITY, -INFINITY};
            p.fmt = GIFT_FMT_F32;
            ck_assert_int_eq(gift_layout(&p, n, &L), 0);
            for (size_t e = 0; e < 3; e++)
                for (size_t c = 0; c < 3; c++)
                    expect_badcode(p.fmt, n, L.code_off + 4 * elems[e], &bf[c], 4, "f32 Inf/NaN");
        }
    }
}
END_TEST

/* NaN codes in the padding (beyond code_bytes) are not elements. A zero
 * scale with non-zero codes is a valid (if odd) payload. */
START_TEST(test_padding_ignored)
{
    for (int f = 0; f < GIFT_FMT_COUNT_; f++) {
        size_t n = 129;
        gift_codec_params_t p;
        gift_layout_t L;
        float x[129], out[129], exp[129];
        uint8_t *pl;
        uint64_t s = 17;
        memset(&p, 0, sizeof p);
        p.fmt = (gift_format_t)f;
        ck_assert_int_eq(gift_layout(&p, n, &L), 0);
        pl = malloc(L.total);
        fill_varied(x, n, &s);
        ck_assert_int_eq(gift_encode(&p, x, n, pl, L.total), 0);
        for (size_t i = L.code_off + L.code_bytes; i < L.total; i++) {
            require_msg(pl[i] == 0, "%s: padding byte %zu is 0x%02x", gift_format_name(p.fmt), i,
                        pl[i]);
            pl[i] = 0xFF;
        }
        for (size_t i = L.scale_bytes; i < L.code_off; i++) {
            require_msg(pl[i] == 0, "%s: scale padding byte %zu is 0x%02x", gift_format_name(p.fmt),
                        i, pl[i]);
            pl[i] = 0xFF;
        }
        if (f == GIFT_FMT_NVFP4) /* the unused high nibble of the last byte */
            require_msg((pl[L.code_off + n / 2] & 0xF0) == 0, "nvfp4 odd n: last byte 0x%02x",
                        pl[L.code_off + n / 2]);
        ck_assert_int_eq(ref_decode(p.fmt, &L, pl, exp), 0);
        require_msg(gift_decode(&p, pl, L.total, n, out) == 0, "%s: NaN bytes in padding refused",
                    gift_format_name(p.fmt));
        for (size_t i = 0; i < n; i++)
            require_msg(f2u(out[i]) == f2u(exp[i]), "%s element %zu: %a vs %a",
                        gift_format_name(p.fmt), i, (double)out[i], (double)exp[i]);
        free(pl);
    }
    {
        /* zero scale, non-zero codes */
        gift_codec_params_t p;
        gift_layout_t L;
        float x[40], out[40];
        uint8_t *pl;
        float zero = 0.0f;
        memset(&p, 0, sizeof p);
        p.fmt = GIFT_FMT_E4M3;
        p.block = 32;
        for (int i = 0; i < 40; i++)
            x[i] = (float)i - 20.0f;
        ck_assert_int_eq(gift_layout(&p, 40, &L), 0);
        pl = malloc(L.total);
        ck_assert_int_eq(gift_encode(&p, x, 40, pl, L.total), 0);
        memcpy(pl, &zero, 4);
        ck_assert_int_eq(gift_decode(&p, pl, L.total, 40, out), 0);
        for (int i = 0; i < 32; i++)
            require_msg(out[i] == 0.0f, "zero-scale block decoded %a", (double)out[i]);
        free(pl);
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* Stochastic rounding                                                  */
/* ------------------------------------------------------------------ */

/* Builds an input where v lands unscaled on the format's grid: fp8 blocks of
 * 128 led by FMAX (scale 1); nvfp4 blocks led by 6 with tensor amax 2688
 * (block scale 1.0). Returns n; samples are marked in is_sample. */
static size_t sr_input(gift_format_t fmt, float v, float **xp, uint8_t **is_sample)
{
    size_t n;
    float *x;
    uint8_t *m;
    switch (fmt) {
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        n = 8200 * 128;
        x = malloc(sizeof(float) * n);
        m = malloc(n);
        for (size_t i = 0; i < n; i++) {
            x[i] = (i % 128 == 0) ? fmax_of(fmt) : v;
            m[i] = i % 128 != 0;
        }
        break;
    case GIFT_FMT_NVFP4:
        n = 70000 * 16;
        x = malloc(sizeof(float) * n);
        m = malloc(n);
        for (size_t i = 0; i < n; i++) {
            x[i] = (i == 0) ? 2688.0f : (i % 16 == 0) ? 6.0f : v;
            m[i] = i >= 16 && i % 16 != 0;
        }
        break;
    default:
        n = 1u << 20;
        x = malloc(sizeof(float) * n);
        m = malloc(n);
        for (size_t i = 0; i < n; i++) {
            x[i] = v;
            m[i] = 1;
        }
        break;
    }
    *xp = x;
    *is_sample = m;
    return n;
}

static const struct {
    gift_format_t fmt;
    float v;
} SR_CASES[] = {
    {GIFT_FMT_E4M3, 1.3f},          {GIFT_FMT_E4M3, -0.1f},       {GIFT_FMT_E4M3, 0.003f},
    {GIFT_FMT_E4M3, 447.0f},        {GIFT_FMT_E4M3, 1.0f / 3.0f}, {GIFT_FMT_E4M3, 0.0004f},
    {GIFT_FMT_E5M2, 1.3f},          {GIFT_FMT_E5M2, -3e-5f},      {GIFT_FMT_E5M2, 50000.0f},
    {GIFT_FMT_E5M2, 0.7f},          {GIFT_FMT_NVFP4, 2.4f},       {GIFT_FMT_NVFP4, 0.3f},
    {GIFT_FMT_NVFP4, 5.1f},         {GIFT_FMT_NVFP4, -0.7f},      {GIFT_FMT_NVFP4, 1.1f},
    {GIFT_FMT_BF16, 1.0009765625f}, {GIFT_FMT_BF16, 3.14159265f}, {GIFT_FMT_BF16, -1e-39f},
    {GIFT_FMT_BF16, 0x1.8p-133f},   {GIFT_FMT_E4M3, 1.25f},       {GIFT_FMT_NVFP4, 3.0f},
    {GIFT_FMT_BF16, 1.5f},          {GIFT_FMT_E4M3, 0x1.8p-8f},   {GIFT_FMT_E5M2, 0x1p-15f},
    {GIFT_FMT_NVFP4, -0.5f},        {GIFT_FMT_BF16, 0x1.8p-132f},
};
#define N_SR_CASES ((int)(sizeof SR_CASES / sizeof SR_CASES[0]))

START_TEST(test_sr_unbiased)
{
    gift_format_t fmt = SR_CASES[_i].fmt;
    float v = SR_CASES[_i].v;
    const ref_fmt_t *t = ref_of(fmt);
    gift_codec_params_t p;
    gift_layout_t L;
    float *x, *out;
    uint8_t *is_s, *pl;
    size_t n = sr_input(fmt, v, &x, &is_s), N = 0, nhi = 0;
    uint32_t clo, chi;
    double lo, hi, sum = 0, sum2 = 0, mean, var, se, pexp;

    ref_neighbours(t, v, &clo, &chi);
    lo = t->fval[clo];
    hi = t->fval[chi];
    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    p.stochastic = 1;
    p.sr.seed = 0x1234567ull;
    p.sr.rank = 3;
    p.sr.key = 42;
    p.sr.chunk = 1;
    p.sr.step = 1000;
    ck_assert_int_eq(gift_layout(&p, n, &L), 0);
    pl = malloc(L.total);
    out = malloc(sizeof(float) * n);
    ck_assert_int_eq(gift_encode(&p, x, n, pl, L.total), 0);
    ck_assert_int_eq(gift_decode(&p, pl, L.total, n, out), 0);
    for (size_t i = 0; i < n; i++) {
        double e;
        if (!is_s[i])
            continue;
        require_msg(out[i] == (float)lo || out[i] == (float)hi,
                    "%s SR of %a: element %zu decoded %a, not a neighbour (%a, %a)",
                    gift_format_name(fmt), (double)v, i, (double)out[i], lo, hi);
        e = (double)out[i] - (double)v;
        sum += e;
        sum2 += e * e;
        nhi += out[i] == (float)hi && hi != lo;
        N++;
    }
    require_msg(N >= 1000000, "only %zu samples", N);
    mean = sum / (double)N;
    var = (sum2 - sum * sum / (double)N) / (double)(N - 1);
    se = sqrt(fmax(var, 0.0) / (double)N);
    pexp = hi != lo ? (fabs((double)v) - fabs(lo)) / (fabs(hi) - fabs(lo)) : 0.0;
    fprintf(
        stderr,
        "SR %-8s v=%-12.7g neighbours (%g, %g): p_up %.5f (exact %.5f), mean err %.3g, 4 SE %.3g\n",
        gift_format_name(fmt), (double)v, lo, hi, (double)nhi / (double)N, pexp, mean, 4 * se);
    if (hi == lo) {
        require_msg(mean == 0.0, "%s SR of the exact value %a moved it (mean error %g)",
                    gift_format_name(fmt), (double)v, mean);
    } else {
        double ph = (double)nhi / (double)N, sep = sqrt(pexp * (1 - pexp) / (double)N);
        require_msg(fabs(mean) <= 4 * se,
                    "%s SR of %a is biased: mean error %g over %zu draws, 4 SE = %g",
                    gift_format_name(fmt), (double)v, mean, N, 4 * se);
        require_msg(fabs(ph - pexp) <= 4 * sep + 1e-9,
                    "%s SR of %a: rounds up with frequency %.6f, expected %.6f (4 SE %.2g)",
                    gift_format_name(fmt), (double)v, ph, pexp, 4 * sep);
    }
    free(pl);
    free(out);
    free(x);
    free(is_s);
}
END_TEST

/* The same few elements over many steps: the draws differ per step. */
START_TEST(test_sr_unbiased_over_steps)
{
    gift_format_t fmt = _i == 0 ? GIFT_FMT_E4M3 : GIFT_FMT_BF16;
    float v = _i == 0 ? 2.7f : 1.7f;
    size_t n = _i == 0 ? 128 : 16, steps = _i == 0 ? 8000 : 65536, N = 0;
    const ref_fmt_t *t = ref_of(fmt);
    gift_codec_params_t p;
    gift_layout_t L;
    float x[128], out[128];
    uint8_t *pl;
    uint32_t clo, chi;
    double sum = 0, sum2 = 0, mean, se;

    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    p.stochastic = 1;
    p.sr.seed = 99;
    for (size_t i = 0; i < n; i++)
        x[i] = (fmt == GIFT_FMT_E4M3 && i == 0) ? 448.0f : v;
    ref_neighbours(t, v, &clo, &chi);
    ck_assert_int_eq(gift_layout(&p, n, &L), 0);
    pl = malloc(L.total);
    for (size_t st = 0; st < steps; st++) {
        p.sr.step = st;
        int rc1 = gift_encode(&p, x, n, pl, L.total), rc2 = gift_decode(&p, pl, L.total, n, out);
        require_msg(rc1 == 0 && rc2 == 0, "step %zu: encode %d decode %d", st, rc1, rc2);
        for (size_t i = (fmt == GIFT_FMT_E4M3); i < n; i++) {
            double e = (double)out[i] - (double)v;
            require_msg(out[i] == t->fval[clo] || out[i] == t->fval[chi],
                        "step %zu element %zu: %a", st, i, (double)out[i]);
            sum += e;
            sum2 += e * e;
            N++;
        }
    }
    mean = sum / (double)N;
    se = sqrt((sum2 - sum * sum / (double)N) / (double)(N - 1) / (double)N);
    require_msg(fabs(mean) <= 4 * se, "%s SR over %zu steps: mean error %g, 4 SE %g",
                gift_format_name(fmt), steps, mean, 4 * se);
    free(pl);
}
END_TEST

/* SR codes are one of the two neighbours of the scaled value; the scales are
 * the RNE scales; the same key reproduces, a different one does not. */
START_TEST(test_sr_block)
{
    gift_format_t fmt = COMBOS[_i].fmt;
    uint32_t block = COMBOS[_i].block;
    static const size_t ns[] = {1, 17, 129, 100003};
    uint64_t s = 555 + (uint64_t)_i;

    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        size_t n = ns[k];
        gift_codec_params_t p, q;
        gift_layout_t L;
        float *x = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n),
              *exp = malloc(sizeof(float) * n);
        uint8_t *pl, *pl2, *ref;
        int sb_free;

        fill_varied(x, n, &s);
        memset(&p, 0, sizeof p);
        p.fmt = fmt;
        p.block = block;
        p.stochastic = 1;
        p.sr.seed = 2024;
        p.sr.rank = 1;
        p.sr.key = 7;
        p.sr.chunk = 2;
        p.sr.step = 10;
        assert_layout(&p, n, &L);
        pl = malloc(L.total);
        pl2 = malloc(L.total);
        ref = calloc(1, L.total);
        ck_assert_int_eq(gift_encode(&p, x, n, pl, L.total), 0);
        ref_payload(&p, &L, x, ref, &sb_free);
        /* scales: identical to RNE */
        for (size_t i = 0; i < L.scale_bytes; i++) {
            if (sb_free && i >= 4)
                break;
            require_msg(pl[i] == ref[i], "%s SR: scale byte %zu got 0x%02x expected 0x%02x",
                        gift_format_name(fmt), i, pl[i], ref[i]);
        }
        /* codes: a neighbour of the scaled value */
        for (size_t i = 0; i < n; i++) {
            uint32_t got, clo, chi;
            float y;
            const ref_fmt_t *t = ref_of(fmt);
            switch (fmt) {
            case GIFT_FMT_F32: {
                float g;
                memcpy(&g, pl + L.code_off + 4 * i, 4);
                require_msg(f2u(g) == f2u(x[i]), "f32 SR changed element %zu", i);
                continue;
            }
            case GIFT_FMT_BF16: {
                uint16_t c;
                memcpy(&c, pl + L.code_off + 2 * i, 2);
                got = c;
                y = x[i];
                break;
            }
            case GIFT_FMT_E4M3:
            case GIFT_FMT_E5M2: {
                float sc, inv, amax = 0.0f;
                size_t b = i / L.block;
                memcpy(&sc, pl + 4 * b, 4);
                got = pl[L.code_off + i];
                if (sc == 0.0f) {
                    require_msg(got == 0, "SR zero block: code 0x%02x at %zu", got, i);
                    continue;
                }
                for (size_t j = b * L.block; j < n && j < (b + 1) * L.block; j++)
                    amax = fmaxf(amax, fabsf(x[j]));
                inv = fmax_of(fmt) / amax;
                y = x[i] * inv;
                break;
            }
            default: {
                float st, eff, inv;
                uint8_t byte = pl[L.code_off + i / 2];
                memcpy(&st, pl, 4);
                eff = R_E4M3.fval[pl[4 + i / 16]] * st;
                inv = 1.0f / eff;
                got = (i & 1) ? byte >> 4 : byte & 15u;
                if (eff == 0.0f || !isfinite(inv) || (ftz_scales && !(eff >= FLT_MIN))) {
                    require_msg(got == 0, "nvfp4 SR zero block: code 0x%x at %zu", got, i);
                    continue;
                }
                y = x[i] * inv;
                break;
            }
            }
            ref_neighbours(t, y, &clo, &chi);
            require_msg(got == clo || got == chi,
                        "%s SR element %zu: x=%a scaled %a: code 0x%x not in {0x%x, 0x%x}",
                        gift_format_name(fmt), i, (double)x[i], (double)y, got, clo, chi);
        }
        ck_assert_int_eq(gift_decode(&p, pl, L.total, n, out), 0);
        ck_assert_int_eq(ref_decode(fmt, &L, pl, exp), 0);
        for (size_t i = 0; i < n; i++)
            require_msg(f2u(out[i]) == f2u(exp[i]), "SR decode element %zu: %a vs %a", i,
                        (double)out[i], (double)exp[i]);

        /* reproducible */
        ck_assert_int_eq(gift_encode(&p, x, n, pl2, L.total), 0);
        require_msg(memcmp(pl, pl2, L.total) == 0, "%s SR: same key, different payload",
                    gift_format_name(fmt));
        /* a different step / rank / seed / key / chunk draws other bits */
        if (n >= 1000 && fmt != GIFT_FMT_F32) {
            for (int field = 0; field < 5; field++) {
                q = p;
                switch (field) {
                case 0:
                    q.sr.step++;
                    break;
                case 1:
                    q.sr.rank++;
                    break;
                case 2:
                    q.sr.seed++;
                    break;
                case 3:
                    q.sr.key++;
                    break;
                default:
                    q.sr.chunk++;
                    break;
                }
                ck_assert_int_eq(gift_encode(&q, x, n, pl2, L.total), 0);
                require_msg(memcmp(pl, pl2, L.total) != 0,
                            "%s SR: changing key field %d gave the same payload",
                            gift_format_name(fmt), field);
            }
            /* RNE ignores the key */
            q = p;
            q.stochastic = 0;
            ck_assert_int_eq(gift_encode(&q, x, n, pl, L.total), 0);
            q.sr.step += 5;
            q.sr.rank += 5;
            ck_assert_int_eq(gift_encode(&q, x, n, pl2, L.total), 0);
            require_msg(memcmp(pl, pl2, L.total) == 0, "%s RNE payload depends on the sr key",
                        gift_format_name(fmt));
        }
        free(pl);
        free(pl2);
        free(ref);
        free(x);
        free(out);
        free(exp);
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* Philox and SR bits                                                   */
/* ------------------------------------------------------------------ */

/* Philox4x32-10 written from the Random123 paper: round, then bump the key. */
static void ref_philox(const uint32_t ctr_in[4], const uint32_t key_in[2], uint32_t out[4])
{
    uint32_t c[4] = {ctr_in[0], ctr_in[1], ctr_in[2], ctr_in[3]}, k[2] = {key_in[0], key_in[1]};
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0], n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1], n3 = (uint32_t)p0;
        c[0] = n0;
        c[1] = n1;
        c[2] = n2;
        c[3] = n3;
        k[0] += 0x9E3779B9u;
        k[1] += 0xBB67AE85u;
    }
    memcpy(out, c, sizeof c);
}

START_TEST(test_philox_kat)
{
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    uint64_t s = 8;
    for (int i = 0; i < 3; i++) {
        uint32_t out[4], rout[4];
        gift_philox4x32(kat[i], kat[i] + 4, out);
        ref_philox(kat[i], kat[i] + 4, rout);
        for (int j = 0; j < 4; j++) {
            require_msg(rout[j] == kat[i][6 + j],
                        "test's own Philox, KAT %d word %d: 0x%08x vs 0x%08x", i, j, rout[j],
                        kat[i][6 + j]);
            require_msg(
                out[j] == kat[i][6 + j],
                "gift_philox4x32 KAT %d word %d: got 0x%08x, expected 0x%08x (all: %08x %08x "
                "%08x %08x)",
                i, j, out[j], kat[i][6 + j], out[0], out[1], out[2], out[3]);
        }
    }
    for (int i = 0; i < 100000; i++) {
        uint32_t ck[6], out[4], rout[4];
        for (int j = 0; j < 6; j++)
            ck[j] = (uint32_t)rng_next(&s);
        gift_philox4x32(ck, ck + 4, out);
        ref_philox(ck, ck + 4, rout);
        require_msg(memcmp(out, rout, sizeof out) == 0,
                    "philox ctr %08x %08x %08x %08x key %08x %08x", ck[0], ck[1], ck[2], ck[3],
                    ck[4], ck[5]);
    }
}
END_TEST

START_TEST(test_sr_bits)
{
    gift_sr_key_t k = {0xABCDEF0123ull, 2, 17, 3, 12345};
    double sum = 0;
    size_t N = 1000000, ones[32] = {0}, same_prev = 0;
    uint32_t prev = 0;
    for (size_t i = 0; i < N; i++) {
        uint32_t b = gift_sr_bits(&k, i);
        require_msg(b == gift_sr_bits(&k, i), "gift_sr_bits not a pure function at %zu", i);
        sum += b;
        for (int j = 0; j < 32; j++)
            ones[j] += (b >> j) & 1u;
        same_prev += (i > 0 && b == prev);
        prev = b;
    }
    require_msg(same_prev < 3, "%zu consecutive equal draws", same_prev);
    /* mean of U[0, 2^32): sd of one draw 2^32/sqrt(12) */
    {
        double mean = sum / (double)N, se = 4294967296.0 / sqrt(12.0) / sqrt((double)N);
        require_msg(fabs(mean - 2147483648.0) < 5 * se, "sr bits mean %g", mean);
    }
    for (int j = 0; j < 32; j++)
        require_msg(fabs((double)ones[j] - 0.5 * (double)N) < 5 * 0.5 * sqrt((double)N),
                    "sr bit %d set %zu of %zu times", j, ones[j], N);
    /* every key field matters */
    for (int f = 0; f < 5; f++) {
        gift_sr_key_t q = k;
        int differ = 0;
        switch (f) {
        case 0:
            q.seed ^= 1ull << 40;
            break;
        case 1:
            q.rank++;
            break;
        case 2:
            q.key++;
            break;
        case 3:
            q.chunk++;
            break;
        default:
            q.step ^= 1ull << 35;
            break;
        }
        for (uint64_t i = 0; i < 64; i++)
            differ += gift_sr_bits(&q, i) != gift_sr_bits(&k, i);
        require_msg(differ >= 60, "changing key field %d changed only %d of 64 draws", f, differ);
    }
    /* large element indices */
    require_msg(gift_sr_bits(&k, 1ull << 33) != gift_sr_bits(&k, 0) ||
                    gift_sr_bits(&k, (1ull << 33) + 1) != gift_sr_bits(&k, 1),
                "index bits above 32 ignored");
}
END_TEST

/* ------------------------------------------------------------------ */
/* Boundary hits, names, errors                                         */
/* ------------------------------------------------------------------ */

static gift_hits_t hits_of(gift_format_t fmt, uint32_t block, const float *x, size_t n)
{
    gift_codec_params_t p;
    gift_layout_t L;
    gift_hits_t h = {99, 99, 99};
    uint8_t *pl;
    int rc;
    memset(&p, 0, sizeof p);
    p.fmt = fmt;
    p.block = block;
    ck_assert_int_eq(gift_layout(&p, n, &L), 0);
    pl = malloc(L.total);
    ck_assert_int_eq(gift_encode(&p, x, n, pl, L.total), 0);
    rc = gift_boundary_hits(&p, x, pl, L.total, n, &h);
    require_msg(rc == 0, "gift_boundary_hits(%s) = %d", gift_format_name(fmt), rc);
    require_msg(h.n == n, "hits.n %zu, expected %zu", h.n, n);
    free(pl);
    return h;
}

START_TEST(test_boundary_hits)
{
    /* saturated: the scaled |x| reached the rounding midpoint above the largest
     * finite value (bf16: 0x7F7F8000, e4m3: 464, e5m2: 61440, e2m1: 7);
     * flushed: x != 0 decoded to exactly zero. */
    {
        const float bmax = (float)R_BF16.vmax, bmid = u2f(0x7F7F8000u);
        const float x[] = {FLT_MAX,
                           -FLT_MAX,
                           1e-45f,
                           -1e-45f,
                           1.0f,
                           0.0f,
                           -0.0f,
                           bmax,
                           nextafterf(bmax, INFINITY),
                           nextafterf(bmid, 0.0f),
                           bmid,
                           -bmid};
        gift_hits_t h = hits_of(GIFT_FMT_BF16, 0, x, sizeof x / sizeof x[0]);
        require_msg(
            h.saturated == 4 && h.flushed == 2,
            "bf16: saturated %zu (expected 4: +-FLT_MAX, +-0x7F7F8000), flushed %zu (expected 2)",
            h.saturated, h.flushed);
    }
    {
        float x[32];
        gift_hits_t h;
        for (int i = 0; i < 32; i++)
            x[i] = 0.5f;
        x[0] = 448.0f;                     /* scale 1; the amax maps to 448 < 464: no saturation */
        x[1] = 1e-4f;                      /* flushes */
        x[2] = -1e-4f;                     /* flushes */
        x[3] = 0.0f;                       /* zero, not a flush */
        x[4] = 0x1p-10f;                   /* tie with 0 -> 0: flushes */
        x[5] = nextafterf(0x1p-10f, 1.0f); /* -> 2^-9 */
        x[6] = 1.0f;
        h = hits_of(GIFT_FMT_E4M3, 32, x, 32);
        require_msg(h.saturated == 0 && h.flushed == 3,
                    "e4m3: saturated %zu (expected 0), flushed %zu (expected 3)", h.saturated,
                    h.flushed);
        for (int i = 0; i < 32; i++)
            x[i] = 64.0f;
        x[0] = 57344.0f; /* e5m2: scale 1, min subnormal 2^-16 */
        x[1] = 1e-6f;    /* flushes */
        x[2] = -1e-6f;   /* flushes */
        x[3] = 0.0f;
        x[4] = 0x1p-17f;                   /* tie with 0 -> 0: flushes */
        x[5] = nextafterf(0x1p-17f, 1.0f); /* -> 2^-16 */
        h = hits_of(GIFT_FMT_E5M2, 32, x, 32);
        require_msg(h.saturated == 0 && h.flushed == 3,
                    "e5m2: saturated %zu (expected 0), flushed %zu (expected 3)", h.saturated,
                    h.flushed);
    }
    {
        /* tensor amax 2688: s_t = 1. Block 0 (amax 2688): eff 448, so x[1] = 1
         * scales to 1/448 and flushes. Block 1: amax 0.01640625 = 8.4 * 2^-9, its
         * scale rounds to the subnormal E4M3 2^-9 (r = 1.4 * 2^-9), eff = 2^-9 and
         * inv = 512 exactly: 0.01640625 -> 8.4 and 7/512 -> 7.0 reach the midpoint 7
         * (saturated), nextafter(7/512, 0) -> just below 7 (not), 0.0004 -> 0.2
         * flushes; 6.36 in block 2 (scale e4m3(1.06) = 1) -> 6.36 < 7 is not. */
        float x[48] = {0};
        gift_hits_t h;
        x[0] = 2688.0f;
        x[1] = 1.0f;
        x[16] = 0.01640625f;
        x[17] = 7.0f / 512.0f;
        x[18] = nextafterf(7.0f / 512.0f, 0.0f);
        x[19] = -0.0004f;
        x[32] = 6.36f;
        x[33] = -6.1f;
        h = hits_of(GIFT_FMT_NVFP4, 0, x, 48);
        require_msg(h.saturated == 2 && h.flushed == 2,
                    "nvfp4: saturated %zu (expected 2), flushed %zu (expected 2)", h.saturated,
                    h.flushed);
    }
    {
        float x[5] = {1.0f, -2.0f, 0.0f, 3.5f, 1e-30f};
        gift_hits_t h = hits_of(GIFT_FMT_F32, 0, x, 5);
        require_msg(h.saturated == 0 && h.flushed == 0, "f32: saturated %zu flushed %zu",
                    h.saturated, h.flushed);
    }
}
END_TEST

START_TEST(test_names)
{
    static const char *names[] = {"f32", "bf16", "fp8-e4m3", "fp8-e5m2", "nvfp4"};
    for (int f = 0; f < GIFT_FMT_COUNT_; f++) {
        const char *nm = gift_format_name((gift_format_t)f);
        require_msg(nm && strcmp(nm, names[f]) == 0, "format %d named '%s', expected '%s'", f,
                    nm ? nm : "(null)", names[f]);
        require_msg(gift_format_parse(nm) == f, "parse('%s') = %d", nm, gift_format_parse(nm));
    }
    ck_assert_int_eq(gift_format_parse("fp8"), GIFT_FMT_E4M3);
    ck_assert_int_eq(gift_format_parse("bogus"), GIFT_EFORMAT);
    ck_assert_int_eq(gift_format_parse(""), GIFT_EFORMAT);
    ck_assert_int_eq(gift_format_parse("fp8-e4m3x"), GIFT_EFORMAT);
    for (int s = GIFT_SIMD_SCALAR; s <= GIFT_SIMD_AVX512; s++)
        require_msg(gift_simd_name((gift_simd_t)s) != NULL && gift_simd_name((gift_simd_t)s)[0],
                    "simd %d has no name", s);
}
END_TEST

START_TEST(test_strerror)
{
    const char *seen[1 - GIFT_ERR_MIN_];
    for (int c = 0; c > GIFT_ERR_MIN_; c--) {
        const char *m = gift_strerror(c), *unk = gift_strerror(-1000);
        require_msg(m != NULL && m[0] != '\0', "code %d has no message", c);
        require_msg(strcmp(m, unk) != 0, "code %d named like an unknown code: '%s'", c, m);
        seen[-c] = m;
        for (int d = 0; d < -c; d++)
            require_msg(strcmp(seen[d], m) != 0, "codes %d and %d share '%s'", -d, c, m);
    }
    require_msg(gift_strerror(GIFT_ERR_MIN_) != NULL, "GIFT_ERR_MIN_ gives NULL");
    require_msg(gift_strerror(12345) != NULL, "positive code gives NULL");
}
END_TEST

/* gift_encode_mean is gift_encode of x * scale + 0, byte for byte, on every
 * format, SIMD path, slice boundary and the large-block fallback. */
START_TEST(test_encode_mean)
{
    static const gift_format_t fmts[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2,
                                         GIFT_FMT_NVFP4};
    static const size_t ns[] = {1, 17, 4095, 4096, 4097, 20011};
    static const float scales[] = {1.0f, 0.5f, 1.0f / 3.0f, 1.0f / 7.0f};
    static const uint32_t blocks[] = {32, 128, 8192};
    const size_t nmax = 20011, cap = 4 * 20011 + 4096;
    float *x = malloc(nmax * sizeof *x), *y = malloc(nmax * sizeof *y);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    uint64_t seed = 42;
    ck_assert_msg(x && y && a && b, "out of memory");
    fill_varied(x, nmax, &seed);
    for (size_t i = 0; i < nmax; i += 7)
        x[i] = -0.0f; /* -0 must come out as +0 */
    for (int path = 0; path < 3; path++) {
        if (gift_simd_force((gift_simd_t)path) != 0)
            continue;
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
            for (size_t bi = 0; bi < 3; bi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                    for (size_t si = 0; si < 4; si++) {
                        gift_codec_params_t p = {.fmt = fmts[f], .block = blocks[bi]};
                        gift_layout_t l;
                        size_t n = ns[ni];
                        int ra, rb;
                        if ((fmts[f] != GIFT_FMT_E4M3 && fmts[f] != GIFT_FMT_E5M2) && bi > 0)
                            continue;
                        for (size_t i = 0; i < n; i++)
                            y[i] = x[i] * scales[si] + 0.0f;
                        ck_assert_int_eq(gift_layout(&p, n, &l), 0);
                        memset(a, 0xA5, cap);
                        memset(b, 0x5A, cap);
                        ra = gift_encode(&p, y, n, a, cap);
                        rb = gift_encode_mean(&p, x, n, scales[si], b, cap);
                        require_msg(ra == rb, "%s path %d block %u n %zu scale %g: rc %d vs %d",
                                    gift_format_name(fmts[f]), path, blocks[bi], n,
                                    (double)scales[si], ra, rb);
                        if (ra == 0 && memcmp(a, b, l.total) != 0) {
                            size_t k = 0;
                            while (a[k] == b[k])
                                k++;
                            ck_abort_msg("%s path %d block %u n %zu scale %g: byte %zu of %zu: "
                                         "0x%02x vs 0x%02x",
                                         gift_format_name(fmts[f]), path, blocks[bi], n,
                                         (double)scales[si], k, l.total, a[k], b[k]);
                        }
                    }
    }
    {
        gift_codec_params_t p = {.fmt = GIFT_FMT_E4M3};
        x[5] = NAN;
        ck_assert_int_eq(gift_encode_mean(&p, x, 100, 0.5f, b, cap), GIFT_ENONFINITE);
        p.fmt = GIFT_FMT_NVFP4;
        ck_assert_int_eq(gift_encode_mean(&p, x, 100, 0.5f, b, cap), GIFT_ENONFINITE);
        p.stochastic = 1;
        ck_assert_int_eq(gift_encode_mean(&p, y, 100, 0.5f, b, cap), GIFT_EINVAL);
        p.stochastic = 0;
        ck_assert_int_eq(gift_encode_mean(&p, y, 100, 0.0f, b, cap), GIFT_EINVAL);
    }
    gift_simd_force(gift_simd_best());
    free(x);
    free(y);
    free(a);
    free(b);
}
END_TEST

/* gift_decode_encode_mean is gift_decode[_acc] into a sum, then
 * gift_encode_mean of it, byte for byte: every push x pull format, SIMD
 * path, slice boundary, with and without an accumulator; a bad payload
 * leaves out untouched; an fp8 block that does not divide the slice is
 * refused (GIFT_EFORMAT) for the caller's two-step path. */
/* gift_vec_add / gift_vec_sub equal the plain loops bit for bit on every
 * SIMD path, sizes around the vector widths, in place (dst == a, dst == b). */
START_TEST(test_vec_add_sub)
{
    enum { N = 1031 };
    static float a[N], b[N], want[N], got[N];
    uint64_t seed = 5;
    long compared = 0;
    fill_varied(a, N, &seed);
    fill_varied(b, N, &seed);
    a[3] = -0.0f;
    b[3] = -0.0f; /* -0 + -0 = -0; -0 - -0 = +0 */
    a[4] = 0.0f;
    b[4] = -0.0f;
    for (int path = 0; path < 3; path++) {
        if (gift_simd_force((gift_simd_t)path) != 0)
            continue;
        for (size_t n = 0; n <= N; n += (n < 40 ? 1 : 97)) {
            for (int op = 0; op < 4; op++) {
                for (size_t i = 0; i < n; i++)
                    want[i] = op == 0 ? a[i] + b[i] : a[i] - b[i];
                memcpy(got, op == 3 ? b : a, n * sizeof *got);
                if (op == 0)
                    gift_vec_add(got, b, n); /* p += e */
                else if (op == 1)
                    gift_vec_sub(a, b, n, got);
                else if (op == 2)
                    gift_vec_sub(got, b, n, got); /* dst == a */
                else
                    gift_vec_sub(a, got, n, got); /* dst == b */
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&want[i], &got[i], sizeof(float)) != 0)
                        ck_abort_msg("path %d n %zu op %d element %zu: %.9g vs %.9g", path, n, op,
                                     i, (double)want[i], (double)got[i]);
                compared++;
            }
        }
    }
    gift_simd_force(gift_simd_best());
    ck_assert_msg(compared > 100, "only %ld comparisons", compared);
}
END_TEST

/* gift_encode_mean_ef gives the bytes and the residual of the passes it
 * replaces (the shard's reference): v = (x * scale + 0) + e, gift_encode(v),
 * e = v - gift_decode(...), on every SIMD path, format, size around the
 * slice, both fp8 blocks that divide 4096, over three steps (the residual
 * feeds the next); an all-zero nvfp4 mean keeps e = v; an fp8 block that
 * does not divide 4096 gives GIFT_EFORMAT with nothing written; an
 * overflowing v gives GIFT_ENONFINITE and a zeroed residual. */
START_TEST(test_encode_mean_ef)
{
    static const gift_format_t fmts[] = {GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2,
                                         GIFT_FMT_NVFP4, GIFT_FMT_F32};
    static const size_t ns[] = {1, 17, 4095, 4097, 12301};
    static const uint32_t blocks[] = {32, 128};
    const size_t nmax = 12301, cap = 4 * 12301 + 4096;
    float *x = malloc(nmax * sizeof *x), *ea = malloc(nmax * sizeof *ea),
          *eb = malloc(nmax * sizeof *eb), *v = malloc(nmax * sizeof *v);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    uint64_t seed = 11;
    long compared = 0;
    ck_assert_msg(x && ea && eb && v && a && b, "out of memory");
    fill_varied(x, nmax, &seed);
    for (int path = 0; path < 3; path++) {
        if (gift_simd_force((gift_simd_t)path) != 0)
            continue;
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
            for (size_t bi = 0; bi < 2; bi++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    gift_codec_params_t p = {.fmt = fmts[fi], .block = blocks[bi]};
                    gift_layout_t l;
                    size_t n = ns[ni];
                    const float scale = 1.0f / 3.0f;
                    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
                    memset(ea, 0, n * sizeof *ea);
                    memset(eb, 0, n * sizeof *eb);
                    for (int step = 0; step < 3; step++) {
                        int ra, rb;
                        for (size_t i = 0; i < n; i++)
                            v[i] = (x[(i * 7 + (size_t)step) % n] * scale + 0.0f) + ea[i];
                        memset(a, 0xA5, cap);
                        memset(b, 0x5A, cap);
                        ra = gift_encode(&p, v, n, a, cap);
                        ck_assert_int_eq(ra, 0);
                        ck_assert_int_eq(gift_decode(&p, a, l.total, n, ea), 0);
                        for (size_t i = 0; i < n; i++) {
                            float t = v[i];
                            v[i] = x[(i * 7 + (size_t)step) % n]; /* this step's input */
                            ea[i] = t - ea[i];
                        }
                        rb = gift_encode_mean_ef(&p, v, n, scale, eb, b, cap);
                        require_msg(rb == 0, "%s block %u path %d n %zu step %d: rc %d",
                                    gift_format_name(p.fmt), p.block, path, n, step, rb);
                        if (memcmp(a, b, l.total) != 0) {
                            size_t k = 0;
                            while (a[k] == b[k])
                                k++;
                            ck_abort_msg("%s block %u path %d n %zu step %d: byte %zu of %zu: "
                                         "0x%02x vs 0x%02x",
                                         gift_format_name(p.fmt), p.block, path, n, step, k,
                                         l.total, a[k], b[k]);
                        }
                        for (size_t i = 0; i < n; i++)
                            if (memcmp(&ea[i], &eb[i], sizeof(float)) != 0)
                                ck_abort_msg("%s block %u path %d n %zu step %d: residual %zu "
                                             "%.9g vs %.9g",
                                             gift_format_name(p.fmt), p.block, path, n, step, i,
                                             (double)ea[i], (double)eb[i]);
                        compared++;
                    }
                }
    }
    gift_simd_force(gift_simd_best());
    ck_assert_msg(compared >= 2 * 5 * 5 * 3, "only %ld comparisons", compared);
    {
        /* nvfp4 of an all-zero mean: zero payload, e = v. */
        gift_codec_params_t p = {.fmt = GIFT_FMT_NVFP4};
        float z[40] = {0}, e[40];
        for (int i = 0; i < 40; i++)
            e[i] = (float)i * 1e-40f; /* subnormal: s_t below FLT_MIN */
        ck_assert_int_eq(gift_encode_mean_ef(&p, z, 40, 0.5f, e, a, cap), 0);
        for (int i = 0; i < 40; i++)
            require_msg(e[i] == (float)i * 1e-40f, "e[%d] = %g", i, (double)e[i]);
        /* an fp8 block that does not divide 4096: nothing written */
        p.fmt = GIFT_FMT_E4M3;
        p.block = 96;
        memset(a, 0x77, 64);
        ck_assert_int_eq(gift_encode_mean_ef(&p, x, 300, 0.5f, eb, a, cap), GIFT_EFORMAT);
        ck_assert_msg(a[0] == 0x77 && a[63] == 0x77, "EFORMAT wrote the payload");
        /* overflow: ENONFINITE, residual dropped */
        p.block = 32;
        for (int i = 0; i < 64; i++)
            e[i % 40] = 1.0f;
        z[5] = FLT_MAX;
        e[5] = FLT_MAX;
        ck_assert_int_eq(gift_encode_mean_ef(&p, z, 40, 1.0f, e, a, cap), GIFT_ENONFINITE);
        for (int i = 0; i < 40; i++)
            require_msg(e[i] == 0.0f, "e[%d] = %g after an overflow", i, (double)e[i]);
        /* bad arguments */
        ck_assert_int_eq(gift_encode_mean_ef(&p, z, 40, 0.0f, e, a, cap), GIFT_EINVAL);
        ck_assert_int_eq(gift_encode_mean_ef(&p, z, 40, 1.0f, NULL, a, cap), GIFT_EINVAL);
    }
    free(x);
    free(ea);
    free(eb);
    free(v);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_decode_encode_mean)
{
    static const gift_format_t fmts[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2,
                                         GIFT_FMT_NVFP4};
    static const size_t ns[] = {1, 17, 4095, 4097, 12301};
    static const float scales[] = {1.0f, 1.0f / 3.0f};
    const size_t nf = sizeof fmts / sizeof fmts[0], nmax = 12301, cap = 4 * 12301 + 4096;
    float *x = malloc(nmax * sizeof *x), *acc = malloc(nmax * sizeof *acc),
          *y = malloc(nmax * sizeof *y), *e0 = malloc(nmax * sizeof *e0),
          *ea = malloc(nmax * sizeof *ea), *eb = malloc(nmax * sizeof *eb);
    uint8_t *pay = malloc(cap), *a = malloc(cap), *b = malloc(cap);
    uint64_t seed = 7;
    long compared = 0;
    ck_assert_msg(x && acc && y && e0 && ea && eb && pay && a && b, "out of memory");
    fill_varied(x, nmax, &seed);
    fill_varied(acc, nmax, &seed);
    for (size_t i = 0; i < nmax; i += 11)
        acc[i] = -x[i];               /* sums of exactly zero and -0 */
    for (size_t i = 0; i < nmax; i++) /* a residual for the _ef pair, some of it zero */
        e0[i] = i % 5 == 0 ? 0.0f : x[(i * 7) % nmax] * 1e-3f;
    for (int path = 0; path < 3; path++) {
        if (gift_simd_force((gift_simd_t)path) != 0)
            continue;
        for (size_t fi = 0; fi < nf; fi++)
            for (size_t fo = 0; fo < nf; fo++)
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                    for (int with_acc = 0; with_acc < 2; with_acc++)
                        for (size_t si = 0; si < 2; si++) {
                            gift_codec_params_t pi = {.fmt = fmts[fi], .block = 32};
                            gift_codec_params_t po = {.fmt = fmts[fo], .block = 128};
                            gift_layout_t li, lo;
                            size_t n = ns[ni];
                            const float *ac = with_acc ? acc : NULL;
                            int ra, rb;
                            ck_assert_int_eq(gift_layout(&pi, n, &li), 0);
                            ck_assert_int_eq(gift_layout(&po, n, &lo), 0);
                            ck_assert_int_eq(gift_encode(&pi, x, n, pay, cap), 0);
                            if (with_acc) {
                                memcpy(y, acc, n * sizeof *y);
                                ra = gift_decode_acc(&pi, pay, li.total, n, y);
                            } else {
                                ra = gift_decode(&pi, pay, li.total, n, y);
                            }
                            ck_assert_int_eq(ra, 0);
                            memset(a, 0xA5, cap);
                            memset(b, 0x5A, cap);
                            ra = gift_encode_mean(&po, y, n, scales[si], a, cap);
                            rb = gift_decode_encode_mean(&pi, pay, li.total, ac, n, scales[si], &po,
                                                         b, cap);
                            require_msg(ra == rb,
                                        "%s -> %s path %d n %zu acc %d scale %g: rc %d vs %d",
                                        gift_format_name(fmts[fi]), gift_format_name(fmts[fo]),
                                        path, n, with_acc, (double)scales[si], ra, rb);
                            if (ra == 0 && memcmp(a, b, lo.total) != 0) {
                                size_t k = 0;
                                while (a[k] == b[k])
                                    k++;
                                ck_abort_msg("%s -> %s path %d n %zu acc %d scale %g: byte %zu "
                                             "of %zu: 0x%02x vs 0x%02x",
                                             gift_format_name(fmts[fi]), gift_format_name(fmts[fo]),
                                             path, n, with_acc, (double)scales[si], k, lo.total,
                                             a[k], b[k]);
                            }
                            /* With the pull's error feedback: the same bytes and
                             * the same residual as the two steps. */
                            memcpy(ea, e0, n * sizeof *ea);
                            memcpy(eb, e0, n * sizeof *eb);
                            memset(a, 0xA5, cap);
                            memset(b, 0x5A, cap);
                            ra = gift_encode_mean_ef(&po, y, n, scales[si], ea, a, cap);
                            rb = gift_decode_encode_mean_ef(&pi, pay, li.total, ac, n, scales[si],
                                                            &po, eb, b, cap);
                            require_msg(ra == rb,
                                        "ef %s -> %s path %d n %zu acc %d scale %g: rc %d vs %d",
                                        gift_format_name(fmts[fi]), gift_format_name(fmts[fo]),
                                        path, n, with_acc, (double)scales[si], ra, rb);
                            require_msg(ra != 0 || memcmp(a, b, lo.total) == 0,
                                        "ef %s -> %s path %d n %zu acc %d scale %g: bytes differ",
                                        gift_format_name(fmts[fi]), gift_format_name(fmts[fo]),
                                        path, n, with_acc, (double)scales[si]);
                            for (size_t k = 0; k < n; k++)
                                if (memcmp(&ea[k], &eb[k], sizeof *ea) != 0)
                                    ck_abort_msg("ef %s -> %s path %d n %zu acc %d scale %g: "
                                                 "residual %zu %.9g vs %.9g",
                                                 gift_format_name(fmts[fi]),
                                                 gift_format_name(fmts[fo]), path, n, with_acc,
                                                 (double)scales[si], k, (double)ea[k],
                                                 (double)eb[k]);
                            compared++;
                        }
    }
    require_msg(compared == 3L * 5 * 5 * 5 * 2 * 2 || compared == 2L * 5 * 5 * 5 * 2 * 2 ||
                    compared == 5L * 5 * 5 * 2 * 2,
                "compared %ld cases", compared);
    gift_simd_force(gift_simd_best());
    {
        gift_codec_params_t pi = {.fmt = GIFT_FMT_E4M3}, po = {.fmt = GIFT_FMT_E4M3};
        gift_layout_t li;
        const size_t n = 1000;
        float big[1000];
        ck_assert_int_eq(gift_layout(&pi, n, &li), 0);
        ck_assert_int_eq(gift_encode(&pi, x, n, pay, cap), 0);
        /* A NaN block scale: refused before out is written. */
        memcpy(pay + 4, &(float){NAN}, 4);
        memset(b, 0x5A, cap);
        ck_assert_int_eq(gift_decode_encode_mean(&pi, pay, li.total, NULL, n, 0.5f, &po, b, cap),
                         GIFT_EBADCODE);
        for (size_t i = 0; i < cap; i++)
            require_msg(b[i] == 0x5A, "out byte %zu written (0x%02x) for a bad payload", i, b[i]);
        memcpy(eb, e0, n * sizeof *eb);
        ck_assert_int_eq(
            gift_decode_encode_mean_ef(&pi, pay, li.total, NULL, n, 0.5f, &po, eb, b, cap),
            GIFT_EBADCODE);
        for (size_t i = 0; i < cap; i++)
            require_msg(b[i] == 0x5A, "ef: out byte %zu written (0x%02x) for a bad payload", i,
                        b[i]);
        require_msg(memcmp(eb, e0, n * sizeof *eb) == 0, "ef: residual written for a bad payload");
        /* A sum past FLT_MAX: GIFT_ENONFINITE, as gift_encode_mean gives. */
        for (size_t i = 0; i < n; i++)
            big[i] = 3e38f;
        ck_assert_int_eq(gift_encode(&pi, big, n, pay, cap), 0);
        for (int pf = 0; pf < 2; pf++) { /* the pull in fp8, then nvfp4 */
            po.fmt = pf ? GIFT_FMT_NVFP4 : GIFT_FMT_E4M3;
            ck_assert_int_eq(gift_decode_encode_mean(&pi, pay, li.total, big, n, 0.5f, &po, b, cap),
                             GIFT_ENONFINITE);
            memcpy(eb, e0, n * sizeof *eb);
            ck_assert_int_eq(
                gift_decode_encode_mean_ef(&pi, pay, li.total, big, n, 0.5f, &po, eb, b, cap),
                GIFT_ENONFINITE);
            for (size_t i = 0; i < n; i++)
                require_msg(eb[i] == 0.0f, "ef overflow (%s pull): residual %zu is %g, want 0",
                            gift_format_name(po.fmt), i, (double)eb[i]);
        }
        /* A block that does not divide the slice, on either side. */
        po.fmt = GIFT_FMT_E4M3;
        po.block = 48;
        ck_assert_int_eq(gift_decode_encode_mean(&pi, pay, li.total, NULL, n, 0.5f, &po, b, cap),
                         GIFT_EFORMAT);
        memcpy(eb, e0, n * sizeof *eb);
        memset(b, 0x5A, cap);
        ck_assert_int_eq(
            gift_decode_encode_mean_ef(&pi, pay, li.total, NULL, n, 0.5f, &po, eb, b, cap),
            GIFT_EFORMAT);
        require_msg(b[0] == 0x5A && b[cap - 1] == 0x5A && memcmp(eb, e0, n * sizeof *eb) == 0,
                    "ef: GIFT_EFORMAT wrote out or the residual");
        po.block = 0;
        po.stochastic = 1;
        ck_assert_int_eq(gift_decode_encode_mean(&pi, pay, li.total, NULL, n, 0.5f, &po, b, cap),
                         GIFT_EINVAL);
        po.stochastic = 0;
        ck_assert_int_eq(
            gift_decode_encode_mean(&pi, pay, li.total - 64, NULL, n, 0.5f, &po, b, cap),
            GIFT_ENOSPC);
    }
    free(x);
    free(acc);
    free(y);
    free(e0);
    free(ea);
    free(eb);
    free(pay);
    free(a);
    free(b);
}
END_TEST

/* Payloads arrive at any offset of a connection's read buffer: decoding from
 * an odd address must give the same floats (and no misaligned access under
 * UBSan) on every format. */
START_TEST(test_unaligned_decode)
{
    static const gift_format_t fmts[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2,
                                         GIFT_FMT_NVFP4};
    const size_t n = 1003;
    float *x = malloc(n * sizeof *x), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    uint8_t *buf = malloc(8192 + 64), *mis = malloc(8192 + 64);
    ck_assert_msg(x && a && b && buf && mis, "out of memory");
    for (size_t i = 0; i < n; i++)
        x[i] = (float)sin((double)i * 0.37) * (float)(1 + i % 17);
    for (size_t k = 0; k < 3 * sizeof fmts / sizeof fmts[0]; k++) {
        size_t f = k % (sizeof fmts / sizeof fmts[0]);
        gift_codec_params_t p = {.fmt = fmts[f]};
        gift_layout_t l;
        if (gift_simd_force((gift_simd_t)(k / (sizeof fmts / sizeof fmts[0]))) != 0)
            continue; /* this CPU lacks that path */
        ck_assert_int_eq(gift_layout(&p, n, &l), 0);
        ck_assert_msg(gift_encode(&p, x, n, buf, 8192) == 0, "encode %s",
                      gift_format_name(fmts[f]));
        ck_assert_msg(gift_decode(&p, buf, l.total, n, a) == 0, "decode %s",
                      gift_format_name(fmts[f]));
        for (size_t off = 1; off < 4; off++) {
            memcpy(mis + off, buf, l.total);
            ck_assert_msg(gift_decode(&p, mis + off, l.total, n, b) == 0, "decode %s at +%zu",
                          gift_format_name(fmts[f]), off);
            ck_assert_msg(memcmp(a, b, n * sizeof *a) == 0, "%s decoded at +%zu differs",
                          gift_format_name(fmts[f]), off);
            for (size_t i = 0; i < n; i++)
                b[i] = 1.0f;
            ck_assert_msg(gift_decode_acc(&p, mis + off, l.total, n, b) == 0,
                          "decode_acc %s at +%zu", gift_format_name(fmts[f]), off);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(b[i] == 1.0f + a[i], "%s acc at +%zu element %zu: %a != 1 + %a",
                              gift_format_name(fmts[f]), off, i, b[i], a[i]);
        }
    }
    gift_simd_force(gift_simd_best());
    free(x);
    free(a);
    free(b);
    free(buf);
    free(mis);
}
END_TEST

static Suite *format_suite(void)
{
    Suite *s = suite_create("codec_format");
    TCase *tc;

    tc = tcase_create("decode");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_ref_tables_sane);
    tcase_add_test(tc, test_decode_e4m3_all);
    tcase_add_test(tc, test_decode_e5m2_all);
    tcase_add_test(tc, test_decode_e2m1_all);
    tcase_add_test(tc, test_decode_bf16_all);
    suite_add_tcase(s, tc);

    tc = tcase_create("encode");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_encode_known_codes);
    tcase_add_loop_test(tc, test_encode_edges, 0, 4);
    tcase_add_loop_test(tc, test_encode_random, 0, 4);
    suite_add_tcase(s, tc);

    tc = tcase_create("block");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup_scalar, teardown_best);
    tcase_add_test(tc, test_layout_blocks);
    tcase_add_test(tc, test_scale_threshold);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_layout_overflow);
    tcase_add_loop_test(tc, test_block_roundtrip, 0, N_COMBOS);
    tcase_add_loop_test(tc, test_block_special, 0, N_COMBOS);
    tcase_add_test(tc, test_enospc);
    tcase_add_test(tc, test_padding_ignored);
    suite_add_tcase(s, tc);

    tc = tcase_create("mean");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_encode_mean);
    tcase_add_test(tc, test_decode_encode_mean);
    tcase_add_test(tc, test_encode_mean_ef);
    tcase_add_test(tc, test_vec_add_sub);
    suite_add_tcase(s, tc);

    tc = tcase_create("unaligned");
    tcase_add_test(tc, test_unaligned_decode);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup_scalar, teardown_best);
    tcase_add_test(tc, test_nonfinite_input);
    tcase_add_test(tc, test_bad_payload);
    suite_add_tcase(s, tc);

    tc = tcase_create("stochastic");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup_scalar, teardown_best);
    tcase_add_loop_test(tc, test_sr_unbiased, 0, N_SR_CASES);
    tcase_add_loop_test(tc, test_sr_unbiased_over_steps, 0, 2);
    tcase_add_loop_test(tc, test_sr_block, 0, N_COMBOS);
    tcase_add_test(tc, test_philox_kat);
    tcase_add_test(tc, test_sr_bits);
    suite_add_tcase(s, tc);

    tc = tcase_create("misc");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup_scalar, teardown_best);
    tcase_add_test(tc, test_boundary_hits);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_strerror);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed;
    double t0 = now_s();

    tables_init();
    fprintf(stderr, "zero-block rule: %s\n",
            ftz_scales ? "scales below FLT_MIN flush (ftz)" : "header (non-finite inverse)");
#ifdef GIFT_HAVE_CUDA_FP_HEADERS
    fprintf(stderr, "CUDA host conversions: used as a second reference\n");
#else
    fprintf(stderr, "CUDA host conversions: not available\n");
#endif
    failed = gift_test_run(format_suite(), CK_NORMAL);
    fprintf(stderr, "test_codec_format: %.1f s\n", now_s() - t0);
    return failed != 0;
}
