/*
 * test_hadamard.c: the Hadamard treatment (issue 42, codec/hadamard.c)
 * against a plain O(b^2) reference in double precision, on every SIMD path
 * this CPU has, for odd shapes (cols not a power of two, odd cols, one row,
 * blocks from 1 to GIFT_HADAMARD_MAX_BLOCK and a cols above it).
 *
 * Tolerance. The fast transform rounds once per butterfly stage (log2 b
 * stages, each output of a stage an exact sum rounded once) and once at the
 * scale; every stage is orthogonal up to a factor sqrt(2) that the scale
 * removes, so to first order the error of a block is at most
 * (log2 b + 1) u ||x|| with u = 2^-24. The tests allow (log2 b + 2) u ||x||
 * per block (normwise) for the forward transform against the reference, and
 * twice that for the round trip (inverse of forward against x). Every SIMD
 * path must give the scalar path's bits exactly (same operations, same
 * order), in place and out of place. gift_hadamard_encode (rotated and
 * encoded slice by slice) must give the bytes of the two steps.
 */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"

static const gift_simd_t PATHS[] = {GIFT_SIMD_SCALAR, GIFT_SIMD_AVX2, GIFT_SIMD_AVX512};
#define N_PATHS 3

/* rows x cols shapes: blocks 1 (odd), 2, 8, 16, 32, 64, 128, 1024, 4096, the
 * cap, and a cols above the cap. */
static const uint32_t SHAPES[][2] = {
    {1, 1},    {1, 3},    {3, 6},     {4, 8},     {2, 16},   {5, 24},
    {1, 48},   {3, 96},   {2, 64},    {7, 1000},  {1, 128},  {2, 384},
    {2, 1024}, {1, 4096}, {1, 32768}, {1, 65536}, {9, 4352}, {2, 2048},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

static int path_ok(gift_simd_t s)
{
    int rc = gift_simd_force(s);
    require_msg(rc == 0 || rc == GIFT_EINVAL, "gift_simd_force(%s) = %d", gift_simd_name(s), rc);
    return rc == 0;
}

static void fill(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        double v = rng_normal(s);
        if (i % 97 == 5)
            v *= 50.0; /* outliers, what the rotation spreads */
        x[i] = (float)v;
    }
}

static int popcount32(uint32_t v)
{
    int c = 0;
    for (; v; v &= v - 1)
        c++;
    return c;
}

static double log2u(uint32_t b)
{
    double l = 0;
    while ((1u << (int)l) < b)
        l++;
    return l;
}

/* The exact forward transform of block [o, o + b) of row x (double), at
 * output indices i (every one when step == 1). */
static double ref_out(const gift_hadamard_t *h, const float *x, uint32_t o, uint32_t i)
{
    uint32_t b = h->block;
    double sum = 0.0;
    for (uint32_t j = 0; j < b; j++) {
        double v = (double)x[o + j] * (h->signs[o + j] ? -1.0 : 1.0);
        sum += (popcount32(i & j) & 1) ? -v : v;
    }
    return sum / sqrt((double)b);
}

START_TEST(test_block_and_seed)
{
    gift_hadamard_t h;
    ck_assert_uint_eq(gift_hadamard_block(0), 0);
    ck_assert_uint_eq(gift_hadamard_block(1), 1);
    ck_assert_uint_eq(gift_hadamard_block(7), 1);
    ck_assert_uint_eq(gift_hadamard_block(24), 8);
    ck_assert_uint_eq(gift_hadamard_block(1000), 8);
    ck_assert_uint_eq(gift_hadamard_block(4096), 4096);
    ck_assert_uint_eq(gift_hadamard_block(11008), 256);
    ck_assert_uint_eq(gift_hadamard_block(1u << 20), GIFT_HADAMARD_MAX_BLOCK);
    ck_assert(gift_hadamard_seed("w", 3, 0) == gift_hadamard_seed("w", 3, 0));
    ck_assert(gift_hadamard_seed("w", 3, 0) != gift_hadamard_seed("w", 4, 0));
    ck_assert(gift_hadamard_seed("w", 3, 0) != gift_hadamard_seed("v", 3, 0));
    ck_assert(gift_hadamard_seed("w", 3, 0) != gift_hadamard_seed("w", 3, 1));
    ck_assert(gift_hadamard_seed(NULL, 0, 0) == gift_hadamard_seed("", 0, 0));
    ck_assert_int_eq(gift_hadamard_init(&h, 0, 1), GIFT_EINVAL);
    ck_assert_int_eq(gift_hadamard_init(&h, 4096, gift_hadamard_seed("w", 3, 0)), 0);
    {
        int neg = 0;
        for (uint32_t j = 0; j < h.cols; j++) {
            ck_assert(h.signs[j] == 0 || h.signs[j] == 0x80000000u);
            neg += h.signs[j] != 0;
        }
        /* a fair coin per column: 2048 +- 5 sigma (32) */
        ck_assert_msg(neg > 2048 - 160 && neg < 2048 + 160, "%d of 4096 signs negative", neg);
    }
    ck_assert_float_eq(h.scale, 1.0f / 64.0f);
    ck_assert_int_eq(gift_hadamard_apply(NULL, 0, NULL, 0, NULL), GIFT_EINVAL);
    gift_hadamard_free(&h);
    gift_hadamard_free(&h); /* twice is harmless */
}
END_TEST

