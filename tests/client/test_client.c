/*
 * test_client.c: libgiftclient end to end, against real giftd processes
 * (GIFTD_BIN) on 127.0.0.1 and worker processes forked from this test.
 *
 *   acceptance  2 shards, 3 worker processes, 20 steps of a list mixing
 *               f32 2-D, bf16, fp8-e4m3 with the GIFT geometry (refreshed
 *               every 5 steps from synthetic layer inputs), nvfp4, fp8 with
 *               error feedback and stochastic rounding, and 1-D tensors
 *               small enough to be fused. Every worker's pulled bytes must be
 *               identical (hashes through pipes); f32 means exact to 1e-6,
 *               the others within what their codecs predict: a push and a
 *               pull each add the format's relL2 on Gaussian data (fp8-e4m3
 *               0.026, nvfp4 0.095 round-to-nearest), so fp8 ~0.036 < 0.05 and
 *               nvfp4 ~0.134 < 0.15.
 *   frames      a Llama-shaped list (~100 small tensors, a few large ones):
 *               a step costs exactly one frame per wire chunk each way.
 *   restart     one shard (with checkpoints) is SIGKILLed between the pushes
 *               and the pulls of a step and a new giftd on its data directory
 *               takes its port: the workers reconnect, replay the pushes, and
 *               the run ends with exact results. (Without checkpoints the
 *               restarted shard refuses them, GIFT_ESTATE: its state is gone;
 *               tests/tools/lost_state_check.sh.)
 *   timeout     a pull whose step cannot finish fails with GIFT_ETIMEDOUT.
 *   errors      bad options and unreachable shards fail cleanly.
 *
 * Bounded in time: every wait has a deadline, every process started here
 * gets PR_SET_PDEATHSIG and is killed at the end of its test.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gift/client.h"
#include "gift_codec.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"
#include "gift_test_time.h"

#ifndef GIFTD_BIN
#error "compile with -DGIFTD_BIN=\"path of the giftd executable\""
#endif

#define READY_TIMEOUT_MS 20000
#define WORKER_TIMEOUT_MS 120000
#define MAX_DAEMONS 4
#define MAX_WORKERS 4

extern char **environ;

/* ------------------------------------------------------------------ */
/* Hashing (clocks and randomness: tests/common)                        */
/* ------------------------------------------------------------------ */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

/* ------------------------------------------------------------------ */
/* Daemons                                                               */
/* ------------------------------------------------------------------ */

typedef struct daemon {
    pid_t pid;
    int port;
    int shard, nshards, world;
    char log[512];
    char data_dir[512]; /* "": no checkpoints; else --checkpoint-steps 1 in it */
} daemon_t;

static daemon_t D[MAX_DAEMONS];
static int ND;

static const char *log_tail(const daemon_t *d)
{
    static char buf[2048];
    FILE *f = fopen(d->log, "r");
    size_t n = 0;
    long size;
    buf[0] = '\0';
    if (f == NULL)
        return buf;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > (long)sizeof buf - 1)
        fseek(f, size - (long)sizeof buf + 1, SEEK_SET);
    else
        fseek(f, 0, SEEK_SET);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Starts giftd as shard `shard` of nshards on port (0: any) and waits for its
 * ready line. */
static void daemon_start(daemon_t *d, int shard, int nshards, int world, int port)
{
    const char *tmp = getenv("TMPDIR");
    char ports[16], sid[16], ns[16], ws[16], line[256];
    char *argv[24];
    int out[2], log_fd, argc = 0;
    size_t len = 0;
    double end;
    pid_t parent = getpid();

    d->shard = shard;
    d->nshards = nshards;
    d->world = world;
    snprintf(d->log, sizeof d->log, "%s/giftd-client-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    log_fd = mkstemp(d->log);
    ck_assert_msg(log_fd >= 0, "mkstemp: %s", strerror(errno));
    ck_assert_msg(pipe2(out, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));
    snprintf(ports, sizeof ports, "%d", port);
    snprintf(sid, sizeof sid, "%d", shard);
    snprintf(ns, sizeof ns, "%d", nshards);
    snprintf(ws, sizeof ws, "%d", world);
    argv[argc++] = (char *)GIFTD_BIN;
    argv[argc++] = (char *)"--bind";
    argv[argc++] = (char *)"127.0.0.1";
    argv[argc++] = (char *)"--port";
    argv[argc++] = ports;
    argv[argc++] = (char *)"--http-port";
    argv[argc++] = (char *)"-1";
    argv[argc++] = (char *)"--shard-id";
    argv[argc++] = sid;
    argv[argc++] = (char *)"--num-shards";
    argv[argc++] = ns;
    argv[argc++] = (char *)"--world-size";
    argv[argc++] = ws;
    if (d->data_dir[0] != '\0') {
        argv[argc++] = (char *)"--checkpoint-steps";
        argv[argc++] = (char *)"1";
        argv[argc++] = (char *)"--data-dir";
        argv[argc++] = d->data_dir;
    }
    argv[argc] = NULL;

    d->pid = fork();
    ck_assert_msg(d->pid >= 0, "fork: %s", strerror(errno));
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(log_fd, STDERR_FILENO) < 0)
            _exit(127);
        for (char **e = environ; *e != NULL;) {
            if (strncmp(*e, "GIFTD_", 6) == 0) {
                char name[128];
                const char *eq = strchr(*e, '=');
                size_t nl = eq ? (size_t)(eq - *e) : strlen(*e);
                if (nl >= sizeof name)
                    nl = sizeof name - 1;
                memcpy(name, *e, nl);
                name[nl] = '\0';
                unsetenv(name);
                continue;
            }
            e++;
        }
        execv(argv[0], argv);
        _exit(127);
    }
    close(out[1]);
    close(log_fd);
    end = now_ms() + READY_TIMEOUT_MS;
    while (memchr(line, '\n', len) == NULL) {
        struct pollfd pfd = {.fd = out[0], .events = POLLIN};
        int left = (int)(end - now_ms());
        ssize_t n;
        ck_assert_msg(left > 0 && len < sizeof line - 1,
                      "giftd printed no ready line in %d ms; log %s:\n%s", READY_TIMEOUT_MS, d->log,
                      log_tail(d));
        if (poll(&pfd, 1, left) <= 0)
            continue;
        n = read(out[0], line + len, sizeof line - 1 - len);
        ck_assert_msg(n > 0, "giftd closed stdout before its ready line; log %s:\n%s", d->log,
                      log_tail(d));
        len += (size_t)n;
    }
    line[len] = '\0';
    close(out[0]);
    ck_assert_msg(sscanf(line, "giftd ready port=%d", &d->port) == 1 && d->port > 0,
                  "unexpected ready line \"%s\"", line);
}

/* Sends sig and reaps the daemon (SIGKILL after timeout_ms). Returns its status. */
static int daemon_signal(daemon_t *d, int sig, int timeout_ms)
{
    int status = 0;
    double end = now_ms() + timeout_ms;
    if (d->pid <= 0)
        return 0;
    kill(d->pid, sig);
    for (;;) {
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid || (r < 0 && errno != EINTR))
            break;
        if (now_ms() > end) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            break;
        }
        sleep_ms(5);
    }
    d->pid = -1;
    return status;
}

static void daemons_start(int n, int world)
{
    ND = n;
    for (int i = 0; i < n; i++)
        daemon_start(&D[i], i, n, world, 0);
}

/* Stops every daemon; their logs go when the test passed this far. */
static void daemons_stop(void)
{
    for (int i = 0; i < ND; i++) {
        daemon_signal(&D[i], SIGTERM, 10000);
        unlink(D[i].log);
    }
    ND = 0;
}

static void servers_string(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < ND; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s127.0.0.1:%d", i ? "," : "", D[i].port);
}

/* ------------------------------------------------------------------ */
/* Workers                                                               */
/* ------------------------------------------------------------------ */

/* What a worker reports to the test through its pipe. */
typedef struct result {
    int rc;   /* 0, or the first failure */
    int line; /* where it failed */
    char what[160];
    uint64_t hash;  /* of every pulled byte, in order */
    double err[16]; /* per-check worst error (meaning per test) */
    uint64_t frames_out, frames_in, reconnects, replays;
    uint32_t epochs_switched;
} result_t;

typedef struct worker {
    pid_t pid;
    int res_fd; /* read end: result_t */
    int sig_fd; /* read end: one byte per "waiting" signal (restart test) */
    int go_fd;  /* write end: one byte releases the worker */
} worker_t;

typedef void (*worker_fn)(int rank, int world, const char *servers, result_t *res, int sig_w,
                          int go_r);

#define WFAIL(res, code, ...)                                                                      \
    do {                                                                                           \
        (res)->rc = (code) ? (code) : -1;                                                          \
        (res)->line = __LINE__;                                                                    \
        snprintf((res)->what, sizeof(res)->what, __VA_ARGS__);                                     \
        goto out;                                                                                  \
    } while (0)

