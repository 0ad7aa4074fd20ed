/*
 * geometry.c: the GIFT geometry (docs/ARCHITECTURE.md, "The transform"). Rank policy, the
 * random starting basis, the stable Nystrom update from summed sketches, the
 * sketch itself, the transform T = c I + U_k diag(d) U_k^T and its inverse,
 * and error feedback in transformed coordinates.
 *
 * All dense algebra goes through cblas and LAPACKE. The update works in
 * double precision on column-major buffers kept in g->ws, so that neither
 * LAPACKE (which transposes row-major input into fresh memory) nor this file
 * allocates after gift_geometry_init.
 */
#include <cblas.h>
#include <float.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"

/* The Nystrom shift. Sketches arrive in fp32, so Q^T Y carries noise of about
 * FLT_EPSILON * ||Y||_F (more after fp32 GEMMs and sums over workers). A shift
 * below that noise lets a rank-deficient A produce a Cholesky factor with
 * tiny pivots, and C^-1 then amplifies the noise into the Ritz values (with a
 * double-precision shift, lambda_0 of a rank-3 A came out 1.4% high). So nu
 * starts at GIFT__NU_REL * sqrt(din) * ||Y||_F and grows tenfold after each
 * failed Cholesky while it stays below GIFT__NU_MAX_REL * ||Y||_F; a sketch
 * that needs more is not a sketch of a PSD matrix. The shift is subtracted
 * again from the Ritz values and biases only the part of A that Q misses. */
#define GIFT__NU_REL 1.1920928955078125e-07 /* FLT_EPSILON */
#define GIFT__NU_GROWTH 10.0
#define GIFT__NU_MAX_REL 1e-3

/* Update workspace, all column-major doubles. */
typedef struct gift__geo_ws {
    double *Q;         /* din x ks: the sketch basis, later the new U */
    double *B;         /* din x ks: Y + nu Q, then Y_nu C^-1, then its Q factor */
    double *M;         /* ks x ks: Q^T Y_nu, its Cholesky factor, then R R^T / eigvecs */
    double *R;         /* ks x ks: the R factor of B */
    double *tau;       /* ks: Householder scalars, then lambda in descending order */
    double *w;         /* ks: eigenvalues of R R^T, ascending */
    double *work;      /* lwork doubles for dgeqrf/dorgqr/dsyevd */
    lapack_int *iwork; /* liwork ints for dsyevd */
    lapack_int lwork, liwork;
} gift__geo_ws_t;

int gift_rank_default(int rows, int din)
{
    int k;

    if (rows < 1 || din < 1)
        return GIFT_EINVAL;
    if (din <= 256)
        return din;
    k = din / 4 + (din % 4 != 0); /* ceil(din / 4) */
    k = (k + 15) / 16 * 16;
    if (k < 64)
        k = 64;
    if (k > 512)
        k = 512;
    return k < din ? k : din;
}

int gift_basis_cols(int din, int k, int oversample)
{
    long ks;

    if (din < 1 || k < 1 || k > din || oversample < 0)
        return GIFT_EINVAL;
    ks = (long)k + oversample;
    return ks < din ? (int)ks : din;
}

/* splitmix64: the seed stream for the random starting basis. */
static uint64_t gift__splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A uniform double in the open interval (0, 1). */
static double gift__uniform(uint64_t *s)
{
    return ((double)(gift__splitmix64(s) >> 11) + 0.5) * 0x1.0p-53;
}

/* Fills n doubles with standard normals (Box-Muller), a pure function of seed. */
static void gift__gaussians(double *x, size_t n, uint64_t seed)
{
    const double two_pi = 6.283185307179586;
    uint64_t s = seed;
    size_t i;

    for (i = 0; i < n; i += 2) {
        double u1 = gift__uniform(&s), u2 = gift__uniform(&s);
        double r = sqrt(-2.0 * log(u1));

        x[i] = r * cos(two_pi * u2);
        if (i + 1 < n)
            x[i + 1] = r * sin(two_pi * u2);
    }
}

static void gift__ws_free(gift__geo_ws_t *ws)
{
    if (ws == NULL)
        return;
    free(ws->iwork);
    free(ws->Q);
    free(ws);
}

/* Allocates the update workspace for din x ks, sizing the LAPACK work arrays
 * by workspace queries. Returns NULL on allocation or query failure. */
