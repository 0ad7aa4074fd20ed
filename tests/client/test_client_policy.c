/*
 * test_client_policy.c: the geometry owner's decision travels in the epoch
 * (issue 24), end to end: a real giftd (GIFTD_BIN) on 127.0.0.1 with
 * policy none and a bit budget between nvfp4 and fp8, and two forked C
 * workers through the public API.
 *
 * Two tensors declared with geometry, fp8 both ways. The budget (7 bits per
 * element, geometry amortised counted in) affords fp8 for one of them only,
 * so the owner must give one of them nvfp4 at every epoch. Which one follows
 * the averaged gradient the owner decoded: tensor A is 100x larger than B
 * before the first refresh, B larger than A before the second, so the fp8
 * tensor changes across an epoch. The workers sketch at steps 4 and 8
 * (refresh 4); epochs 1 and 2 are valid from steps 5 and 9.
 *
 * Every worker checks every pulled mean, bit for bit, against the codec's
 * own output for each candidate format: each rank's gradient encoded and
 * decoded in that format, summed in rank order, times 1/2, encoded and
 * decoded again (policy none: T = I, so no transform is involved). It
 * reports which format matched; the test asserts that exactly one did at
 * every step (no step lost or mixed), that the budget held (never both in
 * fp8), that both workers saw the same formats, and that the formats
 * changed only where an epoch begins and did change. test_two_shards runs
 * the same against two shards with eight chunks per tensor, so that most
 * chunks live on a shard that takes each step's codecs from its pushes.
 * test_budget_kill runs test_budget_mix's case with checkpoints and
 * SIGKILLs the shard after the first format change (after step KILL_AT's
 * pushes, before its pulls), restarts it on its data directory and port,
 * and wants every pulled mean bit for bit that of a fault-free run.
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
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
#define WORLD 2
#define NT 2
#define ROWS 256
#define COLS 64
#define RANK 8
#define REFRESH 4
#define STEPS 12
#define SKETCH_ROWS 128
#define KILL_AT 7    /* after epoch 1's first steps; gbar of step 7 feeds epoch 2 */
#define CKPT_STEPS 3 /* test_budget_kill: a checkpoint at steps 3 and 6, then the log */

extern char **environ;

/* Bits of the decision a pulled mean matched (result_t.fmt). */
#define M_FP8 1
#define M_NVFP4 2

typedef struct result {
    int rc, line;
    char what[200];
    int fmt[STEPS][NT];
    /* test_lowered_rank: each pulled mean's relative L2 to the exact mean,
     * and a hash of its bytes (both workers must pull the same). */
    double err[STEPS][NT];
    uint64_t hash[STEPS][NT];
} result_t;

/* 1: test_lowered_rank (policy all under a transform cap, no budget). */
static int g_rank_mode;

#define WFAIL(res, code, ...)                                                                      \
    do {                                                                                           \
        (res)->rc = (code) ? (code) : -1;                                                          \
        (res)->line = __LINE__;                                                                    \
        snprintf((res)->what, sizeof(res)->what, __VA_ARGS__);                                     \
        goto out;                                                                                  \
    } while (0)

#define MAX_SHARDS 2
static pid_t daemon_pid[MAX_SHARDS] = {-1, -1};
static char daemon_log[MAX_SHARDS][512];
static int nshards;
/* test_budget_kill: the shard's data directory ("" for none), the port a
 * restart takes again, and each worker's pipes (it writes sig after
 * KILL_AT's pushes, then reads go; -1 when not killing). */
static char g_data_dir[512];
static int g_port;
static int g_sig_w[WORLD] = {-1, -1}, g_go_r[WORLD] = {-1, -1};

