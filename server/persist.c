/*
 * persist.c: the shard's persistence (shard.h, "Persistence"): the step log
 * the shard journals to, the checkpoint snapshot and the restore that
 * replays both. checkpoint.h makes the bytes durable and checks them; this
 * file decides what they hold.
 *
 * It reaches the shard's state through shard_internal.h and calls only
 * shard functions that never come back here (gift__shard_*); the shard
 * reaches it only through the journal table below, which a restore
 * attaches once the step log is open.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "gift_error.h"
#include "gift_policy.h"
#include "log.h"
#include "owner.h"
#include "policy_owner.h"
#include "shard_internal.h"

/* ------------------------------------------------------------------ */
/* The policy's state on disk (issue 24)                                */
/* ------------------------------------------------------------------ */

/* A codec as its format and block (the rest of gift_codec_params_t is 0
 * for every codec a tensor, a decision or a push holds). */
static void put_codec(gift_ckpt_buf_t *b, const gift_codec_params_t *p)
{
    gift_ckpt_put_u32(b, (uint32_t)p->fmt);
    gift_ckpt_put_u32(b, p->block);
}

static void get_codec(gift_ckpt_cur_t *c, gift_codec_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->fmt = (gift_format_t)gift_ckpt_get_u32(c);
    p->block = gift_ckpt_get_u32(c);
}

/* An epoch record's decision: set, euclid, k, push, pull, ratio, bits. */
static void put_treat(gift_ckpt_buf_t *b, const gift_treat_t *tr)
{
    gift_ckpt_put_u32(b, (uint32_t)tr->set);
    gift_ckpt_put_u32(b, (uint32_t)tr->euclid);
    gift_ckpt_put_u32(b, tr->k);
    put_codec(b, &tr->push);
    put_codec(b, &tr->pull);
    gift_ckpt_put_f64(b, tr->pred_ratio);
    gift_ckpt_put_f64(b, tr->bits);
}

/* Reads and checks (gift__pol_treat_load) a decision of t. 0, or GIFT_EIO
 * (with c->err set when the body is short, else with why). */
static int get_treat(gift_ckpt_cur_t *c, const tensor_t *t, gift_treat_t *tr, char *why,
                     size_t whylen)
{
    uint32_t set, euclid;
    memset(tr, 0, sizeof *tr);
    set = gift_ckpt_get_u32(c);
    euclid = gift_ckpt_get_u32(c);
    tr->k = gift_ckpt_get_u32(c);
    get_codec(c, &tr->push);
    get_codec(c, &tr->pull);
    tr->pred_ratio = gift_ckpt_get_f64(c);
    tr->bits = gift_ckpt_get_f64(c);
    if (c->err)
        return GIFT_EIO;
    if (set > 1 || euclid > 1) {
        snprintf(why, whylen, "tensor %u: a saved decision has set %u, euclidean %u (not 0 or 1)",
                 t->key, set, euclid);
        return GIFT_EIO;
    }
    tr->set = (int)set;
    tr->euclid = (int)euclid;
    return gift__pol_treat_load(t, tr, why, whylen);
}

/* The chooser's choices of its last round (s->pol_out), which a tensor
 * built later in the same round takes: ok, round, n, then each choice. */
static void put_round(gift_ckpt_buf_t *b, const gift_shard_t *s)
{
    const gift_policy_choice_t *out = s->pol_out;
    size_t n = out != NULL ? gift__pol_count(s) : 0;
    gift_ckpt_put_u32(b, (uint32_t)(s->pol_round_ok && n > 0));
    gift_ckpt_put_u64(b, s->pol_round);
    gift_ckpt_put_u32(b, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        gift_ckpt_put_u32(b, (uint32_t)out[i].gift);
        gift_ckpt_put_u32(b, out[i].k);
        gift_ckpt_put_u32(b, (uint32_t)out[i].format);
        gift_ckpt_put_f64(b, out[i].pred_err2);
        gift_ckpt_put_f64(b, out[i].pred_ratio);
        gift_ckpt_put_f64(b, out[i].bits);
        gift_ckpt_put_f64(b, out[i].gflops);
    }
}

/* Reads put_round's record, checked: as many choices as this shard's
 * chooser makes, each a known format and a rank no larger than its
 * tensor's; into s->pol_out when apply. 0 or GIFT_EIO (c->err set when
 * short, else with why). */
static int get_round(gift_ckpt_cur_t *c, gift_shard_t *s, int apply, char *why, size_t whylen)
{
    gift_policy_choice_t *out = s->pol_out;
    uint32_t ok = gift_ckpt_get_u32(c);
    uint64_t round = gift_ckpt_get_u64(c);
    uint32_t n = gift_ckpt_get_u32(c);
    size_t want = out != NULL ? gift__pol_count(s) : 0, j = 0;
    if (c->err)
        return GIFT_EIO;
    if (want == 0) {
        /* Saved under a policy this shard no longer runs: skipped. */
        gift_ckpt_get(c, NULL, (size_t)n * 44);
        if (apply)
            s->pol_round_ok = 0;
        return c->err ? GIFT_EIO : 0;
    }
    if (ok > 1 || (n != 0 && n != want) || (ok && n == 0)) {
        snprintf(why, whylen,
                 "the saved policy round has %u choices (ok %u); this shard's chooser makes %zu", n,
                 ok, want);
        return GIFT_EIO;
    }
    for (size_t i = 0; i < s->ntensors && j < n; i++) {
        const tensor_t *t = &s->tensors[i];
        gift_policy_choice_t ch;
        if (!t->owner || !t->geometry || t->gbar == NULL)
            continue;
        ch.gift = (int)gift_ckpt_get_u32(c);
        ch.k = gift_ckpt_get_u32(c);
        ch.format = (int)gift_ckpt_get_u32(c);
        ch.pred_err2 = gift_ckpt_get_f64(c);
        ch.pred_ratio = gift_ckpt_get_f64(c);
        ch.bits = gift_ckpt_get_f64(c);
        ch.gflops = gift_ckpt_get_f64(c);
        if (c->err)
            return GIFT_EIO;
        if ((ch.gift != 0 && ch.gift != 1) || ch.k > t->k || ch.format < -1 ||
            ch.format >= GIFT_FMT_COUNT_ || !isfinite(ch.pred_err2) || !isfinite(ch.pred_ratio) ||
            !isfinite(ch.bits) || !isfinite(ch.gflops)) {
            snprintf(why, whylen,
                     "tensor %u: the saved policy choice (gift %d, k %u of %u, format %d, ratio "
                     "%g, bits %g) is invalid",
                     t->key, ch.gift, ch.k, t->k, ch.format, ch.pred_ratio, ch.bits);
            return GIFT_EIO;
        }
        if (apply)
            out[j] = ch;
        j++;
    }
    if (apply) {
        s->pol_round_ok = (int)ok;
        s->pol_round = round;
    }
    return 0;
}

