/*
 * dense.cu: the unscaled formats (f32, bf16) and the elementwise steps of
 * error feedback; twins of format.c's f32/bf16 kernels and of gift_ef_add /
 * gift_ef_update. Each thread owns 4 consecutive elements; codes may sit at
 * any byte offset (the VEC variants run when everything is aligned).
 */
#include "gpu_common.cuh"

static __device__ __forceinline__ uint32_t ldu16(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

template <bool VEC, bool BF16, bool SR>
static __global__ void dense_encode_kernel(int *err, const float *x, size_t n, uint8_t *codes,
                                           gift__gpu_sr_t sr)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    int bad = 0;

    for (size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float v[4];
        uint32_t r[4];

        gift__gpu_load4<VEC>(x, n, i, v);
        for (int j = 0; j < 4; j++)
            bad |= (__float_as_uint(v[j]) & 0x7FFFFFFFu) >= 0x7F800000u;
        if (!BF16) {
            if (VEC && i + 3 < n) {
                *(float4 *)(codes + 4 * i) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
                for (int j = 0; j < 4; j++)
                    if (i + j < n)
                        gift__gpu_stf(codes + 4 * (i + j), v[j]);
            }
            continue;
        }
        uint32_t c[4];
        if (SR)
            gift__gpu_sr_words(sr, i >> 2, r);
        for (int j = 0; j < 4; j++)
            c[j] = SR ? gift__bf16_sr(v[j], r[j]) : gift__bf16_rne(v[j]);
        if (VEC && i + 3 < n) {
            *(uint2 *)(codes + 2 * i) = make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
        } else {
            for (int j = 0; j < 4; j++)
                if (i + j < n) {
                    codes[2 * (i + j)] = (uint8_t)c[j];
                    codes[2 * (i + j) + 1] = (uint8_t)(c[j] >> 8);
                }
        }
    }
    if (__any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0)
        gift__gpu_flag(err, GIFT_ENONFINITE);
}

static unsigned quad_grid(size_t n)
{
    size_t quads = (n + 3) / 4;
    return gift__gpu_blocks(quads < ((size_t)1 << 24) ? quads : ((size_t)1 << 24));
}

extern "C" cudaError_t gift__gpu_f32_encode(cudaStream_t s, int *err, const float *x, size_t n,
                                            void *codes)
{
    gift__gpu_sr_t none;
    uint8_t *c = (uint8_t *)codes;

    if (n == 0)
        return cudaSuccess;
    memset(&none, 0, sizeof none);
    if (gift__gpu_aligned(x, 16) && gift__gpu_aligned(codes, 16))
        dense_encode_kernel<true, false, false>
            <<<quad_grid(n), GIFT__GPU_THREADS, 0, s>>>(err, x, n, c, none);
    else
        dense_encode_kernel<false, false, false>
            <<<quad_grid(n), GIFT__GPU_THREADS, 0, s>>>(err, x, n, c, none);
    return cudaGetLastError();
}

extern "C" cudaError_t gift__gpu_bf16_encode(cudaStream_t s, int *err, const float *x, size_t n,
                                             void *codes, const gift__gpu_sr_t *sr)
{
    gift__gpu_sr_t none;
    uint8_t *c = (uint8_t *)codes;
    int vec = gift__gpu_aligned(x, 16) && gift__gpu_aligned(codes, 8);
    unsigned grid = quad_grid(n);

    if (n == 0)
        return cudaSuccess;
    memset(&none, 0, sizeof none);
    if (sr != NULL && vec)
        dense_encode_kernel<true, true, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, x, n, c, *sr);
    else if (sr != NULL)
        dense_encode_kernel<false, true, true>
            <<<grid, GIFT__GPU_THREADS, 0, s>>>(err, x, n, c, *sr);
    else if (vec)
        dense_encode_kernel<true, true, false>
            <<<grid, GIFT__GPU_THREADS, 0, s>>>(err, x, n, c, none);
    else
        dense_encode_kernel<false, true, false>
            <<<grid, GIFT__GPU_THREADS, 0, s>>>(err, x, n, c, none);
    return cudaGetLastError();
}

