/*
 * simd_avx2.c: AVX2 twins of the scalar kernels in format.c. Full vectors go
 * through the intrinsics below; every tail goes through the scalar helpers of
 * gift_kernels.h, which compute the same bits. Selected at run time.
 */
#include <float.h>

#include "gift_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

/* 8 floats to small-float codes (one per 32-bit lane), RNE, saturating; the
 * rebias is folded into the rounding add. scaled (a constant): y is a block
 * scaled by fmax / amax of that block, so the min is left out and the
 * subnormal conversion runs only where needed (see cvt16_any in
 * simd_avx512.c). Same codes either way. */
static inline __m256i AVX2 cvt8_any(const gift__minifmt_t *f, __m256 y, int scaled)
{
    const int sh = 23 - f->mbits;
    __m256i b = _mm256_castps_si256(y);
    __m256i a = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, sh), _mm256_set1_epi32(1));
    __m256i c = _mm256_srai_epi32(
        _mm256_add_epi32(_mm256_add_epi32(a, lsb),
                         _mm256_set1_epi32(((1 << (sh - 1)) - 1) - ((127 - f->bias) << 23))),
        sh);
    /* a <= 0x7FFFFFFF, so the signed compare is an unsigned one. */
    __m256i norm = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(((128 - f->bias) << 23) - 1));
    if (!scaled || __builtin_expect(_mm256_movemask_ps(_mm256_castsi256_ps(norm)) != 0xFF, 0)) {
        __m256 t = _mm256_mul_ps(_mm256_castsi256_ps(a),
                                 _mm256_set1_ps(gift__pow2f(f->bias - 1 + f->mbits)));
        c = _mm256_blendv_epi8(_mm256_cvtps_epi32(t), c, norm); /* MXCSR default: RNE */
    }
    if (!scaled)
        c = _mm256_min_epu32(c, _mm256_set1_epi32((int)f->maxcode));
    return _mm256_or_si256(c, _mm256_and_si256(_mm256_srli_epi32(b, 31 - f->signpos),
                                               _mm256_set1_epi32(1 << f->signpos)));
}

static inline __m256i AVX2 cvt8(const gift__minifmt_t *f, __m256 y)
{
    return cvt8_any(f, y, 0);
}

/* Four vectors of 8 codes (values 0..255) to 32 bytes in element order. */
static inline __m256i AVX2 pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3)
{
    __m256i p01 = _mm256_packus_epi32(c0, c1);
    __m256i p23 = _mm256_packus_epi32(c2, c3);
    __m256i p = _mm256_packus_epi16(p01, p23);
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline uint32_t AVX2 hmax8(__m256i m)
{
    __m128i x = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_max_epu32(x, _mm_shuffle_epi32(x, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(x);
}

static uint32_t AVX2 avx2_amax_bits(const float *x, size_t n)
{
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256((const void *)(x + i)), abs));
        m1 = _mm256_max_epu32(m1,
                              _mm256_and_si256(_mm256_loadu_si256((const void *)(x + i + 8)), abs));
        m2 = _mm256_max_epu32(
            m2, _mm256_and_si256(_mm256_loadu_si256((const void *)(x + i + 16)), abs));
        m3 = _mm256_max_epu32(
            m3, _mm256_and_si256(_mm256_loadu_si256((const void *)(x + i + 24)), abs));
    }
    for (; i + 8 <= n; i += 8)
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256((const void *)(x + i)), abs));
    uint32_t mb = hmax8(_mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3)));
    for (; i < n; i++) {
        uint32_t a = gift__f2u(gift__ldf(x + i)) & 0x7FFFFFFFu;
        mb = a > mb ? a : mb;
    }
    return mb;
}

