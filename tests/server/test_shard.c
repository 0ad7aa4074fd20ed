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
 * with the pull codec (docs/ARCHITECTURE.md, aggregation). The mean is also compared with
 * the exact mean in double precision. Persistence has a suite of its own
 * (test_checkpoint.c); the fake io and helpers are shared (shard_fake.h).
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
#include "shard_fake.h"

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
            /* The probe's sketch: trace 1e308, values 3e38 (refused here,
             * not accepted to fail the epoch's build); and an element above
             * twice the trace, which no A.Q of an orthonormal Q can hold. */
            for (size_t j = 0; j < (size_t)GDIN * GKS; j++)
                bad[j] = 3e38f;
            sketch_err_at(&P[r], 1, 0, 1e308, GDIN, GKS, bad, ylen, GIFT_EBADCODE, __LINE__);
            memcpy(bad, Y[r], ylen);
            bad[5] = (float)(4.0 * tr[r]);
            sketch_err_at(&P[r], 1, 0, tr[r], GDIN, GKS, bad, ylen, GIFT_EBADCODE, __LINE__);
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
    EXPECT_ERRORS(4, GIFT_ENOKEY, 2, GIFT_ESHAPE, 3, GIFT_EEPOCH, 7, GIFT_EBADCODE, 6);
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
    uint64_t pass0[GIFT_SPASS_KINDS];

    memcpy(pass0, c->pass_bytes, sizeof pass0);
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
    {
        /* Passes over the 91 elements: step 0 in rank order (a decode, two
         * adds, and the last push fused with the mean's encoding: no
         * separate encode); step 1's one push, from rank 1 before rank 0,
         * checked and kept. Duplicates and refused frames cost none. */
        const uint64_t e = 4u * 7 * 13;
        const uint64_t want[GIFT_SPASS_KINDS] = {
            [GIFT_SPASS_DECODE] = e, [GIFT_SPASS_ACCUMULATE] = 2 * e, [GIFT_SPASS_FUSED] = e,
            [GIFT_SPASS_CHECK] = e,  [GIFT_SPASS_COPY] = e,
        };
        for (int k = 0; k < GIFT_SPASS_KINDS; k++)
            for (int k = 0; k < GIFT_SPASS_KINDS; k++)
                ck_assert_msg(c->pass_bytes[k] - pass0[k] == want[k],
                              "pass %s: %" PRIu64 " bytes, want %" PRIu64, gift_shard_pass_name(k),
                              c->pass_bytes[k] - pass0[k], want[k]);
    }
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

/* Asserts that peer fp was refused with GIFT_ERUNID and a text naming the
 * run held, the run presented and the reset. */
static void expect_run_refused(fake_t *fp, const char *held, const char *presented)
{
    const Gift__Error *e = EXPECT_ERROR(fp, GIFT_ERUNID, 1);
    ck_assert_msg(e->text && strstr(e->text, held) && strstr(e->text, presented) &&
                      strstr(e->text, "giftctl reset") && strstr(e->text, "data directory"),
                  "run-id refusal text: %s", e->text ? e->text : "(none)");
}

/* The first Declare's sender fixes the run; a Hello of another run is then
 * refused, one without a run id is not; a Hello alone fixes nothing. */
START_TEST(test_run_id)
{
    char longid[80];
    g_run_id = "run-b"; /* a Hello of run b before any Declare fixes nothing */
    HELLO(&P[4], 1, W);
    g_run_id = "run-a";
    HELLO(&P[0], 0, W);
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    /* The early peer of run b cannot declare into run a. */
    ck_assert_int_eq(declare_raw(&P[4], STD_T, STD_NT, STD_C, STD_NC, 0, 0), GIFT_ERUNID);
    expect_run_refused(&P[4], "run-a", "run-b");
    g_run_id = "run-b";
    ck_assert_int_eq(hello_raw(&P[5], GIFT_PROTOCOL_VERSION, 1, W, NULL, 0), GIFT_ERUNID);
    expect_run_refused(&P[5], "run-a", "run-b");
    g_run_id = ""; /* an old client or a manual run: no check */
    HELLO(&P[1], 1, W);
    g_run_id = "run-a";
    HELLO(&P[2], 2, W);
    DECLARE_OK(&P[2], STD_T, STD_NT, STD_C, STD_NC);
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    g_run_id = longid;
    ck_assert_int_eq(hello_raw(&P[6], GIFT_PROTOCOL_VERSION, 3, W, NULL, 0), GIFT_EPROTO);
    EXPECT_ERROR(&P[6], GIFT_EPROTO, 1);
    QUIET_ALL();
}
END_TEST

/* Hello.resume_step: a worker that has the mean of step t from this shard
 * (resume t + 1) is refused, fatally and naming the step and the fix, by a
 * shard that has not finished step t: one that started empty, or one
 * behind it. 0 (a new client) and steps the shard finished pass; a hostile
 * value costs a comparison. */
