/*
 * bench_fidelity.c: `gift-bench fidelity`, the error of one averaged step.
 *
 * W workers each hold the weight gradient G_w (rows x din) of one linear
 * layer. For each codec (fp8-e4m3, nvfp4) and each transform (Euclidean, and
 * GIFT at several ranks k with geometries built from sketches as the server
 * builds them, and the Hadamard treatment of issue 42: T = D H, random signs
 * and an orthonormal Walsh-Hadamard transform along din), every worker sends
 * encode(G_w T); the server sums the decoded
 * payloads in transformed space (gift_decode_acc) and divides by W; the
 * result is mapped back with T^-1 and compared with the true mean gradient.
 * Only the push leg is quantized; the server's re-encode for the pull is not
 * modelled.
 *
 * The gradients come from files (--grad, --cov) or from a synthetic layer
 * (see synth_* below and bench/README.md).
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cblas.h>
#include <lapacke.h>

#include "gift_codec.h"

#define FID_MAX_WORKERS 256
#define FID_MAX_SCOV 4096 /* --sketch-cov files: workers x sketch steps */
#define FID_MAX_K 16
#define FID_MAX_OUTLIERS 64
#define FID_OUTLIERS_DEFAULT 4
#define FID_DECAY_DEFAULT 1.45 /* bulk spectrum exponent, see synth_init */
#define FID_STUDENT_NU 5
#define FID_TARGET_FP8 0.4 /* GIFT fp8 at the default k: whitened <= 0.4x Euclidean fp8 */

/* Stream ids of the synthetic generator: one per purpose, worker and batch. */
#define STREAM_V 1
#define STREAM_OUTLIERS 2
#define STREAM_ROWSCALE 3
#define STREAM_STEP_X 100
#define STREAM_STEP_DELTA 10000
#define STREAM_SKETCH_X 20000

static const int fid_k_base[] = {8, 16, 32, 64, 128, 256};

typedef struct fid_opts {
    long rows, cols, workers, tokens, refresh, block;
    int workers_set, tokens_set;
    uint64_t seed;
    const char *grad[FID_MAX_WORKERS];
    int ngrad;
    const char *cov[FID_MAX_WORKERS];
    int ncov;
    const char *scov[FID_MAX_SCOV]; /* --sketch-cov: the geometry's covariances, step-major */
    int nscov;
    double geo_decay;     /* --geometry-decay: gift_geometry_update_decay's decay */
    double damping;       /* --damping: the transform's (not the metric's) damping */
    int geo_plain;        /* --geometry-decay-plain: the same decay every round */
    int same_batch;       /* synthetic: sketch the step's own batch instead of fresh ones */
    double decay;         /* synthetic: s_i proportional to i^-decay */
    double outlier_scale; /* synthetic: multiplies the outliers' 20..50x variance */
    long noutliers;       /* synthetic: outlier channels */
    const char *json;
} fid_opts_t;

/* One GIFT geometry under test. */
typedef struct fid_geo {
    int k, ks;
    int is_default, is_full;
    gift_geometry_t g;
    int have_g;
    float *Ysum;        /* din x ks, this round's summed sketch */
    double trsum;       /* this round's summed trace */
    double t_roundtrip; /* relL2 of T^-1(T(G_0)) against G_0 */
    double captured;    /* sum of the top-k lambda over the trace */
} fid_geo_t;

/* One codec under test and its results. */
typedef struct fid_row {
    gift_format_t fmt;
    int gi;       /* -1: Euclidean or Hadamard, else index into the geometries */
    int hadamard; /* 1: the Hadamard treatment (gi == -1) */
    double rel_l2, cosine, whitened, muon, whit_ratio;
    gift_hits_t hits; /* summed over workers */
} fid_row_t;

/* The synthetic layer (see synth_init). */
typedef struct fid_synth {
    int n, din, rows;
    float *V;   /* din x din orthogonal, shared by all workers */
    double *sd; /* din: sqrt of the bulk spectrum s_i */
    int out_ch[FID_MAX_OUTLIERS];
    double out_sd[FID_MAX_OUTLIERS];
    int nout;
    double *row_sd;  /* rows: scale of each output's gradient */
    float *Z;        /* n x din scratch */
    float *X;        /* n x din: one batch of layer inputs */
    float *D;        /* n x rows: one batch of output gradients */
    double bulk_top; /* s_1 over the mean channel variance */
} fid_synth_t;

/* Everything the run holds; allocated once in fid_alloc. */
typedef struct fid_state {
    fid_opts_t o;
    int rows, din, W, n;
    size_t N;      /* rows * din */
    int synthetic; /* 1: synthetic layer; 0: files */
    int have_cov;
    float *G;     /* W x rows x din */
    float *Gtrue; /* rows x din, the true mean */
    float *A;     /* din x din, the mean covariance (metric) */
    float *Aw;    /* W x din x din, per-worker covariances (--cov only) */
    float *Ytmp;  /* din x ksmax */
    float *swork; /* max(n, rows) x ksmax */
    float *P;     /* rows x din, a transformed gradient */
    float *acc;   /* rows x din, the server's accumulator */
    float *Ghat;  /* rows x din, the decoded mean */
    float *twork; /* rows x kmax */
    void *payload;
    size_t cap;
    fid_geo_t geo[FID_MAX_K];
    int ngeo, kdef;
    gift_hadamard_t hd; /* the Hadamard rows' rotation, din columns */
    fid_row_t *row;
    int nrows;
    fid_synth_t s;
    double t_data, t_geometry, t_codecs;
    double fp8_oracle;               /* fp8_oracle_ratio */
    double norm_muon, norm_whitened; /* ||NS5(Gtrue)||, ||Gtrue L||: true_norms */
} fid_state_t;

