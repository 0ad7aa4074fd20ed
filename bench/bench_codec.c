/*
 * bench_codec.c: `gift-bench codec`, encode and decode throughput.
 *
 * One fp32 tensor of --mib MiB is encoded and decoded in every format, once
 * in Euclidean coordinates and once through a GIFT transform (rows x din,
 * rank k, a real non-identity geometry built from sketches). Throughput is
 * fp32 bytes (4 * n) over the median wall time of --repeats runs, after one
 * warm-up run, on one core (BLAS pinned to one thread). Single-core memcpy of
 * the same 4 * n bytes, timed in the same run, is the yardstick.
 *
 * --gpu runs the CUDA twins (gpu/gift_gpu.h) instead, on device memory, timed
 * with CUDA events, beside a device-to-device copy of the same bytes, and
 * times the transform for k = 8, 32 and 128. It exits 77 when this build has
 * no gpu/ or the machine has no CUDA device.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#ifdef GIFT_HAVE_GPU
#include <cuda_runtime_api.h>

#include "gift_gpu.h"
#endif

#define CODEC_MAX_REPEATS 1000
#define CODEC_SKETCH_ROUNDS 2

/* Targets: ratio of encode and decode throughput to
 * memcpy for Euclidean rows. */
#define TARGET_E4M3 0.5
#define TARGET_NVFP4 0.3
/* Issue 42: the Hadamard treatment's fp8-e4m3 encode (transform included). */
#define TARGET_HADAMARD_E4M3 0.5

/* Row treatments (codec_row_t.gift). */
#define TR_EUCLIDEAN 0
#define TR_GIFT 1
#define TR_HADAMARD 2
#define TR_COUNT 3
/* On the GPU: ratio to a device-to-device copy. */
#define TARGET_GPU_E4M3 0.6
#define TARGET_GPU_NVFP4 0.4

static const gift_format_t codec_formats[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3,
                                              GIFT_FMT_E5M2, GIFT_FMT_NVFP4};
#define CODEC_NFORMATS (sizeof(codec_formats) / sizeof(codec_formats[0]))

typedef struct codec_opts {
    long mib;
    long chunk_mib; /* 0: the whole tensor in one call */
    long repeats;
    long din;
    long k;
    uint64_t seed;
    const char *json;
    int simd;        /* -1: leave the default path */
    int gpu;         /* --gpu: the CUDA twins on device 0 */
    int repeats_set; /* --repeats given */
    int json_set;    /* --json given */
} codec_opts_t;

/* One benchmark row: a format under one transform. */
typedef struct codec_row {
    gift_format_t fmt;
    int gift;       /* TR_EUCLIDEAN, TR_GIFT or TR_HADAMARD */
    int target_enc; /* the target is on the encode alone */
    size_t payload_bytes;
    double enc_s[CODEC_MAX_REPEATS];
    double dec_s[CODEC_MAX_REPEATS];
    double enc_gbps, dec_gbps;
    double rel_l2; /* round-trip error, computed here, as a sanity check */
    double target; /* 0: no target for this row */
    int pass_enc, pass_dec;
} codec_row_t;

/* Buffers, all allocated once before anything is timed. */
typedef struct codec_bufs {
    size_t n;
    size_t chunk_n;   /* elements per encode / decode call (n, or --chunk-mib's) */
    size_t chunk_cap; /* payload bytes kept per call; payload holds n / chunk_n of them */
    int rows, din;
    float *x;      /* input, n */
    float *t;      /* transformed, n */
    float *out;    /* decoded, n */
    void *payload; /* cap bytes */
    size_t cap;
    float *work; /* rows * k */
    gift_geometry_t g;
    int have_g;
    gift_hadamard_t hd; /* the Hadamard rows': din columns, blocks of gift_hadamard_block(din) */
} codec_bufs_t;

static const char *tr_name(int tr)
{
    return tr == TR_GIFT ? "gift" : tr == TR_HADAMARD ? "hadamard" : "euclidean";
}

void bench_codec_usage(FILE *f)
{
    fprintf(f,
            "usage: gift-bench codec [--mib N] [--chunk-mib C] [--repeats R] [--din D] [--k K]\n"
            "                        [--seed S] [--simd scalar|avx2|avx512] [--gpu] [--json FILE]\n"
            "\n"
            "Encode and decode throughput of f32, bf16, fp8-e4m3, fp8-e5m2 and nvfp4 on one\n"
            "core, for one fp32 tensor of N MiB (n = N * 262144 elements, gradient-like\n"
            "random values). Each format runs twice:\n"
            "  euclidean  encode = gift_encode, decode = gift_decode\n"
            "  gift       the tensor as (n / D) x D rows, a rank-K geometry built from two\n"
            "             rounds of sketches of a synthetic decaying-spectrum input, so the\n"
            "             transform really runs: encode = gift_transform(T) + gift_encode,\n"
            "             decode = gift_decode + gift_transform(T^-1)\n"
            "  hadamard   the same (n / D) x D rows, random signs and an orthonormal\n"
            "             Walsh-Hadamard transform on blocks of the largest power of two\n"
            "             dividing D (issue 42): encode = gift_hadamard_encode (rotated and\n"
            "             encoded slice by slice in one walk; nvfp4: gift_hadamard_apply, then\n"
            "             gift_encode),\n"
            "             decode = gift_decode + gift_hadamard_apply(inverse) in place, per\n"
            "             call (with --chunk-mib, each chunk rotated just before its encode and\n"
            "             after its decode, as libgiftclient does)\n"
            "Throughput is GB/s of fp32 data (4 * n bytes / median seconds, 1 GB = 1e9 B)\n"
            "over R timed runs after one warm-up run. Single-core memcpy of the same 4 * n\n"
            "bytes (R runs before and R after the codec rows, median of all) is the\n"
            "yardstick; 'x memcpy' is each throughput over memcpy's. The targets:\n"
            "fp8-e4m3 euclidean encode and decode >= %.1fx memcpy, nvfp4 euclidean >= %.1fx,\n"
            "fp8-e4m3 hadamard encode (transform included) >= %.1fx;\n"
            "those rows get a PASS/FAIL column. relL2 is the round-trip error of each row\n"
            "(a sanity check, not a fidelity benchmark: see `gift-bench fidelity`).\n"
            "\n"
            "options:\n"
            "  --mib N        tensor size in MiB of fp32 (default 64)\n"
            "  --chunk-mib C  encode and decode the tensor in calls of C MiB each (C divides\n"
            "                 N), as libgiftclient does a tensor's chunks (4 MiB by default)\n"
            "                 and a worker's gradient is out of the cache; default 0: the\n"
            "                 whole tensor in one call. CPU only.\n"
            "  --repeats R    timed runs per measurement (default 7)\n"
            "  --din D        columns of the gift tensor; must divide n (default 1024)\n"
            "  --k K          rank of the gift transform (default 32)\n"
            "  --seed S       seed of the data and the geometry (default 1)\n"
            "  --simd P       force the SIMD path (gift_simd_force); default: the best this\n"
            "                 CPU has, or GIFT_SIMD from the environment\n"
            "  --gpu          run the CUDA twins on device 0 instead (device memory, CUDA\n"
            "                 events, default 20 repeats): encode/decode GB/s beside a\n"
            "                 device-to-device copy, a bit-for-bit check against the CPU\n"
            "                 codec, and the transform for k = 8, 32, 128. Targets: fp8-e4m3\n"
            "                 >= %.1fx copy, nvfp4 >= %.1fx, the k=32 transform <= the fp8\n"
            "                 encode's time. Exits 77 without gpu/ or a device.\n"
            "  --json FILE    write results here (default %s/codec.json, --gpu:\n"
            "                 %s/codec_gpu.json)\n"
            "  --help         this text\n",
            TARGET_E4M3, TARGET_NVFP4, TARGET_HADAMARD_E4M3, TARGET_GPU_E4M3, TARGET_GPU_NVFP4,
            BENCH_OUT_DIR, BENCH_OUT_DIR);
}

