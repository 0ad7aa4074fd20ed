/*
 * simd_avx512.c: AVX-512 (F, BW, VL, DQ) twins of the scalar kernels in
 * format.c. Each step mirrors gift__cvt_rne and the decode arithmetic, so the
 * bytes and floats are identical to the scalar path; tails use masked loads
 * and stores. Selected at run time by format.c.
 */
#include <float.h>

#include "gift_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

static inline __mmask16 AVX512 tail_mask(size_t len)
{
    return len >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << len) - 1);
}

/* 16 floats to small-float codes (one per 32-bit lane), RNE, saturating.
 * Normal results: the mantissa rounded (+ half - 1 + lsb) and the exponent
 * rebiased in one add, then shifted (arithmetic: lanes below the normal range
 * go negative here and are replaced by the subnormal codes).
 * scaled (a constant): y is a block scaled by fmax / amax of that block. No
 * lane then lies above fmax by more than the two roundings of the scaling,
 * far below the midpoint to the next code, so the saturating min is left
 * out; and the subnormal conversion runs only for vectors that hold a lane
 * below the normal range (rare in scaled blocks, zeros aside). Same codes. */
static inline __m512i AVX512 cvt16_any(const gift__minifmt_t *f, __m512 y, int scaled)
{
    const int sh = 23 - f->mbits;
    __m512i b = _mm512_castps_si512(y);
    __m512i a = _mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, sh), _mm512_set1_epi32(1));
    __m512i c = _mm512_srai_epi32(
        _mm512_add_epi32(_mm512_add_epi32(a, lsb),
                         _mm512_set1_epi32(((1 << (sh - 1)) - 1) - ((127 - f->bias) << 23))),
        sh);
    __mmask16 norm = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((128 - f->bias) << 23));
    if (!scaled || __builtin_expect(norm != 0xFFFF, 0)) {
        __m512 t = _mm512_mul_ps(_mm512_castsi512_ps(a),
                                 _mm512_set1_ps(gift__pow2f(f->bias - 1 + f->mbits)));
        c = _mm512_mask_blend_epi32(
            norm, _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), c);
    }
    if (!scaled)
        c = _mm512_min_epu32(c, _mm512_set1_epi32((int)f->maxcode));
    /* c | (sign bit moved to signpos) */
    return _mm512_ternarylogic_epi32(c, _mm512_srli_epi32(b, 31 - f->signpos),
                                     _mm512_set1_epi32(1 << f->signpos), 0xF8);
}

static inline __m512i AVX512 cvt16(const gift__minifmt_t *f, __m512 y)
{
    return cvt16_any(f, y, 0);
}

static inline uint32_t AVX512 amax16(const float *x, size_t len, __m512i m)
{
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    size_t i = 0;
    for (; i + 16 <= len; i += 16)
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
    if (i < len)
        m = _mm512_max_epu32(
            m, _mm512_and_si512(_mm512_maskz_loadu_epi32(tail_mask(len - i), x + i), abs));
    return (uint32_t)_mm512_reduce_max_epu32(m);
}

static uint32_t AVX512 avx512_amax_bits(const float *x, size_t n)
{
    __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
        m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), abs));
        m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), abs));
        m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), abs));
    }
    m0 = _mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3));
    return amax16(x + i, n - i, m0);
}

/* Codes of one block of len elements scaled by inv = fmax / amax. */
static inline void AVX512 fp8_block_codes(const gift__minifmt_t *f, const float *xb, size_t len,
                                          float inv, uint8_t *cb)
{
    const __m512 vinv = _mm512_set1_ps(inv);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512 v = _mm512_loadu_ps(xb + i);
        _mm_storeu_si128((__m128i *)(cb + i),
                         _mm512_cvtepi32_epi8(cvt16_any(f, _mm512_mul_ps(v, vinv), 1)));
    }
    if (i < len) {
        __mmask16 m = tail_mask(len - i);
        __m512 v = _mm512_maskz_loadu_ps(m, xb + i);
        __m128i c = _mm512_cvtepi32_epi8(cvt16_any(f, _mm512_mul_ps(v, vinv), 1));
        _mm_mask_storeu_epi8(cb + i, m, c);
    }
}

/* One block's amax for the shared group driver (gift__fp8_encode_groups). */
static inline uint32_t AVX512 fp8_block_amax(const float *x, size_t len)
{
    return amax16(x, len, _mm512_setzero_si512());
}

