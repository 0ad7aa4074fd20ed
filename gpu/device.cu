/*
 * device.cu: device discovery and the context (stream, cuBLAS handle, error
 * word) every GPU entry point runs on.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_error.h"
#include "gift_gpu.h"
#include "gpu_internal.h"

extern "C" int gift_gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

extern "C" int gift_gpu_device_name(int dev, char *buf, int cap)
{
    cudaDeviceProp prop;
    if (buf == NULL || cap <= 0 || dev < 0 || dev >= gift_gpu_device_count())
        return GIFT_EINVAL;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return GIFT_EINVAL;
    strncpy(buf, prop.name, (size_t)cap - 1);
    buf[cap - 1] = '\0';
    return 0;
}

extern "C" int gift__gpu_cuda(gift_gpu_ctx_t *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    if (c != NULL)
        snprintf(c->msg, sizeof c->msg, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? GIFT_ENOMEM : GIFT_EIO;
}

extern "C" int gift__gpu_blas(gift_gpu_ctx_t *c, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    if (c != NULL)
        snprintf(c->msg, sizeof c->msg, "%s: cuBLAS status %d", what, (int)s);
    return s == CUBLAS_STATUS_ALLOC_FAILED ? GIFT_ENOMEM : GIFT_EIO;
}

extern "C" const char *gift_gpu_last_error(const gift_gpu_ctx_t *c)
{
    return c != NULL ? c->msg : "";
}

extern "C" void *gift_gpu_ctx_stream(gift_gpu_ctx_t *c)
{
    return c != NULL ? (void *)c->stream : NULL;
}

extern "C" int gift_gpu_ctx_create(int dev, void *stream, gift_gpu_ctx_t **out)
{
    gift_gpu_ctx_t *c;
    int rc;

    if (out == NULL)
        return GIFT_EINVAL;
    *out = NULL;
    if (dev < 0 || dev >= gift_gpu_device_count())
        return GIFT_EINVAL;
    if ((c = (gift_gpu_ctx_t *)calloc(1, sizeof *c)) == NULL)
        return GIFT_ENOMEM;
    c->dev = dev;
    if ((rc = gift__gpu_cuda(c, cudaSetDevice(dev), "cudaSetDevice")) < 0)
        goto fail;
    if (stream != NULL) {
        c->stream = (cudaStream_t)stream;
    } else {
        if ((rc = gift__gpu_cuda(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                                 "cudaStreamCreate")) < 0)
            goto fail;
        c->own_stream = 1;
    }
    if ((rc = gift__gpu_cuda(c, cudaMalloc((void **)&c->err_dev, 64), "cudaMalloc")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaMallocHost((void **)&c->err_host, sizeof(int)),
                             "cudaMallocHost")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaMemsetAsync(c->err_dev, 0, 64, c->stream), "cudaMemset")) < 0)
        goto fail;
    c->word_dev = (uint32_t *)(c->err_dev + 4);
    c->trace_dev = (double *)(c->err_dev + 8);
    if ((rc = gift__gpu_cuda(c, cudaMalloc(&c->lt_ws, GIFT__GPU_LT_WS), "cudaMalloc")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking),
                             "cudaStreamCreate")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaEventCreateWithFlags(&c->encoded, cudaEventDisableTiming),
                             "cudaEventCreate")) < 0)
        goto fail;
    if ((rc = gift__gpu_blas(c, cublasLtCreate(&c->lt), "cublasLtCreate")) < 0 ||
        (rc = gift__gpu_blas(c, cublasCreate(&c->blas), "cublasCreate")) < 0 ||
        (rc = gift__gpu_blas(c, cublasSetStream(c->blas, c->stream), "cublasSetStream")) < 0 ||
        (rc = gift__gpu_blas(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH),
                             "cublasSetMathMode")) < 0)
        goto fail;
    if ((rc = gift__gpu_cuda(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize")) < 0)
        goto fail;
    *out = c;
    return 0;
fail:
    gift_gpu_ctx_free(c);
    return rc;
}

extern "C" void gift_gpu_ctx_free(gift_gpu_ctx_t *c)
{
    if (c == NULL)
        return;
    if (c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream);
    if (c->copy_stream != NULL) {
        (void)cudaStreamSynchronize(c->copy_stream);
        cudaStreamDestroy(c->copy_stream);
    }
    if (c->encoded != NULL)
        cudaEventDestroy(c->encoded);
    if (c->blas != NULL)
        cublasDestroy(c->blas);
    if (c->lt != NULL)
        cublasLtDestroy(c->lt);
    cudaFree(c->lt_ws);
    cudaFree(c->err_dev);
    cudaFreeHost(c->err_host);
    if (c->own_stream)
        cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

extern "C" int gift_gpu_sync(gift_gpu_ctx_t *c)
{
    int rc;

    if (c == NULL)
        return GIFT_EINVAL;
    if ((rc = gift__gpu_cuda(c,
                             cudaMemcpyAsync(c->err_host, c->err_dev, sizeof(int),
                                             cudaMemcpyDeviceToHost, c->stream),
                             "error word copy")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaStreamSynchronize(c->copy_stream), "cudaStreamSynchronize")) <
            0)
        return rc;
    if (*c->err_host == 0)
        return 0;
    rc = *c->err_host;
    if (gift__gpu_cuda(c, cudaMemsetAsync(c->err_dev, 0, sizeof(int), c->stream),
                       "error word reset") < 0)
        return GIFT_EIO;
    return rc;
}
