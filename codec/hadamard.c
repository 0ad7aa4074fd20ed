/*
 * hadamard.c: the Hadamard treatment (issue 42): random signs, then an
 * orthonormal fast Walsh-Hadamard transform along each row, in blocks of
 * gift_hadamard_block(cols) columns. The scalar loops below are the
 * reference; the AVX2 and AVX-512 twins run the very same float operations
 * in the same order (one add or subtract per butterfly, stage by stage, then
 * one multiply by the scale), so every path gives the same bits. The path is
 * the codec's (gift_simd_active: GIFT_SIMD or gift_simd_force).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"

#define SIGN_BIT 0x80000000u

uint32_t gift_hadamard_block(uint32_t cols)
{
    uint32_t b;
    if (cols == 0)
        return 0;
    b = cols & (~cols + 1u); /* the lowest set bit: the largest power of two dividing cols */
    return b > GIFT_HADAMARD_MAX_BLOCK ? GIFT_HADAMARD_MAX_BLOCK : b;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t gift_hadamard_seed(const char *name, uint32_t key, uint32_t epoch)
{
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a 64 of the name */
    for (const unsigned char *p = (const unsigned char *)(name ? name : ""); *p != '\0'; p++) {
        h ^= *p;
        h *= 0x100000001B3ull;
    }
    h = mix64(h ^ ((uint64_t)key * 0x9E3779B97F4A7C15ull));
    return mix64(h ^ ((uint64_t)epoch << 32 | 0x48414441u)); /* "HADA" */
}

int gift_hadamard_init(gift_hadamard_t *h, uint32_t cols, uint64_t seed)
{
    if (h == NULL)
        return GIFT_EINVAL;
    memset(h, 0, sizeof *h);
    if (cols == 0)
        return GIFT_EINVAL;
    if ((h->signs = malloc((size_t)cols * sizeof *h->signs)) == NULL)
        return GIFT_ENOMEM;
    h->cols = cols;
    h->block = gift_hadamard_block(cols);
    h->seed = seed;
    h->scale = (float)(1.0 / sqrt((double)h->block));
    for (uint32_t j = 0; j < cols; j += 64) {
        uint64_t bits = mix64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(j / 64 + 1));
        for (uint32_t i = 0; i < 64 && j + i < cols; i++)
            h->signs[j + i] = (uint32_t)((bits >> i) & 1u) << 31;
    }
    return 0;
}

void gift_hadamard_free(gift_hadamard_t *h)
{
    if (h == NULL)
        return;
    free(h->signs);
    memset(h, 0, sizeof *h);
}

static inline float xor_sign(float x, uint32_t s)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u ^= s;
    memcpy(&x, &u, 4);
    return x;
}

