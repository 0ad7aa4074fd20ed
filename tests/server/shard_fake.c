/*
 * shard_fake.c: the fake io and helpers of shard_fake.h.
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
#include "shard_fake.h"

struct fake_state G;

gift_shard_t *S;
fake_t P[NPEER];
gift_shard_opts_t O;

uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

int fake_send(void *ctx, const uint8_t *head, size_t head_len, gift_rbuf_t *buf, size_t off,
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

void fake_close(void *ctx)
{
    fake_t *fp = ctx;
    if (fp->gone)
        G.closes_after_gone++;
    if (fp->closed)
        G.double_closes++;
    fp->closed = 1;
}

uint64_t fake_now(void)
{
    return G.now;
}

const gift_shard_io_t IO = {fake_send, fake_close, fake_now};

/* Drops fp's references to payload buffers, as the glue does when writes complete. */
void io_release(fake_t *fp)
{
    for (size_t i = 0; i < fp->n; i++) {
        gift_rbuf_unref(fp->f[i]->buf);
        fp->f[i]->buf = NULL;
    }
}

void io_free(fake_t *fp)
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

void peer_open(int i)
{
    P[i].id = (uint64_t)i + 1;
    P[i].p = gift_shard_peer_open(S, &P[i], P[i].id);
    ck_assert_msg(P[i].p != NULL, "peer_open %d failed", i);
}

/* The glue's on-close: the connection is gone. */
void peer_gone(fake_t *fp)
{
    if (fp->p != NULL)
        gift_shard_peer_close(S, fp->p);
    fp->p = NULL;
    fp->gone = 1;
}

/* Set by the eager fixtures: every shard of the test sums in arrival order. */
int g_eager;

void shard_open(const gift_shard_opts_t *o)
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
void shard_close(void)
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

size_t unread(const fake_t *fp)
{
    return fp->n - fp->seen;
}

const char *msg_name(const sent_t *s)
{
    if (s->env->msg_case == GIFT__ENVELOPE__MSG_ERROR)
        return s->env->error->text;
    return gift_msg_name(s->env);
}

sent_t *take_at(fake_t *fp, Gift__Envelope__MsgCase want, int line)
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

sent_t *take_any(fake_t *fp)
{
    ck_assert_msg(fp->seen < fp->n, "peer %" PRIu64 " expected a frame, got nothing", fp->id);
    return fp->f[fp->seen++];
}

void quiet_all(int line)
{
    for (int i = 0; i < NPEER; i++)
        ck_assert_msg(unread(&P[i]) == 0, "line %d: peer %d has %zu unexpected frames, first: %s",
                      line, i, unread(&P[i]), unread(&P[i]) ? msg_name(P[i].f[P[i].seen]) : "");
}

const Gift__Error *expect_error_at(fake_t *fp, int code, int fatal, int line)
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

/* ------------------------------------------------------------------ */
/* Messages in                                                           */
/* ------------------------------------------------------------------ */

uint64_t g_seq = 1;

int feed(fake_t *fp, Gift__Envelope *env, const void *payload, size_t len)
{
    gift_frame_t f;
    f.env = env;
    f.header_len = (uint32_t)gift__envelope__get_packed_size(env); /* as the reader sets it */
    f.payload = payload;
    f.payload_len = len;
    return gift_shard_handle(S, fp->p, &f);
}

const char *g_run_id = "";
uint64_t g_resume_step;

int hello_raw(fake_t *fp, uint32_t version, uint32_t rank, uint32_t world, const uint8_t *digest,
              size_t dlen)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = version;
    h.rank = rank;
    h.world_size = world;
    h.client_name = "test_shard";
    h.run_id = (char *)g_run_id;
    h.resume_step = g_resume_step;
    h.cluster_digest.data = (uint8_t *)digest;
    h.cluster_digest.len = dlen;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    return feed(fp, &env, NULL, 0);
}

