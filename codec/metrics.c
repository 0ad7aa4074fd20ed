/*
 * metrics.c: fidelity metrics (RelL2, cosine, the whitened error and the
 * error of Muon's Newton-Schulz update; docs/ARCHITECTURE.md, "Codec
 * formats"). These are diagnostics: they work in double precision and
 * allocate freely.
 */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"

/* Muon's quintic Newton-Schulz coefficients and step count. */
#define GIFT__NS_A 3.4445
#define GIFT__NS_B (-4.7750)
#define GIFT__NS_C 2.0315
#define GIFT__NS_STEPS 5
#define GIFT__NS_EPS 1e-7

/* num / den for two norms: 0 when both are zero, +Inf when only den is. */
static double gift__ratio(double num, double den)
{
    if (den > 0.0)
        return num / den;
    return num > 0.0 ? INFINITY : 0.0;
}

/*
 * gift_metric_rel_l2: ||Gh - G||_F / ||G||_F over n elements, accumulated in
 * double. 0 when both are zero, +Inf when only G is; (double)GIFT_EINVAL for a
 * NULL pointer with n > 0. NaN in the input gives NaN.
 */
double gift_metric_rel_l2(const float *G, const float *Gh, size_t n)
{
    double num = 0.0, den = 0.0;
    size_t i;

    if (n == 0)
        return 0.0;
    if (G == NULL || Gh == NULL)
        return (double)GIFT_EINVAL;
    for (i = 0; i < n; i++) {
        double g = G[i], e = (double)Gh[i] - g;

        num += e * e;
        den += g * g;
    }
    return gift__ratio(sqrt(num), sqrt(den));
}

/*
 * gift_metric_cosine: <G, Gh> / (||G|| ||Gh||), accumulated in double. When a
 * norm is zero: 1 if both are zero (identical), else 0. NaN for a NULL
 * pointer with n > 0 (no error code fits: every value in [-1, 1] is valid).
 */
double gift_metric_cosine(const float *G, const float *Gh, size_t n)
{
    double dot = 0.0, ng = 0.0, nh = 0.0;
    size_t i;

    if (n == 0)
        return 1.0;
    if (G == NULL || Gh == NULL)
        return NAN;
    for (i = 0; i < n; i++) {
        double g = G[i], h = Gh[i];

        dot += g * h;
        ng += g * g;
        nh += h * h;
    }
    if (ng == 0.0 || nh == 0.0)
        return ng == nh ? 1.0 : 0.0;
    return dot / (sqrt(ng) * sqrt(nh));
}

/*
 * gift__whiten_eig: the eigensystem of the damped covariance for the whitened
 * metrics. A (din x din, row-major) is symmetrised into V, delta = damping
 * tr(A) / din, and LAPACKE_dsyevd leaves the eigenvectors in V's columns
 * (column-major: V[i + k din] is element i of vector k) and in w[k]
 * 1 / (lambda_k + delta), eigenvalues below zero (rounding) counted as zero.
 * Returns 0, GIFT_EINVAL (tr A <= 0 or not finite, bad damping, or A + delta I
 * not positive definite) or GIFT_ELAPACK.
 */
static int gift__whiten_eig(const float *A, int din, double damping, double *V, double *w)
{
    size_t nd = (size_t)din, i, j;
    double tr = 0.0, delta;

    if (!isfinite(damping) || damping < 0.0)
        return GIFT_EINVAL;
    for (i = 0; i < nd; i++) {
        tr += A[i * nd + i];
        for (j = 0; j < nd; j++)
            V[j * nd + i] = 0.5 * ((double)A[i * nd + j] + A[j * nd + i]);
    }
    if (!(tr > 0.0) || !isfinite(tr))
        return GIFT_EINVAL;
    delta = damping * tr / (double)din;
    if (LAPACKE_dsyevd(LAPACK_COL_MAJOR, 'V', 'U', din, V, din, w) != 0)
        return GIFT_ELAPACK;
    for (j = 0; j < nd; j++) {
        double e = (w[j] > 0.0 ? w[j] : 0.0) + delta;

        if (!(e > 0.0))
            return GIFT_EINVAL;
        w[j] = 1.0 / e;
    }
    return 0;
}

/* One buffer for the whitened metrics: V (din x din), then w (din), then
 * `extra` doubles of scratch, with V and w filled by gift__whiten_eig. Returns
 * it (free() it) or NULL with *rc set (GIFT_ENOMEM or gift__whiten_eig's code). */
static double *gift__whiten_alloc(const float *A, int din, double damping, size_t extra, int *rc)
{
    size_t nd = (size_t)din;
    double *V = malloc((nd * nd + nd + extra) * sizeof(double));

    if (V == NULL) {
        *rc = GIFT_ENOMEM;
        return NULL;
    }
    if ((*rc = gift__whiten_eig(A, din, damping, V, V + nd * nd)) < 0) {
        free(V);
        return NULL;
    }
    return V;
}