START_TEST(test_resume_step)
{
    static const uint64_t bad[] = {1, 2, 1000, UINT64_MAX};
    const Gift__Error *e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g_resume_step = bad[i];
        ck_assert_int_eq(hello_raw(&P[i], GIFT_PROTOCOL_VERSION, 0, W, NULL, 0), GIFT_ESTATE);
        e = EXPECT_ERROR(&P[i], GIFT_ESTATE, 1);
        ck_assert_msg(e->step == bad[i] - 1 && strstr(e->text, "shard 0 lost this run's state") &&
                          strstr(e->text, "it holds no tensors") &&
                          strstr(e->text, "Restart the whole run") &&
                          strstr(e->text, "--checkpoint-steps"),
                      "resume %" PRIu64 ": step %" PRIu64 ", text: %s", bad[i], e->step, e->text);
    }
    ck_assert_int_eq(C()->errors[-GIFT_ESTATE], 4);
    g_resume_step = 0;
    for (int r = 0; r < W; r++)
        HELLO(&P[4 + r], (uint32_t)r, W);
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[4 + r], STD_T, STD_NT, STD_C, STD_NC);
    /* Step 0 of every chunk finished: resume 1 passes, resume 2 does not. */
    for (size_t ci = 0; ci < STD_NC; ci++)
        for (int r = 0; r < W; r++)
            PUSH_GRAD(&P[4 + r], STD_C[ci].key, STD_C[ci].chunk, 0, (uint32_t)r, 0);
    QUIET_ALL();
    for (int k = 4; k < 6; k++) { /* ranks 0 and 1 reconnect */
        peer_gone(&P[k]);
        peer_open(k);
        P[k].gone = 0;
    }
    g_resume_step = 1;
    HELLO(&P[4], 0, W);
    g_resume_step = 2;
    ck_assert_int_eq(hello_raw(&P[5], GIFT_PROTOCOL_VERSION, 1, W, NULL, 0), GIFT_ESTATE);
    e = EXPECT_ERROR(&P[5], GIFT_ESTATE, 1);
    ck_assert_msg(strstr(e->text, "the mean of step 1") &&
                      strstr(e->text, "its newest finished step is 0"),
                  "text: %s", e->text);
    QUIET_ALL();
}
END_TEST

/* The restart raced a step: the shard died after finishing step 0, which
 * some workers had pulled and others not. Those came back first (resume 0)
 * and declared again; the first that pulled step 0 is refused. Without
 * authentication its Hello proves nothing (a stranger can send any
 * resume_step), so it is refused alone and the others' connections are left
 * as they are (test_auth.c's test_resume_race_auth: with a key, the others
 * are told at once). */
START_TEST(test_resume_step_race)
{
    const Gift__Error *e;
    for (int r = 0; r < W - 1; r++)
        HELLO(&P[r], (uint32_t)r, W);
    for (int r = 0; r < W - 1; r++)
        DECLARE_OK(&P[r], STD_T, STD_NT, STD_C, STD_NC);
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], STD_C[0].key, STD_C[0].chunk, 0, (uint32_t)r, 0);
    HELLO(&P[4], 0, W);
    g_resume_step = 1;
    ck_assert_int_eq(hello_raw(&P[3], GIFT_PROTOCOL_VERSION, 3, W, NULL, 0), GIFT_ESTATE);
    e = EXPECT_ERROR(&P[3], GIFT_ESTATE, 1);
    ck_assert_msg(strstr(e->text, "it has finished no step"), "text: %s", e->text);
    QUIET_ALL();
}
END_TEST

/* giftctl reset (Reset): refused with nothing changed for another run id
 * and while workers are connected; with force the workers are told and
 * closed; after it the shard holds nothing and adopts the next run. */