int reset_raw(fake_t *fp, const char *run_id, int force, uint64_t seq)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Reset m = GIFT__RESET__INIT;
    m.run_id = (char *)run_id;
    m.force = force;
    m.seq = seq;
    env.msg_case = GIFT__ENVELOPE__MSG_RESET;
    env.reset = &m;
    return feed(fp, &env, NULL, 0);
}

void hello_at(fake_t *fp, uint32_t rank, uint32_t world, int line)
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

void hello_all(void)
{
    for (int r = 0; r < W; r++)
        HELLO(&P[r], (uint32_t)r, W);
}

/* Keys (bit k) declared with pull_error_feedback by tensor_decls. */
uint64_t g_pull_ef;

/* The list this shard was declared with (for the helpers below). */
const tdesc_t *g_t;
size_t g_nt;
const cdesc_t *g_c;
size_t g_nc;

const tdesc_t *tensor_of(uint32_t key)
{
    for (size_t i = 0; i < g_nt; i++)
        if (g_t[i].key == key)
            return &g_t[i];
    ck_abort_msg("no tensor %u in the test's list", key);
    return NULL;
}

const cdesc_t *chunk_of(uint32_t key, uint32_t chunk)
{
    for (size_t i = 0; i < g_nc; i++)
        if (g_c[i].key == key && g_c[i].chunk == chunk)
            return &g_c[i];
    ck_abort_msg("no chunk %u of tensor %u in the test's list", chunk, key);
    return NULL;
}

/* Fills td[0..nt) (and the pointer array tdp, and two codecs per tensor in
 * codecs) from the test's descriptions. */
void tensor_decls(const tdesc_t *t, size_t nt, Gift__TensorDecl *td, Gift__TensorDecl **tdp,
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
int declare_raw(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc,
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

uint64_t digest_of(const tdesc_t *t, size_t nt)
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

void declare_ok_at(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc, int line)
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

void declare_err_at(fake_t *fp, const tdesc_t *t, size_t nt, const cdesc_t *c, size_t nc, int code,
                    int line)
{
    int rc = declare_raw(fp, t, nt, c, nc, 0, 0);
    ck_assert_msg(rc == 0, "line %d: a refused declare returned %d (must not be fatal)", line, rc);
    expect_error_at(fp, code, 0, line);
}

gift_codec_params_t params_of(Gift__Format f, uint32_t block)
{
    gift_codec_params_t p;
    memset(&p, 0, sizeof p);
    p.fmt = (gift_format_t)f;
    p.block = f == E4M3 || f == E5M2 ? block : 0;
    return p;
}

size_t chunk_n(const cdesc_t *c)
{
    return (size_t)c->rows * tensor_of(c->key)->cols;
}

size_t layout_total(Gift__Format f, uint32_t block, size_t n)
{
    gift_codec_params_t p = params_of(f, block);
    gift_layout_t l;
    ck_assert_int_eq(gift_layout(&p, n, &l), 0);
    return l.total;
}

/* Encodes x (n floats) with p; the caller frees. */
uint8_t *encode(const gift_codec_params_t *p, const float *x, size_t n, size_t *len)
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

int push_raw(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
             Gift__Format fmt, uint32_t block, const void *payload, size_t len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    gift_test_fill_push(&env, &m, &codec, key, chunk, step, epoch, fmt, block, g_seq++);
    return feed(fp, &env, payload, len);
}

void expect_ack_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int dup, uint64_t seq,
                   int line)
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
int push_x(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch, const float *x)
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

void push_ok_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                const float *x, int dup, int line)
{
    int rc = push_x(fp, key, chunk, step, epoch, x);
    ck_assert_msg(rc == 0, "line %d: push returned %d", line, rc);
    expect_ack_at(fp, key, chunk, step, dup, g_seq - 1, line);
}

void push_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
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
float *grad(uint32_t key, uint32_t chunk, uint32_t rank, uint64_t v)
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

void push_grad_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                  uint32_t rank, uint64_t v, int dup, int line)
{
    float *x = grad(key, chunk, rank, v);
    push_ok_at(fp, key, chunk, step, epoch, x, dup, line);
    free(x);
}
void push_grad_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                      uint32_t rank, uint64_t v, int code, int line)
{
    float *x = grad(key, chunk, rank, v);
    push_err_at(fp, key, chunk, step, epoch, x, code, line);
    free(x);
}

