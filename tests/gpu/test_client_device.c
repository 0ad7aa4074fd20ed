/*
 * test_client_device.c: libgiftclient with device tensors (GIFT_MEMORY_CUDA)
 * end to end, against a real giftd (GIFTD_BIN, tests/common/gift_test_daemon.h)
 * on 127.0.0.1 and worker processes forked from this test. Built twice
 * (tests/gpu/CMakeLists.txt): test_client_device_emu links a libgiftclient
 * built from the same sources on the CUDA emulator (emu/), so it runs on
 * machines without a GPU; test_client_device links the real gpu/ library
 * and exits 77 (skipped) when the machine has no CUDA device.
 *
 *   parity    2 workers, 6 steps of a list covering every push codec
 *             (fp8-e4m3 with error feedback, fp8-e5m2 with stochastic
 *             rounding, nvfp4 with both, bf16 1-D re-cut into rows, f32
 *             small enough to be fused on the host) and a geometry tensor
 *             (fp8-e4m3, error feedback, rank 8, refreshed every 2 steps
 *             from layer inputs given as device memory), run once with every
 *             tensor in host memory and once with every tensor on the
 *             device. Euclidean results must be bit-identical between the
 *             runs (the first differing element is named); the geometry
 *             tensor's within GEO_TOL relative L2 (its GEMMs and sketches run
 *             through cuBLAS, or the emulator's reference GEMM, in another
 *             summation order than OpenBLAS, and the server builds its epochs
 *             from those sketches); both ranks' results bit-identical within
 *             each run; every result near the exact mean.
 *   parity_policy_none  the same against a giftd running policy none: the
 *             geometry tensor's epochs are Euclidean, so it too must be
 *             bit-identical between the host and the device runs.
 *   errors    one worker: a declare asking for a device that does not
 *             exist fails with GIFT_ENODEV, an unknown memory kind with
 *             GIFT_EINVAL; a NaN in a device gradient (f32, and fp8 with
 *             error feedback, in the last and in the first chunk) fails the
 *             push with GIFT_ENONFINITE; the same step pushed again clean
 *             completes, exactly for f32; a host tensor of the same client
 *             keeps working.
 *   replay    one worker: a shard (with checkpoints) SIGKILLed after a device
 *             push was acknowledged and restarted on its port and data
 *             directory; the client replays the
 *             push from its pinned copies (the device gradient poisoned by
 *             then) and the pull returns the same result (f32 exactly).
 *
 * Outputs are poisoned (0xFF bytes, a NaN) before every pull.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <check.h>
#include <errno.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift/client.h"
#include "gift_gpu.h"
#include "gift_test_check.h"
#include "gift_test_daemon.h"
#include "gift_test_rng.h"

#define NT 6
#define GEO_T 4
#define NSTEPS 6
#define REFRESH 2
#define XROWS 48
#define WORKER_TIMEOUT_MS 300000
/* Geometry tensor, device run against host run: relative L2 per step. The
 * two runs quantise transformed gradients whose transforms differ by
 * rounding (and, after the first refresh, by the epochs built from
 * slightly different sketches); a code that flips moves one element by an
 * fp8 step, so the runs differ by a fraction of the codec's own error
 * (0.036 relative for a push and a pull of fp8-e4m3). */
#define GEO_TOL 0.03
/* Every result against the exact mean of the two ranks' gradients: a push
 * and a pull each add their format's relative L2 on Gaussian data (fp8 ~0.036
 * for both, nvfp4 ~0.134 round-to-nearest, more with stochastic rounding
 * and the error feedback's carried residual). */
#define MEAN_TOL(t) (SPECS[t].push == GIFT_CODEC_NVFP4 ? 0.25 : 0.1)

typedef struct spec {
    const char *name;
    uint32_t rows, cols;
    gift_codec_t push, pull;
    int ef, sr, geo;
} spec_t;

