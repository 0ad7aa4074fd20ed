/*
 * test_checkpoint.c: the shard's persistence (server/persist.c, on
 * server/checkpoint.c's files) without sockets, through the fake io of
 * shard_fake.h.
 *
 * Shards run with a data_dir in a fresh temporary folder: the replies of
 * finished steps, the pull residuals and the geometry owner's rounds and
 * epochs round-trip through a checkpoint plus the step log (a kill is a
 * gift_shard_free without a checkpoint), group commit answers pulls only
 * after the sync, and damaged, foreign or truncated files are refused whole
 * with a sentence that names them.
 */
#define _GNU_SOURCE /* nftw */
#include <check.h>
#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "gift_codec.h"
#include "gift_policy.h"
#include "gift_proto.h"
#include "log.h"
#include "shard.h"
#include "gift_test_check.h"
#include "gift_test_frames.h"
#include "gift_test_rng.h"
#include "shard_fake.h"

/* ------------------------------------------------------------------ */
/* Persistence                                                           */
/* ------------------------------------------------------------------ */

static char g_dir[64];
static double g_decay;  /* geometry_decay of the persisting shards */
static int g_policy;    /* their policy (all unless a test sets it) */
static double g_budget; /* and budget_bits */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Empties the test's own temporary folder: the shard's files and the
 * discarded-* folders that gift_ckpt_discard moved them into. */
