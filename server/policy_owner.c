/*
 * policy_owner.c: the geometry owner's per-tensor treatment of
 * policy_owner.h, and the check of the codecs a push claims. Numbers,
 * buffers and wire fields only; the shard does the talking.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_error.h"
#include "gift_policy.h"
#include "log.h"
#include "policy_owner.h"

/* A large element count: payload sizes compare as bytes per element. */
#define BPE_N ((size_t)1 << 20)

int gift__pol_format_from_wire(Gift__Format f)
{
    switch (f) {
    case GIFT__FORMAT__FORMAT_F32:
        return GIFT_FMT_F32;
    case GIFT__FORMAT__FORMAT_BF16:
        return GIFT_FMT_BF16;
    case GIFT__FORMAT__FORMAT_FP8_E4M3:
        return GIFT_FMT_E4M3;
    case GIFT__FORMAT__FORMAT_FP8_E5M2:
        return GIFT_FMT_E5M2;
    case GIFT__FORMAT__FORMAT_NVFP4:
        return GIFT_FMT_NVFP4;
    default:
        return GIFT_EFORMAT;
    }
}

int gift__pol_codec_from_wire(const Gift__Codec *c, gift_codec_params_t *p)
{
    gift_layout_t l;
    int f = gift__pol_format_from_wire(c ? c->format : GIFT__FORMAT__FORMAT_F32);
    if (f < 0)
        return GIFT_EFORMAT;
    memset(p, 0, sizeof *p);
    p->fmt = (gift_format_t)f;
    p->block = c ? c->block : 0;
    return gift_layout(p, 1, &l);
}

static int is_fp8(gift_format_t f)
{
    return f == GIFT_FMT_E4M3 || f == GIFT_FMT_E5M2;
}

/* The same codec on the wire: format, and the block where it matters
 * (0 and 128 are the same fp8 block). */
static int same_codec(const gift_codec_params_t *a, const gift_codec_params_t *b)
{
    if (a->fmt != b->fmt)
        return 0;
    if (!is_fp8(a->fmt))
        return 1;
    return (a->block ? a->block : 128) == (b->block ? b->block : 128);
}

/* Payload bytes of n elements in p; SIZE_MAX for a layout that fails. */
static size_t bytes_of(const gift_codec_params_t *p, size_t n)
{
    gift_layout_t l;
    return gift_layout(p, n, &l) < 0 ? SIZE_MAX : l.total;
}

/* Whether p fits every buffer sized for decl: no larger per element, and no
 * larger for any chunk of t this shard holds. */
static int fits(const tensor_t *t, const gift_codec_params_t *p, const gift_codec_params_t *decl)
{
    if (bytes_of(p, BPE_N) > bytes_of(decl, BPE_N))
        return 0;
    for (uint32_t i = 0; i < t->nchunks; i++)
        if (bytes_of(p, t->by_id[i]->n) > bytes_of(decl, t->by_id[i]->n))
            return 0;
    return 1;
}

int gift__pol_opts_ok(const gift_shard_opts_t *o)
{
    return o->policy >= GIFT_POLICY_ALL && o->policy <= GIFT_POLICY_HITS &&
           isfinite(o->budget_bits) && o->budget_bits >= 0.0 && isfinite(o->max_transform_gflops) &&
           o->max_transform_gflops >= 0.0 && isfinite(o->hits_threshold) &&
           o->hits_threshold >= 0.0;
}

int gift__pol_active(const gift_shard_t *s)
{
    return s->o.policy != GIFT_POLICY_ALL || s->o.budget_bits > 0.0 ||
           s->o.max_transform_gflops > 0.0;
}

/* The rows of t's chunk 0 (held here: t is owned). */
static uint32_t chunk0_rows(const tensor_t *t)
{
    return t->nchunks > 0 && t->by_id[0]->id == 0 ? t->by_id[0]->rows : 0;
}

static uint64_t tensor_need(const tensor_t *t)
{
    uint64_t n = (uint64_t)chunk0_rows(t);
    /* gbar (n x cols), its T^-1 scratch (n x k), d and d_inv (k each). */
    return 4 * (n * t->cols + n * t->k + 2 * (uint64_t)t->k);
}

uint64_t gift__pol_mem_need(const gift_shard_t *s)
{
    uint64_t need = 0;
    if (!gift__pol_active(s))
        return 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const tensor_t *t = &s->tensors[i];
        if (t->owner && t->geometry)
            need += tensor_need(t) + sizeof(gift_policy_in_t) + sizeof(gift_policy_choice_t);
    }
    return need;
}