static const spec_t SPECS[NT] = {
    {"e4m3_ef", 24, 100, GIFT_CODEC_FP8_E4M3, GIFT_CODEC_FP8_E4M3, 1, 0, 0},
    {"e5m2_sr", 16, 130, GIFT_CODEC_FP8_E5M2, GIFT_CODEC_BF16, 0, 1, 0},
    {"nvfp4_ef_sr", 20, 96, GIFT_CODEC_NVFP4, GIFT_CODEC_NVFP4, 1, 1, 0},
    {"bf16_1d", 1, 3000, GIFT_CODEC_BF16, GIFT_CODEC_F32, 1, 1, 0},
    {"geo_e4m3", 32, 64, GIFT_CODEC_FP8_E4M3, GIFT_CODEC_FP8_E4M3, 1, 0, 1},
    {"f32_small", 5, 40, GIFT_CODEC_F32, GIFT_CODEC_F32, 0, 0, 0},
};

/* Checks that also work in the forked workers (where a Check failure would
 * write into the test's own channel): a worker prints and exits 1. */
static int in_worker;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (in_worker) {                                                                       \
                fprintf(stderr, "test_client_device worker: " __VA_ARGS__);                        \
                fputc('\n', stderr);                                                               \
                _exit(1);                                                                          \
            }                                                                                      \
            ck_abort_msg(__VA_ARGS__);                                                             \
        }                                                                                          \
    } while (0)

/* Kernels the emulator has launched in this process (tests/gpu/emu); the
 * weak reference is NULL in the build on the real CUDA library. */
extern unsigned long gift_emu_launch_count(void) __attribute__((weak));

static unsigned long launches(void)
{
    return gift_emu_launch_count != NULL ? gift_emu_launch_count() : 0;
}

static size_t nel(int t)
{
    return (size_t)SPECS[t].rows * SPECS[t].cols;
}

/* Gradient of tensor t for rank r at step s (tensor 4's rows share a
 * low-rank input geometry, so the transform has something to whiten). */
static void gen(float *x, int t, int r, int s)
{
    uint64_t st = 0x5EEDull ^ ((uint64_t)t << 40) ^ ((uint64_t)r << 32) ^ ((uint64_t)s * 0x9E37ull);
    size_t n = nel(t);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(1e-2 * rng_normal(&st));
    if (SPECS[t].geo)
        for (size_t i = 0; i < n; i++)
            x[i] *= (float)(4.0 / (1.0 + (double)(i % SPECS[t].cols)));
}

/* Layer inputs of the geometry tensor at step s (the same on every rank). */
static void gen_x(float *x, int s)
{
    uint64_t st = 0xC0FFEEull + (uint64_t)s;
    for (size_t i = 0; i < (size_t)XROWS * SPECS[GEO_T].cols; i++)
        x[i] = (float)(rng_normal(&st) * 4.0 / (1.0 + (double)(i % SPECS[GEO_T].cols)));
}

static void fill_desc(gift_tensor_desc_t *d, int t, int memory)
{
    gift_tensor_desc_t z = GIFT_TENSOR_INIT;
    *d = z;
    d->name = SPECS[t].name;
    d->rows = SPECS[t].rows;
    d->cols = SPECS[t].cols;
    d->push_codec = SPECS[t].push;
    d->pull_codec = SPECS[t].pull;
    d->error_feedback = SPECS[t].ef;
    d->stochastic = SPECS[t].sr;
    d->geometry = SPECS[t].geo;
    if (SPECS[t].geo) {
        d->rank = 8;
        d->refresh = REFRESH;
    }
    d->memory = memory;
    d->device = 0;
}

static gift_client_t *open_client(int rank, int world)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_client_t *c = NULL;
    char servers[64];
    int rc;
    snprintf(servers, sizeof servers, "127.0.0.1:%d", D.port);
    o.servers = servers;
    o.rank = rank;
    o.world_size = world;
    o.chunk_bytes = 4096;  /* 1024 floats: several chunks per tensor */
    o.timeout_ms = 240000; /* the emulator is slow */
    o.seed = 77;
    rc = gift_client_open(&o, &c);
    CHECK(rc == 0, "gift_client_open: %s", gift_strerror(rc));
    return c;
}

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    CHECK(e == cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return p;
}