/* Starts shard `shard` of count with the policy and budget, returns its port. */
static int daemon_start(int shard, int count)
{
    const char *tmp = getenv("TMPDIR");
    char line[256], sid[16], ns[16];
    char *argv[] = {(char *)GIFTD_BIN, (char *)"--bind", (char *)"127.0.0.1", (char *)"--port",
                    (char *)"0", (char *)"--http-port", (char *)"-1", (char *)"--world-size",
                    (char *)"2", (char *)"--policy", (char *)(g_rank_mode ? "all" : "none"),
                    (char *)(g_rank_mode ? "--max-transform-gflops" : "--budget-bits"),
                    /* rank mode: 2 tensors x 8 x 256 x 64 x k / 1e9 GFLOP under
                     * 6e-4 only at k = 2 (k_max / 4) for both */
                    (char *)(g_rank_mode ? "0.0006" : "7"), (char *)"--log-level", (char *)"info",
                    (char *)"--shard-id", sid, (char *)"--num-shards", ns, NULL, NULL, NULL, NULL,
                    NULL};
    char portv[16], cs[16];
    int out[2], log_fd, port = 0;
    size_t len = 0;
    double end;
    pid_t parent = getpid();

    snprintf(sid, sizeof sid, "%d", shard);
    snprintf(ns, sizeof ns, "%d", count);
    snprintf(portv, sizeof portv, "%d", g_port);
    snprintf(cs, sizeof cs, "%d", CKPT_STEPS);
    argv[4] = portv;
    if (g_data_dir[0] != '\0') {
        argv[19] = (char *)"--checkpoint-steps";
        argv[20] = cs;
        argv[21] = (char *)"--data-dir";
        argv[22] = g_data_dir;
    }
    snprintf(daemon_log[shard], sizeof daemon_log[shard], "%s/giftd-policy-XXXXXX",
             tmp != NULL && *tmp ? tmp : "/tmp");
    log_fd = mkstemp(daemon_log[shard]);
    ck_assert_msg(log_fd >= 0, "mkstemp: %s", strerror(errno));
    ck_assert_msg(pipe2(out, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));
    daemon_pid[shard] = fork();
    ck_assert_msg(daemon_pid[shard] >= 0, "fork: %s", strerror(errno));
    if (daemon_pid[shard] == 0) {
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
        ck_assert_msg(left > 0 && len < sizeof line - 1, "giftd printed no ready line (log %s)",
                      daemon_log[shard]);
        if (poll(&pfd, 1, left) <= 0)
            continue;
        n = read(out[0], line + len, sizeof line - 1 - len);
        ck_assert_msg(n > 0, "giftd closed stdout before its ready line (log %s)",
                      daemon_log[shard]);
        len += (size_t)n;
    }
    line[len] = '\0';
    close(out[0]);
    ck_assert_msg(sscanf(line, "giftd ready port=%d", &port) == 1 && port > 0,
                  "unexpected ready line \"%s\"", line);
    return port;
}

static void daemons_stop(void)
{
    int status;
    for (int i = 0; i < MAX_SHARDS; i++)
        if (daemon_pid[i] > 0) {
            kill(daemon_pid[i], SIGTERM);
            waitpid(daemon_pid[i], &status, 0);
            daemon_pid[i] = -1;
        }
}

/* The gradient of tensor t, rank r, step s: A large before the first
 * refresh and after the second, B large in between. */
static void gen(float *x, int t, int r, int s)
{
    uint64_t st = 0xC0FFEEull ^ ((uint64_t)t << 40) ^ ((uint64_t)r << 32) ^ ((uint64_t)s * 977u);
    int a_big = s < REFRESH || s >= 2 * REFRESH;
    double scale = (t == 0) == a_big ? 1.0 : 0.01;
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
        x[i] = (float)(scale * rng_normal(&st));
}

/* The layer inputs sketched at refresh steps: isotropic, the same for both
 * tensors, so their whitened metrics are alike and magnitude decides. */
static void gen_inputs(float *x, int t, int r, int s)
{
    uint64_t st = 0xABCDull ^ ((uint64_t)t << 40) ^ ((uint64_t)r << 32) ^ ((uint64_t)s * 31u);
    for (size_t i = 0; i < (size_t)SKETCH_ROWS * COLS; i++)
        x[i] = (float)rng_normal(&st);
}

