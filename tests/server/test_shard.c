/*
 * test_shard.c: server/shard.c without sockets.
 *
 * A fake gift_shard_io_t stands in for the libuv glue: send() checks the
 * preamble, unpacks the header back into a Gift__Envelope, takes a reference
 * on the payload buffer (as the real glue does until the write completes) and
 * keeps a private copy of the payload bytes; close() records the close; the
 * clock is a variable. Frames go in as a Gift__Envelope plus a payload slice,
 * exactly what gift_reader_next hands the glue.
 *
 * Every expected reply is checked field by field. Pull payloads are compared
 * byte for byte with a reference pipeline built from the codec alone: decode
 * and sum the pushes in FP32 in rank order (ordered aggregation, the default)
 * or in their arrival order (the "eager" cases), multiply by 1/W, encode
 * with the pull codec (DESIGN.md section 4). The mean is also compared with
 * the exact mean in double precision. The "persist" case runs shards with a
 * data_dir: checkpoints and step logs round-trip, damaged ones are refused.
 *
 * The "regressions" case holds the reproducers of four bugs this suite found
 * in shard.c (a refused Hello or push changing state, a payload on Hello, an
 * owner mixing two epochs in one step); they pass since the fixes.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gift_codec.h"
#include "gift_proto.h"
#include "log.h"
#include "shard.h"
#include "gift_test_check.h"
#include "gift_test_frames.h"
#include "gift_test_rng.h"

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

static struct {
    int fail_send; /* when nonzero send() refuses frames with this code */
    int bad_frames;
    int sends_after_gone, closes_after_gone, double_closes;
    uint64_t now;
    uint64_t frames, bytes; /* accepted by send() */
} G;

static gift_shard_t *S;
static fake_t P[NPEER];
static gift_shard_opts_t O;

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int fake_send(void *ctx, const uint8_t *head, size_t head_len, gift_rbuf_t *buf, size_t off,
                     size_t len)
{
    fake_t *fp = ctx;
    Gift__Envelope *env;
    sent_t *s;

    if (fp->gone)
        G.sends_after_gone++;
    if (G.fail_send)
        return G.fail_send;
    if (head_len < GIFT_PREAMBLE_BYTES || memcmp(head, GIFT_FRAME_MAGIC, 4) != 0 ||
        GIFT_PREAMBLE_BYTES + (size_t)le32(head + 4) != head_len || le64(head + 8) != len ||
        (buf == NULL && len != 0) || (buf != NULL && (off > buf->len || len > buf->len - off))) {
        G.bad_frames++;
        return GIFT_EINVAL;
    }
    env = gift__envelope__unpack(NULL, head_len - GIFT_PREAMBLE_BYTES, head + GIFT_PREAMBLE_BYTES);
    if (env == NULL) {
        G.bad_frames++;
        return GIFT_EINVAL;
    }
    if (fp->n == fp->cap) {
        size_t nc = fp->cap ? 2 * fp->cap : 64;
        sent_t **nf = realloc(fp->f, nc * sizeof *nf);
        if (nf == NULL) {
            gift__envelope__free_unpacked(env, NULL);
            return GIFT_ENOMEM;
        }
        fp->f = nf;
        fp->cap = nc;
    }
    if ((s = calloc(1, sizeof *s)) == NULL) {
        gift__envelope__free_unpacked(env, NULL);
        return GIFT_ENOMEM;
    }
    fp->f[fp->n++] = s;
    s->env = env;
    s->head_len = head_len;
    s->off = off;
    s->len = len;
    if (buf != NULL) {
        gift_rbuf_ref(buf);
        s->buf = s->orig = buf;
        if (len > 0 && (s->copy = malloc(len)) != NULL)
            memcpy(s->copy, buf->data + off, len);
    }
    G.frames++;
    G.bytes += head_len + len;
    return 0;
}

static void fake_close(void *ctx)
{
    fake_t *fp = ctx;
    if (fp->gone)
        G.closes_after_gone++;
    if (fp->closed)
        G.double_closes++;
    fp->closed = 1;
}

static uint64_t fake_now(void)
{
    return G.now;
}

static const gift_shard_io_t IO = {fake_send, fake_close, fake_now};

/* Drops fp's references to payload buffers, as the glue does when writes complete. */
static void io_release(fake_t *fp)
{
    for (size_t i = 0; i < fp->n; i++) {
        gift_rbuf_unref(fp->f[i]->buf);
        fp->f[i]->buf = NULL;
    }
}

static void io_free(fake_t *fp)
{
    io_release(fp);
    for (size_t i = 0; i < fp->n; i++) {
        gift__envelope__free_unpacked(fp->f[i]->env, NULL);
        free(fp->f[i]->copy);
        free(fp->f[i]);
    }
    free(fp->f);
    memset(fp, 0, sizeof *fp);
}

static void peer_open(int i)
{
    P[i].id = (uint64_t)i + 1;
    P[i].p = gift_shard_peer_open(S, &P[i], P[i].id);
    ck_assert_msg(P[i].p != NULL, "peer_open %d failed", i);
}

/* The glue's on-close: the connection is gone. */
static void peer_gone(fake_t *fp)
{
    if (fp->p != NULL)
        gift_shard_peer_close(S, fp->p);
    fp->p = NULL;
    fp->gone = 1;
}

/* Set by the eager fixtures: every shard of the test sums in arrival order. */
static int g_eager;

static void shard_open(const gift_shard_opts_t *o)
{
    memset(&G, 0, sizeof G);
    memset(P, 0, sizeof P);
    G.now = T0;
    O = *o;
    if (g_eager)
        O.aggregate = GIFT_SHARD_EAGER;
    S = gift_shard_new(&O, &IO);
    ck_assert_msg(S != NULL, "gift_shard_new(shard %u of %u, world %u) failed", O.shard_id,
                  O.num_shards, O.world_size);
    for (int i = 0; i < NPEER; i++)
        peer_open(i);
}

/* Closes every peer, frees the shard while the fake io may still hold
 * payload references, then drops those: ASan sees any leak or double free. */
static void shard_close(void)
{
    uint64_t frames_out = 0, bytes_out = 0;
    if (S != NULL) {
        for (int i = 0; i < NPEER; i++)
            if (!P[i].gone)
                peer_gone(&P[i]);
        ck_assert_msg(gift_shard_counters(S)->peers == 0, "%u peers left after closing all",
                      gift_shard_counters(S)->peers);
        frames_out = gift_shard_counters(S)->frames_out;
        bytes_out = gift_shard_counters(S)->bytes_out;
        gift_shard_free(S);
        S = NULL;
        ck_assert_msg(frames_out == G.frames,
                      "shard counted %" PRIu64 " frames out, io took %" PRIu64, frames_out,
                      G.frames);
        ck_assert_msg(bytes_out == G.bytes, "shard counted %" PRIu64 " bytes out, io took %" PRIu64,
                      bytes_out, G.bytes);
    }
    ck_assert_msg(G.bad_frames == 0, "%d malformed frames", G.bad_frames);
    ck_assert_msg(G.sends_after_gone == 0, "%d frames sent to closed peers", G.sends_after_gone);
    ck_assert_msg(G.closes_after_gone == 0, "%d closes of gone peers", G.closes_after_gone);
    ck_assert_msg(G.double_closes == 0, "%d peers closed twice", G.double_closes);
    for (int i = 0; i < NPEER; i++)
        io_free(&P[i]);
}

/* ------------------------------------------------------------------ */
/* Taking frames                                                         */
/* ------------------------------------------------------------------ */

static size_t unread(const fake_t *fp)
{
    return fp->n - fp->seen;
}

static const char *msg_name(const sent_t *s)
{
    if (s->env->msg_case == GIFT__ENVELOPE__MSG_ERROR)
        return s->env->error->text;
    return gift_msg_name(s->env);
}

static sent_t *take_at(fake_t *fp, Gift__Envelope__MsgCase want, int line)
{
    sent_t *s;
    ck_assert_msg(fp->seen < fp->n, "line %d: peer %" PRIu64 " expected %s, got nothing", line,
                  fp->id, want == GIFT__ENVELOPE__MSG_ERROR ? "an error" : "a frame");
    s = fp->f[fp->seen++];
    ck_assert_msg(s->env->msg_case == want,
                  "line %d: peer %" PRIu64 " expected message %d, got %s (%d)", line, fp->id,
                  (int)want, msg_name(s), (int)s->env->msg_case);
    return s;
}

static sent_t *take_any(fake_t *fp)
{
    ck_assert_msg(fp->seen < fp->n, "peer %" PRIu64 " expected a frame, got nothing", fp->id);
    return fp->f[fp->seen++];
}

#define EXPECT_QUIET(fp)                                                                           \
    ck_assert_msg(unread(fp) == 0, "peer %" PRIu64 " has %zu unexpected frames, first: %s",        \
                  (fp)->id, unread(fp), unread(fp) ? msg_name((fp)->f[(fp)->seen]) : "")

static void quiet_all(int line)
{
    for (int i = 0; i < NPEER; i++)
        ck_assert_msg(unread(&P[i]) == 0, "line %d: peer %d has %zu unexpected frames, first: %s",
                      line, i, unread(&P[i]), unread(&P[i]) ? msg_name(P[i].f[P[i].seen]) : "");
}
#define QUIET_ALL() quiet_all(__LINE__)

static const Gift__Error *expect_error_at(fake_t *fp, int code, int fatal, int line)
{
    sent_t *s = take_at(fp, GIFT__ENVELOPE__MSG_ERROR, line);
    const Gift__Error *e = s->env->error;
    ck_assert_msg(e->code == code, "line %d: error %d (%s: \"%s\"), wanted %d (%s)", line, e->code,
                  gift_strerror(e->code), e->text, code, gift_strerror(code));
    ck_assert_msg(e->fatal == (fatal != 0), "line %d: error %d fatal=%d, wanted %d (\"%s\")", line,
                  code, (int)e->fatal, fatal, e->text);
    ck_assert_msg(fp->closed == (fatal != 0), "line %d: peer %" PRIu64 " closed=%d after %s error",
                  line, fp->id, fp->closed, fatal ? "a fatal" : "a non-fatal");
    ck_assert_msg(e->text != NULL && e->text[0] != '\0', "line %d: error %d without text", line,
                  code);
    return e;
}
#define EXPECT_ERROR(fp, code, fatal) expect_error_at((fp), (code), (fatal), __LINE__)

/* ------------------------------------------------------------------ */
/* Messages in                                                           */
/* ------------------------------------------------------------------ */

static uint64_t g_seq = 1;

static int feed(fake_t *fp, Gift__Envelope *env, const void *payload, size_t len)
{
    gift_frame_t f;
    f.env = env;
    f.header_len = (uint32_t)gift__envelope__get_packed_size(env); /* as the reader sets it */
    f.payload = payload;
    f.payload_len = len;
    return gift_shard_handle(S, fp->p, &f);
}

static int hello_raw(fake_t *fp, uint32_t version, uint32_t rank, uint32_t world,
                     const uint8_t *digest, size_t dlen)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = version;
    h.rank = rank;
    h.world_size = world;
    h.client_name = "test_shard";
    h.cluster_digest.data = (uint8_t *)digest;
    h.cluster_digest.len = dlen;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    return feed(fp, &env, NULL, 0);
}

static void hello_at(fake_t *fp, uint32_t rank, uint32_t world, int line)
{
    const Gift__HelloAck *a;
    int rc = hello_raw(fp, GIFT_PROTOCOL_VERSION, rank, world, NULL, 0);
    ck_assert_msg(rc == 0, "line %d: hello rank %u world %u returned %d", line, rank, world, rc);
    a = take_at(fp, GIFT__ENVELOPE__MSG_HELLO_ACK, line)->env->hello_ack;
    ck_assert_msg(a->protocol_version == GIFT_PROTOCOL_VERSION && a->world_size == world &&
                      a->shard_id == O.shard_id && a->num_shards == O.num_shards,
                  "line %d: hello_ack version %u world %u shard %u/%u", line, a->protocol_version,
                  a->world_size, a->shard_id, a->num_shards);
}
#define HELLO(fp, rank, world) hello_at((fp), (rank), (world), __LINE__)

static void hello_all(void)
{
    for (int r = 0; r < W; r++)
        HELLO(&P[r], (uint32_t)r, W);
}

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

/* Keys (bit k) declared with pull_error_feedback by tensor_decls. */
static uint64_t g_pull_ef;

/* The list this shard was declared with (for the helpers below). */
static const tdesc_t *g_t;
static size_t g_nt;
static const cdesc_t *g_c;
static size_t g_nc;

static const tdesc_t *tensor_of(uint32_t key)
{
    for (size_t i = 0; i < g_nt; i++)
        if (g_t[i].key == key)
            return &g_t[i];
    ck_abort_msg("no tensor %u in the test's list", key);
    return NULL;
}

static const cdesc_t *chunk_of(uint32_t key, uint32_t chunk)
{
    for (size_t i = 0; i < g_nc; i++)
        if (g_c[i].key == key && g_c[i].chunk == chunk)
            return &g_c[i];
    ck_abort_msg("no chunk %u of tensor %u in the test's list", chunk, key);
    return NULL;
}

/* Fills td[0..nt) (and the pointer array tdp, and two codecs per tensor in
 * codecs) from the test's descriptions. */
static void tensor_decls(const tdesc_t *t, size_t nt, Gift__TensorDecl *td, Gift__TensorDecl **tdp,
                         Gift__Codec *codecs)
{
    for (size_t i = 0; i < nt; i++) {
        gift__tensor_decl__init(&td[i]);
        gift__codec__init(&codecs[2 * i]);
        gift__codec__init(&codecs[2 * i + 1]);
        codecs[2 * i].format = t[i].push_fmt;
        codecs[2 * i].block = t[i].push_block;
        codecs[2 * i + 1].format = t[i].pull_fmt;
        codecs[2 * i + 1].block = t[i].pull_block;
        td[i].key = t[i].key;
        td[i].name = (char *)t[i].name;
        td[i].rows = t[i].rows;
        td[i].cols = t[i].cols;
        td[i].push_codec = &codecs[2 * i];
        td[i].pull_codec = &codecs[2 * i + 1];
        td[i].geometry = t[i].geometry;
        td[i].rank = t[i].rank;
        td[i].basis_cols = t[i].basis_cols;
        td[i].refresh = t[i].refresh;
        td[i].seed = t[i].seed;
        td[i].pull_error_feedback = t[i].key < 64 && ((g_pull_ef >> t[i].key) & 1);
        tdp[i] = &td[i];
    }
}

/* Builds a Declare from descriptions. bad_digest: 0 correct, 1 one byte
 * flipped, 2 seven bytes. Returns the handle code. */
static int declare_raw(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc,
                       int bad_digest, size_t payload_len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Declare d = GIFT__DECLARE__INIT;
    Gift__TensorDecl *td = calloc(nt ? nt : 1, sizeof *td),
                     **tdp = calloc(nt ? nt : 1, sizeof *tdp);
    Gift__ChunkDecl *cd = calloc(nc ? nc : 1, sizeof *cd), **cdp = calloc(nc ? nc : 1, sizeof *cdp);
    Gift__Codec *codecs = calloc(2 * (nt ? nt : 1), sizeof *codecs);
    uint8_t dg[8], junk[64] = {0};
    int rc;

    ck_assert(td && tdp && cd && cdp && codecs);
    tensor_decls(t, nt, td, tdp, codecs);
    for (size_t i = 0; i < nc; i++) {
        gift__chunk_decl__init(&cd[i]);
        cd[i].key = c[i].key;
        cd[i].chunk = c[i].chunk;
        cd[i].row_begin = c[i].row_begin;
        cd[i].rows = c[i].rows;
        cdp[i] = &cd[i];
    }
    d.n_tensors = nt;
    d.tensors = tdp;
    d.n_chunks = nc;
    d.chunks = cdp;
    gift_digest_bytes(gift_digest_tensors(tdp, nt), dg);
    if (bad_digest == 1)
        dg[3] ^= 0x10;
    d.digest.data = dg;
    d.digest.len = bad_digest == 2 ? 7 : 8;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
    env.declare = &d;
    rc = feed(fp, &env, payload_len ? junk : NULL, payload_len);
    free(td);
    free(tdp);
    free(cd);
    free(cdp);
    free(codecs);
    return rc;
}

static uint64_t digest_of(const tdesc_t *t, size_t nt)
{
    uint64_t d;
    Gift__TensorDecl *td = calloc(nt, sizeof *td), **tdp = calloc(nt, sizeof *tdp);
    Gift__Codec *codecs = calloc(2 * nt, sizeof *codecs);
    ck_assert(td && tdp && codecs);
    tensor_decls(t, nt, td, tdp, codecs);
    d = gift_digest_tensors(tdp, nt);
    free(td);
    free(tdp);
    free(codecs);
    return d;
}

static void declare_ok_at(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc,
                          int line)
{
    const Gift__DeclareAck *a;
    int rc = declare_raw(fp, t, nt, c, nc, 0, 0);
    ck_assert_msg(rc == 0, "line %d: declare returned %d", line, rc);
    a = take_at(fp, GIFT__ENVELOPE__MSG_DECLARE_ACK, line)->env->declare_ack;
    ck_assert_msg(a->tensors == nt && a->chunks == nc,
                  "line %d: declare_ack %u tensors %u chunks, wanted %zu %zu", line, a->tensors,
                  a->chunks, nt, nc);
    g_t = t;
    g_nt = nt;
    g_c = c;
    g_nc = nc;
}
#define DECLARE_OK(fp, t, nt, c, nc) declare_ok_at((fp), (t), (nt), (c), (nc), __LINE__)

static void declare_err_at(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc,
                           int code, int line)
{
    int rc = declare_raw(fp, t, nt, c, nc, 0, 0);
    ck_assert_msg(rc == 0, "line %d: a refused declare returned %d (must not be fatal)", line, rc);
    expect_error_at(fp, code, 0, line);
}
#define DECLARE_ERR(fp, t, nt, c, nc, code)                                                        \
    declare_err_at((fp), (t), (nt), (c), (nc), (code), __LINE__)

static gift_codec_params_t params_of(Gift__Format f, uint32_t block)
{
    gift_codec_params_t p;
    memset(&p, 0, sizeof p);
    p.fmt = (gift_format_t)f;
    p.block = f == E4M3 || f == E5M2 ? block : 0;
    return p;
}

static size_t chunk_n(const cdesc_t *c)
{
    return (size_t)c->rows * tensor_of(c->key)->cols;
}

static size_t layout_total(Gift__Format f, uint32_t block, size_t n)
{
    gift_codec_params_t p = params_of(f, block);
    gift_layout_t l;
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
    return l.total;
}

/* Encodes x (n floats) with p; the caller frees. */
static uint8_t *encode(const gift_codec_params_t *p, const float *x, size_t n, size_t *len)
{
    gift_layout_t l;
    uint8_t *b;
    int rc;
    ck_assert_int_eq(gift_layout(p, n, &l), 0);
    b = malloc(l.total ? l.total : 1);
    ck_assert_ptr_nonnull(b);
    rc = gift_encode(p, x, n, b, l.total);
    ck_assert_msg(rc == 0, "gift_encode(%s, n %zu) returned %d", gift_format_name(p->fmt), n, rc);
    *len = l.total;
    return b;
}

static int push_raw(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                    Gift__Format fmt, uint32_t block, const void *payload, size_t len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    gift_test_fill_push(&env, &m, &codec, key, chunk, step, epoch, fmt, block, g_seq++);
    return feed(fp, &env, payload, len);
}

static void expect_ack_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int dup,
                          uint64_t seq, int line)
{
    const Gift__PushAck *a = take_at(fp, GIFT__ENVELOPE__MSG_PUSH_ACK, line)->env->push_ack;
    ck_assert_msg(a->key == key && a->chunk == chunk && a->step == step && a->seq == seq,
                  "line %d: push_ack key %u chunk %u step %" PRIu64 " seq %" PRIu64
                  ", wanted %u %u %" PRIu64 " %" PRIu64,
                  line, a->key, a->chunk, a->step, a->seq, key, chunk, step, seq);
    ck_assert_msg(a->duplicate == (dup != 0),
                  "line %d: push_ack duplicate=%d, wanted %d (key %u step %" PRIu64 ")", line,
                  (int)a->duplicate, dup, key, step);
}

/* Pushes x (the chunk's elements) encoded with the tensor's push codec. */
static int push_x(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                  const float *x)
{
    const tdesc_t *t = tensor_of(key);
    const cdesc_t *c = chunk_of(key, chunk);
    gift_codec_params_t p = params_of(t->push_fmt, t->push_block);
    size_t len;
    uint8_t *b = encode(&p, x, chunk_n(c), &len);
    int rc = push_raw(fp, key, chunk, step, epoch, t->push_fmt, t->push_block, b, len);
    free(b);
    return rc;
}

static void push_ok_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                       const float *x, int dup, int line)
{
    int rc = push_x(fp, key, chunk, step, epoch, x);
    ck_assert_msg(rc == 0, "line %d: push returned %d", line, rc);
    expect_ack_at(fp, key, chunk, step, dup, g_seq - 1, line);
}

static void push_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                        const float *x, int code, int line)
{
    const Gift__Error *e;
    int rc = push_x(fp, key, chunk, step, epoch, x);
    ck_assert_msg(rc == 0, "line %d: a refused push returned %d (must not be fatal)", line, rc);
    e = expect_error_at(fp, code, 0, line);
    ck_assert_msg(e->key == key && e->chunk == chunk && e->step == step && e->seq == g_seq - 1,
                  "line %d: error context key %u chunk %u step %" PRIu64 " seq %" PRIu64, line,
                  e->key, e->chunk, e->step, e->seq);
}

/* ------------------------------------------------------------------ */
/* Data                                                                  */
/* ------------------------------------------------------------------ */

/* Rank r's gradient chunk for data set v: fresh normals, a different scale
 * per rank, some blocks much larger than others. */
