/*
 * test_metrics.c: the fidelity metrics of codec/metrics.c against hand
 * computations and direct double-precision references.
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

/* Muon's coefficients, restated so the test does not trust the library's. */
#define NS_A 3.4445
#define NS_B (-4.7750)
#define NS_C 2.0315

/* m x n (m >= n) with orthonormal columns, row-major double. */
static double *rand_orthonormal(int m, int n, uint64_t seed)
{
    double *V = malloc((size_t)m * n * sizeof(double)), *tau = malloc(n * sizeof(double));
    size_t i;

    for (i = 0; i < (size_t)m * n; i++)
        V[i] = rng_normal(&seed);
    ck_assert_int_eq(LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, m, n, V, n, tau), 0);
    ck_assert_int_eq(LAPACKE_dorgqr(LAPACK_ROW_MAJOR, m, n, n, V, n, tau), 0);
    free(tau);
    return V;
}

/* Singular values of a rows x din row-major double matrix (descending). */
static double *singular_values(const double *X, int rows, int din)
{
    int m = rows < din ? rows : din;
    double *A = malloc((size_t)rows * din * sizeof(double)), *sv = malloc(m * sizeof(double));

    memcpy(A, X, (size_t)rows * din * sizeof(double));
    ck_assert_int_eq(
        LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'N', rows, din, A, din, sv, NULL, rows, NULL, din), 0);
    free(A);
    return sv;
}

/* ---- rel_l2 and cosine -------------------------------------------------- */

START_TEST(test_rel_l2_cosine)
{
    const float g[2] = {3, 4}, gh[2] = {3, 5};
    const float a[3] = {1, 2, 3}, b[3] = {-1, -2, -3}, z[3] = {0, 0, 0};
    const float x[2] = {1, 0}, y[2] = {1, 1};
    double v;

    v = gift_metric_rel_l2(g, gh, 2);
    ck_assert_msg(fabs(v - 0.2) < 1e-15, "rel_l2 {3,4} vs {3,5} = %.17g, want 0.2", v);
    v = gift_metric_rel_l2(a, b, 3);
    ck_assert_msg(fabs(v - 2.0) < 1e-15, "rel_l2 a vs -a = %.17g, want 2", v);
    v = gift_metric_rel_l2(a, a, 3);
    ck_assert_msg(v == 0.0, "rel_l2 a vs a = %g", v);
    v = gift_metric_rel_l2(z, z, 3);
    ck_assert_msg(v == 0.0, "rel_l2 0 vs 0 = %g", v);
    v = gift_metric_rel_l2(z, a, 3);
    ck_assert_msg(isinf(v) && v > 0, "rel_l2 0 vs a = %g, want +inf", v);
    v = gift_metric_rel_l2(NULL, a, 3);
    ck_assert_msg(v == GIFT_EINVAL, "rel_l2 NULL = %g", v);
    v = gift_metric_rel_l2(NULL, NULL, 0);
    ck_assert_msg(v == 0.0, "rel_l2 n=0 = %g", v);

    v = gift_metric_cosine(x, y, 2);
    ck_assert_msg(fabs(v - sqrt(0.5)) < 1e-15, "cosine = %.17g, want 1/sqrt2", v);
    v = gift_metric_cosine(a, b, 3);
    ck_assert_msg(fabs(v + 1.0) < 1e-15, "cosine a vs -a = %.17g", v);
    v = gift_metric_cosine(g, gh, 2);
    ck_assert_msg(fabs(v - 29.0 / (5.0 * sqrt(34.0))) < 1e-15, "cosine {3,4}{3,5} = %.17g", v);
    v = gift_metric_cosine(z, z, 3);
    ck_assert_msg(v == 1.0, "cosine 0 vs 0 = %g", v);
    v = gift_metric_cosine(z, a, 3);
    ck_assert_msg(v == 0.0, "cosine 0 vs a = %g", v);
    v = gift_metric_cosine(a, NULL, 3);
    ck_assert_msg(isnan(v), "cosine NULL = %g", v);
}
END_TEST