/* What the chooser reads of t besides its geometry: the boundary-hit rate
 * (hit_known, hit_rate), and gbar (gbar_ok, gbar_step, then its floats
 * when `with_gbar`). */
static void put_observed(gift_ckpt_buf_t *b, const tensor_t *t, int with_gbar)
{
    gift_ckpt_put_u32(b, (uint32_t)t->hit_known);
    gift_ckpt_put_f64(b, t->hit_rate);
    gift_ckpt_put_u32(b, (uint32_t)t->gbar_ok);
    gift_ckpt_put_u64(b, t->gbar_step);
    if (with_gbar)
        gift_ckpt_put_blob(b, t->gbar, t->gbar != NULL ? (size_t)t->by_id[0]->n * 4 : 0);
}

/* Reads put_observed's fields into t (the gbar blob when with_gbar; a blob
 * of 0 bytes or without a gbar buffer keeps none). 0 or GIFT_EIO with why. */
static int get_observed(gift_ckpt_cur_t *c, tensor_t *t, int with_gbar, char *why, size_t whylen)
{
    uint32_t hk = gift_ckpt_get_u32(c);
    double hr = gift_ckpt_get_f64(c);
    uint32_t gok = gift_ckpt_get_u32(c);
    uint64_t gstep = gift_ckpt_get_u64(c);
    size_t gn = t->gbar != NULL ? (size_t)t->by_id[0]->n * 4 : 0, len = 0;
    const uint8_t *g = with_gbar ? gift_ckpt_get_blob(c, &len, gn) : NULL;
    if (c->err)
        return GIFT_EIO;
    if (hk > 1 || gok > 1 || !(hr >= 0.0 && hr <= 1.0) || (with_gbar && len != 0 && len != gn)) {
        snprintf(why, whylen,
                 "tensor %u: the saved policy inputs are invalid (hit rate %g, known %u; mean "
                 "kept %u, %zu bytes of %zu)",
                 t->key, hr, hk, gok, len, gn);
        return GIFT_EIO;
    }
    t->hit_known = (int)hk;
    t->hit_rate = hr;
    if (t->gbar == NULL)
        return 0; /* saved under a policy this shard no longer runs */
    if (with_gbar) {
        if (len == gn && gn > 0)
            memcpy(t->gbar, g, len);
        else
            gok = 0; /* saved without a policy */
    }
    t->gbar_ok = (int)gok;
    t->gbar_step = gstep;
    return 0;
}

/* Appends one record to the open step log, counting it (a no-op while
 * replaying or without persistence). Returns 0 or GIFT_EIO. */
static int log_append(gift_shard_t *s, uint32_t type, const void *const *parts, const size_t *lens,
                      int n, int sync)
{
    int rc;
    uint64_t before = s->log.bytes;
    if (!s->persist || s->replaying)
        return 0;
    if (s->log.err_no != 0) {
        /* Fail-stop: after a failed write nothing more is appended, so the
         * log stays a prefix of the run that a restart can replay (a later
         * record of the same chunk would leave a gap it refuses). */
        s->c.log_failures++;
        return GIFT_EIO;
    }
    if ((rc = gift_log_append(&s->log, type, parts, lens, n, sync)) < 0) {
        s->c.log_failures++;
        return rc;
    }
    s->c.log_records++;
    s->c.log_bytes += s->log.bytes - before;
    return 0;
}

/* Appends a finished chunk step to the step log (a no-op while replaying). */
static int log_step(gift_shard_t *s, const chunk_t *ch, const reply_t *r)
{
    uint8_t h[36], pe[4], ob[32];
    const void *parts[6];
    size_t lens[6];
    int nparts = 2, new_gbar;
    gift_ckpt_buf_t b = {0}, o = {ob, 0, sizeof ob, 0};
    const tensor_t *t = ch->t;
    int rc;
    if (s->replaying)
        return 0;
    /* key, chunk, step, epoch, err, reply length, the reply's codec, the
     * reply bytes; with pull error feedback then the residual's epoch and
     * the residual; then what the policy observed (put_observed without
     * gbar, whether gbar follows, and gbar when this step filled it). */
    b.p = h;
    b.cap = sizeof h;
    gift_ckpt_put_u32(&b, t->key);
    gift_ckpt_put_u32(&b, ch->id);
    gift_ckpt_put_u64(&b, r->step);
    gift_ckpt_put_u32(&b, r->epoch);
    gift_ckpt_put_u32(&b, (uint32_t)r->err);
    gift_ckpt_put_u32(&b, r->err ? 0u : (uint32_t)r->len);
    put_codec(&b, &r->pull);
    parts[0] = h;
    lens[0] = b.len;
    parts[1] = r->buf->data;
    lens[1] = r->err ? 0 : r->len;
    if (ch->pres != NULL) {
        /* Pull error feedback: the residual after this step, so a replay
         * of the log resumes it (its epoch, then n floats). */
        gift_ckpt_buf_t eb = {.p = pe, .cap = sizeof pe};
        gift_ckpt_put_u32(&eb, ch->pres_epoch);
        parts[2] = pe;
        lens[2] = sizeof pe;
        parts[3] = ch->pres;
        lens[3] = ch->n * sizeof(float);
        nparts = 4;
    }
    new_gbar = t->gbar != NULL && ch->id == 0 && t->gbar_ok && t->gbar_step == r->step;
    put_observed(&o, t, 0);
    gift_ckpt_put_u32(&o, (uint32_t)new_gbar);
    parts[nparts] = ob;
    lens[nparts++] = o.len;
    if (new_gbar) {
        parts[nparts] = t->gbar;
        lens[nparts++] = ch->n * sizeof(float);
    }
    if ((rc = log_append(s, GIFT_LOG_STEP2, parts, lens, nparts, !s->o.group_commit)) < 0)
        GIFT_LOG_ERROR(0,
                       "tensor %u chunk %u step %" PRIu64 " is not durable: its pulls fail "
                       "with %s",
                       ch->t->key, ch->id, r->step, gift_strerror(GIFT_EIO));
    return rc;
}

