/*
 * bench_codec.c: `gift-bench codec`, encode and decode throughput.
 *
 * One fp32 tensor of --mib MiB is encoded and decoded in every format, once
 * in Euclidean coordinates and once through a GIFT transform (rows x din,
 * rank k, a real non-identity geometry built from sketches). Throughput is
 * fp32 bytes (4 * n) over the median wall time of --repeats runs, after one
 * warm-up run, on one core (BLAS pinned to one thread). Single-core memcpy of
 * the same 4 * n bytes, timed in the same run, is the yardstick.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"

#define CODEC_MAX_REPEATS 1000
#define CODEC_SKETCH_ROUNDS 2

/* Targets from the codec issue: ratio of encode and decode throughput to
 * memcpy for Euclidean rows. */
#define TARGET_E4M3 0.5
#define TARGET_NVFP4 0.3

static const gift_format_t codec_formats[] = {GIFT_FMT_F32, GIFT_FMT_BF16, GIFT_FMT_E4M3,
                                              GIFT_FMT_E5M2, GIFT_FMT_NVFP4};
#define CODEC_NFORMATS (sizeof(codec_formats) / sizeof(codec_formats[0]))

typedef struct codec_opts {
    long mib;
    long repeats;
    long din;
    long k;
    uint64_t seed;
    const char *json;
    int simd; /* -1: leave the default path */
} codec_opts_t;

/* One benchmark row: a format under one transform. */
typedef struct codec_row {
    gift_format_t fmt;
    int gift;
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
    int rows, din;
    float *x;      /* input, n */
    float *t;      /* transformed, n */
    float *out;    /* decoded, n */
    void *payload; /* cap bytes */
    size_t cap;
    float *work; /* rows * k */
    gift_geometry_t g;
    int have_g;
} codec_bufs_t;

void bench_codec_usage(FILE *f)
{
    fprintf(f,
            "usage: gift-bench codec [--mib N] [--repeats R] [--din D] [--k K] [--seed S]\n"
            "                        [--simd scalar|avx2|avx512] [--json FILE]\n"
            "\n"
            "Encode and decode throughput of f32, bf16, fp8-e4m3, fp8-e5m2 and nvfp4 on one\n"
            "core, for one fp32 tensor of N MiB (n = N * 262144 elements, gradient-like\n"
            "random values). Each format runs twice:\n"
            "  euclidean  encode = gift_encode, decode = gift_decode\n"
            "  gift       the tensor as (n / D) x D rows, a rank-K geometry built from two\n"
            "             rounds of sketches of a synthetic decaying-spectrum input, so the\n"
            "             transform really runs: encode = gift_transform(T) + gift_encode,\n"
            "             decode = gift_decode + gift_transform(T^-1)\n"
            "Throughput is GB/s of fp32 data (4 * n bytes / median seconds, 1 GB = 1e9 B)\n"
            "over R timed runs after one warm-up run. Single-core memcpy of the same 4 * n\n"
            "bytes (R runs before and R after the codec rows, median of all) is the\n"
            "yardstick; 'x memcpy' is each throughput over memcpy's. The issue's targets:\n"
            "fp8-e4m3 euclidean encode and decode >= %.1fx memcpy, nvfp4 euclidean >= %.1fx;\n"
            "those rows get a PASS/FAIL column. relL2 is the round-trip error of each row\n"
            "(a sanity check, not a fidelity benchmark: see `gift-bench fidelity`).\n"
            "\n"
            "options:\n"
            "  --mib N        tensor size in MiB of fp32 (default 64)\n"
            "  --repeats R    timed runs per measurement (default 7)\n"
            "  --din D        columns of the gift tensor; must divide n (default 1024)\n"
            "  --k K          rank of the gift transform (default 32)\n"
            "  --seed S       seed of the data and the geometry (default 1)\n"
            "  --simd P       force the SIMD path (gift_simd_force); default: the best this\n"
            "                 CPU has, or GIFT_SIMD from the environment\n"
            "  --json FILE    write results here (default %s/codec.json)\n"
            "  --help         this text\n",
            TARGET_E4M3, TARGET_NVFP4, BENCH_OUT_DIR);
}

