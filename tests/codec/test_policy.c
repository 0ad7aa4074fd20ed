/*
 * test_policy.c: the per-tensor chooser of codec/policy.c on synthetic layers
 * whose best choice is known, its limits, its determinism, and its prediction
 * against the codec's measured whitened error of an averaged step.
 */
#include <cblas.h>
#include <check.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_policy.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"

#define DAMPING 1e-2

/* A synthetic layer: covariance A = V diag(s) V^T, its geometry at (k, ks)
 * as the owner would publish it, and an averaged gradient whose rows have
 * covariance A (gradient aligned with the inputs' spectrum). */
typedef struct layer {
    int rows, din, k, ks;
    double *V; /* din x din orthogonal, row-major */
    double *s; /* din, descending */
    gift_geometry_t g;
    float *gbar; /* rows x din */
} layer_t;

enum { SPEC_FLAT, SPEC_STEEP, SPEC_DECAY };

static void layer_init(layer_t *L, int rows, int din, int k, int ks, int spec, double gscale,
                       uint64_t seed)
{
    double *tau = malloc((size_t)din * sizeof(double)), trace = 0.0, sumk = 0.0, sigma2;
    float *U = malloc((size_t)din * ks * sizeof(float)), *lam = malloc((size_t)ks * sizeof(float));
    size_t i;
    int j, r;

    memset(L, 0, sizeof(*L));
    L->rows = rows;
    L->din = din;
    L->k = k;
    L->ks = ks;
    L->V = malloc((size_t)din * din * sizeof(double));
    L->s = malloc((size_t)din * sizeof(double));
    for (i = 0; i < (size_t)din * din; i++)
        L->V[i] = rng_normal(&seed);
    ck_assert_int_eq(LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, din, din, L->V, din, tau), 0);
    ck_assert_int_eq(LAPACKE_dorgqr(LAPACK_ROW_MAJOR, din, din, din, L->V, din, tau), 0);
    for (j = 0; j < din; j++) {
        if (spec == SPEC_FLAT)
            L->s[j] = 1.0;
        else if (spec == SPEC_STEEP)
            L->s[j] = j < 4 ? 100.0 : 1e-2;
        else
            L->s[j] = pow(j + 1.0, -1.5);
        trace += L->s[j];
    }
    for (j = 0; j < k; j++)
        sumk += L->s[j];
    sigma2 = k < din ? (trace - sumk) / (din - k) : 0.0;
    for (i = 0; i < (size_t)din; i++)
        for (j = 0; j < ks; j++)
            U[i * ks + j] = (float)L->V[i * din + j];
    for (j = 0; j < ks; j++)
        lam[j] = (float)L->s[j];
    ck_assert_int_eq(gift_geometry_init(&L->g, din, k, ks, seed), 0);
    ck_assert_int_eq(gift_geometry_load(&L->g, U, lam, trace, sigma2, DAMPING * trace / din, 1, 0),
                     0);
    /* gbar = gscale Z diag(sqrt s) V^T */
    L->gbar = malloc((size_t)rows * din * sizeof(float));
    for (r = 0; r < rows; r++) {
        double *z = malloc((size_t)din * sizeof(double));

        for (j = 0; j < din; j++)
            z[j] = rng_normal(&seed) * sqrt(L->s[j]);
        for (i = 0; i < (size_t)din; i++) {
            double v = 0.0;

            for (j = 0; j < din; j++)
                v += z[j] * L->V[i * din + j];
            L->gbar[(size_t)r * din + i] = (float)(gscale * v);
        }
        free(z);
    }
    free(tau);
    free(U);
    free(lam);
}

static void layer_free(layer_t *L)
{
    gift_geometry_free(&L->g);
    free(L->V);
    free(L->s);
    free(L->gbar);
}

