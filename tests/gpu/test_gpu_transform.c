/*
 * test_gpu_transform.c: the cuBLAS transform and sketch against their CPU
 * twins. GEMMs sum in another order on the GPU, so these compare by
 * normalised error (ggml's way), not bit for bit: ||gpu - cpu|| / ||cpu||
 * below TOL. Geometries are real (non-identity, built from sketches of a
 * decaying-spectrum input), shapes are awkward, outputs are poisoned, and
 * the identity geometry must copy exactly. Exits 77 without a device.
 */
#include "gpu_test_util.h"

#define TOL 1e-4

static double rel_err(const float *ref, const float *x, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Inputs with variance 1/(1+j) on coordinate j (a decaying spectrum). */
static void fill_inputs(float *X, int n, int din, uint64_t *s)
{
    for (int t = 0; t < n; t++)
        for (int j = 0; j < din; j++)
            X[(size_t)t * din + j] = (float)(rng_normal(s) / sqrt(1.0 + j));
}

/* A host geometry after two sketch refreshes (non-identity). */
static void make_geometry(gift_geometry_t *g, int din, int k, uint64_t seed)
{
    int ks = gift_basis_cols(din, k, GIFT_OVERSAMPLE_DEFAULT), n = 2 * din + 3;
    float *X = host_alloc((size_t)n * din * 4), *Y = host_alloc((size_t)din * ks * 4);
    float *w = host_alloc((size_t)n * ks * 4);
    uint64_t s = seed;
    double tr;

    ck_assert_int_eq(gift_geometry_init(g, din, k, ks, seed), 0);
    fill_inputs(X, n, din, &s);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(gift_sketch(X, n, din, g->U, ks, Y, &tr, w), 0);
        ck_assert_int_eq(gift_geometry_update(g, Y, tr, GIFT_DAMPING_DEFAULT), 0);
    }
    ck_assert_msg(!g->identity, "geometry din %d k %d is still the identity", din, k);
    free(w), free(Y), free(X);
}

