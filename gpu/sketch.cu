/*
 * sketch.cu: the input sketch on the device, twin of gift_sketch:
 * Y = X^T (X Q) / n through two cuBLAS SGEMMs and tr(X^T X) / n in double.
 *
 * Row-major X (n x din) is column-major X^T, so:
 *   W^T (ks x n)  = Q^T (ks x din) . X^T (din x n)            op N N
 *   Y^T (ks x din) = W^T (ks x n) . X (n x din) / n           op N T
 * The trace is summed first, and the call waits for it: NaN/Inf in X returns
 * GIFT_ENONFINITE with Y untouched, as on the CPU.
 */
#include "gpu_common.cuh"

static __global__ void sumsq_kernel(int *err, const float *x, size_t n, double *trace)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    double s = 0.0;
    int bad = 0;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        bad |= (__float_as_uint(v) & 0x7FFFFFFFu) >= 0x7F800000u;
        s += (double)v * (double)v;
    }
    for (int o = 16; o > 0; o /= 2)
        s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (__any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0)
        gift__gpu_flag(err, GIFT_ENONFINITE);
    if (threadIdx.x % 32 == 0)
        atomicAdd(trace, s);
}

extern "C" cudaError_t gift__gpu_sumsq(cudaStream_t s, int *err, const float *x, size_t n,
                                       double *trace)
{
    if (n == 0)
        return cudaSuccess;
    sumsq_kernel<<<gift__gpu_blocks(n < ((size_t)1 << 18) ? n : ((size_t)1 << 18)),
                   GIFT__GPU_THREADS, 0, s>>>(err, x, n, trace);
    return cudaGetLastError();
}

extern "C" int gift_gpu_sketch(gift_gpu_ctx_t *c, const float *X_dev, int n, int din,
                               const float *Q_dev, int ks, float *Y_dev, double *trace,
                               float *work_dev)
{
    const float one = 1.0f, zero = 0.0f, inv_n = 1.0f / (float)n;
    double t;
    int rc;

    if (c == NULL || X_dev == NULL || Q_dev == NULL || Y_dev == NULL || trace == NULL ||
        work_dev == NULL)
        return GIFT_EINVAL;
    if (n < 1 || din < 1 || ks < 1 || ks > din)
        return GIFT_EINVAL;
    if ((rc = gift__gpu_cuda(c, cudaMemsetAsync(c->trace_dev, 0, sizeof(double), c->stream),
                             "sketch memset")) < 0 ||
        (rc = gift__gpu_cuda(
             c, gift__gpu_sumsq(c->stream, c->err_dev, X_dev, (size_t)n * din, c->trace_dev),
             "sketch trace")) < 0 ||
        (rc = gift__gpu_cuda(
             c, cudaMemcpyAsync(&t, c->trace_dev, sizeof t, cudaMemcpyDeviceToHost, c->stream),
             "sketch trace copy")) < 0)
        return rc;
    if ((rc = gift_gpu_sync(c)) < 0)
        return rc;
    if ((rc = gift__gpu_blas(c,
                             cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, ks, n, din, &one, Q_dev,
                                         ks, X_dev, din, &zero, work_dev, ks),
                             "sketch GEMM 1")) < 0 ||
        (rc = gift__gpu_blas(c,
                             cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, ks, din, n, &inv_n,
                                         work_dev, ks, X_dev, din, &zero, Y_dev, ks),
                             "sketch GEMM 2")) < 0)
        return rc;
    if ((rc = gift_gpu_sync(c)) < 0)
        return rc;
    *trace = t / (double)n;
    return 0;
}