static void workers_start(worker_t *w, int n, worker_fn fn, const char *servers)
{
    pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        int res[2], sig[2], go[2];
        ck_assert(pipe(res) == 0 && pipe(sig) == 0 && pipe(go) == 0);
        w[r].pid = fork();
        ck_assert_msg(w[r].pid >= 0, "fork: %s", strerror(errno));
        if (w[r].pid == 0) {
            result_t out;
            ssize_t wr;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
            close(res[0]);
            close(sig[0]);
            close(go[1]);
            memset(&out, 0, sizeof out);
            fn(r, n, servers, &out, sig[1], go[0]);
            wr = write(res[1], &out, sizeof out);
            _exit(wr == (ssize_t)sizeof out ? 0 : 1);
        }
        close(res[1]);
        close(sig[1]);
        close(go[0]);
        w[r].res_fd = res[0];
        w[r].sig_fd = sig[0];
        w[r].go_fd = go[1];
    }
}

/* Reads every worker's result (killing the lot past the deadline). */
static void workers_finish(worker_t *w, int n, result_t *res)
{
    double end = now_ms() + WORKER_TIMEOUT_MS;
    for (int r = 0; r < n; r++) {
        size_t got = 0;
        int status = 0;
        while (got < sizeof res[r]) {
            struct pollfd pfd = {.fd = w[r].res_fd, .events = POLLIN};
            int left = (int)(end - now_ms());
            ssize_t k;
            if (left <= 0 || poll(&pfd, 1, left) <= 0) {
                for (int q = 0; q < n; q++)
                    kill(w[q].pid, SIGKILL);
                ck_abort_msg("worker %d gave no result within %d ms", r, WORKER_TIMEOUT_MS);
            }
            k = read(w[r].res_fd, (char *)&res[r] + got, sizeof res[r] - got);
            ck_assert_msg(k > 0, "worker %d exited without a result", r);
            got += (size_t)k;
        }
        waitpid(w[r].pid, &status, 0);
        close(w[r].res_fd);
        close(w[r].sig_fd);
        close(w[r].go_fd);
        ck_assert_msg(res[r].rc == 0, "worker %d failed at line %d: %s (%s)", r, res[r].line,
                      res[r].what, gift_strerror(res[r].rc));
    }
}

/* ------------------------------------------------------------------ */
/* Synthetic gradients                                                   */
/* ------------------------------------------------------------------ */

/* Gradient of tensor t for rank r at step s: n values from a fixed stream. */
static void gen(float *x, size_t n, int t, int r, uint64_t s, double scale)
{
    uint64_t st = 0x1234567ull ^ ((uint64_t)t << 40) ^ ((uint64_t)r << 32) ^ (s * 0x9E37ull);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_normal(&st));
}

/* The input geometry of the GIFT tensor: A^(1/2) = V diag(sqrt(s)) V with
 * V = I - 2 v v^T / |v|^2 (a reflection) and s_i = 4 / (1 + i)^1.5. */
#define GEO_DIN 96
static double Vh[GEO_DIN], Sq[GEO_DIN];

static void geo_init(void)
{
    uint64_t st = 77;
    double nn = 0.0;
    for (int i = 0; i < GEO_DIN; i++) {
        Vh[i] = rng_normal(&st);
        nn += Vh[i] * Vh[i];
        Sq[i] = sqrt(4.0 / pow(1.0 + i, 1.5));
    }
    for (int i = 0; i < GEO_DIN; i++)
        Vh[i] /= sqrt(nn);
}

/* Rows of x (rows x GEO_DIN) <- rows of Z A^(1/2). */
static void geo_shape(float *x, size_t rows)
{
    double y[GEO_DIN];
    for (size_t r = 0; r < rows; r++) {
        float *row = x + r * GEO_DIN;
        double dot = 0.0, dot2 = 0.0;
        for (int i = 0; i < GEO_DIN; i++)
            dot += row[i] * Vh[i];
        for (int i = 0; i < GEO_DIN; i++)
            y[i] = (row[i] - 2.0 * dot * Vh[i]) * Sq[i];
        for (int i = 0; i < GEO_DIN; i++)
            dot2 += y[i] * Vh[i];
        for (int i = 0; i < GEO_DIN; i++)
            row[i] = (float)(y[i] - 2.0 * dot2 * Vh[i]);
    }
}

/* ||got - want|| / ||scale||: for f32 means scale is sum_r |g_r| / W, the
 * size of a float summation's error (|fl(sum) - sum| <= n eps sum |x|), so
 * that summands which cancel do not turn rounding into a relative error. */
