/*
 * stats.c: what a shard reports about itself: the read-only views of
 * shard.h (counters, per-tensor status) and the Stats message that
 * handle_stats sends. Reads shard state; changes nothing, sends nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "gift_error.h"
#include "gift_policy.h"
#include "owner.h"
#include "policy_owner.h"
#include "shard.h"
#include "stats.h"

void gift_shard_policy(const gift_shard_t *s, gift_shard_policy_t *out)
{
    out->name = gift_policy_name(s->o.policy);
    out->budget_bits = s->o.budget_bits;
    out->max_transform_gflops = s->o.max_transform_gflops;
}

int gift_shard_tensor_status(const gift_shard_t *s, size_t index, gift_tensor_status_t *out,
                             uint64_t *missing, size_t words)
{
    const tensor_t *t;
    const chunk_t *oldest = NULL;
    if (index >= s->ntensors || out == NULL)
        return GIFT_ENOKEY;
    t = &s->tensors[index];
    memset(out, 0, sizeof *out);
    out->key = t->key;
    out->name = t->name;
    out->owner = t->owner && t->geometry;
    out->epoch = out->owner ? gift__owner_latest_epoch(t) : 0;
    out->hit_rate = t->hit_rate;
    out->bytes_in = t->bytes_in;
    out->bytes_out = t->bytes_out;
    out->push_codec = gift_format_name(t->push.fmt);
    out->pull_codec = gift_format_name(t->pull.fmt);
    if (out->owner) {
        const gift_treat_t *tr = gift__pol_treat_of(t, out->epoch);
        int set = tr != NULL && tr->set;
        out->mode = set && tr->euclid ? "euclidean" : "gift";
        out->rank = set ? tr->k : t->k;
        out->epoch_push_codec = gift_format_name(set ? tr->push.fmt : t->push.fmt);
        out->epoch_pull_codec = gift_format_name(set ? tr->pull.fmt : t->pull.fmt);
        out->pred_ratio = tr != NULL ? tr->pred_ratio : 0.0;
        out->bits = tr != NULL ? tr->bits : 0.0;
    }
    for (uint32_t i = 0; i < t->nchunks; i++) {
        const chunk_t *ch = t->by_id[i];
        if (ch && ch->started && (oldest == NULL || ch->base < oldest->base))
            oldest = ch;
    }
    if (missing)
        memset(missing, 0, words * sizeof(uint64_t));
    if (oldest != NULL) {
        const slot_t *sl = &oldest->slot[oldest->base & 1];
        out->has_step = 1;
        out->step = oldest->base;
        out->missing = s->world - sl->count;
        for (uint32_t r = 0; missing && r < s->world && (r >> 6) < words; r++)
            if (!bit_get(sl->ranks, r))
                bit_set(missing, r);
    }
    return 0;
}

int gift__stats_build(const gift_shard_t *s, uint64_t seq, gift_stats_msg_t *sm)
{
    Gift__Stats *st = &sm->st;
    size_t nt = s->ntensors, nr = 0;

    memset(sm, 0, sizeof *sm);
    gift__stats__init(st);
    st->shard_id = s->o.shard_id;
    st->frames_in = s->c.frames_in;
    st->frames_out = s->c.frames_out;
    st->bytes_in = s->c.bytes_in;
    st->bytes_out = s->c.bytes_out;
    st->pushes = s->c.pushes;
    st->pulls = s->c.pulls;
    st->steps_finished = s->c.steps_finished;
    st->connections = s->c.peers;
    st->seq = seq;
    if (nt == 0)
        return 0;
    sm->ts = calloc(nt, sizeof *sm->ts);
    sm->tsp = calloc(nt, sizeof *sm->tsp);
    sm->ranks = calloc(nt * (size_t)s->world, sizeof *sm->ranks);
    sm->bm = calloc(s->words ? s->words : 1, sizeof *sm->bm);
    if (sm->ts == NULL || sm->tsp == NULL || sm->ranks == NULL || sm->bm == NULL)
        return GIFT_ENOMEM;
    for (size_t i = 0; i < nt; i++) {
        Gift__TensorStats *ts = &sm->ts[i];
        gift_tensor_status_t ss;
        gift__tensor_stats__init(ts);
        sm->tsp[i] = ts;
        gift_shard_tensor_status(s, i, &ss, sm->bm, s->words);
        ts->key = ss.key;
        ts->name = (char *)ss.name;
        ts->step_finished = ss.has_step ? ss.step : 0;
        ts->epoch = ss.epoch;
        ts->bytes_in = ss.bytes_in;
        ts->bytes_out = ss.bytes_out;
        ts->push_codec = (char *)ss.push_codec;
        ts->pull_codec = (char *)ss.pull_codec;
        ts->boundary_hit_rate = ss.hit_rate;
        if (ss.owner) {
            ts->policy_owner = 1;
            ts->mode = (char *)ss.mode;
            ts->transform_rank = ss.rank;
            ts->epoch_push_codec = (char *)ss.epoch_push_codec;
            ts->epoch_pull_codec = (char *)ss.epoch_pull_codec;
            ts->predicted_ratio = ss.pred_ratio;
            ts->bits = ss.bits;
        }
        ts->missing_ranks = sm->ranks + nr;
        if (ss.has_step)
            for (uint32_t r = 0; r < s->world; r++)
                if (bit_get(sm->bm, r))
                    sm->ranks[nr + ts->n_missing_ranks++] = r;
        nr += ts->n_missing_ranks;
    }
    st->n_tensors = nt;
    st->tensors = sm->tsp;
    return 0;
}

void gift__stats_release(gift_stats_msg_t *sm)
{
    free(sm->ts);
    free(sm->tsp);
    free(sm->ranks);
    free(sm->bm);
    memset(sm, 0, sizeof *sm);
}

const gift_shard_counters_t *gift_shard_counters(const gift_shard_t *s)
{
    return &s->c;
}

uint32_t gift_shard_world_size(const gift_shard_t *s)
{
    return s->world;
}

size_t gift_shard_tensor_count(const gift_shard_t *s)
{
    return s->ntensors;
}

int gift_shard_ready(const gift_shard_t *s)
{
    return s != NULL;
}