START_TEST(test_rel_l2_double_accumulation)
{
    /* 2^24 + many ones: fp32 accumulation would lose them. */
    enum { N = 1 << 16 };
    float *g = malloc(N * sizeof(float)), *h = malloc(N * sizeof(float));
    double v, want, diff;
    int i;

    for (i = 0; i < N; i++) {
        g[i] = i == 0 ? 4096.0f : 1.0f;
        h[i] = g[i] + (i == 0 ? 0.0f : 1e-3f);
    }
    diff = (double)h[1] - 1.0; /* the same fp32 difference in every element */
    want = sqrt((N - 1) * diff * diff) / sqrt(4096.0 * 4096.0 + (N - 1));
    v = gift_metric_rel_l2(g, h, N);
    ck_assert_msg(fabs(v / want - 1.0) < 1e-12, "rel_l2 = %.12g, want %.12g", v, want);
    free(g);
    free(h);
}
END_TEST

/* ---- whitened ----------------------------------------------------------- */

enum { WR = 13, WD = 24 };

static float *w_G, *w_H;

static void w_setup(void)
{
    size_t i;

    w_G = rand_floats(WR * WD, 1);
    w_H = rand_floats(WR * WD, 2);
    for (i = 0; i < WR * WD; i++)
        w_H[i] = w_G[i] + 0.1f * w_H[i];
}

static void w_teardown(void)
{
    free(w_G);
    free(w_H);
}

/* ||(H - G) L|| / ||G L|| with an explicit L (din x din, row-major double). */
static double whitened_ref(const float *G, const float *H, const double *L)
{
    double num = 0.0, den = 0.0;
    int i, j, l;

    for (i = 0; i < WR; i++)
        for (j = 0; j < WD; j++) {
            double a = 0.0, b = 0.0;

            for (l = 0; l < WD; l++) {
                a += ((double)H[i * WD + l] - G[i * WD + l]) * L[l * WD + j];
                b += (double)G[i * WD + l] * L[l * WD + j];
            }
            num += a * a;
            den += b * b;
        }
    return sqrt(num) / sqrt(den);
}

START_TEST(test_whitened_identity)
{
    float A[WD * WD] = {0};
    double v, r;
    int i;

    for (i = 0; i < WD; i++)
        A[i * WD + i] = 1.0f;
    /* L = (1 + damping)^-1/2 I: the factor cancels and the metric is RelL2. */
    v = gift_metric_whitened(w_G, w_H, WR, WD, A, 0.01);
    r = gift_metric_rel_l2(w_G, w_H, WR * WD);
    ck_assert_msg(fabs(v - r) < 1e-12 * r, "whitened(A=I) %.15g vs rel_l2 %.15g", v, r);
    v = gift_metric_whitened(w_G, w_H, WR, WD, A, 0.0);
    ck_assert_msg(fabs(v - r) < 1e-12 * r, "whitened(A=I, damping 0) %.15g vs %.15g", v, r);
}
END_TEST

START_TEST(test_whitened_diagonal)
{
    float A[WD * WD] = {0};
    double L[WD * WD] = {0}, tr = 0.0, delta, v, want;
    int i;

    for (i = 0; i < WD; i++) {
        A[i * WD + i] = (float)(100.0 / (1 + i * i));
        tr += A[i * WD + i];
    }
    delta = 0.05 * tr / WD;
    for (i = 0; i < WD; i++)
        L[i * WD + i] = 1.0 / sqrt(A[i * WD + i] + delta);
    v = gift_metric_whitened(w_G, w_H, WR, WD, A, 0.05);
    want = whitened_ref(w_G, w_H, L);
    ck_assert_msg(fabs(v - want) < 1e-10 * want, "whitened(diag) %.15g, want %.15g", v, want);
    ck_assert_msg(fabs(v - gift_metric_rel_l2(w_G, w_H, WR * WD)) > 1e-3,
                  "a non-trivial A should change the metric (got %g)", v);
}
END_TEST