static int parse_opts(int argc, char **argv, codec_opts_t *o)
{
    o->mib = 64;
    o->chunk_mib = 0;
    o->repeats = 7;
    o->din = 1024;
    o->k = 32;
    o->seed = 1;
    o->json = BENCH_OUT_DIR "/codec.json";
    o->simd = -1;
    o->gpu = o->repeats_set = o->json_set = 0;
    const bench_opt_t opts[] = {
        BENCH_LONG("--mib", &o->mib, 1, 16384),
        BENCH_LONG("--chunk-mib", &o->chunk_mib, 0, 16384),
        BENCH_LONG_SET("--repeats", &o->repeats, 1, CODEC_MAX_REPEATS, &o->repeats_set),
        BENCH_LONG("--din", &o->din, 2, 1 << 16),
        BENCH_LONG("--k", &o->k, 1, 1 << 16),
        BENCH_U64("--seed", &o->seed),
        BENCH_STR_SET("--json", &o->json, "a file name", &o->json_set),
        BENCH_FLAG("--gpu", &o->gpu),
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;

        if ((r = bench_opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, &i)) != 0) {
            if (r < 0)
                return -1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bench_codec_usage(stdout);
            return 1;
        } else if (strcmp(a, "--simd") == 0) {
            if (v == NULL) {
                fprintf(stderr, "gift-bench: --simd needs scalar, avx2 or avx512\n");
                return -1;
            }
            if (strcmp(v, "scalar") == 0)
                o->simd = GIFT_SIMD_SCALAR;
            else if (strcmp(v, "avx2") == 0)
                o->simd = GIFT_SIMD_AVX2;
            else if (strcmp(v, "avx512") == 0)
                o->simd = GIFT_SIMD_AVX512;
            else {
                fprintf(stderr, "gift-bench: --simd: '%s' is not scalar, avx2 or avx512\n", v);
                return -1;
            }
            i++;
        } else {
            fprintf(stderr, "gift-bench codec: unknown option '%s' (see --help)\n", a);
            return -1;
        }
    }
    if (o->chunk_mib > 0 && (o->chunk_mib > o->mib || o->mib % o->chunk_mib != 0)) {
        fprintf(stderr, "gift-bench: --chunk-mib %ld does not divide --mib %ld\n", o->chunk_mib,
                o->mib);
        return -1;
    }
    if (o->chunk_mib > 0 && o->gpu) {
        fprintf(stderr, "gift-bench: --chunk-mib is for the CPU codec, not --gpu\n");
        return -1;
    }
    if (o->k > o->din) {
        fprintf(stderr, "gift-bench: --k %ld is larger than --din %ld\n", o->k, o->din);
        return -1;
    }
    if (((size_t)o->mib << 18) % (size_t)o->din != 0) {
        fprintf(stderr, "gift-bench: --din %ld does not divide n = %zu elements\n", o->din,
                (size_t)o->mib << 18);
        return -1;
    }
    if (o->chunk_mib > 0 && ((size_t)o->chunk_mib << 18) % (size_t)o->din != 0) {
        fprintf(stderr, "gift-bench: --din %ld does not divide a --chunk-mib call's %zu elements\n",
                o->din, (size_t)o->chunk_mib << 18);
        return -1;
    }
    return 0;
}

/* Gradient-like test data: N(0, 1) entries times a log-normal scale per
 * row, around 1e-3. Fixed by the seed. */
static void fill_data(float *x, size_t n, int din, uint64_t seed)
{
    bench_rng_t r;
    double scale = 1e-3;

    bench_rng_seed(&r, seed, 1);
    for (size_t i = 0; i < n; i++) {
        if (i % (size_t)din == 0)
            scale = 1e-3 * exp(0.5 * bench_rng_normal(&r));
        x[i] = (float)(scale * bench_rng_normal(&r));
    }
}

/* Builds a non-identity rank-k geometry as the server would: sketches of a
 * synthetic input whose covariance has a decaying spectrum (variance 1/i on
 * coordinate i), summed over CODEC_SKETCH_ROUNDS refreshes. */
static int build_geometry(codec_bufs_t *b, int k, uint64_t seed)
{
    int din = b->din, ks = gift_basis_cols(din, k, GIFT_OVERSAMPLE_DEFAULT);
    int ntok = 2 * din;
    float *X = NULL, *Y = NULL, *sw = NULL;
    bench_rng_t r;
    double trace;
    int rc;

    if ((rc = gift_geometry_init(&b->g, din, k, ks, seed)) < 0) {
        fprintf(stderr, "gift-bench: gift_geometry_init(din %d, k %d, ks %d): %s\n", din, k, ks,
                gift_strerror(rc));
        goto out;
    }
    b->have_g = 1;
    X = bench_alloc((size_t)ntok * din * sizeof(float));
    Y = bench_alloc((size_t)din * ks * sizeof(float));
    sw = bench_alloc((size_t)ntok * ks * sizeof(float));
    if (X == NULL || Y == NULL || sw == NULL) {
        fprintf(stderr, "gift-bench: out of memory for the sketch buffers\n");
        rc = GIFT_ENOMEM;
        goto out_free;
    }
    bench_rng_seed(&r, seed, 2);
    for (int t = 0; t < ntok; t++)
        for (int j = 0; j < din; j++)
            X[(size_t)t * din + j] = (float)(bench_rng_normal(&r) / sqrt(1.0 + j));
    for (int round = 0; round < CODEC_SKETCH_ROUNDS; round++) {
        if ((rc = gift_sketch(X, ntok, din, b->g.U, ks, Y, &trace, sw)) < 0) {
            fprintf(stderr, "gift-bench: gift_sketch: %s\n", gift_strerror(rc));
            goto out_free;
        }
        if ((rc = gift_geometry_update(&b->g, Y, trace, GIFT_DAMPING_DEFAULT)) < 0) {
            fprintf(stderr, "gift-bench: gift_geometry_update: %s\n", gift_strerror(rc));
            goto out_free;
        }
    }
    if (b->g.identity) {
        fprintf(stderr,
                "gift-bench: the geometry is still the identity after %d refreshes "
                "(epoch %u); the gift rows would not measure the transform\n",
                CODEC_SKETCH_ROUNDS, b->g.epoch);
        rc = GIFT_EINVAL;
        goto out_free;
    }
    rc = 0;
out_free:
    free(sw);
    free(Y);
    free(X);
out:
    return rc;
}