static gift_policy_in_t layer_in(const layer_t *L, int fmt)
{
    gift_policy_in_t in = {.rows = (uint32_t)L->rows,
                           .cols = (uint32_t)L->din,
                           .k_max = (uint32_t)L->k,
                           .ks = (uint32_t)L->ks,
                           .refresh = 50,
                           .declared_format = fmt,
                           .geo = &L->g,
                           .gbar = L->gbar,
                           .nrows = (uint32_t)L->rows,
                           .hit_rate = -1.0};
    return in;
}

static double sum_err2(const gift_policy_choice_t *c, size_t n)
{
    double s = 0.0;

    for (size_t i = 0; i < n; i++)
        s += c[i].pred_err2;
    return s;
}

static double avg_bits(const gift_policy_choice_t *c, const gift_policy_in_t *in, size_t n)
{
    double b = 0.0, e = 0.0;

    for (size_t i = 0; i < n; i++) {
        b += c[i].bits * in[i].rows * in[i].cols;
        e += (double)in[i].rows * in[i].cols;
    }
    return b / e;
}

/* ---- names ------------------------------------------------------------------ */

START_TEST(test_parse_name)
{
    static const char *const names[] = {"all", "none", "auto", "hits"};
    int i;

    for (i = 0; i < 4; i++) {
        int p = gift_policy_parse(names[i]);

        ck_assert_msg(p == i, "parse(%s) = %d, want %d", names[i], p, i);
        ck_assert_msg(strcmp(gift_policy_name(p), names[i]) == 0, "name(%d) = %s", p,
                      gift_policy_name(p));
    }
    ck_assert_int_eq(gift_policy_parse("AUTO"), GIFT_EINVAL);
    ck_assert_int_eq(gift_policy_parse(""), GIFT_EINVAL);
    ck_assert_int_eq(gift_policy_parse(NULL), GIFT_EINVAL);
    ck_assert_str_eq(gift_policy_name(7), "?");
}
END_TEST

/* ---- known best choices ------------------------------------------------------ */

START_TEST(test_flat_is_euclidean)
{
    layer_t L;
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO};
    gift_policy_in_t in;
    gift_policy_choice_t c;
    int rc;

    layer_init(&L, 256, 64, 32, 40, SPEC_FLAT, 1.0, 11);
    in = layer_in(&L, GIFT_FMT_E4M3);
    rc = gift_policy_choose(&cfg, &in, 1, &c);
    ck_assert_msg(rc == 0, "choose rc %d", rc);
    ck_assert_msg(c.gift == 0 && c.k == 0 && c.format == GIFT_FMT_E4M3,
                  "flat spectrum: gift %d k %u format %d ratio %.4f, want Euclidean fp8", c.gift,
                  c.k, c.format, c.pred_ratio);
    ck_assert_msg(c.gflops == 0.0 && fabs(c.bits - 8.25) < 1e-9,
                  "Euclidean fp8: bits %.6f gflops %g", c.bits, c.gflops);
    ck_assert_msg(c.pred_ratio == 1.0, "pred_ratio %.6f, want 1", c.pred_ratio);
    layer_free(&L);
}
END_TEST

