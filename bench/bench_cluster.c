/*
 * bench_cluster.c: gift-bench cluster, end-to-end throughput of giftd.
 *
 * Starts S giftd shards and W worker processes on loopback (or uses a
 * running cluster given by --servers), runs a tensor list for a number of
 * steps under every codec row and reports, per row, per-worker goodput in
 * FP32-equivalent GB/s, wire GB/s and step time p50/p99. The same run
 * measures a raw-TCP baseline between two processes (streaming GB/s and
 * 4 KiB round trip) and a 4 KiB push+pull through giftd, and checks the
 * three targets against it.
 *
 * Processes: every child (shards, workers, the raw-TCP peer) is recorded in
 * one table and killed at exit, on every path: an atexit handler, a
 * SIGINT/SIGTERM handler, and PR_SET_PDEATHSIG in the shards for a parent
 * that is killed outright. Workers report to the parent through one pipe
 * each, in fixed-size messages.
 */
#define _GNU_SOURCE

#include "bench_common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/resource.h>
#endif

#include "gift/client.h"

#ifndef GIFTD_BIN
#define GIFTD_BIN "giftd"
#endif

#define CL_MAX_SHARDS 64
#define CL_MAX_WORKERS 64
#define CL_MAX_STEPS 400
#define CL_MAX_ROWS 16
#define CL_PROBE_COLS 1024
#define CL_READY_TIMEOUT_S 20.0
#define CL_SKETCH_ROWS 256 /* rows of the random layer inputs sketched per tensor */
#define CL_REFRESH 1000    /* sketch once, at the first step (a multiple of it) */

/* Targets of the cluster benchmark. */
#define TARGET_WIRE_X_RAW 0.8  /* f32 push+pull wire rate over raw streaming */
#define TARGET_FP8_X_F32 3.0   /* fp8-e4m3 goodput over f32 goodput */
#define TARGET_PROBE_X_RTT 3.0 /* 4 KiB push+pull p50 over raw round trip, at most */

typedef struct cl_codec {
    const char *name;
    gift_codec_t codec;
} cl_codec_t;

static const cl_codec_t cl_codecs[] = {
    {"f32", GIFT_CODEC_F32},           {"bf16", GIFT_CODEC_BF16},
    {"fp8-e4m3", GIFT_CODEC_FP8_E4M3}, {"fp8-e5m2", GIFT_CODEC_FP8_E5M2},
    {"nvfp4", GIFT_CODEC_NVFP4},
};
#define CL_NCODECS (sizeof(cl_codecs) / sizeof(cl_codecs[0]))

typedef struct cl_opts {
    long shards, workers, steps, warmup, mib, chunk_mib, k, rtt_iters, stream_reps;
    double row_seconds;
    int llama;
    const char *codecs;     /* comma list of cl_codecs names */
    const char *transforms; /* comma list of euclidean, gift */
    const char *json;
    const char *giftd;
    const char *servers; /* NULL: start our own shards */
    uint64_t step0;
    uint64_t seed;
    int pull_ef;        /* --pull-ef: every row tensor declared with pull_error_feedback */
    int inplace;        /* --inplace: gift_push_pull(grad, grad), as gift.torch calls it */
    int ef;             /* --ef: every row tensor declared with error_feedback */
    long codec_threads; /* --codec-threads: gift_client_opts_t.codec_threads */
} cl_opts_t;

/* One tensor of the base list (the same list is declared once per row). */
typedef struct cl_tensor {
    char name[48];
    uint32_t rows, cols;
} cl_tensor_t;

/* The shard's pass kinds, as giftd's /metrics names them
 * (giftd_pass_bytes_total{pass="..."}); a kind not listed here is ignored. */
static const char *const cl_spass_names[] = {"decode", "accumulate", "fused",    "encode",
                                             "copy",   "check",      "residual", "scale"};
#define CL_SPASS_KINDS ((int)(sizeof(cl_spass_names) / sizeof(cl_spass_names[0])))

/* One table row: a codec under one transform. */
typedef struct cl_row {
    const cl_codec_t *codec;
    int gift;
    /* filled in by the parent from the workers' reports */
    int nsteps; /* measured steps, per worker (the same on all) */
    double goodput[CL_MAX_WORKERS], wire[CL_MAX_WORKERS];
    double goodput_mean, goodput_min, wire_mean, p50_ms, p99_ms;
    double cpu_w[CL_MAX_WORKERS];      /* each worker's CPU seconds per measured step */
    double measured_s[CL_MAX_WORKERS]; /* each worker's wall time of its measured steps */
    double worker_cpu_ms;              /* their mean, ms per step */
    double shard_cpu_ms;               /* all shards together, ms per step (NAN: not ours) */
    /* Per-byte costs (NAN where not measured). Worker figures pool every
     * worker: sums of the counters' deltas over their measured steps. */
    double w_io_ns, w_payload, w_fp32, w_pass[GIFT_PASS_KINDS]; /* sums; w_fp32: list B x steps */
    int w_have;                                                 /* workers whose counters came */
    double worker_io_ns_per_payload_byte; /* I/O-thread CPU ns / (payload_out + payload_in) */
    double worker_io_ns_per_fp32_byte;    /* ... / (2 x list FP32 bytes x steps: push + pull) */
    double worker_passes;                 /* pass bytes / (list FP32 bytes x steps), per worker */
    double worker_passes_by_kind[GIFT_PASS_KINDS];
    double shard_ns_per_payload_byte; /* all shards' process CPU ns / their payload in + out */
    double shard_passes; /* all shards' pass bytes / (W x list FP32 bytes x steps): pushed */
    double shard_passes_by_kind[CL_SPASS_KINDS];
    double *steps_all; /* W * nsteps step times, seconds */
    uint32_t switches; /* rank 0's epoch switches over the row */
    int sketched;      /* geometry tensors sketched at step 0 */
    int nall;
} cl_row_t;

/* Worker -> parent message: one per row, then one for the probe. */
enum { CL_MSG_ROW = 1, CL_MSG_PROBE = 2, CL_MSG_ERROR = 3 };

typedef struct cl_msg {
    int kind;
    int row;
    int status;
    int nsteps;
    uint64_t wire_bytes; /* bytes_out + bytes_in over the measured steps */
    double measured_s;   /* wall time of the measured steps */
    uint32_t switches;   /* epochs_switched over the row (gift rows) */
    int sketched;        /* tensors sketched at the row's first step */
    double p50_s;        /* probe: median push+pull time */
    double cpu_s;        /* this worker's CPU time (all its threads) over the measured steps */
    double shard_cpu_s;  /* rank 0: the shards' CPU time over its measured steps; else NAN */
    /* Per-byte counters over the measured steps (deltas): */
    uint64_t io_cpu_ns;                   /* the client's I/O thread */
    uint64_t payload_bytes;               /* payload_out + payload_in */
    uint64_t pass_bytes[GIFT_PASS_KINDS]; /* the client's, by kind */
    int have_counters;                    /* gift_client_counters answered both times */
    int have_shard_metrics;               /* rank 0: every shard's /metrics scraped twice */
    double smet_cpu_s;                    /* rank 0: process_cpu_seconds_total, all shards */
    double smet_payload;                  /* rank 0: giftd_payload_bytes_total, in + out */
    double smet_pass[CL_SPASS_KINDS];     /* rank 0: giftd_pass_bytes_total by kind */
    long probe_n;
    char err[160];
    double step_s[CL_MAX_STEPS];
} cl_msg_t;

/* Shared between the parent and the workers (MAP_SHARED): the step at
 * which each row stops, so that a row over its time budget stops on every
 * worker at the same step. Rank 0 lowers it; see run_row. */
typedef struct cl_shared {
    atomic_long limit[CL_MAX_ROWS];
} cl_shared_t;

/* ------------------------------------------------------------------ */
/* Children: every process we start, killed at exit                    */

static pid_t cl_children[CL_MAX_SHARDS + CL_MAX_WORKERS + 4];
/* The shards this run started (inherited by the forked workers, which
 * read the shards' CPU time around their measured steps). */
static pid_t cl_shard_pids[CL_MAX_SHARDS];
static int cl_shard_http[CL_MAX_SHARDS]; /* each one's /metrics port (0: none) */
static int cl_nshard_pids;
static volatile sig_atomic_t cl_nchildren;
static int cl_cleanup_installed;

static void child_add(pid_t pid)
{
    if ((size_t)cl_nchildren < sizeof(cl_children) / sizeof(cl_children[0]))
        cl_children[cl_nchildren++] = pid;
}

/* Forgets pid (it has been reaped). */
static void child_forget(pid_t pid)
{
    for (int i = 0; i < cl_nchildren; i++)
        if (cl_children[i] == pid)
            cl_children[i] = 0;
}

/* SIGTERM to every child still recorded, then up to 2 s for them to go,
 * then SIGKILL. Safe to call twice. */
static void children_kill(void)
{
    double t0;
    int left;

    for (int i = 0; i < cl_nchildren; i++)
        if (cl_children[i] > 0)
            kill(cl_children[i], SIGTERM);
    t0 = bench_now();
    do {
        left = 0;
        for (int i = 0; i < cl_nchildren; i++) {
            pid_t got;

            if (cl_children[i] <= 0)
                continue;
            got = waitpid(cl_children[i], NULL, WNOHANG);
            if (got == cl_children[i] || (got < 0 && errno == ECHILD))
                cl_children[i] = 0;
            else
                left++;
        }
        if (left > 0)
            usleep(10000);
    } while (left > 0 && bench_now() - t0 < 2.0);
    for (int i = 0; i < cl_nchildren; i++) {
        if (cl_children[i] > 0) {
            kill(cl_children[i], SIGKILL);
            waitpid(cl_children[i], NULL, 0);
            cl_children[i] = 0;
        }
    }
    cl_nchildren = 0;
}

static void cleanup_atexit(void)
{
    children_kill();
}

/* Async-signal-safe: SIGKILL everything and leave with the usual status. */
static void cleanup_signal(int sig)
{
    for (int i = 0; i < cl_nchildren; i++)
        if (cl_children[i] > 0)
            kill(cl_children[i], SIGKILL);
    _exit(128 + sig);
}

static void cleanup_install(void)
{
    struct sigaction sa;

    if (cl_cleanup_installed)
        return;
    cl_cleanup_installed = 1;
    atexit(cleanup_atexit);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cleanup_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A dead worker's pipe must not kill the parent. */
    signal(SIGPIPE, SIG_IGN);
}

