/*
 * aggregate.h: the arithmetic of a chunk step, on store.h's records alone.
 *
 * The mean of a step is, element by element, fl(fl(sum) * fl(1/N)) + 0.0f,
 * encoded with the tensor's pull codec (shard.h). Ordered aggregation sums
 * the decoded pushes in rank order whatever order they arrive in, keeping
 * the early ones encoded in the slot; the last push of a step is fused with
 * the mean's encoding where the layout allows it (the same bytes, one pass
 * less). The shard (shard.c) decides which step a push belongs to and when
 * a step is finished; these functions only compute, and touch nothing but
 * the chunk, slot and reply they are given, and count their walks over the
 * elements in pass (gift_shard_counters_t.pass_bytes). No errors are
 * logged here.
 */
#ifndef GIFT_AGGREGATE_H
#define GIFT_AGGREGATE_H

#include "store.h"

/* Ordered aggregation of rank's push into sl (its bit is not set yet): in
 * rank order it is summed at once, followed by every kept push that now
 * follows without a gap; out of order it is validated (gift_payload_check:
 * the checks of a decode, without decoding) and kept. now: step is
 * the one the shard finishes next; epoch: the step's (every push
 * of a step has it); hits: the step samples boundary hits (no fusing).
 * A step's first push may come before the chunk has started (ch->base not
 * set yet): the reply slot is taken from step.
 * Returns 0, or the decode error (nothing kept). */
int gift__agg_ordered_add(chunk_t *ch, slot_t *sl, uint32_t world, int hits, uint64_t step,
                          uint32_t epoch, int now, uint32_t rank, const uint8_t *payload,
                          size_t len, uint64_t *pass);

/* Encodes the mean of the finished step in sl (all world pushes summed)
 * into the step's reply r: taken from the fused last add when there was
 * one, else computed from acc (with pull error feedback on ch->pres; with
 * hits the mean is left in acc for the boundary-hit count). A reply buffer
 * still held by writes of an older step is replaced first. Returns 0, or
 * GIFT_ENOMEM (no buffer) or the encode's error (an overflowed mean). */
int gift__agg_mean(chunk_t *ch, slot_t *sl, reply_t *r, uint32_t world, int hits, uint64_t *pass);

#endif