START_TEST(test_steep_is_gift)
{
    layer_t L;
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO};
    gift_policy_in_t in;
    gift_policy_choice_t c, none;
    int rc;

    layer_init(&L, 256, 64, 32, 40, SPEC_STEEP, 1.0, 12);
    in = layer_in(&L, GIFT_FMT_E4M3);
    rc = gift_policy_choose(&cfg, &in, 1, &c);
    ck_assert_msg(rc == 0, "choose rc %d", rc);
    ck_assert_msg(c.gift == 1 && c.k >= 8 && c.k <= 32 && c.format == GIFT_FMT_E4M3,
                  "steep spectrum: gift %d k %u format %d, want GIFT fp8", c.gift, c.k, c.format);
    ck_assert_msg(c.pred_ratio < 0.3, "steep spectrum: pred_ratio %.4f, want < 0.3", c.pred_ratio);
    /* bits: 8.25 + 32 (2 * 64 * 40 + 40) / (2 * 256 * 64 * 50) */
    ck_assert_msg(fabs(c.bits - (8.25 + 32.0 * (2 * 64 * 40 + 40) / (2.0 * 256 * 64 * 50))) < 1e-9,
                  "bits %.9f", c.bits);
    ck_assert_msg(fabs(c.gflops - 8.0 * 256 * 64 * c.k / 1e9) < 1e-15, "gflops %g at k %u",
                  c.gflops, c.k);
    cfg.policy = GIFT_POLICY_NONE;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &none), 0);
    ck_assert_msg(none.gift == 0 && none.pred_ratio == 1.0, "none: gift %d ratio %.4f", none.gift,
                  none.pred_ratio);
    ck_assert_msg(fabs(sqrt(c.pred_err2 / none.pred_err2) - c.pred_ratio) < 1e-12,
                  "pred_ratio %.6f vs sqrt(err2 / eucl) %.6f", c.pred_ratio,
                  sqrt(c.pred_err2 / none.pred_err2));
    cfg.policy = GIFT_POLICY_ALL;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 1 && c.k == 32, "all: gift %d k %u, want k_max 32", c.gift, c.k);
    layer_free(&L);
}
END_TEST

/* Budget below fp8 for two tensors: fp8 goes to the one whose fp8 cuts its
 * predicted error most (per bit: equal sizes, so per tensor). */
START_TEST(test_budget_mix)
{
    layer_t L[2];
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO};
    gift_policy_in_t in[2];
    gift_policy_choice_t c[2], hi, lo;
    double red[2];
    int rc, i, want;

    layer_init(&L[0], 256, 64, 32, 40, SPEC_STEEP, 1.0, 21);
    layer_init(&L[1], 256, 64, 32, 40, SPEC_FLAT, 3.0, 22);
    for (i = 0; i < 2; i++) {
        in[i] = layer_in(&L[i], GIFT_FMT_E4M3);
        /* alone: fp8 affordable, then nvfp4 only */
        cfg.budget_bits = 8.5;
        ck_assert_int_eq(gift_policy_choose(&cfg, &in[i], 1, &hi), 0);
        cfg.budget_bits = 4.7;
        ck_assert_int_eq(gift_policy_choose(&cfg, &in[i], 1, &lo), 0);
        ck_assert_msg(hi.format == GIFT_FMT_E4M3 && lo.format == GIFT_FMT_NVFP4,
                      "tensor %d alone: formats %d / %d", i, hi.format, lo.format);
        red[i] = lo.pred_err2 - hi.pred_err2;
    }
    want = red[1] > red[0] ? 1 : 0;
    cfg.budget_bits = 6.5; /* (8.25 + 4.5) / 2 plus geometry: one fp8, one nvfp4 */
    rc = gift_policy_choose(&cfg, in, 2, c);
    ck_assert_msg(rc == 0, "choose rc %d", rc);
    ck_assert_msg(c[want].format == GIFT_FMT_E4M3 && c[1 - want].format == GIFT_FMT_NVFP4,
                  "fp8 should go to tensor %d (reductions %.4g / %.4g): formats %d / %d", want,
                  red[0], red[1], c[0].format, c[1].format);
    ck_assert_msg(c[0].gift == 1, "steep tensor not GIFT under the budget");
    ck_assert_msg(c[1].gift == 0, "flat tensor GIFT under the budget");
    ck_assert_msg(avg_bits(c, in, 2) <= 6.5, "average bits %.4f over 6.5", avg_bits(c, in, 2));

    /* infeasible: below nvfp4 */
    cfg.budget_bits = 3.0;
    rc = gift_policy_choose(&cfg, in, 2, c);
    ck_assert_msg(rc == GIFT_POLICY_INFEASIBLE, "3 bits: rc %d, want INFEASIBLE", rc);
    for (i = 0; i < 2; i++)
        ck_assert_msg(c[i].gift == 0 && c[i].format == GIFT_FMT_NVFP4,
                      "infeasible: tensor %d gift %d format %d, want Euclidean nvfp4", i, c[i].gift,
                      c[i].format);
    /* 4.5 bits: nvfp4 is 4 + 8/16 bits plus its fp32 tensor scale, so even Euclidean
     * nvfp4 everywhere (4.5 + 32 / 16384) does not fit */
    cfg.budget_bits = 4.5;
    rc = gift_policy_choose(&cfg, in, 2, c);
    ck_assert_msg(rc == GIFT_POLICY_INFEASIBLE && c[0].format == GIFT_FMT_NVFP4 &&
                      fabs(c[0].bits - (4.5 + 32.0 / (256 * 64))) < 1e-12,
                  "4.5 bits: rc %d, format %d, bits %.6f", rc, c[0].format, c[0].bits);
    /* no budget: the declared format, whatever the errors */
    cfg.budget_bits = 0.0;
    ck_assert_int_eq(gift_policy_choose(&cfg, in, 2, c), 0);
    ck_assert_msg(c[0].format == GIFT_FMT_E4M3 && c[1].format == GIFT_FMT_E4M3,
                  "no budget: formats %d %d", c[0].format, c[1].format);
    for (i = 0; i < 2; i++)
        layer_free(&L[i]);
}
END_TEST

