/*
 * test_geometry.c: the geometry of codec/geometry.c. Rank policy, the random
 * starting basis, the Nystrom update against a known A, the sketch, the
 * transform against a dense double reference, error feedback, loading a
 * published epoch (what a worker does) bit for bit, and the running average
 * of the covariance across refreshes (gift_geometry_update_decay).
 */
#include <cblas.h>
#include <check.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"

/* ---- helpers ---------------------------------------------------------- */

/* A random orthogonal din x din matrix, row-major double. */
static double *rand_orthogonal(int din, uint64_t seed)
{
    double *V = malloc((size_t)din * din * sizeof(double)), *tau = malloc(din * sizeof(double));
    size_t i;

    ck_assert_ptr_nonnull(V);
    ck_assert_ptr_nonnull(tau);
    for (i = 0; i < (size_t)din * din; i++)
        V[i] = rng_normal(&seed);
    ck_assert_int_eq(LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, din, din, V, din, tau), 0);
    ck_assert_int_eq(LAPACKE_dorgqr(LAPACK_ROW_MAJOR, din, din, din, V, din, tau), 0);
    free(tau);
    return V;
}

/* A known covariance: A = V diag(s) V^T (row-major double). */
typedef struct known_a {
    int din;
    double *V, *s, *A, trace;
} known_a_t;

static void known_a_make(known_a_t *ka, int din, const double *s, uint64_t seed)
{
    int i, j, l;

    ka->din = din;
    ka->V = rand_orthogonal(din, seed);
    ka->s = malloc(din * sizeof(double));
    ka->A = calloc((size_t)din * din, sizeof(double));
    ck_assert_ptr_nonnull(ka->s);
    ck_assert_ptr_nonnull(ka->A);
    memcpy(ka->s, s, din * sizeof(double));
    ka->trace = 0.0;
    for (l = 0; l < din; l++)
        ka->trace += s[l];
    for (i = 0; i < din; i++)
        for (j = 0; j < din; j++) {
            double a = 0.0;

            for (l = 0; l < din; l++)
                a += ka->V[i * din + l] * s[l] * ka->V[j * din + l];
            ka->A[i * din + j] = a;
        }
}

static void known_a_free(known_a_t *ka)
{
    free(ka->V);
    free(ka->s);
    free(ka->A);
    memset(ka, 0, sizeof(*ka));
}

/* One refresh: Y = A Q exactly (double), rounded to fp32, then update. */
static int refresh(gift_geometry_t *g, const known_a_t *ka, double damping)
{
    size_t dks = (size_t)g->din * g->ks, i;
    double *Qd = malloc(dks * sizeof(double)), *Yd = malloc(dks * sizeof(double));
    float *Y = malloc(dks * sizeof(float));
    int rc;

    ck_assert_ptr_nonnull(Qd);
    ck_assert_ptr_nonnull(Yd);
    ck_assert_ptr_nonnull(Y);
    for (i = 0; i < dks; i++)
        Qd[i] = g->U[i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->din, g->ks, g->din, 1.0, ka->A,
                g->din, Qd, g->ks, 0.0, Yd, g->ks);
    for (i = 0; i < dks; i++)
        Y[i] = (float)Yd[i];
    rc = gift_geometry_update(g, Y, ka->trace, damping);
    free(Qd);
    free(Yd);
    free(Y);
    return rc;
}

/* ||x - y|| / ||y|| for float x against double y. */
static double rel_err_fd(const float *x, const double *y, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        num += (x[i] - y[i]) * (x[i] - y[i]);
        den += y[i] * y[i];
    }
    return sqrt(num) / sqrt(den);
}

static double rel_err_ff(const float *x, const float *y, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        double e = (double)x[i] - y[i];

        num += e * e;
        den += (double)y[i] * y[i];
    }
    return sqrt(num) / sqrt(den);
}

/* Dense T (inverse 0) or T^-1 (inverse 1), din x din row-major double, from
 * the published float fields of g. */
static double *dense_t(const gift_geometry_t *g, int inverse)
{
    int din = g->din, i, j, l;
    double *T = calloc((size_t)din * din, sizeof(double));
    const float *d = inverse ? g->d_inv : g->d;
    double c = inverse ? g->c_inv : g->c;

    ck_assert_ptr_nonnull(T);
    for (i = 0; i < din; i++)
        for (j = 0; j < din; j++) {
            double t = i == j ? c : 0.0;

            for (l = 0; l < g->k; l++)
                t += (double)g->U[i * g->ks + l] * d[l] * g->U[j * g->ks + l];
            T[i * din + j] = t;
        }
    return T;
}

/* A moderate spectrum for the round-trip tests: 1/(1+i)^1.5 times 4. */
static void spectrum_moderate(double *s, int din)
{
    int i;

    for (i = 0; i < din; i++)
        s[i] = 4.0 / pow(1.0 + i, 1.5);
}

/* ---- fixture: geometries built from a known A, din = 96 ----------------- */

#define FX_DIN 96
#define FX_ROWS 37

static known_a_t fx_a;

static void fx_setup(void)
{
    double s[FX_DIN];

    spectrum_moderate(s, FX_DIN);
    known_a_make(&fx_a, FX_DIN, s, 11);
}

static void fx_teardown(void)
{
    known_a_free(&fx_a);
}

/* Builds g for rank k from fx_a with `refreshes` updates. */
static void fx_geometry(gift_geometry_t *g, int k, int refreshes)
{
    int ks = gift_basis_cols(FX_DIN, k, GIFT_OVERSAMPLE_DEFAULT), r, rc;

    ck_assert_int_eq(gift_geometry_init(g, FX_DIN, k, ks, 1234), 0);
    for (r = 0; r < refreshes; r++) {
        rc = refresh(g, &fx_a, GIFT_DAMPING_DEFAULT);
        ck_assert_msg(rc == 0, "update %d for k=%d returned %d", r, k, rc);
    }
    ck_assert_int_eq(g->identity, 0);
    ck_assert_uint_eq(g->epoch, (unsigned)refreshes);
}

/* ---- rank policy -------------------------------------------------------- */

START_TEST(test_rank_policy)
{
    static const struct {
        int rows, din, k;
    } cases[] = {
        {1, 1, 1},        {4096, 64, 64}, {256, 256, 256}, {10, 257, 80},   {688, 256, 256},
        {256, 688, 176},  {10, 300, 80},  {10, 1024, 256}, {10, 2048, 512}, {10, 4096, 512},
        {10, 11008, 512}, {10, 320, 80},  {10, 1000, 256},
    };
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int k = gift_rank_default(cases[i].rows, cases[i].din);

        ck_assert_msg(k == cases[i].k, "rank(%d, %d) = %d, want %d", cases[i].rows, cases[i].din, k,
                      cases[i].k);
        ck_assert_msg(k >= 1 && k <= cases[i].din && (cases[i].din <= 256 || k % 16 == 0),
                      "rank(%d, %d) = %d breaks the policy", cases[i].rows, cases[i].din, k);
    }
    ck_assert_int_eq(gift_rank_default(0, 10), GIFT_EINVAL);
    ck_assert_int_eq(gift_rank_default(10, 0), GIFT_EINVAL);
    ck_assert_int_eq(gift_rank_default(10, -5), GIFT_EINVAL);

    ck_assert_int_eq(gift_basis_cols(256, 32, 8), 40);
    ck_assert_int_eq(gift_basis_cols(40, 36, 8), 40);
    ck_assert_int_eq(gift_basis_cols(10, 10, 8), 10);
    ck_assert_int_eq(gift_basis_cols(4096, 512, 0), 512);
    ck_assert_int_eq(gift_basis_cols(10, 0, 8), GIFT_EINVAL);
    ck_assert_int_eq(gift_basis_cols(10, 11, 8), GIFT_EINVAL);
    ck_assert_int_eq(gift_basis_cols(10, 5, -1), GIFT_EINVAL);
    ck_assert_int_eq(gift_basis_cols(0, 1, 0), GIFT_EINVAL);
}
END_TEST

/* ---- init and identity -------------------------------------------------- */