void bench_fidelity_usage(FILE *f)
{
    fprintf(f,
            "usage: gift-bench fidelity [--rows R] [--cols C] [--workers W] [--tokens N]\n"
            "                           [--grad FILE]... [--cov FILE]... [--sketch-cov FILE]...\n"
            "                           [--seed S] [--refresh N] [--geometry-decay B]\n"
            "                           [--block B] [--sketch-batch fresh|same] [--decay A]\n"
            "                           [--outliers N] [--outlier-scale X] [--json FILE]\n"
            "\n"
            "One simulated step of W workers for one linear layer of R x C (din = C). Each\n"
            "worker's gradient G_w is transformed with the shared T (Euclidean: T = I),\n"
            "encoded, and decoded into a sum in transformed space (gift_decode_acc); the mean\n"
            "is mapped back with T^-1 and compared with the true mean gradient by\n"
            "  relL2     ||Gh - G|| / ||G||\n"
            "  cosine    <G, Gh> / (||G|| ||Gh||)\n"
            "  whitened  gift_metric_whitened with the mean input covariance, damping %g\n"
            "  muon      ||NS5(Gh) - NS5(G)|| / ||NS5(G)|| (gift_metric_muon)\n"
            "  hits      fraction of codes that saturated or flushed to zero, over workers\n"
            "for fp8-e4m3 and nvfp4, each Euclidean, Hadamard (T = D H: random signs and an\n"
            "orthonormal Walsh-Hadamard transform on blocks of the largest power of two\n"
            "dividing C, issue 42) and GIFT at k = 8, 16, 32, 64, 128, 256 (those below\n"
            "din), k = din (full) and the default policy's k\n"
            "(gift_rank_default). 'vs e4m3' is the whitened error over Euclidean\n"
            "fp8-e4m3's. Targets: GIFT fp8-e4m3 at the default k <= %.1fx Euclidean fp8's\n"
            "whitened error; GIFT nvfp4 at full rank below Euclidean fp8's. Only the push\n"
            "leg is quantized (the server's re-encode for the pull is not modelled).\n"
            "Also printed (JSON fp8_oracle_whitened_ratio): what fp8's relative error\n"
            "predicts for GIFT fp8 with the measured step's own covariance as geometry,\n"
            "sqrt(sum_w ||G_w L||^2 / sum_w sum_ij G_w,ij^2 (L^2)_jj), L = (A + dI)^-1/2:\n"
            "a property of the data that no geometry built from other batches beat in\n"
            "our measurements.\n"
            "\n"
            "Geometry, as the server builds it: gift_geometry_init (random basis, seed S),\n"
            "then N refresh rounds, each summing every worker's sketch and trace and\n"
            "calling gift_geometry_update (damping %g, %d columns of oversampling).\n"
            "\n"
            "Data:\n"
            "  --grad FILE   once per worker: raw little-endian f32, R x C row-major.\n"
            "  --cov FILE    optional, once per worker: that worker's input covariance,\n"
            "                C x C f32. Sketches are A_w Q; the metric uses the mean A_w.\n"
            "                Without --cov the sketches are G_w^T G_w Q / R and the\n"
            "                whitened metric uses the mean G_w^T G_w / R (a proxy).\n"
            "  --sketch-cov FILE  optional, once per worker with --cov: the covariance the\n"
            "                geometry is sketched from (C x C f32), e.g. from an earlier\n"
            "                step, as in training where the geometry lags the step it\n"
            "                is used at; --cov then serves the whitened metric only.\n"
            "                Several steps: give W files per step, steps in order (all\n"
            "                workers of the first step, then of the next, ...); each step\n"
            "                is one refresh round, as in training, and --refresh is\n"
            "                ignored. With --geometry-decay B the rounds build giftd's\n"
            "                running average (geometry_decay B): C_n = b C_n-1 + (1 - b) C_new\n"
            "                by gift_geometry_update_decay, b = gift_geometry_decay_at(B, n).\n"
            "  no files      a synthetic layer, a stand-in for a transformer MLP layer that\n"
            "                is not tuned for GIFT: per worker N tokens of inputs\n"
            "                X = Z diag(sqrt(s)) V^T with one shared random orthogonal V,\n"
            "                s_i proportional to i^-1.45 (fitted to the real Llama layer of\n"
            "                bench/README.md; mean channel variance 1), Z Student-t\n"
            "                (%d dof, unit variance); plus %d outlier channels (fixed\n"
            "                coordinates, the 'massive activations' of LLMs) with 20, 30, 40\n"
            "                and 50x the mean channel variance; output gradients D (N x R)\n"
            "                Student-t times a log-normal scale per output row;\n"
            "                G_w = D^T X / N (the exact form of a linear layer's weight\n"
            "                gradient) and A_w = X^T X / N. The geometry's sketches use\n"
            "                fresh batches from the same distribution (earlier steps), not\n"
            "                the batch being measured, unless --sketch-batch same.\n"
            "\n"
            "options:\n"
            "  --rows R          output rows (default 512)\n"
            "  --cols C          input columns, din (default 1024)\n"
            "  --workers W       workers (default 4; with --grad: the number of --grad)\n"
            "  --tokens N        synthetic tokens per worker per batch (default max(2048, 2C))\n"
            "  --seed S          seed of the synthetic layer and the geometry (default 1)\n"
            "  --refresh N       refresh rounds before the step (default 4)\n"
            "  --geometry-decay B  covariance running average across rounds, 0 <= B < 1\n"
            "                    (default 0: each round replaces the estimate); round n\n"
            "                    uses gift_geometry_decay_at(B, n) as giftd does: weights\n"
            "                    B^age normalised over the rounds seen\n"
            "  --geometry-decay-plain  use B itself every round instead (a plain running\n"
            "                    average: the first round keeps weight B^n)\n"
            "  --block B         fp8 block size (default %d)\n"
            "  --damping D       the geometry's damping (default %g, giftd's); the whitened\n"
            "                    metric keeps %g whatever D is\n"
            "  --sketch-batch M  synthetic only: 'fresh' (default) or 'same' batch for sketches\n"
            "  --decay A         synthetic only: bulk spectrum s_i ~ i^-A (default 1.45)\n"
            "  --outliers N      synthetic only: outlier channels (default %d)\n"
            "  --outlier-scale X synthetic only: multiplies their 20-50x variance (default 1)\n"
            "                    These three are for sensitivity studies; the defaults are the\n"
            "                    stand-in described above and are not tuned for GIFT.\n"
            "  --json FILE       write results here (default %s/fidelity.json)\n"
            "  --help            this text\n"
            "\n"
            "BLAS runs on one thread. The exit status is 0 when the run completes, whether or\n"
            "not the targets pass.\n",
            GIFT_DAMPING_DEFAULT, FID_TARGET_FP8, GIFT_DAMPING_DEFAULT, GIFT_OVERSAMPLE_DEFAULT,
            FID_STUDENT_NU, FID_OUTLIERS_DEFAULT, GIFT_FP8_BLOCK_DEFAULT, GIFT_DAMPING_DEFAULT,
            GIFT_DAMPING_DEFAULT, FID_OUTLIERS_DEFAULT, BENCH_OUT_DIR);
}

