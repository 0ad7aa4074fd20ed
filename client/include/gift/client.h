/*
 * gift/client.h: libgiftclient, the worker side of giftd.
 *
 * A worker opens one client, declares every tensor it will exchange (the
 * same list, in the same order, on every rank), then per training step
 * pushes each gradient and pulls the average back. The library splits each
 * tensor into chunks of whole rows, places the chunks on the shards (the
 * same placement on every worker, computed from the declared list), applies
 * the GIFT transform before encoding and its inverse after decoding, keeps
 * error-feedback residuals, and talks to the shards from one I/O thread
 * (with opts.codec_threads, pushes are transformed and encoded beside it).
 *
 * Threads: every function may be called from any thread, but calls on one
 * client are serialised by the caller (one training thread per client is
 * the intended use). The I/O thread owns the sockets and a libuv loop of its
 * own; the calling thread only hands operations over and waits. Completion
 * callbacks run on the I/O thread: they must be short and must not call
 * back into the client, except gift_op_test and gift_op_free.
 *
 * Memory: gradient and output buffers passed to push/pull stay owned by the
 * caller and must stay valid and unchanged until the operation completes.
 * Per-tensor buffers are allocated at declaration and reused every step.
 *
 * Errors: functions return 0 or a negative code of gift_error.h;
 * gift_strerror names each one. An operation that cannot complete within
 * its timeout fails with GIFT_ETIMEDOUT instead of hanging (timeout_ms, else
 * $GIFT_TIMEOUT_MS, else 60 s); gift_client_last_error says which shard failed.
 * A shard that lost state this client already pulled from it (restarted
 * without checkpoints) refuses it at the reconnect: every operation in
 * flight, and every later one, then fails at once with GIFT_ESTATE.
 *
 * Versioning: the header and the library follow semantic versioning; the
 * SONAME carries the major version. Structs passed in carry their own size
 * in the first field so that fields can be added compatibly.
 */
#ifndef GIFT_CLIENT_H
#define GIFT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "gift_error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GIFT_CLIENT_VERSION_MAJOR 0
#define GIFT_CLIENT_VERSION_MINOR 1
#define GIFT_CLIENT_VERSION_PATCH 0

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *gift_version(void);

typedef struct gift_client gift_client_t;
typedef struct gift_op gift_op_t;

/* Wire formats for pushes and pulls (the same values as gift_format_t). */
typedef enum gift_codec {
    GIFT_CODEC_F32 = 0,
    GIFT_CODEC_BF16 = 1,
    GIFT_CODEC_FP8_E4M3 = 2,
    GIFT_CODEC_FP8_E5M2 = 3,
    GIFT_CODEC_NVFP4 = 4
} gift_codec_t;

/* Options of gift_client_open. Zero means "default" for every field;
 * initialise with GIFT_CLIENT_OPTS_INIT. */
