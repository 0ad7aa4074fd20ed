/*
 * gift_gpu.h: plain-C entry points of the CUDA twins (gpu/). Each mirrors a
 * codec/ function on device memory: the same arguments, the same payload
 * bytes, the same error codes (gift_codec.h holds the exact arithmetic).
 *
 *   gift_encode / gift_decode / gift_decode_acc   gift_gpu_encode / _decode / _decode_acc
 *   gift_transform                                gift_gpu_transform (cuBLAS)
 *   gift_sketch                                   gift_gpu_sketch (cuBLAS)
 *   gift_ef_add / gift_ef_update                  gift_gpu_ef_add / _ef_update
 *
 * Encode and decode are bit-identical to the CPU (the shared element
 * arithmetic of codec/gift_kernels.h runs on the device; the hardware FP8
 * conversion, where used, is the same RNE + satfinite). The transform and the
 * sketch are GEMMs: equal to the CPU up to summation order, not bit for bit.
 *
 * Streams and errors. Every call takes a context, which owns one CUDA stream
 * (its own or the caller's), a cuBLAS handle and a device error word. Calls
 * only enqueue work on that stream and return at once; argument errors
 * (GIFT_EINVAL, GIFT_EFORMAT, GIFT_ENOSPC) and CUDA or cuBLAS failures
 * (GIFT_EIO, or GIFT_ENOMEM for an allocation; gift_gpu_last_error names the
 * CUDA error) are returned by the call itself. Errors that depend on the
 * data (GIFT_ENONFINITE from an encode, GIFT_EBADCODE from a decode) are
 * recorded in the context's error word and returned by gift_gpu_sync, which
 * waits for the stream and clears the word. Once the word is set, later
 * decode kernels on the context write nothing until the sync, so nothing
 * decoded after a failure reaches an accumulator. A decode validates its
 * whole payload before writing, like the CPU: a bad payload leaves out/acc
 * untouched. A context is used by one thread at a time.
 *
 * All pointers named *_dev are device pointers (or managed memory); payloads
 * have the layout of gift_layout. Pointers need no particular alignment.
 * Below the codec: the worker's device pipeline (gift_gpu_push_chunk and
 * friends, what libgiftclient would run for device memory) and the backend
 * table shared with the CPU codec (gift__backend_cuda).
 */
#ifndef GIFT_GPU_H
#define GIFT_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "gift_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices this process can use; 0 when there is no driver or
 * no device (never an error). */
int gift_gpu_device_count(void);

/* Writes the name of device dev into buf (cap bytes). Returns 0 or
 * GIFT_EINVAL when dev does not exist. */
int gift_gpu_device_name(int dev, char *buf, int cap);

typedef struct gift_gpu_ctx gift_gpu_ctx_t;

/* Creates a context on device dev. stream is a cudaStream_t to run on (the
 * caller keeps owning it), or NULL for a new non-blocking stream the context
 * owns. Makes dev current on the calling thread. Returns 0, GIFT_EINVAL (no
 * such device), GIFT_ENOMEM or GIFT_EIO. Free with gift_gpu_ctx_free. */
int gift_gpu_ctx_create(int dev, void *stream, gift_gpu_ctx_t **out);
/* Waits for the stream and frees everything the context owns. NULL is a no-op. */
void gift_gpu_ctx_free(gift_gpu_ctx_t *c);
/* The context's cudaStream_t, for callers that enqueue copies beside it. */
void *gift_gpu_ctx_stream(gift_gpu_ctx_t *c);

/* The last CUDA or cuBLAS failure seen on c, as text ("" when none). */
const char *gift_gpu_last_error(const gift_gpu_ctx_t *c);

/* Waits until every call enqueued on c has finished (payload copies too). Returns 0, the first
 * data error recorded since the last sync (GIFT_ENONFINITE, GIFT_EBADCODE),
 * or GIFT_EIO when CUDA failed; clears the recorded error. */
int gift_gpu_sync(gift_gpu_ctx_t *c);