static void dir_clear(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        nftw(path, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

static void fx_persist(void)
{
    strcpy(g_dir, "/tmp/gift-test-ckpt-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    fx_base();
    g_policy = GIFT_POLICY_ALL;
    g_budget = 0.0;
}

static void fx_persist_teardown(void)
{
    fx_teardown();
    dir_clear(g_dir);
    rmdir(g_dir);
}

/* Replaces the shard by one persisting to g_dir (every cs steps) and
 * restores it; returns what gift_shard_restore returned (err in *why). */

static int persist_open(uint32_t shard_id, uint32_t num_shards, uint32_t cs, char *why,
                        size_t whylen)
{
    gift_shard_opts_t o;
    memset(&o, 0, sizeof o);
    o.shard_id = shard_id;
    o.num_shards = num_shards;
    o.max_parked = 64;
    o.geometry_decay = g_decay;
    o.policy = g_policy;
    o.budget_bits = g_budget;
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
    ck_assert_msg(C()->log_records > 0 && C()->log_failures == 0,
                  "log records %" PRIu64 " failures %" PRIu64, C()->log_records, C()->log_failures);
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

/* The run id is kept with the declaration: a restarted shard refuses
 * another run, and once its data directory is discarded (giftd --reset)
 * it adopts the next one. */
START_TEST(test_persist_run_id)
{
    char why[512];
    const Gift__Error *e;
    persist_open_ok(100, 0);
    g_run_id = "run-a";
    hello_all();
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    std_step(0, NULL, NULL);
    persist_open_ok(100, 1);
    g_run_id = "run-b";
    ck_assert_int_eq(hello_raw(&P[0], GIFT_PROTOCOL_VERSION, 0, W, NULL, 0), GIFT_ERUNID);
    e = EXPECT_ERROR(&P[0], GIFT_ERUNID, 1);
    ck_assert_msg(strstr(e->text, "run-a") && strstr(e->text, "run-b"), "text: %s", e->text);
    {
        /* Moved aside whole, nothing unlinked: the log is in the folder. */
        char where[256], path[512];
        struct stat st;
        int n = gift_ckpt_discard(g_dir, where, sizeof where, why, sizeof why);
        ck_assert_msg(n >= 1, "discard returned %d: %s", n, why);
        ck_assert_msg(strstr(where, "/discarded-") != NULL, "moved into '%s'", where);
        snprintf(path, sizeof path, "%s/log-0", where);
        ck_assert_msg(stat(path, &st) == 0 && st.st_size > 0, "%s: missing or empty", path);
        snprintf(path, sizeof path, "%s/log-0", g_dir);
        ck_assert_msg(stat(path, &st) != 0, "%s is still there after the discard", path);
        /* Nothing left to move: no second folder. */
        ck_assert_int_eq(gift_ckpt_discard(g_dir, where, sizeof where, why, sizeof why), 0);
    }
    persist_open_ok(100, 0);
    hello_all();
    DECLARE_OK(&P[0], STD_T, STD_NT, STD_C, STD_NC);
    std_step(0, NULL, NULL);
    QUIET_ALL();
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
    ck_assert_msg(C()->restored_step == 4,
                  "restored step %" PRIu64 " (the last step 4 record "
                  "was cut, so step 4 is open again)",
                  C()->restored_step);
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

/* ------------------------------------------------------------------ */
/* The policy's decisions (issue 24)                                    */
/* ------------------------------------------------------------------ */

/* One geometry tensor in two chunks, one fp8 format both ways: under a
 * budget of 4.5 bits the owner gives it nvfp4 for push and pull. */
static const tdesc_t POL_T[] = {
    {0, "pol.w", 16, GDIN, E4M3, 32, E4M3, 32, 1, GK, GKS, 4, 1234},
};
static const cdesc_t POL_C[] = {{0, 0, 0, 10}, {0, 1, 10, 6}};
#define POL_NC 2

/* A Geometry reply as bytes: the envelope packed again with its seq
 * cleared (each request has its own), then the payload. */
typedef struct {
    uint8_t *b;
    size_t len;
    const Gift__Geometry *g; /* valid until the peer's frames are released */
} geo_bytes_t;

static void geo_take(geo_bytes_t *out, int line)
{
    sent_t *s;
    size_t hl;
    ck_assert_int_eq(georeq_raw(&P[1], 0, 0), 0);
    s = take_at(&P[1], GIFT__ENVELOPE__MSG_GEOMETRY, line);
    s->env->geometry->seq = 0;
    hl = gift__envelope__get_packed_size(s->env);
    out->b = malloc(hl + s->len);
    ck_assert_ptr_nonnull(out->b);
    gift__envelope__pack(s->env, out->b);
    memcpy(out->b + hl, s->copy, s->len);
    out->len = hl + s->len;
    out->g = s->env->geometry;
}

static void geo_same_at(const geo_bytes_t *a, const geo_bytes_t *b, const char *what, int line)
{
    size_t i = 0;
    while (i < a->len && i < b->len && a->b[i] == b->b[i])
        i++;
    ck_assert_msg(a->len == b->len && i == a->len,
                  "line %d: %s: Geometry reply of %zu bytes differs from the fault-free one "
                  "(%zu bytes) at byte %zu",
                  line, what, b->len, a->len, i);
}

/* The PullReply of chunk c step (seq q), in whichever codec the step has
 * (EXPECT_REPLY wants the declared one). */
static sent_t *pol_reply_at(fake_t *fp, const cdesc_t *c, uint64_t step, uint64_t q, int line)
{
    sent_t *rep = take_at(fp, GIFT__ENVELOPE__MSG_PULL_REPLY, line);
    const Gift__PullReply *m = rep->env->pull_reply;
    ck_assert_msg(m->key == c->key && m->chunk == c->chunk && m->step == step && m->seq == q &&
                      m->epoch == 0,
                  "line %d: reply %u/%u step %" PRIu64 " seq %" PRIu64 " epoch %u; want %u/%u "
                  "step %" PRIu64 " seq %" PRIu64 " epoch 0",
                  line, m->key, m->chunk, m->step, m->seq, m->epoch, c->key, c->chunk, step, q);
    return rep;
}

/* Pushes step `step` of both chunks from every rank in the codec fmt (the
 * epoch's decision), pulls it on rank 0 and keeps the reply's bytes and
 * format. */
static void pol_step(uint64_t step, Gift__Format fmt, uint8_t **keep, size_t *keep_len,
                     int *keep_fmt)
{
    for (size_t ci = 0; ci < POL_NC; ci++) {
        const cdesc_t *c = &POL_C[ci];
        size_t n = (size_t)c->rows * GDIN, len;
        gift_codec_params_t p = params_of(fmt, fmt == NVFP4 ? 0 : 32);
        sent_t *rep;
        uint64_t q;
        for (int r = 0; r < W; r++) {
            Gift__Envelope env = GIFT__ENVELOPE__INIT;
            Gift__Push m = GIFT__PUSH__INIT;
            Gift__Codec codec = GIFT__CODEC__INIT, pull = GIFT__CODEC__INIT;
            float *x = grad(c->key, c->chunk, (uint32_t)r, step);
            uint8_t *pay = encode(&p, x, n, &len);
            gift_test_fill_push(&env, &m, &codec, c->key, c->chunk, step, 0, fmt, p.block, g_seq++);
            pull.format = fmt;
            pull.block = p.block;
            m.pull_codec = &pull;
            ck_assert_int_eq(feed(&P[r], &env, pay, len), 0);
            take_at(&P[r], GIFT__ENVELOPE__MSG_PUSH_ACK, __LINE__);
            free(pay);
            free(x);
        }
        q = PULL(&P[0], c->key, c->chunk, step);
        rep = pol_reply_at(&P[0], c, step, q, __LINE__);
        if (keep != NULL) {
            free(keep[ci]);
            keep[ci] = malloc(rep->len);
            ck_assert_ptr_nonnull(keep[ci]);
            memcpy(keep[ci], rep->copy, rep->len);
            keep_len[ci] = rep->len;
            keep_fmt[ci] =
                rep->env->pull_reply->codec ? (int)rep->env->pull_reply->codec->format : -1;
        } else {
            /* A restored step: the same bytes in the same codec. */
            int f = rep->env->pull_reply->codec ? (int)rep->env->pull_reply->codec->format : -1;
            ck_assert_msg(f == keep_fmt[ci], "chunk %u step %" PRIu64 ": reply format %d, was %d",
                          c->chunk, step, f, keep_fmt[ci]);
            EXPECT_BYTES(rep, keep[ci], keep_len[ci]);
        }
        QUIET_ALL();
        io_release(&P[0]);
    }
}

/* Pulls step again from every chunk and expects the kept bytes and codec. */
static void pol_repull(uint64_t step, uint8_t **keep, size_t *keep_len, int *keep_fmt)
{
    for (size_t ci = 0; ci < POL_NC; ci++) {
        const cdesc_t *c = &POL_C[ci];
        uint64_t q = PULL(&P[2], c->key, c->chunk, step);
        sent_t *rep = pol_reply_at(&P[2], c, step, q, __LINE__);
        int f = rep->env->pull_reply->codec ? (int)rep->env->pull_reply->codec->format : -1;
        ck_assert_msg(f == keep_fmt[ci], "restored chunk %u step %" PRIu64 ": format %d, was %d",
                      c->chunk, step, f, keep_fmt[ci]);
        EXPECT_BYTES(rep, keep[ci], keep_len[ci]);
        QUIET_ALL();
        io_release(&P[2]);
    }
}

/* Under a budget the owner's decision (nvfp4 both ways) and the steps
 * coded in it come back bit for bit after a kill (step log only), after a
 * checkpoint, and after a kill with both; the next step takes the same
 * codecs. */
START_TEST(test_persist_policy)
{
    geo_bytes_t g0, g;
    uint8_t *k1[POL_NC] = {0}, *k2[POL_NC] = {0};
    size_t l1[POL_NC], l2[POL_NC];
    int f1[POL_NC], f2[POL_NC];
    char why[512];

    g_policy = GIFT_POLICY_AUTO;
    g_budget = 4.5;
    persist_open_ok(100, 0);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    geo_take(&g0, __LINE__);
    ck_assert_msg(g0.g->push_codec != NULL && g0.g->push_codec->format == NVFP4 &&
                      g0.g->pull_codec != NULL && g0.g->pull_codec->format == NVFP4 &&
                      g0.g->bits > 0.0,
                  "budget 4.5: push %d pull %d, %g bits; want nvfp4 both ways",
                  g0.g->push_codec ? (int)g0.g->push_codec->format : -1,
                  g0.g->pull_codec ? (int)g0.g->pull_codec->format : -1, g0.g->bits);
    QUIET_ALL();
    pol_step(0, NVFP4, k1, l1, f1);
    pol_step(1, NVFP4, k2, l2, f2);
    ck_assert_msg(f1[0] == NVFP4 && l1[0] == layout_total(NVFP4, 0, 10 * GDIN),
                  "step 0 reply format %d, %zu bytes; want nvfp4, %zu", f1[0], l1[0],
                  layout_total(NVFP4, 0, 10 * GDIN));

    /* Killed: the step log alone. */
    persist_open_ok(100, 1);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    geo_take(&g, __LINE__);
    geo_same_at(&g0, &g, "after a kill", __LINE__);
    free(g.b);
    QUIET_ALL();
    pol_repull(0, k1, l1, f1);
    pol_repull(1, k2, l2, f2);

    /* A checkpoint, then killed: the checkpoint alone. */
    ck_assert_int_eq(gift_shard_checkpoint(S, why, sizeof why), 0);
    persist_open_ok(100, 1);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    geo_take(&g, __LINE__);
    geo_same_at(&g0, &g, "from the checkpoint", __LINE__);
    free(g.b);
    QUIET_ALL();
    pol_repull(0, k1, l1, f1);
    pol_repull(1, k2, l2, f2);
    /* The next step under the restored decision, then killed again: the
     * checkpoint plus the log. */
    pol_step(2, NVFP4, k1, l1, f1);
    persist_open_ok(100, 1);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    pol_repull(2, k1, l1, f1);
    pol_repull(1, k2, l2, f2);
    pol_step(3, NVFP4, k2, l2, f2);
    free(g0.b);
    for (size_t i = 0; i < POL_NC; i++) {
        free(k1[i]);
        free(k2[i]);
    }
}
END_TEST

/* Finds the saved decision of g (pred_ratio then bits, 8 bytes each) in a
 * checkpoint body: the offset of its first field (set), 28 bytes before. */
static size_t treat_at(const uint8_t *body, size_t len, double ratio, double bits)
{
    uint8_t want[16];
    uint64_t u;
    memcpy(&u, &ratio, 8);
    for (int i = 0; i < 8; i++)
        want[i] = (uint8_t)(u >> (8 * i));
    memcpy(&u, &bits, 8);
    for (int i = 0; i < 8; i++)
        want[8 + i] = (uint8_t)(u >> (8 * i));
    for (size_t i = 28; i + 16 <= len; i++)
        if (memcmp(body + i, want, 16) == 0)
            return i - 28;
    ck_abort_msg("the decision (ratio %g, bits %g) is not in the checkpoint body", ratio, bits);
    return 0;
}

static void ckpt_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A checkpoint whose decision is damaged but whose checksum is good (as
 * written by a buggy or hostile giftd) is refused with a sentence: a rank
 * above the declared one, an unknown format, a format larger than
 * declared, a set flag that is not 0 or 1. */
START_TEST(test_persist_policy_corrupt)
{
    geo_bytes_t g0;
    char why[512];
    uint8_t *k[POL_NC] = {0};
    size_t l[POL_NC];
    int f[POL_NC];
    uint8_t *body, *bad;
    size_t len, off;
    uint32_t v;
    static const struct {
        size_t field; /* bytes after the decision's start */
        uint32_t value;
        const char *want;
    } cases[] = {
        {8, GK + 1, "rank 9; the declared rank is 8"},
        {8, 0, "rank 0"},
        {12, 99, "push format 99"},
        {20, (uint32_t)GIFT_FMT_F32, "pull format 0"}, /* f32: larger than declared fp8 */
        {0, 2, "set 2"},
    };

    g_policy = GIFT_POLICY_AUTO;
    g_budget = 4.5;
    persist_open_ok(100, 0);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    geo_take(&g0, __LINE__);
    QUIET_ALL();
    pol_step(0, NVFP4, k, l, f);
    ck_assert_int_eq(gift_shard_checkpoint(S, why, sizeof why), 0);
    ck_assert_int_eq(gift_ckpt_read(g_dir, &body, &len, &v, why, sizeof why), 1);
    ck_assert_msg(v == GIFT_CKPT_VERSION, "checkpoint version %u", v);
    off = treat_at(body, len, g0.g->predicted_ratio, g0.g->bits);
    ck_assert_msg(le32(body + off) == 1 && le32(body + off + 8) == GK &&
                      le32(body + off + 12) == (uint32_t)GIFT_FMT_NVFP4,
                  "decision at byte %zu: set %u k %u push %u", off, le32(body + off),
                  le32(body + off + 8), le32(body + off + 12));
    bad = malloc(len);
    ck_assert_ptr_nonnull(bad);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(bad, body, len);
        ckpt_put_u32(bad + off + cases[i].field, cases[i].value);
        ck_assert_int_eq(gift_ckpt_write(g_dir, GIFT_CKPT_VERSION, bad, len, why, sizeof why), 0);
        refused_at(cases[i].want, 0, 1, __LINE__);
    }
    /* The intact body loads again. */
    ck_assert_int_eq(gift_ckpt_write(g_dir, GIFT_CKPT_VERSION, body, len, why, sizeof why), 0);
    persist_open_ok(100, 1);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    pol_repull(0, k, l, f);
    /* A step record (type 5) of the log whose reply claims an unknown
     * format, its CRC good: refused. */
    pol_step(1, NVFP4, k, l, f);
    {
        char lg[128];
        size_t llen, off = 0;
        uint8_t *glog;
        int found = 0;
        snprintf(lg, sizeof lg, "%s/log-1", g_dir);
        glog = file_read(lg, &llen);
        while (off + 20 <= llen && !found) {
            uint64_t rl = le64(glog + off + 8);
            ck_assert_msg(off + 20 + rl <= llen, "log record at %zu of %zu overruns", off, llen);
            if (le32(glog + off + 4) == GIFT_LOG_STEP2) {
                uint8_t *b = glog + off + 16;
                ck_assert_msg(le32(b + 28) == (uint32_t)GIFT_FMT_NVFP4,
                              "the step record's reply format is %u, not nvfp4", le32(b + 28));
                ckpt_put_u32(b + 28, 99);
                ckpt_put_u32(b + rl, gift_crc32c(gift_crc32c(0, glog + off + 4, 12), b, rl));
                found = 1;
            }
            off += 20 + rl;
        }
        ck_assert_msg(found, "no step record (type %d) in %s", GIFT_LOG_STEP2, lg);
        file_write(lg, glog, llen);
        refused_at("has format 99", 0, 1, __LINE__);
        free(glog);
    }
    free(bad);
    free(body);
    free(g0.b);
    for (size_t i = 0; i < POL_NC; i++)
        free(k[i]);
}
END_TEST

/* A checkpoint of format version 1 (before the policy was persisted) still
 * loads: its replies come back, and under an active policy its epochs have
 * the declared treatment (a Geometry without a decision). */
START_TEST(test_persist_format_v1)
{
    uint8_t *k[POL_NC] = {0};
    size_t l[POL_NC];
    int f[POL_NC];
    char why[512];
    uint8_t *body;
    size_t len;
    uint32_t v;
    geo_bytes_t g;

    persist_open_ok(100, 0);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    QUIET_ALL();
    pol_step(0, E4M3, k, l, f);
    ck_assert_int_eq(gift_shard_checkpoint_version(S, 1, why, sizeof why), 0);
    ck_assert_int_eq(gift_ckpt_read(g_dir, &body, &len, &v, why, sizeof why), 1);
    ck_assert_msg(v == 1, "wrote version %u, wanted 1", v);
    free(body);
    ck_assert_msg(gift_shard_checkpoint_version(S, GIFT_CKPT_VERSION + 1, why, sizeof why) < 0,
                  "wrote an unknown version");
    /* The log of generation 1 is empty: the checkpoint alone. */
    persist_open_ok(100, 1);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    pol_repull(0, k, l, f);
    /* The same file under an active policy: declared treatment. */
    g_policy = GIFT_POLICY_AUTO;
    g_budget = 4.5;
    persist_open_ok(100, 1);
    hello_all();
    DECLARE_OK(&P[0], POL_T, 1, POL_C, POL_NC);
    pol_repull(0, k, l, f);
    geo_take(&g, __LINE__);
    ck_assert_msg(g.g->push_codec == NULL && g.g->pull_codec == NULL && g.g->transform_rank == 0,
                  "a version 1 epoch restored with a decision: push %p pull %p rank %u",
                  (void *)g.g->push_codec, (void *)g.g->pull_codec, g.g->transform_rank);
    free(g.b);
    QUIET_ALL();
    for (size_t i = 0; i < POL_NC; i++)
        free(k[i]);
}
END_TEST

static Suite *checkpoint_suite(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *persist = tcase_create("persist");

    tcase_add_checked_fixture(persist, fx_persist, fx_persist_teardown);
    tcase_set_timeout(persist, 60);
    tcase_add_test(persist, test_persist_round_trip);
    tcase_add_test(persist, test_persist_run_id);
    tcase_add_test(persist, test_persist_geometry);
    tcase_add_test(persist, test_persist_pull_ef);
    tcase_add_test(persist, test_persist_geometry_decay);
    tcase_add_test(persist, test_persist_corrupt);
    tcase_add_test(persist, test_persist_group_commit);
    tcase_add_test(persist, test_persist_policy);
    tcase_add_test(persist, test_persist_policy_corrupt);
    tcase_add_test(persist, test_persist_format_v1);
    suite_add_tcase(s, persist);
    return s;
}

int main(void)
{
    /* The shard logs every refusal; keep the test output readable. */
    if (getenv("GIFT_TEST_LOG") == NULL)
        gift_log_set_level(GIFT_LOG_LEVEL_ERROR);
    return gift_test_run(checkpoint_suite(), CK_ENV) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
