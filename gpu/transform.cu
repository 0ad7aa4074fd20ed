/*
 * transform.cu: the GIFT transform on the device, twin of gift_transform:
 * out = c G + ((G U_k) diag(d)) U_k^T as two thin cuBLAS SGEMMs, and the
 * device geometry it reads (uploaded from a host gift_geometry_t).
 *
 * Row-major X is column-major X^T, so with U row-major din x ks (ld ks):
 *   W^T (k x rows)    = U_k^T (k x din) . G^T (din x rows)     GEMM 1, op N N
 *   out^T (din x rows) = U_k (din x k) . W^T + c out^T        GEMM 2, op T N
 * GEMM 2 adds c G through its beta, so c G costs no extra pass: in place
 * (out == G) with cublasSgemm, out of place with cublasLtMatmul, which reads
 * C = G and writes D = out (where cuBLASLt declines, G is copied to out and
 * cublasSgemm runs in place). Plain FP32 (CUBLAS_COMPUTE_32F, no TF32): equal
 * to the CPU up to the GEMMs' summation order, not bit for bit.
 */
#include "gpu_common.cuh"

static __global__ void scale_cols_kernel(float *work, int rows, int k, const float *d)
{
    const size_t n = (size_t)rows * k, stride = (size_t)gridDim.x * blockDim.x;

    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        work[i] = __fmul_rn(work[i], d[i % (size_t)k]);
}

extern "C" cudaError_t gift__gpu_scale_cols(cudaStream_t s, float *work, int rows, int k,
                                            const float *d)
{
    size_t n = (size_t)rows * k;

    if (n == 0)
        return cudaSuccess;
    scale_cols_kernel<<<gift__gpu_blocks(n < ((size_t)1 << 22) ? n : ((size_t)1 << 22)),
                        GIFT__GPU_THREADS, 0, s>>>(work, rows, k, d);
    return cudaGetLastError();
}

extern "C" int gift_gpu_geometry_init(gift_gpu_geometry_t *g, int din, int k, int ks)
{
    if (g == NULL)
        return GIFT_EINVAL;
    memset(g, 0, sizeof *g);
    if (din < 1 || k < 1 || k > ks || ks > din)
        return GIFT_EINVAL;
    if (cudaMalloc((void **)&g->U_dev, (size_t)din * ks * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&g->d_dev, (size_t)k * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&g->d_inv_dev, (size_t)k * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError();
        gift_gpu_geometry_free(g);
        return GIFT_ENOMEM;
    }
    g->din = din, g->k = k, g->ks = ks, g->k_cap = k;
    g->identity = 1;
    g->c = g->c_inv = 1.0f;
    return 0;
}

extern "C" void gift_gpu_geometry_free(gift_gpu_geometry_t *g)
{
    if (g == NULL)
        return;
    cudaFree(g->U_dev);
    cudaFree(g->d_dev);
    cudaFree(g->d_inv_dev);
    memset(g, 0, sizeof *g);
}

extern "C" int gift_gpu_geometry_upload(gift_gpu_ctx_t *c, gift_gpu_geometry_t *g,
                                        const gift_geometry_t *h)
{
    int rc;

    if (c == NULL || g == NULL || h == NULL || g->U_dev == NULL || h->U == NULL)
        return GIFT_EINVAL;
    /* An epoch may lower the rank (the owner's policy): d and d_inv were
     * sized for k_cap, U keeps its ks columns. */
    if (h->din != g->din || h->k < 1 || h->k > g->k_cap || h->ks != g->ks)
        return GIFT_EINVAL;
    if ((rc = gift__gpu_cuda(c,
                             cudaMemcpyAsync(g->U_dev, h->U, (size_t)h->din * h->ks * 4,
                                             cudaMemcpyHostToDevice, c->stream),
                             "upload U")) < 0)
        return rc;
    if (!h->identity) {
        if ((rc = gift__gpu_cuda(c,
                                 cudaMemcpyAsync(g->d_dev, h->d, (size_t)h->k * 4,
                                                 cudaMemcpyHostToDevice, c->stream),
                                 "upload d")) < 0 ||
            (rc = gift__gpu_cuda(c,
                                 cudaMemcpyAsync(g->d_inv_dev, h->d_inv, (size_t)h->k * 4,
                                                 cudaMemcpyHostToDevice, c->stream),
                                 "upload d_inv")) < 0)
            return rc;
    }
    g->identity = h->identity;
    g->k = h->k;
    g->epoch = h->epoch;
    g->c = h->c;
    g->c_inv = h->c_inv;
    return 0;
}

/* D = out = U_k W^T + sc G (column-major din x rows) in one cuBLASLt call. */
static cublasStatus_t gemm2_lt(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, int rows,
                               const float *G, float *out, const float *work, float sc)
{
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const float one = 1.0f;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, cd = NULL;
    cublasStatus_t st;

    if ((st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ==
            CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ==
            CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ==
            CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, (uint64_t)g->k, (uint64_t)g->din,
                                         (int64_t)g->ks)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, (uint64_t)g->k, (uint64_t)rows,
                                         (int64_t)g->k)) == CUBLAS_STATUS_SUCCESS &&
        (st = cublasLtMatrixLayoutCreate(&cd, CUDA_R_32F, (uint64_t)g->din, (uint64_t)rows,
                                         (int64_t)g->din)) == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(c->lt, op, &one, g->U_dev, a, work, b, &sc, G, cd, out, cd, NULL,
                            c->lt_ws, GIFT__GPU_LT_WS, c->stream);
    if (cd != NULL)
        cublasLtMatrixLayoutDestroy(cd);
    if (b != NULL)
        cublasLtMatrixLayoutDestroy(b);
    if (a != NULL)
        cublasLtMatrixLayoutDestroy(a);
    if (op != NULL)
        cublasLtMatmulDescDestroy(op);
    return st;
}

