/*
 * test_gpu_pipeline.c: the worker's device pipeline (gift_gpu_push_prepare,
 * gift_gpu_push_chunk, gift_gpu_pull_chunk, gift_gpu_pull_finish) against the
 * CPU client's sequence: p = G T + e; per chunk encode, e = p - decode. With
 * an identity geometry every byte and every residual bit must match; with a
 * real geometry the payload decodes to the CPU's within the transform's
 * normalised error. Chunk payloads land in pinned host memory and each
 * chunk's callback fires once with status 0 (GIFT_ENONFINITE for NaN input).
 * Exits 77 without a device.
 */
#include <stdatomic.h>

#include "gpu_test_util.h"

static atomic_int fired, bad_status;

static void ready_cb(void *arg, int status)
{
    (void)arg;
    atomic_fetch_add(&fired, 1);
    if (status != 0)
        atomic_store(&bad_status, status);
}

#define ROWS 37
#define DIN 131
#define CHUNK_ROWS 10 /* chunks of whole rows; the last one short */

/* Pushes G (ROWS x DIN) through the device pipeline with error feedback
 * from e0 and returns the host payloads (one total-sized slice per chunk)
 * and the new residual. */
static void push_gpu(const gift_codec_params_t *p0, const gift_gpu_geometry_t *g, const float *G,
                     const float *e0, uint8_t *pay_host, size_t slice, float *e_out, int nan_at)
{
    size_t n = (size_t)ROWS * DIN, nch = (ROWS + CHUNK_ROWS - 1) / CHUNK_ROWS;
    float *G_d = dev_alloc(n * 4), *p_d = dev_alloc(n * 4), *e_d = dev_alloc(n * 4);
    float *w_d = dev_alloc((size_t)ROWS * DIN * 4);
    uint8_t *pay_d = dev_alloc(slice * nch);
    int *status = gift_gpu_host_alloc(nch * sizeof(int));
    float *Gn = host_alloc(n * 4);

    ck_assert_ptr_nonnull(status);
    memcpy(Gn, G, n * 4);
    if (nan_at >= 0)
        Gn[nan_at] = NAN;
    h2d(G_d, Gn, n * 4);
    h2d(e_d, e0, n * 4);
    atomic_store(&fired, 0);
    atomic_store(&bad_status, 0);
    GPU_OK(ctx, gift_gpu_push_prepare(ctx, g, G_d, ROWS, DIN, e_d, p_d, w_d));
    for (size_t j = 0; j < nch; j++) {
        gift_codec_params_t p = *p0;
        size_t r0 = j * CHUNK_ROWS, rows = ROWS - r0 < CHUNK_ROWS ? ROWS - r0 : CHUNK_ROWS;
        p.sr.chunk = (uint32_t)j;
        GPU_OK(ctx, gift_gpu_push_chunk(ctx, &p, p_d + r0 * DIN, rows * DIN, e_d + r0 * DIN,
                                        pay_d + j * slice, pay_host + j * slice, slice, status + j,
                                        ready_cb, NULL));
    }
    (void)gift_gpu_sync(ctx); /* the data error, if any, is checked through the callbacks */
    /* Host functions may run just after the stream work they follow. */
    for (int spin = 0; spin < 100000 && atomic_load(&fired) < (int)nch; spin++)
        ;
    CUDA_OK(cudaDeviceSynchronize());
    ck_assert_int_eq(atomic_load(&fired), (int)nch);
    d2h(e_out, e_d, n * 4);
    gift_gpu_host_free(status);
    CUDA_OK(cudaFree(pay_d));
    CUDA_OK(cudaFree(w_d));
    CUDA_OK(cudaFree(e_d));
    CUDA_OK(cudaFree(p_d));
    CUDA_OK(cudaFree(G_d));
    free(Gn);
}