int gift__pol_alloc(gift_shard_t *s)
{
    size_t n = 0;
    if (!gift__pol_active(s))
        return 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        size_t rows = chunk0_rows(t);
        if (!t->owner || !t->geometry || rows == 0)
            continue;
        n++;
        if ((t->gbar = calloc(rows * t->cols, sizeof(float))) == NULL ||
            (t->gbar_work = calloc(rows * t->k, sizeof(float))) == NULL ||
            (t->gbar_d = calloc(t->k, sizeof(float))) == NULL ||
            (t->gbar_dinv = calloc(t->k, sizeof(float))) == NULL)
            return GIFT_ENOMEM;
    }
    if (n > 0 && ((s->pol_in = calloc(n, sizeof(gift_policy_in_t))) == NULL ||
                  (s->pol_out = calloc(n, sizeof(gift_policy_choice_t))) == NULL))
        return GIFT_ENOMEM;
    return 0;
}

void gift__pol_free(tensor_t *t)
{
    free(t->gbar);
    free(t->gbar_work);
    free(t->gbar_d);
    free(t->gbar_dinv);
    t->gbar = t->gbar_work = t->gbar_d = t->gbar_dinv = NULL;
    t->gbar_ok = 0;
}

/* A codec of format f for t, from its declared decl: decl itself for the
 * same format, else f with decl's fp8 block (or the default one). */
static gift_codec_params_t codec_for(const gift_codec_params_t *decl, gift_format_t f)
{
    gift_codec_params_t p = *decl;
    if (f == decl->fmt)
        return p;
    p.fmt = f;
    p.block = is_fp8(f) && is_fp8(decl->fmt) ? decl->block : 0;
    return p;
}

/* The treatment a choice c means for t. The pull follows the push's format
 * when the tensor was declared with one format both ways; otherwise it
 * keeps the declared pull codec. Anything out of range keeps the declared
 * part of the treatment. */
static void treat_from_choice(const tensor_t *t, const gift_policy_choice_t *c, gift_treat_t *tr)
{
    memset(tr, 0, sizeof *tr);
    tr->push = t->push;
    tr->pull = t->pull;
    tr->k = t->k;
    tr->euclid = !c->gift;
    if (c->gift && c->k >= 1 && c->k <= t->k)
        tr->k = c->k;
    if (c->format >= 0 && c->format < GIFT_FMT_COUNT_) {
        gift_codec_params_t p = codec_for(&t->push, (gift_format_t)c->format);
        if (fits(t, &p, &t->push))
            tr->push = p;
        if (t->pull.fmt == t->push.fmt) {
            p = codec_for(&t->pull, (gift_format_t)c->format);
            if (fits(t, &p, &t->pull))
                tr->pull = p;
        }
    }
    tr->pred_ratio = c->pred_ratio;
    tr->bits = c->bits;
    tr->set = tr->euclid || tr->k != t->k || !same_codec(&tr->push, &t->push) ||
              !same_codec(&tr->pull, &t->pull);
}

/* Runs the chooser over every owned geometry tensor into s->pol_out (in
 * tensor order) and remembers the round it ran for. Returns its code. */
