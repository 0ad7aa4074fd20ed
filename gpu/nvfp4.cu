/*
 * nvfp4.cu: nvfp4 (E2M1 codes, E4M3 block scales of 16, one fp32 tensor
 * scale) encode, check and decode, and the tensor amax they start from; the
 * twins of the nvfp4 kernels of codec/format.c.
 *
 * Encode is two launches: gift__gpu_amax reduces max |x| into one word, then
 * every thread derives the tensor scale from that word with the CPU's fp32
 * divide and encodes 4 consecutive elements; the 4 threads of a 16-element
 * block share its amax by shuffles. The E4M3 block scale and the E2M1 codes
 * use gift__cvt_rne / gift__cvt_sr of codec/gift_kernels.h (sm_100's E2M1
 * conversion is an sm_100a feature, and the software path is exact anyway).
 */
#include "gpu_common.cuh"

/* Grid-stride max over a few CTAs per SM; one atomic per CTA (atomics on
 * one word serialise, so not one per warp). */
template <bool VEC> static __global__ void amax_kernel(const float *x, size_t n, uint32_t *word)
{
    __shared__ uint32_t red[GIFT__GPU_THREADS / 32];
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    uint32_t m = 0;

    for (size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float v[4];
        gift__gpu_load4<VEC>(x, n, i, v);
        for (int j = 0; j < 4; j++)
            m = max(m, __float_as_uint(v[j]) & 0x7FFFFFFFu);
    }
    m = gift__gpu_group_max(m, GIFT__GPU_THREADS, red);
    if (threadIdx.x == 0 && m != 0)
        atomicMax(word, m);
}

extern "C" cudaError_t gift__gpu_amax(cudaStream_t s, const float *x, size_t n, uint32_t *word)
{
    size_t quads = (n + 3) / 4;
    unsigned grid = gift__gpu_blocks(quads < ((size_t)1 << 19) ? quads : ((size_t)1 << 19));

    if (n == 0)
        return cudaSuccess;
    if (gift__gpu_aligned(x, 16))
        amax_kernel<true><<<grid, GIFT__GPU_THREADS, 0, s>>>(x, n, word);
    else
        amax_kernel<false><<<grid, GIFT__GPU_THREADS, 0, s>>>(x, n, word);
    return cudaGetLastError();
}

template <bool VEC, bool SR>
static __global__ void nvfp4_encode_kernel(int *err, gift__minifmt_t e4m3, gift__minifmt_t e2m1,
                                           const float *x, size_t n, const uint32_t *word,
                                           uint8_t *payload, size_t code_off, gift__gpu_sr_t sr)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    const uint32_t mt = *word;
    uint8_t *codes = payload + code_off;
    float s_t;

    if (mt >= 0x7F800000u) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            gift__gpu_flag(err, GIFT_ENONFINITE);
        return;
    }
    s_t = __fdiv_rn(__uint_as_float(mt), GIFT_E2M1_MAX * GIFT_E4M3_MAX);
    if (!(s_t >= FLT_MIN))
        s_t = 0.0f;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        gift__gpu_stf(payload, s_t);
    /* Whole warps run every iteration (the shuffles need all 32 lanes), so
     * the loop bound is rounded up to whole warps. */
    for (size_t i0 = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x - threadIdx.x % 32); i0 < n;
         i0 += stride) {
        const size_t i = i0 + 4 * (threadIdx.x % 32);
        float v[4], inv = 0.0f;
        uint32_t m = 0, c[4] = {0, 0, 0, 0}, r[4];
        uint8_t sb = 0;

        gift__gpu_load4<VEC>(x, n, i, v);
        for (int j = 0; j < 4; j++)
            m = max(m, __float_as_uint(v[j]) & 0x7FFFFFFFu);
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
        if (i >= n)
            continue;
        if (s_t != 0.0f) {
            float rr = __fdiv_rn(__uint_as_float(m), __fmul_rn(s_t, 6.0f));
            float eff;
            sb = (uint8_t)gift__cvt_rne(&e4m3, rr);
            eff = __fmul_rn(gift__mini_value(&e4m3, sb), s_t);
            inv = eff >= FLT_MIN ? __fdiv_rn(1.0f, eff) : 0.0f;
        }
        if (i % GIFT_NVFP4_BLOCK == 0)
            payload[4 + i / GIFT_NVFP4_BLOCK] = sb;
        if (inv != 0.0f) {
            if (SR)
                gift__gpu_sr_words(sr, i >> 2, r);
            for (int j = 0; j < 4; j++) {
                float y = __fmul_rn(v[j], inv);
                c[j] =
                    i + j < n ? (SR ? gift__cvt_sr(&e2m1, y, r[j]) : gift__cvt_rne(&e2m1, y)) : 0u;
            }
        }
        {
            uint8_t b0 = (uint8_t)(c[0] | (c[1] << 4)), b1 = (uint8_t)(c[2] | (c[3] << 4));
            size_t k = i / 2, nb = (n + 1) / 2;
            if (VEC && k + 1 < nb) {
                *(uint16_t *)(codes + k) = (uint16_t)(b0 | (b1 << 8));
            } else {
                codes[k] = b0;
                if (k + 1 < nb)
                    codes[k + 1] = b1;
            }
        }
    }
}

