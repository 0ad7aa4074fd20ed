/*
 * train_worker.c: one worker of a small, deterministic "training run" for
 * the fault test (tests/long/fault_test.sh) and the soak benchmark
 * (bench/soak.sh).
 *
 * Every rank starts from the same parameters and, each step, computes for
 * every tensor a synthetic gradient that depends on the parameters, its
 * rank and the step: g = a (W - T_rank) + noise(rank, step). It pushes it,
 * pulls the mean over all ranks and takes an SGD step W -= lr * mean. On a
 * geometry tensor's refresh steps it first submits synthetic layer inputs
 * (gift_sketch_inputs). Nothing is random beyond counters, so two runs with
 * the same shards, ranks and steps end with bit-identical parameters, and
 * every rank ends with the same parameters as the others.
 *
 * Usage: gift-train-worker --steps N --out FILE [--refresh R]
 *        [--progress FILE] [--start S] [--resume FILE] [--save-every K]
 * with GIFT_SERVERS, GIFT_RANK and GIFT_WORLD set. --out gets the final
 * parameters (raw floats, tensor after tensor). --progress gets "step N"
 * lines (the last finished step) and, at the end, per-100-step rates. With
 * --save-every K the parameters after each K-th step are also written to
 * OUT.ckpt (tmp + rename), with the step; --resume FILE starts from such a
 * file (a worker restarted from its own checkpoint). --die-after K makes
 * the worker SIGKILL itself after saving step K and starting step K + 1's
 * pushes (a crash at a known point, for the fault test). --scale F
 * multiplies every tensor's rows by F (the soak benchmark's load).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>

#include <gift/client.h>

enum { NT = 5, INPUTS = 256 };

typedef struct spec {
    const char *name;
    uint32_t rows, cols; /* rows are multiplied by --scale */
    gift_codec_t codec;
    int geometry;
} spec_t;

/* f32 and fp8-e4m3 tensors, geometry on two of them; small ones are fused
 * by the client, larger ones split into chunks over both shards. */
static spec_t SPEC[NT] = {
    {"fp8gift.a", 96, 64, GIFT_CODEC_FP8_E4M3, 1},  {"f32.fused", 40, 80, GIFT_CODEC_F32, 0},
    {"f32.bias", 1, 96, GIFT_CODEC_F32, 0},         {"f32.big", 160, 128, GIFT_CODEC_F32, 0},
    {"fp8gift.b", 192, 96, GIFT_CODEC_FP8_E4M3, 1},
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A counter-based uniform in [-1, 1) (splitmix64 of the key). */
static float unif(uint64_t k)
{
    k += 0x9e3779b97f4a7c15ull;
    k = (k ^ (k >> 30)) * 0xbf58476d1ce4e5b9ull;
    k = (k ^ (k >> 27)) * 0x94d049bb133111ebull;
    k ^= k >> 31;
    return (float)((double)(k >> 11) / 4503599627370496.0 - 1.0);
}

static int save(const char *path, float **w, uint64_t step)
{
    char tmp[4096];
    FILE *f;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if ((f = fopen(tmp, "wb")) == NULL)
        return -1;
    fwrite(&step, sizeof step, 1, f);
    for (int t = 0; t < NT; t++)
        fwrite(w[t], sizeof(float), (size_t)SPEC[t].rows * SPEC[t].cols, f);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path);
}