static int choose_round(gift_shard_t *s, uint64_t round, size_t *np)
{
    gift_policy_in_t *in = s->pol_in;
    gift_policy_choice_t *out = s->pol_out;
    gift_policy_cfg_t cfg = {0};
    size_t n = 0;
    int rc;

    s->pol_round_ok = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *u = &s->tensors[i];
        if (!u->owner || !u->geometry || u->gbar == NULL)
            continue;
        memset(&in[n], 0, sizeof in[n]);
        in[n].rows = u->rows;
        in[n].cols = u->cols;
        in[n].k_max = u->k;
        in[n].ks = u->ks;
        in[n].refresh = u->refresh;
        in[n].declared_format = (int)u->push.fmt;
        in[n].geo = &u->geo;
        in[n].gbar = u->gbar_ok ? u->gbar : NULL;
        in[n].nrows = chunk0_rows(u);
        in[n].hit_rate = u->hit_known ? u->hit_rate : -1.0; /* < 0: unknown (policy hits) */
        in[n].block = is_fp8(u->push.fmt) ? u->push.block : 0;
        n++;
    }
    *np = n;
    if (n == 0)
        return GIFT_EINVAL;
    cfg.policy = s->o.policy;
    cfg.budget_bits = s->o.budget_bits;
    cfg.max_gflops = s->o.max_transform_gflops;
    cfg.hits_threshold = s->o.hits_threshold;
    /* A Euclidean epoch still takes sketches (the owner may choose GIFT
     * again at the next one): their bytes count. */
    cfg.sketch_always = 1;
    memset(out, 0, n * sizeof *out);
    if ((rc = gift_policy_choose(&cfg, in, n, out)) < 0)
        return rc;
    if (rc == GIFT_POLICY_INFEASIBLE) {
        /* out holds the cheapest treatment of each tensor: say what it costs,
         * so the operator sees how far the limit is from what can be met. */
        double el = 0.0, bits = 0.0, gfl = 0.0;
        for (size_t i = 0; i < n; i++) {
            double e = (double)in[i].rows * in[i].cols;
            el += e;
            bits += out[i].bits * e;
            gfl += out[i].gflops;
        }
        GIFT_LOG_WARN(0,
                      "policy: the limits cannot be met on the %zu geometry tensors this shard "
                      "owns: budget_bits %g (0: unset) against %.4f bits per element for the "
                      "cheapest treatment (sketches and geometry counted in, at their refresh), "
                      "max_transform_gflops %g (0: unset) against %.3f; every tensor gets its "
                      "cheapest treatment",
                      n, cfg.budget_bits, el > 0.0 ? bits / el : 0.0, cfg.max_gflops, gfl);
    }
    s->pol_round = round;
    s->pol_round_ok = 1;
    return rc;
}

void gift__pol_decide(gift_shard_t *s, tensor_t *t, gift_treat_t *tr, uint64_t round)
{
    const gift_policy_choice_t *out = s->pol_out;
    size_t n = 0, me = SIZE_MAX;
    int rc;

    memset(tr, 0, sizeof *tr);
    tr->push = t->push;
    tr->pull = t->pull;
    tr->k = t->k;
    if (!gift__pol_active(s) || s->pol_in == NULL || out == NULL)
        return;
    for (size_t i = 0; i < s->ntensors; i++) {
        const tensor_t *u = &s->tensors[i];
        if (!u->owner || !u->geometry || u->gbar == NULL)
            continue;
        if (u == t)
            me = n;
        n++;
    }
    if (me == SIZE_MAX)
        return;
    /* Once per round: the prediction costs each tensor a few codings of its
     * chunk 0 and GEMMs (about 0.6 s for 1024 x 1024 on one core), which,
     * run again at every tensor's build, would make a round cost n^2 of
     * them on the event loop. A tensor built later in the round takes the
     * choice made with the geometry the others held at the first build. */
    if (!(s->pol_round_ok && s->pol_round == round) && (rc = choose_round(s, round, &n)) < 0) {
        GIFT_LOG_ERROR(0,
                       "tensor %u: the policy's chooser failed (%s); keeping the declared "
                       "treatment",
                       t->key, gift_strerror(rc));
        return;
    }
    treat_from_choice(t, &out[me], tr);
    GIFT_LOG_INFO(0,
                  "tensor %u: policy %s chose %s k %u, push %s pull %s (predicted ratio %.3g, "
                  "%.3g bits, %.3g GFLOP) for epoch %u",
                  t->key, gift_policy_name(s->o.policy), tr->euclid ? "euclidean" : "gift", tr->k,
                  gift_format_name(tr->push.fmt), gift_format_name(tr->pull.fmt), tr->pred_ratio,
                  tr->bits, out[me].gflops, t->geo.epoch);
}

void gift__pol_epoch0(gift_shard_t *s)
{
    if (!gift__pol_active(s))
        return;
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->owner && t->geometry && t->nepochs > 0)
            gift__pol_decide(s, t, &t->epochs[t->nepochs - 1].tr, UINT64_MAX);
    }
}

const gift_treat_t *gift__pol_treat_of(const tensor_t *t, uint32_t e)
{
    for (uint32_t i = 0; i < t->nepochs; i++)
        if (t->epochs[i].epoch == e)
            return &t->epochs[i].tr;
    return NULL;
}

int gift__pol_wants_mean(const chunk_t *ch, uint64_t step)
{
    const tensor_t *t = ch->t;
    return t->gbar != NULL && ch->id == 0 && (!t->gbar_ok || (step + 1) % t->refresh == 0);
}