START_TEST(test_flop_cap)
{
    layer_t L[3];
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO};
    gift_policy_in_t in[3];
    gift_policy_choice_t c[3];
    double cap = 8.0 * 256 * 64 * 40 / 1e9, fl = 0.0;
    int i, rc, p, ngift = 0;

    for (i = 0; i < 3; i++) {
        layer_init(&L[i], 256, 64, 32, 40, SPEC_DECAY, 1.0 + i, 31 + i);
        in[i] = layer_in(&L[i], GIFT_FMT_E4M3);
    }
    for (p = 0; p < 4; p++) {
        cfg.policy = p;
        cfg.max_gflops = cap;
        rc = gift_policy_choose(&cfg, in, 3, c);
        ck_assert_msg(rc == 0, "policy %s rc %d", gift_policy_name(p), rc);
        fl = 0.0;
        ngift = 0;
        for (i = 0; i < 3; i++) {
            fl += c[i].gflops;
            ngift += c[i].gift;
        }
        ck_assert_msg(fl <= cap, "policy %s: %.6g GFLOP over the cap %.6g", gift_policy_name(p), fl,
                      cap);
        if (p == GIFT_POLICY_AUTO)
            ck_assert_msg(ngift >= 1, "auto under the cap uses no GIFT");
    }
    /* a cap no GIFT option fits: Euclidean */
    cfg.policy = GIFT_POLICY_AUTO;
    cfg.max_gflops = 1e-6;
    ck_assert_int_eq(gift_policy_choose(&cfg, in, 3, c), 0);
    for (i = 0; i < 3; i++)
        ck_assert_msg(c[i].gift == 0, "tiny cap: tensor %d gift", i);
    for (i = 0; i < 3; i++)
        layer_free(&L[i]);
}
END_TEST

/* AUTO never predicts worse than ALL or NONE (beyond the 1% hysteresis), on a
 * mix, with and without limits. */