static gift__geo_ws_t *gift__ws_alloc(int din, int ks)
{
    gift__geo_ws_t *ws;
    double dummy[1] = {0.0}, q = 0.0, qe = 0.0;
    lapack_int qi = 0, lw;
    size_t dks = (size_t)din * ks, kk = (size_t)ks * ks;

    if ((ws = calloc(1, sizeof(*ws))) == NULL)
        goto out;
    /* Workspace queries: lwork = -1 touches no matrix. */
    if (LAPACKE_dgeqrf_work(LAPACK_COL_MAJOR, din, ks, dummy, din, dummy, &q, -1) != 0)
        goto out_free_ws;
    lw = (lapack_int)q;
    if (LAPACKE_dorgqr_work(LAPACK_COL_MAJOR, din, ks, ks, dummy, din, dummy, &q, -1) != 0)
        goto out_free_ws;
    if ((lapack_int)q > lw)
        lw = (lapack_int)q;
    if (LAPACKE_dsyevd_work(LAPACK_COL_MAJOR, 'V', 'U', ks, dummy, ks, dummy, &qe, -1, &qi, -1) !=
        0)
        goto out_free_ws;
    if ((lapack_int)qe > lw)
        lw = (lapack_int)qe;
    ws->lwork = lw > 1 ? lw : 1;
    ws->liwork = qi > 1 ? qi : 1;

    ws->Q = malloc((2 * dks + 2 * kk + 2 * (size_t)ks + (size_t)ws->lwork) * sizeof(double));
    if (ws->Q == NULL)
        goto out_free_ws;
    ws->B = ws->Q + dks;
    ws->M = ws->B + dks;
    ws->R = ws->M + kk;
    ws->tau = ws->R + kk;
    ws->w = ws->tau + ks;
    ws->work = ws->w + ks;
    if ((ws->iwork = malloc((size_t)ws->liwork * sizeof(lapack_int))) == NULL)
        goto out_free_ws;
    return ws;

out_free_ws:
    gift__ws_free(ws);
out:
    return NULL;
}

/* Sets the scalars of the identity transform: c = c_inv = 1, d = d_inv = 0. */
static void gift__set_identity(gift_geometry_t *g)
{
    g->identity = 1;
    g->dense_on = 0;
    g->sigma2 = 0.0;
    g->delta = 0.0;
    g->c = 1.0f;
    g->c_inv = 1.0f;
    memset(g->d, 0, (size_t)g->k * sizeof(float));
    memset(g->d_inv, 0, (size_t)g->k * sizeof(float));
    memset(g->lambda, 0, (size_t)g->ks * sizeof(float));
}

size_t gift_geometry_dense_floats(int din, int k)
{
    if (din < 1 || k < 1 || k > din || din > GIFT_DENSE_MAX_DIN || 2 * k < din)
        return 0;
    return (2 * (size_t)din + (size_t)k) * (size_t)din;
}

double gift_transform_flops(double rows, int din, int k)
{
    if (!(rows >= 0.0) || din < 1 || k < 1 || k > din)
        return 0.0;
    if (gift_geometry_dense_floats(din, k) > 0)
        return 4.0 * rows * din * (double)din;
    return 8.0 * rows * din * (double)k;
}

/* Forms the dense T = c I + U_k diag(d) U_k^T and T^-1 (c_inv, d_inv) in
 * g->dense from the epoch's U, d and c, where g has the buffer and its rank
 * wants it (gift_geometry_dense_floats); sets dense_on. One fp32 product each
 * (2 din^2 k flops), once per epoch. The buffer was sized for the rank g was
 * allocated with; a lowered rank needs less scratch. */
static void gift__dense_set(gift_geometry_t *g)
{
    size_t n = (size_t)g->din, k = (size_t)g->k, i, j;
    float *S;

    g->dense_on = 0;
    if (g->dense == NULL || g->identity || gift_geometry_dense_floats(g->din, g->k) == 0)
        return;
    S = g->dense + 2 * n * n;
    for (int inv = 0; inv < 2; inv++) {
        float *T = g->dense + (size_t)inv * n * n;
        const float *d = inv ? g->d_inv : g->d;
        float c = inv ? g->c_inv : g->c;

        for (i = 0; i < n; i++)
            for (j = 0; j < k; j++)
                S[i * k + j] = g->U[i * (size_t)g->ks + j] * d[j];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)k, 1.0f, S,
                    (int)k, g->U, g->ks, 0.0f, T, (int)n);
        for (i = 0; i < n; i++)
            T[i * n + i] += c;
    }
    g->dense_on = 1;
}

/*
 * gift_geometry_init: allocates every buffer of g for (din, k, ks) once,
 * including the update workspace, and sets epoch 0: the identity transform
 * with a random orthonormal basis U that is a pure function of seed (for one
 * BLAS/LAPACK build). g is zeroed first, so gift_geometry_free is safe after
 * any failure. Returns 0, GIFT_EINVAL (bad sizes), GIFT_ENOMEM or GIFT_ELAPACK.
 */
