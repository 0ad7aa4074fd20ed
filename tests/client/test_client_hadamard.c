/*
 * test_client_hadamard.c: tensors declared with GIFT_TRANSFORM_HADAMARD
 * (issue 42) through the public API against a real giftd (GIFTD_BIN,
 * tests/common/gift_test_daemon.h).
 *
 *  - test_push_exact (codec threads 0 and 2): one worker, f32 pulls, error
 *    feedback on: every pulled value bit for bit D H (decode(encode(H D g +
 *    e))) with e the residual kept in the rotated space, for fp8 and nvfp4
 *    tensors of odd shapes (cols 96: blocks of 32; cols 1000: blocks of 8;
 *    one row of 4096) and one in several chunks.
 *  - test_mean: two workers (threads, one client each), fp8 and nvfp4 both
 *    ways without error feedback: every pulled mean bit for bit the shard's
 *    mean of the rotated pushes (decoded in rank order, times 1/2, encoded in
 *    the pull format) rotated back, the same bytes on both workers, and
 *    within the format's error of the exact mean of the two gradients (fp8:
 *    relative L2 under 0.06 for two roundings; nvfp4: under 0.3).
 *  - test_digest: a Hadamard and a Euclidean declaration of the same tensor
 *    have different cluster digests (a shard refuses the second with
 *    GIFT_EDIGEST); a list without the field keeps its old digest.
 *  - test_refused: Hadamard with geometry, on a CUDA tensor, or an unknown
 *    transform: GIFT_EINVAL before anything is sent.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift/client.h"
#include "gift_codec.h"
#include "gift_proto.h"
#include "gift_test_check.h"
#include "gift_test_daemon.h"
#include "gift_test_rng.h"

#define STOP_TIMEOUT_MS 20000
#define STEPS 4

static void start(const char *world)
{
    const char *const flags[] = {"--world-size", world, "--log-level", "info", NULL};
    const daemon_opts_t o = {.log_prefix = "giftd-hadamard-", .flags = flags};
    daemon_start_opts(&o, NULL, 1);
}

static void servers(char *buf, size_t cap)
{
    snprintf(buf, cap, "127.0.0.1:%d", D.port);
}

/* Gradient-like values with outlier columns (what a rotation spreads). */
static void gen(float *x, size_t n, uint32_t cols, int t, int rank, int step)
{
    uint64_t s = 0x1234u + (uint64_t)t * 1000003u + (uint64_t)rank * 7919u + (uint64_t)step * 31u;
    for (size_t i = 0; i < n; i++) {
        double v = rng_normal(&s) * 1e-2;
        if ((i % cols) % 37 == 3)
            v *= 30.0;
        x[i] = (float)v;
    }
}

typedef struct tdef {
    const char *name;
    uint32_t rows, cols;
    gift_codec_t codec;
} tdef_t;

static size_t payload_cap(size_t n)
{
    return 4 * n + 4096;
}

/* ------------------------------------------------------------------ */