static void h2d(void *d, const void *h, size_t n)
{
    cudaError_t e = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    CHECK(e == cudaSuccess, "cudaMemcpy H2D: %s", cudaGetErrorString(e));
}

static void d2h(void *h, const void *d, size_t n)
{
    cudaError_t e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    CHECK(e == cudaSuccess, "cudaMemcpy D2H: %s", cudaGetErrorString(e));
}

static void poison_dev(void *d, size_t n)
{
    cudaError_t e = cudaMemset(d, 0xFF, n);
    CHECK(e == cudaSuccess, "cudaMemset: %s", cudaGetErrorString(e));
}

/* ------------------------------------------------------------------ */
/* parity                                                               */
/* ------------------------------------------------------------------ */

/* One worker of a run: NSTEPS steps of every tensor, every pulled result
 * appended to path (step-major, tensor order), then the epochs switched.
 * Runs in a forked child: a failed check ends it with a non-zero status. */
static void parity_worker(int rank, int memory, const char *path)
{
    gift_tensor_desc_t d[NT];
    gift_client_t *c = open_client(rank, 2);
    gift_client_stats_t st;
    float *g[NT], *out[NT], *dg[NT] = {0}, *dout[NT] = {0}, *x, *dx = NULL;
    gift_op_t *op[NT];
    FILE *f = fopen(path, "wb");
    int rc, dev = memory == GIFT_MEMORY_CUDA;

    CHECK(f != NULL, "fopen %s", path);
    for (int t = 0; t < NT; t++) {
        fill_desc(&d[t], t, memory);
        g[t] = malloc(nel(t) * sizeof(float));
        out[t] = malloc(nel(t) * sizeof(float));
        CHECK(g[t] != NULL && out[t] != NULL, "%s", "g[t] != NULL && out[t] != NULL");
        if (dev) {
            dg[t] = dmalloc(nel(t) * sizeof(float));
            dout[t] = dmalloc(nel(t) * sizeof(float));
        }
    }
    x = malloc((size_t)XROWS * SPECS[GEO_T].cols * sizeof(float));
    CHECK(x != NULL, "%s", "x != NULL");
    if (dev)
        dx = dmalloc((size_t)XROWS * SPECS[GEO_T].cols * sizeof(float));
    rc = gift_declare(c, d, NT);
    CHECK(rc == 0, "rank %d: gift_declare: %s", rank, gift_strerror(rc));
    for (int s = 0; s < NSTEPS; s++) {
        if (s % REFRESH == 0) {
            gen_x(x, s);
            if (dev)
                h2d(dx, x, (size_t)XROWS * SPECS[GEO_T].cols * sizeof(float));
            rc = gift_sketch_inputs(c, GEO_T, (uint64_t)s, dev ? dx : x, XROWS);
            CHECK(rc == 0, "rank %d step %d: gift_sketch_inputs: %s", rank, s, gift_strerror(rc));
        }
        for (int t = 0; t < NT; t++) {
            gen(g[t], t, rank, s);
            memset(out[t], 0xFF, nel(t) * sizeof(float));
            if (dev) {
                h2d(dg[t], g[t], nel(t) * sizeof(float));
                poison_dev(dout[t], nel(t) * sizeof(float));
            }
        }
        for (int t = NT - 1; t >= 0; t--) {
            rc = gift_push_pull(c, (uint32_t)t, (uint64_t)s, dev ? dg[t] : g[t],
                                dev ? dout[t] : out[t], NULL, NULL, &op[t]);
            CHECK(rc == 0, "rank %d step %d %s: gift_push_pull: %s", rank, s, SPECS[t].name,
                  gift_strerror(rc));
        }
        for (int t = 0; t < NT; t++) {
            rc = gift_op_wait(op[t]);
            CHECK(rc == 0, "rank %d step %d %s (%s): %s", rank, s, SPECS[t].name,
                  dev ? "device" : "host", gift_strerror(rc));
            gift_op_free(op[t]);
            if (dev)
                d2h(out[t], dout[t], nel(t) * sizeof(float));
            CHECK(fwrite(out[t], sizeof(float), nel(t), f) == nel(t), "%s",
                  "fwrite(out[t], sizeof(float), nel(t), f) == nel(t)");
        }
    }
    gift_client_stats(c, &st);
    if (gift_emu_launch_count != NULL)
        fprintf(stderr, "test_parity: rank %d, %s run: %lu emulated kernel launches\n", rank,
                dev ? "device" : "host", launches());
    /* On the emulator, the device run must have run kernels, the host run none. */
    CHECK(gift_emu_launch_count == NULL || (launches() > 0) == dev,
          "rank %d, %s run: %lu kernels launched", rank, dev ? "device" : "host", launches());
    CHECK(fwrite(&st.epochs_switched, sizeof st.epochs_switched, 1, f) == 1, "%s",
          "fwrite(&st.epochs_switched, sizeof st.epochs_switched, 1, f) == 1");
    CHECK(fclose(f) == 0, "%s", "fclose(f) == 0");
    gift_client_close(c);
    for (int t = 0; t < NT; t++) {
        free(g[t]);
        free(out[t]);
        if (dev) {
            cudaFree(dg[t]);
            cudaFree(dout[t]);
        }
    }
    if (dev)
        cudaFree(dx);
    free(x);
}

