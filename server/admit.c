/*
 * admit.c: the admission checks of admit.h, computed before the shard
 * allocates or accepts anything a peer asked for.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "admit.h"
#include "gift_codec.h"
#include "log.h"
#include "send.h"
#include "shard.h"

/* The parked pulls one connection may hold: max_parked_per_peer, or by
 * default what one worker can need (steps base and base + 1 of every chunk
 * here) and some room for repeats. Never more than the pool. */
uint32_t gift__admit_park_cap(const gift_shard_t *s)
{
    uint64_t cap = s->o.max_parked_per_peer ? s->o.max_parked_per_peer
                                            : gift__add_sat(gift__mul_sat(s->nchunks, 2), 64);
    return cap < s->o.max_parked ? (uint32_t)cap : s->o.max_parked;
}

uint64_t gift_shard_memory_default(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return 1ull << 40;
    return gift__mul_sat((uint64_t)pages, (uint64_t)size) / 4 * 3;
}

uint64_t gift_shard_memory_committed(const gift_shard_t *s)
{
    return s->declared ? s->mem : 0;
}

/* What the geometry owner of t allocates: the basis and its LAPACK
 * workspace (codec/geometry.c; thin, so no dense T), the sketch sums, with
 * ordered aggregation every rank's sketch, and two published copies of U
 * and lambda. */
static uint64_t geometry_need(const gift_shard_t *s, const tensor_t *t)
{
    uint64_t dks = gift__mul_sat(t->cols, t->ks), kk = gift__mul_sat(t->ks, t->ks), n;
    n = gift__mul_sat(dks, 4 + 16 + 4 + 8);               /* U, Q and B (double), ysum, 2 geo_buf */
    n = gift__add_sat(n, gift__mul_sat(kk, 16 + 16));     /* M, R, the eigenproblem */
    n = gift__add_sat(n, gift__mul_sat(t->ks, 64));       /* lambda, d, tau, ... */
    n = gift__add_sat(n, gift__mul_sat(t->cols, 64 * 8)); /* QR workspace (din x block) */
    n = gift__add_sat(n, gift__mul_sat(s->words, 8));     /* sk_ranks */
    if (s->o.aggregate == GIFT_SHARD_ORDERED)
        n = gift__add_sat(
            n, gift__mul_sat(s->world, gift__add_sat(gift__mul_sat(dks, 4), 8))); /* yr, tr */
    return n;
}

/* The bytes store_build will allocate for the checked declaration d: per
 * chunk its two accumulators, rank bitmaps and reply buffers, the kept
 * pushes of ordered aggregation (world per step), the pull residual; per
 * owned tensor its geometry; the tables and the packed Declare. Computed
 * with saturating arithmetic before anything is allocated. */
uint64_t gift__admit_store_need(const gift_shard_t *s, const Gift__Declare *d)
{
    int ordered = s->o.aggregate == GIFT_SHARD_ORDERED;
    uint64_t n = gift__declare__get_packed_size(d);
    n = gift__add_sat(n, gift__mul_sat(s->ntensors, sizeof(tensor_t)));
    n = gift__add_sat(n, gift__mul_sat(s->nchunks, sizeof(chunk_t) + 2 * sizeof(chunk_t *)));
    for (size_t i = 0; i < s->ntensors; i++) {
        const tensor_t *t = &s->tensors[i];
        n = gift__add_sat(n, strlen(t->name) + 1);
        if (t->owner && t->geometry)
            n = gift__add_sat(n, geometry_need(s, t));
    }
    for (size_t i = 0; i < s->nchunks; i++) {
        const chunk_t *ch = &s->chunks[i];
        uint64_t per_step = gift__mul_sat(ch->n, sizeof(float));
        per_step = gift__add_sat(per_step, gift__mul_sat(s->words, 8));
        per_step =
            gift__add_sat(per_step, gift__add_sat(ch->pull_l.total, sizeof(gift_rbuf_t) + 64));
        if (ordered)
            per_step = gift__add_sat(
                per_step, gift__mul_sat((ch->push_l.total + 63) & ~(uint64_t)63, s->world));
        n = gift__add_sat(n, gift__mul_sat(per_step, 2));
        if (ch->t->pull_ef)
            n = gift__add_sat(n, gift__mul_sat(ch->n, sizeof(float)));
    }
    return n;
}

/* Fails with GIFT_ENOMEM and a sentence in why when need is above the
 * budget: the figure, the budget, and the option that raises it. */
