/*
 * gpu_internal.h: what the files of gpu/ share. The context, the CUDA error
 * helper, and the launchers of the kernels, one .cu per operation, each
 * with a plain-C launcher declared here. Launchers only enqueue on the given
 * stream and return the launch's cudaError_t; the data errors go to the
 * device error word err (first one wins, see gift__gpu_flag).
 */
#ifndef GIFT_GPU_INTERNAL_H
#define GIFT_GPU_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gift_codec.h"
#include "gift_gpu.h"
#include "gift_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GIFT__GPU_LT_WS ((size_t)8 << 20)

struct gift_gpu_ctx {
    int dev;
    cudaStream_t stream;
    int own_stream;
    cudaStream_t copy_stream; /* payload copies to the host (gift_gpu_push_chunk) */
    cudaEvent_t encoded;      /* recorded on stream, waited on by copy_stream */
    cublasHandle_t blas;
    cublasLtHandle_t lt; /* the transform's out-of-place GEMM (C != D) */
    void *lt_ws;         /* its workspace, GIFT__GPU_LT_WS bytes */
    int *err_dev;        /* the device error word: 0 or a negative gift code */
    int *err_host;       /* pinned copy, read by gift_gpu_sync */
    uint32_t *word_dev;  /* scratch: the nvfp4 tensor amax */
    double *trace_dev;   /* scratch: the sketch's trace */
    char msg[192];       /* last CUDA/cuBLAS failure, for gift_gpu_last_error */
};

/* Records a failed CUDA call (what names it) and returns its gift code:
 * GIFT_ENOMEM for cudaErrorMemoryAllocation, else GIFT_EIO; 0 on success. */
int gift__gpu_cuda(gift_gpu_ctx_t *c, cudaError_t e, const char *what);
int gift__gpu_blas(gift_gpu_ctx_t *c, cublasStatus_t s, const char *what);

/* Random-bit parameters of a stochastic encode, NULL for round to nearest:
 * the SR key and its Philox key, computed once on the host. */
typedef struct gift__gpu_sr {
    gift_sr_key_t k;
    uint32_t key[2];
} gift__gpu_sr_t;

/* fp8.cu: every block of an fp8 encode (scales at scales, 4-byte floats that
 * may be unaligned, codes at codes); NaN/Inf records GIFT_ENONFINITE. */
cudaError_t gift__gpu_fp8_encode(cudaStream_t s, int *err, const gift__minifmt_t *f, const float *x,
                                 size_t n, size_t block, void *scales, uint8_t *codes,
                                 const gift__gpu_sr_t *sr);
/* Checks nblocks scales and n codes; a bad one records GIFT_EBADCODE. */
cudaError_t gift__gpu_fp8_check(cudaStream_t s, int *err, const gift__minifmt_t *f,
                                const void *scales, size_t nblocks, const uint8_t *codes, size_t n);
/* out = value * scale, or out += value * scale (acc); writes nothing when
 * *err is set. */
cudaError_t gift__gpu_fp8_decode(cudaStream_t s, const int *err, const gift__minifmt_t *f,
                                 const void *scales, const uint8_t *codes, size_t n, size_t block,
                                 float *out, int acc);

/* nvfp4.cu. amax: *word = max |x| bits (word zeroed by the caller). encode:
 * the whole nvfp4 payload (tensor scale, block scales at payload + 4, codes
 * at payload + code_off) from the tensor amax in *word. */
cudaError_t gift__gpu_amax(cudaStream_t s, const float *x, size_t n, uint32_t *word);
cudaError_t gift__gpu_nvfp4_encode(cudaStream_t s, int *err, const float *x, size_t n,
                                   const uint32_t *word, uint8_t *payload, size_t code_off,
                                   const gift__gpu_sr_t *sr);
cudaError_t gift__gpu_nvfp4_check(cudaStream_t s, int *err, const uint8_t *payload, size_t nblocks);
cudaError_t gift__gpu_nvfp4_decode(cudaStream_t s, const int *err, const uint8_t *payload,
                                   size_t code_off, size_t n, float *out, int acc);

/* dense.cu: f32 and bf16 (codes may be unaligned), and error feedback. */
cudaError_t gift__gpu_f32_encode(cudaStream_t s, int *err, const float *x, size_t n, void *codes);
cudaError_t gift__gpu_bf16_encode(cudaStream_t s, int *err, const float *x, size_t n, void *codes,
                                  const gift__gpu_sr_t *sr);
cudaError_t gift__gpu_dense_check(cudaStream_t s, int *err, int bf16, const void *codes, size_t n);
cudaError_t gift__gpu_dense_decode(cudaStream_t s, const int *err, int bf16, const void *codes,
                                   size_t n, float *out, int acc);
/* out[i] = a[i] + b[i] (sub 0) or a[i] - b[i] (sub 1), one fp32 op each. */
cudaError_t gift__gpu_axpb(cudaStream_t s, const float *a, const float *b, size_t n, float *out,
                           int sub);

/* transform.cu: work[i * k + j] *= d[j] for rows x k. */
cudaError_t gift__gpu_scale_cols(cudaStream_t s, float *work, int rows, int k, const float *d);
/* sketch.cu: *trace += sum x^2 over n (double; trace zeroed by the caller);
 * NaN/Inf records GIFT_ENONFINITE in err. */
cudaError_t gift__gpu_sumsq(cudaStream_t s, int *err, const float *x, size_t n, double *trace);

#ifdef __cplusplus
}
#endif
#endif