extern "C" int gift_gpu_transform(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, int inverse,
                                  const float *G_dev, int rows, float *out_dev, float *work_dev)
{
    const float one = 1.0f, zero = 0.0f;
    size_t n;
    float sc;
    int rc;

    if (c == NULL || g == NULL || g->U_dev == NULL || G_dev == NULL || out_dev == NULL || rows < 0)
        return GIFT_EINVAL;
    if (inverse != 0 && inverse != 1)
        return GIFT_EINVAL;
    n = (size_t)rows * g->din;
    if (g->identity || rows == 0) {
        if (out_dev != G_dev && n > 0)
            return gift__gpu_cuda(
                c, cudaMemcpyAsync(out_dev, G_dev, n * 4, cudaMemcpyDeviceToDevice, c->stream),
                "transform copy");
        return 0;
    }
    if (work_dev == NULL)
        return GIFT_EINVAL;
    sc = inverse ? g->c_inv : g->c;
    /* GEMM 1 reads G before GEMM 2 writes out (stream order), so out == G
     * needs no care. */
    if ((rc =
             gift__gpu_blas(c,
                            cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, g->k, rows, g->din, &one,
                                        g->U_dev, g->ks, G_dev, g->din, &zero, work_dev, g->k),
                            "transform GEMM 1")) < 0)
        return rc;
    if ((rc = gift__gpu_cuda(c,
                             gift__gpu_scale_cols(c->stream, work_dev, rows, g->k,
                                                  inverse ? g->d_inv_dev : g->d_dev),
                             "transform diag(d)")) < 0)
        return rc;
    if (out_dev != G_dev) {
        if (gemm2_lt(c, g, rows, G_dev, out_dev, work_dev, sc) == CUBLAS_STATUS_SUCCESS)
            return 0;
        if ((rc = gift__gpu_cuda(
                 c, cudaMemcpyAsync(out_dev, G_dev, n * 4, cudaMemcpyDeviceToDevice, c->stream),
                 "transform copy")) < 0)
            return rc;
    }
    return gift__gpu_blas(c,
                          cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, g->din, rows, g->k, &one,
                                      g->U_dev, g->ks, work_dev, g->k, &sc, out_dev, g->din),
                          "transform GEMM 2");
}
