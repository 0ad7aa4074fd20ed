/*
 * format.c: number formats. Layout, the scalar reference kernels, stochastic
 * rounding (Philox4x32-10), the SIMD dispatch and the public encode/decode
 * entry points. The exact arithmetic is specified in gift_codec.h.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_kernels.h"

const gift__minifmt_t gift__fmt_e4m3 = {3, 7, 0x7E, 7, GIFT_E4M3_MAX};
const gift__minifmt_t gift__fmt_e5m2 = {2, 15, 0x7B, 7, GIFT_E5M2_MAX};
const gift__minifmt_t gift__fmt_e2m1 = {1, 1, 0x7, 3, GIFT_E2M1_MAX};

/* ------------------------------------------------------------------ */
/* Names and layout                                                      */
/* ------------------------------------------------------------------ */

static const char *const format_names[GIFT_FMT_COUNT_] = {
    [GIFT_FMT_F32] = "f32",       [GIFT_FMT_BF16] = "bf16",   [GIFT_FMT_E4M3] = "fp8-e4m3",
    [GIFT_FMT_E5M2] = "fp8-e5m2", [GIFT_FMT_NVFP4] = "nvfp4",
};

const char *gift_format_name(gift_format_t fmt)
{
    if ((unsigned)fmt >= GIFT_FMT_COUNT_)
        return "unknown";
    return format_names[fmt];
}

int gift_format_parse(const char *name)
{
    if (name == NULL)
        return GIFT_EFORMAT;
    for (int i = 0; i < GIFT_FMT_COUNT_; i++)
        if (strcmp(name, format_names[i]) == 0)
            return i;
    if (strcmp(name, "fp8") == 0 || strcmp(name, "e4m3") == 0)
        return GIFT_FMT_E4M3;
    if (strcmp(name, "e5m2") == 0)
        return GIFT_FMT_E5M2;
    return GIFT_EFORMAT;
}

static size_t align_up(size_t x)
{
    return (x + GIFT_ALIGN - 1) & ~(size_t)(GIFT_ALIGN - 1);
}

/* Effective fp8 block size, or 0 when the requested one is not allowed. */
static size_t fp8_block(const gift_codec_params_t *p)
{
    size_t b = p->block ? p->block : GIFT_FP8_BLOCK_DEFAULT;
    if (b < 32 || (b & (b - 1)) != 0 || b > (1u << 20))
        return 0;
    return b;
}

int gift_layout(const gift_codec_params_t *p, size_t n, gift_layout_t *out)
{
    gift_layout_t l;
    if (p == NULL || out == NULL)
        return GIFT_EINVAL;
    /* Every size below is at most 4n + 4 + n/16 + 2 * GIFT_ALIGN: keep it
     * far from wrapping. */
    if (n > (SIZE_MAX >> 3))
        return GIFT_EINVAL;
    memset(&l, 0, sizeof l);
    l.n = n;
    switch (p->fmt) {
    case GIFT_FMT_F32:
        l.code_bytes = 4 * n;
        break;
    case GIFT_FMT_BF16:
        l.code_bytes = 2 * n;
        break;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        if ((l.block = fp8_block(p)) == 0)
            return GIFT_EFORMAT;
        l.nblocks = (n + l.block - 1) / l.block;
        l.scale_bytes = 4 * l.nblocks;
        l.code_bytes = n;
        break;
    case GIFT_FMT_NVFP4:
        l.block = GIFT_NVFP4_BLOCK;
        l.nblocks = (n + l.block - 1) / l.block;
        l.scale_bytes = 4 + l.nblocks;
        l.code_bytes = (n + 1) / 2;
        break;
    default:
        return GIFT_EFORMAT;
    }
    l.code_off = align_up(l.scale_bytes);
    l.total = align_up(l.code_off + l.code_bytes);
    *out = l;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Scalar element conversions                                           */
/* ------------------------------------------------------------------ */

uint8_t gift_f32_to_e4m3(float x)
{
    return (uint8_t)gift__cvt_rne(&gift__fmt_e4m3, x);
}

uint8_t gift_f32_to_e5m2(float x)
{
    return (uint8_t)gift__cvt_rne(&gift__fmt_e5m2, x);
}

uint8_t gift_f32_to_e2m1(float x)
{
    return (uint8_t)gift__cvt_rne(&gift__fmt_e2m1, x);
}

uint16_t gift_f32_to_bf16(float x)
{
    return gift__bf16_rne(x);
}

float gift_e4m3_to_f32(uint8_t c)
{
    if ((c & 0x7F) == 0x7F)
        return gift__u2f(0x7FC00000u | ((uint32_t)(c >> 7) << 31));
    return gift__mini_value(&gift__fmt_e4m3, c);
}

float gift_e5m2_to_f32(uint8_t c)
{
    if ((c & 0x7C) == 0x7C) {
        uint32_t s = (uint32_t)(c >> 7) << 31;
        return gift__u2f(((c & 3) ? 0x7FC00000u : 0x7F800000u) | s);
    }
    return gift__mini_value(&gift__fmt_e5m2, c);
}

float gift_e2m1_to_f32(uint8_t c)
{
    return gift__mini_value(&gift__fmt_e2m1, c & 0xF);
}

float gift_bf16_to_f32(uint16_t c)
{
    return gift__u2f((uint32_t)c << 16);
}

/* ------------------------------------------------------------------ */
/* Philox4x32-10 and the stochastic-rounding bits                        */
/* ------------------------------------------------------------------ */

void gift_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Philox key for (seed, rank, step's high half); the counter carries the
 * element group, the step's low half, the tensor key and the chunk. */
static void sr_key(const gift_sr_key_t *k, uint32_t key[2])
{
    uint64_t h = splitmix64(k->seed ^ splitmix64(((uint64_t)k->rank << 32) | (k->step >> 32)));
    key[0] = (uint32_t)h;
    key[1] = (uint32_t)(h >> 32);
}

static void sr_block(const gift_sr_key_t *k, const uint32_t key[2], uint64_t group, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)group, (uint32_t)k->step, k->key,
                       k->chunk ^ ((uint32_t)(group >> 32) << 16)};
    gift_philox4x32(ctr, key, out);
}