START_TEST(test_init_basis)
{
    gift_geometry_t g, h;
    int din = 70, ks = 24, i, j, l;
    double worst = 0.0;

    ck_assert_int_eq(gift_geometry_init(&g, din, 16, ks, 42), 0);
    ck_assert_int_eq(g.identity, 1);
    ck_assert_uint_eq(g.epoch, 0);
    ck_assert_msg(g.c == 1.0f && g.c_inv == 1.0f, "c %g c_inv %g", g.c, g.c_inv);
    for (i = 0; i < ks; i++)
        for (j = 0; j < ks; j++) {
            double dot = 0.0;

            for (l = 0; l < din; l++)
                dot += (double)g.U[l * ks + i] * g.U[l * ks + j];
            dot -= i == j;
            worst = fabs(dot) > worst ? fabs(dot) : worst;
        }
    ck_assert_msg(worst < 1e-6, "U^T U - I max entry %g", worst);

    /* The basis is a pure function of the seed. */
    ck_assert_int_eq(gift_geometry_init(&h, din, 16, ks, 42), 0);
    ck_assert_msg(memcmp(g.U, h.U, (size_t)din * ks * sizeof(float)) == 0,
                  "same seed, different basis");
    gift_geometry_free(&h);
    ck_assert_int_eq(gift_geometry_init(&h, din, 16, ks, 43), 0);
    ck_assert_msg(memcmp(g.U, h.U, (size_t)din * ks * sizeof(float)) != 0,
                  "different seeds, same basis");
    gift_geometry_free(&h);
    gift_geometry_free(&g);
    gift_geometry_free(&g); /* idempotent */
}
END_TEST