static int gift__geometry_init(gift_geometry_t *g, int din, int k, int ks, uint64_t seed, int dense)
{
    gift__geo_ws_t *ws;
    size_t dks, i, j;
    int rc = GIFT_EINVAL;

    if (g == NULL)
        goto out;
    memset(g, 0, sizeof(*g));
    if (din < 1 || k < 1 || k > ks || ks > din)
        goto out;
    g->din = din;
    g->k = k;
    g->ks = ks;
    dks = (size_t)din * ks;
    rc = GIFT_ENOMEM;
    g->U = malloc(dks * sizeof(float));
    g->lambda = malloc((size_t)ks * sizeof(float));
    g->d = malloc((size_t)k * sizeof(float));
    g->d_inv = malloc((size_t)k * sizeof(float));
    if (g->U == NULL || g->lambda == NULL || g->d == NULL || g->d_inv == NULL)
        goto out_free_g;
    if (dense && gift_geometry_dense_floats(din, k) > 0 &&
        (g->dense = malloc(gift_geometry_dense_floats(din, k) * sizeof(float))) == NULL)
        goto out_free_g;
    if ((ws = gift__ws_alloc(din, ks)) == NULL)
        goto out_free_g;
    g->ws = ws;

    /* Q = qr(Gaussian din x ks), column-major in ws->Q. */
    rc = GIFT_ELAPACK;
    gift__gaussians(ws->Q, dks, seed);
    if (LAPACKE_dgeqrf_work(LAPACK_COL_MAJOR, din, ks, ws->Q, din, ws->tau, ws->work, ws->lwork) !=
        0)
        goto out_free_g;
    if (LAPACKE_dorgqr_work(LAPACK_COL_MAJOR, din, ks, ks, ws->Q, din, ws->tau, ws->work,
                            ws->lwork) != 0)
        goto out_free_g;
    for (i = 0; i < (size_t)din; i++)
        for (j = 0; j < (size_t)ks; j++)
            g->U[i * ks + j] = (float)ws->Q[j * din + i];

    gift__set_identity(g);
    g->trace = 0.0;
    g->epoch = 0;
    return 0;

out_free_g:
    gift_geometry_free(g);
out:
    return rc;
}

int gift_geometry_init(gift_geometry_t *g, int din, int k, int ks, uint64_t seed)
{
    return gift__geometry_init(g, din, k, ks, seed, 1);
}

int gift_geometry_init_thin(gift_geometry_t *g, int din, int k, int ks, uint64_t seed)
{
    return gift__geometry_init(g, din, k, ks, seed, 0);
}

void gift_geometry_free(gift_geometry_t *g)
{
    if (g == NULL)
        return;
    free(g->U);
    free(g->lambda);
    free(g->d);
    free(g->d_inv);
    free(g->dense);
    gift__ws_free(g->ws);
    memset(g, 0, sizeof(*g));
}

/*
 * gift_geometry_copy: copies the published state of src (U, lambda, d, d_inv
 * and the scalars) into dst, which must have been initialised with the same
 * din, k and ks; dst keeps its own workspace. Returns 0 or GIFT_EINVAL.
 */
int gift_geometry_copy(gift_geometry_t *dst, const gift_geometry_t *src)
{
    if (dst == NULL || src == NULL || dst->U == NULL || src->U == NULL)
        return GIFT_EINVAL;
    if (dst == src)
        return 0;
    if (dst->din != src->din || dst->k != src->k || dst->ks != src->ks)
        return GIFT_EINVAL;
    memcpy(dst->U, src->U, (size_t)src->din * src->ks * sizeof(float));
    memcpy(dst->lambda, src->lambda, (size_t)src->ks * sizeof(float));
    memcpy(dst->d, src->d, (size_t)src->k * sizeof(float));
    memcpy(dst->d_inv, src->d_inv, (size_t)src->k * sizeof(float));
    dst->trace = src->trace;
    dst->sigma2 = src->sigma2;
    dst->delta = src->delta;
    dst->c = src->c;
    dst->c_inv = src->c_inv;
    dst->epoch = src->epoch;
    dst->identity = src->identity;
    gift__dense_set(dst);
    return 0;
}

/* True if the positive double x converts to a normal float (converting a
 * double beyond FLT_MAX is undefined behaviour; NaN fails too). */
static int gift__fits_float(double x)
{
    return x >= FLT_MIN && x <= FLT_MAX;
}

/* Checks that sigma2, delta and the first k lambdas (ld in double, or else
 * lf in float) give a transform whose scalars are normal floats (T and T^-1
 * both non-singular). Returns 0 or GIFT_EINVAL. */
static int gift__scalars_check(const double *ld, const float *lf, size_t k, double sigma2,
                               double delta)
{
    double base = sigma2 + delta;
    size_t j;

    if (!gift__fits_float(1.0 / sqrt(base)) || !gift__fits_float(sqrt(base)))
        return GIFT_EINVAL;
    for (j = 0; j < k; j++) {
        double e = (ld != NULL ? ld[j] : (double)lf[j]) + delta;

        if (!gift__fits_float(1.0 / sqrt(e)) || !gift__fits_float(sqrt(e)))
            return GIFT_EINVAL;
    }
    return 0;
}

/* Sets c, d, c_inv, d_inv from g->lambda (float), sigma2 and delta: the one
 * formula shared by gift_geometry_update and gift_geometry_load. */