/* The mean giftd must return for tensor t at step s in format f, exactly:
 * each rank's push encoded and decoded, summed in rank order, times 1/2
 * (+0), encoded and decoded again. */
static int reference(gift_format_t f, int t, int s, float *g, float *acc, float *d, uint8_t *pay,
                     size_t cap, float *want)
{
    gift_codec_params_t p = {f, 0, 0, {0}};
    const size_t n = (size_t)ROWS * COLS;
    /* One payload per chunk (nvfp4's tensor scale is a chunk's). */
    const size_t per = nshards > 1 ? n / 8 : n;
    int rc;
    for (int r = 0; r < WORLD; r++) {
        gen(g, t, r, s);
        for (size_t c0 = 0; c0 < n; c0 += per)
            if ((rc = gift_encode(&p, g + c0, per, pay, cap)) < 0 ||
                (rc = gift_decode(&p, pay, cap, per, d + c0)) < 0)
                return rc;
        for (size_t i = 0; i < n; i++)
            acc[i] = r == 0 ? d[i] : acc[i] + d[i];
    }
    for (size_t i = 0; i < n; i++)
        acc[i] = acc[i] * (1.0f / (float)WORLD) + 0.0f;
    for (size_t c0 = 0; c0 < n; c0 += per)
        if ((rc = gift_encode(&p, acc + c0, per, pay, cap)) < 0 ||
            (rc = gift_decode(&p, pay, cap, per, want + c0)) < 0)
            return rc;
    return 0;
}

/* The workers' gift_client_opts_t.codec_threads (test_budget_mix runs with 0
 * and with 2: the same bytes either way). */
static int g_codec_threads;