static int AVX512 avx512_fp8_encode(const gift__minifmt_t *f, const float *x, size_t n,
                                    size_t block, float *scales, uint8_t *codes)
{
    /* A local copy: the code stores (char) may alias *f, which would reload
     * it and rebuild every constant per vector. */
    const gift__minifmt_t fl = *f;
    return gift__fp8_encode_groups(&fl, x, n, block, scales, codes, fp8_block_amax,
                                   fp8_block_codes);
}

/* 16 codes (one per 32-bit lane, finite) to their fp32 values, unscaled:
 * the code's top byte moved to the float's (sign at bit 31), shifted right
 * arithmetically so that the magnitude lands under the float's exponent
 * field, the sign's copies masked off, and the result scaled by the
 * format's bias (exact: a power of two, subnormal codes included). */
static inline __m512 AVX512 fp8_lanes_value16(const gift__minifmt_t *f, __m512i c)
{
    const int sh = 23 - f->mbits;
    __m512i m = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(c, 24), 24 - sh),
                                 _mm512_set1_epi32((int)(0x80000000u | (0x7Fu << sh))));
    return _mm512_mul_ps(_mm512_castsi512_ps(m), _mm512_set1_ps(gift__pow2f(127 - f->bias)));
}

/* 16 code bytes (finite codes) as fp32 bit patterns that are their values
 * times 2^(bias - 127): the bytes sign-extended (sign at bit 31), shifted so
 * that the magnitude lands under the float's exponent field, the sign's
 * copies masked off (as fp8_lanes_value16, one shift fewer). */
static inline __m512 AVX512 fp8_raw16(const gift__minifmt_t *f, __m128i c8)
{
    const int sh = 23 - f->mbits;
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(c8), sh),
                         _mm512_set1_epi32((int)(0x80000000u | (0x7Fu << sh)))));
}

/* One block of raw lanes times m1 (and then m2 when two): out = or += . */
static inline void AVX512 fp8_decode_lanes(const gift__minifmt_t *f, __m512 m1, __m512 m2, int two,
                                           const uint8_t *codes, size_t len, float *out, int acc)
{
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m512 v = _mm512_mul_ps(fp8_raw16(f, _mm_loadu_si128((const __m128i *)(codes + i))), m1);
        if (two)
            v = _mm512_mul_ps(v, m2);
        if (acc)
            v = _mm512_add_ps(_mm512_loadu_ps(out + i), v);
        _mm512_storeu_ps(out + i, v);
    }
    if (i < len) {
        __mmask16 m = tail_mask(len - i);
        __m512 v = _mm512_mul_ps(fp8_raw16(f, _mm_maskz_loadu_epi8(m, codes + i)), m1);
        if (two)
            v = _mm512_mul_ps(v, m2);
        if (acc)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + i), v);
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

static void AVX512 avx512_fp8_decode(const gift__minifmt_t *f, const float *scales,
                                     const uint8_t *codes, size_t n, size_t block, float *out,
                                     int acc)
{
    /* A local copy: the code stores (char) may alias *f, which would reload
     * it and rebuild every constant per vector. */
    const gift__minifmt_t fl = *f;
    const float p = gift__pow2f(127 - fl.bias);
    f = &fl;
    for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
        size_t len = n - b0 < block ? n - b0 : block;
        /* A raw lane times 2^(127 - bias) is the code's value, exactly, and
         * s * 2^(127 - bias) is exact unless it overflows: one product by it
         * rounds the same real number once, as the two products do. Blocks
         * whose product overflows (s >= 2^(bias - 127 + 128)) take the two. */
        const float s = gift__ldf(scales + bi), sp = s * p;
        const __m512 vs = _mm512_set1_ps(s);
        if (sp <= FLT_MAX && acc)
            fp8_decode_lanes(f, _mm512_set1_ps(sp), vs, 0, codes + b0, len, out + b0, 1);
        else if (sp <= FLT_MAX)
            fp8_decode_lanes(f, _mm512_set1_ps(sp), vs, 0, codes + b0, len, out + b0, 0);
        else
            fp8_decode_lanes(f, _mm512_set1_ps(p), vs, 1, codes + b0, len, out + b0, acc);
    }
}

