/*
 * shard_fake.h: the fake io and the frame helpers that the shard's suites
 * share (tests/server/test_shard.c, test_checkpoint.c), defined in
 * shard_fake.c.
 *
 * A fake gift_shard_io_t stands in for the libuv glue: send() checks the
 * preamble, unpacks the header back into a Gift__Envelope, takes a reference
 * on the payload buffer (as the real glue does until the write completes) and
 * keeps a private copy of the payload bytes; close() records the close; the
 * clock is a variable. Frames go in as a Gift__Envelope plus a payload slice,
 * exactly what gift_reader_next hands the glue. The *_at helpers take the
 * caller's __LINE__ (the upper-case macros pass it) for their messages.
 */
#ifndef GIFT_TEST_SHARD_FAKE_H
#define GIFT_TEST_SHARD_FAKE_H

#include <check.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include "gift_codec.h"
#include "gift_proto.h"
#include "shard.h"

#define W 4              /* world size of most tests */
#define NPEER 8          /* peers 0..3 are ranks 0..3 after hello_all; 4..7 are spare connections */
#define T0 1000000000ull /* the fake clock starts at 1 s: t_first == 0 means "unset" */

/* ------------------------------------------------------------------ */
/* Fake io                                                               */
/* ------------------------------------------------------------------ */

typedef struct sent {
    Gift__Envelope *env; /* unpacked header */
    gift_rbuf_t *buf;    /* payload buffer, one reference held until released */
    gift_rbuf_t *orig;   /* the buffer pointer as sent (kept after release, for identity) */
    size_t off, len;
    uint8_t *copy; /* the payload bytes as they were at send time */
    size_t head_len;
} sent_t;

typedef struct fake {
    gift_peer_t *p;
    uint64_t id;
    int closed; /* io->close was called */
    int gone;   /* gift_shard_peer_close was called */
    sent_t **f; /* one allocation per frame, so that a taken frame's address stays valid */
    size_t n, cap;
    size_t seen; /* frames the test has taken */
} fake_t;

struct fake_state {
    int fail_send; /* when nonzero send() refuses frames with this code */
    int bad_frames;
    int sends_after_gone, closes_after_gone, double_closes;
    uint64_t now;
    uint64_t frames, bytes; /* accepted by send() */
};
extern struct fake_state G;
extern gift_shard_t *S;
extern fake_t P[NPEER];
extern gift_shard_opts_t O;
extern const gift_shard_io_t IO;
extern int g_eager;

#define EXPECT_QUIET(fp)                                                                           \
    ck_assert_msg(unread(fp) == 0, "peer %" PRIu64 " has %zu unexpected frames, first: %s",        \
                  (fp)->id, unread(fp), unread(fp) ? msg_name((fp)->f[(fp)->seen]) : "")
#define QUIET_ALL() quiet_all(__LINE__)
#define EXPECT_ERROR(fp, code, fatal) expect_error_at((fp), (code), (fatal), __LINE__)
extern uint64_t g_seq;
#define HELLO(fp, rank, world) hello_at((fp), (rank), (world), __LINE__)

/* A tensor of the declared list, and a chunk placed on this shard. */
typedef struct tdesc {
    uint32_t key;
    const char *name;
    uint32_t rows, cols;
    Gift__Format push_fmt;
    uint32_t push_block;
    Gift__Format pull_fmt;
    uint32_t pull_block;
    int geometry;
    uint32_t rank, basis_cols, refresh;
    uint64_t seed;
} tdesc_t;

typedef struct cdesc {
    uint32_t key, chunk, row_begin, rows;
} cdesc_t;

#define F32 GIFT__FORMAT__FORMAT_F32
#define BF16 GIFT__FORMAT__FORMAT_BF16
#define E4M3 GIFT__FORMAT__FORMAT_FP8_E4M3
#define E5M2 GIFT__FORMAT__FORMAT_FP8_E5M2
#define NVFP4 GIFT__FORMAT__FORMAT_NVFP4

/* The standard list: every format, odd shapes, fp8 blocks 32 and 128
 * (declared as 0), one tensor in two chunks. */
static const tdesc_t STD_T[] = {
    {0, "layers.0.f32", 7, 13, F32, 0, F32, 0, 0, 0, 0, 0, 0},
    {1, "layers.0.bf16", 5, 33, BF16, 0, BF16, 0, 0, 0, 0, 0, 0},
    {2, "layers.0.e4m3_b32", 9, 37, E4M3, 32, E4M3, 32, 0, 0, 0, 0, 0},
    {3, "layers.0.e4m3_b128", 3, 129, E4M3, 0, F32, 0, 0, 0, 0, 0, 0},
    {4, "layers.0.nvfp4", 11, 17, NVFP4, 0, NVFP4, 0, 0, 0, 0, 0, 0},
    {5, "layers.0.split", 10, 7, F32, 0, E5M2, 0, 0, 0, 0, 0, 0},
};
static const cdesc_t STD_C[] = {{0, 0, 0, 7},  {1, 0, 0, 5}, {2, 0, 0, 9}, {3, 0, 0, 3},
                                {4, 0, 0, 11}, {5, 0, 0, 4}, {5, 1, 4, 6}};