static void gift__scalars_set(gift_geometry_t *g, double sigma2, double delta)
{
    double base = sigma2 + delta;
    int j;

    g->c = (float)(1.0 / sqrt(base));
    g->c_inv = (float)sqrt(base);
    for (j = 0; j < g->k; j++) {
        double e = (double)g->lambda[j] + delta;

        g->d[j] = (float)(1.0 / sqrt(e) - 1.0 / sqrt(base));
        g->d_inv[j] = (float)(sqrt(e) - sqrt(base));
    }
}

/*
 * gift_geometry_update: builds the next epoch from the summed sketch
 * Y = sum_r A_r Q (din x ks, row-major fp32, Q = g->U) and the summed trace.
 * It is gift_geometry_update_decay with decay 0.
 */
int gift_geometry_update(gift_geometry_t *g, const float *Y, double trace, double damping)
{
    return gift_geometry_update_decay(g, Y, trace, damping, 0.0);
}

/*
 * gift_geometry_update_decay: builds the next epoch from the summed sketch
 * Y = sum_r A_r Q (din x ks, row-major fp32, Q = g->U) and the summed trace,
 * averaged with the estimate g holds now when decay > 0.
 *
 * The running average (beta = decay). The current epoch represents
 *   C_prev = U diag(lambda) U^T + rho (I - U U^T),
 *   rho = max(0, trace_prev - sum_j lambda_j) / (din - ks)   (0 when ks = din)
 * with all ks columns of U and lambda (the oversampling columns carry the
 * best estimate of the spectrum just below the top k; sigma2 of the
 * transform spreads the same remainder over din - k), so tr C_prev =
 * trace_prev (a Nystrom approximation never exceeds A, so the remainder is
 * >= 0 up to rounding). The new round sketches against Q = U, and U^T U = I, so
 *   C_prev Q = U diag(lambda) U^T U + rho (U - U U^T U) = U diag(lambda)
 * and the sketch and trace of C_t = beta C_prev + (1 - beta) C_new are
 *   Y_t   = beta U diag(lambda) + (1 - beta) Y,
 *   tr_t  = beta trace_prev + (1 - beta) trace.
 * Everything below then runs on (Y_t, tr_t) exactly as without averaging;
 * rho, invisible to any sketch against Q, enters only through tr_t and so
 * through sigma2 and delta. When k = ks = din the Nystrom step reproduces
 * C_prev from Q = U (up to fp32 rounding of U and lambda and the shift nu),
 * so two updates give the epoch of beta C_1 + (1 - beta) C_2 built
 * directly. Each sketch is a sum over the same workers; averaging sums
 * averages means. An identity g (epoch 0 or a zero trace) holds no estimate
 * and is not averaged. The inputs are g's published U, lambda, trace and
 * identity flag, which checkpoints and epoch records restore bit for bit.
 *
 * Stable Nystrom (Tropp, Yurtsever, Udell, Cevher 2017), in double:
 * Y_nu = Y + nu Q, C = chol(sym(Q^T Y_nu)) (nu grows on failure), B = Y_nu C^-1,
 * B = Q_b R, eig(R R^T) = W S W^T, U = Q_b W (descending), lambda = max(0, S - nu).
 * Then sigma2, delta, c, d, c_inv, d_inv as in gift_codec.h's gift_geometry_t.
 *
 * trace <= 0 gives the identity transform (U kept as the next basis). Either way
 * the epoch advances by one. On any error g is left exactly as it was.
 * Returns 0; GIFT_EINVAL for NULL/uninitialised g, NaN/Inf in Y or trace, a
 * negative or non-finite damping, or scalars that do not fit a float or make T
 * singular (damping 0 with a rank-deficient A); GIFT_ELAPACK when Q^T Y_nu is
 * not positive definite even after the largest shift (Y is not a PSD sketch)
 * or LAPACK fails.
 */
/* One update's inputs, as the steps of gift_geometry_update_decay read
 * them: g (its published U and lambda), the sketch Y, the workspace, and
 * the average (avg: Y_t = take Y + keep U diag(lambda), else Y itself). */
typedef struct {
    const gift_geometry_t *g;
    const float *Y;
    gift__geo_ws_t *ws;
    size_t din, ks;
    int avg;
    double keep, take;
} gift__geo_upd_t;

/* Step 1: Q = g's basis (column-major, din x ks); returns ||Y_t||^2. */
static double upd_start(const gift__geo_upd_t *u)
{
    const gift_geometry_t *g = u->g;
    const float *Y = u->Y;
    gift__geo_ws_t *ws = u->ws;
    size_t din = u->din, ks = u->ks, dks = din * ks, i, j;
    double normy = 0.0, keep = u->keep, take = u->take;

    for (i = 0; i < din; i++)
        for (j = 0; j < ks; j++)
            ws->Q[j * din + i] = g->U[i * ks + j];
    if (u->avg) {
        /* ||Y_t||; Y_t itself is formed into B on every shift below. */
        for (i = 0; i < din; i++)
            for (j = 0; j < ks; j++) {
                double y =
                    take * (double)Y[i * ks + j] + keep * (double)g->lambda[j] * ws->Q[j * din + i];

                normy += y * y;
            }
    } else {
        for (i = 0; i < dks; i++)
            normy += (double)Y[i] * Y[i];
    }
    return normy;
}