START_TEST(test_auto_not_worse)
{
    layer_t L[4];
    gift_policy_in_t in[4];
    gift_policy_choice_t c[4];
    static const double budgets[] = {0.0, 4.7, 5.5, 6.5, 8.5, 20.0};
    static const double caps[] = {0.0, 0.01};
    int i, b, f, spec[4] = {SPEC_FLAT, SPEC_STEEP, SPEC_DECAY, SPEC_DECAY};

    for (i = 0; i < 4; i++) {
        layer_init(&L[i], 128 + 64 * i, 64, 32, 40, spec[i], 1.0 + 0.5 * i, 41 + i);
        in[i] = layer_in(&L[i], i == 3 ? GIFT_FMT_BF16 : GIFT_FMT_E4M3);
    }
    for (b = 0; b < 6; b++)
        for (f = 0; f < 2; f++) {
            gift_policy_cfg_t cfg = {.budget_bits = budgets[b], .max_gflops = caps[f]};
            double e[3];
            int rcs[3], p;

            for (p = 0; p < 3; p++) {
                cfg.policy = p;
                rcs[p] = gift_policy_choose(&cfg, in, 4, c);
                ck_assert_msg(rcs[p] >= 0, "rc %d", rcs[p]);
                e[p] = sum_err2(c, 4);
                if (budgets[b] > 0.0 && rcs[p] == 0)
                    ck_assert_msg(avg_bits(c, in, 4) <= budgets[b] + 1e-9,
                                  "%s budget %.2f: %.4f bits", gift_policy_name(p), budgets[b],
                                  avg_bits(c, in, 4));
            }
            if (rcs[GIFT_POLICY_AUTO] != 0)
                continue;
            if (rcs[GIFT_POLICY_ALL] == 0)
                ck_assert_msg(e[GIFT_POLICY_AUTO] * (1.0 - GIFT_POLICY_MIN_GAIN) <=
                                  e[GIFT_POLICY_ALL],
                              "budget %.2f cap %g: auto %.6g > all %.6g", budgets[b], caps[f],
                              e[GIFT_POLICY_AUTO], e[GIFT_POLICY_ALL]);
            if (rcs[GIFT_POLICY_NONE] == 0)
                ck_assert_msg(e[GIFT_POLICY_AUTO] * (1.0 - GIFT_POLICY_MIN_GAIN) <=
                                  e[GIFT_POLICY_NONE],
                              "budget %.2f cap %g: auto %.6g > none %.6g", budgets[b], caps[f],
                              e[GIFT_POLICY_AUTO], e[GIFT_POLICY_NONE]);
        }
    for (i = 0; i < 4; i++)
        layer_free(&L[i]);
}
END_TEST

START_TEST(test_deterministic)
{
    layer_t L[3];
    gift_policy_in_t in[3];
    gift_policy_choice_t a[3], b[3];
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO, .budget_bits = 6.0, .max_gflops = 0.01};
    int i, p;

    for (i = 0; i < 3; i++) {
        layer_init(&L[i], 192, 64, 32, 40, i == 0 ? SPEC_STEEP : SPEC_DECAY, 1.0 + i, 51 + i);
        in[i] = layer_in(&L[i], GIFT_FMT_E4M3);
    }
    for (p = 0; p < 4; p++) {
        cfg.policy = p;
        memset(a, 0xA5, sizeof(a));
        memset(b, 0x5A, sizeof(b));
        ck_assert_int_ge(gift_policy_choose(&cfg, in, 3, a), 0);
        ck_assert_int_ge(gift_policy_choose(&cfg, in, 3, b), 0);
        for (i = 0; i < 3; i++) {
            /* field by field, then the bytes the fields cover */
            ck_assert_msg(a[i].gift == b[i].gift && a[i].k == b[i].k &&
                              a[i].format == b[i].format &&
                              memcmp(&a[i].pred_err2, &b[i].pred_err2, sizeof(double)) == 0 &&
                              memcmp(&a[i].pred_ratio, &b[i].pred_ratio, sizeof(double)) == 0 &&
                              memcmp(&a[i].bits, &b[i].bits, sizeof(double)) == 0 &&
                              memcmp(&a[i].gflops, &b[i].gflops, sizeof(double)) == 0,
                          "%s: two calls differ on tensor %d", gift_policy_name(p), i);
        }
    }
    for (i = 0; i < 3; i++)
        layer_free(&L[i]);
}
END_TEST