START_TEST(test_whitened_dense)
{
    /* A = V diag(s) V^T, L = V diag((s + delta)^-1/2) V^T built directly. */
    double *V = rand_orthonormal(WD, WD, 5), s[WD], L[WD * WD], tr = 0.0, delta;
    float A[WD * WD];
    double v, want;
    int i, j, l;

    for (i = 0; i < WD; i++) {
        s[i] = 10.0 * pow(0.6, i);
        tr += s[i];
    }
    for (i = 0; i < WD; i++)
        for (j = 0; j < WD; j++) {
            double a = 0.0;

            for (l = 0; l < WD; l++)
                a += V[i * WD + l] * s[l] * V[j * WD + l];
            A[i * WD + j] = (float)a;
        }
    delta = 1e-2 * tr / WD;
    for (i = 0; i < WD; i++)
        for (j = 0; j < WD; j++) {
            double a = 0.0;

            for (l = 0; l < WD; l++)
                a += V[i * WD + l] * V[j * WD + l] / sqrt(s[l] + delta);
            L[i * WD + j] = a;
        }
    v = gift_metric_whitened(w_G, w_H, WR, WD, A, 1e-2);
    want = whitened_ref(w_G, w_H, L);
    /* A went through fp32: agreement to ~1e-6 relative. */
    ck_assert_msg(fabs(v - want) < 1e-5 * want, "whitened(dense) %.15g, want %.15g", v, want);
    free(V);
}
END_TEST

START_TEST(test_whitened_bad)
{
    float A[WD * WD] = {0};
    double v;

    v = gift_metric_whitened(w_G, w_H, WR, WD, A, 0.01); /* tr A = 0 */
    ck_assert_msg(v == GIFT_EINVAL, "zero A gave %g", v);
    A[0] = 1.0f;
    v = gift_metric_whitened(w_G, w_H, WR, WD, A, 0.0); /* singular, no damping */
    ck_assert_msg(v == GIFT_EINVAL, "singular A without damping gave %g", v);
    v = gift_metric_whitened(w_G, w_H, WR, WD, A, -1.0);
    ck_assert_msg(v == GIFT_EINVAL, "negative damping gave %g", v);
    v = gift_metric_whitened(NULL, w_H, WR, WD, A, 0.01);
    ck_assert_msg(v == GIFT_EINVAL, "NULL G gave %g", v);
    v = gift_metric_whitened(w_G, w_H, WR, 0, A, 0.01);
    ck_assert_msg(v == GIFT_EINVAL, "din 0 gave %g", v);
    v = gift_metric_whitened(w_G, w_H, 0, WD, A, 0.01);
    ck_assert_msg(v == 0.0, "rows 0 gave %g", v);
}
END_TEST

/* ||G L|| against the sum over a diagonal A worked directly. */
START_TEST(test_whitened_norm)
{
    float A[WD * WD] = {0};
    double tr = 0.0, delta, want = 0.0, v;
    int i, j;

    for (i = 0; i < WD; i++) {
        A[i * WD + i] = (float)(100.0 / (1 + i * i));
        tr += A[i * WD + i];
    }
    delta = 0.05 * tr / WD;
    for (i = 0; i < WR; i++)
        for (j = 0; j < WD; j++)
            want += (double)w_G[i * WD + j] * w_G[i * WD + j] / (A[j * WD + j] + delta);
    want = sqrt(want);
    v = gift_metric_whitened_norm(w_G, WR, WD, A, 0.05);
    ck_assert_msg(fabs(v - want) < 1e-10 * want, "whitened norm %.15g, want %.15g", v, want);
    v = gift_metric_whitened_norm(w_G, 0, WD, A, 0.05);
    ck_assert_msg(v == 0.0, "rows 0 gave %g", v);
    v = gift_metric_whitened_norm(NULL, WR, WD, A, 0.05);
    ck_assert_msg(v == GIFT_EINVAL, "NULL G gave %g", v);
    memset(A, 0, sizeof(A));
    v = gift_metric_whitened_norm(w_G, WR, WD, A, 0.05);
    ck_assert_msg(v == GIFT_EINVAL, "zero A gave %g", v);
}
END_TEST

/* ---- fp8 oracle prediction --------------------------------------------- */

/* A diagonal A: per-coordinate scaling is all whitening does, the ratio is 1. */
START_TEST(test_fp8_oracle_diagonal)
{
    float A[WD * WD] = {0};
    double v;
    int i;

    for (i = 0; i < WD; i++)
        A[i * WD + i] = (float)(100.0 / (1 + i * i));
    v = gift_metric_fp8_oracle(w_G, 1, WR, WD, A, 0.01);
    ck_assert_msg(fabs(v - 1.0) < 1e-12, "fp8 oracle with a diagonal A: %.15g, want 1", v);
}
END_TEST