/* Step 2: C = chol(Q^T Y_nu) into ws->M, B = Y_nu, growing nu (from a
 * multiple of ||Y_t||, *nu on return) until Q^T Y_nu is positive definite.
 * A zero Y (A orthogonal to Q) is handled by any positive shift. 0, or
 * GIFT_ELAPACK when no shift up to the largest makes it so. */
static int upd_cholesky(const gift__geo_upd_t *u, double normy, double *nu_out)
{
    const gift_geometry_t *g = u->g;
    const float *Y = u->Y;
    gift__geo_ws_t *ws = u->ws;
    size_t din = u->din, ks = u->ks, i, j;
    double nu, numax, keep = u->keep, take = u->take;
    lapack_int info = 1;

    nu = normy > 0.0 ? GIFT__NU_REL * sqrt((double)din) * normy : 1.0;
    numax = fmax(GIFT__NU_MAX_REL * normy, nu);
    for (; nu <= numax; nu *= GIFT__NU_GROWTH) {
        if (u->avg) {
            for (i = 0; i < din; i++)
                for (j = 0; j < ks; j++)
                    ws->B[j * din + i] = (take * (double)Y[i * ks + j] +
                                          keep * (double)g->lambda[j] * ws->Q[j * din + i]) +
                                         nu * ws->Q[j * din + i];
        } else {
            for (i = 0; i < din; i++)
                for (j = 0; j < ks; j++)
                    ws->B[j * din + i] = (double)Y[i * ks + j] + nu * ws->Q[j * din + i];
        }
        cblas_dgemm(CblasColMajor, CblasTrans, CblasNoTrans, (int)ks, (int)ks, (int)din, 1.0, ws->Q,
                    (int)din, ws->B, (int)din, 0.0, ws->M, (int)ks);
        for (j = 0; j < ks; j++)
            for (i = 0; i < j; i++) {
                double s = 0.5 * (ws->M[j * ks + i] + ws->M[i * ks + j]);

                ws->M[j * ks + i] = s;
                ws->M[i * ks + j] = s;
            }
        info = LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'U', (lapack_int)ks, ws->M, (lapack_int)ks);
        if (info == 0)
            break;
        if (info < 0)
            return GIFT_ELAPACK;
    }
    if (info != 0)
        return GIFT_ELAPACK;
    *nu_out = nu;
    return 0;
}

/* Step 3: B = Y_nu C^-1 = Q_b R; eig(R R^T) = W S W^T (S in ws->w,
 * ascending); the new basis Q = Q_b W. 0 or GIFT_ELAPACK. */
static int upd_basis(const gift__geo_upd_t *u)
{
    gift__geo_ws_t *ws = u->ws;
    size_t din = u->din, ks = u->ks, i, j;

    /* B = Y_nu C^-1, then B = Q_b R. */
    cblas_dtrsm(CblasColMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, (int)din,
                (int)ks, 1.0, ws->M, (int)ks, ws->B, (int)din);
    if (LAPACKE_dgeqrf_work(LAPACK_COL_MAJOR, (lapack_int)din, (lapack_int)ks, ws->B,
                            (lapack_int)din, ws->tau, ws->work, ws->lwork) != 0)
        return GIFT_ELAPACK;
    for (j = 0; j < ks; j++)
        for (i = 0; i < ks; i++)
            ws->R[j * ks + i] = i <= j ? ws->B[j * din + i] : 0.0;
    /* M = R R^T (upper triangle), B = Q_b. */
    cblas_dsyrk(CblasColMajor, CblasUpper, CblasNoTrans, (int)ks, (int)ks, 1.0, ws->R, (int)ks, 0.0,
                ws->M, (int)ks);
    if (LAPACKE_dorgqr_work(LAPACK_COL_MAJOR, (lapack_int)din, (lapack_int)ks, (lapack_int)ks,
                            ws->B, (lapack_int)din, ws->tau, ws->work, ws->lwork) != 0)
        return GIFT_ELAPACK;
    if (LAPACKE_dsyevd_work(LAPACK_COL_MAJOR, 'V', 'U', (lapack_int)ks, ws->M, (lapack_int)ks,
                            ws->w, ws->work, ws->lwork, ws->iwork, ws->liwork) != 0)
        return GIFT_ELAPACK;
    /* New basis Q = Q_b W (eigenvalues ascending: reversed when stored). */
    cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)din, (int)ks, (int)ks, 1.0, ws->B,
                (int)din, ws->M, (int)ks, 0.0, ws->Q, (int)din);
    return 0;
}

/* Step 4: lambda = max(0, S - nu), descending, rounded to float; sigma2
 * and delta; checked, then g takes the new basis, lambda, scalars and
 * epoch. 0, or GIFT_EINVAL (g unchanged). */
