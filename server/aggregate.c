/*
 * aggregate.c: the arithmetic of a chunk step (aggregate.h): rank-ordered
 * sums, the last push fused with the mean's encoding, the mean itself and
 * pull error feedback. shard.c decides when; this file computes.
 */
#include <string.h>

#include "aggregate.h"
#include "gift_error.h"
#include "shard_types.h"

/* One walk of kind over ch's elements. */
#define PASS(pass, kind, ch) ((pass)[(kind)] += 4u * (uint64_t)(ch)->n)

/* The pull residual for a step of epoch: zeroed when it belongs to another. */
static void pres_for_epoch(chunk_t *ch, uint32_t epoch)
{
    if (ch->pres_epoch != epoch) {
        memset(ch->pres, 0, ch->n * sizeof *ch->pres);
        ch->pres_epoch = epoch;
    }
}

/* Pull error feedback: encodes v = mean + residual into the reply and keeps
 * v - decode(encode(v)) as the next step's residual (gift_encode_mean_ef,
 * slice by slice in cache). The residual belongs to the coordinates of one
 * geometry epoch; a step of another epoch starts from zero (non-owner shards
 * hold no geometry to rebase it with). On the steps that sample boundary
 * hits (hits: they read v from acc), or for an fp8 block the slices cannot
 * walk, the same arithmetic in passes over acc, which ends holding v. On an
 * encode error (an overflowed mean) the residual is dropped (zeroed). */
static int encode_mean_ef(chunk_t *ch, slot_t *sl, reply_t *r, float inv, int hits, uint64_t *pass)
{
    float *acc = sl->acc, *e = ch->pres;
    int rc;
    pres_for_epoch(ch, sl->epoch < 0 ? 0 : (uint32_t)sl->epoch);
    if (!hits && (rc = gift_encode_mean_ef(&sl->pull, acc, ch->n, inv, e, r->buf->data,
                                           r->buf->cap)) != GIFT_EFORMAT) {
        PASS(pass, GIFT_SPASS_ENCODE, ch); /* scale, residual and encode in one walk */
        return rc;
    }
    PASS(pass, GIFT_SPASS_SCALE, ch);
    PASS(pass, GIFT_SPASS_ENCODE, ch);
    PASS(pass, GIFT_SPASS_RESIDUAL, ch); /* its decode */
    PASS(pass, GIFT_SPASS_RESIDUAL, ch); /* v - decode */
    for (size_t i = 0; i < ch->n; i++)
        acc[i] = (acc[i] * inv + 0.0f) + e[i];
    if ((rc = gift_encode(&sl->pull, acc, ch->n, r->buf->data, r->buf->cap)) < 0 ||
        (rc = gift_decode(&sl->pull, r->buf->data, sl->pull_len, ch->n, e)) < 0) {
        memset(e, 0, ch->n * sizeof *e);
        return rc;
    }
    gift_vec_sub(acc, e, ch->n, e);
    return 0;
}

/* A step's reply buffer, free of writes still sending an older step from
 * it (those keep the old buffer). 0, or GIFT_ENOMEM with refs still > 1. */
static int reply_writable(chunk_t *ch, reply_t *r)
{
    if (r->buf->refs > 1) {
        gift_rbuf_t *nb = gift_rbuf_new(ch->pull_l.total);
        if (nb == NULL)
            return GIFT_ENOMEM;
        gift_rbuf_unref(r->buf);
        r->buf = nb;
    }
    return 0;
}

/* Sums the push of rank sl->next (in rank order) into sl. The last one of a
 * step that finish_steps finishes right after (now: it is ch->base) is
 * fused with the mean's encoding (gift_decode_encode_mean, or with pull
 * error feedback gift_decode_encode_mean_ef on the residual of the step's
 * epoch, straight into the step's reply buffer, acc not written): the same
 * bytes and residual, one pass over the sum less and no write of it. Not on
 * the steps that sample boundary hits (they read the mean from acc), nor for
 * layouts it cannot walk (GIFT_EFORMAT: the two-step path). Returns 0 or the
 * payload's error. */