typedef struct gift_client_opts {
    size_t size;                 /* sizeof(gift_client_opts_t) */
    const char *servers;         /* "host:port,host:port,..." in shard order; NULL: $GIFT_SERVERS */
    int rank;                    /* -1: $GIFT_RANK, else $RANK */
    int world_size;              /* 0: $GIFT_WORLD, else $WORLD_SIZE */
    uint64_t chunk_bytes;        /* largest chunk in FP32 bytes; 0: $GIFT_CHUNK_BYTES, else 4 MiB */
    uint32_t timeout_ms;         /* per operation; 0: $GIFT_TIMEOUT_MS, else 60000 */
    uint32_t connect_timeout_ms; /* giving up on reaching a shard; 0: 30000 */
    uint32_t backoff_max_ms;     /* reconnect backoff cap; 0: 2000 */
    uint64_t seed;               /* stochastic rounding and epoch-0 bases; 0: 1 */
    const char *name;            /* shown in the shards' logs; NULL: "gift-<pid>" */
    /* The shards' shared secret (their auth_key_file): NULL: $GIFT_AUTH_KEY_FILE; unset or
     * empty: no authentication. With a key the client proves it at Hello and refuses any
     * shard that does not prove it back; the file must not be readable by other users. */
    const char *auth_key_file;
    /* The run this worker belongs to, at most 64 bytes, presented at every Hello: NULL:
     * $GIFT_RUN_ID (giftrun sets a fresh one per run); unset or empty: no check. A shard
     * holding another run's state refuses the client (GIFT_ERUNID). The string is the
     * caller's and is copied by gift_client_open. Added after auth_key_file: a caller built
     * against an older header (smaller size) gets $GIFT_RUN_ID. */
    const char *run_id;
    /* Threads beside the I/O thread that transform and encode the pushes of host tensors
     * (added after run_id): -1: $GIFT_CODEC_THREADS, else 0; 0..64. With 0 the I/O thread
     * does all of it; with N each push of a tensor of its own (not fused, not f32 sent as
     * it lies) is transformed and encoded on one of N threads, and with N >= 2 the pull's
     * T^-1 of a tensor in one chunk too (a tensor of several chunks is transformed back
     * chunk by chunk on the I/O thread as they arrive), while the I/O thread keeps the
     * sockets and decodes the pulls, so a CPU worker's communication can use more than
     * one core. The bytes do not depend on N. A caller built against an older
     * header (smaller size) gets the variable. */
    int codec_threads;
} gift_client_opts_t;

#define GIFT_CLIENT_OPTS_INIT                                                                      \
    {                                                                                              \
        sizeof(gift_client_opts_t), NULL, -1, 0, 0, 0, 0, 0, 0, NULL, NULL, NULL, -1               \
    }

/* Opens a client: reads what opts leaves unset from the environment, starts
 * the I/O thread and connects to every shard (Hello). Returns 0 and *out, or
 * GIFT_EINVAL (bad or missing servers/rank/world), GIFT_ETIMEDOUT (a shard
 * could not be reached within connect_timeout_ms), GIFT_EWORLD, GIFT_ENOMEM,
 * GIFT_ERUNID (a shard holds another run's state), GIFT_EINVAL (a run id above 64 bytes),
 * GIFT_EAUTH (the key file is unusable, said on stderr; a shard refused the
 * key, or it requires one and none is set; a shard failed to prove the key).
 * On error *out is NULL and nothing is left running. */
int gift_client_open(const gift_client_opts_t *opts, gift_client_t **out);

/* Copies into buf (len bytes, always terminated) the sentence that explained
 * the client's last failure: the shard's index, address and Error text, or
 * what was expected and found (world size, connection refused, ...); "" when
 * nothing failed. With c NULL: the last failed gift_client_open of the
 * calling thread. The sentence also went to stderr when it happened. Returns
 * its length (it may have been cut to fit), or GIFT_EINVAL (buf NULL or len
 * 0). Any thread. */
int gift_client_last_error(gift_client_t *c, char *buf, size_t len);

/* Closes the client: waits for operations in flight (up to their timeout),
 * stops the I/O thread, frees everything. NULL is allowed. */
void gift_client_close(gift_client_t *c);

