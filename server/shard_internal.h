/*
 * shard_internal.h: what shard.c offers persist.c (snapshot, journal,
 * replay) beyond shard.h, on the state of shard_state.h. Not for the glue
 * (net.c, main.c): they see shard.h.
 *
 * The calls between the two run one way by name: persist.c calls the
 * gift__shard_* functions below and those of declare.h, none of which
 * reaches persistence. The shard reaches persistence only through the
 * journal hook table (gift_shard_journal_t, shard_state.h), which
 * persist.c attaches when a restore opens the step log.
 */
#ifndef GIFT_SHARD_INTERNAL_H
#define GIFT_SHARD_INTERNAL_H

#include "declare.h"
#include "shard.h"
#include "shard_state.h"

/* The chunk (key, id) of the store, or NULL. */
chunk_t *gift__shard_find_chunk(gift_shard_t *s, uint32_t key, uint32_t id);

/* Every sketch of t's round is in: has the owner build and publish the
 * next epoch, valid from the first step no chunk of t has a push for.
 * Counts and logs it; journals nothing (the caller does). Returns the new
 * epoch (> 0), or a negative code when the update failed and t keeps its
 * epoch. */
int gift__shard_round_finish(gift_shard_t *s, tensor_t *t);

#endif
