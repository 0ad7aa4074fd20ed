/*
 * test_client_treat.c: a worker's load of an epoch's decision
 * (gift__geo_load, client/host.c). Every field of the Geometry is hostile
 * until checked: a rank above the declared one, an unknown codec or one
 * larger than a declared buffer is refused (GIFT_ESHAPE) and the epoch slot
 * keeps what it held; a valid decision gives the lowered rank's transform,
 * an identity for Euclidean, and the codecs the pushes and pulls of the
 * epoch use. No sockets: one wire, one chunk, built by hand.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gift_proto.h"
#include "gift_test_check.h"
#include "giftclient_internal.h"

#define ROWS 16
#define DIN 64
#define K 8
#define KS 12

static gift_client_t *C;
static gift__wire_t *Wr;
static gift__geo_t *G;
static gift_geometry_t Src; /* a built epoch: what the owner published */

static void setup(void)
{
    gift_codec_params_t fp8 = {GIFT_FMT_E4M3, 0, 0, {0}};
    float *X = malloc(40 * DIN * sizeof(float)), *Y = malloc(DIN * KS * sizeof(float));
    float *work = malloc(40 * KS * sizeof(float));
    uint64_t st = 99;
    double tr;
    ck_assert(X != NULL && Y != NULL && work != NULL);
    C = calloc(1, sizeof *C);
    Wr = calloc(1, sizeof *Wr);
    ck_assert(C != NULL && Wr != NULL);
    ck_assert((C->chunks = calloc(1, sizeof *C->chunks)) != NULL);
    C->chunks[0].n = (size_t)ROWS * DIN;
    C->chunks[0].rows = ROWS;
    ck_assert_int_eq(gift_layout(&fp8, C->chunks[0].n, &C->chunks[0].push_l), 0);
    ck_assert_int_eq(gift_layout(&fp8, C->chunks[0].n, &C->chunks[0].pull_l), 0);
    Wr->rows = ROWS;
    Wr->cols = DIN;
    Wr->k = K;
    Wr->ks = KS;
    Wr->geometry = 1;
    Wr->nchunks = 1;
    Wr->push = Wr->pull = fp8;
    G = &Wr->geo[0];
    ck_assert_int_eq(gift_geometry_init(&G->g, DIN, K, KS, 7), 0);
    ck_assert_int_eq(gift_geometry_init(&Src, DIN, K, KS, 7), 0);
    for (size_t i = 0; i < 40 * DIN; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        X[i] = (float)((double)(st >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + i % DIN);
    }
    ck_assert_int_eq(gift_sketch(X, 40, DIN, Src.U, KS, Y, &tr, work), 0);
    ck_assert_int_eq(gift_geometry_update(&Src, Y, tr, 1e-2), 0);
    free(X);
    free(Y);
    free(work);
}

static void teardown(void)
{
    gift_geometry_free(&G->g);
    gift_geometry_free(&Src);
    free(C->chunks);
    free(C);
    free(Wr);
}

/* The Geometry message of Src, with no decision. */
static void message(Gift__Geometry *m)
{
    gift__geometry__init(m);
    m->epoch = Src.epoch;
    m->din = DIN;
    m->rank = K;
    m->basis_cols = KS;
    m->trace = Src.trace;
    m->sigma2 = Src.sigma2;
    m->delta = Src.delta;
}

/* What on_geometry does before the load: the payload into the slot. */
static int load(const Gift__Geometry *m)
{
    memcpy(G->g.U, Src.U, (size_t)DIN * KS * sizeof(float));
    memcpy(G->g.lambda, Src.lambda, KS * sizeof(float));
    return gift__geo_load(C, Wr, G, m);
}

START_TEST(test_refused)
{
    Gift__Geometry m;
    Gift__Codec bf16 = GIFT__CODEC__INIT, bad = GIFT__CODEC__INIT, blk = GIFT__CODEC__INIT;
    bf16.format = GIFT__FORMAT__FORMAT_BF16;
    bad.format = (Gift__Format)77;
    blk.format = GIFT__FORMAT__FORMAT_FP8_E4M3;
    blk.block = 7;
    message(&m);
    m.transform_rank = K + 1;
    ck_assert_int_eq(load(&m), GIFT_ESHAPE);
    ck_assert_msg(G->g.k == K && !G->tr, "after a refused rank: k %d tr %d", G->g.k, G->tr);
    message(&m);
    m.push_codec = &bf16; /* 2 bytes per element, the buffers hold fp8 */
    ck_assert_int_eq(load(&m), GIFT_ESHAPE);
    message(&m);
    m.pull_codec = &bf16;
    ck_assert_int_eq(load(&m), GIFT_ESHAPE);
    message(&m);
    m.push_codec = &bad;
    ck_assert_int_eq(load(&m), GIFT_ESHAPE);
    message(&m);
    m.pull_codec = &blk;
    ck_assert_int_eq(load(&m), GIFT_ESHAPE);
    ck_assert_msg(G->g.epoch == 0 && !G->tr, "a refused epoch was loaded: epoch %u tr %d",
                  G->g.epoch, G->tr);
}
END_TEST

START_TEST(test_declared)
{
    Gift__Geometry m;
    gift__pstate_t ps;
    message(&m);
    ck_assert_int_eq(load(&m), 0);
    ck_assert_msg(!G->tr && G->g.k == K && G->g.sigma2 == Src.sigma2 && G->g.c == Src.c &&
                      G->g.d[K - 1] == Src.d[K - 1],
                  "no decision: tr %d k %d sigma2 %.17g (owner %.17g)", G->tr, G->g.k, G->g.sigma2,
                  Src.sigma2);
    G->used = 1;
    memset(&ps, 0, sizeof ps);
    gift__ps_codecs(Wr, &ps, G);
    ck_assert_msg(!ps.tr && ps.push.fmt == GIFT_FMT_E4M3 &&
                      gift__ps_push_len(&ps, &C->chunks[0]) == C->chunks[0].push_l.total,
                  "push tr %d fmt %d len %zu", ps.tr, (int)ps.push.fmt,
                  gift__ps_push_len(&ps, &C->chunks[0]));
}
END_TEST

START_TEST(test_lowered_rank_nvfp4)
{
    Gift__Geometry m;
    Gift__Codec nv = GIFT__CODEC__INIT;
    gift__pstate_t ps;
    gift_layout_t l;
    double want;
    nv.format = GIFT__FORMAT__FORMAT_NVFP4;
    message(&m);
    m.transform_rank = 4;
    m.push_codec = &nv;
    m.pull_codec = &nv;
    ck_assert_int_eq(load(&m), 0);
    want = gift_geometry_rank_sigma2(&Src, 4);
    ck_assert_msg(G->tr && G->g.k == 4 && G->g.sigma2 == want && !G->g.identity,
                  "rank 4: tr %d k %d sigma2 %.17g want %.17g identity %d", G->tr, G->g.k,
                  G->g.sigma2, want, G->g.identity);
    ck_assert_msg(fabs(G->g.c - (float)(1.0 / sqrt(want + Src.delta))) == 0.0,
                  "rank 4: c %.9g, want %.9g", (double)G->g.c, 1.0 / sqrt(want + Src.delta));
    G->used = 1;
    memset(&ps, 0, sizeof ps);
    gift__ps_codecs(Wr, &ps, G);
    ck_assert_int_eq(gift_layout(&ps.push, C->chunks[0].n, &l), 0);
    ck_assert_msg(ps.tr && ps.push.fmt == GIFT_FMT_NVFP4 && ps.pull.fmt == GIFT_FMT_NVFP4 &&
                      gift__ps_push_len(&ps, &C->chunks[0]) == l.total,
                  "push tr %d fmt %d pull %d len %zu want %zu", ps.tr, (int)ps.push.fmt,
                  (int)ps.pull.fmt, gift__ps_push_len(&ps, &C->chunks[0]), l.total);
    ck_assert_msg(gift__pull_codec(Wr, Src.epoch)->fmt == GIFT_FMT_NVFP4 &&
                      gift__pull_len(Wr, Src.epoch, &C->chunks[0]) == l.total &&
                      gift__pull_codec(Wr, Src.epoch + 1) == &Wr->pull,
                  "pull codec of the epoch %d (len %zu), of an unknown epoch the declared",
                  (int)gift__pull_codec(Wr, Src.epoch)->fmt,
                  gift__pull_len(Wr, Src.epoch, &C->chunks[0]));
    /* The same slot, the next epoch without a decision: back to rank K. */
    message(&m);
    ck_assert_int_eq(load(&m), 0);
    ck_assert_msg(G->g.k == K && !G->tr && G->g.sigma2 == Src.sigma2, "reload: k %d tr %d", G->g.k,
                  G->tr);
}
END_TEST

START_TEST(test_euclidean)
{
    Gift__Geometry m;
    message(&m);
    m.euclidean = 1;
    ck_assert_int_eq(load(&m), 0);
    ck_assert_msg(G->tr && G->g.identity, "euclidean: tr %d identity %d", G->tr, G->g.identity);
    ck_assert_msg(memcmp(G->g.U, Src.U, (size_t)DIN * KS * sizeof(float)) == 0,
                  "euclidean: the sketch basis must stay the epoch's U");
}
END_TEST

static Suite *treat_suite(void)
{
    Suite *s = suite_create("client_treat");
    TCase *tc = tcase_create("geo_load");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_declared);
    tcase_add_test(tc, test_lowered_rank_nvfp4);
    tcase_add_test(tc, test_euclidean);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(treat_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