static void worker(int rank, const char *servers, result_t *res)
{
    const size_t n = (size_t)ROWS * COLS;
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t td[NT];
    gift_client_t *c = NULL;
    gift_op_t *ops[NT];
    float *g[NT], *out[NT], *x = malloc((size_t)SKETCH_ROWS * COLS * sizeof(float));
    float *rg = malloc(n * sizeof(float)), *acc = malloc(n * sizeof(float));
    float *d = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    size_t cap = 2 * n + 65536;
    uint8_t *pay = malloc(cap);
    int rc;

    for (int i = 0; i < NT; i++) {
        gift_tensor_desc_t t = GIFT_TENSOR_INIT;
        t.name = i == 0 ? "a.weight" : "b.weight";
        t.rows = ROWS;
        t.cols = COLS;
        t.push_codec = GIFT_CODEC_FP8_E4M3;
        t.pull_codec = GIFT_CODEC_FP8_E4M3;
        t.geometry = 1;
        t.rank = RANK;
        t.refresh = REFRESH;
        td[i] = t;
        g[i] = malloc(n * sizeof(float));
        out[i] = malloc(n * sizeof(float));
        if (g[i] == NULL || out[i] == NULL)
            WFAIL(res, GIFT_ENOMEM, "allocation");
    }
    if (x == NULL || rg == NULL || acc == NULL || d == NULL || want == NULL || pay == NULL)
        WFAIL(res, GIFT_ENOMEM, "allocation");
    o.servers = servers;
    o.rank = rank;
    o.world_size = WORLD;
    o.codec_threads = g_codec_threads;
    if (nshards > 1) /* 8 chunks per tensor, spread over the shards */
        o.chunk_bytes = (uint64_t)(ROWS / 8) * COLS * sizeof(float);
    if (g_sig_w[rank] >= 0) { /* a shard restart to ride through */
        o.timeout_ms = 30000;
        o.connect_timeout_ms = 20000;
        o.backoff_max_ms = 200;
    }
    if ((rc = gift_client_open(&o, &c)) < 0)
        WFAIL(res, rc, "gift_client_open");
    if ((rc = gift_declare(c, td, NT)) < 0)
        WFAIL(res, rc, "gift_declare");
    for (int s = 0; s < STEPS; s++) {
        if (s > 0 && s % REFRESH == 0)
            for (int i = 0; i < NT; i++) {
                gen_inputs(x, i, rank, s);
                if ((rc = gift_sketch_inputs(c, (uint32_t)i, (uint64_t)s, x, SKETCH_ROWS)) < 0)
                    WFAIL(res, rc, "step %d tensor %d: sketch", s, i);
            }
        if (s == KILL_AT && g_sig_w[rank] >= 0) {
            /* Push, tell the test, wait while it kills and restarts the
             * shard, then pull. */
            char b = 'p';
            for (int i = 0; i < NT; i++) {
                gen(g[i], i, rank, s);
                if ((rc = gift_push(c, (uint32_t)i, (uint64_t)s, g[i], NULL, NULL, &ops[i])) < 0)
                    WFAIL(res, rc, "step %d tensor %d: push", s, i);
            }
            for (int i = 0; i < NT; i++) {
                rc = gift_op_wait(ops[i]);
                gift_op_free(ops[i]);
                if (rc < 0)
                    WFAIL(res, rc, "step %d tensor %d: the push failed", s, i);
            }
            if (write(g_sig_w[rank], &b, 1) != 1 || read(g_go_r[rank], &b, 1) != 1)
                WFAIL(res, GIFT_EIO, "signal pipes");
            for (int i = 0; i < NT; i++)
                if ((rc = gift_pull(c, (uint32_t)i, (uint64_t)s, out[i], NULL, NULL, &ops[i])) < 0)
                    WFAIL(res, rc, "step %d tensor %d: pull", s, i);
        } else {
            for (int i = 0; i < NT; i++) {
                gen(g[i], i, rank, s);
                if ((rc = gift_push_pull(c, (uint32_t)i, (uint64_t)s, g[i], out[i], NULL, NULL,
                                         &ops[i])) < 0)
                    WFAIL(res, rc, "step %d tensor %d: push_pull", s, i);
            }
        }
        for (int i = 0; i < NT; i++) {
            rc = gift_op_wait(ops[i]);
            gift_op_free(ops[i]);
            if (rc < 0)
                WFAIL(res, rc, "step %d tensor %d: the pull failed", s, i);
        }
        for (int i = 0; i < NT; i++) {
            uint64_t h = 1469598103934665603ull;
            const uint8_t *b = (const uint8_t *)out[i];
            for (size_t j = 0; j < n * sizeof(float); j++)
                h = (h ^ b[j]) * 1099511628211ull;
            res->hash[s][i] = h;
        }
        for (int i = 0; g_rank_mode && i < NT; i++) {
            double e2 = 0, m2 = 0;
            for (int r = 0; r < WORLD; r++) {
                gen(rg, i, r, s);
                for (size_t j = 0; j < n; j++)
                    acc[j] = r == 0 ? rg[j] / WORLD : acc[j] + rg[j] / WORLD;
            }
            for (size_t j = 0; j < n; j++) {
                e2 += ((double)out[i][j] - acc[j]) * ((double)out[i][j] - acc[j]);
                m2 += (double)acc[j] * acc[j];
            }
            res->err[s][i] = sqrt(e2 / m2);
        }
        for (int i = 0; !g_rank_mode && i < NT; i++) {
            static const gift_format_t F[2] = {GIFT_FMT_E4M3, GIFT_FMT_NVFP4};
            for (int k = 0; k < 2; k++) {
                if ((rc = reference(F[k], i, s, rg, acc, d, pay, cap, want)) < 0)
                    WFAIL(res, rc, "step %d tensor %d: reference", s, i);
                if (memcmp(want, out[i], n * sizeof(float)) == 0)
                    res->fmt[s][i] |= k == 0 ? M_FP8 : M_NVFP4;
            }
        }
    }
out:
    if (c != NULL)
        gift_client_close(c);
    for (int i = 0; i < NT; i++) {
        free(g[i]);
        free(out[i]);
    }
    free(x);
    free(rg);
    free(acc);
    free(d);
    free(want);
    free(pay);
}

/* Runs the two workers against count shards; res gets their results. With
 * kill (one shard, g_data_dir set) the shard is SIGKILLed once both workers
 * pushed step KILL_AT, and a new giftd on its data directory and port
 * takes over before they pull it. */