/* One block's codes: x * inv, 32 at a time, then the scalar tail. */
static inline void AVX2 fp8_block_codes(const gift__minifmt_t *f, const float *xb, size_t len,
                                        float inv, uint8_t *cb)
{
    const __m256 vinv = _mm256_set1_ps(inv);
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i c0 = cvt8_any(f, _mm256_mul_ps(_mm256_loadu_ps(xb + i), vinv), 1);
        __m256i c1 = cvt8_any(f, _mm256_mul_ps(_mm256_loadu_ps(xb + i + 8), vinv), 1);
        __m256i c2 = cvt8_any(f, _mm256_mul_ps(_mm256_loadu_ps(xb + i + 16), vinv), 1);
        __m256i c3 = cvt8_any(f, _mm256_mul_ps(_mm256_loadu_ps(xb + i + 24), vinv), 1);
        _mm256_storeu_si256((__m256i *)(cb + i), pack32(c0, c1, c2, c3));
    }
    for (; i < len; i++)
        cb[i] = (uint8_t)gift__cvt_rne(f, xb[i] * inv);
}

static int AVX2 avx2_fp8_encode(const gift__minifmt_t *f, const float *x, size_t n, size_t block,
                                float *scales, uint8_t *codes)
{
    /* A local copy: the code stores (char) may alias *f, which would reload
     * it and rebuild every constant per vector. */
    const gift__minifmt_t fl = *f;
    return gift__fp8_encode_groups(&fl, x, n, block, scales, codes, avx2_amax_bits,
                                   fp8_block_codes);
}

/* 8 codes (one per 32-bit lane, finite) to their fp32 values, unscaled. */
static inline __m256 AVX2 fp8_lanes_value8(const gift__minifmt_t *f, __m256i c)
{
    const int sh = 23 - f->mbits;
    __m256i mag = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7F)), sh);
    __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(gift__pow2f(127 - f->bias)));
    __m256i s = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), s));
}

/* 8 code bytes (finite codes) as fp32 bit patterns that are their values
 * times 2^(bias - 127): the bytes sign-extended (sign at bit 31), shifted so
 * that the magnitude lands under the float's exponent field, the sign's
 * copies masked off. */
static inline __m256 AVX2 fp8_raw8(const gift__minifmt_t *f, __m128i c8)
{
    const int sh = 23 - f->mbits;
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(c8), sh),
                         _mm256_set1_epi32((int)(0x80000000u | (0x7Fu << sh)))));
}

/* Full vectors of one block: raw lanes times m1 (and then m2 when two);
 * out = or += . Returns the elements done. */
static inline size_t AVX2 fp8_decode_lanes(const gift__minifmt_t *f, __m256 m1, __m256 m2, int two,
                                           const uint8_t *codes, size_t len, float *out, int acc)
{
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256 v = _mm256_mul_ps(fp8_raw8(f, _mm_loadl_epi64((const __m128i *)(codes + i))), m1);
        if (two)
            v = _mm256_mul_ps(v, m2);
        if (acc)
            v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
        _mm256_storeu_ps(out + i, v);
    }
    return i;
}

static void AVX2 avx2_fp8_decode(const gift__minifmt_t *f, const float *scales,
                                 const uint8_t *codes, size_t n, size_t block, float *out, int acc)
{
    /* A local copy: the code stores (char) may alias *f, which would reload
     * it and rebuild every constant per vector. */
    const gift__minifmt_t fl = *f;
    const float p = gift__pow2f(127 - fl.bias);
    f = &fl;
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
        size_t len = n - b0 < block ? n - b0 : block, i;
        /* As the AVX-512 decode: one product by s * 2^(127 - bias) where
         * that is finite (the same one rounding), else the two. */
        const float sc = gift__ldf(scales + bi), sp = sc * p;
        const __m256 vs = _mm256_set1_ps(sc);
        if (sp <= FLT_MAX && acc)
            i = fp8_decode_lanes(f, _mm256_set1_ps(sp), vs, 0, codes + b0, len, out + b0, 1);
        else if (sp <= FLT_MAX)
            i = fp8_decode_lanes(f, _mm256_set1_ps(sp), vs, 0, codes + b0, len, out + b0, 0);
        else
            i = fp8_decode_lanes(f, _mm256_set1_ps(p), vs, 1, codes + b0, len, out + b0, acc);
        for (; i < len; i++) {
            float v = gift__mini_value(f, codes[b0 + i]) * sc;
            if (acc)
                out[b0 + i] += v;
            else
                out[b0 + i] = v;
        }
    }
}