static void log_epoch(gift_shard_t *s, const tensor_t *t)
{
    gift_ckpt_buf_t b = {0};
    const void *parts[3];
    size_t lens[3];
    if (!s->persist || s->replaying)
        return;
    /* As GIFT_LOG_EPOCH, then the epoch's decision and the round's choices
     * (put_treat, put_round), then U and lambda. */
    gift_ckpt_put_u32(&b, t->key);
    gift_ckpt_put_u64(&b, t->sk_done_step);
    gift_ckpt_put_u32(&b, t->geo.epoch);
    gift_ckpt_put_u64(&b, t->epochs[t->nepochs - 1].valid_from);
    gift_ckpt_put_u32(&b, (uint32_t)t->geo.identity);
    gift_ckpt_put_f64(&b, t->geo.trace);
    gift_ckpt_put_f64(&b, t->geo.sigma2);
    gift_ckpt_put_f64(&b, t->geo.delta);
    put_treat(&b, &t->epochs[t->nepochs - 1].tr);
    put_round(&b, s);
    parts[0] = b.p;
    lens[0] = b.len;
    parts[1] = t->geo.U;
    lens[1] = (size_t)t->cols * t->ks * sizeof(float);
    parts[2] = t->geo.lambda;
    lens[2] = (size_t)t->ks * sizeof(float);
    /* If this fails, a restart rebuilds the epoch from the logged sketches. */
    if (b.err || log_append(s, GIFT_LOG_EPOCH2, parts, lens, 3, 1) < 0)
        GIFT_LOG_ERROR(0, "tensor %u: epoch %u not written to the step log", t->key, t->geo.epoch);
    gift_ckpt_buf_free(&b);
}

/* The oldest unfinished step over the chunks that have started (0 if none). */
static uint64_t min_base(const gift_shard_t *s)
{
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < s->nchunks; i++)
        if (s->chunks[i].started && s->chunks[i].base < m)
            m = s->chunks[i].base;
    return m == UINT64_MAX ? 0 : m;
}

static void ckpt_schedule(gift_shard_t *s)
{
    uint64_t cs = s->o.checkpoint_steps;
    if (cs)
        s->ckpt_next = (min_base(s) / cs + 1) * cs;
}

static void maybe_checkpoint(gift_shard_t *s)
{
    char err[512];
    if (!s->persist || s->replaying || min_base(s) < s->ckpt_next)
        return;
    if (gift_shard_checkpoint(s, err, sizeof err) < 0)
        GIFT_LOG_ERROR(0, "checkpoint failed: %s (the step log keeps growing)", err);
}

/* ------------------------------------------------------------------ */
/* The journal the shard calls (gift_shard_journal_t)                   */
/* ------------------------------------------------------------------ */

/* The world size, then the Declare; then the first checkpoint's step. */
static int journal_declare(gift_shard_t *s)
{
    uint8_t wb[4] = {(uint8_t)s->world, (uint8_t)(s->world >> 8), (uint8_t)(s->world >> 16),
                     (uint8_t)(s->world >> 24)};
    const void *parts[2] = {wb, s->decl};
    size_t lens[2] = {4, s->decl_len};
    int rc;
    if ((rc = log_append(s, GIFT_LOG_DECLARE, parts, lens, 2, 1)) < 0)
        return rc;
    ckpt_schedule(s);
    return 0;
}

/* An accepted sketch, durable before its SketchAck. */
static int journal_sketch(gift_shard_t *s, const tensor_t *t, uint64_t step, uint32_t rank,
                          uint32_t epoch, double trace, const uint8_t *Y, size_t len)
{
    uint8_t h[36];
    const void *parts[2] = {h, Y};
    size_t lens[2] = {0, len};
    gift_ckpt_buf_t b = {h, 0, sizeof h, 0};
    gift_ckpt_put_u32(&b, t->key);
    gift_ckpt_put_u64(&b, step);
    gift_ckpt_put_u32(&b, rank);
    gift_ckpt_put_u32(&b, epoch);
    gift_ckpt_put_f64(&b, trace);
    gift_ckpt_put_u64(&b, len);
    lens[0] = b.len;
    return log_append(s, GIFT_LOG_SKETCH, parts, lens, 2, 1);
}

/* Group commit: one fdatasync for the steps appended since the last. */
static int journal_sync(gift_shard_t *s)
{
    int rc = s->log.err_no != 0 ? GIFT_EIO : gift_log_sync(&s->log);
    if (rc < 0)
        s->c.log_failures++;
    return rc;
}

/* giftctl reset: the files are moved aside as with giftd --reset; a new,
 * empty log of generation 0 takes the next run's records. */
static int journal_reset(gift_shard_t *s, char *err, size_t errlen)
{
    char where[4200];
    int rc;
    gift_log_close(&s->log);
    s->gen = 0;
    s->ckpt_next = 0;
    if ((rc = gift_ckpt_discard(s->dir, where, sizeof where, err, errlen)) < 0)
        return rc;
    if (rc > 0)
        GIFT_LOG_INFO(0, "reset: moved the state of %s (%d entries) into %s", s->dir, rc, where);
    return gift_log_open(&s->log, s->dir, 0, 1, err, errlen);
}

static const gift_shard_journal_t persist_journal = {
    .declare = journal_declare,
    .step = log_step,
    .sketch = journal_sketch,
    .epoch = log_epoch,
    .sync = journal_sync,
    .steps_done = maybe_checkpoint,
    .reset = journal_reset,
};

/* ------------------------------------------------------------------ */
/* Snapshot                                                             */
/* ------------------------------------------------------------------ */

/* The checkpoint body of format version v: see snapshot_load for the same
 * order. Version 2 adds each reply's codec (its blob then holds the reply's
 * own length), each epoch record's decision, each owned tensor's policy
 * inputs (put_observed) and the chooser's round (put_round). */