START_TEST(test_push_exact)
{
    enum { NT = 4 };
    static const tdef_t T[NT] = {
        {"h.fp8", 64, 96, GIFT_CODEC_FP8_E4M3},
        {"h.nvfp4", 16, 1000, GIFT_CODEC_NVFP4},
        {"h.row", 1, 4096, GIFT_CODEC_NVFP4},
        {"h.chunks", 256, 256, GIFT_CODEC_FP8_E4M3}, /* four chunks of 64 rows */
    };
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t[NT];
    gift_hadamard_t h[NT];
    gift_client_t *c = NULL;
    float *g[NT], *out[NT], *e[NT], *v, *d;
    uint8_t *pay;
    char sv[64];
    size_t nmax = 256 * 256;

    v = malloc(nmax * sizeof *v);
    d = malloc(nmax * sizeof *d);
    pay = malloc(payload_cap(nmax));
    ck_assert(v && d && pay);
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)T[i].rows * T[i].cols;
        gift_tensor_desc_t x = GIFT_TENSOR_INIT;
        x.name = T[i].name;
        x.rows = T[i].rows;
        x.cols = T[i].cols;
        x.push_codec = T[i].codec;
        x.pull_codec = GIFT_CODEC_F32;
        x.error_feedback = 1;
        x.transform = GIFT_TRANSFORM_HADAMARD;
        t[i] = x;
        g[i] = malloc(n * sizeof(float));
        out[i] = malloc(n * sizeof(float));
        e[i] = calloc(n, sizeof(float));
        ck_assert(g[i] && out[i] && e[i]);
        /* Every tensor is a wire of its own: key i. */
        ck_assert_int_eq(
            gift_hadamard_init(&h[i], T[i].cols, gift_hadamard_seed(T[i].name, (uint32_t)i, 0)), 0);
    }
    start("1");
    servers(sv, sizeof sv);
    o.servers = sv;
    o.rank = 0;
    o.world_size = 1;
    o.codec_threads = _i ? 2 : 0;
    o.chunk_bytes = 64 * 256 * sizeof(float);
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    ck_assert_int_eq(gift_declare(c, t, NT), 0);
    for (int s = 0; s < STEPS; s++) {
        gift_op_t *ops[NT];
        for (int i = 0; i < NT; i++) {
            gen(g[i], (size_t)T[i].rows * T[i].cols, T[i].cols, i, 0, s);
            ck_assert_int_eq(
                gift_push_pull(c, (uint32_t)i, (uint64_t)s, g[i], out[i], NULL, NULL, &ops[i]), 0);
        }
        for (int i = 0; i < NT; i++) {
            int rc = gift_op_wait(ops[i]);
            ck_assert_msg(rc == 0, "step %d %s: %s", s, T[i].name, gift_strerror(rc));
            gift_op_free(ops[i]);
        }
        for (int i = 0; i < NT; i++) {
            gift_codec_params_t p = {(gift_format_t)T[i].codec, 0, 0, {0}};
            size_t n = (size_t)T[i].rows * T[i].cols;
            /* chunks of whole rows, at most 64 x 256 floats */
            size_t per = T[i].rows * (size_t)T[i].cols <= 64 * 256 ? n : 64 * (size_t)T[i].cols;
            ck_assert_int_eq(gift_hadamard_apply(&h[i], 0, g[i], T[i].rows, v), 0);
            for (size_t c0 = 0; c0 < n; c0 += per) {
                for (size_t k = c0; k < c0 + per; k++)
                    v[k] += e[i][k];
                ck_assert_int_eq(gift_encode(&p, v + c0, per, pay, payload_cap(nmax)), 0);
                ck_assert_int_eq(gift_decode(&p, pay, payload_cap(nmax), per, d + c0), 0);
                for (size_t k = c0; k < c0 + per; k++)
                    e[i][k] = v[k] - d[k];
            }
            ck_assert_int_eq(gift_hadamard_apply(&h[i], 1, d, T[i].rows, d), 0);
            for (size_t k = 0; k < n; k++)
                require_msg(out[i][k] == d[k], "step %d %s element %zu: pulled %.9g, model %.9g", s,
                            T[i].name, k, (double)out[i][k], (double)d[k]);
        }
    }
    gift_client_close(c);
    daemon_teardown_ms(STOP_TIMEOUT_MS);
    for (int i = 0; i < NT; i++) {
        gift_hadamard_free(&h[i]);
        free(g[i]);
        free(out[i]);
        free(e[i]);
    }
    free(v);
    free(d);
    free(pay);
}
END_TEST

/* ------------------------------------------------------------------ */

enum { MT = 2, MROWS = 48, MCOLS = 384 };
static const tdef_t MEAN_T[MT] = {
    {"m.fp8", MROWS, MCOLS, GIFT_CODEC_FP8_E4M3},
    {"m.nvfp4", MROWS, MCOLS, GIFT_CODEC_NVFP4},
};

typedef struct mworker {
    int rank, rc;
    char why[256];
    char servers[64];
    float out[STEPS][MT][MROWS * MCOLS];
} mworker_t;