static void run_cluster_kill(int count, result_t *res, int kill_it)
{
    pid_t pid[WORLD];
    int fd[WORLD], sig_r[WORLD], go_w[WORLD];
    char servers[128];
    size_t len = 0;
    pid_t parent = getpid();

    nshards = count;
    for (int i = 0; i < count; i++) {
        int port = daemon_start(i, count);
        if (kill_it)
            g_port = port; /* the restart takes it again */
        len += (size_t)snprintf(servers + len, sizeof servers - len, "%s127.0.0.1:%d", i ? "," : "",
                                port);
    }
    for (int r = 0; r < WORLD; r++) {
        int p[2], a[2], b[2];
        ck_assert(pipe(p) == 0);
        if (kill_it) {
            ck_assert(pipe(a) == 0 && pipe(b) == 0);
            g_sig_w[r] = a[1];
            g_go_r[r] = b[0];
            sig_r[r] = a[0];
            go_w[r] = b[1];
        }
        pid[r] = fork();
        ck_assert_msg(pid[r] >= 0, "fork: %s", strerror(errno));
        if (pid[r] == 0) {
            result_t mine;
            ssize_t wr;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
            close(p[0]);
            memset(&mine, 0, sizeof mine);
            worker(r, servers, &mine);
            wr = write(p[1], &mine, sizeof mine);
            _exit(wr == (ssize_t)sizeof mine ? 0 : 1);
        }
        close(p[1]);
        fd[r] = p[0];
        if (kill_it) {
            close(g_sig_w[r]);
            close(g_go_r[r]);
            g_sig_w[r] = g_go_r[r] = -1;
        }
    }
    if (kill_it) {
        int status;
        for (int r = 0; r < WORLD; r++) {
            struct pollfd pfd = {.fd = sig_r[r], .events = POLLIN};
            char b;
            if (poll(&pfd, 1, WORKER_TIMEOUT_MS) != 1 || read(sig_r[r], &b, 1) != 1) {
                for (int q = 0; q < WORLD; q++)
                    kill(pid[q], SIGKILL);
                ck_abort_msg("worker %d did not reach step %d (giftd log %s)", r, KILL_AT,
                             daemon_log[0]);
            }
        }
        kill(daemon_pid[0], SIGKILL);
        waitpid(daemon_pid[0], &status, 0);
        daemon_pid[0] = -1;
        unlink(daemon_log[0]);
        daemon_start(0, 1); /* g_port: the same port */
        for (int r = 0; r < WORLD; r++) {
            char b = 'g';
            ck_assert(write(go_w[r], &b, 1) == 1);
            close(go_w[r]);
            close(sig_r[r]);
        }
    }
    for (int r = 0; r < WORLD; r++) {
        size_t got = 0;
        double end = now_ms() + WORKER_TIMEOUT_MS;
        while (got < sizeof res[r]) {
            struct pollfd pfd = {.fd = fd[r], .events = POLLIN};
            int left = (int)(end - now_ms());
            ssize_t k;
            if (left <= 0 || poll(&pfd, 1, left) <= 0) {
                for (int q = 0; q < WORLD; q++)
                    kill(pid[q], SIGKILL);
                ck_abort_msg("worker %d gave no result within %d ms (giftd log %s)", r,
                             WORKER_TIMEOUT_MS, daemon_log[0]);
            }
            k = read(fd[r], (char *)&res[r] + got, sizeof res[r] - got);
            ck_assert_msg(k > 0, "worker %d exited without a result", r);
            got += (size_t)k;
        }
        waitpid(pid[r], NULL, 0);
        close(fd[r]);
        ck_assert_msg(res[r].rc == 0, "worker %d failed at line %d: %s (%s); giftd log %s", r,
                      res[r].line, res[r].what, gift_strerror(res[r].rc), daemon_log[0]);
    }
    daemons_stop();
}

static void run_cluster(int count, result_t *res)
{
    run_cluster_kill(count, res, 0);
}