/* gift_fwht is H itself: against the O(b^2) reference, and its own inverse. */
START_TEST(test_fwht_plain)
{
    uint64_t s = 11;
    for (uint32_t b = 1; b <= 512; b *= 2) {
        float x[512], y[512];
        double err = 0, nx = 0;
        fill(x, b, &s);
        memcpy(y, x, sizeof x);
        gift_fwht(y, b);
        for (uint32_t i = 0; i < b; i++) {
            double r = 0;
            for (uint32_t j = 0; j < b; j++)
                r += (popcount32(i & j) & 1) ? -(double)x[j] : (double)x[j];
            r /= sqrt((double)b);
            err += (y[i] - r) * (y[i] - r);
            nx += (double)x[i] * x[i];
        }
        ck_assert_msg(sqrt(err) <= (log2u(b) + 2) * 0x1p-24 * sqrt(nx), "b %u: error %g of %g", b,
                      sqrt(err), sqrt(nx));
        gift_fwht(y, b);
        err = 0;
        for (uint32_t i = 0; i < b; i++)
            err += (y[i] - x[i]) * (double)(y[i] - x[i]);
        ck_assert_msg(sqrt(err) <= 2 * (log2u(b) + 2) * 0x1p-24 * sqrt(nx),
                      "b %u: round trip %g of %g", b, sqrt(err), sqrt(nx));
    }
}
END_TEST

