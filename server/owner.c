/*
 * owner.c: the geometry owner's epoch state of owner.h. Numbers and
 * buffers only; the shard does the talking.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gift_error.h"
#include "owner.h"

uint32_t gift__owner_epoch_for_step(const tensor_t *t, uint64_t step)
{
    uint32_t e = t->nepochs ? t->epochs[0].epoch : 0;
    for (uint32_t i = 0; i < t->nepochs; i++)
        if (t->epochs[i].valid_from <= step)
            e = t->epochs[i].epoch;
    return e;
}

uint32_t gift__owner_latest_epoch(const tensor_t *t)
{
    return t->nepochs ? t->epochs[t->nepochs - 1].epoch : 0;
}

int gift__owner_publish(tensor_t *t, uint64_t valid_from)
{
    size_t ub = (size_t)t->cols * t->ks * 4, lb = (size_t)t->ks * 4;
    gift_rbuf_t *b = t->geo_buf;
    if (b == NULL || b->refs > 1) {
        /* A write still holds the old basis: it keeps it, we take a new one. */
        gift_rbuf_t *nb = gift_rbuf_new(ub + lb);
        if (nb == NULL)
            return GIFT_ENOMEM;
        gift_rbuf_unref(b);
        t->geo_buf = b = nb;
    }
    memcpy(b->data, t->geo.U, ub);
    memcpy(b->data + ub, t->geo.lambda, lb);
    b->len = ub + lb;
    if (t->nepochs == MAX_EPOCH_RECS) {
        memmove(t->epochs, t->epochs + 1, (MAX_EPOCH_RECS - 1) * sizeof t->epochs[0]);
        t->nepochs--;
    }
    t->epochs[t->nepochs].epoch = t->geo.epoch;
    t->epochs[t->nepochs].valid_from = valid_from;
    memset(&t->epochs[t->nepochs].tr, 0, sizeof t->epochs[0].tr); /* declared, until decided */
    t->nepochs++;
    return 0;
}

void gift__owner_sketch_begin(tensor_t *t, size_t words, uint64_t step)
{
    memset(t->ysum, 0, (size_t)t->cols * t->ks * sizeof(float));
    memset(t->sk_ranks, 0, words * sizeof(uint64_t));
    t->trace_sum = 0.0;
    t->sk_count = 0;
    t->sk_step = step;
    t->sk_active = 1;
}

void gift__owner_sketch_add(tensor_t *t, int ordered, uint32_t rank, double trace, const uint8_t *Y)
{
    size_t ny = (size_t)t->cols * t->ks;
    if (ordered) {
        memcpy(t->yr + rank * ny, Y, ny * sizeof(float));
        t->tr[rank] = trace;
    } else {
        for (size_t i = 0; i < ny; i++) {
            float y;
            memcpy(&y, Y + 4 * i, 4);
            t->ysum[i] += y;
        }
        t->trace_sum += trace;
    }
    bit_set(t->sk_ranks, rank);
    t->sk_count++;
}