static int snapshot_build(gift_shard_t *s, uint64_t gen, uint32_t v, gift_ckpt_buf_t *b)
{
    gift_ckpt_put_u32(b, s->o.shard_id);
    gift_ckpt_put_u32(b, s->o.num_shards);
    gift_ckpt_put_u32(b, s->world);
    gift_ckpt_put_u32(b, (uint32_t)s->o.aggregate);
    gift_ckpt_put_u64(b, gen);
    gift_ckpt_put_blob(b, s->decl, s->decl_len);
    gift_ckpt_put_u64(b, s->nchunks);
    for (size_t i = 0; i < s->nchunks; i++) {
        const chunk_t *ch = &s->chunks[i];
        gift_ckpt_put_u32(b, ch->t->key);
        gift_ckpt_put_u32(b, ch->id);
        gift_ckpt_put_u32(b, (uint32_t)ch->started);
        gift_ckpt_put_u64(b, ch->base);
        for (int j = 0; j < 2; j++) {
            const reply_t *r = &ch->reply[j];
            int has = r->valid && !r->err;
            gift_ckpt_put_u32(b, (uint32_t)r->valid);
            gift_ckpt_put_u32(b, (uint32_t)r->err);
            gift_ckpt_put_u64(b, r->step);
            gift_ckpt_put_u32(b, r->epoch);
            if (v >= 2)
                put_codec(b, &r->pull);
            gift_ckpt_put_blob(b, r->buf->data, has ? (v >= 2 ? r->len : ch->pull_l.total) : 0);
        }
        if (ch->pres != NULL) { /* pull error feedback (the declaration says so) */
            gift_ckpt_put_u32(b, ch->pres_epoch);
            gift_ckpt_put_blob(b, ch->pres, ch->n * sizeof(float));
        }
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        const tensor_t *t = &s->tensors[i];
        size_t ny = (size_t)t->cols * t->ks;
        if (!t->owner || !t->geometry)
            continue;
        gift_ckpt_put_u32(b, t->key);
        gift_ckpt_put_u32(b, t->nepochs);
        for (uint32_t e = 0; e < t->nepochs; e++) {
            gift_ckpt_put_u32(b, t->epochs[e].epoch);
            gift_ckpt_put_u64(b, t->epochs[e].valid_from);
            if (v >= 2)
                put_treat(b, &t->epochs[e].tr);
        }
        gift_ckpt_put_u32(b, t->geo.epoch);
        gift_ckpt_put_u32(b, (uint32_t)t->geo.identity);
        gift_ckpt_put_f64(b, t->geo.trace);
        gift_ckpt_put_f64(b, t->geo.sigma2);
        gift_ckpt_put_f64(b, t->geo.delta);
        gift_ckpt_put_blob(b, t->geo.U, ny * 4);
        gift_ckpt_put_blob(b, t->geo.lambda, (size_t)t->ks * 4);
        gift_ckpt_put_u32(b, (uint32_t)t->sk_active);
        gift_ckpt_put_u64(b, t->sk_step);
        gift_ckpt_put_u32(b, t->sk_count);
        gift_ckpt_put_blob(b, t->sk_ranks, s->words * 8);
        gift_ckpt_put_u32(b, (uint32_t)t->sk_done);
        gift_ckpt_put_u64(b, t->sk_done_step);
        gift_ckpt_put_blob(b, t->ysum, ny * 4);
        gift_ckpt_put_f64(b, t->trace_sum);
        gift_ckpt_put_blob(b, t->yr, t->yr ? ny * 4 * s->world : 0);
        gift_ckpt_put_blob(b, t->tr, t->tr ? 8 * (size_t)s->world : 0);
        if (v >= 2)
            put_observed(b, t, 1);
    }
    if (v >= 2)
        put_round(b, s);
    gift_ckpt_put_u32(b, 0x454e4421u); /* "!DNE": end of body */
    return b->err;
}

int gift_shard_checkpoint(gift_shard_t *s, char *err, size_t errlen)
{
    return gift_shard_checkpoint_version(s, GIFT_CKPT_VERSION, err, errlen);
}

int gift_shard_checkpoint_version(gift_shard_t *s, uint32_t version, char *err, size_t errlen)
{
    gift_ckpt_buf_t *b = &s->ckpt_buf;
    gift_log_t nl;
    uint64_t gen = s->gen + 1;
    uint64_t t0 = now_ns(s);
    int rc;

    err[0] = '\0';
    if (!s->persist || !s->declared)
        return 0;
    if (s->log.err_no != 0) {
        /* The state holds a step that is in no log: a checkpoint of it
         * would make its failed pulls permanent. */
        snprintf(err, errlen,
                 "no checkpoint after the step log %s could not be written (%s); restart "
                 "giftd once there is space",
                 s->log.path, strerror(s->log.err_no));
        rc = GIFT_EIO;
        goto out;
    }
    b->len = 0;
    b->err = 0;
    if (version < GIFT_CKPT_VERSION_MIN || version > GIFT_CKPT_VERSION) {
        snprintf(err, errlen, "no checkpoint format version %u", version);
        rc = GIFT_EINVAL;
        goto out;
    }
    if ((rc = snapshot_build(s, gen, version, b)) < 0) {
        snprintf(err, errlen, "out of memory building the checkpoint");
        goto out;
    }
    if ((rc = gift_ckpt_write(s->dir, version, b->p, b->len, err, errlen)) < 0)
        goto out;
    /* The checkpoint names generation gen: its log starts empty and the
     * previous one is no longer read. */
    if ((rc = gift_log_open(&nl, s->dir, gen, 1, err, errlen)) < 0)
        goto out;
    gift_log_close(&s->log);
    s->log = nl;
    s->gen = gen;
    /* gift_ckpt_write made the checkpoint durable: the older logs' steps
     * are in it. */
    gift_log_remove_superseded(s->dir, gen);
    s->c.checkpoints++;
    GIFT_LOG_INFO(0,
                  "checkpoint %" PRIu64 " written: %zu bytes, oldest unfinished step %" PRIu64
                  " (%.1f ms)",
                  gen, b->len, min_base(s), (double)(now_ns(s) - t0) * 1e-6);
out:
    if (rc < 0)
        s->c.checkpoint_failures++;
    ckpt_schedule(s);
    return rc;
}