static const int shapes[][3] = {
    /* rows, din, k */
    {1, 67, 1}, {7, 67, 8}, {33, 200, 32}, {130, 256, 256}, {5, 300, 64}, {257, 129, 17},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* T and T^-1, out of place and in place, against gift_transform. */
START_TEST(test_transform_matches_cpu)
{
    int rows = shapes[_i][0], din = shapes[_i][1], k = shapes[_i][2];
    size_t n = (size_t)rows * din;
    uint64_t s = 17 + _i;
    gift_geometry_t g;
    gift_gpu_geometry_t gg;
    float *G = host_alloc(n * 4), *ref = host_alloc(n * 4), *got = host_alloc(n * 4);
    float *work = host_alloc((size_t)rows * k * 4);
    float *G_d = dev_alloc(n * 4), *out_d = dev_alloc(n * 4),
          *w_d = dev_alloc((size_t)rows * k * 4);

    make_geometry(&g, din, k, 1000 + _i);
    ck_assert_int_eq(gift_gpu_geometry_init(&gg, din, k, g.ks), 0);
    GPU_OK(ctx, gift_gpu_geometry_upload(ctx, &gg, &g));
    for (size_t i = 0; i < n; i++)
        G[i] = (float)(rng_normal(&s) * 1e-3);
    for (int inv = 0; inv < 2; inv++) {
        double e;
        ck_assert_int_eq(gift_transform(&g, inv, G, rows, ref, work), 0);
        h2d(G_d, G, n * 4);
        CUDA_OK(cudaMemset(out_d, POISON_BYTE, n * 4));
        GPU_OK(ctx, gift_gpu_transform(ctx, &gg, inv, G_d, rows, out_d, w_d));
        GPU_OK(ctx, gift_gpu_sync(ctx));
        d2h(got, out_d, n * 4);
        e = rel_err(ref, got, n);
        ck_assert_msg(e < TOL, "transform inv %d rows %d din %d k %d: rel err %g", inv, rows, din,
                      k, e);
        /* In place: out == G. */
        GPU_OK(ctx, gift_gpu_transform(ctx, &gg, inv, G_d, rows, G_d, w_d));
        GPU_OK(ctx, gift_gpu_sync(ctx));
        d2h(got, G_d, n * 4);
        e = rel_err(ref, got, n);
        ck_assert_msg(e < TOL, "in-place transform inv %d rows %d din %d k %d: rel err %g", inv,
                      rows, din, k, e);
    }
    /* T^-1 (T G) == G up to rounding. */
    h2d(G_d, G, n * 4);
    GPU_OK(ctx, gift_gpu_transform(ctx, &gg, 0, G_d, rows, out_d, w_d));
    GPU_OK(ctx, gift_gpu_transform(ctx, &gg, 1, out_d, rows, out_d, w_d));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(got, out_d, n * 4);
    ck_assert_msg(rel_err(G, got, n) < 1e-4, "round trip rows %d din %d k %d: rel err %g", rows,
                  din, k, rel_err(G, got, n));
    gift_gpu_geometry_free(&gg);
    gift_geometry_free(&g);
    CUDA_OK(cudaFree(w_d));
    CUDA_OK(cudaFree(out_d));
    CUDA_OK(cudaFree(G_d));
    free(work), free(got), free(ref), free(G);
}
END_TEST

/* An identity geometry (epoch 0) copies, bit for bit, with no workspace. */
START_TEST(test_identity_copies)
{
    int rows = 19, din = 77;
    size_t n = (size_t)rows * din;
    uint64_t s = 5;
    gift_geometry_t g;
    gift_gpu_geometry_t gg;
    float *G = host_alloc(n * 4), *got = host_alloc(n * 4);
    float *G_d = dev_alloc(n * 4), *out_d = dev_alloc(n * 4);

    ck_assert_int_eq(gift_geometry_init(&g, din, 8, 16, 3), 0);
    ck_assert_int_eq(gift_gpu_geometry_init(&gg, din, 8, 16), 0);
    GPU_OK(ctx, gift_gpu_geometry_upload(ctx, &gg, &g));
    fill_varied(G, n, &s);
    h2d(G_d, G, n * 4);
    GPU_OK(ctx, gift_gpu_transform(ctx, &gg, 0, G_d, rows, out_d, NULL));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(got, out_d, n * 4);
    ck_assert_msg(memcmp(G, got, n * 4) == 0, "identity transform changed the data");
    gift_gpu_geometry_free(&gg);
    gift_geometry_free(&g);
    CUDA_OK(cudaFree(out_d));
    CUDA_OK(cudaFree(G_d));
    free(got), free(G);
}
END_TEST

/* The sketch Y = X^T (X Q) / n and the trace against gift_sketch. */
START_TEST(test_sketch_matches_cpu)
{
    static const int cases[][3] = {{1, 5, 1}, {37, 67, 9}, {300, 200, 40}, {1000, 129, 129}};
    int n = cases[_i][0], din = cases[_i][1], ks = cases[_i][2];
    uint64_t s = 71 + _i;
    float *X = host_alloc((size_t)n * din * 4), *Q = host_alloc((size_t)din * ks * 4);
    float *Y = host_alloc((size_t)din * ks * 4), *got = host_alloc((size_t)din * ks * 4);
    float *w = host_alloc((size_t)n * ks * 4);
    float *X_d = dev_alloc((size_t)n * din * 4), *Q_d = dev_alloc((size_t)din * ks * 4);
    float *Y_d = dev_alloc((size_t)din * ks * 4), *w_d = dev_alloc((size_t)n * ks * 4);
    double tr, tr_g;
    int rc;

    fill_inputs(X, n, din, &s);
    for (size_t i = 0; i < (size_t)din * ks; i++)
        Q[i] = (float)rng_normal(&s);
    ck_assert_int_eq(gift_sketch(X, n, din, Q, ks, Y, &tr, w), 0);
    h2d(X_d, X, (size_t)n * din * 4);
    h2d(Q_d, Q, (size_t)din * ks * 4);
    GPU_OK(ctx, gift_gpu_sketch(ctx, X_d, n, din, Q_d, ks, Y_d, &tr_g, w_d));
    d2h(got, Y_d, (size_t)din * ks * 4);
    ck_assert_msg(rel_err(Y, got, (size_t)din * ks) < TOL, "sketch n %d din %d ks %d: rel err %g",
                  n, din, ks, rel_err(Y, got, (size_t)din * ks));
    ck_assert_msg(fabs(tr_g - tr) <= 1e-9 * tr, "trace cpu %.17g gpu %.17g", tr, tr_g);

    /* NaN in X: GIFT_ENONFINITE, Y untouched. */
    X[(size_t)n * din / 2] = NAN;
    h2d(X_d, X, (size_t)n * din * 4);
    CUDA_OK(cudaMemset(Y_d, POISON_BYTE, (size_t)din * ks * 4));
    rc = gift_gpu_sketch(ctx, X_d, n, din, Q_d, ks, Y_d, &tr_g, w_d);
    ck_assert_msg(rc == GIFT_ENONFINITE, "NaN sketch gave %s", gift_strerror(rc));
    d2h(got, Y_d, (size_t)din * ks * 4);
    for (size_t i = 0; i < (size_t)din * ks * 4; i++)
        ck_assert_msg(((uint8_t *)got)[i] == POISON_BYTE, "Y byte %zu written after NaN", i);
    GPU_OK(ctx, gift_gpu_sync(ctx));
    CUDA_OK(cudaFree(w_d));
    CUDA_OK(cudaFree(Y_d));
    CUDA_OK(cudaFree(Q_d));
    CUDA_OK(cudaFree(X_d));
    free(w), free(got), free(Y), free(Q), free(X);
}
END_TEST

START_TEST(test_arguments)
{
    gift_gpu_geometry_t gg;
    gift_geometry_t g;
    double tr;

    ck_assert_int_eq(gift_gpu_geometry_init(&gg, 10, 11, 11), GIFT_EINVAL);
    ck_assert_int_eq(gift_gpu_geometry_init(&gg, 10, 2, 4), 0);
    ck_assert_int_eq(gift_geometry_init(&g, 12, 2, 4, 1), 0);
    ck_assert_int_eq(gift_gpu_geometry_upload(ctx, &gg, &g), GIFT_EINVAL);
    ck_assert_int_eq(gift_gpu_transform(ctx, &gg, 2, gg.U_dev, 1, gg.U_dev, NULL), GIFT_EINVAL);
    ck_assert_int_eq(gift_gpu_sketch(ctx, gg.U_dev, 0, 4, gg.U_dev, 2, gg.U_dev, &tr, gg.U_dev),
                     GIFT_EINVAL);
    ck_assert_int_eq(gift_gpu_ctx_create(gift_gpu_device_count(), NULL, &(gift_gpu_ctx_t *){NULL}),
                     GIFT_EINVAL);
    gift_geometry_free(&g);
    gift_gpu_geometry_free(&gg);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("gpu_transform");
    TCase *tc = gpu_tcase(s, "transform", 600);

    tcase_add_loop_test(tc, test_transform_matches_cpu, 0, NSHAPES);
    tcase_add_test(tc, test_identity_copies);
    tcase_add_loop_test(tc, test_sketch_matches_cpu, 0, 4);
    tcase_add_test(tc, test_arguments);
    return s;
}

int main(void)
{
    return gpu_test_main(make_suite);
}