static int AVX512 avx512_byte_has_mask(const uint8_t *codes, size_t n, uint8_t mask)
{
    /* (c & mask) never exceeds mask, so a byte hits it exactly when the
     * bytewise maximum of (c & mask) does: two vector operations per 64
     * codes, four chains, one compare at the end. */
    const __m512i vm = _mm512_set1_epi8((char)mask);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
    __mmask64 bad = 0;
    size_t i = 0;
    for (; i + 256 <= n; i += 256) {
        m0 = _mm512_max_epu8(m0, _mm512_and_si512(_mm512_loadu_si512(codes + i), vm));
        m1 = _mm512_max_epu8(m1, _mm512_and_si512(_mm512_loadu_si512(codes + i + 64), vm));
        m2 = _mm512_max_epu8(m2, _mm512_and_si512(_mm512_loadu_si512(codes + i + 128), vm));
        m3 = _mm512_max_epu8(m3, _mm512_and_si512(_mm512_loadu_si512(codes + i + 192), vm));
    }
    for (; i + 64 <= n; i += 64)
        m0 = _mm512_max_epu8(m0, _mm512_and_si512(_mm512_loadu_si512(codes + i), vm));
    m0 = _mm512_max_epu8(_mm512_max_epu8(m0, m1), _mm512_max_epu8(m2, m3));
    bad = _mm512_cmpeq_epi8_mask(m0, vm);
    if (i < n) {
        __mmask64 m = (__mmask64)((~0ull) >> (64 - (n - i)));
        __m512i c = _mm512_maskz_loadu_epi8(m, codes + i);
        bad |= _mm512_mask_cmpeq_epi8_mask(m, _mm512_and_si512(c, vm), vm);
    }
    return bad != 0;
}

/* Packs 16 nibble codes (one per 32-bit lane, values 0..15) into 8 bytes,
 * low nibble first: each 64-bit pair gets its odd lane's code moved under
 * bits 4..7 of its even lane's, then one byte per pair is kept. */
static inline __m128i AVX512 nib_pack(__m512i c)
{
    return _mm512_cvtepi64_epi8(_mm512_or_si512(c, _mm512_srli_epi64(c, 28)));
}

/* Lane j of the result is the largest lane of a[j] (unsigned): a 16 x 16
 * transpose-and-reduce in 15 shuffles instead of 16 horizontal reductions. */