/* The butterflies of an unnormalised transform of b floats in place. */
static void fwht_stages(float *x, uint32_t b)
{
    for (uint32_t h = 1; h < b; h <<= 1)
        for (uint32_t i = 0; i < b; i += 2 * h)
            for (uint32_t j = i; j < i + h; j++) {
                float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
}

void gift_fwht(float *x, uint32_t b)
{
    float s = (float)(1.0 / sqrt((double)b));
    fwht_stages(x, b);
    for (uint32_t i = 0; i < b; i++)
        x[i] *= s;
}

/* One block: out = H (in ^ sf) * s, then ^ si (sf, si NULL: no signs). */
static void block_scalar(const float *in, const uint32_t *sf, const uint32_t *si, float *out,
                         uint32_t b, float s)
{
    for (uint32_t i = 0; i < b; i++)
        out[i] = sf != NULL ? xor_sign(in[i], sf[i]) : in[i];
    fwht_stages(out, b);
    for (uint32_t i = 0; i < b; i++) {
        out[i] *= s;
        if (si != NULL)
            out[i] = xor_sign(out[i], si[i]);
    }
}

typedef void (*block_fn)(const float *in, const uint32_t *sf, const uint32_t *si, float *out,
                         uint32_t b, float s);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f")))

/* One in-register stage: x times +-1 (the upper lane of each pair -1) plus
 * its partner lanes sw, in one fused multiply-add: the lower lane gets
 * fl(a + c), the upper fl(-c + a) = fl(a - c) (x * -1 is exact, and the
 * FMA rounds once), exactly the scalar butterfly's two results. */
static inline __m256 AVX2 bfly8(__m256 x, __m256 sw, __m256 pm)
{
    return _mm256_fmadd_ps(x, pm, sw);
}

/* The stages h = 1, 2, 4 inside one vector of 8. */
static inline __m256 AVX2 stages8(__m256 x)
{
    const __m256 p1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 p2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 p4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    x = bfly8(x, _mm256_permute_ps(x, 0xB1), p1);
    x = bfly8(x, _mm256_permute_ps(x, 0x4E), p2);
    return bfly8(x, _mm256_permute2f128_ps(x, x, 0x01), p4);
}

static inline __m256 AVX2 fin8(__m256 x, __m256 vs, const uint32_t *si)
{
    x = _mm256_mul_ps(x, vs);
    if (si != NULL)
        x = _mm256_castsi256_ps(
            _mm256_xor_si256(_mm256_castps_si256(x), _mm256_loadu_si256((const __m256i *)si)));
    return x;
}

/* One butterfly of the scalar loop on two vectors: (a, c) -> (a + c, a - c). */
#define BFLY(T, ADD, SUB, p, q)                                                                    \
    do {                                                                                           \
        T a_ = p, c_ = q;                                                                          \
        p = ADD(a_, c_);                                                                           \
        q = SUB(a_, c_);                                                                           \
    } while (0)

#define FINQ(FIN, x, idx) ((last) ? FIN(x, vs, si ? si + (idx) : NULL) : (x))

/* The wide stages (h = first .. b/2) over vectors of V floats: three per
 * pass where they fit (radix 8: stages h, 2h, 4h on x0..x7 = o[j + k h]),
 * else two, else one; the last pass scales and applies si (FIN). Every
 * element sees the scalar loop's operations in its order. Expects o, si, b,
 * vs in scope. */
#define WIDE_STAGES(T, V, LD, ST, ADD, SUB, FIN, first)                                            \
    for (uint32_t h = (first); h < b;) {                                                           \
        if (8 * h <= b) {                                                                          \
            int last = 8 * h == b;                                                                 \
            for (uint32_t i = 0; i < b; i += 8 * h)                                                \
                for (uint32_t j = i; j < i + h; j += (V)) {                                        \
                    T x0 = LD(o + j), x1 = LD(o + j + h), x2 = LD(o + j + 2 * h);                  \
                    T x3 = LD(o + j + 3 * h), x4 = LD(o + j + 4 * h), x5 = LD(o + j + 5 * h);      \
                    T x6 = LD(o + j + 6 * h), x7 = LD(o + j + 7 * h);                              \
                    BFLY(T, ADD, SUB, x0, x1);                                                     \
                    BFLY(T, ADD, SUB, x2, x3);                                                     \
                    BFLY(T, ADD, SUB, x4, x5);                                                     \
                    BFLY(T, ADD, SUB, x6, x7);                                                     \
                    BFLY(T, ADD, SUB, x0, x2);                                                     \
                    BFLY(T, ADD, SUB, x1, x3);                                                     \
                    BFLY(T, ADD, SUB, x4, x6);                                                     \
                    BFLY(T, ADD, SUB, x5, x7);                                                     \
                    BFLY(T, ADD, SUB, x0, x4);                                                     \
                    BFLY(T, ADD, SUB, x1, x5);                                                     \
                    BFLY(T, ADD, SUB, x2, x6);                                                     \
                    BFLY(T, ADD, SUB, x3, x7);                                                     \
                    ST(o + j, FINQ(FIN, x0, j));                                                   \
                    ST(o + j + h, FINQ(FIN, x1, j + h));                                           \
                    ST(o + j + 2 * h, FINQ(FIN, x2, j + 2 * h));                                   \
                    ST(o + j + 3 * h, FINQ(FIN, x3, j + 3 * h));                                   \
                    ST(o + j + 4 * h, FINQ(FIN, x4, j + 4 * h));                                   \
                    ST(o + j + 5 * h, FINQ(FIN, x5, j + 5 * h));                                   \
                    ST(o + j + 6 * h, FINQ(FIN, x6, j + 6 * h));                                   \
                    ST(o + j + 7 * h, FINQ(FIN, x7, j + 7 * h));                                   \
                }                                                                                  \
            h *= 8;                                                                                \
        } else if (4 * h <= b) {                                                                   \
            int last = 4 * h == b;                                                                 \
            for (uint32_t i = 0; i < b; i += 4 * h)                                                \
                for (uint32_t j = i; j < i + h; j += (V)) {                                        \
                    T x0 = LD(o + j), x1 = LD(o + j + h), x2 = LD(o + j + 2 * h);                  \
                    T x3 = LD(o + j + 3 * h);                                                      \
                    BFLY(T, ADD, SUB, x0, x1);                                                     \
                    BFLY(T, ADD, SUB, x2, x3);                                                     \
                    BFLY(T, ADD, SUB, x0, x2);                                                     \
                    BFLY(T, ADD, SUB, x1, x3);                                                     \
                    ST(o + j, FINQ(FIN, x0, j));                                                   \
                    ST(o + j + h, FINQ(FIN, x1, j + h));                                           \
                    ST(o + j + 2 * h, FINQ(FIN, x2, j + 2 * h));                                   \
                    ST(o + j + 3 * h, FINQ(FIN, x3, j + 3 * h));                                   \
                }                                                                                  \
            h *= 4;                                                                                \
        } else {                                                                                   \
            int last = 1; /* 2h == b */                                                            \
            for (uint32_t j = 0; j < h; j += (V)) {                                                \
                T x0 = LD(o + j), x1 = LD(o + j + h);                                              \
                BFLY(T, ADD, SUB, x0, x1);                                                         \
                ST(o + j, FINQ(FIN, x0, j));                                                       \
                ST(o + j + h, FINQ(FIN, x1, j + h));                                               \
            }                                                                                      \
            h *= 2;                                                                                \
        }                                                                                          \
    }

/* A block of b >= 8. */
static void AVX2 block_avx2(const float *in, const uint32_t *sf, const uint32_t *si, float *out,
                            uint32_t b, float s)
{
    const __m256 vs = _mm256_set1_ps(s);
    uint32_t first = 8;
#define LOAD8(i)                                                                                   \
    (sf != NULL                                                                                    \
         ? _mm256_castsi256_ps(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(in + (i))),   \
                                                _mm256_loadu_si256((const __m256i *)(sf + (i)))))  \
         : _mm256_loadu_ps(in + (i)))
    if (b >= 64) {
        /* The in-register stages and the stages 8, 16, 32 in one pass over
         * each 64-float group (as the AVX-512 path does with 128). */
        int last = b == 64;
        for (uint32_t i = 0; i < b; i += 64) {
            __m256 x0 = stages8(LOAD8(i)), x1 = stages8(LOAD8(i + 8));
            __m256 x2 = stages8(LOAD8(i + 16)), x3 = stages8(LOAD8(i + 24));
            __m256 x4 = stages8(LOAD8(i + 32)), x5 = stages8(LOAD8(i + 40));
            __m256 x6 = stages8(LOAD8(i + 48)), x7 = stages8(LOAD8(i + 56));
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x0, x1);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x2, x3);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x4, x5);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x6, x7);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x0, x2);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x1, x3);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x4, x6);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x5, x7);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x0, x4);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x1, x5);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x2, x6);
            BFLY(__m256, _mm256_add_ps, _mm256_sub_ps, x3, x7);
            _mm256_storeu_ps(out + i, last ? fin8(x0, vs, si ? si + i : NULL) : x0);
            _mm256_storeu_ps(out + i + 8, last ? fin8(x1, vs, si ? si + i + 8 : NULL) : x1);
            _mm256_storeu_ps(out + i + 16, last ? fin8(x2, vs, si ? si + i + 16 : NULL) : x2);
            _mm256_storeu_ps(out + i + 24, last ? fin8(x3, vs, si ? si + i + 24 : NULL) : x3);
            _mm256_storeu_ps(out + i + 32, last ? fin8(x4, vs, si ? si + i + 32 : NULL) : x4);
            _mm256_storeu_ps(out + i + 40, last ? fin8(x5, vs, si ? si + i + 40 : NULL) : x5);
            _mm256_storeu_ps(out + i + 48, last ? fin8(x6, vs, si ? si + i + 48 : NULL) : x6);
            _mm256_storeu_ps(out + i + 56, last ? fin8(x7, vs, si ? si + i + 56 : NULL) : x7);
        }
        first = 64;
    } else {
        for (uint32_t i = 0; i < b; i += 8) {
            __m256 x = stages8(LOAD8(i));
            if (b == 8)
                x = fin8(x, vs, si ? si + i : NULL);
            _mm256_storeu_ps(out + i, x);
        }
    }
