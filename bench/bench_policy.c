/*
 * bench_policy.c: `gift-bench policy`, the per-tensor chooser (codec/gift_policy.h)
 * on the dumped gradients of a whole model at one step, measured with the
 * real codecs.
 *
 * A manifest (written by bench/convergence_report.py policy) lists every
 * tensor of the step: its shape, each worker's gradient (--grad as in
 * `gift-bench fidelity`) and input covariance of the step (the metric), the
 * covariances the geometry is sketched from (the previous dumped step's, as
 * training uses a lagged geometry, or the step's own), and the gradients whose
 * mean is the chooser's gbar (the previous step's: the latest average the
 * owner decoded; or the step's own, to measure what the lag costs):
 *
 *   tensor NAME ROWS COLS
 *   grad PATH      (one per worker)
 *   cov PATH       (one per worker)
 *   scov PATH      (one per worker)
 *   gbar PATH      (one per worker of the gbar step)
 *
 * The geometry: gift_geometry_init (seed 1) at k_max = gift_rank_default and
 * ks = gift_basis_cols(din, k_max, 8), then --rounds rounds of
 * gift_geometry_update on sum_w C_w U (as `gift-bench fidelity --sketch-cov`
 * with one sketch step). The fp8 boundary-hit rate for `hits` is that of
 * Euclidean fp8 on the gbar step's worker gradients.
 *
 * For each policy (all, none, auto, hits) and budget (unset, and each
 * --budget), the chooser runs on every tensor jointly; then each worker codes
 * G_w T_k with the chosen format (gift_encode, gift_decode_acc), the mean is
 * mapped back with T_k^-1 and compared with the true mean: the whole update's
 * error sqrt(sum_l err_l^2 / sum_l true_l^2), each layer in its own metric
 * (whitened: ||(Ghat - Gbar) L|| with L of the step's own mean covariance,
 * damping 0.01; Muon: ||NS5(Ghat) - NS5(Gbar)||; Muon as applied: blocks
 * only, each layer weighted by sqrt(max(1, rows/cols)), the head excluded:
 * tensors whose name does not start with "blocks."), over Euclidean fp8's.
 * Only the push leg is coded, as in `gift-bench fidelity`.
 */
#define _POSIX_C_SOURCE 200809L

#include "bench_common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cblas.h>

#include "gift_codec.h"
#include "gift_policy.h"

#define POL_MAX_T 256
#define POL_MAX_W 64
#define POL_MAX_BUDGETS 8
#define POL_MAX_MEAS 32

typedef struct pol_meas {
    int gift, fmt;
    uint32_t k;
    double whit2, muon2; /* absolute squared errors */
} pol_meas_t;

typedef struct pol_tensor {
    char name[128];
    int rows, din, W, Wg, k, ks, applied;
    char *grad[POL_MAX_W], *cov[POL_MAX_W], *scov[POL_MAX_W], *gbar[POL_MAX_W];
    int ngrad, ncov, nscov, ngbar;
    float *G;     /* W x rows x din */
    float *Gtrue; /* rows x din */
    float *A;     /* din x din, the step's mean covariance (metric) */
    float *gb;    /* rows x din, the chooser's gbar */
    gift_geometry_t g;
    double hit_rate;
    double norm_whit, norm_muon;
    pol_meas_t meas[POL_MAX_MEAS];
    int nmeas;
} pol_tensor_t;

typedef struct pol_state {
    pol_tensor_t *t;
    int n;
    long rounds, refresh;
    double budgets[POL_MAX_BUDGETS];
    int nbudgets;
    const char *json, *manifest, *label;
} pol_state_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: gift-bench policy --manifest FILE [--budget B]... [--refresh N]\n"
               "                         [--rounds N] [--label TEXT] [--json FILE]\n"
               "  --manifest FILE  the step's tensors (see bench/bench_policy.c)\n"
               "  --budget B       a bit budget to run besides the unset one (repeatable)\n"
               "  --refresh N      steps per epoch, the geometry bytes' amortisation (50)\n"
               "  --rounds N       sketch rounds of the geometry (4, as gift-bench fidelity)\n");
}

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);

    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

