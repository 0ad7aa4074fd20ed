/*
 * gift_codec.h: the GIFT codec. Number formats, the geometry transform,
 * sketches, error feedback and fidelity metrics. CPU only, no I/O.
 *
 * Formats (docs/ARCHITECTURE.md, "Codec formats"). Every encoder rounds to
 * nearest even (or stochastically, when asked), saturates to the finite
 * maximum and refuses NaN/Inf input with GIFT_ENONFINITE (the payload is then
 * unspecified and must not be sent).
 *
 *   f32      raw IEEE binary32, 4 bytes/elem, no scales
 *   bf16     bfloat16, 2 bytes/elem, no scales; saturates to +-0x7F7F
 *   fp8-e4m3 OCP E4M3FN, 1 byte/elem; one fp32 scale per block of `block`
 *   fp8-e5m2 OCP E5M2, 1 byte/elem; one fp32 scale per block
 *   nvfp4    E2M1 two per byte, low nibble first; one E4M3 scale per 16
 *            elements and one fp32 tensor scale
 *
 * The exact arithmetic, which the GPU twins reproduce bit for bit:
 *
 *   fp8 block b:  amax = max|x_i| over the block (the last block may be short)
 *                 scale = amax / FMAX          (FMAX = 448 or 57344, fp32 divide)
 *                 inv   = FMAX / amax          (fp32 divide)
 *                 If scale < FLT_MIN (amax == 0, or amax below FMAX * 2^-126)
 *                 the block is stored as scale 0 and all-zero codes.
 *                 code_i = cvt(x_i * inv)      (fp32 multiply, then RNE to fp8)
 *                 decode: value(code_i) * scale
 *   nvfp4:        amax_t = max|x| over the whole tensor
 *                 s_t = amax_t / 2688          (6 * 448; fp32 divide); if s_t <
 *                 FLT_MIN the tensor is stored as s_t = 0, zero scales and codes.
 *                 per 16-element block: sb = e4m3(amax_b / (s_t * 6)) RNE, satfinite
 *                 eff = value(sb) * s_t; inv = 1 / eff (fp32); a block with
 *                 eff < FLT_MIN has all-zero codes.
 *                 code_i = e2m1(x_i * inv); decode: value(code_i) * eff
 *
 * Payload layout: the scale section then the code section, each starting at a
 * 64-byte aligned offset (see gift_layout). For nvfp4 the scale section is the
 * fp32 tensor scale followed by one E4M3 byte per block.
 *
 * SIMD: the scalar path is the reference. AVX2 and AVX-512 paths are chosen at
 * run time (or forced with GIFT_SIMD=scalar|avx2|avx512 in the environment, or
 * gift_simd_force) and produce the same bytes and floats bit for bit.
 */
#ifndef GIFT_CODEC_H
#define GIFT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "gift_error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GIFT_CODEC_VERSION "0.1.0"
#define GIFT_ALIGN 64              /* payload section alignment, bytes */
#define GIFT_FP8_BLOCK_DEFAULT 128 /* fp8 elements per block */
#define GIFT_NVFP4_BLOCK 16        /* nvfp4 elements per block (fixed) */
#define GIFT_E4M3_MAX 448.0f
#define GIFT_E5M2_MAX 57344.0f
#define GIFT_E2M1_MAX 6.0f

typedef enum gift_format {
    GIFT_FMT_F32 = 0,
    GIFT_FMT_BF16 = 1,
    GIFT_FMT_E4M3 = 2,
    GIFT_FMT_E5M2 = 3,
    GIFT_FMT_NVFP4 = 4,
    GIFT_FMT_COUNT_
} gift_format_t;

/* Stochastic-rounding key: the random bits for element i of a chunk are a
 * pure function of (seed, rank, key, chunk, step, i) (Philox4x32-10), so a run
 * reproduces exactly and every (rank, step) draws independent bits. */