static int AVX2 avx2_byte_has_mask(const uint8_t *codes, size_t n, uint8_t mask)
{
    /* (c & mask) never exceeds mask, so a byte hits it exactly when the
     * bytewise maximum of (c & mask) does (as the AVX-512 scan). */
    const __m256i vm = _mm256_set1_epi8((char)mask);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm256_max_epu8(
            m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(codes + i)), vm));
        m1 = _mm256_max_epu8(
            m1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(codes + i + 32)), vm));
    }
    for (; i + 32 <= n; i += 32)
        m0 = _mm256_max_epu8(
            m0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(codes + i)), vm));
    int r = _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(m0, m1), vm)) != 0;
    for (; i < n; i++)
        r |= (codes[i] & mask) == mask;
    return r;
}

/* The block scales of eight blocks (128 elements at x) as one vector (same
 * divisions and roundings as the scalar path): their e4m3 codes into sbc32,
 * the inverses of their effective scales into inv (0 for a zero block). */
static inline void AVX2 nvfp4_group_scales(const float *x, __m256 vst6, __m256 vst,
                                           uint32_t sbc32[8], float inv[8])
{
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
    uint32_t am[8];
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 16 * j;
        am[j] = hmax8(
            _mm256_max_epu32(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)xb), abs),
                             _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(xb + 8)), abs)));
    }
    __m256 r = _mm256_div_ps(_mm256_loadu_ps((const float *)am), vst6);
    __m256i sbc = cvt8(&gift__fmt_e4m3, r);
    __m256 eff = _mm256_mul_ps(fp8_lanes_value8(&gift__fmt_e4m3, sbc), vst);
    __m256 ok = _mm256_cmp_ps(eff, _mm256_set1_ps(FLT_MIN), _CMP_GE_OQ);
    _mm256_storeu_ps(inv, _mm256_and_ps(ok, _mm256_div_ps(_mm256_set1_ps(1.0f), eff)));
    _mm256_storeu_si256((__m256i *)sbc32, sbc);
}

/* Eight blocks (128 elements) at a time: the group's block scales as one
 * vector (nvfp4_group_scales), then each block converted with its broadcast
 * inverse. The next group's scales are computed before this group's blocks,
 * as in simd_avx512.c, so that serial chain overlaps the blocks' work. */
static void AVX2 avx2_nvfp4_encode(const float *x, size_t n, float s_t, uint8_t *sb, uint8_t *codes)
{
    const __m256 vst6 = _mm256_set1_ps(s_t * 6.0f), vst = _mm256_set1_ps(s_t);
    uint32_t sbc32[2][8];
    float inv[2][8];
    size_t g = 0;
    int cur = 0;
    if (n >= 128)
        nvfp4_group_scales(x, vst6, vst, sbc32[0], inv[0]);
    for (; g + 128 <= n; g += 128, cur ^= 1) {
        if (g + 256 <= n)
            nvfp4_group_scales(x + g + 128, vst6, vst, sbc32[cur ^ 1], inv[cur ^ 1]);
        for (int j = 0; j < 8; j++) {
            uint64_t packed = 0;
            sb[g / 16 + j] = (uint8_t)sbc32[cur][j];
            if (inv[cur][j] != 0.0f) {
                const __m256 vinv = _mm256_set1_ps(inv[cur][j]);
                const float *xb = x + g + 16 * j;
                __m256i c0 = cvt8(&gift__fmt_e2m1, _mm256_mul_ps(_mm256_loadu_ps(xb), vinv));
                __m256i c1 = cvt8(&gift__fmt_e2m1, _mm256_mul_ps(_mm256_loadu_ps(xb + 8), vinv));
                /* 16 codes as 16-bit lanes in element order, then each 32-bit
                 * lane (elements 2k, 2k+1) becomes e[2k] | e[2k+1] << 4. */
                __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);
                __m256i q = _mm256_or_si256(
                    _mm256_and_si256(w, _mm256_set1_epi32(0xF)),
                    _mm256_and_si256(_mm256_srli_epi32(w, 12), _mm256_set1_epi32(0xF0)));
                q = _mm256_packus_epi16(_mm256_packus_epi32(q, q), q);
                uint32_t lo = (uint32_t)_mm_cvtsi128_si32(_mm256_castsi256_si128(q));
                uint32_t hi = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(q, 1));
                packed = (uint64_t)lo | ((uint64_t)hi << 32);
            }
            memcpy(codes + (g >> 1) + 8 * j, &packed, 8);
        }
    }
    for (; g < n; g += 16)
        gift__nvfp4_block(x + g, n - g < 16 ? n - g : 16, s_t, sb + g / 16, codes + (g >> 1));
}