static int parse_opts(int argc, char **argv, fid_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->rows = 512;
    o->cols = 1024;
    o->workers = 4;
    o->refresh = 4;
    o->block = GIFT_FP8_BLOCK_DEFAULT;
    o->seed = 1;
    o->decay = FID_DECAY_DEFAULT;
    o->damping = GIFT_DAMPING_DEFAULT;
    o->outlier_scale = 1.0;
    o->noutliers = FID_OUTLIERS_DEFAULT;
    o->json = BENCH_OUT_DIR "/fidelity.json";
    const bench_opt_t opts[] = {
        BENCH_LONG("--rows", &o->rows, 1, 1 << 20),
        BENCH_LONG("--cols", &o->cols, 2, 1 << 15),
        BENCH_LONG_SET("--workers", &o->workers, 1, FID_MAX_WORKERS, &o->workers_set),
        BENCH_LONG_SET("--tokens", &o->tokens, 1, 1 << 22, &o->tokens_set),
        BENCH_LONG("--refresh", &o->refresh, 1, 1000),
        BENCH_LONG("--block", &o->block, 32, 1 << 20),
        BENCH_U64("--seed", &o->seed),
        BENCH_FLAG("--geometry-decay-plain", &o->geo_plain),
        BENCH_DOUBLE("--damping", &o->damping, 1e-6, 10.0),
        BENCH_DOUBLE("--geometry-decay", &o->geo_decay, 0.0, 0.999999),
        BENCH_DOUBLE("--decay", &o->decay, 0.0, 4.0),
        BENCH_DOUBLE("--outlier-scale", &o->outlier_scale, 0.0, 1e6),
        BENCH_LONG("--outliers", &o->noutliers, 0, FID_MAX_OUTLIERS),
        BENCH_STR("--json", &o->json, "a file name", 0),
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
            bench_fidelity_usage(stdout);
            return 1;
        } else if (strcmp(a, "--grad") == 0 || strcmp(a, "--cov") == 0 ||
                   strcmp(a, "--sketch-cov") == 0) {
            int is_grad = a[2] == 'g', is_scov = a[2] == 's';
            int *cnt = is_grad ? &o->ngrad : is_scov ? &o->nscov : &o->ncov;
            int max = is_scov ? FID_MAX_SCOV : FID_MAX_WORKERS;

            if (v == NULL) {
                fprintf(stderr, "gift-bench: %s needs a file name\n", a);
                return -1;
            }
            if (*cnt >= max) {
                fprintf(stderr, "gift-bench: at most %d %s files\n", max, a);
                return -1;
            }
            (is_grad ? o->grad : is_scov ? o->scov : o->cov)[(*cnt)++] = v;
            i++;
        } else if (strcmp(a, "--sketch-batch") == 0) {
            if (v != NULL && strcmp(v, "fresh") == 0)
                o->same_batch = 0;
            else if (v != NULL && strcmp(v, "same") == 0)
                o->same_batch = 1;
            else {
                fprintf(stderr, "gift-bench: --sketch-batch needs 'fresh' or 'same'\n");
                return -1;
            }
            i++;
        } else {
            fprintf(stderr, "gift-bench fidelity: unknown option '%s' (see --help)\n", a);
            return -1;
        }
    }
    if (o->nscov > 0 && (o->ncov == 0 || o->nscov % o->ncov != 0)) {
        fprintf(stderr,
                "gift-bench: %d --sketch-cov files for %d --cov files; give one per worker "
                "and sketch step\n",
                o->nscov, o->ncov);
        return -1;
    }
    if (o->ncov > 0 && o->ngrad == 0) {
        fprintf(stderr, "gift-bench: --cov needs --grad (one of each per worker)\n");
        return -1;
    }
    if (o->ncov > 0 && o->ncov != o->ngrad) {
        fprintf(stderr, "gift-bench: %d --cov files for %d --grad files; give one per worker\n",
                o->ncov, o->ngrad);
        return -1;
    }
    if (o->ngrad > 0) {
        if (o->workers_set && o->workers != o->ngrad) {
            fprintf(stderr, "gift-bench: --workers %ld but %d --grad files (one per worker)\n",
                    o->workers, o->ngrad);
            return -1;
        }
        o->workers = o->ngrad;
        if (o->tokens_set)
            fprintf(stderr, "gift-bench: note: --tokens is ignored with --grad\n");
        if (o->same_batch)
            fprintf(stderr, "gift-bench: note: --sketch-batch is ignored with --grad\n");
    }
    if (!o->tokens_set)
        o->tokens = o->cols * 2 > 2048 ? o->cols * 2 : 2048;
    if ((o->block & (o->block - 1)) != 0) {
        fprintf(stderr, "gift-bench: --block %ld is not a power of two\n", o->block);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ file data */

static int host_is_little_endian(void)
{
    const uint16_t one = 1;

    return *(const uint8_t *)&one == 1;
}

/* Reads count little-endian f32 from path into buf, checking the size and
 * that every value is finite. what/shape name the file in messages.
 * Returns 0 or -1 (reported). */
static int read_f32_file(const char *path, const char *what, const char *shape, size_t count,
                         float *buf)
{
    struct stat st;
    FILE *f;
    size_t got;

    if (stat(path, &st) != 0) {
        fprintf(stderr, "gift-bench: %s %s: %s\n", what, path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode) || (unsigned long long)st.st_size != 4ull * count) {
        fprintf(stderr,
                "gift-bench: %s %s: %lld bytes, expected %zu (%s f32, row-major);"
                " check --rows/--cols\n",
                what, path, (long long)st.st_size, 4 * count, shape);
        return -1;
    }
    if ((f = fopen(path, "rb")) == NULL) {
        fprintf(stderr, "gift-bench: %s %s: %s\n", what, path, strerror(errno));
        return -1;
    }
    got = fread(buf, sizeof(float), count, f);
    fclose(f);
    if (got != count) {
        fprintf(stderr, "gift-bench: %s %s: short read (%zu of %zu values)\n", what, path, got,
                count);
        return -1;
    }
    if (!host_is_little_endian()) {
        uint8_t *b = (uint8_t *)buf;

        for (size_t i = 0; i < count; i++) {
            uint8_t t0 = b[4 * i], t1 = b[4 * i + 1];

            b[4 * i] = b[4 * i + 3];
            b[4 * i + 1] = b[4 * i + 2];
            b[4 * i + 2] = t1;
            b[4 * i + 3] = t0;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(buf[i])) {
            fprintf(stderr, "gift-bench: %s %s: value %zu is not finite (%g)\n", what, path, i,
                    (double)buf[i]);
            return -1;
        }
    }
    return 0;
}

/* -------------------------------------------------------- synthetic data */

/*
 * The synthetic layer. It is meant to be a fair stand-in for one linear
 * layer of a transformer MLP, not a case built for GIFT:
 *
 *  - Layer inputs x (din) with covariance V diag(s) V^T, s_i proportional to
 *    i^-FID_DECAY_DEFAULT. The exponent is fitted to the one real layer we
 *    hold figures for (bench/README.md: a 256x688 Llama MLP
 *    down-projection whose full-rank GIFT-FP8 whitened error was 0.25x
 *    Euclidean; for a power law that ratio sits at the bound
 *    din / sqrt(tr A tr (A + delta I)^-1), which is 0.25 at din 688 for an
 *    exponent of 1.45 and 0.54 for 1). V is a
 *    random rotation, so the bulk is not aligned with the coordinates that
 *    the block scales see.
 *  - FID_OUTLIERS_DEFAULT fixed input channels with 20-50x the mean channel
 *    variance, aligned with coordinates as the "massive activations" of
 *    LLMs are. Such outliers hurt Euclidean block scaling and are real.
 *  - Heavy tails: every latent factor and every output gradient is
 *    Student-t with 5 degrees of freedom (unit variance).
 *  - Output gradients independent of the inputs (K-FAC's own assumption),
 *    with a log-normal scale per output row, shared by the workers.
 *  - G_w = D_w^T X_w / n is exactly a linear layer's weight gradient over
 *    the worker's n tokens; A_w = X_w^T X_w / n its K-FAC input factor.
 *    Workers share the distribution, not the tokens, so the mean gradient
 *    is noise-dominated, as at modest per-worker batch sizes.
 *  - The geometry is sketched from other batches of the same distribution
 *    (earlier steps), so it is an estimate, as in training.
 */
static int synth_init(fid_synth_t *s, const fid_opts_t *o)
{
    bench_rng_t r;
    float *tau = NULL;
    double h = 0.0;
    int din = s->din, info, rc = -1;

    /* Random orthogonal V: QR of a Gaussian matrix. */
    bench_rng_seed(&r, o->seed, STREAM_V);
    for (size_t i = 0; i < (size_t)din * din; i++)
        s->V[i] = (float)bench_rng_normal(&r);
    if ((tau = malloc((size_t)din * sizeof(float))) == NULL) {
        fprintf(stderr, "gift-bench: out of memory\n");
        goto out;
    }
    if ((info = LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, din, din, s->V, din, tau)) != 0 ||
        (info = LAPACKE_sorgqr(LAPACK_ROW_MAJOR, din, din, din, s->V, din, tau)) != 0) {
        fprintf(stderr, "gift-bench: QR for the random rotation failed (info %d)\n", info);
        goto out_free;
    }
    /* Bulk spectrum s_i = c i^-decay with mean 1. */
    for (int i = 0; i < din; i++)
        h += pow(i + 1.0, -o->decay);
    for (int i = 0; i < din; i++)
        s->sd[i] = sqrt((double)din / h * pow(i + 1.0, -o->decay));
    s->bulk_top = (double)din / h;
    /* Outlier channels: distinct, random, 20..50x the mean channel variance
     * (times --outlier-scale). */
    bench_rng_seed(&r, o->seed, STREAM_OUTLIERS);
    s->nout = din < o->noutliers ? din : (int)o->noutliers;
    for (int j = 0; j < s->nout; j++) {
        int c, dup;

        do {
            c = (int)(bench_rng_u64(&r) % (uint64_t)din);
            dup = 0;
            for (int i = 0; i < j; i++)
                dup |= s->out_ch[i] == c;
        } while (dup);
        s->out_ch[j] = c;
        s->out_sd[j] =
            sqrt(o->outlier_scale * (s->nout > 1 ? 20.0 + 30.0 * j / (s->nout - 1) : 35.0));
    }
    bench_rng_seed(&r, o->seed, STREAM_ROWSCALE);
    for (int i = 0; i < s->rows; i++)
        s->row_sd[i] = exp(0.5 * bench_rng_normal(&r));
    rc = 0;
out_free:
    free(tau);
out:
    return rc;
}