/* In a freshly forked child: it owns no children, and signals go back to
 * their defaults. */
static void child_reset(void)
{
    cl_nchildren = 0;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
}

/* ------------------------------------------------------------------ */
/* Options                                                             */

void bench_cluster_usage(FILE *f);

void bench_cluster_usage(FILE *f)
{
    fprintf(f,
            "usage: gift-bench cluster [--shards S] [--workers W] [--steps N] [--warmup N]\n"
            "                          [--mib N] [--chunk-mib N] [--list single|llama]\n"
            "                          [--codecs LIST] [--transforms LIST] [--k K]\n"
            "                          [--row-seconds X] [--rtt-iters N] [--stream-reps N]\n"
            "                          [--giftd PATH] [--servers host:port,...] [--step0 N]\n"
            "                          [--seed S] [--ef] [--pull-ef] [--inplace]\n"
            "                          [--codec-threads N]\n"
            "                          [--json FILE]\n"
            "\n"
            "End-to-end throughput of giftd on loopback. Starts S shards (giftd --port 0)\n"
            "and W worker processes; each worker opens a gift client, declares the tensor\n"
            "list once per codec row, and per step calls gift_push_pull on every tensor and\n"
            "waits for all. Per row: goodput (FP32 bytes of the list / step time, GB/s per\n"
            "worker), wire GB/s (client bytes_out + bytes_in per second), step p50/p99.\n"
            "In the same run: raw TCP between two processes (streaming GB/s, 4 KiB\n"
            "round trip) and a 4 KiB push+pull through giftd (a 1 x 1024 f32 tensor).\n"
            "Targets (meant for 1 shard, 1 worker, --mib 64 --chunk-mib 4):\n"
            "f32 wire >= %.1fx raw streaming; fp8-e4m3 goodput >= %.0fx f32 goodput;\n"
            "4 KiB push+pull p50 <= %.0fx raw round trip. Exit 0 when the run completes,\n"
            "pass or fail.\n"
            "\n"
            "Per-byte costs, a second table (and JSON fields of each row), from counters the\n"
            "code keeps, over the measured steps: the worker's I/O thread\n"
            "(gift_client_counters) in CPU ns per payload byte out + in and per FP32 byte\n"
            "moved (2 x the list per step), and its passes over the data per step (pass\n"
            "bytes / the list's FP32 bytes, total and by kind); the shards (rank 0 scrapes\n"
            "each one's /metrics before and after): process CPU ns per payload byte in + out\n"
            "and passes (pass bytes / the FP32 bytes pushed, W x the list per step). With\n"
            "--servers the shard figures are n/a (null in the JSON).\n"
            "\n"
            "options:\n"
            "  --shards S        shards to start (default 1)\n"
            "  --workers W       worker processes (default 1)\n"
            "  --steps N         measured steps per row (default 10, at most %d)\n"
            "  --warmup N        untimed steps first (default 2)\n"
            "  --row-seconds X   a row stops after this long, at least 3 steps (default 4)\n"
            "  --mib N           single: the tensor's size in MiB of fp32 (default 64)\n"
            "  --chunk-mib N     client chunk size, MiB of fp32 (default 4)\n"
            "  --list L          single: one N MiB tensor (N/4 Mi x 1024);\n"
            "                    llama: a small Llama-like list (~59 MiB, 14 layers, about\n"
            "                    100 small tensors among the matrices)\n"
            "  --codecs LIST     of f32,bf16,fp8-e4m3,fp8-e5m2,nvfp4 (default\n"
            "                    f32,bf16,fp8-e4m3,nvfp4)\n"
            "  --transforms LIST of euclidean,gift (default both)\n"
            "  --k K             rank of the gift rows' 2-D tensors (default 32); each sends\n"
            "                    one sketch of random inputs at its first step\n"
            "  --rtt-iters N     round trips for the raw and giftd 4 KiB probes (default 2000)\n"
            "  --stream-reps N   raw streaming repetitions of --mib MiB (default 5)\n"
            "  --giftd PATH      the giftd binary (default %s)\n"
            "  --servers LIST    use this running cluster (world size = --workers) instead\n"
            "                    of starting shards\n"
            "  --step0 N         first step of every tensor (default 0). A shard accepts only\n"
            "                    the next step of each tensor, so run the bench once per\n"
            "                    fresh cluster\n"
            "  --seed S          seed of the gradients (default 1)\n"
            "  --ef              declare the rows' tensors with error_feedback (the worker\n"
            "                    keeps each push's residual; no effect on f32 rows)\n"
            "  --pull-ef         declare the rows' tensors with pull_error_feedback (the\n"
            "                    shards keep the residual of each step's encoded mean;\n"
            "                    no effect on f32 rows)\n"
            "  --codec-threads N each worker's client transforms and encodes its pushes on N\n"
            "                    threads beside the I/O thread (opts.codec_threads; default\n"
            "                    0, or $GIFT_CODEC_THREADS); their CPU is counted with the\n"
            "                    I/O thread's in the per-byte costs\n"
            "  --inplace         pull into the pushed buffer (out = grad), as gift.torch's\n"
            "                    DDP hook and GiftReducer do; default: a separate out buffer\n"
            "  --json FILE       write results here (default %s/cluster.json)\n"
            "  --help            this text\n",
            TARGET_WIRE_X_RAW, TARGET_FP8_X_F32, TARGET_PROBE_X_RTT, CL_MAX_STEPS, GIFTD_BIN,
            BENCH_OUT_DIR);
}

static int parse_opts(int argc, char **argv, cl_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->shards = 1;
    o->workers = 1;
    o->steps = 10;
    o->warmup = 2;
    o->row_seconds = 4.0;
    o->mib = 64;
    o->chunk_mib = 4;
    o->k = 32;
    o->rtt_iters = 2000;
    o->stream_reps = 5;
    o->codecs = "f32,bf16,fp8-e4m3,nvfp4";
    o->transforms = "euclidean,gift";
    o->json = BENCH_OUT_DIR "/cluster.json";
    o->giftd = GIFTD_BIN;
    o->seed = 1;
    o->codec_threads = -1;
    const bench_opt_t opts[] = {
        BENCH_FLAG("--pull-ef", &o->pull_ef),
        BENCH_FLAG("--ef", &o->ef),
        BENCH_FLAG("--inplace", &o->inplace),
        BENCH_LONG("--shards", &o->shards, 1, CL_MAX_SHARDS),
        BENCH_LONG("--workers", &o->workers, 1, CL_MAX_WORKERS),
        BENCH_LONG("--steps", &o->steps, 1, CL_MAX_STEPS),
        BENCH_LONG("--warmup", &o->warmup, 0, 100),
        BENCH_LONG("--mib", &o->mib, 1, 4096),
        BENCH_LONG("--chunk-mib", &o->chunk_mib, 1, 1024),
        BENCH_LONG("--k", &o->k, 1, 1024),
        BENCH_LONG("--codec-threads", &o->codec_threads, 0, 64),
        BENCH_LONG("--rtt-iters", &o->rtt_iters, 10, 1000000),
        BENCH_LONG("--stream-reps", &o->stream_reps, 1, 1000),
        BENCH_DOUBLE("--row-seconds", &o->row_seconds, 0.0, 3600.0),
        BENCH_U64("--seed", &o->seed),
        BENCH_U64("--step0", &o->step0),
        BENCH_STR("--codecs", &o->codecs, "a value", 1),
        BENCH_STR("--transforms", &o->transforms, "a value", 1),
        BENCH_STR("--json", &o->json, "a value", 1),
        BENCH_STR("--giftd", &o->giftd, "a value", 1),
        BENCH_STR("--servers", &o->servers, "a value", 1),
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bench_cluster_usage(stdout);
            return 1;
        }
        if ((r = bench_opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, &i)) != 0) {
            if (r < 0)
                return -1;
            continue;
        }
        if (strcmp(a, "--list") != 0) {
            fprintf(stderr, "gift-bench cluster: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (v == NULL || v[0] == '\0') {
            fprintf(stderr, "gift-bench: %s needs a value\n", a);
            return -1;
        }
        if (strcmp(v, "single") == 0)
            o->llama = 0;
        else if (strcmp(v, "llama") == 0)
            o->llama = 1;
        else {
            fprintf(stderr, "gift-bench: --list: '%s' is not single or llama\n", v);
            return -1;
        }
        i++;
    }
    return 0;
}

/* Fills rows[] from --codecs x --transforms. Returns the count or -1. */
static int build_rows(const cl_opts_t *o, cl_row_t *rows)
{
    int n = 0;
    char tr[64];

    snprintf(tr, sizeof tr, "%s", o->transforms);
    for (int gift = 0; gift < 2; gift++) {
        const char *want = gift ? "gift" : "euclidean";
        int on = 0;
        char buf[64], *save = NULL;

        snprintf(buf, sizeof buf, "%s", tr);
        for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (strcmp(t, "euclidean") != 0 && strcmp(t, "gift") != 0) {
                fprintf(stderr, "gift-bench: --transforms: '%s' is not euclidean or gift\n", t);
                return -1;
            }
            on |= strcmp(t, want) == 0;
        }
        if (!on)
            continue;
        {
            char cb[256], *s2 = NULL;

            snprintf(cb, sizeof cb, "%s", o->codecs);
            for (char *t = strtok_r(cb, ",", &s2); t; t = strtok_r(NULL, ",", &s2)) {
                const cl_codec_t *c = NULL;

                for (size_t i = 0; i < CL_NCODECS; i++)
                    if (strcmp(t, cl_codecs[i].name) == 0)
                        c = &cl_codecs[i];
                if (c == NULL) {
                    fprintf(stderr, "gift-bench: --codecs: unknown codec '%s'\n", t);
                    return -1;
                }
                if (n >= CL_MAX_ROWS) {
                    fprintf(stderr, "gift-bench: at most %d rows\n", CL_MAX_ROWS);
                    return -1;
                }
                rows[n].codec = c;
                rows[n].gift = gift;
                n++;
            }
        }
    }
    if (n == 0) {
        fprintf(stderr, "gift-bench: --codecs/--transforms select no row\n");
        return -1;
    }
    return n;
}