int gift__admit_budget(const gift_shard_t *s, uint64_t need, const char *what, char *why,
                       size_t whylen)
{
    if (need <= s->o.max_memory)
        return 0;
    if (need == UINT64_MAX)
        snprintf(why, whylen,
                 "%s needs more than 2^64 bytes; max_memory is %" PRIu64 " bytes (%.1f MiB)", what,
                 s->o.max_memory, (double)s->o.max_memory / 1048576.0);
    else
        snprintf(why, whylen,
                 "%s needs %" PRIu64 " bytes (%.1f MiB) of tensor memory on this "
                 "shard; max_memory is %" PRIu64 " bytes (%.1f MiB): raise max_memory "
                 "(--max-memory, GIFTD_MAX_MEMORY) or place the tensors on more shards",
                 what, need, (double)need / 1048576.0, s->o.max_memory,
                 (double)s->o.max_memory / 1048576.0);
    return GIFT_ENOMEM;
}

/* Checks and fixes the transform shape of a geometry tensor: its rank k
 * and basis width ks (declared, or the default policy), each named in the
 * error when out of range; the geometry math takes them as int. */
int gift__admit_geometry_shape(const gift_shard_t *s, tensor_t *t, const Gift__TensorDecl *td,
                               char *why, size_t whylen)
{
    int k, ks;
    if (t->cols < 2 || t->cols > INT32_MAX || t->rows > INT32_MAX) {
        snprintf(why, whylen,
                 "tensor %u has shape %u x %u: geometry needs 2 to 2^31-1 columns "
                 "and at most 2^31-1 rows",
                 t->key, t->rows, t->cols);
        return GIFT_ESHAPE;
    }
    k = td->rank ? (td->rank > t->cols ? -1 : (int)td->rank)
                 : gift_rank_default((int)t->rows, (int)t->cols);
    if (k < 1) {
        snprintf(why, whylen, "tensor %u: rank %u is outside 1..%u (its columns)", t->key, td->rank,
                 t->cols);
        return GIFT_ESHAPE;
    }
    ks = td->basis_cols ? (td->basis_cols > t->cols ? -1 : (int)td->basis_cols)
                        : gift_basis_cols((int)t->cols, k, GIFT_OVERSAMPLE_DEFAULT);
    if (ks < k) {
        snprintf(why, whylen, "tensor %u: a basis of %u columns is outside rank %d..%u columns",
                 t->key, td->basis_cols, k, t->cols);
        return GIFT_ESHAPE;
    }
    t->k = (uint32_t)k;
    t->ks = (uint32_t)ks;
    if ((uint64_t)t->cols * t->ks * 4 > s->o.max_frame_bytes) {
        snprintf(why, whylen,
                 "tensor %u: its sketch (%u x %u floats) is above max_frame_bytes "
                 "(%" PRIu64 ")",
                 t->key, t->cols, t->ks, s->o.max_frame_bytes);
        return GIFT_ESHAPE;
    }
    return 0;
}

/* The newest base step over the shard's anchored chunks (0 when none): a
 * tentative window, placed by one push with no step finished, says nothing
 * about what the shard finished. */
uint64_t gift__admit_newest_base(const gift_shard_t *s)
{
    uint64_t b = 0;
    for (size_t i = 0; i < s->nchunks; i++)
        if (s->chunks[i].started && !s->chunks[i].tentative && s->chunks[i].base > b)
            b = s->chunks[i].base;
    return b;
}

/* The lowest open step of the shard: the smallest base step over its
 * anchored chunks, those that finished a step or were restored (0 when
 * none is). A tentative window, placed by one push alone, anchors nothing. */
uint64_t gift__admit_lowest_base(const gift_shard_t *s)
{
    uint64_t b = UINT64_MAX;
    for (size_t i = 0; i < s->nchunks; i++)
        if (s->chunks[i].started && !s->chunks[i].tentative && s->chunks[i].base < b)
            b = s->chunks[i].base;
    return b == UINT64_MAX ? 0 : b;
}

/* The first push of a chunk places its window, so it may be at most
 * max_step_ahead past the lowest open step of the whole shard: counted from
 * the newest, or from windows placed by one push, one chunk placed far
 * ahead would let the next go further, and the limit would chain. Returns
 * 0, or GIFT_ESTEP after answering it. */
int gift__admit_first_step(gift_shard_t *s, gift_peer_t *p, const chunk_t *ch, const Gift__Push *m)
{
    uint64_t lowest = gift__admit_lowest_base(s);
    if (m->step <= lowest || m->step - lowest <= s->o.max_step_ahead)
        return 0;
    gift__send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                     "push for step %" PRIu64 " is the first of tensor %u chunk %u and more than "
                     "max_step_ahead (%" PRIu64 ") past this shard's lowest open step %" PRIu64
                     "; raise max_step_ahead (--max-step-ahead) if the run really starts there",
                     m->step, ch->t->key, ch->id, s->o.max_step_ahead, lowest);
    return GIFT_ESTEP;
}

