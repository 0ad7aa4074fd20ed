/*
 * test_engine.c: client/engine.c without sockets or threads.
 *
 * The client is built by gift__client_new and gift__declare_build (no I/O
 * thread), and its gift__io_t is a fake: queue() packs the frame as net.c
 * would and unpacks the header back into a Gift__Envelope, keeping a copy of
 * the payload; drop() reports the connection down as net.c does; the clock
 * is a variable. The test plays the I/O thread: it runs the commands the
 * caller queued (gift__eng_commands), ends loop turns (encode_more,
 * turn_end, then the writes complete), raises connection events and feeds
 * the shard's frames to gift__eng_frame. Every expected frame is checked
 * field by field.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <check.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_proto.h"
#include "gift_test_check.h"
#include "giftclient_internal.h"

#define NSHARD 2
#define ROWS 8
#define COLS 16
#define MAXF 64

typedef struct sent {
    Gift__Envelope *env;
    uint8_t *payload;
    size_t len;
    int64_t prio; /* what net.c sorts a turn's frames by (higher first, then queue order) */
} sent_t;

static struct {
    sent_t f[NSHARD][MAXF];
    size_t n[NSHARD], seen[NSHARD];
    int *inflight[NSHARD * MAXF];
    size_t ninflight;
    int connected[NSHARD];
    int wakes, connects, shutdowns, drops, backoff_resets;
    int unsinks;
    const void *unsink_lo, *unsink_hi;
    uint64_t now;
} F;

static gift_client_t *C;

/* ------------------------------------------------------------------ */
/* The fake network                                                      */
/* ------------------------------------------------------------------ */

static void keep(uint32_t shard, const uint8_t *head, size_t head_len, const void *payload,
                 size_t len, int64_t prio, int *inflight)
{
    uint32_t hl;
    sent_t *s;
    ck_assert_msg(shard < NSHARD && F.n[shard] < MAXF, "frame for shard %u (%zu kept)", shard,
                  shard < NSHARD ? F.n[shard] : 0);
    ck_assert_msg(head_len >= GIFT_PREAMBLE_BYTES && memcmp(head, "GIF1", 4) == 0,
                  "a head of %zu bytes without the preamble", head_len);
    hl = (uint32_t)head[4] | (uint32_t)head[5] << 8 | (uint32_t)head[6] << 16 |
         (uint32_t)head[7] << 24;
    ck_assert_msg(GIFT_PREAMBLE_BYTES + hl == head_len, "header_len %u in a %zu-byte head", hl,
                  head_len);
    s = &F.f[shard][F.n[shard]++];
    s->env = gift__envelope__unpack(NULL, hl, head + GIFT_PREAMBLE_BYTES);
    ck_assert_msg(s->env != NULL, "a header that does not unpack");
    s->len = payload ? len : 0;
    s->prio = prio;
    s->payload = NULL;
    if (s->len) {
        s->payload = malloc(s->len);
        ck_assert_ptr_nonnull(s->payload);
        memcpy(s->payload, payload, s->len);
    }
    if (inflight != NULL) {
        (*inflight)++;
        F.inflight[F.ninflight++] = inflight;
    }
}

static int fake_queue(gift_client_t *c, uint32_t shard, const Gift__Envelope *env,
                      const void *payload, size_t len, int64_t prio, int *inflight)
{
    uint8_t head[4096];
    long n;
    (void)c;
    if (!F.connected[shard])
        return GIFT_ECLOSED;
    n = gift_frame_pack_head(env, payload ? len : 0, head, sizeof head);
    ck_assert_msg(n > 0, "pack_head returned %ld", n);
    keep(shard, head, (size_t)n, payload, len, prio, inflight);
    return 0;
}

static int fake_queue_raw(gift_client_t *c, uint32_t shard, const uint8_t *head, size_t head_len,
                          int64_t prio)
{
    (void)c;
    if (!F.connected[shard])
        return GIFT_ECLOSED;
    keep(shard, head, head_len, NULL, 0, prio, NULL);
    return 0;
}

static void fake_drop(gift_client_t *c, uint32_t shard)
{
    F.drops++;
    if (F.connected[shard]) {
        F.connected[shard] = 0;
        gift__eng_conn_down(c, shard);
    }
}

static void fake_wake(gift_client_t *c)
{
    (void)c;
    F.wakes++;
}

static void fake_connect(gift_client_t *c)
{
    (void)c;
    F.connects++;
}

static void fake_shutdown(gift_client_t *c)
{
    (void)c;
    F.shutdowns++;
}

static void fake_backoff_reset(gift_client_t *c, uint32_t shard)
{
    (void)c;
    (void)shard;
    F.backoff_resets++;
}