/* ---------------------------------------------------------------- */
/* Codec                                                              */
/* ---------------------------------------------------------------- */

/* gift_encode on the device: n floats at x_dev into the payload at
 * payload_dev (cap bytes, at least gift_layout's total; padding written as
 * zero). Round to nearest or stochastic (p->stochastic, same Philox bits as
 * the CPU). NaN/Inf in x records GIFT_ENONFINITE (see gift_gpu_sync). */
int gift_gpu_encode(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const float *x_dev, size_t n,
                    void *payload_dev, size_t cap);
/* gift_decode on the device: checks every scale and code, then writes n
 * floats to out_dev; a bad payload records GIFT_EBADCODE and writes nothing.
 * len as for gift_decode. */
int gift_gpu_decode(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_dev,
                    size_t len, size_t n, float *out_dev);
/* acc_dev[i] += decode(payload)[i] (one fp32 multiply, then one add, as on
 * the CPU); validated first like gift_gpu_decode. */
int gift_gpu_decode_acc(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_dev,
                        size_t len, size_t n, float *acc_dev);

/* ---------------------------------------------------------------- */
/* Transform and sketch (cuBLAS, fp32, no TF32)                       */
/* ---------------------------------------------------------------- */

/* A geometry's transform on the device: U (din x ks, row-major), d and d_inv
 * (k each), and the scalars, copied from a host gift_geometry_t. */
typedef struct gift_gpu_geometry {
    int din, k, ks;
    int identity;
    uint32_t epoch;
    float c, c_inv;
    float *U_dev;
    float *d_dev;
    float *d_inv_dev;
    int k_cap; /* the rank d_dev and d_inv_dev were allocated for (k may be lower) */
} gift_gpu_geometry_t;

/* Allocates the device buffers for din, k, ks (once). Returns 0, GIFT_EINVAL,
 * GIFT_ENOMEM. Starts as an identity geometry. */
int gift_gpu_geometry_init(gift_gpu_geometry_t *g, int din, int k, int ks);
void gift_gpu_geometry_free(gift_gpu_geometry_t *g);
/* Copies host geometry h (same din and ks, 1 <= k <= the allocated k: an
 * epoch of lowered rank sets g's k to h's) into g on c's stream; h must stay
 * unchanged until the next gift_gpu_sync. Returns 0, GIFT_EINVAL, GIFT_EIO. */
int gift_gpu_geometry_upload(gift_gpu_ctx_t *c, gift_gpu_geometry_t *g, const gift_geometry_t *h);

/* gift_transform on the device: out = G T (inverse 0) or G T^-1 (inverse 1),
 * rows x din row-major, out may equal G (no other overlap). work_dev holds
 * rows * k floats (unused for identity, which copies). Returns 0, GIFT_EINVAL
 * or GIFT_EIO. */
int gift_gpu_transform(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, int inverse,
                       const float *G_dev, int rows, float *out_dev, float *work_dev);

/* gift_sketch on the device: Y = X^T (X Q) / n (din x ks) and the trace
 * ||X||^2 / n (in double). Synchronous: it waits for the stream, because the
 * trace is a host value and NaN/Inf must leave Y untouched; like
 * gift_gpu_sync it also returns (and clears) an error recorded earlier on c.
 * work_dev holds n * ks floats. Returns 0, GIFT_EINVAL, GIFT_ENONFINITE or
 * GIFT_EIO. */
int gift_gpu_sketch(gift_gpu_ctx_t *c, const float *X_dev, int n, int din, const float *Q_dev,
                    int ks, float *Y_dev, double *trace, float *work_dev);

/* ---------------------------------------------------------------- */
/* Error feedback (elementwise, bit-identical to gift_ef_add/update)  */
/* ---------------------------------------------------------------- */

/* p_dev[i] += e_dev[i]. */
int gift_gpu_ef_add(gift_gpu_ctx_t *c, const float *e_dev, size_t n, float *p_dev);
/* e_dev[i] = p_dev[i] - decoded_dev[i]. */
int gift_gpu_ef_update(gift_gpu_ctx_t *c, const float *p_dev, const float *decoded_dev, size_t n,
                       float *e_dev);