static int read_f32(const char *path, size_t count, float *buf)
{
    struct stat st;
    FILE *f;
    size_t got;

    if (stat(path, &st) != 0 || (unsigned long long)st.st_size != 4ull * count) {
        fprintf(stderr, "gift-bench policy: %s: missing or not %zu floats\n", path, count);
        return -1;
    }
    if ((f = fopen(path, "rb")) == NULL)
        return -1;
    got = fread(buf, sizeof(float), count, f);
    fclose(f);
    return got == count ? 0 : -1;
}

static int parse_manifest(pol_state_t *s)
{
    FILE *f = fopen(s->manifest, "r");
    char line[4096];
    pol_tensor_t *cur = NULL;

    if (f == NULL) {
        fprintf(stderr, "gift-bench policy: %s: %s\n", s->manifest, strerror(errno));
        return -1;
    }
    if ((s->t = calloc(POL_MAX_T, sizeof(pol_tensor_t))) == NULL) {
        fclose(f);
        fprintf(stderr, "gift-bench policy: out of memory\n");
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char key[16], val[4000], tname[sizeof(s->t[0].name)];
        int rows, cols;

        line[strcspn(line, "\n")] = 0;
        if (line[0] == 0 || line[0] == '#')
            continue;
        if (sscanf(line, "tensor %127s %d %d", tname, &rows, &cols) == 3) {
            if (s->n >= POL_MAX_T)
                goto bad;
            cur = &s->t[s->n++];
            memcpy(cur->name, tname, sizeof(cur->name));
            cur->rows = rows;
            cur->din = cols;
            continue;
        }
        if (cur == NULL || sscanf(line, "%15s %3999s", key, val) != 2)
            goto bad;
#define ADD(arr, cnt)                                                                              \
    do {                                                                                           \
        if (cur->cnt >= POL_MAX_W)                                                                 \
            goto bad;                                                                              \
        cur->arr[cur->cnt++] = dupstr(val);                                                        \
    } while (0)
        if (strcmp(key, "grad") == 0)
            ADD(grad, ngrad);
        else if (strcmp(key, "cov") == 0)
            ADD(cov, ncov);
        else if (strcmp(key, "scov") == 0)
            ADD(scov, nscov);
        else if (strcmp(key, "gbar") == 0)
            ADD(gbar, ngbar);
        else
            goto bad;
#undef ADD
    }
    fclose(f);
    for (int i = 0; i < s->n; i++) {
        pol_tensor_t *t = &s->t[i];

        if (t->ngrad < 1 || t->ncov != t->ngrad || t->nscov < 1 || t->ngbar < 1 || t->rows < 1 ||
            t->din < 2) {
            fprintf(stderr, "gift-bench policy: tensor %s: incomplete\n", t->name);
            return -1;
        }
    }
    return s->n > 0 ? 0 : -1;
bad:
    fprintf(stderr, "gift-bench policy: %s: bad line '%s'\n", s->manifest, line);
    fclose(f);
    return -1;
}