/* The reference of docs/ARCHITECTURE.md (aggregation) for one chunk: the pushes of the
 * ranks in order[] (data set v), decoded and summed in FP32 in that order
 * under eager aggregation, in rank order under ordered aggregation,
 * times 1/world, encoded with the pull codec. Returns the payload; exact[]
 * (optional) gets the mean in double of the decoded pushes and mag[] the
 * mean of their magnitudes. */
uint8_t *reference(uint32_t key, uint32_t chunk, uint64_t v, const int *order, int world,
                   size_t *len, double *exact, double *mag)
{
    const tdesc_t *t = tensor_of(key);
    size_t n = chunk_n(chunk_of(key, chunk));
    gift_codec_params_t pp = params_of(t->push_fmt, t->push_block);
    gift_codec_params_t qp = params_of(t->pull_fmt, t->pull_block);
    float *acc = calloc(n, sizeof *acc), *dec = malloc(n * sizeof *dec);
    const float inv = 1.0f / (float)world;
    uint8_t *out;
    static const int by_rank[64] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                                    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                                    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

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

int pull_raw(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t have_epoch,
             size_t payload_len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Pull m = GIFT__PULL__INIT;
    uint8_t junk[16] = {0};
    gift_test_fill_pull(&env, &m, key, chunk, step, have_epoch, g_seq++);
    return feed(fp, &env, payload_len ? junk : NULL, payload_len);
}

/* Sends a pull; returns its seq. */
uint64_t pull_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int line)
{
    int rc = pull_raw(fp, key, chunk, step, 0, 0);
    ck_assert_msg(rc == 0, "line %d: pull returned %d", line, rc);
    return g_seq - 1;
}

void pull_err_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, int code, int line)
{
    uint64_t seq = pull_at(fp, key, chunk, step, line);
    const Gift__Error *e = expect_error_at(fp, code, 0, line);
    ck_assert_msg(e->key == key && e->chunk == chunk && e->step == step && e->seq == seq,
                  "line %d: error context key %u chunk %u step %" PRIu64 " seq %" PRIu64, line,
                  e->key, e->chunk, e->step, e->seq);
}

/* Takes a PullReply and checks its header; returns the frame. */
sent_t *expect_reply_at(fake_t *fp, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                        uint64_t seq, int line)
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

void expect_bytes_at(const sent_t *s, const uint8_t *want, size_t len, int line)
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

int sketch_raw(fake_t *fp, uint32_t key, uint64_t step, uint32_t epoch, double trace, uint32_t din,
               uint32_t ks, const void *y, size_t len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Sketch m = GIFT__SKETCH__INIT;
    gift_test_fill_sketch(&env, &m, key, step, epoch, trace, din, ks, g_seq++);
    return feed(fp, &env, y, len);
}

void expect_sketch_ack_at(fake_t *fp, uint32_t key, uint64_t step, int dup, int line)
{
    const Gift__SketchAck *a = take_at(fp, GIFT__ENVELOPE__MSG_SKETCH_ACK, line)->env->sketch_ack;
    ck_assert_msg(a->key == key && a->step == step && a->seq == g_seq - 1,
                  "line %d: sketch_ack key %u step %" PRIu64 " seq %" PRIu64, line, a->key, a->step,
                  a->seq);
    ck_assert_msg(a->duplicate == (dup != 0), "line %d: sketch_ack duplicate=%d, wanted %d", line,
                  (int)a->duplicate, dup);
}

int georeq_raw(fake_t *fp, uint32_t key, size_t payload_len)
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

int stats_raw(fake_t *fp, size_t payload_len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest m = GIFT__STATS_REQUEST__INIT;
    uint8_t junk[8] = {0};
    m.seq = g_seq++;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &m;
    return feed(fp, &env, payload_len ? junk : NULL, payload_len);
}