static int upd_publish(gift_geometry_t *g, gift__geo_ws_t *ws, double nu, double trace,
                       double damping)
{
    size_t din = (size_t)g->din, ks = (size_t)g->ks, k = (size_t)g->k, i, j;
    double sumk = 0.0, sigma2, delta;
    int rc;

    /* lambda, descending, into tau (free now). */
    for (j = 0; j < ks; j++) {
        double l = ws->w[ks - 1 - j] - nu;

        ws->tau[j] = l > 0.0 ? l : 0.0;
    }
    for (j = 0; j < k; j++)
        sumk += ws->tau[j];
    sigma2 = 0.0;
    if (k < din) {
        sigma2 = (trace - sumk) / (double)(din - k);
        if (sigma2 < 0.0)
            sigma2 = 0.0;
    }
    delta = damping * trace / (double)din;

    /* T is built from lambda rounded to float, the values that travel on the
     * wire, so that a worker loading the published epoch (gift_geometry_load)
     * gets bit for bit the same transform. Validate before g changes. */
    for (j = 0; j < ks; j++) {
        if (ws->tau[j] > FLT_MAX)
            return GIFT_EINVAL;
        ws->tau[j] = (double)(float)ws->tau[j];
    }
    if ((rc = gift__scalars_check(ws->tau, NULL, k, sigma2, delta)) < 0)
        return rc;

    for (i = 0; i < din; i++)
        for (j = 0; j < ks; j++)
            g->U[i * ks + j] = (float)ws->Q[(ks - 1 - j) * din + i];
    for (j = 0; j < ks; j++)
        g->lambda[j] = (float)ws->tau[j];
    gift__scalars_set(g, sigma2, delta);
    g->trace = trace;
    g->sigma2 = sigma2;
    g->delta = delta;
    g->identity = 0;
    g->epoch++;
    gift__dense_set(g);
    return 0;
}

int gift_geometry_update_decay(gift_geometry_t *g, const float *Y, double trace, double damping,
                               double decay)
{
    gift__geo_upd_t u;
    double normy, nu = 0.0;
    int rc;

    if (g == NULL || g->U == NULL || g->ws == NULL || Y == NULL)
        return GIFT_EINVAL;
    if (!isfinite(trace) || !isfinite(damping) || damping < 0.0)
        return GIFT_EINVAL;
    if (!(decay >= 0.0 && decay < 1.0))
        return GIFT_EINVAL;
    memset(&u, 0, sizeof u);
    u.g = g;
    u.Y = Y;
    u.ws = g->ws;
    u.din = (size_t)g->din;
    u.ks = (size_t)g->ks;
    u.keep = 0.0;
    u.take = 1.0;

    /* Average only onto an estimate; decay 0 keeps the plain path, bit for bit. */
    u.avg = decay > 0.0 && !g->identity;
    if (u.avg) {
        u.keep = decay;
        u.take = 1.0 - decay;
        trace = u.keep * g->trace + u.take * trace;
        if (!isfinite(trace))
            return GIFT_EINVAL;
    }

    if (trace <= 0.0) {
        gift__set_identity(g);
        g->trace = trace;
        g->epoch++;
        return 0;
    }

    normy = upd_start(&u);
    if (!isfinite(normy))
        return GIFT_EINVAL;
    normy = sqrt(normy);
    if ((rc = upd_cholesky(&u, normy, &nu)) < 0 || (rc = upd_basis(&u)) < 0)
        return rc;
    return upd_publish(g, u.ws, nu, trace, damping);
}

/*
 * gift_geometry_decay_at: with weights w_i = decay^(n - i) on rounds
 * i = 0..n, the normalised average A_n = sum w_i C_i / sum w_i satisfies
 * A_n = b A_(n-1) + (1 - b) C_n with b = decay W_(n-1) / W_n and
 * W_n = (1 - decay^(n + 1)) / (1 - decay). pow is the only libm call; the
 * owner alone evaluates it and publishes the result's epoch.
 */
double gift_geometry_decay_at(double decay, uint32_t n)
{
    if (!(decay >= 0.0 && decay < 1.0))
        return NAN;
    if (n == 0 || decay == 0.0)
        return 0.0;
    return decay * (1.0 - pow(decay, (double)n)) / (1.0 - pow(decay, (double)n + 1.0));
}

/*
 * gift_geometry_load: sets g to a published epoch received from its owner
 * (U din x ks row-major, lambda ks, and the scalars), computing c, d, c_inv,
 * d_inv with the same formula as gift_geometry_update, so that loading what
 * an update produced gives a bit-identical transform. g's buffers must exist
 * for the epoch's din, k, ks (gift_geometry_init, or allocated by the caller
 * with ws NULL: the transform never uses the workspace). U and lambda may be
 * g's own buffers (a caller that received them unaligned copies them there).
 * identity != 0 sets T = I and keeps U as the next sketch basis. On error g
 * is unchanged.
 * Returns 0 or GIFT_EINVAL (NULL arguments, NaN/Inf in U or lambda, negative
 * lambda, sigma2 or delta, or scalars that make T singular).
 */