void gift__pol_observe(const chunk_t *ch, const slot_t *sl, const reply_t *r)
{
    tensor_t *t = ch->t;
    const gift_treat_t *tr;
    gift_geometry_t g;

    /* A fused step (its mean went straight into the reply) left no mean in
     * acc: possible only when gbar_ok dropped between its pushes and now. */
    if (!gift__pol_wants_mean(ch, r->step) || r->err || !r->valid || sl->fused)
        return;
    /* Only the newest epoch's transform is held: a mean of an older one is
     * skipped (the previous gbar stays, the lag the chooser is told of). */
    if (r->epoch != t->geo.epoch || (tr = gift__pol_treat_of(t, r->epoch)) == NULL)
        return;
    memcpy(t->gbar, sl->acc, ch->n * sizeof(float));
    if (!t->geo.identity && !(tr->set && tr->euclid)) {
        g = t->geo;
        if (tr->set && tr->k < t->k) {
            /* The view forms no dense T (its buffer is the owner's). */
            g.dense = NULL;
            g.dense_on = 0;
            /* The transform of the lowered rank (gift_geometry_rank_sigma2):
             * a view of the owner's U and lambda with its own d, d_inv. */
            g.k = (int)tr->k;
            g.d = t->gbar_d;
            g.d_inv = t->gbar_dinv;
            if (gift_geometry_load(&g, g.U, g.lambda, g.trace,
                                   gift_geometry_rank_sigma2(&t->geo, (int)tr->k), g.delta, g.epoch,
                                   0) < 0) {
                t->gbar_ok = 0;
                return;
            }
        }
        if (gift_transform(&g, 1, t->gbar, (int)ch->rows, t->gbar, t->gbar_work) < 0) {
            t->gbar_ok = 0;
            return;
        }
    }
    t->gbar_ok = 1;
    t->gbar_step = r->step;
}

int gift__pol_push_codecs(const chunk_t *ch, const Gift__Push *m, gift_codec_params_t *push,
                          gift_codec_params_t *pull, size_t *push_len, size_t *pull_len, char *why,
                          size_t whylen)
{
    const tensor_t *t = ch->t;
    gift_codec_params_t p;
    *push = t->push;
    *pull = t->pull;
    *push_len = ch->push_l.total;
    *pull_len = ch->pull_l.total;
    /* The declared codec as before (a missing Codec is f32, an fp8 block of
     * 0 is 128); another only under geometry, and only one that fits. */
    if (gift__pol_codec_from_wire(m->codec, &p) < 0 ||
        (!same_codec(&p, &t->push) && (!t->geometry || !fits(t, &p, &t->push)))) {
        snprintf(why, whylen, "push codec differs from tensor %u's declared push codec %s", m->key,
                 gift_format_name(t->push.fmt));
        return GIFT_ECODEC;
    }
    if (!same_codec(&p, &t->push)) {
        *push = p;
        *push_len = bytes_of(push, ch->n);
    }
    if (m->pull_codec != NULL) {
        if (gift__pol_codec_from_wire(m->pull_codec, &p) < 0 ||
            (!same_codec(&p, &t->pull) && (!t->geometry || !fits(t, &p, &t->pull)))) {
            snprintf(why, whylen,
                     "push names a pull codec that tensor %u cannot use (declared %s; a policy "
                     "may only choose one no larger in bytes)",
                     m->key, gift_format_name(t->pull.fmt));
            return GIFT_ECODEC;
        }
        if (!same_codec(&p, &t->pull)) {
            *pull = p;
            *pull_len = bytes_of(pull, ch->n);
        }
    }
    return 0;
}