/* din 2 by hand: A = [[2.5, 1.5], [1.5, 2.5]] (eigenvalues 4 and 1 at 45
 * degrees), no damping, so L^2 = A^-1 = [[0.625, -0.375], [-0.375, 0.625]].
 * g = (1, 1): g L^2 g = 0.5 against sum g_j^2 (L^2)_jj = 1.25, ratio
 * sqrt(0.4). A second worker g = (1, -1) adds 2.0 and 1.25: the sums give
 * sqrt(2.5 / 2.5) = 1, not the mean of the two ratios (0.949). */
START_TEST(test_fp8_oracle_hand)
{
    const float A[4] = {2.5f, 1.5f, 1.5f, 2.5f};
    const float G[4] = {1.0f, 1.0f, 1.0f, -1.0f};
    const float Z[4] = {0};
    double v;

    v = gift_metric_fp8_oracle(G, 1, 1, 2, A, 0.0);
    ck_assert_msg(fabs(v - sqrt(0.4)) < 1e-12, "one worker: %.15g, want %.15g", v, sqrt(0.4));
    v = gift_metric_fp8_oracle(G, 2, 1, 2, A, 0.0);
    ck_assert_msg(fabs(v - 1.0) < 1e-12, "two workers: %.15g, want 1", v);
    /* The same two gradients as one worker of two rows: the rows sum alike. */
    v = gift_metric_fp8_oracle(G, 1, 2, 2, A, 0.0);
    ck_assert_msg(fabs(v - 1.0) < 1e-12, "two rows: %.15g, want 1", v);
    v = gift_metric_fp8_oracle(Z, 2, 1, 2, A, 0.0);
    ck_assert_msg(v == 0.0, "zero gradients: %g, want 0", v);
}
END_TEST

START_TEST(test_fp8_oracle_bad)
{
    float A[WD * WD] = {0};
    double v;

    v = gift_metric_fp8_oracle(w_G, 1, WR, WD, A, 0.01); /* tr A = 0 */
    ck_assert_msg(v == GIFT_EINVAL, "zero A gave %g", v);
    A[0] = 1.0f;
    v = gift_metric_fp8_oracle(w_G, 1, WR, WD, A, 0.0); /* singular, no damping */
    ck_assert_msg(v == GIFT_EINVAL, "singular A without damping gave %g", v);
    v = gift_metric_fp8_oracle(w_G, 1, WR, WD, A, -1.0);
    ck_assert_msg(v == GIFT_EINVAL, "negative damping gave %g", v);
    v = gift_metric_fp8_oracle(NULL, 1, WR, WD, A, 0.01);
    ck_assert_msg(v == GIFT_EINVAL, "NULL G gave %g", v);
    v = gift_metric_fp8_oracle(w_G, 0, WR, WD, A, 0.01);
    ck_assert_msg(v == GIFT_EINVAL, "0 workers gave %g", v);
    v = gift_metric_fp8_oracle(w_G, 1, 0, WD, A, 0.01);
    ck_assert_msg(v == GIFT_EINVAL, "0 rows gave %g", v);
}
END_TEST

/* ---- Newton-Schulz and Muon --------------------------------------------- */

/* The five-step scalar map applied to one singular value x. */
static double ns5_scalar(double x)
{
    int i;

    for (i = 0; i < 5; i++) {
        double x2 = x * x;

        x = NS_A * x + NS_B * x * x2 + NS_C * x * x2 * x2;
    }
    return x;
}

START_TEST(test_ns5_orthogonal)
{
    /* Equal singular values: NS5(Q) = phi5(1/sqrt(m)) Q exactly in theory. */
    static const int shapes[3][2] = {{32, 32}, {16, 48}, {48, 16}};
    int t;

    for (t = 0; t < 3; t++) {
        int rows = shapes[t][0], din = shapes[t][1], m = rows < din ? rows : din;
        int big = rows > din ? rows : din, i, j;
        double *Q = rand_orthonormal(big, m, 10 + t), *out = malloc((size_t)rows * din * 8);
        float *G = malloc((size_t)rows * din * sizeof(float));
        double scale, worst = 0.0;

        /* Q is big x m with orthonormal columns: G = Q (tall) or Q^T (wide). */
        for (i = 0; i < rows; i++)
            for (j = 0; j < din; j++)
                G[i * din + j] = (float)(rows >= din ? Q[i * m + j] : Q[j * m + i]);
        ck_assert_int_eq(gift_ns5(G, rows, din, out), 0);
        {
            double fro = 0.0;

            for (i = 0; i < rows * din; i++)
                fro += (double)G[i] * G[i];
            scale = ns5_scalar(1.0 / (sqrt(fro) + 1e-7));
        }
        for (i = 0; i < rows * din; i++) {
            double e = fabs(out[i] - scale * G[i]);

            worst = e > worst ? e : worst;
        }
        ck_assert_msg(worst < 1e-6, "%dx%d: NS5(Q) - %.6f Q max entry %g", rows, din, scale, worst);
        ck_assert_msg(scale > 0.5 && scale < 1.3, "%dx%d: phi5(1/sqrt(%d)) = %g", rows, din, m,
                      scale);
        free(Q);
        free(out);
        free(G);
    }
}
END_TEST