static void fake_unsink(gift_client_t *c, const void *lo, const void *hi)
{
    (void)c;
    F.unsinks++;
    F.unsink_lo = lo;
    F.unsink_hi = hi;
}

static uint64_t fake_now(void)
{
    return F.now;
}

static const gift__io_t FAKE_IO = {
    .wake = fake_wake,
    .connect = fake_connect,
    .shutdown = fake_shutdown,
    .drop = fake_drop,
    .backoff_reset = fake_backoff_reset,
    .queue = fake_queue,
    .queue_raw = fake_queue_raw,
    .now_ns = fake_now,
    .unsink = fake_unsink,
};

/* The end of a loop turn as net.c's check handle runs it, then every write
 * completes. */
static void turn(void)
{
    for (int i = 0; i < 16; i++) {
        gift__host_encode_more(C);
        gift__eng_turn_end(C);
        if (C->nencoding == 0)
            break;
    }
    for (size_t i = 0; i < F.ninflight; i++)
        (*F.inflight[i])--;
    F.ninflight = 0;
    gift__eng_turn_end(C);
}

/* The I/O thread wakes: runs the queued commands, ends the turn. */
static void io_run(void)
{
    gift__eng_commands(C);
    turn();
}

/* The caller queues cmd (kind, due in `in` ns), the I/O thread runs it. */
static void command(gift__cmd_t *cmd, int kind, uint64_t in)
{
    memset(cmd, 0, sizeof *cmd);
    cmd->kind = kind;
    cmd->deadline_ns = F.now + in;
    gift__cmd_put(C, cmd);
    io_run();
}

/* ------------------------------------------------------------------ */
/* Frames                                                                */
/* ------------------------------------------------------------------ */

static size_t unread(uint32_t shard)
{
    return F.n[shard] - F.seen[shard];
}

static const Gift__Envelope *take_at(uint32_t shard, Gift__Envelope__MsgCase want,
                                     const sent_t **out, int line)
{
    const sent_t *s;
    ck_assert_msg(unread(shard) > 0, "line %d: shard %u got no frame, want case %d", line, shard,
                  (int)want);
    s = &F.f[shard][F.seen[shard]++];
    ck_assert_msg(s->env->msg_case == want, "line %d: shard %u got case %d, want %d", line, shard,
                  (int)s->env->msg_case, (int)want);
    if (out != NULL)
        *out = s;
    return s->env;
}
#define TAKE(shard, want, out) take_at((shard), (want), (out), __LINE__)
#define EXPECT_QUIET(shard)                                                                        \
    ck_assert_msg(unread(shard) == 0, "shard %u has %zu unexpected frames, first case %d",         \
                  (shard), unread(shard),                                                          \
                  unread(shard) ? (int)F.f[shard][F.seen[shard]].env->msg_case : 0)

/* Hands a shard's frame to the engine as net.c does; returns its rc. */
static int feed(uint32_t shard, Gift__Envelope *env, const void *payload, size_t len)
{
    gift_frame_t f;
    f.env = env;
    f.header_len = (uint32_t)gift__envelope__get_packed_size(env);
    f.payload = payload;
    f.payload_len = len;
    return gift__eng_frame(C, shard, &f);
}

static int feed_hello_ack(uint32_t shard, uint32_t shard_id)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__HelloAck a = GIFT__HELLO_ACK__INIT;
    a.protocol_version = GIFT_PROTOCOL_VERSION;
    a.shard_id = shard_id;
    a.num_shards = NSHARD;
    a.max_frame_bytes = 1ull << 30;
    a.world_size = 2;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO_ACK;
    env.hello_ack = &a;
    return feed(shard, &env, NULL, 0);
}

static int feed_declare_ack(uint32_t shard)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__DeclareAck a = GIFT__DECLARE_ACK__INIT;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE_ACK;
    env.declare_ack = &a;
    return feed(shard, &env, NULL, 0);
}

/* A connection comes up and shakes hands: Hello, HelloAck (then, once
 * declared, Declare and DeclareAck). */
static void shake_at(uint32_t shard, int declared, int line)
{
    const Gift__Envelope *e;
    int rc;
    F.connected[shard] = 1;
    gift__eng_conn_up(C, shard);
    e = take_at(shard, GIFT__ENVELOPE__MSG_HELLO, NULL, line);
    ck_assert_msg(e->hello->rank == 1 && e->hello->world_size == 2 &&
                      e->hello->protocol_version == GIFT_PROTOCOL_VERSION,
                  "line %d: Hello of rank %u world %u version %u", line, e->hello->rank,
                  e->hello->world_size, e->hello->protocol_version);
    ck_assert_msg((e->hello->cluster_digest.len == 8) == (declared != 0),
                  "line %d: Hello carries a digest of %zu bytes (declared %d)", line,
                  e->hello->cluster_digest.len, declared);
    rc = feed_hello_ack(shard, shard);
    ck_assert_msg(rc == 0, "line %d: HelloAck returned %d", line, rc);
    if (!declared)
        return;
    take_at(shard, GIFT__ENVELOPE__MSG_DECLARE, NULL, line);
    rc = feed_declare_ack(shard);
    ck_assert_msg(rc == 0, "line %d: DeclareAck returned %d", line, rc);
}
#define SHAKE(shard, declared) shake_at((shard), (declared), __LINE__)

