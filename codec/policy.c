/*
 * policy.c: the geometry owner's per-tensor treatment (gift_policy.h has the
 * model, the bit and flop accounting and the joint choice).
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_policy.h"

#define GP_MAX_FMT 4
#define GP_MAX_K 3

typedef struct gp_opt {
    int gift;
    uint32_t k;
    int fmt;
    double err2; /* predicted, rows-scaled; 0 when the tensor has no prediction */
    double bits; /* per element */
    double gflops;
} gp_opt_t;

typedef struct gp_tensor {
    gp_opt_t opt[GIFT_POLICY_MAX_OPTIONS];
    int nopt;
    int known;     /* 1: err2 predicted */
    int eucl_decl; /* index of Euclidean at the declared format */
    int nfmt;      /* formats per mode */
    double elems;  /* rows x cols */
} gp_tensor_t;

int gift_policy_parse(const char *s)
{
    static const char *const names[] = {"all", "none", "auto", "hits"};
    int i;

    if (s == NULL)
        return GIFT_EINVAL;
    for (i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return GIFT_EINVAL;
}

const char *gift_policy_name(int policy)
{
    switch (policy) {
    case GIFT_POLICY_ALL:
        return "all";
    case GIFT_POLICY_NONE:
        return "none";
    case GIFT_POLICY_AUTO:
        return "auto";
    case GIFT_POLICY_HITS:
        return "hits";
    default:
        return "?";
    }
}

/* Bytes of the scale and code sections (unpadded) of a whole tensor. */
static double gp_payload_bits(int fmt, uint32_t block, double elems)
{
    gift_codec_params_t p = {.fmt = (gift_format_t)fmt, .block = block};
    gift_layout_t l;

    if (gift_layout(&p, (size_t)elems, &l) < 0)
        return GIFT_EINVAL;
    return 8.0 * (double)(l.scale_bytes + l.code_bytes) / elems;
}

double gift_policy_bits(const gift_policy_in_t *in, int format, int gift, int sketch_always)
{
    double elems, b, geo = 0.0;

    if (in == NULL || in->rows == 0 || in->cols == 0 || format < 0 || format >= GIFT_FMT_COUNT_)
        return GIFT_EINVAL;
    elems = (double)in->rows * in->cols;
    if ((b = gp_payload_bits(format, in->block, elems)) < 0)
        return b;
    if (gift)
        geo = 32.0 * (2.0 * in->cols * in->ks + in->ks);
    else if (sketch_always)
        geo = 32.0 * (double)in->cols * in->ks;
    return b + geo / (2.0 * elems * (in->refresh ? in->refresh : 1));
}

int gift_policy_geometry_at(const gift_geometry_t *src, uint32_t k, gift_geometry_t *dst)
{
    double sigma2 = 0.0, sumk = 0.0;
    uint32_t i;

    if (src == NULL || dst == NULL || k < 1 || (int)k > src->ks || dst->din != src->din ||
        dst->ks != src->ks || dst->k != (int)k)
        return GIFT_EINVAL;
    if (src->identity || k == (uint32_t)src->k) {
        sigma2 = src->sigma2;
    } else if ((int)k < src->din) {
        for (i = 0; i < k; i++)
            sumk += src->lambda[i];
        sigma2 = (src->trace - sumk) / (double)(src->din - (int)k);
        if (sigma2 < 0.0)
            sigma2 = 0.0;
    }
    return gift_geometry_load(dst, src->U, src->lambda, src->trace, sigma2, src->delta, src->epoch,
                              src->identity);
}

/* Formats the chooser may use for a declared one: itself and the smaller of
 * bf16, fp8-e4m3, nvfp4 (fewer bits per element). Returns the count. */
static int gp_formats(int declared, int budget, uint32_t block, int *fmts)
{
    static const int cand[] = {GIFT_FMT_BF16, GIFT_FMT_E4M3, GIFT_FMT_NVFP4};
    double db = gp_payload_bits(declared, block, 4096.0);
    int n = 0, i;

    fmts[n++] = declared;
    if (!budget)
        return n;
    for (i = 0; i < 3; i++)
        if (cand[i] != declared && gp_payload_bits(cand[i], block, 4096.0) < db)
            fmts[n++] = cand[i];
    return n;
}

/* Work buffers for one tensor's predictions. */
typedef struct gp_work {
    float *X, *Xh, *twork;
    double *E, *Ud, *EU;
    void *payload;
    size_t cap;
    gift_geometry_t gk; /* rank-k geometry (caller-owned buffers) */
} gp_work_t;

static void gp_work_free(gp_work_t *w)
{
    free(w->X);
    free(w->Xh);
    free(w->twork);
    free(w->E);
    free(w->Ud);
    free(w->EU);
    free(w->payload);
    free(w->gk.U);
    free(w->gk.lambda);
    free(w->gk.d);
    free(w->gk.d_inv);
    memset(w, 0, sizeof(*w));
}

static int gp_work_alloc(gp_work_t *w, const gift_policy_in_t *in)
{
    size_t nx = (size_t)in->nrows * in->cols, cap = 0;
    gift_codec_params_t p = {.block = in->block};
    gift_layout_t l;
    int f;

    memset(w, 0, sizeof(*w));
    for (f = 0; f < GIFT_FMT_COUNT_; f++) {
        p.fmt = (gift_format_t)f;
        if (gift_layout(&p, nx, &l) < 0)
            return GIFT_EINVAL;
        if (l.total > cap)
            cap = l.total;
    }
    w->cap = cap;
    w->X = malloc(nx * sizeof(float));
    w->Xh = malloc(nx * sizeof(float));
    w->twork = malloc((size_t)in->nrows * in->k_max * sizeof(float));
    w->E = malloc(nx * sizeof(double));
    w->Ud = malloc((size_t)in->cols * in->k_max * sizeof(double));
    w->EU = malloc((size_t)in->nrows * in->k_max * sizeof(double));
    w->payload = malloc(cap);
    w->gk.U = malloc((size_t)in->cols * in->ks * sizeof(float));
    w->gk.lambda = malloc((size_t)in->ks * sizeof(float));
    w->gk.d = malloc((size_t)in->k_max * sizeof(float));
    w->gk.d_inv = malloc((size_t)in->k_max * sizeof(float));
    if (!w->X || !w->Xh || !w->twork || !w->E || !w->Ud || !w->EU || !w->payload || !w->gk.U ||
        !w->gk.lambda || !w->gk.d || !w->gk.d_inv) {
        gp_work_free(w);
        return GIFT_ENOMEM;
    }
    w->gk.din = (int)in->cols;
    w->gk.ks = (int)in->ks;
    return 0;
}

/*
 * The predicted squared whitened error of one option (gift_policy.h): X =
 * gbar T_k coded by the real codec, E = decode - X, ||E M||^2 with M = T_k^-1
 * L diagonal in U's basis, scaled by rows / nrows.
 */
static int gp_predict(const gift_policy_in_t *in, gp_work_t *w, gp_opt_t *o)
{
    const gift_geometry_t *G = in->geo;
    const gift_geometry_t *T = G;
    size_t nx = (size_t)in->nrows * in->cols, i;
    int rows = (int)in->nrows, din = (int)in->cols, kmax = (int)in->k_max, j, rc;
    gift_codec_params_t p = {.fmt = (gift_format_t)o->fmt, .block = in->block};
    gift_layout_t l;
    double base = G->sigma2 + G->delta, lc = 1.0 / sqrt(base), tinv_c = 1.0, mc, e2 = 0.0, acc;
    double sigk = G->sigma2;

    if (o->gift) {
        if (o->k != in->k_max) {
            w->gk.k = (int)o->k;
            if ((rc = gift_policy_geometry_at(G, o->k, &w->gk)) < 0)
                return rc;
            T = &w->gk;
            sigk = w->gk.sigma2;
        }
        if ((rc = gift_transform(T, 0, in->gbar, rows, w->X, w->twork)) < 0)
            return rc;
        tinv_c = sqrt(sigk + G->delta);
    } else {
        memcpy(w->X, in->gbar, nx * sizeof(float));
    }
    if ((rc = gift_layout(&p, nx, &l)) < 0)
        return rc;
    if ((rc = gift_encode(&p, w->X, nx, w->payload, w->cap)) < 0)
        return rc;
    if ((rc = gift_decode(&p, w->payload, l.total, nx, w->Xh)) < 0)
        return rc;
    for (i = 0; i < nx; i++) {
        w->E[i] = (double)w->Xh[i] - (double)w->X[i];
        e2 += w->E[i] * w->E[i];
    }
    mc = tinv_c * lc;
    acc = mc * mc * e2;
    if (e2 > 0.0) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, kmax, din, 1.0, w->E, din,
                    w->Ud, kmax, 0.0, w->EU, kmax);
        for (j = 0; j < kmax; j++) {
            double li = 1.0 / sqrt((double)G->lambda[j] + G->delta);
            double ti = (o->gift && j < (int)o->k) ? sqrt((double)G->lambda[j] + G->delta) : tinv_c;
            double mi = ti * li, col = 0.0;
            int r;

            for (r = 0; r < rows; r++)
                col += w->EU[(size_t)r * kmax + j] * w->EU[(size_t)r * kmax + j];
            acc += (mi * mi - mc * mc) * col;
        }
    }
    if (acc < 0.0)
        acc = 0.0;
    o->err2 = acc * (double)in->rows / (double)in->nrows;
    return 0;
}

