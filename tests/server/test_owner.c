/*
 * test_owner.c: server/owner.c alone, on a tensor_t built by hand: no shard,
 * no peers, no files.
 *
 * The owner's epoch records (which epoch a step uses, the newest one, the
 * ring of MAX_EPOCH_RECS), publishing (the payload buffer holds U then
 * lambda; a buffer a write still holds is replaced, not overwritten), the
 * checks a Sketch passes before it joins a round, and the round itself: the
 * ordered sum adds the ranks in rank order whatever order they arrive in,
 * and the epoch built is the one gift_geometry_update_decay builds from the
 * same sum.
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_error.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"
#include "owner.h"

#define DIN 16
#define K 4
#define KS 6
#define WORLD 3
#define NX 24 /* activation rows per sketch */

static tensor_t T;

/* A geometry tensor of DIN columns owned here, as store_build leaves it:
 * epoch 0 published from step 0, rounds kept for WORLD ranks. */
static void fx_tensor(void)
{
    int rc;
    memset(&T, 0, sizeof T);
    T.key = 7;
    T.rows = 10;
    T.cols = DIN;
    T.k = K;
    T.ks = KS;
    T.geometry = 1;
    T.owner = 1;
    rc = gift_geometry_init(&T.geo, DIN, K, KS, 1234);
    ck_assert_msg(rc == 0, "gift_geometry_init returned %d", rc);
    T.ysum = calloc((size_t)DIN * KS, sizeof(float));
    T.sk_ranks = calloc(1, sizeof(uint64_t));
    T.yr = calloc((size_t)DIN * KS * WORLD, sizeof(float));
    T.tr = calloc(WORLD, sizeof(double));
    ck_assert(T.ysum && T.sk_ranks && T.yr && T.tr);
    rc = gift__owner_publish(&T, 0);
    ck_assert_msg(rc == 0, "first publish returned %d", rc);
}

static void fx_tensor_free(void)
{
    gift_geometry_free(&T.geo);
    free(T.ysum);
    free(T.sk_ranks);
    free(T.yr);
    free(T.tr);
    gift_rbuf_unref(T.geo_buf);
    memset(&T, 0, sizeof T);
}

/* Rank r's sketch against the current basis: Y = A U with A = X^T X / NX
 * for random activations X (so the sum is a PSD sketch), and tr(A). */
static void make_sketch(uint32_t r, float *Y, double *trace)
{
    uint64_t seed = 99 + r;
    double A[DIN][DIN] = {{0}};
    float X[NX][DIN];
    for (int i = 0; i < NX; i++)
        for (int j = 0; j < DIN; j++)
            X[i][j] = (float)(2.0 * rng_unit(&seed) - 1.0);
    *trace = 0;
    for (int a = 0; a < DIN; a++)
        for (int b = 0; b < DIN; b++) {
            for (int i = 0; i < NX; i++)
                A[a][b] += (double)X[i][a] * X[i][b];
            A[a][b] /= NX;
        }
    for (int a = 0; a < DIN; a++)
        *trace += A[a][a];
    for (int a = 0; a < DIN; a++)
        for (int c = 0; c < KS; c++) {
            double y = 0;
            for (int b = 0; b < DIN; b++)
                y += A[a][b] * T.geo.U[(size_t)b * KS + (size_t)c];
            Y[(size_t)a * KS + (size_t)c] = (float)y;
        }
}

/* A Sketch message of rank's round at step under epoch. */
static Gift__Sketch sketch_msg(uint64_t step, uint32_t epoch, double trace)
{
    Gift__Sketch m = GIFT__SKETCH__INIT;
    m.key = T.key;
    m.step = step;
    m.epoch = epoch;
    m.din = DIN;
    m.basis_cols = KS;
    m.trace = trace;
    return m;
}