/* f32: a code with all exponent bits set is Inf/NaN; bf16 likewise. */
static __global__ void dense_check_kernel(int *err, int bf16, const uint8_t *codes, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    int bad = 0;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (bf16)
            bad |= (ldu16(codes + 2 * i) & 0x7F80u) == 0x7F80u;
        else
            bad |= (__float_as_uint(gift__gpu_ldf(codes + 4 * i)) & 0x7F800000u) == 0x7F800000u;
    }
    if (__any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0)
        gift__gpu_flag(err, GIFT_EBADCODE);
}

extern "C" cudaError_t gift__gpu_dense_check(cudaStream_t s, int *err, int bf16, const void *codes,
                                             size_t n)
{
    unsigned grid = gift__gpu_blocks(n < ((size_t)1 << 22) ? n : ((size_t)1 << 22));

    dense_check_kernel<<<grid, GIFT__GPU_THREADS, 0, s>>>(err, bf16, (const uint8_t *)codes, n);
    return cudaGetLastError();
}

template <bool VEC, bool BF16>
static __global__ void dense_decode_kernel(const int *err, const uint8_t *codes, size_t n,
                                           float *out, int acc)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x * 4;

    if (gift__gpu_failed(err))
        return;
    for (size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        float v[4];

        if (VEC && i + 3 < n) {
            if (BF16) {
                uint2 w = *(const uint2 *)(codes + 2 * i);
                v[0] = __uint_as_float(w.x << 16), v[1] = __uint_as_float(w.x & 0xFFFF0000u);
                v[2] = __uint_as_float(w.y << 16), v[3] = __uint_as_float(w.y & 0xFFFF0000u);
            } else {
                float4 q = *(const float4 *)(codes + 4 * i);
                v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
            }
        } else {
            for (int j = 0; j < 4; j++) {
                if (i + j >= n)
                    v[j] = 0.0f;
                else if (BF16)
                    v[j] = __uint_as_float(ldu16(codes + 2 * (i + j)) << 16);
                else
                    v[j] = gift__gpu_ldf(codes + 4 * (i + j));
            }
        }
        gift__gpu_store4<VEC>(out, n, i, v, acc);
    }
}

extern "C" cudaError_t gift__gpu_dense_decode(cudaStream_t s, const int *err, int bf16,
                                              const void *codes, size_t n, float *out, int acc)
{
    const uint8_t *c = (const uint8_t *)codes;
    int vec = gift__gpu_aligned(out, 16) && gift__gpu_aligned(codes, 16);
    unsigned grid = quad_grid(n);

    if (n == 0)
        return cudaSuccess;
    if (bf16 && vec)
        dense_decode_kernel<true, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, c, n, out, acc);
    else if (bf16)
        dense_decode_kernel<false, true><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, c, n, out, acc);
    else if (vec)
        dense_decode_kernel<true, false><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, c, n, out, acc);
    else
        dense_decode_kernel<false, false><<<grid, GIFT__GPU_THREADS, 0, s>>>(err, c, n, out, acc);
    return cudaGetLastError();
}

static __global__ void axpb_kernel(const float *a, const float *b, size_t n, float *out, int sub)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = sub ? __fsub_rn(a[i], b[i]) : __fadd_rn(a[i], b[i]);
}

extern "C" cudaError_t gift__gpu_axpb(cudaStream_t s, const float *a, const float *b, size_t n,
                                      float *out, int sub)
{
    if (n == 0)
        return cudaSuccess;
    axpb_kernel<<<gift__gpu_blocks(n < ((size_t)1 << 24) ? n : ((size_t)1 << 24)),
                  GIFT__GPU_THREADS, 0, s>>>(a, b, n, out, sub);
    return cudaGetLastError();
}