/* What every run must show: each pulled mean bit for bit one format's
 * codec output, the same on both workers, changing only where an epoch
 * begins. Returns how many (step, tensor) changes there were. */
static int check_steps(const result_t *res)
{
    int changes = 0;
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < NT; i++) {
            int m = res[0].fmt[s][i];
            ck_assert_msg(m == M_FP8 || m == M_NVFP4,
                          "step %d tensor %d: the pulled mean matched %s", s, i,
                          m == 0 ? "neither the fp8 nor the nvfp4 reference"
                                 : "both references (degenerate data)");
            ck_assert_msg(res[1].fmt[s][i] == m,
                          "step %d tensor %d: worker 0 decoded format mask %d, worker 1 %d", s, i,
                          m, res[1].fmt[s][i]);
            if (s > 0 && res[0].fmt[s - 1][i] != m) {
                ck_assert_msg(s % REFRESH == 1,
                              "step %d tensor %d: the format changed from mask %d to %d outside "
                              "an epoch's first step",
                              s, i, res[0].fmt[s - 1][i], m);
                changes++;
            }
        }
    return changes;
}

START_TEST(test_budget_mix)
{
    result_t res[WORLD];
    int changes;

    g_codec_threads = _i ? 2 : 0;
    run_cluster(1, res);
    changes = check_steps(res);
    for (int s = 0; s < STEPS; s++)
        ck_assert_msg(!(res[0].fmt[s][0] == M_FP8 && res[0].fmt[s][1] == M_FP8),
                      "step %d: both tensors in fp8, above the 7-bit budget", s);
    /* A large before refresh 1, B before refresh 2: fp8 must move to B. */
    ck_assert_msg(res[0].fmt[STEPS - 1][1] == M_FP8 && res[0].fmt[STEPS - 1][0] == M_NVFP4,
                  "last step: tensor A mask %d, B mask %d; want B in fp8, A in nvfp4 (masks: "
                  "1 fp8, 2 nvfp4)",
                  res[0].fmt[STEPS - 1][0], res[0].fmt[STEPS - 1][1]);
    ck_assert_msg(changes >= 1, "no format change across %d steps", STEPS);
    unlink(daemon_log[0]);
}
END_TEST

/* policy all with a transform cap that only k = k_max / 4 meets: both
 * tensors' epochs from the first refresh on lower the rank to 2, which the
 * workers apply (T and T^-1 from the first two columns, the rank-2 sigma2)
 * and the owner inverts for its gbar. Every step must complete, both
 * workers must pull the same bytes, the means must stay near the exact
 * ones (fp8 in a transformed basis), and the owner must have said k 2. */
START_TEST(test_lowered_rank)
{
    result_t res[WORLD];
    char cmd[700];
    int found;
    g_rank_mode = 1;
    run_cluster(1, res);
    g_rank_mode = 0;
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < NT; i++) {
            ck_assert_msg(res[0].hash[s][i] == res[1].hash[s][i],
                          "step %d tensor %d: the workers pulled different bytes", s, i);
            ck_assert_msg(res[0].err[s][i] < 0.2,
                          "step %d tensor %d: relative L2 to the exact mean %.4g (fp8 at rank "
                          "2); giftd log %s",
                          s, i, res[0].err[s][i], daemon_log[0]);
        }
    snprintf(cmd, sizeof cmd, "grep -q 'policy all chose gift k 2, push fp8-e4m3' %s",
             daemon_log[0]);
    found = system(cmd) == 0;
    ck_assert_msg(found, "giftd never chose rank 2 under the cap; log %s", daemon_log[0]);
    fprintf(stderr, "test_lowered_rank: last step relative L2 %.4g / %.4g\n",
            res[0].err[STEPS - 1][0], res[0].err[STEPS - 1][1]);
    unlink(daemon_log[0]);
}
END_TEST

/* Two shards, eight chunks per tensor: most chunks live on a shard that
 * does not own the tensor's geometry and learns each step's codecs from its
 * pushes. Every chunk of a step must still come back in the one format of
 * the decision (the whole tensor matches one reference bit for bit). Each
 * owner holds the budget over the tensors it owns. */