#define STD_NT (sizeof STD_T / sizeof STD_T[0])
#define STD_NC (sizeof STD_C / sizeof STD_C[0])
extern uint64_t g_pull_ef;
extern const tdesc_t *g_t;
extern size_t g_nt;
extern const cdesc_t *g_c;
extern size_t g_nc;
#define DECLARE_OK(fp, t, nt, c, nc) declare_ok_at((fp), (t), (nt), (c), (nc), __LINE__)
#define DECLARE_ERR(fp, t, nt, c, nc, code)                                                        \
    declare_err_at((fp), (t), (nt), (c), (nc), (code), __LINE__)
#define PUSH_ERR(fp, key, chunk, step, rank, v, code)                                              \
    push_grad_err_at((fp), (key), (chunk), (step), 0, (rank), (v), (code), __LINE__)
#define PUSH_GRAD(fp, key, chunk, step, rank, v)                                                   \
    push_grad_at((fp), (key), (chunk), (step), 0, (rank), (v), 0, __LINE__)
#define PUSH_DUP(fp, key, chunk, step, rank, v)                                                    \
    push_grad_at((fp), (key), (chunk), (step), 0, (rank), (v), 1, __LINE__)
#define PULL(fp, key, chunk, step) pull_at((fp), (key), (chunk), (step), __LINE__)
#define PULL_ERR(fp, key, chunk, step, code)                                                       \
    pull_err_at((fp), (key), (chunk), (step), (code), __LINE__)
#define EXPECT_REPLY(fp, key, chunk, step, epoch, seq)                                             \
    expect_reply_at((fp), (key), (chunk), (step), (epoch), (seq), __LINE__)
#define EXPECT_BYTES(s, want, len) expect_bytes_at((s), (want), (len), __LINE__)
#define STATS(fp) stats_at((fp), __LINE__)
#define EXPECT_ERRORS(...) expect_errors_at(__LINE__, __VA_ARGS__)
#define GDIN 64
#define GK 8
#define GKS 12
#define GN 24 /* activation rows per sketch */

static const tdesc_t GEO_T[] = {
    {0, "attn.o_proj", 16, GDIN, E4M3, 32, F32, 0, 1, GK, GKS, 4, 1234},
    {1, "norm", 3, 5, F32, 0, F32, 0, 0, 0, 0, 0, 0},
};
static const cdesc_t GEO_OWNER_C[] = {{0, 0, 0, 10}, {0, 1, 10, 6}, {1, 0, 0, 3}};
static const cdesc_t GEO_OTHER_C[] = {{0, 1, 10, 6}};
#define GEO_PUSH(fp, chunk, step, epoch, rank)                                                     \
    geo_push_at((fp), (chunk), (step), (epoch), (rank), 0, __LINE__)
#define GEO_PUSH_ERR(fp, chunk, step, epoch, rank, code)                                           \
    geo_push_at((fp), (chunk), (step), (epoch), (rank), (code), __LINE__)
/* Pull error feedback: lossy pull codecs (nvfp4, fp8 with an odd block,
 * bf16), pushes in f32 and fp8, one tensor in two chunks; key 3 is declared
 * without it (its means must stay those of reference()). */
static const tdesc_t PEF_T[] = {
    {0, "pef.nvfp4", 6, 40, F32, 0, NVFP4, 0, 0, 0, 0, 0, 0},
    {1, "pef.e4m3", 5, 37, E4M3, 32, E4M3, 32, 0, 0, 0, 0, 0},
    {2, "pef.split", 10, 16, F32, 0, NVFP4, 0, 0, 0, 0, 0, 0},
    {3, "pef.off", 4, 40, F32, 0, NVFP4, 0, 0, 0, 0, 0, 0},
    {4, "pef.bf16", 3, 50, F32, 0, BF16, 0, 0, 0, 0, 0, 0},
};
static const cdesc_t PEF_C[] = {{0, 0, 0, 6}, {1, 0, 0, 5}, {2, 0, 0, 4},
                                {2, 1, 4, 6}, {3, 0, 0, 4}, {4, 0, 0, 3}};
#define PEF_NT (sizeof PEF_T / sizeof PEF_T[0])
#define PEF_NC (sizeof PEF_C / sizeof PEF_C[0])
#define PEF_MASK 0x17u /* keys 0, 1, 2, 4 */

/* The reference of pull error feedback for one chunk, step by step: the
 * shard's mean m (rank order, * 1/W + 0) plus the residual e, encoded with
 * the pull codec; e becomes v - decode(encode(v)). Starts from e = 0. */
typedef struct pef_ref {
    float *e[PEF_NC];
} pef_ref_t;

/* ------------------------------------------------------------------ */
/* Helpers (shard_fake.c)                                                */
/* ------------------------------------------------------------------ */