static int parse_opts(int argc, char **argv, codec_opts_t *o)
{
    o->mib = 64;
    o->repeats = 7;
    o->din = 1024;
    o->k = 32;
    o->seed = 1;
    o->json = BENCH_OUT_DIR "/codec.json";
    o->simd = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bench_codec_usage(stdout);
            return 1;
        } else if (strcmp(a, "--mib") == 0) {
            if (bench_parse_long(a, v, 1, 16384, &o->mib) < 0)
                return -1;
            i++;
        } else if (strcmp(a, "--repeats") == 0) {
            if (bench_parse_long(a, v, 1, CODEC_MAX_REPEATS, &o->repeats) < 0)
                return -1;
            i++;
        } else if (strcmp(a, "--din") == 0) {
            if (bench_parse_long(a, v, 2, 1 << 16, &o->din) < 0)
                return -1;
            i++;
        } else if (strcmp(a, "--k") == 0) {
            if (bench_parse_long(a, v, 1, 1 << 16, &o->k) < 0)
                return -1;
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            if (bench_parse_u64(a, v, &o->seed) < 0)
                return -1;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            if (v == NULL) {
                fprintf(stderr, "gift-bench: --json needs a file name\n");
                return -1;
            }
            o->json = v;
            i++;
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
    if (o->k > o->din) {
        fprintf(stderr, "gift-bench: --k %ld is larger than --din %ld\n", o->k, o->din);
        return -1;
    }
    if (((size_t)o->mib << 18) % (size_t)o->din != 0) {
        fprintf(stderr, "gift-bench: --din %ld does not divide n = %zu elements\n", o->din,
                (size_t)o->mib << 18);
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

    if (gift) {
        if ((rc = gift_transform(&b->g, 0, b->x, b->rows, b->t, b->work)) < 0)
            return rc;
        src = b->t;
    }
    return gift_encode(p, src, b->n, b->payload, b->cap);
}

static int run_decode(codec_bufs_t *b, const gift_codec_params_t *p, int gift, size_t len)
{
    int rc;

    if (!gift)
        return gift_decode(p, b->payload, len, b->n, b->out);
    if ((rc = gift_decode(p, b->payload, len, b->n, b->t)) < 0)
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
    const char *tr = row->gift ? "gift" : "euclidean";
    double bytes = 4.0 * (double)b->n;
    int rc;

    memset(&p, 0, sizeof(p));
    p.fmt = row->fmt;
    if ((rc = gift_layout(&p, b->n, &lay)) < 0) {
        fprintf(stderr, "gift-bench: gift_layout(%s): %s\n", name, gift_strerror(rc));
        return rc;
    }
    if (lay.total > b->cap) {
        fprintf(stderr, "gift-bench: %s payload of %zu bytes exceeds the %zu allocated\n", name,
                lay.total, b->cap);
        return GIFT_ENOSPC;
    }
    row->payload_bytes = lay.total;
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

static void json_samples(bench_json_t *j, const char *key, const double *s, long n)
{
    bench_json_arr(j, key);
    for (long i = 0; i < n; i++)
        bench_json_num(j, NULL, s[i]);
    bench_json_arr_end(j);
}

static int write_json(const codec_opts_t *o, const codec_bufs_t *b, const codec_row_t *rows,
                      size_t nrows, const double *mc_s, long nmc, double mc_gbps, const double *tf,
                      const double *ti, double tf_gbps, double ti_gbps, const char *cpu,
                      const char *date, double wall)
{
    FILE *f;
    bench_json_t j;

    if (bench_mkdir_for(o->json) < 0 || (f = fopen(o->json, "w")) == NULL) {
        perror(o->json);
        return -1;
    }
    bench_json_open(&j, f);
    bench_json_str(&j, "benchmark", "codec");
    bench_json_str(&j, "codec_version", GIFT_CODEC_VERSION);
    bench_json_str(&j, "date", date);
    bench_json_str(&j, "cpu", cpu);
    bench_json_int(&j, "cores", bench_cpu_count());
    bench_json_str(&j, "simd", gift_simd_name(gift_simd_active()));
    bench_json_str(&j, "simd_best", gift_simd_name(gift_simd_best()));
    bench_json_int(&j, "mib", o->mib);
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
    bench_json_obj(&j, "memcpy");
    bench_json_num(&j, "gbps", mc_gbps);
    json_samples(&j, "seconds", mc_s, nmc);
    bench_json_obj_end(&j);
    bench_json_arr(&j, "rows");
    for (size_t i = 0; i < nrows; i++) {
        const codec_row_t *r = &rows[i];

        bench_json_obj(&j, NULL);
        bench_json_str(&j, "format", gift_format_name(r->fmt));
        bench_json_str(&j, "transform", r->gift ? "gift" : "euclidean");
        if (r->gift)
            bench_json_int(&j, "k", b->g.k);
        else
            bench_json_null(&j, "k");
        bench_json_int(&j, "payload_bytes", (long long)r->payload_bytes);
        bench_json_num(&j, "bits_per_elem", 8.0 * (double)r->payload_bytes / (double)b->n);
        bench_json_num(&j, "encode_gbps", r->enc_gbps);
        bench_json_num(&j, "decode_gbps", r->dec_gbps);
        bench_json_num(&j, "encode_x_memcpy", r->enc_gbps / mc_gbps);
        bench_json_num(&j, "decode_x_memcpy", r->dec_gbps / mc_gbps);
        bench_json_num(&j, "roundtrip_rel_l2", r->rel_l2);
        if (r->target > 0.0) {
            bench_json_num(&j, "target_x_memcpy", r->target);
            bench_json_bool(&j, "pass", r->pass_enc && r->pass_dec);
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

int bench_codec_main(int argc, char **argv)
{
    codec_opts_t o;
    codec_bufs_t b;
    codec_row_t *rows = NULL;
    size_t nrows = 2 * CODEC_NFORMATS;
    double *mc_s = NULL, *tf = NULL, *ti = NULL, tmp[2 * CODEC_MAX_REPEATS];
    double mc_gbps, tf_gbps, ti_gbps, t_start = bench_now(), wall;
    char cpu[256], date[64];
    int rc, status = 1, fail = 0;

    memset(&b, 0, sizeof(b));
    if ((rc = parse_opts(argc, argv, &o)) != 0)
        return rc > 0 ? 0 : 2;
    if (o.simd >= 0 && (rc = gift_simd_force((gift_simd_t)o.simd)) < 0) {
        fprintf(stderr, "gift-bench: --simd %s: %s (this CPU's best is %s)\n",
                gift_simd_name((gift_simd_t)o.simd), gift_strerror(rc),
                gift_simd_name(gift_simd_best()));
        return 1;
    }
    b.n = (size_t)o.mib << 18;
    b.din = (int)o.din;
    b.rows = (int)(b.n / (size_t)o.din);

    /* Every buffer once, up front. */
    b.cap = 0;
    for (size_t i = 0; i < CODEC_NFORMATS; i++) {
        gift_codec_params_t p;
        gift_layout_t lay;

        memset(&p, 0, sizeof(p));
        p.fmt = codec_formats[i];
        if ((rc = gift_layout(&p, b.n, &lay)) < 0) {
            fprintf(stderr, "gift-bench: gift_layout(%s): %s\n", gift_format_name(codec_formats[i]),
                    gift_strerror(rc));
            goto out;
        }
        if (lay.total > b.cap)
            b.cap = lay.total;
    }
    b.x = bench_alloc(b.n * sizeof(float));
    b.t = bench_alloc(b.n * sizeof(float));
    b.out = bench_alloc(b.n * sizeof(float));
    b.payload = bench_alloc(b.cap);
    b.work = bench_alloc((size_t)b.rows * (size_t)o.k * sizeof(float));
    rows = calloc(nrows, sizeof(*rows));
    mc_s = calloc(2 * (size_t)o.repeats, sizeof(double));
    tf = calloc((size_t)o.repeats, sizeof(double));
    ti = calloc((size_t)o.repeats, sizeof(double));
    if (!b.x || !b.t || !b.out || !b.payload || !b.work || !rows || !mc_s || !tf || !ti) {
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
        if (bench_row(&b, r, o.repeats) < 0)
            goto out;
    }
    if (time_transform(&b, tf, ti, o.repeats) < 0)
        goto out;
    time_memcpy(&b, mc_s + o.repeats, o.repeats);

    memcpy(tmp, mc_s, 2 * (size_t)o.repeats * sizeof(double));
    mc_gbps = 4.0 * (double)b.n / bench_median(tmp, 2 * (size_t)o.repeats) / 1e9;
    memcpy(tmp, tf, (size_t)o.repeats * sizeof(double));
    tf_gbps = 4.0 * (double)b.n / bench_median(tmp, (size_t)o.repeats) / 1e9;
    memcpy(tmp, ti, (size_t)o.repeats * sizeof(double));
    ti_gbps = 4.0 * (double)b.n / bench_median(tmp, (size_t)o.repeats) / 1e9;

    printf("## gift-bench codec\n\n");
    printf("- date %s; CPU %s; %ld cores online; SIMD path %s (best on this CPU: %s)\n", date, cpu,
           bench_cpu_count(), gift_simd_name(gift_simd_active()), gift_simd_name(gift_simd_best()));
    printf("- tensor: %ld MiB of fp32 (n = %zu); gift rows: %d x %d, k = %d, ks = %d, epoch "
           "%u; one core, BLAS on one thread\n",
           o.mib, b.n, b.rows, b.din, b.g.k, b.g.ks, b.g.epoch);
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

        if (r->gift)
            snprintf(tr, sizeof(tr), "gift k=%d", b.g.k);
        else
            snprintf(tr, sizeof(tr), "euclidean");
        target[0] = '\0';
        if (r->target > 0.0) {
            r->pass_enc = r->enc_gbps >= r->target * mc_gbps;
            r->pass_dec = r->dec_gbps >= r->target * mc_gbps;
            snprintf(target, sizeof(target), ">= %.1fx", r->target);
            pass = r->pass_enc && r->pass_dec ? "PASS"
                   : r->pass_enc              ? "FAIL (decode)"
                   : r->pass_dec              ? "FAIL (encode)"
                                              : "FAIL (both)";
            fail |= !(r->pass_enc && r->pass_dec);
        }
        printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2e | %s | %s |\n",
               gift_format_name(r->fmt), tr, 8.0 * (double)r->payload_bytes / (double)b.n,
               r->enc_gbps, r->enc_gbps / mc_gbps, r->dec_gbps, r->dec_gbps / mc_gbps, r->rel_l2,
               target, pass);
    }
    printf("\ngift transform alone (rank %d, %d x %d): T %.2f GB/s (%.2fx memcpy), T^-1 %.2f "
           "GB/s (%.2fx memcpy)\n",
           b.g.k, b.rows, b.din, tf_gbps, tf_gbps / mc_gbps, ti_gbps, ti_gbps / mc_gbps);
    wall = bench_now() - t_start;
    printf("\ntargets: %s; wall time %.1f s; JSON: %s\n", fail ? "FAIL" : "PASS", wall, o.json);
    if (write_json(&o, &b, rows, nrows, mc_s, 2 * o.repeats, mc_gbps, tf, ti, tf_gbps, ti_gbps, cpu,
                   date, wall) < 0)
        goto out;
    status = 0;
out:
    if (b.have_g)
        gift_geometry_free(&b.g);
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