START_TEST(test_two_shards)
{
    result_t res[WORLD];
    int nv = 0;
    run_cluster(2, res);
    (void)check_steps(res);
    for (int s = 0; s < STEPS; s++)
        nv += (res[0].fmt[s][0] == M_NVFP4) + (res[0].fmt[s][1] == M_NVFP4);
    /* 7 bits cannot buy fp8 for all (each owner holds one or both). */
    ck_assert_msg(nv >= STEPS, "only %d of %d tensor steps in nvfp4 under a 7-bit budget", nv,
                  2 * STEPS);
    unlink(daemon_log[0]);
    unlink(daemon_log[1]);
}
END_TEST

/* test_budget_mix with checkpoints (every 3 steps) and a SIGKILL of the
 * shard after step KILL_AT's pushes, past the first format change: the
 * restarted shard (checkpoint of step 6 plus the step log) must republish
 * the same decisions, finish step KILL_AT and choose epoch 2 as a shard
 * that never stopped, so every pulled mean equals a fault-free run's bit
 * for bit (both runs with checkpoints on). */
START_TEST(test_budget_kill)
{
    result_t ref[WORLD], res[WORLD];
    const char *tmp = getenv("TMPDIR");
    char cmd[700];
    int changes;

    snprintf(g_data_dir, sizeof g_data_dir, "%s/giftd-policy-kill-XXXXXX",
             tmp != NULL && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(g_data_dir) != NULL, "mkdtemp: %s", strerror(errno));
    run_cluster(1, ref); /* fault-free */
    unlink(daemon_log[0]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*", g_data_dir);
    ck_assert_int_eq(system(cmd), 0);
    g_port = 0;
    run_cluster_kill(1, res, 1);
    g_port = 0;
    changes = check_steps(ref);
    ck_assert_msg(changes >= 1 && (ref[0].fmt[KILL_AT][0] != ref[0].fmt[0][0] ||
                                   ref[0].fmt[KILL_AT][1] != ref[0].fmt[0][1]),
                  "the fault-free run changed format %d times (masks A %d B %d at step 0, A %d "
                  "B %d at step %d); the kill must come after a change",
                  changes, ref[0].fmt[0][0], ref[0].fmt[0][1], ref[0].fmt[KILL_AT][0],
                  ref[0].fmt[KILL_AT][1], KILL_AT);
    (void)check_steps(res);
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < NT; i++)
            for (int r = 0; r < WORLD; r++)
                ck_assert_msg(
                    res[r].hash[s][i] == ref[r].hash[s][i] && res[r].fmt[s][i] == ref[r].fmt[s][i],
                    "worker %d step %d tensor %d: after the kill at step %d the mean "
                    "(hash %016llx, format mask %d) differs from the fault-free run's "
                    "(%016llx, mask %d); giftd log %s",
                    r, s, i, KILL_AT, (unsigned long long)res[r].hash[s][i], res[r].fmt[s][i],
                    (unsigned long long)ref[r].hash[s][i], ref[r].fmt[s][i], daemon_log[0]);
    snprintf(cmd, sizeof cmd, "grep -q 'restored from' %s", daemon_log[0]);
    ck_assert_msg(system(cmd) == 0, "the restarted giftd did not restore; log %s", daemon_log[0]);
    unlink(daemon_log[0]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_data_dir);
    ck_assert_int_eq(system(cmd), 0);
    g_data_dir[0] = '\0';
}
END_TEST

static Suite *policy_suite(void)
{
    Suite *s = suite_create("client_policy");
    TCase *tc = tcase_create("cluster");
    tcase_set_timeout(tc, 180);
    tcase_add_loop_test(tc, test_budget_mix, 0, 2);
    tcase_add_test(tc, test_two_shards);
    tcase_add_test(tc, test_lowered_rank);
    tcase_add_test(tc, test_budget_kill);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* Workers are forked: keep OpenBLAS from starting threads before. */
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    signal(SIGPIPE, SIG_IGN);
    return gift_test_run(policy_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