START_TEST(test_epoch_records)
{
    uint32_t e;
    ck_assert_msg(T.nepochs == 1, "after the first publish: %u records", T.nepochs);
    e = gift__owner_epoch_for_step(&T, 123);
    ck_assert_msg(e == 0, "step 123 before any new epoch uses epoch %u", e);
    /* Epochs 1..5 valid from steps 10, 20, ...: the ring keeps the last 4. */
    for (uint32_t k = 1; k <= 5; k++) {
        T.geo.epoch = k;
        ck_assert_int_eq(gift__owner_publish(&T, 10 * k), 0);
    }
    ck_assert_msg(T.nepochs == MAX_EPOCH_RECS, "%u records kept, want %d", T.nepochs,
                  MAX_EPOCH_RECS);
    ck_assert_msg(T.epochs[0].epoch == 2 && T.epochs[0].valid_from == 20,
                  "oldest record: epoch %u from %" PRIu64, T.epochs[0].epoch,
                  T.epochs[0].valid_from);
    e = gift__owner_latest_epoch(&T);
    ck_assert_msg(e == 5, "latest epoch %u, want 5", e);
    e = gift__owner_epoch_for_step(&T, 35);
    ck_assert_msg(e == 3, "step 35 uses epoch %u, want 3", e);
    e = gift__owner_epoch_for_step(&T, 50);
    ck_assert_msg(e == 5, "step 50 uses epoch %u, want 5", e);
    e = gift__owner_epoch_for_step(&T, 5);
    ck_assert_msg(e == 2, "step 5 (before every kept record) uses epoch %u, want 2", e);
}
END_TEST

START_TEST(test_publish_buffer)
{
    size_t ub = (size_t)DIN * KS * 4, lb = (size_t)KS * 4;
    gift_rbuf_t *held = T.geo_buf, *mine;
    ck_assert_msg(held->len == ub + lb, "payload %zu bytes, want %zu", held->len, ub + lb);
    ck_assert_msg(memcmp(held->data, T.geo.U, ub) == 0, "payload does not start with U");
    ck_assert_msg(memcmp(held->data + ub, T.geo.lambda, lb) == 0, "lambda does not follow U");
    /* Nobody else holds it: reused in place. */
    ck_assert_int_eq(gift__owner_publish(&T, 1), 0);
    ck_assert_msg(T.geo_buf == held, "an unshared buffer was replaced");
    /* A write holds it: the write keeps the old bytes, the owner a new buffer. */
    gift_rbuf_ref(held);
    memcpy(held->data, "KEEP", 4);
    ck_assert_int_eq(gift__owner_publish(&T, 2), 0);
    mine = T.geo_buf;
    ck_assert_msg(mine != held, "a buffer held by a write was overwritten");
    ck_assert_msg(memcmp(held->data, "KEEP", 4) == 0, "the write's bytes changed");
    ck_assert_msg(held->refs == 1, "the old buffer has %u references, want 1 (the write's)",
                  held->refs);
    ck_assert_msg(memcmp(mine->data, T.geo.U, ub) == 0, "new payload does not hold U");
    gift_rbuf_unref(held);
}
END_TEST