/* Loads one tensor, builds its geometry and the true norms. */
static int load_tensor(pol_state_t *s, pol_tensor_t *t)
{
    size_t N = (size_t)t->rows * t->din, dd = (size_t)t->din * t->din, i;
    float *C = malloc(dd * sizeof(float)), *Y, *tmp;
    double *ns;
    int w, r, rc;

    t->W = t->ngrad;
    t->Wg = t->ngbar;
    t->k = gift_rank_default(t->rows, t->din);
    t->ks = gift_basis_cols(t->din, t->k, GIFT_OVERSAMPLE_DEFAULT);
    t->applied = strncmp(t->name, "blocks.", 7) == 0;
    t->G = malloc((size_t)t->W * N * sizeof(float));
    t->Gtrue = calloc(N, sizeof(float));
    t->A = calloc(dd, sizeof(float));
    t->gb = calloc(N, sizeof(float));
    tmp = malloc(N * sizeof(float));
    Y = malloc((size_t)t->din * t->ks * sizeof(float));
    ns = malloc(N * sizeof(double));
    if (!C || !t->G || !t->Gtrue || !t->A || !t->gb || !tmp || !Y || !ns)
        return -1;
    for (w = 0; w < t->W; w++) {
        if (read_f32(t->grad[w], N, t->G + (size_t)w * N) < 0 || read_f32(t->cov[w], dd, C) < 0)
            return -1;
        for (i = 0; i < N; i++)
            t->Gtrue[i] += t->G[(size_t)w * N + i] / (float)t->W;
        for (i = 0; i < dd; i++)
            t->A[i] += C[i] / (float)t->W;
    }
    /* The chooser's gbar, and the fp8 boundary-hit rate of its step. */
    {
        gift_codec_params_t p = {.fmt = GIFT_FMT_E4M3};
        gift_layout_t l;
        void *pay;
        size_t hits = 0, tot = 0;

        gift_layout(&p, N, &l);
        pay = malloc(l.total);
        for (w = 0; w < t->Wg; w++) {
            gift_hits_t h;

            if (read_f32(t->gbar[w], N, tmp) < 0)
                return -1;
            for (i = 0; i < N; i++)
                t->gb[i] += tmp[i] / (float)t->Wg;
            if (gift_encode(&p, tmp, N, pay, l.total) < 0 ||
                gift_boundary_hits(&p, tmp, pay, l.total, N, &h) < 0)
                return -1;
            hits += h.saturated + h.flushed;
            tot += h.n;
        }
        free(pay);
        t->hit_rate = tot ? (double)hits / (double)tot : 0.0;
    }
    /* The geometry: rounds of sum_w C_w U from the sketch covariances. */
    if ((rc = gift_geometry_init(&t->g, t->din, t->k, t->ks, 1)) < 0)
        return -1;
    for (r = 0; r < s->rounds; r++) {
        double tr = 0.0;

        memset(Y, 0, (size_t)t->din * t->ks * sizeof(float));
        for (w = 0; w < t->nscov; w++) {
            if (read_f32(t->scov[w], dd, C) < 0)
                return -1;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t->din, t->ks, t->din, 1.0f, C,
                        t->din, t->g.U, t->ks, 1.0f, Y, t->ks);
            for (i = 0; i < (size_t)t->din; i++)
                tr += C[i * t->din + i];
        }
        if ((rc = gift_geometry_update(&t->g, Y, tr, GIFT_DAMPING_DEFAULT)) < 0) {
            fprintf(stderr, "gift-bench policy: %s: geometry update: %s\n", t->name,
                    gift_strerror(rc));
            return -1;
        }
    }
    t->norm_whit = gift_metric_whitened_norm(t->Gtrue, t->rows, t->din, t->A, GIFT_DAMPING_DEFAULT);
    if (gift_ns5(t->Gtrue, t->rows, t->din, ns) < 0)
        return -1;
    t->norm_muon = 0.0;
    for (i = 0; i < N; i++)
        t->norm_muon += ns[i] * ns[i];
    t->norm_muon = sqrt(t->norm_muon);
    free(C);
    free(Y);
    free(tmp);
    free(ns);
    return t->norm_whit >= 0 ? 0 : -1;
}

/* The measured squared errors of one option (cached per tensor). */
static const pol_meas_t *measure(pol_tensor_t *t, int gift, uint32_t k, int fmt)
{
    size_t N = (size_t)t->rows * t->din, i;
    gift_codec_params_t p = {.fmt = (gift_format_t)fmt};
    gift_layout_t l;
    gift_geometry_t gk, *T = NULL;
    float *X, *acc, *work;
    void *pay;
    pol_meas_t *m;
    double wr, mr;
    int w;

    for (int j = 0; j < t->nmeas; j++)
        if (t->meas[j].gift == gift && t->meas[j].k == k && t->meas[j].fmt == fmt)
            return &t->meas[j];
    if (t->nmeas >= POL_MAX_MEAS)
        return NULL;
    m = &t->meas[t->nmeas];
    memset(&gk, 0, sizeof(gk));
    if (gift) {
        if (gift_geometry_init(&gk, t->din, (int)k, t->ks, 1) < 0 ||
            gift_policy_geometry_at(&t->g, k, &gk) < 0)
            return NULL;
        T = &gk;
    }
    gift_layout(&p, N, &l);
    X = malloc(N * sizeof(float));
    acc = calloc(N, sizeof(float));
    work = malloc((size_t)t->rows * t->ks * sizeof(float));
    pay = malloc(l.total);
    for (w = 0; w < t->W; w++) {
        const float *src = t->G + (size_t)w * N;

        if (T != NULL) {
            gift_transform(T, 0, src, t->rows, X, work);
            src = X;
        }
        if (gift_encode(&p, src, N, pay, l.total) < 0 ||
            gift_decode_acc(&p, pay, l.total, N, acc) < 0)
            return NULL;
    }
    for (i = 0; i < N; i++)
        acc[i] /= (float)t->W;
    if (T != NULL)
        gift_transform(T, 1, acc, t->rows, acc, work);
    wr = gift_metric_whitened(t->Gtrue, acc, t->rows, t->din, t->A, GIFT_DAMPING_DEFAULT);
    mr = gift_metric_muon(t->Gtrue, acc, t->rows, t->din);
    m->gift = gift;
    m->k = k;
    m->fmt = fmt;
    m->whit2 = wr * wr * t->norm_whit * t->norm_whit;
    m->muon2 = mr * mr * t->norm_muon * t->norm_muon;
    t->nmeas++;
    if (gift)
        gift_geometry_free(&gk);
    free(X);
    free(acc);
    free(work);
    free(pay);
    return m;
}