/* ---------------------------------------------------------------- */
/* The worker's pipeline (what libgiftclient runs for device memory)  */
/* ---------------------------------------------------------------- */

/* Pinned host memory for staging payloads (cudaMallocHost): copies to and
 * from it run asynchronously. Returns NULL on failure. */
void *gift_gpu_host_alloc(size_t bytes);
void gift_gpu_host_free(void *p);

/* Push, step 1 (whole tensor, rows x din): p = G T (g NULL or identity:
 * p = G), then p += e when e_dev is not NULL (error feedback, e already in
 * this epoch). p_dev must not overlap G; work_dev holds rows * k floats.
 * The client's encode_send, on the device. */
int gift_gpu_push_prepare(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, const float *G_dev,
                          int rows, int din, const float *e_dev, float *p_dev, float *work_dev);

/* Called on a CUDA driver thread once a chunk's payload is in host memory;
 * status is 0 or the first data error recorded on the context so far
 * (GIFT_ENONFINITE: the payload must not be sent). Must not call CUDA; a
 * libuv client wakes its loop (uv_async_send). */
typedef void (*gift_gpu_ready_cb)(void *arg, int status);

/* Push, step 2 (one chunk of n elements of p): encode p_dev into
 * payload_dev (cap bytes) with p's SR key; with error feedback (e_dev not
 * NULL) e = p - decode(payload) as the CPU client does; then copy the
 * payload's total bytes to payload_host (pinned) on the context's copy
 * stream, so the copy overlaps the next chunk's encode, and call cb when
 * they have arrived. *status_host (pinned, e.g. from gift_gpu_host_alloc)
 * receives the status passed to cb. payload_dev must not be reused (say,
 * for the next chunk) before cb fires: give each chunk its own slice, as the
 * CPU client does. Returns 0 or an argument/CUDA error (cb then never fires). */
int gift_gpu_push_chunk(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const float *p_dev,
                        size_t n, float *e_dev, void *payload_dev, void *payload_host, size_t cap,
                        int *status_host, gift_gpu_ready_cb cb, void *arg);

/* Calls cb(arg, status) on a CUDA driver thread once everything enqueued
 * on c's stream so far has run (not the copy stream of gift_gpu_push_chunk);
 * status, also written to *status_host (pinned), is the first data error
 * recorded on c so far, or 0. Does not clear it (gift_gpu_sync does). cb
 * must not call CUDA. Returns 0 or an argument/CUDA error (cb then never
 * fires). What libgiftclient uses to learn that a pull's decode is done. */
int gift_gpu_notify(gift_gpu_ctx_t *c, int *status_host, gift_gpu_ready_cb cb, void *arg);

/* Pull, step 1 (one chunk): copies len payload bytes from payload_host
 * (pinned) to payload_dev and decodes n elements into out_dev, stream
 * ordered. A bad payload records GIFT_EBADCODE (see gift_gpu_sync). */
int gift_gpu_pull_chunk(gift_gpu_ctx_t *c, const gift_codec_params_t *p, const void *payload_host,
                        size_t len, size_t n, void *payload_dev, float *out_dev);

/* Pull, step 2 (whole tensor): out = out T^-1 in place (nothing for NULL or
 * identity g). work_dev holds rows * k floats. */
int gift_gpu_pull_finish(gift_gpu_ctx_t *c, const gift_gpu_geometry_t *g, int rows, float *out_dev,
                         float *work_dev);

/* ---------------------------------------------------------------- */
/* The backend table                                                  */
/* ---------------------------------------------------------------- */

/* These entry points as the device-memory sibling of gift__backend_cpu()
 * (codec/gift_kernels.h), for callers that choose a backend once. */
struct gift__backend;
extern const struct gift__backend gift__backend_cuda;

#ifdef __cplusplus
}
#endif
#endif