#undef LOAD8
    {
        float *o = out;
        WIDE_STAGES(__m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, _mm256_sub_ps,
                    fin8, first)
    }
}

static inline __m512 AVX512 bfly16(__m512 x, __m512 sw, __m512 pm)
{
    return _mm512_fmadd_ps(x, pm, sw); /* as bfly8 */
}

static inline __m512 AVX512 fin16(__m512 x, __m512 vs, const uint32_t *si)
{
    x = _mm512_mul_ps(x, vs);
    if (si != NULL)
        x = _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(x), _mm512_loadu_si512((const void *)si)));
    return x;
}

/* A block of b >= 16: the stages h = 1..8 inside each vector of 16, then
 * the wide ones over vectors of 16, two per pass. */
static void AVX512 block_avx512(const float *in, const uint32_t *sf, const uint32_t *si, float *out,
                                uint32_t b, float s)
{
    const __m512 n1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const __m512 n2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1);
    const __m512 n4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1);
    const __m512 n8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m512 vs = _mm512_set1_ps(s);
    uint32_t first = 16;

#define LOAD16(i)                                                                                  \
    (sf != NULL                                                                                    \
         ? _mm512_castsi512_ps(_mm512_xor_si512(_mm512_loadu_si512((const void *)(in + (i))),      \
                                                _mm512_loadu_si512((const void *)(sf + (i)))))     \
         : _mm512_loadu_ps(in + (i)))