/* One batch of n layer inputs into s->X, fixed by (seed, stream). */
static void synth_inputs(fid_synth_t *s, uint64_t seed, uint64_t stream)
{
    bench_rng_t r;
    int n = s->n, din = s->din;

    bench_rng_seed(&r, seed, stream);
    for (int t = 0; t < n; t++) {
        float *z = s->Z + (size_t)t * din;

        for (int i = 0; i < din; i++)
            z[i] = (float)(s->sd[i] * bench_rng_student_unit(&r, FID_STUDENT_NU));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, din, din, 1.0f, s->Z, din, s->V, din,
                0.0f, s->X, din);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < s->nout; j++)
            s->X[(size_t)t * din + s->out_ch[j]] +=
                (float)(s->out_sd[j] * bench_rng_student_unit(&r, FID_STUDENT_NU));
}

/* One batch of n output gradients into s->D (n x rows). */
static void synth_deltas(fid_synth_t *s, uint64_t seed, uint64_t stream)
{
    bench_rng_t r;

    bench_rng_seed(&r, seed, stream);
    for (int t = 0; t < s->n; t++)
        for (int i = 0; i < s->rows; i++)
            s->D[(size_t)t * s->rows + i] =
                (float)(s->row_sd[i] * bench_rng_student_unit(&r, FID_STUDENT_NU));
}

/* ---------------------------------------------------------------- setup */

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* The ranks under test: fid_k_base below din, din itself, and the default. */
static void choose_ranks(fid_state_t *st)
{
    int ks[FID_MAX_K], nk = 0;

    st->kdef = gift_rank_default(st->rows, st->din);
    for (size_t i = 0; i < sizeof(fid_k_base) / sizeof(fid_k_base[0]); i++)
        if (fid_k_base[i] < st->din)
            ks[nk++] = fid_k_base[i];
    ks[nk++] = st->din;
    if (st->kdef >= 1 && st->kdef <= st->din)
        ks[nk++] = st->kdef;
    qsort(ks, (size_t)nk, sizeof(int), cmp_int);
    st->ngeo = 0;
    for (int i = 0; i < nk; i++) {
        fid_geo_t *g;

        if (i > 0 && ks[i] == ks[i - 1])
            continue;
        g = &st->geo[st->ngeo++];
        g->k = ks[i];
        g->ks = gift_basis_cols(st->din, ks[i], GIFT_OVERSAMPLE_DEFAULT);
        g->is_full = ks[i] == st->din;
        g->is_default = ks[i] == st->kdef;
    }
}

/* Allocates every buffer of the run. Returns 0 or -1 (reported). */
static int fid_alloc(fid_state_t *st)
{
    size_t din = (size_t)st->din, rows = (size_t)st->rows, W = (size_t)st->W;
    size_t n = st->synthetic ? (size_t)st->n : 0;
    int ksmax = 0, kmax = 0, rc;
    gift_codec_params_t p;
    gift_layout_t lay;

    for (int i = 0; i < st->ngeo; i++) {
        ksmax = st->geo[i].ks > ksmax ? st->geo[i].ks : ksmax;
        kmax = st->geo[i].k > kmax ? st->geo[i].k : kmax;
    }
    st->cap = 0;
    for (int f = 0; f < 2; f++) {
        memset(&p, 0, sizeof(p));
        p.fmt = f == 0 ? GIFT_FMT_E4M3 : GIFT_FMT_NVFP4;
        p.block = (uint32_t)st->o.block;
        if ((rc = gift_layout(&p, st->N, &lay)) < 0) {
            fprintf(stderr, "gift-bench: gift_layout(%s, block %ld): %s\n", gift_format_name(p.fmt),
                    st->o.block, gift_strerror(rc));
            return -1;
        }
        st->cap = lay.total > st->cap ? lay.total : st->cap;
    }
    st->G = bench_alloc(W * st->N * sizeof(float));
    st->Gtrue = bench_alloc(st->N * sizeof(float));
    st->A = bench_alloc(din * din * sizeof(float));
    st->Ytmp = bench_alloc(din * (size_t)ksmax * sizeof(float));
    st->swork = bench_alloc((n > rows ? n : rows) * (size_t)ksmax * sizeof(float));
    st->P = bench_alloc(st->N * sizeof(float));
    st->acc = bench_alloc(st->N * sizeof(float));
    st->Ghat = bench_alloc(st->N * sizeof(float));
    st->twork = bench_alloc(rows * (size_t)kmax * sizeof(float));
    st->payload = bench_alloc(st->cap);
    st->nrows = 2 * (2 + st->ngeo); /* per format: Euclidean, Hadamard, the geometries */
    st->row = calloc((size_t)st->nrows, sizeof(*st->row));
    if (!st->G || !st->Gtrue || !st->A || !st->Ytmp || !st->swork || !st->P || !st->acc ||
        !st->Ghat || !st->twork || !st->payload || !st->row ||
        gift_hadamard_init(&st->hd, (uint32_t)st->din,
                           gift_hadamard_seed("gift-bench fidelity", (uint32_t)st->o.seed, 0)) < 0)
        goto nomem;
    if (st->have_cov && (st->Aw = bench_alloc(W * din * din * sizeof(float))) == NULL)
        goto nomem;
    if (st->synthetic) {
        fid_synth_t *s = &st->s;

        s->n = st->n;
        s->din = st->din;
        s->rows = st->rows;
        s->V = bench_alloc(din * din * sizeof(float));
        s->sd = bench_alloc(din * sizeof(double));
        s->row_sd = bench_alloc(rows * sizeof(double));
        s->Z = bench_alloc(n * din * sizeof(float));
        s->X = bench_alloc(n * din * sizeof(float));
        s->D = bench_alloc(n * rows * sizeof(float));
        if (!s->V || !s->sd || !s->row_sd || !s->Z || !s->X || !s->D)
            goto nomem;
    }
    for (int i = 0; i < st->ngeo; i++) {
        fid_geo_t *g = &st->geo[i];

        if ((rc = gift_geometry_init(&g->g, st->din, g->k, g->ks, st->o.seed)) < 0) {
            fprintf(stderr, "gift-bench: gift_geometry_init(din %d, k %d, ks %d): %s\n", st->din,
                    g->k, g->ks, gift_strerror(rc));
            return -1;
        }
        g->have_g = 1;
        if ((g->Ysum = bench_alloc(din * (size_t)g->ks * sizeof(float))) == NULL)
            goto nomem;
    }
    return 0;
nomem:
    fprintf(stderr, "gift-bench: out of memory\n");
    return -1;
}