uint32_t gift_sr_bits(const gift_sr_key_t *k, uint64_t i)
{
    uint32_t key[2], out[4];
    sr_key(k, key);
    sr_block(k, key, i >> 2, out);
    return out[i & 3];
}

/* A cursor that hands out the SR bits of consecutive elements. */
typedef struct sr_stream {
    const gift_sr_key_t *k;
    uint32_t key[2];
    uint32_t buf[4];
    uint64_t group; /* group held in buf, or UINT64_MAX */
} sr_stream_t;

static void sr_stream_init(sr_stream_t *s, const gift_sr_key_t *k)
{
    s->k = k;
    sr_key(k, s->key);
    s->group = UINT64_MAX;
}

static uint32_t sr_stream_bits(sr_stream_t *s, uint64_t i)
{
    if ((i >> 2) != s->group) {
        s->group = i >> 2;
        sr_block(s->k, s->key, s->group, s->buf);
    }
    return s->buf[i & 3];
}

/* ------------------------------------------------------------------ */
/* Scalar reference kernels                                             */
/* ------------------------------------------------------------------ */

static uint32_t scalar_amax_bits(const float *x, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = gift__f2u(gift__ldf(x + i)) & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    return m;
}

/* fp8 encode of all blocks, RNE (s == NULL) or stochastic (bits from s). */
static int fp8_encode_any(const gift__minifmt_t *f, const float *x, size_t n, size_t block,
                          float *scales, uint8_t *codes, sr_stream_t *s)
{
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
        size_t len = n - b0 < block ? n - b0 : block;
        uint32_t mb = scalar_amax_bits(x + b0, len);
        float scale, inv;
        if (mb >= 0x7F800000u)
            return GIFT_ENONFINITE;
        if (!gift__fp8_block_scale(f, mb, &scale, &inv)) {
            scales[bi] = 0.0f;
            memset(codes + b0, 0, len);
            continue;
        }
        scales[bi] = scale;
        for (size_t i = 0; i < len; i++) {
            float y = x[b0 + i] * inv;
            codes[b0 + i] =
                (uint8_t)(s ? gift__cvt_sr(f, y, sr_stream_bits(s, b0 + i)) : gift__cvt_rne(f, y));
        }
    }
    return 0;
}

static int scalar_fp8_encode(const gift__minifmt_t *f, const float *x, size_t n, size_t block,
                             float *scales, uint8_t *codes)
{
    return fp8_encode_any(f, x, n, block, scales, codes, NULL);
}

static int sr_fp8_encode(const gift__minifmt_t *f, const float *x, size_t n, size_t block,
                         float *scales, uint8_t *codes, const gift_sr_key_t *k)
{
    sr_stream_t s;
    sr_stream_init(&s, k);
    return fp8_encode_any(f, x, n, block, scales, codes, &s);
}

static void scalar_fp8_decode(const gift__minifmt_t *f, const float *scales, const uint8_t *codes,
                              size_t n, size_t block, float *out, int acc)
{
    float lut[256];
    for (int c = 0; c < 256; c++)
        lut[c] = ((c & 0x7F) > (int)f->maxcode) ? 0.0f : gift__mini_value(f, (uint32_t)c);
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
        size_t len = n - b0 < block ? n - b0 : block;
        float s = gift__ldf(scales + bi);
        if (acc)
            for (size_t i = 0; i < len; i++)
                out[b0 + i] += lut[codes[b0 + i]] * s;
        else
            for (size_t i = 0; i < len; i++)
                out[b0 + i] = lut[codes[b0 + i]] * s;
    }
}

static int scalar_byte_has_mask(const uint8_t *codes, size_t n, uint8_t mask)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (codes[i] & mask) == mask;
    return bad;
}

/* nvfp4 block scale code and effective scale/inverse for one block. */
static uint8_t nvfp4_block_scale(uint32_t maxbits, float s_t, float *eff, float *inv)
{
    float r = gift__u2f(maxbits) / (s_t * 6.0f);
    uint8_t sb = (uint8_t)gift__cvt_rne(&gift__fmt_e4m3, r);
    float e = gift__mini_value(&gift__fmt_e4m3, sb) * s_t;
    *eff = e;
    *inv = e >= FLT_MIN ? 1.0f / e : 0.0f;
    return sb;
}