static double rel_l2_scaled(const float *got, const double *want, const double *scale, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = got[i] - want[i];
        num += e * e;
        den += scale[i] * scale[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static double rel_l2(const float *got, const double *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = got[i] - want[i];
        num += e * e;
        den += want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------------ */
/* Acceptance: 2 shards, 3 workers, 20 steps                             */
/* ------------------------------------------------------------------ */

enum { A_F32, A_BF16, A_GEO, A_NVFP4, A_EF, A_B0, A_B1, A_B2, A_B3, A_B4, A_B5, A_B6, A_B7, A_N };
enum { ACC_STEPS = 20, ACC_REFRESH = 5, ACC_INPUTS = 256 };

/* err[] slots of the acceptance result. */
enum {
    E_F32,
    E_BF16,
    E_GEO,
    E_NVFP4,
    E_EF_STEP,
    E_EF_SUM,
    E_SMALL_F32,
    E_SMALL_BF16,
    E_SMALL_FP8,
    E_GEO_FIRST
};

static void acc_list(gift_tensor_desc_t *t)
{
    static const struct {
        const char *name;
        uint32_t rows, cols;
        gift_codec_t codec;
    } L[A_N] = {
        {"layers.0.attn.wq", 160, 128, GIFT_CODEC_F32}, /* 80 KiB: 3 chunks of 32 KiB */
        {"layers.0.mlp.w1", 96, 200, GIFT_CODEC_BF16},
        {"layers.0.mlp.w2", 128, GEO_DIN, GIFT_CODEC_FP8_E4M3},
        {"layers.0.attn.wo", 100, 256, GIFT_CODEC_NVFP4},
        {"layers.0.attn.wk", 80, 128, GIFT_CODEC_FP8_E4M3},
        {"layers.0.attn_norm", 1, 128, GIFT_CODEC_F32},
        {"layers.0.bq", 1, 96, GIFT_CODEC_F32},
        {"layers.0.b1", 1, 200, GIFT_CODEC_BF16},
        {"layers.0.ffn_norm", 1, 128, GIFT_CODEC_F32},
        {"layers.0.bk", 1, 37, GIFT_CODEC_BF16},
        {"layers.0.scale", 1, 1, GIFT_CODEC_F32},
        {"layers.0.b2", 1, 300, GIFT_CODEC_FP8_E4M3},
        {"layers.0.bo", 1, 77, GIFT_CODEC_FP8_E4M3},
    };
    for (int i = 0; i < A_N; i++) {
        gift_tensor_desc_t d = GIFT_TENSOR_INIT;
        d.name = L[i].name;
        d.rows = L[i].rows;
        d.cols = L[i].cols;
        d.push_codec = d.pull_codec = L[i].codec;
        t[i] = d;
    }
    t[A_GEO].geometry = 1;
    t[A_GEO].rank = 32;
    t[A_GEO].refresh = ACC_REFRESH;
    t[A_EF].pull_codec = GIFT_CODEC_F32;
    t[A_EF].error_feedback = 1;
    t[A_EF].stochastic = 1;
    t[A_B6].fp8_block = 32;
    t[A_B7].fp8_block = 32;
}

/* test_acceptance with codec threads: rank 0 none, rank 1 one, rank 2 two
 * (gift_client_opts_t.codec_threads), so the ranks' pulled bytes (T^-1 on
 * the I/O thread or on a codec thread) are compared with each other. */
static int g_acc_codec_threads;

static void acc_worker(int rank, int world, const char *servers, result_t *res, int sig_w, int go_r)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t[A_N];
    gift_client_t *c = NULL;
    float *g[A_N], *out[A_N], *X = NULL, *tmp = NULL;
    double *mean = NULL, *absm = NULL, *sum_got = NULL, *sum_want = NULL;
    gift_op_t *ops[A_N];
    gift_client_stats_t st;
    uint64_t h = 0xCBF29CE484222325ull;
    size_t n[A_N], maxn = 0;
    int rc;

    (void)sig_w;
    (void)go_r;
    memset(g, 0, sizeof g);
    memset(out, 0, sizeof out);
    acc_list(t);
    geo_init();
    for (int i = 0; i < A_N; i++) {
        n[i] = (size_t)t[i].rows * t[i].cols;
        if (n[i] > maxn)
            maxn = n[i];
        g[i] = malloc(n[i] * sizeof(float));
        out[i] = malloc(n[i] * sizeof(float));
        if (!g[i] || !out[i])
            WFAIL(res, GIFT_ENOMEM, "malloc");
    }
    mean = malloc(maxn * sizeof(double));
    absm = malloc(maxn * sizeof(double));
    tmp = malloc(maxn * sizeof(float));
    sum_got = calloc(n[A_EF], sizeof(double));
    sum_want = calloc(n[A_EF], sizeof(double));
    X = malloc((size_t)ACC_INPUTS * GEO_DIN * sizeof(float));
    if (!mean || !absm || !tmp || !sum_got || !sum_want || !X)
        WFAIL(res, GIFT_ENOMEM, "malloc");

    o.codec_threads = g_acc_codec_threads ? rank : 0;
    o.servers = servers;
    o.rank = rank;
    o.world_size = world;
    o.chunk_bytes = 32 * 1024;
    o.timeout_ms = 30000;
    o.connect_timeout_ms = 20000;
    if ((rc = gift_client_open(&o, &c)) < 0)
        WFAIL(res, rc, "gift_client_open");
    if ((rc = gift_declare(c, t, A_N)) < 0)
        WFAIL(res, rc, "gift_declare");

    for (uint64_t s = 0; s < ACC_STEPS; s++) {
        for (int i = 0; i < A_N; i++) {
            gen(g[i], n[i], i, rank, s, i == A_EF ? 0.01 : 1.0);
            if (i == A_GEO)
                geo_shape(g[i], t[i].rows);
        }
        if (s % ACC_REFRESH == 0) {
            gen(X, (size_t)ACC_INPUTS * GEO_DIN, 100, rank, s, 1.0);
            geo_shape(X, ACC_INPUTS);
            if ((rc = gift_sketch_inputs(c, A_GEO, s, X, ACC_INPUTS)) < 0)
                WFAIL(res, rc, "gift_sketch_inputs step %d", (int)s);
        }
        /* All at once, later-declared first as a backward pass would. */
        for (int i = A_N - 1; i >= 0; i--)
            if ((rc = gift_push_pull(c, (uint32_t)i, s, g[i], out[i], NULL, NULL, &ops[i])) < 0)
                WFAIL(res, rc, "gift_push_pull %d step %d", i, (int)s);
        for (int i = 0; i < A_N; i++) {
            rc = gift_op_wait(ops[i]);
            gift_op_free(ops[i]);
            if (rc < 0)
                WFAIL(res, rc, "op %d step %d", i, (int)s);
        }
        for (int i = 0; i < A_N; i++) {
            double e;
            h = fnv(h, out[i], n[i] * sizeof(float));
            /* The exact mean: every worker can make every rank's gradient. */
            memset(mean, 0, n[i] * sizeof(double));
            memset(absm, 0, n[i] * sizeof(double));
            for (int r = 0; r < world; r++) {
                gen(tmp, n[i], i, r, s, i == A_EF ? 0.01 : 1.0);
                if (i == A_GEO)
                    geo_shape(tmp, t[i].rows);
                for (size_t k = 0; k < n[i]; k++) {
                    mean[k] += tmp[k];
                    absm[k] += fabs(tmp[k]);
                }
            }
            for (size_t k = 0; k < n[i]; k++) {
                mean[k] /= world;
                absm[k] /= world;
            }
            e = t[i].pull_codec == GIFT_CODEC_F32 && t[i].push_codec == GIFT_CODEC_F32
                    ? rel_l2_scaled(out[i], mean, absm, n[i])
                    : rel_l2(out[i], mean, n[i]);
            switch (i) {
            case A_F32:
                res->err[E_F32] = fmax(res->err[E_F32], e);
                break;
            case A_BF16:
                res->err[E_BF16] = fmax(res->err[E_BF16], e);
                break;
            case A_GEO:
                res->err[s == 0 ? E_GEO_FIRST : E_GEO] =
                    fmax(res->err[s == 0 ? E_GEO_FIRST : E_GEO], e);
                break;
            case A_NVFP4:
                res->err[E_NVFP4] = fmax(res->err[E_NVFP4], e);
                break;
            case A_EF:
                res->err[E_EF_STEP] = fmax(res->err[E_EF_STEP], e);
                for (size_t k = 0; k < n[i]; k++) {
                    sum_got[k] += out[i][k];
                    sum_want[k] += mean[k];
                }
                break;
            case A_B0:
            case A_B1:
            case A_B3:
            case A_B5:
                res->err[E_SMALL_F32] = fmax(res->err[E_SMALL_F32], e);
                break;
            case A_B2:
            case A_B4:
                res->err[E_SMALL_BF16] = fmax(res->err[E_SMALL_BF16], e);
                break;
            default:
                res->err[E_SMALL_FP8] = fmax(res->err[E_SMALL_FP8], e);
                break;
            }
        }
    }
    for (size_t k = 0; k < n[A_EF]; k++)
        tmp[k] = (float)sum_got[k];
    res->err[E_EF_SUM] = rel_l2(tmp, sum_want, n[A_EF]);
    gift_client_stats(c, &st);
    res->epochs_switched = st.epochs_switched;
    res->frames_out = st.frames_out;
    res->hash = h;
out:
    gift_client_close(c);
    for (int i = 0; i < A_N; i++) {
        free(g[i]);
        free(out[i]);
    }
    free(X);
    free(tmp);
    free(mean);
    free(absm);
    free(sum_got);
    free(sum_want);
}

START_TEST(test_acceptance)
{
    worker_t w[3];
    result_t res[3];
    char servers[128];

    g_acc_codec_threads = _i;
    daemons_start(2, 3);
    servers_string(servers, sizeof servers);
    workers_start(w, 3, acc_worker, servers);
    workers_finish(w, 3, res);
    for (int r = 0; r < 3; r++) {
        const double *e = res[r].err;
        ck_assert_msg(res[r].hash == res[0].hash,
                      "worker %d pulled other bytes than worker 0 (%016llx vs %016llx)", r,
                      (unsigned long long)res[r].hash, (unsigned long long)res[0].hash);
        ck_assert_msg(e[E_F32] < 1e-6 && e[E_SMALL_F32] < 1e-6,
                      "worker %d: f32 mean off by %g (fused: %g)", r, e[E_F32], e[E_SMALL_F32]);
        ck_assert_msg(e[E_BF16] < 0.01 && e[E_SMALL_BF16] < 0.01,
                      "worker %d: bf16 relL2 %g (fused: %g)", r, e[E_BF16], e[E_SMALL_BF16]);
        ck_assert_msg(e[E_GEO] < 0.05 && e[E_GEO_FIRST] < 0.05,
                      "worker %d: GIFT fp8-e4m3 relL2 %g (epoch 0: %g)", r, e[E_GEO],
                      e[E_GEO_FIRST]);
        ck_assert_msg(e[E_SMALL_FP8] < 0.05, "worker %d: fused fp8-e4m3 relL2 %g", r,
                      e[E_SMALL_FP8]);
        ck_assert_msg(e[E_NVFP4] < 0.15, "worker %d: nvfp4 relL2 %g", r, e[E_NVFP4]);
        /* Error feedback: each step is off by e_{t-1} - e_t, the sum only by e_T. */
        ck_assert_msg(e[E_EF_STEP] < 0.1 && e[E_EF_SUM] < 0.02,
                      "worker %d: error feedback relL2 per step %g, of the sum %g", r, e[E_EF_STEP],
                      e[E_EF_SUM]);
        ck_assert_msg(res[r].epochs_switched == ACC_STEPS / ACC_REFRESH,
                      "worker %d switched epochs %u times, want %d", r, res[r].epochs_switched,
                      ACC_STEPS / ACC_REFRESH);
    }
    printf("acceptance: f32 %.2e bf16 %.2e gift-fp8 %.4f (epoch 0 %.4f) nvfp4 %.4f "
           "ef step %.4f sum %.4f fused f32 %.2e bf16 %.2e fp8 %.4f\n",
           res[0].err[E_F32], res[0].err[E_BF16], res[0].err[E_GEO], res[0].err[E_GEO_FIRST],
           res[0].err[E_NVFP4], res[0].err[E_EF_STEP], res[0].err[E_EF_SUM],
           res[0].err[E_SMALL_F32], res[0].err[E_SMALL_BF16], res[0].err[E_SMALL_FP8]);
    daemons_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* Frames: a model-shaped step                                           */
/* ------------------------------------------------------------------ */

#define FR_CHUNK (64u * 1024u)
#define FR_MAX 160

typedef struct fr_tensor {
    char name[48];
    uint32_t rows, cols;
    gift_codec_t codec;
} fr_tensor_t;

/* A small Llama: tok_embeddings, output and 4 MLP weights are large; every
 * layer also has 2 norms and 10 bias-like vectors, 96 small tensors in all. */
static size_t fr_list(fr_tensor_t *t)
{
    size_t n = 0;
    static const char *const small[12] = {
        "attention_norm", "ffn_norm",  "bq",      "bk", "bv", "bo", "b1", "b2", "b3",
        "rope_scale",     "attn_gate", "mlp_gate"};
    snprintf(t[n].name, sizeof t[n].name, "tok_embeddings");
    t[n].rows = 1024, t[n].cols = 128, t[n++].codec = GIFT_CODEC_BF16;
    for (int l = 0; l < 8; l++) {
        for (int k = 0; k < 12; k++) {
            snprintf(t[n].name, sizeof t[n].name, "layers.%d.%s", l, small[k]);
            t[n].rows = 1;
            t[n].cols = k == 6 || k == 8 ? 352 : k >= 9 ? 1 + (uint32_t)k : 128;
            t[n++].codec = k < 2 ? GIFT_CODEC_F32 : GIFT_CODEC_BF16;
        }
        if (l % 2 == 0) {
            snprintf(t[n].name, sizeof t[n].name, "layers.%d.feed_forward.w1", l);
            t[n].rows = 352, t[n].cols = 128, t[n++].codec = GIFT_CODEC_FP8_E4M3;
        }
    }
    snprintf(t[n].name, sizeof t[n].name, "norm");
    t[n].rows = 1, t[n].cols = 128, t[n++].codec = GIFT_CODEC_F32;
    snprintf(t[n].name, sizeof t[n].name, "output");
    t[n].rows = 1024, t[n].cols = 128, t[n++].codec = GIFT_CODEC_BF16;
    return n;
}

/* The documented rule, computed independently: Euclidean tensors below
 * 64 KiB of FP32 go into 1 x N buckets per codec class, in declaration order,
 * each at most chunk_bytes; every other tensor is cut into whole-row chunks of
 * at most chunk_bytes. Returns the number of wire chunks. */
static size_t fr_expected_chunks(const fr_tensor_t *t, size_t n, size_t *nsmall)
{
    size_t chunks = 0, fill[8] = {0};
    int open[8] = {0};
    *nsmall = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nel = (size_t)t[i].rows * t[i].cols;
        if (nel * 4 < 64 * 1024) {
            int k = (int)t[i].codec;
            (*nsmall)++;
            if (!open[k] || (fill[k] + nel) * 4 > FR_CHUNK) {
                open[k] = 1;
                fill[k] = 0;
                chunks++;
            }
            fill[k] += nel;
        } else {
            size_t per = FR_CHUNK / (4 * t[i].cols);
            per = per ? per : 1;
            chunks += (t[i].rows + per - 1) / per;
        }
    }
    return chunks;
}

START_TEST(test_frames)
{
    fr_tensor_t L[FR_MAX];
    gift_tensor_desc_t t[FR_MAX];
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_client_t *c = NULL;
    gift_op_t *ops[FR_MAX];
    float *g[FR_MAX], *out[FR_MAX];
    char servers[128];
    size_t n = fr_list(L), nsmall, expect = fr_expected_chunks(L, n, &nsmall);
    int rc;

    ck_assert_msg(nsmall >= 90 && n - nsmall <= 8, "list: %zu small of %zu", nsmall, n);
    ck_assert_msg(2 * expect < n, "the rule gives %zu wire chunks for %zu tensors", expect, n);
    daemons_start(2, 1);
    servers_string(servers, sizeof servers);
    o.servers = servers;
    o.rank = 0;
    o.world_size = 1;
    o.chunk_bytes = FR_CHUNK;
    o.timeout_ms = 20000;
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    for (size_t i = 0; i < n; i++) {
        gift_tensor_desc_t d = GIFT_TENSOR_INIT;
        d.name = L[i].name;
        d.rows = L[i].rows;
        d.cols = L[i].cols;
        d.push_codec = d.pull_codec = L[i].codec;
        t[i] = d;
        g[i] = malloc((size_t)d.rows * d.cols * sizeof(float));
        out[i] = malloc((size_t)d.rows * d.cols * sizeof(float));
        ck_assert(g[i] != NULL && out[i] != NULL);
    }
    rc = gift_declare(c, t, n);
    ck_assert_msg(rc == 0, "gift_declare: %s", gift_strerror(rc));
    for (uint64_t s = 0; s < 4; s++) {
        gift_client_stats_t a, b;
        gift_client_stats(c, &a);
        for (size_t i = 0; i < n; i++) {
            size_t ne = (size_t)L[i].rows * L[i].cols;
            gen(g[i], ne, (int)i, 0, s, 1.0);
        }
        for (size_t i = n; i-- > 0;)
            ck_assert_int_eq(gift_push_pull(c, (uint32_t)i, s, g[i], out[i], NULL, NULL, &ops[i]),
                             0);
        for (size_t i = 0; i < n; i++) {
            rc = gift_op_wait(ops[i]);
            gift_op_free(ops[i]);
            ck_assert_msg(rc == 0, "step %d tensor %zu: %s", (int)s, i, gift_strerror(rc));
        }
        gift_client_stats(c, &b);
        ck_assert_msg(b.frames_out - a.frames_out == 2 * expect,
                      "step %d: %llu frames out for %zu tensors; want %zu (one Push and one Pull "
                      "per wire chunk)",
                      (int)s, (unsigned long long)(b.frames_out - a.frames_out), n, 2 * expect);
        ck_assert_msg(b.frames_in - a.frames_in == 2 * expect, "step %d: %llu frames in; want %zu",
                      (int)s, (unsigned long long)(b.frames_in - a.frames_in), 2 * expect);
        /* World 1: the mean is the gradient, up to the codecs. */
        for (size_t i = 0; i < n; i++)
            if (L[i].codec == GIFT_CODEC_F32)
                ck_assert_msg(memcmp(g[i], out[i], (size_t)L[i].rows * L[i].cols * 4) == 0,
                              "f32 tensor %s differs", L[i].name);
    }
    printf("frames: %zu tensors (%zu small) cost %zu frames a step each way\n", n, nsmall, expect);
    gift_client_close(c);
    for (size_t i = 0; i < n; i++) {
        free(g[i]);
        free(out[i]);
    }
    daemons_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* Restart: a shard dies between a step's pushes and its pulls            */
/* ------------------------------------------------------------------ */

enum { R_F32, R_FP8, R_S0, R_S1, R_S2, R_N };
enum { RS_STEPS = 12, RS_KILL = 6 };

static void rs_list(gift_tensor_desc_t *t)
{
    static const struct {
        const char *name;
        uint32_t rows, cols;
        gift_codec_t codec;
    } L[R_N] = {
        {"w_f32", 200, 64, GIFT_CODEC_F32}, /* 50 KiB: 4 chunks over both shards */
        {"w_fp8", 128, 96, GIFT_CODEC_FP8_E4M3}, {"norm", 1, 64, GIFT_CODEC_F32},
        {"bias", 1, 100, GIFT_CODEC_F32},        {"gate", 1, 3, GIFT_CODEC_F32},
    };
    for (int i = 0; i < R_N; i++) {
        gift_tensor_desc_t d = GIFT_TENSOR_INIT;
        d.name = L[i].name;
        d.rows = L[i].rows;
        d.cols = L[i].cols;
        d.push_codec = d.pull_codec = L[i].codec;
        t[i] = d;
    }
}

static void rs_worker(int rank, int world, const char *servers, result_t *res, int sig_w, int go_r)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t[R_N];
    gift_client_t *c = NULL;
    float *g[R_N], *out[R_N], *tmp = NULL;
    double *mean = NULL, *absm = NULL;
    gift_op_t *ops[R_N];
    gift_client_stats_t st;
    uint64_t h = 0xCBF29CE484222325ull;
    size_t n[R_N], maxn = 0;
    int rc;

    memset(g, 0, sizeof g);
    memset(out, 0, sizeof out);
    rs_list(t);
    for (int i = 0; i < R_N; i++) {
        n[i] = (size_t)t[i].rows * t[i].cols;
        maxn = n[i] > maxn ? n[i] : maxn;
        g[i] = malloc(n[i] * sizeof(float));
        out[i] = malloc(n[i] * sizeof(float));
        if (!g[i] || !out[i])
            WFAIL(res, GIFT_ENOMEM, "malloc");
    }
    mean = malloc(maxn * sizeof(double));
    absm = malloc(maxn * sizeof(double));
    tmp = malloc(maxn * sizeof(float));
    if (!mean || !absm || !tmp)
        WFAIL(res, GIFT_ENOMEM, "malloc");
    o.codec_threads = g_acc_codec_threads ? rank : 0; /* as test_acceptance */
    o.servers = servers;
    o.rank = rank;
    o.world_size = world;
    o.chunk_bytes = 16 * 1024;
    o.timeout_ms = 30000;
    o.backoff_max_ms = 200;
    if ((rc = gift_client_open(&o, &c)) < 0)
        WFAIL(res, rc, "gift_client_open");
    if ((rc = gift_declare(c, t, R_N)) < 0)
        WFAIL(res, rc, "gift_declare");
    for (uint64_t s = 0; s < RS_STEPS; s++) {
        for (int i = 0; i < R_N; i++)
            gen(g[i], n[i], i, rank, s, 1.0);
        if (s == RS_KILL) {
            /* Push, tell the test, wait while it replaces a shard, then pull. */
            char b = 'p';
            for (int i = 0; i < R_N; i++)
                if ((rc = gift_push(c, (uint32_t)i, s, g[i], NULL, NULL, &ops[i])) < 0)
                    WFAIL(res, rc, "push %d", i);
            for (int i = 0; i < R_N; i++) {
                rc = gift_op_wait(ops[i]);
                gift_op_free(ops[i]);
                if (rc < 0)
                    WFAIL(res, rc, "push %d step %d", i, (int)s);
            }
            if (write(sig_w, &b, 1) != 1 || read(go_r, &b, 1) != 1)
                WFAIL(res, GIFT_EIO, "signal pipes");
            for (int i = 0; i < R_N; i++)
                if ((rc = gift_pull(c, (uint32_t)i, s, out[i], NULL, NULL, &ops[i])) < 0)
                    WFAIL(res, rc, "pull %d", i);
        } else {
            for (int i = R_N - 1; i >= 0; i--)
                if ((rc = gift_push_pull(c, (uint32_t)i, s, g[i], out[i], NULL, NULL, &ops[i])) < 0)
                    WFAIL(res, rc, "push_pull %d", i);
        }
        for (int i = 0; i < R_N; i++) {
            rc = gift_op_wait(ops[i]);
            gift_op_free(ops[i]);
            if (rc < 0)
                WFAIL(res, rc, "tensor %d step %d", i, (int)s);
        }
        for (int i = 0; i < R_N; i++) {
            double e;
            h = fnv(h, out[i], n[i] * sizeof(float));
            memset(mean, 0, n[i] * sizeof(double));
            memset(absm, 0, n[i] * sizeof(double));
            for (int r = 0; r < world; r++) {
                gen(tmp, n[i], i, r, s, 1.0);
                for (size_t k = 0; k < n[i]; k++) {
                    mean[k] += tmp[k];
                    absm[k] += fabs(tmp[k]);
                }
            }
            for (size_t k = 0; k < n[i]; k++) {
                mean[k] /= world;
                absm[k] /= world;
            }
            e = i == R_FP8 ? rel_l2(out[i], mean, n[i]) : rel_l2_scaled(out[i], mean, absm, n[i]);
            res->err[i == R_FP8] = fmax(res->err[i == R_FP8], e);
        }
    }
    gift_client_stats(c, &st);
    res->reconnects = st.reconnects;
    res->replays = st.replays;
    res->hash = h;
out:
    gift_client_close(c);
    for (int i = 0; i < R_N; i++) {
        free(g[i]);
        free(out[i]);
    }
    free(mean);
    free(absm);
    free(tmp);
}

START_TEST(test_restart)
{
    worker_t w[3];
    result_t res[3];
    char servers[128];
    int port;

    const char *tmp = getenv("TMPDIR");
    snprintf(D[1].data_dir, sizeof D[1].data_dir, "%s/giftd-restart-XXXXXX",
             tmp != NULL && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(D[1].data_dir) != NULL, "mkdtemp: %s", strerror(errno));
    g_acc_codec_threads = _i;
    daemons_start(2, 3);
    servers_string(servers, sizeof servers);
    workers_start(w, 3, rs_worker, servers);
    /* Every worker has pushed step RS_KILL and waits. */
    for (int r = 0; r < 3; r++) {
        struct pollfd pfd = {.fd = w[r].sig_fd, .events = POLLIN};
        char b;
        ck_assert_msg(poll(&pfd, 1, WORKER_TIMEOUT_MS) == 1 && read(w[r].sig_fd, &b, 1) == 1,
                      "worker %d did not reach step %d", r, RS_KILL);
    }
    port = D[1].port;
    daemon_signal(&D[1], SIGKILL, 5000);
    unlink(D[1].log);
    sleep_ms(100); /* the workers see the connection drop and retry meanwhile */
    daemon_start(&D[1], 1, 2, 3, port);
    for (int r = 0; r < 3; r++) {
        char b = 'g';
        ck_assert(write(w[r].go_fd, &b, 1) == 1);
    }
    workers_finish(w, 3, res);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(res[r].hash == res[0].hash, "worker %d pulled other bytes than worker 0", r);
        ck_assert_msg(res[r].err[0] < 1e-6, "worker %d: f32 mean off by %g", r, res[r].err[0]);
        ck_assert_msg(res[r].err[1] < 0.05, "worker %d: fp8 relL2 %g", r, res[r].err[1]);
        ck_assert_msg(res[r].reconnects >= 1 && res[r].replays >= 1,
                      "worker %d: %llu reconnects, %llu replays", r,
                      (unsigned long long)res[r].reconnects, (unsigned long long)res[r].replays);
    }
    printf("restart: %llu reconnects, %llu pushes replayed by worker 0\n",
           (unsigned long long)res[0].reconnects, (unsigned long long)res[0].replays);
    daemons_stop();
    {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", D[1].data_dir);
        ck_assert_int_eq(system(cmd), 0);
        D[1].data_dir[0] = '\0';
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* Timeout and errors                                                    */
/* ------------------------------------------------------------------ */

/* The loop tests' _i is gift_client_opts_t.codec_threads: 0 (the I/O thread
 * does everything), 1 (pushes beside it), 2 (the pulls' T^-1 there too).
 * The same values every way. */
static int codec_threads_of(int i)
{
    return i;
}

START_TEST(test_timeout)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t = GIFT_TENSOR_INIT;
    gift_client_t *c = NULL;
    gift_op_t *push = NULL, *pull = NULL;
    float g[64], out[64];
    char servers[64];
    double t0, dt;
    int rc;

    daemons_start(1, 2);
    servers_string(servers, sizeof servers);
    o.codec_threads = codec_threads_of(_i);
    o.servers = servers;
    o.rank = 0;
    o.world_size = 2;                    /* rank 1 never comes */
    setenv("GIFT_TIMEOUT_MS", "300", 1); /* the operation timeout from the environment */
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    unsetenv("GIFT_TIMEOUT_MS");
    t.name = "w";
    t.rows = 4;
    t.cols = 16;
    ck_assert_int_eq(gift_declare(c, &t, 1), 0);
    for (int i = 0; i < 64; i++)
        g[i] = (float)i;
    t0 = now_ms();
    ck_assert_int_eq(gift_push(c, 0, 0, g, NULL, NULL, &push), 0);
    ck_assert_int_eq(gift_pull(c, 0, 0, out, NULL, NULL, &pull), 0);
    rc = gift_op_wait(push);
    ck_assert_msg(rc == 0, "push: %s", gift_strerror(rc));
    rc = gift_op_wait(pull);
    dt = now_ms() - t0;
    ck_assert_msg(rc == GIFT_ETIMEDOUT, "pull: %s, want GIFT_ETIMEDOUT", gift_strerror(rc));
    ck_assert_msg(dt >= 250 && dt < 3000, "the pull failed after %.0f ms (timeout 300 ms)", dt);
    {
        char why[512];
        gift_client_last_error(c, why, sizeof why);
        ck_assert_msg(strstr(why, "300 ms") && strstr(why, "GIFT_TIMEOUT_MS"),
                      "last error after a timeout: %s", why);
    }
    gift_op_free(push);
    gift_op_free(pull);
    t0 = now_ms();
    gift_client_close(c);
    ck_assert_msg(now_ms() - t0 < 2000, "close took %.0f ms", now_ms() - t0);
    daemons_stop();
}
END_TEST

START_TEST(test_errors)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t = GIFT_TENSOR_INIT;
    gift_client_t *c = (gift_client_t *)&o;
    char servers[64];
    double t0;
    int rc, port;

    ck_assert_str_eq(gift_version(), "0.1.0");
    /* Nothing to go on. */
    unsetenv("GIFT_SERVERS");
    unsetenv("GIFT_RANK");
    unsetenv("RANK");
    unsetenv("GIFT_WORLD");
    unsetenv("WORLD_SIZE");
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL);
    ck_assert_ptr_null(c);
    o.servers = "127.0.0.1:1";
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL); /* no rank, no world */
    o.rank = 2;
    o.world_size = 2;
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL); /* rank outside the world */
    o.servers = "127.0.0.1";
    o.rank = 0;
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL); /* no port */
    /* Codec threads: at most 64, from opts or the environment. */
    o.servers = "127.0.0.1:1";
    o.codec_threads = 65;
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL);
    o.codec_threads = -2;
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL);
    o.codec_threads = INT_MAX;
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL);
    o.codec_threads = INT_MIN;
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL);
    o.codec_threads = -1;
    {
        /* Not a count of threads 0..64: refused before any thread is made. */
        static const char *bad[] = {"two",
                                    "65",
                                    "-1",
                                    " 2",
                                    "2x",
                                    "4294967295",
                                    "4294967296",
                                    "18446744073709551615",
                                    "18446744073709551616",
                                    "999999999999999999999999"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            setenv("GIFT_CODEC_THREADS", bad[i], 1);
            rc = gift_client_open(&o, &c);
            ck_assert_msg(rc == GIFT_EINVAL, "GIFT_CODEC_THREADS=\"%s\": %s, want GIFT_EINVAL",
                          bad[i], gift_strerror(rc));
        }
    }
    setenv("GIFT_CODEC_THREADS", "65", 1);
    ck_assert_int_eq(gift_client_open(&o, &c), GIFT_EINVAL);
    o.codec_threads = 64; /* the bound itself: allowed (nothing listens on port 1) */
    o.connect_timeout_ms = 300;
    rc = gift_client_open(&o, &c);
    ck_assert_msg(rc == GIFT_ETIMEDOUT, "open with 64 codec threads: %s", gift_strerror(rc));
    o.codec_threads = -1;
    o.connect_timeout_ms = 0;
    unsetenv("GIFT_CODEC_THREADS");

    /* A server that is not there: refused until connect_timeout_ms. */
    daemons_start(1, 1);
    port = D[0].port;
    daemons_stop();
    snprintf(servers, sizeof servers, "127.0.0.1:%d", port);
    o.servers = servers;
    o.connect_timeout_ms = 300;
    t0 = now_ms();
    rc = gift_client_open(&o, &c);
    ck_assert_msg(rc == GIFT_ETIMEDOUT, "open: %s", gift_strerror(rc));
    ck_assert_msg(now_ms() - t0 < 3000, "open gave up after %.0f ms", now_ms() - t0);
    {
        /* The failure names the server and says "connection refused". */
        char why[512];
        ck_assert_int_gt(gift_client_last_error(NULL, why, sizeof why), 0);
        ck_assert_msg(strstr(why, servers) && strstr(why, "connection refused") &&
                          strstr(why, "GIFT_SERVERS"),
                      "last error after a refused connect: %s", why);
    }

    /* The environment, and a world size the shard does not have. */
    daemons_start(1, 2);
    snprintf(servers, sizeof servers, "localhost:%d", D[0].port);
    setenv("GIFT_SERVERS", servers, 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "3", 1);
    {
        gift_client_opts_t e = GIFT_CLIENT_OPTS_INIT;
        e.connect_timeout_ms = 5000;
        char why[512];
        rc = gift_client_open(&e, &c);
        ck_assert_msg(rc == GIFT_EWORLD, "open with the wrong world: %s", gift_strerror(rc));
        /* The numbers, the shard and its address. */
        gift_client_last_error(NULL, why, sizeof why);
        ck_assert_msg(strstr(why, "world size 3") && strstr(why, "has 2") &&
                          strstr(why, "shard 0 (127.0.0.1:"),
                      "last error after a world mismatch: %s", why);
        setenv("WORLD_SIZE", "2", 1);
        rc = gift_client_open(&e, &c);
        ck_assert_msg(rc == 0, "open from the environment: %s", gift_strerror(rc));
    }
    /* Bad declarations. */
    t.name = "w";
    t.rows = 0;
    t.cols = 4;
    ck_assert_int_eq(gift_declare(c, &t, 1), GIFT_EINVAL);
    ck_assert_int_eq(gift_push(c, 0, 0, NULL, NULL, NULL, NULL), GIFT_EINVAL);
    t.rows = 1;
    t.geometry = 1;
    t.cols = 1;
    ck_assert_int_eq(gift_declare(c, &t, 1), GIFT_EINVAL); /* geometry needs 2 columns */
    /* Device tensors: an unknown memory kind; a device this process does not
     * have (any build: without CUDA every device is one). An old caller's
     * smaller struct (no memory field) is a host tensor. */
    t.geometry = 0;
    t.cols = 4;
    t.memory = 2;
    ck_assert_int_eq(gift_declare(c, &t, 1), GIFT_EINVAL);
    t.memory = GIFT_MEMORY_CUDA;
    t.device = 1000;
    ck_assert_int_eq(gift_declare(c, &t, 1), GIFT_ENODEV);
    ck_assert_str_eq(gift_strerror(GIFT_ENODEV),
                     "no such CUDA device (or libgiftclient was built without CUDA)");
    t.size = offsetof(gift_tensor_desc_t, memory);
    t.memory = 5; /* past the caller's size: never read */
    rc = gift_declare(c, &t, 1);
    ck_assert_msg(rc == 0, "declare with an old caller's size: %s", gift_strerror(rc));
    gift_client_close(c);
    unsetenv("GIFT_SERVERS");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    daemons_stop();
}
END_TEST