static float *grad(uint32_t key, uint32_t chunk, uint32_t rank, uint64_t v)
{
    const cdesc_t *c = chunk_of(key, chunk);
    size_t n = chunk_n(c);
    uint64_t s =
        0x5eed ^ ((uint64_t)key << 40) ^ ((uint64_t)chunk << 32) ^ ((uint64_t)rank << 24) ^ v;
    float *x = malloc(n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rng_normal(&s) * (0.25 + rank) * ((i / 40) % 3 == 1 ? 20.0 : 1.0));
    return x;
}

static void push_grad_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                         uint32_t rank, uint64_t v, int dup, int line)
{
    float *x = grad(key, chunk, rank, v);
    push_ok_at(fp, key, chunk, step, epoch, x, dup, line);
    free(x);
}
static void push_grad_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step,
                             uint32_t epoch, uint32_t rank, uint64_t v, int code, int line)
{
    float *x = grad(key, chunk, rank, v);
    push_err_at(fp, key, chunk, step, epoch, x, code, line);
    free(x);
}
#define PUSH_ERR(fp, key, chunk, step, rank, v, code)                                              \
    push_grad_err_at((fp), (key), (chunk), (step), 0, (rank), (v), (code), __LINE__)
#define PUSH_GRAD(fp, key, chunk, step, rank, v)                                                   \
    push_grad_at((fp), (key), (chunk), (step), 0, (rank), (v), 0, __LINE__)
#define PUSH_DUP(fp, key, chunk, step, rank, v)                                                    \
    push_grad_at((fp), (key), (chunk), (step), 0, (rank), (v), 1, __LINE__)

/* The reference of DESIGN.md section 4 for one chunk: the pushes of the
 * ranks in order[] (data set v), decoded and summed in FP32 in that order
 * under eager aggregation, in rank order under ordered aggregation,
 * times 1/world, encoded with the pull codec. Returns the payload; exact[]
 * (optional) gets the mean in double of the decoded pushes and mag[] the
 * mean of their magnitudes. */
static uint8_t *reference(uint32_t key, uint32_t chunk, uint64_t v, const int *order, int world,
                          size_t *len, double *exact, double *mag)
{
    const tdesc_t *t = tensor_of(key);
    size_t n = chunk_n(chunk_of(key, chunk));
    gift_codec_params_t pp = params_of(t->push_fmt, t->push_block);
    gift_codec_params_t qp = params_of(t->pull_fmt, t->pull_block);
    float *acc = calloc(n, sizeof *acc), *dec = malloc(n * sizeof *dec);
    const float inv = 1.0f / (float)world;
    uint8_t *out;
    static const int by_rank[64] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12,
                                    13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                                    26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38,
                                    39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
                                    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

    ck_assert(acc && dec && world <= 64);
    if (!g_eager)
        order = by_rank;
    if (exact)
        memset(exact, 0, n * sizeof *exact);
    if (mag)
        memset(mag, 0, n * sizeof *mag);
    for (int i = 0; i < world; i++) {
        float *x = grad(key, chunk, (uint32_t)order[i], v);
        size_t plen;
        uint8_t *b = encode(&pp, x, n, &plen);
        ck_assert_int_eq(gift_decode_acc(&pp, b, plen, n, acc), 0);
        ck_assert_int_eq(gift_decode(&pp, b, plen, n, dec), 0);
        for (size_t j = 0; j < n; j++) {
            if (exact)
                exact[j] += (double)dec[j] / world;
            if (mag)
                mag[j] += fabs((double)dec[j]) / world;
        }
        free(b);
        free(x);
    }
    /* The shard's mean: sum * (1/W) + 0 (shard.h). */
    for (size_t j = 0; j < n; j++)
        acc[j] = acc[j] * inv + 0.0f;
    out = encode(&qp, acc, n, len);
    free(acc);
    free(dec);
    return out;
}

/* ------------------------------------------------------------------ */
/* Pull, sketch, geometry, stats                                         */
/* ------------------------------------------------------------------ */

static int pull_raw(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t have_epoch,
                    size_t payload_len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Pull m = GIFT__PULL__INIT;
    uint8_t junk[16] = {0};
    gift_test_fill_pull(&env, &m, key, chunk, step, have_epoch, g_seq++);
    return feed(fp, &env, payload_len ? junk : NULL, payload_len);
}

/* Sends a pull; returns its seq. */
static uint64_t pull_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int line)
{
    int rc = pull_raw(fp, key, chunk, step, 0, 0);
    ck_assert_msg(rc == 0, "line %d: pull returned %d", line, rc);
    return g_seq - 1;
}
#define PULL(fp, key, chunk, step) pull_at((fp), (key), (chunk), (step), __LINE__)

static void pull_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int code, int line)
{
    uint64_t seq = pull_at(fp, key, chunk, step, line);
    const Gift__Error *e = expect_error_at(fp, code, 0, line);
    ck_assert_msg(e->key == key && e->chunk == chunk && e->step == step && e->seq == seq,
                  "line %d: error context key %u chunk %u step %" PRIu64 " seq %" PRIu64, line,
                  e->key, e->chunk, e->step, e->seq);
}
#define PULL_ERR(fp, key, chunk, step, code)                                                       \
    pull_err_at((fp), (key), (chunk), (step), (code), __LINE__)

/* Takes a PullReply and checks its header; returns the frame. */
static sent_t *expect_reply_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step,
                               uint32_t epoch, uint64_t seq, int line)
{
    sent_t *s = take_at(fp, GIFT__ENVELOPE__MSG_PULL_REPLY, line);
    const Gift__PullReply *r = s->env->pull_reply;
    const tdesc_t *t = tensor_of(key);
    size_t want_len = layout_total(t->pull_fmt, t->pull_block, chunk_n(chunk_of(key, chunk)));
    ck_assert_msg(r->key == key && r->chunk == chunk && r->step == step && r->seq == seq,
                  "line %d: pull_reply key %u chunk %u step %" PRIu64 " seq %" PRIu64
                  ", wanted %u %u %" PRIu64 " %" PRIu64,
                  line, r->key, r->chunk, r->step, r->seq, key, chunk, step, seq);
    ck_assert_msg(r->epoch == epoch, "line %d: pull_reply epoch %u, wanted %u", line, r->epoch,
                  epoch);
    ck_assert_msg(r->contributors == W, "line %d: pull_reply contributors %u, wanted %d", line,
                  r->contributors, W);
    ck_assert_msg(r->codec != NULL && r->codec->format == t->pull_fmt &&
                      r->codec->block == t->pull_block,
                  "line %d: pull_reply codec %d/%u, wanted %d/%u", line,
                  r->codec ? (int)r->codec->format : -1, r->codec ? r->codec->block : 0,
                  (int)t->pull_fmt, t->pull_block);
    ck_assert_msg(s->orig != NULL && s->off == 0 && s->len == want_len,
                  "line %d: pull_reply payload buf %p off %zu len %zu, wanted len %zu", line,
                  (void *)s->orig, s->off, s->len, want_len);
    return s;
}
#define EXPECT_REPLY(fp, key, chunk, step, epoch, seq)                                             \
    expect_reply_at((fp), (key), (chunk), (step), (epoch), (seq), __LINE__)

static void expect_bytes_at(const sent_t *s, const uint8_t *want, size_t len, int line)
{
    size_t first = 0;
    ck_assert_msg(s->len == len, "line %d: payload of %zu bytes, wanted %zu", line, s->len, len);
    ck_assert_ptr_nonnull(s->copy);
    if (memcmp(s->copy, want, len) != 0) {
        while (first < len && s->copy[first] == want[first])
            first++;
        ck_abort_msg("line %d: payload differs from the reference at byte %zu of %zu (0x%02x, "
                     "wanted 0x%02x)",
                     line, first, len, s->copy[first], want[first]);
    }
    /* The buffer must still hold those bytes while a write references it. */
    if (s->buf != NULL)
        ck_assert_msg(memcmp(s->buf->data + s->off, s->copy, len) == 0,
                      "line %d: a buffer changed while a write held it", line);
}
#define EXPECT_BYTES(s, want, len) expect_bytes_at((s), (want), (len), __LINE__)

static int sketch_raw(fake_t *fp, uint32_t key, uint64_t step, uint32_t epoch, double trace,
                      uint32_t din, uint32_t ks, const void *y, size_t len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Sketch m = GIFT__SKETCH__INIT;
    gift_test_fill_sketch(&env, &m, key, step, epoch, trace, din, ks, g_seq++);
    return feed(fp, &env, y, len);
}

static void expect_sketch_ack_at(fake_t *fp, uint32_t key, uint64_t step, int dup, int line)
{
    const Gift__SketchAck *a = take_at(fp, GIFT__ENVELOPE__MSG_SKETCH_ACK, line)->env->sketch_ack;
    ck_assert_msg(a->key == key && a->step == step && a->seq == g_seq - 1,
                  "line %d: sketch_ack key %u step %" PRIu64 " seq %" PRIu64, line, a->key, a->step,
                  a->seq);
    ck_assert_msg(a->duplicate == (dup != 0), "line %d: sketch_ack duplicate=%d, wanted %d", line,
                  (int)a->duplicate, dup);
}

static int georeq_raw(fake_t *fp, uint32_t key, size_t payload_len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__GeometryRequest m = GIFT__GEOMETRY_REQUEST__INIT;
    uint8_t junk[8] = {0};
    m.key = key;
    m.seq = g_seq++;
    env.msg_case = GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST;
    env.geometry_request = &m;
    return feed(fp, &env, payload_len ? junk : NULL, payload_len);
}

static int stats_raw(fake_t *fp, size_t payload_len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest m = GIFT__STATS_REQUEST__INIT;
    uint8_t junk[8] = {0};
    m.seq = g_seq++;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &m;
    return feed(fp, &env, payload_len ? junk : NULL, payload_len);
}

static const Gift__Stats *stats_at(fake_t *fp, int line)
{
    const Gift__Stats *st;
    int rc = stats_raw(fp, 0);
    ck_assert_msg(rc == 0, "line %d: stats returned %d", line, rc);
    st = take_at(fp, GIFT__ENVELOPE__MSG_STATS, line)->env->stats;
    ck_assert_msg(st->seq == g_seq - 1, "line %d: stats seq %" PRIu64, line, st->seq);
    return st;
}
#define STATS(fp) stats_at((fp), __LINE__)

static const gift_shard_counters_t *C(void)
{
    return gift_shard_counters(S);
}

/* Checks that no error of any code was counted except the listed ones. */
static void expect_errors_at(int line, int n, ...)
{
    uint64_t want[32] = {0};
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        int code = va_arg(ap, int);
        int cnt = va_arg(ap, int);
        want[-code] = (uint64_t)cnt;
    }
    va_end(ap);
    for (int i = 0; i < 32; i++)
        ck_assert_msg(C()->errors[i] == want[i],
                      "line %d: errors[%d] (%s) = %" PRIu64 ", wanted %" PRIu64, line, i,
                      gift_strerror(-i), C()->errors[i], want[i]);
}
#define EXPECT_ERRORS(...) expect_errors_at(__LINE__, __VA_ARGS__)

/* ------------------------------------------------------------------ */
/* Fixtures                                                              */
/* ------------------------------------------------------------------ */

static void fx_base(void)
{
    gift_shard_opts_t o;
    memset(&o, 0, sizeof o);
    o.shard_id = 0;
    o.num_shards = 1;
    o.max_parked = 64;
    shard_open(&o);
    g_t = NULL;
    g_nt = 0;
    g_c = NULL;
    g_nc = 0;
}

static void fx_hello(void)
{
    fx_base();
    hello_all();
}

static void fx_std_declare(void);

/* Every rank said hello and declared the standard list. */
static void fx_std(void)
{
    fx_base();
    fx_std_declare();
}

static void fx_std_declare(void)
{
    hello_all();
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], STD_T, STD_NT, STD_C, STD_NC);
}

static void fx_teardown(void)
{
    shard_close();
    g_eager = 0;
    g_pull_ef = 0;
}

static void fx_std_eager(void)
{
    g_eager = 1;
    fx_std();
}

static void fx_hello_eager(void)
{
    g_eager = 1;
    fx_hello();
}

/* Replaces the fixture's shard by one with other options. */
static void reopen(const gift_shard_opts_t *o)
{
    shard_close();
    shard_open(o);
}

/* ------------------------------------------------------------------ */
/* Hello                                                                 */
/* ------------------------------------------------------------------ */

START_TEST(test_hello_ack)
{
    const Gift__HelloAck *a;
    ck_assert_int_eq(hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 2, W, NULL, 0), 0);
    a = take_at(&P[0], GIFT__ENVELOPE__MSG_HELLO_ACK, __LINE__)->env->hello_ack;
    ck_assert_msg(a->protocol_version == GIFT_PROTOCOL_VERSION, "version %u", a->protocol_version);
    ck_assert_msg(a->world_size == W, "world %u", a->world_size);
    ck_assert_msg(a->shard_id == 0 && a->num_shards == 1, "shard %u of %u", a->shard_id,
                  a->num_shards);
    ck_assert_msg(a->max_frame_bytes == GIFT_MAX_FRAME_DEFAULT, "max_frame_bytes %" PRIu64,
                  a->max_frame_bytes);
    ck_assert_msg(a->server_version && strcmp(a->server_version, GIFT_CODEC_VERSION) == 0,
                  "server_version %s", a->server_version ? a->server_version : "(null)");
    /* A Hello alone does not fix the world size: the first Declare does. */
    ck_assert_msg(gift_shard_world_size(S) == 0, "world %u after a Hello",
                  gift_shard_world_size(S));
    ck_assert_msg(C()->peers == NPEER, "peers %u", C()->peers);
    ck_assert(gift_shard_ready(S) == 1);
    QUIET_ALL();
}
END_TEST

START_TEST(test_hello_version)
{
    int rc = hello_raw(&P[0], GIFT_PROTOCOL_VERSION + 1, 0, W, NULL, 0);
    ck_assert_msg(rc == GIFT_EVERSION, "rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EVERSION, 1);
    /* A closing peer is ignored: nothing answered, nothing counted. */
    rc = hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 0, W, NULL, 0);
    ck_assert_msg(rc == GIFT_ECLOSED, "handle on a closing peer returned %d", rc);
    EXPECT_QUIET(&P[0]);
    rc = hello_raw(&P[1], 0, 0, W, NULL, 0);
    ck_assert_msg(rc == GIFT_EVERSION, "version 0: rc %d", rc);
    EXPECT_ERROR(&P[1], GIFT_EVERSION, 1);
    EXPECT_ERRORS(1, GIFT_EVERSION, 2);
    /* A refused version does not fix the world size. */
    HELLO(&P[2], 0, 2);
}
END_TEST

START_TEST(test_hello_world)
{
    int rc = hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 0, 0, NULL, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "world 0: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EWORLD, 1);
    rc = hello_raw(&P[1], GIFT_PROTOCOL_VERSION, 0, 65537, NULL, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "world 65537: rc %d", rc);
    EXPECT_ERROR(&P[1], GIFT_EWORLD, 1);
    HELLO(&P[2], 3, W);
    /* rank >= world */
    rc = hello_raw(&P[3], GIFT_PROTOCOL_VERSION, W, W, NULL, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "rank %d of %d: rc %d", W, W, rc);
    EXPECT_ERROR(&P[3], GIFT_EWORLD, 1);
    /* Before a Declare a Hello of another world size is taken, and refused
     * once the peer acts as its rank after P[2]'s Declare fixed W. */
    HELLO(&P[6], 1, 2 * W);
    DECLARE_OK(&P[2], STD_T, STD_NT, STD_C, STD_NC);
    ck_assert_msg(gift_shard_world_size(S) == W, "world %u after the Declare",
                  gift_shard_world_size(S));
    rc = declare_raw(&P[6], STD_T, STD_NT, STD_C, STD_NC, 0, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "declare from a Hello of world %d: rc %d", 2 * W, rc);
    EXPECT_ERROR(&P[6], GIFT_EWORLD, 1);
    /* world mismatch between peers */
    rc = hello_raw(&P[4], GIFT_PROTOCOL_VERSION, 1, 2 * W, NULL, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "world %d after %d: rc %d", 2 * W, W, rc);
    EXPECT_ERROR(&P[4], GIFT_EWORLD, 1);
    rc = hello_raw(&P[5], GIFT_PROTOCOL_VERSION, 0, 1, NULL, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "world 1 after %d: rc %d", W, rc);
    EXPECT_ERROR(&P[5], GIFT_EWORLD, 1);
    /* The same rank on a second connection may say Hello (one that acts as
     * the rank while the first is live is refused: test_hostile_rank). */
    HELLO(&P[7], 3, W);
    ck_assert_msg(gift_shard_world_size(S) == W, "world %u", gift_shard_world_size(S));
    EXPECT_ERRORS(1, GIFT_EWORLD, 6);
    QUIET_ALL();
}
END_TEST

START_TEST(test_hello_world_configured)
{
    gift_shard_opts_t o = O;
    int rc;
    o.world_size = 3;
    o.shard_id = 1;
    o.num_shards = 2;
    reopen(&o);
    rc = hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 0, W, NULL, 0);
    ck_assert_msg(rc == GIFT_EWORLD, "world %d on a shard configured for 3: rc %d", W, rc);
    EXPECT_ERROR(&P[0], GIFT_EWORLD, 1);
    HELLO(&P[1], 2, 3);
    ck_assert_msg(gift_shard_world_size(S) == 3, "world %u", gift_shard_world_size(S));
}
END_TEST

