/*
 * gift_kernels.h: the table of inner loops behind gift_encode/gift_decode.
 * Internal to codec/ and gpu/: format.c holds the scalar reference table and
 * the dispatch; simd_avx2.c and simd_avx512.c hold their twins. Every entry
 * of every table produces the same bits as the scalar one.
 *
 * The element conversions below are the reference arithmetic. They compile
 * for the host and, under nvcc, for the device too (GIFT__HD), so the CUDA
 * twins in gpu/ run these very lines: the GPU is bit-identical to the CPU by
 * construction, not by a second implementation.
 */
#ifndef GIFT_KERNELS_H
#define GIFT_KERNELS_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gift_codec.h"

/* Host-and-device marker for the shared inline arithmetic. */
#ifdef __CUDACC__
#define GIFT__HD __host__ __device__
#else
#define GIFT__HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

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
    void (*nvfp4_decode)(const uint8_t *sb, float s_t, const uint8_t *codes, size_t n, float *out,
                         int acc);
    /* bf16: returns GIFT_ENONFINITE if any input is NaN/Inf. */
    int (*bf16_encode)(const float *x, size_t n, uint16_t *codes);
    void (*bf16_decode)(const uint16_t *codes, size_t n, float *out, int acc);
    /* dst[i] = x[i] * scale + 0.0f (gift_encode_mean's scaling). */
    void (*scale)(const float *x, size_t n, float scale, float *dst);
    /* dst[i] = (x[i] * scale + 0.0f) + e[i] and dst[i] = a[i] - b[i]
     * (gift_encode_mean_ef: the mean plus the residual, the new residual). */
    void (*scale_add)(const float *x, const float *e, size_t n, float scale, float *dst);
    void (*sub)(const float *a, const float *b, size_t n, float *dst);
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

static inline GIFT__HD uint32_t gift__f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline GIFT__HD float gift__u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Loads that tolerate any alignment: payloads arrive at arbitrary offsets of
 * a connection's read buffer. They compile to plain loads. */