static int gp_check_in(const gift_policy_in_t *in)
{
    const gift_geometry_t *g = in->geo;
    size_t i, nx;

    if (in->rows == 0 || in->cols == 0 || in->k_max < 1 || in->k_max > in->ks ||
        in->ks > in->cols || in->declared_format < 0 || in->declared_format >= GIFT_FMT_COUNT_ ||
        g == NULL || g->din != (int)in->cols || g->ks != (int)in->ks || g->k != (int)in->k_max ||
        g->U == NULL || g->lambda == NULL)
        return GIFT_EINVAL;
    if (in->block != 0) {
        gift_codec_params_t p = {.fmt = GIFT_FMT_E4M3, .block = in->block};
        gift_layout_t l;

        if (gift_layout(&p, 1, &l) < 0)
            return GIFT_EINVAL;
    }
    if (in->gbar != NULL) {
        if (in->nrows < 1 || in->nrows > in->rows)
            return GIFT_EINVAL;
        nx = (size_t)in->nrows * in->cols;
        for (i = 0; i < nx; i++)
            if (!isfinite(in->gbar[i]))
                return GIFT_ENONFINITE;
    }
    if (!isfinite(in->hit_rate))
        return GIFT_EINVAL;
    return 0;
}

/* The option set of one tensor; predictions when gbar is there and the
 * geometry is not the identity. */