static int restore_declare(gift_shard_t *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    char why[256] = "";
    Gift__Declare *d = gift__declare__unpack(NULL, len, p);
    int rc;
    if (d == NULL) {
        snprintf(err, errlen, "the saved declaration does not parse");
        return GIFT_EIO;
    }
    if (s->world == 0) {
        snprintf(err, errlen, "a declaration is saved but no world size");
        gift__declare__free_unpacked(d, NULL);
        return GIFT_EIO;
    }
    if ((rc = gift__shard_declare_apply(s, d, why, sizeof why)) < 0)
        snprintf(err, errlen, "the saved declaration is refused: %s", why);
    gift__declare__free_unpacked(d, NULL);
    return rc;
}

#define SHORT_BODY 1 /* a load step's: the body is inconsistent at the cursor */

/* Chunk i of the checkpoint: its step, the replies of its last two
 * finished steps and its pull residual. 0, a code with err, or SHORT_BODY. */
static int load_chunk(gift_shard_t *s, gift_ckpt_cur_t *c, size_t i, uint32_t v, char *err,
                      size_t errlen)
{
    chunk_t *ch = &s->chunks[i];
    size_t n;
    uint32_t key = gift_ckpt_get_u32(c), id = gift_ckpt_get_u32(c);
    ch->started = gift_ckpt_get_u32(c) != 0;
    ch->base = gift_ckpt_get_u64(c);
    if (c->err)
        return SHORT_BODY;
    if (key != ch->t->key || id != ch->id) {
        snprintf(err, errlen, "chunk %zu of the checkpoint is %u/%u, not %u/%u", i, key, id,
                 ch->t->key, ch->id);
        return GIFT_EIO;
    }
    for (int j = 0; j < 2; j++) {
        reply_t *r = &ch->reply[j];
        const uint8_t *p;
        r->valid = gift_ckpt_get_u32(c) != 0;
        r->durable = 1;
        r->err = (int)gift_ckpt_get_u32(c);
        r->step = gift_ckpt_get_u64(c);
        r->epoch = gift_ckpt_get_u32(c);
        r->pull = ch->t->pull; /* version 1: the declared codec */
        if (v >= 2)
            get_codec(c, &r->pull);
        p = gift_ckpt_get_blob(c, &n, ch->pull_l.total);
        if (c->err)
            return SHORT_BODY;
        if (r->valid && !r->err) {
            if (gift__pol_reply_load(ch, &r->pull, n, err, errlen) < 0)
                return GIFT_EIO;
        } else {
            r->pull = ch->t->pull;
            n = 0;
        }
        memcpy(r->buf->data, p, n);
        r->buf->len = r->len = n ? n : ch->pull_l.total;
    }
    if (ch->pres != NULL) {
        const uint8_t *p;
        ch->pres_epoch = gift_ckpt_get_u32(c);
        p = gift_ckpt_get_blob(c, &n, ch->n * sizeof(float));
        if (c->err)
            return SHORT_BODY;
        if (n != ch->n * sizeof(float)) {
            snprintf(err, errlen,
                     "the pull residual of tensor %u chunk %u has %zu bytes, "
                     "not %zu",
                     key, id, n, ch->n * sizeof(float));
            return GIFT_EIO;
        }
        memcpy(ch->pres, p, n);
    }
    return 0;
}

/* The owner state of tensor t (its epoch records, geometry and the
 * sketches of an unfinished round), saved under aggregate agg. 0, a code
 * with err, or SHORT_BODY. */
static int load_owned(gift_shard_t *s, gift_ckpt_cur_t *c, tensor_t *t, uint32_t agg, uint32_t v,
                      char *err, size_t errlen)
{
    size_t n;
    int rc;
    size_t ny = (size_t)t->cols * t->ks, ul, ll, yl;
    const uint8_t *U, *L, *p;
    uint32_t epoch, identity;
    double trace, sigma2, delta;
    if (gift_ckpt_get_u32(c) != t->key || c->err)
        return SHORT_BODY;
    t->nepochs = gift_ckpt_get_u32(c);
    if (t->nepochs == 0 || t->nepochs > MAX_EPOCH_RECS)
        return SHORT_BODY;
    for (uint32_t e = 0; e < t->nepochs; e++) {
        gift_treat_t *tr = &t->epochs[e].tr;
        t->epochs[e].epoch = gift_ckpt_get_u32(c);
        t->epochs[e].valid_from = gift_ckpt_get_u64(c);
        /* Version 1 knew no policy: every epoch had the declared treatment. */
        memset(tr, 0, sizeof *tr);
        if (v >= 2 && (rc = get_treat(c, t, tr, err, errlen)) < 0)
            return c->err ? SHORT_BODY : rc;
    }
    epoch = gift_ckpt_get_u32(c);
    identity = gift_ckpt_get_u32(c);
    trace = gift_ckpt_get_f64(c);
    sigma2 = gift_ckpt_get_f64(c);
    delta = gift_ckpt_get_f64(c);
    U = gift_ckpt_get_blob(c, &ul, ny * 4);
    L = gift_ckpt_get_blob(c, &ll, (size_t)t->ks * 4);
    if (c->err || ul != ny * 4 || ll != (size_t)t->ks * 4)
        return SHORT_BODY;
    if ((rc = gift__owner_restore(t, epoch, (int)identity, trace, sigma2, delta, U, L)) < 0) {
        snprintf(err, errlen, "tensor %u: the saved geometry of epoch %u is invalid (%s)", t->key,
                 epoch, gift_strerror(rc));
        return GIFT_EIO;
    }
    t->sk_active = gift_ckpt_get_u32(c) != 0;
    t->sk_step = gift_ckpt_get_u64(c);
    t->sk_count = gift_ckpt_get_u32(c);
    p = gift_ckpt_get_blob(c, &n, s->words * 8);
    if (c->err || n != s->words * 8)
        return SHORT_BODY;
    memcpy(t->sk_ranks, p, n);
    t->sk_done = gift_ckpt_get_u32(c) != 0;
    t->sk_done_step = gift_ckpt_get_u64(c);
    p = gift_ckpt_get_blob(c, &yl, ny * 4);
    if (c->err || yl != ny * 4)
        return SHORT_BODY;
    memcpy(t->ysum, p, yl);
    t->trace_sum = gift_ckpt_get_f64(c);
    p = gift_ckpt_get_blob(c, &yl, ny * 4 * (size_t)s->world);
    if (c->err)
        return SHORT_BODY;
    if (t->yr && yl == ny * 4 * (size_t)s->world)
        memcpy(t->yr, p, yl);
    else if (t->sk_active && t->sk_count > 0 && (t->yr != NULL) != (yl != 0)) {
        snprintf(err, errlen,
                 "tensor %u: a sketch round saved under aggregate = %s cannot continue "
                 "under aggregate = %s",
                 t->key, agg == GIFT_SHARD_ORDERED ? "ordered" : "eager",
                 t->yr ? "ordered" : "eager");
        return GIFT_ECONFIG;
    }
    p = gift_ckpt_get_blob(c, &yl, 8 * (size_t)s->world);
    if (c->err)
        return SHORT_BODY;
    if (t->tr && yl == 8 * (size_t)s->world)
        memcpy(t->tr, p, yl);
    if (v >= 2 && (rc = get_observed(c, t, 1, err, errlen)) < 0)
        return c->err ? SHORT_BODY : rc;
    return 0;
}