/* ------------------------------------------------------------------ */
/* Fixtures                                                              */
/* ------------------------------------------------------------------ */

static void fx_open(void)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    int rc;
    memset(&F, 0, sizeof F);
    F.now = 1000000000ull;
    o.servers = "127.0.0.1:1,127.0.0.1:2";
    o.rank = 1;
    o.world_size = 2;
    o.timeout_ms = 1000;
    o.chunk_bytes = 256; /* the 8 x 16 tensor goes in two chunks of 4 rows */
    o.name = "test-engine";
    rc = gift__client_new(&o, &C);
    ck_assert_msg(rc == 0 && C != NULL, "gift__client_new returned %d", rc);
    C->io = &FAKE_IO;
}

static void fx_close(void)
{
    gift_client_close(C); /* no thread: frees what open and declare built */
    C = NULL;
    for (int s = 0; s < NSHARD; s++)
        for (size_t i = 0; i < F.n[s]; i++) {
            gift__envelope__free_unpacked(F.f[s][i].env, NULL);
            free(F.f[s][i].payload);
        }
}

/* Connected to both shards and ntensors f32 tensors of 8 x 16 declared, each
 * in two chunks (too large to be fused), placed by the client's rule. */
static void declare_n(size_t ntensors)
{
    gift_tensor_desc_t t[4];
    static const char *names[4] = {"w", "w1", "w2", "w3"};
    gift__cmd_t cmd;
    int rc;

    ck_assert(ntensors >= 1 && ntensors <= 4);
    command(&cmd, GIFT__CMD_CONNECT, 1000000000ull);
    for (uint32_t s = 0; s < NSHARD; s++)
        SHAKE(s, 0);
    ck_assert_msg(cmd.done && cmd.rc == 0, "connect: done %d rc %d", cmd.done, cmd.rc);
    for (size_t i = 0; i < ntensors; i++) {
        t[i] = (gift_tensor_desc_t)GIFT_TENSOR_INIT;
        t[i].name = names[i];
        t[i].rows = ROWS;
        t[i].cols = COLS;
        t[i].push_codec = GIFT_CODEC_F32;
        t[i].pull_codec = GIFT_CODEC_F32;
    }
    rc = gift__declare_build(C, t, ntensors);
    ck_assert_msg(rc == 0, "gift__declare_build returned %d", rc);
    ck_assert_msg(C->nchunks == 2 * ntensors, "%zu chunks, want %zu", C->nchunks, 2 * ntensors);
    C->declared = 1;
    command(&cmd, GIFT__CMD_DECLARE, 1000000000ull);
    for (uint32_t s = 0; s < NSHARD; s++) {
        TAKE(s, GIFT__ENVELOPE__MSG_DECLARE, NULL);
        ck_assert_int_eq(feed_declare_ack(s), 0);
    }
    ck_assert_msg(cmd.done && cmd.rc == 0, "declare: done %d rc %d", cmd.done, cmd.rc);
}

/* Connected to both shards and the list declared: one f32 tensor of 8 x 16
 * in two chunks, placed by the client's rule. */
static void fx_declared(void)
{
    fx_open();
    declare_n(1);
}

/* ------------------------------------------------------------------ */
/* Tests                                                                 */
/* ------------------------------------------------------------------ */

/* Connect: one connect call, a Hello per shard, done once both answer. */
START_TEST(test_connect)
{
    gift__cmd_t cmd;
    command(&cmd, GIFT__CMD_CONNECT, 1000000000ull);
    ck_assert_msg(F.connects == 1, "%d connect calls", F.connects);
    SHAKE(0, 0);
    ck_assert_msg(!cmd.done, "connect done with one shard of two");
    SHAKE(1, 0);
    ck_assert_msg(cmd.done && cmd.rc == 0, "connect: done %d rc %d", cmd.done, cmd.rc);
    ck_assert_msg(F.backoff_resets == 2, "%d backoff resets, want 2", F.backoff_resets);
    EXPECT_QUIET(0);
    EXPECT_QUIET(1);
}
END_TEST

/* A server that is another shard than its place in the list: refused, and
 * the connect command fails with GIFT_EINVAL. */