static int gp_tensor_build(const gift_policy_cfg_t *cfg, const gift_policy_in_t *in, gp_tensor_t *t)
{
    int fmts[GP_MAX_FMT], nf, f, m, nk = 0, rc = 0, i;
    uint32_t ks[GP_MAX_K], cand[GP_MAX_K] = {in->k_max / 4, in->k_max / 2, in->k_max};
    int budget = cfg->budget_bits > 0.0, can_gift = !in->geo->identity;
    gp_work_t w;

    memset(t, 0, sizeof(*t));
    t->elems = (double)in->rows * in->cols;
    for (i = 0; i < GP_MAX_K; i++) {
        uint32_t k = cand[i] < 1 ? 1 : cand[i];

        if (nk == 0 || ks[nk - 1] != k)
            ks[nk++] = k;
    }
    nf = gp_formats(in->declared_format, budget, in->block, fmts);
    t->nfmt = nf;
    for (m = 0; m <= (can_gift ? nk : 0); m++)
        for (f = 0; f < nf; f++) {
            gp_opt_t *o = &t->opt[t->nopt++];

            o->gift = m > 0;
            o->k = m > 0 ? ks[m - 1] : 0;
            o->fmt = fmts[f];
            o->bits = gift_policy_bits(in, fmts[f], o->gift, cfg->sketch_always);
            o->gflops = o->gift
                            ? gift_transform_flops((double)in->rows, (int)in->cols, (int)o->k) / 1e9
                            : 0.0;
            if (o->bits < 0)
                return GIFT_EINVAL;
        }
    t->eucl_decl = 0; /* Euclidean, declared format: always the first */
    t->known = in->gbar != NULL && can_gift;
    if (!t->known)
        return 0;
    if ((rc = gp_work_alloc(&w, in)) < 0)
        return rc;
    for (i = 0; i < (int)in->cols * (int)in->k_max; i++) /* U's first k_max columns, double */
        w.Ud[i] = in->geo->U[(size_t)(i / (int)in->k_max) * in->ks + (size_t)(i % (int)in->k_max)];
    for (i = 0; i < t->nopt && rc == 0; i++)
        rc = gp_predict(in, &w, &t->opt[i]);
    gp_work_free(&w);
    return rc;
}