/* No gbar, identity geometry, hits, chunk-0 rows. */
START_TEST(test_declared_and_hits)
{
    layer_t L;
    gift_geometry_t id;
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO};
    gift_policy_in_t in;
    gift_policy_choice_t c, full, part;

    layer_init(&L, 256, 64, 32, 40, SPEC_FLAT, 1.0, 61);
    in = layer_in(&L, GIFT_FMT_E4M3);
    in.gbar = NULL;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 1 && c.k == 32 && c.format == GIFT_FMT_E4M3 && c.pred_err2 == 0.0 &&
                      c.pred_ratio == 1.0,
                  "no gbar, auto: gift %d k %u fmt %d", c.gift, c.k, c.format);
    cfg.policy = GIFT_POLICY_NONE;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 0, "no gbar, none: gift %d", c.gift);
    /* budget with no prediction: the largest format that fits */
    cfg.policy = GIFT_POLICY_AUTO;
    cfg.budget_bits = 6.0;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 1 && c.format == GIFT_FMT_NVFP4, "no gbar, 6 bits: gift %d fmt %d",
                  c.gift, c.format);
    cfg.budget_bits = 0.0;

    /* identity geometry: Euclidean only */
    ck_assert_int_eq(gift_geometry_init(&id, 64, 32, 40, 5), 0);
    in = layer_in(&L, GIFT_FMT_E4M3);
    in.geo = &id;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 0 && c.k == 0, "identity geo: gift %d", c.gift);
    cfg.policy = GIFT_POLICY_ALL;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 0, "identity geo, all: gift %d", c.gift);
    gift_geometry_free(&id);

    /* hits: the rate decides, whatever the prediction */
    in = layer_in(&L, GIFT_FMT_E4M3);
    cfg.policy = GIFT_POLICY_HITS;
    in.hit_rate = 0.01;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 1 && c.k == 32, "hits 0.01: gift %d k %u", c.gift, c.k);
    in.hit_rate = 1e-5;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 0, "hits 1e-5: gift %d", c.gift);
    cfg.hits_threshold = 1e-6;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), 0);
    ck_assert_msg(c.gift == 1, "hits 1e-5, threshold 1e-6: gift %d", c.gift);

    /* the owner holds only the first rows: err2 scaled by rows / nrows */
    layer_free(&L);
    layer_init(&L, 256, 64, 32, 40, SPEC_DECAY, 1.0, 62);
    in = layer_in(&L, GIFT_FMT_E4M3);
    cfg.policy = GIFT_POLICY_NONE;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &full), 0);
    in.nrows = 128;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &part), 0);
    ck_assert_msg(fabs(part.pred_err2 / full.pred_err2 - 1.0) < 0.2,
                  "half the rows: err2 %.6g vs all rows %.6g", part.pred_err2, full.pred_err2);
    layer_free(&L);
}
END_TEST

START_TEST(test_invalid)
{
    layer_t L;
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_AUTO};
    gift_policy_in_t in, bad;
    gift_policy_choice_t c;
    gift_geometry_t g2;

    layer_init(&L, 64, 64, 32, 40, SPEC_DECAY, 1.0, 71);
    in = layer_in(&L, GIFT_FMT_E4M3);
    memset(&c, 0x11, sizeof(c));
    ck_assert_int_eq(gift_policy_choose(NULL, &in, 1, &c), GIFT_EINVAL);
    ck_assert_int_eq(gift_policy_choose(&cfg, NULL, 1, &c), GIFT_EINVAL);
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, NULL), GIFT_EINVAL);
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 0, &c), GIFT_EINVAL);
    cfg.policy = 4;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), GIFT_EINVAL);
    cfg.policy = -1;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), GIFT_EINVAL);
    cfg.policy = GIFT_POLICY_AUTO;
    cfg.budget_bits = NAN;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), GIFT_EINVAL);
    cfg.budget_bits = 0.0;
    bad = in;
    bad.rows = 0;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.k_max = 41;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.ks = 39;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.cols = 63;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.nrows = 65;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.nrows = 0;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.declared_format = GIFT_FMT_COUNT_;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.geo = NULL;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    bad = in;
    bad.block = 100;
    ck_assert_int_eq(gift_policy_choose(&cfg, &bad, 1, &c), GIFT_EINVAL);
    L.gbar[17] = NAN;
    ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &c), GIFT_ENONFINITE);
    ck_assert_msg(c.k == 0x11111111u, "out written on an error");
    /* geometry_at */
    ck_assert_int_eq(gift_geometry_init(&g2, 64, 16, 40, 3), 0);
    ck_assert_int_eq(gift_policy_geometry_at(&L.g, 8, &g2), GIFT_EINVAL); /* dst k 16 */
    ck_assert_int_eq(gift_policy_geometry_at(&L.g, 16, &g2), 0);
    ck_assert_msg(g2.k == 16 && g2.identity == 0, "geometry_at: k %d identity %d", g2.k,
                  g2.identity);
    gift_geometry_free(&g2);
    layer_free(&L);
}
END_TEST