static int run_encode(codec_bufs_t *b, const gift_codec_params_t *p, int gift)
{
    const float *src = b->x;
    int rc;

    if (gift == TR_GIFT) {
        if ((rc = gift_transform(&b->g, 0, b->x, b->rows, b->t, b->work)) < 0)
            return rc;
        src = b->t;
    } else if (gift == TR_HADAMARD) {
        src = b->t; /* each call's rows rotated just before their encode, as the client does */
    }
    for (size_t i = 0, c = 0; i < b->n; i += b->chunk_n, c++) {
        if (gift == TR_HADAMARD) {
            /* As libgiftclient: rotated and encoded in one walk where the
             * format allows it (round to nearest, not nvfp4), else in two. */
            rc = gift_hadamard_encode(p, &b->hd, b->x + i, b->chunk_n / (size_t)b->din,
                                      (char *)b->payload + c * b->chunk_cap, b->chunk_cap);
            if (rc != GIFT_EFORMAT) {
                if (rc < 0)
                    return rc;
                continue;
            }
            if ((rc = gift_hadamard_apply(&b->hd, 0, b->x + i, b->chunk_n / (size_t)b->din,
                                          b->t + i)) < 0)
                return rc;
        }
        if ((rc = gift_encode(p, src + i, b->chunk_n, (char *)b->payload + c * b->chunk_cap,
                              b->chunk_cap)) < 0)
            return rc;
    }
    return 0;
}

/* Decodes every chunk of the payload (len bytes each) into dst. */
static int decode_chunks(codec_bufs_t *b, const gift_codec_params_t *p, size_t len, float *dst)
{
    int rc;

    for (size_t i = 0, c = 0; i < b->n; i += b->chunk_n, c++)
        if ((rc = gift_decode(p, (const char *)b->payload + c * b->chunk_cap, len, b->chunk_n,
                              dst + i)) < 0)
            return rc;
    return 0;
}

/* Hadamard rows: each call's payload decoded into out and rotated back
 * there in place, as the client does each pulled chunk. */
static int decode_hadamard(codec_bufs_t *b, const gift_codec_params_t *p, size_t len)
{
    int rc;

    for (size_t i = 0, c = 0; i < b->n; i += b->chunk_n, c++)
        if ((rc = gift_decode(p, (const char *)b->payload + c * b->chunk_cap, len, b->chunk_n,
                              b->out + i)) < 0 ||
            (rc = gift_hadamard_apply(&b->hd, 1, b->out + i, b->chunk_n / (size_t)b->din,
                                      b->out + i)) < 0)
            return rc;
    return 0;
}

static int run_decode(codec_bufs_t *b, const gift_codec_params_t *p, int gift, size_t len)
{
    int rc;

    if (gift == TR_EUCLIDEAN)
        return decode_chunks(b, p, len, b->out);
    if (gift == TR_HADAMARD)
        return decode_hadamard(b, p, len);
    if ((rc = decode_chunks(b, p, len, b->t)) < 0)
        return rc;
    return gift_transform(&b->g, 1, b->t, b->rows, b->out, b->work);
}