const Gift__Stats *stats_at(fake_t *fp, int line)
{
    const Gift__Stats *st;
    int rc = stats_raw(fp, 0);
    ck_assert_msg(rc == 0, "line %d: stats returned %d", line, rc);
    st = take_at(fp, GIFT__ENVELOPE__MSG_STATS, line)->env->stats;
    ck_assert_msg(st->seq == g_seq - 1, "line %d: stats seq %" PRIu64, line, st->seq);
    return st;
}

const gift_shard_counters_t *C(void)
{
    return gift_shard_counters(S);
}

/* Checks that no error of any code was counted except the listed ones. */
void expect_errors_at(int line, int n, ...)
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

/* ------------------------------------------------------------------ */
/* Fixtures                                                              */
/* ------------------------------------------------------------------ */

void fx_base(void)
{
    gift_shard_opts_t o;
    g_run_id = "";
    g_resume_step = 0;
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

void fx_hello(void)
{
    fx_base();
    hello_all();
}

/* Every rank said hello and declared the standard list. */
void fx_std(void)
{
    fx_base();
    fx_std_declare();
}

void fx_std_declare(void)
{
    hello_all();
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], STD_T, STD_NT, STD_C, STD_NC);
}

void fx_teardown(void)
{
    shard_close();
    g_eager = 0;
    g_pull_ef = 0;
}

void fx_std_eager(void)
{
    g_eager = 1;
    fx_std();
}

void fx_hello_eager(void)
{
    g_eager = 1;
    fx_hello();
}

/* Replaces the fixture's shard by one with other options. */
void reopen(const gift_shard_opts_t *o)
{
    shard_close();
    shard_open(o);
}

/* Takes a Geometry frame and checks it against g. */
sent_t *expect_geometry_at(fake_t *fp, const gift_geometry_t *g, uint64_t valid_from, int line)
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
void make_sketch(uint32_t r, uint64_t round, const float *U, float *Y, double *trace)
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

void sketch_ok_at(fake_t *fp, uint64_t step, uint32_t epoch, double trace, const float *Y, int dup,
                  int line)
{
    int rc = sketch_raw(fp, 0, step, epoch, trace, GDIN, GKS, Y, (size_t)GDIN * GKS * 4);
    ck_assert_msg(rc == 0, "line %d: sketch returned %d", line, rc);
    expect_sketch_ack_at(fp, 0, step, dup, line);
}

void sketch_err_at(fake_t *fp, uint64_t step, uint32_t epoch, double trace, uint32_t din,
                   uint32_t ks, const float *Y, size_t len, int code, int line)
{
    const Gift__Error *e;
    int rc = sketch_raw(fp, 0, step, epoch, trace, din, ks, Y, len);
    ck_assert_msg(rc == 0, "line %d: a refused sketch returned %d", line, rc);
    e = expect_error_at(fp, code, 0, line);
    ck_assert_msg(e->key == 0 && e->step == step && e->seq == g_seq - 1,
                  "line %d: error context key %u step %" PRIu64, line, e->key, e->step);
}

void geo_push_at(fake_t *fp, uint32_t chunk, uint64_t step, uint32_t epoch, uint32_t rank, int code,
                 int line)
{
    float *x = grad(0, chunk, rank, step);
    if (code == 0)
        push_ok_at(fp, 0, chunk, step, epoch, x, 0, line);
    else
        push_err_at(fp, 0, chunk, step, epoch, x, code, line);
    free(x);
}

void pef_declare(void)
{
    g_pull_ef = PEF_MASK;
    hello_all();
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], PEF_T, PEF_NT, PEF_C, PEF_NC);
}

uint8_t *pef_reference(pef_ref_t *st, const cdesc_t *c, size_t ci, uint64_t v, size_t *len)
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
int pef_step(pef_ref_t *st, uint64_t step, int line)
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

void pef_ref_free(pef_ref_t *st)
{
    for (size_t ci = 0; ci < PEF_NC; ci++)
        free(st->e[ci]);
}