/* ---- the prediction against the codec ---------------------------------------- */

/* The whitened error ||(Ghat - Gbar) L||^2 of W workers' averaged push, each
 * worker coding G_w T (T the geometry at rank k, or I), mapped back with T^-1. */
static double measured_err2(const layer_t *L, const gift_geometry_t *T, const float *G, int W,
                            const float *gbar, int fmt, const float *A)
{
    size_t nx = (size_t)L->rows * L->din, i;
    gift_codec_params_t p = {.fmt = (gift_format_t)fmt};
    gift_layout_t lay;
    float *X = malloc(nx * sizeof(float)), *acc = calloc(nx, sizeof(float));
    float *work = malloc((size_t)L->rows * L->ks * sizeof(float));
    void *pay;
    double r, nrm;
    int w;

    ck_assert_int_eq(gift_layout(&p, nx, &lay), 0);
    pay = malloc(lay.total);
    for (w = 0; w < W; w++) {
        if (T != NULL)
            ck_assert_int_eq(gift_transform(T, 0, G + (size_t)w * nx, L->rows, X, work), 0);
        else
            memcpy(X, G + (size_t)w * nx, nx * sizeof(float));
        ck_assert_int_eq(gift_encode(&p, X, nx, pay, lay.total), 0);
        ck_assert_int_eq(gift_decode_acc(&p, pay, lay.total, nx, acc), 0);
    }
    for (i = 0; i < nx; i++)
        acc[i] /= (float)W;
    if (T != NULL)
        ck_assert_int_eq(gift_transform(T, 1, acc, L->rows, acc, work), 0);
    r = gift_metric_whitened(gbar, acc, L->rows, L->din, A, DAMPING);
    nrm = gift_metric_whitened_norm(gbar, L->rows, L->din, A, DAMPING);
    ck_assert_msg(r >= 0 && nrm >= 0, "metric %g %g", r, nrm);
    free(X);
    free(acc);
    free(work);
    free(pay);
    return r * r * nrm * nrm;
}