typedef struct pol_result {
    int policy;
    double budget;
    int rc;
    double whit2, muon2, appl2, pred2, bits, gflops, geo_bits;
    double choose_s; /* wall time of gift_policy_choose */
    int ngift, nfp8, nnvfp4;
    gift_policy_choice_t *c;
} pol_result_t;

static int run_config(pol_state_t *s, int policy, double budget, pol_result_t *r)
{
    gift_policy_cfg_t cfg = {.policy = policy, .budget_bits = budget};
    gift_policy_in_t *in = calloc((size_t)s->n, sizeof(*in));
    double elems = 0.0;

    memset(r, 0, sizeof(*r));
    r->policy = policy;
    r->budget = budget;
    r->c = calloc((size_t)s->n, sizeof(*r->c));
    for (int i = 0; i < s->n; i++) {
        pol_tensor_t *t = &s->t[i];

        in[i] = (gift_policy_in_t){.rows = (uint32_t)t->rows,
                                   .cols = (uint32_t)t->din,
                                   .k_max = (uint32_t)t->k,
                                   .ks = (uint32_t)t->ks,
                                   .refresh = (uint32_t)s->refresh,
                                   .declared_format = GIFT_FMT_E4M3,
                                   .geo = &t->g,
                                   .gbar = t->gb,
                                   .nrows = (uint32_t)t->rows,
                                   .hit_rate = t->hit_rate};
    }
    r->choose_s = bench_now();
    r->rc = gift_policy_choose(&cfg, in, (size_t)s->n, r->c);
    r->choose_s = bench_now() - r->choose_s;
    if (r->rc < 0) {
        fprintf(stderr, "gift-bench policy: gift_policy_choose: %s\n", gift_strerror(r->rc));
        free(in);
        return -1;
    }
    for (int i = 0; i < s->n; i++) {
        pol_tensor_t *t = &s->t[i];
        const gift_policy_choice_t *c = &r->c[i];
        const pol_meas_t *m = measure(t, c->gift, c->k, c->format);
        double e = (double)t->rows * t->din, wa;

        if (m == NULL)
            return -1;
        wa = t->applied ? fmax(1.0, (double)t->rows / t->din) : 0.0;
        r->whit2 += m->whit2;
        r->muon2 += m->muon2;
        r->appl2 += m->muon2 * wa;
        r->pred2 += c->pred_err2;
        r->bits += c->bits * e;
        r->geo_bits += c->gift ? (c->bits - gift_policy_bits(&in[i], c->format, 0, 0)) * e : 0.0;
        r->gflops += c->gflops;
        r->ngift += c->gift;
        r->nfp8 += c->format == GIFT_FMT_E4M3;
        r->nnvfp4 += c->format == GIFT_FMT_NVFP4;
        elems += e;
    }
    r->bits /= elems;
    r->geo_bits /= elems;
    free(in);
    return 0;
}