static void nvfp4_encode_any(const float *x, size_t n, float s_t, uint8_t *sb, uint8_t *codes,
                             sr_stream_t *s)
{
    memset(codes, 0, (n + 1) / 2);
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += GIFT_NVFP4_BLOCK, bi++) {
        size_t len = n - b0 < GIFT_NVFP4_BLOCK ? n - b0 : GIFT_NVFP4_BLOCK;
        float eff, inv;
        sb[bi] = nvfp4_block_scale(scalar_amax_bits(x + b0, len), s_t, &eff, &inv);
        if (inv == 0.0f)
            continue;
        for (size_t i = 0; i < len; i++) {
            size_t j = b0 + i;
            float y = x[j] * inv;
            uint32_t c = s ? gift__cvt_sr(&gift__fmt_e2m1, y, sr_stream_bits(s, j))
                           : gift__cvt_rne(&gift__fmt_e2m1, y);
            codes[j >> 1] |= (uint8_t)(c << ((j & 1) * 4));
        }
    }
}

void gift__nvfp4_block(const float *x, size_t len, float s_t, uint8_t *sb, uint8_t *codes)
{
    nvfp4_encode_any(x, len, s_t, sb, codes, NULL);
}

static void scalar_nvfp4_encode(const float *x, size_t n, float s_t, uint8_t *sb, uint8_t *codes)
{
    nvfp4_encode_any(x, n, s_t, sb, codes, NULL);
}

static void scalar_nvfp4_decode(const uint8_t *sb, float s_t, const uint8_t *codes, size_t n,
                                float *out, int acc)
{
    float lut[16];
    for (int c = 0; c < 16; c++)
        lut[c] = gift__mini_value(&gift__fmt_e2m1, (uint32_t)c);
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += GIFT_NVFP4_BLOCK, bi++) {
        size_t len = n - b0 < GIFT_NVFP4_BLOCK ? n - b0 : GIFT_NVFP4_BLOCK;
        float eff = gift__mini_value(&gift__fmt_e4m3, sb[bi]) * s_t;
        for (size_t i = 0; i < len; i++) {
            size_t j = b0 + i;
            float v = lut[(codes[j >> 1] >> ((j & 1) * 4)) & 0xF] * eff;
            if (acc)
                out[j] += v;
            else
                out[j] = v;
        }
    }
}

static int scalar_bf16_encode(const float *x, size_t n, uint16_t *codes)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = gift__f2u(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
        codes[i] = gift__bf16_rne(x[i]);
    }
    return m >= 0x7F800000u ? GIFT_ENONFINITE : 0;
}

static void scalar_bf16_decode(const uint16_t *codes, size_t n, float *out, int acc)
{
    for (size_t i = 0; i < n; i++) {
        float v = gift__u2f((uint32_t)gift__ldu16(codes + i) << 16);
        if (acc)
            out[i] += v;
        else
            out[i] = v;
    }
}

static int scalar_f32_encode(const float *x, size_t n, float *out)
{
    if (scalar_amax_bits(x, n) >= 0x7F800000u)
        return GIFT_ENONFINITE;
    memcpy(out, x, n * 4);
    return 0;
}

static void scalar_f32_decode(const float *codes, size_t n, float *out, int acc)
{
    if (!acc) {
        memcpy(out, codes, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] += gift__ldf(codes + i);
}

/* dst[i] = x[i] * scale + 0.0f: the + 0 turns a -0 into +0, so the result
 * equals a sum that started from +0. */
static void scalar_scale(const float *x, size_t n, float scale, float *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gift__ldf(x + i) * scale + 0.0f;
}

static void scalar_scale_add(const float *x, const float *e, size_t n, float scale, float *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (gift__ldf(x + i) * scale + 0.0f) + gift__ldf(e + i);
}

static void scalar_sub(const float *a, const float *b, size_t n, float *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = gift__ldf(a + i) - gift__ldf(b + i);
}

const gift__kernels_t gift__kernels_scalar = {
    .scale = scalar_scale,
    .scale_add = scalar_scale_add,
    .sub = scalar_sub,
    .fp8_encode = scalar_fp8_encode,
    .fp8_decode = scalar_fp8_decode,
    .byte_has_mask = scalar_byte_has_mask,
    .amax_bits = scalar_amax_bits,
    .nvfp4_encode = scalar_nvfp4_encode,
    .nvfp4_decode = scalar_nvfp4_decode,
    .bf16_encode = scalar_bf16_encode,
    .bf16_decode = scalar_bf16_decode,
    .f32_encode = scalar_f32_encode,
    .f32_decode = scalar_f32_decode,
};

/* ------------------------------------------------------------------ */
/* Dispatch                                                              */
/* ------------------------------------------------------------------ */

static const gift__kernels_t *active_kernels;
static gift_simd_t active_simd;
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;

static const gift__kernels_t *kernels_for(gift_simd_t s)
{
    switch (s) {
    case GIFT_SIMD_SCALAR:
        return &gift__kernels_scalar;
    case GIFT_SIMD_AVX2:
        if (gift__kernels_avx2 && __builtin_cpu_supports("avx2"))
            return gift__kernels_avx2;
        return NULL;
    case GIFT_SIMD_AVX512:
        if (gift__kernels_avx512 && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
            return gift__kernels_avx512;
        return NULL;
    }
    return NULL;
}

gift_simd_t gift_simd_best(void)
{
    __builtin_cpu_init();
    if (kernels_for(GIFT_SIMD_AVX512))
        return GIFT_SIMD_AVX512;
    if (kernels_for(GIFT_SIMD_AVX2))
        return GIFT_SIMD_AVX2;
    return GIFT_SIMD_SCALAR;
}

static void simd_init(void)
{
    const char *env = getenv("GIFT_SIMD");
    gift_simd_t s = gift_simd_best();
    if (env != NULL) {
        gift_simd_t want = s;
        if (strcmp(env, "scalar") == 0)
            want = GIFT_SIMD_SCALAR;
        else if (strcmp(env, "avx2") == 0)
            want = GIFT_SIMD_AVX2;
        else if (strcmp(env, "avx512") == 0)
            want = GIFT_SIMD_AVX512;
        if (kernels_for(want))
            s = want;
    }
    active_simd = s;
    active_kernels = kernels_for(s);
}

static const gift__kernels_t *kernels(void)
{
    pthread_once(&simd_once, simd_init);
    return active_kernels;
}

gift_simd_t gift_simd_active(void)
{
    pthread_once(&simd_once, simd_init);
    return active_simd;
}

int gift_simd_force(gift_simd_t s)
{
    const gift__kernels_t *k;
    pthread_once(&simd_once, simd_init);
    if ((k = kernels_for(s)) == NULL)
        return GIFT_EINVAL;
    active_simd = s;
    active_kernels = k;
    return 0;
}

const char *gift_simd_name(gift_simd_t s)
{
    switch (s) {
    case GIFT_SIMD_SCALAR:
        return "scalar";
    case GIFT_SIMD_AVX2:
        return "avx2";
    case GIFT_SIMD_AVX512:
        return "avx512";
    }
    return "unknown";
}

/* ------------------------------------------------------------------ */
/* Public encode / decode                                                */
/* ------------------------------------------------------------------ */

static const gift__minifmt_t *fp8_fmt(gift_format_t f)
{
    return f == GIFT_FMT_E4M3 ? &gift__fmt_e4m3 : &gift__fmt_e5m2;
}

/* What every encoder does first: check the arguments, lay the payload out,
 * and zero its padding so that equal inputs give equal bytes. */
static int encode_begin(const gift_codec_params_t *p, const float *x, size_t n, void *payload,
                        size_t cap, gift_layout_t *l)
{
    uint8_t *out = payload;
    int rc;
    if (p == NULL || (x == NULL && n > 0) || payload == NULL)
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, l)) < 0)
        return rc;
    if (cap < l->total)
        return GIFT_ENOSPC;
    memset(out + l->scale_bytes, 0, l->code_off - l->scale_bytes);
    memset(out + l->code_off + l->code_bytes, 0, l->total - l->code_off - l->code_bytes);
    return 0;
}