static void fid_free(fid_state_t *st)
{
    for (int i = 0; i < st->ngeo; i++) {
        if (st->geo[i].have_g)
            gift_geometry_free(&st->geo[i].g);
        free(st->geo[i].Ysum);
    }
    free(st->s.D);
    free(st->s.X);
    free(st->s.Z);
    free(st->s.row_sd);
    free(st->s.sd);
    free(st->s.V);
    free(st->row);
    gift_hadamard_free(&st->hd);
    free(st->payload);
    free(st->twork);
    free(st->Ghat);
    free(st->acc);
    free(st->P);
    free(st->swork);
    free(st->Ytmp);
    free(st->Aw);
    free(st->A);
    free(st->Gtrue);
    free(st->G);
}

/* ---------------------------------------------------------------- step */

/* Fills G (per worker), Gtrue and A. Returns 0 or -1 (reported). */
static int load_step(fid_state_t *st)
{
    size_t din = (size_t)st->din, N = st->N;
    char shape[64];

    memset(st->A, 0, din * din * sizeof(float));
    if (st->synthetic) {
        fid_synth_t *s = &st->s;

        if (synth_init(s, &st->o) < 0)
            return -1;
        for (int w = 0; w < st->W; w++) {
            synth_inputs(s, st->o.seed, STREAM_STEP_X + (uint64_t)w);
            synth_deltas(s, st->o.seed, STREAM_STEP_DELTA + (uint64_t)w);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, st->rows, st->din, st->n,
                        1.0f / (float)st->n, s->D, st->rows, s->X, st->din, 0.0f,
                        st->G + (size_t)w * N, st->din);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, st->din, st->din, st->n,
                        1.0f / ((float)st->n * (float)st->W), s->X, st->din, s->X, st->din, 1.0f,
                        st->A, st->din);
        }
    } else {
        for (int w = 0; w < st->W; w++) {
            snprintf(shape, sizeof(shape), "%d x %d", st->rows, st->din);
            if (read_f32_file(st->o.grad[w], "--grad", shape, N, st->G + (size_t)w * N) < 0)
                return -1;
        }
        if (st->have_cov) {
            snprintf(shape, sizeof(shape), "%d x %d", st->din, st->din);
            for (int w = 0; w < st->W; w++) {
                float *Aw = st->Aw + (size_t)w * din * din;

                if (read_f32_file(st->o.cov[w], "--cov", shape, din * din, Aw) < 0)
                    return -1;
                for (size_t i = 0; i < din * din; i++)
                    st->A[i] += Aw[i] / (float)st->W;
            }
            /* The geometry's own covariances (--sketch-cov) are read per round
             * by build_geometries, after A is complete. */
        } else {
            /* Proxy geometry for the metric: the mean G_w^T G_w / rows. */
            for (int w = 0; w < st->W; w++)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, st->din, st->din, st->rows,
                            1.0f / ((float)st->rows * (float)st->W), st->G + (size_t)w * N, st->din,
                            st->G + (size_t)w * N, st->din, 1.0f, st->A, st->din);
        }
    }
    for (size_t i = 0; i < N; i++) {
        double sum = 0.0;

        for (int w = 0; w < st->W; w++)
            sum += st->G[(size_t)w * N + i];
        st->Gtrue[i] = (float)(sum / st->W);
    }
    return 0;
}

/* Adds worker w's sketch against every geometry's basis to its Ysum.
 * Synthetic: the inputs in s->X. Files: A_w Q, or G_w^T G_w Q / rows. */
static int sketch_worker(fid_state_t *st, int w)
{
    size_t din = (size_t)st->din;
    int rc;

    for (int i = 0; i < st->ngeo; i++) {
        fid_geo_t *g = &st->geo[i];
        size_t m = din * (size_t)g->ks;
        double tr = 0.0;

        if (st->synthetic) {
            rc = gift_sketch(st->s.X, st->n, st->din, g->g.U, g->ks, st->Ytmp, &tr, st->swork);
        } else if (st->have_cov) {
            const float *Aw = st->Aw + (size_t)w * din * din;

            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, st->din, g->ks, st->din, 1.0f,
                        Aw, st->din, g->g.U, g->ks, 0.0f, st->Ytmp, g->ks);
            for (size_t j = 0; j < din; j++)
                tr += Aw[j * din + j];
            rc = 0;
        } else {
            rc = gift_sketch(st->G + (size_t)w * st->N, st->rows, st->din, g->g.U, g->ks, st->Ytmp,
                             &tr, st->swork);
        }
        if (rc < 0) {
            fprintf(stderr, "gift-bench: gift_sketch (worker %d, k %d): %s\n", w, g->k,
                    gift_strerror(rc));
            return -1;
        }
        for (size_t j = 0; j < m; j++)
            g->Ysum[j] += st->Ytmp[j];
        g->trsum += tr;
    }
    return 0;
}

/* Sketch rounds: one per --sketch-cov step when there are several, else --refresh. */
static long sketch_rounds(const fid_state_t *st)
{
    long steps = st->o.ncov > 0 ? st->o.nscov / st->o.ncov : 0;

    return steps > 1 ? steps : st->o.refresh;
}

/* Reads the --sketch-cov files of one sketch step into Aw. Returns 0 or -1. */
static int load_sketch_step(fid_state_t *st, long step)
{
    size_t din = (size_t)st->din;
    char shape[64];

    snprintf(shape, sizeof(shape), "%d x %d", st->din, st->din);
    for (int w = 0; w < st->W; w++)
        if (read_f32_file(st->o.scov[step * st->W + w], "--sketch-cov", shape, din * din,
                          st->Aw + (size_t)w * din * din) < 0)
            return -1;
    return 0;
}

/* Runs the refresh rounds for every geometry, each through
 * gift_geometry_update_decay with --geometry-decay, as giftd's owner does.
 * Returns 0 or -1 (reported). */
static int build_geometries(fid_state_t *st)
{
    size_t din = (size_t)st->din;
    long rounds = sketch_rounds(st), steps = st->o.ncov > 0 ? st->o.nscov / st->o.ncov : 0;
    int rc;

    for (long round = 0; round < rounds; round++) {
        if (steps > 0 && (round == 0 || steps > 1) &&
            load_sketch_step(st, steps > 1 ? round : 0) < 0)
            return -1;
        for (int i = 0; i < st->ngeo; i++) {
            memset(st->geo[i].Ysum, 0, din * (size_t)st->geo[i].ks * sizeof(float));
            st->geo[i].trsum = 0.0;
        }
        for (int w = 0; w < st->W; w++) {
            if (st->synthetic) {
                uint64_t stream = st->o.same_batch ? STREAM_STEP_X + (uint64_t)w
                                                   : STREAM_SKETCH_X + (uint64_t)round * st->W + w;
                synth_inputs(&st->s, st->o.seed, stream);
            }
            if (sketch_worker(st, w) < 0)
                return -1;
        }
        for (int i = 0; i < st->ngeo; i++) {
            fid_geo_t *g = &st->geo[i];

            double b = st->o.geo_plain ? st->o.geo_decay
                                       : gift_geometry_decay_at(st->o.geo_decay, g->g.epoch);

            if ((rc = gift_geometry_update_decay(&g->g, g->Ysum, g->trsum, st->o.damping, b)) < 0) {
                fprintf(stderr, "gift-bench: gift_geometry_update (k %d, round %ld): %s\n", g->k,
                        round + 1, gift_strerror(rc));
                return -1;
            }
        }
    }
    return 0;
}

