/*
 * gift_ops_worker: a small, deterministic training loop through
 * libgiftclient, for the operating tests (tests/ops, tests/tools).
 *
 *   GIFT_SERVERS=h:p,h:p GIFT_RANK=r GIFT_WORLD=w gift_ops_worker [--steps N]
 *       [--sleep-ms M] [--chunk-kib K] [--timeout-ms T]
 *
 * Three tensors (fp8-e4m3, nvfp4 and a small f32 one, so that every shard
 * holds chunks of several codecs) are "trained" towards a fixed target: each
 * step every rank pushes (w - target) plus noise that depends only on
 * (rank, step, index), pulls the mean and applies w -= lr * mean. Nothing
 * depends on timing, so every rank ends with the same parameters, and so
 * does every run with the same world size, whatever happened to the network
 * in between. Prints "pushed STEP" once a step's pushes are acknowledged,
 * "step STEP" after its pull, and at the end one line
 *   result hash=<fnv64 of the parameters> loss=<mean squared distance>
 *          reconnects=<n> replays=<n>
 * Exit 0, or 1 with a message on stderr.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gift/client.h>

#define NT 3

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform in [-1, 1), a function of its arguments only. */
static float noise(uint64_t rank, uint64_t step, uint64_t t, uint64_t i)
{
    uint64_t h = mix64(mix64(mix64(rank * 0x100000001b3ull + step) + t) + i);
    return (float)((double)(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "gift_ops_worker: %s: %s\n", what, gift_strerror(rc));
    return 1;
}

int main(int argc, char **argv)
{
    long steps = 100, sleep_ms = 0, chunk_kib = 128, timeout_ms = 60000;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--steps") == 0)
            steps = atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--sleep-ms") == 0)
            sleep_ms = atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--chunk-kib") == 0)
            chunk_kib = atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--timeout-ms") == 0)
            timeout_ms = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: gift_ops_worker [--steps N] [--sleep-ms M] [--chunk-kib K]"
                            " [--timeout-ms T]\n");
            return 2;
        }
    }

    gift_tensor_desc_t t[NT] = {GIFT_TENSOR_INIT, GIFT_TENSOR_INIT, GIFT_TENSOR_INIT};
    t[0].name = "embed";
    t[0].rows = 512;
    t[0].cols = 256;
    t[0].push_codec = t[0].pull_codec = GIFT_CODEC_FP8_E4M3;
    t[1].name = "mlp.down";
    t[1].rows = 256;
    t[1].cols = 688;
    t[1].push_codec = t[1].pull_codec = GIFT_CODEC_NVFP4;
    t[2].name = "norm";
    t[2].rows = 1;
    t[2].cols = 256;
    t[2].push_codec = t[2].pull_codec = GIFT_CODEC_F32;

    gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT;
    gift_client_t *c = NULL;
    gift_client_stats_t cs;
    float *w[NT], *g[NT], *m[NT], *target[NT];
    size_t n[NT];
    gift_op_t *op[NT];
    int rank, rc;
    const char *rs = getenv("GIFT_RANK") ? getenv("GIFT_RANK") : getenv("RANK");
    const float lr = 0.25f;

    rank = rs ? atoi(rs) : 0;
    o.chunk_bytes = (uint64_t)chunk_kib * 1024;
    o.timeout_ms = (uint32_t)timeout_ms;
    o.name = "gift_ops_worker";
    if ((rc = gift_client_open(&o, &c)) < 0)
        return fail("open", rc);
    if ((rc = gift_declare(c, t, NT)) < 0)
        return fail("declare", rc);
    for (int k = 0; k < NT; k++) {
        n[k] = (size_t)t[k].rows * t[k].cols;
        w[k] = calloc(n[k], sizeof(float));
        g[k] = calloc(n[k], sizeof(float));
        m[k] = calloc(n[k], sizeof(float));
        target[k] = calloc(n[k], sizeof(float));
        if (!w[k] || !g[k] || !m[k] || !target[k])
            return fail("memory", GIFT_ENOMEM);
        for (size_t i = 0; i < n[k]; i++)
            target[k][i] = (float)sin(0.001 * (double)i + k) * (1.0f + (float)(i % 7));
    }

    for (long s = 0; s < steps; s++) {
        for (int k = 0; k < NT; k++) {
            for (size_t i = 0; i < n[k]; i++)
                g[k][i] = (w[k][i] - target[k][i]) +
                          0.1f * noise((uint64_t)rank, (uint64_t)s, (uint64_t)k, i);
            if ((rc = gift_push(c, (uint32_t)k, (uint64_t)s, g[k], NULL, NULL, &op[k])) < 0)
                return fail("push", rc);
        }
        for (int k = 0; k < NT; k++) {
            rc = gift_op_wait(op[k]);
            gift_op_free(op[k]);
            if (rc < 0)
                return fail("push wait", rc);
        }
        printf("pushed %ld\n", s);
        fflush(stdout);
        for (int k = 0; k < NT; k++)
            if ((rc = gift_pull(c, (uint32_t)k, (uint64_t)s, m[k], NULL, NULL, &op[k])) < 0)
                return fail("pull", rc);
        for (int k = 0; k < NT; k++) {
            rc = gift_op_wait(op[k]);
            gift_op_free(op[k]);
            if (rc < 0)
                return fail("pull wait", rc);
            for (size_t i = 0; i < n[k]; i++)
                w[k][i] -= lr * m[k][i];
        }
        printf("step %ld\n", s);
        fflush(stdout);
        if (sleep_ms > 0) {
            struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }

    uint64_t h = 0xcbf29ce484222325ull;
    double loss = 0;
    size_t total = 0;
    for (int k = 0; k < NT; k++) {
        const unsigned char *b = (const unsigned char *)w[k];
        for (size_t i = 0; i < n[k] * sizeof(float); i++)
            h = (h ^ b[i]) * 0x100000001b3ull;
        for (size_t i = 0; i < n[k]; i++)
            loss += ((double)w[k][i] - target[k][i]) * ((double)w[k][i] - target[k][i]);
        total += n[k];
    }
    gift_client_stats(c, &cs);
    printf("result hash=%016" PRIx64 " loss=%.9g reconnects=%" PRIu64 " replays=%" PRIu64 "\n", h,
           loss / (double)total, cs.reconnects, cs.replays);
    gift_client_close(c);
    for (int k = 0; k < NT; k++) {
        free(w[k]);
        free(g[k]);
        free(m[k]);
        free(target[k]);
    }
    return 0;
}