START_TEST(test_before_hello)
{
    static const cdesc_t c[] = {{0, 0, 0, 7}};
    float x[7 * 13] = {0};
    int rc;
    g_t = STD_T;
    g_nt = STD_NT;
    g_c = STD_C;
    g_nc = STD_NC;

    rc = declare_raw(&P[0], STD_T, 1, c, 1, 0, 0);
    ck_assert_msg(rc == GIFT_EPROTO, "declare before hello: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EPROTO, 1);
    rc = push_x(&P[1], 0, 0, 0, 0, x);
    ck_assert_msg(rc == GIFT_EPROTO, "push before hello: rc %d", rc);
    EXPECT_ERROR(&P[1], GIFT_EPROTO, 1);
    rc = pull_raw(&P[2], 0, 0, 0, 0, 0);
    ck_assert_msg(rc == GIFT_EPROTO, "pull before hello: rc %d", rc);
    EXPECT_ERROR(&P[2], GIFT_EPROTO, 1);
    rc = sketch_raw(&P[3], 0, 0, 0, 1.0, 13, 4, x, 13 * 4 * 4);
    ck_assert_msg(rc == GIFT_EPROTO, "sketch before hello: rc %d", rc);
    EXPECT_ERROR(&P[3], GIFT_EPROTO, 1);
    rc = georeq_raw(&P[4], 0, 0);
    ck_assert_msg(rc == GIFT_EPROTO, "geometry request before hello: rc %d", rc);
    EXPECT_ERROR(&P[4], GIFT_EPROTO, 1);
    rc = stats_raw(&P[5], 0);
    ck_assert_msg(rc == GIFT_EPROTO, "stats before hello: rc %d", rc);
    EXPECT_ERROR(&P[5], GIFT_EPROTO, 1);
    EXPECT_ERRORS(1, GIFT_EPROTO, 6);
    ck_assert_msg(C()->frames_in == 6, "frames_in %" PRIu64, C()->frames_in);
    QUIET_ALL();
}
END_TEST

START_TEST(test_second_hello)
{
    int rc;
    HELLO(&P[0], 0, W);
    rc = hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 0, W, NULL, 0);
    ck_assert_msg(rc == GIFT_EPROTO, "second hello: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EPROTO, 1);
    /* After the fatal error the connection takes nothing more. */
    rc = stats_raw(&P[0], 0);
    ck_assert_msg(rc == GIFT_ECLOSED, "stats on a closing peer: rc %d", rc);
    EXPECT_QUIET(&P[0]);
}
END_TEST

START_TEST(test_payload_on_bare_messages)
{
    int rc;
    HELLO(&P[0], 0, W);
    rc = declare_raw(&P[0], STD_T, STD_NT, STD_C, STD_NC, 0, 24);
    ck_assert_msg(rc == GIFT_EPROTO, "declare with a payload: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EPROTO, 1);
    ck_assert_msg(gift_shard_tensor_count(S) == 0, "the declare with a payload was applied");
    HELLO(&P[1], 1, W);
    rc = stats_raw(&P[1], 8);
    ck_assert_msg(rc == GIFT_EPROTO, "stats request with a payload: rc %d", rc);
    EXPECT_ERROR(&P[1], GIFT_EPROTO, 1);
    HELLO(&P[4], 0, W);
    DECLARE_OK(&P[4], STD_T, STD_NT, STD_C, STD_NC);
    PUSH_GRAD(&P[4], 0, 0, 0, 0, 0);
    HELLO(&P[2], 2, W);
    rc = pull_raw(&P[2], 0, 0, 0, 0, 16);
    ck_assert_msg(rc == GIFT_EPROTO, "pull with a payload: rc %d", rc);
    EXPECT_ERROR(&P[2], GIFT_EPROTO, 1);
    HELLO(&P[3], 3, W);
    rc = georeq_raw(&P[3], 0, 8);
    ck_assert_msg(rc == GIFT_EPROTO, "geometry request with a payload: rc %d", rc);
    EXPECT_ERROR(&P[3], GIFT_EPROTO, 1);
    /* Nothing was parked for the refused pull: finishing the step sends P[2] nothing. */
    for (int r = 1; r < W; r++) {
        HELLO(&P[4 + r], (uint32_t)r, W);
        PUSH_GRAD(&P[4 + r], 0, 0, 0, (uint32_t)r, 0);
    }
    ck_assert_msg(C()->steps_finished == 1, "steps_finished %" PRIu64, C()->steps_finished);
    EXPECT_ERRORS(1, GIFT_EPROTO, 4);
    QUIET_ALL();
}
END_TEST

START_TEST(test_server_messages_from_client)
{
    static const Gift__Envelope__MsgCase server_only[] = {
        GIFT__ENVELOPE__MSG_HELLO_ACK,  GIFT__ENVELOPE__MSG_DECLARE_ACK,
        GIFT__ENVELOPE__MSG_PUSH_ACK,   GIFT__ENVELOPE__MSG_PULL_REPLY,
        GIFT__ENVELOPE__MSG_SKETCH_ACK, GIFT__ENVELOPE__MSG_GEOMETRY,
        GIFT__ENVELOPE__MSG_ERROR,      GIFT__ENVELOPE__MSG_STATS};
    Gift__HelloAck ha = GIFT__HELLO_ACK__INIT;
    Gift__DeclareAck da = GIFT__DECLARE_ACK__INIT;
    Gift__PushAck pa = GIFT__PUSH_ACK__INIT;
    Gift__PullReply pr = GIFT__PULL_REPLY__INIT;
    Gift__SketchAck sa = GIFT__SKETCH_ACK__INIT;
    Gift__Geometry ge = GIFT__GEOMETRY__INIT;
    Gift__Error er = GIFT__ERROR__INIT;
    Gift__Stats st = GIFT__STATS__INIT;
    void *msgs[] = {&ha, &da, &pa, &pr, &sa, &ge, &er, &st};

    /* Each message is fatal: one connection (of NPEER == 8) per message. */
    for (int k = 0; k < NPEER; k++)
        HELLO(&P[k], (uint32_t)(k % W), W);
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    for (size_t i = 0; i < sizeof server_only / sizeof server_only[0]; i++) {
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        fake_t *fp = &P[i];
        int rc;
        env.msg_case = server_only[i];
        env.hello_ack = msgs[i]; /* the oneof members share one pointer */
        rc = feed(fp, &env, NULL, 0);
        ck_assert_msg(rc == GIFT_EPROTO, "client sent %s: rc %d", gift_msg_name(&env), rc);
        EXPECT_ERROR(fp, GIFT_EPROTO, 1);
    }
    EXPECT_ERRORS(1, GIFT_EPROTO, 8);
}
END_TEST

START_TEST(test_hello_digest)
{
    uint8_t dg[8];
    int rc;
    hello_all();
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    gift_digest_bytes(digest_of(STD_T, STD_NT), dg);
    ck_assert_int_eq(hello_raw(&P[4], GIFT_PROTOCOL_VERSION, 1, W, dg, 8), 0);
    take_at(&P[4], GIFT__ENVELOPE__MSG_HELLO_ACK, __LINE__);
    dg[0] ^= 1;
    rc = hello_raw(&P[5], GIFT_PROTOCOL_VERSION, 1, W, dg, 8);
    ck_assert_msg(rc == GIFT_EDIGEST, "hello with a wrong digest: rc %d", rc);
    EXPECT_ERROR(&P[5], GIFT_EDIGEST, 1);
    rc = hello_raw(&P[6], GIFT_PROTOCOL_VERSION, 1, W, dg, 4);
    ck_assert_msg(rc == GIFT_EDIGEST, "hello with a 4-byte digest: rc %d", rc);
    EXPECT_ERROR(&P[6], GIFT_EDIGEST, 1);
    /* An empty digest (a worker that has not declared yet) is accepted. */
    HELLO(&P[7], 2, W);
    QUIET_ALL();
}
END_TEST

START_TEST(test_reject)
{
    int rc;
    HELLO(&P[0], 0, W);
    gift_shard_reject(S, P[0].p, GIFT_EBADMAGIC, "bad magic");
    {
        const Gift__Error *e = EXPECT_ERROR(&P[0], GIFT_EBADMAGIC, 1);
        ck_assert_msg(strstr(e->text, "bad magic") != NULL, "text \"%s\"", e->text);
    }
    gift_shard_reject(S, P[1].p, GIFT_EFRAMESIZE, NULL);
    EXPECT_ERROR(&P[1], GIFT_EFRAMESIZE, 1);
    rc = stats_raw(&P[0], 0);
    ck_assert_msg(rc == GIFT_ECLOSED, "rc %d", rc);
    EXPECT_ERRORS(2, GIFT_EBADMAGIC, 1, GIFT_EFRAMESIZE, 1);
    QUIET_ALL();
}
END_TEST

/* ------------------------------------------------------------------ */
/* Declare                                                               */
/* ------------------------------------------------------------------ */

START_TEST(test_declare_redeclare)
{
    cdesc_t shuffled[STD_NC];
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    ck_assert_msg(gift_shard_tensor_count(S) == STD_NT, "tensor count %zu",
                  gift_shard_tensor_count(S));
    /* Identical from another peer. */
    DECLARE_OK(&P[1], STD_T, STD_NT, STD_C, STD_NC);
    /* The same chunks in another order: the same placement. */
    for (size_t i = 0; i < STD_NC; i++)
        shuffled[i] = STD_C[STD_NC - 1 - i];
    DECLARE_OK(&P[2], STD_T, STD_NT, shuffled, STD_NC);
    /* Again on a connection that declared already. */
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    EXPECT_ERRORS(0);
    QUIET_ALL();
}
END_TEST

START_TEST(test_declare_digest_mismatch)
{
    int rc = declare_raw(&P[0], STD_T, STD_NT, STD_C, STD_NC, 1, 0);
    ck_assert_msg(rc == 0, "a bad digest must not be fatal: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EDIGEST, 0);
    rc = declare_raw(&P[0], STD_T, STD_NT, STD_C, STD_NC, 2, 0);
    ck_assert_msg(rc == 0, "a short digest must not be fatal: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_EDIGEST, 0);
    ck_assert_msg(gift_shard_tensor_count(S) == 0, "a declare with a bad digest was applied");
    /* The connection goes on. */
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    EXPECT_ERRORS(1, GIFT_EDIGEST, 2);
}
END_TEST

START_TEST(test_declare_differs)
{
    tdesc_t t[STD_NT];
    cdesc_t c[STD_NC];
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);

    /* A renamed tensor. */
    memcpy(t, STD_T, sizeof t);
    t[3].name = "layers.0.renamed";
    DECLARE_ERR(&P[1], t, STD_NT, STD_C, STD_NC, GIFT_EDIGEST);
    /* Another codec block. */
    memcpy(t, STD_T, sizeof t);
    t[2].push_block = 64;
    DECLARE_ERR(&P[1], t, STD_NT, STD_C, STD_NC, GIFT_EDIGEST);
    /* One tensor fewer. */
    DECLARE_ERR(&P[1], STD_T, STD_NT - 1, STD_C, STD_NC - 2, GIFT_EDIGEST);
    /* The same list, the split tensor cut at another row. */
    memcpy(c, STD_C, sizeof c);
    c[5].rows = 5;
    c[6].row_begin = 5;
    c[6].rows = 5;
    DECLARE_ERR(&P[2], STD_T, STD_NT, c, STD_NC, GIFT_EDIGEST);
    /* The same list, one chunk fewer. */
    DECLARE_ERR(&P[2], STD_T, STD_NT, STD_C, STD_NC - 1, GIFT_EDIGEST);
    /* The same list, chunk ids swapped. */
    memcpy(c, STD_C, sizeof c);
    c[5].chunk = 1;
    c[6].chunk = 0;
    DECLARE_ERR(&P[2], STD_T, STD_NT, c, STD_NC, GIFT_EDIGEST);
    /* Refusals changed nothing. */
    ck_assert_msg(gift_shard_tensor_count(S) == STD_NT, "tensor count %zu",
                  gift_shard_tensor_count(S));
    DECLARE_OK(&P[3], STD_T, STD_NT, STD_C, STD_NC);
    EXPECT_ERRORS(1, GIFT_EDIGEST, 6);
    ck_assert_msg(P[1].closed == 0 && P[2].closed == 0, "a refused declare closed a peer");
}
END_TEST

START_TEST(test_declare_invalid)
{
    tdesc_t t[3];
    cdesc_t c[4];
    static const tdesc_t base[3] = {
        {0, "a", 4, 8, F32, 0, F32, 0, 0, 0, 0, 0, 0},
        {1, "b", 6, 64, E4M3, 32, BF16, 0, 1, 8, 12, 10, 77},
        {2, "c", 2, 3, NVFP4, 0, E5M2, 64, 0, 0, 0, 0, 0},
    };
    static const cdesc_t cbase[4] = {{0, 0, 0, 4}, {1, 0, 0, 3}, {1, 1, 3, 3}, {2, 0, 0, 2}};
    int n = 0;

#define RESET() (memcpy(t, base, sizeof t), memcpy(c, cbase, sizeof c))
#define REFUSE(code)                                                                               \
    do {                                                                                           \
        DECLARE_ERR(&P[0], t, 3, c, 4, (code));                                                    \
        ck_assert_msg(gift_shard_tensor_count(S) == 0,                                             \
                      "line %d: refused declare kept %zu tensors", __LINE__,                       \
                      gift_shard_tensor_count(S));                                                 \
        n++;                                                                                       \
    } while (0)

    DECLARE_ERR(&P[0], base, 0, NULL, 0, GIFT_EINVAL); /* empty list */
    n++;
    RESET();
    t[0].key = 1;
    t[1].key = 0;
    REFUSE(GIFT_EINVAL); /* keys out of order */
    RESET();
    t[2].key = 5;
    REFUSE(GIFT_EINVAL); /* a gap */
    RESET();
    t[0].rows = 0;
    REFUSE(GIFT_ESHAPE);
    RESET();
    t[2].cols = 0;
    REFUSE(GIFT_ESHAPE);
    RESET();
    t[0].rows = 1u << 21;
    t[0].cols = 1u << 20;
    REFUSE(GIFT_ESHAPE); /* 2^41 elements */
    RESET();
    t[0].push_fmt = (Gift__Format)9;
    REFUSE(GIFT_ECODEC);
    RESET();
    t[2].pull_fmt = (Gift__Format)5;
    REFUSE(GIFT_ECODEC);
    RESET();
    t[1].push_block = 48;
    REFUSE(GIFT_ECODEC); /* not a power of two */
    RESET();
    t[1].push_block = 16;
    REFUSE(GIFT_ECODEC); /* below 32 */
    RESET();
    t[2].pull_block = 1u << 21;
    REFUSE(GIFT_ECODEC); /* above 2^20 */
    RESET();
    t[1].rank = 65;
    REFUSE(GIFT_ESHAPE); /* rank > din */
    RESET();
    t[1].basis_cols = 7;
    REFUSE(GIFT_ESHAPE); /* ks < k */
    RESET();
    t[1].basis_cols = 65;
    REFUSE(GIFT_ESHAPE); /* ks > din */
    RESET();
    t[1].cols = 1;
    t[1].rank = 1;
    t[1].basis_cols = 1;
    REFUSE(GIFT_ESHAPE); /* din 1 */
    RESET();
    c[3].key = 3;
    REFUSE(GIFT_ENOKEY); /* chunk of an unknown tensor */
    RESET();
    c[0].rows = 0;
    REFUSE(GIFT_ESHAPE);
    RESET();
    c[2].rows = 4;
    REFUSE(GIFT_ESHAPE); /* rows 3..7 of 6 */
    RESET();
    c[2].row_begin = 0xFFFFFFFFu;
    REFUSE(GIFT_ESHAPE); /* no 32-bit wrap */
    RESET();
    c[2].chunk = 0;
    REFUSE(GIFT_EINVAL); /* declared twice */
    /* Failing after the geometry owner's chunk was placed frees what was made. */
    RESET();
    c[3].rows = 3;
    REFUSE(GIFT_ESHAPE);
    /* A chunk above max_frame_bytes is refused before anything is allocated:
     * 4100 x 4100 f32 = 67,240,000 bytes > 64 MiB. */
    RESET();
    t[0].rows = 4100;
    t[0].cols = 4100;
    c[0].rows = 4100;
    REFUSE(GIFT_ESHAPE);
    /* The same tensor in two chunks is fine. */
    RESET();
    DECLARE_OK(&P[0], t, 3, c, 4);
    EXPECT_ERRORS(4, GIFT_EINVAL, 4, GIFT_ESHAPE, 12, GIFT_ECODEC, 5, GIFT_ENOKEY, 1);
    ck_assert_msg(n == 22, "%d refusals", n);
    ck_assert_msg(P[0].closed == 0, "a refused declare closed the peer");
#undef RESET
#undef REFUSE
}
END_TEST

/* Chunk ids at the top of their range: the id 2^32-1 that once wrapped the
 * chunk index to zero entries (a remote crash) is refused, and a sparse id
 * near 2^32 costs one index entry, not a table as large as its value. */
START_TEST(test_declare_chunk_id_bounds)
{
    static const tdesc_t t[1] = {{0, "tall", 0xFFFFFFFFu, 1, F32, 0, F32, 0, 0, 0, 0, 0, 0}};
    static const cdesc_t wrap[1] = {{0, 0xFFFFFFFFu, 0xFFFFFFFEu, 1}};
    static const cdesc_t sparse[2] = {{0, 0xFFFFFFFEu, 0xFFFFFFFEu, 1}, {0, 1u << 26, 1u << 26, 1}};
    float x[1] = {0};
    uint8_t junk[4] = {0};

    DECLARE_ERR(&P[0], t, 1, wrap, 1, GIFT_ESHAPE);
    ck_assert_msg(gift_shard_tensor_count(S) == 0, "refused declare kept %zu tensors",
                  gift_shard_tensor_count(S));
    DECLARE_OK(&P[0], t, 1, sparse, 2);
    /* Both sparse chunks are found; an id between them is not. */
    for (int r = 0; r < W; r++) {
        x[0] = (float)(r + 1);
        push_ok_at(&P[r], 0, 0xFFFFFFFEu, 0, 0, x, 0, __LINE__);
        push_ok_at(&P[r], 0, 1u << 26, 0, 0, x, 0, __LINE__);
    }
    ck_assert_int_eq(push_raw(&P[0], 0, 5, 0, 0, F32, 0, junk, 4), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    ck_assert_msg(C()->steps_finished == 2, "steps_finished %" PRIu64 ", wanted 2",
                  C()->steps_finished);
    EXPECT_ERRORS(2, GIFT_ESHAPE, 1, GIFT_ENOKEY, 1);
    QUIET_ALL();
}
END_TEST

/* max_memory: a Declare needing more is refused before anything is
 * allocated, naming the figure; a small one is taken and its bytes counted. */
START_TEST(test_declare_memory_budget)
{
    static const tdesc_t big[1] = {{0, "big", 1024, 1024, F32, 0, F32, 0, 0, 0, 0, 0, 0}};
    static const cdesc_t bigc[1] = {{0, 0, 0, 1024}};
    gift_shard_opts_t o = O;
    const Gift__Error *e;
    o.max_memory = 1u << 20;
    reopen(&o);
    hello_all();
    ck_assert_int_eq(declare_raw(&P[0], big, 1, bigc, 1, 0, 0), 0);
    e = expect_error_at(&P[0], GIFT_ENOMEM, 0, __LINE__);
    ck_assert_msg(strstr(e->text, "max_memory is 1048576 bytes") != NULL &&
                      strstr(e->text, "--max-memory") != NULL,
                  "budget error text: %s", e->text);
    ck_assert_msg(gift_shard_tensor_count(S) == 0 && gift_shard_world_size(S) == 0 &&
                      gift_shard_memory_committed(S) == 0,
                  "a refused declare kept %zu tensors, world %u, %" PRIu64 " bytes",
                  gift_shard_tensor_count(S), gift_shard_world_size(S),
                  gift_shard_memory_committed(S));
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    ck_assert_msg(gift_shard_memory_committed(S) > 0 &&
                      gift_shard_memory_committed(S) <= o.max_memory,
                  "committed %" PRIu64 " bytes", gift_shard_memory_committed(S));
    EXPECT_ERRORS(1, GIFT_ENOMEM, 1);
}
END_TEST

/* One connection may park at most max_parked_per_peer pulls; others still park. */
START_TEST(test_park_share)
{
    gift_shard_opts_t o = O;
    float x[7 * 13] = {0};
    o.max_parked_per_peer = 3;
    reopen(&o);
    fx_std_declare();
    push_ok_at(&P[1], 0, 0, 0, 0, x, 0, __LINE__);
    for (int i = 0; i < 3; i++)
        PULL(&P[0], 0, 0, 0);
    PULL_ERR(&P[0], 0, 0, 0, GIFT_EBUSY);
    PULL(&P[2], 0, 0, 0);
    EXPECT_QUIET(&P[2]);
    EXPECT_ERRORS(1, GIFT_EBUSY, 1);
}
END_TEST

/* One live connection per rank (no authentication): a second connection
 * acting as rank 1 is refused; once the first is gone, it may. */
START_TEST(test_rank_one_connection)
{
    float x[7 * 13] = {0};
    int rc;
    HELLO(&P[4], 1, W);
    rc = push_x(&P[4], 0, 0, 0, 0, x);
    ck_assert_msg(rc == GIFT_EBUSY, "push from a second connection of rank 1: rc %d", rc);
    EXPECT_ERROR(&P[4], GIFT_EBUSY, 1);
    push_ok_at(&P[1], 0, 0, 0, 0, x, 0, __LINE__);
    peer_gone(&P[1]);
    HELLO(&P[5], 1, W);
    push_ok_at(&P[5], 0, 0, 0, 0, x, 1, __LINE__); /* a replay: acknowledged, ignored */
    EXPECT_ERRORS(1, GIFT_EBUSY, 1);
}
END_TEST

START_TEST(test_before_declare)
{
    float x[7 * 13] = {0};
    const Gift__Stats *st;
    int rc;
    g_t = STD_T;
    g_nt = STD_NT;
    g_c = STD_C;
    g_nc = STD_NC;

    rc = push_x(&P[0], 0, 0, 0, 0, x);
    ck_assert_msg(rc == 0, "push before declare must not be fatal: rc %d", rc);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    ck_assert_int_eq(pull_raw(&P[0], 0, 0, 0, 0, 0), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    ck_assert_int_eq(sketch_raw(&P[0], 0, 0, 0, 1.0, 13, 4, x, 13 * 4 * 4), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    /* Stats work before any declare. */
    st = STATS(&P[1]);
    ck_assert_msg(st->n_tensors == 0 && st->connections == NPEER,
                  "stats: %zu tensors, %u connections", st->n_tensors, st->connections);
    EXPECT_ERRORS(1, GIFT_ENOKEY, 4);
    ck_assert_msg(C()->pushes == 0, "pushes %" PRIu64, C()->pushes);

    /* After the declare: unknown tensors and chunks. */
    DECLARE_OK(&P[1], STD_T, STD_NT, STD_C, STD_NC);
    {
        uint8_t junk[64] = {0};
        ck_assert_int_eq(push_raw(&P[0], (uint32_t)STD_NT, 0, 0, 0, F32, 0, junk, 64), 0);
        EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
        ck_assert_int_eq(push_raw(&P[0], 5, 2, 0, 0, F32, 0, junk, 64), 0);
        EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
        ck_assert_int_eq(push_raw(&P[0], 0, 1, 0, 0, F32, 0, junk, 64), 0);
        EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    }
    PULL_ERR(&P[0], 99, 0, 0, GIFT_ENOKEY);
    PULL_ERR(&P[0], 4, 1, 0, GIFT_ENOKEY);
    /* A pull of a declared chunk before any push of it. */
    PULL_ERR(&P[0], 0, 0, 0, GIFT_ESTEP);
    /* Geometry of a tensor without geometry. */
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    EXPECT_ERRORS(2, GIFT_ENOKEY, 10, GIFT_ESTEP, 1);
    QUIET_ALL();
}
END_TEST

/* ------------------------------------------------------------------ */
/* Sync aggregation                                                      */
/* ------------------------------------------------------------------ */

static void perms4(int out[24][4])
{
    int k = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 4; d++)
                    if (a != b && a != c && a != d && b != c && b != d && c != d) {
                        out[k][0] = a;
                        out[k][1] = b;
                        out[k][2] = c;
                        out[k][3] = d;
                        k++;
                    }
    ck_assert_int_eq(k, 24);
}

/* Relative L2 distance of the decoded pull payload from the exact mean. */
static double rel_l2(const tdesc_t *t, const uint8_t *payload, size_t len, size_t n,
                     const double *exact, float *got)
{
    gift_codec_params_t q = params_of(t->pull_fmt, t->pull_block);
    double num = 0, den = 0;
    ck_assert_int_eq(gift_decode(&q, payload, len, n, got), 0);
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - exact[i]) * ((double)got[i] - exact[i]);
        den += exact[i] * exact[i];
    }
    return sqrt(num / den);
}

static double pull_tolerance(Gift__Format f)
{
    switch (f) {
    case F32:
        return 1e-6;
    case BF16:
        return 1.0 / 256; /* half an ulp of 8 significant bits, relative */
    case E4M3:
        return 1.0 / 16;
    case E5M2:
        return 1.0 / 8;
    default:
        return 0.25; /* nvfp4 */
    }
}

START_TEST(test_sync_all_orders)
{
    int perm[24][4];
    size_t maxn = 0;
    perms4(perm);
    for (size_t ci = 0; ci < STD_NC; ci++)
        if (chunk_n(&STD_C[ci]) > maxn)
            maxn = chunk_n(&STD_C[ci]);
    {
        double *exact = malloc(maxn * sizeof *exact), *mag = malloc(maxn * sizeof *mag);
        float *got = malloc(maxn * sizeof *got);
        double worst[5] = {0};
        ck_assert(exact && mag && got);

        for (uint64_t step = 0; step < 24; step++) {
            const int *o = perm[step];
            uint64_t v = step & 1; /* neighbouring steps hold different data */
            for (size_t ci = 0; ci < STD_NC; ci++) {
                const cdesc_t *c = &STD_C[ci];
                const tdesc_t *t = tensor_of(c->key);
                size_t n = chunk_n(c), rlen;
                uint64_t seq[W];
                sent_t *rep[W];
                uint8_t *ref;

                /* o[0] pulls before anything of this step arrived (parked),
                 * except at step 0, where a pull before the first push is refused. */
                if (step > 0)
                    seq[o[0]] = PULL(&P[o[0]], c->key, c->chunk, step);
                for (int i = 0; i < W; i++) {
                    int r = o[i];
                    push_grad_at(&P[r], c->key, c->chunk, step, 0, (uint32_t)r, v, 0, __LINE__);
                    if (step == 0 && i == 0)
                        seq[o[0]] = PULL(&P[o[0]], c->key, c->chunk, step);
                    if (i == 1) /* o[1] parks after two pushes */
                        seq[o[1]] = PULL(&P[o[1]], c->key, c->chunk, step);
                    if (i < W - 1)
                        QUIET_ALL(); /* no early replies */
                }
                /* The last push finished the step: both parked pulls answered. */
                rep[o[0]] = EXPECT_REPLY(&P[o[0]], c->key, c->chunk, step, 0, seq[o[0]]);
                rep[o[1]] = EXPECT_REPLY(&P[o[1]], c->key, c->chunk, step, 0, seq[o[1]]);
                QUIET_ALL();
                /* Late pulls are answered at once from the kept reply. */
                for (int i = 2; i < W; i++) {
                    seq[o[i]] = PULL(&P[o[i]], c->key, c->chunk, step);
                    rep[o[i]] = EXPECT_REPLY(&P[o[i]], c->key, c->chunk, step, 0, seq[o[i]]);
                }
                QUIET_ALL();

                ref = reference(c->key, c->chunk, v, o, W, &rlen, exact, mag);
                for (int r = 0; r < W; r++) {
                    ck_assert_msg(
                        rep[r]->orig == rep[0]->orig,
                        "step %" PRIu64 " key %u chunk %u: rank %d got buffer %p, rank 0 %p", step,
                        c->key, c->chunk, r, (void *)rep[r]->orig, (void *)rep[0]->orig);
                    EXPECT_BYTES(rep[r], ref, rlen);
                }
                {
                    double e = rel_l2(t, rep[0]->copy, rep[0]->len, n, exact, got);
                    double tol = pull_tolerance(t->pull_fmt);
                    ck_assert_msg(e <= tol,
                                  "step %" PRIu64
                                  " key %u (%s): rel L2 %.3g from the exact mean, tolerance %.3g",
                                  step, c->key, t->name, e, tol);
                    if (e > worst[t->pull_fmt])
                        worst[t->pull_fmt] = e;
                    if (t->pull_fmt == F32)
                        for (size_t j = 0; j < n; j++)
                            ck_assert_msg(fabs((double)got[j] - exact[j]) <= 1e-6 * mag[j],
                                          "step %" PRIu64
                                          " key %u elem %zu: mean %.9g, exact %.12g (scale %.3g)",
                                          step, c->key, j, (double)got[j], exact[j], mag[j]);
                }
                free(ref);
                for (int r = 0; r < W; r++)
                    io_release(&P[r]);
            }
        }
        if (getenv("GIFT_TEST_VERBOSE"))
            printf(
                "worst rel L2 by pull format: f32 %.3g bf16 %.3g e4m3 %.3g e5m2 %.3g nvfp4 %.3g\n",
                worst[0], worst[1], worst[2], worst[3], worst[4]);
        free(exact);
        free(mag);
        free(got);
    }
    ck_assert_msg(C()->pushes == 24 * W * STD_NC, "pushes %" PRIu64, C()->pushes);
    ck_assert_msg(C()->steps_finished == 24 * STD_NC, "steps_finished %" PRIu64,
                  C()->steps_finished);
    ck_assert_msg(C()->pulls == 24 * W * STD_NC, "pulls %" PRIu64, C()->pulls);
    ck_assert_msg(C()->duplicates == 0, "duplicates %" PRIu64, C()->duplicates);
    EXPECT_ERRORS(0);
}
END_TEST

/* The reply buffer is allocated once and reused when no write holds it; a
 * write that still holds it keeps its bytes and the shard takes a new one. */
START_TEST(test_reply_buffer_reuse)
{
    static const int order[W] = {0, 1, 2, 3};
    gift_rbuf_t *b0, *b2, *b4;
    sent_t *s0, *s2, *s4;
    uint64_t seq;
    size_t rlen;
    uint8_t *ref0;

    for (uint64_t step = 0; step < 5; step++) {
        for (int r = 0; r < W; r++)
            PUSH_GRAD(&P[r], 0, 0, step, (uint32_t)r, step);
    }
    /* Steps 3 and 4 are kept; 0..2 are gone. */
    PULL_ERR(&P[0], 0, 0, 2, GIFT_ESTEP);
    seq = PULL(&P[0], 0, 0, 4);
    s4 = EXPECT_REPLY(&P[0], 0, 0, 4, 0, seq);
    b4 = s4->orig;
    io_release(&P[0]);

    /* Step 6 lands in the same reply slot as step 4: nothing holds it, so it is reused. */
    for (uint64_t step = 5; step < 7; step++)
        for (int r = 0; r < W; r++)
            PUSH_GRAD(&P[r], 0, 0, step, (uint32_t)r, step);
    seq = PULL(&P[1], 0, 0, 6);
    s0 = EXPECT_REPLY(&P[1], 0, 0, 6, 0, seq);
    b0 = s0->orig;
    ck_assert_msg(b0 == b4, "step 6 got a new buffer %p although step 4's %p was free", (void *)b0,
                  (void *)b4);
    ref0 = reference(0, 0, 6, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(s0, ref0, rlen);

    /* P[1] still holds step 6's buffer: step 8 must not overwrite it. */
    for (uint64_t step = 7; step < 9; step++)
        for (int r = 0; r < W; r++)
            PUSH_GRAD(&P[r], 0, 0, step, (uint32_t)r, step);
    seq = PULL(&P[2], 0, 0, 8);
    s2 = EXPECT_REPLY(&P[2], 0, 0, 8, 0, seq);
    b2 = s2->orig;
    ck_assert_msg(b2 != b0, "step 8 was encoded into step 6's buffer, which a write still holds");
    ck_assert_msg(memcmp(b0->data, ref0, rlen) == 0, "step 6's bytes changed under a write");
    EXPECT_BYTES(s0, ref0, rlen);
    free(ref0);
    ref0 = reference(0, 0, 8, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(s2, ref0, rlen);
    free(ref0);
    EXPECT_ERRORS(1, GIFT_ESTEP, 1);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Duplicates, window, pipelining                                        */
/* ------------------------------------------------------------------ */

START_TEST(test_duplicates)
{
    static const int order[W] = {0, 1, 2, 3}, order1[W] = {3, 0, 1, 2};
    uint64_t seq[W];
    sent_t *rep;
    size_t rlen;
    uint8_t *ref;

    for (uint32_t key = 0; key < 3; key++) {
        uint64_t dups = C()->duplicates;
        PUSH_GRAD(&P[0], key, 0, 0, 0, 0);
        /* The same rank again, with other data: acknowledged, ignored. */
        PUSH_DUP(&P[0], key, 0, 0, 0, 99);
        PUSH_GRAD(&P[1], key, 0, 0, 1, 0);
        PUSH_GRAD(&P[2], key, 0, 0, 2, 0);
        PUSH_DUP(&P[2], key, 0, 0, 2, 0);
        /* The same rank on a second connection (a reconnect, once the old
         * one is gone: one live connection per rank). */
        peer_gone(&P[1]);
        peer_open(1);
        P[1].gone = 0;
        HELLO(&P[1], 1, W);
        PUSH_DUP(&P[1], key, 0, 0, 1, 98);
        /* A duplicate for base + 1 before anything finished. */
        PUSH_GRAD(&P[3], key, 0, 1, 3, 1);
        PUSH_DUP(&P[3], key, 0, 1, 3, 97);
        ck_assert_msg(C()->steps_finished == 2 * key, "three distinct ranks finished a step");
        seq[0] = PULL(&P[0], key, 0, 0);
        PUSH_GRAD(&P[3], key, 0, 0, 3, 0);
        rep = EXPECT_REPLY(&P[0], key, 0, 0, 0, seq[0]);
        ref = reference(key, 0, 0, order, W, &rlen, NULL, NULL);
        EXPECT_BYTES(rep, ref, rlen);
        /* After the step finished: still a duplicate, the kept reply unchanged. */
        PUSH_DUP(&P[1], key, 0, 0, 1, 96);
        PUSH_DUP(&P[1], key, 0, 0, 1, 0);
        seq[1] = PULL(&P[1], key, 0, 0);
        {
            sent_t *r2 = EXPECT_REPLY(&P[1], key, 0, 0, 0, seq[1]);
            ck_assert_msg(r2->orig == rep->orig, "a duplicate made a new reply buffer");
            EXPECT_BYTES(r2, ref, rlen);
        }
        free(ref);
        /* Finish step 1 so that its duplicate is checked too. */
        for (int r = 0; r < 3; r++)
            PUSH_GRAD(&P[r], key, 0, 1, (uint32_t)r, 1);
        seq[2] = PULL(&P[2], key, 0, 1);
        rep = EXPECT_REPLY(&P[2], key, 0, 1, 0, seq[2]);
        ref = reference(key, 0, 1, order1, W, &rlen, NULL, NULL);
        EXPECT_BYTES(rep, ref, rlen);
        free(ref);
        ck_assert_msg(C()->duplicates - dups == 6,
                      "key %u: %" PRIu64 " duplicates counted, wanted 6", key,
                      C()->duplicates - dups);
        QUIET_ALL();
    }
    ck_assert_msg(C()->pushes == 3 * 2 * W, "pushes %" PRIu64, C()->pushes);
    ck_assert_msg(C()->steps_finished == 6, "steps_finished %" PRIu64, C()->steps_finished);
    EXPECT_ERRORS(0);
}
END_TEST

START_TEST(test_step_window)
{
    static const int order[W] = {0, 1, 2, 3};
    uint64_t s1, s2;
    sent_t *rep;
    size_t rlen;
    uint8_t *ref;

    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 0, (uint32_t)r, 0);
    /* base is 1: steps 1 and 2 are open, 3 is not. */
    PUSH_GRAD(&P[0], 0, 0, 1, 0, 1);
    PUSH_GRAD(&P[0], 0, 0, 2, 0, 2);
    PUSH_ERR(&P[0], 0, 0, 3, 0, 3, GIFT_ESTEP);
    PUSH_ERR(&P[1], 0, 0, 1000, 1, 3, GIFT_ESTEP);
    ck_assert_msg(!P[0].closed && !P[1].closed, "ESTEP closed a connection");
    PULL_ERR(&P[0], 0, 0, 3, GIFT_ESTEP);
    PULL_ERR(&P[0], 0, 0, UINT64_MAX, GIFT_ESTEP);
    /* The connection goes on: base and base + 1 park. */
    s1 = PULL(&P[0], 0, 0, 1);
    s2 = PULL(&P[0], 0, 0, 2);
    QUIET_ALL();
    for (int r = 1; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 1, (uint32_t)r, 1);
    rep = EXPECT_REPLY(&P[0], 0, 0, 1, 0, s1);
    ref = reference(0, 0, 1, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(rep, ref, rlen);
    free(ref);
    EXPECT_QUIET(&P[0]);
    for (int r = 1; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 2, (uint32_t)r, 2);
    rep = EXPECT_REPLY(&P[0], 0, 0, 2, 0, s2);
    ref = reference(0, 0, 2, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(rep, ref, rlen);
    free(ref);
    /* Steps 3 and 4; then base is 5. */
    for (uint64_t step = 3; step < 5; step++)
        for (int r = 0; r < W; r++)
            PUSH_GRAD(&P[r], 0, 0, step, (uint32_t)r, step);
    for (uint64_t step = 3; step < 5; step++) {
        uint64_t q = PULL(&P[2], 0, 0, step);
        rep = EXPECT_REPLY(&P[2], 0, 0, step, 0, q);
        ref = reference(0, 0, step, order, W, &rlen, NULL, NULL);
        EXPECT_BYTES(rep, ref, rlen);
        free(ref);
    }
    /* Older than the last two finished steps. */
    PULL_ERR(&P[2], 0, 0, 2, GIFT_ESTEP);
    PULL_ERR(&P[2], 0, 0, 1, GIFT_ESTEP);
    PULL_ERR(&P[2], 0, 0, 0, GIFT_ESTEP);
    /* A push for a finished step is a replay: acknowledged as a duplicate. */
    PUSH_DUP(&P[3], 0, 0, 2, 3, 2);
    PUSH_DUP(&P[3], 0, 0, 0, 3, 0);
    /* Window 5..6. */
    PUSH_GRAD(&P[3], 0, 0, 6, 3, 6);
    PUSH_ERR(&P[3], 0, 0, 7, 3, 7, GIFT_ESTEP);
    ck_assert_msg(C()->steps_finished == 5, "steps_finished %" PRIu64, C()->steps_finished);
    EXPECT_ERRORS(1, GIFT_ESTEP, 8);
    QUIET_ALL();
}
END_TEST

START_TEST(test_stall)
{
    gift_shard_opts_t o;
    const Gift__Error *e;

    memset(&o, 0, sizeof o);
    o.num_shards = 1;
    o.max_parked = 64;
    o.stall_warn_s = 2;
    o.stall_timeout_s = 5;
    reopen(&o);
    fx_std_declare();
    QUIET_ALL();
    G.now = T0;
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], 5, 1, 0, (uint32_t)r, 0);
    PULL(&P[0], 5, 1, 0);
    QUIET_ALL();
    G.now = T0 + 1000000000ull;
    gift_shard_tick(S);
    ck_assert_msg(C()->stalls == 0, "stalls %" PRIu64 " after 1 s", C()->stalls);
    G.now = T0 + 2500000000ull;
    gift_shard_tick(S);
    gift_shard_tick(S);
    ck_assert_msg(C()->stalls == 1, "stalls %" PRIu64 " after 2.5 s (logged once)", C()->stalls);
    QUIET_ALL();
    G.now = T0 + 6000000000ull;
    gift_shard_tick(S);
    e = EXPECT_ERROR(&P[0], GIFT_ETIMEDOUT, 0);
    ck_assert_msg(e->step == 0 && e->key == 5 && e->chunk == 1,
                  "timeout for key %u chunk %u step %" PRIu64, e->key, e->chunk, e->step);
    QUIET_ALL();
    /* The late rank still completes the step. */
    PUSH_GRAD(&P[W - 1], 5, 1, 0, W - 1, 0);
    ck_assert_msg(C()->steps_finished == 1, "steps_finished %" PRIu64, C()->steps_finished);
    QUIET_ALL();
}
END_TEST

START_TEST(test_pipelining)
{
    static const int order[W] = {0, 1, 2, 3};
    static const int order1[W] = {3, 2, 1, 0};
    uint64_t q0, q1, q1b;
    sent_t *r0, *r1, *r1b;
    size_t rlen;
    uint8_t *ref;

    G.now = T0;
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], 5, 1, 0, (uint32_t)r, 0);
    G.now = T0 + 1000000;
    /* Every rank pushes step 1 before step 0 is finished. */
    for (int r = W - 1; r >= 0; r--)
        PUSH_GRAD(&P[r], 5, 1, 1, (uint32_t)r, 1);
    q0 = PULL(&P[0], 5, 1, 0);
    q1 = PULL(&P[1], 5, 1, 1);
    q1b = PULL(&P[3], 5, 1, 1);
    ck_assert_msg(C()->steps_finished == 0, "steps_finished %" PRIu64, C()->steps_finished);
    QUIET_ALL();
    G.now = T0 + 3000000; /* step 0 took 3 ms, step 1 2 ms */
    PUSH_GRAD(&P[3], 5, 1, 0, 3, 0);
    ck_assert_msg(C()->steps_finished == 2,
                  "the last push of step 0 finished %" PRIu64 " steps, wanted 2",
                  C()->steps_finished);
    r0 = EXPECT_REPLY(&P[0], 5, 1, 0, 0, q0);
    r1 = EXPECT_REPLY(&P[1], 5, 1, 1, 0, q1);
    r1b = EXPECT_REPLY(&P[3], 5, 1, 1, 0, q1b);
    ck_assert_msg(r1->orig == r1b->orig && r1->orig != r0->orig,
                  "buffers: step 0 %p, step 1 %p and %p", (void *)r0->orig, (void *)r1->orig,
                  (void *)r1b->orig);
    ref = reference(5, 1, 0, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(r0, ref, rlen);
    free(ref);
    ref = reference(5, 1, 1, order1, W, &rlen, NULL, NULL);
    EXPECT_BYTES(r1, ref, rlen);
    EXPECT_BYTES(r1b, ref, rlen);
    free(ref);
    QUIET_ALL();
    /* The window moved to 2..3. */
    PUSH_GRAD(&P[0], 5, 1, 3, 0, 3);
    PUSH_ERR(&P[0], 5, 1, 4, 0, 4, GIFT_ESTEP);
    /* Step 2 waits 10 s for its last push. */
    G.now = T0 + 4000000;
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], 5, 1, 2, (uint32_t)r, 2);
    G.now = T0 + 4000000 + 10000000000ull;
    PUSH_GRAD(&P[3], 5, 1, 2, 3, 2);
    ck_assert_msg(C()->steps_finished == 3, "steps_finished %" PRIu64, C()->steps_finished);
    /* The other chunk of the tensor is independent: still at its first step. */
    PUSH_GRAD(&P[0], 5, 0, 0, 0, 0);
    /* Step latency: 3 ms -> bucket (2.5, 5] ms; 2 ms -> (1, 2.5] ms; 10 s -> +Inf. */
    for (int b = 0; b < GIFT_LAT_BUCKETS; b++)
        ck_assert_msg(C()->lat_bucket[b] ==
                          (b == 1 || b == 2 || b == GIFT_LAT_BUCKETS - 1 ? 1u : 0u),
                      "latency bucket %d (<= %g s) holds %" PRIu64, b, gift_lat_bounds[b],
                      C()->lat_bucket[b]);
    ck_assert_msg(fabs(C()->lat_sum - 10.005) < 1e-9, "latency sum %.9f s, wanted 10.005",
                  C()->lat_sum);
    EXPECT_ERRORS(1, GIFT_ESTEP, 1);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Parked pulls                                                          */
/* ------------------------------------------------------------------ */

START_TEST(test_parked_peer_close)
{
    static const int order[W] = {0, 1, 2, 3};
    uint64_t q2, q3;
    sent_t *rep;
    size_t rlen;
    uint8_t *ref;
    gift_shard_opts_t o = O;
    o.max_parked = 4;
    reopen(&o);
    hello_all();
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], STD_T, STD_NT, STD_C, STD_NC);

    PUSH_GRAD(&P[0], 1, 0, 0, 0, 0);
    PUSH_GRAD(&P[1], 1, 0, 0, 1, 0);
    /* Rank 0 parks three pulls (two steps, two chunks), then its connection dies. */
    PUSH_GRAD(&P[0], 5, 0, 0, 0, 0);
    PULL(&P[0], 1, 0, 0);
    PULL(&P[0], 1, 0, 1);
    PULL(&P[0], 5, 0, 0);
    q2 = PULL(&P[2], 1, 0, 0);
    /* The pool (4) is full. */
    PULL_ERR(&P[3], 1, 0, 0, GIFT_EBUSY);
    ck_assert_msg(!P[3].closed, "EBUSY closed the connection");
    peer_gone(&P[0]);
    ck_assert_msg(C()->peers == NPEER - 1, "peers %u", C()->peers);
    /* Its entries went back to the pool. */
    q3 = PULL(&P[3], 1, 0, 0);
    PULL(&P[3], 1, 0, 1);
    PULL(&P[1], 1, 0, 1);
    PULL_ERR(&P[1], 1, 0, 0, GIFT_EBUSY);
    /* Rank 0 comes back on a new connection and nothing is sent to the old one. */
    HELLO(&P[4], 0, W);
    PUSH_DUP(&P[4], 1, 0, 0, 0, 0);
    PUSH_GRAD(&P[2], 1, 0, 0, 2, 0);
    PUSH_GRAD(&P[3], 1, 0, 0, 3, 0);
    rep = EXPECT_REPLY(&P[2], 1, 0, 0, 0, q2);
    ref = reference(1, 0, 0, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(rep, ref, rlen);
    rep = EXPECT_REPLY(&P[3], 1, 0, 0, 0, q3);
    EXPECT_BYTES(rep, ref, rlen);
    free(ref);
    QUIET_ALL();
    ck_assert_msg(G.sends_after_gone == 0, "%d frames sent to the closed connection",
                  G.sends_after_gone);
    EXPECT_ERRORS(1, GIFT_EBUSY, 2);
}
END_TEST

/* Closing a peer with parked pulls in the middle of a chunk's list, and
 * closing all of them, keeps the lists consistent. */
START_TEST(test_parked_unlink_order)
{
    uint64_t q[W][3];
    PUSH_GRAD(&P[0], 0, 0, 0, 0, 0);
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < W; r++)
            q[r][k] = PULL(&P[r], 0, 0, (uint64_t)(k == 2 ? 1 : 0));
    peer_gone(&P[2]); /* middle of the list */
    peer_gone(&P[0]);
    HELLO(&P[4], 0, W);
    HELLO(&P[5], 2, W);
    PUSH_GRAD(&P[1], 0, 0, 0, 1, 0);
    PUSH_GRAD(&P[5], 0, 0, 0, 2, 0);
    PUSH_GRAD(&P[3], 0, 0, 0, 3, 0);
    for (int r = 1; r < W; r += 2) {
        /* Woken in some order; both step-0 pulls of each live peer answered. */
        int got = 0;
        for (int k = 0; k < 2; k++) {
            sent_t *s = take_at(&P[r], GIFT__ENVELOPE__MSG_PULL_REPLY, __LINE__);
            ck_assert_msg(s->env->pull_reply->step == 0, "step %" PRIu64, s->env->pull_reply->step);
            got |= s->env->pull_reply->seq == q[r][0]   ? 1
                   : s->env->pull_reply->seq == q[r][1] ? 2
                                                        : 0;
        }
        ck_assert_msg(got == 3, "peer %d: replies for seqs mask %d", r, got);
    }
    QUIET_ALL();
    PUSH_GRAD(&P[4], 0, 0, 1, 0, 1);
    PUSH_GRAD(&P[1], 0, 0, 1, 1, 1);
    PUSH_GRAD(&P[5], 0, 0, 1, 2, 1);
    PUSH_GRAD(&P[3], 0, 0, 1, 3, 1);
    EXPECT_REPLY(&P[1], 0, 0, 1, 0, q[1][2]);
    EXPECT_REPLY(&P[3], 0, 0, 1, 0, q[3][2]);
    QUIET_ALL();
}
END_TEST

START_TEST(test_send_failure)
{
    uint64_t q;
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], 0, 0, 0, (uint32_t)r, 0);
    q = PULL(&P[0], 0, 0, 0);
    /* The glue cannot queue anything now (out of memory): the shard goes on. */
    G.fail_send = GIFT_ENOMEM;
    {
        float *x = grad(0, 0, 3, 0);
        ck_assert_int_eq(push_x(&P[3], 0, 0, 0, 0, x), 0);
        free(x);
    }
    G.fail_send = 0;
    ck_assert_msg(C()->steps_finished == 1, "steps_finished %" PRIu64, C()->steps_finished);
    QUIET_ALL();
    /* The pull's reply was lost with the write; a repeated pull gets it. */
    q = PULL(&P[0], 0, 0, 0);
    EXPECT_REPLY(&P[0], 0, 0, 0, 0, q);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Bad payloads                                                          */