int gift_encode(const gift_codec_params_t *p, const float *x, size_t n, void *payload, size_t cap)
{
    gift_layout_t l;
    const gift__kernels_t *k = kernels();
    uint8_t *out = payload;
    int rc;

    if ((rc = encode_begin(p, x, n, payload, cap, &l)) < 0)
        return rc;
    switch (p->fmt) {
    case GIFT_FMT_F32:
        return k->f32_encode(x, n, (float *)(out + l.code_off));
    case GIFT_FMT_BF16:
        if (!p->stochastic)
            return k->bf16_encode(x, n, (uint16_t *)(out + l.code_off));
        if (k->amax_bits(x, n) >= 0x7F800000u)
            return GIFT_ENONFINITE;
        {
            sr_stream_t s;
            uint16_t *c = (uint16_t *)(out + l.code_off);
            sr_stream_init(&s, &p->sr);
            for (size_t i = 0; i < n; i++)
                c[i] = gift__bf16_sr(x[i], sr_stream_bits(&s, i));
        }
        return 0;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        if (p->stochastic)
            return sr_fp8_encode(fp8_fmt(p->fmt), x, n, l.block, (float *)out, out + l.code_off,
                                 &p->sr);
        return k->fp8_encode(fp8_fmt(p->fmt), x, n, l.block, (float *)out, out + l.code_off);
    case GIFT_FMT_NVFP4: {
        uint32_t mb = k->amax_bits(x, n);
        float s_t;
        if (mb >= 0x7F800000u)
            return GIFT_ENONFINITE;
        s_t = gift__u2f(mb) / (GIFT_E2M1_MAX * GIFT_E4M3_MAX);
        if (!(s_t >= FLT_MIN)) {
            memset(out, 0, l.total);
            return 0;
        }
        memcpy(out, &s_t, 4);
        if (p->stochastic) {
            sr_stream_t s;
            sr_stream_init(&s, &p->sr);
            nvfp4_encode_any(x, n, s_t, out + 4, out + l.code_off, &s);
        } else {
            k->nvfp4_encode(x, n, s_t, out + 4, out + l.code_off);
        }
        return 0;
    }
    default:
        return GIFT_EFORMAT;
    }
}

#define MEAN_SLICE 4096 /* elements per cache-resident slice of gift_encode_mean */

/* Encodes elements [i, i + len) of an f32, bf16 or fp8 payload from buf
 * (i on a block boundary): one slice of the mean encoders. */
static int encode_slice(const gift__kernels_t *k, const gift_codec_params_t *p,
                        const gift_layout_t *l, const float *buf, size_t i, size_t len,
                        uint8_t *out)
{
    switch (p->fmt) {
    case GIFT_FMT_F32:
        return k->f32_encode(buf, len, (float *)(out + l->code_off) + i);
    case GIFT_FMT_BF16:
        return k->bf16_encode(buf, len, (uint16_t *)(out + l->code_off) + i);
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        return k->fp8_encode(fp8_fmt(p->fmt), buf, len, l->block, (float *)out + i / l->block,
                             out + l->code_off + i);
    default:
        return GIFT_EFORMAT;
    }
}