int bench_policy_main(int argc, char **argv)
{
    pol_state_t s;
    static const int policies[] = {GIFT_POLICY_ALL, GIFT_POLICY_NONE, GIFT_POLICY_AUTO,
                                   GIFT_POLICY_HITS};
    pol_result_t *res;
    int nres = 0, nconf;
    double e8w = 0, e8m = 0, e8a = 0, nw = 0, nm = 0, na = 0, e8p;
    FILE *jf;
    bench_json_t j;
    char date[64], cpu[256];

    memset(&s, 0, sizeof(s));
    s.rounds = 4;
    s.refresh = 50;
    s.json = BENCH_OUT_DIR "/policy.json";
    s.label = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--manifest") == 0)
            s.manifest = v;
        else if (strcmp(a, "--json") == 0)
            s.json = v;
        else if (strcmp(a, "--label") == 0)
            s.label = v;
        else if (strcmp(a, "--budget") == 0 && s.nbudgets < POL_MAX_BUDGETS)
            s.budgets[s.nbudgets++] = atof(v);
        else if (strcmp(a, "--refresh") == 0)
            s.refresh = atol(v);
        else if (strcmp(a, "--rounds") == 0)
            s.rounds = atol(v);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (s.manifest == NULL || s.refresh < 1 || s.rounds < 1) {
        usage(stderr);
        return 2;
    }
    if (parse_manifest(&s) < 0)
        return 1;
    for (int i = 0; i < s.n; i++)
        if (load_tensor(&s, &s.t[i]) < 0) {
            fprintf(stderr, "gift-bench policy: loading %s failed\n", s.t[i].name);
            return 1;
        }
    /* The yardstick: Euclidean fp8-e4m3 everywhere. */
    for (int i = 0; i < s.n; i++) {
        pol_tensor_t *t = &s.t[i];
        const pol_meas_t *m = measure(t, 0, 0, GIFT_FMT_E4M3);
        double wa = t->applied ? fmax(1.0, (double)t->rows / t->din) : 0.0;

        if (m == NULL)
            return 1;
        e8w += m->whit2;
        e8m += m->muon2;
        e8a += m->muon2 * wa;
        nw += t->norm_whit * t->norm_whit;
        nm += t->norm_muon * t->norm_muon;
        na += t->norm_muon * t->norm_muon * wa;
    }
    nconf = 4 * (1 + s.nbudgets);
    res = calloc((size_t)nconf, sizeof(*res));
    for (int b = -1; b < s.nbudgets; b++)
        for (int p = 0; p < 4; p++)
            if (run_config(&s, policies[p], b < 0 ? 0.0 : s.budgets[b], &res[nres++]) < 0)
                return 1;
    e8p = res[1].pred2; /* none, unset budget: Euclidean fp8 */

    printf("gift-bench policy %s: %d tensors, %d workers, refresh %ld; ratios to Euclidean "
           "fp8-e4m3 (8.25 bits) on the whole update\n\n",
           s.label, s.n, s.t[0].W, s.refresh);
    printf("| policy | budget | whitened | Muon | Muon as applied | predicted whitened | bits/elem "
           "(geometry) | GFLOP/step | GIFT / fp8 / nvfp4 tensors | flag | choose s |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n");
    for (int i = 0; i < nres; i++) {
        pol_result_t *r = &res[i];
        char bud[32];

        snprintf(bud, sizeof(bud), r->budget > 0 ? "%.2f" : "unset", r->budget);
        printf("| %s | %s | %.3fx | %.3fx | %.3fx | %.3fx | %.3f (%.3f) | %.4f | %d / %d / %d | "
               "%s | %.3f |\n",
               gift_policy_name(r->policy), bud, sqrt(r->whit2 / e8w), sqrt(r->muon2 / e8m),
               e8a > 0 ? sqrt(r->appl2 / e8a) : NAN, e8p > 0 ? sqrt(r->pred2 / e8p) : NAN, r->bits,
               r->geo_bits, r->gflops, r->ngift, r->nfp8, r->nnvfp4,
               r->rc == GIFT_POLICY_INFEASIBLE ? "infeasible" : "", r->choose_s);
    }
    printf("\n| tensor | shape | k_max | hit rate | auto: mode, k, format, pred ratio |\n"
           "|---|---|---:|---:|---|\n");
    for (int i = 0; i < s.n; i++) {
        const gift_policy_choice_t *c = &res[2].c[i];

        printf("| %s | %dx%d | %d | %.2e | %s %u %s %.3f |\n", s.t[i].name, s.t[i].rows, s.t[i].din,
               s.t[i].k, s.t[i].hit_rate, c->gift ? "gift" : "eucl", c->k,
               gift_format_name((gift_format_t)c->format), c->pred_ratio);
    }

    if (bench_mkdir_for(s.json) < 0 || (jf = fopen(s.json, "w")) == NULL) {
        fprintf(stderr, "gift-bench policy: cannot write %s\n", s.json);
        return 1;
    }
    bench_date_utc(date, sizeof(date));
    bench_cpu_model(cpu, sizeof(cpu));
    bench_json_open(&j, jf);
    bench_json_str(&j, "bench", "policy");
    bench_json_str(&j, "label", s.label);
    bench_json_str(&j, "manifest", s.manifest);
    bench_json_str(&j, "date", date);
    bench_json_str(&j, "cpu", cpu);
    bench_json_int(&j, "nproc", bench_cpu_count());
    bench_json_int(&j, "refresh", s.refresh);
    bench_json_int(&j, "rounds", s.rounds);
    bench_json_int(&j, "workers", s.t[0].W);
    bench_json_num(&j, "e8_whitened2", e8w);
    bench_json_num(&j, "e8_muon2", e8m);
    bench_json_num(&j, "e8_muon_applied2", e8a);
    bench_json_num(&j, "true_whitened2", nw);
    bench_json_num(&j, "true_muon2", nm);
    bench_json_num(&j, "true_muon_applied2", na);
    bench_json_arr(&j, "tensors");
    for (int i = 0; i < s.n; i++) {
        bench_json_obj(&j, NULL);
        bench_json_str(&j, "name", s.t[i].name);
        bench_json_int(&j, "rows", s.t[i].rows);
        bench_json_int(&j, "cols", s.t[i].din);
        bench_json_int(&j, "k_max", s.t[i].k);
        bench_json_int(&j, "ks", s.t[i].ks);
        bench_json_num(&j, "hit_rate", s.t[i].hit_rate);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_arr(&j, "results");
    for (int i = 0; i < nres; i++) {
        pol_result_t *r = &res[i];

        bench_json_obj(&j, NULL);
        bench_json_str(&j, "policy", gift_policy_name(r->policy));
        bench_json_num(&j, "budget_bits", r->budget > 0 ? r->budget : NAN);
        bench_json_bool(&j, "infeasible", r->rc == GIFT_POLICY_INFEASIBLE);
        bench_json_num(&j, "whitened_ratio", sqrt(r->whit2 / e8w));
        bench_json_num(&j, "muon_ratio", sqrt(r->muon2 / e8m));
        bench_json_num(&j, "muon_applied_ratio", e8a > 0 ? sqrt(r->appl2 / e8a) : NAN);
        bench_json_num(&j, "pred_whitened_ratio", e8p > 0 ? sqrt(r->pred2 / e8p) : NAN);
        bench_json_num(&j, "bits", r->bits);
        bench_json_num(&j, "geometry_bits", r->geo_bits);
        bench_json_num(&j, "gflops", r->gflops);
        bench_json_num(&j, "choose_s", r->choose_s);
        bench_json_int(&j, "n_gift", r->ngift);
        bench_json_int(&j, "n_fp8", r->nfp8);
        bench_json_int(&j, "n_nvfp4", r->nnvfp4);
        bench_json_arr(&j, "choices");
        for (int t = 0; t < s.n; t++) {
            const gift_policy_choice_t *c = &r->c[t];

            bench_json_obj(&j, NULL);
            bench_json_int(&j, "gift", c->gift);
            bench_json_int(&j, "k", c->k);
            bench_json_str(&j, "format", gift_format_name((gift_format_t)c->format));
            bench_json_num(&j, "pred_ratio", c->pred_ratio);
            bench_json_num(&j, "bits", c->bits);
            bench_json_num(&j, "gflops", c->gflops);
            bench_json_obj_end(&j);
        }
        bench_json_arr_end(&j);
        bench_json_obj_end(&j);
    }
    bench_json_arr_end(&j);
    bench_json_close(&j);
    fclose(jf);
    return 0;
}