static double rel_l2_local(const float *ref, const float *x, size_t n)
{
    double num = 0.0, den = 0.0;

    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Geometry diagnostics: T^-1(T(G_0)) against G_0, and the captured trace. */
static int check_geometries(fid_state_t *st)
{
    int rc;

    for (int i = 0; i < st->ngeo; i++) {
        fid_geo_t *g = &st->geo[i];
        double top = 0.0;

        if ((rc = gift_transform(&g->g, 0, st->G, st->rows, st->P, st->twork)) < 0 ||
            (rc = gift_transform(&g->g, 1, st->P, st->rows, st->Ghat, st->twork)) < 0) {
            fprintf(stderr, "gift-bench: gift_transform (k %d): %s\n", g->k, gift_strerror(rc));
            return -1;
        }
        g->t_roundtrip = rel_l2_local(st->G, st->Ghat, st->N);
        for (int j = 0; j < g->g.k; j++)
            top += g->g.lambda[j];
        g->captured = g->g.trace > 0.0 ? top / g->g.trace : NAN;
        if (g->g.identity)
            fprintf(stderr, "gift-bench: warning: geometry k=%d is still the identity (epoch %u)\n",
                    g->k, g->g.epoch);
        if (!(g->t_roundtrip < 1e-3))
            fprintf(stderr, "gift-bench: warning: k=%d: T^-1(T(G)) differs from G by relL2 %.3g\n",
                    g->k, g->t_roundtrip);
    }
    return 0;
}

/* Pushes every worker's gradient through one codec and measures the mean.
 * Returns 0 or -1 (reported). */
static int run_codec(fid_state_t *st, fid_row_t *r)
{
    gift_geometry_t *g = r->gi >= 0 ? &st->geo[r->gi].g : NULL;
    gift_codec_params_t p;
    gift_layout_t lay;
    const char *fname = gift_format_name(r->fmt);
    double v;
    int rc;

    memset(&p, 0, sizeof(p));
    p.fmt = r->fmt;
    p.block = (uint32_t)st->o.block;
    if ((rc = gift_layout(&p, st->N, &lay)) < 0) {
        fprintf(stderr, "gift-bench: gift_layout(%s): %s\n", fname, gift_strerror(rc));
        return -1;
    }
    memset(st->acc, 0, st->N * sizeof(float));
    memset(&r->hits, 0, sizeof(r->hits));
    for (int w = 0; w < st->W; w++) {
        const float *src = st->G + (size_t)w * st->N;
        gift_hits_t h;

        if (g != NULL) {
            if ((rc = gift_transform(g, 0, src, st->rows, st->P, st->twork)) < 0) {
                fprintf(stderr, "gift-bench: gift_transform: %s\n", gift_strerror(rc));
                return -1;
            }
            src = st->P;
        } else if (r->hadamard) {
            if ((rc = gift_hadamard_apply(&st->hd, 0, src, (size_t)st->rows, st->P)) < 0) {
                fprintf(stderr, "gift-bench: gift_hadamard_apply: %s\n", gift_strerror(rc));
                return -1;
            }
            src = st->P;
        }
        if ((rc = gift_encode(&p, src, st->N, st->payload, st->cap)) < 0) {
            fprintf(stderr, "gift-bench: gift_encode(%s, worker %d): %s\n", fname, w,
                    gift_strerror(rc));
            return -1;
        }
        if ((rc = gift_boundary_hits(&p, src, st->payload, lay.total, st->N, &h)) < 0) {
            fprintf(stderr, "gift-bench: gift_boundary_hits(%s): %s\n", fname, gift_strerror(rc));
            return -1;
        }
        r->hits.saturated += h.saturated;
        r->hits.flushed += h.flushed;
        r->hits.n += h.n;
        if ((rc = gift_decode_acc(&p, st->payload, lay.total, st->N, st->acc)) < 0) {
            fprintf(stderr, "gift-bench: gift_decode_acc(%s, worker %d): %s\n", fname, w,
                    gift_strerror(rc));
            return -1;
        }
    }
    for (size_t i = 0; i < st->N; i++)
        st->acc[i] /= (float)st->W;
    if (g != NULL) {
        if ((rc = gift_transform(g, 1, st->acc, st->rows, st->Ghat, st->twork)) < 0) {
            fprintf(stderr, "gift-bench: gift_transform (inverse): %s\n", gift_strerror(rc));
            return -1;
        }
    } else if (r->hadamard) {
        if ((rc = gift_hadamard_apply(&st->hd, 1, st->acc, (size_t)st->rows, st->Ghat)) < 0) {
            fprintf(stderr, "gift-bench: gift_hadamard_apply (inverse): %s\n", gift_strerror(rc));
            return -1;
        }
    } else {
        memcpy(st->Ghat, st->acc, st->N * sizeof(float));
    }
    r->rel_l2 = gift_metric_rel_l2(st->Gtrue, st->Ghat, st->N);
    r->cosine = gift_metric_cosine(st->Gtrue, st->Ghat, st->N);
    v = gift_metric_whitened(st->Gtrue, st->Ghat, st->rows, st->din, st->A, GIFT_DAMPING_DEFAULT);
    if (v < 0.0) {
        fprintf(stderr, "gift-bench: gift_metric_whitened: %s\n", gift_strerror((int)v));
        return -1;
    }
    r->whitened = v;
    v = gift_metric_muon(st->Gtrue, st->Ghat, st->rows, st->din);
    if (v < 0.0) {
        fprintf(stderr, "gift-bench: gift_metric_muon: %s\n", gift_strerror((int)v));
        return -1;
    }
    r->muon = v;
    return 0;
}

/* Data-only figures: what fp8's relative error predicts for GIFT fp8 with the
 * measured step's own covariance as geometry (gift_metric_fp8_oracle), and the
 * true mean's size in the two metrics, ||NS5(Gtrue)|| and ||Gtrue L||, so that
 * layers can be weighed against each other (bench/convergence_report.py).
 * Returns 0 or -1 (reported). */
static int data_figures(fid_state_t *st)
{
    double *ns = malloc(st->N * sizeof(double)), s = 0.0;
    int rc;

    if (ns == NULL) {
        fprintf(stderr, "gift-bench: out of memory\n");
        return -1;
    }
    if ((rc = gift_ns5(st->Gtrue, st->rows, st->din, ns)) < 0) {
        free(ns);
        fprintf(stderr, "gift-bench: gift_ns5: %s\n", gift_strerror(rc));
        return -1;
    }
    for (size_t i = 0; i < st->N; i++)
        s += ns[i] * ns[i];
    free(ns);
    st->norm_muon = sqrt(s);
    st->fp8_oracle =
        gift_metric_fp8_oracle(st->G, st->W, st->rows, st->din, st->A, GIFT_DAMPING_DEFAULT);
    st->norm_whitened =
        gift_metric_whitened_norm(st->Gtrue, st->rows, st->din, st->A, GIFT_DAMPING_DEFAULT);
    if (st->fp8_oracle < 0.0 || st->norm_whitened < 0.0) {
        fprintf(stderr, "gift-bench: fp8 oracle / whitened norm: %s\n",
                gift_strerror((int)(st->fp8_oracle < 0.0 ? st->fp8_oracle : st->norm_whitened)));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- output */

static void row_label(const fid_state_t *st, const fid_row_t *r, char *buf, size_t cap)
{
    const fid_geo_t *g;

    if (r->hadamard) {
        snprintf(buf, cap, "hadamard b=%u", st->hd.block);
        return;
    }
    if (r->gi < 0) {
        snprintf(buf, cap, "euclidean");
        return;
    }
    g = &st->geo[r->gi];
    snprintf(buf, cap, "gift k=%d%s", g->k,
             g->is_full && g->is_default ? " (full, default)"
             : g->is_full                ? " (full)"
             : g->is_default             ? " (default)"
                                         : "");
}

static double hits_frac(const gift_hits_t *h)
{
    return h->n ? (double)(h->saturated + h->flushed) / (double)h->n : NAN;
}

/* Index of the row for (fmt, predicate on geometry), or -1. */
static int find_row(const fid_state_t *st, gift_format_t fmt, int want_default, int want_full)
{
    for (int i = 0; i < st->nrows; i++) {
        const fid_row_t *r = &st->row[i];

        if (r->fmt != fmt)
            continue;
        if (!want_default && !want_full && r->gi < 0 && !r->hadamard)
            return i;
        if (r->gi >= 0 &&
            ((want_default && st->geo[r->gi].is_default) || (want_full && st->geo[r->gi].is_full)))
            return i;
    }
    return -1;
}

static int write_json(const fid_state_t *st, double wall, const char *date, const char *cpu,
                      int t1_pass, int t2_pass, double t1_ratio, double t2_ratio)
{
    const fid_opts_t *o = &st->o;
    bench_json_t j;
    FILE *f;

    if ((f = bench_json_begin(&j, o->json, "fidelity", "codec_version", GIFT_CODEC_VERSION,
                              date)) == NULL)
        return -1;
    bench_json_str(&j, "cpu", cpu);
    bench_json_str(&j, "simd", gift_simd_name(gift_simd_active()));
    bench_json_str(&j, "data", st->synthetic ? "synthetic" : st->have_cov ? "files+cov" : "files");
    bench_json_int(&j, "layer_rows", st->rows); /* "rows" is the results array */
    bench_json_int(&j, "cols", st->din);
    bench_json_int(&j, "workers", st->W);
    bench_json_int(&j, "seed", (long long)o->seed);
    bench_json_int(&j, "refresh", o->refresh);
    bench_json_int(&j, "sketch_rounds", sketch_rounds(st));
    bench_json_num(&j, "geometry_decay", o->geo_decay);
    bench_json_bool(&j, "geometry_decay_plain", o->geo_plain);
    bench_json_int(&j, "fp8_block", o->block);
    bench_json_num(&j, "damping", o->damping);
    bench_json_num(&j, "metric_damping", GIFT_DAMPING_DEFAULT);
    bench_json_int(&j, "oversample", GIFT_OVERSAMPLE_DEFAULT);
    bench_json_int(&j, "k_default", st->kdef);
    bench_json_arr(&j, "k_list");
    for (int i = 0; i < st->ngeo; i++)
        bench_json_int(&j, NULL, st->geo[i].k);
    bench_json_arr_end(&j);
    if (st->synthetic) {
        bench_json_obj(&j, "synthetic");
        bench_json_int(&j, "tokens_per_worker", st->n);
        bench_json_str(&j, "spectrum",
                       "s_i = c i^-decay, mean channel variance 1, random rotation");
        bench_json_num(&j, "decay", o->decay);
        bench_json_num(&j, "outlier_scale", o->outlier_scale);
        bench_json_num(&j, "bulk_top_over_mean", st->s.bulk_top);
        bench_json_int(&j, "student_t_dof", FID_STUDENT_NU);
        bench_json_arr(&j, "outlier_channels");
        for (int i = 0; i < st->s.nout; i++)
            bench_json_int(&j, NULL, st->s.out_ch[i]);
        bench_json_arr_end(&j);
        bench_json_arr(&j, "outlier_variance_over_mean");
        for (int i = 0; i < st->s.nout; i++)
            bench_json_num(&j, NULL, st->s.out_sd[i] * st->s.out_sd[i]);
        bench_json_arr_end(&j);
        bench_json_str(&j, "sketch_batch", o->same_batch ? "same" : "fresh");
        bench_json_obj_end(&j);
    } else {
        bench_json_arr(&j, "grad_files");
        for (int i = 0; i < o->ngrad; i++)
            bench_json_str(&j, NULL, o->grad[i]);
        bench_json_arr_end(&j);
        bench_json_arr(&j, "cov_files");
        for (int i = 0; i < o->ncov; i++)
            bench_json_str(&j, NULL, o->cov[i]);
        bench_json_arr_end(&j);
        bench_json_arr(&j, "sketch_cov_files");
        for (int i = 0; i < o->nscov; i++)
            bench_json_str(&j, NULL, o->scov[i]);
        bench_json_arr_end(&j);
    }
    bench_json_arr(&j, "geometries");
    for (int i = 0; i < st->ngeo; i++) {
        const fid_geo_t *g = &st->geo[i];

        bench_json_obj(&j, NULL);
        bench_json_int(&j, "k", g->k);
        bench_json_int(&j, "ks", g->ks);
        bench_json_bool(&j, "default", g->is_default);
        bench_json_bool(&j, "full", g->is_full);
        bench_json_int(&j, "epoch", g->g.epoch);
        bench_json_bool(&j, "identity", g->g.identity);
        bench_json_num(&j, "trace", g->g.trace);
        bench_json_num(&j, "sigma2", g->g.sigma2);
        bench_json_num(&j, "delta", g->g.delta);
        bench_json_num(&j, "c", g->g.c);
        bench_json_num(&j, "lambda_1", g->g.lambda[0]);
        bench_json_num(&j, "lambda_k", g->g.lambda[g->g.k - 1]);
        bench_json_num(&j, "captured_trace", g->captured);
        bench_json_num(&j, "transform_roundtrip_rel_l2", g->t_roundtrip);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_arr(&j, "rows");
    for (int i = 0; i < st->nrows; i++) {
        const fid_row_t *r = &st->row[i];

        bench_json_obj(&j, NULL);
        bench_json_str(&j, "format", gift_format_name(r->fmt));
        bench_json_str(&j, "transform",
                       r->hadamard ? "hadamard"
                       : r->gi < 0 ? "euclidean"
                                   : "gift");
        if (r->gi < 0) {
            bench_json_null(&j, "k");
            if (r->hadamard)
                bench_json_int(&j, "hadamard_block", st->hd.block);
        } else {
            bench_json_int(&j, "k", st->geo[r->gi].k);
            bench_json_bool(&j, "k_default", st->geo[r->gi].is_default);
            bench_json_bool(&j, "k_full", st->geo[r->gi].is_full);
        }
        bench_json_num(&j, "rel_l2", r->rel_l2);
        bench_json_num(&j, "cosine", r->cosine);
        bench_json_num(&j, "whitened", r->whitened);
        bench_json_num(&j, "whitened_x_euclidean_fp8", r->whit_ratio);
        bench_json_num(&j, "muon", r->muon);
        bench_json_num(&j, "boundary_hits", hits_frac(&r->hits));
        bench_json_int(&j, "saturated", (long long)r->hits.saturated);
        bench_json_int(&j, "flushed", (long long)r->hits.flushed);
        bench_json_int(&j, "inspected", (long long)r->hits.n);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_obj(&j, "targets");
    bench_json_obj(&j, "gift_fp8_default_k_whitened_le_0.4x_euclidean_fp8");
    bench_json_num(&j, "ratio", t1_ratio);
    bench_json_bool(&j, "pass", t1_pass);
    bench_json_obj_end(&j);
    bench_json_obj(&j, "gift_nvfp4_full_rank_whitened_below_euclidean_fp8");
    bench_json_num(&j, "ratio", t2_ratio);
    bench_json_bool(&j, "pass", t2_pass);
    bench_json_obj_end(&j);
    bench_json_obj_end(&j);
    bench_json_num(&j, "fp8_oracle_whitened_ratio", st->fp8_oracle);
    bench_json_obj(&j, "true_norms"); /* of the true mean gradient */
    bench_json_num(&j, "muon", st->norm_muon);
    bench_json_num(&j, "whitened", st->norm_whitened);
    bench_json_obj_end(&j);
    bench_json_obj(&j, "seconds");
    bench_json_num(&j, "data", st->t_data);
    bench_json_num(&j, "geometry", st->t_geometry);
    bench_json_num(&j, "codecs_and_metrics", st->t_codecs);
    bench_json_num(&j, "wall", wall);
    bench_json_obj_end(&j);
    bench_json_close(&j);
    if (fclose(f) != 0) {
        perror(o->json);
        return -1;
    }
    return 0;
}

int bench_fidelity_main(int argc, char **argv)
{
    fid_state_t *st;
    double t0 = bench_now(), t, wall, ref, t1_ratio = NAN, t2_ratio = NAN;
    char cpu[256], date[64], label[64];
    int rc, status = 1, t1_pass = 0, t2_pass = 0, i_ref, i_t1, i_t2;

    if ((st = calloc(1, sizeof(*st))) == NULL) {
        fprintf(stderr, "gift-bench: out of memory\n");
        return 1;
    }
    if ((rc = parse_opts(argc, argv, &st->o)) != 0) {
        free(st);
        return rc > 0 ? 0 : 2;
    }
    st->rows = (int)st->o.rows;
    st->din = (int)st->o.cols;
    st->W = (int)st->o.workers;
    st->n = (int)st->o.tokens;
    st->N = (size_t)st->rows * (size_t)st->din;
    st->synthetic = st->o.ngrad == 0;
    st->have_cov = st->o.ncov > 0;
    choose_ranks(st);
    if (fid_alloc(st) < 0)
        goto out;
    bench_cpu_model(cpu, sizeof(cpu));
    bench_date_utc(date, sizeof(date));

    fprintf(stderr, "gift-bench fidelity: %d x %d, %d workers, %s ...\n", st->rows, st->din, st->W,
            st->synthetic ? "synthetic layer" : "gradient files");
    t = bench_now();
    if (load_step(st) < 0)
        goto out;
    st->t_data = bench_now() - t;
    t = bench_now();
    if (build_geometries(st) < 0 || check_geometries(st) < 0)
        goto out;
    st->t_geometry = bench_now() - t;
    t = bench_now();
    for (int i = 0; i < st->nrows; i++) {
        fid_row_t *r = &st->row[i];

        r->fmt = i < st->nrows / 2 ? GIFT_FMT_E4M3 : GIFT_FMT_NVFP4;
        r->gi = i % (st->nrows / 2) - 2; /* -2: Euclidean, -1: Hadamard */
        r->hadamard = r->gi == -1;
        if (r->gi < 0)
            r->gi = -1;
        if (run_codec(st, r) < 0)
            goto out;
    }
    st->t_codecs = bench_now() - t;
    if (data_figures(st) < 0)
        goto out;

    i_ref = find_row(st, GIFT_FMT_E4M3, 0, 0);
    ref = st->row[i_ref].whitened;
    for (int i = 0; i < st->nrows; i++)
        st->row[i].whit_ratio = ref > 0.0 ? st->row[i].whitened / ref : NAN;
    i_t1 = find_row(st, GIFT_FMT_E4M3, 1, 0);
    i_t2 = find_row(st, GIFT_FMT_NVFP4, 0, 1);
    if (i_t1 >= 0) {
        t1_ratio = st->row[i_t1].whit_ratio;
        t1_pass = t1_ratio <= FID_TARGET_FP8;
    }
    if (i_t2 >= 0) {
        t2_ratio = st->row[i_t2].whit_ratio;
        t2_pass = t2_ratio < 1.0;
    }

    printf("## gift-bench fidelity\n\n");
    printf("- date %s; CPU %s; SIMD path %s; BLAS on one thread\n", date, cpu,
           gift_simd_name(gift_simd_active()));
    printf("- layer %d x %d (rows x din), %d workers, seed %llu, %ld refresh rounds%s, "
           "geometry decay %g%s, fp8 block %ld, damping %g, default k %d\n",
           st->rows, st->din, st->W, (unsigned long long)st->o.seed, sketch_rounds(st),
           st->o.nscov > st->o.ncov ? " (one per --sketch-cov step)" : "", st->o.geo_decay,
           st->o.geo_plain ? " (plain)" : "", st->o.block, st->o.damping, st->kdef);
    if (st->synthetic) {
        printf("- data: synthetic layer, %d tokens per worker; spectrum i^-%g (top %.0fx the "
               "mean channel variance) under a random rotation; %d outlier channels at "
               "%g-%gx; Student-t(%d); sketches from %s batches\n",
               st->n, st->o.decay, st->s.bulk_top, st->s.nout, 20.0 * st->o.outlier_scale,
               50.0 * st->o.outlier_scale, FID_STUDENT_NU,
               st->o.same_batch ? "the step's own" : "fresh");
    } else {
        printf("- data: %d --grad files%s%s\n", st->W,
               st->have_cov ? " with --cov covariances"
                            : "; no --cov: sketches and the whitened metric use the mean "
                              "G_w^T G_w / rows as the geometry (a proxy)",
               st->o.nscov > 0 ? "; the geometry is sketched from the --sketch-cov ones" : "");
    }
    printf("\n| format | transform | RelL2 | cosine | whitened | vs e4m3 | muon | hits |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < st->nrows; i++) {
        const fid_row_t *r = &st->row[i];

        row_label(st, r, label, sizeof(label));
        printf("| %s | %s | %.4f | %.6f | %.4f | %.3f | %.4f | %.2e |\n", gift_format_name(r->fmt),
               label, r->rel_l2, r->cosine, r->whitened, r->whit_ratio, r->muon,
               hits_frac(&r->hits));
    }
    printf("\n| geometry k | ks | epoch | captured tr | lambda_1 / sigma2 | c | T^-1 T relL2 |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < st->ngeo; i++) {
        const fid_geo_t *g = &st->geo[i];

        printf("| %d%s%s | %d | %u | %.3f | %.3g | %.4g | %.2e |\n", g->k,
               g->is_full ? " (full)" : "", g->is_default ? " (default)" : "", g->ks, g->g.epoch,
               g->captured, g->g.sigma2 > 0.0 ? g->g.lambda[0] / g->g.sigma2 : INFINITY,
               (double)g->g.c, g->t_roundtrip);
    }
    printf("\ntargets:\n");
    printf("- GIFT fp8-e4m3 at the default k=%d: whitened %.3fx Euclidean fp8 (target <= "
           "%.1fx): **%s**\n",
           st->kdef, t1_ratio, FID_TARGET_FP8, i_t1 >= 0 && t1_pass ? "PASS" : "FAIL");
    printf("- GIFT nvfp4 at full rank k=%d: whitened %.3fx Euclidean fp8 (target < 1): **%s**\n",
           st->din, t2_ratio, i_t2 >= 0 && t2_pass ? "PASS" : "FAIL");
    printf("\nGIFT fp8 with the step's own geometry, as fp8's relative error predicts it "
           "(depends on the data only): whitened %.3fx Euclidean fp8\n",
           st->fp8_oracle);
    wall = bench_now() - t0;
    printf("\nwall time %.1f s (data %.1f, geometry %.1f, codecs + metrics %.1f); JSON: %s\n", wall,
           st->t_data, st->t_geometry, st->t_codecs, st->o.json);
    if (write_json(st, wall, date, cpu, t1_pass, t2_pass, t1_ratio, t2_ratio) < 0)
        goto out;
    status = 0;
out:
    fid_free(st);
    free(st);
    return status;
}