/* ------------------------------------------------------------------ */

START_TEST(test_bad_payloads)
{
    static const int order[W] = {0, 1, 2, 3};
    const tdesc_t *t2 = tensor_of(2);
    size_t n2 = chunk_n(chunk_of(2, 0)), len, rlen;
    gift_codec_params_t p2 = params_of(t2->push_fmt, t2->push_block);
    gift_layout_t l2;
    float *x0 = grad(2, 0, 0, 0);
    uint8_t *good = encode(&p2, x0, n2, &len), *bad = malloc(len + 64), *ref;
    uint64_t q;
    sent_t *rep;

    ck_assert_ptr_nonnull(bad);
    ck_assert_int_eq(gift_layout(&p2, n2, &l2), 0);
    /* Wrong payload sizes. */
    memcpy(bad, good, len);
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, bad, len - 64), 0);
    EXPECT_ERROR(&P[0], GIFT_ESHAPE, 0);
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, bad, len + 64), 0);
    EXPECT_ERROR(&P[0], GIFT_ESHAPE, 0);
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, NULL, 0), 0);
    EXPECT_ERROR(&P[0], GIFT_ESHAPE, 0);
    /* Codec mismatches: another format, another fp8 block. */
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E5M2, 32, good, len), 0);
    EXPECT_ERROR(&P[0], GIFT_ECODEC, 0);
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 128, good, len), 0);
    EXPECT_ERROR(&P[0], GIFT_ECODEC, 0);
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 0, good, len), 0);
    EXPECT_ERROR(&P[0], GIFT_ECODEC, 0);
    /* A NaN code (0x7F), a negative-NaN code (0xFF), a NaN and a negative block scale. */
    memcpy(bad, good, len);
    bad[l2.code_off + 5] = 0x7F;
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, bad, len), 0);
    EXPECT_ERROR(&P[0], GIFT_EBADCODE, 0);
    memcpy(bad, good, len);
    bad[l2.code_off + n2 - 1] = 0xFF;
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, bad, len), 0);
    EXPECT_ERROR(&P[0], GIFT_EBADCODE, 0);
    memcpy(bad, good, len);
    {
        float nanv = NAN, neg = -1.0f;
        memcpy(bad + 4, &nanv, 4);
        ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, bad, len), 0);
        EXPECT_ERROR(&P[0], GIFT_EBADCODE, 0);
        memcpy(bad, good, len);
        memcpy(bad + 8, &neg, 4);
        ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, bad, len), 0);
        EXPECT_ERROR(&P[0], GIFT_EBADCODE, 0);
    }
    /* An epoch on a tensor without geometry. */
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 1, E4M3, 32, good, len), 0);
    EXPECT_ERROR(&P[0], GIFT_EEPOCH, 0);
    ck_assert_msg(C()->pushes == 0, "refused pushes counted: %" PRIu64, C()->pushes);
    ck_assert_msg(!P[0].closed, "a refused push closed the connection");

    /* The same rank then pushes its good payload: not a duplicate, so nothing
     * of the refused ones was recorded; the mean is that of the good pushes. */
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 0, 0, E4M3, 32, good, len), 0);
    expect_ack_at(&P[0], 2, 0, 0, 0, g_seq - 1, __LINE__);
    q = PULL(&P[1], 2, 0, 0);
    for (int r = 1; r < W; r++) {
        /* Every other rank also tries a NaN first. */
        float *x = grad(2, 0, (uint32_t)r, 0);
        size_t l;
        uint8_t *b = encode(&p2, x, n2, &l);
        b[l2.code_off + (size_t)r * 7] = 0x7F;
        ck_assert_int_eq(push_raw(&P[r], 2, 0, 0, 0, E4M3, 32, b, l), 0);
        EXPECT_ERROR(&P[r], GIFT_EBADCODE, 0);
        free(b);
        free(x);
        PUSH_GRAD(&P[r], 2, 0, 0, (uint32_t)r, 0);
    }
    rep = EXPECT_REPLY(&P[1], 2, 0, 0, 0, q);
    ref = reference(2, 0, 0, order, W, &rlen, NULL, NULL);
    EXPECT_BYTES(rep, ref, rlen);
    free(ref);

    /* The declared block 0 means 128: a push that says 128 matches; nvfp4 ignores the block. */
    {
        float *x = grad(3, 0, 0, 0);
        gift_codec_params_t p3 = params_of(E4M3, 128);
        size_t l;
        uint8_t *b = encode(&p3, x, chunk_n(chunk_of(3, 0)), &l);
        ck_assert_int_eq(push_raw(&P[0], 3, 0, 0, 0, E4M3, 128, b, l), 0);
        expect_ack_at(&P[0], 3, 0, 0, 0, g_seq - 1, __LINE__);
        ck_assert_int_eq(push_raw(&P[1], 3, 0, 0, 0, E4M3, 64, b, l), 0);
        EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
        free(b);
        free(x);
        x = grad(4, 0, 0, 0);
        p3 = params_of(NVFP4, 0);
        b = encode(&p3, x, chunk_n(chunk_of(4, 0)), &l);
        ck_assert_int_eq(push_raw(&P[0], 4, 0, 0, 0, NVFP4, 128, b, l), 0);
        expect_ack_at(&P[0], 4, 0, 0, 0, g_seq - 1, __LINE__);
        ck_assert_int_eq(push_raw(&P[1], 4, 0, 0, 0, F32, 0, b, l), 0);
        EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
        free(b);
        free(x);
    }
    EXPECT_ERRORS(5, GIFT_ESHAPE, 3, GIFT_ECODEC, 5, GIFT_EBADCODE, 4 + W - 1, GIFT_EEPOCH, 1,
                  GIFT_EPROTO, 0);
    QUIET_ALL();
    free(x0);
    free(good);
    free(bad);
}
END_TEST