extern "C" cudaError_t gift__gpu_nvfp4_encode(cudaStream_t s, int *err, const float *x, size_t n,
                                              const uint32_t *word, uint8_t *payload,
                                              size_t code_off, const gift__gpu_sr_t *sr)
{
    size_t quads = (n + 3) / 4;
    unsigned grid = gift__gpu_blocks(quads < ((size_t)1 << 24) ? quads : ((size_t)1 << 24));
    int vec = gift__gpu_aligned(x, 16) && gift__gpu_aligned(payload + code_off, 2);
    gift__gpu_sr_t none;

    memset(&none, 0, sizeof none);
    if (sr != NULL && vec)
        nvfp4_encode_kernel<true, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, gift__fmt_e4m3, gift__fmt_e2m1, x, n, word, payload, code_off, *sr);
    else if (sr != NULL)
        nvfp4_encode_kernel<false, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, gift__fmt_e4m3, gift__fmt_e2m1, x, n, word, payload, code_off, *sr);
    else if (vec)
        nvfp4_encode_kernel<true, false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, gift__fmt_e4m3, gift__fmt_e2m1, x, n, word, payload, code_off, none);
    else
        nvfp4_encode_kernel<false, false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, gift__fmt_e4m3, gift__fmt_e2m1, x, n, word, payload, code_off, none);
    return cudaGetLastError();
}

/* The tensor scale must be finite and >= 0; block scales are unsigned E4M3
 * (no sign, no NaN: below 0x7F). */
static __global__ void nvfp4_check_kernel(int *err, const uint8_t *payload, size_t nblocks)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int bad = 0;

    if (t == 0) {
        float s_t = gift__gpu_ldf(payload);
        bad |= !(s_t >= 0.0f) || s_t > FLT_MAX;
    }
    for (size_t i = t; i < nblocks; i += stride)
        bad |= payload[4 + i] >= 0x7F;
    if (__any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0)
        gift__gpu_flag(err, GIFT_EBADCODE);
}

extern "C" cudaError_t gift__gpu_nvfp4_check(cudaStream_t s, int *err, const uint8_t *payload,
                                             size_t nblocks)
{
    unsigned grid = gift__gpu_blocks(nblocks < ((size_t)1 << 22) ? nblocks : ((size_t)1 << 22));

    nvfp4_check_kernel<<<grid, GIFT__GPU_THREADS, 0, s>>>(err, payload, nblocks);
    return cudaGetLastError();
}

template <bool VEC>
static __global__ void nvfp4_decode_kernel(const int *err, gift__minifmt_t e4m3,
                                           gift__minifmt_t e2m1, const uint8_t *payload,
                                           size_t code_off, size_t n, float *out, int acc)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    const uint8_t *codes = payload + code_off;
    float s_t;

    if (gift__gpu_failed(err))
        return;
    s_t = gift__gpu_ldf(payload);
    for (size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float eff = __fmul_rn(gift__mini_value(&e4m3, payload[4 + i / GIFT_NVFP4_BLOCK]), s_t);
        float v[4];
        uint32_t w;

        if (VEC && i + 3 < n)
            w = *(const uint16_t *)(codes + i / 2);
        else
            w = codes[i / 2] | (i + 2 < n ? (uint32_t)codes[i / 2 + 1] << 8 : 0u);
        for (int j = 0; j < 4; j++)
            v[j] = __fmul_rn(gift__mini_value(&e2m1, (w >> (4 * j)) & 0xFu), eff);
        gift__gpu_store4<VEC>(out, n, i, v, acc);
    }
}

extern "C" cudaError_t gift__gpu_nvfp4_decode(cudaStream_t s, const int *err,
                                              const uint8_t *payload, size_t code_off, size_t n,
                                              float *out, int acc)
{
    size_t quads = (n + 3) / 4;
    unsigned grid = gift__gpu_blocks(quads < ((size_t)1 << 24) ? quads : ((size_t)1 << 24));
    int vec = gift__gpu_aligned(out, 16) && gift__gpu_aligned(payload + code_off, 2);

    if (n == 0)
        return cudaSuccess;
    if (vec)
        nvfp4_decode_kernel<true><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, gift__fmt_e4m3, gift__fmt_e2m1, payload, code_off, n, out, acc);
    else
        nvfp4_decode_kernel<false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, gift__fmt_e4m3, gift__fmt_e2m1, payload, code_off, n, out, acc);
    return cudaGetLastError();
}