/* A shard that does not own a tensor's geometry cannot check a push's
 * epoch against the owner's, but epochs only grow, at most one per sketch
 * round (one round per step): the epoch of step is at most step + 1, at
 * least that of the chunk's last finished step, and at most one more per
 * step since. gift__admit_epoch_bound is the largest such epoch. */
static uint64_t epoch_bound_u64(const chunk_t *ch, uint64_t step)
{
    const reply_t *r = ch->started && ch->base > 0 ? &ch->reply[(ch->base - 1) & 1] : NULL;
    if (r != NULL && r->valid && r->step == ch->base - 1 && step > r->step)
        return gift__add_sat(r->epoch, step - r->step);
    return gift__add_sat(step, 1);
}

uint32_t gift__admit_epoch_bound(const chunk_t *ch, uint64_t step)
{
    uint64_t b = epoch_bound_u64(ch, step);
    return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
}

int gift__admit_epoch_plausible(const chunk_t *ch, uint64_t step, uint32_t epoch)
{
    const reply_t *r = ch->started && ch->base > 0 ? &ch->reply[(ch->base - 1) & 1] : NULL;
    if (r != NULL && r->valid && r->step == ch->base - 1 && epoch < r->epoch)
        return 0;
    return epoch <= epoch_bound_u64(ch, step);
}

int gift__admit_run_id(gift_shard_t *s, gift_peer_t *p, const char *run_id)
{
    if (s->run_id[0] == '\0' || run_id[0] == '\0' || strcmp(s->run_id, run_id) == 0)
        return 0;
    gift__send_error(
        s, p, GIFT_ERUNID, 1, 0, 0, 0, 0,
        "shard %u holds the state of run '%s'; this worker presents run '%s' "
        "(GIFT_RUN_ID): once that run is over, reset the shard (`giftctl reset --servers "
        "HOST:PORT --run-id %s`, its address), or restart giftd with --reset or with a "
        "fresh data directory",
        s->o.shard_id, s->run_id, run_id, s->run_id);
    GIFT_LOG_WARN(p->id, "refused a worker of run '%s': this shard holds run '%s'", run_id,
                  s->run_id);
    return GIFT_ERUNID;
}

/* A worker's progress (Hello.resume_step) says it received the mean of step
 * resume - 1 from this shard; a pull is answered only once its step is
 * finished (and durable, with checkpoints), so the shard's newest base step
 * is at least resume, unless the shard lost that state. */
int gift__admit_resume(gift_shard_t *s, gift_peer_t *p, uint64_t resume)
{
    uint64_t newest = gift__admit_newest_base(s);
    char held[96];
    if (resume <= newest)
        return 0;
    if (!s->declared)
        snprintf(held, sizeof held, "it holds no tensors (it started empty)");
    else if (newest == 0)
        snprintf(held, sizeof held, "it has finished no step");
    else
        snprintf(held, sizeof held, "its newest finished step is %" PRIu64, newest - 1);
    gift__send_error(
        s, p, GIFT_ESTATE, 1, 0, 0, resume - 1, 0,
        "shard %u lost this run's state: the worker has the mean of step %" PRIu64
        " from it, but %s. It was restarted without checkpoints (or on another data "
        "directory); the run cannot continue exactly. Restart the whole run, and run giftd "
        "with --checkpoint-steps N --data-dir DIR so that a restarted shard resumes",
        s->o.shard_id, resume - 1, held);
    GIFT_LOG_ERROR(p->id,
                   "refused a worker: it received the mean of step %" PRIu64
                   " from this shard, but %s (restarted without checkpoints?)",
                   resume - 1, held);
    /* The workers already back (none had pulled from it: it has finished no
     * step) wait for a step the refused one will never push: tell them now
     * rather than at their timeout, but only when the refused Hello proved
     * the cluster's key. Without authentication anyone can send any
     * resume_step, and what a connection that is not a member says must not
     * end the others' run: it is refused alone. */
    for (uint32_t r = 0; s->o.auth != NULL && newest == 0 && r < s->by_rank_len; r++) {
        gift_peer_t *q = s->by_rank[r];
        if (q != NULL && q != p && !q->closing)
            gift__send_error(
                s, q, GIFT_ESTATE, 1, 0, 0, resume - 1, 0,
                "shard %u lost this run's state: another worker has the mean of step "
                "%" PRIu64 " from it, but %s. Restart the whole run, and run giftd with "
                "--checkpoint-steps N --data-dir DIR so that a restarted shard resumes",
                s->o.shard_id, resume - 1, held);
    }
    return GIFT_ESTATE;
}