/* Error feedback on the worker, exactly: with one worker and f32 pulls the
 * pulled mean is the decoded push, so every step's result must equal a
 * reference computed here chunk by chunk with the codec: v = g + e, encode,
 * d = decode, e = v - d. Covers the one-pass path (fp8, nvfp4, a fused bucket
 * of two small tensors) and the pass-wise one (an fp8 block of 8192, which
 * the one-pass encoder does not slice); a residual not added, not updated or
 * added twice shows from step 1. */
START_TEST(test_ef_exact)
{
    enum { ROWS = 64, COLS = 256, CROWS = 32, SMALL = 300, STEPS = 6, NT = 5 };
    static const struct {
        const char *name;
        uint32_t rows, cols;
        gift_codec_t codec;
        uint32_t block;
    } T[NT] = {
        {"fp8", ROWS, COLS, GIFT_CODEC_FP8_E4M3, 0},
        {"nvfp4", ROWS, COLS, GIFT_CODEC_NVFP4, 0},
        {"fp8-b8192", ROWS, COLS, GIFT_CODEC_FP8_E4M3, 8192},
        {"small.a", 1, SMALL, GIFT_CODEC_FP8_E4M3, 0},
        {"small.b", 1, SMALL, GIFT_CODEC_FP8_E4M3, 0},
    };
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t[NT];
    gift_client_t *c = NULL;
    gift_op_t *ops[NT];
    size_t nmax = (size_t)ROWS * COLS, cap;
    float *g[NT], *out[NT], *e[NT], *v = malloc(nmax * sizeof(float));
    float *d = malloc(nmax * sizeof(float)), *cat = malloc(2 * SMALL * sizeof(float));
    uint8_t *pay;
    gift_layout_t l;
    char servers[64];

    ck_assert(v != NULL && d != NULL && cat != NULL);
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)T[i].rows * T[i].cols;
        gift_tensor_desc_t x = GIFT_TENSOR_INIT;
        x.name = T[i].name;
        x.rows = T[i].rows;
        x.cols = T[i].cols;
        x.push_codec = T[i].codec;
        x.pull_codec = GIFT_CODEC_F32;
        x.fp8_block = T[i].block;
        x.error_feedback = 1;
        t[i] = x;
        g[i] = malloc(n * sizeof(float));
        out[i] = malloc(n * sizeof(float));
        e[i] = calloc(nmax, sizeof(float)); /* small.a's: the bucket's */
        ck_assert(g[i] != NULL && out[i] != NULL && e[i] != NULL);
    }
    {
        gift_codec_params_t p = {GIFT_FMT_E4M3, 0, 0, {0}};
        ck_assert_int_eq(gift_layout(&p, nmax, &l), 0);
        cap = l.total * 2 + 4096; /* more than any payload here */
        ck_assert((pay = malloc(cap)) != NULL);
    }
    daemons_start(1, 1);
    servers_string(servers, sizeof servers);
    o.codec_threads = codec_threads_of(_i);
    o.servers = servers;
    o.rank = 0;
    o.world_size = 1;
    o.chunk_bytes = (uint64_t)CROWS * COLS * sizeof(float); /* two chunks of the large ones */
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    ck_assert_int_eq(gift_declare(c, t, NT), 0);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < NT; i++) {
            gen(g[i], (size_t)T[i].rows * T[i].cols, i, 0, (uint64_t)s, 1e-2);
            ck_assert_int_eq(
                gift_push_pull(c, (uint32_t)i, (uint64_t)s, g[i], out[i], NULL, NULL, &ops[i]), 0);
        }
        for (int i = 0; i < NT; i++) {
            int rc = gift_op_wait(ops[i]);
            ck_assert_msg(rc == 0, "step %d %s: %s", s, T[i].name, gift_strerror(rc));
            gift_op_free(ops[i]);
        }
        /* The reference, one payload per chunk (the small pair: one bucket,
         * a first, b second). */
        for (int i = 0; i < NT; i++) {
            gift_codec_params_t p = {(gift_format_t)T[i].codec, T[i].block, 0, {0}};
            size_t n = (size_t)T[i].rows * T[i].cols, per = (size_t)CROWS * COLS;
            const float *gi = g[i];
            float *ei = e[i];
            if (i == NT - 1)
                continue; /* done with small.a */
            if (i == NT - 2) {
                memcpy(cat, g[i], SMALL * sizeof(float));
                memcpy(cat + SMALL, g[i + 1], SMALL * sizeof(float));
                gi = cat;
                n = per = 2 * SMALL;
            }
            for (size_t c0 = 0; c0 < n; c0 += per) {
                for (size_t k = 0; k < per; k++)
                    v[k] = gi[c0 + k] + ei[c0 + k];
                ck_assert_int_eq(gift_encode(&p, v, per, pay, cap), 0);
                ck_assert_int_eq(gift_decode(&p, pay, cap, per, d), 0);
                for (size_t k = 0; k < per; k++) {
                    float got =
                        i == NT - 2 ? out[i + (c0 + k >= SMALL)][(c0 + k) % SMALL] : out[i][c0 + k];
                    ei[c0 + k] = v[k] - d[k];
                    if (got != d[k])
                        ck_abort_msg("step %d %s element %zu: pulled %.9g, reference %.9g "
                                     "(g %.9g + e %.9g)",
                                     s, i == NT - 2 && c0 + k >= SMALL ? "small.b" : T[i].name,
                                     c0 + k, (double)got, (double)d[k], (double)gi[c0 + k],
                                     (double)(v[k] - gi[c0 + k]));
                }
            }
        }
    }
    {
        /* With codec threads the pushes were encoded there. */
        gift_client_counters_t k;
        memset(&k, 0, sizeof k);
        k.size = sizeof k;
        ck_assert_int_eq(gift_client_counters(c, &k), 0);
        ck_assert_msg(_i ? k.codec_cpu_ns > 0 : k.codec_cpu_ns == 0,
                      "codec threads %d: codec_cpu_ns %llu", codec_threads_of(_i),
                      (unsigned long long)k.codec_cpu_ns);
    }
    gift_client_close(c);
    daemons_stop();
    for (int i = 0; i < NT; i++) {
        free(g[i]);
        free(out[i]);
        free(e[i]);
    }
    free(v);
    free(d);
    free(cat);
    free(pay);
}
END_TEST