int gift_geometry_load(gift_geometry_t *g, const float *U, const float *lambda, double trace,
                       double sigma2, double delta, uint32_t epoch, int identity)
{
    size_t dks, i;
    int rc = GIFT_EINVAL;

    if (g == NULL || g->U == NULL || g->lambda == NULL || g->d == NULL || g->d_inv == NULL ||
        U == NULL || lambda == NULL || g->din < 1 || g->k < 1 || g->k > g->ks || g->ks > g->din)
        goto out;
    dks = (size_t)g->din * g->ks;
    for (i = 0; i < dks; i++)
        if (!isfinite(U[i]))
            goto out;
    if (!identity) {
        if (!isfinite(sigma2) || !isfinite(delta) || sigma2 < 0.0 || delta < 0.0)
            goto out;
        for (i = 0; i < (size_t)g->ks; i++)
            if (!isfinite(lambda[i]) || lambda[i] < 0.0f)
                goto out;
        if ((rc = gift__scalars_check(NULL, lambda, (size_t)g->k, sigma2, delta)) < 0)
            goto out;
    }
    if (U != g->U)
        memcpy(g->U, U, dks * sizeof(float));
    if (identity) {
        gift__set_identity(g);
    } else {
        if (lambda != g->lambda)
            memcpy(g->lambda, lambda, (size_t)g->ks * sizeof(float));
        gift__scalars_set(g, sigma2, delta);
        g->sigma2 = sigma2;
        g->delta = delta;
        g->identity = 0;
        gift__dense_set(g);
    }
    g->trace = trace;
    g->epoch = epoch;
    rc = 0;
out:
    return rc;
}

/*
 * gift_sketch: Y = X^T (X Q) / n (din x ks) and *trace = ||X||_F^2 / n, with
 * X n x din and Q din x ks row-major; work holds n * ks floats. The trace is
 * computed first, in double: NaN/Inf in X returns GIFT_ENONFINITE with Y
 * untouched. Returns 0, GIFT_EINVAL or GIFT_ENONFINITE.
 */
int gift_sketch(const float *X, int n, int din, const float *Q, int ks, float *Y, double *trace,
                float *work)
{
    double t = 0.0;
    size_t i, nx;

    if (X == NULL || Q == NULL || Y == NULL || trace == NULL || work == NULL)
        return GIFT_EINVAL;
    if (n < 1 || din < 1 || ks < 1 || ks > din)
        return GIFT_EINVAL;
    nx = (size_t)n * din;
    for (i = 0; i < nx; i++)
        t += (double)X[i] * X[i];
    if (!isfinite(t))
        return GIFT_ENONFINITE;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, ks, din, 1.0f, X, din, Q, ks, 0.0f,
                work, ks);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, din, ks, n, 1.0f / (float)n, X, din, work,
                ks, 0.0f, Y, ks);
    *trace = t / (double)n;
    return 0;
}

/*
 * gift_transform_ws: out = G T (inverse 0) or G T^-1 (inverse 1) for rows x
 * din row-major G, as out = c G + ((G U_k) diag(d)) U_k^T with two
 * cblas_sgemm, or with the dense form in row blocks. out may equal G but must
 * not overlap it otherwise; work holds work_rows * k floats, work_rows >=
 * rows (unused, and may be NULL, for an identity geometry, which copies).
 * The form and the blocks depend on work_rows, not rows: a tensor transformed
 * chunk by chunk with its whole rows as work_rows takes the form the whole
 * tensor would. Returns 0 or GIFT_EINVAL.
 */
int gift_transform_ws(const gift_geometry_t *g, int inverse, const float *G, int rows, float *out,
                      float *work, int work_rows)
{
    const float *d;
    float c;
    size_t i, j, n, k;

    if (g == NULL || g->U == NULL || G == NULL || out == NULL || rows < 0 || work_rows < rows)
        return GIFT_EINVAL;
    if (inverse != 0 && inverse != 1)
        return GIFT_EINVAL;
    n = (size_t)rows * g->din;
    if (g->identity) {
        if (out != G)
            memcpy(out, G, n * sizeof(float));
        return 0;
    }
    if (work == NULL)
        return GIFT_EINVAL;
    if (rows == 0)
        return 0;
    k = (size_t)g->k;
    if (g->dense_on && (size_t)work_rows * k >= (size_t)g->din) {
        /* out = G T in blocks of r rows: r x din fits in work (work_rows x k). */
        const float *T = g->dense + (inverse ? (size_t)g->din * g->din : 0);
        size_t r = (size_t)work_rows * k / (size_t)g->din, i0, nr;

        if (r > (size_t)rows)
            r = (size_t)rows;
        for (i0 = 0; i0 < (size_t)rows; i0 += nr) {
            float *dst = out == G ? work : out + i0 * g->din;

            nr = (size_t)rows - i0 < r ? (size_t)rows - i0 : r;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, g->din, g->din, 1.0f,
                        G + i0 * g->din, g->din, T, g->din, 0.0f, dst, g->din);
            if (dst == work)
                memcpy(out + i0 * g->din, work, nr * g->din * sizeof(float));
        }
        return 0;
    }
    c = inverse ? g->c_inv : g->c;
    d = inverse ? g->d_inv : g->d;

    /* W = G U_k (the first k of ks columns), scaled by d column-wise. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, g->k, g->din, 1.0f, G, g->din,
                g->U, g->ks, 0.0f, work, g->k);
    for (i = 0; i < (size_t)rows; i++)
        for (j = 0; j < k; j++)
            work[i * k + j] *= d[j];
    /* out = c G + W U_k^T. */
    for (i = 0; i < n; i++)
        out[i] = c * G[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, g->din, g->k, 1.0f, work, g->k, g->U,
                g->ks, 1.0f, out, g->din);
    return 0;
}