int gift__pol_step_codecs(const chunk_t *ch, slot_t *sl, uint64_t step, uint32_t epoch,
                          const gift_codec_params_t *push, const gift_codec_params_t *pull,
                          size_t push_len, size_t pull_len, char *why, size_t whylen)
{
    const tensor_t *t = ch->t;
    const gift_codec_params_t *wp = push, *wl = pull;
    if (t->owner && t->geometry) {
        const gift_treat_t *tr = gift__pol_treat_of(t, epoch);
        if (tr != NULL && tr->set) {
            wp = &tr->push;
            wl = &tr->pull;
        } else {
            wp = &t->push;
            wl = &t->pull;
        }
    } else if (sl->count > 0) {
        wp = &sl->push;
        wl = &sl->pull;
    }
    if (!same_codec(push, wp) || !same_codec(pull, wl)) {
        snprintf(why, whylen,
                 "push of tensor %u step %" PRIu64 " under epoch %u is %s, pulled as %s; the "
                 "step uses %s, pulled as %s",
                 t->key, step, epoch, gift_format_name(push->fmt), gift_format_name(pull->fmt),
                 gift_format_name(wp->fmt), gift_format_name(wl->fmt));
        return GIFT_ECODEC;
    }
    if (sl->count == 0) {
        sl->push = *push;
        sl->pull = *pull;
        sl->push_len = push_len;
        sl->pull_len = pull_len;
    }
    return 0;
}

/* Whether p, read from disk, may stand for decl on t: a known format whose
 * layout works, and decl itself or (under geometry) one that fits. */
static int codec_load_ok(const tensor_t *t, const gift_codec_params_t *p,
                         const gift_codec_params_t *decl)
{
    gift_layout_t l;
    if ((unsigned)p->fmt >= GIFT_FMT_COUNT_ || gift_layout(p, 1, &l) < 0)
        return 0;
    return same_codec(p, decl) || (t->geometry && fits(t, p, decl));
}

int gift__pol_treat_load(const tensor_t *t, gift_treat_t *tr, char *why, size_t whylen)
{
    if (!isfinite(tr->pred_ratio) || !isfinite(tr->bits)) {
        snprintf(why, whylen, "tensor %u: a saved decision has predicted ratio %g, bits %g", t->key,
                 tr->pred_ratio, tr->bits);
        return GIFT_EIO;
    }
    if (!tr->set) {
        tr->euclid = 0;
        tr->k = t->k;
        tr->push = t->push;
        tr->pull = t->pull;
        return 0;
    }
    tr->set = 1;
    tr->euclid = tr->euclid != 0;
    if (tr->k < 1 || tr->k > t->k) {
        snprintf(why, whylen, "tensor %u: a saved decision has rank %u; the declared rank is %u",
                 t->key, tr->k, t->k);
        return GIFT_EIO;
    }
    if (!codec_load_ok(t, &tr->push, &t->push) || !codec_load_ok(t, &tr->pull, &t->pull)) {
        snprintf(why, whylen,
                 "tensor %u: a saved decision has push format %d block %u, pull format %d "
                 "block %u; declared %s and %s, and a decision may only be a known format no "
                 "larger",
                 t->key, (int)tr->push.fmt, tr->push.block, (int)tr->pull.fmt, tr->pull.block,
                 gift_format_name(t->push.fmt), gift_format_name(t->pull.fmt));
        return GIFT_EIO;
    }
    return 0;
}

int gift__pol_reply_load(const chunk_t *ch, const gift_codec_params_t *p, size_t len, char *why,
                         size_t whylen)
{
    if (!codec_load_ok(ch->t, p, &ch->t->pull) || bytes_of(p, ch->n) != len) {
        snprintf(why, whylen,
                 "a saved reply of tensor %u chunk %u has format %d block %u and %zu bytes; "
                 "declared %s (%zu bytes), and a step's may only be a known format no larger",
                 ch->t->key, ch->id, (int)p->fmt, p->block, len, gift_format_name(ch->t->pull.fmt),
                 ch->pull_l.total);
        return GIFT_EIO;
    }
    return 0;
}

size_t gift__pol_count(const gift_shard_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->ntensors; i++)
        if (s->tensors[i].owner && s->tensors[i].geometry && s->tensors[i].gbar != NULL)
            n++;
    return n;
}

void gift__pol_geometry_wire(const tensor_t *t, Gift__Geometry *g, Gift__Codec *push,
                             Gift__Codec *pull)
{
    const gift_treat_t *tr = gift__pol_treat_of(t, t->geo.epoch);
    if (tr == NULL || !tr->set)
        return;
    g->euclidean = tr->euclid != 0;
    g->transform_rank = tr->k;
    gift__codec__init(push);
    push->format = (Gift__Format)tr->push.fmt;
    push->block = tr->push.block;
    gift__codec__init(pull);
    pull->format = (Gift__Format)tr->pull.fmt;
    pull->block = tr->pull.block;
    g->push_codec = push;
    g->pull_codec = pull;
    g->predicted_ratio = tr->pred_ratio;
    g->bits = tr->bits;
}
