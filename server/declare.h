/*
 * declare.h: the shard's store built from a Declare and freed (declare.c):
 * the tensors and chunks it lists, checked field by field, sized against
 * max_memory before anything else is allocated, and every buffer a step
 * needs allocated once, so that no message allocates afterwards. Called by
 * shard.c (a Declare, gift_shard_free), reset.c (giftctl reset) and
 * persist.c (a restore); calls only down (admit.c, owner.c,
 * policy_owner.c).
 */
#ifndef GIFT_DECLARE_H
#define GIFT_DECLARE_H

#include <stddef.h>
#include <stdint.h>

#include "shard_state.h"

/* Builds the store from d (already checked against its digest) and keeps
 * its packed form for checkpoints, its run id (at most GIFT_RUN_ID_MAX
 * bytes), digest and placement signature. On error nothing is kept and why
 * says what was wrong. */
int gift__shard_declare_apply(gift_shard_t *s, const Gift__Declare *d, char *why, size_t whylen);

/* Frees the store (tensors, chunks, the kept Declare): the shard is as
 * before any Declare. */
void gift__shard_store_free(gift_shard_t *s);

/* The order-independent signature of a chunk placement (key, chunk, rows,
 * row_begin of each), to compare a re-declaration with the store's. */
uint64_t gift__declare_placement(Gift__ChunkDecl *const *c, size_t n);

#endif