START_TEST(test_connect_wrong_shard)
{
    gift__cmd_t cmd;
    int rc;
    command(&cmd, GIFT__CMD_CONNECT, 1000000000ull);
    F.connected[0] = 1;
    gift__eng_conn_up(C, 0);
    TAKE(0, GIFT__ENVELOPE__MSG_HELLO, NULL);
    rc = feed_hello_ack(0, 1);
    ck_assert_msg(rc == GIFT_EINVAL, "HelloAck of shard 1 on server 0 returned %d", rc);
    ck_assert_msg(cmd.done && cmd.rc == GIFT_EINVAL, "connect: done %d rc %d", cmd.done, cmd.rc);
}
END_TEST

/* Connect times out on the engine's tick once the deadline has passed. */
START_TEST(test_connect_timeout)
{
    gift__cmd_t cmd;
    command(&cmd, GIFT__CMD_CONNECT, 1000);
    gift__eng_tick(C);
    ck_assert_msg(!cmd.done, "connect failed before its deadline");
    F.now += 1000;
    gift__eng_tick(C);
    ck_assert_msg(cmd.done && cmd.rc == GIFT_ETIMEDOUT, "connect: done %d rc %d", cmd.done, cmd.rc);
}
END_TEST

static float G[ROWS * COLS], M[ROWS * COLS], OUT[ROWS * COLS];

/* Starts a push_pull of step; returns the op (the engine queued it). */
static gift_op_t *push_pull_at(uint64_t step, int line)
{
    gift_op_t *op = NULL;
    int rc, wakes = F.wakes;
    for (int i = 0; i < ROWS * COLS; i++) {
        G[i] = (float)(i % 13) - 6.0f + 0.25f * (float)step;
        M[i] = 0.5f * G[i] + 1.0f;
        OUT[i] = -1.0f;
    }
    rc = gift_push_pull(C, 0, step, G, OUT, NULL, NULL, &op);
    ck_assert_msg(rc == 0 && op != NULL, "line %d: gift_push_pull returned %d", line, rc);
    ck_assert_msg(F.wakes == wakes + 1, "line %d: %d wakes for one operation", line,
                  F.wakes - wakes);
    io_run();
    return op;
}

/* Takes the Push and then the Pull of every chunk of step, checks them and
 * answers the Push with its ack. */
static void expect_push_pull_at(uint64_t step, uint64_t *pull_seq, int line)
{
    for (uint32_t j = 0; j < C->nchunks; j++) {
        const gift__chunk_t *ch = &C->chunks[j];
        const sent_t *s;
        const Gift__Envelope *e = take_at(ch->shard, GIFT__ENVELOPE__MSG_PUSH, &s, line);
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__PushAck a = GIFT__PUSH_ACK__INIT;
        ck_assert_msg(e->push->key == 0 && e->push->chunk == ch->idx && e->push->step == step &&
                          e->push->epoch == 0,
                      "line %d: Push key %u chunk %u step %" PRIu64 " epoch %u", line, e->push->key,
                      e->push->chunk, e->push->step, e->push->epoch);
        ck_assert_msg(s->len == ch->n * 4 && memcmp(s->payload, G + ch->off, s->len) == 0,
                      "line %d: chunk %u's f32 payload (%zu bytes) is not the gradient's rows",
                      line, ch->idx, s->len);
        e = take_at(ch->shard, GIFT__ENVELOPE__MSG_PULL, NULL, line);
        ck_assert_msg(e->pull->chunk == ch->idx && e->pull->step == step,
                      "line %d: Pull chunk %u step %" PRIu64, line, e->pull->chunk, e->pull->step);
        pull_seq[j] = e->pull->seq;
        a.key = 0;
        a.chunk = ch->idx;
        a.step = step;
        env.msg_case = GIFT__ENVELOPE__MSG_PUSH_ACK;
        env.push_ack = &a;
        ck_assert_int_eq(feed(ch->shard, &env, NULL, 0), 0);
    }
}

static void reply_at(uint64_t step, uint32_t j, uint64_t seq, int line)
{
    const gift__chunk_t *ch = &C->chunks[j];
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__PullReply r = GIFT__PULL_REPLY__INIT;
    Gift__Codec cd = GIFT__CODEC__INIT;
    int rc;
    cd.format = GIFT__FORMAT__FORMAT_F32;
    r.key = 0;
    r.chunk = ch->idx;
    r.step = step;
    r.codec = &cd;
    r.contributors = 2;
    r.seq = seq;
    env.msg_case = GIFT__ENVELOPE__MSG_PULL_REPLY;
    env.pull_reply = &r;
    rc = feed(ch->shard, &env, M + ch->off, ch->n * 4);
    ck_assert_msg(rc == 0, "line %d: PullReply of chunk %u returned %d", line, ch->idx, rc);
}