START_TEST(test_push_identity_bit_exact)
{
    static const gift_format_t fmts[] = {GIFT_FMT_E4M3, GIFT_FMT_NVFP4, GIFT_FMT_BF16};
    size_t n = (size_t)ROWS * DIN, nch = (ROWS + CHUNK_ROWS - 1) / CHUNK_ROWS, slice;
    gift_codec_params_t p;
    gift_layout_t l;
    uint64_t s = 8 + _i;
    float *G = host_alloc(n * 4), *e = host_alloc(n * 4), *e_g = host_alloc(n * 4);
    float *q = host_alloc(n * 4), *dec = host_alloc(n * 4);
    uint8_t *pay_c, *pay_g;

    memset(&p, 0, sizeof p);
    p.fmt = fmts[_i % 3];
    p.stochastic = _i >= 3;
    p.sr.seed = 99, p.sr.rank = 1, p.sr.key = 4, p.sr.step = 12345;
    ck_assert_int_eq(gift_layout(&p, (size_t)CHUNK_ROWS * DIN, &l), 0);
    slice = l.total;
    pay_c = host_alloc(slice * nch);
    pay_g = gift_gpu_host_alloc(slice * nch);
    ck_assert_ptr_nonnull(pay_g);
    for (size_t i = 0; i < n; i++)
        G[i] = (float)(rng_normal(&s) * 1e-2), e[i] = (float)(rng_normal(&s) * 1e-4);
    push_gpu(&p, NULL, G, e, pay_g, slice, e_g, -1);
    ck_assert_int_eq(atomic_load(&bad_status), 0);
    /* The CPU client's sequence. */
    for (size_t i = 0; i < n; i++)
        q[i] = G[i] + e[i];
    for (size_t j = 0; j < nch; j++) {
        gift_codec_params_t pc = p;
        size_t r0 = j * CHUNK_ROWS, rows = ROWS - r0 < CHUNK_ROWS ? ROWS - r0 : CHUNK_ROWS;
        size_t m = rows * DIN;
        gift_layout_t lj;
        pc.sr.chunk = (uint32_t)j;
        ck_assert_int_eq(gift_layout(&pc, m, &lj), 0);
        ck_assert_int_eq(gift_encode(&pc, q + r0 * DIN, m, pay_c + j * slice, slice), 0);
        ck_assert_msg(memcmp(pay_c + j * slice, pay_g + j * slice, lj.total) == 0,
                      "%s sr %d chunk %zu: payload differs", gift_format_name(p.fmt), p.stochastic,
                      j);
        ck_assert_int_eq(gift_decode(&pc, pay_c + j * slice, lj.total, m, dec + r0 * DIN), 0);
    }
    for (size_t i = 0; i < n; i++)
        e[i] = q[i] - dec[i];
    ck_assert_msg(memcmp(e, e_g, n * 4) == 0, "residual differs");

    /* Pull the first chunk back through the device. */
    {
        float *out_d = dev_alloc(n * 4), *out = host_alloc(n * 4);
        uint8_t *pd = dev_alloc(slice);
        size_t m = (size_t)CHUNK_ROWS * DIN;
        GPU_OK(ctx, gift_gpu_pull_chunk(ctx, &p, pay_g, slice, m, pd, out_d));
        GPU_OK(ctx, gift_gpu_pull_finish(ctx, NULL, CHUNK_ROWS, out_d, NULL));
        GPU_OK(ctx, gift_gpu_sync(ctx));
        d2h(out, out_d, m * 4);
        ck_assert_msg(memcmp(out, dec, m * 4) == 0, "pulled chunk differs");
        CUDA_OK(cudaFree(pd));
        CUDA_OK(cudaFree(out_d));
        free(out);
    }
    gift_gpu_host_free(pay_g);
    free(pay_c), free(dec), free(q), free(e_g), free(e), free(G);
}
END_TEST

/* NaN in the gradient: the callbacks report GIFT_ENONFINITE. */
START_TEST(test_push_nan_reported)
{
    size_t n = (size_t)ROWS * DIN, nch = (ROWS + CHUNK_ROWS - 1) / CHUNK_ROWS;
    gift_codec_params_t p;
    gift_layout_t l;
    float *G = host_alloc(n * 4), *e = host_alloc(n * 4), *e_g = host_alloc(n * 4);
    uint8_t *pay_g;
    uint64_t s = 3;

    memset(&p, 0, sizeof p);
    p.fmt = GIFT_FMT_E4M3;
    ck_assert_int_eq(gift_layout(&p, (size_t)CHUNK_ROWS * DIN, &l), 0);
    pay_g = gift_gpu_host_alloc(l.total * nch);
    for (size_t i = 0; i < n; i++)
        G[i] = (float)rng_normal(&s), e[i] = 0.0f;
    push_gpu(&p, NULL, G, e, pay_g, l.total, e_g, (int)(n - 5));
    ck_assert_int_eq(atomic_load(&bad_status), GIFT_ENONFINITE);
    gift_gpu_host_free(pay_g);
    free(e_g), free(e), free(G);
}
END_TEST

/* A real geometry: push then pull through the device equals the CPU chain
 * (transform, encode, decode, inverse) within the GEMMs' rounding. */