START_TEST(test_reset)
{
    const Gift__ResetAck *a;
    const Gift__Error *e;
    g_run_id = "run-a";
    for (int r = 0; r < W; r++)
        HELLO(&P[r], (uint32_t)r, W);
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], STD_T, STD_NT, STD_C, STD_NC);
    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], STD_C[0].key, STD_C[0].chunk, 0, (uint32_t)r, 0);
    for (int r = 0; r < W - 1; r++)
        PUSH_GRAD(&P[r], STD_C[1].key, STD_C[1].chunk, 0, (uint32_t)r, 0);
    (void)PULL(&P[0], STD_C[1].key, STD_C[1].chunk, 0); /* parked: the reset must drop it */
    QUIET_ALL();
    /* From a worker's own connection: refused. */
    ck_assert_int_eq(reset_raw(&P[3], NULL, 1, 6), GIFT_EPROTO);
    e = EXPECT_ERROR(&P[3], GIFT_EPROTO, 1);
    ck_assert_msg(strstr(e->text, "acts as rank 3"), "text: %s", e->text);
    peer_gone(&P[3]);
    peer_open(3);
    P[3].gone = P[3].closed = 0;
    HELLO(&P[3], 3, W);
    PUSH_DUP(&P[3], STD_C[0].key, STD_C[0].chunk, 0, 3, 0); /* claims rank 3 again */
    /* Before a Hello: refused. */
    ck_assert_int_eq(reset_raw(&P[4], NULL, 1, 7), GIFT_EPROTO);
    EXPECT_ERROR(&P[4], GIFT_EPROTO, 1);
    g_run_id = "";
    HELLO(&P[5], 0, W);
    ck_assert_int_eq(reset_raw(&P[5], "run-b", 1, 7), GIFT_ERUNID);
    e = EXPECT_ERROR(&P[5], GIFT_ERUNID, 1);
    ck_assert_msg(e->seq == 7 && strstr(e->text, "holds run 'run-a', not run 'run-b'") &&
                      strstr(e->text, "nothing changed"),
                  "seq %" PRIu64 ", text: %s", e->seq, e->text);
    /* A run id one byte past the bound: refused before it is compared or kept. */
    {
        char longid[64 + 2]; /* the shard's bound is 64 bytes (GIFT_RUN_ID_MAX) */
        memset(longid, 'x', sizeof longid - 1);
        longid[sizeof longid - 1] = '\0';
        HELLO(&P[6], 0, W);
        ck_assert_int_eq(reset_raw(&P[6], longid, 1, 8), GIFT_EPROTO);
        e = EXPECT_ERROR(&P[6], GIFT_EPROTO, 1);
        ck_assert_msg(strstr(e->text, "run id longer than"), "text: %s", e->text);
        ck_assert_msg(C()->steps_finished == 1, "a refused reset changed the shard");
        peer_gone(&P[6]);
        peer_open(6);
        P[6].gone = P[6].closed = 0;
    }
    HELLO(&P[6], 0, W);
    ck_assert_int_eq(reset_raw(&P[6], "run-a", 0, 8), GIFT_EBUSY);
    e = EXPECT_ERROR(&P[6], GIFT_EBUSY, 1);
    ck_assert_msg(strstr(e->text, "4 workers of run 'run-a' are connected") &&
                      strstr(e->text, "ranks 0,1,2,3") && strstr(e->text, "--force"),
                  "text: %s", e->text);
    ck_assert_msg(C()->steps_finished == 1, "a refused reset changed the shard");
    HELLO(&P[7], 0, W);
    ck_assert_int_eq(reset_raw(&P[7], "run-a", 1, 9), 0);
    for (int r = 0; r < W; r++) {
        e = EXPECT_ERROR(&P[r], GIFT_ESTATE, 1);
        ck_assert_msg(strstr(e->text, "was reset by `giftctl reset --force`") &&
                          strstr(e->text, "run 'run-a'"),
                      "rank %d: %s", r, e->text);
    }
    a = take_at(&P[7], GIFT__ENVELOPE__MSG_RESET_ACK, __LINE__)->env->reset_ack;
    ck_assert_msg(a->seq == 9 && a->shard_id == 0 && strcmp(a->run_id, "run-a") == 0 &&
                      a->tensors == STD_NT && a->steps == 1 && a->closed == W && !a->files,
                  "ack: seq %" PRIu64 " run '%s' tensors %u steps %" PRIu64 " closed %u files %d",
                  a->seq, a->run_id, a->tensors, a->steps, a->closed, a->files);
    ck_assert_msg(gift_shard_memory_committed(S) == 0, "memory still committed after a reset");
    QUIET_ALL();
    for (int r = 0; r < W; r++) {
        peer_gone(&P[r]);
        peer_open(r);
        P[r].gone = P[r].closed = 0;
    }
    /* The next run: another run id, and step 0 again. */
    g_run_id = "run-b";
    for (int r = 0; r < W; r++)
        HELLO(&P[r], (uint32_t)r, W);
    for (int r = 0; r < W; r++)
        DECLARE_OK(&P[r], STD_T, STD_NT, STD_C, STD_NC);
    for (int r = 0; r < W; r++)
        PUSH_GRAD(&P[r], STD_C[0].key, STD_C[0].chunk, 0, (uint32_t)r, 0);
    QUIET_ALL();
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
    TCase *ordered = tcase_create("ordered");

    tcase_add_checked_fixture(hello, fx_base, fx_teardown);
    tcase_add_test(hello, test_hello_ack);
    tcase_add_test(hello, test_run_id);
    tcase_add_test(hello, test_resume_step);
    tcase_add_test(hello, test_resume_step_race);
    tcase_add_test(hello, test_reset);
    tcase_add_test(hello, test_hello_version);
    tcase_add_test(hello, test_hello_world);
    tcase_add_test(hello, test_hello_world_configured);
    tcase_add_test(hello, test_before_hello);
    tcase_add_test(hello, test_second_hello);
    tcase_add_test(hello, test_payload_on_bare_messages);
    tcase_add_test(hello, test_server_messages_from_client);
    tcase_add_test(hello, test_hello_digest);
    tcase_add_test(hello, test_reject);
    tcase_add_test(hello, test_pull_ef);       /* declares a list of its own */
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