/* The reply of chunk 1 completes op with the mean in out; frees op. */
static void last_reply_at(gift_op_t *op, uint64_t seq, int line)
{
    int st = 1;
    reply_at(0, 1, seq, line);
    turn();
    ck_assert_msg(gift_op_test(op, &st) && st == 0, "line %d: op done %d status %d", line,
                  gift_op_test(op, NULL), st);
    ck_assert_msg(memcmp(OUT, M, sizeof M) == 0, "line %d: out is not the replied mean", line);
    gift_op_free(op);
}

/* One step end to end: Push and Pull per chunk, acks and replies, the op
 * completes with the decoded mean in out. */
START_TEST(test_push_pull)
{
    uint64_t seq[2];
    gift_op_t *op = push_pull_at(0, __LINE__);
    expect_push_pull_at(0, seq, __LINE__);
    ck_assert_msg(!gift_op_test(op, NULL), "the op is done before any reply");
    reply_at(0, 0, seq[0], __LINE__);
    turn();
    ck_assert_msg(!gift_op_test(op, NULL), "the op is done with one chunk of two");
    last_reply_at(op, seq[1], __LINE__);
    EXPECT_QUIET(0);
    EXPECT_QUIET(1);
}
END_TEST

/* No reply: the op fails with GIFT_ETIMEDOUT on the first tick past its
 * deadline (timeout_ms 1000), not before. */
START_TEST(test_op_timeout)
{
    uint64_t seq[2];
    int st = 0;
    gift_op_t *op = push_pull_at(0, __LINE__);
    expect_push_pull_at(0, seq, __LINE__);
    F.now += 999000000ull;
    gift__eng_tick(C);
    ck_assert_msg(!gift_op_test(op, NULL), "timed out before its deadline");
    F.now += 1000000ull;
    gift__eng_tick(C);
    ck_assert_msg(gift_op_test(op, &st) && st == GIFT_ETIMEDOUT, "op: done %d status %d",
                  gift_op_test(op, NULL), st);
    gift_op_free(op);
}
END_TEST

/* The head of chunk j's PullReply for step, as the reader peeks at it
 * before the payload is in (payload NULL, payload_len len): env and its
 * parts live in *h. */
typedef struct reply_head {
    Gift__Envelope env;
    Gift__PullReply r;
    Gift__Codec cd;
    gift_frame_t f;
} reply_head_t;

static gift_frame_t *reply_head(reply_head_t *h, uint32_t key, uint32_t chunk, uint64_t step,
                                int format, uint64_t len)
{
    gift__envelope__init(&h->env);
    gift__pull_reply__init(&h->r);
    gift__codec__init(&h->cd);
    h->cd.format = (Gift__Format)format;
    h->r.key = key;
    h->r.chunk = chunk;
    h->r.step = step;
    h->r.codec = &h->cd;
    h->r.contributors = 2;
    h->env.msg_case = GIFT__ENVELOPE__MSG_PULL_REPLY;
    h->env.pull_reply = &h->r;
    h->f.env = &h->env;
    h->f.header_len = (uint32_t)gift__envelope__get_packed_size(&h->env);
    h->f.payload = NULL;
    h->f.payload_len = len;
    return &h->f;
}

/* Where a pulled chunk's payload may be received directly
 * (gift__eng_sink): only the f32 chunk this pull waits for, from its own
 * shard, at exactly its length; received there, it is checked, not copied,
 * and the mean is exact. */