typedef struct gift_sr_key {
    uint64_t seed;
    uint32_t rank;
    uint32_t key;   /* tensor id */
    uint32_t chunk; /* chunk index within the tensor */
    uint64_t step;
} gift_sr_key_t;

typedef struct gift_codec_params {
    gift_format_t fmt;
    uint32_t block; /* fp8: elements per block, a power of two in 32..2^20; 0 means 128.
                       Ignored by f32/bf16; nvfp4 always uses 16. */
    int stochastic; /* 0: round to nearest even; 1: stochastic rounding with sr */
    gift_sr_key_t sr;
} gift_codec_params_t;

/* Byte layout of one encoded payload of n elements. */
typedef struct gift_layout {
    size_t n;           /* elements */
    size_t block;       /* effective block size (0 for f32/bf16) */
    size_t nblocks;     /* number of scaled blocks (0 for f32/bf16) */
    size_t scale_off;   /* always 0 */
    size_t scale_bytes; /* bytes used in the scale section, unpadded */
    size_t code_off;    /* 64-aligned start of the codes */
    size_t code_bytes;  /* bytes used in the code section, unpadded */
    size_t total;       /* 64-aligned size of the whole payload */
} gift_layout_t;

/* Counts of codes at the edges of the format (see gift_boundary_hits). */
typedef struct gift_hits {
    size_t saturated; /* the scaled |x| reached the rounding midpoint above the largest
                         finite value: it wanted a code the format lacks */
    size_t flushed;   /* x != 0 that decoded to exactly zero */
    size_t n;         /* elements inspected */
} gift_hits_t;

/* Format names: "f32", "bf16", "fp8-e4m3", "fp8-e5m2", "nvfp4". */
const char *gift_format_name(gift_format_t fmt);
/* Parses a format name (also "fp8" and "e4m3" for fp8-e4m3, "e5m2" for
 * fp8-e5m2). Returns the format or GIFT_EFORMAT. */
int gift_format_parse(const char *name);

/* Fills *out with the layout for n elements under p. Returns 0, GIFT_EFORMAT
 * for an unknown format or a block that is not a power of two in 32..2^20, and
 * GIFT_EINVAL when n is so large (over SIZE_MAX / 8) that sizes would wrap. */
int gift_layout(const gift_codec_params_t *p, size_t n, gift_layout_t *out);

/* Encodes n floats x into payload (cap bytes, at least layout.total; padding
 * bytes are written as zero). Returns 0, GIFT_ENONFINITE if x holds NaN/Inf
 * (payload contents then unspecified), GIFT_ENOSPC, GIFT_EFORMAT. */
int gift_encode(const gift_codec_params_t *p, const float *x, size_t n, void *payload, size_t cap);

/* Encodes the mean the server sends: exactly the bytes gift_encode gives for
 * y_i = x_i * scale + 0.0f (fp32 multiply, then adding +0 turns -0 into +0),
 * without writing y anywhere: x is read once, slice by slice, while the
 * slice is in cache. Round to nearest only (p->stochastic gives GIFT_EINVAL);
 * scale must be positive and finite. Returns as gift_encode. fp8 blocks over
 * 4096 elements need one temporary allocation per call. */
int gift_encode_mean(const gift_codec_params_t *p, const float *x, size_t n, float scale,
                     void *payload, size_t cap);

/* p[i] += e[i], and dst[i] = a[i] - b[i] (dst may be a or b): the float
 * operations of error feedback, on the SIMD path (same results as the plain
 * loops: one IEEE add or subtract per element). */
void gift_vec_add(float *p, const float *e, size_t n);
void gift_vec_sub(const float *a, const float *b, size_t n, float *dst);