START_TEST(test_identity_copies)
{
    gift_geometry_t g;
    int din = 48, rows = 9;
    size_t n = (size_t)rows * din;
    float *G = rand_floats(n, 5), *out = malloc(n * sizeof(float)), *keep = malloc(n * 4);
    float *Y = calloc((size_t)din * 12, sizeof(float));

    memcpy(keep, G, n * sizeof(float));
    ck_assert_int_eq(gift_geometry_init(&g, din, 8, 12, 7), 0);
    ck_assert_int_eq(gift_transform(&g, 0, G, rows, out, NULL), 0);
    ck_assert_msg(memcmp(out, G, n * sizeof(float)) == 0, "identity T changed G");
    ck_assert_int_eq(gift_transform(&g, 1, G, rows, out, NULL), 0);
    ck_assert_msg(memcmp(out, G, n * sizeof(float)) == 0, "identity T^-1 changed G");
    ck_assert_int_eq(gift_transform(&g, 0, G, rows, G, NULL), 0);
    ck_assert_msg(memcmp(keep, G, n * sizeof(float)) == 0, "identity in place changed G");

    /* A zero trace publishes an identity epoch, and the epoch still advances. */
    ck_assert_int_eq(gift_geometry_update(&g, Y, 0.0, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_uint_eq(g.epoch, 1);
    ck_assert_int_eq(g.identity, 1);
    ck_assert_int_eq(gift_transform(&g, 0, G, rows, out, NULL), 0);
    ck_assert_msg(memcmp(out, G, n * sizeof(float)) == 0, "zero-trace T changed G");
    ck_assert_int_eq(gift_geometry_update(&g, Y, -3.0, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_uint_eq(g.epoch, 2);
    ck_assert_int_eq(g.identity, 1);

    gift_geometry_free(&g);
    free(G);
    free(out);
    free(keep);
    free(Y);
}
END_TEST

/* ---- transform ---------------------------------------------------------- */

START_TEST(test_roundtrip)
{
    const int ks_list[3] = {1, 40, FX_DIN};
    int t;

    for (t = 0; t < 3; t++) {
        gift_geometry_t g;
        int k = ks_list[t];
        size_t n = (size_t)FX_ROWS * FX_DIN;
        float *G = rand_floats(n, 100 + t), *H = malloc(n * sizeof(float));
        float *B = malloc(n * sizeof(float)), *work = malloc((size_t)FX_ROWS * k * sizeof(float));
        double e;

        fx_geometry(&g, k, 3);
        if (k == FX_DIN)
            ck_assert_msg(g.sigma2 == 0.0, "full rank sigma2 = %g", g.sigma2);
        else
            ck_assert_msg(g.sigma2 > 0.0, "k=%d sigma2 = %g", k, g.sigma2);
        ck_assert_int_eq(gift_transform(&g, 0, G, FX_ROWS, H, work), 0);
        ck_assert_msg(rel_err_ff(H, G, n) > 1e-2, "k=%d: T looks like the identity", k);
        ck_assert_int_eq(gift_transform(&g, 1, H, FX_ROWS, B, work), 0);
        e = rel_err_ff(B, G, n);
        ck_assert_msg(e < 1e-5, "k=%d: ||G T T^-1 - G|| / ||G|| = %g", k, e);
        ck_assert_int_eq(gift_transform(&g, 1, G, FX_ROWS, H, work), 0);
        ck_assert_int_eq(gift_transform(&g, 0, H, FX_ROWS, B, work), 0);
        e = rel_err_ff(B, G, n);
        ck_assert_msg(e < 1e-5, "k=%d: ||G T^-1 T - G|| / ||G|| = %g", k, e);

        /* In place gives the same bytes as out of place. */
        memcpy(B, G, n * sizeof(float));
        ck_assert_int_eq(gift_transform(&g, 0, B, FX_ROWS, B, work), 0);
        ck_assert_int_eq(gift_transform(&g, 0, G, FX_ROWS, H, work), 0);
        ck_assert_msg(memcmp(B, H, n * sizeof(float)) == 0, "k=%d: in place differs", k);
        ck_assert_int_eq(gift_transform(&g, 1, B, FX_ROWS, B, work), 0);
        e = rel_err_ff(B, G, n);
        ck_assert_msg(e < 1e-5, "k=%d: in-place round trip error %g", k, e);

        gift_geometry_free(&g);
        free(G);
        free(H);
        free(B);
        free(work);
    }
}
END_TEST

START_TEST(test_dense_reference)
{
    /* Thin form (1, 24), dense in row blocks (60: 2 k >= din), dense whole. */
    const int ks_list[4] = {1, 24, 60, FX_DIN};
    int t, inv;

    for (t = 0; t < 4; t++) {
        gift_geometry_t g;
        int k = ks_list[t], din = FX_DIN;
        size_t n = (size_t)FX_ROWS * din, i;
        float *G = rand_floats(n, 200 + t), *H = malloc(n * sizeof(float));
        float *work = malloc((size_t)FX_ROWS * k * sizeof(float));
        double *Gd = malloc(n * sizeof(double)), *R = malloc(n * sizeof(double));
        double *T, *Ti, *P = malloc((size_t)din * din * sizeof(double)), worst = 0.0;

        fx_geometry(&g, k, 2);
        for (i = 0; i < n; i++)
            Gd[i] = G[i];
        for (inv = 0; inv < 2; inv++) {
            double e;

            T = dense_t(&g, inv);
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, FX_ROWS, din, din, 1.0, Gd, din,
                        T, din, 0.0, R, din);
            ck_assert_int_eq(gift_transform(&g, inv, G, FX_ROWS, H, work), 0);
            e = rel_err_fd(H, R, n);
            ck_assert_msg(e < 1e-5, "k=%d inverse=%d: transform vs dense T error %g", k, inv, e);
            free(T);
        }
        /* The published scalars make T T^-1 = I up to fp32 rounding of U. */
        T = dense_t(&g, 0);
        Ti = dense_t(&g, 1);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, din, din, din, 1.0, T, din, Ti, din,
                    0.0, P, din);
        for (i = 0; i < (size_t)din * din; i++) {
            double e = fabs(P[i] - (i % (din + 1) == 0));

            worst = e > worst ? e : worst;
        }
        ck_assert_msg(worst < 1e-5, "k=%d: dense T T^-1 - I max entry %g", k, worst);

        /* T is the inverse square root of the damped model of A. */
        ck_assert_msg(fabs(g.c * (double)g.c_inv - 1.0) < 1e-6, "c c_inv = %g",
                      (double)g.c * g.c_inv);
        free(T);
        free(Ti);
        gift_geometry_free(&g);
        free(G);
        free(H);
        free(work);
        free(Gd);
        free(R);
        free(P);
    }
}
END_TEST

/* ---- update against a known spectrum ----------------------------------- */

/* Largest principal angle between span(V[:, :k]) and span(U[:, :k]), two
 * ways: acos of the smallest singular value of V_k^T U_k, and asin of the
 * largest singular value of V_perp^T U_k. The acos form cannot resolve angles
 * below ~1e-4 once U has been rounded to fp32 (cos is then 1 - 5e-9 and the
 * rounding of U moves it by more); the asin form is well conditioned. */
static void max_angle(const known_a_t *ka, const gift_geometry_t *g, double *by_acos,
                      double *by_asin)
{
    int din = ka->din, k = g->k, i, j, l, np = din - k;
    double *M = malloc((size_t)din * k * sizeof(double)), *sv = malloc(k * sizeof(double));

    ck_assert_ptr_nonnull(M);
    ck_assert_ptr_nonnull(sv);
    for (i = 0; i < din; i++)
        for (j = 0; j < k; j++) {
            double dot = 0.0;

            for (l = 0; l < din; l++)
                dot += ka->V[l * din + i] * g->U[l * g->ks + j];
            M[i * k + j] = dot;
        }
    /* Rows 0..k-1: V_k^T U_k; rows k..din-1: V_perp^T U_k. */
    ck_assert_int_eq(
        LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', np, k, M + (size_t)k * k, k, sv, NULL, np, NULL, k),
        0);
    *by_asin = asin(sv[0] < 1.0 ? sv[0] : 1.0);
    ck_assert_int_eq(LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', k, k, M, k, sv, NULL, k, NULL, k), 0);
    *by_acos = acos(sv[k - 1] < 1.0 ? sv[k - 1] : 1.0);
    free(M);
    free(sv);
}

START_TEST(test_subspace_recovery)
{
    enum { DIN = 256, K = 32, MAXR = 6 };
    known_a_t ka;
    gift_geometry_t g;
    double s[DIN], tail = 0.0, angle[MAXR], acos_angle[MAXR], sig[MAXR], worst_l = 0.0;
    int i, r, ks = gift_basis_cols(DIN, K, GIFT_OVERSAMPLE_DEFAULT), reached = -1;

    /* Decaying top k (10 down to 0.065), then a 65x gap to a flat-ish tail. */
    for (i = 0; i < DIN; i++)
        s[i] = i < K ? 10.0 * pow(0.85, i) : 1e-3 * (1.0 + 0.5 * sin(0.37 * i));
    for (i = K; i < DIN; i++)
        tail += s[i];
    tail /= DIN - K;
    known_a_make(&ka, DIN, s, 77);
    ck_assert_int_eq(gift_geometry_init(&g, DIN, K, ks, 9), 0);
    for (r = 0; r < MAXR; r++) {
        ck_assert_int_eq(refresh(&g, &ka, GIFT_DAMPING_DEFAULT), 0);
        max_angle(&ka, &g, &acos_angle[r], &angle[r]);
        sig[r] = g.sigma2;
        if (reached < 0 && angle[r] < 1e-3 && acos_angle[r] < 1e-3 &&
            fabs(sig[r] / tail - 1.0) < 1e-2)
            reached = r + 1;
    }
    for (r = 0; r < MAXR; r++)
        fprintf(stderr, "subspace: refresh %d max angle %.3e (acos form %.3e) sigma2/tail %.6f\n",
                r + 1, angle[r], acos_angle[r], sig[r] / tail);
    ck_assert_msg(reached > 0 && reached <= 3,
                  "angle %.3e, sigma2/tail %.6f after 3 refreshes (reached at %d)", angle[2],
                  sig[2] / tail, reached);
    for (r = reached; r < MAXR; r++)
        ck_assert_msg(angle[r] < 1e-3 && acos_angle[r] < 1e-3 && fabs(sig[r] / tail - 1.0) < 1e-2,
                      "refresh %d drifted: angle %.3e sigma2/tail %.6f", r + 1, angle[r],
                      sig[r] / tail);
    /* Converged: each refresh shrinks the angle by about tail / s[k-1]. */
    ck_assert_msg(angle[MAXR - 1] < 1e-5, "angle after %d refreshes %.3e", MAXR, angle[MAXR - 1]);
    for (i = 0; i < K; i++) {
        double e = fabs(g.lambda[i] - s[i]) / s[i];

        worst_l = e > worst_l ? e : worst_l;
    }
    ck_assert_msg(worst_l < 1e-4, "top-k lambda worst relative error %g", worst_l);
    ck_assert_msg(fabs(g.delta - GIFT_DAMPING_DEFAULT * ka.trace / DIN) < 1e-12 * ka.trace,
                  "delta %g", g.delta);
    for (i = 1; i < ks; i++)
        ck_assert_msg(g.lambda[i] <= g.lambda[i - 1], "lambda not descending at %d: %g > %g", i,
                      g.lambda[i], g.lambda[i - 1]);
    gift_geometry_free(&g);
    known_a_free(&ka);
}
END_TEST

START_TEST(test_update_low_rank)
{
    /* rank(A) = 3 < k < ks: Q^T Y is singular up to fp32 noise, so the
     * Cholesky needs the shift to grow. */
    enum { DIN = 64, K = 8, KS = 16 };
    known_a_t ka;
    gift_geometry_t g;
    double s[DIN] = {5.0, 2.0, 0.5};
    float *Y = calloc((size_t)DIN * KS, sizeof(float)), *U0;
    int i, rc;

    known_a_make(&ka, DIN, s, 3);
    ck_assert_int_eq(gift_geometry_init(&g, DIN, K, KS, 1), 0);
    for (i = 0; i < 2; i++) {
        rc = refresh(&g, &ka, GIFT_DAMPING_DEFAULT);
        ck_assert_msg(rc == 0, "low-rank update %d returned %d", i, rc);
    }
    for (i = 0; i < 3; i++)
        ck_assert_msg(fabs(g.lambda[i] - s[i]) < 1e-4 * s[0], "lambda[%d] = %g, want %g", i,
                      g.lambda[i], s[i]);
    for (i = 3; i < KS; i++)
        ck_assert_msg(g.lambda[i] < 1e-4 * s[0], "lambda[%d] = %g, want ~0", i, g.lambda[i]);
    ck_assert_msg(g.sigma2 < 1e-5 * s[0], "sigma2 %g", g.sigma2);
    ck_assert_msg(isfinite(g.c) && g.c > 0.0f, "c %g", g.c);

    /* Y = -Q is no PSD sketch: GIFT_ELAPACK and g untouched. */
    U0 = malloc((size_t)DIN * KS * sizeof(float));
    memcpy(U0, g.U, (size_t)DIN * KS * sizeof(float));
    for (i = 0; i < DIN * KS; i++)
        Y[i] = -g.U[i];
    rc = gift_geometry_update(&g, Y, ka.trace, GIFT_DAMPING_DEFAULT);
    ck_assert_msg(rc == GIFT_ELAPACK, "indefinite sketch returned %d", rc);
    ck_assert_uint_eq(g.epoch, 2);
    ck_assert_msg(memcmp(U0, g.U, (size_t)DIN * KS * sizeof(float)) == 0, "U changed on error");

    /* Without damping the zero Ritz values (rank 3 < k) make T singular; a
     * trace whose scalars overflow fp32 is refused too. g stays as it was. */
    ck_assert_int_eq(refresh(&g, &ka, 0.0), GIFT_EINVAL);
    memset(Y, 0, (size_t)DIN * KS * sizeof(float));
    ck_assert_int_eq(gift_geometry_update(&g, Y, 1e80, GIFT_DAMPING_DEFAULT), GIFT_EINVAL);
    ck_assert_uint_eq(g.epoch, 2);
    ck_assert_msg(memcmp(U0, g.U, (size_t)DIN * KS * sizeof(float)) == 0, "U changed on error");

    /* A zero sketch with a positive trace: all lambda 0, sigma2 = trace / (din - k). */
    memset(Y, 0, (size_t)DIN * KS * sizeof(float));
    ck_assert_int_eq(gift_geometry_update(&g, Y, 5.6, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_msg(fabs(g.lambda[0]) < 1e-12, "lambda[0] %g", g.lambda[0]);
    ck_assert_msg(fabs(g.sigma2 - 5.6 / (DIN - K)) < 1e-12, "sigma2 %g", g.sigma2);
    free(U0);
    free(Y);
    gift_geometry_free(&g);
    known_a_free(&ka);
}
END_TEST

/* ---- sketch ------------------------------------------------------------- */

START_TEST(test_sketch)
{
    enum { N = 50, DIN = 64, KS = 20 };
    gift_geometry_t g;
    float *X = rand_floats((size_t)N * DIN, 31), Y[DIN * KS], work[N * KS];
    double Z[N * KS], Yref[DIN * KS], tr, tref = 0.0, e;
    int i, j, l;

    ck_assert_int_eq(gift_geometry_init(&g, DIN, 12, KS, 8), 0);
    for (i = 0; i < N; i++)
        for (j = 0; j < KS; j++) {
            double z = 0.0;

            for (l = 0; l < DIN; l++)
                z += (double)X[i * DIN + l] * g.U[l * KS + j];
            Z[i * KS + j] = z;
        }
    for (i = 0; i < DIN; i++)
        for (j = 0; j < KS; j++) {
            double y = 0.0;

            for (l = 0; l < N; l++)
                y += (double)X[l * DIN + i] * Z[l * KS + j];
            Yref[i * KS + j] = y / N;
        }
    for (i = 0; i < N * DIN; i++)
        tref += (double)X[i] * X[i];
    tref /= N;

    ck_assert_int_eq(gift_sketch(X, N, DIN, g.U, KS, Y, &tr, work), 0);
    e = rel_err_fd(Y, Yref, DIN * KS);
    ck_assert_msg(e < 1e-5, "sketch vs naive double: relative error %g", e);
    ck_assert_msg(fabs(tr - tref) < 1e-12 * tref, "trace %.17g, want %.17g", tr, tref);

    /* NaN in X: GIFT_ENONFINITE and Y untouched. */
    memset(Y, 0x5a, sizeof(Y));
    X[77] = NAN;
    ck_assert_int_eq(gift_sketch(X, N, DIN, g.U, KS, Y, &tr, work), GIFT_ENONFINITE);
    for (i = 0; i < DIN * KS; i++) {
        uint32_t b;

        memcpy(&b, &Y[i], 4);
        ck_assert_msg(b == 0x5a5a5a5aU, "Y[%d] written on error", i);
    }
    free(X);
    gift_geometry_free(&g);
}
END_TEST

/* ---- error feedback ----------------------------------------------------- */

START_TEST(test_ef_basic)
{
    gift_ef_t ef;
    float p[6] = {1, 2, 3, 4, 5, 6}, dec[6] = {1, 2.5f, 3, 3, 5, 6.25f};
    int i;

    ck_assert_int_eq(gift_ef_init(&ef, 2, 3), 0);
    ck_assert_uint_eq(ef.epoch, 0);
    for (i = 0; i < 6; i++)
        ck_assert_msg(ef.e[i] == 0.0f, "e[%d] = %g after init", i, ef.e[i]);
    gift_ef_update(&ef, p, dec);
    ck_assert_msg(ef.e[1] == -0.5f && ef.e[3] == 1.0f && ef.e[5] == -0.25f && ef.e[0] == 0.0f,
                  "e = %g %g %g %g", ef.e[0], ef.e[1], ef.e[3], ef.e[5]);
    gift_ef_add(&ef, p);
    ck_assert_msg(p[1] == 1.5f && p[3] == 5.0f && p[5] == 5.75f, "p = %g %g %g", p[1], p[3], p[5]);
    gift_ef_reset(&ef, 9);
    ck_assert_uint_eq(ef.epoch, 9);
    for (i = 0; i < 6; i++)
        ck_assert_msg(ef.e[i] == 0.0f, "e[%d] = %g after reset", i, ef.e[i]);
    gift_ef_free(&ef);
    gift_ef_free(&ef);
    ck_assert_int_eq(gift_ef_init(&ef, 0, 3), GIFT_EINVAL);
    ck_assert_int_eq(gift_ef_init(NULL, 1, 3), GIFT_EINVAL);
}
END_TEST

START_TEST(test_ef_rebase)
{
    gift_geometry_t g1, g2, g0;
    gift_ef_t ef;
    size_t n = (size_t)FX_ROWS * FX_DIN, i;
    float *e0 = rand_floats(n, 55), *work = malloc((size_t)FX_ROWS * 40 * sizeof(float));
    float *f = malloc(n * sizeof(float));
    double *E = malloc(n * sizeof(double)), *P = malloc(n * sizeof(double)), *Q, *Ti, *T, e;

    fx_geometry(&g1, 16, 2); /* epoch 2 */
    fx_geometry(&g2, 40, 3); /* epoch 3, a different rank */
    ck_assert_int_eq(gift_geometry_init(&g0, FX_DIN, 16, 24, 1), 0);
    ck_assert_int_eq(gift_ef_init(&ef, FX_ROWS, FX_DIN), 0);
    memcpy(ef.e, e0, n * sizeof(float));

    /* The residual must be expressed in old_g's epoch. */
    ck_assert_int_eq(gift_ef_rebase(&ef, &g1, &g2, work), GIFT_EINVAL);
    ck_assert_msg(memcmp(ef.e, e0, n * sizeof(float)) == 0, "e changed on error");
    ef.epoch = g1.epoch;

    /* e <- (e T1^-1) T2 against the dense reference. */
    ck_assert_int_eq(gift_ef_rebase(&ef, &g1, &g2, work), 0);
    ck_assert_uint_eq(ef.epoch, g2.epoch);
    for (i = 0; i < n; i++)
        E[i] = e0[i];
    Ti = dense_t(&g1, 1);
    T = dense_t(&g2, 0);
    Q = malloc((size_t)FX_DIN * FX_DIN * sizeof(double));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, FX_DIN, FX_DIN, FX_DIN, 1.0, Ti, FX_DIN,
                T, FX_DIN, 0.0, Q, FX_DIN);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, FX_ROWS, FX_DIN, FX_DIN, 1.0, E, FX_DIN,
                Q, FX_DIN, 0.0, P, FX_DIN);
    e = rel_err_fd(ef.e, P, n);
    ck_assert_msg(e < 1e-5, "rebase vs dense (e T1^-1) T2: error %g", e);

    /* And back: the round trip restores e. */
    ck_assert_int_eq(gift_ef_rebase(&ef, &g2, &g1, work), 0);
    ck_assert_uint_eq(ef.epoch, g1.epoch);
    e = rel_err_ff(ef.e, e0, n);
    ck_assert_msg(e < 1e-5, "rebase round trip error %g", e);

    /* From the identity epoch 0 the rebase is just T_new. */
    ef.epoch = 0;
    memcpy(ef.e, e0, n * sizeof(float));
    ck_assert_int_eq(gift_ef_rebase(&ef, &g0, &g1, work), 0);
    ck_assert_int_eq(gift_transform(&g1, 0, e0, FX_ROWS, f, work), 0);
    ck_assert_msg(memcmp(ef.e, f, n * sizeof(float)) == 0, "rebase from identity != T_new");

    /* No work for a non-identity geometry; a shape mismatch. */
    ck_assert_int_eq(gift_ef_rebase(&ef, &g1, &g1, NULL), GIFT_EINVAL);
    gift_ef_free(&ef);
    ck_assert_int_eq(gift_ef_init(&ef, FX_ROWS, FX_DIN - 1), 0);
    ck_assert_int_eq(gift_ef_rebase(&ef, &g0, &g1, work), GIFT_EINVAL);

    gift_ef_free(&ef);
    gift_geometry_free(&g0);
    gift_geometry_free(&g1);
    gift_geometry_free(&g2);
    free(e0);
    free(f);
    free(work);
    free(E);
    free(P);
    free(Q);
    free(Ti);
    free(T);
}
END_TEST

/* ---- bad arguments ------------------------------------------------------ */

START_TEST(test_bad_args)
{
    gift_geometry_t g, h;
    float G[4 * 32] = {0}, out[32 * 8], work[4 * 32], *Y;
    double tr;
    uint32_t ep;

    ck_assert_int_eq(gift_geometry_init(NULL, 32, 4, 8, 0), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_init(&g, 0, 1, 1, 0), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_init(&g, 32, 0, 8, 0), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_init(&g, 32, 9, 8, 0), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_init(&g, 32, 4, 33, 0), GIFT_EINVAL);
    gift_geometry_free(&g); /* safe after a failed init */

    ck_assert_int_eq(gift_geometry_init(&g, 32, 4, 8, 0), 0);
    Y = rand_floats(32 * 8, 3);
    ck_assert_int_eq(gift_geometry_update(NULL, Y, 1.0, 0.01), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update(&g, NULL, 1.0, 0.01), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update(&g, Y, NAN, 0.01), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update(&g, Y, INFINITY, 0.01), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update(&g, Y, 1.0, -0.01), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update(&g, Y, 1.0, NAN), GIFT_EINVAL);
    Y[17] = INFINITY;
    ck_assert_int_eq(gift_geometry_update(&g, Y, 1.0, 0.01), GIFT_EINVAL);
    ep = g.epoch;
    ck_assert_msg(ep == 0 && g.identity == 1, "g changed by failed updates: epoch %u", ep);

    /* Transform: identity geometries accept work == NULL, others do not. */
    ck_assert_int_eq(gift_transform(NULL, 0, G, 4, out, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_transform(&g, 0, NULL, 4, out, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_transform(&g, 0, G, 4, NULL, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_transform(&g, 2, G, 4, out, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_transform(&g, 0, G, -1, out, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_transform(&g, 0, G, 0, out, work), 0);
    g.identity = 0;
    ck_assert_int_eq(gift_transform(&g, 0, G, 4, out, NULL), GIFT_EINVAL);
    g.identity = 1;

    ck_assert_int_eq(gift_sketch(G, 0, 32, g.U, 8, out, &tr, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_sketch(G, 4, 32, g.U, 33, out, &tr, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_sketch(G, 4, 32, NULL, 8, out, &tr, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_sketch(G, 4, 32, g.U, 8, out, NULL, work), GIFT_EINVAL);
    ck_assert_int_eq(gift_sketch(G, 4, 32, g.U, 8, out, &tr, NULL), GIFT_EINVAL);

    ck_assert_int_eq(gift_geometry_init(&h, 32, 5, 8, 0), 0);
    ck_assert_int_eq(gift_geometry_copy(&h, &g), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_copy(NULL, &g), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_copy(&g, &g), 0);
    gift_geometry_free(&h);

    gift_geometry_free(&g);
    free(Y);
}
END_TEST

START_TEST(test_copy)
{
    gift_geometry_t g, h;
    float *G = rand_floats((size_t)FX_ROWS * FX_DIN, 9);
    float *a = malloc((size_t)FX_ROWS * FX_DIN * 4), *b = malloc((size_t)FX_ROWS * FX_DIN * 4);
    float *work = malloc((size_t)FX_ROWS * 24 * sizeof(float));

    fx_geometry(&g, 24, 2);
    ck_assert_int_eq(gift_geometry_init(&h, FX_DIN, 24, g.ks, 999), 0);
    ck_assert_int_eq(gift_geometry_copy(&h, &g), 0);
    ck_assert_uint_eq(h.epoch, g.epoch);
    ck_assert_int_eq(h.identity, 0);
    ck_assert_int_eq(gift_transform(&g, 1, G, FX_ROWS, a, work), 0);
    ck_assert_int_eq(gift_transform(&h, 1, G, FX_ROWS, b, work), 0);
    ck_assert_msg(memcmp(a, b, (size_t)FX_ROWS * FX_DIN * 4) == 0, "copy transforms differently");
    /* The copy updates on its own workspace. */
    ck_assert_int_eq(refresh(&h, &fx_a, GIFT_DAMPING_DEFAULT), 0);
    ck_assert_uint_eq(h.epoch, g.epoch + 1);
    gift_geometry_free(&g);
    gift_geometry_free(&h);
    free(G);
    free(a);
    free(b);
    free(work);
}
END_TEST

/* The dense form (T and T^-1 as matrices, gift_geometry_dense_floats): kept
 * for 2 k >= din only, never by gift_geometry_init_thin; in place gives the same bits as not, for
 * one row (the thin fallback: rows * k < din) and many (row blocks at k = 60); it agrees with the
 * thin form of the same epoch to fp32 rounding; a copy forms the same matrices; a rank lowered
 * below din / 2 and an identity epoch use none. */
START_TEST(test_dense_form)
{
    static const int ranks[3] = {48, 60, FX_DIN};
    const size_t n = (size_t)FX_ROWS * FX_DIN;
    float *G = rand_floats(n, 31), *a = malloc(n * 4), *b = malloc(n * 4);
    float *work = malloc((size_t)FX_ROWS * FX_DIN * sizeof(float));
    gift_geometry_t g, h, t;

    ck_assert_ptr_nonnull(work);
    ck_assert_uint_eq(gift_geometry_dense_floats(FX_DIN, 47), 0);
    ck_assert_uint_eq(gift_geometry_dense_floats(FX_DIN, 48), (2 * FX_DIN + 48) * FX_DIN);
    ck_assert_uint_eq(gift_geometry_dense_floats(GIFT_DENSE_MAX_DIN + 1, GIFT_DENSE_MAX_DIN + 1),
                      0);
    ck_assert_uint_eq(gift_geometry_dense_floats(0, 1), 0);
    ck_assert_uint_eq(gift_geometry_dense_floats(8, 9), 0);
    /* What the policy's flops cap counts: thin 8 rows din k, dense 4 rows din^2. */
    ck_assert_msg(gift_transform_flops(10, FX_DIN, 47) == 8.0 * 10 * FX_DIN * 47 &&
                      gift_transform_flops(10, FX_DIN, 48) == 4.0 * 10 * FX_DIN * FX_DIN &&
                      gift_transform_flops(10, FX_DIN, FX_DIN) == 4.0 * 10 * FX_DIN * FX_DIN &&
                      gift_transform_flops(10, 2048, 2048) == 8.0 * 10 * 2048 * 2048 &&
                      gift_transform_flops(-1, FX_DIN, 8) == 0.0 &&
                      gift_transform_flops(10, FX_DIN, 0) == 0.0,
                  "gift_transform_flops: %g %g %g", gift_transform_flops(10, FX_DIN, 47),
                  gift_transform_flops(10, FX_DIN, 48), gift_transform_flops(10, 2048, 2048));
    fx_geometry(&g, 24, 2);
    ck_assert_msg(g.dense == NULL && g.dense_on == 0, "k=24 of %d: a dense buffer", FX_DIN);
    gift_geometry_free(&g);
    for (int r = 0; r < 3; r++) {
        int k = ranks[r];

        fx_geometry(&g, k, 2);
        ck_assert_msg(g.dense != NULL && g.dense_on == 1, "k=%d: dense %p on %d", k,
                      (void *)g.dense, g.dense_on);
        /* The same epoch without the buffer: the thin form. */
        ck_assert_int_eq(gift_geometry_init_thin(&t, FX_DIN, k, g.ks, 5), 0);
        ck_assert_ptr_null(t.dense);
        ck_assert_int_eq(gift_geometry_copy(&t, &g), 0);
        ck_assert_int_eq(t.dense_on, 0);
        ck_assert_int_eq(gift_geometry_init(&h, FX_DIN, k, g.ks, 6), 0);
        ck_assert_int_eq(gift_geometry_copy(&h, &g), 0);
        ck_assert_int_eq(h.dense_on, 1);
        ck_assert_msg(memcmp(h.dense, g.dense, 2 * (size_t)FX_DIN * FX_DIN * 4) == 0,
                      "k=%d: the copy formed other matrices", k);
        for (int inv = 0; inv < 2; inv++) {
            const int rows_list[2] = {1, FX_ROWS};

            for (int q = 0; q < 2; q++) {
                int rows = rows_list[q];
                size_t m = (size_t)rows * FX_DIN;
                double e;

                ck_assert_int_eq(gift_transform(&g, inv, G, rows, a, work), 0);
                memcpy(b, G, m * 4);
                ck_assert_int_eq(gift_transform(&g, inv, b, rows, b, work), 0);
                ck_assert_msg(memcmp(a, b, m * 4) == 0, "k=%d inv=%d rows=%d: in place differs", k,
                              inv, rows);
                ck_assert_int_eq(gift_transform(&t, inv, G, rows, b, work), 0);
                e = rel_err_ff(a, b, m);
                ck_assert_msg(e < 1e-5, "k=%d inv=%d rows=%d: dense vs thin rel err %g", k, inv,
                              rows, e);
            }
        }
        /* gift_transform_ws: one row of a tensor of FX_ROWS takes the form the
         * tensor would (dense at k = 48 too, where one row alone goes thin),
         * bit for bit the one product row x T; too small a work size is
         * refused. */
        for (int inv = 0; inv < 2; inv++) {
            const float *T = g.dense + (inv ? (size_t)FX_DIN * FX_DIN : 0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, FX_DIN, FX_DIN, 1.0f,
                        G + FX_DIN, FX_DIN, T, FX_DIN, 0.0f, b, FX_DIN);
            ck_assert_int_eq(gift_transform_ws(&g, inv, G + FX_DIN, 1, a, work, FX_ROWS), 0);
            ck_assert_msg(memcmp(a, b, FX_DIN * 4) == 0,
                          "k=%d inv=%d: one row with the tensor's work size is not row x T", k,
                          inv);
            memcpy(a, G + FX_DIN, FX_DIN * 4);
            ck_assert_int_eq(gift_transform_ws(&g, inv, a, 1, a, work, FX_ROWS), 0);
            ck_assert_msg(memcmp(a, b, FX_DIN * 4) == 0, "k=%d inv=%d: in place differs", k, inv);
            ck_assert_int_eq(gift_transform_ws(&g, inv, G, 2, a, work, 1), GIFT_EINVAL);
        }
        gift_geometry_free(&t);
        gift_geometry_free(&h);
        gift_geometry_free(&g);
    }
    /* A rank lowered below din / 2 on a full-rank buffer forms nothing; an
     * identity epoch neither. */
    fx_geometry(&g, FX_DIN, 2);
    g.k = 40;
    ck_assert_int_eq(gift_geometry_load(&g, g.U, g.lambda, g.trace,
                                        gift_geometry_rank_sigma2(&g, 40), g.delta, g.epoch, 0),
                     0);
    ck_assert_int_eq(g.dense_on, 0);
    ck_assert_int_eq(gift_geometry_load(&g, g.U, g.lambda, 0.0, 0.0, 0.0, 9, 1), 0);
    ck_assert_int_eq(g.dense_on, 0);
    ck_assert_int_eq(gift_transform(&g, 0, G, FX_ROWS, a, work), 0);
    ck_assert_int_eq(memcmp(a, G, n * 4), 0);
    g.k = FX_DIN;
    gift_geometry_free(&g);
    free(G);
    free(a);
    free(b);
    free(work);
}
END_TEST

/* A worker loads what the owner published (U, lambda, trace, sigma2, delta,
 * epoch) into a geometry of its own, with no update workspace: its transform
 * must be bit for bit the owner's, both ways, for a partial and a full rank. */
START_TEST(test_load)
{
    static const int ks_rank[2] = {24, FX_DIN};
    float *G = rand_floats((size_t)FX_ROWS * FX_DIN, 21);
    float *a = malloc((size_t)FX_ROWS * FX_DIN * 4), *b = malloc((size_t)FX_ROWS * FX_DIN * 4);
    float *work = malloc((size_t)FX_ROWS * FX_DIN * sizeof(float));

    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(work);
    for (int t = 0; t < 2; t++) {
        gift_geometry_t g, h;
        int k = ks_rank[t], inv;
        size_t dks;

        fx_geometry(&g, k, 2);
        dks = (size_t)g.din * g.ks;
        /* Buffers only, as libgiftclient allocates them: ws stays NULL, and
         * the dense form where the rank wants it. */
        memset(&h, 0, sizeof h);
        h.din = g.din;
        h.k = g.k;
        h.ks = g.ks;
        if (gift_geometry_dense_floats(g.din, g.k) > 0)
            h.dense = malloc(gift_geometry_dense_floats(g.din, g.k) * sizeof(float));
        h.U = malloc(dks * sizeof(float));
        h.lambda = malloc((size_t)g.ks * sizeof(float));
        h.d = malloc((size_t)g.k * sizeof(float));
        h.d_inv = malloc((size_t)g.k * sizeof(float));
        ck_assert_ptr_nonnull(h.U);
        ck_assert_ptr_nonnull(h.d_inv);
        ck_assert_int_eq(
            gift_geometry_load(&h, g.U, g.lambda, g.trace, g.sigma2, g.delta, g.epoch, g.identity),
            0);
        ck_assert_uint_eq(h.epoch, g.epoch);
        ck_assert_int_eq(h.identity, 0);
        ck_assert_msg(memcmp(&h.c, &g.c, sizeof g.c) == 0 &&
                          memcmp(&h.c_inv, &g.c_inv, sizeof g.c_inv) == 0,
                      "k=%d: c %.9g / %.9g, c_inv %.9g / %.9g", k, (double)h.c, (double)g.c,
                      (double)h.c_inv, (double)g.c_inv);
        for (int j = 0; j < g.k; j++)
            ck_assert_msg(memcmp(&h.d[j], &g.d[j], 4) == 0 &&
                              memcmp(&h.d_inv[j], &g.d_inv[j], 4) == 0,
                          "k=%d: d[%d] %.9g vs %.9g, d_inv %.9g vs %.9g", k, j, (double)h.d[j],
                          (double)g.d[j], (double)h.d_inv[j], (double)g.d_inv[j]);
        for (inv = 0; inv < 2; inv++) {
            ck_assert_int_eq(gift_transform(&g, inv, G, FX_ROWS, a, work), 0);
            ck_assert_int_eq(gift_transform(&h, inv, G, FX_ROWS, b, work), 0);
            ck_assert_msg(memcmp(a, b, (size_t)FX_ROWS * FX_DIN * 4) == 0,
                          "k=%d inverse=%d: the loaded transform differs", k, inv);
        }
        /* In place (U and lambda already in h's buffers), as a receiver does. */
        ck_assert_int_eq(
            gift_geometry_load(&h, h.U, h.lambda, g.trace, g.sigma2, g.delta, g.epoch, 0), 0);
        ck_assert_int_eq(gift_transform(&h, 0, G, FX_ROWS, b, work), 0);
        ck_assert_int_eq(gift_transform(&g, 0, G, FX_ROWS, a, work), 0);
        ck_assert_msg(memcmp(a, b, (size_t)FX_ROWS * FX_DIN * 4) == 0, "k=%d: in-place load", k);
        /* Refused input leaves h as it was. */
        {
            float bad = g.lambda[0];
            g.lambda[0] = -1.0f;
            ck_assert_int_eq(
                gift_geometry_load(&h, g.U, g.lambda, g.trace, g.sigma2, g.delta, g.epoch + 1, 0),
                GIFT_EINVAL);
            g.lambda[0] = bad;
            ck_assert_int_eq(
                gift_geometry_load(&h, g.U, g.lambda, g.trace, -1.0, g.delta, g.epoch + 1, 0),
                GIFT_EINVAL);
            ck_assert_uint_eq(h.epoch, g.epoch);
        }
        /* An identity epoch keeps U as the basis and maps G to itself. */
        ck_assert_int_eq(gift_geometry_load(&h, g.U, g.lambda, 0.0, 0.0, 0.0, 7, 1), 0);
        ck_assert_int_eq(h.identity, 1);
        ck_assert_uint_eq(h.epoch, 7);
        ck_assert_int_eq(memcmp(h.U, g.U, dks * sizeof(float)), 0);
        ck_assert_int_eq(gift_transform(&h, 0, G, FX_ROWS, b, work), 0);
        ck_assert_int_eq(memcmp(b, G, (size_t)FX_ROWS * FX_DIN * 4), 0);
        gift_geometry_free(&h);
        gift_geometry_free(&g);
    }
    free(G);
    free(a);
    free(b);
    free(work);
}
END_TEST

/* ---- running average of the covariance (gift_geometry_update_decay) ----- */

/* Y = A Q (double, rounded to fp32) for Q = g->U: the summed sketch of a
 * known A, as refresh() makes it, without updating. Caller frees. */
static float *sketch_of(const gift_geometry_t *g, const double *A)
{
    size_t dks = (size_t)g->din * g->ks, i;
    double *Qd = malloc(dks * sizeof(double)), *Yd = malloc(dks * sizeof(double));
    float *Y = malloc(dks * sizeof(float));

    ck_assert_ptr_nonnull(Qd);
    ck_assert_ptr_nonnull(Yd);
    ck_assert_ptr_nonnull(Y);
    for (i = 0; i < dks; i++)
        Qd[i] = g->U[i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->din, g->ks, g->din, 1.0, A, g->din,
                Qd, g->ks, 0.0, Yd, g->ks);
    for (i = 0; i < dks; i++)
        Y[i] = (float)Yd[i];
    free(Qd);
    free(Yd);
    return Y;
}

/* Every published field of a and b, bit for bit; line names the caller. */
static void same_bits(const gift_geometry_t *a, const gift_geometry_t *b, const char *what)
{
    ck_assert_msg(a->epoch == b->epoch && a->identity == b->identity,
                  "%s: epoch %u/%u identity %d/%d", what, a->epoch, b->epoch, a->identity,
                  b->identity);
    ck_assert_msg(memcmp(&a->trace, &b->trace, sizeof a->trace) == 0 &&
                      memcmp(&a->sigma2, &b->sigma2, sizeof a->sigma2) == 0 &&
                      memcmp(&a->delta, &b->delta, sizeof a->delta) == 0,
                  "%s: trace %.17g/%.17g sigma2 %.17g/%.17g delta %.17g/%.17g", what, a->trace,
                  b->trace, a->sigma2, b->sigma2, a->delta, b->delta);
    ck_assert_msg(memcmp(&a->c, &b->c, sizeof a->c) == 0 &&
                      memcmp(&a->c_inv, &b->c_inv, sizeof a->c_inv) == 0,
                  "%s: c %.9g/%.9g c_inv %.9g/%.9g", what, (double)a->c, (double)b->c,
                  (double)a->c_inv, (double)b->c_inv);
    ck_assert_msg(memcmp(a->U, b->U, (size_t)a->din * a->ks * sizeof(float)) == 0,
                  "%s: U differs (relL2 %.3g)", what,
                  rel_err_ff(a->U, b->U, (size_t)a->din * a->ks));
    ck_assert_msg(memcmp(a->lambda, b->lambda, (size_t)a->ks * sizeof(float)) == 0,
                  "%s: lambda differs (lambda_1 %.9g/%.9g)", what, (double)a->lambda[0],
                  (double)b->lambda[0]);
    ck_assert_msg(memcmp(a->d, b->d, (size_t)a->k * sizeof(float)) == 0 &&
                      memcmp(a->d_inv, b->d_inv, (size_t)a->k * sizeof(float)) == 0,
                  "%s: d or d_inv differs", what);
}

/* The model U diag(lambda) U^T of g's first k columns, row-major double. */
static double *dense_model(const gift_geometry_t *g)
{
    int din = g->din, i, j, l;
    double *M = calloc((size_t)din * din, sizeof(double));

    ck_assert_ptr_nonnull(M);
    for (i = 0; i < din; i++)
        for (j = 0; j < din; j++) {
            double m = 0.0;

            for (l = 0; l < g->k; l++)
                m += (double)g->U[i * g->ks + l] * g->lambda[l] * g->U[j * g->ks + l];
            M[i * din + j] = m;
        }
    return M;
}

static double rel_err_dd(const double *x, const double *y, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    for (i = 0; i < n; i++) {
        num += (x[i] - y[i]) * (x[i] - y[i]);
        den += y[i] * y[i];
    }
    return sqrt(num) / sqrt(den);
}

/* decay 0 is the plain update bit for bit, over several rounds and ranks;
 * a decay on the first epoch (onto the identity of epoch 0) is not applied. */
START_TEST(test_decay_zero_bitwise)
{
    static const int k_list[3] = {1, 24, FX_DIN};
    known_a_t a2;
    double s2[FX_DIN];
    int t, r;

    for (r = 0; r < FX_DIN; r++)
        s2[r] = 1.0 / (1.0 + 0.1 * r);
    known_a_make(&a2, FX_DIN, s2, 29);
    for (t = 0; t < 3; t++) {
        int k = k_list[t], ks = gift_basis_cols(FX_DIN, k, GIFT_OVERSAMPLE_DEFAULT);
        gift_geometry_t ga, gb, gc;
        char what[64];

        ck_assert_int_eq(gift_geometry_init(&ga, FX_DIN, k, ks, 77), 0);
        ck_assert_int_eq(gift_geometry_init(&gb, FX_DIN, k, ks, 77), 0);
        ck_assert_int_eq(gift_geometry_init(&gc, FX_DIN, k, ks, 77), 0);
        for (r = 0; r < 3; r++) {
            const known_a_t *A = r % 2 ? &a2 : &fx_a;
            float *Y = sketch_of(&ga, A->A);

            ck_assert_int_eq(gift_geometry_update(&ga, Y, A->trace, GIFT_DAMPING_DEFAULT), 0);
            ck_assert_int_eq(
                gift_geometry_update_decay(&gb, Y, A->trace, GIFT_DAMPING_DEFAULT, 0.0), 0);
            /* gc: decay 0.7 on its first epoch only: not averaged with epoch 0. */
            if (r == 0)
                ck_assert_int_eq(
                    gift_geometry_update_decay(&gc, Y, A->trace, GIFT_DAMPING_DEFAULT, 0.7), 0);
            snprintf(what, sizeof what, "k=%d round %d, decay 0", k, r + 1);
            same_bits(&ga, &gb, what);
            if (r == 0) {
                snprintf(what, sizeof what, "k=%d first epoch, decay 0.7", k);
                same_bits(&ga, &gc, what);
            }
            free(Y);
        }
        gift_geometry_free(&ga);
        gift_geometry_free(&gb);
        gift_geometry_free(&gc);
    }
    known_a_free(&a2);
}
END_TEST

/*
 * With k = ks = din, two updates with decay beta (C_1, then C_2 sketched
 * against U_1) give the geometry built in one update from
 * C = beta C_1 + (1 - beta) C_2 directly. Compared: the trace (the same
 * double expression, exact), the model U diag(lambda) U^T and the dense T.
 *
 * Tolerances. Both sides carry fp32 rounding of the sketches Y (relative
 * 2^-24 per entry) and of the published U and lambda; the averaged side
 * also uses U_1 diag(lambda_1) for C_1 U_1, which differs from it by that
 * rounding and by the Nystrom shift nu (FLT_EPSILON sqrt(din) ||Y||_F at
 * first, 1.2e-6 relative, and subtracted again from the Ritz values). The
 * first-order bound is therefore a few 1e-6 for the model; measured 5e-8
 * (the errors are random and partly cancel; printed on stderr), so 1e-6
 * keeps a margin of 20 while still catching a wrong weight, a lost trace
 * term or a missed oversampling column (all >= 1e-3). T = (M + delta I)^-1/2
 * amplifies a relative perturbation of M by up to 0.5 lambda_max /
 * (lambda_min + delta), about 50 here; measured 3e-7, tolerance 1e-5.
 */
START_TEST(test_decay_full_rank_average)
{
    static const double betas[3] = {0.5, 0.8, 0.95};
    const int din = FX_DIN;
    size_t nn = (size_t)din * din, i;
    known_a_t a2, mix;
    double s2[FX_DIN];
    int b;

    for (i = 0; i < (size_t)din; i++)
        s2[i] = 2.0 / (1.0 + 0.2 * (double)i);
    known_a_make(&a2, din, s2, 31);
    for (b = 0; b < 3; b++) {
        double beta = betas[b], e_m, e_t, e_c, tr;
        gift_geometry_t ga, gb;
        double *Ma, *Mb, *Ta, *Tb;
        float *Y1, *Y2, *Yc;

        /* The averaged covariance, as a known_a_t for sketch_of. */
        mix.din = din;
        mix.A = malloc(nn * sizeof(double));
        ck_assert_ptr_nonnull(mix.A);
        for (i = 0; i < nn; i++)
            mix.A[i] = beta * fx_a.A[i] + (1.0 - beta) * a2.A[i];
        tr = beta * fx_a.trace + (1.0 - beta) * a2.trace;

        ck_assert_int_eq(gift_geometry_init(&ga, din, din, din, 5), 0);
        ck_assert_int_eq(gift_geometry_init(&gb, din, din, din, 5), 0);
        Y1 = sketch_of(&ga, fx_a.A);
        ck_assert_int_eq(
            gift_geometry_update_decay(&ga, Y1, fx_a.trace, GIFT_DAMPING_DEFAULT, beta), 0);
        Y2 = sketch_of(&ga, a2.A);
        ck_assert_int_eq(gift_geometry_update_decay(&ga, Y2, a2.trace, GIFT_DAMPING_DEFAULT, beta),
                         0);
        Yc = sketch_of(&gb, mix.A);
        ck_assert_int_eq(gift_geometry_update(&gb, Yc, tr, GIFT_DAMPING_DEFAULT), 0);

        ck_assert_msg(ga.trace == gb.trace && ga.delta == gb.delta && ga.sigma2 == 0.0 &&
                          gb.sigma2 == 0.0,
                      "beta %g: trace %.17g vs %.17g, delta %.17g vs %.17g, sigma2 %g %g", beta,
                      ga.trace, gb.trace, ga.delta, gb.delta, ga.sigma2, gb.sigma2);
        Ma = dense_model(&ga);
        Mb = dense_model(&gb);
        e_m = rel_err_dd(Ma, Mb, nn);
        e_c = rel_err_dd(Ma, mix.A, nn);
        ck_assert_msg(e_m < 1e-6 && e_c < 1e-6,
                      "beta %g: averaged model vs direct relL2 %.3g, vs the exact C %.3g "
                      "(tolerance 1e-6)",
                      beta, e_m, e_c);
        Ta = dense_t(&ga, 0);
        Tb = dense_t(&gb, 0);
        e_t = rel_err_dd(Ta, Tb, nn);
        ck_assert_msg(e_t < 1e-5, "beta %g: dense T averaged vs direct relL2 %.3g (tolerance 1e-5)",
                      beta, e_t);
        fprintf(stderr, "decay %.2f, k = din = %d: model relL2 %.2e (vs exact C %.2e), T %.2e\n",
                beta, din, e_m, e_c, e_t);
        free(Ma);
        free(Mb);
        free(Ta);
        free(Tb);
        free(Y1);
        free(Y2);
        free(Yc);
        free(mix.A);
        gift_geometry_free(&ga);
        gift_geometry_free(&gb);
    }
    known_a_free(&a2);
}
END_TEST

/* A bad decay leaves g untouched. The same covariance every round is a fixed
 * point of the average, but with k < din the estimate of the first rounds
 * (a Nystrom approximation from a poor basis, which underestimates A) fades
 * only as decay^t: after 4 rounds at 0.9 lambda_1 is still 1% low; after 80
 * (0.9^80 = 2e-4) the averaged and the plain geometry agree to 1e-3. */
START_TEST(test_decay_args)
{
    gift_geometry_t g, h;
    float *Y;
    int r;

    ck_assert_int_eq(gift_geometry_init(&g, FX_DIN, 24, 32, 9), 0);
    ck_assert_int_eq(gift_geometry_init(&h, FX_DIN, 24, 32, 9), 0);
    Y = sketch_of(&g, fx_a.A);
    ck_assert_int_eq(gift_geometry_update_decay(&g, Y, fx_a.trace, 0.01, -0.1), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update_decay(&g, Y, fx_a.trace, 0.01, 1.0), GIFT_EINVAL);
    ck_assert_int_eq(gift_geometry_update_decay(&g, Y, fx_a.trace, 0.01, NAN), GIFT_EINVAL);
    ck_assert_msg(g.epoch == 0 && g.identity == 1, "failed updates changed g: epoch %u", g.epoch);
    free(Y);
    for (r = 0; r < 80; r++) {
        float *Yg = sketch_of(&g, fx_a.A), *Yh = sketch_of(&h, fx_a.A);

        ck_assert_int_eq(gift_geometry_update_decay(&g, Yg, fx_a.trace, 0.01, 0.9), 0);
        ck_assert_int_eq(gift_geometry_update(&h, Yh, fx_a.trace, 0.01), 0);
        free(Yg);
        free(Yh);
    }
    ck_assert_msg(fabs(g.trace / fx_a.trace - 1.0) < 1e-14, "trace %.17g, wanted %.17g", g.trace,
                  fx_a.trace);
    for (r = 0; r < g.k; r++)
        ck_assert_msg(fabs(g.lambda[r] / h.lambda[r] - 1.0) < 1e-3,
                      "lambda_%d %.9g averaged vs %.9g plain", r, (double)g.lambda[r],
                      (double)h.lambda[r]);
    gift_geometry_free(&g);
    gift_geometry_free(&h);
}
END_TEST

/* gift_geometry_decay_at: the schedule, and three full-rank updates with it
 * give the normalised average (b^2 C_1 + b C_2 + C_3) / (1 + b + b^2). */
START_TEST(test_decay_schedule)
{
    const int din = FX_DIN;
    const double beta = 0.9;
    size_t nn = (size_t)din * din, i;
    known_a_t a[3];
    double s[FX_DIN], w[3] = {beta * beta, beta, 1.0}, e_m, tr = 0.0, wsum = 0.0, b;
    double *C = calloc(nn, sizeof(double)), *M;
    gift_geometry_t g;
    int r;

    ck_assert_ptr_nonnull(C);
    ck_assert_msg(gift_geometry_decay_at(0.9, 0) == 0.0 && gift_geometry_decay_at(0.0, 5) == 0.0,
                  "decay_at(0.9, 0) %g, decay_at(0, 5) %g", gift_geometry_decay_at(0.9, 0),
                  gift_geometry_decay_at(0.0, 5));
    b = gift_geometry_decay_at(0.9, 1);
    ck_assert_msg(fabs(b - 0.9 / 1.9) < 1e-15, "decay_at(0.9, 1) %.17g, wanted 0.9/1.9", b);
    b = gift_geometry_decay_at(0.9, 400);
    ck_assert_msg(fabs(b - 0.9) < 1e-15, "decay_at(0.9, 400) %.17g, wanted 0.9", b);
    ck_assert_msg(isnan(gift_geometry_decay_at(1.0, 3)) && isnan(gift_geometry_decay_at(-0.1, 3)),
                  "a bad decay is not NaN");
    for (r = 0; r < 3; r++) {
        for (i = 0; i < (size_t)din; i++)
            s[i] = (1.0 + r) / (1.0 + (0.05 + 0.1 * r) * (double)i);
        known_a_make(&a[r], din, s, 40 + r);
        for (i = 0; i < nn; i++)
            C[i] += w[r] * a[r].A[i];
        tr += w[r] * a[r].trace;
        wsum += w[r];
    }
    for (i = 0; i < nn; i++)
        C[i] /= wsum;
    tr /= wsum;
    ck_assert_int_eq(gift_geometry_init(&g, din, din, din, 3), 0);
    for (r = 0; r < 3; r++) {
        float *Y = sketch_of(&g, a[r].A);

        b = gift_geometry_decay_at(beta, g.epoch);
        ck_assert_int_eq(gift_geometry_update_decay(&g, Y, a[r].trace, GIFT_DAMPING_DEFAULT, b), 0);
        free(Y);
    }
    M = dense_model(&g);
    e_m = rel_err_dd(M, C, nn);
    ck_assert_msg(e_m < 1e-6 && fabs(g.trace / tr - 1.0) < 1e-14,
                  "model vs the normalised average relL2 %.3g (tolerance 1e-6), trace %.17g vs "
                  "%.17g",
                  e_m, g.trace, tr);
    free(M);
    free(C);
    for (r = 0; r < 3; r++)
        known_a_free(&a[r]);
    gift_geometry_free(&g);
}
END_TEST

static Suite *geometry_suite(void)
{
    Suite *s = suite_create("geometry");
    TCase *plain = tcase_create("plain"), *known = tcase_create("known_a");
    TCase *recovery = tcase_create("recovery");

    tcase_add_test(plain, test_rank_policy);
    tcase_add_test(plain, test_init_basis);
    tcase_add_test(plain, test_identity_copies);
    tcase_add_test(plain, test_sketch);
    tcase_add_test(plain, test_ef_basic);
    tcase_add_test(plain, test_bad_args);
    suite_add_tcase(s, plain);

    tcase_add_checked_fixture(known, fx_setup, fx_teardown);
    tcase_add_test(known, test_roundtrip);
    tcase_add_test(known, test_dense_reference);
    tcase_add_test(known, test_ef_rebase);
    tcase_add_test(known, test_copy);
    tcase_add_test(known, test_load);
    tcase_add_test(known, test_dense_form);
    tcase_add_test(known, test_decay_zero_bitwise);
    tcase_add_test(known, test_decay_full_rank_average);
    tcase_add_test(known, test_decay_args);
    tcase_add_test(known, test_decay_schedule);
    suite_add_tcase(s, known);

    tcase_set_timeout(recovery, 120);
    tcase_add_test(recovery, test_subspace_recovery);
    tcase_add_test(recovery, test_update_low_rank);
    suite_add_tcase(s, recovery);
    return s;
}

int main(void)
{
    return gift_test_run(geometry_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
