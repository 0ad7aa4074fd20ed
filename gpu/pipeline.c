/*
 * pipeline.c: the worker's push and pull on device memory, the sequence
 * libgiftclient's engine runs on the CPU (transform, error feedback, encode
 * chunk by chunk, residual), built from the twins. Only payload bytes cross
 * PCIe: each chunk's payload is copied to pinned host memory on the
 * context's copy stream, behind an event, so the copy of one chunk overlaps
 * the encode of the next, and a host callback reports it.
 */
#include <stdlib.h>

#include "gpu_internal.h"

void *gift_gpu_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

void gift_gpu_host_free(void *p)
{
    if (p != NULL)
        cudaFreeHost(p);
}

int gift_gpu_push_prepare(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, const float *G_dev,
                          int rows, int din, const float *e_dev, float *p_dev, float *work_dev)
{
    size_t n;
    int rc;

    if (c == NULL || G_dev == NULL || p_dev == NULL || rows < 0 || din < 1 || G_dev == p_dev)
        return GIFT_EINVAL;
    if (g != NULL && g->din != din)
        return GIFT_EINVAL;
    n = (size_t)rows * din;
    if (g != NULL && !g->identity)
        rc = gift_gpu_transform(c, g, 0, G_dev, rows, p_dev, work_dev);
    else
        rc = n == 0 ? 0
                    : gift__gpu_cuda(c,
                                     cudaMemcpyAsync(p_dev, G_dev, n * sizeof(float),
                                                     cudaMemcpyDeviceToDevice, c->stream),
                                     "push copy");
    if (rc < 0 || e_dev == NULL)
        return rc;
    return gift_gpu_ef_add(c, e_dev, n, p_dev);
}

/* What the host callback needs; freed by it. */
typedef struct ready_ctx {
    gift_gpu_ready_cb cb;
    void *arg;
    int *status;
} ready_ctx_t;

static void CUDART_CB ready_host_fn(void *arg)
{
    ready_ctx_t r = *(ready_ctx_t *)arg;
    free(arg);
    r.cb(r.arg, *r.status);
}

int gift_gpu_push_chunk(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const float *p_dev,
                        size_t n, float *e_dev, void *payload_dev, void *payload_host, size_t cap,
                        int *status_host, gift_gpu_ready_cb cb, void *arg)
{
    gift_layout_t l;
    ready_ctx_t *r;
    int rc;

    if (c == NULL || p == NULL || payload_host == NULL || status_host == NULL || cb == NULL)
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, &l)) < 0)
        return rc;
    if ((rc = gift_gpu_encode(c, p, p_dev, n, payload_dev, cap)) < 0)
        return rc;
    if (e_dev != NULL &&
        ((rc = gift_gpu_decode(c, p, payload_dev, l.total, n, e_dev)) < 0 ||
         (rc = gift__gpu_cuda(c, gift__gpu_axpb(c->stream, p_dev, e_dev, n, e_dev, 1),
                              "ef residual")) < 0))
        return rc;
    if ((r = malloc(sizeof *r)) == NULL)
        return GIFT_ENOMEM;
    r->cb = cb, r->arg = arg, r->status = status_host;
    if ((rc = gift__gpu_cuda(c, cudaEventRecord(c->encoded, c->stream), "cudaEventRecord")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaStreamWaitEvent(c->copy_stream, c->encoded, 0),
                             "cudaStreamWaitEvent")) < 0 ||
        (rc = gift__gpu_cuda(c,
                             cudaMemcpyAsync(payload_host, payload_dev, l.total,
                                             cudaMemcpyDeviceToHost, c->copy_stream),
                             "payload copy")) < 0 ||
        (rc = gift__gpu_cuda(c,
                             cudaMemcpyAsync(status_host, c->err_dev, sizeof(int),
                                             cudaMemcpyDeviceToHost, c->copy_stream),
                             "status copy")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaLaunchHostFunc(c->copy_stream, ready_host_fn, r),
                             "cudaLaunchHostFunc")) < 0) {
        free(r);
        return rc;
    }
    return 0;
}

int gift_gpu_notify(gift_gpu_ctx_t *c, int *status_host, gift_gpu_ready_cb cb, void *arg)
{
    ready_ctx_t *r;
    int rc;

    if (c == NULL || status_host == NULL || cb == NULL)
        return GIFT_EINVAL;
    if ((r = malloc(sizeof *r)) == NULL)
        return GIFT_ENOMEM;
    r->cb = cb, r->arg = arg, r->status = status_host;
    if ((rc = gift__gpu_cuda(c,
                             cudaMemcpyAsync(status_host, c->err_dev, sizeof(int),
                                             cudaMemcpyDeviceToHost, c->stream),
                             "status copy")) < 0 ||
        (rc = gift__gpu_cuda(c, cudaLaunchHostFunc(c->stream, ready_host_fn, r),
                             "cudaLaunchHostFunc")) < 0) {
        free(r);
        return rc;
    }
    return 0;
}

int gift_gpu_pull_chunk(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_host,
                        size_t len, size_t n, void *payload_dev, float *out_dev)
{
    int rc;

    if (c == NULL || payload_host == NULL || payload_dev == NULL)
        return GIFT_EINVAL;
    if ((rc = gift__gpu_cuda(
             c, cudaMemcpyAsync(payload_dev, payload_host, len, cudaMemcpyHostToDevice, c->stream),
             "payload copy")) < 0)
        return rc;
    return gift_gpu_decode(c, p, payload_dev, len, n, out_dev);
}

int gift_gpu_pull_finish(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, int rows, float *out_dev,
                         float *work_dev)
{
    if (c == NULL || out_dev == NULL || rows < 0)
        return GIFT_EINVAL;
    if (g == NULL || g->identity)
        return 0;
    return gift_gpu_transform(c, g, 1, out_dev, rows, out_dev, work_dev);
}