/* The base tensor list. Returns the count (*out malloc'ed) or -1. */
static int build_list(const cl_opts_t *o, cl_tensor_t **out)
{
    cl_tensor_t *t;
    int n = 0;

    if (!o->llama) {
        if ((t = calloc(1, sizeof *t)) == NULL)
            return -1;
        snprintf(t[0].name, sizeof t[0].name, "grad");
        t[0].cols = 1024;
        t[0].rows = (uint32_t)(o->mib * 256); /* mib * 2^18 elements / 1024 */
        *out = t;
        return 1;
    }
    /* A small Llama: dim 256, 4 heads of 64, MLP 704, 14 layers, vocab 8192,
     * with q/k norms and q/k/v biases: 15.4 M parameters (about 59 MiB of
     * fp32) in 8 matrices + 7 small vectors per layer. */
    {
        const uint32_t dim = 256, ffn = 704, layers = 14, vocab = 8192, hd = 64;
        size_t cap = 3 + (size_t)layers * 15;

        if ((t = calloc(cap, sizeof *t)) == NULL)
            return -1;
#define ADD(nm, r, c)                                                                              \
    do {                                                                                           \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm);                                           \
        t[n].rows = (r);                                                                           \
        t[n].cols = (c);                                                                           \
        n++;                                                                                       \
    } while (0)
        ADD("tok_embeddings", vocab, dim);
        for (uint32_t l = 0; l < layers; l++) {
            static const char *const mats[] = {"wq", "wk", "wv", "wo"};
            static const char *const vecs[] = {"attn_norm", "q_norm", "k_norm",  "bq",
                                               "bk",        "bv",     "ffn_norm"};
            static const uint32_t vlen[] = {256, 64, 64, 256, 256, 256, 256};
            char nm[48];

            for (int i = 0; i < 4; i++) {
                snprintf(nm, sizeof nm, "layers.%u.%s", l, mats[i]);
                ADD(nm, dim, dim);
            }
            snprintf(nm, sizeof nm, "layers.%u.w1", l);
            ADD(nm, ffn, dim);
            snprintf(nm, sizeof nm, "layers.%u.w3", l);
            ADD(nm, ffn, dim);
            snprintf(nm, sizeof nm, "layers.%u.w2", l);
            ADD(nm, dim, ffn);
            for (int i = 0; i < 7; i++) {
                snprintf(nm, sizeof nm, "layers.%u.%s", l, vecs[i]);
                ADD(nm, 1, vlen[i] == 64 ? hd : vlen[i]);
            }
        }
        ADD("norm", 1, dim);
        ADD("output", vocab, dim);
#undef ADD
    }
    *out = t;
    return n;
}

static double list_fp32_bytes(const cl_tensor_t *t, int n)
{
    double b = 0;

    for (int i = 0; i < n; i++)
        b += 4.0 * t[i].rows * t[i].cols;
    return b;
}