/* The mean with error feedback (the shard's pull_error_feedback): with
 * v_i = (x_i * scale + 0.0f) + e_i, writes the bytes gift_encode gives for v
 * and sets e_i = v_i - decode(those bytes)_i, slice by slice while each slice
 * is in cache (x read once, e read and written once; nvfp4 reads both twice,
 * its tensor scale needs v's largest magnitude). Round to nearest only;
 * scale positive and finite. Returns 0, GIFT_ENONFINITE when v overflows (e
 * is then all zeros: the step failed and its residual is dropped), or
 * GIFT_EFORMAT with nothing written for an fp8 block that does not divide
 * 4096 (compute it in passes then). */
int gift_encode_mean_ef(const gift_codec_params_t *p, const float *x, size_t n, float scale,
                        float *e, void *payload, size_t cap);

/* The shard's last push of a step fused with the mean's encoding: writes to
 * out exactly the bytes of gift_decode (acc NULL) or gift_decode_acc (onto a
 * copy of acc) of the push payload into a sum y, followed by
 * gift_encode_mean(pull, y, n, scale), without writing y anywhere: slice by
 * slice, each slice decoded, scaled and encoded while in cache. acc is only
 * read. The payload is checked whole (gift_payload_check) before out is
 * touched. Returns 0, the codes of gift_decode and of gift_encode_mean
 * (GIFT_ENONFINITE when the sum overflows), or GIFT_EFORMAT, out untouched,
 * when the two layouts cannot be walked in common slices (an fp8 block that
 * does not divide 4096): take the two-step path then. An nvfp4 pull reads
 * the payload twice (the tensor scale needs the sum's largest magnitude). */
int gift_decode_encode_mean(const gift_codec_params_t *push, const void *payload, size_t len,
                            const float *acc, size_t n, float scale,
                            const gift_codec_params_t *pull, void *out, size_t cap);

/* gift_decode_encode_mean with the pull's error feedback: writes to out
 * exactly the bytes of gift_decode (acc NULL) or gift_decode_acc (onto a copy
 * of acc) of the push payload into a sum y, followed by
 * gift_encode_mean_ef(pull, y, n, scale, e, out, cap), and updates e as that
 * would, without writing y anywhere. acc is only read. The payload is checked
 * whole first: GIFT_EBADCODE (and the other codes of gift_decode) leave out
 * and e untouched, as does GIFT_EFORMAT (an fp8 block, push or pull, that
 * does not divide 4096: take the two-step path). Otherwise returns as
 * gift_encode_mean_ef. nvfp4 pulls decode the payload twice. */
int gift_decode_encode_mean_ef(const gift_codec_params_t *push, const void *payload, size_t len,
                               const float *acc, size_t n, float scale,
                               const gift_codec_params_t *pull, float *e, void *out, size_t cap);

/* The bytes gift_encode gives for n floats that fill writes, slice by slice
 * (fill(ctx, i, len, buf): elements [i, i + len) into buf; 0 or an error,
 * which is returned), each slice encoded while it is in cache: an input
 * transformed on the way (gift_hadamard_encode) is never written whole.
 * slice is a multiple of the fp8 block. f32, bf16 and fp8, round to nearest
 * only (p->stochastic: GIFT_EINVAL); nvfp4, whose tensor scale needs the
 * whole input, gives GIFT_EFORMAT with nothing written. Slices above 4096
 * elements need one temporary allocation per call. Otherwise returns as
 * gift_encode. */
typedef int (*gift_slice_fn)(void *ctx, size_t i, size_t len, float *buf);
int gift_encode_slices(const gift_codec_params_t *p, size_t n, size_t slice, gift_slice_fn fill,
                       void *ctx, void *payload, size_t cap);

/* Decodes a payload of n elements into out. Checks every scale and code first:
 * NaN/Inf codes or non-finite/negative scales give GIFT_EBADCODE and out is
 * left untouched. len is the payload size (at least layout.total - padding of
 * the last section is not required: layout.code_off + layout.code_bytes). */
int gift_decode(const gift_codec_params_t *p, const void *payload, size_t len, size_t n,
                float *out);