/* Options allowed for tensor t under a policy (bitmask over t's options). */
static uint32_t gp_mask(const gift_policy_cfg_t *cfg, const gift_policy_in_t *in,
                        const gp_tensor_t *t, int policy)
{
    uint32_t mask = 0;
    int i, gift_on, want_k_only = cfg->max_gflops <= 0.0;
    double thr = cfg->hits_threshold > 0.0 ? cfg->hits_threshold : GIFT_POLICY_HITS_DEFAULT;

    switch (policy) {
    case GIFT_POLICY_NONE:
        gift_on = 0;
        break;
    case GIFT_POLICY_HITS:
        gift_on = in->hit_rate < 0.0 ? 1 : in->hit_rate >= thr;
        break;
    case GIFT_POLICY_AUTO:
        gift_on = t->known ? -1 : 1; /* -1: free choice */
        want_k_only = !t->known;
        break;
    default:
        gift_on = 1;
    }
    if (in->geo->identity)
        gift_on = 0;
    for (i = 0; i < t->nopt; i++) {
        const gp_opt_t *o = &t->opt[i];

        if (gift_on == -1 || (gift_on == 0 && !o->gift) ||
            (gift_on == 1 && o->gift && (!want_k_only || o->k == in->k_max)))
            mask |= 1u << i;
    }
    return mask;
}

typedef struct gp_totals {
    double bits, gflops, err2;
} gp_totals_t;

static void gp_totals(const gp_tensor_t *t, size_t n, const int *sel, gp_totals_t *s)
{
    size_t i;

    memset(s, 0, sizeof(*s));
    for (i = 0; i < n; i++) {
        const gp_opt_t *o = &t[i].opt[sel[i]];

        s->bits += o->bits * t[i].elems;
        s->gflops += o->gflops;
        s->err2 += o->err2;
    }
}

/* Within the limits? bits is the element-weighted sum, B the budget's. */
static int gp_fits(const gp_totals_t *s, double B, double F)
{
    return (B <= 0.0 || s->bits <= B * (1.0 + 1e-12)) &&
           (F <= 0.0 || s->gflops <= F * (1.0 + 1e-12));
}

/* Cheapest option of t within mask: fewest bits, then flops, then error, then index. */
static int gp_cheapest(const gp_tensor_t *t, uint32_t mask)
{
    int i, best = -1;

    for (i = 0; i < t->nopt; i++) {
        const gp_opt_t *o = &t->opt[i], *b;

        if (!(mask & (1u << i)))
            continue;
        if (best < 0) {
            best = i;
            continue;
        }
        b = &t->opt[best];
        if (o->bits < b->bits ||
            (o->bits == b->bits &&
             (o->gflops < b->gflops || (o->gflops == b->gflops && o->err2 < b->err2))))
            best = i;
    }
    return best;
}