/* One tensor. Initialise with GIFT_TENSOR_INIT. */
typedef struct gift_tensor_desc {
    size_t size; /* sizeof(gift_tensor_desc_t) */
    const char *name;
    uint32_t rows, cols; /* a 1-D tensor is 1 x n */
    gift_codec_t push_codec;
    gift_codec_t pull_codec;
    uint32_t fp8_block; /* 0: 128 */
    int geometry;       /* 1: GIFT transform (2-D weights); 0: Euclidean */
    uint32_t rank;      /* transform rank k; 0: the default policy */
    uint32_t refresh;   /* sketch every `refresh` steps; 0: 50 */
    int error_feedback; /* keep the residual of the push encoding */
    int stochastic;     /* stochastic rounding for pushes */
    int priority;       /* larger goes first; 0: declaration order (see below) */
    /* Where this tensor's buffers live (added in 0.1 after priority; a caller
     * built against an older header passes a smaller size and gets host). */
    int memory; /* GIFT_MEMORY_HOST (0) or GIFT_MEMORY_CUDA (1) */
    int device; /* GIFT_MEMORY_CUDA: the CUDA device ordinal of its buffers */
    /* Error feedback on the pulled mean (added in 0.1 after device): with a
     * lossy pull codec (bf16, fp8, nvfp4) the shards keep the residual of each
     * step's mean encoding and add it to the next step's mean, so the pulled
     * means' rounding errors cancel over steps instead of adding up. Costs
     * the shards 4 bytes per element; reset when a geometry epoch changes.
     * Every worker must declare the same value (part of the cluster digest). */
    int pull_error_feedback;
    /* A fixed rotation of a tensor without geometry (added in 0.1 after
     * pull_error_feedback; a caller built against an older header gets
     * GIFT_TRANSFORM_NONE). GIFT_TRANSFORM_HADAMARD (issue 42): each row is
     * sent as H D x, D random signs from a seed derived from the tensor's
     * name and id (the same on every worker), H the orthonormal
     * Walsh-Hadamard transform on blocks of the largest power of two that
     * divides cols (codec/gift_codec.h, gift_hadamard_block), and every
     * pulled mean is rotated back (D H). The shards average in the rotated
     * space, as for geometry tensors; error feedback keeps the residual
     * there too. Such a tensor is never fused into a bucket. Refused
     * (GIFT_EINVAL, said on stderr) with geometry and with GIFT_MEMORY_CUDA
     * (no device path yet). Part of the cluster digest. */
    int transform;
} gift_tensor_desc_t;

#define GIFT_TENSOR_INIT                                                                           \
    {                                                                                              \
        sizeof(gift_tensor_desc_t), NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0              \
    }

/* Treatments of gift_tensor_desc_t.transform. */
#define GIFT_TRANSFORM_NONE 0     /* Euclidean, or GIFT where geometry is on */
#define GIFT_TRANSFORM_HADAMARD 1 /* random signs and a Walsh-Hadamard rotation */

/* Memory kinds of gift_tensor_desc_t.memory. */
#define GIFT_MEMORY_HOST 0
#define GIFT_MEMORY_CUDA 1

/*
 * Device tensors (memory = GIFT_MEMORY_CUDA). The pointers passed to
 * gift_push, gift_pull, gift_push_pull and gift_sketch_inputs for such a
 * tensor are CUDA device pointers (cudaMalloc or managed memory) on
 * `device`, rows x cols floats (n x cols for X). The library transforms,
 * adds the error-feedback residual and encodes on the GPU, copies only the
 * encoded payload to pinned host memory, and after a pull decodes each
 * chunk's payload and applies T^-1 on the GPU, in place in out. Every
 * device buffer (residual, scratch, payload staging, pinned host copies of
 * the payloads, kept for replay after a reconnect) is allocated once, when
 * gift_declare reaches the I/O thread.
 *
 * Streams and ordering. The library runs this work on a non-blocking CUDA
 * stream of its own (one per device per client, created and used only on
 * the client's I/O thread), not on the caller's streams, and does not wait
 * on them: before gift_push / gift_push_pull / gift_sketch_inputs the
 * caller must have finished writing grad (or X), e.g. with
 * cudaStreamSynchronize on the stream that produced it (PyTorch:
 * torch.cuda.current_stream().synchronize()). grad and out must stay
 * allocated, and grad unchanged, until the operation completes. When an
 * operation completes (gift_op_wait returns, its callback runs) every GPU
 * write of it to out has finished and is visible to any stream; X is no
 * longer read when gift_sketch_inputs returns; this holds for a failed
 * operation too (a timeout or a shard's Error frame while its device work
 * runs waits for that work before completing). The library changes the
 * current CUDA device of its own I/O thread only; calls on the caller's
 * thread query the device count and nothing else.
 *
 * Device work of one client is serialised per device (one push or one
 * pull's decode at a time, queued in arrival order), so that a data error
 * (NaN in a gradient, a bad payload code) is charged to the operation that
 * caused it; within a push, the copy of chunk i to the host overlaps the
 * encode of chunk i + 1, and each chunk is sent as soon as its copy lands.
 * Device tensors are never fused into the small-tensor buckets described at
 * gift_push: each is a wire tensor of its own. A NaN or Inf in a device
 * gradient fails the push with GIFT_ENONFINITE as on the host; with error
 * feedback, the residual of the chunks from the failing one on is reset to
 * zero (the host path resets the failing chunk's only, or none with
 * stochastic rounding, and keeps the later chunks'). Results are bit-identical
 * to the host path for Euclidean tensors; with geometry the transforms run
 * through cuBLAS and agree to rounding.
 *
 * gift_declare fails with GIFT_ENODEV (and a line on stderr) when a tensor
 * asks for GIFT_MEMORY_CUDA and the library was built without CUDA, or
 * `device` is not a CUDA device of this process; GIFT_EINVAL for a memory
 * kind it does not know.
 */