int gift__owner_sketch_check(tensor_t *t, const Gift__Sketch *m, uint32_t rank, const uint8_t *Y,
                             uint64_t len, char *why, size_t whylen)
{
    size_t ny = (size_t)t->cols * t->ks;
    if (m->din != t->cols || m->basis_cols != t->ks || len != ny * 4) {
        snprintf(why, whylen, "sketch of %u x %u (%" PRIu64 " bytes); tensor %u needs %u x %u",
                 m->din, m->basis_cols, len, m->key, t->cols, t->ks);
        return GIFT_ESHAPE;
    }
    if (t->sk_done && m->step == t->sk_done_step && m->epoch + 1 == t->geo.epoch)
        return GIFT__SKETCH_DUP; /* a replay of the round that built the newest epoch */
    if (m->epoch != t->geo.epoch) {
        snprintf(why, whylen, "sketch against the basis of epoch %u; the newest is %u", m->epoch,
                 t->geo.epoch);
        return GIFT_EEPOCH;
    }
    if (!(m->trace >= 0.0) || !isfinite(m->trace)) {
        snprintf(why, whylen, "sketch trace %g is not a finite non-negative number", m->trace);
        return GIFT_EBADCODE;
    }
    /* The world's sketches are summed in f32 and their traces build the
     * epoch: a trace above GIFT_SKETCH_TRACE_MAX (far above any layer's
     * E|a|^2) would overflow that sum, so it is refused here rather than
     * accepted and then fail the epoch's build for every worker. */
    if (m->trace > GIFT_SKETCH_TRACE_MAX) {
        snprintf(why, whylen, "sketch trace %g is above %g, the largest a sketch may carry",
                 m->trace, GIFT_SKETCH_TRACE_MAX);
        return GIFT_EBADCODE;
    }
    for (size_t i = 0; i < ny; i++) {
        float y;
        memcpy(&y, Y + 4 * i, 4);
        if (!isfinite(y)) {
            snprintf(why, whylen, "sketch holds NaN or Inf at element %zu", i);
            return GIFT_EBADCODE;
        }
        /* Y = A Q with A positive semi-definite and Q orthonormal, so
         * |Y_ij| <= |A|_2 <= tr(A); twice that leaves room for rounding. */
        if (fabs((double)y) > 2.0 * m->trace + 1e-30) {
            snprintf(why, whylen,
                     "sketch element %zu is %g, above twice its trace %g (a sketch A.Q of an "
                     "orthonormal Q is bounded by the trace of A)",
                     i, (double)y, m->trace);
            return GIFT_EBADCODE;
        }
    }
    if (t->sk_active && m->step != t->sk_step) {
        if (m->step < t->sk_step)
            return GIFT__SKETCH_DUP;
        t->sk_active = 0;
        return GIFT__SKETCH_RESTART;
    }
    return t->sk_active && bit_get(t->sk_ranks, rank) ? GIFT__SKETCH_DUP : GIFT__SKETCH_NEW;
}

int gift__owner_build(tensor_t *t, uint32_t world, int ordered, double damping, double decay)
{
    int rc;
    t->sk_active = 0;
    if (ordered) {
        size_t ny = (size_t)t->cols * t->ks;
        memset(t->ysum, 0, ny * sizeof(float));
        t->trace_sum = 0.0;
        for (uint32_t r = 0; r < world; r++) {
            const float *y = t->yr + r * ny;
            for (size_t i = 0; i < ny; i++)
                t->ysum[i] += y[i];
            t->trace_sum += t->tr[r];
        }
    }
    /* geometry_decay: the epoch averages onto t->geo with weights decay^age over
     * the rounds seen (gift_geometry_decay_at, the epoch number counting the
     * rounds; after an identity epoch it overcounts and b is merely nearer
     * decay), a function of the published state, which checkpoints and epoch
     * records restore exactly. */
    if ((rc = gift_geometry_update_decay(&t->geo, t->ysum, t->trace_sum, damping,
                                         gift_geometry_decay_at(decay, t->geo.epoch))) < 0)
        return rc;
    return (int)t->geo.epoch;
}

int gift__owner_publish_round(tensor_t *t, uint64_t valid_from)
{
    int rc;
    if ((rc = gift__owner_publish(t, valid_from)) < 0)
        return rc;
    t->sk_done = 1;
    t->sk_done_step = t->sk_step;
    return (int)t->geo.epoch;
}

int gift__owner_restore(tensor_t *t, uint32_t epoch, int identity, double trace, double sigma2,
                        double delta, const uint8_t *U, const uint8_t *lambda)
{
    size_t ub = (size_t)t->cols * t->ks * 4, lb = (size_t)t->ks * 4;
    int rc;
    memcpy(t->geo.U, U, ub);
    memcpy(t->geo.lambda, lambda, lb);
    if ((rc = gift_geometry_load(&t->geo, t->geo.U, t->geo.lambda, trace, sigma2, delta, epoch,
                                 identity)) < 0)
        return rc;
    memcpy(t->geo_buf->data, U, ub);
    memcpy(t->geo_buf->data + ub, lambda, lb);
    t->geo_buf->len = ub + lb;
    return 0;
}