/*
 * One solve: every tensor within masks[i]. Unknown tensors take the largest
 * uniform format (their declared one first) that fits with every other tensor
 * at its cheapest; then the greedy over the known ones. Returns 1 when even
 * the cheapest options break a limit (sel then holds them), else 0.
 */
static int gp_solve(const gp_tensor_t *t, size_t n, const uint32_t *masks, double B, double F,
                    int *sel)
{
    gp_totals_t s;
    size_t i;
    int f;

    for (i = 0; i < n; i++)
        sel[i] = gp_cheapest(&t[i], masks[i]);
    gp_totals(t, n, sel, &s);
    if (!gp_fits(&s, B, F))
        return 1;
    /* Unknown tensors: one format rank r for all (0 = each its declared). */
    for (f = 0; f < GP_MAX_FMT; f++) {
        int *try = malloc(n * sizeof(int)), any = 0;

        if (try == NULL)
            return GIFT_ENOMEM;
        memcpy(try, sel, n * sizeof(int));
        for (i = 0; i < n; i++) {
            int j, fi = f < t[i].nfmt ? f : t[i].nfmt - 1, pick = -1;

            if (t[i].known)
                continue;
            /* options are listed mode-major, formats declared first then smaller */
            for (j = 0; j < t[i].nopt && pick < 0; j++)
                if ((masks[i] & (1u << j)) && j % t[i].nfmt == fi)
                    pick = j;
            if (pick >= 0) {
                try[i] = pick;
                any = 1;
            }
        }
        if (any) {
            gp_totals(t, n, try, &s);
            if (gp_fits(&s, B, F)) {
                memcpy(sel, try, n * sizeof(int));
                free(try);
                break;
            }
        }
        free(try);
    }
    /* The greedy over the known tensors. */
    gp_totals(t, n, sel, &s);
    for (;;) {
        int bt = -1, bo = -1;
        double beff = -1.0;
        int bfree = 0;

        for (i = 0; i < n; i++) {
            const gp_opt_t *cur = &t[i].opt[sel[i]];
            int j;

            if (!t[i].known)
                continue;
            for (j = 0; j < t[i].nopt; j++) {
                const gp_opt_t *o = &t[i].opt[j];
                gp_totals_t s2 = s;
                double gain = cur->err2 - o->err2, cost = 0.0, eff;
                int isfree;

                if (!(masks[i] & (1u << j)) || j == sel[i])
                    continue;
                if (!(gain > GIFT_POLICY_MIN_GAIN * cur->err2) || !(gain > 0.0))
                    continue;
                s2.bits += (o->bits - cur->bits) * t[i].elems;
                s2.gflops += o->gflops - cur->gflops;
                if (!gp_fits(&s2, B, F))
                    continue;
                if (B > 0.0 && o->bits > cur->bits)
                    cost += (o->bits - cur->bits) * t[i].elems / B;
                if (F > 0.0 && o->gflops > cur->gflops)
                    cost += (o->gflops - cur->gflops) / F;
                isfree = !(cost > 0.0);
                eff = isfree ? gain : gain / cost;
                if ((isfree && !bfree) || (isfree == bfree && eff > beff)) {
                    bt = (int)i;
                    bo = j;
                    beff = eff;
                    bfree = isfree;
                }
            }
        }
        if (bt < 0)
            break;
        s.bits += (t[bt].opt[bo].bits - t[bt].opt[sel[bt]].bits) * t[bt].elems;
        s.gflops += t[bt].opt[bo].gflops - t[bt].opt[sel[bt]].gflops;
        sel[bt] = bo;
    }
    return 0;
}