/* The checks of gift_decode without the decode: 0 when a payload of n
 * elements would decode, else the error gift_decode would return
 * (GIFT_EBADCODE, GIFT_ENOSPC, ...). Reads only the scales and the codes'
 * special-value bits; writes nothing. */
int gift_payload_check(const gift_codec_params_t *p, const void *payload, size_t len, size_t n);

/* acc[i] += decode(payload)[i], the server's inner loop. Validates like
 * gift_decode before touching acc, so a bad payload leaves acc unchanged. */
int gift_decode_acc(const gift_codec_params_t *p, const void *payload, size_t len, size_t n,
                    float *acc);

/* Compares x with its encoding: counts codes that saturated or flushed to
 * zero. Slow path (diagnostics), not for the inner loop. */
int gift_boundary_hits(const gift_codec_params_t *p, const float *x, const void *payload,
                       size_t len, size_t n, gift_hits_t *out);

/* Scalar element conversions, exposed for tests and the GPU twins.
 * e4m3/e5m2: RNE, saturate to the finite max; input must be finite. */
uint8_t gift_f32_to_e4m3(float x);
uint8_t gift_f32_to_e5m2(float x);
uint8_t gift_f32_to_e2m1(float x); /* 4-bit code in the low nibble */
uint16_t gift_f32_to_bf16(float x);
float gift_e4m3_to_f32(uint8_t c); /* NaN codes give NaN */
float gift_e5m2_to_f32(uint8_t c); /* Inf/NaN codes give Inf/NaN */
float gift_e2m1_to_f32(uint8_t c); /* low nibble used */
float gift_bf16_to_f32(uint16_t c);

/* Philox4x32-10 (Random123): one 128-bit block for counter ctr under key. */
void gift_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The 32 random bits that stochastic rounding uses for element i. */
uint32_t gift_sr_bits(const gift_sr_key_t *k, uint64_t i);

/* SIMD path selection. */
typedef enum gift_simd {
    GIFT_SIMD_SCALAR = 0,
    GIFT_SIMD_AVX2 = 1,
    GIFT_SIMD_AVX512 = 2
} gift_simd_t;
/* The best path this CPU supports. */
gift_simd_t gift_simd_best(void);
/* The path in use now (GIFT_SIMD env var or gift_simd_force, else best). */
gift_simd_t gift_simd_active(void);
/* Forces a path; returns GIFT_EINVAL if the CPU lacks it. Not thread safe:
 * call it before encoding starts (tests and benchmarks). */
int gift_simd_force(gift_simd_t s);
const char *gift_simd_name(gift_simd_t s);

/* ------------------------------------------------------------------ */
/* Geometry and transform (docs/ARCHITECTURE.md, "The transform").      */
/* ------------------------------------------------------------------ */

/* The published geometry of one tensor: U (din x ks, row-major, orthonormal
 * columns sorted by descending lambda), lambda[ks], and the scalars. The
 * transform uses the first k columns; all ks columns are the next sketch
 * basis Q. */
typedef struct gift_geometry {
    int din;        /* input dimension (columns of the gradient) */
    int k;          /* transform rank, 1..din (k == din: full transform) */
    int ks;         /* basis columns, k <= ks <= din (k plus oversampling) */
    float *U;       /* din x ks, row-major */
    float *lambda;  /* ks Ritz values, descending */
    double trace;   /* tr A of the summed sketch */
    double sigma2;  /* (tr A - sum of the top k lambda) / (din - k), 0 if k == din */
    double delta;   /* damping * tr A / din */
    float c;        /* (sigma2 + delta)^-1/2 */
    float *d;       /* k entries: (lambda_i + delta)^-1/2 - c */
    uint32_t epoch; /* 0: the random starting basis, identity transform */
    int identity;   /* 1: T = I (epoch 0, or a zero trace) */
    float c_inv;    /* (sigma2 + delta)^+1/2, the scalar of T^-1 */
    float *d_inv;   /* k entries: (lambda_i + delta)^+1/2 - c_inv */
    void *ws;       /* private: update workspace, allocated by gift_geometry_init */
    float *dense;   /* optional, gift_geometry_dense_floats(din, k) floats: T and T^-1
                       as din x din matrices, then scratch; NULL: the thin form only */
    int dense_on;   /* 1: dense holds this epoch's T and T^-1 (set by update, load, copy) */
} gift_geometry_t;

