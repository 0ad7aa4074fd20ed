/*
 * gpu_common.cuh: device helpers the kernels of gpu/ share. Included by .cu
 * files only. Every float operation the codec specifies is written with an
 * explicit round-to-nearest intrinsic (__fmul_rn, __fdiv_rn, __fadd_rn), which
 * nvcc never contracts into an FMA; gpu/ is also built with --fmad=false for
 * the shared inline arithmetic of codec/gift_kernels.h.
 */
#ifndef GIFT_GPU_COMMON_CUH
#define GIFT_GPU_COMMON_CUH

#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "gpu_internal.h"

#define GIFT__GPU_THREADS 256

/* Records code in the error word unless an earlier error is there. */
static __device__ __forceinline__ void gift__gpu_flag(int *err, int code)
{
    atomicCAS(err, 0, code);
}

/* Nonzero when an earlier operation on the context failed: the kernel then
 * writes nothing. A volatile load, so it sees the word as the stream left it. */
static __device__ __forceinline__ int gift__gpu_failed(const int *err)
{
    return *(const volatile int *)err != 0;
}

static inline int gift__gpu_aligned(const void *p, size_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

/* Grid for nthreads threads (at least one block, at most 2^31 - 1). */
static inline unsigned gift__gpu_blocks(size_t nthreads)
{
    size_t b = (nthreads + GIFT__GPU_THREADS - 1) / GIFT__GPU_THREADS;
    if (b == 0)
        b = 1;
    if (b > 0x7FFFFFFFu)
        b = 0x7FFFFFFFu;
    return (unsigned)b;
}

/* Loads x[i .. i+3] (absent elements, past n, read as +0). VEC: x + i is
 * 16-byte aligned whenever i + 3 < n. */
template <bool VEC>
static __device__ __forceinline__ void gift__gpu_load4(const float *x, size_t n, size_t i,
                                                       float v[4])
{
    if (VEC && i + 3 < n) {
        float4 q = *(const float4 *)(x + i);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        return;
    }
    for (int j = 0; j < 4; j++)
        v[j] = i + j < n ? x[i + j] : 0.0f;
}

/* Stores out[i .. i+3] that exist, as the CPU does: value, or out + value. */
template <bool VEC>
static __device__ __forceinline__ void gift__gpu_store4(float *out, size_t n, size_t i,
                                                        const float v[4], int acc)
{
    if (VEC && i + 3 < n) {
        float4 *p = (float4 *)(out + i);
        float4 q;
        if (acc) {
            float4 o = *p;
            q.x = __fadd_rn(o.x, v[0]), q.y = __fadd_rn(o.y, v[1]);
            q.z = __fadd_rn(o.z, v[2]), q.w = __fadd_rn(o.w, v[3]);
        } else {
            q.x = v[0], q.y = v[1], q.z = v[2], q.w = v[3];
        }
        *p = q;
        return;
    }
    for (int j = 0; j < 4; j++)
        if (i + j < n)
            out[i + j] = acc ? __fadd_rn(out[i + j], v[j]) : v[j];
}

/* Unaligned 4-byte float load and store (payload scales). */
static __device__ __forceinline__ float gift__gpu_ldf(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return __uint_as_float((uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
                           ((uint32_t)b[3] << 24));
}

static __device__ __forceinline__ void gift__gpu_stf(void *p, float f)
{
    uint8_t *b = (uint8_t *)p;
    uint32_t u = __float_as_uint(f);
    b[0] = (uint8_t)u, b[1] = (uint8_t)(u >> 8), b[2] = (uint8_t)(u >> 16),
    b[3] = (uint8_t)(u >> 24);
}

/* Max of v over aligned groups of g threads (g a power of two, 1..256,
 * groups never straddle a block). Every thread of the block must call it;
 * red holds GIFT__GPU_THREADS / 32 words. */
static __device__ __forceinline__ uint32_t gift__gpu_group_max(uint32_t v, int g, uint32_t *red)
{
    int lanes = g < 32 ? g : 32;
    for (int o = lanes / 2; o > 0; o /= 2)
        v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    if (g > 32) {
        int w = threadIdx.x / 32, wpg = g / 32, first = w - w % wpg;
        __syncthreads();
        if (threadIdx.x % 32 == 0)
            red[w] = v;
        __syncthreads();
        v = red[first];
        for (int i = 1; i < wpg; i++)
            v = max(v, red[first + i]);
    }
    return v;
}

/* The Philox words of element group g under sr. */
static __device__ __forceinline__ void gift__gpu_sr_words(const gift__gpu_sr_t &sr, uint64_t g,
                                                          uint32_t out[4])
{
    gift__sr_group(&sr.k, sr.key, g, out);
}

#endif