/* An nvfp4 mean's tensor scale from the largest unscaled magnitude (bits
 * mb): the largest scaled magnitude is the scaled largest, since rounding
 * x * scale is monotone. Returns 1 with *s_t written to out; 0 when it is
 * below FLT_MIN (out is then the all-zero payload, complete); or
 * GIFT_ENONFINITE. */
static int mean_tensor_scale(uint32_t mb, float scale, const gift_layout_t *l, uint8_t *out,
                             float *s_t)
{
    if (mb >= 0x7F800000u)
        return GIFT_ENONFINITE;
    *s_t = (gift__u2f(mb) * scale + 0.0f) / (GIFT_E2M1_MAX * GIFT_E4M3_MAX);
    if (!(*s_t >= FLT_MIN)) {
        memset(out, 0, l->total);
        return 0;
    }
    memcpy(out, s_t, 4);
    return 1;
}

int gift_encode_mean(const gift_codec_params_t *p, const float *x, size_t n, float scale,
                     void *payload, size_t cap)
{
    _Alignas(64) float tmp[MEAN_SLICE];
    float *buf = tmp;
    gift_layout_t l;
    const gift__kernels_t *k = kernels();
    uint8_t *out = payload;
    size_t slice = MEAN_SLICE;
    int rc = 0;

    if (p != NULL && (p->stochastic || !(scale > 0.0f) || scale > FLT_MAX))
        return GIFT_EINVAL;
    if ((rc = encode_begin(p, x, n, payload, cap, &l)) < 0)
        return rc;
    if ((p->fmt == GIFT_FMT_E4M3 || p->fmt == GIFT_FMT_E5M2) && l.block > MEAN_SLICE) {
        /* Blocks larger than the stack slice (rare): one slice per block. */
        slice = l.block;
        if ((buf = malloc(slice * sizeof(float))) == NULL)
            return GIFT_ENOMEM;
    }
    if (p->fmt == GIFT_FMT_NVFP4) {
        float s_t;
        if ((rc = mean_tensor_scale(k->amax_bits(x, n), scale, &l, out, &s_t)) <= 0)
            return rc;
        for (size_t i = 0; i < n; i += slice) {
            size_t len = n - i < slice ? n - i : slice;
            k->scale(x + i, len, scale, buf);
            k->nvfp4_encode(buf, len, s_t, out + 4 + i / GIFT_NVFP4_BLOCK,
                            out + l.code_off + i / 2);
        }
        return 0;
    }
    for (size_t i = 0; i < n && rc == 0; i += slice) {
        size_t len = n - i < slice ? n - i : slice;
        k->scale(x + i, len, scale, buf);
        rc = encode_slice(k, p, &l, buf, i, len, out);
    }
    if (buf != tmp)
        free(buf);
    return rc;
}

int gift_encode_slices(const gift_codec_params_t *p, size_t n, size_t slice, gift_slice_fn fill,
                       void *ctx, void *payload, size_t cap)
{
    _Alignas(64) float tmp[MEAN_SLICE];
    float *buf = tmp;
    gift_layout_t l;
    const gift__kernels_t *k = kernels();
    uint8_t *out = payload;
    int rc;

    if (p == NULL || fill == NULL || slice == 0 || p->stochastic)
        return GIFT_EINVAL;
    if (p->fmt == GIFT_FMT_NVFP4)
        return GIFT_EFORMAT; /* its tensor scale needs the whole input first */
    if ((rc = encode_begin(p, (const float *)payload, n, payload, cap, &l)) < 0)
        return rc;
    if (l.block > 0 && slice % l.block != 0)
        return GIFT_EINVAL;
    if (slice > MEAN_SLICE && (buf = malloc(slice * sizeof(float))) == NULL)
        return GIFT_ENOMEM;
    for (size_t i = 0; i < n && rc == 0; i += slice) {
        size_t len = n - i < slice ? n - i : slice;
        if ((rc = fill(ctx, i, len, buf)) == 0)
            rc = encode_slice(k, p, &l, buf, i, len, out);
    }
    if (buf != tmp)
        free(buf);
    return rc;
}

/* Checks scales and codes of a payload; 0 when every value is finite. */
static int payload_check(const gift_codec_params_t *p, const gift_layout_t *l, const uint8_t *in)
{
    const gift__kernels_t *k = kernels();
    switch (p->fmt) {
    case GIFT_FMT_F32:
        /* Codes may be unaligned on the wire only if the caller broke the
         * layout; the section offset is 64-aligned. */
        return k->amax_bits((const float *)(in + l->code_off), l->n) >= 0x7F800000u ? GIFT_EBADCODE
                                                                                    : 0;
    case GIFT_FMT_BF16: {
        /* Four codes per 64-bit word: a lane whose exponent bits are all set
         * (Inf/NaN) becomes a zero lane after masking and flipping; the
         * classic has-zero-lane test finds it (no lane has bit 15 set). */
        const uint8_t *c = in + l->code_off;
        const uint64_t m = 0x7F807F807F807F80ull, lo = 0x0001000100010001ull;
        uint64_t bad = 0;
        size_t i = 0;
        for (; i + 4 <= l->n; i += 4) {
            uint64_t w, t;
            memcpy(&w, c + 2 * i, 8);
            t = (w & m) ^ m;
            bad |= (t - lo) & ~t & 0x8000800080008000ull;
        }
        for (; i < l->n; i++)
            bad |= (gift__ldu16(c + 2 * i) & 0x7F80u) == 0x7F80u;
        return bad ? GIFT_EBADCODE : 0;
    }
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2: {
        const float *s = (const float *)in;
        for (size_t i = 0; i < l->nblocks; i++)
            if (!(gift__ldf(s + i) >= 0.0f) || gift__ldf(s + i) > FLT_MAX)
                return GIFT_EBADCODE;
        return k->byte_has_mask(in + l->code_off, l->n, p->fmt == GIFT_FMT_E4M3 ? 0x7F : 0x7C)
                   ? GIFT_EBADCODE
                   : 0;
    }
    case GIFT_FMT_NVFP4: {
        float s_t;
        memcpy(&s_t, in, 4);
        if (!(s_t >= 0.0f) || s_t > FLT_MAX)
            return GIFT_EBADCODE;
        /* Block scales are unsigned E4M3: no sign bit, no NaN. */
        for (size_t i = 0; i < l->nblocks; i++)
            if (in[4 + i] >= 0x7F)
                return GIFT_EBADCODE;
        return 0;
    }
    default:
        return GIFT_EFORMAT;
    }
}