/* A NaN in the last chunk of a push: the chunks before it are encoded and
 * sent while the next ones encode, so some reach the shard before the NaN is
 * found. The push fails with GIFT_ENONFINITE, the NaN never leaves, a retry of
 * the same step with clean data completes it (the pull returns the clean
 * mean), and the client stays usable. */
START_TEST(test_nonfinite)
{
    enum { ROWS = 2048, COLS = 1024 }; /* 8 MiB of FP32: 8 chunks of 1 MiB */
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t = GIFT_TENSOR_INIT;
    gift_client_t *c = NULL;
    gift_op_t *push = NULL, *pull = NULL;
    size_t n = (size_t)ROWS * COLS;
    float *g = malloc(n * sizeof(float)), *bad = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    gift_client_stats_t s0, s1;
    char servers[64];
    int rc;

    ck_assert(g != NULL && bad != NULL && out != NULL);
    daemons_start(1, 1);
    servers_string(servers, sizeof servers);
    o.codec_threads = codec_threads_of(_i);
    o.servers = servers;
    o.rank = 0;
    o.world_size = 1;
    o.chunk_bytes = 1u << 20;
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    t.name = "w";
    t.rows = ROWS;
    t.cols = COLS;
    t.push_codec = GIFT_CODEC_F32;
    t.pull_codec = GIFT_CODEC_F32;
    ck_assert_int_eq(gift_declare(c, &t, 1), 0);
    for (int step = 0; step < 3; step++) {
        gen(g, n, step, 0, 7, 1.0);
        memcpy(bad, g, n * sizeof(float));
        bad[n - 1] = step == 1 ? INFINITY : NAN;
        gift_client_stats(c, &s0);
        ck_assert_int_eq(gift_push(c, 0, (uint64_t)step, bad, NULL, NULL, &push), 0);
        rc = gift_op_wait(push);
        ck_assert_msg(rc == GIFT_ENONFINITE, "step %d: push with a NaN: %s", step,
                      gift_strerror(rc));
        gift_op_free(push);
        /* Chunks 0-6 went out while the next ones encoded; chunk 7 never. */
        gift_client_stats(c, &s1);
        ck_assert_msg(s1.frames_out - s0.frames_out >= 1 && s1.frames_out - s0.frames_out <= 7,
                      "step %d: %llu frames out for the failed push (want 1-7)", step,
                      (unsigned long long)(s1.frames_out - s0.frames_out));
        /* The same step again, clean. */
        memset(out, 0, n * sizeof(float));
        ck_assert_int_eq(gift_push_pull(c, 0, (uint64_t)step, g, out, NULL, NULL, &pull), 0);
        rc = gift_op_wait(pull);
        ck_assert_msg(rc == 0, "step %d: clean retry: %s", step, gift_strerror(rc));
        gift_op_free(pull);
        for (size_t i = 0; i < n; i++)
            if (out[i] != g[i])
                ck_abort_msg("step %d: element %zu is %g, want %g", step, i, (double)out[i],
                             (double)g[i]);
    }
    gift_client_close(c);
    daemons_stop();
    free(g);
    free(bad);
    free(out);
}
END_TEST