#define GIFT_DAMPING_DEFAULT 1e-2
#define GIFT_OVERSAMPLE_DEFAULT 8

/* The default rank policy: k for a rows x din gradient. Full rank when
 * din <= 256; otherwise din/4 rounded up to a multiple of 16, clamped to
 * [64, 512], so that the transform (4*rows*din*k flops each way) stays below
 * 2048 flops per gradient element while keeping k/din near 1/4, where the
 * rank measurements in bench/README.md put most of the gain. */
int gift_rank_default(int rows, int din);
/* The dense form. Applying T as c G + ((G U_k) diag(d)) U_k^T costs 4 rows din
 * k flops; as one product G T with T formed once per epoch, 2 rows din^2. So
 * for k >= din / 2 (every default full-rank tensor) the product is cheaper, by
 * 2x at full rank. The floats a geometry's dense buffer needs for rank k (the
 * two matrices and a din x k scratch), or 0 where the thin form is kept:
 * k < din / 2, or din > GIFT_DENSE_MAX_DIN (the matrices would outgrow U).
 * gift_geometry_init allocates it; a caller allocating its own buffers may.
 * Two geometries of the same epoch transform bit for bit alike when both or
 * neither have it (it is formed by one function from U, d and c). */
#define GIFT_DENSE_MAX_DIN 1024
size_t gift_geometry_dense_floats(int din, int k);
/* Flops of T and T^-1 once each on rows x din on the CPU: 8 rows din k in the
 * thin form, 4 rows din^2 where the dense form applies (0 for bad sizes). */
double gift_transform_flops(double rows, int din, int k);

/* Basis columns for rank k: min(din, k + oversample). */
int gift_basis_cols(int din, int k, int oversample);

/* Allocates a geometry for din, k, ks (all buffers, once). Starts as epoch 0:
 * identity transform with a deterministic random orthonormal basis from seed.
 * Returns 0, GIFT_EINVAL, GIFT_ENOMEM, GIFT_ELAPACK. Free with gift_geometry_free. */
int gift_geometry_init(gift_geometry_t *g, int din, int k, int ks, uint64_t seed);
/* gift_geometry_init without the dense form (dense stays NULL): for a holder
 * that builds epochs but seldom applies T, such as the shard's geometry
 * owner, which then neither holds the matrices nor forms them each epoch
 * (4 din^2 k flops). Its transforms take the thin form. */
int gift_geometry_init_thin(gift_geometry_t *g, int din, int k, int ks, uint64_t seed);
void gift_geometry_free(gift_geometry_t *g);
/* Copies src into dst (same din, k, ks). */
int gift_geometry_copy(gift_geometry_t *dst, const gift_geometry_t *src);

/* Builds the next epoch in g from a summed sketch Y = sum_r A_r Q (din x ks,
 * row-major) taken against the basis Q = g->U, and the summed trace. Uses the
 * stable Nyström approximation A ~ Y (Q^T Y)^-1 Y^T: QR, Cholesky and a ks x ks
 * symmetric eigenproblem in double precision (LAPACKE). Sums over workers
 * need no scaling: a common factor cancels in the transform up to damping,
 * which scales with the trace. trace <= 0 publishes an identity epoch. On error g is
 * unchanged (epoch included). No allocation: the workspace comes from init.
 * Returns 0, GIFT_EINVAL (NaN/Inf input, damping < 0, or a singular T), or
 * GIFT_ELAPACK (Y is not the sketch of a PSD matrix). Same as
 * gift_geometry_update_decay with decay 0, bit for bit. */