/* Sum over rows x din of (X V)_ij^2 w_j, X row-major double, V and w from
 * gift__whiten_eig: ||X L||^2 with L^2 = V diag(w) V^T. XV: rows x din scratch. */
static double gift__whitened_sq(const double *X, int rows, int din, const double *V,
                                const double *w, double *XV)
{
    size_t nd = (size_t)din, n = (size_t)rows * nd, i;
    double s = 0.0;

    /* V is column-major: row-major V^T. Hence CblasTrans. */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, din, din, 1.0, X, din, V, din, 0.0,
                XV, din);
    for (i = 0; i < n; i++)
        s += XV[i] * XV[i] * w[i % nd];
    return s;
}

/* The whitened squared norms: *den = ||G L||^2 and, when Gh is not NULL,
 * *num = ||(Gh - G) L||^2. Returns 0 or a negative code, as gift_metric_whitened. */
static int gift__whitened_norms(const float *G, const float *Gh, int rows, int din, const float *A,
                                double damping, double *num, double *den)
{
    double *V, *w, *X;
    size_t i, nd, nx;
    int rc;

    *num = *den = 0.0;
    if (G == NULL || A == NULL || rows < 0 || din < 1)
        return GIFT_EINVAL;
    if (!isfinite(damping) || damping < 0.0)
        return GIFT_EINVAL;
    if (rows == 0)
        return 0;
    nd = (size_t)din;
    nx = (size_t)rows * nd;
    if ((V = gift__whiten_alloc(A, din, damping, 2 * nx, &rc)) == NULL)
        return rc;
    w = V + nd * nd;
    X = w + nd; /* rows x din row-major, then the product's scratch */
    for (i = 0; i < nx; i++)
        X[i] = G[i];
    *den = gift__whitened_sq(X, rows, din, V, w, X + nx);
    if (Gh != NULL) {
        for (i = 0; i < nx; i++)
            X[i] = (double)Gh[i] - (double)G[i];
        *num = gift__whitened_sq(X, rows, din, V, w, X + nx);
    }
    free(V);
    return 0;
}

/*
 * gift_metric_whitened: ||(Gh - G) L||_F / ||G L||_F with L = (A + delta I)^-1/2,
 * delta = damping tr(A) / din, A (din x din, row-major) symmetrised first.
 * L = V diag((lambda + delta)^-1/2) V^T from LAPACKE_dsyevd; since V is
 * orthogonal, ||X L|| = ||X V diag(.)|| and only X V is formed (cblas_dgemm).
 * Eigenvalues below zero (rounding) count as zero. Returns the ratio (0 for
 * rows == 0), or GIFT_EINVAL (bad arguments, tr A <= 0, or A + delta I not
 * positive definite), GIFT_ENOMEM, GIFT_ELAPACK.
 */
double gift_metric_whitened(const float *G, const float *Gh, int rows, int din, const float *A,
                            double damping)
{
    double num, den;
    int rc;

    if (Gh == NULL)
        return GIFT_EINVAL;
    if ((rc = gift__whitened_norms(G, Gh, rows, din, A, damping, &num, &den)) < 0)
        return rc;
    return gift__ratio(sqrt(num), sqrt(den));
}

/*
 * gift_metric_whitened_norm: ||G L||_F with L = (A + delta I)^-1/2 as in
 * gift_metric_whitened (the size of G in that metric, e.g. to weigh layers
 * against each other). Returns it (0 for rows == 0) or a negative code as
 * gift_metric_whitened.
 */
double gift_metric_whitened_norm(const float *G, int rows, int din, const float *A, double damping)
{
    double num, den;
    int rc;

    if ((rc = gift__whitened_norms(G, NULL, rows, din, A, damping, &num, &den)) < 0)
        return rc;
    return sqrt(den);
}

/*
 * gift_metric_fp8_oracle: what fp8's relative error predicts for GIFT with the
 * geometry of A itself (T = L = (A + delta I)^-1/2) over Euclidean coding, in
 * the whitened metric of A. A floating-point code errs by about a fixed
 * fraction of each element, so worker w's Euclidean error is about
 * eps^2 sum_ij G_w,ij^2 (L^2)_jj and GIFT's eps^2 ||G_w L||^2; summed over the
 * W workers (G: W x rows x din, row-major),
 *   sqrt(sum_w ||G_w L||^2 / sum_w sum_ij G_w,ij^2 (L^2)_jj).
 * 1 when A is diagonal: per-coordinate scaling is then all whitening does.
 * Returns the ratio (0 when every G_w is zero), or GIFT_EINVAL, GIFT_ENOMEM,
 * GIFT_ELAPACK as gift_metric_whitened.
 */