static size_t run_floats(void)
{
    size_t n = 0;
    for (int t = 0; t < NT; t++)
        n += nel(t);
    return n * NSTEPS;
}

/* Starts giftd (world 2; policy none: every epoch Euclidean), runs both
 * workers of one run, stops giftd; the results go to path_fmt with the rank. */
static void parity_run(int memory, const char *tmpl, int euclid)
{
    static const char *const flags[] = {"--world-size", "2", NULL};
    static const char *const none[] = {"--world-size", "2", "--policy", "none", NULL};
    daemon_opts_t o = {.log_prefix = "giftd-clientdev-", .flags = euclid ? none : flags};
    pid_t pid[2];
    daemon_start_opts(&o, NULL, 1);
    for (int r = 0; r < 2; r++) {
        char path[600];
        snprintf(path, sizeof path, tmpl, r);
        pid[r] = fork();
        ck_assert_msg(pid[r] >= 0, "fork: %s", strerror(errno));
        if (pid[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            alarm(WORKER_TIMEOUT_MS / 1000);
            in_worker = 1;
            parity_worker(r, memory, path);
            _exit(0);
        }
    }
    for (int r = 0; r < 2; r++) {
        int status = 0;
        if (!wait_exit(pid[r], WORKER_TIMEOUT_MS + 5000, &status)) {
            kill(pid[0], SIGKILL);
            kill(pid[1], SIGKILL);
            ck_abort_msg("%s run: worker %d did not finish; giftd log %s:\n%s",
                         memory ? "device" : "host", r, D.log_path, log_tail());
        }
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "%s run: worker %d ended with status 0x%x (its failure is above); giftd "
                      "log %s:\n%s",
                      memory ? "device" : "host", r, status, D.log_path, log_tail());
    }
    daemon_teardown_ms(20000);
}

static float *load(const char *path, uint32_t *epochs)
{
    size_t n = run_floats();
    float *v = malloc(n * sizeof(float));
    FILE *f = fopen(path, "rb");
    ck_assert_msg(v != NULL && f != NULL, "open %s", path);
    ck_assert_msg(fread(v, sizeof(float), n, f) == n && fread(epochs, sizeof *epochs, 1, f) == 1,
                  "%s: short", path);
    fclose(f);
    unlink(path);
    return v;
}