int gift_geometry_update(gift_geometry_t *g, const float *Y, double trace, double damping);

/* Like gift_geometry_update, but the epoch is built from a running average of
 * the input covariance across refreshes, C_t = decay C_prev + (1 - decay) C_new,
 * where C_prev is the covariance g represents now (its U, lambda and trace) and
 * C_new the one Y and trace sketch. Because Y is taken against Q = g->U, the
 * averaged sketch is decay U diag(lambda) + (1 - decay) Y and the averaged trace
 * decay g->trace + (1 - decay) trace, both formed here; exact when ks == din.
 * An identity g (epoch 0, or after a zero trace) holds no estimate: its update
 * is not averaged. decay 0 is gift_geometry_update bit for bit. The result is
 * a pure function of g's published state (U, lambda, trace, identity), so an
 * owner restored from a checkpoint or from logged epochs continues exactly.
 * Returns what gift_geometry_update returns; GIFT_EINVAL also for a decay
 * outside [0, 1) or NaN. */
int gift_geometry_update_decay(gift_geometry_t *g, const float *Y, double trace, double damping,
                               double decay);

/* The decay that turns a geometry holding n rounds into the average of n + 1
 * rounds with weights decay^age normalised by their sum (an exponential
 * average without the weight decay^n that a plain one leaves on its first
 * round, which is taken whole): decay (1 - decay^n) / (1 - decay^(n + 1)).
 * 0 for n = 0; tends to decay. decay outside [0, 1) gives NaN. */
double gift_geometry_decay_at(double decay, uint32_t n);

/* Sets g to a published epoch: U (din x ks, row-major) and lambda (ks) as
 * received from the geometry owner, with its trace, sigma2, delta, epoch and
 * identity flag. c, d, c_inv and d_inv are computed exactly as
 * gift_geometry_update computes them, so every holder of the same epoch
 * transforms bit for bit alike, the owner included, where both or neither
 * hold the dense form. g's buffers must exist for din, k, ks
 * (gift_geometry_init, or allocated by the caller with ws NULL and dense
 * NULL or of gift_geometry_dense_floats(din, k) floats); U and lambda may be
 * g's own buffers. On error g is
 * unchanged. Returns 0 or GIFT_EINVAL
 * (NaN/Inf or negative values, or a singular T). No allocation. */
int gift_geometry_load(gift_geometry_t *g, const float *U, const float *lambda, double trace,
                       double sigma2, double delta, uint32_t epoch, int identity);

/* sigma2 of g's epoch for a transform of rank k (1 <= k <= g->ks):
 * max(0, trace - sum of lambda[0..k)) / (din - k) in double from the float
 * lambda, 0 when k == din. What a worker and the owner load for an epoch
 * whose decision lowers the rank (gift.proto Geometry.transform_rank), so
 * every one of them holds the same transform. NaN for a k out of range. */
double gift_geometry_rank_sigma2(const gift_geometry_t *g, int k);

/* Sketch of one worker's layer inputs X (n x din, row-major):
 * Y = X^T (X Q) / n (din x ks) and *trace = tr(X^T X) / n. work must hold
 * n * ks floats (allocated once by the caller). */
int gift_sketch(const float *X, int n, int din, const float *Q, int ks, float *Y, double *trace,
                float *work);

/* Applies T (inverse = 0) or T^-1 (inverse = 1) to rows x din row-major G,
 * writing out (may equal G). work must hold rows * k floats. Identity
 * geometries copy. With a formed dense form (dense_on) and rows * k >= din:
 * out = G T in row blocks of rows * k / din (through work when out == G, so
 * in place and out of place give the same bits); otherwise two thin
 * cblas_sgemm:
 * out = c*G + ((G U_k) diag(d)) U_k^T. */
int gift_transform(const gift_geometry_t *g, int inverse, const float *G, int rows, float *out,
                   float *work);