/* Counter deltas of one operation. */
static void counters(gift_client_t *c, gift_client_counters_t *k)
{
    memset(k, 0, sizeof *k);
    k->size = sizeof *k;
    ck_assert_int_eq(gift_client_counters(c, k), 0);
}

#define PASS_D(a, b, kind) ((b).pass_bytes[kind] - (a).pass_bytes[kind])

/* An f32 push_pull whose out is not its grad sends grad from where it is
 * (checked, not copied); in place it is copied first; a NaN found by the
 * check fails the push and a clean retry of the step still completes; a
 * timed-out op's grad is copied into the push's own buffer before the op
 * completes. Pulled chunks are decoded or received in place; either way the
 * mean is exact. Counted in gift_client_counters. */
START_TEST(test_zero_copy)
{
    enum { ROWS = 2048, COLS = 1024 }; /* 8 MiB of FP32: 8 chunks of 1 MiB */
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t = GIFT_TENSOR_INIT;
    gift_client_t *c = NULL;
    gift_op_t *op = NULL;
    size_t n = (size_t)ROWS * COLS, nb = n * sizeof(float);
    float *g = malloc(nb), *out = malloc(nb), *keep = malloc(nb);
    gift_client_counters_t k0, k1;
    char servers[64];
    int rc;

    ck_assert(g != NULL && out != NULL && keep != NULL);
    ck_assert_str_eq(gift_pass_name(GIFT_PASS_ENCODE), "encode");
    ck_assert_str_eq(gift_pass_name(GIFT_PASS_TRANSFORM), "transform");
    ck_assert_ptr_null(gift_pass_name(GIFT_PASS_KINDS));
    ck_assert_ptr_null(gift_pass_name(-1));
    daemons_start(1, 1);
    servers_string(servers, sizeof servers);
    o.servers = servers;
    o.rank = 0;
    o.world_size = 1;
    o.chunk_bytes = 1u << 20;
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    /* Below the first release's size (up to pass_bytes): refused; that size
     * itself: filled up to it, codec_cpu_ns (added later) left alone. */
    k0.size = offsetof(gift_client_counters_t, codec_cpu_ns) - 1;
    ck_assert_int_eq(gift_client_counters(c, &k0), GIFT_EINVAL);
    k0.size = offsetof(gift_client_counters_t, codec_cpu_ns);
    k0.codec_cpu_ns = 12345;
    ck_assert_int_eq(gift_client_counters(c, &k0), 0);
    ck_assert_msg(k0.codec_cpu_ns == 12345 &&
                      k0.size == offsetof(gift_client_counters_t, codec_cpu_ns),
                  "an older caller's counters: size %zu, codec_cpu_ns %llu (want it untouched)",
                  k0.size, (unsigned long long)k0.codec_cpu_ns);
    t.name = "w";
    t.rows = ROWS;
    t.cols = COLS;
    t.push_codec = GIFT_CODEC_F32;
    t.pull_codec = GIFT_CODEC_F32;
    ck_assert_int_eq(gift_declare(c, &t, 1), 0);
    for (int step = 0; step < 4; step++) {
        int inplace = step == 2, nan = step == 3;
        gen(g, n, step, 0, 11, 1.0);
        memcpy(keep, g, nb);
        if (nan)
            g[n - 1] = NAN;
        counters(c, &k0);
        rc = gift_push_pull(c, 0, (uint64_t)step, g, inplace ? g : out, NULL, NULL, &op);
        ck_assert_int_eq(rc, 0);
        rc = gift_op_wait(op);
        gift_op_free(op);
        counters(c, &k1);
        if (nan) {
            ck_assert_msg(rc == GIFT_ENONFINITE, "step %d: a NaN in the last chunk: %s", step,
                          gift_strerror(rc));
            /* Every chunk checked where it was, none copied; the pull may
             * have received the chunks that went out before the failure. */
            ck_assert_msg(
                PASS_D(k0, k1, GIFT_PASS_ENCODE) == 0 && PASS_D(k0, k1, GIFT_PASS_CHECK) >= nb &&
                    PASS_D(k0, k1, GIFT_PASS_CHECK) + PASS_D(k0, k1, GIFT_PASS_DECODE) < 2 * nb,
                "step %d: encode %llu check %llu decode %llu bytes, want 0, at least "
                "%zu, and check + decode below %zu",
                step, (unsigned long long)PASS_D(k0, k1, GIFT_PASS_ENCODE),
                (unsigned long long)PASS_D(k0, k1, GIFT_PASS_CHECK),
                (unsigned long long)PASS_D(k0, k1, GIFT_PASS_DECODE), nb, 2 * nb);
            /* The same step again, clean: the chunks that went out from grad
             * are acknowledged as duplicates. */
            memcpy(g, keep, nb);
            ck_assert_int_eq(gift_push_pull(c, 0, (uint64_t)step, g, out, NULL, NULL, &op), 0);
            rc = gift_op_wait(op);
            gift_op_free(op);
        }
        ck_assert_msg(rc == 0, "step %d: %s", step, gift_strerror(rc));
        for (size_t i = 0; i < n; i++)
            if ((inplace ? g : out)[i] != keep[i])
                ck_abort_msg("step %d: element %zu is %g, want %g", step, i,
                             (double)(inplace ? g : out)[i], (double)keep[i]);
        if (!nan) {
            uint64_t enc = PASS_D(k0, k1, GIFT_PASS_ENCODE), chk = PASS_D(k0, k1, GIFT_PASS_CHECK);
            uint64_t dec = PASS_D(k0, k1, GIFT_PASS_DECODE);
            /* Each pulled chunk is decoded from the reader's buffer, or
             * received in place and only checked (gift__eng_sink), as the
             * reads happen to fall. */
            ck_assert_msg(enc == (inplace ? nb : 0) && chk >= (inplace ? 0 : nb) &&
                              chk + dec == (inplace ? nb : 2 * nb),
                          "step %d (%s): encode %llu check %llu decode %llu bytes, want "
                          "encode %zu and check + decode %zu",
                          step, inplace ? "in place" : "out apart", (unsigned long long)enc,
                          (unsigned long long)chk, (unsigned long long)dec, inplace ? nb : 0,
                          inplace ? nb : 2 * nb);
            ck_assert_msg(k1.payload_out - k0.payload_out == nb &&
                              k1.payload_in - k0.payload_in == nb,
                          "step %d: payload out %llu in %llu, want %zu each", step,
                          (unsigned long long)(k1.payload_out - k0.payload_out),
                          (unsigned long long)(k1.payload_in - k0.payload_in), nb);
            ck_assert_msg(k1.io_cpu_ns > k0.io_cpu_ns, "step %d: I/O thread CPU %llu -> %llu ns",
                          step, (unsigned long long)k0.io_cpu_ns, (unsigned long long)k1.io_cpu_ns);
        }
    }
    gift_client_close(c);
    daemons_stop();

    /* World 2, rank 1 never comes: the op times out, and grad, sent from
     * where it was, is copied into the push's buffer before the op completes. */
    daemons_start(1, 2);
    servers_string(servers, sizeof servers);
    o.servers = servers;
    o.world_size = 2;
    o.timeout_ms = 300;
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    ck_assert_int_eq(gift_declare(c, &t, 1), 0);
    gen(g, n, 0, 0, 11, 1.0);
    counters(c, &k0);
    ck_assert_int_eq(gift_push_pull(c, 0, 0, g, out, NULL, NULL, &op), 0);
    rc = gift_op_wait(op);
    gift_op_free(op);
    counters(c, &k1);
    ck_assert_msg(rc == GIFT_ETIMEDOUT, "alone in a world of 2: %s", gift_strerror(rc));
    ck_assert_msg(PASS_D(k0, k1, GIFT_PASS_COPY) == nb && PASS_D(k0, k1, GIFT_PASS_CHECK) == nb &&
                      PASS_D(k0, k1, GIFT_PASS_DECODE) == 0,
                  "after the timeout: copy %llu check %llu bytes, want %zu each",
                  (unsigned long long)PASS_D(k0, k1, GIFT_PASS_COPY),
                  (unsigned long long)PASS_D(k0, k1, GIFT_PASS_CHECK), nb);
    memset(g, 0xff, nb); /* the caller's to reuse now */
    gift_client_close(c);
    daemons_stop();
    free(g);
    free(out);
    free(keep);
}
END_TEST