START_TEST(test_sink)
{
    const gift__chunk_t *c0 = &C->chunks[0], *c1 = &C->chunks[1];
    uint64_t seq[2], n4 = (uint64_t)c0->n * 4u;
    gift_client_counters_t k0, k1;
    reply_head_t h;
    gift_frame_t *f;
    float *dst;
    int st = 1;
    gift_op_t *op = push_pull_at(0, __LINE__);

    expect_push_pull_at(0, seq, __LINE__);
    struct {
        uint32_t shard, key, chunk;
        uint64_t step;
        int format;
        uint64_t len;
        const char *what;
    } no[] = {
        {c0->shard, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, n4 - 4, "a length 4 bytes short"},
        {c0->shard, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, n4 + 64, "a length 64 bytes long"},
        {c0->shard, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_BF16, n4, "another codec"},
        {c1->shard, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, n4, "another shard's connection"},
        {c0->shard, 0, c0->idx, 1, GIFT__FORMAT__FORMAT_F32, n4, "a step not pulled"},
        {c0->shard, 0, c0->idx, 2, GIFT__FORMAT__FORMAT_F32, n4, "a step of the same parity"},
        {c0->shard, 9, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, n4, "an unknown key"},
        {c0->shard, 0, 2, 0, GIFT__FORMAT__FORMAT_F32, n4, "chunk 2 of 2"},
        {c0->shard, 0, UINT32_MAX, 0, GIFT__FORMAT__FORMAT_F32, n4, "chunk 2^32-1"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        f = reply_head(&h, no[i].key, no[i].chunk, no[i].step, no[i].format, no[i].len);
        ck_assert_msg(gift__eng_sink(C, no[i].shard, f) == NULL, "sunk with %s", no[i].what);
    }
    {
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__PushAck a = GIFT__PUSH_ACK__INIT;
        env.msg_case = GIFT__ENVELOPE__MSG_PUSH_ACK;
        env.push_ack = &a;
        h.f.env = &env;
        ck_assert_ptr_null(gift__eng_sink(C, c0->shard, &h.f));
    }
    f = reply_head(&h, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, n4);
    dst = gift__eng_sink(C, c0->shard, f);
    ck_assert_msg(dst == OUT + c0->off, "chunk 0 sinks at %p, want out + %zu = %p", (void *)dst,
                  c0->off, (void *)(OUT + c0->off));
    memcpy(dst, M + c0->off, n4); /* the reader fills it */
    memset(&k0, 0, sizeof k0);
    k0.size = sizeof k0;
    ck_assert_int_eq(gift_client_counters(C, &k0), 0);
    h.r.seq = seq[0];
    f->payload = (const uint8_t *)dst;
    ck_assert_int_eq(gift__eng_frame(C, c0->shard, f), 0);
    k1 = k0;
    ck_assert_int_eq(gift_client_counters(C, &k1), 0);
    ck_assert_msg(
        k1.pass_bytes[GIFT_PASS_CHECK] - k0.pass_bytes[GIFT_PASS_CHECK] == n4 &&
            k1.pass_bytes[GIFT_PASS_DECODE] == k0.pass_bytes[GIFT_PASS_DECODE],
        "received in place: check +%llu decode +%llu bytes, want +%llu and 0",
        (unsigned long long)(k1.pass_bytes[GIFT_PASS_CHECK] - k0.pass_bytes[GIFT_PASS_CHECK]),
        (unsigned long long)(k1.pass_bytes[GIFT_PASS_DECODE] - k0.pass_bytes[GIFT_PASS_DECODE]),
        (unsigned long long)n4);
    turn();
    f = reply_head(&h, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, n4);
    ck_assert_msg(gift__eng_sink(C, c0->shard, f) == NULL, "chunk 0 sunk again once it is in");
    ck_assert_msg(!gift_op_test(op, &st), "the op is done with one chunk of two");
    reply_at(0, 1, seq[1], __LINE__); /* decoded from the reader's buffer */
    turn();
    ck_assert_msg(gift_op_test(op, &st) && st == 0, "op: done %d status %d", gift_op_test(op, NULL),
                  st);
    ck_assert_msg(memcmp(OUT, M, sizeof M) == 0, "out is not the replied mean");
    ck_assert_msg(F.unsinks == 0, "%d unsinks for a pull that completed", F.unsinks);
    gift_op_free(op);
}
END_TEST

/* A pull that times out while its chunk is being received in place
 * unsinks its whole target first: no connection writes into out after the
 * op has completed. */
START_TEST(test_sink_timeout)
{
    const gift__chunk_t *c0 = &C->chunks[0];
    uint64_t seq[2];
    reply_head_t h;
    int st = 0;
    gift_op_t *op = push_pull_at(0, __LINE__);

    expect_push_pull_at(0, seq, __LINE__);
    ck_assert_ptr_nonnull(gift__eng_sink(
        C, c0->shard, reply_head(&h, 0, c0->idx, 0, GIFT__FORMAT__FORMAT_F32, c0->n * 4u)));
    F.now += 1001000000ull;
    gift__eng_tick(C);
    ck_assert_msg(gift_op_test(op, &st) && st == GIFT_ETIMEDOUT, "op: done %d status %d",
                  gift_op_test(op, NULL), st);
    ck_assert_msg(F.unsinks >= 1 && F.unsink_lo == (const void *)OUT &&
                      F.unsink_hi == (const void *)(OUT + ROWS * COLS),
                  "%d unsinks, the last of [%p, %p), want [%p, %p)", F.unsinks, F.unsink_lo,
                  F.unsink_hi, (void *)OUT, (void *)(OUT + ROWS * COLS));
    gift_op_free(op);
}
END_TEST

/* A shard's Error for the pull fails the op with its code. */
START_TEST(test_shard_error)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Error e = GIFT__ERROR__INIT;
    uint64_t seq[2];
    int st = 0;
    gift_op_t *op = push_pull_at(0, __LINE__);
    expect_push_pull_at(0, seq, __LINE__);
    e.code = GIFT_ESTEP;
    e.text = "pull for a step out of the window";
    e.key = 0;
    e.chunk = C->chunks[1].idx;
    e.step = 0;
    e.seq = seq[1];
    env.msg_case = GIFT__ENVELOPE__MSG_ERROR;
    env.error = &e;
    ck_assert_int_eq(feed(C->chunks[1].shard, &env, NULL, 0), 0);
    turn();
    ck_assert_msg(gift_op_test(op, &st) && st == GIFT_ESTEP, "op: done %d status %d",
                  gift_op_test(op, NULL), st);
    gift_op_free(op);
}
END_TEST