/* gift_transform of rows of a larger tensor: work holds work_rows * k floats
 * (work_rows >= rows, else GIFT_EINVAL), and the form and row blocks are the
 * ones gift_transform would take for work_rows rows. So a tensor of R rows
 * transformed chunk by chunk with work_rows = R takes one form for every
 * chunk, and two callers that cut it into the same chunks get the same bits. */
int gift_transform_ws(const gift_geometry_t *g, int inverse, const float *G, int rows, float *out,
                      float *work, int work_rows);

/* ------------------------------------------------------------------ */
/* The Hadamard treatment (issue 42)                                     */
/* ------------------------------------------------------------------ */

/* A fixed orthogonal rotation along the input dimension, the cheap
 * alternative to GIFT's data-dependent T (THC; QuaRot-style rotations): each
 * row x of rows x cols G is sent as y = H_b (D x) blockwise, where D flips
 * the sign of column j by a pseudo-random bit of the seed, and H_b is the
 * orthonormal Walsh-Hadamard matrix (entries +-1/sqrt(b)) applied to each
 * run of b = gift_hadamard_block(cols) columns. Not padded: a block is the
 * largest power of two that divides cols, so the wire carries exactly
 * rows x cols elements and the shard's chunks, buffers and bytes are those of
 * a Euclidean tensor (a cols with a small power-of-two factor mixes little:
 * an odd cols gets signs only). The inverse is D H_b (H_b is symmetric and
 * its own inverse). It is linear, so the shard averages pushes in the rotated
 * space and each worker rotates the pulled mean back, as for GIFT tensors.
 *
 * Arithmetic, the same bits on every SIMD path: the signs are XORed into the
 * sign bit (exact), the butterflies of stage h = 1, 2, 4, ..., b/2 are the
 * plain (a + c, a - c), and each result is multiplied once by the fp32
 * scale fl(1/sqrt(b)) (then the signs, for the inverse). Against the exact
 * transform the error is that of log2(b) rounded additions and one multiply
 * per element (normwise about (log2 b + 1) 2^-24 ||x||). */
#define GIFT_HADAMARD_MAX_BLOCK 32768u /* 128 KiB of floats: one block stays in L2 */

/* The block of a row of cols columns: the largest power of two dividing cols,
 * at most GIFT_HADAMARD_MAX_BLOCK; 1 for odd cols, 0 for 0. */
uint32_t gift_hadamard_block(uint32_t cols);
/* The seed of a tensor's signs for an epoch (0 for a tensor without
 * geometry epochs): a pure function of its declared name and key, so every
 * worker derives the same signs without being told. */
uint64_t gift_hadamard_seed(const char *name, uint32_t key, uint32_t epoch);

typedef struct gift_hadamard {
    uint32_t cols;  /* row length */
    uint32_t block; /* gift_hadamard_block(cols) */
    uint64_t seed;
    float scale;     /* fl(1/sqrt(block)) */
    uint32_t *signs; /* cols words, 0 or 0x80000000: XORed into column j */
} gift_hadamard_t;

/* Allocates the signs for cols columns from seed. 0, GIFT_EINVAL (cols 0),
 * GIFT_ENOMEM. Free with gift_hadamard_free. */
int gift_hadamard_init(gift_hadamard_t *h, uint32_t cols, uint64_t seed);
void gift_hadamard_free(gift_hadamard_t *h);
/* out = in rotated (inverse 0: H D, row by row; 1: D H, its inverse), rows x
 * h->cols floats row-major; out may equal in. Rows never mix, so a chunk of
 * whole rows transforms on its own. Allocates nothing. 0 or GIFT_EINVAL. */
int gift_hadamard_apply(const gift_hadamard_t *h, int inverse, const float *in, size_t rows,
                        float *out);