static void parity(int euclid)
{
    const char *tmp = getenv("TMPDIR");
    char host_t[512], dev_t[512], path[600];
    float *res[2][2]; /* [run: host, device][rank] */
    uint32_t epochs[2][2];
    float *want = NULL, *a = NULL, *b = NULL;
    size_t base = 0;

    snprintf(host_t, sizeof host_t, "%s/gift-clientdev-%d-host-%%d.bin", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    snprintf(dev_t, sizeof dev_t, "%s/gift-clientdev-%d-dev-%%d.bin", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    parity_run(GIFT_MEMORY_HOST, host_t, euclid);
    parity_run(GIFT_MEMORY_CUDA, dev_t, euclid);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, host_t, r);
        res[0][r] = load(path, &epochs[0][r]);
        snprintf(path, sizeof path, dev_t, r);
        res[1][r] = load(path, &epochs[1][r]);
    }
    for (int k = 0; k < 2; k++)
        ck_assert_msg(epochs[k][0] >= 1 && epochs[k][1] >= 1,
                      "%s run: the geometry tensor switched epochs %u/%u times (want >= 1)",
                      k ? "device" : "host", epochs[k][0], epochs[k][1]);
    for (int s = 0; s < NSTEPS; s++) {
        for (int t = 0; t < NT; t++) {
            size_t n = nel(t);
            double d2 = 0, h2 = 0, e2[2] = {0, 0}, m2 = 0;
            want = realloc(want, n * sizeof(float));
            a = realloc(a, n * sizeof(float));
            b = realloc(b, n * sizeof(float));
            gen(a, t, 0, s);
            gen(b, t, 1, s);
            for (size_t i = 0; i < n; i++)
                want[i] = (a[i] + b[i]) / 2;
            for (int k = 0; k < 2; k++)
                for (size_t i = 0; i < n; i++)
                    require_msg(memcmp(&res[k][0][base + i], &res[k][1][base + i], 4) == 0,
                                "%s run, step %d, %s: ranks differ at element %zu: %.9g vs %.9g",
                                k ? "device" : "host", s, SPECS[t].name, i,
                                (double)res[k][0][base + i], (double)res[k][1][base + i]);
            for (size_t i = 0; i < n; i++) {
                double h = res[0][0][base + i], dv = res[1][0][base + i];
                if (!SPECS[t].geo || euclid)
                    require_msg(memcmp(&res[0][0][base + i], &res[1][0][base + i], 4) == 0,
                                "step %d, %s: device and host results differ first at element "
                                "%zu: device %.9g (0x%08x), host %.9g (0x%08x)",
                                s, SPECS[t].name, i, dv, f2u((float)dv), h, f2u((float)h));
                require_msg(isfinite(h) && isfinite(dv), "step %d, %s: element %zu not finite", s,
                            SPECS[t].name, i);
                d2 += (dv - h) * (dv - h);
                h2 += h * h;
                e2[0] += (h - want[i]) * (h - want[i]);
                e2[1] += (dv - want[i]) * (dv - want[i]);
                m2 += (double)want[i] * want[i];
            }
            if (SPECS[t].geo)
                ck_assert_msg(sqrt(d2 / h2) <= GEO_TOL,
                              "step %d, %s: device vs host relative L2 %.4g > %.3g", s,
                              SPECS[t].name, sqrt(d2 / h2), GEO_TOL);
            for (int k = 0; k < 2; k++)
                ck_assert_msg(sqrt(e2[k] / m2) <= MEAN_TOL(t),
                              "%s run, step %d, %s: relative L2 to the exact mean %.4g > %.3g",
                              k ? "device" : "host", s, SPECS[t].name, sqrt(e2[k] / m2),
                              MEAN_TOL(t));
            if (SPECS[t].geo)
                fprintf(stderr,
                        "test_parity: step %d %s: device vs host %.3g, to the mean: host "
                        "%.3g device %.3g\n",
                        s, SPECS[t].name, sqrt(d2 / h2), sqrt(e2[0] / m2), sqrt(e2[1] / m2));
            base += n;
        }
    }
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 2; r++)
            free(res[k][r]);
    free(want);
    free(a);
    free(b);
}

