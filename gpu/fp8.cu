/*
 * fp8.cu: block-scaled fp8-e4m3 / fp8-e5m2 encode, check and decode, the
 * twins of the fp8 kernels of codec/format.c (arithmetic in gift_codec.h).
 *
 * Encode: each thread owns 4 consecutive elements; a codec block of B
 * elements is a group of min(B/4, 256) threads that reduce its amax together
 * (blocks over 1024 elements loop, one CUDA block per codec block, and read
 * x twice). Rounding to nearest uses the hardware cvt.rn.satfinite where the
 * architecture has it (sm_89 and up: the same RNE + saturate-to-finite as
 * gift__cvt_rne), and gift__cvt_rne itself elsewhere; stochastic rounding
 * always runs gift__cvt_sr with the CPU's Philox bits.
 */
#include <cuda_fp8.h>

#include "gpu_common.cuh"

/* RNE conversion of a finite y, bit-identical to gift__cvt_rne(f, y). */
static __device__ __forceinline__ void fp8_cvt2(const gift__minifmt_t *f, int e4m3, float y0,
                                                float y1, uint32_t *c0, uint32_t *c1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(GIFT_GPU_SOFT_CVT)
    __nv_fp8x2_storage_t s =
        __nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
    (void)f;
    *c0 = s & 0xFFu;
    *c1 = (s >> 8) & 0xFFu;
#else
    (void)e4m3;
    *c0 = gift__cvt_rne(f, y0);
    *c1 = gift__cvt_rne(f, y1);
#endif
}

template <bool VEC, bool SR>
static __global__ void fp8_encode_kernel(int *err, gift__minifmt_t f, int e4m3, const float *x,
                                         size_t n, size_t block, int g, int steps, uint8_t *scales,
                                         uint8_t *codes, gift__gpu_sr_t sr)
{
    __shared__ uint32_t red[GIFT__GPU_THREADS / 32];
    const size_t tile = (size_t)steps * 4 * GIFT__GPU_THREADS;

    for (size_t t0 = (size_t)blockIdx.x * tile; t0 < n; t0 += (size_t)gridDim.x * tile) {
        const size_t base = t0 + 4 * threadIdx.x;
        const size_t bi = base / block;
        float v[4];
        uint32_t m = 0;
        float scale, inv = 0.0f;

        for (int s = 0; s < steps; s++) {
            gift__gpu_load4<VEC>(x, n, base + (size_t)s * 4 * GIFT__GPU_THREADS, v);
            for (int j = 0; j < 4; j++)
                m = max(m, __float_as_uint(v[j]) & 0x7FFFFFFFu);
        }
        m = gift__gpu_group_max(m, g, red);
        if (m >= 0x7F800000u) {
            if (threadIdx.x % g == 0 && base < n)
                gift__gpu_flag(err, GIFT_ENONFINITE);
            continue;
        }
        scale = __fdiv_rn(__uint_as_float(m), f.fmax);
        if (!(scale >= FLT_MIN))
            scale = 0.0f;
        else
            inv = __fdiv_rn(f.fmax, __uint_as_float(m));
        if (threadIdx.x % g == 0 && base < n)
            gift__gpu_stf(scales + 4 * bi, scale);
        for (int s = 0; s < steps; s++) {
            const size_t i = base + (size_t)s * 4 * GIFT__GPU_THREADS;
            uint32_t c[4] = {0, 0, 0, 0}, r[4];

            if (i >= n)
                break;
            if (steps > 1)
                gift__gpu_load4<VEC>(x, n, i, v);
            if (inv != 0.0f) {
                float y[4];
                for (int j = 0; j < 4; j++)
                    y[j] = __fmul_rn(v[j], inv);
                if (SR) {
                    gift__gpu_sr_words(sr, i >> 2, r);
                    for (int j = 0; j < 4; j++)
                        c[j] = gift__cvt_sr(&f, y[j], r[j]);
                } else {
                    fp8_cvt2(&f, e4m3, y[0], y[1], &c[0], &c[1]);
                    fp8_cvt2(&f, e4m3, y[2], y[3], &c[2], &c[3]);
                }
            }
            if (VEC && i + 3 < n) {
                *(uint32_t *)(codes + i) = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
            } else {
                for (int j = 0; j < 4; j++)
                    if (i + j < n)
                        codes[i + j] = (uint8_t)c[j];
            }
        }
    }
}