START_TEST(test_prediction_matches_codec)
{
    enum { W = 4 };
    layer_t L;
    size_t nx, i;
    float *G, *gbar, *A;
    double *Ad;
    gift_policy_cfg_t cfg = {.policy = GIFT_POLICY_ALL};
    gift_policy_in_t in;
    gift_policy_choice_t g8, e8;
    int w, j, a, b, fmt;

    layer_init(&L, 384, 64, 32, 40, SPEC_DECAY, 1.0, 81);
    nx = (size_t)L.rows * L.din;
    /* W workers: the layer's gradient plus 10% independent noise of the same law */
    G = malloc(W * nx * sizeof(float));
    gbar = calloc(nx, sizeof(float));
    for (w = 0; w < W; w++) {
        layer_t n;

        layer_init(&n, L.rows, L.din, L.k, L.ks, SPEC_DECAY, 0.1, 1000 + w);
        for (i = 0; i < nx; i++)
            G[w * nx + i] = L.gbar[i] + n.gbar[i];
        layer_free(&n);
    }
    for (i = 0; i < nx; i++) {
        double s = 0.0;

        for (w = 0; w < W; w++)
            s += G[w * nx + i];
        gbar[i] = (float)(s / W);
    }
    /* The geometry's A: U diag(lambda) U^T at k_max plus sigma2 on the complement. */
    Ad = calloc((size_t)L.din * L.din, sizeof(double));
    A = malloc((size_t)L.din * L.din * sizeof(float));
    for (a = 0; a < L.din; a++)
        for (b = 0; b < L.din; b++) {
            double v = a == b ? L.g.sigma2 : 0.0;

            for (j = 0; j < L.k; j++)
                v += (L.g.lambda[j] - L.g.sigma2) * L.g.U[a * L.ks + j] * L.g.U[b * L.ks + j];
            Ad[a * L.din + b] = v;
        }
    for (i = 0; i < (size_t)L.din * L.din; i++)
        A[i] = (float)Ad[i];

    in = layer_in(&L, GIFT_FMT_E4M3);
    in.gbar = gbar;
    for (fmt = 0; fmt < 2; fmt++) {
        int f = fmt == 0 ? GIFT_FMT_E4M3 : GIFT_FMT_NVFP4;
        double mg, me, pr, mr, scale;

        in.declared_format = f;
        cfg.policy = GIFT_POLICY_ALL;
        ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &g8), 0);
        cfg.policy = GIFT_POLICY_NONE;
        ck_assert_int_eq(gift_policy_choose(&cfg, &in, 1, &e8), 0);
        ck_assert_msg(g8.gift == 1 && g8.k == 32 && e8.gift == 0, "choices %d %u %d", g8.gift, g8.k,
                      e8.gift);
        mg = measured_err2(&L, &L.g, G, W, gbar, f, A);
        me = measured_err2(&L, NULL, G, W, gbar, f, A);
        pr = g8.pred_ratio;
        mr = sqrt(mg / me);
        /* fp8 within 5%; nvfp4 (not a relative code: its scale is per 16 and per
         * tensor, and each worker's tensor scale differs) within 20% */
        ck_assert_msg(fabs(pr / mr - 1.0) < (f == GIFT_FMT_E4M3 ? 0.05 : 0.2),
                      "%s: predicted GIFT/Euclidean %.4f, measured %.4f (W %d)",
                      gift_format_name(f), pr, mr, W);
        /* absolute: W pushes of independent rounding average to about 1/W of one */
        scale = me * W / e8.pred_err2;
        ck_assert_msg(f == GIFT_FMT_E4M3 ? (scale > 0.85 && scale < 1.15)
                                         : (scale > 0.6 && scale < 1.6),
                      "%s: measured Euclidean err2 x W / predicted = %.3f (%.4g x %d / %.4g)",
                      gift_format_name(f), scale, me, W, e8.pred_err2);
        fprintf(stderr,
                "prediction %s: GIFT/Euclidean predicted %.4f measured %.4f; "
                "Euclidean err2 x W / predicted %.3f\n",
                gift_format_name(f), pr, mr, scale);
    }
    free(G);
    free(gbar);
    free(A);
    free(Ad);
    layer_free(&L);
}
END_TEST

static Suite *policy_suite(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("choose");

    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_parse_name);
    tcase_add_test(tc, test_flat_is_euclidean);
    tcase_add_test(tc, test_steep_is_gift);
    tcase_add_test(tc, test_budget_mix);
    tcase_add_test(tc, test_flop_cap);
    tcase_add_test(tc, test_auto_not_worse);
    tcase_add_test(tc, test_deterministic);
    tcase_add_test(tc, test_declared_and_hits);
    tcase_add_test(tc, test_invalid);
    tcase_add_test(tc, test_prediction_matches_codec);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(policy_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