/* Declares the whole tensor list at once (every rank the same list in the
 * same order), computes the chunks and their placement, allocates every
 * per-tensor buffer (device buffers too, see "Device tensors" above), and
 * declares the chunks to the shards. Tensor i gets the id i. Priorities
 * default to the order a backward pass produces gradients: later-declared
 * tensors are pushed first and pulled last. Every rank must give each
 * tensor the same memory kind: device tensors are never fused, so the kind
 * of a small tensor changes the list the shards see (GIFT_EDIGEST). Returns 0, GIFT_EINVAL,
 * GIFT_ENODEV (a device tensor, and no CUDA or no such device), GIFT_EDIGEST (a shard holds a
 * different list), GIFT_ETIMEDOUT, GIFT_ENOMEM, GIFT_EIO (a CUDA call failed; said on stderr). Call
 * once per client. */
int gift_declare(gift_client_t *c, const gift_tensor_desc_t *tensors, size_t n);

/* Completion callback: status is 0 or a negative code. Runs on the I/O
 * thread. */
typedef void (*gift_op_cb)(gift_op_t *op, int status, void *arg);

/* Starts pushing tensor id's gradient (rows x cols floats, row-major) for
 * step. Steps start anywhere but advance by one. Returns 0 and *op, or a
 * negative code (nothing was started). *op completes when every chunk is
 * acknowledged. cb may be NULL.
 *
 * Small Euclidean tensors (geometry off, under 64 KiB of FP32) are fused,
 * in declaration order and per (codecs, fp8 block, error feedback,
 * stochastic, priority), into buckets that travel as one tensor: such a
 * push is sent, and completes, once every tensor of its bucket has been
 * pushed for that step. Start all of a step's pushes before waiting on any
 * of them (gift_push_pull for each tensor, then wait).
 *
 * grad must stay valid until *op completes: chunks are encoded a few per
 * I/O-loop turn, each sent as soon as it is encoded. A chunk holding NaN or
 * Inf (after the transform and error feedback) is never sent: the op fails
 * with GIFT_ENONFINITE. The chunks before it may already have reached their
 * shards, which keep them: pushing the same step again (with finite data) is
 * allowed and completes the step, the shards acknowledging those chunks as
 * duplicates and keeping their first copy, so push the same values again
 * (for a worker, data differing there is not seen). Error feedback has then
 * already taken those chunks' residual. */
int gift_push(gift_client_t *c, uint32_t id, uint64_t step, const float *grad, gift_op_cb cb,
              void *arg, gift_op_t **op);

/* Starts pulling the mean of tensor id for step into out (rows x cols
 * floats), mapped back to Euclidean coordinates. Completes when every chunk
 * has arrived and been decoded. */
int gift_pull(gift_client_t *c, uint32_t id, uint64_t step, float *out, gift_op_cb cb, void *arg,
              gift_op_t **op);

/* Push then pull the same step: the usual call. grad and out may be the
 * same buffer. When they do not overlap, an f32 push is sent from grad
 * itself (checked, not copied), which is why grad must stay unchanged until
 * the whole operation completes; in place it is copied first. */