static double rel_l2(const float *ref, const float *x, size_t n)
{
    double num = 0.0, den = 0.0;

    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Times one row. Returns 0 or a gift error code (already reported). */
static int bench_row(codec_bufs_t *b, codec_row_t *row, long repeats)
{
    gift_codec_params_t p;
    gift_layout_t lay;
    const char *name = gift_format_name(row->fmt);
    const char *tr = tr_name(row->gift);
    double bytes = 4.0 * (double)b->n;
    int rc;

    memset(&p, 0, sizeof(p));
    p.fmt = row->fmt;
    if ((rc = gift_layout(&p, b->chunk_n, &lay)) < 0) {
        fprintf(stderr, "gift-bench: gift_layout(%s): %s\n", name, gift_strerror(rc));
        return rc;
    }
    if (lay.total > b->chunk_cap) {
        fprintf(stderr, "gift-bench: %s payload of %zu bytes exceeds the %zu allocated\n", name,
                lay.total, b->chunk_cap);
        return GIFT_ENOSPC;
    }
    row->payload_bytes = lay.total * (b->n / b->chunk_n);
    /* Warm-up, which also checks the round trip. */
    if ((rc = run_encode(b, &p, row->gift)) < 0) {
        fprintf(stderr, "gift-bench: encode %s %s: %s\n", name, tr, gift_strerror(rc));
        return rc;
    }
    if ((rc = run_decode(b, &p, row->gift, lay.total)) < 0) {
        fprintf(stderr, "gift-bench: decode %s %s: %s\n", name, tr, gift_strerror(rc));
        return rc;
    }
    row->rel_l2 = rel_l2(b->x, b->out, b->n);
    for (long r = 0; r < repeats; r++) {
        double t0 = bench_now(), t1, t2;

        rc = run_encode(b, &p, row->gift);
        t1 = bench_now();
        if (rc < 0) {
            fprintf(stderr, "gift-bench: encode %s %s: %s\n", name, tr, gift_strerror(rc));
            return rc;
        }
        rc = run_decode(b, &p, row->gift, lay.total);
        t2 = bench_now();
        if (rc < 0) {
            fprintf(stderr, "gift-bench: decode %s %s: %s\n", name, tr, gift_strerror(rc));
            return rc;
        }
        row->enc_s[r] = t1 - t0;
        row->dec_s[r] = t2 - t1;
    }
    {
        double tmp[CODEC_MAX_REPEATS];

        memcpy(tmp, row->enc_s, (size_t)repeats * sizeof(double));
        row->enc_gbps = bytes / bench_median(tmp, (size_t)repeats) / 1e9;
        memcpy(tmp, row->dec_s, (size_t)repeats * sizeof(double));
        row->dec_gbps = bytes / bench_median(tmp, (size_t)repeats) / 1e9;
    }
    return 0;
}

static void time_memcpy(codec_bufs_t *b, double *s, long repeats)
{
    memcpy(b->out, b->x, b->n * sizeof(float)); /* warm-up */
    for (long r = 0; r < repeats; r++) {
        double t0 = bench_now();

        memcpy(b->out, b->x, b->n * sizeof(float));
        s[r] = bench_now() - t0;
    }
}

/* Times the transform alone (T into t, T^-1 from t into out). */
static int time_transform(codec_bufs_t *b, double *fwd, double *inv, long repeats)
{
    int rc;

    for (long r = -1; r < repeats; r++) { /* r == -1: warm-up */
        double t0 = bench_now(), t1, t2;

        if ((rc = gift_transform(&b->g, 0, b->x, b->rows, b->t, b->work)) < 0)
            goto fail;
        t1 = bench_now();
        if ((rc = gift_transform(&b->g, 1, b->t, b->rows, b->out, b->work)) < 0)
            goto fail;
        t2 = bench_now();
        if (r >= 0) {
            fwd[r] = t1 - t0;
            inv[r] = t2 - t1;
        }
    }
    return 0;
fail:
    fprintf(stderr, "gift-bench: gift_transform: %s\n", gift_strerror(rc));
    return rc;
}

/* Times the Hadamard rotation alone (H D into t, D H from t into out). */
static int time_hadamard(codec_bufs_t *b, double *fwd, double *inv, long repeats)
{
    int rc;

    for (long r = -1; r < repeats; r++) { /* r == -1: warm-up */
        double t0 = bench_now(), t1, t2;

        if ((rc = gift_hadamard_apply(&b->hd, 0, b->x, (size_t)b->rows, b->t)) < 0)
            goto fail;
        t1 = bench_now();
        if ((rc = gift_hadamard_apply(&b->hd, 1, b->t, (size_t)b->rows, b->out)) < 0)
            goto fail;
        t2 = bench_now();
        if (r >= 0) {
            fwd[r] = t1 - t0;
            inv[r] = t2 - t1;
        }
    }
    return 0;
fail:
    fprintf(stderr, "gift-bench: gift_hadamard_apply: %s\n", gift_strerror(rc));
    return rc;
}

static void json_samples(bench_json_t *j, const char *key, const double *s, long n)
{
    bench_json_arr(j, key);
    for (long i = 0; i < n; i++)
        bench_json_num(j, NULL, s[i]);
    bench_json_arr_end(j);
}

static int write_json(const codec_opts_t *o, const codec_bufs_t *b, const codec_row_t *rows,
                      size_t nrows, const double *mc_s, long nmc, double mc_gbps, const double *tf,
                      const double *ti, double tf_gbps, double ti_gbps, const double *hf,
                      const double *hi, double hf_gbps, double hi_gbps, const char *cpu,
                      const char *date, double wall)
{
    FILE *f;
    bench_json_t j;

    if ((f = bench_json_begin(&j, o->json, "codec", "codec_version", GIFT_CODEC_VERSION, date)) ==
        NULL)
        return -1;
    bench_json_str(&j, "cpu", cpu);
    bench_json_int(&j, "cores", bench_cpu_count());
    bench_json_str(&j, "simd", gift_simd_name(gift_simd_active()));
    bench_json_str(&j, "simd_best", gift_simd_name(gift_simd_best()));
    bench_json_int(&j, "mib", o->mib);
    bench_json_int(&j, "chunk_mib", o->chunk_mib);
    bench_json_int(&j, "n", (long long)b->n);
    bench_json_int(&j, "bytes_fp32", (long long)(4 * b->n));
    bench_json_int(&j, "repeats", o->repeats);
    bench_json_int(&j, "seed", (long long)o->seed);
    bench_json_obj(&j, "gift");
    bench_json_int(&j, "rows", b->rows);
    bench_json_int(&j, "din", b->din);
    bench_json_int(&j, "k", b->g.k);
    bench_json_int(&j, "ks", b->g.ks);
    bench_json_int(&j, "epoch", b->g.epoch);
    bench_json_num(&j, "transform_gbps", tf_gbps);
    bench_json_num(&j, "inverse_gbps", ti_gbps);
    json_samples(&j, "transform_s", tf, o->repeats);
    json_samples(&j, "inverse_s", ti, o->repeats);
    bench_json_obj_end(&j);
    bench_json_obj(&j, "hadamard");
    bench_json_int(&j, "rows", b->rows);
    bench_json_int(&j, "din", b->din);
    bench_json_int(&j, "block", b->hd.block);
    bench_json_num(&j, "transform_gbps", hf_gbps);
    bench_json_num(&j, "inverse_gbps", hi_gbps);
    json_samples(&j, "transform_s", hf, o->repeats);
    json_samples(&j, "inverse_s", hi, o->repeats);
    bench_json_obj_end(&j);
    bench_json_obj(&j, "memcpy");
    bench_json_num(&j, "gbps", mc_gbps);
    json_samples(&j, "seconds", mc_s, nmc);
    bench_json_obj_end(&j);
    bench_json_arr(&j, "rows");
    for (size_t i = 0; i < nrows; i++) {
        const codec_row_t *r = &rows[i];

        bench_json_obj(&j, NULL);
        bench_json_str(&j, "format", gift_format_name(r->fmt));
        bench_json_str(&j, "transform", tr_name(r->gift));
        if (r->gift == TR_GIFT)
            bench_json_int(&j, "k", b->g.k);
        else
            bench_json_null(&j, "k");
        if (r->gift == TR_HADAMARD)
            bench_json_int(&j, "hadamard_block", b->hd.block);
        bench_json_int(&j, "payload_bytes", (long long)r->payload_bytes);
        bench_json_num(&j, "bits_per_elem", 8.0 * (double)r->payload_bytes / (double)b->n);
        bench_json_num(&j, "encode_gbps", r->enc_gbps);
        bench_json_num(&j, "decode_gbps", r->dec_gbps);
        bench_json_num(&j, "encode_x_memcpy", r->enc_gbps / mc_gbps);
        bench_json_num(&j, "decode_x_memcpy", r->dec_gbps / mc_gbps);
        bench_json_num(&j, "roundtrip_rel_l2", r->rel_l2);
        if (r->target > 0.0) {
            bench_json_num(&j, "target_x_memcpy", r->target);
            bench_json_str(&j, "target_on", r->target_enc ? "encode" : "encode and decode");
            bench_json_bool(&j, "pass", r->pass_enc && (r->target_enc || r->pass_dec));
        } else {
            bench_json_null(&j, "target_x_memcpy");
            bench_json_null(&j, "pass");
        }
        json_samples(&j, "encode_s", r->enc_s, o->repeats);
        json_samples(&j, "decode_s", r->dec_s, o->repeats);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_num(&j, "wall_s", wall);
    bench_json_close(&j);
    if (fclose(f) != 0) {
        perror(o->json);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* --gpu: the CUDA twins                                                 */
/* ------------------------------------------------------------------ */

#ifndef GIFT_HAVE_GPU
static int bench_codec_gpu(const codec_opts_t *o)
{
    (void)o;
    fprintf(stderr, "gift-bench codec --gpu: this gift-bench was built without the CUDA twins "
                    "(gpu/ needs nvcc; GIFT_WITH_CUDA=AUTO|ON): skipped\n");
    return 77;
}
#else

#define GPU_TRANSFORM_KS 3
static const int gpu_transform_k[GPU_TRANSFORM_KS] = {8, 32, 128};

typedef struct gpu_row {
    gift_format_t fmt;
    size_t payload_bytes;
    double enc_gbps, dec_gbps, target;
    int same_bits; /* payload and decode equal the CPU's, bit for bit */
    int pass;
    double enc_s[CODEC_MAX_REPEATS], dec_s[CODEC_MAX_REPEATS];
} gpu_row_t;

typedef struct gpu_tf_row {
    int k, ks;
    double fwd_ms, inv_ms;
    double fwd_s[CODEC_MAX_REPEATS], inv_s[CODEC_MAX_REPEATS];
} gpu_tf_row_t;

/* Everything the GPU benchmark holds; device buffers end in _d. */
typedef struct gpu_bench {
    gift_gpu_ctx_t *ctx;
    cudaStream_t stream;
    cudaEvent_t ev0, ev1;
    size_t n, cap;
    int rows, din;
    float *x, *out;       /* host: input, CPU decode */
    uint8_t *pay, *pay_g; /* host: CPU payload, GPU payload */
    float *out_g;         /* host: GPU decode */
    float *x_d, *t_d, *out_d, *w_d;
    uint8_t *pay_d;
} gpu_bench_t;

static int gpu_cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "gift-bench codec --gpu: %s: %s\n", what, cudaGetErrorString(e));
    return -1;
}

static int gpu_gift_ok(gpu_bench_t *g, int rc, const char *what)
{
    if (rc == 0)
        return 0;
    fprintf(stderr, "gift-bench codec --gpu: %s: %s %s\n", what, gift_strerror(rc),
            gift_gpu_last_error(g->ctx));
    return -1;
}

/* What one timed step runs. */
typedef enum gpu_op { GPU_COPY, GPU_ENCODE, GPU_DECODE, GPU_T, GPU_TINV } gpu_op_t;

static int gpu_run(gpu_bench_t *g, gpu_op_t op, const gift_codec_params_t *p, size_t len,
                   const gift_gpu_geometry_t *geo)
{
    switch (op) {
    case GPU_COPY:
        return gpu_cuda_ok(cudaMemcpyAsync(g->out_d, g->x_d, g->n * sizeof(float),
                                           cudaMemcpyDeviceToDevice, g->stream),
                           "device copy");
    case GPU_ENCODE:
        return gpu_gift_ok(g, gift_gpu_encode(g->ctx, p, g->x_d, g->n, g->pay_d, g->cap),
                           "gift_gpu_encode");
    case GPU_DECODE:
        return gpu_gift_ok(g, gift_gpu_decode(g->ctx, p, g->pay_d, len, g->n, g->out_d),
                           "gift_gpu_decode");
    case GPU_T:
        return gpu_gift_ok(g, gift_gpu_transform(g->ctx, geo, 0, g->x_d, g->rows, g->t_d, g->w_d),
                           "gift_gpu_transform");
    case GPU_TINV:
        return gpu_gift_ok(g, gift_gpu_transform(g->ctx, geo, 1, g->t_d, g->rows, g->out_d, g->w_d),
                           "gift_gpu_transform (inverse)");
    }
    return -1;
}

/* Times op repeats times (after one warm-up) with CUDA events on the
 * context's stream; seconds into s. Checks the context's error word. */
static int gpu_time(gpu_bench_t *g, gpu_op_t op, const gift_codec_params_t *p, size_t len,
                    const gift_gpu_geometry_t *geo, double *s, long repeats)
{
    for (long r = -1; r < repeats; r++) {
        float ms;

        if (gpu_cuda_ok(cudaEventRecord(g->ev0, g->stream), "cudaEventRecord") < 0 ||
            gpu_run(g, op, p, len, geo) < 0 ||
            gpu_cuda_ok(cudaEventRecord(g->ev1, g->stream), "cudaEventRecord") < 0 ||
            gpu_cuda_ok(cudaEventSynchronize(g->ev1), "cudaEventSynchronize") < 0 ||
            gpu_cuda_ok(cudaEventElapsedTime(&ms, g->ev0, g->ev1), "cudaEventElapsedTime") < 0)
            return -1;
        if (r >= 0)
            s[r] = ms * 1e-3;
    }
    return gpu_gift_ok(g, gift_gpu_sync(g->ctx), "gift_gpu_sync");
}

static double gpu_median_gbps(size_t n, const double *s, long repeats)
{
    double tmp[2 * CODEC_MAX_REPEATS];

    memcpy(tmp, s, (size_t)repeats * sizeof(double));
    return 4.0 * (double)n / bench_median(tmp, (size_t)repeats) / 1e9;
}

/* One format: the bit check against the CPU codec, then encode and decode
 * timings. */
static int gpu_row(gpu_bench_t *g, gpu_row_t *row, long repeats)
{
    gift_codec_params_t p;
    gift_layout_t l;
    const char *name = gift_format_name(row->fmt);

    memset(&p, 0, sizeof p);
    p.fmt = row->fmt;
    if (gift_layout(&p, g->n, &l) < 0 || l.total > g->cap)
        return -1;
    row->payload_bytes = l.total;
    if (gift_encode(&p, g->x, g->n, g->pay, g->cap) < 0 ||
        gift_decode(&p, g->pay, l.total, g->n, g->out) < 0) {
        fprintf(stderr, "gift-bench codec --gpu: the CPU codec failed on %s\n", name);
        return -1;
    }
    if (gpu_cuda_ok(cudaMemset(g->pay_d, 0xA7, g->cap), "cudaMemset") < 0 ||
        gpu_cuda_ok(cudaMemset(g->out_d, 0xA7, g->n * sizeof(float)), "cudaMemset") < 0 ||
        gpu_run(g, GPU_ENCODE, &p, l.total, NULL) < 0 ||
        gpu_run(g, GPU_DECODE, &p, l.total, NULL) < 0 ||
        gpu_gift_ok(g, gift_gpu_sync(g->ctx), name) < 0 ||
        gpu_cuda_ok(cudaMemcpy(g->pay_g, g->pay_d, l.total, cudaMemcpyDeviceToHost), "copy back") <
            0 ||
        gpu_cuda_ok(cudaMemcpy(g->out_g, g->out_d, g->n * sizeof(float), cudaMemcpyDeviceToHost),
                    "copy back") < 0)
        return -1;
    row->same_bits = memcmp(g->pay, g->pay_g, l.total) == 0 &&
                     memcmp(g->out, g->out_g, g->n * sizeof(float)) == 0;
    if (!row->same_bits)
        fprintf(stderr, "gift-bench codec --gpu: %s: the GPU bytes differ from the CPU's\n", name);
    if (gpu_time(g, GPU_ENCODE, &p, l.total, NULL, row->enc_s, repeats) < 0 ||
        gpu_time(g, GPU_DECODE, &p, l.total, NULL, row->dec_s, repeats) < 0)
        return -1;
    row->enc_gbps = gpu_median_gbps(g->n, row->enc_s, repeats);
    row->dec_gbps = gpu_median_gbps(g->n, row->dec_s, repeats);
    return 0;
}

/* The transform for rank k: a real geometry built on the host (as in the
 * CPU rows), uploaded, then T and T^-1 timed. */
static int gpu_transform_row(gpu_bench_t *g, gpu_tf_row_t *row, uint64_t seed, long repeats)
{
    codec_bufs_t hb;
    gift_gpu_geometry_t geo;
    double tmp[CODEC_MAX_REPEATS];
    int rc = -1;

    memset(&hb, 0, sizeof hb);
    hb.din = g->din;
    if (build_geometry(&hb, row->k, seed) < 0)
        goto out;
    row->ks = hb.g.ks;
    if (gpu_gift_ok(g, gift_gpu_geometry_init(&geo, hb.g.din, hb.g.k, hb.g.ks),
                    "gift_gpu_geometry_init") < 0)
        goto out;
    if (gpu_gift_ok(g, gift_gpu_geometry_upload(g->ctx, &geo, &hb.g), "upload") == 0 &&
        gpu_time(g, GPU_T, NULL, 0, &geo, row->fwd_s, repeats) == 0 &&
        gpu_time(g, GPU_TINV, NULL, 0, &geo, row->inv_s, repeats) == 0) {
        memcpy(tmp, row->fwd_s, (size_t)repeats * sizeof(double));
        row->fwd_ms = 1e3 * bench_median(tmp, (size_t)repeats);
        memcpy(tmp, row->inv_s, (size_t)repeats * sizeof(double));
        row->inv_ms = 1e3 * bench_median(tmp, (size_t)repeats);
        rc = 0;
    }
    gift_gpu_geometry_free(&geo);
out:
    if (hb.have_g)
        gift_geometry_free(&hb.g);
    return rc;
}

static void gpu_bench_free(gpu_bench_t *g)
{
    cudaFree(g->pay_d);
    cudaFree(g->w_d);
    cudaFree(g->out_d);
    cudaFree(g->t_d);
    cudaFree(g->x_d);
    if (g->ev0)
        cudaEventDestroy(g->ev0);
    if (g->ev1)
        cudaEventDestroy(g->ev1);
    gift_gpu_ctx_free(g->ctx);
    free(g->out_g);
    free(g->pay_g);
    free(g->pay);
    free(g->out);
    free(g->x);
}

static int gpu_write_json(const codec_opts_t *o, const gpu_bench_t *g, const char *gpu_name,
                          const char *date, double copy_gbps, const double *copy_s, long ncopy,
                          const gpu_row_t *rows, size_t nrows, const gpu_tf_row_t *tf, size_t ntf,
                          double e4m3_enc_ms, double wall)
{
    const char *path = o->json_set ? o->json : BENCH_OUT_DIR "/codec_gpu.json";
    bench_json_t j;
    FILE *f;

    if ((f = bench_json_begin(&j, path, "codec_gpu", "codec_version", GIFT_CODEC_VERSION, date)) ==
        NULL)
        return -1;
    bench_json_str(&j, "gpu", gpu_name);
    bench_json_int(&j, "mib", o->mib);
    bench_json_int(&j, "n", (long long)g->n);
    bench_json_int(&j, "repeats", o->repeats);
    bench_json_obj(&j, "device_copy");
    bench_json_num(&j, "gbps", copy_gbps);
    json_samples(&j, "seconds", copy_s, ncopy);
    bench_json_obj_end(&j);
    bench_json_arr(&j, "rows");
    for (size_t i = 0; i < nrows; i++) {
        bench_json_obj(&j, NULL);
        bench_json_str(&j, "format", gift_format_name(rows[i].fmt));
        bench_json_int(&j, "payload_bytes", (long long)rows[i].payload_bytes);
        bench_json_num(&j, "encode_gbps", rows[i].enc_gbps);
        bench_json_num(&j, "decode_gbps", rows[i].dec_gbps);
        bench_json_num(&j, "encode_x_copy", rows[i].enc_gbps / copy_gbps);
        bench_json_num(&j, "decode_x_copy", rows[i].dec_gbps / copy_gbps);
        bench_json_bool(&j, "same_bits_as_cpu", rows[i].same_bits);
        if (rows[i].target > 0.0) {
            bench_json_num(&j, "target_x_copy", rows[i].target);
            bench_json_bool(&j, "pass", rows[i].pass);
        }
        json_samples(&j, "encode_s", rows[i].enc_s, o->repeats);
        json_samples(&j, "decode_s", rows[i].dec_s, o->repeats);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_arr(&j, "transform");
    for (size_t i = 0; i < ntf; i++) {
        bench_json_obj(&j, NULL);
        bench_json_int(&j, "rows", g->rows);
        bench_json_int(&j, "din", g->din);
        bench_json_int(&j, "k", tf[i].k);
        bench_json_int(&j, "ks", tf[i].ks);
        bench_json_num(&j, "forward_ms", tf[i].fwd_ms);
        bench_json_num(&j, "inverse_ms", tf[i].inv_ms);
        bench_json_num(&j, "forward_x_e4m3_encode", tf[i].fwd_ms / e4m3_enc_ms);
        json_samples(&j, "forward_s", tf[i].fwd_s, o->repeats);
        json_samples(&j, "inverse_s", tf[i].inv_s, o->repeats);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_num(&j, "wall_s", wall);
    bench_json_close(&j);
    if (fclose(f) != 0) {
        perror(path);
        return -1;
    }
    return 0;
}

static int bench_codec_gpu(const codec_opts_t *o_in)
{
    codec_opts_t o = *o_in;
    gpu_bench_t g;
    gpu_row_t *rows = NULL;
    gpu_tf_row_t *tf = NULL;
    double *copy_s = NULL, tmp[2 * CODEC_MAX_REPEATS], copy_gbps, e4m3_ms = 0.0;
    double t_start = bench_now(), wall;
    char name[256], date[64];
    size_t ntf = 0;
    int status = 1, fail = 0, mismatch = 0;

    memset(&g, 0, sizeof g);
    if (gift_gpu_device_count() == 0) {
        fprintf(stderr, "gift-bench codec --gpu: no CUDA device on this machine: skipped\n");
        return 77;
    }
    if (!o.repeats_set)
        o.repeats = 20;
    g.n = (size_t)o.mib << 18;
    g.din = (int)o.din;
    g.rows = (int)(g.n / (size_t)o.din);
    for (size_t i = 0; i < CODEC_NFORMATS; i++) {
        gift_codec_params_t p;
        gift_layout_t l;

        memset(&p, 0, sizeof p);
        p.fmt = codec_formats[i];
        if (gift_layout(&p, g.n, &l) == 0 && l.total > g.cap)
            g.cap = l.total;
    }
    if (gpu_gift_ok(&g, gift_gpu_ctx_create(0, NULL, &g.ctx), "gift_gpu_ctx_create") < 0)
        goto out;
    g.stream = (cudaStream_t)gift_gpu_ctx_stream(g.ctx);
    gift_gpu_device_name(0, name, sizeof name);
    g.x = bench_alloc(g.n * sizeof(float));
    g.out = bench_alloc(g.n * sizeof(float));
    g.out_g = bench_alloc(g.n * sizeof(float));
    g.pay = bench_alloc(g.cap);
    g.pay_g = bench_alloc(g.cap);
    rows = calloc(CODEC_NFORMATS, sizeof *rows);
    tf = calloc(GPU_TRANSFORM_KS, sizeof *tf);
    copy_s = calloc(2 * (size_t)o.repeats, sizeof(double));
    if (!g.x || !g.out || !g.out_g || !g.pay || !g.pay_g || !rows || !tf || !copy_s) {
        fprintf(stderr, "gift-bench codec --gpu: out of host memory\n");
        goto out;
    }
    if (gpu_cuda_ok(cudaMalloc((void **)&g.x_d, g.n * sizeof(float)), "cudaMalloc") < 0 ||
        gpu_cuda_ok(cudaMalloc((void **)&g.t_d, g.n * sizeof(float)), "cudaMalloc") < 0 ||
        gpu_cuda_ok(cudaMalloc((void **)&g.out_d, g.n * sizeof(float)), "cudaMalloc") < 0 ||
        gpu_cuda_ok(cudaMalloc((void **)&g.w_d, (size_t)g.rows * 128 * sizeof(float)),
                    "cudaMalloc") < 0 ||
        gpu_cuda_ok(cudaMalloc((void **)&g.pay_d, g.cap), "cudaMalloc") < 0 ||
        gpu_cuda_ok(cudaEventCreate(&g.ev0), "cudaEventCreate") < 0 ||
        gpu_cuda_ok(cudaEventCreate(&g.ev1), "cudaEventCreate") < 0)
        goto out;
    fill_data(g.x, g.n, g.din, o.seed);
    if (gpu_cuda_ok(cudaMemcpy(g.x_d, g.x, g.n * sizeof(float), cudaMemcpyHostToDevice),
                    "cudaMemcpy") < 0)
        goto out;
    bench_date_utc(date, sizeof date);
    fprintf(stderr, "gift-bench codec --gpu: %s, %ld MiB, %ld repeats ...\n", name, o.mib,
            o.repeats);

    if (gpu_time(&g, GPU_COPY, NULL, 0, NULL, copy_s, o.repeats) < 0)
        goto out;
    for (size_t i = 0; i < CODEC_NFORMATS; i++) {
        rows[i].fmt = codec_formats[i];
        rows[i].target = rows[i].fmt == GIFT_FMT_E4M3    ? TARGET_GPU_E4M3
                         : rows[i].fmt == GIFT_FMT_NVFP4 ? TARGET_GPU_NVFP4
                                                         : 0.0;
        if (gpu_row(&g, &rows[i], o.repeats) < 0)
            goto out;
        mismatch |= !rows[i].same_bits;
    }
    for (size_t i = 0; i < GPU_TRANSFORM_KS; i++) {
        if (gpu_transform_k[i] > g.din)
            continue;
        tf[ntf].k = gpu_transform_k[i];
        if (gpu_transform_row(&g, &tf[ntf], o.seed, o.repeats) < 0)
            goto out;
        ntf++;
    }
    if (gpu_time(&g, GPU_COPY, NULL, 0, NULL, copy_s + o.repeats, o.repeats) < 0)
        goto out;
    memcpy(tmp, copy_s, 2 * (size_t)o.repeats * sizeof(double));
    copy_gbps = 4.0 * (double)g.n / bench_median(tmp, 2 * (size_t)o.repeats) / 1e9;

    printf("## gift-bench codec --gpu\n\n");
    printf("- date %s; GPU %s (device 0); CUDA events on one stream\n", date, name);
    printf("- tensor: %ld MiB of fp32 (n = %zu) in device memory; GB/s = 4n bytes / median of "
           "%ld runs (1 GB = 1e9 B)\n",
           o.mib, g.n, o.repeats);
    printf("- device-to-device copy of the same %zu bytes: **%.1f GB/s** (median of %ld runs, "
           "before and after)\n\n",
           4 * g.n, copy_gbps, 2 * o.repeats);
    printf("| format | bits/elem | encode GB/s | x copy | decode GB/s | x copy | same bits as CPU "
           "| target | pass |\n");
    printf("|---|---:|---:|---:|---:|---:|---|---:|---|\n");
    for (size_t i = 0; i < CODEC_NFORMATS; i++) {
        gpu_row_t *r = &rows[i];
        char target[16] = "";
        const char *pass = "";

        if (r->target > 0.0) {
            r->pass = r->enc_gbps >= r->target * copy_gbps && r->dec_gbps >= r->target * copy_gbps;
            snprintf(target, sizeof target, ">= %.1fx", r->target);
            pass = r->pass ? "PASS" : "FAIL";
            fail |= !r->pass;
        }
        if (r->fmt == GIFT_FMT_E4M3)
            e4m3_ms = 4e3 * (double)g.n / (r->enc_gbps * 1e9);
        printf("| %s | %.2f | %.1f | %.2f | %.1f | %.2f | %s | %s | %s |\n",
               gift_format_name(r->fmt), 8.0 * (double)r->payload_bytes / (double)g.n, r->enc_gbps,
               r->enc_gbps / copy_gbps, r->dec_gbps, r->dec_gbps / copy_gbps,
               r->same_bits ? "yes" : "**NO**", target, pass);
    }
    printf("\nGIFT transform on the device (%d x %d, cuBLAS FP32), beside the fp8-e4m3 encode "
           "(%.3f ms):\n\n",
           g.rows, g.din, e4m3_ms);
    printf("| k | ks | T ms | T^-1 ms | T GB/s | T / e4m3 encode | target | pass |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t i = 0; i < ntf; i++) {
        double ratio = tf[i].fwd_ms / e4m3_ms;
        int is32 = tf[i].k == 32;

        if (is32)
            fail |= ratio > 1.0;
        printf("| %d | %d | %.3f | %.3f | %.1f | %.2f | %s | %s |\n", tf[i].k, tf[i].ks,
               tf[i].fwd_ms, tf[i].inv_ms, 4.0 * (double)g.n / (tf[i].fwd_ms * 1e6), ratio,
               is32 ? "<= 1.0" : "", is32 ? (ratio <= 1.0 ? "PASS" : "FAIL") : "");
    }
    wall = bench_now() - t_start;
    printf("\nbit-for-bit with the CPU codec: %s; targets: %s; wall time %.1f s\n",
           mismatch ? "**NO**" : "yes", fail ? "FAIL" : "PASS", wall);
    if (gpu_write_json(&o, &g, name, date, copy_gbps, copy_s, 2 * o.repeats, rows, CODEC_NFORMATS,
                       tf, ntf, e4m3_ms, wall) < 0)
        goto out;
    status = mismatch ? 1 : 0;
out:
    gpu_bench_free(&g);
    free(copy_s);
    free(tf);
    free(rows);
    return status;
}
#endif

int bench_codec_main(int argc, char **argv)
{
    codec_opts_t o;
    codec_bufs_t b;
    codec_row_t *rows = NULL;
    size_t nrows = TR_COUNT * CODEC_NFORMATS;
    double *mc_s = NULL, *tf = NULL, *ti = NULL, *hf = NULL, *hi = NULL;
    double tmp[2 * CODEC_MAX_REPEATS];
    double mc_gbps, tf_gbps, ti_gbps, hf_gbps, hi_gbps, t_start = bench_now(), wall;
    char cpu[256], date[64], chunks[96];
    int rc, status = 1, fail = 0;

    memset(&b, 0, sizeof(b));
    if ((rc = parse_opts(argc, argv, &o)) != 0)
        return rc > 0 ? 0 : 2;
    if (o.gpu)
        return bench_codec_gpu(&o);
    if (o.simd >= 0 && (rc = gift_simd_force((gift_simd_t)o.simd)) < 0) {
        fprintf(stderr, "gift-bench: --simd %s: %s (this CPU's best is %s)\n",
                gift_simd_name((gift_simd_t)o.simd), gift_strerror(rc),
                gift_simd_name(gift_simd_best()));
        return 1;
    }
    b.n = (size_t)o.mib << 18;
    b.din = (int)o.din;
    b.rows = (int)(b.n / (size_t)o.din);

    b.chunk_n = o.chunk_mib > 0 ? (size_t)o.chunk_mib << 18 : b.n;

    /* Every buffer once, up front. */
    b.chunk_cap = 0;
    for (size_t i = 0; i < CODEC_NFORMATS; i++) {
        gift_codec_params_t p;
        gift_layout_t lay;

        memset(&p, 0, sizeof(p));
        p.fmt = codec_formats[i];
        if ((rc = gift_layout(&p, b.chunk_n, &lay)) < 0) {
            fprintf(stderr, "gift-bench: gift_layout(%s): %s\n", gift_format_name(codec_formats[i]),
                    gift_strerror(rc));
            goto out;
        }
        if (lay.total > b.chunk_cap)
            b.chunk_cap = lay.total;
    }
    b.cap = b.chunk_cap * (b.n / b.chunk_n);
    b.x = bench_alloc(b.n * sizeof(float));
    b.t = bench_alloc(b.n * sizeof(float));
    b.out = bench_alloc(b.n * sizeof(float));
    b.payload = bench_alloc(b.cap);
    b.work = bench_alloc((size_t)b.rows * (size_t)o.k * sizeof(float));
    rows = calloc(nrows, sizeof(*rows));
    mc_s = calloc(2 * (size_t)o.repeats, sizeof(double));
    tf = calloc((size_t)o.repeats, sizeof(double));
    ti = calloc((size_t)o.repeats, sizeof(double));
    hf = calloc((size_t)o.repeats, sizeof(double));
    hi = calloc((size_t)o.repeats, sizeof(double));
    if (!b.x || !b.t || !b.out || !b.payload || !b.work || !rows || !mc_s || !tf || !ti || !hf ||
        !hi || gift_hadamard_init(&b.hd, (uint32_t)b.din, gift_hadamard_seed("bench", 0, 0)) < 0) {
        fprintf(stderr, "gift-bench: out of memory (a %ld MiB tensor needs about %ld MiB)\n", o.mib,
                4 * o.mib);
        goto out;
    }
    fill_data(b.x, b.n, b.din, o.seed);
    if (build_geometry(&b, (int)o.k, o.seed) < 0)
        goto out;

    bench_cpu_model(cpu, sizeof(cpu));
    bench_date_utc(date, sizeof(date));
    fprintf(stderr, "gift-bench codec: %ld MiB, %ld repeats, simd %s ...\n", o.mib, o.repeats,
            gift_simd_name(gift_simd_active()));

    time_memcpy(&b, mc_s, o.repeats);
    for (size_t i = 0; i < nrows; i++) {
        codec_row_t *r = &rows[i];

        r->fmt = codec_formats[i % CODEC_NFORMATS];
        r->gift = (int)(i / CODEC_NFORMATS);
        if (!r->gift && r->fmt == GIFT_FMT_E4M3)
            r->target = TARGET_E4M3;
        else if (!r->gift && r->fmt == GIFT_FMT_NVFP4)
            r->target = TARGET_NVFP4;
        else if (r->gift == TR_HADAMARD && r->fmt == GIFT_FMT_E4M3) {
            r->target = TARGET_HADAMARD_E4M3;
            r->target_enc = 1;
        }
        if (bench_row(&b, r, o.repeats) < 0)
            goto out;
    }
    if (time_transform(&b, tf, ti, o.repeats) < 0 || time_hadamard(&b, hf, hi, o.repeats) < 0)
        goto out;
    time_memcpy(&b, mc_s + o.repeats, o.repeats);

    memcpy(tmp, mc_s, 2 * (size_t)o.repeats * sizeof(double));
    mc_gbps = 4.0 * (double)b.n / bench_median(tmp, 2 * (size_t)o.repeats) / 1e9;
    memcpy(tmp, tf, (size_t)o.repeats * sizeof(double));
    tf_gbps = 4.0 * (double)b.n / bench_median(tmp, (size_t)o.repeats) / 1e9;
    memcpy(tmp, ti, (size_t)o.repeats * sizeof(double));
    ti_gbps = 4.0 * (double)b.n / bench_median(tmp, (size_t)o.repeats) / 1e9;
    memcpy(tmp, hf, (size_t)o.repeats * sizeof(double));
    hf_gbps = 4.0 * (double)b.n / bench_median(tmp, (size_t)o.repeats) / 1e9;
    memcpy(tmp, hi, (size_t)o.repeats * sizeof(double));
    hi_gbps = 4.0 * (double)b.n / bench_median(tmp, (size_t)o.repeats) / 1e9;

    if (o.chunk_mib > 0)
        snprintf(chunks, sizeof(chunks), "encoded and decoded in %zu calls of %ld MiB",
                 b.n / b.chunk_n, o.chunk_mib);
    else
        snprintf(chunks, sizeof(chunks), "one encode and one decode call");
    printf("## gift-bench codec\n\n");
    printf("- date %s; CPU %s; %ld cores online; SIMD path %s (best on this CPU: %s)\n", date, cpu,
           bench_cpu_count(), gift_simd_name(gift_simd_active()), gift_simd_name(gift_simd_best()));
    printf("- tensor: %ld MiB of fp32 (n = %zu), %s; gift rows: %d x %d, k = %d, ks = %d, "
           "epoch %u; one core, BLAS on one thread\n",
           o.mib, b.n, chunks, b.rows, b.din, b.g.k, b.g.ks, b.g.epoch);
    printf("- GB/s = 4n bytes / median of %ld runs (1 GB = 1e9 B); memcpy of the same %zu "
           "bytes: **%.2f GB/s** (median of %ld runs)\n\n",
           o.repeats, 4 * b.n, mc_gbps, 2 * o.repeats);
    printf("| format | transform | bits/elem | encode GB/s | x memcpy | decode GB/s | x memcpy "
           "| round-trip relL2 | target | pass |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t i = 0; i < nrows; i++) {
        codec_row_t *r = &rows[i];
        char tr[32], target[16];
        const char *pass = "";

        if (r->gift == TR_GIFT)
            snprintf(tr, sizeof(tr), "gift k=%d", b.g.k);
        else if (r->gift == TR_HADAMARD)
            snprintf(tr, sizeof(tr), "hadamard b=%u", b.hd.block);
        else
            snprintf(tr, sizeof(tr), "euclidean");
        target[0] = '\0';
        if (r->target > 0.0) {
            r->pass_enc = r->enc_gbps >= r->target * mc_gbps;
            r->pass_dec = r->dec_gbps >= r->target * mc_gbps;
            snprintf(target, sizeof(target), ">= %.1fx%s", r->target, r->target_enc ? " enc" : "");
            if (r->target_enc)
                pass = r->pass_enc ? "PASS" : "FAIL (encode)";
            else
                pass = r->pass_enc && r->pass_dec ? "PASS"
                       : r->pass_enc              ? "FAIL (decode)"
                       : r->pass_dec              ? "FAIL (encode)"
                                                  : "FAIL (both)";
            fail |= !(r->pass_enc && (r->target_enc || r->pass_dec));
        }
        printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2e | %s | %s |\n",
               gift_format_name(r->fmt), tr, 8.0 * (double)r->payload_bytes / (double)b.n,
               r->enc_gbps, r->enc_gbps / mc_gbps, r->dec_gbps, r->dec_gbps / mc_gbps, r->rel_l2,
               target, pass);
    }
    printf("\ngift transform alone (rank %d, %d x %d): T %.2f GB/s (%.2fx memcpy), T^-1 %.2f "
           "GB/s (%.2fx memcpy)\n",
           b.g.k, b.rows, b.din, tf_gbps, tf_gbps / mc_gbps, ti_gbps, ti_gbps / mc_gbps);
    printf("hadamard rotation alone (blocks of %u, %d x %d): H D %.2f GB/s (%.2fx memcpy), D H "
           "%.2f GB/s (%.2fx memcpy)\n",
           b.hd.block, b.rows, b.din, hf_gbps, hf_gbps / mc_gbps, hi_gbps, hi_gbps / mc_gbps);
    wall = bench_now() - t_start;
    printf("\ntargets: %s; wall time %.1f s; JSON: %s\n", fail ? "FAIL" : "PASS", wall, o.json);
    if (write_json(&o, &b, rows, nrows, mc_s, 2 * o.repeats, mc_gbps, tf, ti, tf_gbps, ti_gbps, hf,
                   hi, hf_gbps, hi_gbps, cpu, date, wall) < 0)
        goto out;
    status = 0;
out:
    if (b.have_g)
        gift_geometry_free(&b.g);
    gift_hadamard_free(&b.hd);
    free(hi);
    free(hf);
    free(ti);
    free(tf);
    free(mc_s);
    free(rows);
    free(b.work);
    free(b.payload);
    free(b.out);
    free(b.t);
    free(b.x);
    return status;
}