/* GIFT tensors transformed chunk by chunk: one worker with f32 codecs pulls
 * back T^-1 (T g), which must be g to float rounding, on every step and
 * through geometry epochs, for a thin-form tensor (rank 32 of 96), a dense
 * one (rank 48: 2k >= din) whose last chunk is a single row (a form chosen
 * by the chunk's rows would go thin there), and a tensor of one chunk (with
 * 2 codec threads its T^-1 runs on one of them). A chunk transformed twice,
 * not at all, or at another chunk's offset shows as an O(1) error. The same
 * bytes must come back with 0, 1 and 2 codec threads (each path cuts the
 * tensor into the same chunks); and the geometry must not be the identity
 * (some pulled element differs from g). */
enum {
    CT_ROWS = 200,
    CT_ROWS_D = 171,
    CT_ROWS_1 = 60,
    CT_CROWS = 85,
    CT_STEPS = 8,
    CT_INPUTS = 128,
    CT_N = 3
};

static uint64_t chunked_run(int threads, double *worst, int *moved)
{
    static const uint32_t rows[CT_N] = {CT_ROWS, CT_ROWS_D, CT_ROWS_1}, rank[CT_N] = {32, 48, 32};
    static const char *const names[CT_N] = {"thin", "dense", "one-chunk"};
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t t[CT_N];
    gift_client_t *c = NULL;
    gift_op_t *ops[CT_N];
    size_t n[CT_N] = {(size_t)CT_ROWS * GEO_DIN, (size_t)CT_ROWS_D * GEO_DIN,
                      (size_t)CT_ROWS_1 * GEO_DIN};
    float *g[CT_N], *out[CT_N], *X = malloc((size_t)CT_INPUTS * GEO_DIN * sizeof(float));
    double *want = malloc(n[0] * sizeof(double));
    char servers[64];
    uint64_t h = 1469598103934665603ull;

    ck_assert(X != NULL && want != NULL);
    for (int i = 0; i < CT_N; i++) {
        gift_tensor_desc_t d = GIFT_TENSOR_INIT;
        d.name = names[i];
        d.rows = rows[i];
        d.cols = GEO_DIN;
        d.push_codec = d.pull_codec = GIFT_CODEC_F32;
        d.geometry = 1;
        d.rank = rank[i];
        d.refresh = 2;
        t[i] = d;
        ck_assert((g[i] = malloc(n[i] * sizeof(float))) != NULL &&
                  (out[i] = malloc(n[i] * sizeof(float))) != NULL);
    }
    daemons_start(1, 1);
    servers_string(servers, sizeof servers);
    o.codec_threads = threads;
    o.servers = servers;
    o.rank = 0;
    o.world_size = 1;
    o.chunk_bytes = (uint64_t)CT_CROWS * GEO_DIN * sizeof(float); /* 85 85 30, 85 85 1, 60 rows */
    ck_assert_int_eq(gift_client_open(&o, &c), 0);
    ck_assert_int_eq(gift_declare(c, t, CT_N), 0);
    *worst = 0.0;
    *moved = 0;
    for (int s = 0; s < CT_STEPS; s++) {
        for (int i = 0; i < CT_N; i++) {
            int rc;
            if (s % 2 == 0) {
                gen(X, (size_t)CT_INPUTS * GEO_DIN, 50 + i, 0, (uint64_t)s, 1.0);
                geo_shape(X, CT_INPUTS);
                ck_assert_int_eq(gift_sketch_inputs(c, (uint32_t)i, (uint64_t)s, X, CT_INPUTS), 0);
            }
            gen(g[i], n[i], 60 + i, 0, (uint64_t)s, 1.0);
            geo_shape(g[i], rows[i]);
            rc = gift_push_pull(c, (uint32_t)i, (uint64_t)s, g[i], out[i], NULL, NULL, &ops[i]);
            ck_assert_msg(rc == 0, "step %d %s: %s", s, t[i].name, gift_strerror(rc));
        }
        for (int i = 0; i < CT_N; i++) {
            int rc = gift_op_wait(ops[i]);
            double e;
            gift_op_free(ops[i]);
            ck_assert_msg(rc == 0, "threads %d step %d %s: %s", threads, s, t[i].name,
                          gift_strerror(rc));
            for (size_t k = 0; k < n[i]; k++) {
                want[k] = g[i][k];
                *moved += out[i][k] != g[i][k];
            }
            e = rel_l2(out[i], want, n[i]);
            ck_assert_msg(e < 1e-4, "threads %d step %d %s: relL2 of T^-1 (T g) to g %g", threads,
                          s, t[i].name, e);
            *worst = fmax(*worst, e);
            h = fnv(h, out[i], n[i] * sizeof(float));
        }
    }
    gift_client_close(c);
    daemons_stop();
    for (int i = 0; i < CT_N; i++) {
        free(g[i]);
        free(out[i]);
    }
    free(X);
    free(want);
    return h;
}