/* Layout, length and payload_check: everything decoding verifies first. */
static int decode_check(const gift_codec_params_t *p, const void *payload, size_t len, size_t n,
                        gift_layout_t *l)
{
    int rc;
    if (p == NULL || payload == NULL)
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, l)) < 0)
        return rc;
    if (len < l->code_off + l->code_bytes)
        return GIFT_ENOSPC;
    return payload_check(p, l, payload);
}

int gift_payload_check(const gift_codec_params_t *p, const void *payload, size_t len, size_t n)
{
    gift_layout_t l;
    return decode_check(p, payload, len, n, &l);
}

static int decode_any(const gift_codec_params_t *p, const void *payload, size_t len, size_t n,
                      float *out, int acc)
{
    gift_layout_t l;
    const gift__kernels_t *k = kernels();
    const uint8_t *in = payload;
    int rc;

    if (out == NULL && n > 0)
        return GIFT_EINVAL;
    if ((rc = decode_check(p, payload, len, n, &l)) < 0)
        return rc;
    switch (p->fmt) {
    case GIFT_FMT_F32:
        k->f32_decode((const float *)(in + l.code_off), n, out, acc);
        return 0;
    case GIFT_FMT_BF16:
        k->bf16_decode((const uint16_t *)(in + l.code_off), n, out, acc);
        return 0;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        k->fp8_decode(fp8_fmt(p->fmt), (const float *)in, in + l.code_off, n, l.block, out, acc);
        return 0;
    case GIFT_FMT_NVFP4: {
        float s_t;
        memcpy(&s_t, in, 4);
        k->nvfp4_decode(in + 4, s_t, in + l.code_off, n, out, acc);
        return 0;
    }
    default:
        return GIFT_EFORMAT;
    }
}

int gift_decode(const gift_codec_params_t *p, const void *payload, size_t len, size_t n, float *out)
{
    return decode_any(p, payload, len, n, out, 0);
}

int gift_decode_acc(const gift_codec_params_t *p, const void *payload, size_t len, size_t n,
                    float *acc)
{
    return decode_any(p, payload, len, n, acc, 1);
}

/* Elements per slice unit of a layout: slices must start on a block. */
static size_t slice_unit(const gift_codec_params_t *p, const gift_layout_t *l)
{
    switch (p->fmt) {
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        return l->block;
    case GIFT_FMT_NVFP4:
        return GIFT_NVFP4_BLOCK;
    default:
        return 1;
    }
}

/* Decodes elements [i, i + len) of a checked payload into out (acc: adds),
 * i on a block boundary: the kernels of decode_any on a slice. */
static void decode_slice(const gift__kernels_t *k, const gift_codec_params_t *p,
                         const gift_layout_t *l, const uint8_t *in, size_t i, size_t len,
                         float *out, int acc)
{
    switch (p->fmt) {
    case GIFT_FMT_F32:
        k->f32_decode((const float *)(in + l->code_off) + i, len, out, acc);
        break;
    case GIFT_FMT_BF16:
        k->bf16_decode((const uint16_t *)(in + l->code_off) + i, len, out, acc);
        break;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        k->fp8_decode(fp8_fmt(p->fmt), (const float *)in + i / l->block, in + l->code_off + i, len,
                      l->block, out, acc);
        break;
    case GIFT_FMT_NVFP4: {
        float s_t;
        memcpy(&s_t, in, 4);
        k->nvfp4_decode(in + 4 + i / GIFT_NVFP4_BLOCK, s_t, in + l->code_off + i / 2, len, out,
                        acc);
        break;
    }
    default:
        break;
    }
}

/* Slice [i, i + len) of the sum: a copy of acc's slice plus the decoded
 * payload, or the decoded payload alone (the bytes decode_any writes). */
static void sum_slice(const gift__kernels_t *k, const gift_codec_params_t *p,
                      const gift_layout_t *l, const uint8_t *in, const float *acc, size_t i,
                      size_t len, float *buf)
{
    if (acc != NULL)
        memcpy(buf, acc + i, len * sizeof(float));
    decode_slice(k, p, l, in, i, len, buf, acc != NULL);
}

void gift_vec_add(float *p, const float *e, size_t n)
{
    if (n > 0)
        kernels()->f32_decode(e, n, p, 1); /* p[i] = p[i] + e[i] */
}