/* gift_transform: gift_transform_ws with work_rows = rows. */
int gift_transform(const gift_geometry_t *g, int inverse, const float *G, int rows, float *out,
                   float *work)
{
    return gift_transform_ws(g, inverse, G, rows, out, work, rows);
}

/* ------------------------------------------------------------------ */
/* Error feedback                                                        */
/* ------------------------------------------------------------------ */

/* gift_ef_init: allocates a zero residual of rows x din at epoch 0.
 * Returns 0, GIFT_EINVAL or GIFT_ENOMEM; free with gift_ef_free. */
int gift_ef_init(gift_ef_t *ef, int rows, int din)
{
    if (ef == NULL)
        return GIFT_EINVAL;
    memset(ef, 0, sizeof(*ef));
    if (rows < 1 || din < 1)
        return GIFT_EINVAL;
    if ((ef->e = calloc((size_t)rows * din, sizeof(float))) == NULL)
        return GIFT_ENOMEM;
    ef->rows = rows;
    ef->din = din;
    ef->epoch = 0;
    return 0;
}

void gift_ef_free(gift_ef_t *ef)
{
    if (ef == NULL)
        return;
    free(ef->e);
    memset(ef, 0, sizeof(*ef));
}

void gift_ef_add(const gift_ef_t *ef, float *p)
{
    size_t n;

    if (ef == NULL || ef->e == NULL || p == NULL)
        return;
    n = (size_t)ef->rows * ef->din;
    gift_vec_add(p, ef->e, n);
}

void gift_ef_update(gift_ef_t *ef, const float *p, const float *decoded)
{
    size_t n;

    if (ef == NULL || ef->e == NULL || p == NULL || decoded == NULL)
        return;
    n = (size_t)ef->rows * ef->din;
    gift_vec_sub(p, decoded, n, ef->e);
}

void gift_ef_reset(gift_ef_t *ef, uint32_t epoch)
{
    if (ef == NULL || ef->e == NULL)
        return;
    memset(ef->e, 0, (size_t)ef->rows * ef->din * sizeof(float));
    ef->epoch = epoch;
}

/*
 * gift_ef_rebase: e <- (e T_old^-1) T_new in place, then stamps new_g->epoch.
 * e must be expressed in old_g's epoch (ef->epoch == old_g->epoch) and both
 * geometries must have ef->din columns; work holds rows * max(k_old, k_new)
 * floats. Returns 0 or GIFT_EINVAL (e untouched).
 */
int gift_ef_rebase(gift_ef_t *ef, const gift_geometry_t *old_g, const gift_geometry_t *new_g,
                   float *work)
{
    int rc;

    if (ef == NULL || ef->e == NULL || old_g == NULL || new_g == NULL)
        return GIFT_EINVAL;
    if (old_g->din != ef->din || new_g->din != ef->din || ef->epoch != old_g->epoch)
        return GIFT_EINVAL;
    if (work == NULL && (!old_g->identity || !new_g->identity))
        return GIFT_EINVAL;
    if (old_g->U == NULL || new_g->U == NULL)
        return GIFT_EINVAL;
    if ((rc = gift_transform(old_g, 1, ef->e, ef->rows, ef->e, work)) < 0)
        return rc;
    if ((rc = gift_transform(new_g, 0, ef->e, ef->rows, ef->e, work)) < 0)
        return rc;
    ef->epoch = new_g->epoch;
    return 0;
}

double gift_geometry_rank_sigma2(const gift_geometry_t *g, int k)
{
    double sum = 0.0, s2;
    if (g == NULL || g->lambda == NULL || k < 1 || k > g->ks || k > g->din)
        return NAN;
    if (k == g->din)
        return 0.0;
    for (int j = 0; j < k; j++)
        sum += (double)g->lambda[j];
    s2 = (g->trace - sum) / (double)(g->din - k);
    return s2 > 0.0 ? s2 : 0.0;
}