/* Applies the checkpoint body (snapshot_build's order): the head (shard,
 * world, aggregate, generation), the declaration, then every chunk
 * (load_chunk) and every owned tensor (load_owned). Returns 0 or a negative
 * code with err. */
static int snapshot_load(gift_shard_t *s, const uint8_t *body, size_t len, uint32_t v, char *err,
                         size_t errlen)
{
    gift_ckpt_cur_t c = {body, len, 0, 0};
    uint32_t shard_id, num_shards, world, agg;
    const uint8_t *decl;
    size_t dlen;
    uint64_t nch;
    int rc;

    shard_id = gift_ckpt_get_u32(&c);
    num_shards = gift_ckpt_get_u32(&c);
    world = gift_ckpt_get_u32(&c);
    agg = gift_ckpt_get_u32(&c);
    s->gen = gift_ckpt_get_u64(&c);
    decl = gift_ckpt_get_blob(&c, &dlen, len);
    if (c.err)
        goto short_body;
    if (shard_id != s->o.shard_id || num_shards != s->o.num_shards) {
        snprintf(err, errlen, "the checkpoint is of shard %u of %u; this is shard %u of %u",
                 shard_id, num_shards, s->o.shard_id, s->o.num_shards);
        return GIFT_ECONFIG;
    }
    if (world == 0 || world > 65536 || (s->world != 0 && world != s->world)) {
        snprintf(err, errlen, "the checkpoint has world size %u; this shard is set to %u", world,
                 s->world);
        return GIFT_ECONFIG;
    }
    s->world = world;
    s->words = (world + 63) / 64;
    if (dlen == 0)
        goto end; /* nothing was declared */
    if ((rc = restore_declare(s, decl, dlen, err, errlen)) < 0)
        return rc;
    nch = gift_ckpt_get_u64(&c);
    if (c.err || nch != s->nchunks) {
        snprintf(err, errlen, "the checkpoint lists %" PRIu64 " chunks; its declaration has %zu",
                 nch, s->nchunks);
        return GIFT_EIO;
    }
    for (size_t i = 0; i < s->nchunks; i++)
        if ((rc = load_chunk(s, &c, i, v, err, errlen)) != 0)
            goto step_failed;
    for (size_t i = 0; i < s->ntensors; i++)
        if (s->tensors[i].owner && s->tensors[i].geometry &&
            (rc = load_owned(s, &c, &s->tensors[i], agg, v, err, errlen)) != 0)
            goto step_failed;
    /* Version 1: no round kept; the next build chooses afresh. */
    s->pol_round_ok = 0;
    if (v >= 2 && (rc = get_round(&c, s, 1, err, errlen)) < 0) {
        if (c.err)
            goto short_body;
        return rc;
    }
end:
    if (gift_ckpt_get_u32(&c) != 0x454e4421u || c.err || c.off != c.len)
        goto short_body;
    return 0;
step_failed:
    if (rc < 0)
        return rc;
short_body:
    snprintf(err, errlen, "the checkpoint body is inconsistent at byte %zu of %zu", c.off, c.len);
    return GIFT_EIO;
}

typedef struct replay_ctx {
    gift_shard_t *s;
    char *err;
    size_t errlen;
    uint64_t records;
} replay_ctx_t;

/* A Declare record (the world size, then the packed Declare): builds the
 * store, or checks that it is the one a checkpoint built. */
static int replay_declare(replay_ctx_t *x, gift_ckpt_cur_t *c)
{
    gift_shard_t *s = x->s;
    const uint8_t *body = c->p;
    size_t len = c->len;
    uint32_t world = gift_ckpt_get_u32(c);
    if (c->err || world == 0 || world > 65536 || (s->world != 0 && world != s->world)) {
        snprintf(x->err, x->errlen, "the step log declares world size %u; this shard has %u", world,
                 s->world);
        return GIFT_EIO;
    }
    if (s->declared) {
        if (len - 4 == s->decl_len && memcmp(body + 4, s->decl, len - 4) == 0)
            return 0;
        snprintf(x->err, x->errlen, "the step log declares a second, different tensor list");
        return GIFT_EIO;
    }
    s->world = world;
    s->words = (world + 63) / 64;
    return restore_declare(s, body + 4, len - 4, x->err, x->errlen);
}

/* A finished chunk step: its reply (and pull residual) become the chunk's
 * newest, and its base moves past it. Steps the checkpoint holds already
 * are skipped; a gap is corruption. */