START_TEST(test_parity)
{
    parity(0);
}
END_TEST

/* The owner's policy none (issue 24): the geometry tensor's epochs are
 * Euclidean, which the device path applies as an identity transform, so
 * even that tensor must be bit-identical between the host and the device
 * runs, and its sketches still build epochs. */
START_TEST(test_parity_policy_none)
{
    parity(1);
}
END_TEST

/* ------------------------------------------------------------------ */
/* errors                                                               */
/* ------------------------------------------------------------------ */

START_TEST(test_errors)
{
    static const char *const flags[] = {"--world-size", "1", NULL};
    daemon_opts_t o = {.log_prefix = "giftd-clientdev-", .flags = flags};
    enum { ROWS = 64, COLS = 100, N = ROWS * COLS }; /* 7 chunks of 1024 floats */
    gift_tensor_desc_t d[3];
    gift_client_t *c;
    gift_op_t *op;
    float *g = malloc(N * sizeof(float)), *bad = malloc(N * sizeof(float));
    float *out = malloc(N * sizeof(float)), *dg, *dout;
    int rc;

    ck_assert(g != NULL && bad != NULL && out != NULL);
    daemon_start_opts(&o, NULL, 1);
    c = open_client(0, 1);
    /* A device that does not exist, an unknown memory kind. */
    fill_desc(&d[0], 0, GIFT_MEMORY_CUDA);
    d[0].device = gift_gpu_device_count();
    ck_assert_int_eq(gift_declare(c, d, 1), GIFT_ENODEV);
    d[0].device = -1;
    ck_assert_int_eq(gift_declare(c, d, 1), GIFT_ENODEV);
    d[0].device = 0;
    d[0].memory = 2;
    ck_assert_int_eq(gift_declare(c, d, 1), GIFT_EINVAL);

    for (int t = 0; t < 3; t++) {
        gift_tensor_desc_t z = GIFT_TENSOR_INIT;
        d[t] = z;
        d[t].rows = ROWS;
        d[t].cols = COLS;
        d[t].memory = t < 2 ? GIFT_MEMORY_CUDA : GIFT_MEMORY_HOST;
    }
    d[0].name = "f32";
    d[0].push_codec = d[0].pull_codec = GIFT_CODEC_F32;
    d[1].name = "e4m3_ef";
    d[1].push_codec = d[1].pull_codec = GIFT_CODEC_FP8_E4M3;
    d[1].error_feedback = 1;
    d[2].name = "host";
    d[2].push_codec = d[2].pull_codec = GIFT_CODEC_FP8_E4M3;
    rc = gift_declare(c, d, 3);
    ck_assert_msg(rc == 0, "gift_declare: %s", gift_strerror(rc));
    dg = dmalloc(N * sizeof(float));
    dout = dmalloc(N * sizeof(float));
    for (int s = 0; s < 3; s++) {
        for (int t = 0; t < 2; t++) {
            double e2 = 0, g2 = 0;
            uint64_t st = 1000u + (uint64_t)(s * 2 + t);
            for (size_t i = 0; i < N; i++)
                g[i] = (float)rng_normal(&st);
            memcpy(bad, g, sizeof(float) * N);
            bad[s == 1 ? 3 : N - 1] = s == 2 ? INFINITY : NAN; /* first or last chunk */
            h2d(dg, bad, N * sizeof(float));
            ck_assert_int_eq(gift_push(c, (uint32_t)t, (uint64_t)s, dg, NULL, NULL, &op), 0);
            rc = gift_op_wait(op);
            ck_assert_msg(rc == GIFT_ENONFINITE, "step %d %s: push with a NaN: %s", s, d[t].name,
                          gift_strerror(rc));
            gift_op_free(op);
            /* The same step again, clean. */
            h2d(dg, g, N * sizeof(float));
            poison_dev(dout, N * sizeof(float));
            ck_assert_int_eq(gift_push_pull(c, (uint32_t)t, (uint64_t)s, dg, dout, NULL, NULL, &op),
                             0);
            rc = gift_op_wait(op);
            ck_assert_msg(rc == 0, "step %d %s: clean retry: %s", s, d[t].name, gift_strerror(rc));
            gift_op_free(op);
            d2h(out, dout, N * sizeof(float));
            for (size_t i = 0; i < N; i++) {
                require_msg(isfinite(out[i]), "step %d %s: element %zu is %g", s, d[t].name, i,
                            (double)out[i]);
                if (t == 0)
                    require_msg(out[i] == g[i], "step %d f32: element %zu is %.9g, want %.9g", s, i,
                                (double)out[i], (double)g[i]);
                e2 += ((double)out[i] - g[i]) * ((double)out[i] - g[i]);
                g2 += (double)g[i] * g[i];
            }
            ck_assert_msg(sqrt(e2 / g2) < 0.08, "step %d %s: relative L2 %.4g", s, d[t].name,
                          sqrt(e2 / g2));
        }
        /* The host tensor of the same client. */
        memset(out, 0xFF, N * sizeof(float));
        ck_assert_int_eq(gift_push_pull(c, 2, (uint64_t)s, g, out, NULL, NULL, &op), 0);
        rc = gift_op_wait(op);
        ck_assert_msg(rc == 0, "step %d host tensor: %s", s, gift_strerror(rc));
        gift_op_free(op);
        for (size_t i = 0; i < N; i++)
            require_msg(isfinite(out[i]), "step %d host: element %zu is %g", s, i, (double)out[i]);
    }
    gift_client_close(c);
    cudaFree(dg);
    cudaFree(dout);
    free(g);
    free(bad);
    free(out);
    daemon_teardown_ms(20000);
}
END_TEST