static inline GIFT__HD float gift__ldf(const void *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

static inline GIFT__HD uint16_t gift__ldu16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* 2^e as a float for -126 <= e <= 127. */
static inline GIFT__HD float gift__pow2f(int e)
{
    return gift__u2f((uint32_t)(e + 127) << 23);
}

/* The reference conversion of a finite float to a small float code, round to
 * nearest even, saturating at f->maxcode. Every SIMD path mirrors these exact
 * steps: the normal range rounds the fp32 bit pattern, the subnormal range
 * scales by a power of two (exact) and rounds to an integer. */
static inline GIFT__HD uint32_t gift__cvt_rne(const gift__minifmt_t *f, float y)
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
static inline GIFT__HD uint32_t gift__cvt_sr(const gift__minifmt_t *f, float y, uint32_t r)
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
static inline GIFT__HD float gift__mini_value(const gift__minifmt_t *f, uint32_t c)
{
    uint32_t mag = c & ((1u << f->signpos) - 1);
    uint32_t e = mag >> f->mbits, m = mag & ((1u << f->mbits) - 1);
    float v;
    if (e == 0)
        v = (float)m * gift__pow2f(1 - f->bias - f->mbits);
    else
        v = (1.0f + (float)m * gift__pow2f(-f->mbits)) * gift__pow2f((int)e - f->bias);
    return (c >> f->signpos) & 1u ? -v : v;
}

/* fp8 block scale amax / fmax and its inverse fmax / amax from the block's
 * largest magnitude (bits, finite); both 0 and returns 0 when the scale
 * would be below FLT_MIN (the block is encoded as all zeros). */
static inline int gift__fp8_block_scale(const gift__minifmt_t *f, uint32_t maxbits, float *scale,
                                        float *inv)
{
    float amax = gift__u2f(maxbits);
    float s = amax / f->fmax;
    if (!(s >= FLT_MIN)) {
        *scale = 0.0f;
        *inv = 0.0f;
        return 0;
    }
    *scale = s;
    *inv = f->fmax / amax;
    return 1;
}

/* The fp8 encode of the SIMD paths: blocks taken GIFT__FP8_GROUP at a time,
 * first every block's amax (amax) and scale (gift__fp8_block_scale), then
 * every block's codes (codes, or zeros for a zero block), so the serial part
 * of a block (reduction, divisions) overlaps the others instead of stalling
 * each. Returns 0 or GIFT_ENONFINITE (the blocks before the bad one are
 * written, as the scalar path leaves them). Always inlined into each SIMD
 * file's encode, so amax and codes become direct calls of that file's
 * target. */
#define GIFT__FP8_GROUP 8
/* How far ahead of the group being encoded the input is prefetched, every
 * line, for inputs of at least GIFT__FP8_PF_MIN bytes. A worker's gradient
 * (64 MiB encoded in 4 MiB chunks, not in the cache) was encoded at 0.7-1.0x
 * memcpy's rate without it and 1.0-1.1x with it (AVX-512; AVX2 0.6-0.9 ->
 * 0.92x); 4 and 16 KiB ahead measured the same as 8, every second line
 * 0.85x, 0.5-2 KiB ahead inside the amax loop nothing. On data already in
 * the cache it costs ~5%, hence the floor: the shard encodes 16 KiB slices
 * of a cache-resident sum. */
#define GIFT__FP8_PF_BYTES 8192u
#define GIFT__FP8_PF_MIN (256u * 1024u)
typedef uint32_t (*gift__fp8_amax_fn)(const float *x, size_t n);
typedef void (*gift__fp8_codes_fn)(const gift__minifmt_t *f, const float *xb, size_t len, float inv,
                                   uint8_t *cb);
static inline __attribute__((always_inline)) int
gift__fp8_encode_groups(const gift__minifmt_t *f, const float *x, size_t n, size_t block,
                        float *scales, uint8_t *codes, gift__fp8_amax_fn amax,
                        gift__fp8_codes_fn block_codes)
{
    const size_t nb = (n + block - 1) / block;
    const size_t nbytes = n * sizeof(float);
    /* bytes of x prefetched so far; a small x (a slice of a cache-resident
     * buffer, the shard's case) is not prefetched at all */
    size_t pf = nbytes < GIFT__FP8_PF_MIN ? nbytes : 0;
    for (size_t g0 = 0; g0 < nb; g0 += GIFT__FP8_GROUP) {
        size_t gn = nb - g0 < GIFT__FP8_GROUP ? nb - g0 : GIFT__FP8_GROUP, bad = gn;
        float inv[GIFT__FP8_GROUP];
        for (size_t j = 0; j < gn; j++) {
            size_t b0 = (g0 + j) * block, len = n - b0 < block ? n - b0 : block;
            uint32_t mb = amax(x + b0, len);
            if (mb >= 0x7F800000u) {
                bad = j;
                break;
            }
            gift__fp8_block_scale(f, mb, &scales[g0 + j], &inv[j]); /* inv 0: zero codes */
        }
        /* Ask for the input GIFT__FP8_PF_BYTES past this group now, while its
         * codes are computed from the cache: the amax loads of the next
         * groups then find their lines on the way instead of each group's
         * loads waiting on memory alone. */
        for (size_t pf_to = (g0 + gn) * block * sizeof(float) + GIFT__FP8_PF_BYTES;
             pf < pf_to && pf < nbytes; pf += 64)
            __builtin_prefetch((const char *)x + pf, 0, 3);
        for (size_t j = 0; j < bad; j++) {
            size_t b0 = (g0 + j) * block, len = n - b0 < block ? n - b0 : block;
            if (inv[j] == 0.0f)
                memset(codes + b0, 0, len);
            else
                block_codes(f, x + b0, len, inv[j], codes + b0);
        }
        if (bad < gn)
            return GIFT_ENONFINITE;
    }
    return 0;
}

/* bf16 round to nearest even, saturating to the finite max. */
static inline GIFT__HD uint16_t gift__bf16_rne(float y)
{
    uint32_t b = gift__f2u(y);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t code = (a + 0x7FFFu + ((a >> 16) & 1u)) >> 16;
    if (code > 0x7F7Fu)
        code = 0x7F7Fu;
    return (uint16_t)(code | ((b >> 31) << 15));
}

static inline GIFT__HD uint16_t gift__bf16_sr(float y, uint32_t r)
{
    uint32_t b = gift__f2u(y);
    uint32_t a = b & 0x7FFFFFFFu;
    uint32_t code = (a + (r >> 16)) >> 16;
    if (code > 0x7F7Fu)
        code = 0x7F7Fu;
    return (uint16_t)(code | ((b >> 31) << 15));
}

/* ------------------------------------------------------------------ */
/* Backends: the codec on one kind of memory                            */
/* ------------------------------------------------------------------ */

/* The codec's entry points for one kind of memory, siblings behind one table
 * (ggml's way): a caller picks a backend once per buffer, never #ifdef at
 * each call. gift__backend_cpu() is host memory (ctx unused, every call
 * synchronous); gift__backend_cuda (gpu/gift_gpu.h, only where gpu/ is built)
 * is device memory, ctx a gift_gpu_ctx_t *, calls stream-ordered and data
 * errors returned by sync. geom is a gift_geometry_t * on the CPU and a
 * gift_gpu_geometry_t * on the GPU. Same arguments, same bytes, same codes
 * as the gift_* functions they wrap. */
typedef struct gift__backend {
    const char *name; /* "cpu", "cuda" */
    int (*encode)(void *ctx, const gift_codec_params_t *p, const float *x, size_t n, void *payload,
                  size_t cap);
    int (*decode)(void *ctx, const gift_codec_params_t *p, const void *payload, size_t len,
                  size_t n, float *out);
    int (*decode_acc)(void *ctx, const gift_codec_params_t *p, const void *payload, size_t len,
                      size_t n, float *acc);
    int (*transform)(void *ctx, const void *geom, int inverse, const float *G, int rows, float *out,
                     float *work);
    int (*ef_add)(void *ctx, const float *e, size_t n, float *p);
    int (*ef_update)(void *ctx, const float *p, const float *decoded, size_t n, float *e);
    int (*sync)(void *ctx);
} gift__backend_t;

static inline int gift__cpu_encode(void *ctx, const gift_codec_params_t *p, const float *x,
                                   size_t n, void *payload, size_t cap)
{
    (void)ctx;
    return gift_encode(p, x, n, payload, cap);
}

static inline int gift__cpu_decode(void *ctx, const gift_codec_params_t *p, const void *payload,
                                   size_t len, size_t n, float *out)
{
    (void)ctx;
    return gift_decode(p, payload, len, n, out);
}

static inline int gift__cpu_decode_acc(void *ctx, const gift_codec_params_t *p, const void *payload,
                                       size_t len, size_t n, float *acc)
{
    (void)ctx;
    return gift_decode_acc(p, payload, len, n, acc);
}

static inline int gift__cpu_transform(void *ctx, const void *geom, int inverse, const float *G,
                                      int rows, float *out, float *work)
{
    (void)ctx;
    return gift_transform((const gift_geometry_t *)geom, inverse, G, rows, out, work);
}

/* gift_ef_add / gift_ef_update on plain arrays (the same float operation). */
static inline int gift__cpu_ef_add(void *ctx, const float *e, size_t n, float *p)
{
    (void)ctx;
    if ((e == NULL || p == NULL) && n > 0)
        return GIFT_EINVAL;
    gift_vec_add(p, e, n);
    return 0;
}

static inline int gift__cpu_ef_update(void *ctx, const float *p, const float *decoded, size_t n,
                                      float *e)
{
    (void)ctx;
    if ((p == NULL || decoded == NULL || e == NULL) && n > 0)
        return GIFT_EINVAL;
    gift_vec_sub(p, decoded, n, e);
    return 0;
}

static inline int gift__cpu_sync(void *ctx)
{
    (void)ctx;
    return 0;
}

/* The host-memory backend. */
static inline const gift__backend_t *gift__backend_cpu(void)
{
    static const gift__backend_t cpu = {
        "cpu",
        gift__cpu_encode,
        gift__cpu_decode,
        gift__cpu_decode_acc,
        gift__cpu_transform,
        gift__cpu_ef_add,
        gift__cpu_ef_update,
        gift__cpu_sync,
    };
    return &cpu;
}

/* Philox4x32-10 (Random123) and the stochastic-rounding key, the same
 * arithmetic as gift_philox4x32 and gift_sr_bits in format.c, inline so the
 * GPU twins can run it per element. */
static inline GIFT__HD void gift__philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0];
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c[0] = n0, c[1] = n1, c[2] = n2, c[3] = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

static inline GIFT__HD uint64_t gift__sr_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The Philox key of an SR key: (seed, rank, the step's high half). */
static inline GIFT__HD void gift__sr_philox_key(const gift_sr_key_t *k, uint32_t key[2])
{
    uint64_t h =
        gift__sr_mix64(k->seed ^ gift__sr_mix64(((uint64_t)k->rank << 32) | (k->step >> 32)));
    key[0] = (uint32_t)h;
    key[1] = (uint32_t)(h >> 32);
}

/* The four SR words of element group g (elements 4g .. 4g + 3). */
static inline GIFT__HD void gift__sr_group(const gift_sr_key_t *k, const uint32_t key[2],
                                           uint64_t g, uint32_t out[4])
{
    out[0] = (uint32_t)g;
    out[1] = (uint32_t)k->step;
    out[2] = k->key;
    out[3] = k->chunk ^ ((uint32_t)(g >> 32) << 16);
    gift__philox(out, key[0], key[1]);
}

#ifdef __cplusplus
}
#endif
#endif