int gift_push_pull(gift_client_t *c, uint32_t id, uint64_t step, const float *grad, float *out,
                   gift_op_cb cb, void *arg, gift_op_t **op);

/* Submits the layer inputs X (n x cols floats, row-major) of a geometry
 * tensor for the refresh step `step` (a multiple of the tensor's refresh).
 * The client computes the sketch X^T (X Q) / n against the current basis
 * and sends it before that step's push. Call before gift_push for the step;
 * X is no longer needed when the call returns. The epoch built from every
 * worker's sketch is announced in the reply to that step's pull, so the
 * tensor's pushes of later steps wait until the step has been pulled.
 * Returns 0, GIFT_EINVAL (not a geometry tensor, not a refresh step, wrong
 * shape, or the step's push already started), GIFT_ENONFINITE (X holds
 * NaN/Inf), GIFT_ETIMEDOUT. */
int gift_sketch_inputs(gift_client_t *c, uint32_t id, uint64_t step, const float *X, uint32_t n);

/* Waits for op (up to the client's timeout). Returns its status. */
int gift_op_wait(gift_op_t *op);
/* Returns 1 when op has completed (its status in *status), else 0. */
int gift_op_test(gift_op_t *op, int *status);
/* Frees a completed operation (waits first if it has not completed). */
void gift_op_free(gift_op_t *op);

/* Counters of this client (for tests and benchmarks). */
typedef struct gift_client_stats {
    uint64_t frames_out, frames_in;
    uint64_t bytes_out, bytes_in; /* wire bytes, headers included */
    uint64_t reconnects, replays;
    uint32_t epochs_switched;
} gift_client_stats_t;
void gift_client_stats(gift_client_t *c, gift_client_stats_t *out);

/* What this client's work costs per byte (for benchmarks and capacity
 * planning). A pass is one walk of user-space code over a chunk's elements:
 * pass_bytes[kind] adds 4 bytes per element each time a pass of that kind
 * runs, so pass_bytes summed over kinds, over the FP32 bytes pushed, is the
 * number of passes the data took. Passes the kernel makes (socket copies)
 * and passes on a GPU are not counted. */
enum {
    GIFT_PASS_ENCODE,     /* encode into a payload (f32: a checked copy) */
    GIFT_PASS_DECODE,     /* decode a payload (f32: a checked copy) */
    GIFT_PASS_ACCUMULATE, /* decode and add into a sum (shard) */
    GIFT_PASS_FUSED,      /* decode, average and encode the reply in one walk (shard) */
    GIFT_PASS_COPY,       /* a plain copy (buckets, out-of-order pushes, copies out) */
    GIFT_PASS_CHECK,      /* a read-only NaN/Inf check where no copy was made */
    GIFT_PASS_RESIDUAL,   /* error feedback: residual added, updated or both */
    GIFT_PASS_TRANSFORM,  /* the GIFT transform or its inverse */
    GIFT_PASS_KINDS
};
/* "encode", "decode", ...; NULL for a kind out of range. */
const char *gift_pass_name(int kind);

typedef struct gift_client_counters {
    size_t size;          /* sizeof(gift_client_counters_t), set by the caller */
    uint64_t io_cpu_ns;   /* CPU time of the client's I/O thread, user + system */
    uint64_t payload_out; /* push and sketch payload bytes written (headers not) */
    uint64_t payload_in;  /* pull reply and geometry payload bytes read */
    uint64_t pass_bytes[GIFT_PASS_KINDS];
    /* CPU time of the codec threads (opts.codec_threads), summed, as each finishes a job
     * (added after pass_bytes: a smaller size does not get it). */
    uint64_t codec_cpu_ns;
} gift_client_counters_t;
/* Fills *out (up to out->size bytes). Returns 0, or GIFT_EINVAL (NULL, or a
 * size below that of the first release of this struct). */
int gift_client_counters(gift_client_t *c, gift_client_counters_t *out);

#ifdef __cplusplus
}
#endif
#endif