/* ------------------------------------------------------------------ */
/* replay                                                               */
/* ------------------------------------------------------------------ */

/* A shard killed after a device push was acknowledged, and a fresh giftd on
 * its port: the client reconnects and replays the push from its pinned host
 * copies of the payloads (the device gradient may be gone), and the pull
 * returns the same result as without the restart. */
START_TEST(test_replay)
{
    /* With checkpoints: a shard restarted empty would refuse the workers
     * that pulled from it (GIFT_ESTATE) instead of taking the replay. */
    char dir[256], rm[300];
    const char *tmp = getenv("TMPDIR");
    const char *flags[] = {"--world-size", "1", "--checkpoint-steps", "1", "--data-dir", dir, NULL};
    daemon_opts_t o = {.log_prefix = "giftd-clientdev-", .flags = flags};
    enum { ROWS = 64, COLS = 100, N = ROWS * COLS };
    gift_tensor_desc_t d[2];
    gift_client_stats_t st;
    gift_client_t *c;
    gift_op_t *op[2];
    float *g[2], *out = malloc(N * sizeof(float)), *dg[2], *dout;
    char port[16];
    int rc;

    ck_assert(out != NULL);
    snprintf(dir, sizeof dir, "%s/giftd-clientdev-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    daemon_start_opts(&o, NULL, 1);
    snprintf(port, sizeof port, "%d", D.port);
    c = open_client(0, 1);
    for (int t = 0; t < 2; t++) {
        gift_tensor_desc_t z = GIFT_TENSOR_INIT;
        d[t] = z;
        d[t].rows = ROWS;
        d[t].cols = COLS;
        d[t].memory = GIFT_MEMORY_CUDA;
        d[t].push_codec = d[t].pull_codec = t ? GIFT_CODEC_FP8_E4M3 : GIFT_CODEC_F32;
        d[t].error_feedback = t;
        d[t].name = t ? "e4m3_ef" : "f32";
        g[t] = malloc(N * sizeof(float));
        ck_assert(g[t] != NULL);
        dg[t] = dmalloc(N * sizeof(float));
    }
    dout = dmalloc(N * sizeof(float));
    rc = gift_declare(c, d, 2);
    ck_assert_msg(rc == 0, "gift_declare: %s", gift_strerror(rc));
    for (int s = 0; s < 2; s++) {
        for (int t = 0; t < 2; t++) {
            uint64_t seed = 555u + (uint64_t)(10 * s + t);
            for (size_t i = 0; i < N; i++)
                g[t][i] = (float)rng_normal(&seed);
            h2d(dg[t], g[t], N * sizeof(float));
            ck_assert_int_eq(gift_push(c, (uint32_t)t, (uint64_t)s, dg[t], NULL, NULL, &op[t]), 0);
        }
        for (int t = 0; t < 2; t++) {
            rc = gift_op_wait(op[t]);
            ck_assert_msg(rc == 0, "step %d %s: push: %s", s, d[t].name, gift_strerror(rc));
            gift_op_free(op[t]);
            /* The gradient is gone once its push completed. */
            poison_dev(dg[t], N * sizeof(float));
        }
        if (s == 1) {
            /* Acknowledged, not yet pulled: SIGKILL, a fresh giftd on the port. */
            static const char *extra[] = {"--port", NULL, NULL};
            int status;
            extra[1] = port;
            ck_assert(kill(D.pid, SIGKILL) == 0);
            ck_assert(wait_exit(D.pid, 10000, &status));
            if (D.out_fd >= 0)
                close(D.out_fd);
            unlink(D.log_path);
            daemon_start_opts(&o, extra, 1);
        }
        for (int t = 0; t < 2; t++) {
            double e2 = 0, g2 = 0;
            poison_dev(dout, N * sizeof(float));
            ck_assert_int_eq(gift_pull(c, (uint32_t)t, (uint64_t)s, dout, NULL, NULL, &op[t]), 0);
            rc = gift_op_wait(op[t]);
            ck_assert_msg(rc == 0, "step %d %s: pull: %s", s, d[t].name, gift_strerror(rc));
            gift_op_free(op[t]);
            d2h(out, dout, N * sizeof(float));
            for (size_t i = 0; i < N; i++) {
                if (t == 0)
                    require_msg(out[i] == g[t][i], "step %d f32: element %zu is %.9g, want %.9g", s,
                                i, (double)out[i], (double)g[t][i]);
                require_msg(isfinite(out[i]), "step %d %s: element %zu is %g", s, d[t].name, i,
                            (double)out[i]);
                e2 += ((double)out[i] - g[t][i]) * ((double)out[i] - g[t][i]);
                g2 += (double)g[t][i] * g[t][i];
            }
            ck_assert_msg(sqrt(e2 / g2) < 0.08, "step %d %s: relative L2 %.4g", s, d[t].name,
                          sqrt(e2 / g2));
        }
    }
    gift_client_stats(c, &st);
    ck_assert_msg(st.reconnects >= 1 && st.replays >= 1, "%llu reconnects, %llu replays",
                  (unsigned long long)st.reconnects, (unsigned long long)st.replays);
    gift_client_close(c);
    for (int t = 0; t < 2; t++) {
        cudaFree(dg[t]);
        free(g[t]);
    }
    cudaFree(dout);
    free(out);
    daemon_teardown_ms(20000);
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("client_device");
    TCase *tc = tcase_create("cluster");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_replay);
    tcase_add_test(tc, test_parity);
    tcase_add_test(tc, test_parity_policy_none);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    pid_t pid;
    int status = 0;

    /* A CUDA context does not survive fork(): probe the device in a child,
     * so that this process (which forks giftd, the tests and the workers)
     * never initialises CUDA itself. */
    pid = fork();
    if (pid == 0)
        _exit(gift_gpu_device_count() > 0 ? 0 : 77);
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return EXIT_FAILURE;
    if (WEXITSTATUS(status) == 77) {
        fprintf(stderr, "test_client_device: no CUDA device: skipped\n");
        return 77;
    }
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    signal(SIGPIPE, SIG_IGN);
    return gift_test_run(suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