static void AVX2 avx2_nvfp4_decode(const uint8_t *sb, float s_t, const uint8_t *codes, size_t n,
                                   float *out, int acc)
{
    float lutf[8];
    for (int c = 0; c < 8; c++)
        lutf[c] = gift__mini_value(&gift__fmt_e2m1, (uint32_t)c);
    const __m256 lut = _mm256_loadu_ps(lutf);
    size_t b0 = 0, bi = 0;
    while (b0 + 16 <= n) {
        /* Eight whole blocks: their effective scales as one vector (exact
         * e4m3 values times s_t, the scalar path's one rounding). Fewer:
         * one block at a time, as the scalar path. */
        float effs[8];
        size_t nb = (n - b0) / 16 < 8 ? 1 : 8;
        if (nb == 8)
            _mm256_storeu_ps(effs,
                             _mm256_mul_ps(fp8_lanes_value8(&gift__fmt_e4m3,
                                                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                                                (const __m128i *)(sb + bi)))),
                                           _mm256_set1_ps(s_t)));
        else
            effs[0] = gift__mini_value(&gift__fmt_e4m3, sb[bi]) * s_t;
        for (size_t j = 0; j < nb; j++, b0 += 16, bi++) {
            __m128i raw = _mm_loadl_epi64((const __m128i *)(codes + (b0 >> 1)));
            __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
            __m128i nib = _mm_unpacklo_epi8(lo, hi);
            const __m256 eff = _mm256_set1_ps(effs[j]);
            for (int h = 0; h < 2; h++) {
                __m256i c = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(nib, 8) : nib);
                __m256 v = _mm256_permutevar8x32_ps(lut, _mm256_and_si256(c, _mm256_set1_epi32(7)));
                __m256i sg = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(8)), 28);
                v = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sg));
                v = _mm256_mul_ps(v, eff);
                if (acc)
                    v = _mm256_add_ps(_mm256_loadu_ps(out + b0 + 8 * h), v);
                _mm256_storeu_ps(out + b0 + 8 * h, v);
            }
        }
    }
    if (b0 < n) {
        float eff = gift__mini_value(&gift__fmt_e4m3, sb[bi]) * s_t;
        for (size_t j = b0; j < n; j++) {
            float v =
                gift__mini_value(&gift__fmt_e2m1, (codes[j >> 1] >> ((j & 1) * 4)) & 0xF) * eff;
            if (acc)
                out[j] += v;
            else
                out[j] = v;
        }
    }
}