#define INREG16(x)                                                                                 \
    do {                                                                                           \
        x = bfly16(x, _mm512_permute_ps(x, 0xB1), n1);                                             \
        x = bfly16(x, _mm512_permute_ps(x, 0x4E), n2);                                             \
        x = bfly16(x, _mm512_shuffle_f32x4(x, x, 0xB1), n4);                                       \
        x = bfly16(x, _mm512_shuffle_f32x4(x, x, 0x4E), n8);                                       \
    } while (0)

    if (b >= 128) {
        /* The in-register stages and the stages 16, 32, 64 in one pass: 8
         * vectors of a 128-float group, each element's operations in the
         * scalar order (in-register stages first, then the wide ones). */
        int last = b == 128;
        for (uint32_t i = 0; i < b; i += 128) {
            __m512 x0 = LOAD16(i), x1 = LOAD16(i + 16), x2 = LOAD16(i + 32);
            __m512 x3 = LOAD16(i + 48), x4 = LOAD16(i + 64), x5 = LOAD16(i + 80);
            __m512 x6 = LOAD16(i + 96), x7 = LOAD16(i + 112);
            INREG16(x0);
            INREG16(x1);
            INREG16(x2);
            INREG16(x3);
            INREG16(x4);
            INREG16(x5);
            INREG16(x6);
            INREG16(x7);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x0, x1);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x2, x3);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x4, x5);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x6, x7);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x0, x2);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x1, x3);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x4, x6);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x5, x7);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x0, x4);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x1, x5);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x2, x6);
            BFLY(__m512, _mm512_add_ps, _mm512_sub_ps, x3, x7);
            _mm512_storeu_ps(out + i, last ? fin16(x0, vs, si ? si + i : NULL) : x0);
            _mm512_storeu_ps(out + i + 16, last ? fin16(x1, vs, si ? si + i + 16 : NULL) : x1);
            _mm512_storeu_ps(out + i + 32, last ? fin16(x2, vs, si ? si + i + 32 : NULL) : x2);
            _mm512_storeu_ps(out + i + 48, last ? fin16(x3, vs, si ? si + i + 48 : NULL) : x3);
            _mm512_storeu_ps(out + i + 64, last ? fin16(x4, vs, si ? si + i + 64 : NULL) : x4);
            _mm512_storeu_ps(out + i + 80, last ? fin16(x5, vs, si ? si + i + 80 : NULL) : x5);
            _mm512_storeu_ps(out + i + 96, last ? fin16(x6, vs, si ? si + i + 96 : NULL) : x6);
            _mm512_storeu_ps(out + i + 112, last ? fin16(x7, vs, si ? si + i + 112 : NULL) : x7);
        }
        first = 128;
    } else {
        for (uint32_t i = 0; i < b; i += 16) {
            __m512 x = LOAD16(i);
            INREG16(x);
            if (b == 16)
                x = fin16(x, vs, si ? si + i : NULL);
            _mm512_storeu_ps(out + i, x);
        }
    }