START_TEST(test_ns5_band)
{
    /* The five-step quintic maps every normalised singular value in
     * [0.02, 1] into [0.6818, 1.1344] (a scan of the scalar map; it reaches
     * 1.2015 near x = 0.004 and falls below 0.5 under x = 0.001, so no band
     * holds for nearly rank-deficient input). A Gaussian matrix that is not
     * square has its normalised singular values well inside [0.02, 1]. */
    static const int shapes[3][2] = {{64, 256}, {256, 64}, {96, 160}};
    int t, i;

    for (t = 0; t < 3; t++) {
        int rows = shapes[t][0], din = shapes[t][1], m = rows < din ? rows : din;
        size_t n = (size_t)rows * din;
        float *G = rand_floats(n, 20 + t);
        double *out = malloc(n * sizeof(double)), *Gd = malloc(n * sizeof(double)), *sv, *svg;
        double fro = 0.0;

        for (i = 0; i < (int)n; i++) {
            Gd[i] = G[i];
            fro += Gd[i] * Gd[i];
        }
        svg = singular_values(Gd, rows, din);
        ck_assert_msg(svg[m - 1] / sqrt(fro) > 0.02, "%dx%d: input sigma_min/||G|| = %g", rows, din,
                      svg[m - 1] / sqrt(fro));
        ck_assert_int_eq(gift_ns5(G, rows, din, out), 0);
        sv = singular_values(out, rows, din);
        fprintf(stderr, "ns5 %dx%d: input sv/||G|| in [%.4f, %.4f], output sv in [%.4f, %.4f]\n",
                rows, din, svg[m - 1] / sqrt(fro), svg[0] / sqrt(fro), sv[m - 1], sv[0]);
        ck_assert_msg(sv[m - 1] > 0.68 && sv[0] < 1.135,
                      "%dx%d: NS5 singular values in [%g, %g], want inside [0.68, 1.135]", rows,
                      din, sv[m - 1], sv[0]);
        free(G);
        free(out);
        free(sv);
        free(svg);
        free(Gd);
    }
}
END_TEST

START_TEST(test_ns5_spectrum)
{
    /* G = P diag(s) R^T with chosen s: NS5(G) = P diag(phi5(s / ||s||)) R^T,
     * including values below the band (s / ||s|| = 1e-3 stays near 0.47). */
    enum { M = 12, N = 30 };
    double *P = rand_orthonormal(M, M, 70), *R = rand_orthonormal(N, M, 71), s[M], fro = 0.0;
    double out[M * N], want[M * N], worst = 0.0, scale = 0.0;
    float G[M * N];
    int i, j, l;

    for (l = 0; l < M; l++)
        s[l] = pow(10.0, -3.0 * l / (M - 1)); /* 1 down to 1e-3 */
    for (l = 0; l < M; l++)
        fro += s[l] * s[l];
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double g = 0.0, w = 0.0;

            for (l = 0; l < M; l++) {
                g += P[i * M + l] * s[l] * R[j * M + l];
                w += P[i * M + l] * ns5_scalar(s[l] / (sqrt(fro) + 1e-7)) * R[j * M + l];
            }
            G[i * N + j] = (float)g;
            want[i * N + j] = w;
            scale = fabs(w) > scale ? fabs(w) : scale;
        }
    ck_assert_int_eq(gift_ns5(G, M, N, out), 0);
    for (i = 0; i < M * N; i++) {
        double e = fabs(out[i] - want[i]);

        worst = e > worst ? e : worst;
    }
    /* G went through fp32 and phi5 has slopes up to ~400 at x ~ 1e-3. */
    ck_assert_msg(worst < 1e-4 * scale, "NS5 vs P phi5(s) R^T: max error %g (scale %g)", worst,
                  scale);
    free(P);
    free(R);
}
END_TEST