static int AVX2 avx2_bf16_encode(const float *x, size_t n, uint16_t *codes)
{
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i mx = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i c[2];
        for (int h = 0; h < 2; h++) {
            __m256i b = _mm256_loadu_si256((const __m256i *)(x + i + 8 * h));
            __m256i a = _mm256_and_si256(b, abs);
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 16), _mm256_set1_epi32(1));
            __m256i v = _mm256_srli_epi32(
                _mm256_add_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
            mx = _mm256_max_epu32(mx, a);
            v = _mm256_min_epu32(v, _mm256_set1_epi32(0x7F7F));
            c[h] = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_srli_epi32(b, 31), 15));
        }
        __m256i p = _mm256_packus_epi32(c[0], c[1]);
        p = _mm256_permute4x64_epi64(p, 0xD8);
        _mm256_storeu_si256((__m256i *)(codes + i), p);
    }
    uint32_t m = hmax8(mx);
    for (; i < n; i++) {
        uint32_t a = gift__f2u(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
        codes[i] = gift__bf16_rne(x[i]);
    }
    return m >= 0x7F800000u ? GIFT_ENONFINITE : 0;
}

static void AVX2 avx2_bf16_decode(const uint16_t *codes, size_t n, float *out, int acc)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i c = _mm_loadu_si128((const __m128i *)(codes + i));
        __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(c), 16));
        if (acc)
            v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++) {
        float v = gift__u2f((uint32_t)gift__ldu16(codes + i) << 16);
        if (acc)
            out[i] += v;
        else
            out[i] = v;
    }
}

static int AVX2 avx2_f32_encode(const float *x, size_t n, float *out)
{
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i mx = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(x + i));
        mx = _mm256_max_epu32(mx, _mm256_and_si256(b, abs));
        _mm256_storeu_si256((__m256i *)(out + i), b);
    }
    uint32_t m = hmax8(mx);
    for (; i < n; i++) {
        uint32_t a = gift__f2u(x[i]) & 0x7FFFFFFFu;
        m = a > m ? a : m;
        out[i] = x[i];
    }
    return m >= 0x7F800000u ? GIFT_ENONFINITE : 0;
}

static void AVX2 avx2_f32_decode(const float *codes, size_t n, float *out, int acc)
{
    size_t i = 0;
    if (!acc) {
        memcpy(out, codes, n * 4);
        return;
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i,
                         _mm256_add_ps(_mm256_loadu_ps(out + i), _mm256_loadu_ps(codes + i)));
    for (; i < n; i++)
        out[i] += gift__ldf(codes + i);
}

static void AVX2 avx2_scale(const float *x, size_t n, float scale, float *dst)
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), z));
    for (; i < n; i++)
        dst[i] = gift__ldf(x + i) * scale + 0.0f;
}

static void AVX2 avx2_scale_add(const float *x, const float *e, size_t n, float scale, float *dst)
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), z);
        _mm256_storeu_ps(dst + i, _mm256_add_ps(y, _mm256_loadu_ps(e + i)));
    }
    for (; i < n; i++)
        dst[i] = (gift__ldf(x + i) * scale + 0.0f) + gift__ldf(e + i);
}

static void AVX2 avx2_sub(const float *a, const float *b, size_t n, float *dst)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++)
        dst[i] = gift__ldf(a + i) - gift__ldf(b + i);
}

static const gift__kernels_t kernels_avx2 = {
    .scale = avx2_scale,
    .scale_add = avx2_scale_add,
    .sub = avx2_sub,
    .fp8_encode = avx2_fp8_encode,
    .fp8_decode = avx2_fp8_decode,
    .byte_has_mask = avx2_byte_has_mask,
    .amax_bits = avx2_amax_bits,
    .nvfp4_encode = avx2_nvfp4_encode,
    .nvfp4_decode = avx2_nvfp4_decode,
    .bf16_encode = avx2_bf16_encode,
    .bf16_decode = avx2_bf16_decode,
    .f32_encode = avx2_f32_encode,
    .f32_decode = avx2_f32_decode,
};
const gift__kernels_t *const gift__kernels_avx2 = &kernels_avx2;

#else
const gift__kernels_t *const gift__kernels_avx2 = NULL;
#endif
