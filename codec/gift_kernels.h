/*
 * gift_kernels.h: the table of inner loops behind gift_encode/gift_decode.
 * Internal to codec/: format.c holds the scalar reference table and the
 * dispatch; simd_avx2.c and simd_avx512.c hold their twins. Every entry of
 * every table produces the same bits as the scalar one.
 */
#ifndef GIFT_KERNELS_H
#define GIFT_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gift_codec.h"

/* A small float format: mantissa bits, exponent bias, largest finite code
 * without its sign, the sign bit's position, the fp32 bits of the smallest
 * normal, and the finite maximum as a float. */
typedef struct gift__minifmt {
    int mbits;
    int bias;
    uint32_t maxcode;
    int signpos;
    float fmax;
} gift__minifmt_t;

extern const gift__minifmt_t gift__fmt_e4m3, gift__fmt_e5m2, gift__fmt_e2m1;

typedef struct gift__kernels {
    /* fp8: encodes all blocks (amax, scale, codes). Returns GIFT_ENONFINITE as
     * soon as a block holds NaN/Inf. */
    int (*fp8_encode)(const gift__minifmt_t *f, const float *x, size_t n, size_t block,
                      float *scales, uint8_t *codes);
    /* out = value * scale (acc == 0) or out += value * scale (acc == 1). */
    void (*fp8_decode)(const gift__minifmt_t *f, const float *scales, const uint8_t *codes,
                       size_t n, size_t block, float *out, int acc);
    /* Nonzero when any code is NaN/Inf under mask: (c & mask) == mask. */
    int (*byte_has_mask)(const uint8_t *codes, size_t n, uint8_t mask);
    /* Largest |x| bits (x as uint32 with the sign cleared); >= 0x7F800000
     * means NaN/Inf is present. */
    uint32_t (*amax_bits)(const float *x, size_t n);
    /* nvfp4 given the tensor scale s_t >= FLT_MIN: block scales and codes. */
    void (*nvfp4_encode)(const float *x, size_t n, float s_t, uint8_t *sb, uint8_t *codes);
    void (*nvfp4_decode)(const uint8_t *sb, float s_t, const uint8_t *codes, size_t n,
                         float *out, int acc);
    /* bf16: returns GIFT_ENONFINITE if any input is NaN/Inf. */
    int (*bf16_encode)(const float *x, size_t n, uint16_t *codes);
    void (*bf16_decode)(const uint16_t *codes, size_t n, float *out, int acc);
    /* dst[i] = x[i] * scale + 0.0f (gift_encode_mean's scaling). */
    void (*scale)(const float *x, size_t n, float scale, float *dst);
    /* f32: copies x to out; returns GIFT_ENONFINITE if any is NaN/Inf. */
    int (*f32_encode)(const float *x, size_t n, float *out);
    void (*f32_decode)(const float *codes, size_t n, float *out, int acc);
} gift__kernels_t;

extern const gift__kernels_t gift__kernels_scalar;

/* One nvfp4 block of len <= 16 elements by the reference arithmetic (RNE):
 * writes its scale byte and (len + 1) / 2 code bytes. SIMD tails use it. */
void gift__nvfp4_block(const float *x, size_t len, float s_t, uint8_t *sb, uint8_t *codes);
/* NULL when the compiler could not build that path. */
extern const gift__kernels_t *const gift__kernels_avx2;
extern const gift__kernels_t *const gift__kernels_avx512;

static inline uint32_t gift__f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float gift__u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Loads that tolerate any alignment: payloads arrive at arbitrary offsets of
 * a connection's read buffer. They compile to plain loads. */
static inline float gift__ldf(const void *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t gift__ldu16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* 2^e as a float for -126 <= e <= 127. */
static inline float gift__pow2f(int e)
{
    return gift__u2f((uint32_t)(e + 127) << 23);
}

/* The reference conversion of a finite float to a small float code, round to
 * nearest even, saturating at f->maxcode. Every SIMD path mirrors these exact
 * steps: the normal range rounds the fp32 bit pattern, the subnormal range
 * scales by a power of two (exact) and rounds to an integer. */
static inline uint32_t gift__cvt_rne(const gift__minifmt_t *f, float y)
{
    uint32_t b = gift__f2u(y);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t code;
    const int sh = 23 - f->mbits;
    if (a >= ((uint32_t)(128 - f->bias) << 23)) {
        uint32_t add = ((1u << (sh - 1)) - 1) + ((a >> sh) & 1u);
        code = ((a + add) >> sh) - ((uint32_t)(127 - f->bias) << f->mbits);
    } else {
        float t = gift__u2f(a) * gift__pow2f(f->bias - 1 + f->mbits);
        code = (uint32_t)((t + 0x1p23f) - 0x1p23f);
    }
    if (code > f->maxcode)
        code = f->maxcode;
    return code | ((b >> 31) << f->signpos);
}

/* The same with stochastic rounding from 32 random bits r: rounds up with
 * probability equal to the dropped fraction (unbiased below saturation). */
static inline uint32_t gift__cvt_sr(const gift__minifmt_t *f, float y, uint32_t r)
{
    uint32_t b = gift__f2u(y);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t code;
    const int sh = 23 - f->mbits;
    if (a >= ((uint32_t)(128 - f->bias) << 23)) {
        code = ((a + (r >> (32 - sh))) >> sh) - ((uint32_t)(127 - f->bias) << f->mbits);
    } else {
        float t = gift__u2f(a) * gift__pow2f(f->bias - 1 + f->mbits);
        float q = (float)(uint32_t)t; /* floor: t >= 0 and small */
        float frac = t - q;
        code = (uint32_t)q + (((float)(r >> 8) * 0x1p-24f) < frac ? 1u : 0u);
    }
    if (code > f->maxcode)
        code = f->maxcode;
    return code | ((b >> 31) << f->signpos);
}

/* Value of a small-float code (finite codes only). */
static inline float gift__mini_value(const gift__minifmt_t *f, uint32_t c)
{
    uint32_t mag = c & ((1u << f->signpos) - 1);
    int ebits = f->signpos - f->mbits;
    uint32_t e = mag >> f->mbits, m = mag & ((1u << f->mbits) - 1);
    float v;
    (void)ebits;
    if (e == 0)
        v = (float)m * gift__pow2f(1 - f->bias - f->mbits);
    else
        v = (1.0f + (float)m * gift__pow2f(-f->mbits)) * gift__pow2f((int)e - f->bias);
    return (c >> f->signpos) & 1u ? -v : v;
}

/* bf16 round to nearest even, saturating to the finite max. */
static inline uint16_t gift__bf16_rne(float y)
{
    uint32_t b = gift__f2u(y);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t code = (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;
    if (code > 0x7F7Fu)
        code = 0x7F7Fu;
    return (uint16_t)(code | ((b >> 31) << 15));
}

static inline uint16_t gift__bf16_sr(float y, uint32_t r)
{
    uint32_t b = gift__f2u(y);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t code = (a + (r >> 16)) >> 16;
    if (code > 0x7F7Fu)
        code = 0x7F7Fu;
    return (uint16_t)(code | ((b >> 31) << 15));
}

#endif