void gift_vec_sub(const float *a, const float *b, size_t n, float *dst)
{
    if (n > 0)
        kernels()->sub(a, b, n, dst);
}

/* Where the mean's sum comes from, slice by slice: x itself, or (x NULL)
 * a push payload decoded onto a copy of acc (sum_slice). */
typedef struct {
    const float *x;
    const gift_codec_params_t *push;
    const gift_layout_t *li;
    const uint8_t *in;
    const float *acc;
} mean_src_t;

static const float *src_slice(const gift__kernels_t *k, const mean_src_t *s, size_t i, size_t m,
                              float *buf)
{
    if (s->x != NULL)
        return s->x + i;
    sum_slice(k, s->push, s->li, s->in, s->acc, i, m, buf);
    return buf;
}

/* gift_encode_mean_ef on a checked source (its layout l under p, the
 * payload's padding written). */
static int mean_ef(const gift__kernels_t *k, const gift_codec_params_t *p, const gift_layout_t *l,
                   const mean_src_t *src, size_t n, float scale, float *e, uint8_t *out)
{
    _Alignas(64) float v[MEAN_SLICE], d[MEAN_SLICE];
    float s_t = 0.0f; /* nvfp4: the tensor scale of v; 0 when every code is zero */
    int rc;

    if (p->fmt == GIFT_FMT_NVFP4) {
        /* v's largest magnitude first (v = x * scale + 0 + e, slice by slice). */
        uint32_t mb = 0;
        for (size_t i = 0; i < n; i += MEAN_SLICE) {
            size_t m = n - i < MEAN_SLICE ? n - i : MEAN_SLICE;
            uint32_t b;
            k->scale_add(src_slice(k, src, i, m, d), e + i, m, scale, v);
            if ((b = k->amax_bits(v, m)) > mb)
                mb = b;
        }
        if (mb >= 0x7F800000u) {
            memset(e, 0, n * sizeof *e);
            return GIFT_ENONFINITE;
        }
        s_t = gift__u2f(mb) / (GIFT_E2M1_MAX * GIFT_E4M3_MAX);
        if (s_t >= FLT_MIN) {
            memcpy(out, &s_t, 4);
        } else {
            s_t = 0.0f; /* the all-zero payload: the residual becomes v */
            memset(out, 0, l->total);
        }
    }
    for (size_t i = 0; i < n; i += MEAN_SLICE) {
        size_t m = n - i < MEAN_SLICE ? n - i : MEAN_SLICE;
        k->scale_add(src_slice(k, src, i, m, d), e + i, m, scale, v);
        if (p->fmt == GIFT_FMT_NVFP4) {
            if (s_t > 0.0f)
                k->nvfp4_encode(v, m, s_t, out + 4 + i / GIFT_NVFP4_BLOCK,
                                out + l->code_off + i / 2);
        } else if ((rc = encode_slice(k, p, l, v, i, m, out)) < 0) {
            memset(e, 0, n * sizeof *e);
            return rc;
        }
        decode_slice(k, p, l, out, i, m, d, 0);
        k->sub(v, d, m, e + i);
    }
    return 0;
}

int gift_encode_mean_ef(const gift_codec_params_t *p, const float *x, size_t n, float scale,
                        float *e, void *payload, size_t cap)
{
    gift_layout_t l;
    mean_src_t src = {x, NULL, NULL, NULL, NULL};
    int rc;

    if (p == NULL || e == NULL || p->stochastic || !(scale > 0.0f) || scale > FLT_MAX)
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, &l)) < 0)
        return rc;
    if (MEAN_SLICE % slice_unit(p, &l) != 0)
        return GIFT_EFORMAT;
    if ((rc = encode_begin(p, x, n, payload, cap, &l)) < 0)
        return rc;
    return mean_ef(kernels(), p, &l, &src, n, scale, e, payload);
}

/* The checks and the padding of the fused decode + mean encoders: the payload
 * whole (decode_check), both layouts walkable in common slices, out's
 * padding written. */
static int fused_begin(const gift_codec_params_t *push, const void *payload, size_t len, size_t n,
                       float scale, const gift_codec_params_t *pull, void *out, size_t cap,
                       gift_layout_t *li, gift_layout_t *lo)
{
    int rc;
    if (pull == NULL || out == NULL || pull->stochastic || !(scale > 0.0f) || scale > FLT_MAX)
        return GIFT_EINVAL;
    if ((rc = decode_check(push, payload, len, n, li)) < 0)
        return rc;
    if ((rc = gift_layout(pull, n, lo)) < 0)
        return rc;
    if (MEAN_SLICE % slice_unit(push, li) != 0 || MEAN_SLICE % slice_unit(pull, lo) != 0)
        return GIFT_EFORMAT;
    return encode_begin(pull, &scale, n, out, cap, lo); /* its x is only checked for NULL */
}

int gift_decode_encode_mean_ef(const gift_codec_params_t *push, const void *payload, size_t len,
                               const float *acc, size_t n, float scale,
                               const gift_codec_params_t *pull, float *e, void *out, size_t cap)
{
    gift_layout_t li, lo;
    mean_src_t src = {NULL, push, &li, payload, acc};
    int rc;

    if (e == NULL)
        return GIFT_EINVAL;
    if ((rc = fused_begin(push, payload, len, n, scale, pull, out, cap, &li, &lo)) < 0)
        return rc;
    return mean_ef(kernels(), pull, &lo, &src, n, scale, e, out);
}