int main(int argc, char **argv)
{
    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_tensor_desc_t d[NT];
    gift_client_t *c = NULL;
    float *w[NT], *g[NT], *mean[NT], *x = NULL;
    const char *out = NULL, *progress = NULL, *resume = NULL;
    uint64_t steps = 0, start = 0, save_every = 0, die_after = UINT64_MAX;
    uint32_t refresh = 25;
    FILE *pf = NULL;
    double t0, tw = 0;
    int rc = 1, rank;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps"))
            steps = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
        else if (!strcmp(argv[i], "--refresh"))
            refresh = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--progress"))
            progress = argv[i + 1];
        else if (!strcmp(argv[i], "--resume"))
            resume = argv[i + 1];
        else if (!strcmp(argv[i], "--save-every"))
            save_every = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--scale")) {
            uint32_t f = (uint32_t)strtoul(argv[i + 1], NULL, 10);
            for (int t = 0; t < NT && f > 1; t++)
                if (SPEC[t].rows > 1)
                    SPEC[t].rows *= f;
        } else if (!strcmp(argv[i], "--die-after"))
            die_after = strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "train_worker: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (steps == 0 || out == NULL || refresh == 0) {
        fprintf(stderr,
                "usage: %s --steps N --out FILE [--refresh R] [--progress FILE] "
                "[--resume FILE] [--save-every K]\n",
                argv[0]);
        return 2;
    }
    o.chunk_bytes = 16384; /* several chunks per tensor, on both shards */
    o.timeout_ms = 120000;
    o.connect_timeout_ms = 60000;
    o.backoff_max_ms = 200;
    if ((rc = gift_client_open(&o, &c)) < 0) {
        fprintf(stderr, "train_worker: gift_client_open: %s\n", gift_strerror(rc));
        return 1;
    }
    rank = atoi(getenv("GIFT_RANK") ? getenv("GIFT_RANK") : "0");
    for (int t = 0; t < NT; t++) {
        size_t n = (size_t)SPEC[t].rows * SPEC[t].cols;
        gift_tensor_desc_t z = GIFT_TENSOR_INIT;
        d[t] = z;
        d[t].name = SPEC[t].name;
        d[t].rows = SPEC[t].rows;
        d[t].cols = SPEC[t].cols;
        d[t].push_codec = d[t].pull_codec = SPEC[t].codec;
        d[t].geometry = SPEC[t].geometry;
        d[t].refresh = refresh;
        w[t] = malloc(n * sizeof(float));
        g[t] = malloc(n * sizeof(float));
        mean[t] = malloc(n * sizeof(float));
        if (!w[t] || !g[t] || !mean[t])
            return 1;
        for (size_t i = 0; i < n; i++)
            w[t][i] = 0.5f * unif(((uint64_t)t << 48) ^ i);
    }
    if ((x = malloc(sizeof(float) * INPUTS * 256)) == NULL)
        return 1;
    if (resume != NULL) {
        FILE *f = fopen(resume, "rb");
        if (f == NULL || fread(&start, sizeof start, 1, f) != 1) {
            fprintf(stderr, "train_worker: cannot read %s\n", resume);
            return 1;
        }
        for (int t = 0; t < NT; t++)
            if (fread(w[t], sizeof(float), (size_t)SPEC[t].rows * SPEC[t].cols, f) !=
                (size_t)SPEC[t].rows * SPEC[t].cols) {
                fprintf(stderr, "train_worker: %s is short\n", resume);
                return 1;
            }
        fclose(f);
    }
    if ((rc = gift_declare(c, d, NT)) < 0) {
        fprintf(stderr, "train_worker: gift_declare: %s\n", gift_strerror(rc));
        goto out;
    }
    if (progress && (pf = fopen(progress, "a")) == NULL)
        return 1;
    t0 = tw = now_s();
    for (uint64_t step = start; step < steps; step++) {
        gift_op_t *op[NT] = {0};
        for (int t = 0; t < NT; t++) {
            size_t n = (size_t)SPEC[t].rows * SPEC[t].cols;
            uint64_t key = ((uint64_t)t << 56) ^ ((uint64_t)rank << 40) ^ (step << 8);
            for (size_t i = 0; i < n; i++) {
                float target = 0.3f * unif(((uint64_t)rank << 50) ^ ((uint64_t)t << 44) ^ i);
                g[t][i] = 0.5f * (w[t][i] - target) + 0.05f * unif(key ^ (i << 20) ^ i);
            }
            if (SPEC[t].geometry && step % refresh == 0) {
                uint32_t cols = SPEC[t].cols;
                for (uint32_t r = 0; r < INPUTS; r++)
                    for (uint32_t j = 0; j < cols; j++)
                        x[(size_t)r * cols + j] =
                            unif(key ^ 0x5ce7c4ull ^ ((uint64_t)r << 16) ^ j) / (1.0f + 0.2f * j);
                if ((rc = gift_sketch_inputs(c, (uint32_t)t, step, x, INPUTS)) < 0) {
                    fprintf(stderr,
                            "train_worker: rank %d step %" PRIu64 " gift_sketch_inputs(%s): %s\n",
                            rank, step, SPEC[t].name, gift_strerror(rc));
                    goto out;
                }
            }
        }
        /* Backward order: the last tensor's gradient first. */
        for (int t = NT - 1; t >= 0; t--)
            if ((rc = gift_push_pull(c, (uint32_t)t, step, g[t], mean[t], NULL, NULL, &op[t])) <
                0) {
                fprintf(stderr, "train_worker: rank %d step %" PRIu64 " push_pull(%s): %s\n", rank,
                        step, SPEC[t].name, gift_strerror(rc));
                goto out;
            }
        if (die_after != UINT64_MAX && step == die_after + 1) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL); /* let some pushes reach the shards */
            raise(SIGKILL);
        }
        for (int t = NT - 1; t >= 0; t--) {
            int st = gift_op_wait(op[t]);
            gift_op_free(op[t]);
            if (st < 0 && rc == 0) {
                fprintf(stderr, "train_worker: rank %d step %" PRIu64 " %s: %s\n", rank, step,
                        SPEC[t].name, gift_strerror(st));
                rc = st;
            }
        }
        if (rc < 0)
            goto out;
        for (int t = 0; t < NT; t++) {
            size_t n = (size_t)SPEC[t].rows * SPEC[t].cols;
            for (size_t i = 0; i < n; i++)
                w[t][i] -= 0.1f * mean[t][i];
        }
        if (save_every && (step + 1) % save_every == 0) {
            char ck[4096];
            snprintf(ck, sizeof ck, "%s.ckpt", out);
            if (save(ck, w, step + 1) < 0) {
                fprintf(stderr, "train_worker: cannot write %s\n", ck);
                rc = -1;
                goto out;
            }
        }
        if (pf) {
            fprintf(pf, "step %" PRIu64 "\n", step);
            if ((step + 1) % 100 == 0) {
                double t1 = now_s();
                fprintf(pf, "rate %" PRIu64 " %.2f\n", step + 1, 100.0 / (t1 - tw));
                tw = t1;
            }
            fflush(pf);
        }
    }
    {
        gift_client_stats_t st;
        gift_client_stats(c, &st);
        printf("rank %d: %" PRIu64 " steps in %.1f s, %" PRIu64 " reconnects, %" PRIu64
               " replays, %u epoch switches\n",
               rank, steps - start, now_s() - t0, st.reconnects, st.replays, st.epochs_switched);
    }
    if (save(out, w, steps) < 0) {
        fprintf(stderr, "train_worker: cannot write %s\n", out);
        rc = -1;
        goto out;
    }
    rc = 0;
out:
    if (pf)
        fclose(pf);
    gift_client_close(c);
    for (int t = 0; t < NT; t++) {
        free(w[t]);
        free(g[t]);
        free(mean[t]);
    }
    free(x);
    return rc < 0 ? 1 : 0;
}