static void *mean_worker(void *arg)
{
    mworker_t *w = arg;
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t[MT];
    gift_client_t *c = NULL;
    static float g[2][MT][MROWS * MCOLS];
    int rc;

    o.servers = w->servers;
    o.rank = w->rank;
    o.world_size = 2;
    for (int i = 0; i < MT; i++) {
        gift_tensor_desc_t x = GIFT_TENSOR_INIT;
        x.name = MEAN_T[i].name;
        x.rows = MEAN_T[i].rows;
        x.cols = MEAN_T[i].cols;
        x.push_codec = x.pull_codec = MEAN_T[i].codec;
        x.transform = GIFT_TRANSFORM_HADAMARD;
        t[i] = x;
    }
    if ((rc = gift_client_open(&o, &c)) < 0 || (rc = gift_declare(c, t, MT)) < 0) {
        w->rc = rc;
        snprintf(w->why, sizeof w->why, "rank %d open/declare: %s", w->rank, gift_strerror(rc));
        gift_client_close(c);
        return NULL;
    }
    for (int s = 0; s < STEPS && w->rc == 0; s++) {
        gift_op_t *ops[MT];
        for (int i = 0; i < MT; i++) {
            gen(g[w->rank][i], MROWS * MCOLS, MCOLS, i, w->rank, s);
            if ((rc = gift_push_pull(c, (uint32_t)i, (uint64_t)s, g[w->rank][i], w->out[s][i], NULL,
                                     NULL, &ops[i])) < 0) {
                w->rc = rc;
                snprintf(w->why, sizeof w->why, "rank %d step %d push_pull: %s", w->rank, s,
                         gift_strerror(rc));
                for (int k = 0; k < i; k++)
                    gift_op_free(ops[k]);
                break;
            }
        }
        for (int i = 0; i < MT && w->rc == 0; i++) {
            if ((rc = gift_op_wait(ops[i])) < 0) {
                w->rc = rc;
                snprintf(w->why, sizeof w->why, "rank %d step %d wait: %s", w->rank, s,
                         gift_strerror(rc));
            }
            gift_op_free(ops[i]);
        }
    }
    gift_client_close(c);
    return NULL;
}