/* A mean that overflows FP32 cannot be encoded: pulls get an error, not garbage. */
START_TEST(test_mean_overflow)
{
    size_t n = chunk_n(chunk_of(0, 0));
    float *x = malloc(n * sizeof *x);
    uint64_t q;
    const Gift__Error *e;
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++)
        x[i] = 3.0e38f;
    PULL_ERR(&P[0], 0, 0, 0, GIFT_ESTEP); /* before any push */
    for (int r = 0; r < W; r++)
        push_ok_at(&P[r], 0, 0, 0, 0, x, 0, __LINE__);
    q = PULL(&P[1], 0, 0, 0);
    e = EXPECT_ERROR(&P[1], GIFT_ENONFINITE, 0);
    ck_assert_msg(e->key == 0 && e->step == 0 && e->seq == q,
                  "error context key %u step %" PRIu64 " seq %" PRIu64, e->key, e->step, e->seq);
    /* The next step is fine again. */
    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 1, (uint32_t)r, 1);
    q = PULL(&P[1], 0, 0, 1);
    EXPECT_REPLY(&P[1], 0, 0, 1, 0, q);
    free(x);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Geometry                                                              */
/* ------------------------------------------------------------------ */

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

/* Takes a Geometry frame and checks it against g. */
static sent_t *expect_geometry_at(fake_t *fp, const gift_geometry_t *g, uint64_t valid_from,
                                  int line)
{
    sent_t *s = take_at(fp, GIFT__ENVELOPE__MSG_GEOMETRY, line);
    const Gift__Geometry *m = s->env->geometry;
    size_t ub = (size_t)GDIN * GKS * 4;
    ck_assert_msg(m->key == 0 && m->epoch == g->epoch && m->valid_from_step == valid_from &&
                      m->seq == g_seq - 1,
                  "line %d: geometry key %u epoch %u valid from %" PRIu64 " seq %" PRIu64
                  ", wanted epoch %u from %" PRIu64,
                  line, m->key, m->epoch, m->valid_from_step, m->seq, g->epoch, valid_from);
    ck_assert_msg(m->din == GDIN && m->rank == GK && m->basis_cols == GKS,
                  "line %d: geometry %u x %u rank %u", line, m->din, m->basis_cols, m->rank);
    ck_assert_msg(m->identity == (g->identity != 0), "line %d: identity %d, wanted %d", line,
                  (int)m->identity, g->identity);
    ck_assert_msg(m->trace == g->trace && m->sigma2 == g->sigma2 && m->delta == g->delta,
                  "line %d: trace %.17g sigma2 %.17g delta %.17g, wanted %.17g %.17g %.17g", line,
                  m->trace, m->sigma2, m->delta, g->trace, g->sigma2, g->delta);
    ck_assert_msg(s->len == ub + (size_t)GKS * 4, "line %d: geometry payload %zu bytes, wanted %zu",
                  line, s->len, ub + (size_t)GKS * 4);
    ck_assert_msg(memcmp(s->copy, g->U, ub) == 0, "line %d: U differs from the reference", line);
    ck_assert_msg(memcmp(s->copy + ub, g->lambda, (size_t)GKS * 4) == 0,
                  "line %d: lambda differs from the reference", line);
    return s;
}

/* Rank r's sketch against basis U (din x ks row-major): Y = A_r U with
 * A_r = X^T X / n for activations with a decaying column spectrum. */
static void make_sketch(uint32_t r, uint64_t round, const float *U, float *Y, double *trace)
{
    float *X = malloc((size_t)GN * GDIN * sizeof *X),
          *work = malloc((size_t)GN * GKS * sizeof *work);
    uint64_t s = 0xabc0 + r * 131 + round * 7919;
    ck_assert(X && work);
    for (int i = 0; i < GN; i++)
        for (int j = 0; j < GDIN; j++)
            X[i * GDIN + j] = (float)(rng_normal(&s) / (1.0 + 0.3 * j));
    ck_assert_int_eq(gift_sketch(X, GN, GDIN, U, GKS, Y, trace, work), 0);
    free(X);
    free(work);
}

static void sketch_ok_at(fake_t *fp, uint64_t step, uint32_t epoch, double trace, const float *Y,
                         int dup, int line)
{
    int rc = sketch_raw(fp, 0, step, epoch, trace, GDIN, GKS, Y, (size_t)GDIN * GKS * 4);
    ck_assert_msg(rc == 0, "line %d: sketch returned %d", line, rc);
    expect_sketch_ack_at(fp, 0, step, dup, line);
}

static void sketch_err_at(fake_t *fp, uint64_t step, uint32_t epoch, double trace, uint32_t din,
                          uint32_t ks, const float *Y, size_t len, int code, int line)
{
    const Gift__Error *e;
    int rc = sketch_raw(fp, 0, step, epoch, trace, din, ks, Y, len);
    ck_assert_msg(rc == 0, "line %d: a refused sketch returned %d", line, rc);
    e = expect_error_at(fp, code, 0, line);
    ck_assert_msg(e->key == 0 && e->step == step && e->seq == g_seq - 1,
                  "line %d: error context key %u step %" PRIu64, line, e->key, e->step);
}

static void geo_push_at(fake_t *fp, uint32_t chunk, uint64_t step, uint32_t epoch, uint32_t rank,
                        int code, int line)
{
    float *x = grad(0, chunk, rank, step);
    if (code == 0)
        push_ok_at(fp, 0, chunk, step, epoch, x, 0, line);
    else
        push_err_at(fp, 0, chunk, step, epoch, x, code, line);
    free(x);
}
#define GEO_PUSH(fp, chunk, step, epoch, rank)                                                     \
    geo_push_at((fp), (chunk), (step), (epoch), (rank), 0, __LINE__)
#define GEO_PUSH_ERR(fp, chunk, step, epoch, rank, code)                                           \
    geo_push_at((fp), (chunk), (step), (epoch), (rank), (code), __LINE__)