/* A connection lost before the pull completed: after the reconnect (Hello
 * with the digest, Declare again) the push is replayed and the pull sent
 * again, and the op completes. */
START_TEST(test_reconnect_replay)
{
    uint32_t s1 = C->chunks[1].shard;
    uint64_t seq[2];
    const Gift__Envelope *e;
    gift_client_stats_t stats;
    gift_op_t *op = push_pull_at(0, __LINE__);
    expect_push_pull_at(0, seq, __LINE__);
    reply_at(0, 0, seq[0], __LINE__);
    fake_drop(C, s1);
    SHAKE(s1, 1);
    turn();
    e = TAKE(s1, GIFT__ENVELOPE__MSG_PUSH, NULL);
    ck_assert_msg(e->push->chunk == C->chunks[1].idx && e->push->step == 0,
                  "replayed Push chunk %u step %" PRIu64, e->push->chunk, e->push->step);
    e = TAKE(s1, GIFT__ENVELOPE__MSG_PULL, NULL);
    seq[1] = e->pull->seq;
    gift_client_stats(C, &stats);
    ck_assert_msg(stats.replays == 1 && stats.reconnects == 1,
                  "replays %" PRIu64 ", reconnects %" PRIu64, stats.replays, stats.reconnects);
    ck_assert_msg(!gift_op_test(op, NULL), "the op is done before the last reply");
    last_reply_at(op, seq[1], __LINE__);
}
END_TEST

/* GIFT_CHUNK_BYTES sets the chunk size when the options leave it 0; a value
 * that is not a number of bytes from 64 to 2^30 fails the open; the options
 * win over the environment. */
START_TEST(test_chunk_bytes_env)
{
    static const struct {
        const char *env;
        uint64_t opt;
        int rc;
        uint64_t want;
    } cases[] = {
        {"262144", 0, 0, 262144},
        {"64", 0, 0, 64},
        {"1073741824", 0, 0, 1073741824ull},
        {"", 0, 0, 4ull << 20},
        {"1073741825", 0, GIFT_EINVAL, 0},
        {"63", 0, GIFT_EINVAL, 0},
        {"0", 0, GIFT_EINVAL, 0},
        {"-4096", 0, GIFT_EINVAL, 0},
        {"256k", 0, GIFT_EINVAL, 0},
        {" 4096", 0, GIFT_EINVAL, 0},
        {"99999999999999999999999", 0, GIFT_EINVAL, 0},
        {"junk", 4096, 0, 4096}, /* the option wins and the variable is not read */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
        gift_client_t *c = NULL;
        int rc;
        o.servers = "127.0.0.1:1";
        o.rank = 0;
        o.world_size = 1;
        o.chunk_bytes = cases[i].opt;
        setenv("GIFT_CHUNK_BYTES", cases[i].env, 1);
        rc = gift__client_new(&o, &c);
        unsetenv("GIFT_CHUNK_BYTES");
        ck_assert_msg(rc == cases[i].rc,
                      "GIFT_CHUNK_BYTES='%s', chunk_bytes %" PRIu64 ": open returned %d, want %d",
                      cases[i].env, cases[i].opt, rc, cases[i].rc);
        if (rc == 0) {
            ck_assert_msg(c->chunk_bytes == cases[i].want,
                          "GIFT_CHUNK_BYTES='%s': chunk_bytes %" PRIu64 ", want %" PRIu64,
                          cases[i].env, c->chunk_bytes, cases[i].want);
            gift_client_close(c);
        } else {
            ck_assert_ptr_null(c);
        }
    }
}
END_TEST

/* A Pull behind this worker's own push leaves right behind it, not behind
 * every push of the turn: it takes its Push's priority and is queued after
 * it, so net.c's sort of a turn (higher priority first, then queue order)
 * writes Push(x) Pull(x) Push(y) Pull(y) ... on every shard, the pushes in
 * their own order (later-declared tensors first). */