/* Shape _i: every path against the reference, the round trip, in place. */
START_TEST(test_reference)
{
    uint32_t rows = SHAPES[_i][0], cols = SHAPES[_i][1];
    size_t n = (size_t)rows * cols;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
    float *y0 = malloc(n * sizeof *y0), *z0 = malloc(n * sizeof *z0);
    uint64_t s = 1000 + (uint64_t)_i;
    gift_hadamard_t h;
    int have0 = 0;

    ck_assert(x && y && z && y0 && z0);
    fill(x, n, &s);
    ck_assert_int_eq(gift_hadamard_init(&h, cols, gift_hadamard_seed("t", (uint32_t)_i, 0)), 0);
    for (int p = 0; p < N_PATHS; p++) {
        double tol_l = log2u(h.block) + 2;
        if (!path_ok(PATHS[p])) {
            fprintf(stderr, "test_hadamard: %s not on this CPU, skipped\n",
                    gift_simd_name(PATHS[p]));
            continue;
        }
        ck_assert_int_eq(gift_hadamard_apply(&h, 0, x, rows, y), 0);
        ck_assert_int_eq(gift_hadamard_apply(&h, 1, y, rows, z), 0);
        if (!have0) {
            /* The scalar path (the first one) against the O(b^2) reference. */
            /* Large blocks: 64 output indices per block (a row of H each). */
            uint32_t step = h.block > 4096 ? h.block / 64 : 1;
            for (uint32_t r = 0; r < rows; r++)
                for (uint32_t o = 0; o < cols; o += h.block) {
                    const float *xr = x + (size_t)r * cols;
                    const float *yr = y + (size_t)r * cols;
                    double err = 0, nx = 0, rt = 0;
                    for (uint32_t j = 0; j < h.block; j++) {
                        double d = (double)z[(size_t)r * cols + o + j] - xr[o + j];
                        nx += (double)xr[o + j] * xr[o + j];
                        rt += d * d;
                    }
                    for (uint32_t i = 0; i < h.block; i += step) {
                        double d = (double)yr[o + i] - ref_out(&h, xr, o, i);
                        err = fmax(err, fabs(d));
                    }
                    /* per element: bounded by the block's normwise bound */
                    require_msg(err <= tol_l * 0x1p-24 * sqrt(nx),
                                "%ux%u row %u block %u: max error %g, norm %g (tol %g)", rows, cols,
                                r, o, err, sqrt(nx), tol_l * 0x1p-24 * sqrt(nx));
                    require_msg(sqrt(rt) <= 2 * tol_l * 0x1p-24 * sqrt(nx),
                                "%ux%u row %u block %u: round trip %g, norm %g", rows, cols, r, o,
                                sqrt(rt), sqrt(nx));
                }
            if (step == 1 && h.block <= 4096) {
                /* normwise too, over whole blocks */
                for (uint32_t r = 0; r < rows; r++)
                    for (uint32_t o = 0; o < cols; o += h.block) {
                        const float *xr = x + (size_t)r * cols;
                        double err = 0, nx = 0;
                        for (uint32_t i = 0; i < h.block; i++) {
                            double d = (double)y[(size_t)r * cols + o + i] - ref_out(&h, xr, o, i);
                            err += d * d;
                            nx += (double)xr[o + i] * xr[o + i];
                        }
                        require_msg(sqrt(err) <= tol_l * 0x1p-24 * sqrt(nx),
                                    "%ux%u: normwise error %g of %g", rows, cols, sqrt(err),
                                    sqrt(nx));
                    }
            }
            memcpy(y0, y, n * sizeof *y);
            memcpy(z0, z, n * sizeof *z);
            have0 = 1;
        } else {
            require_msg(memcmp(y, y0, n * sizeof *y) == 0, "%ux%u: %s forward differs from scalar",
                        rows, cols, gift_simd_name(PATHS[p]));
            require_msg(memcmp(z, z0, n * sizeof *z) == 0, "%ux%u: %s inverse differs from scalar",
                        rows, cols, gift_simd_name(PATHS[p]));
        }
        /* In place: the same bits. */
        memcpy(z, x, n * sizeof *x);
        ck_assert_int_eq(gift_hadamard_apply(&h, 0, z, rows, z), 0);
        require_msg(memcmp(z, y0, n * sizeof *z) == 0, "%ux%u: %s in place differs", rows, cols,
                    gift_simd_name(PATHS[p]));
        ck_assert_int_eq(gift_hadamard_apply(&h, 1, z, rows, z), 0);
        require_msg(memcmp(z, z0, n * sizeof *z) == 0, "%ux%u: %s inverse in place differs", rows,
                    cols, gift_simd_name(PATHS[p]));
    }
    gift_simd_force(gift_simd_best());
    gift_hadamard_free(&h);
    free(x);
    free(y);
    free(z);
    free(y0);
    free(z0);
}
END_TEST

/* Rows never mix: a chunk of rows transforms as those rows of the whole. */
START_TEST(test_rows_independent)
{
    uint32_t rows = 6, cols = 192;
    float x[6 * 192], y[6 * 192], part[2 * 192];
    uint64_t s = 5;
    gift_hadamard_t h;
    fill(x, sizeof x / sizeof x[0], &s);
    ck_assert_int_eq(gift_hadamard_init(&h, cols, 77), 0);
    ck_assert_uint_eq(h.block, 64);
    ck_assert_int_eq(gift_hadamard_apply(&h, 0, x, rows, y), 0);
    ck_assert_int_eq(gift_hadamard_apply(&h, 0, x + 3 * cols, 2, part), 0);
    ck_assert(memcmp(part, y + 3 * cols, sizeof part) == 0);
    gift_hadamard_free(&h);
}
END_TEST

/* Orthonormal, so the codec's error is the same in both coordinates: the
 * error of an nvfp4 round trip in the rotated space equals, after the
 * rotation back, the error against x (up to the transform's rounding). */