START_TEST(test_geometry_owner)
{
    static const int sk_order[W] = {2, 0, 3, 1};
    gift_geometry_t ref;
    float *Y[W], *ysum = calloc((size_t)GDIN * GKS, sizeof(float)), *bad;
    double tr[W], trace_sum = 0;
    size_t ylen = (size_t)GDIN * GKS * 4;
    sent_t *g0, *g1;
    uint64_t q;
    gift_tensor_status_t ts;

    ck_assert_ptr_nonnull(ysum);
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(gift_geometry_init(&ref, GDIN, GK, GKS, GEO_T[0].seed), 0);

    /* Epoch 0: the seeded random basis, identity transform. */
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    g0 = expect_geometry_at(&P[1], &ref, 0, __LINE__);
    /* Geometry of a tensor without it. */
    ck_assert_int_eq(georeq_raw(&P[1], 1, 0), 0);
    EXPECT_ERROR(&P[1], GIFT_ENOKEY, 0);
    ck_assert_int_eq(georeq_raw(&P[1], 7, 0), 0);
    EXPECT_ERROR(&P[1], GIFT_ENOKEY, 0);

    /* Step 0 under epoch 0; epoch 1 does not exist yet. */
    GEO_PUSH_ERR(&P[0], 0, 0, 1, 0, GIFT_EEPOCH);
    for (int r = 0; r < W; r++) {
        GEO_PUSH(&P[r], 0, 0, 0, (uint32_t)r);
        GEO_PUSH(&P[r], 1, 0, 0, (uint32_t)r);
    }
    for (int r = 0; r < W; r++) {
        Y[r] = malloc(ylen);
        ck_assert_ptr_nonnull(Y[r]);
        make_sketch((uint32_t)r, 1, (const float *)g0->copy, Y[r], &tr[r]);
    }
    bad = malloc(ylen);
    ck_assert_ptr_nonnull(bad);

    /* Refresh step 1: each rank sketches, then pushes step 1 (epoch 0). */
    for (int i = 0; i < W; i++) {
        int r = sk_order[i];
        if (i == 1) {
            /* Refused sketches leave nothing behind. */
            sketch_err_at(&P[r], 1, 0, tr[r], GDIN - 1, GKS, Y[r], ylen, GIFT_ESHAPE, __LINE__);
            sketch_err_at(&P[r], 1, 0, tr[r], GDIN, GKS + 1, Y[r], ylen, GIFT_ESHAPE, __LINE__);
            sketch_err_at(&P[r], 1, 0, tr[r], GDIN, GKS, Y[r], ylen - 4, GIFT_ESHAPE, __LINE__);
            sketch_err_at(&P[r], 1, 1, tr[r], GDIN, GKS, Y[r], ylen, GIFT_EEPOCH, __LINE__);
            memcpy(bad, Y[r], ylen);
            bad[17] = NAN;
            sketch_err_at(&P[r], 1, 0, tr[r], GDIN, GKS, bad, ylen, GIFT_EBADCODE, __LINE__);
            bad[17] = INFINITY;
            sketch_err_at(&P[r], 1, 0, tr[r], GDIN, GKS, bad, ylen, GIFT_EBADCODE, __LINE__);
            sketch_err_at(&P[r], 1, 0, NAN, GDIN, GKS, Y[r], ylen, GIFT_EBADCODE, __LINE__);
            sketch_err_at(&P[r], 1, 0, -1.0, GDIN, GKS, Y[r], ylen, GIFT_EBADCODE, __LINE__);
        }
        sketch_ok_at(&P[r], 1, 0, tr[r], Y[r], 0, __LINE__);
        for (size_t j = 0; j < (size_t)GDIN * GKS; j++)
            ysum[j] += Y[r][j];
        trace_sum += tr[r];
        if (i == 2) {
            /* A duplicate (another connection of the same rank, other data) is acknowledged and
             * ignored. */
            sketch_ok_at(&P[sk_order[0]], 1, 0, tr[r], Y[r], 1, __LINE__);
            ck_assert_msg(C()->epochs_published == 0,
                          "an epoch was published after %d sketches and a duplicate", i + 1);
            ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
            expect_geometry_at(&P[1], &ref, 0, __LINE__);
        }
        if (i < W - 1)
            GEO_PUSH(&P[r], 0, 1, 0, (uint32_t)r);
    }
    ck_assert_msg(C()->epochs_published == 1 && C()->sketches == W,
                  "epochs_published %" PRIu64 " sketches %" PRIu64, C()->epochs_published,
                  C()->sketches);
    if (!g_eager) {
        /* Ordered aggregation sums the sketches in rank order too. */
        memset(ysum, 0, (size_t)GDIN * GKS * sizeof(float));
        trace_sum = 0;
        for (int r = 0; r < W; r++) {
            for (size_t j = 0; j < (size_t)GDIN * GKS; j++)
                ysum[j] += Y[r][j];
            trace_sum += tr[r];
        }
    }
    ck_assert_int_eq(gift_geometry_update(&ref, ysum, trace_sum, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_msg(ref.epoch == 1 && !ref.identity, "reference epoch %u identity %d", ref.epoch,
                  ref.identity);
    /* The last rank's step-1 push still carries epoch 0: step 1 is under epoch 0. */
    GEO_PUSH_ERR(&P[sk_order[W - 1]], 0, 1, 1, (uint32_t)sk_order[W - 1], GIFT_EEPOCH);
    GEO_PUSH(&P[sk_order[W - 1]], 0, 1, 0, (uint32_t)sk_order[W - 1]);
    for (int r = 0; r < W; r++)
        GEO_PUSH(&P[r], 1, 1, 0, (uint32_t)r);

    /* Step 2 must be under epoch 1, on both chunks. */
    GEO_PUSH_ERR(&P[0], 0, 2, 0, 0, GIFT_EEPOCH);
    GEO_PUSH_ERR(&P[0], 1, 2, 0, 0, GIFT_EEPOCH);
    GEO_PUSH_ERR(&P[0], 0, 2, 2, 0, GIFT_EEPOCH);
    for (int r = 0; r < W; r++) {
        GEO_PUSH(&P[r], 0, 2, 1, (uint32_t)r);
        GEO_PUSH(&P[r], 1, 2, 1, (uint32_t)r);
    }
    /* Chunk 0's replies advertise epoch 1; step 1's payload is still in epoch 0. */
    q = PULL(&P[2], 0, 0, 1);
    {
        sent_t *s = EXPECT_REPLY(&P[2], 0, 0, 1, 0, q);
        ck_assert_msg(s->env->pull_reply->latest_epoch == 1, "step 1 latest_epoch %u",
                      s->env->pull_reply->latest_epoch);
    }
    q = PULL(&P[2], 0, 0, 2);
    {
        sent_t *s = EXPECT_REPLY(&P[2], 0, 0, 2, 1, q);
        ck_assert_msg(s->env->pull_reply->latest_epoch == 1, "step 2 latest_epoch %u",
                      s->env->pull_reply->latest_epoch);
    }
    q = PULL(&P[2], 0, 1, 2);
    EXPECT_REPLY(&P[2], 0, 1, 2, 1, q);
    /* The new epoch, valid from step 2, exactly as the codec computes it. */
    ck_assert_int_eq(georeq_raw(&P[3], 0, 0), 0);
    g1 = expect_geometry_at(&P[3], &ref, 2, __LINE__);
    ck_assert_msg(g1->orig != g0->orig,
                  "epoch 1 was written into the buffer epoch 0's write holds");
    ck_assert_msg(memcmp(g0->buf->data, g0->copy, g0->len) == 0,
                  "epoch 0's bytes changed under a write");
    /* Sketches against the old basis are refused now. */
    sketch_err_at(&P[0], 5, 0, tr[0], GDIN, GKS, Y[0], ylen, GIFT_EEPOCH, __LINE__);
    ck_assert_int_eq(gift_shard_tensor_status(S, 0, &ts, NULL, 0), 0);
    ck_assert_msg(ts.owner == 1 && ts.epoch == 1, "status owner %d epoch %u", ts.owner, ts.epoch);
    EXPECT_ERRORS(4, GIFT_ENOKEY, 2, GIFT_ESHAPE, 3, GIFT_EEPOCH, 7, GIFT_EBADCODE, 4);
    QUIET_ALL();

    for (int r = 0; r < W; r++)
        free(Y[r]);
    free(bad);
    free(ysum);
    gift_geometry_free(&ref);
}
END_TEST

/* A round whose sum is not the sketch of a PSD matrix fails in LAPACK: the
 * epoch stays, the failure is counted, pushes go on under the old epoch. */
START_TEST(test_geometry_update_fails)
{
    size_t ny = (size_t)GDIN * GKS;
    float *Y = malloc(ny * 4), *Y2 = malloc(ny * 4);
    double tr;
    uint64_t errs = 0;
    sent_t *g0;
    ck_assert(Y && Y2);
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    g0 = take_at(&P[0], GIFT__ENVELOPE__MSG_GEOMETRY, __LINE__);
    /* Y = -Q: Q^T Y = -I is no sketch of a PSD matrix. */
    for (size_t j = 0; j < ny; j++)
        Y[j] = -((const float *)g0->copy)[j];
    for (int r = 0; r < W; r++)
        sketch_ok_at(&P[r], 0, 0, 1.0, Y, 0, __LINE__);
    ck_assert_msg(C()->epochs_published == 0, "an epoch was published from a negative sketch");
    for (int i = 0; i < 32; i++)
        errs += C()->errors[i];
    ck_assert_msg(errs == 1 && (C()->errors[-GIFT_ELAPACK] == 1 || C()->errors[-GIFT_EINVAL] == 1),
                  "a failed update counted %" PRIu64 " errors (ELAPACK %" PRIu64 ")", errs,
                  C()->errors[-GIFT_ELAPACK]);
    for (int r = 0; r < W; r++)
        GEO_PUSH(&P[r], 0, 0, 0, (uint32_t)r);
    /* The next round, against the same basis, works. */
    for (int r = 0; r < W; r++) {
        make_sketch((uint32_t)r, 4, (const float *)g0->copy, Y2, &tr);
        sketch_ok_at(&P[r], 4, 0, tr, Y2, 0, __LINE__);
    }
    ck_assert_msg(C()->epochs_published == 1, "epochs_published %" PRIu64, C()->epochs_published);
    ck_assert_msg(C()->sketches == 2 * W, "sketches %" PRIu64, C()->sketches);
    GEO_PUSH(&P[0], 0, 1, 0, 0);
    GEO_PUSH_ERR(&P[0], 0, 5, 0, 0, GIFT_ESTEP);
    QUIET_ALL();
    free(Y);
    free(Y2);
}
END_TEST

/* A shard that holds chunk 1 only: pushes of a step agree on the epoch
 * among themselves; no sketches, no geometry. */
START_TEST(test_geometry_non_owner)
{
    gift_shard_opts_t o = O;
    uint64_t q;
    sent_t *s;
    gift_tensor_status_t ts;
    float y[GDIN * GKS] = {0};
    o.shard_id = 1;
    o.num_shards = 2;
    reopen(&o);
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OTHER_C, 1);

    GEO_PUSH(&P[0], 1, 0, 0, 0);
    GEO_PUSH_ERR(&P[1], 1, 0, 1, 1, GIFT_EEPOCH);
    GEO_PUSH(&P[1], 1, 0, 0, 1);
    GEO_PUSH(&P[2], 1, 0, 0, 2);
    GEO_PUSH_ERR(&P[3], 1, 0, 3, 3, GIFT_EEPOCH);
    GEO_PUSH(&P[3], 1, 0, 0, 3);
    q = PULL(&P[0], 0, 1, 0);
    s = EXPECT_REPLY(&P[0], 0, 1, 0, 0, q);
    ck_assert_msg(s->env->pull_reply->latest_epoch == 0, "latest_epoch %u on a non-owner",
                  s->env->pull_reply->latest_epoch);
    /* Step 1: the first push says epoch 1, the rest must follow. */
    GEO_PUSH(&P[2], 1, 1, 1, 2);
    GEO_PUSH_ERR(&P[0], 1, 1, 0, 0, GIFT_EEPOCH);
    GEO_PUSH(&P[0], 1, 1, 1, 0);
    GEO_PUSH(&P[1], 1, 1, 1, 1);
    GEO_PUSH(&P[3], 1, 1, 1, 3);
    q = PULL(&P[1], 0, 1, 1);
    EXPECT_REPLY(&P[1], 0, 1, 1, 1, q);
    /* Not the owner. */
    ck_assert_int_eq(sketch_raw(&P[0], 0, 0, 0, 1.0, GDIN, GKS, y, sizeof y), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
    {
        size_t len = layout_total(E4M3, 32, 10 * GDIN);
        uint8_t *junk = calloc(1, len);
        ck_assert_ptr_nonnull(junk);
        ck_assert_int_eq(push_raw(&P[0], 0, 0, 2, 1, E4M3, 32, junk, len), 0);
        EXPECT_ERROR(&P[0], GIFT_ENOKEY, 0);
        free(junk);
    }
    ck_assert_int_eq(gift_shard_tensor_status(S, 0, &ts, NULL, 0), 0);
    ck_assert_msg(ts.owner == 0 && ts.epoch == 0, "status owner %d epoch %u", ts.owner, ts.epoch);
    EXPECT_ERRORS(2, GIFT_EEPOCH, 3, GIFT_ENOKEY, 3);
    QUIET_ALL();
}
END_TEST

/* ------------------------------------------------------------------ */
/* Stats and counters                                                    */
/* ------------------------------------------------------------------ */

static int has_rank(const Gift__TensorStats *t, uint32_t r)
{
    for (size_t i = 0; i < t->n_missing_ranks; i++)
        if (t->missing_ranks[i] == r)
            return 1;
    return 0;
}

START_TEST(test_stats)
{
    const Gift__Stats *st;
    gift_tensor_status_t ts;
    uint64_t bm[2];
    uint64_t frames_out;

    /* Tensor 0: step 0 finished. Tensor 1: rank 2 holds back step 0.
     * Tensor 5: chunk 1 at step 1 (rank 0 missing), chunk 0 at step 0 (ranks 1, 3 missing). */
    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 0, (uint32_t)r, 0);
    for (int r = 0; r < W; r++)
        if (r != 2)
            PUSH_GRAD(&P[r], 1, 0, 0, (uint32_t)r, 0);
    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], 5, 1, 0, (uint32_t)r, 0);
    for (int r = 1; r < W; r++)
        PUSH_GRAD(&P[r], 5, 1, 1, (uint32_t)r, 1);
    PUSH_GRAD(&P[0], 5, 0, 0, 0, 0);
    PUSH_GRAD(&P[2], 5, 0, 0, 2, 0);
    PULL(&P[0], 1, 0, 0); /* parked */
    frames_out = C()->frames_out;

    st = STATS(&P[3]);
    ck_assert_msg(st->shard_id == 0 && st->connections == NPEER, "shard %u connections %u",
                  st->shard_id, st->connections);
    ck_assert_msg(st->pushes == C()->pushes && st->pushes == 4 + 3 + 4 + 3 + 2,
                  "stats pushes %" PRIu64 ", counters %" PRIu64, st->pushes, C()->pushes);
    ck_assert_msg(st->pulls == 1 && st->steps_finished == 2,
                  "pulls %" PRIu64 " steps_finished %" PRIu64, st->pulls, st->steps_finished);
    ck_assert_msg(st->frames_out == frames_out, "frames_out %" PRIu64 ", wanted %" PRIu64,
                  st->frames_out, frames_out);
    ck_assert_msg(st->frames_in == C()->frames_in && st->bytes_in == C()->bytes_in,
                  "frames_in %" PRIu64 " bytes_in %" PRIu64, st->frames_in, st->bytes_in);
    ck_assert_msg(st->n_tensors == STD_NT, "%zu tensors", st->n_tensors);
    for (size_t i = 0; i < STD_NT; i++) {
        const Gift__TensorStats *t = st->tensors[i];
        ck_assert_msg(t->key == i && strcmp(t->name, STD_T[i].name) == 0,
                      "tensor %zu: key %u name %s", i, t->key, t->name);
        ck_assert_int_eq(gift_shard_tensor_status(S, i, &ts, bm, 2), 0);
        ck_assert_msg(ts.key == t->key && strcmp(ts.name, t->name) == 0 &&
                          ts.bytes_in == t->bytes_in && ts.bytes_out == t->bytes_out &&
                          ts.epoch == t->epoch,
                      "tensor %zu: status and stats disagree", i);
        ck_assert_msg((ts.has_step ? ts.step : 0) == t->step_finished,
                      "tensor %zu: status step %" PRIu64 " (has %d), stats %" PRIu64, i, ts.step,
                      ts.has_step, t->step_finished);
        ck_assert_msg(ts.missing == t->n_missing_ranks || !ts.has_step,
                      "tensor %zu: status missing %u, stats lists %zu", i, ts.missing,
                      t->n_missing_ranks);
        for (uint32_t r = 0; r < W; r++)
            ck_assert_msg(((bm[0] >> r) & 1) == (uint64_t)has_rank(t, r),
                          "tensor %zu rank %u: bitmap %d, stats %d", i, r, (int)((bm[0] >> r) & 1),
                          has_rank(t, r));
        ck_assert_msg(
            strcmp(ts.push_codec, gift_format_name((gift_format_t)STD_T[i].push_fmt)) == 0 &&
                strcmp(ts.pull_codec, gift_format_name((gift_format_t)STD_T[i].pull_fmt)) == 0,
            "tensor %zu codecs %s/%s", i, ts.push_codec, ts.pull_codec);
    }
    /* Tensor 0: step 0 done, nobody pushed step 1 yet. */
    ck_assert_msg(st->tensors[0]->step_finished == 1 && st->tensors[0]->n_missing_ranks == W,
                  "tensor 0: step %" PRIu64 " missing %zu", st->tensors[0]->step_finished,
                  st->tensors[0]->n_missing_ranks);
    /* Tensor 1: exactly rank 2 is named. */
    ck_assert_msg(st->tensors[1]->step_finished == 0 && st->tensors[1]->n_missing_ranks == 1 &&
                      st->tensors[1]->missing_ranks[0] == 2,
                  "tensor 1: step %" PRIu64 ", %zu missing, first %u",
                  st->tensors[1]->step_finished, st->tensors[1]->n_missing_ranks,
                  st->tensors[1]->n_missing_ranks ? st->tensors[1]->missing_ranks[0] : 99);
    ck_assert_int_eq(gift_shard_tensor_status(S, 1, &ts, bm, 1), 0);
    ck_assert_msg(ts.has_step && ts.step == 0 && ts.missing == 1 && bm[0] == 4u,
                  "status tensor 1: step %" PRIu64 " missing %u bitmap %#" PRIx64, ts.step,
                  ts.missing, bm[0]);
    /* Tensor 2: never pushed. */
    ck_assert_msg(st->tensors[2]->step_finished == 0 && st->tensors[2]->n_missing_ranks == 0,
                  "tensor 2: step %" PRIu64 " missing %zu", st->tensors[2]->step_finished,
                  st->tensors[2]->n_missing_ranks);
    /* Tensor 5: its oldest chunk (0, step 0) is reported: ranks 1 and 3. */
    ck_assert_msg(st->tensors[5]->step_finished == 0 && st->tensors[5]->n_missing_ranks == 2 &&
                      has_rank(st->tensors[5], 1) && has_rank(st->tensors[5], 3),
                  "tensor 5: step %" PRIu64 ", %zu missing", st->tensors[5]->step_finished,
                  st->tensors[5]->n_missing_ranks);
    ck_assert_msg(st->tensors[0]->bytes_in == 4 * layout_total(F32, 0, 7 * 13),
                  "tensor 0 bytes_in %" PRIu64, st->tensors[0]->bytes_in);
    ck_assert_int_eq(gift_shard_tensor_status(S, STD_NT, &ts, NULL, 0), GIFT_ENOKEY);
    QUIET_ALL();
}
END_TEST

/* A Stats answer larger than the shard's fixed header buffer. */
START_TEST(test_stats_large)
{
    enum { NT = 400 };
    tdesc_t *t = calloc(NT, sizeof *t);
    char(*names)[48] = calloc(NT, sizeof *names);
    const Gift__Stats *st;
    ck_assert(t && names);
    for (uint32_t i = 0; i < NT; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%u.mlp.down_proj.weight", i);
        t[i].key = i;
        t[i].name = names[i];
        t[i].rows = 1 + i % 5;
        t[i].cols = 3;
        t[i].push_fmt = BF16;
        t[i].pull_fmt = BF16;
    }
    DECLARE_OK(&P[0], t, NT, NULL, 0);
    st = STATS(&P[0]);
    ck_assert_msg(st->n_tensors == NT && strcmp(st->tensors[NT - 1]->name, names[NT - 1]) == 0,
                  "%zu tensors", st->n_tensors);
    ck_assert_msg(P[0].f[P[0].n - 1]->head_len > 4096, "stats header only %zu bytes",
                  P[0].f[P[0].n - 1]->head_len);
    g_t = NULL;
    free(t);
    free(names);
}
END_TEST

START_TEST(test_counters)
{
    const gift_shard_counters_t *c = C();
    uint64_t frames_in0 = c->frames_in, frames_out0 = c->frames_out, bytes_in0 = c->bytes_in;
    size_t plen = layout_total(F32, 0, 7 * 13);

    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 0, (uint32_t)r, 0); /* 4 pushes, 1 step */
    PUSH_DUP(&P[1], 0, 0, 0, 1, 0);                /* 1 duplicate */
    PUSH_GRAD(&P[1], 0, 0, 1, 1, 1);               /* 1 push */
    PUSH_DUP(&P[1], 0, 0, 1, 1, 1);                /* 1 duplicate */
    PUSH_ERR(&P[1], 0, 0, 3, 1, 3, GIFT_ESTEP);
    PULL(&P[2], 0, 0, 0); /* 1 pull, answered */
    take_at(&P[2], GIFT__ENVELOPE__MSG_PULL_REPLY, __LINE__);
    PULL(&P[2], 0, 0, 1);                 /* 1 pull, parked */
    PULL_ERR(&P[2], 0, 0, 9, GIFT_ESTEP); /* 1 pull, refused */
    ck_assert_msg(c->pushes == 5 && c->duplicates == 2 && c->steps_finished == 1 && c->pulls == 3,
                  "pushes %" PRIu64 " duplicates %" PRIu64 " steps %" PRIu64 " pulls %" PRIu64,
                  c->pushes, c->duplicates, c->steps_finished, c->pulls);
    ck_assert_msg(c->push_bytes_in[GIFT_FMT_F32] == 5 * plen, "push_bytes_in f32 %" PRIu64,
                  c->push_bytes_in[GIFT_FMT_F32]);
    ck_assert_msg(c->pull_bytes_out[GIFT_FMT_F32] == plen, "pull_bytes_out f32 %" PRIu64,
                  c->pull_bytes_out[GIFT_FMT_F32]);
    ck_assert_msg(c->frames_in - frames_in0 == 11, "frames_in +%" PRIu64,
                  c->frames_in - frames_in0);
    ck_assert_msg(c->frames_out - frames_out0 == 10, "frames_out +%" PRIu64,
                  c->frames_out - frames_out0);
    /* bytes_in counts preamble, header and payload of every frame; the 11
     * headers here are between 2 and 40 bytes each. */
    ck_assert_msg(c->bytes_in - bytes_in0 >= 11 * (GIFT_PREAMBLE_BYTES + 2) + 8 * plen &&
                      c->bytes_in - bytes_in0 <= 11 * (GIFT_PREAMBLE_BYTES + 40) + 8 * plen,
                  "bytes_in +%" PRIu64 " (payloads %" PRIu64 ")", c->bytes_in - bytes_in0,
                  (uint64_t)(8 * plen));
    EXPECT_ERRORS(1, GIFT_ESTEP, 2);
    QUIET_ALL();
}
END_TEST

START_TEST(test_hit_rate)
{
    gift_shard_opts_t o = O;
    gift_tensor_status_t ts;
    size_t n;
    float *x;
    o.hits_every = 1;
    reopen(&o);
    hello_all();
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    /* f32 pushes, e5m2 pull: one huge value in the block flushes the small ones. */
    n = chunk_n(chunk_of(5, 0));
    x = malloc(n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++)
        x[i] = i == 0 ? 1.0e4f : 1e-6f;
    ck_assert_int_eq(gift_shard_tensor_status(S, 5, &ts, NULL, 0), 0);
    ck_assert_msg(ts.hit_rate == 0.0, "hit rate %.3f before any step", ts.hit_rate);
    for (int r = 0; r < W; r++)
        push_ok_at(&P[r], 5, 0, 0, 0, x, 0, __LINE__);
    ck_assert_int_eq(gift_shard_tensor_status(S, 5, &ts, NULL, 0), 0);
    ck_assert_msg(fabs(ts.hit_rate - (double)(n - 1) / n) < 1e-12, "hit rate %.4f, wanted %.4f",
                  ts.hit_rate, (double)(n - 1) / n);
    free(x);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Teardown with buffers in flight                                       */
/* ------------------------------------------------------------------ */

START_TEST(test_free_with_buffers_in_flight)
{
    uint64_t q;
    sent_t *rep, *geo;
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    for (int r = 0; r < W; r++)
        GEO_PUSH(&P[r], 0, 0, 0, (uint32_t)r);
    q = PULL(&P[1], 0, 0, 0);
    rep = EXPECT_REPLY(&P[1], 0, 0, 0, 0, q);
    ck_assert_int_eq(georeq_raw(&P[2], 0, 0), 0);
    geo = take_at(&P[2], GIFT__ENVELOPE__MSG_GEOMETRY, __LINE__);
    /* Parked pulls at free time as well. */
    PULL(&P[3], 0, 0, 1);
    GEO_PUSH(&P[3], 1, 0, 0, 3);
    PULL(&P[3], 0, 1, 0);
    ck_assert_msg(rep->buf->refs == 2 && geo->buf->refs == 2, "refs %u and %u", rep->buf->refs,
                  geo->buf->refs);
    for (int i = 0; i < NPEER; i++)
        peer_gone(&P[i]);
    gift_shard_free(S);
    S = NULL;
    /* The writes still own their bytes. */
    ck_assert_msg(rep->buf->refs == 1 && geo->buf->refs == 1, "refs after free %u and %u",
                  rep->buf->refs, geo->buf->refs);
    ck_assert(memcmp(rep->buf->data, rep->copy, rep->len) == 0);
    ck_assert(memcmp(geo->buf->data, geo->copy, geo->len) == 0);
    /* fx_teardown drops them; ASan reports any leak. */
}
END_TEST

START_TEST(test_rbuf)
{
    gift_rbuf_t *b = gift_rbuf_new(100), *z = gift_rbuf_new(0);
    ck_assert(b != NULL && z != NULL);
    ck_assert_msg(b->refs == 1 && b->cap == 100 && b->len == 0 && ((uintptr_t)b->data & 63) == 0,
                  "refs %u cap %zu len %zu data %p", b->refs, b->cap, b->len, (void *)b->data);
    for (size_t i = 0; i < 100; i++)
        ck_assert_msg(b->data[i] == 0, "byte %zu not zeroed", i);
    gift_rbuf_ref(b);
    gift_rbuf_unref(b);
    ck_assert_int_eq(b->refs, 1);
    gift_rbuf_unref(b);
    gift_rbuf_unref(z);
    gift_rbuf_unref(NULL);
}
END_TEST

START_TEST(test_new_invalid)
{
    gift_shard_opts_t o;
    gift_shard_io_t io = IO;
    memset(&o, 0, sizeof o);
    ck_assert_ptr_null(gift_shard_new(&o, &IO)); /* num_shards 0 */
    o.num_shards = 2;
    o.shard_id = 2;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    o.shard_id = 1;
    ck_assert_ptr_null(gift_shard_new(NULL, &IO));
    ck_assert_ptr_null(gift_shard_new(&o, NULL));
    io.send = NULL;
    ck_assert_ptr_null(gift_shard_new(&o, &io));
    io = IO;
    io.close = NULL;
    ck_assert_ptr_null(gift_shard_new(&o, &io));
    o.geometry_decay = 1.0;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    o.geometry_decay = -0.25;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    o.geometry_decay = NAN;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    gift_shard_free(NULL);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Known bugs: the intended behaviour, where shard.c differs today       */
/* ------------------------------------------------------------------ */

/* A Hello carrying a payload is a payload on a message that takes none. */
START_TEST(test_bug_hello_payload)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    uint8_t junk[32] = {0};
    int rc;
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = 0;
    h.world_size = W;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    rc = feed(&P[0], &env, junk, sizeof junk);
    ck_assert_msg(rc == GIFT_EPROTO, "hello with a %zu-byte payload: rc %d (%s), wanted EPROTO",
                  sizeof junk, rc,
                  unread(&P[0]) ? gift_msg_name(P[0].f[P[0].seen]->env) : "nothing");
    EXPECT_ERROR(&P[0], GIFT_EPROTO, 1);
}
END_TEST

/* A refused push must leave no trace: here the first push of a chunk is
 * refused (NaN code) for step 5, and the cluster then starts at step 0. */
START_TEST(test_bug_refused_first_push_sets_base)
{
    const tdesc_t *t = &STD_T[2];
    size_t n = (size_t)STD_C[2].rows * t->cols, len;
    gift_codec_params_t p = params_of(t->push_fmt, t->push_block);
    gift_layout_t l;
    float *x;
    uint8_t *b;
    uint64_t q;
    fx_std_declare();
    x = grad(2, 0, 0, 0);
    b = encode(&p, x, n, &len);
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
    b[l.code_off] = 0x7F;
    ck_assert_int_eq(push_raw(&P[0], 2, 0, 5, 0, E4M3, 32, b, len), 0);
    EXPECT_ERROR(&P[0], GIFT_EBADCODE, 0);
    for (int r = 0; r < W; r++) {
        float *y = grad(2, 0, (uint32_t)r, 0);
        int rc = push_x(&P[r], 2, 0, 0, 0, y);
        const Gift__PushAck *a;
        free(y);
        ck_assert_int_eq(rc, 0);
        a = take_at(&P[r], GIFT__ENVELOPE__MSG_PUSH_ACK, __LINE__)->env->push_ack;
        ck_assert_msg(!a->duplicate,
                      "rank %d's first push of step 0 was taken for a replay: the refused push of "
                      "step 5 set the chunk's base step",
                      r);
    }
    q = PULL(&P[0], 2, 0, 0);
    EXPECT_REPLY(&P[0], 2, 0, 0, 0, q);
    free(x);
    free(b);
}
END_TEST

/* A Hello that is refused must not fix the world size (no Hello does now:
 * the first Declare does). */
START_TEST(test_bug_refused_hello_sets_world)
{
    int rc = hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 9, 8, NULL, 0); /* rank 9 of 8 */
    ck_assert_int_eq(rc, GIFT_EWORLD);
    EXPECT_ERROR(&P[0], GIFT_EWORLD, 1);
    rc = hello_raw(&P[1], GIFT_PROTOCOL_VERSION, 0, W, NULL, 0);
    ck_assert_int_eq(rc, 0);
    (void)take_at(&P[1], GIFT__ENVELOPE__MSG_HELLO_ACK, __LINE__);
    /* No Hello fixes the world size any more; the first Declare does. */
    DECLARE_OK(&P[1], STD_T, STD_NT, STD_C, STD_NC);
    ck_assert_msg(gift_shard_world_size(S) == W,
                  "a correct hello (world %d) after a refused one (world 8): rc %d, shard world %u",
                  W, rc, gift_shard_world_size(S));
}
END_TEST