/* gift_encode of the rows x h->cols input rotated (H D, as gift_hadamard_apply
 * with inverse 0), without writing the rotated tensor: slices of whole
 * Hadamard blocks are rotated and encoded while in cache
 * (gift_encode_slices). Same bytes as the two steps. f32, bf16 and fp8 with
 * round to nearest; nvfp4 or stochastic rounding give GIFT_EFORMAT, nothing
 * written (take the two steps). Returns as gift_encode. */
int gift_hadamard_encode(const gift_codec_params_t *p, const gift_hadamard_t *h, const float *x,
                         size_t rows, void *payload, size_t cap);
/* The orthonormal transform of one block of b floats in place (b a power of
 * two), no signs, scalar: the reference the tests and benchmarks compare. */
void gift_fwht(float *x, uint32_t b);

/* ------------------------------------------------------------------ */
/* Error feedback                                                        */
/* ------------------------------------------------------------------ */

/* Sender-side residual e in transformed coordinates, one per tensor chunk. */
typedef struct gift_ef {
    float *e; /* rows x din */
    int rows, din;
    uint32_t epoch; /* geometry epoch e is expressed in */
} gift_ef_t;

int gift_ef_init(gift_ef_t *ef, int rows, int din);
void gift_ef_free(gift_ef_t *ef);
/* p += e (p in transformed coordinates). */
void gift_ef_add(const gift_ef_t *ef, float *p);
/* e = p - decoded, the part of p the wire did not carry. */
void gift_ef_update(gift_ef_t *ef, const float *p, const float *decoded);
/* Zeroes e and stamps the epoch. */
void gift_ef_reset(gift_ef_t *ef, uint32_t epoch);
/* Re-expresses e under a new geometry: e <- (e T_old^-1) T_new, and stamps
 * new_g->epoch. e must be expressed in old_g's epoch (ef->epoch ==
 * old_g->epoch), else GIFT_EINVAL and e is untouched. work holds
 * rows * max(k_old, k_new) floats (may be NULL when both are identity). */
int gift_ef_rebase(gift_ef_t *ef, const gift_geometry_t *old_g, const gift_geometry_t *new_g,
                   float *work);

/* ------------------------------------------------------------------ */
/* Fidelity metrics (all in double precision; rows x din row-major)      */
/* ------------------------------------------------------------------ */

/* ||Gh - G|| / ||G|| (Frobenius). */
double gift_metric_rel_l2(const float *G, const float *Gh, size_t n);
/* <G, Gh> / (||G|| ||Gh||). */
double gift_metric_cosine(const float *G, const float *Gh, size_t n);
/* ||(Gh - G) L|| / ||G L|| with L = (A + delta I)^-1/2, delta = damping tr A / din,
 * A the din x din covariance (row-major). Returns a negative code on failure. */
double gift_metric_whitened(const float *G, const float *Gh, int rows, int din, const float *A,
                            double damping);
/* ||G L|| with L = (A + delta I)^-1/2 as above: G's size in the whitened metric.
 * Negative code on failure. */
double gift_metric_whitened_norm(const float *G, int rows, int din, const float *A, double damping);
/* What fp8's relative error predicts for GIFT fp8 with A's own geometry over
 * Euclidean fp8, in the whitened metric of A: sqrt(sum_w ||G_w L||^2 /
 * sum_w sum_ij G_w,ij^2 (L^2)_jj) for W gradients G (W x rows x din). A
 * property of the data; 1 when A is diagonal. Negative code on failure. */
double gift_metric_fp8_oracle(const float *G, int W, int rows, int din, const float *A,
                              double damping);
/* Muon's five Newton-Schulz steps (a, b, c) = (3.4445, -4.7750, 2.0315) on
 * X = G / ||G||, transposed internally when rows > din. out is rows x din. */
int gift_ns5(const float *G, int rows, int din, double *out);
/* ||NS5(Gh) - NS5(G)|| / ||NS5(G)||. Negative code on failure. */
double gift_metric_muon(const float *G, const float *Gh, int rows, int din);

#ifdef __cplusplus
}
#endif
#endif