START_TEST(test_chunked_transform)
{
    uint64_t h[3];
    double worst[3];
    int moved[3];
    geo_init();
    for (int i = 0; i < 3; i++)
        h[i] = chunked_run(i, &worst[i], &moved[i]);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(moved[i] > 0,
                      "codec threads %d: every pulled element equals g, so T was "
                      "the identity throughout (relL2 %g)",
                      i, worst[i]);
    ck_assert_msg(h[0] == h[1] && h[0] == h[2],
                  "the pulled bytes depend on the codec threads: hashes %016llx (0) %016llx (1) "
                  "%016llx (2); worst relL2 %g %g %g",
                  (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2],
                  worst[0], worst[1], worst[2]);
}
END_TEST

static Suite *client_suite(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("cluster");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_errors);
    tcase_add_loop_test(tc, test_timeout, 0, 3);
    tcase_add_loop_test(tc, test_nonfinite, 0, 3);
    tcase_add_test(tc, test_zero_copy);
    tcase_add_loop_test(tc, test_ef_exact, 0, 3);
    tcase_add_test(tc, test_chunked_transform);
    tcase_add_test(tc, test_frames);
    tcase_add_loop_test(tc, test_acceptance, 0, 2);
    tcase_add_loop_test(tc, test_restart, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* Workers are forked: keep OpenBLAS from starting threads before. */
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    signal(SIGPIPE, SIG_IGN);
    return gift_test_run(client_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