int gift_decode_encode_mean(const gift_codec_params_t *push, const void *payload, size_t len,
                            const float *acc, size_t n, float scale,
                            const gift_codec_params_t *pull, void *out, size_t cap)
{
    _Alignas(64) float buf[MEAN_SLICE];
    gift_layout_t li, lo;
    const gift__kernels_t *k = kernels();
    const uint8_t *in = payload;
    uint8_t *o = out;
    int rc = 0;

    if ((rc = fused_begin(push, payload, len, n, scale, pull, out, cap, &li, &lo)) < 0)
        return rc;
    if (pull->fmt == GIFT_FMT_NVFP4) {
        /* The tensor scale from the sum's largest magnitude (as
         * gift_encode_mean), then the sum again, scaled and encoded. */
        uint32_t mb = 0;
        float s_t;
        for (size_t i = 0; i < n; i += MEAN_SLICE) {
            size_t m = n - i < MEAN_SLICE ? n - i : MEAN_SLICE;
            uint32_t b;
            sum_slice(k, push, &li, in, acc, i, m, buf);
            if ((b = k->amax_bits(buf, m)) > mb)
                mb = b;
        }
        if ((rc = mean_tensor_scale(mb, scale, &lo, o, &s_t)) <= 0)
            return rc;
        for (size_t i = 0; i < n; i += MEAN_SLICE) {
            size_t m = n - i < MEAN_SLICE ? n - i : MEAN_SLICE;
            sum_slice(k, push, &li, in, acc, i, m, buf);
            k->scale(buf, m, scale, buf);
            k->nvfp4_encode(buf, m, s_t, o + 4 + i / GIFT_NVFP4_BLOCK, o + lo.code_off + i / 2);
        }
        return 0;
    }
    for (size_t i = 0; i < n && rc == 0; i += MEAN_SLICE) {
        size_t m = n - i < MEAN_SLICE ? n - i : MEAN_SLICE;
        sum_slice(k, push, &li, in, acc, i, m, buf);
        k->scale(buf, m, scale, buf);
        rc = encode_slice(k, pull, &lo, buf, i, m, o);
    }
    return rc;
}

/* The rounding midpoint above a format's largest finite value: a scaled
 * |y| at or past it would have rounded to a code the format lacks. */
static float sat_midpoint(const gift__minifmt_t *f)
{
    int e;
    frexpf(f->fmax, &e); /* fmax = m * 2^e with m in [0.5, 1) */
    return f->fmax + ldexpf(1.0f, e - 1 - f->mbits - 1);
}

int gift_boundary_hits(const gift_codec_params_t *p, const float *x, const void *payload,
                       size_t len, size_t n, gift_hits_t *out)
{
    gift_layout_t l;
    const uint8_t *in = payload;
    int rc;

    if (p == NULL || x == NULL || payload == NULL || out == NULL)
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, &l)) < 0)
        return rc;
    if (len < l.code_off + l.code_bytes)
        return GIFT_ENOSPC;
    memset(out, 0, sizeof *out);
    out->n = n;
    for (size_t b0 = 0; b0 < n; b0 += l.block ? l.block : n) {
        size_t len_b = l.block ? (n - b0 < l.block ? n - b0 : l.block) : n;
        float inv = 0.0f, mid = 0.0f;
        const gift__minifmt_t *f = NULL;
        /* The encoder's inverse scale for this block, recomputed. */
        if (p->fmt == GIFT_FMT_E4M3 || p->fmt == GIFT_FMT_E5M2) {
            float scale;
            f = fp8_fmt(p->fmt);
            if (gift__fp8_block_scale(f, scalar_amax_bits(x + b0, len_b), &scale, &inv) == 0)
                inv = 0.0f;
            mid = sat_midpoint(f);
        } else if (p->fmt == GIFT_FMT_NVFP4) {
            float s_t, eff;
            memcpy(&s_t, in, 4);
            eff = gift__mini_value(&gift__fmt_e4m3, in[4 + b0 / GIFT_NVFP4_BLOCK]) * s_t;
            inv = eff >= FLT_MIN ? 1.0f / eff : 0.0f;
            mid = sat_midpoint(&gift__fmt_e2m1);
        }
        for (size_t i = b0; i < b0 + len_b; i++) {
            int sat = 0, zero = 0;
            switch (p->fmt) {
            case GIFT_FMT_F32:
                break;
            case GIFT_FMT_BF16: {
                uint16_t c;
                memcpy(&c, in + l.code_off + 2 * i, 2);
                sat = (gift__f2u(x[i]) & 0x7FFFFFFFu) >= 0x7F7F8000u;
                zero = (c & 0x7FFFu) == 0;
                break;
            }
            case GIFT_FMT_E4M3:
            case GIFT_FMT_E5M2:
                sat = fabsf(x[i] * inv) >= mid;
                zero = (in[l.code_off + i] & 0x7F) == 0;
                break;
            case GIFT_FMT_NVFP4:
                sat = fabsf(x[i] * inv) >= mid;
                zero = ((in[l.code_off + (i >> 1)] >> ((i & 1) * 4)) & 0x7) == 0;
                break;
            default:
                return GIFT_EFORMAT;
            }
            out->saturated += (size_t)sat;
            out->flushed += (size_t)(zero && x[i] != 0.0f);
        }
    }
    return 0;
}