static inline __m512i AVX512 hmax16x16(const __m512i a[16])
{
    __m512i c[8], d[4], e[2];
    for (int i = 0; i < 8; i++) /* c[i]: 256-bit halves of a[2i], a[2i+1], maxed */
        c[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* d[i] quarter k: 4 partial lanes of a[4i + k] */
        d[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(c[2 * i], c[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(c[2 * i], c[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* e[i] quarter k: 2 lanes of a[8i + k], 2 of a[8i + 4 + k] */
        e[i] = _mm512_max_epu32(_mm512_unpacklo_epi64(d[2 * i], d[2 * i + 1]),
                                _mm512_unpackhi_epi64(d[2 * i], d[2 * i + 1]));
    /* quarter k: a[k], a[4 + k], a[8 + k], a[12 + k] */
    __m512 e0 = _mm512_castsi512_ps(e[0]), e1 = _mm512_castsi512_ps(e[1]);
    __m512i f = _mm512_max_epu32(_mm512_castps_si512(_mm512_shuffle_ps(e0, e1, 0x88)),
                                 _mm512_castps_si512(_mm512_shuffle_ps(e0, e1, 0xDD)));
    /* Lane 4k + j holds a[k + 4j]: gather lane v from 4 (v % 4) + v / 4. */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(idx, f);
}

/* The block scales of sixteen blocks (256 elements at x) as one vector (same
 * divisions and roundings as the scalar path): their e4m3 codes into *sbc,
 * the inverses of their effective scales into inv (0 for a zero block). */
static inline void AVX512 nvfp4_group_scales(const float *x, __m512 vst6, __m512 vst, __m512i *sbc,
                                             float inv[16])
{
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i a[16];
    for (int j = 0; j < 16; j++)
        a[j] = _mm512_and_si512(_mm512_loadu_si512(x + 16 * j), abs);
    __m512 r = _mm512_div_ps(_mm512_castsi512_ps(hmax16x16(a)), vst6);
    *sbc = cvt16(&gift__fmt_e4m3, r);
    __m512 eff = _mm512_mul_ps(fp8_lanes_value16(&gift__fmt_e4m3, *sbc), vst);
    __mmask16 ok = _mm512_cmp_ps_mask(eff, _mm512_set1_ps(FLT_MIN), _CMP_GE_OQ);
    _mm512_storeu_ps(inv, _mm512_maskz_div_ps(ok, _mm512_set1_ps(1.0f), eff));
}

/* Sixteen blocks (256 elements) at a time: the group's block scales as one
 * vector (nvfp4_group_scales), then each block converted with its broadcast
 * inverse. The next group's scales are computed before this group's blocks:
 * that chain (reduction, divisions, conversions) is long and serial, and so
 * it overlaps the blocks' independent work instead of stalling between
 * groups. */
static void AVX512 avx512_nvfp4_encode(const float *x, size_t n, float s_t, uint8_t *sb,
                                       uint8_t *codes)
{
    const __m512 vst6 = _mm512_set1_ps(s_t * 6.0f), vst = _mm512_set1_ps(s_t);
    float inv[2][16];
    __m512i sbc[2];
    size_t g = 0;
    int cur = 0;
    if (n >= 256)
        nvfp4_group_scales(x, vst6, vst, &sbc[0], inv[0]);
    for (; g + 256 <= n; g += 256, cur ^= 1) {
        if (g + 512 <= n)
            nvfp4_group_scales(x + g + 256, vst6, vst, &sbc[cur ^ 1], inv[cur ^ 1]);
        _mm_storeu_si128((__m128i *)(sb + g / 16), _mm512_cvtepi32_epi8(sbc[cur]));
        for (int j = 0; j < 16; j++) {
            __m128i packed = _mm_setzero_si128();
            if (inv[cur][j] != 0.0f) {
                __m512 y =
                    _mm512_mul_ps(_mm512_loadu_ps(x + g + 16 * j), _mm512_set1_ps(inv[cur][j]));
                packed = nib_pack(cvt16(&gift__fmt_e2m1, y));
            }
            _mm_storel_epi64((__m128i *)(codes + (g >> 1) + 8 * j), packed);
        }
    }
    for (; g < n; g += 16)
        gift__nvfp4_block(x + g, n - g < 16 ? n - g : 16, s_t, sb + g / 16, codes + (g >> 1));
}

static void AVX512 avx512_nvfp4_decode(const uint8_t *sb, float s_t, const uint8_t *codes, size_t n,
                                       float *out, int acc)
{
    float lutf[16];
    for (int c = 0; c < 16; c++)
        lutf[c] = gift__mini_value(&gift__fmt_e2m1, (uint32_t)c);
    const __m512 lut = _mm512_loadu_ps(lutf);
    size_t g = 0;
    /* Sixteen blocks (256 elements, 128 code bytes) at a time: their sixteen
     * effective scales as one vector (the e4m3 values are exact, times s_t
     * is the scalar path's one rounding), then two blocks per 16 code bytes. */
    for (; g + 256 <= n; g += 256) {
        float eff[16];
        _mm512_storeu_ps(eff, _mm512_mul_ps(fp8_lanes_value16(&gift__fmt_e4m3,
                                                              _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                                                  (const __m128i *)(sb + g / 16)))),
                                            _mm512_set1_ps(s_t)));
        for (int j = 0; j < 16; j += 2) {
            __m128i raw = _mm_loadu_si128((const __m128i *)(codes + (g >> 1) + 8 * j));
            __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
            __m512 v0 = _mm512_mul_ps(
                _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), lut),
                _mm512_set1_ps(eff[j]));
            __m512 v1 = _mm512_mul_ps(
                _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), lut),
                _mm512_set1_ps(eff[j + 1]));
            float *o = out + g + 16 * j;
            if (acc) {
                v0 = _mm512_add_ps(_mm512_loadu_ps(o), v0);
                v1 = _mm512_add_ps(_mm512_loadu_ps(o + 16), v1);
            }
            _mm512_storeu_ps(o, v0);
            _mm512_storeu_ps(o + 16, v1);
        }
    }
    for (size_t b0 = g, bi = g / 16; b0 < n; b0 += 16, bi++) {
        size_t len = n - b0 < 16 ? n - b0 : 16;
        __mmask16 m = tail_mask(len);
        __m128i raw;
        if (len == 16)
            raw = _mm_loadl_epi64((const __m128i *)(codes + (b0 >> 1)));
        else {
            uint8_t tmp[16] = {0};
            memcpy(tmp, codes + (b0 >> 1), (len + 1) / 2);
            raw = _mm_loadu_si128((const __m128i *)tmp);
        }
        __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
        __m512i c = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
        float eff = gift__mini_value(&gift__fmt_e4m3, sb[bi]) * s_t;
        __m512 v = _mm512_mul_ps(_mm512_permutexvar_ps(c, lut), _mm512_set1_ps(eff));
        if (len == 16) {
            if (acc)
                v = _mm512_add_ps(_mm512_loadu_ps(out + b0), v);
            _mm512_storeu_ps(out + b0, v);
            continue;
        }
        if (acc)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + b0), v);
        _mm512_mask_storeu_ps(out + b0, m, v);
    }
}