static int replay_step(replay_ctx_t *x, gift_ckpt_cur_t *c, int v2)
{
    gift_shard_t *s = x->s;
    const uint8_t *body = c->p;
    uint32_t key = gift_ckpt_get_u32(c), id = gift_ckpt_get_u32(c);
    uint64_t step = gift_ckpt_get_u64(c);
    uint32_t epoch = gift_ckpt_get_u32(c), e = gift_ckpt_get_u32(c);
    uint32_t n = gift_ckpt_get_u32(c);
    chunk_t *ch = gift__shard_find_chunk(s, key, id);
    size_t extra = ch != NULL && ch->pres != NULL ? 4 + ch->n * sizeof(float) : 0, head, rest;
    gift_codec_params_t pull;
    tensor_t *t;
    uint32_t new_gbar = 0;
    reply_t *r;
    if (c->err || ch == NULL)
        goto misfit;
    t = ch->t;
    pull = t->pull; /* GIFT_LOG_STEP: the declared codec */
    if (v2)
        get_codec(c, &pull);
    head = c->off;
    rest = c->len - head;
    /* GIFT_LOG_STEP2 ends with what the policy observed (28 bytes, then
     * chunk 0's gbar when this step filled it). */
    if (c->err || n > ch->pull_l.total || rest < (size_t)n + extra ||
        (!v2 && (rest != n + extra || (e == 0 && n != ch->pull_l.total))))
        goto misfit;
    if (v2) {
        gift_ckpt_cur_t o = {body + head + n + extra, rest - n - extra, 0, 0};
        uint32_t gok;
        gift_ckpt_get(&o, NULL, 12); /* the hit rate: get_observed's, below */
        gok = gift_ckpt_get_u32(&o);
        uint64_t gstep = gift_ckpt_get_u64(&o);
        size_t gn = (size_t)ch->n * sizeof(float);
        new_gbar = gift_ckpt_get_u32(&o);
        if (o.err || new_gbar > 1 || o.len - o.off != (new_gbar ? gn : 0) ||
            (new_gbar && (id != 0 || !gok || gstep != step)))
            goto misfit;
        if (e == 0 && gift__pol_reply_load(ch, &pull, n, x->err, x->errlen) < 0)
            return GIFT_EIO;
        if (!(ch->started && step < ch->base)) {
            /* Applied with the step: the same bytes again, through
             * get_observed's checks, then the floats. */
            gift_ckpt_cur_t oc = {o.p, o.len, 0, 0};
            if (get_observed(&oc, t, 0, x->err, x->errlen) < 0)
                return GIFT_EIO;
            if (new_gbar && t->gbar != NULL)
                memcpy(t->gbar, o.p + o.off, gn);
        }
    }
    if (ch->started && step < ch->base)
        return 0; /* already in the checkpoint */
    if (ch->started && step != ch->base) {
        snprintf(x->err, x->errlen,
                 "tensor %u chunk %u: the step log jumps from step %" PRIu64 " to %" PRIu64, key,
                 id, ch->base, step);
        return GIFT_EIO;
    }
    r = &ch->reply[step & 1];
    r->valid = 1;
    r->durable = 1;
    r->err = (int)e;
    r->step = step;
    r->epoch = epoch;
    r->pull = e == 0 ? pull : t->pull;
    memcpy(r->buf->data, body + head, n);
    r->buf->len = r->len = e == 0 ? n : ch->pull_l.total;
    if (ch->pres != NULL) {
        gift_ckpt_cur_t pc = {body + head + n, extra, 0, 0};
        ch->pres_epoch = gift_ckpt_get_u32(&pc);
        memcpy(ch->pres, body + head + n + 4, ch->n * sizeof(float));
    }
    ch->started = 1;
    ch->base = step + 1;
    return 0;
misfit:
    snprintf(x->err, x->errlen, "a step record of tensor %u chunk %u does not fit the declaration",
             key, id);
    return GIFT_EIO;
}

/* An accepted sketch of an owned tensor t (ny = cols x ks floats): joins
 * its round again unless the round is done or holds it already. */
static int replay_sketch(replay_ctx_t *x, gift_ckpt_cur_t *c, tensor_t *t, uint64_t step, size_t ny)
{
    gift_shard_t *s = x->s;
    uint32_t rank = gift_ckpt_get_u32(c);
    uint32_t epoch = gift_ckpt_get_u32(c);
    double trace = gift_ckpt_get_f64(c);
    size_t yl;
    const uint8_t *Y = gift_ckpt_get_blob(c, &yl, ny * 4);
    (void)epoch;
    if (c->err || yl != ny * 4 || rank >= s->world) {
        snprintf(x->err, x->errlen, "a sketch record of tensor %u is malformed", t->key);
        return GIFT_EIO;
    }
    if ((t->sk_done && step <= t->sk_done_step) ||
        (t->sk_active && (step < t->sk_step || (step == t->sk_step && bit_get(t->sk_ranks, rank)))))
        return 0;
    if (!t->sk_active || step != t->sk_step)
        gift__owner_sketch_begin(t, s->words, step);
    gift__owner_sketch_add(t, s->o.aggregate == GIFT_SHARD_ORDERED, rank, trace, Y);
    s->c.sketches++;
    return 0;
}

/* A published epoch of an owned tensor t: restored and published again
 * (newer than the one held only), its round of step done. */
static int replay_epoch(replay_ctx_t *x, gift_ckpt_cur_t *c, tensor_t *t, uint64_t step, size_t ny,
                        int v2)
{
    uint32_t epoch = gift_ckpt_get_u32(c);
    uint64_t valid_from = gift_ckpt_get_u64(c);
    uint32_t identity = gift_ckpt_get_u32(c);
    double trace = gift_ckpt_get_f64(c), sigma2 = gift_ckpt_get_f64(c),
           delta = gift_ckpt_get_f64(c);
    const uint8_t *U, *L;
    gift_treat_t tr;
    size_t round_at = 0;
    int rc;
    memset(&tr, 0, sizeof tr); /* GIFT_LOG_EPOCH: the declared treatment */
    if (v2 && !c->err) {
        /* The decision, then the round's choices: checked now, applied
         * (from round_at) once the epoch is. */
        if ((rc = get_treat(c, t, &tr, x->err, x->errlen)) < 0 && !c->err)
            return rc;
        round_at = c->off;
        if (!c->err && (rc = get_round(c, x->s, 0, x->err, x->errlen)) < 0 && !c->err)
            return rc;
    }
    U = c->p + c->off;
    L = U + ny * 4;
    if (c->err || c->len - c->off != ny * 4 + (size_t)t->ks * 4) {
        snprintf(x->err, x->errlen, "an epoch record of tensor %u is malformed", t->key);
        return GIFT_EIO;
    }
    if (epoch <= t->geo.epoch)
        return 0;
    if ((rc = gift__owner_restore(t, epoch, (int)identity, trace, sigma2, delta, U, L)) < 0) {
        snprintf(x->err, x->errlen, "tensor %u: the logged epoch %u is invalid (%s)", t->key, epoch,
                 gift_strerror(rc));
        return GIFT_EIO;
    }
    /* gift__owner_publish re-copies U and lambda and appends the record. */
    if ((rc = gift__owner_publish(t, valid_from)) < 0)
        return rc;
    t->epochs[t->nepochs - 1].tr = tr;
    if (v2) {
        gift_ckpt_cur_t rc_cur = {c->p, c->len, round_at, 0};
        if ((rc = get_round(&rc_cur, x->s, 1, x->err, x->errlen)) < 0)
            return rc;
    }
    t->sk_active = 0;
    t->sk_done = 1;
    t->sk_done_step = step;
    return 0;
}