START_TEST(test_push_pull_geometry)
{
    size_t n = (size_t)ROWS * DIN, nch = (ROWS + CHUNK_ROWS - 1) / CHUNK_ROWS;
    int k = 16, ks = gift_basis_cols(DIN, k, GIFT_OVERSAMPLE_DEFAULT), nt = 300;
    gift_codec_params_t p;
    gift_layout_t l;
    gift_geometry_t g;
    gift_gpu_geometry_t gg;
    uint64_t s = 77;
    float *G = host_alloc(n * 4), *e = host_alloc(n * 4), *e_g = host_alloc(n * 4);
    float *X = host_alloc((size_t)nt * DIN * 4), *Y = host_alloc((size_t)DIN * ks * 4);
    float *sw = host_alloc((size_t)nt * ks * 4), *t = host_alloc(n * 4), *ref = host_alloc(n * 4);
    float *got = host_alloc(n * 4), *work = host_alloc((size_t)ROWS * k * 4);
    float *out_d = dev_alloc(n * 4), *w_d = dev_alloc((size_t)ROWS * k * 4);
    uint8_t *pay_g, *pd;
    double tr, num = 0.0, den = 0.0;

    ck_assert_int_eq(gift_geometry_init(&g, DIN, k, ks, 5), 0);
    for (size_t i = 0; i < (size_t)nt * DIN; i++)
        X[i] = (float)(rng_normal(&s) / sqrt(1.0 + (double)(i % DIN)));
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(gift_sketch(X, nt, DIN, g.U, ks, Y, &tr, sw), 0);
        ck_assert_int_eq(gift_geometry_update(&g, Y, tr, GIFT_DAMPING_DEFAULT), 0);
    }
    ck_assert_int_eq(gift_gpu_geometry_init(&gg, DIN, k, ks), 0);
    GPU_OK(ctx, gift_gpu_geometry_upload(ctx, &gg, &g));
    memset(&p, 0, sizeof p);
    p.fmt = GIFT_FMT_E4M3;
    ck_assert_int_eq(gift_layout(&p, (size_t)CHUNK_ROWS * DIN, &l), 0);
    pay_g = gift_gpu_host_alloc(l.total * nch);
    pd = dev_alloc(l.total * nch);
    for (size_t i = 0; i < n; i++)
        G[i] = (float)(rng_normal(&s) * 1e-3), e[i] = 0.0f;
    push_gpu(&p, &gg, G, e, pay_g, l.total, e_g, -1);
    ck_assert_int_eq(atomic_load(&bad_status), 0);
    for (size_t j = 0; j < nch; j++) {
        size_t r0 = j * CHUNK_ROWS, rows = ROWS - r0 < CHUNK_ROWS ? ROWS - r0 : CHUNK_ROWS;
        GPU_OK(ctx, gift_gpu_pull_chunk(ctx, &p, pay_g + j * l.total, l.total, rows * DIN,
                                        pd + j * l.total, out_d + r0 * DIN));
    }
    GPU_OK(ctx, gift_gpu_pull_finish(ctx, &gg, ROWS, out_d, w_d));
    GPU_OK(ctx, gift_gpu_sync(ctx));
    d2h(got, out_d, n * 4);
    /* CPU: T, encode/decode per chunk, T^-1. */
    ck_assert_int_eq(gift_transform(&g, 0, G, ROWS, t, work), 0);
    for (size_t j = 0; j < nch; j++) {
        size_t r0 = j * CHUNK_ROWS, rows = ROWS - r0 < CHUNK_ROWS ? ROWS - r0 : CHUNK_ROWS;
        uint8_t *pc = host_alloc(l.total);
        ck_assert_int_eq(gift_encode(&p, t + r0 * DIN, rows * DIN, pc, l.total), 0);
        ck_assert_int_eq(gift_decode(&p, pc, l.total, rows * DIN, t + r0 * DIN), 0);
        free(pc);
    }
    ck_assert_int_eq(gift_transform(&g, 1, t, ROWS, ref, work), 0);
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    /* A GEMM rounding difference can move a code by one step: allow a
     * fraction of one fp8 step's error, far below the codec's own. */
    ck_assert_msg(sqrt(num / den) < 5e-3, "device push/pull vs CPU: rel err %g", sqrt(num / den));
    gift_gpu_geometry_free(&gg);
    gift_geometry_free(&g);
    gift_gpu_host_free(pay_g);
    CUDA_OK(cudaFree(pd));
    CUDA_OK(cudaFree(w_d));
    CUDA_OK(cudaFree(out_d));
    free(work), free(got), free(ref), free(t), free(sw), free(Y), free(X), free(e_g), free(e),
        free(G);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("gpu_pipeline");
    TCase *tc = gpu_tcase(s, "pipeline", 300);

    tcase_add_loop_test(tc, test_push_identity_bit_exact, 0, 6);
    tcase_add_test(tc, test_push_nan_reported);
    tcase_add_test(tc, test_push_pull_geometry);
    return s;
}

int main(void)
{
    return gpu_test_main(make_suite);
}