static int AVX512 avx512_bf16_encode(const float *x, size_t n, uint16_t *codes)
{
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i mx = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512i b = m == 0xFFFF ? _mm512_loadu_si512(x + i) : _mm512_maskz_loadu_epi32(m, x + i);
        __m512i a = _mm512_and_si512(b, abs);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, 16), _mm512_set1_epi32(1));
        __m512i c = _mm512_srli_epi32(
            _mm512_add_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
        mx = _mm512_max_epu32(mx, a);
        c = _mm512_min_epu32(c, _mm512_set1_epi32(0x7F7F));
        c = _mm512_or_si512(c, _mm512_slli_epi32(_mm512_srli_epi32(b, 31), 15));
        if (m == 0xFFFF)
            _mm256_storeu_si256((__m256i *)(codes + i), _mm512_cvtepi32_epi16(c));
        else
            _mm256_mask_storeu_epi16(codes + i, m, _mm512_cvtepi32_epi16(c));
    }
    return (uint32_t)_mm512_reduce_max_epu32(mx) >= 0x7F800000u ? GIFT_ENONFINITE : 0;
}

static void AVX512 avx512_bf16_decode(const uint16_t *codes, size_t n, float *out, int acc)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        if (m == 0xFFFF) {
            __m256i c = _mm256_loadu_si256((const __m256i *)(codes + i));
            __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(c), 16));
            if (acc)
                v = _mm512_add_ps(_mm512_loadu_ps(out + i), v);
            _mm512_storeu_ps(out + i, v);
            continue;
        }
        __m256i c = _mm256_maskz_loadu_epi16(m, codes + i);
        __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(c), 16));
        if (acc)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + i), v);
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

static int AVX512 avx512_f32_encode(const float *x, size_t n, float *out)
{
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i mx = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_loadu_si512(x + i);
        mx = _mm512_max_epu32(mx, _mm512_and_si512(b, abs));
        _mm512_storeu_si512(out + i, b);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512i b = _mm512_maskz_loadu_epi32(m, x + i);
        mx = _mm512_max_epu32(mx, _mm512_and_si512(b, abs));
        _mm512_mask_storeu_epi32(out + i, m, b);
    }
    return (uint32_t)_mm512_reduce_max_epu32(mx) >= 0x7F800000u ? GIFT_ENONFINITE : 0;
}

static void AVX512 avx512_f32_decode(const float *codes, size_t n, float *out, int acc)
{
    if (!acc) {
        memcpy(out, codes, n * 4);
        return;
    }
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i,
                         _mm512_add_ps(_mm512_loadu_ps(out + i), _mm512_loadu_ps(codes + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v =
            _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + i), _mm512_maskz_loadu_ps(m, codes + i));
        _mm512_mask_storeu_ps(out + i, m, v);
    }
}

static void AVX512 avx512_scale(const float *x, size_t n, float scale, float *dst)
{
    const __m512 s = _mm512_set1_ps(scale), z = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), z));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m,
                              _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s), z));
    }
}

static void AVX512 avx512_scale_add(const float *x, const float *e, size_t n, float scale,
                                    float *dst)
{
    const __m512 s = _mm512_set1_ps(scale), z = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), s), z);
        _mm512_storeu_ps(dst + i, _mm512_add_ps(y, _mm512_loadu_ps(e + i)));
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s), z);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, e + i)));
    }
}

static void AVX512 avx512_sub(const float *a, const float *b, size_t n, float *dst)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(
            dst + i, m,
            _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
    }
}

static const gift__kernels_t kernels_avx512 = {
    .scale = avx512_scale,
    .scale_add = avx512_scale_add,
    .sub = avx512_sub,
    .fp8_encode = avx512_fp8_encode,
    .fp8_decode = avx512_fp8_decode,
    .byte_has_mask = avx512_byte_has_mask,
    .amax_bits = avx512_amax_bits,
    .nvfp4_encode = avx512_nvfp4_encode,
    .nvfp4_decode = avx512_nvfp4_decode,
    .bf16_encode = avx512_bf16_encode,
    .bf16_decode = avx512_bf16_decode,
    .f32_encode = avx512_f32_encode,
    .f32_decode = avx512_f32_decode,
};
const gift__kernels_t *const gift__kernels_avx512 = &kernels_avx512;

#else
const gift__kernels_t *const gift__kernels_avx512 = NULL;
#endif
