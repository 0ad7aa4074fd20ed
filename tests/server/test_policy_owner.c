/*
 * test_policy_owner.c: the owner's per-tensor decision on the shard alone
 * (server/policy_owner.h; fake peers, no sockets). What a peer claims about
 * codecs is hostile until checked: a push may use a codec other than the
 * declared one only on a geometry tensor, only one no larger in bytes, and
 * only the one its step already uses (another shard) or its epoch's
 * decision says (the owner). Without a policy nothing of the decision is
 * sent and nothing is allocated for it.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_policy.h"
#include "gift_proto.h"
#include "log.h"
#include "shard.h"
#include "gift_test_check.h"
#include "gift_test_frames.h"
#include "shard_fake.h"

#define CH1_N (6 * GDIN) /* GEO_T's chunk 1 */

/* A push of tensor 0 chunk 1 step from fp, claiming push codec (fmt,
 * block) and, when pfmt >= 0, pull codec pfmt, with a zero payload of len
 * bytes (a valid payload of every format). */
static void push_claim(fake_t *fp, uint64_t step, Gift__Format fmt, uint32_t block, int pfmt,
                       size_t len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT, pull = GIFT__CODEC__INIT;
    uint8_t *pay = calloc(1, len ? len : 1);
    ck_assert_ptr_nonnull(pay);
    gift_test_fill_push(&env, &m, &codec, 0, 1, step, 0, fmt, block, g_seq++);
    if (pfmt >= 0) {
        pull.format = (Gift__Format)pfmt;
        m.pull_codec = &pull;
    }
    ck_assert_int_eq(feed(fp, &env, pay, len), 0);
    free(pay);
}

static void expect_ack(fake_t *fp)
{
    take_at(fp, GIFT__ENVELOPE__MSG_PUSH_ACK, __LINE__);
}

/* Another shard (not the owner) takes the step's codecs from its first push. */
START_TEST(test_non_owner_codecs)
{
    gift_shard_opts_t o = O;
    size_t nv = layout_total(NVFP4, 0, CH1_N), f8 = layout_total(E4M3, 32, CH1_N);
    uint64_t q;
    sent_t *s;
    o.shard_id = 1;
    o.num_shards = 2;
    reopen(&o);
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OTHER_C, 1);

    push_claim(&P[0], 0, NVFP4, 0, -1, nv); /* smaller than fp8: fixes step 0 */
    expect_ack(&P[0]);
    push_claim(&P[1], 0, E4M3, 32, -1, f8); /* the declared codec, but not the step's */
    EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    push_claim(&P[1], 0, BF16, 0, -1, layout_total(BF16, 0, CH1_N)); /* larger than declared */
    EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    push_claim(&P[1], 0, NVFP4, 0, -1, f8); /* nvfp4 claimed, fp8's length */
    EXPECT_ERROR(&P[1], GIFT_ESHAPE, 0);
    push_claim(&P[1], 0, NVFP4, 0, 99, nv); /* an unknown pull format */
    EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    push_claim(&P[1], 0, NVFP4, 0, (int)BF16, nv); /* a pull codec the step does not use */
    EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    push_claim(&P[1], 0, E4M3, 7, -1, f8); /* an fp8 block that is not a codec */
    EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    push_claim(&P[1], 0, E4M3, UINT32_MAX, -1, f8); /* the largest block the wire can say */
    EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    for (int r = 1; r < W; r++) {
        push_claim(&P[r], 0, NVFP4, 0, -1, nv);
        expect_ack(&P[r]);
    }
    q = PULL(&P[2], 0, 1, 0);
    s = EXPECT_REPLY(&P[2], 0, 1, 0, 0, q);
    ck_assert_msg(s->env->pull_reply->codec != NULL && s->env->pull_reply->codec->format == F32 &&
                      s->len == layout_total(F32, 0, CH1_N),
                  "reply codec %d, %zu bytes; want the declared f32 pull, %zu bytes",
                  s->env->pull_reply->codec ? (int)s->env->pull_reply->codec->format : -1, s->len,
                  layout_total(F32, 0, CH1_N));
    /* Step 1: the first push says nvfp4 both ways (the declared pull is f32). */
    push_claim(&P[3], 1, NVFP4, 0, (int)NVFP4, nv);
    expect_ack(&P[3]);
    for (int r = 0; r < 3; r++) {
        push_claim(&P[r], 1, NVFP4, 0, (int)NVFP4, nv);
        expect_ack(&P[r]);
    }
    q = PULL(&P[0], 0, 1, 1);
    s = take_at(&P[0], GIFT__ENVELOPE__MSG_PULL_REPLY, __LINE__);
    ck_assert_msg(s->env->pull_reply->step == 1 && s->env->pull_reply->seq == q,
                  "reply of step %" PRIu64 " seq %" PRIu64 "; want step 1 seq %" PRIu64,
                  s->env->pull_reply->step, s->env->pull_reply->seq, q);
    ck_assert_msg(s->env->pull_reply->codec->format == NVFP4 && s->len == nv,
                  "reply codec %d, %zu bytes; want nvfp4, %zu bytes",
                  (int)s->env->pull_reply->codec->format, s->len, nv);
    EXPECT_ERRORS(2, GIFT_ECODEC, 6, GIFT_ESHAPE, 1);
    QUIET_ALL();
}
END_TEST