/* The owner accepts a push of step t+1 under epoch 0 while the sketches of
 * refresh step t are still coming in; once they complete, epoch 1 is valid
 * from t+1 and the other ranks' pushes of t+1 are accepted under epoch 1.
 * Step t+1 then sums gradients in two coordinate systems. */
START_TEST(test_bug_owner_mixes_epochs)
{
    float *Y[W];
    double tr[W];
    sent_t *g0;
    uint32_t accepted_epochs = 0; /* bit e: a push of step 2 under epoch e was accepted */
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    g0 = take_at(&P[0], GIFT__ENVELOPE__MSG_GEOMETRY, __LINE__);
    for (int r = 0; r < W; r++) {
        Y[r] = malloc((size_t)GDIN * GKS * 4);
        ck_assert_ptr_nonnull(Y[r]);
        make_sketch((uint32_t)r, 1, (const float *)g0->copy, Y[r], &tr[r]);
    }
    /* Step 0 done; refresh step 1: rank 0 sketches, pushes 1, and (pipelined) pushes 2 under epoch
     * 0. */
    for (int r = 0; r < W; r++)
        GEO_PUSH(&P[r], 0, 0, 0, (uint32_t)r);
    sketch_ok_at(&P[0], 1, 0, tr[0], Y[0], 0, __LINE__);
    GEO_PUSH(&P[0], 0, 1, 0, 0);
    {
        float *x = grad(0, 0, 0, 2);
        ck_assert_int_eq(push_x(&P[0], 0, 0, 2, 0, x), 0);
        free(x);
        if (take_any(&P[0])->env->msg_case == GIFT__ENVELOPE__MSG_PUSH_ACK)
            accepted_epochs |= 1u << 0;
    }
    for (int r = 1; r < W; r++) {
        sketch_ok_at(&P[r], 1, 0, tr[r], Y[r], 0, __LINE__);
        GEO_PUSH(&P[r], 0, 1, 0, (uint32_t)r);
    }
    ck_assert_msg(C()->epochs_published == 1, "epochs_published %" PRIu64, C()->epochs_published);
    for (int r = 1; r < W; r++) {
        float *x = grad(0, 0, (uint32_t)r, 2);
        ck_assert_int_eq(push_x(&P[r], 0, 0, 2, 1, x), 0);
        free(x);
        if (take_any(&P[r])->env->msg_case == GIFT__ENVELOPE__MSG_PUSH_ACK)
            accepted_epochs |= 1u << 1;
    }
    ck_assert_msg(accepted_epochs != 3, "step 2 of tensor 0 accepted pushes under epochs 0 and 1: "
                                        "its mean mixes two coordinate systems");
    for (int r = 0; r < W; r++)
        free(Y[r]);
}
END_TEST

/* ------------------------------------------------------------------ */

/* ------------------------------------------------------------------ */
/* Ordered aggregation                                                   */
/* ------------------------------------------------------------------ */

/* Values whose float sum depends on the order: 1e8 + 3 rounds to 1e8. */
static void cancel_grad(uint32_t rank, size_t n, float *x)
{
    static const float v[W] = {1e8f, 3.0f, -1e8f, 5.0f};
    for (size_t j = 0; j < n; j++)
        x[j] = v[rank] * (float)(1 + j % 5);
}

/* Runs 24 steps of tensor 0 (f32) with every arrival order of 4 ranks under
 * the given mode; returns how many steps' replies differ from step 0's. */
static int replies_that_differ(int mode)
{
    gift_shard_opts_t o;
    int perm[24][4], differ = 0;
    size_t n = chunk_n(&STD_C[0]), rlen = 0;
    float x[W][7 * 13];
    uint8_t *first = NULL;

    memset(&o, 0, sizeof o);
    o.num_shards = 1;
    o.max_parked = 64;
    o.aggregate = mode;
    reopen(&o);
    fx_std_declare();
    perms4(perm);
    ck_assert(n == 7 * 13);
    for (uint32_t r = 0; r < W; r++)
        cancel_grad(r, n, x[r]);
    for (uint64_t step = 0; step < 24; step++) {
        sent_t *rep;
        uint64_t q;
        for (int i = 0; i < W; i++)
            push_ok_at(&P[perm[step][i]], 0, 0, step, 0, x[perm[step][i]], 0, __LINE__);
        q = PULL(&P[0], 0, 0, step);
        rep = EXPECT_REPLY(&P[0], 0, 0, step, 0, q);
        if (first == NULL) {
            rlen = rep->len;
            first = malloc(rlen);
            ck_assert_ptr_nonnull(first);
            memcpy(first, rep->copy, rlen);
        } else if (rep->len != rlen || memcmp(rep->copy, first, rlen) != 0) {
            differ++;
        }
        QUIET_ALL();
        io_release(&P[0]);
    }
    if (mode == GIFT_SHARD_ORDERED) {
        /* Rank order: ((1e8 + 3) - 1e8) + 5 = 5, times 1/4. */
        float got;
        memcpy(&got, first, 4);
        ck_assert_msg(got == 1.25f, "ordered mean of element 0 is %.9g, wanted 1.25", got);
    }
    free(first);
    return differ;
}

/* The same pushes in all 24 arrival orders: ordered replies are
 * bit-identical; eager ones are not for these values. */
START_TEST(test_ordered_bit_identical)
{
    int d_ordered = replies_that_differ(GIFT_SHARD_ORDERED);
    int d_eager = replies_that_differ(GIFT_SHARD_EAGER);
    ck_assert_msg(d_ordered == 0, "ordered: %d of 23 orders gave other bytes than rank order",
                  d_ordered);
    ck_assert_msg(d_eager > 0, "eager: every order gave the same bytes (the test data should "
                               "make the sum order-dependent)");
    if (getenv("GIFT_TEST_VERBOSE"))
        printf("arrival orders with other bytes than the first: ordered %d/23, eager %d/23\n",
               d_ordered, d_eager);
}
END_TEST

/* An early push with a bad payload is refused (validated on arrival, not
 * only when its turn in rank order comes) and leaves nothing behind. */
START_TEST(test_ordered_validates_early_push)
{
    size_t n = chunk_n(chunk_of(2, 0)), len;
    gift_codec_params_t p = params_of(E4M3, 32);
    float *x = grad(2, 0, 3, 0);
    uint8_t *b = encode(&p, x, n, &len);
    const Gift__Error *e;
    uint64_t q, seq;

    memset(b, 0xff, 4); /* the first block scale becomes NaN */
    ck_assert_int_eq(push_raw(&P[3], 2, 0, 0, 0, E4M3, 32, b, len), 0);
    seq = g_seq - 1;
    e = EXPECT_ERROR(&P[3], GIFT_EBADCODE, 0);
    ck_assert_msg(e->seq == seq, "error seq %" PRIu64, e->seq);
    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], 2, 0, 0, (uint32_t)r, 0);
    q = PULL(&P[0], 2, 0, 0);
    {
        sent_t *rep = EXPECT_REPLY(&P[0], 2, 0, 0, 0, q);
        size_t rlen;
        uint8_t *ref = reference(2, 0, 0, NULL, W, &rlen, NULL, NULL);
        EXPECT_BYTES(rep, ref, rlen);
        free(ref);
    }
    QUIET_ALL();
    free(b);
    free(x);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Persistence                                                           */
/* ------------------------------------------------------------------ */

static char g_dir[64];

static void dir_clear(const char *dir)
{
    static const char *names[] = {"checkpoint", "checkpoint.tmp", NULL};
    char path[256];
    for (int i = 0; names[i]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    for (int g = 0; g < 64; g++) {
        snprintf(path, sizeof path, "%s/log-%d", dir, g);
        unlink(path);
    }
}

static void fx_persist(void)
{
    strcpy(g_dir, "/tmp/gift-test-ckpt-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    fx_base();
}

static void fx_persist_teardown(void)
{
    fx_teardown();
    dir_clear(g_dir);
    rmdir(g_dir);
}

/* Replaces the shard by one persisting to g_dir (every cs steps) and
 * restores it; returns what gift_shard_restore returned (err in *why). */
static double g_decay; /* geometry_decay of the persisting shards */

static int persist_open(uint32_t shard_id, uint32_t num_shards, uint32_t cs, char *why,
                        size_t whylen)
{
    gift_shard_opts_t o;
    memset(&o, 0, sizeof o);
    o.shard_id = shard_id;
    o.num_shards = num_shards;
    o.max_parked = 64;
    o.geometry_decay = g_decay;
    o.data_dir = g_dir;
    o.checkpoint_steps = cs;
    reopen(&o);
    return gift_shard_restore(S, why, whylen);
}

static void persist_open_ok(uint32_t cs, int want)
{
    char why[512];
    int rc = persist_open(0, 1, cs, why, sizeof why);
    ck_assert_msg(rc == want, "restore returned %d, wanted %d: %s", rc, want, why);
}

/* Pushes step `step` of every standard chunk from every rank (data set
 * step), then pulls it on rank 0 and keeps the bytes in keep[chunk]. */
static void std_step(uint64_t step, uint8_t **keep, size_t *keep_len)
{
    for (size_t ci = 0; ci < STD_NC; ci++) {
        const cdesc_t *c = &STD_C[ci];
        sent_t *rep;
        uint64_t q;
        for (int r = 0; r < W; r++)
            PUSH_GRAD(&P[r], c->key, c->chunk, step, (uint32_t)r, step);
        q = PULL(&P[0], c->key, c->chunk, step);
        rep = EXPECT_REPLY(&P[0], c->key, c->chunk, step, 0, q);
        if (keep != NULL) {
            free(keep[ci]);
            keep[ci] = malloc(rep->len);
            ck_assert_ptr_nonnull(keep[ci]);
            memcpy(keep[ci], rep->copy, rep->len);
            keep_len[ci] = rep->len;
        }
        QUIET_ALL();
        io_release(&P[0]);
    }
}

/* The replies of steps 8 and 9 kept by a shard that was freed without a
 * checkpoint of them (as by SIGKILL) come back byte for byte from the
 * checkpoint plus the step log; the step in progress is replayed by the
 * clients; a checkpoint written on demand round-trips the same way. */
START_TEST(test_persist_round_trip)
{
    uint8_t *k8[STD_NC] = {0}, *k9[STD_NC] = {0};
    size_t l8[STD_NC], l9[STD_NC];
    char why[512];

    persist_open_ok(4, 0);
    fx_std_declare();
    for (uint64_t step = 0; step < 10; step++)
        std_step(step, step == 8 ? k8 : step == 9 ? k9 : NULL, step == 8 ? l8 : l9);
    ck_assert_msg(C()->checkpoints == 2, "checkpoints %" PRIu64 " after 10 steps every 4",
                  C()->checkpoints);
    ck_assert_msg(C()->log_records > 0 && C()->log_failures == 0, "log records %" PRIu64
                  " failures %" PRIu64, C()->log_records, C()->log_failures);
    /* Step 10 partly pushed: not durable, the clients replay it. */
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], 0, 0, 10, (uint32_t)r, 10);

    for (int round = 0; round < 2; round++) {
        persist_open_ok(4, 1);
        ck_assert_msg(gift_shard_tensor_count(S) == STD_NT && C()->restored_step == 10,
                      "restored %zu tensors, step %" PRIu64, gift_shard_tensor_count(S),
                      C()->restored_step);
        fx_std_declare(); /* clients reconnect: Hello, the same Declare */
        for (size_t ci = 0; ci < STD_NC; ci++) {
            const cdesc_t *c = &STD_C[ci];
            uint64_t q = PULL(&P[1], c->key, c->chunk, 8);
            EXPECT_BYTES(EXPECT_REPLY(&P[1], c->key, c->chunk, 8, 0, q), k8[ci], l8[ci]);
            q = PULL(&P[2], c->key, c->chunk, 9);
            EXPECT_BYTES(EXPECT_REPLY(&P[2], c->key, c->chunk, 9, 0, q), k9[ci], l9[ci]);
            PULL_ERR(&P[3], c->key, c->chunk, 7, GIFT_ESTEP);
            PUSH_DUP(&P[3], c->key, c->chunk, 9, 3, 9);
        }
        QUIET_ALL();
        if (round == 0) {
            /* Step 10 from every rank again (replay) finishes it normally. */
            std_step(10, NULL, NULL);
            std_step(11, NULL, NULL);
            ck_assert_int_eq(gift_shard_checkpoint(S, why, sizeof why), 0);
            /* Rewind the expectations: the next restore is at step 12. */
            for (size_t ci = 0; ci < STD_NC; ci++) {
                const cdesc_t *c = &STD_C[ci];
                uint64_t q = PULL(&P[0], c->key, c->chunk, 10);
                sent_t *rep = EXPECT_REPLY(&P[0], c->key, c->chunk, 10, 0, q);
                free(k8[ci]);
                k8[ci] = malloc(rep->len);
                memcpy(k8[ci], rep->copy, rep->len);
                l8[ci] = rep->len;
                q = PULL(&P[0], c->key, c->chunk, 11);
                rep = EXPECT_REPLY(&P[0], c->key, c->chunk, 11, 0, q);
                free(k9[ci]);
                k9[ci] = malloc(rep->len);
                memcpy(k9[ci], rep->copy, rep->len);
                l9[ci] = rep->len;
            }
            QUIET_ALL();
        }
        if (round == 1)
            break;
        /* The second round checks steps 10 and 11 at pulls of "8" and "9" + 2. */
        persist_open_ok(4, 1);
        ck_assert_msg(C()->restored_step == 12, "restored step %" PRIu64, C()->restored_step);
        fx_std_declare();
        for (size_t ci = 0; ci < STD_NC; ci++) {
            const cdesc_t *c = &STD_C[ci];
            uint64_t q = PULL(&P[1], c->key, c->chunk, 10);
            EXPECT_BYTES(EXPECT_REPLY(&P[1], c->key, c->chunk, 10, 0, q), k8[ci], l8[ci]);
            q = PULL(&P[2], c->key, c->chunk, 11);
            EXPECT_BYTES(EXPECT_REPLY(&P[2], c->key, c->chunk, 11, 0, q), k9[ci], l9[ci]);
        }
        QUIET_ALL();
        break;
    }
    for (size_t ci = 0; ci < STD_NC; ci++) {
        free(k8[ci]);
        free(k9[ci]);
    }
}
END_TEST

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
static const cdesc_t PEF_C[] = {{0, 0, 0, 6}, {1, 0, 0, 5}, {2, 0, 0, 4}, {2, 1, 4, 6},
                                {3, 0, 0, 4}, {4, 0, 0, 3}};
#define PEF_NT (sizeof PEF_T / sizeof PEF_T[0])
#define PEF_NC (sizeof PEF_C / sizeof PEF_C[0])
#define PEF_MASK 0x17u /* keys 0, 1, 2, 4 */

static void pef_declare(void)
{
    g_pull_ef = PEF_MASK;
    hello_all();
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], PEF_T, PEF_NT, PEF_C, PEF_NC);
}

/* The reference of pull error feedback for one chunk, step by step: the
 * shard's mean m (rank order, * 1/W + 0) plus the residual e, encoded with
 * the pull codec; e becomes v - decode(encode(v)). Starts from e = 0. */
typedef struct pef_ref {
    float *e[PEF_NC];
} pef_ref_t;

static uint8_t *pef_reference(pef_ref_t *st, const cdesc_t *c, size_t ci, uint64_t v,
                              size_t *len)
{
    const tdesc_t *t = tensor_of(c->key);
    size_t n = chunk_n(c);
    gift_codec_params_t pp = params_of(t->push_fmt, t->push_block);
    gift_codec_params_t qp = params_of(t->pull_fmt, t->pull_block);
    float *acc = calloc(n, sizeof *acc), *dec = malloc(n * sizeof *dec);
    uint8_t *out;
    ck_assert(acc && dec);
    if (st->e[ci] == NULL)
        ck_assert_ptr_nonnull(st->e[ci] = calloc(n, sizeof(float)));
    for (int r = 0; r < W; r++) {
        float *x = grad(c->key, c->chunk, (uint32_t)r, v);
        size_t plen;
        uint8_t *b = encode(&pp, x, n, &plen);
        ck_assert_int_eq(gift_decode_acc(&pp, b, plen, n, acc), 0);
        free(b);
        free(x);
    }
    for (size_t j = 0; j < n; j++)
        acc[j] = (acc[j] * (1.0f / (float)W) + 0.0f) + st->e[ci][j];
    out = encode(&qp, acc, n, len);
    ck_assert_int_eq(gift_decode(&qp, out, *len, n, dec), 0);
    for (size_t j = 0; j < n; j++)
        st->e[ci][j] = acc[j] - dec[j];
    free(acc);
    free(dec);
    return out;
}

/* Step `step` (data set step) of every PEF chunk from every rank, pulled
 * on rank step % W and checked byte for byte against the EF reference
 * (key 3: against reference(), no feedback). Returns how many chunks'
 * replies differ from the reply without feedback. */
static int pef_step(pef_ref_t *st, uint64_t step, int line)
{
    int differs = 0;
    for (size_t ci = 0; ci < PEF_NC; ci++) {
        const cdesc_t *c = &PEF_C[ci];
        fake_t *fp = &P[step % W];
        size_t len, plen;
        uint8_t *want = c->key == 3 ? reference(c->key, c->chunk, step, NULL, W, &len, NULL, NULL)
                                    : pef_reference(st, c, ci, step, &len);
        uint8_t *plain = reference(c->key, c->chunk, step, NULL, W, &plen, NULL, NULL);
        sent_t *rep;
        uint64_t q;
        for (int r = 0; r < W; r++)
            push_grad_at(&P[r], c->key, c->chunk, step, 0, (uint32_t)r, step, 0, line);
        q = pull_at(fp, c->key, c->chunk, step, line);
        rep = expect_reply_at(fp, c->key, c->chunk, step, 0, q, line);
        expect_bytes_at(rep, want, len, line);
        differs += plen != len || memcmp(plain, want, len) != 0;
        QUIET_ALL();
        io_release(fp);
        free(want);
        free(plain);
    }
    return differs;
}

static void pef_ref_free(pef_ref_t *st)
{
    for (size_t ci = 0; ci < PEF_NC; ci++)
        free(st->e[ci]);
}

/* Every step's reply is the EF reference's, byte for byte, and from the
 * second step on the lossy EF chunks' replies differ from plain ones (the
 * residual is really added); f32 pulls ignore the flag (see shard.c). */
START_TEST(test_pull_ef)
{
    pef_ref_t st = {{0}};
    int d0, later = 0;
    pef_declare();
    d0 = pef_step(&st, 0, __LINE__);
    ck_assert_msg(d0 == 0, "step 0 (zero residual): %d replies differ from plain ones", d0);
    for (uint64_t step = 1; step < 6; step++)
        later += pef_step(&st, step, __LINE__);
    /* 5 chunks with feedback x 5 steps; bf16's residual can round to the same
     * codes now and then, so ask for most, not all. */
    ck_assert_msg(later >= 20, "only %d of 25 EF replies differ from plain ones", later);
    pef_ref_free(&st);
}
END_TEST

/* The residual belongs to one geometry epoch: a non-owner shard (no basis to
 * rebase it with) starts a step of a new epoch from zero, so that step's
 * reply is the plain mean's, and feedback resumes from there. */
static const tdesc_t PEFG_T[] = {{0, "pef.geo", 16, GDIN, E4M3, 32, NVFP4, 0, 1, GK, GKS, 4, 1234}};
static const cdesc_t PEFG_C[] = {{0, 1, 10, 6}};

START_TEST(test_pull_ef_epoch)
{
    pef_ref_t st = {{0}};
    const cdesc_t *c = &PEFG_C[0];
    g_pull_ef = 1;
    hello_all();
    DECLARE_OK(&P[0], PEFG_T, 1, PEFG_C, 1);
    for (uint64_t step = 0; step < 6; step++) {
        uint32_t epoch = step < 3 ? 0 : 1;
        fake_t *fp = &P[step % W];
        size_t len, plen;
        uint8_t *want, *plain = reference(0, 1, step, NULL, W, &plen, NULL, NULL);
        sent_t *rep;
        uint64_t q;
        if (step == 3) { /* the reference's residual too */
            free(st.e[0]);
            st.e[0] = NULL;
        }
        want = pef_reference(&st, c, 0, step, &len);
        for (int r = 0; r < W; r++)
            push_grad_at(&P[r], 0, 1, step, epoch, (uint32_t)r, step, 0, __LINE__);
        q = pull_at(fp, 0, 1, step, __LINE__);
        rep = expect_reply_at(fp, 0, 1, step, epoch, q, __LINE__);
        expect_bytes_at(rep, want, len, __LINE__);
        ck_assert_msg((step == 0 || step == 3) == (plen == len && memcmp(plain, want, len) == 0),
                      "step %" PRIu64 ": the reply %s the plain mean's", step,
                      step == 0 || step == 3 ? "differs from" : "equals");
        QUIET_ALL();
        io_release(fp);
        free(want);
        free(plain);
    }
    pef_ref_free(&st);
}
END_TEST