int gift_policy_choose(const gift_policy_cfg_t *cfg, const gift_policy_in_t *in, size_t n,
                       gift_policy_choice_t *out)
{
    gp_tensor_t *t = NULL;
    uint32_t *masks = NULL;
    int *sel = NULL, *cand = NULL, rc = GIFT_EINVAL, infeasible = 0;
    double B, F, elems = 0.0;
    size_t i;

    if (cfg == NULL || in == NULL || out == NULL || n == 0 || cfg->policy < GIFT_POLICY_ALL ||
        cfg->policy > GIFT_POLICY_HITS || !isfinite(cfg->budget_bits) ||
        !isfinite(cfg->max_gflops) || !isfinite(cfg->hits_threshold))
        return GIFT_EINVAL;
    for (i = 0; i < n; i++)
        if ((rc = gp_check_in(&in[i])) < 0)
            return rc;
    rc = GIFT_ENOMEM;
    t = calloc(n, sizeof(*t));
    masks = calloc(n, sizeof(*masks));
    sel = calloc(n, sizeof(*sel));
    cand = calloc(n, sizeof(*cand));
    if (t == NULL || masks == NULL || sel == NULL || cand == NULL)
        goto out;
    for (i = 0; i < n; i++) {
        if ((rc = gp_tensor_build(cfg, &in[i], &t[i])) < 0)
            goto out;
        elems += t[i].elems;
    }
    B = cfg->budget_bits > 0.0 ? cfg->budget_bits * elems : 0.0;
    F = cfg->max_gflops > 0.0 ? cfg->max_gflops : 0.0;

    for (i = 0; i < n; i++)
        masks[i] = gp_mask(cfg, &in[i], &t[i], cfg->policy);
    if ((rc = gp_solve(t, n, masks, B, F, sel)) < 0)
        goto out;
    infeasible = rc;
    if (cfg->policy == GIFT_POLICY_AUTO && !infeasible) {
        /* AUTO is never predicted worse than ALL, NONE or HITS under the same limits by
         * more than the hysteresis: a candidate replaces the greedy's choice when it
         * predicts more than GIFT_POLICY_MIN_GAIN less in total. */
        static const int others[] = {GIFT_POLICY_ALL, GIFT_POLICY_NONE, GIFT_POLICY_HITS};
        gp_totals_t best, s;
        int p;

        gp_totals(t, n, sel, &best);
        for (p = 0; p < 3; p++) {
            for (i = 0; i < n; i++)
                masks[i] = t[i].known ? gp_mask(cfg, &in[i], &t[i], others[p])
                                      : gp_mask(cfg, &in[i], &t[i], GIFT_POLICY_AUTO);
            if ((rc = gp_solve(t, n, masks, B, F, cand)) < 0)
                goto out;
            if (rc != 0)
                continue;
            gp_totals(t, n, cand, &s);
            if (s.err2 < best.err2 * (1.0 - GIFT_POLICY_MIN_GAIN)) {
                best = s;
                memcpy(sel, cand, n * sizeof(int));
            }
        }
    }
    if (infeasible) /* the cheapest of everything: Euclidean at the smallest format */
        for (i = 0; i < n; i++)
            sel[i] = gp_cheapest(&t[i], ~0u);
    for (i = 0; i < n; i++) {
        const gp_opt_t *o = &t[i].opt[sel[i]];
        double e0 = t[i].opt[t[i].eucl_decl].err2;

        out[i].gift = o->gift;
        out[i].k = o->k;
        out[i].format = o->fmt;
        out[i].pred_err2 = o->err2;
        out[i].pred_ratio = (t[i].known && e0 > 0.0) ? sqrt(o->err2 / e0) : 1.0;
        out[i].bits = o->bits;
        out[i].gflops = o->gflops;
    }
    rc = infeasible ? GIFT_POLICY_INFEASIBLE : 0;
out:
    free(t);
    free(masks);
    free(sel);
    free(cand);
    return rc;
}