/* gift_log_replay's callback: one record of the step log, applied by its
 * type's step above. Returns 0, or a negative code with a sentence in
 * x->err (the restore then refuses the whole log). */
static int replay_record(uint32_t type, const uint8_t *body, size_t len, void *arg)
{
    replay_ctx_t *x = arg;
    gift_shard_t *s = x->s;
    gift_ckpt_cur_t c = {body, len, 0, 0};
    x->records++;
    if (type == GIFT_LOG_DECLARE)
        return replay_declare(x, &c);
    if (!s->declared) {
        snprintf(x->err, x->errlen, "the step log has a record of type %u before any declaration",
                 type);
        return GIFT_EIO;
    }
    if (type == GIFT_LOG_STEP || type == GIFT_LOG_STEP2)
        return replay_step(x, &c, type == GIFT_LOG_STEP2);
    if (type == GIFT_LOG_SKETCH || type == GIFT_LOG_EPOCH || type == GIFT_LOG_EPOCH2) {
        uint32_t key = gift_ckpt_get_u32(&c);
        uint64_t step = gift_ckpt_get_u64(&c);
        tensor_t *t = key < s->ntensors ? &s->tensors[key] : NULL;
        size_t ny;
        if (c.err || t == NULL || !t->owner || !t->geometry) {
            snprintf(x->err, x->errlen,
                     "a geometry record names tensor %u, which this shard "
                     "does not own",
                     key);
            return GIFT_EIO;
        }
        ny = (size_t)t->cols * t->ks;
        return type == GIFT_LOG_SKETCH ? replay_sketch(x, &c, t, step, ny)
                                       : replay_epoch(x, &c, t, step, ny, type == GIFT_LOG_EPOCH2);
    }
    snprintf(x->err, x->errlen, "the step log has a record of unknown type %u", type);
    return GIFT_EIO;
}

int gift_shard_datadir_check(const char *dir, char *err, size_t errlen)
{
    /* The body starts: shard id, shard count, world, aggregate (u32 each),
     * then the generation (snapshot_build). */
    uint8_t head[24];
    uint64_t gen = 0;
    int have;
    err[0] = '\0';
    if ((have = gift_ckpt_peek(dir, head, sizeof head, err, errlen)) < 0) {
        err[0] = '\0';
        return 0; /* damaged: gift_shard_restore says how */
    }
    for (int i = 0; have && i < 8; i++)
        gen |= (uint64_t)head[16 + i] << (8 * i);
    return gift_ckpt_audit(dir, have, gen, err, errlen);
}

int gift_shard_restore(gift_shard_t *s, char *err, size_t errlen)
{
    uint8_t *body = NULL;
    size_t len = 0;
    uint32_t version = 0;
    replay_ctx_t x = {s, err, errlen, 0};
    int rc, have, torn = 0;

    err[0] = '\0';
    if (!s->persist)
        return 0;
    if ((rc = gift_ckpt_mkdir(s->dir, err, errlen)) < 0)
        return rc;
    s->replaying = 1;
    if ((have = gift_ckpt_read(s->dir, &body, &len, &version, err, errlen)) < 0) {
        rc = have;
        goto fail;
    }
    if (have && (rc = snapshot_load(s, body, len, version, err, errlen)) < 0) {
        size_t n = strlen(err);
        /* Prefix the file's name: "DIR/checkpoint: why". */
        if (n + strlen(s->dir) + 14 < errlen) {
            size_t pre = strlen(s->dir) + 13;
            memmove(err + pre, err, n + 1);
            memcpy(err, s->dir, strlen(s->dir));
            memcpy(err + strlen(s->dir), "/checkpoint: ", 13);
        }
        goto fail;
    }
    /* Nothing is replayed, opened or removed while data_dir holds a file
     * this checkpoint (or its absence) does not account for. */
    if ((rc = gift_ckpt_audit(s->dir, have, s->gen, err, errlen)) < 0)
        goto fail;
    if ((rc = gift_log_replay(s->dir, s->gen, replay_record, &x, &torn, err, errlen)) < 0)
        goto fail;
    s->replaying = 0;
    if (have)
        gift_log_remove_superseded(s->dir, s->gen);
    if ((rc = gift_log_open(&s->log, s->dir, s->gen, 0, err, errlen)) < 0)
        goto fail;
    s->jr = &persist_journal;
    free(body);
    /* A round whose last sketch was logged but whose epoch was not. */
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->owner && t->geometry && t->sk_active && t->sk_count == s->world &&
            gift__shard_round_finish(s, t) > 0)
            log_epoch(s, t);
    }
    ckpt_schedule(s);
    if (!have && x.records == 0)
        return 0;
    s->c.restored_step = min_base(s);
    GIFT_LOG_INFO(0,
                  "restored from %s: checkpoint %s (generation %" PRIu64 "), %" PRIu64
                  " log records%s; %zu tensors, %zu chunks, world %u, oldest unfinished step "
                  "%" PRIu64,
                  s->dir, have ? "found" : "absent", s->gen, x.records,
                  torn ? " (an unfinished last record dropped)" : "", s->ntensors, s->nchunks,
                  s->world, min_base(s));
    return 1;
fail:
    s->replaying = 0;
    free(body);
    gift__shard_store_free(s);
    return rc < 0 ? rc : GIFT_EIO;
}