START_TEST(test_pull_behind_push)
{
    enum { NT = 3 };
    static float g[NT][ROWS * COLS], out[NT][ROWS * COLS];
    gift_op_t *op[NT];
    size_t total = 0;

    declare_n(NT);
    for (int i = 0; i < NT; i++) {
        for (int e = 0; e < ROWS * COLS; e++)
            g[i][e] = (float)(e % 7) - 3.0f + (float)i;
        int rc = gift_push_pull(C, (uint32_t)i, 0, g[i], out[i], NULL, NULL, &op[i]);
        ck_assert_msg(rc == 0 && op[i] != NULL, "gift_push_pull of tensor %d returned %d", i, rc);
    }
    io_run();
    for (uint32_t s = 0; s < NSHARD; s++) {
        size_t idx[MAXF], n = unread(s), npush = 0;
        uint32_t last_key = UINT32_MAX;
        /* net.c's order: a stable sort by priority, higher first */
        for (size_t i = 0; i < n; i++)
            idx[i] = F.seen[s] + i;
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && F.f[s][idx[j]].prio > F.f[s][idx[j - 1]].prio; j--) {
                size_t x = idx[j];
                idx[j] = idx[j - 1];
                idx[j - 1] = x;
            }
        ck_assert_msg(n % 2 == 0, "shard %u: %zu frames, want a Push and a Pull per chunk", s, n);
        for (size_t i = 0; i < n; i += 2) {
            const Gift__Envelope *a = F.f[s][idx[i]].env, *b = F.f[s][idx[i + 1]].env;
            ck_assert_msg(a->msg_case == GIFT__ENVELOPE__MSG_PUSH &&
                              b->msg_case == GIFT__ENVELOPE__MSG_PULL,
                          "shard %u, frames %zu and %zu as written: cases %d, %d, want a Push "
                          "and then its Pull",
                          s, i, i + 1, (int)a->msg_case, (int)b->msg_case);
            ck_assert_msg(b->pull->key == a->push->key && b->pull->chunk == a->push->chunk &&
                              b->pull->step == 0,
                          "shard %u: Pull key %u chunk %u right behind Push key %u chunk %u", s,
                          b->pull->key, b->pull->chunk, a->push->key, a->push->chunk);
            ck_assert_msg(F.f[s][idx[i + 1]].prio == F.f[s][idx[i]].prio,
                          "shard %u key %u: Pull priority %" PRId64 ", its Push's %" PRId64, s,
                          a->push->key, F.f[s][idx[i + 1]].prio, F.f[s][idx[i]].prio);
            ck_assert_msg(last_key == UINT32_MAX || a->push->key <= last_key,
                          "shard %u: Push key %u written after key %u (later-declared first)", s,
                          a->push->key, last_key);
            last_key = a->push->key;
            npush++;
        }
        total += npush;
    }
    ck_assert_msg(total == C->nchunks, "%zu pushes written, want %zu", total, C->nchunks);
    F.now += 1000000000ull; /* nothing answers: the ops time out */
    gift__eng_tick(C);
    for (int i = 0; i < NT; i++) {
        int st = 0;
        ck_assert_msg(gift_op_test(op[i], &st) && st == GIFT_ETIMEDOUT, "op %d: done %d status %d",
                      i, gift_op_test(op[i], NULL), st);
        gift_op_free(op[i]);
    }
}
END_TEST

/* Close: the loop is shut down once nothing is in flight. */
START_TEST(test_close)
{
    gift__cmd_t cmd;
    memset(&cmd, 0, sizeof cmd);
    cmd.kind = GIFT__CMD_CLOSE;
    gift__cmd_put(C, &cmd);
    io_run();
    ck_assert_msg(cmd.done && cmd.rc == 0 && F.shutdowns == 1, "close: done %d rc %d, %d shutdowns",
                  cmd.done, cmd.rc, F.shutdowns);
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *conn = tcase_create("connect"), *ops = tcase_create("operations");
    tcase_add_checked_fixture(conn, fx_open, fx_close);
    tcase_add_test(conn, test_connect);
    tcase_add_test(conn, test_connect_wrong_shard);
    tcase_add_test(conn, test_connect_timeout);
    tcase_add_test(conn, test_pull_behind_push);
    tcase_add_test(conn, test_chunk_bytes_env);
    suite_add_tcase(s, conn);
    tcase_add_checked_fixture(ops, fx_declared, fx_close);
    tcase_add_test(ops, test_push_pull);
    tcase_add_test(ops, test_op_timeout);
    tcase_add_test(ops, test_sink);
    tcase_add_test(ops, test_sink_timeout);
    tcase_add_test(ops, test_shard_error);
    tcase_add_test(ops, test_reconnect_replay);
    tcase_add_test(ops, test_close);
    suite_add_tcase(s, ops);
    return s;
}

int main(void)
{
    return gift_test_run(engine_suite(), CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