START_TEST(test_ns5_transpose_and_scale)
{
    enum { R = 20, D = 36 };
    float *G = rand_floats(R * D, 40), GT[R * D], G2[R * D];
    double a[R * D], b[R * D], c[R * D], worst_t = 0.0, worst_s = 0.0;
    int i, j;

    for (i = 0; i < R; i++)
        for (j = 0; j < D; j++) {
            GT[j * R + i] = G[i * D + j];
            G2[i * D + j] = 8.0f * G[i * D + j];
        }
    ck_assert_int_eq(gift_ns5(G, R, D, a), 0);
    ck_assert_int_eq(gift_ns5(GT, D, R, b), 0);
    ck_assert_int_eq(gift_ns5(G2, R, D, c), 0);
    for (i = 0; i < R; i++)
        for (j = 0; j < D; j++) {
            double et = fabs(a[i * D + j] - b[j * R + i]), es = fabs(a[i * D + j] - c[i * D + j]);

            worst_t = et > worst_t ? et : worst_t;
            worst_s = es > worst_s ? es : worst_s;
        }
    ck_assert_msg(worst_t < 1e-12, "NS5(G^T) vs NS5(G)^T: %g", worst_t);
    ck_assert_msg(worst_s < 1e-6, "NS5(8G) vs NS5(G): %g", worst_s);
    ck_assert_int_eq(gift_ns5(NULL, R, D, a), GIFT_EINVAL);
    ck_assert_int_eq(gift_ns5(G, 0, D, a), GIFT_EINVAL);
    ck_assert_int_eq(gift_ns5(G, R, D, NULL), GIFT_EINVAL);
    free(G);
}
END_TEST

START_TEST(test_muon)
{
    enum { R = 32, D = 80 };
    float *G = rand_floats(R * D, 60), *H = rand_floats(R * D, 61);
    double v, v2;
    int i;

    v = gift_metric_muon(G, G, R, D);
    ck_assert_msg(v == 0.0, "muon(G, G) = %g", v);
    for (i = 0; i < R * D; i++)
        H[i] = G[i] + 1e-2f * H[i];
    v = gift_metric_muon(G, H, R, D);
    ck_assert_msg(v > 0.0 && v < 0.1, "muon(G, G + 1%% noise) = %g", v);
    for (i = 0; i < R * D; i++)
        H[i] = G[i] + 9.0f * (H[i] - G[i]);
    v2 = gift_metric_muon(G, H, R, D);
    ck_assert_msg(v2 > v, "muon error should grow with the noise: %g then %g", v, v2);
    v = gift_metric_muon(G, H, 0, D);
    ck_assert_msg(v == GIFT_EINVAL, "rows 0 gave %g", v);
    v = gift_metric_muon(G, NULL, R, D);
    ck_assert_msg(v == GIFT_EINVAL, "NULL gave %g", v);
    free(G);
    free(H);
}
END_TEST

static Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *basic = tcase_create("basic"), *white = tcase_create("whitened");
    TCase *ns = tcase_create("ns5");

    tcase_add_test(basic, test_rel_l2_cosine);
    tcase_add_test(basic, test_rel_l2_double_accumulation);
    suite_add_tcase(s, basic);

    tcase_add_checked_fixture(white, w_setup, w_teardown);
    tcase_add_test(white, test_whitened_identity);
    tcase_add_test(white, test_whitened_diagonal);
    tcase_add_test(white, test_whitened_dense);
    tcase_add_test(white, test_whitened_bad);
    tcase_add_test(white, test_whitened_norm);
    tcase_add_test(white, test_fp8_oracle_diagonal);
    tcase_add_test(white, test_fp8_oracle_hand);
    tcase_add_test(white, test_fp8_oracle_bad);
    suite_add_tcase(s, white);

    tcase_add_test(ns, test_ns5_orthogonal);
    tcase_add_test(ns, test_ns5_band);
    tcase_add_test(ns, test_ns5_spectrum);
    tcase_add_test(ns, test_ns5_transpose_and_scale);
    tcase_add_test(ns, test_muon);
    suite_add_tcase(s, ns);
    return s;
}

int main(void)
{
    return gift_test_run(metrics_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
