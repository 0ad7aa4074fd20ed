/*
 * admit.h: what the shard admits from a peer before it acts (admit.c):
 * the memory a Declare needs against max_memory, the shape of a geometry
 * tensor, one connection's share of the parked pulls, how far ahead a
 * chunk's first push may be, which epochs a non-owner shard accepts, and
 * the run id and progress a Hello presents. Every figure computed from wire fields saturates
 * instead of wrapping. admit.c reads shard state (shard_state.h) and answers through send.c; it
 * calls nothing of shard.c.
 */
#ifndef GIFT_ADMIT_H
#define GIFT_ADMIT_H

#include <stdint.h>

#include "shard_state.h"

/* Saturating arithmetic for sizes computed from wire fields: a sum or
 * product that would wrap is UINT64_MAX, which no budget admits. */
static inline uint64_t gift__add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline uint64_t gift__mul_sat(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* The parked pulls one connection may hold: max_parked_per_peer, or by
 * default two per chunk here plus 64; never more than max_parked. */
uint32_t gift__admit_park_cap(const gift_shard_t *s);

/* The bytes store_build allocates for the checked declaration d (the
 * store's tensors and chunks filled in, nothing allocated yet). */
uint64_t gift__admit_store_need(const gift_shard_t *s, const Gift__Declare *d);

/* 0 when need fits max_memory, else GIFT_ENOMEM with a sentence in why
 * naming what, the figure, the budget and the option that raises it. */
int gift__admit_budget(const gift_shard_t *s, uint64_t need, const char *what, char *why,
                       size_t whylen);

/* Checks and sets t's rank k and basis width ks from td (or the default
 * policy). Returns 0, or GIFT_ESHAPE with why filled in. */
int gift__admit_geometry_shape(const gift_shard_t *s, tensor_t *t, const Gift__TensorDecl *td,
                               char *why, size_t whylen);

/* A chunk's first push m may be at most max_step_ahead past the shard's
 * lowest open step (gift__admit_lowest_base), so that chunks placed ahead
 * cannot chain the limit. Returns 0, or GIFT_ESTEP after sending p the
 * Error. */
int gift__admit_first_step(gift_shard_t *s, gift_peer_t *p, const chunk_t *ch, const Gift__Push *m);

/* The lowest base step over the shard's anchored chunks (started, and a
 * step finished or restored; 0 when none is). */
uint64_t gift__admit_lowest_base(const gift_shard_t *s);

/* The newest base step over the shard's started chunks: the newest
 * finished step + 1 (0 when none has finished). */
uint64_t gift__admit_newest_base(const gift_shard_t *s);

/* Refuses peer p when the shard holds the state of a run other than
 * run_id (both non-empty): a fatal GIFT_ERUNID naming both runs and how to
 * reset (giftctl reset). Returns it, or 0 when the run ids agree. */
int gift__admit_run_id(gift_shard_t *s, gift_peer_t *p, const char *run_id);

/* Refuses peer p whose Hello says it received the mean of step resume - 1
 * from this shard when the shard has not finished that step (it lost its
 * state): a fatal GIFT_ESTATE naming the steps and the fix. Returns it, or
 * 0 (resume 0, or within what the shard holds). */
int gift__admit_resume(gift_shard_t *s, gift_peer_t *p, uint64_t resume);

/* On a shard that does not own the geometry: the largest epoch a push for
 * step may carry, and whether epoch is plausible for step. */
uint32_t gift__admit_epoch_bound(const chunk_t *ch, uint64_t step);
int gift__admit_epoch_plausible(const chunk_t *ch, uint64_t step, uint32_t epoch);

#endif