#undef LOAD16
#undef INREG16
    {
        /* Radix 8 measured faster than 16 here (1.2-1.4x on a Zen 5 EPYC, b = 256..4096). */
        float *o = out;
        WIDE_STAGES(__m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_sub_ps,
                    fin16, first)
    }
}

static block_fn pick(uint32_t b)
{
    gift_simd_t s = gift_simd_active();
    if (s == GIFT_SIMD_AVX512 && b >= 16)
        return block_avx512;
    if (s != GIFT_SIMD_SCALAR && b >= 8 && __builtin_cpu_supports("fma"))
        return block_avx2;
    return block_scalar;
}
#else
static block_fn pick(uint32_t b)
{
    (void)b;
    return block_scalar;
}
#endif

/* Elements [i, i + len) of x rotated into buf: whole blocks (i and len
 * multiples of the block), the signs of their columns. */
typedef struct enc_ctx {
    const gift_hadamard_t *h;
    const float *x;
    block_fn fn;
} enc_ctx_t;

static int enc_fill(void *arg, size_t i, size_t len, float *buf)
{
    const enc_ctx_t *c = arg;
    uint32_t b = c->h->block;
    for (size_t o = 0; o < len; o += b)
        c->fn(c->x + i + o, c->h->signs + (i + o) % c->h->cols, NULL, buf + o, b, c->h->scale);
    return 0;
}

int gift_hadamard_encode(const gift_codec_params_t *p, const gift_hadamard_t *h, const float *x,
                         size_t rows, void *payload, size_t cap)
{
    enc_ctx_t c;
    gift_layout_t l;
    size_t n, slice;
    int rc;
    if (p == NULL || h == NULL || h->signs == NULL || (rows > 0 && x == NULL))
        return GIFT_EINVAL;
    if (p->fmt == GIFT_FMT_NVFP4 || p->stochastic)
        return GIFT_EFORMAT;
    if ((rc = gift_layout(p, 1, &l)) < 0)
        return rc;
    n = rows * h->cols;
    /* Whole blocks of both kinds (powers of two: the larger is a multiple of
     * the smaller), about 4096 floats: 16 KiB, in L1 while it is encoded. */
    slice = h->block > l.block ? h->block : (l.block ? l.block : 1);
    while (slice < 4096 && slice * 2 <= n)
        slice *= 2;
    c.h = h;
    c.x = x;
    c.fn = pick(h->block);
    return gift_encode_slices(p, n, slice, enc_fill, &c, payload, cap);
}

int gift_hadamard_apply(const gift_hadamard_t *h, int inverse, const float *in, size_t rows,
                        float *out)
{
    block_fn fn;
    uint32_t b;
    if (h == NULL || h->signs == NULL || h->block == 0 || (rows > 0 && (in == NULL || out == NULL)))
        return GIFT_EINVAL;
    b = h->block;
    fn = pick(b);
    for (size_t r = 0; r < rows; r++) {
        const float *x = in + r * h->cols;
        float *y = out + r * h->cols;
        for (uint32_t o = 0; o < h->cols; o += b)
            fn(x + o, inverse ? NULL : h->signs + o, inverse ? h->signs + o : NULL, y + o, b,
               h->scale);
    }
    return 0;
}