START_TEST(test_sketch_check)
{
    float Y[DIN * KS];
    char why[256];
    Gift__Sketch m;
    double trace;
    int rc;

    make_sketch(0, Y, &trace);
    m = sketch_msg(50, 0, trace);
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT__SKETCH_NEW, "a good sketch: %d (%s)", rc, why);
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y - 4, why, sizeof why);
    ck_assert_msg(rc == GIFT_ESHAPE, "short payload: %d", rc);
    ck_assert_msg(strstr(why, "tensor 7 needs 16 x 6") != NULL, "short payload says: %s", why);
    m.din = DIN - 1;
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT_ESHAPE, "wrong din: %d", rc);
    m = sketch_msg(50, 1, trace);
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT_EEPOCH, "epoch 1 before it exists: %d", rc);
    m = sketch_msg(50, 0, -1.0);
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT_EBADCODE, "negative trace: %d", rc);
    m = sketch_msg(50, 0, trace);
    Y[5] = NAN;
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT_EBADCODE && strstr(why, "element 5") != NULL, "NaN at 5: %d (%s)", rc,
                  why);
    make_sketch(0, Y, &trace);
    /* Rank 0 joins the round of step 50: again it is a duplicate; an older
     * step is a duplicate; a newer one restarts the round. */
    gift__owner_sketch_begin(&T, 1, 50);
    gift__owner_sketch_add(&T, 1, 0, trace, (const uint8_t *)Y);
    rc = gift__owner_sketch_check(&T, &m, 0, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT__SKETCH_DUP, "rank 0 again: %d", rc);
    rc = gift__owner_sketch_check(&T, &m, 1, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT__SKETCH_NEW, "rank 1: %d", rc);
    m = sketch_msg(0, 0, trace);
    rc = gift__owner_sketch_check(&T, &m, 1, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT__SKETCH_DUP, "an older step: %d", rc);
    m = sketch_msg(100, 0, trace);
    rc = gift__owner_sketch_check(&T, &m, 1, (const uint8_t *)Y, sizeof Y, why, sizeof why);
    ck_assert_msg(rc == GIFT__SKETCH_RESTART, "a newer step: %d", rc);
    ck_assert_msg(!T.sk_active && T.sk_step == 50 && T.sk_count == 1,
                  "after a restart: active %d, step %" PRIu64 ", count %u (the dropped round's)",
                  T.sk_active, T.sk_step, T.sk_count);
}
END_TEST

/* The ordered round sums in rank order whatever the arrival order, eager in
 * arrival order; the epoch built is gift_geometry_update_decay's on the sum,
 * published valid from the step the caller names, the round marked done. */
START_TEST(test_round)
{
    static const uint32_t order[WORLD] = {2, 0, 1};
    float Y[WORLD][DIN * KS], ysum[DIN * KS] = {0};
    double tr[WORLD], trace_sum = 0;
    gift_geometry_t ref;
    int rc;

    ck_assert_int_eq(gift_geometry_init(&ref, DIN, K, KS, 1234), 0);
    for (uint32_t r = 0; r < WORLD; r++)
        make_sketch(r, Y[r], &tr[r]);
    for (uint32_t r = 0; r < WORLD; r++) {
        for (size_t i = 0; i < (size_t)DIN * KS; i++)
            ysum[i] += Y[r][i];
        trace_sum += tr[r];
    }
    gift__owner_sketch_begin(&T, 1, 50);
    for (uint32_t i = 0; i < WORLD; i++)
        gift__owner_sketch_add(&T, 1, order[i], tr[order[i]], (const uint8_t *)Y[order[i]]);
    ck_assert_msg(T.sk_count == WORLD && T.sk_ranks[0] == 7u, "count %u, ranks %#" PRIx64,
                  T.sk_count, T.sk_ranks[0]);
    rc = gift__owner_build(&T, WORLD, 1, GIFT_DAMPING_DEFAULT, 0.0);
    ck_assert_msg(rc == 1, "build returned %d, want epoch 1", rc);
    ck_assert_msg(memcmp(T.ysum, ysum, sizeof ysum) == 0, "the ordered sum is not rank 0+1+2");
    ck_assert_msg(T.trace_sum == trace_sum, "trace sum %.17g, want %.17g", T.trace_sum, trace_sum);
    ck_assert_int_eq(gift_geometry_update_decay(&ref, ysum, trace_sum, GIFT_DAMPING_DEFAULT,
                                                gift_geometry_decay_at(0.0, 0)),
                     0);
    ck_assert_msg(
        memcmp(T.geo.U, ref.U, (size_t)DIN * KS * 4) == 0 &&
            memcmp(T.geo.lambda, ref.lambda, (size_t)KS * 4) == 0 && T.geo.sigma2 == ref.sigma2,
        "epoch 1 differs from the reference update (sigma2 %g vs %g)", T.geo.sigma2, ref.sigma2);
    ck_assert_msg(T.nepochs == 1, "build published already (%u records)", T.nepochs);
    rc = gift__owner_publish_round(&T, 52);
    ck_assert_msg(rc == 1, "publish_round returned %d", rc);
    ck_assert_msg(T.sk_done && T.sk_done_step == 50 && !T.sk_active,
                  "round done %d at %" PRIu64 ", active %d", T.sk_done, T.sk_done_step,
                  T.sk_active);
    ck_assert_msg(gift__owner_epoch_for_step(&T, 51) == 0 &&
                      gift__owner_epoch_for_step(&T, 52) == 1,
                  "steps 51/52 use epochs %u/%u", gift__owner_epoch_for_step(&T, 51),
                  gift__owner_epoch_for_step(&T, 52));
    gift_geometry_free(&ref);
}
END_TEST

