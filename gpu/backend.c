/*
 * backend.c: gift__backend_cuda, the device-memory sibling of
 * gift__backend_cpu() (codec/gift_kernels.h): the same table over the
 * gift_gpu_* entry points, ctx a gift_gpu_ctx_t *.
 */
#include "gpu_internal.h"

static int cuda_encode(void *ctx, const gift_codec_params_t *p, const float *x, size_t n,
                       void *payload, size_t cap)
{
    return gift_gpu_encode(ctx, p, x, n, payload, cap);
}

static int cuda_decode(void *ctx, const gift_codec_params_t *p, const void *payload, size_t len,
                       size_t n, float *out)
{
    return gift_gpu_decode(ctx, p, payload, len, n, out);
}

static int cuda_decode_acc(void *ctx, const gift_codec_params_t *p, const void *payload, size_t len,
                           size_t n, float *acc)
{
    return gift_gpu_decode_acc(ctx, p, payload, len, n, acc);
}

static int cuda_transform(void *ctx, const void *geom, int inverse, const float *G, int rows,
                          float *out, float *work)
{
    return gift_gpu_transform(ctx, geom, inverse, G, rows, out, work);
}

static int cuda_ef_add(void *ctx, const float *e, size_t n, float *p)
{
    return gift_gpu_ef_add(ctx, e, n, p);
}

static int cuda_ef_update(void *ctx, const float *p, const float *decoded, size_t n, float *e)
{
    return gift_gpu_ef_update(ctx, p, decoded, n, e);
}

static int cuda_sync(void *ctx)
{
    return gift_gpu_sync(ctx);
}

const gift__backend_t gift__backend_cuda = {
    .name = "cuda",
    .encode = cuda_encode,
    .decode = cuda_decode,
    .decode_acc = cuda_decode_acc,
    .transform = cuda_transform,
    .ef_add = cuda_ef_add,
    .ef_update = cuda_ef_update,
    .sync = cuda_sync,
};