extern "C" cudaError_t gift__gpu_fp8_encode(cudaStream_t s, int *err, const gift__minifmt_t *f,
                                            const float *x, size_t n, size_t block, void *scales,
                                            uint8_t *codes, const gift__gpu_sr_t *sr)
{
    const size_t per_cta = 4 * GIFT__GPU_THREADS;
    int g = (int)(block / 4 < GIFT__GPU_THREADS ? block / 4 : GIFT__GPU_THREADS);
    int steps = (int)(block > per_cta ? block / per_cta : 1);
    size_t tiles = (n + per_cta * steps - 1) / (per_cta * steps);
    unsigned grid = gift__gpu_blocks(tiles * GIFT__GPU_THREADS);
    int vec = gift__gpu_aligned(x, 16) && gift__gpu_aligned(codes, 4);
    int e4m3 = f->mbits == 3;
    gift__gpu_sr_t none;
    uint8_t *sc = (uint8_t *)scales;

    if (n == 0)
        return cudaSuccess;
    memset(&none, 0, sizeof none);
    if (sr != NULL && vec)
        fp8_encode_kernel<true, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, *f, e4m3, x, n, block,
                                                                         g, steps, sc, codes, *sr);
    else if (sr != NULL)
        fp8_encode_kernel<false, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, *f, e4m3, x, n, block, g, steps, sc, codes, *sr);
    else if (vec)
        fp8_encode_kernel<true, false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, *f, e4m3, x, n, block, g, steps, sc, codes, none);
    else
        fp8_encode_kernel<false, false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, *f, e4m3, x, n, block, g, steps, sc, codes, none);
    return cudaGetLastError();
}

/* Scales must be finite and >= 0; a code c with (c & mask) == mask is NaN
 * (e4m3, mask 0x7F) or Inf/NaN (e5m2, mask 0x7C). VEC reads the codes four
 * at a time: masking and flipping turns a bad byte into a zero byte (bit 7
 * clear in every byte), which the classic has-zero-byte test finds. */
template <bool VEC>
static __global__ void fp8_check_kernel(int *err, uint32_t mask, const uint8_t *scales,
                                        size_t nblocks, const uint8_t *codes, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint32_t m4 = mask * 0x01010101u;
    int bad = 0;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nblocks; i += stride) {
        float sc = gift__gpu_ldf(scales + 4 * i);
        bad |= !(sc >= 0.0f) || sc > FLT_MAX;
    }
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; 4 * i < n; i += stride) {
        if (VEC && 4 * i + 3 < n) {
            uint32_t t = (*(const uint32_t *)(codes + 4 * i) & m4) ^ m4;
            bad |= ((t - 0x01010101u) & ~t & 0x80808080u) != 0;
        } else {
            for (int j = 0; j < 4; j++)
                if (4 * i + j < n)
                    bad |= (codes[4 * i + j] & mask) == mask;
        }
    }
    if (__any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0)
        gift__gpu_flag(err, GIFT_EBADCODE);
}

extern "C" cudaError_t gift__gpu_fp8_check(cudaStream_t s, int *err, const gift__minifmt_t *f,
                                           const void *scales, size_t nblocks, const uint8_t *codes,
                                           size_t n)
{
    size_t work = (n + 3) / 4 > nblocks ? (n + 3) / 4 : nblocks;
    unsigned grid = gift__gpu_blocks(work < ((size_t)1 << 22) ? work : ((size_t)1 << 22));

    uint32_t mask = f->mbits == 3 ? 0x7Fu : 0x7Cu;

    if (gift__gpu_aligned(codes, 4))
        fp8_check_kernel<true><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, mask, (const uint8_t *)scales, nblocks, codes, n);
    else
        fp8_check_kernel<false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, mask, (const uint8_t *)scales, nblocks, codes, n);
    return cudaGetLastError();
}

template <bool VEC>
static __global__ void fp8_decode_kernel(const int *err, gift__minifmt_t f, const uint8_t *scales,
                                         const uint8_t *codes, size_t n, size_t block, float *out,
                                         int acc)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;

    if (gift__gpu_failed(err))
        return;
    for (size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float sc = gift__gpu_ldf(scales + 4 * (i / block)), v[4];
        uint32_t c[4];

        if (VEC && i + 3 < n) {
            uint32_t w = *(const uint32_t *)(codes + i);
            c[0] = w & 0xFF, c[1] = (w >> 8) & 0xFF, c[2] = (w >> 16) & 0xFF, c[3] = w >> 24;
        } else {
            for (int j = 0; j < 4; j++)
                c[j] = i + j < n ? codes[i + j] : 0u;
        }
        for (int j = 0; j < 4; j++)
            v[j] = __fmul_rn(gift__mini_value(&f, c[j]), sc);
        gift__gpu_store4<VEC>(out, n, i, v, acc);
    }
}

extern "C" cudaError_t gift__gpu_fp8_decode(cudaStream_t s, const int *err,
                                            const gift__minifmt_t *f, const void *scales,
                                            const uint8_t *codes, size_t n, size_t block,
                                            float *out, int acc)
{
    size_t quads = (n + 3) / 4;
    unsigned grid = gift__gpu_blocks(quads < ((size_t)1 << 24) ? quads : ((size_t)1 << 24));
    int vec = gift__gpu_aligned(out, 16) && gift__gpu_aligned(codes, 4);

    if (n == 0)
        return cudaSuccess;
    if (vec)
        fp8_decode_kernel<true><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, *f, (const uint8_t *)scales,
                                                                   codes, n, block, out, acc);
    else
        fp8_decode_kernel<false><<<grid, GIFT__GPU_THREADS, 0, s>>>(
            err, *f, (const uint8_t *)scales, codes, n, block, out, acc);
    return cudaGetLastError();
}
