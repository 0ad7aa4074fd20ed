/*
 * codec.c: the public encode / decode entry points of the CUDA twins. Plain
 * C: lays the payload out exactly as gift_encode does (gift_layout), zeroes
 * its padding, and picks the kernel launcher of fp8.cu, nvfp4.cu or dense.cu
 * for the format. The arithmetic lives in those files.
 */
#include <string.h>

#include "gpu_internal.h"

static const gift__minifmt_t *fp8_fmt(gift_format_t f)
{
    return f == GIFT_FMT_E4M3 ? &gift__fmt_e4m3 : &gift__fmt_e5m2;
}

/* The SR parameters of p, or NULL for round to nearest. */
static const gift__gpu_sr_t *sr_of(const gift_codec_params_t *p, gift__gpu_sr_t *sr)
{
    if (!p->stochastic)
        return NULL;
    sr->k = p->sr;
    gift__sr_philox_key(&p->sr, sr->key);
    return sr;
}

int gift_gpu_encode(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const float *x_dev, size_t n,
                    void *payload_dev, size_t cap)
{
    uint8_t *out = payload_dev;
    gift__gpu_sr_t srb;
    const gift__gpu_sr_t *sr;
    gift_layout_t l;
    cudaError_t e;
    int rc;

    if (c == NULL || p == NULL || (x_dev == NULL && n > 0) || payload_dev == NULL)
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, &l)) < 0)
        return rc;
    if (cap < l.total)
        return GIFT_ENOSPC;
    sr = sr_of(p, &srb);
    /* Padding after each section is zero, so equal inputs give equal bytes. */
    if (l.code_off > l.scale_bytes &&
        (rc = gift__gpu_cuda(
             c, cudaMemsetAsync(out + l.scale_bytes, 0, l.code_off - l.scale_bytes, c->stream),
             "encode padding")) < 0)
        return rc;
    if (l.total > l.code_off + l.code_bytes &&
        (rc = gift__gpu_cuda(c,
                             cudaMemsetAsync(out + l.code_off + l.code_bytes, 0,
                                             l.total - l.code_off - l.code_bytes, c->stream),
                             "encode padding")) < 0)
        return rc;
    switch (p->fmt) {
    case GIFT_FMT_F32:
        e = gift__gpu_f32_encode(c->stream, c->err_dev, x_dev, n, out + l.code_off);
        break;
    case GIFT_FMT_BF16:
        e = gift__gpu_bf16_encode(c->stream, c->err_dev, x_dev, n, out + l.code_off, sr);
        break;
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        e = gift__gpu_fp8_encode(c->stream, c->err_dev, fp8_fmt(p->fmt), x_dev, n, l.block, out,
                                 out + l.code_off, sr);
        break;
    case GIFT_FMT_NVFP4:
        if ((e = cudaMemsetAsync(c->word_dev, 0, sizeof(uint32_t), c->stream)) == cudaSuccess &&
            (e = gift__gpu_amax(c->stream, x_dev, n, c->word_dev)) == cudaSuccess)
            e = gift__gpu_nvfp4_encode(c->stream, c->err_dev, x_dev, n, c->word_dev, out,
                                       l.code_off, sr);
        break;
    default:
        return GIFT_EFORMAT;
    }
    return gift__gpu_cuda(c, e, "encode launch");
}

static int decode_any(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_dev,
                      size_t len, size_t n, float *out_dev, int acc)
{
    const uint8_t *in = payload_dev;
    gift_layout_t l;
    cudaError_t e;
    int rc;

    if (c == NULL || p == NULL || payload_dev == NULL || (out_dev == NULL && n > 0))
        return GIFT_EINVAL;
    if ((rc = gift_layout(p, n, &l)) < 0)
        return rc;
    if (len < l.code_off + l.code_bytes)
        return GIFT_ENOSPC;
    /* Check the whole payload, then decode; the decode kernels do nothing
     * when the check (or anything earlier on c) recorded an error. */
    switch (p->fmt) {
    case GIFT_FMT_F32:
    case GIFT_FMT_BF16: {
        int bf16 = p->fmt == GIFT_FMT_BF16;
        if ((e = gift__gpu_dense_check(c->stream, c->err_dev, bf16, in + l.code_off, n)) ==
            cudaSuccess)
            e = gift__gpu_dense_decode(c->stream, c->err_dev, bf16, in + l.code_off, n, out_dev,
                                       acc);
        break;
    }
    case GIFT_FMT_E4M3:
    case GIFT_FMT_E5M2:
        if ((e = gift__gpu_fp8_check(c->stream, c->err_dev, fp8_fmt(p->fmt), in, l.nblocks,
                                     in + l.code_off, n)) == cudaSuccess)
            e = gift__gpu_fp8_decode(c->stream, c->err_dev, fp8_fmt(p->fmt), in, in + l.code_off, n,
                                     l.block, out_dev, acc);
        break;
    case GIFT_FMT_NVFP4:
        if ((e = gift__gpu_nvfp4_check(c->stream, c->err_dev, in, l.nblocks)) == cudaSuccess)
            e = gift__gpu_nvfp4_decode(c->stream, c->err_dev, in, l.code_off, n, out_dev, acc);
        break;
    default:
        return GIFT_EFORMAT;
    }
    return gift__gpu_cuda(c, e, "decode launch");
}

int gift_gpu_decode(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_dev,
                    size_t len, size_t n, float *out_dev)
{
    return decode_any(c, p, payload_dev, len, n, out_dev, 0);
}

int gift_gpu_decode_acc(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_dev,
                        size_t len, size_t n, float *acc_dev)
{
    return decode_any(c, p, payload_dev, len, n, acc_dev, 1);
}

int gift_gpu_ef_add(gift_gpu_ctx_t *c, const float *e_dev, size_t n, float *p_dev)
{
    if (c == NULL || ((e_dev == NULL || p_dev == NULL) && n > 0))
        return GIFT_EINVAL;
    return gift__gpu_cuda(c, gift__gpu_axpb(c->stream, p_dev, e_dev, n, p_dev, 0), "ef_add");
}

int gift_gpu_ef_update(gift_gpu_ctx_t *c, const float *p_dev, const float *decoded_dev, size_t n,
                       float *e_dev)
{
    if (c == NULL || ((p_dev == NULL || decoded_dev == NULL || e_dev == NULL) && n > 0))
        return GIFT_EINVAL;
    return gift__gpu_cuda(c, gift__gpu_axpb(c->stream, p_dev, decoded_dev, n, e_dev, 1),
                          "ef_update");
}