START_TEST(test_mean)
{
    static mworker_t W[2];
    pthread_t th[2];
    size_t n = MROWS * MCOLS, cap = payload_cap(n);
    float *g0 = malloc(n * sizeof(float)), *g1 = malloc(n * sizeof(float));
    float *y0 = malloc(n * sizeof(float)), *y1 = malloc(n * sizeof(float));
    float *acc = malloc(n * sizeof(float)), *m = malloc(n * sizeof(float));
    uint8_t *pay = malloc(cap);
    ck_assert(g0 && g1 && y0 && y1 && acc && m && pay);

    start("2");
    for (int r = 0; r < 2; r++) {
        memset(&W[r], 0, sizeof W[r]);
        W[r].rank = r;
        servers(W[r].servers, sizeof W[r].servers);
        ck_assert_int_eq(pthread_create(&th[r], NULL, mean_worker, &W[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(W[r].rc == 0, "%s; log %s:\n%s", W[r].why, D.log_path, log_tail());
    for (int i = 0; i < MT; i++) {
        gift_codec_params_t p = {(gift_format_t)MEAN_T[i].codec, 0, 0, {0}};
        gift_hadamard_t h;
        ck_assert_int_eq(
            gift_hadamard_init(&h, MCOLS, gift_hadamard_seed(MEAN_T[i].name, (uint32_t)i, 0)), 0);
        for (int s = 0; s < STEPS; s++) {
            double err = 0, nm = 0, rel;
            gen(g0, n, MCOLS, i, 0, s);
            gen(g1, n, MCOLS, i, 1, s);
            /* The shard's mean in the rotated space: rank 0 decoded, rank 1
             * added, times fl(1/2), encoded in the pull format. */
            ck_assert_int_eq(gift_hadamard_apply(&h, 0, g0, MROWS, y0), 0);
            ck_assert_int_eq(gift_hadamard_apply(&h, 0, g1, MROWS, y1), 0);
            ck_assert_int_eq(gift_encode(&p, y0, n, pay, cap), 0);
            ck_assert_int_eq(gift_decode(&p, pay, cap, n, acc), 0);
            ck_assert_int_eq(gift_encode(&p, y1, n, pay, cap), 0);
            ck_assert_int_eq(gift_decode_acc(&p, pay, cap, n, acc), 0);
            ck_assert_int_eq(gift_encode_mean(&p, acc, n, 0.5f, pay, cap), 0);
            ck_assert_int_eq(gift_decode(&p, pay, cap, n, m), 0);
            ck_assert_int_eq(gift_hadamard_apply(&h, 1, m, MROWS, m), 0);
            for (size_t k = 0; k < n; k++) {
                double exact = 0.5 * ((double)g0[k] + (double)g1[k]);
                require_msg(W[0].out[s][i][k] == m[k] && W[1].out[s][i][k] == m[k],
                            "%s step %d element %zu: pulled %.9g / %.9g, model %.9g",
                            MEAN_T[i].name, s, k, (double)W[0].out[s][i][k],
                            (double)W[1].out[s][i][k], (double)m[k]);
                err += (m[k] - exact) * (m[k] - exact);
                nm += exact * exact;
            }
            rel = sqrt(err / nm);
            ck_assert_msg(rel < (MEAN_T[i].codec == GIFT_CODEC_NVFP4 ? 0.3 : 0.06),
                          "%s step %d: relative L2 %.4f to the exact mean", MEAN_T[i].name, s, rel);
            if (s == 0)
                fprintf(stderr, "test_mean: %s relative L2 to the exact mean %.4f\n",
                        MEAN_T[i].name, rel);
        }
        gift_hadamard_free(&h);
    }
    daemon_teardown_ms(STOP_TIMEOUT_MS);
    free(g0);
    free(g1);
    free(y0);
    free(y1);
    free(acc);
    free(m);
    free(pay);
}
END_TEST

/* ------------------------------------------------------------------ */

START_TEST(test_digest)
{
    Gift__TensorDecl td = GIFT__TENSOR_DECL__INIT, *tp = &td;
    Gift__Codec cd = GIFT__CODEC__INIT;
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t = GIFT_TENSOR_INIT;
    gift_client_t *a = NULL, *b = NULL;
    uint64_t none, had;
    char sv[64];
    int rc;

    td.name = (char *)"w";
    td.rows = 8;
    td.cols = 64;
    td.push_codec = td.pull_codec = &cd;
    none = gift_digest_tensors(&tp, 1);
    td.transform = GIFT__TRANSFORM__TRANSFORM_HADAMARD;
    had = gift_digest_tensors(&tp, 1);
    ck_assert(none != had);
    td.transform = GIFT__TRANSFORM__TRANSFORM_NONE;
    ck_assert(gift_digest_tensors(&tp, 1) == none);

    /* Through a shard: rank 0 declares Hadamard, rank 1 the same Euclidean. */
    start("2");
    servers(sv, sizeof sv);
    o.servers = sv;
    o.world_size = 2;
    o.timeout_ms = 10000;
    t.name = "w";
    t.rows = 64;
    t.cols = 512; /* 128 KiB: not fused */
    t.push_codec = t.pull_codec = GIFT_CODEC_FP8_E4M3;
    t.transform = GIFT_TRANSFORM_HADAMARD;
    o.rank = 0;
    ck_assert_int_eq(gift_client_open(&o, &a), 0);
    ck_assert_int_eq(gift_declare(a, &t, 1), 0);
    t.transform = GIFT_TRANSFORM_NONE;
    o.rank = 1;
    ck_assert_int_eq(gift_client_open(&o, &b), 0);
    rc = gift_declare(b, &t, 1);
    ck_assert_msg(rc == GIFT_EDIGEST, "Euclidean after Hadamard: %s, want GIFT_EDIGEST",
                  gift_strerror(rc));
    gift_client_close(b);
    gift_client_close(a);
    daemon_teardown_ms(STOP_TIMEOUT_MS);
}
END_TEST

START_TEST(test_refused)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_client_t *c = NULL;
    char sv[64];
    start("1");
    servers(sv, sizeof sv);
    o.servers = sv;
    o.rank = 0;
    o.world_size = 1;
    for (int k = 0; k < 3; k++) {
        gift_tensor_desc_t t = GIFT_TENSOR_INIT;
        int rc;
        t.name = "w";
        t.rows = 16;
        t.cols = 64;
        t.transform = GIFT_TRANSFORM_HADAMARD;
        if (k == 0)
            t.geometry = 1;
        else if (k == 1)
            t.memory = GIFT_MEMORY_CUDA;
        else
            t.transform = 7;
        ck_assert_int_eq(gift_client_open(&o, &c), 0);
        rc = gift_declare(c, &t, 1);
        ck_assert_msg(rc == GIFT_EINVAL, "case %d: %s, want GIFT_EINVAL", k, gift_strerror(rc));
        gift_client_close(c);
    }
    daemon_teardown_ms(STOP_TIMEOUT_MS);
}
END_TEST

static Suite *hadamard_suite(void)
{
    Suite *s = suite_create("client_hadamard");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_push_exact, 0, 2);
    tcase_add_test(tc, test_mean);
    tcase_add_test(tc, test_digest);
    tcase_add_test(tc, test_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(hadamard_suite(), CK_NORMAL) ? EXIT_FAILURE : EXIT_SUCCESS;
}