double gift_metric_fp8_oracle(const float *G, int W, int rows, int din, const float *A,
                              double damping)
{
    double *V, *w, *diag, *X, num = 0.0, den = 0.0;
    size_t i, k, nd, nx;
    int rc;

    if (G == NULL || A == NULL || W < 1 || rows < 1 || din < 1)
        return GIFT_EINVAL;
    nd = (size_t)din;
    nx = (size_t)rows * nd;
    if ((V = gift__whiten_alloc(A, din, damping, nd + 2 * nx, &rc)) == NULL)
        return rc;
    w = V + nd * nd;
    diag = w + nd;
    X = diag + nd;
    for (i = 0; i < nd; i++) { /* (L^2)_ii = sum_k V_ik^2 w_k */
        diag[i] = 0.0;
        for (k = 0; k < nd; k++)
            diag[i] += V[i + k * nd] * V[i + k * nd] * w[k];
    }
    for (int wk = 0; wk < W; wk++) {
        const float *Gw = G + (size_t)wk * nx;

        for (i = 0; i < nx; i++) {
            X[i] = Gw[i];
            den += X[i] * X[i] * diag[i % nd];
        }
        num += gift__whitened_sq(X, rows, din, V, w, X + nx);
    }
    free(V);
    return gift__ratio(sqrt(num), sqrt(den));
}

/*
 * gift_ns5: Muon's orthogonalisation. X = G / (||G||_F + 1e-7) in double,
 * worked on as m x n with m = min(rows, din) (G^T when rows > din); five steps
 * of A = X X^T, B = b A + c A A, X = a X + B X with cblas_dgemm; the result,
 * transposed back, goes to out (rows x din, row-major double). Returns 0,
 * GIFT_EINVAL or GIFT_ENOMEM.
 */
int gift_ns5(const float *G, int rows, int din, double *out)
{
    double *buf, *X, *Xn, *Am, *Bm, *t, norm = 0.0;
    size_t i, j, nx;
    int m, n, tall, step, rc = GIFT_EINVAL;

    if (G == NULL || out == NULL || rows < 1 || din < 1)
        goto out;
    tall = rows > din;
    m = tall ? din : rows;
    n = tall ? rows : din;
    nx = (size_t)rows * din;

    rc = GIFT_ENOMEM;
    if ((buf = malloc((2 * nx + 2 * (size_t)m * m) * sizeof(double))) == NULL)
        goto out;
    X = buf;
    Xn = X + nx;
    Am = Xn + nx;
    Bm = Am + (size_t)m * m;

    for (i = 0; i < nx; i++)
        norm += (double)G[i] * G[i];
    norm = sqrt(norm) + GIFT__NS_EPS;
    for (i = 0; i < (size_t)rows; i++)
        for (j = 0; j < (size_t)din; j++) {
            double v = G[i * din + j] / norm;

            if (tall)
                X[j * rows + i] = v;
            else
                X[i * din + j] = v;
        }

    for (step = 0; step < GIFT__NS_STEPS; step++) {
        /* A = X X^T; B = b A + c A A; Xn = a X + B X. */
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0, X, n, X, n, 0.0, Am, m);
        for (i = 0; i < (size_t)m * m; i++)
            Bm[i] = GIFT__NS_B * Am[i];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, GIFT__NS_C, Am, m, Am, m,
                    1.0, Bm, m);
        for (i = 0; i < nx; i++)
            Xn[i] = GIFT__NS_A * X[i];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0, Bm, m, X, n, 1.0, Xn,
                    n);
        t = X;
        X = Xn;
        Xn = t;
    }

    for (i = 0; i < (size_t)rows; i++)
        for (j = 0; j < (size_t)din; j++)
            out[i * din + j] = tall ? X[j * rows + i] : X[i * din + j];
    free(buf);
    rc = 0;
out:
    return rc;
}

/*
 * gift_metric_muon: ||NS5(Gh) - NS5(G)||_F / ||NS5(G)||_F (0 when both are
 * zero). Returns the ratio or GIFT_EINVAL / GIFT_ENOMEM.
 */
double gift_metric_muon(const float *G, const float *Gh, int rows, int din)
{
    double *P = NULL, *Ph, num = 0.0, den = 0.0;
    size_t i, nx;
    double rc = GIFT_EINVAL;
    int r;

    if (G == NULL || Gh == NULL || rows < 1 || din < 1)
        goto out;
    nx = (size_t)rows * din;
    rc = GIFT_ENOMEM;
    if ((P = malloc(2 * nx * sizeof(double))) == NULL)
        goto out;
    Ph = P + nx;
    if ((r = gift_ns5(G, rows, din, P)) < 0 || (r = gift_ns5(Gh, rows, din, Ph)) < 0) {
        rc = r;
        goto out_free_p;
    }
    for (i = 0; i < nx; i++) {
        double e = Ph[i] - P[i];

        num += e * e;
        den += P[i] * P[i];
    }
    rc = gift__ratio(sqrt(num), sqrt(den));
out_free_p:
    free(P);
out:
    return rc;
}