/* The default (policy all, no budget): the Geometry carries no decision and
 * the owner takes nothing but the declared codecs. */
START_TEST(test_default_sends_nothing_new)
{
    sent_t *s;
    const Gift__Geometry *g;
    uint64_t mem;
    reopen(&O);
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    mem = gift_shard_memory_committed(S);
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    s = take_at(&P[0], GIFT__ENVELOPE__MSG_GEOMETRY, __LINE__);
    g = s->env->geometry;
    ck_assert_msg(!g->euclidean && g->transform_rank == 0 && g->push_codec == NULL &&
                      g->pull_codec == NULL && g->predicted_ratio == 0.0 && g->bits == 0.0,
                  "policy all sent euclidean %d rank %u push %p pull %p ratio %g bits %g",
                  (int)g->euclidean, g->transform_rank, (void *)g->push_codec,
                  (void *)g->pull_codec, g->predicted_ratio, g->bits);
    push_claim(&P[0], 0, NVFP4, 0, -1, layout_total(NVFP4, 0, CH1_N));
    EXPECT_ERROR(&P[0], GIFT_ECODEC, 0);
    /* The same store under policy none costs the decision's buffers more. */
    {
        gift_shard_opts_t o = O;
        o.policy = GIFT_POLICY_NONE;
        reopen(&o);
        hello_all();
        DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
        /* gbar 10 x 64, T^-1 scratch 10 x 8, d and d_inv 8 each, in f32. */
        ck_assert_msg(gift_shard_memory_committed(S) >= mem + 4 * (10 * GDIN + 10 * GK + 2 * GK),
                      "policy none commits %" PRIu64 " bytes, all %" PRIu64,
                      gift_shard_memory_committed(S), mem);
    }
    QUIET_ALL();
}
END_TEST

/* policy none on the owner: every epoch Euclidean at the declared codecs;
 * the owner refuses a push that does not follow the decision, and any other
 * codec on a tensor without geometry. */
START_TEST(test_owner_decision)
{
    gift_shard_opts_t o = O;
    const Gift__Geometry *g;
    o.policy = GIFT_POLICY_NONE;
    reopen(&o);
    hello_all();
    DECLARE_OK(&P[0], GEO_T, 2, GEO_OWNER_C, 3);
    ck_assert_int_eq(georeq_raw(&P[0], 0, 0), 0);
    g = take_at(&P[0], GIFT__ENVELOPE__MSG_GEOMETRY, __LINE__)->env->geometry;
    ck_assert_msg(g->euclidean && g->transform_rank == GK && g->push_codec != NULL &&
                      g->push_codec->format == E4M3 && g->push_codec->block == 32 &&
                      g->pull_codec != NULL && g->pull_codec->format == F32,
                  "policy none: euclidean %d rank %u push %d/%u pull %d", (int)g->euclidean,
                  g->transform_rank, g->push_codec ? (int)g->push_codec->format : -1,
                  g->push_codec ? g->push_codec->block : 0,
                  g->pull_codec ? (int)g->pull_codec->format : -1);
    push_claim(&P[0], 0, NVFP4, 0, -1, layout_total(NVFP4, 0, CH1_N)); /* not the decision */
    EXPECT_ERROR(&P[0], GIFT_ECODEC, 0);
    push_claim(&P[0], 0, E4M3, 32, -1, layout_total(E4M3, 32, CH1_N));
    expect_ack(&P[0]);
    {
        /* Tensor 1 has no geometry: only its declared f32. */
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__Push m = GIFT__PUSH__INIT;
        Gift__Codec codec = GIFT__CODEC__INIT;
        size_t len = layout_total(NVFP4, 0, 3 * 5);
        uint8_t *pay = calloc(1, len);
        ck_assert_ptr_nonnull(pay);
        gift_test_fill_push(&env, &m, &codec, 1, 0, 0, 0, NVFP4, 0, g_seq++);
        ck_assert_int_eq(feed(&P[1], &env, pay, len), 0);
        free(pay);
        EXPECT_ERROR(&P[1], GIFT_ECODEC, 0);
    }
    QUIET_ALL();
}
END_TEST

/* Options a shard refuses to start with. */
START_TEST(test_bad_options)
{
    gift_shard_opts_t o = O;
    gift_shard_t *s;
    o.policy = 7;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    o = O;
    o.budget_bits = NAN;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    o = O;
    o.max_transform_gflops = -1.0;
    ck_assert_ptr_null(gift_shard_new(&o, &IO));
    o = O;
    o.policy = GIFT_POLICY_AUTO;
    o.budget_bits = 6.0;
    s = gift_shard_new(&o, &IO);
    ck_assert_ptr_nonnull(s);
    gift_shard_free(s);
}
END_TEST

static Suite *policy_suite(void)
{
    Suite *s = suite_create("server_policy");
    TCase *tc = tcase_create("policy");
    tcase_add_checked_fixture(tc, fx_base, fx_teardown);
    tcase_add_test(tc, test_non_owner_codecs);
    tcase_add_test(tc, test_default_sends_nothing_new);
    tcase_add_test(tc, test_owner_decision);
    tcase_add_test(tc, test_bad_options);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (getenv("GIFT_TEST_LOG") == NULL)
        gift_log_set_level(GIFT_LOG_LEVEL_ERROR);
    return gift_test_run(policy_suite(), CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