/* The residual is durable like the replies: a shard killed after step 9
 * (checkpoint at 8, step 9 in the log) resumes with it, so steps 10-13 are
 * the uninterrupted run's bytes; again after an on-demand checkpoint. */
START_TEST(test_persist_pull_ef)
{
    pef_ref_t st = {{0}};
    char why[512];
    persist_open_ok(4, 0);
    pef_declare();
    for (uint64_t step = 0; step < 10; step++)
        pef_step(&st, step, __LINE__);
    persist_open_ok(4, 1);
    ck_assert_msg(C()->restored_step == 10, "restored step %" PRIu64, C()->restored_step);
    pef_declare();
    for (uint64_t step = 10; step < 12; step++)
        pef_step(&st, step, __LINE__);
    ck_assert_int_eq(gift_shard_checkpoint(S, why, sizeof why), 0);
    persist_open_ok(4, 1);
    ck_assert_msg(C()->restored_step == 12, "restored step %" PRIu64, C()->restored_step);
    pef_declare();
    for (uint64_t step = 12; step < 14; step++)
        pef_step(&st, step, __LINE__);
    pef_ref_free(&st);
}
END_TEST

/* A sketch round cut by a kill (two of four sketches in) continues after the
 * restore, the replayed sketches are duplicates, and the epoch it builds is
 * the one an uninterrupted round builds; the published epoch survives the
 * next kill. */
START_TEST(test_persist_geometry)
{
    gift_geometry_t ref;
    float *Y[W], *ysum = calloc((size_t)GDIN * GKS, sizeof(float));
    double tr[W], trace_sum = 0;
    size_t ylen = (size_t)GDIN * GKS * 4;
    sent_t *g0;

    ck_assert_ptr_nonnull(ysum);
    persist_open_ok(100, 0);
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(gift_geometry_init(&ref, GDIN, GK, GKS, GEO_T[0].seed), 0);
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    g0 = expect_geometry_at(&P[1], &ref, 0, __LINE__);
    for (int r = 0; r < W; r++) {
        GEO_PUSH(&P[r], 0, 0, 0, (uint32_t)r);
        GEO_PUSH(&P[r], 1, 0, 0, (uint32_t)r);
        Y[r] = malloc(ylen);
        ck_assert_ptr_nonnull(Y[r]);
        make_sketch((uint32_t)r, 1, (const float *)g0->copy, Y[r], &tr[r]);
    }
    for (int r = 0; r < W; r++) {
        for (size_t j = 0; j < (size_t)GDIN * GKS; j++)
            ysum[j] += Y[r][j];
        trace_sum += tr[r];
    }
    ck_assert_int_eq(gift_geometry_update(&ref, ysum, trace_sum, GIFT_DAMPING_DEFAULT), 0);
    sketch_ok_at(&P[2], 1, 0, tr[2], Y[2], 0, __LINE__);
    sketch_ok_at(&P[0], 1, 0, tr[0], Y[0], 0, __LINE__);
    QUIET_ALL();

    persist_open_ok(100, 1); /* killed with half a round */
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    sketch_ok_at(&P[0], 1, 0, tr[0], Y[0], 1, __LINE__); /* replayed: duplicate */
    sketch_ok_at(&P[1], 1, 0, tr[1], Y[1], 0, __LINE__);
    sketch_ok_at(&P[2], 1, 0, tr[2], Y[2], 1, __LINE__);
    ck_assert_msg(C()->epochs_published == 0, "published after 3 of 4 and duplicates");
    sketch_ok_at(&P[3], 1, 0, tr[3], Y[3], 0, __LINE__);
    ck_assert_msg(C()->epochs_published == 1, "not published after 4 of 4");
    QUIET_ALL();
    /* Exactly the epoch of an uninterrupted round (rank-ordered sum). */
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    expect_geometry_at(&P[1], &ref, 2, __LINE__);
    persist_open_ok(100, 1); /* killed after the epoch */
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    expect_geometry_at(&P[1], &ref, 2, __LINE__);
    sketch_ok_at(&P[3], 1, 0, tr[3], Y[3], 1, __LINE__); /* a replay of the finished round */
    /* Step 0 was finished before the first kill; step 1 under epoch 0. */
    GEO_PUSH_ERR(&P[0], 0, 1, 1, 0, GIFT_EEPOCH);
    for (int r = 0; r < W; r++)
        GEO_PUSH(&P[r], 0, 1, 0, (uint32_t)r);
    QUIET_ALL();
    for (int r = 0; r < W; r++)
        free(Y[r]);
    free(ysum);
    gift_geometry_free(&ref);
}
END_TEST

/* Sums the sketches of every rank for `round` against U in rank order (the
 * order of aggregate = ordered), into fresh Y[], ysum and *trace_sum. */
static void geo_round(uint64_t round, const float *U, float **Y, double *tr, float *ysum,
                      double *trace_sum)
{
    memset(ysum, 0, (size_t)GDIN * GKS * sizeof(float));
    *trace_sum = 0.0;
    for (int r = 0; r < W; r++) {
        Y[r] = malloc((size_t)GDIN * GKS * 4);
        ck_assert_ptr_nonnull(Y[r]);
        make_sketch((uint32_t)r, round, U, Y[r], &tr[r]);
        for (size_t j = 0; j < (size_t)GDIN * GKS; j++)
            ysum[j] += Y[r][j];
        *trace_sum += tr[r];
    }
}

/* geometry_decay: the first epoch is not averaged (the plain update), the
 * second averages onto the first with gift_geometry_decay_at's weight. The
 * second round, cut by a kill after a checkpoint, continues from the restored
 * geometry plus the logged sketches and publishes, bit for bit, the epoch
 * gift_geometry_update_decay builds uninterrupted; that epoch survives the
 * next kill (from the step log). */
START_TEST(test_persist_geometry_decay)
{
    gift_geometry_t ref, plain;
    float *Y1[W], *Y2[W], *ysum = calloc((size_t)GDIN * GKS, sizeof(float));
    double tr1[W], tr2[W], trace_sum;
    char why[512];
    sent_t *g;

    ck_assert_ptr_nonnull(ysum);
    g_decay = 0.75;
    persist_open_ok(100, 0);
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(gift_geometry_init(&ref, GDIN, GK, GKS, GEO_T[0].seed), 0);
    ck_assert_int_eq(gift_geometry_init(&plain, GDIN, GK, GKS, GEO_T[0].seed), 0);
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    g = expect_geometry_at(&P[1], &ref, 0, __LINE__);
    for (int r = 0; r < W; r++) {
        GEO_PUSH(&P[r], 0, 0, 0, (uint32_t)r);
        GEO_PUSH(&P[r], 1, 0, 0, (uint32_t)r);
    }

    /* Round 1 (step 1): the plain update, decay or not. */
    geo_round(1, (const float *)g->copy, Y1, tr1, ysum, &trace_sum);
    ck_assert_int_eq(gift_geometry_update(&plain, ysum, trace_sum, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_int_eq(
        gift_geometry_update_decay(&ref, ysum, trace_sum, GIFT_DAMPING_DEFAULT, g_decay), 0);
    for (int r = 0; r < W; r++)
        sketch_ok_at(&P[r], 1, 0, tr1[r], Y1[r], 0, __LINE__);
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    expect_geometry_at(&P[1], &plain, 2, __LINE__);
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    g = expect_geometry_at(&P[1], &ref, 2, __LINE__);
    ck_assert_int_eq(gift_shard_checkpoint(S, why, sizeof why), 0);

    /* Round 2 (step 2), against epoch 1's basis: averaged, so not the plain update. */
    geo_round(2, (const float *)g->copy, Y2, tr2, ysum, &trace_sum);
    ck_assert_int_eq(gift_geometry_update(&plain, ysum, trace_sum, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_int_eq(gift_geometry_update_decay(&ref, ysum, trace_sum, GIFT_DAMPING_DEFAULT,
                                                gift_geometry_decay_at(g_decay, ref.epoch)),
                     0);
    ck_assert_msg(memcmp(ref.lambda, plain.lambda, GKS * sizeof(float)) != 0 &&
                      ref.trace != plain.trace,
                  "decay %g changed nothing: trace %.17g", g_decay, ref.trace);
    sketch_ok_at(&P[3], 2, 1, tr2[3], Y2[3], 0, __LINE__);
    sketch_ok_at(&P[1], 2, 1, tr2[1], Y2[1], 0, __LINE__);
    QUIET_ALL();

    persist_open_ok(100, 1); /* killed with half of round 2, after the checkpoint */
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    sketch_ok_at(&P[1], 2, 1, tr2[1], Y2[1], 1, __LINE__); /* replayed: duplicate */
    sketch_ok_at(&P[2], 2, 1, tr2[2], Y2[2], 0, __LINE__);
    sketch_ok_at(&P[0], 2, 1, tr2[0], Y2[0], 0, __LINE__);
    ck_assert_msg(C()->epochs_published == 1, "epochs_published %" PRIu64 " after 4 of 4",
                  C()->epochs_published);
    QUIET_ALL();
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    expect_geometry_at(&P[1], &ref, 3, __LINE__);

    persist_open_ok(100, 1); /* killed after the averaged epoch */
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    expect_geometry_at(&P[1], &ref, 3, __LINE__);
    QUIET_ALL();
    for (int r = 0; r < W; r++) {
        free(Y1[r]);
        free(Y2[r]);
    }
    free(ysum);
    gift_geometry_free(&ref);
    gift_geometry_free(&plain);
    g_decay = 0.0;
}
END_TEST

/* Group commit: a finished step's pulls wait for gift_shard_flush (the
 * log's one sync per loop turn), parked or arriving late; then every one of
 * them is answered, and a restore brings the step back. */
START_TEST(test_persist_group_commit)
{
    gift_shard_opts_t o;
    char why[512];
    uint64_t q0, q1;

    memset(&o, 0, sizeof o);
    o.num_shards = 1;
    o.max_parked = 64;
    o.data_dir = g_dir;
    o.checkpoint_steps = 100;
    o.group_commit = 1;
    reopen(&o);
    ck_assert_int_eq(gift_shard_restore(S, why, sizeof why), 0);
    fx_std_declare();
    PUSH_GRAD(&P[0], 0, 0, 0, 0, 0);
    q0 = PULL(&P[0], 0, 0, 0);
    for (int r = 1; r < W; r++)
        PUSH_GRAD(&P[r], 0, 0, 0, (uint32_t)r, 0);
    q1 = PULL(&P[1], 0, 0, 0); /* finished, not yet synced: parks */
    QUIET_ALL();
    ck_assert_msg(C()->steps_finished == 1, "steps_finished %" PRIu64, C()->steps_finished);
    gift_shard_flush(S);
    EXPECT_REPLY(&P[0], 0, 0, 0, 0, q0);
    EXPECT_REPLY(&P[1], 0, 0, 0, 0, q1);
    QUIET_ALL();
    gift_shard_flush(S); /* nothing pending: nothing sent */
    QUIET_ALL();
    q1 = PULL(&P[2], 0, 0, 0); /* durable now: at once */
    EXPECT_REPLY(&P[2], 0, 0, 0, 0, q1);
    persist_open_ok(100, 1);
    ck_assert_msg(C()->restored_step == 1, "restored step %" PRIu64, C()->restored_step);
}
END_TEST

static uint8_t *file_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *b;
    long n;
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = malloc(n > 0 ? (size_t)n : 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void file_write(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_int_eq(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* Restores from the damaged files and expects a refusal naming the cause,
 * with nothing loaded. */
static void refused_at(const char *want, uint32_t shard_id, uint32_t num_shards, int line)
{
    char why[512];
    int rc = persist_open(shard_id, num_shards, 100, why, sizeof why);
    ck_assert_msg(rc < 0, "line %d: a damaged state was accepted (rc %d)", line, rc);
    ck_assert_msg(strstr(why, want) != NULL, "line %d: refusal '%s' does not say '%s'", line, why,
                  want);
    ck_assert_msg(gift_shard_tensor_count(S) == 0, "line %d: %zu tensors half-loaded", line,
                  gift_shard_tensor_count(S));
}
#define REFUSED(want) refused_at((want), 0, 1, __LINE__)

/* A checkpoint with a flipped byte, cut short, empty, or of another shard,
 * and a step log damaged before its end, are refused whole; a log whose last
 * record was cut short (a crash inside its write) loses only that record. */
START_TEST(test_persist_corrupt)
{
    char ck[128], lg[128], why[512];
    uint8_t *good, *glog, *bad;
    size_t len, llen;

    persist_open_ok(100, 0);
    fx_std_declare();
    for (uint64_t step = 0; step < 3; step++)
        std_step(step, NULL, NULL);
    ck_assert_int_eq(gift_shard_checkpoint(S, why, sizeof why), 0);
    std_step(3, NULL, NULL);
    std_step(4, NULL, NULL);
    snprintf(ck, sizeof ck, "%s/checkpoint", g_dir);
    snprintf(lg, sizeof lg, "%s/log-1", g_dir);
    good = file_read(ck, &len);
    glog = file_read(lg, &llen);
    ck_assert_msg(llen > 2 * 100, "log of %zu bytes", llen);
    bad = malloc((len > llen ? len : llen) + 64);
    ck_assert_ptr_nonnull(bad);

    memcpy(bad, good, len);
    bad[len / 2] ^= 0x10;
    file_write(ck, bad, len);
    REFUSED("checksum");
    file_write(ck, good, len / 2);
    REFUSED("truncated");
    file_write(ck, good, 0);
    REFUSED("not a giftd checkpoint");
    memcpy(bad, good, len);
    bad[8] = 9; /* version */
    file_write(ck, bad, len);
    REFUSED("version");
    file_write(ck, good, len);
    refused_at("shard 0 of 1", 1, 2, __LINE__);

    /* A log damaged in its first record, with more after it. */
    memcpy(bad, glog, llen);
    bad[20] ^= 0x01;
    file_write(lg, bad, llen);
    REFUSED("corrupt");
    /* The same log cut inside its last record: that record is dropped. */
    file_write(lg, glog, llen - 3);
    persist_open_ok(100, 1);
    ck_assert_msg(C()->restored_step == 4, "restored step %" PRIu64 " (the last step 4 record "
                  "was cut, so step 4 is open again)", C()->restored_step);
    fx_std_declare();
    {
        /* The clients replay step 4: new for the last chunk, duplicates elsewhere. */
        const cdesc_t *c = &STD_C[STD_NC - 1];
        uint64_t q;
        for (int r = 0; r < W; r++) {
            PUSH_DUP(&P[r], 0, 0, 4, (uint32_t)r, 4);
            PUSH_GRAD(&P[r], c->key, c->chunk, 4, (uint32_t)r, 4);
        }
        q = PULL(&P[0], c->key, c->chunk, 4);
        EXPECT_REPLY(&P[0], c->key, c->chunk, 4, 0, q);
        QUIET_ALL();
    }

    /* Intact files again: everything back. */
    file_write(ck, good, len);
    file_write(lg, glog, llen);
    persist_open_ok(100, 1);
    ck_assert_msg(C()->restored_step == 5, "restored step %" PRIu64, C()->restored_step);
    /* A record whose head was cut after its magic: dropped, the rest kept. */
    memcpy(bad, glog, llen);
    memcpy(bad + llen, "GLR1\x02\0\0\0\x10", 9);
    file_write(lg, bad, llen + 9);
    persist_open_ok(100, 1);
    ck_assert_msg(C()->restored_step == 5, "restored step %" PRIu64, C()->restored_step);
    /* Garbage after the last record is damage, not a cut write. */
    memcpy(bad + llen, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", 32);
    file_write(lg, bad, llen + 32);
    REFUSED("corrupt");
    file_write(lg, glog, llen);
    free(good);
    free(glog);
    free(bad);
}
END_TEST

static Suite *shard_suite(void)
{
    Suite *s = suite_create("shard");
    TCase *hello = tcase_create("hello"), *declare = tcase_create("declare");
    TCase *sync = tcase_create("sync"), *geo = tcase_create("geometry");
    TCase *stats = tcase_create("stats"), *misc = tcase_create("misc");
    TCase *bugs = tcase_create("regressions");
    TCase *eager = tcase_create("eager"), *geo_eager = tcase_create("geometry_eager");
    TCase *ordered = tcase_create("ordered"), *persist = tcase_create("persist");

    tcase_add_checked_fixture(hello, fx_base, fx_teardown);
    tcase_add_test(hello, test_hello_ack);
    tcase_add_test(hello, test_hello_version);
    tcase_add_test(hello, test_hello_world);
    tcase_add_test(hello, test_hello_world_configured);
    tcase_add_test(hello, test_before_hello);
    tcase_add_test(hello, test_second_hello);
    tcase_add_test(hello, test_payload_on_bare_messages);
    tcase_add_test(hello, test_server_messages_from_client);
    tcase_add_test(hello, test_hello_digest);
    tcase_add_test(hello, test_reject);
    tcase_add_test(hello, test_pull_ef); /* declares a list of its own */
    tcase_add_test(hello, test_pull_ef_epoch); /* likewise */
    suite_add_tcase(s, hello);

    tcase_add_checked_fixture(declare, fx_hello, fx_teardown);
    tcase_add_test(declare, test_declare_redeclare);
    tcase_add_test(declare, test_declare_digest_mismatch);
    tcase_add_test(declare, test_declare_differs);
    tcase_add_test(declare, test_declare_invalid);
    tcase_add_test(declare, test_declare_chunk_id_bounds);
    tcase_add_test(declare, test_declare_memory_budget);
    tcase_add_test(declare, test_before_declare);
    suite_add_tcase(s, declare);

    tcase_add_checked_fixture(sync, fx_std, fx_teardown);
    tcase_set_timeout(sync, 60);
    tcase_add_test(sync, test_sync_all_orders);
    tcase_add_test(sync, test_reply_buffer_reuse);
    tcase_add_test(sync, test_duplicates);
    tcase_add_test(sync, test_park_share);
    tcase_add_test(sync, test_rank_one_connection);
    tcase_add_test(sync, test_step_window);
    tcase_add_test(sync, test_pipelining);
    tcase_add_test(sync, test_stall);
    tcase_add_test(sync, test_parked_peer_close);
    tcase_add_test(sync, test_parked_unlink_order);
    tcase_add_test(sync, test_send_failure);
    tcase_add_test(sync, test_bad_payloads);
    tcase_add_test(sync, test_mean_overflow);
    suite_add_tcase(s, sync);

    /* The same sums in arrival order (aggregate = eager). */
    tcase_add_checked_fixture(eager, fx_std_eager, fx_teardown);
    tcase_set_timeout(eager, 60);
    tcase_add_test(eager, test_sync_all_orders);
    tcase_add_test(eager, test_duplicates);
    tcase_add_test(eager, test_pipelining);
    tcase_add_test(eager, test_bad_payloads);
    suite_add_tcase(s, eager);
    tcase_add_checked_fixture(geo_eager, fx_hello_eager, fx_teardown);
    tcase_add_test(geo_eager, test_geometry_owner);
    suite_add_tcase(s, geo_eager);

    tcase_add_checked_fixture(geo, fx_hello, fx_teardown);
    tcase_add_test(geo, test_geometry_owner);
    tcase_add_test(geo, test_geometry_update_fails);
    tcase_add_test(geo, test_geometry_non_owner);
    tcase_add_test(geo, test_free_with_buffers_in_flight);
    suite_add_tcase(s, geo);

    tcase_add_checked_fixture(stats, fx_std, fx_teardown);
    tcase_add_test(stats, test_stats);
    tcase_add_test(stats, test_counters);
    tcase_add_test(stats, test_hit_rate);
    suite_add_tcase(s, stats);

    tcase_add_checked_fixture(misc, fx_hello, fx_teardown);
    tcase_add_test(misc, test_stats_large);
    tcase_add_test(misc, test_rbuf);
    tcase_add_test(misc, test_new_invalid);
    suite_add_tcase(s, misc);

    tcase_add_checked_fixture(ordered, fx_std, fx_teardown);
    tcase_add_test(ordered, test_ordered_bit_identical);
    tcase_add_test(ordered, test_ordered_validates_early_push);
    suite_add_tcase(s, ordered);

    tcase_add_checked_fixture(persist, fx_persist, fx_persist_teardown);
    tcase_set_timeout(persist, 60);
    tcase_add_test(persist, test_persist_round_trip);
    tcase_add_test(persist, test_persist_geometry);
    tcase_add_test(persist, test_persist_pull_ef);
    tcase_add_test(persist, test_persist_geometry_decay);
    tcase_add_test(persist, test_persist_corrupt);
    tcase_add_test(persist, test_persist_group_commit);
    suite_add_tcase(s, persist);

    tcase_add_checked_fixture(bugs, fx_base, fx_teardown);
    tcase_add_test(bugs, test_bug_hello_payload);
    tcase_add_test(bugs, test_bug_refused_first_push_sets_base);
    tcase_add_test(bugs, test_bug_refused_hello_sets_world);
    tcase_add_test(bugs, test_bug_owner_mixes_epochs);
    suite_add_tcase(s, bugs);
    return s;
}

int main(void)
{
    /* The shard logs every refusal; keep the test output readable. */
    if (getenv("GIFT_TEST_LOG") == NULL)
        gift_log_set_level(GIFT_LOG_LEVEL_ERROR);
    return gift_test_run(shard_suite(), CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