START_TEST(test_round_eager)
{
    float Y[2][DIN * KS], want[DIN * KS];
    double tr[2];
    make_sketch(1, Y[0], &tr[0]);
    make_sketch(0, Y[1], &tr[1]);
    gift__owner_sketch_begin(&T, 1, 0);
    gift__owner_sketch_add(&T, 0, 1, tr[0], (const uint8_t *)Y[0]);
    gift__owner_sketch_add(&T, 0, 0, tr[1], (const uint8_t *)Y[1]);
    for (size_t i = 0; i < (size_t)DIN * KS; i++)
        want[i] = 0.0f + Y[0][i] + Y[1][i];
    ck_assert_msg(memcmp(T.ysum, want, sizeof want) == 0, "eager sum is not in arrival order");
    ck_assert_msg(T.trace_sum == 0.0 + tr[0] + tr[1], "eager trace sum %.17g", T.trace_sum);
}
END_TEST

/* A saved epoch comes back whole: geometry, epoch number and payload. */
START_TEST(test_restore)
{
    size_t ub = (size_t)DIN * KS * 4, lb = (size_t)KS * 4;
    gift_geometry_t src;
    float Y[DIN * KS];
    double trace;
    uint8_t *U = malloc(ub + 1), *L = malloc(lb + 1);
    int rc;

    ck_assert(U && L);
    ck_assert_int_eq(gift_geometry_init(&src, DIN, K, KS, 1234), 0);
    make_sketch(0, Y, &trace);
    ck_assert_int_eq(gift_geometry_update(&src, Y, trace, GIFT_DAMPING_DEFAULT), 0);
    memcpy(U + 1, src.U, ub); /* unaligned, as in a checkpoint body */
    memcpy(L + 1, src.lambda, lb);
    rc = gift__owner_restore(&T, src.epoch, src.identity, src.trace, src.sigma2, src.delta, U + 1,
                             L + 1);
    ck_assert_msg(rc == 0, "restore returned %d", rc);
    ck_assert_msg(T.geo.epoch == src.epoch && T.geo.sigma2 == src.sigma2,
                  "restored epoch %u sigma2 %g, saved %u %g", T.geo.epoch, T.geo.sigma2, src.epoch,
                  src.sigma2);
    ck_assert_msg(memcmp(T.geo_buf->data, src.U, ub) == 0 &&
                      memcmp(T.geo_buf->data + ub, src.lambda, lb) == 0,
                  "the payload does not hold the restored U and lambda");
    rc = gift__owner_restore(&T, 9, 0, src.trace, NAN, src.delta, U + 1, L + 1);
    ck_assert_msg(rc < 0, "a NaN sigma2 was restored (%d)", rc);
    gift_geometry_free(&src);
    free(U);
    free(L);
}
END_TEST

static Suite *owner_suite(void)
{
    Suite *s = suite_create("owner");
    TCase *tc = tcase_create("owner");
    tcase_add_checked_fixture(tc, fx_tensor, fx_tensor_free);
    tcase_add_test(tc, test_epoch_records);
    tcase_add_test(tc, test_publish_buffer);
    tcase_add_test(tc, test_sketch_check);
    tcase_add_test(tc, test_round);
    tcase_add_test(tc, test_round_eager);
    tcase_add_test(tc, test_restore);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(owner_suite(), CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
