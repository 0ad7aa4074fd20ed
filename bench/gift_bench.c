/*
 * gift_bench.c: gift-bench, the codec benchmarks. Dispatches to one
 * subcommand; each prints a markdown table to stdout and writes JSON.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gift_codec.h"

/* bench_cluster.c (its prototype lives here, not in bench_common.h). */
int bench_cluster_main(int argc, char **argv);
/* bench_policy.c. */
int bench_policy_main(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gift-bench <subcommand> [options]\n"
            "       gift-bench <subcommand> --help\n"
            "\n"
            "subcommands:\n"
            "  codec     encode/decode throughput of every format, Euclidean and GIFT,\n"
            "            against single-core memcpy\n"
            "  fidelity  error of the averaged gradient of one simulated step (W workers,\n"
            "            one layer) for fp8-e4m3 and nvfp4, Euclidean and GIFT at several ranks\n"
            "  cluster   end-to-end giftd throughput on loopback: S shards, W workers, every\n"
            "            codec, against a raw-TCP baseline\n"
            "  policy    the per-tensor chooser (gift_policy.h) on a dumped step of a whole\n"
            "            model: policies all/none/auto/hits and bit budgets, measured\n"
            "\n"
            "Every subcommand prints a markdown table to stdout and writes JSON\n"
            "(default %s/<subcommand>.json, relative to the current directory).\n"
            "BLAS runs on one thread. gift-codec %s.\n",
            BENCH_OUT_DIR, GIFT_CODEC_VERSION);
}

#ifndef GIFT_HAVE_OPENBLAS_SET_NUM_THREADS
/* OpenBLAS reads OPENBLAS_NUM_THREADS once, when the library loads, so
 * without openblas_set_num_threads the only way to one thread is to start
 * again with the variable set. Returns only if that fails. */
static void reexec_single_thread(char **argv)
{
    const char *v = getenv("OPENBLAS_NUM_THREADS");

    if (v != NULL && strcmp(v, "1") == 0)
        return;
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0 || setenv("OMP_NUM_THREADS", "1", 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    fprintf(stderr, "gift-bench: warning: could not re-execute with OPENBLAS_NUM_THREADS=1; "
                    "BLAS may use several threads\n");
}
#endif

int main(int argc, char **argv)
{
#ifndef GIFT_HAVE_OPENBLAS_SET_NUM_THREADS
    reexec_single_thread(argv);
#endif
    bench_blas_single_thread();

    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("gift-bench %s\n", GIFT_CODEC_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "codec") == 0)
        return bench_codec_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "fidelity") == 0)
        return bench_fidelity_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "cluster") == 0)
        return bench_cluster_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "policy") == 0)
        return bench_policy_main(argc - 1, argv + 1);
    fprintf(stderr, "gift-bench: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