static int add_in_order(chunk_t *ch, slot_t *sl, uint32_t world, int hits, uint64_t step,
                        uint32_t epoch, int now, const uint8_t *payload, size_t len, uint64_t *pass)
{
    const gift_codec_params_t *cp = &sl->push;
    if (now && sl->next + 1 == world && !hits) {
        reply_t *r = &ch->reply[step & 1];
        if (reply_writable(ch, r) == 0) {
            const float *acc = sl->next == 0 ? NULL : sl->acc;
            const float inv = 1.0f / (float)world;
            int rc;
            if (ch->pres != NULL) {
                /* A refused payload must not cost the residual: checked
                 * before a new epoch's reset (the call checks it too). */
                if (ch->pres_epoch != epoch &&
                    (rc = gift_payload_check(cp, payload, len, ch->n)) < 0)
                    return rc;
                pres_for_epoch(ch, epoch);
                rc = gift_decode_encode_mean_ef(cp, payload, len, acc, ch->n, inv, &sl->pull,
                                                ch->pres, r->buf->data, r->buf->cap);
            } else {
                rc = gift_decode_encode_mean(cp, payload, len, acc, ch->n, inv, &sl->pull,
                                             r->buf->data, r->buf->cap);
            }
            if (rc == GIFT_EBADCODE)
                return rc; /* the payload: refused, as a decode would */
            if (rc != GIFT_EFORMAT) {
                PASS(pass, GIFT_SPASS_FUSED, ch);
                sl->fused = 1;
                sl->fused_rc = rc; /* 0, or the encode's (an overflowed mean) */
                return 0;
            }
        }
    }
    if (sl->next == 0) {
        PASS(pass, GIFT_SPASS_DECODE, ch);
        return gift_decode(cp, payload, len, ch->n, sl->acc);
    }
    PASS(pass, GIFT_SPASS_ACCUMULATE, ch);
    return gift_decode_acc(cp, payload, len, ch->n, sl->acc);
}

int gift__agg_ordered_add(chunk_t *ch, slot_t *sl, uint32_t world, int hits, uint64_t step,
                          uint32_t epoch, int now, uint32_t rank, const uint8_t *payload,
                          size_t len, uint64_t *pass)
{
    const gift_codec_params_t *cp = &sl->push;
    int rc;
    if (rank != sl->next) {
        PASS(pass, GIFT_SPASS_CHECK, ch);
        if ((rc = gift_payload_check(cp, payload, len, ch->n)) < 0)
            return rc;
        PASS(pass, GIFT_SPASS_COPY, ch);
        memcpy(sl->pay + (size_t)rank * ch->pay_stride, payload, len);
        return 0;
    }
    if ((rc = add_in_order(ch, sl, world, hits, step, epoch, now, payload, len, pass)) < 0)
        return rc;
    sl->next++;
    while (sl->next < world && bit_get(sl->ranks, sl->next)) {
        /* Validated when it arrived. */
        rc = add_in_order(ch, sl, world, hits, step, epoch, now,
                          sl->pay + (size_t)sl->next * ch->pay_stride, sl->push_len, pass);
        if (rc < 0)
            return rc;
        sl->next++;
    }
    return 0;
}

int gift__agg_mean(chunk_t *ch, slot_t *sl, reply_t *r, uint32_t world, int hits, uint64_t *pass)
{
    const float inv = 1.0f / (float)world;

    /* Writes of step - 2 still hold the buffer: leave it to them. */
    (void)reply_writable(ch, r);
    /* The mean is acc * (1/N) + 0 (the +0 makes it the sum a zeroed
     * accumulator would give, see handle_push). Encoded already when the
     * last push was fused with it (add_in_order). On the steps that
     * measure boundary hits the mean is materialised in place; otherwise
     * scaling and encoding are one cache-resident pass (the same bytes). */
    if (sl->fused)
        return sl->fused_rc;
    if (r->buf->refs > 1)
        return GIFT_ENOMEM;
    if (ch->pres != NULL)
        return encode_mean_ef(ch, sl, r, inv, hits, pass);
    PASS(pass, GIFT_SPASS_ENCODE, ch);
    if (hits) {
        PASS(pass, GIFT_SPASS_SCALE, ch);
        for (size_t i = 0; i < ch->n; i++)
            sl->acc[i] = sl->acc[i] * inv + 0.0f;
        return gift_encode(&sl->pull, sl->acc, ch->n, r->buf->data, r->buf->cap);
    }
    return gift_encode_mean(&sl->pull, sl->acc, ch->n, inv, r->buf->data, r->buf->cap);
}