uint32_t le32(const uint8_t *p);
uint64_t le64(const uint8_t *p);
int fake_send(void *ctx, const uint8_t *head, size_t head_len, gift_rbuf_t *buf, size_t off,
              size_t len);
void fake_close(void *ctx);
uint64_t fake_now(void);
void io_release(fake_t *fp);
void io_free(fake_t *fp);
void peer_open(int i);
void peer_gone(fake_t *fp);
void shard_open(const gift_shard_opts_t *o);
void shard_close(void);
size_t unread(const fake_t *fp);
const char *msg_name(const sent_t *s);
sent_t *take_at(fake_t *fp, Gift__Envelope__MsgCase want, int line);
sent_t *take_any(fake_t *fp);
void quiet_all(int line);
const Gift__Error *expect_error_at(fake_t *fp, int code, int fatal, int line);
int feed(fake_t *fp, Gift__Envelope *env, const void *payload, size_t len);
extern const char *g_run_id;   /* the run id hello_raw presents ("" by fx_base) */
extern uint64_t g_resume_step; /* the resume_step hello_raw presents (0 by fx_base) */
/* Feeds a Reset (giftctl reset) of run_id (NULL: any) from fp. */
int reset_raw(fake_t *fp, const char *run_id, int force, uint64_t seq);
int hello_raw(fake_t *fp, uint32_t version, uint32_t rank, uint32_t world, const uint8_t *digest,
              size_t dlen);
void hello_at(fake_t *fp, uint32_t rank, uint32_t world, int line);
void hello_all(void);
const tdesc_t *tensor_of(uint32_t key);
const cdesc_t *chunk_of(uint32_t key, uint32_t chunk);
void tensor_decls(const tdesc_t *t, size_t nt, Gift__TensorDecl *td, Gift__TensorDecl **tdp,
                  Gift__Codec *codecs);
int declare_raw(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc,
                int bad_digest, size_t payload_len);
uint64_t digest_of(const tdesc_t *t, size_t nt);
void declare_ok_at(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc, int line);
void declare_err_at(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc, int code,
                    int line);
gift_codec_params_t params_of(Gift__Format f, uint32_t block);
size_t chunk_n(const cdesc_t *c);
size_t layout_total(Gift__Format f, uint32_t block, size_t n);
uint8_t *encode(const gift_codec_params_t *p, const float *x, size_t n, size_t *len);
int push_raw(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
             Gift__Format fmt, uint32_t block, const void *payload, size_t len);
void expect_ack_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int dup, uint64_t seq,
                   int line);
int push_x(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch, const float *x);
void push_ok_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                const float *x, int dup, int line);
void push_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                 const float *x, int code, int line);
float *grad(uint32_t key, uint32_t chunk, uint32_t rank, uint64_t v);
void push_grad_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                  uint32_t rank, uint64_t v, int dup, int line);
void push_grad_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                      uint32_t rank, uint64_t v, int code, int line);
uint8_t *reference(uint32_t key, uint32_t chunk, uint64_t v, const int *order, int world,
                   size_t *len, double *exact, double *mag);
int pull_raw(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t have_epoch,
             size_t payload_len);
uint64_t pull_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int line);
void pull_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int code, int line);
sent_t *expect_reply_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                        uint64_t seq, int line);
void expect_bytes_at(const sent_t *s, const uint8_t *want, size_t len, int line);
int sketch_raw(fake_t *fp, uint32_t key, uint64_t step, uint32_t epoch, double trace, uint32_t din,
               uint32_t ks, const void *y, size_t len);
void expect_sketch_ack_at(fake_t *fp, uint32_t key, uint64_t step, int dup, int line);
int georeq_raw(fake_t *fp, uint32_t key, size_t payload_len);
int stats_raw(fake_t *fp, size_t payload_len);
const Gift__Stats *stats_at(fake_t *fp, int line);
const gift_shard_counters_t *C(void);
void expect_errors_at(int line, int n, ...);
void fx_base(void);
void fx_hello(void);
void fx_std(void);
void fx_std_declare(void);
void fx_teardown(void);
void fx_std_eager(void);
void fx_hello_eager(void);
void reopen(const gift_shard_opts_t *o);
sent_t *expect_geometry_at(fake_t *fp, const gift_geometry_t *g, uint64_t valid_from, int line);
void make_sketch(uint32_t r, uint64_t round, const float *U, float *Y, double *trace);
void sketch_ok_at(fake_t *fp, uint64_t step, uint32_t epoch, double trace, const float *Y, int dup,
                  int line);
void sketch_err_at(fake_t *fp, uint64_t step, uint32_t epoch, double trace, uint32_t din,
                   uint32_t ks, const float *Y, size_t len, int code, int line);
void geo_push_at(fake_t *fp, uint32_t chunk, uint64_t step, uint32_t epoch, uint32_t rank, int code,
                 int line);
void pef_declare(void);
uint8_t *pef_reference(pef_ref_t *st, const cdesc_t *c, size_t ci, uint64_t v, size_t *len);
int pef_step(pef_ref_t *st, uint64_t step, int line);
void pef_ref_free(pef_ref_t *st);

#endif