START_TEST(test_isometry)
{
    enum { ROWS = 4, COLS = 1024, N = ROWS * COLS };
    static float x[N], y[N], dec[N], back[N];
    static uint8_t pay[4096];
    gift_codec_params_t p;
    gift_hadamard_t h;
    uint64_t s = 9;
    double e_rot = 0, e_back = 0, nx = 0;
    fill(x, N, &s);
    memset(&p, 0, sizeof p);
    p.fmt = GIFT_FMT_NVFP4;
    ck_assert_int_eq(gift_hadamard_init(&h, COLS, 3), 0);
    ck_assert_int_eq(gift_hadamard_apply(&h, 0, x, ROWS, y), 0);
    ck_assert_int_eq(gift_encode(&p, y, N, pay, sizeof pay), 0);
    ck_assert_int_eq(gift_decode(&p, pay, sizeof pay, N, dec), 0);
    ck_assert_int_eq(gift_hadamard_apply(&h, 1, dec, ROWS, back), 0);
    for (int i = 0; i < N; i++) {
        e_rot += (dec[i] - y[i]) * (double)(dec[i] - y[i]);
        e_back += (back[i] - x[i]) * (double)(back[i] - x[i]);
        nx += (double)x[i] * x[i];
    }
    ck_assert_msg(fabs(sqrt(e_back) - sqrt(e_rot)) <= 2 * 12 * 0x1p-24 * sqrt(nx),
                  "error %g rotated, %g back (norm %g)", sqrt(e_rot), sqrt(e_back), sqrt(nx));
    ck_assert(e_rot > 0);
    gift_hadamard_free(&h);
}
END_TEST

/* gift_hadamard_encode: the bytes of gift_hadamard_apply then gift_encode,
 * for every shape, the lossless and fp8 formats, small and large fp8 blocks,
 * on every path; nvfp4 and stochastic rounding refused; NaN found. */
START_TEST(test_encode_fused)
{
    static const gift_format_t F[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_E5M2};
    static const uint32_t BLK[] = {128, 32, 8192};
    uint32_t rows = SHAPES[_i][0], cols = SHAPES[_i][1];
    size_t n = (size_t)rows * cols, cap = 4 * n + 4096;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    uint64_t s = 77 + (uint64_t)_i;
    gift_hadamard_t h;
    ck_assert(x && y && a && b);
    fill(x, n, &s);
    ck_assert_int_eq(gift_hadamard_init(&h, cols, 5), 0);
    for (int p = 0; p < N_PATHS; p++) {
        if (!path_ok(PATHS[p]))
            continue;
        ck_assert_int_eq(gift_hadamard_apply(&h, 0, x, rows, y), 0);
        for (size_t f = 0; f < sizeof F / sizeof F[0]; f++)
            for (size_t k = 0; k < 3; k++) {
                gift_codec_params_t cp = {F[f], BLK[k], 0, {0}};
                gift_layout_t l;
                ck_assert_int_eq(gift_layout(&cp, n, &l), 0);
                memset(a, 0xAB, cap);
                memset(b, 0xCD, cap);
                ck_assert_int_eq(gift_encode(&cp, y, n, a, cap), 0);
                ck_assert_int_eq(gift_hadamard_encode(&cp, &h, x, rows, b, cap), 0);
                require_msg(memcmp(a, b, l.total) == 0, "%ux%u %s block %u %s: bytes differ", rows,
                            cols, gift_format_name(F[f]), BLK[k], gift_simd_name(PATHS[p]));
            }
    }
    gift_simd_force(gift_simd_best());
    {
        gift_codec_params_t nv = {GIFT_FMT_NVFP4, 0, 0, {0}}, sr = {GIFT_FMT_E4M3, 0, 1, {0}};
        gift_codec_params_t e4 = {GIFT_FMT_E4M3, 0, 0, {0}};
        ck_assert_int_eq(gift_hadamard_encode(&nv, &h, x, rows, b, cap), GIFT_EFORMAT);
        ck_assert_int_eq(gift_hadamard_encode(&sr, &h, x, rows, b, cap), GIFT_EFORMAT);
        ck_assert_int_eq(gift_hadamard_encode(&e4, &h, x, rows, b, 1), GIFT_ENOSPC);
        x[n - 1] = NAN;
        ck_assert_int_eq(gift_hadamard_encode(&e4, &h, x, rows, b, cap), GIFT_ENONFINITE);
    }
    gift_hadamard_free(&h);
    free(x);
    free(y);
    free(a);
    free(b);
}
END_TEST

static Suite *hadamard_suite(void)
{
    Suite *s = suite_create("codec_hadamard");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_block_and_seed);
    tcase_add_test(tc, test_fwht_plain);
    tcase_add_loop_test(tc, test_reference, 0, (int)N_SHAPES);
    tcase_add_loop_test(tc, test_encode_fused, 0, (int)N_SHAPES);
    tcase_add_test(tc, test_rows_independent);
    tcase_add_test(tc, test_isometry);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(hadamard_suite(), CK_NORMAL) ? EXIT_FAILURE : EXIT_SUCCESS;
}
