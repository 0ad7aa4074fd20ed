/*
 * test_gpu_emu.cpp: the codec kernels of gpu/ (fp8.cu, nvfp4.cu, dense.cu and
 * the dispatch in codec.c) run on the CUDA emulator of gift_emu.h against the
 * CPU codec, byte for byte and bit for bit, on this machine with no GPU. It
 * checks the kernels' indexing, reductions, packing, padding, misalignment,
 * stochastic rounding and error paths; not the hardware FP8 conversion, not
 * timing (tests/gpu/test_gpu_*.c do, on a device; test_gpu_emu_transform and
 * test_gpu_emu_pipeline run two of them here on the emulator).
 */
#include "gift_emu.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "gift_codec.h"
#include "gift_gpu.h"
#include "gpu_internal.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double normal(uint64_t *s)
{
    double u1 = ((double)(rng(s) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = ((double)(rng(s) >> 11) + 0.5) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Kind 0: gradient-like; 1: a mix of subnormals, huge values, ties on a
 * power-of-two grid, runs of zeros and signed zeros. Never all zero. */
static void fill(float *x, size_t n, int kind, uint64_t *s)
{
    double scale = 1.0;
    for (size_t i = 0; i < n; i++) {
        if (kind == 0) {
            if (i % 97 == 0)
                scale = 1e-3 * exp(2.0 * normal(s));
            x[i] = (float)(scale * normal(s));
            continue;
        }
        switch (rng(s) % 7) {
        case 0: {
            uint32_t u = (uint32_t)rng(s) & 0x807FFFFFu; /* subnormal */
            memcpy(&x[i], &u, 4);
            break;
        }
        case 1:
            x[i] = ldexpf((float)((int)(rng(s) % 33) - 16), (int)(rng(s) % 41) - 20); /* ties */
            break;
        case 2:
            x[i] = (rng(s) & 1) ? -0.0f : 0.0f;
            break;
        case 3:
            x[i] = ldexpf((float)normal(s), 100 + (int)(rng(s) % 27)); /* huge */
            break;
        default:
            x[i] = ldexpf((float)normal(s), (int)(rng(s) % 60) - 30);
        }
    }
    x[rng(s) % n] = 1.5f;
}

static size_t first_diff(const void *a, const void *b, size_t n)
{
    const uint8_t *p = (const uint8_t *)a, *q = (const uint8_t *)b;
    for (size_t i = 0; i < n; i++)
        if (p[i] != q[i])
            return i;
    return n;
}

static int sync_err(gift_gpu_ctx_t *c)
{
    int e = *c->err_dev;
    *c->err_dev = 0;
    return e;
}

/* One case, as tests/gpu/test_gpu_codec.c's check_case: xoff and poff
 * misalign the input/output and the payload. */
static void check_case(gift_gpu_ctx_t *c, gift_format_t fmt, uint32_t block, int sr, size_t n,
                       int kind, size_t xoff, size_t poff, uint64_t seed)
{
    gift_codec_params_t p;
    gift_layout_t l;
    uint64_t s = seed;
    int rc;

    memset(&p, 0, sizeof p);
    p.fmt = fmt, p.block = block, p.stochastic = sr;
    p.sr.seed = rng(&s), p.sr.rank = (uint32_t)rng(&s), p.sr.key = 3, p.sr.chunk = 2;
    p.sr.step = rng(&s) >> 20;
    if (gift_layout(&p, n, &l) < 0) {
        CHECK(0, "layout");
        return;
    }
    std::vector<float> x(n + xoff), out_c(n), out_g(n + xoff), acc_c(n), acc_g(n + xoff);
    std::vector<uint8_t> pay_c(l.total), pay_g(l.total + poff, 0xA7);
    fill(x.data() + xoff, n, kind, &s);
    rc = gift_encode(&p, x.data() + xoff, n, pay_c.data(), l.total);
    CHECK(rc == 0, "cpu encode %d", rc);
    rc = gift_gpu_encode(c, &p, x.data() + xoff, n, pay_g.data() + poff, l.total);
    CHECK(rc == 0 && sync_err(c) == 0, "gpu encode");
    size_t at = first_diff(pay_c.data(), pay_g.data() + poff, l.total);
    CHECK(at == l.total,
          "encode %s block %u sr %d n %zu kind %d xoff %zu poff %zu: byte %zu/%zu "
          "(code_off %zu) cpu %02x gpu %02x",
          gift_format_name(fmt), block, sr, n, kind, xoff, poff, at, l.total, l.code_off,
          at < l.total ? pay_c[at] : 0, at < l.total ? pay_g[poff + at] : 0);
    memcpy(pay_g.data() + poff, pay_c.data(), l.total);
    CHECK(gift_decode(&p, pay_c.data(), l.total, n, out_c.data()) == 0, "cpu decode");
    memset(out_g.data(), 0xA7, out_g.size() * 4);
    rc = gift_gpu_decode(c, &p, pay_g.data() + poff, l.total, n, out_g.data() + xoff);
    CHECK(rc == 0 && sync_err(c) == 0, "gpu decode");
    at = first_diff(out_c.data(), out_g.data() + xoff, n * 4);
    CHECK(at == n * 4, "decode %s block %u n %zu: element %zu", gift_format_name(fmt), block, n,
          at / 4);
    fill(acc_c.data(), n, 0, &s);
    memcpy(acc_g.data() + xoff, acc_c.data(), n * 4);
    CHECK(gift_decode_acc(&p, pay_c.data(), l.total, n, acc_c.data()) == 0, "cpu decode_acc");
    rc = gift_gpu_decode_acc(c, &p, pay_g.data() + poff, l.total, n, acc_g.data() + xoff);
    CHECK(rc == 0 && sync_err(c) == 0, "gpu decode_acc");
    at = first_diff(acc_c.data(), acc_g.data() + xoff, n * 4);
    CHECK(at == n * 4, "decode_acc %s block %u n %zu: element %zu", gift_format_name(fmt), block, n,
          at / 4);
}

int main(void)
{
    static const gift_format_t fmts[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2,
                                         GIFT_FMT_NVFP4};
    static const size_t ns[] = {1, 31, 129, 1003, 4097};
    int err = 0;
    uint32_t word = 0;
    double tr = 0.0;
    gift_gpu_ctx_t c;

    memset(&c, 0, sizeof c);
    c.err_dev = &err, c.word_dev = &word, c.trace_dev = &tr;
    for (size_t f = 0; f < 5; f++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (int kind = 0; kind < 2; kind++)
                for (int sr = 0; sr < 2; sr++)
                    check_case(&c, fmts[f], 0, sr, ns[i], kind, 0, 0,
                               100 * f + 10 * i + 2 * kind + sr);
    /* Block sizes: 32 and 64 (sub-warp groups), 512 (a group over 4 warps),
     * 4096 (loops inside a CUDA block). */
    for (uint32_t b : {32u, 64u, 512u, 4096u})
        for (int sr = 0; sr < 2; sr++) {
            check_case(&c, GIFT_FMT_E4M3, b, sr, b > 1024 ? 4096 + 1029 : 2053, 1, 0, 0, b + sr);
            check_case(&c, GIFT_FMT_E5M2, b, sr, b > 1024 ? 4096 + 5 : 1001, 0, 0, 0, 7 * b + sr);
        }
    for (size_t f = 0; f < 5; f++) {
        check_case(&c, fmts[f], 0, 0, 1001, 1, 1, 3, 900 + f);
        check_case(&c, fmts[f], 0, 1, 1003, 0, 3, 1, 950 + f);
    }
    /* NaN input: ENONFINITE in the error word. */
    for (size_t f = 0; f < 5; f++) {
        gift_codec_params_t p;
        gift_layout_t l;
        std::vector<float> x(777, 0.5f);
        memset(&p, 0, sizeof p);
        p.fmt = fmts[f];
        gift_layout(&p, x.size(), &l);
        std::vector<uint8_t> pay(l.total);
        x[500] = NAN;
        CHECK(gift_gpu_encode(&c, &p, x.data(), x.size(), pay.data(), l.total) == 0, "launch");
        CHECK(sync_err(&c) == GIFT_ENONFINITE, "%s: NaN not refused", gift_format_name(fmts[f]));
    }
    /* A bad payload: EBADCODE, the accumulator untouched. */
    for (size_t f = 0; f < 5; f++) {
        gift_codec_params_t p;
        gift_layout_t l;
        uint64_t s = 5;
        std::vector<float> x(1000), acc(1000, 2.0f);
        memset(&p, 0, sizeof p);
        p.fmt = fmts[f];
        gift_layout(&p, x.size(), &l);
        std::vector<uint8_t> pay(l.total);
        fill(x.data(), x.size(), 0, &s);
        gift_encode(&p, x.data(), x.size(), pay.data(), l.total);
        if (p.fmt == GIFT_FMT_F32)
            memset(pay.data() + l.code_off + 40, 0xFF, 4);
        else if (p.fmt == GIFT_FMT_BF16)
            pay[l.code_off + 41] = 0x7F, pay[l.code_off + 40] = 0x80; /* +Inf */
        else if (p.fmt == GIFT_FMT_NVFP4)
            pay[4 + 3] = 0x7F;
        else
            pay[l.code_off + 999] = p.fmt == GIFT_FMT_E4M3 ? 0x7F : 0xFD;
        CHECK(gift_gpu_decode_acc(&c, &p, pay.data(), l.total, x.size(), acc.data()) == 0,
              "launch");
        CHECK(sync_err(&c) == GIFT_EBADCODE, "%s: bad payload not refused",
              gift_format_name(fmts[f]));
        for (float v : acc)
            CHECK(v == 2.0f, "%s: accumulator changed", gift_format_name(fmts[f]));
    }
    /* Error feedback. */
    {
        uint64_t s = 9;
        std::vector<float> p(3001), e(3001), d(3001), pc, ec(3001);
        fill(p.data(), p.size(), 1, &s);
        fill(e.data(), e.size(), 0, &s);
        fill(d.data(), d.size(), 0, &s);
        pc = p;
        for (size_t i = 0; i < p.size(); i++)
            pc[i] += e[i], ec[i] = pc[i] - d[i];
        gift_gpu_ef_add(&c, e.data(), p.size(), p.data());
        CHECK(memcmp(p.data(), pc.data(), p.size() * 4) == 0, "ef_add");
        gift_gpu_ef_update(&c, p.data(), d.data(), p.size(), e.data());
        CHECK(memcmp(e.data(), ec.data(), e.size() * 4) == 0, "ef_update");
    }
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