/* ------------------------------------------------------------------ */
/* I/O helpers                                                         */

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t k = write(fd, p, len);

        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
    char *p = buf;

    while (len > 0) {
        ssize_t k = read(fd, p, len);

        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Raw TCP baseline                                                    */

typedef struct cl_raw {
    double stream_gbps; /* median over every rep, one direction */
    double rtt_p50_s;   /* 4 KiB there and back */
    double rtt_p99_s;
    long reps, iters; /* samples so far (two runs: before and after the rows) */
    size_t stream_bytes;
    double *ss, *rt; /* sample pools, room for two runs; owned by the caller */
} cl_raw_t;

static void sock_tune(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* The peer: reads reps x bytes (1-byte ack after each rep), then echoes
 * iters 4 KiB messages. Runs in the forked child; never returns. */
static void raw_peer(uint16_t port, size_t bytes, long reps, long iters)
{
    struct sockaddr_in a;
    char *buf = malloc(4u << 20), ack = 1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (buf == NULL || fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        _exit(1);
    sock_tune(fd);
    for (long r = 0; r < reps; r++) {
        size_t left = bytes;

        while (left > 0) {
            ssize_t k = read(fd, buf, left < (4u << 20) ? left : (4u << 20));

            if (k <= 0)
                _exit(1);
            left -= (size_t)k;
        }
        if (write_all(fd, &ack, 1) < 0)
            _exit(1);
    }
    for (long i = 0; i < iters; i++) {
        if (read_all(fd, buf, 4096) < 0 || write_all(fd, buf, 4096) < 0)
            _exit(1);
    }
    _exit(0);
}

/* Runs the baseline once: this process sends and times, a forked peer
 * reads and echoes. Adds the samples to r's pools (room for them is the
 * caller's) and recomputes r's figures over everything pooled. Returns 0 or
 * -1 (message printed). */
static int raw_tcp(const cl_opts_t *o, cl_raw_t *r)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    int lfd = -1, fd = -1, rc = -1, st;
    size_t bytes = (size_t)o->mib << 20;
    long warm = 100, iters = o->rtt_iters;
    char *buf = NULL, ack;
    double *ss = r->ss + r->reps, *rt = r->rt + r->iters, *tmp = NULL;
    pid_t pid = -1;

    r->stream_bytes = bytes;
    buf = bench_alloc(bytes);
    tmp = calloc((size_t)(r->reps + o->stream_reps + r->iters + iters), sizeof *tmp);
    if (buf == NULL || tmp == NULL) {
        fprintf(stderr, "gift-bench: raw tcp: out of memory\n");
        goto out;
    }
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((lfd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) < 0) {
        perror("gift-bench: raw tcp: listen on 127.0.0.1:0");
        goto out;
    }
    fflush(NULL);
    if ((pid = fork()) < 0) {
        perror("gift-bench: fork");
        goto out;
    }
    if (pid == 0) {
        child_reset();
        close(lfd);
        raw_peer(ntohs(a.sin_port), bytes, o->stream_reps, iters + warm);
    }
    child_add(pid);
    if ((fd = accept(lfd, NULL, NULL)) < 0) {
        perror("gift-bench: raw tcp: accept");
        goto out;
    }
    sock_tune(fd);
    for (long i = 0; i < o->stream_reps; i++) {
        double t0 = bench_now();

        if (write_all(fd, buf, bytes) < 0 || read_all(fd, &ack, 1) < 0) {
            fprintf(stderr, "gift-bench: raw tcp: the peer went away while streaming\n");
            goto out;
        }
        ss[i] = bench_now() - t0;
    }
    for (long i = 0; i < iters + warm; i++) {
        double t0 = bench_now();

        if (write_all(fd, buf, 4096) < 0 || read_all(fd, buf, 4096) < 0) {
            fprintf(stderr, "gift-bench: raw tcp: the peer went away in the ping-pong\n");
            goto out;
        }
        if (i >= warm)
            rt[i - warm] = bench_now() - t0;
    }
    r->reps += o->stream_reps;
    r->iters += iters;
    memcpy(tmp, r->ss, (size_t)r->reps * sizeof *tmp);
    r->stream_gbps = (double)bytes / bench_median(tmp, (size_t)r->reps) / 1e9;
    memcpy(tmp, r->rt, (size_t)r->iters * sizeof *tmp);
    r->rtt_p50_s = bench_percentile(tmp, (size_t)r->iters, 0.5);
    r->rtt_p99_s = bench_percentile(tmp, (size_t)r->iters, 0.99);
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    if (lfd >= 0)
        close(lfd);
    if (pid > 0) {
        if (rc < 0)
            kill(pid, SIGKILL);
        if (waitpid(pid, &st, 0) == pid)
            child_forget(pid);
        if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            fprintf(stderr, "gift-bench: raw tcp: the peer failed\n");
            rc = -1;
        }
    }
    free(tmp);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Shards                                                              */

/* Starts shard id of n with world size w; on success writes "127.0.0.1:P"
 * into addr and keeps the child's stdout in *outfd (closing it would make a
 * later write of giftd's kill it). Returns 0 or -1 (message printed). */
static int shard_start(const char *bin, int id, int n, int w, char *addr, size_t cap, int *outfd)
{
    char sid[16], sn[16], sw[16], line[256];
    int p[2];
    size_t len = 0;
    pid_t pid;
    double t0;

    snprintf(sid, sizeof sid, "%d", id);
    snprintf(sn, sizeof sn, "%d", n);
    snprintf(sw, sizeof sw, "%d", w);
    if (pipe(p) < 0) {
        perror("gift-bench: pipe");
        return -1;
    }
    fflush(NULL);
    if ((pid = fork()) < 0) {
        perror("gift-bench: fork");
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        child_reset();
        close(p[0]);
        if (dup2(p[1], STDOUT_FILENO) < 0)
            _exit(127);
        close(p[1]);
        execlp(bin, bin, "--port", "0", "--http-port", "0", "--shard-id", sid, "--num-shards", sn,
               "--world-size", sw, "--log-level", "warn", (char *)NULL);
        fprintf(stderr, "gift-bench: cannot run %s: %s (see --giftd)\n", bin, strerror(errno));
        _exit(127);
    }
    child_add(pid);
    if (cl_nshard_pids < CL_MAX_SHARDS)
        cl_shard_pids[cl_nshard_pids++] = pid;
    close(p[1]);
    t0 = bench_now();
    /* Read up to the first newline, at most CL_READY_TIMEOUT_S. */
    while (len + 1 < sizeof line) {
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        double left = CL_READY_TIMEOUT_S - (bench_now() - t0);
        ssize_t k;

        if (left <= 0 || poll(&pf, 1, (int)(left * 1000) + 1) == 0) {
            fprintf(stderr, "gift-bench: shard %d: no ready line within %.0f s\n", id,
                    CL_READY_TIMEOUT_S);
            goto fail;
        }
        k = read(p[0], line + len, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            fprintf(stderr, "gift-bench: shard %d (%s) exited before it was ready\n", id, bin);
            goto fail;
        }
        len++;
        if (line[len - 1] == '\n')
            break;
    }
    line[len] = '\0';
    {
        int port = 0, http = 0;

        if (sscanf(line, "giftd ready port=%d http_port=%d", &port, &http) < 1 || port <= 0) {
            fprintf(stderr, "gift-bench: shard %d: unexpected first line '%s'\n", id, line);
            goto fail;
        }
        snprintf(addr, cap, "127.0.0.1:%d", port);
        if (cl_nshard_pids > 0 && cl_shard_pids[cl_nshard_pids - 1] == pid)
            cl_shard_http[cl_nshard_pids - 1] = http > 0 ? http : 0;
    }
    *outfd = p[0];
    return 0;
fail:
    close(p[0]);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Workers                                                             */

typedef struct cl_worker_ctx {
    const cl_opts_t *o;
    const cl_tensor_t *list;
    int nt;
    cl_row_t *rows;
    int nrows;
    const char *servers;
    int rank;
    int fd; /* write end of the pipe to the parent */
    cl_shared_t *sh;
    const gift_tensor_desc_t *d; /* the declared list */
    const float *X;              /* CL_SKETCH_ROWS x (largest cols) random inputs */
} cl_worker_ctx_t;

static void send_error(int fd, int row, int status, const char *what)
{
    cl_msg_t m;

    memset(&m, 0, sizeof m);
    m.kind = CL_MSG_ERROR;
    m.row = row;
    m.status = status;
    snprintf(m.err, sizeof m.err, "%s: %s", what, gift_strerror(status));
    write_all(fd, &m, sizeof m);
}

/* CPU time (user + system, all threads) of this process, in seconds. */
static double self_cpu_s(void)
{
    struct rusage ru;

    if (getrusage(RUSAGE_SELF, &ru) < 0)
        return NAN;
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* CPU time of the shards we started (utime + stime of /proc/PID/stat,
 * fields 14 and 15), in seconds; NAN when there are none (--servers) or one
 * cannot be read. Clock-tick resolution (10 ms): used over whole rows. */
static double shards_cpu_s(void)
{
    double sum = 0, tick = (double)sysconf(_SC_CLK_TCK);

    if (cl_nshard_pids == 0 || tick <= 0)
        return NAN;
    for (int i = 0; i < cl_nshard_pids; i++) {
        char path[64], buf[1024], *q;
        unsigned long long ut = 0, st = 0;
        FILE *f;
        size_t n;

        snprintf(path, sizeof path, "/proc/%d/stat", (int)cl_shard_pids[i]);
        if ((f = fopen(path, "r")) == NULL)
            return NAN;
        n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* The command name may hold spaces: fields count from its ')'. */
        if ((q = strrchr(buf, ')')) == NULL ||
            sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
            return NAN;
        sum += (double)(ut + st) / tick;
    }
    return sum;
}

/* The per-byte counters of the shards we started, summed over them, from
 * each one's /metrics. */
typedef struct cl_smet {
    double cpu_s;   /* process_cpu_seconds_total */
    double payload; /* giftd_payload_bytes_total, in + out, every codec */
    double pass[CL_SPASS_KINDS];
} cl_smet_t;

#define CL_METRICS_MAX (4u << 20) /* a /metrics answer larger than this is refused */
#define CL_METRICS_TIMEOUT_MS 2000

/* A plain blocking HTTP/1.0 GET /metrics to 127.0.0.1:port, read to EOF (at
 * most CL_METRICS_MAX bytes, CL_METRICS_TIMEOUT_MS per connect, send and
 * read). Adds the lines it knows to *m. Returns 0 or -1 (message printed). */
static int metrics_scrape(int port, cl_smet_t *m)
{
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    struct sockaddr_in a;
    struct timeval tv = {.tv_sec = CL_METRICS_TIMEOUT_MS / 1000,
                         .tv_usec = (CL_METRICS_TIMEOUT_MS % 1000) * 1000};
    size_t len = 0;
    char *buf = NULL, *body, *line, *save = NULL;
    int fd = -1, rc = -1, code = 0, seen = 0;
    double t0 = bench_now();

    if ((buf = malloc(CL_METRICS_MAX + 1)) == NULL || (fd = socket(AF_INET, SOCK_STREAM, 0)) < 0) {
        fprintf(stderr, "gift-bench: /metrics: no memory or socket\n");
        goto out;
    }
    /* On Linux SO_SNDTIMEO bounds connect too. */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        write_all(fd, req, sizeof req - 1) < 0) {
        fprintf(stderr, "gift-bench: /metrics on 127.0.0.1:%d: %s\n", port, strerror(errno));
        goto out;
    }
    for (;;) {
        ssize_t k;

        if (len >= CL_METRICS_MAX) {
            fprintf(stderr, "gift-bench: /metrics on 127.0.0.1:%d: over %u bytes\n", port,
                    CL_METRICS_MAX);
            goto out;
        }
        if (bench_now() - t0 > 3.0 * CL_METRICS_TIMEOUT_MS / 1000.0) {
            fprintf(stderr, "gift-bench: /metrics on 127.0.0.1:%d: too slow\n", port);
            goto out;
        }
        k = read(fd, buf + len, CL_METRICS_MAX - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            fprintf(stderr, "gift-bench: /metrics on 127.0.0.1:%d: %s\n", port, strerror(errno));
            goto out;
        }
        if (k == 0)
            break;
        len += (size_t)k;
    }
    buf[len] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1 || code != 200 ||
        (body = strstr(buf, "\r\n\r\n")) == NULL) {
        fprintf(stderr, "gift-bench: /metrics on 127.0.0.1:%d: status %d\n", port, code);
        goto out;
    }
    for (line = strtok_r(body + 4, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char kind[32];
        double v;

        if (line[0] == '#')
            continue;
        if (sscanf(line, "process_cpu_seconds_total %lf", &v) == 1) {
            m->cpu_s += v;
            seen |= 1;
        } else if (strncmp(line, "giftd_payload_bytes_total{", 26) == 0) {
            char *sp = strrchr(line, ' ');

            if (sp != NULL && sscanf(sp, " %lf", &v) == 1) {
                m->payload += v;
                seen |= 2;
            }
        } else if (sscanf(line, "giftd_pass_bytes_total{pass=\"%31[a-z_]\"} %lf", kind, &v) == 2) {
            for (int k = 0; k < CL_SPASS_KINDS; k++)
                if (strcmp(kind, cl_spass_names[k]) == 0)
                    m->pass[k] += v;
            seen |= 4;
        }
    }
    if (seen != 7) {
        fprintf(stderr,
                "gift-bench: /metrics on 127.0.0.1:%d lacks %s%s%s (a giftd older than the "
                "per-byte counters?)\n",
                port, seen & 1 ? "" : "process_cpu_seconds_total ",
                seen & 2 ? "" : "giftd_payload_bytes_total ",
                seen & 4 ? "" : "giftd_pass_bytes_total");
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

/* Every started shard's /metrics, summed into *m. Returns 0, or -1 when
 * there are none (--servers) or one fails. */
static int shards_metrics(cl_smet_t *m)
{
    memset(m, 0, sizeof *m);
    if (cl_nshard_pids == 0)
        return -1;
    for (int i = 0; i < cl_nshard_pids; i++) {
        if (cl_shard_http[i] <= 0) {
            fprintf(stderr,
                    "gift-bench: shard %d gave no http_port in its ready line: no "
                    "shard per-byte costs\n",
                    i);
            return -1;
        }
        if (metrics_scrape(cl_shard_http[i], m) < 0)
            return -1;
    }
    return 0;
}

/* One row on one worker: warm-up, then measured steps until --steps or the
 * shared limit. Returns 0 or a negative code (reported). */
static int run_row(cl_worker_ctx_t *x, gift_client_t *c, int r, float **grad, float **out,
                   gift_op_t **ops, uint64_t step0, cl_msg_t *m)
{
    const cl_opts_t *o = x->o;
    long total = o->warmup + o->steps;
    gift_client_stats_t s0, s1;
    gift_client_counters_t k0, k1;
    cl_smet_t sm0, sm1;
    int have_k0 = 0, have_sm0 = 0;
    uint32_t base = (uint32_t)(r * x->nt);
    double t_meas = 0, t_row = bench_now(), cpu0 = 0, shard0 = NAN;
    int rc = 0;

    memset(m, 0, sizeof *m);
    memset(&s0, 0, sizeof s0);
    m->kind = CL_MSG_ROW;
    m->row = r;
    gift_client_stats(c, &s1);
    m->switches = s1.epochs_switched;
    /* Gift rows: one sketch of random inputs per geometry tensor at the first
     * step, so that a real epoch follows the identity-like epoch 0 when the
     * client and shards get there within the row. */
    for (int i = 0; x->X != NULL && i < x->nt && step0 % CL_REFRESH == 0; i++) {
        if (!x->d[base + (uint32_t)i].geometry)
            continue;
        if ((rc = gift_sketch_inputs(c, base + (uint32_t)i, step0, x->X, CL_SKETCH_ROWS)) < 0) {
            send_error(x->fd, r, rc, "gift_sketch_inputs");
            return rc;
        }
        m->sketched++;
    }
    for (long s = 0; s < total; s++) {
        double t0;
        int started = 0;

        /* Rank 0 lowers the limit when a row runs over its time; nobody can
         * be past step s + 1 then (sync mode), so s + 2 is safe for all. */
        if (s >= atomic_load(&x->sh->limit[r]))
            break;
        if (s == o->warmup) {
            /* The shards' /metrics first: its HTTP round trips stay out of
             * this worker's CPU time and the measured wall time. */
            if (x->rank == 0)
                have_sm0 = shards_metrics(&sm0) == 0;
            gift_client_stats(c, &s0);
            memset(&k0, 0, sizeof k0);
            k0.size = sizeof k0;
            have_k0 = gift_client_counters(c, &k0) == 0;
            t_meas = bench_now();
            cpu0 = self_cpu_s();
            if (x->rank == 0)
                shard0 = shards_cpu_s();
        }
        t0 = bench_now();
        for (int i = x->nt - 1; i >= 0; i--) { /* backward order: last layer first */
            if ((rc = gift_push_pull(c, base + (uint32_t)i, step0 + (uint64_t)s, grad[i], out[i],
                                     NULL, NULL, &ops[i])) < 0) {
                send_error(x->fd, r, rc, "gift_push_pull");
                break;
            }
            started++;
        }
        for (int i = x->nt - 1; i >= x->nt - started; i--) {
            int st = gift_op_wait(ops[i]);

            gift_op_free(ops[i]);
            if (st < 0 && rc == 0) {
                rc = st;
                send_error(x->fd, r, st, "push+pull");
            }
        }
        if (rc < 0)
            return rc;
        if (s >= o->warmup)
            m->step_s[m->nsteps++] = bench_now() - t0;
        if (x->rank == 0 && s >= o->warmup + 2 && o->row_seconds > 0 &&
            bench_now() - t_row > o->row_seconds && atomic_load(&x->sh->limit[r]) > s + 2)
            atomic_store(&x->sh->limit[r], s + 2);
    }
    gift_client_stats(c, &s1);
    m->switches = s1.epochs_switched - m->switches;
    m->measured_s = bench_now() - t_meas;
    m->cpu_s = self_cpu_s() - cpu0;
    m->shard_cpu_s = x->rank == 0 ? shards_cpu_s() - shard0 : NAN;
    memset(&k1, 0, sizeof k1);
    k1.size = sizeof k1;
    if (have_k0 && gift_client_counters(c, &k1) == 0) {
        m->have_counters = 1;
        m->io_cpu_ns = (k1.io_cpu_ns + k1.codec_cpu_ns) - (k0.io_cpu_ns + k0.codec_cpu_ns);
        m->payload_bytes = (k1.payload_out - k0.payload_out) + (k1.payload_in - k0.payload_in);
        for (int k = 0; k < GIFT_PASS_KINDS; k++)
            m->pass_bytes[k] = k1.pass_bytes[k] - k0.pass_bytes[k];
    }
    if (x->rank == 0 && have_sm0 && shards_metrics(&sm1) == 0) {
        m->have_shard_metrics = 1;
        m->smet_cpu_s = sm1.cpu_s - sm0.cpu_s;
        m->smet_payload = sm1.payload - sm0.payload;
        for (int k = 0; k < CL_SPASS_KINDS; k++)
            m->smet_pass[k] = sm1.pass[k] - sm0.pass[k];
    }
    m->wire_bytes = (s1.bytes_out - s0.bytes_out) + (s1.bytes_in - s0.bytes_in);
    return 0;
}

/* The 4 KiB probe: push+pull of the 1 x 1024 f32 tensor, one at a time. */
static int run_probe(cl_worker_ctx_t *x, gift_client_t *c, uint32_t id, uint64_t step0, cl_msg_t *m)
{
    long warm = 100, n = x->o->rtt_iters;
    float g[CL_PROBE_COLS], out[CL_PROBE_COLS];
    double *t = calloc((size_t)n, sizeof *t);
    int rc = 0;

    memset(m, 0, sizeof *m);
    m->kind = CL_MSG_PROBE;
    if (t == NULL)
        return GIFT_ENOMEM;
    for (int i = 0; i < CL_PROBE_COLS; i++)
        g[i] = (float)(i % 7) * 0.125f;
    for (long s = 0; s < warm + n; s++) {
        gift_op_t *op;
        double t0 = bench_now();

        if ((rc = gift_push_pull(c, id, step0 + (uint64_t)s, g, out, NULL, NULL, &op)) < 0) {
            send_error(x->fd, -1, rc, "probe gift_push_pull");
            goto out;
        }
        rc = gift_op_wait(op);
        gift_op_free(op);
        if (rc < 0) {
            send_error(x->fd, -1, rc, "probe push+pull");
            goto out;
        }
        if (s >= warm)
            t[s - warm] = bench_now() - t0;
    }
    m->probe_n = n;
    m->p50_s = bench_percentile(t, (size_t)n, 0.5);
out:
    free(t);
    return rc;
}

/* A worker process: opens the client, declares every row's copy of the
 * list plus the probe, runs the rows, then the probe. Never returns. */
static void worker_main(cl_worker_ctx_t *x)
{
    const cl_opts_t *o = x->o;
    gift_client_opts_t co = GIFT_CLIENT_OPTS_INIT;
    gift_client_t *c = NULL;
    gift_tensor_desc_t *d = NULL;
    char(*names)[80] = NULL;
    float **grad = NULL, **out = NULL;
    gift_op_t **ops = NULL;
    size_t nd = (size_t)x->nrows * (size_t)x->nt + 1;
    char name[32];
    cl_msg_t *m = calloc(1, sizeof *m);
    int rc;
    bench_rng_t rng;

    snprintf(name, sizeof name, "gift-bench-w%d", x->rank);
    co.servers = x->servers;
    co.rank = x->rank;
    co.world_size = (int)o->workers;
    co.codec_threads = (int)o->codec_threads;
    co.chunk_bytes = (uint64_t)o->chunk_mib << 20;
    co.seed = o->seed;
    co.name = name;
    d = calloc(nd, sizeof *d);
    names = calloc(nd, sizeof *names);
    grad = calloc((size_t)x->nt, sizeof *grad);
    out = calloc((size_t)x->nt, sizeof *out);
    ops = calloc((size_t)x->nt, sizeof *ops);
    if (m == NULL || d == NULL || names == NULL || grad == NULL || out == NULL || ops == NULL) {
        send_error(x->fd, -1, GIFT_ENOMEM, "worker setup");
        _exit(1);
    }
    /* Gradient-like data: normal, a different stream per rank. */
    bench_rng_seed(&rng, o->seed, (uint64_t)x->rank + 1);
    for (int i = 0; i < x->nt; i++) {
        size_t n = (size_t)x->list[i].rows * x->list[i].cols;

        grad[i] = bench_alloc(n * sizeof(float));
        out[i] = o->inplace ? grad[i] : bench_alloc(n * sizeof(float));
        if (grad[i] == NULL || out[i] == NULL) {
            send_error(x->fd, -1, GIFT_ENOMEM, "worker buffers");
            _exit(1);
        }
        for (size_t e = 0; e < n; e++)
            grad[i][e] = (float)(1e-3 * bench_rng_normal(&rng));
    }
    for (int r = 0; r < x->nrows; r++) {
        for (int i = 0; i < x->nt; i++) {
            gift_tensor_desc_t t = GIFT_TENSOR_INIT;
            size_t k = (size_t)r * (size_t)x->nt + (size_t)i;

            snprintf(names[k], sizeof names[k], "%s.%s.%s", x->rows[r].codec->name,
                     x->rows[r].gift ? "gift" : "euclidean", x->list[i].name);
            t.name = names[k];
            t.rows = x->list[i].rows;
            t.cols = x->list[i].cols;
            t.push_codec = t.pull_codec = x->rows[r].codec->codec;
            /* The client fuses small tensors of one class (codec, priority, ...)
             * across the whole list, and a fused bucket goes out only when all
             * its members are pushed. Rows run one at a time, so each row gets a
             * priority of its own and fuses only within itself. */
            t.priority = r + 1;
            t.pull_error_feedback = o->pull_ef;
            t.error_feedback = o->ef;
            if (x->rows[r].gift && t.rows > 1 && t.cols > (uint32_t)o->k) {
                t.geometry = 1;
                t.rank = (uint32_t)o->k;
                t.refresh = CL_REFRESH;
            }
            d[k] = t;
        }
    }
    {
        gift_tensor_desc_t t = GIFT_TENSOR_INIT;

        snprintf(names[nd - 1], sizeof names[nd - 1], "probe.f32.1x%d", CL_PROBE_COLS);
        t.name = names[nd - 1];
        t.rows = 1;
        t.cols = CL_PROBE_COLS;
        t.push_codec = t.pull_codec = GIFT_CODEC_F32;
        t.priority = x->nrows + 1; /* its own class: never fused with a row */
        d[nd - 1] = t;
    }
    {
        uint32_t maxc = 0;
        float *X;

        for (int i = 0; i < x->nt; i++)
            if (x->list[i].cols > maxc)
                maxc = x->list[i].cols;
        if ((X = bench_alloc((size_t)CL_SKETCH_ROWS * maxc * sizeof(float))) == NULL) {
            send_error(x->fd, -1, GIFT_ENOMEM, "worker buffers");
            _exit(1);
        }
        for (size_t e = 0; e < (size_t)CL_SKETCH_ROWS * maxc; e++)
            X[e] = (float)bench_rng_normal(&rng);
        x->X = X;
        x->d = d;
    }
    if ((rc = gift_client_open(&co, &c)) < 0) {
        send_error(x->fd, -1, rc, "gift_client_open");
        _exit(1);
    }
    if ((rc = gift_declare(c, d, nd)) < 0) {
        send_error(x->fd, -1, rc, "gift_declare");
        gift_client_close(c);
        _exit(1);
    }
    for (int r = 0; r < x->nrows; r++) {
        if (run_row(x, c, r, grad, out, ops, o->step0, m) < 0) {
            gift_client_close(c);
            _exit(1);
        }
        if (write_all(x->fd, m, sizeof *m) < 0)
            _exit(1);
    }
    if (run_probe(x, c, (uint32_t)(nd - 1), o->step0, m) < 0) {
        gift_client_close(c);
        _exit(1);
    }
    write_all(x->fd, m, sizeof *m);
    gift_client_close(c);
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* The run                                                             */

typedef struct cl_result {
    cl_raw_t raw;
    int have_raw;
    double probe_p50[CL_MAX_WORKERS];
    double probe_p50_s; /* median over workers */
    int have_probe;
    char servers[CL_MAX_SHARDS * 24];
} cl_result_t;

/* Starts the workers and collects their messages into rows/res. Returns 0
 * or -1 (every worker is killed on error). */
static int run_workers(const cl_opts_t *o, const cl_tensor_t *list, int nt, cl_row_t *rows,
                       int nrows, cl_result_t *res)
{
    int fds[CL_MAX_WORKERS], done[CL_MAX_WORKERS], rc = -1, alive;
    pid_t pids[CL_MAX_WORKERS];
    size_t have[CL_MAX_WORKERS];
    int nmsg[CL_MAX_WORKERS];
    cl_msg_t *msg = calloc((size_t)o->workers, sizeof *msg);
    cl_shared_t *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double probe[CL_MAX_WORKERS];
    int nprobe = 0;

    for (long w = 0; w < o->workers; w++) {
        fds[w] = -1;
        pids[w] = -1;
        done[w] = 0;
        have[w] = 0;
        nmsg[w] = 0;
    }
    if (msg == NULL || sh == MAP_FAILED) {
        fprintf(stderr, "gift-bench: out of memory\n");
        goto out;
    }
    for (int r = 0; r < CL_MAX_ROWS; r++)
        atomic_init(&sh->limit[r], LONG_MAX);
    for (int r = 0; r < nrows; r++) {
        rows[r].nall = 0;
        rows[r].nsteps = -1;
        rows[r].shard_ns_per_payload_byte = rows[r].shard_passes = NAN;
        for (int k = 0; k < CL_SPASS_KINDS; k++)
            rows[r].shard_passes_by_kind[k] = NAN;
        if ((rows[r].steps_all = calloc((size_t)o->workers * CL_MAX_STEPS, sizeof(double))) ==
            NULL) {
            fprintf(stderr, "gift-bench: out of memory\n");
            goto out;
        }
    }
    for (long w = 0; w < o->workers; w++) {
        int p[2];

        if (pipe(p) < 0) {
            perror("gift-bench: pipe");
            goto out;
        }
        fflush(NULL);
        if ((pids[w] = fork()) < 0) {
            perror("gift-bench: fork");
            close(p[0]);
            close(p[1]);
            goto out;
        }
        if (pids[w] == 0) {
            cl_worker_ctx_t x = {.o = o,
                                 .list = list,
                                 .nt = nt,
                                 .rows = rows,
                                 .nrows = nrows,
                                 .servers = res->servers,
                                 .rank = (int)w,
                                 .fd = p[1],
                                 .sh = sh};

            child_reset();
            close(p[0]);
            for (long v = 0; v < w; v++)
                close(fds[v]);
            worker_main(&x);
        }
        child_add(pids[w]);
        close(p[1]);
        fds[w] = p[0];
    }
    alive = (int)o->workers;
    while (alive > 0) {
        struct pollfd pf[CL_MAX_WORKERS];
        int np = 0, map[CL_MAX_WORKERS];

        for (long w = 0; w < o->workers; w++) {
            if (done[w])
                continue;
            pf[np].fd = fds[w];
            pf[np].events = POLLIN;
            map[np++] = (int)w;
        }
        if (poll(pf, (nfds_t)np, -1) < 0) {
            if (errno == EINTR)
                continue;
            perror("gift-bench: poll");
            goto out;
        }
        for (int i = 0; i < np; i++) {
            int w = map[i];
            ssize_t k;

            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            k = read(fds[w], (char *)&msg[w] + have[w], sizeof(cl_msg_t) - have[w]);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                done[w] = 1;
                alive--;
                if (have[w] != 0 || nmsg[w] != nrows + 1) {
                    /* The others would wait for its pushes until they time out. */
                    fprintf(stderr, "gift-bench: worker %d exited after %d of %d reports\n", w,
                            nmsg[w], nrows + 1);
                    goto out;
                }
                continue;
            }
            have[w] += (size_t)k;
            if (have[w] < sizeof(cl_msg_t))
                continue;
            have[w] = 0;
            nmsg[w]++;
            if (msg[w].kind == CL_MSG_ERROR) {
                if (msg[w].row >= 0 && msg[w].row < nrows)
                    fprintf(stderr, "gift-bench: worker %d, row %s %s: %s\n", w,
                            rows[msg[w].row].codec->name,
                            rows[msg[w].row].gift ? "gift" : "euclidean", msg[w].err);
                else
                    fprintf(stderr, "gift-bench: worker %d: %s\n", w, msg[w].err);
                if (o->servers != NULL)
                    fprintf(stderr, "gift-bench: (with --servers: the shards keep each tensor's "
                                    "step; a second run needs a fresh cluster)\n");
                goto out;
            } else if (msg[w].kind == CL_MSG_ROW && msg[w].row >= 0 && msg[w].row < nrows) {
                cl_row_t *r = &rows[msg[w].row];
                double med, tmp[CL_MAX_STEPS];
                int n = msg[w].nsteps;

                if (n <= 0 || n > CL_MAX_STEPS)
                    continue;
                memcpy(tmp, msg[w].step_s, (size_t)n * sizeof(double));
                memcpy(r->steps_all + r->nall, msg[w].step_s, (size_t)n * sizeof(double));
                r->nall += n;
                med = bench_median(tmp, (size_t)n);
                r->goodput[w] = list_fp32_bytes(list, nt) / med / 1e9;
                r->wire[w] = msg[w].measured_s > 0
                                 ? (double)msg[w].wire_bytes / msg[w].measured_s / 1e9
                                 : NAN;
                r->nsteps = n;
                r->cpu_w[w] = msg[w].cpu_s / n;
                r->measured_s[w] = msg[w].measured_s;
                if (msg[w].have_counters) {
                    r->w_have++;
                    r->w_io_ns += (double)msg[w].io_cpu_ns;
                    r->w_payload += (double)msg[w].payload_bytes;
                    r->w_fp32 += list_fp32_bytes(list, nt) * n;
                    for (int k = 0; k < GIFT_PASS_KINDS; k++)
                        r->w_pass[k] += (double)msg[w].pass_bytes[k];
                }
                if (w == 0 && msg[w].have_shard_metrics) {
                    /* Every worker pushes the whole list each step. */
                    double pushed = (double)o->workers * list_fp32_bytes(list, nt) * n;

                    r->shard_ns_per_payload_byte =
                        msg[w].smet_payload > 0 ? 1e9 * msg[w].smet_cpu_s / msg[w].smet_payload
                                                : NAN;
                    r->shard_passes = 0;
                    for (int k = 0; k < CL_SPASS_KINDS; k++) {
                        r->shard_passes_by_kind[k] = msg[w].smet_pass[k] / pushed;
                        r->shard_passes += r->shard_passes_by_kind[k];
                    }
                }
                if (w == 0) {
                    r->shard_cpu_ms = 1e3 * msg[w].shard_cpu_s / n;
                    r->switches = msg[w].switches;
                    r->sketched = msg[w].sketched;
                }
            } else if (msg[w].kind == CL_MSG_PROBE) {
                res->probe_p50[w] = msg[w].p50_s;
                probe[nprobe++] = msg[w].p50_s;
            }
        }
    }
    for (long w = 0; w < o->workers; w++) {
        int st;

        if (waitpid(pids[w], &st, 0) == pids[w]) {
            child_forget(pids[w]);
            pids[w] = -1;
            if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
                fprintf(stderr, "gift-bench: worker %ld failed (status %d)\n", w, st);
                goto out;
            }
        }
    }
    if (nprobe == o->workers) {
        res->probe_p50_s = bench_median(probe, (size_t)nprobe);
        res->have_probe = 1;
    }
    for (int r = 0; r < nrows; r++) {
        cl_row_t *row = &rows[r];

        row->goodput_mean = row->wire_mean = row->worker_cpu_ms = 0;
        row->goodput_min = INFINITY;
        for (long w = 0; w < o->workers; w++) {
            row->worker_cpu_ms += 1e3 * row->cpu_w[w] / (double)o->workers;
            row->goodput_mean += row->goodput[w] / (double)o->workers;
            row->wire_mean += row->wire[w] / (double)o->workers;
            if (row->goodput[w] < row->goodput_min)
                row->goodput_min = row->goodput[w];
        }
        row->worker_io_ns_per_payload_byte = row->worker_io_ns_per_fp32_byte = NAN;
        row->worker_passes = NAN;
        for (int k = 0; k < GIFT_PASS_KINDS; k++)
            row->worker_passes_by_kind[k] = NAN;
        if (row->w_have == o->workers && row->w_fp32 > 0) {
            row->worker_io_ns_per_payload_byte =
                row->w_payload > 0 ? row->w_io_ns / row->w_payload : NAN;
            row->worker_io_ns_per_fp32_byte = row->w_io_ns / (2.0 * row->w_fp32);
            row->worker_passes = 0;
            for (int k = 0; k < GIFT_PASS_KINDS; k++) {
                row->worker_passes_by_kind[k] = row->w_pass[k] / row->w_fp32;
                row->worker_passes += row->worker_passes_by_kind[k];
            }
        }
        {
            double *tmp = malloc((size_t)(row->nall > 0 ? row->nall : 1) * sizeof(double));

            if (tmp == NULL)
                goto out;
            memcpy(tmp, row->steps_all, (size_t)row->nall * sizeof(double));
            row->p50_ms = 1e3 * bench_percentile(tmp, (size_t)row->nall, 0.5);
            row->p99_ms = 1e3 * bench_percentile(tmp, (size_t)row->nall, 0.99);
            free(tmp);
        }
    }
    rc = 0;
out:
    for (long w = 0; w < o->workers; w++) {
        if (pids[w] > 0) {
            kill(pids[w], SIGKILL);
            waitpid(pids[w], NULL, 0);
            child_forget(pids[w]);
        }
        if (fds[w] >= 0)
            close(fds[w]);
    }
    if (sh != MAP_FAILED && sh != NULL)
        munmap(sh, sizeof *sh);
    free(msg);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Output                                                              */

typedef struct cl_targets {
    double wire_x_raw, fp8_x_f32, probe_x_rtt; /* NaN: not measured */
} cl_targets_t;

static const cl_row_t *find_row(const cl_row_t *rows, int nrows, gift_codec_t c)
{
    for (int r = 0; r < nrows; r++)
        if (!rows[r].gift && rows[r].codec->codec == c && rows[r].nsteps > 0)
            return &rows[r];
    return NULL;
}

static void targets_compute(const cl_row_t *rows, int nrows, const cl_result_t *res,
                            cl_targets_t *t)
{
    const cl_row_t *f32 = find_row(rows, nrows, GIFT_CODEC_F32);
    const cl_row_t *fp8 = find_row(rows, nrows, GIFT_CODEC_FP8_E4M3);

    t->wire_x_raw = f32 && res->have_raw ? f32->wire_mean / res->raw.stream_gbps : NAN;
    t->fp8_x_f32 = f32 && fp8 ? fp8->goodput_mean / f32->goodput_mean : NAN;
    t->probe_x_rtt = res->have_probe && res->have_raw ? res->probe_p50_s / res->raw.rtt_p50_s : NAN;
}

/* 1 when o is the configuration the targets are stated for. */
static int targets_apply(const cl_opts_t *o)
{
    return o->shards == 1 && o->workers == 1 && !o->llama && o->mib == 64 && o->chunk_mib == 4;
}

static const char *verdict(double v, double target, int at_most, int applies)
{
    if (isnan(v))
        return "n/a";
    if (!applies)
        return "shown only (other setup)";
    return (at_most ? v <= target : v >= target) ? "PASS" : "FAIL";
}

static int write_json(const cl_opts_t *o, const cl_tensor_t *list, int nt, const cl_row_t *rows,
                      int nrows, const cl_result_t *res, const cl_targets_t *t, const char *cpu,
                      const char *date, double wall)
{
    FILE *f;
    bench_json_t j;

    if ((f = bench_json_begin(&j, o->json, "cluster", "client_version", gift_version(), date)) ==
        NULL)
        return -1;
    bench_json_str(&j, "cpu", cpu);
    bench_json_int(&j, "cores", bench_cpu_count());
    bench_json_int(&j, "shards", o->shards);
    bench_json_int(&j, "workers", o->workers);
    bench_json_str(&j, "servers", res->servers);
    bench_json_bool(&j, "external_cluster", o->servers != NULL);
    bench_json_str(&j, "list", o->llama ? "llama" : "single");
    bench_json_int(&j, "tensors", nt);
    bench_json_num(&j, "fp32_bytes_per_step", list_fp32_bytes(list, nt));
    bench_json_int(&j, "chunk_bytes", o->chunk_mib << 20);
    bench_json_int(&j, "warmup_steps", o->warmup);
    bench_json_int(&j, "max_steps", o->steps);
    bench_json_num(&j, "row_seconds", o->row_seconds);
    bench_json_int(&j, "gift_rank", o->k);
    bench_json_int(&j, "pull_error_feedback", o->pull_ef);
    bench_json_int(&j, "inplace", o->inplace);
    bench_json_int(&j, "codec_threads", o->codec_threads);
    bench_json_int(&j, "error_feedback", o->ef);
    bench_json_int(&j, "gift_sketch_rows", CL_SKETCH_ROWS);
    bench_json_int(&j, "gift_refresh", CL_REFRESH);
    bench_json_obj(&j, "raw_tcp");
    if (res->have_raw) {
        bench_json_int(&j, "stream_bytes", (long long)res->raw.stream_bytes);
        bench_json_int(&j, "stream_reps", res->raw.reps);
        bench_json_num(&j, "stream_gbps", res->raw.stream_gbps);
        bench_json_int(&j, "rtt_iters", res->raw.iters);
        bench_json_num(&j, "rtt_4k_p50_us", 1e6 * res->raw.rtt_p50_s);
        bench_json_num(&j, "rtt_4k_p99_us", 1e6 * res->raw.rtt_p99_s);
        bench_json_arr(&j, "stream_s");
        for (long i = 0; i < res->raw.reps; i++)
            bench_json_num(&j, NULL, res->raw.ss[i]);
        bench_json_arr_end(&j);
    }
    bench_json_obj_end(&j);
    bench_json_obj(&j, "probe_4k");
    bench_json_num(&j, "push_pull_p50_us", res->have_probe ? 1e6 * res->probe_p50_s : NAN);
    bench_json_arr(&j, "per_worker_p50_us");
    for (long w = 0; res->have_probe && w < o->workers; w++)
        bench_json_num(&j, NULL, 1e6 * res->probe_p50[w]);
    bench_json_arr_end(&j);
    bench_json_obj_end(&j);
    bench_json_obj(&j, "per_byte_costs");
    bench_json_str(&j, "worker_io_ns_per_payload_byte",
                   "CPU ns of the client's I/O thread and codec threads (gift_client_counters "
                   "io_cpu_ns + codec_cpu_ns) per payload byte out + in, all workers pooled");
    bench_json_str(&j, "worker_io_ns_per_fp32_byte",
                   "the same CPU ns per FP32 byte moved: 2 x the list's FP32 bytes per step "
                   "(push and pull)");
    bench_json_str(&j, "worker_passes",
                   "client pass_bytes / the list's FP32 bytes per step, per worker (mean)");
    bench_json_str(&j, "shard_ns_per_payload_byte",
                   "all shards' process_cpu_seconds_total per giftd_payload_bytes_total in + out "
                   "(/metrics, scraped by rank 0 around its measured steps)");
    bench_json_str(&j, "shard_passes",
                   "all shards' giftd_pass_bytes_total / the FP32 bytes pushed to them (W x the "
                   "list per step)");
    if (o->servers != NULL)
        bench_json_str(&j, "shard_figures",
                       "null: --servers (a running cluster), its shards are not scraped");
    else
        bench_json_str(&j, "shard_figures", "measured");
    bench_json_obj_end(&j);
    bench_json_arr(&j, "rows");
    for (int r = 0; r < nrows; r++) {
        const cl_row_t *row = &rows[r];

        bench_json_obj(&j, NULL);
        bench_json_str(&j, "codec", row->codec->name);
        bench_json_str(&j, "transform", row->gift ? "gift" : "euclidean");
        bench_json_int(&j, "steps", row->nsteps);
        bench_json_int(&j, "sketched_tensors", row->sketched);
        bench_json_int(&j, "epoch_switches", row->switches);
        bench_json_num(&j, "goodput_gbps", row->goodput_mean);
        bench_json_num(&j, "goodput_min_gbps", row->goodput_min);
        bench_json_num(&j, "wire_gbps", row->wire_mean);
        bench_json_num(&j, "step_p50_ms", row->p50_ms);
        bench_json_num(&j, "step_p99_ms", row->p99_ms);
        bench_json_num(&j, "worker_cpu_ms_per_step", row->worker_cpu_ms);
        bench_json_num(&j, "shards_cpu_ms_per_step", row->shard_cpu_ms);
        bench_json_num(&j, "worker_io_ns_per_payload_byte", row->worker_io_ns_per_payload_byte);
        bench_json_num(&j, "worker_io_ns_per_fp32_byte", row->worker_io_ns_per_fp32_byte);
        bench_json_num(&j, "worker_passes", row->worker_passes);
        if (isnan(row->worker_passes)) {
            bench_json_null(&j, "worker_passes_by_kind");
        } else {
            bench_json_obj(&j, "worker_passes_by_kind");
            for (int k = 0; k < GIFT_PASS_KINDS; k++)
                bench_json_num(&j, gift_pass_name(k), row->worker_passes_by_kind[k]);
            bench_json_obj_end(&j);
        }
        bench_json_num(&j, "shard_ns_per_payload_byte", row->shard_ns_per_payload_byte);
        bench_json_num(&j, "shard_passes", row->shard_passes);
        if (isnan(row->shard_passes)) {
            bench_json_null(&j, "shard_passes_by_kind");
        } else {
            bench_json_obj(&j, "shard_passes_by_kind");
            for (int k = 0; k < CL_SPASS_KINDS; k++)
                bench_json_num(&j, cl_spass_names[k], row->shard_passes_by_kind[k]);
            bench_json_obj_end(&j);
        }
        bench_json_arr(&j, "goodput_per_worker_gbps");
        for (long w = 0; w < o->workers; w++)
            bench_json_num(&j, NULL, row->goodput[w]);
        bench_json_arr_end(&j);
        bench_json_arr(&j, "wire_per_worker_gbps");
        for (long w = 0; w < o->workers; w++)
            bench_json_num(&j, NULL, row->wire[w]);
        bench_json_arr_end(&j);
        bench_json_arr(&j, "measured_s_per_worker");
        for (long w = 0; w < o->workers; w++)
            bench_json_num(&j, NULL, row->measured_s[w]);
        bench_json_arr_end(&j);
        bench_json_arr(&j, "step_s");
        for (int i = 0; i < row->nall; i++)
            bench_json_num(&j, NULL, row->steps_all[i]);
        bench_json_arr_end(&j);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_obj(&j, "targets");
    bench_json_bool(&j, "targets_apply", targets_apply(o));
    bench_json_num(&j, "f32_wire_x_raw_stream", t->wire_x_raw);
    bench_json_num(&j, "f32_wire_x_raw_stream_target", TARGET_WIRE_X_RAW);
    if (isnan(t->wire_x_raw))
        bench_json_null(&j, "f32_wire_pass");
    else
        bench_json_bool(&j, "f32_wire_pass", t->wire_x_raw >= TARGET_WIRE_X_RAW);
    bench_json_num(&j, "fp8_goodput_x_f32", t->fp8_x_f32);
    bench_json_num(&j, "fp8_goodput_x_f32_target", TARGET_FP8_X_F32);
    if (isnan(t->fp8_x_f32))
        bench_json_null(&j, "fp8_goodput_pass");
    else
        bench_json_bool(&j, "fp8_goodput_pass", t->fp8_x_f32 >= TARGET_FP8_X_F32);
    bench_json_num(&j, "probe_4k_x_raw_rtt", t->probe_x_rtt);
    bench_json_num(&j, "probe_4k_x_raw_rtt_target_max", TARGET_PROBE_X_RTT);
    if (isnan(t->probe_x_rtt))
        bench_json_null(&j, "probe_4k_pass");
    else
        bench_json_bool(&j, "probe_4k_pass", t->probe_x_rtt <= TARGET_PROBE_X_RTT);
    bench_json_obj_end(&j);
    bench_json_num(&j, "wall_s", wall);
    bench_json_close(&j);
    if (fclose(f) != 0) {
        perror(o->json);
        return -1;
    }
    return 0;
}

/* "encode 1.00 decode 1.00": the kinds above 0.005 passes, "-" when none,
 * "n/a" when not measured. */
static const char *passes_by_kind(char *buf, size_t cap, const double *v, int n,
                                  const char *(*name)(int))
{
    size_t len = 0;

    buf[0] = '\0';
    if (n > 0 && isnan(v[0]))
        return "n/a";
    for (int k = 0; k < n && len < cap; k++)
        if (v[k] >= 0.005)
            len +=
                (size_t)snprintf(buf + len, cap - len, "%s%s %.2f", len ? " " : "", name(k), v[k]);
    return len ? buf : "-";
}

static const char *spass_name(int k)
{
    return k >= 0 && k < CL_SPASS_KINDS ? cl_spass_names[k] : "?";
}

static const char *cpass_name(int k)
{
    const char *s = gift_pass_name(k);

    return s ? s : "?";
}

/* "%.2f" of v, or "n/a" for NaN. */
static const char *fmt2(char *buf, size_t cap, double v)
{
    if (isnan(v))
        return "n/a";
    snprintf(buf, cap, "%.2f", v);
    return buf;
}

static void print_costs(const cl_opts_t *o, const cl_row_t *rows, int nrows)
{
    printf("\n### Per-byte costs\n\n");
    printf("- worker: the client's I/O thread (gift_client_counters): CPU ns per payload byte "
           "(out + in) and per FP32 byte moved (2 x the list per step); passes = pass bytes / "
           "the list's FP32 bytes per step, per worker\n");
    if (o->servers != NULL)
        printf("- shard: n/a with --servers (the running cluster's shards are not scraped)\n");
    else
        printf("- shard: all shards' /metrics, scraped by rank 0 around its measured steps: "
               "process CPU ns per payload byte (in + out); passes = pass bytes / the FP32 bytes "
               "pushed to them (%ld x the list per step)\n",
               o->workers);
    printf("\n| codec | transform | worker I/O ns/payload B | worker I/O ns/FP32 B | worker "
           "passes | worker by kind | shard ns/payload B | shard passes | shard by kind |\n");
    printf("|---|---|---:|---:|---:|---|---:|---:|---|\n");
    for (int r = 0; r < nrows; r++) {
        const cl_row_t *row = &rows[r];
        char a[32], b[32], c[32], d[32], e[32], wk[256], sk[256];

        printf(
            "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", row->codec->name,
            row->gift ? "gift" : "euclidean", fmt2(a, sizeof a, row->worker_io_ns_per_payload_byte),
            fmt2(b, sizeof b, row->worker_io_ns_per_fp32_byte),
            fmt2(c, sizeof c, row->worker_passes),
            passes_by_kind(wk, sizeof wk, row->worker_passes_by_kind, GIFT_PASS_KINDS, cpass_name),
            fmt2(d, sizeof d, row->shard_ns_per_payload_byte), fmt2(e, sizeof e, row->shard_passes),
            passes_by_kind(sk, sizeof sk, row->shard_passes_by_kind, CL_SPASS_KINDS, spass_name));
    }
}

static void print_report(const cl_opts_t *o, const cl_tensor_t *list, int nt, const cl_row_t *rows,
                         int nrows, const cl_result_t *res, const cl_targets_t *t, const char *cpu,
                         const char *date)
{
    int small = 0;

    for (int i = 0; i < nt; i++)
        small += list[i].rows == 1;
    printf("## gift-bench cluster\n\n");
    printf("- date %s; CPU %s; %ld cores online; giftclient %s\n", date, cpu, bench_cpu_count(),
           gift_version());
    printf("- %s: %ld shard%s (%s), %ld worker%s, all on loopback\n",
           o->servers ? "running cluster" : "started here", o->shards, o->shards == 1 ? "" : "s",
           res->servers, o->workers, o->workers == 1 ? "" : "s");
    printf("- list %s: %d tensor%s (%d 1-D), %.1f MiB of fp32 per step; chunks of %ld MiB; "
           "%ld warm-up step%s, then up to %ld measured (a row stops after %.0f s)\n",
           o->llama ? "llama" : "single", nt, nt == 1 ? "" : "s", small,
           list_fp32_bytes(list, nt) / 1048576.0, o->chunk_mib, o->warmup,
           o->warmup == 1 ? "" : "s", o->steps, o->row_seconds);
    printf("- goodput = fp32 bytes of the list / median step time, per worker (mean over "
           "workers); wire = client bytes_out + bytes_in / time; 1 GB = 1e9 B\n");
    printf("- CPU ms/step: user + system time over the measured steps, all threads: each "
           "worker's own (mean over workers) and all shards' together (n/a with --servers)\n");
    printf("- gift rows: 2-D tensors with geometry, rank %ld; each sends one sketch of random "
           "inputs at its first step; until the new epoch is in force the geometry is epoch 0 "
           "(see 'epoch switches' below the table)\n\n",
           o->k);
    if (o->ef)
        printf("- --ef: the rows' tensors have push error feedback (the worker keeps each "
               "push's residual)\n\n");
    if (o->pull_ef)
        printf("- --pull-ef: the rows' tensors have pull error feedback (the shards keep "
               "each step's residual of the encoded mean)\n\n");
    if (o->inplace)
        printf("- --inplace: each step pulls into the pushed buffer (out = grad)\n\n");
    printf("| codec | transform | steps | goodput GB/s | wire GB/s | step p50 ms | step p99 ms "
           "| worker CPU ms/step | shards CPU ms/step |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int r = 0; r < nrows; r++) {
        const cl_row_t *row = &rows[r];

        printf("| %s | %s | %d | %.2f | %.2f | %.1f | %.1f | %.1f | %.1f |\n", row->codec->name,
               row->gift ? "gift" : "euclidean", row->nsteps, row->goodput_mean, row->wire_mean,
               row->p50_ms, row->p99_ms, row->worker_cpu_ms, row->shard_cpu_ms);
    }
    for (int r = 0; r < nrows; r++)
        if (rows[r].gift)
            printf("%s%s %u/%d",
                   r == 0 || !rows[r - 1].gift ? "\nepoch switches on rank 0 / "
                                                 "tensors sketched, per gift row: "
                                               : ", ",
                   rows[r].codec->name, rows[r].switches, rows[r].sketched);
    printf("\n");
    print_costs(o, rows, nrows);
    printf("\nbaseline (raw TCP, two processes on 127.0.0.1):");
    if (res->have_raw)
        printf(" streaming %.2f GB/s (median of %ld x %zu MiB, half before the rows, half "
               "after); 4 KiB round trip p50 %.1f us, p99 %.1f us (%ld round trips)\n",
               res->raw.stream_gbps, res->raw.reps, res->raw.stream_bytes >> 20,
               1e6 * res->raw.rtt_p50_s, 1e6 * res->raw.rtt_p99_s, res->raw.iters);
    else
        printf(" not measured\n");
    if (res->have_probe)
        printf("giftd 4 KiB push+pull (1 x %d f32, one at a time): p50 %.1f us\n", CL_PROBE_COLS,
               1e6 * res->probe_p50_s);
    int applies = targets_apply(o);

    printf("\n| target | measured | needed | pass |\n|---|---:|---:|---|\n");
    printf("| f32 euclidean wire / raw streaming | %.2fx | >= %.1fx | %s |\n", t->wire_x_raw,
           TARGET_WIRE_X_RAW, verdict(t->wire_x_raw, TARGET_WIRE_X_RAW, 0, applies));
    printf("| fp8-e4m3 goodput / f32 goodput (euclidean) | %.2fx | >= %.1fx | %s |\n", t->fp8_x_f32,
           TARGET_FP8_X_F32, verdict(t->fp8_x_f32, TARGET_FP8_X_F32, 0, applies));
    printf("| 4 KiB push+pull p50 / raw round trip p50 | %.2fx | <= %.1fx | %s |\n", t->probe_x_rtt,
           TARGET_PROBE_X_RTT, verdict(t->probe_x_rtt, TARGET_PROBE_X_RTT, 1, applies));
    {
        const cl_row_t *f32 = find_row(rows, nrows, GIFT_CODEC_F32);
        const cl_row_t *fp8 = find_row(rows, nrows, GIFT_CODEC_FP8_E4M3);

        if (f32 != NULL && fp8 != NULL && !isnan(f32->shard_cpu_ms) && !isnan(fp8->shard_cpu_ms)) {
            double a = o->workers * f32->worker_cpu_ms + f32->shard_cpu_ms;
            double b = o->workers * fp8->worker_cpu_ms + fp8->shard_cpu_ms;

            printf("\nCPU per step, every worker and shard together: f32 %.1f ms, fp8-e4m3 %.1f ms "
                   "(f32 / fp8 = %.2fx). Where all processes share %ld cores, the goodput ratio "
                   "follows this CPU ratio once the cores are saturated.\n",
                   a, b, a / b, bench_cpu_count());
        }
    }
    if (!applies)
        printf("\nnote: the targets are stated for 1 shard, 1 worker, one 64 MiB tensor in 4 MiB "
               "chunks; this run differs, so its figures are shown, not judged\n");
}

int bench_cluster_main(int argc, char **argv);

int bench_cluster_main(int argc, char **argv)
{
    cl_opts_t o;
    cl_row_t rows[CL_MAX_ROWS];
    cl_tensor_t *list = NULL;
    cl_result_t *res = calloc(1, sizeof *res);
    cl_targets_t tg;
    int shard_fds[CL_MAX_SHARDS], nrows, nt, rc, status = 1;
    double t_start = bench_now();
    char cpu[256], date[64];

    memset(rows, 0, sizeof rows);
    for (int i = 0; i < CL_MAX_SHARDS; i++)
        shard_fds[i] = -1;
    if (res == NULL)
        return 1;
    if ((rc = parse_opts(argc, argv, &o)) != 0) {
        free(res);
        return rc > 0 ? 0 : 2;
    }
    if ((nrows = build_rows(&o, rows)) < 0) {
        free(res);
        return 2;
    }
    if ((nt = build_list(&o, &list)) < 0) {
        fprintf(stderr, "gift-bench: out of memory\n");
        free(res);
        return 1;
    }
    cleanup_install();
    bench_cpu_model(cpu, sizeof cpu);
    bench_date_utc(date, sizeof date);
    res->raw.ss = calloc(2 * (size_t)o.stream_reps, sizeof(double));
    res->raw.rt = calloc(2 * (size_t)o.rtt_iters, sizeof(double));
    if (res->raw.ss == NULL || res->raw.rt == NULL) {
        fprintf(stderr, "gift-bench: out of memory\n");
        goto out;
    }
    fprintf(stderr, "gift-bench cluster: raw tcp baseline ...\n");
    if (raw_tcp(&o, &res->raw) == 0)
        res->have_raw = 1;
    if (o.servers != NULL) {
        int n = 1;

        snprintf(res->servers, sizeof res->servers, "%s", o.servers);
        for (const char *p = o.servers; *p; p++)
            n += *p == ',';
        o.shards = n;
    } else {
        size_t len = 0;

        fprintf(stderr, "gift-bench cluster: starting %ld shard%s (%s) ...\n", o.shards,
                o.shards == 1 ? "" : "s", o.giftd);
        for (long s = 0; s < o.shards; s++) {
            char addr[32];

            if (shard_start(o.giftd, (int)s, (int)o.shards, (int)o.workers, addr, sizeof addr,
                            &shard_fds[s]) < 0)
                goto out;
            len += (size_t)snprintf(res->servers + len, sizeof res->servers - len, "%s%s",
                                    s ? "," : "", addr);
        }
    }
    fprintf(stderr, "gift-bench cluster: %ld worker%s, %d row%s ...\n", o.workers,
            o.workers == 1 ? "" : "s", nrows, nrows == 1 ? "" : "s");
    if (run_workers(&o, list, nt, rows, nrows, res) < 0)
        goto out;
    /* The baseline again, after the rows: the machines are noisy, so it
     * brackets the measurement like memcpy does in `gift-bench codec`. */
    fprintf(stderr, "gift-bench cluster: raw tcp baseline again ...\n");
    if (res->have_raw && raw_tcp(&o, &res->raw) < 0)
        res->have_raw = 0;
    targets_compute(rows, nrows, res, &tg);
    print_report(&o, list, nt, rows, nrows, res, &tg, cpu, date);
    printf("\nwall time %.1f s; JSON: %s\n", bench_now() - t_start, o.json);
    if (write_json(&o, list, nt, rows, nrows, res, &tg, cpu, date, bench_now() - t_start) < 0)
        goto out;
    status = 0;
out:
    children_kill();
    for (int i = 0; i < CL_MAX_SHARDS; i++)
        if (shard_fds[i] >= 0)
            close(shard_fds[i]);
    for (int r = 0; r < nrows; r++)
        free(rows[r].steps_all);
    free(list);
    free(res->raw.rt);
    free(res->raw.ss);
    free(res);
    return status;
}
