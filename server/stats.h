/*
 * stats.h: the Stats message of a shard (stats.c). The read-only views for
 * metrics and giftctl are in shard.h.
 */
#ifndef GIFT_STATS_H
#define GIFT_STATS_H

#include "shard_state.h"

/* A Stats message and the arrays it points into. */
typedef struct gift_stats_msg {
    Gift__Stats st;
    Gift__TensorStats *ts, **tsp;
    uint32_t *ranks;
    uint64_t *bm;
} gift_stats_msg_t;

/* Fills sm with the shard's counters and, per tensor, its status (oldest
 * unfinished step, missing ranks, epoch, bytes, codecs, hit rate), answering
 * request seq. sm points into the shard (names) until the next message is
 * handled. Returns 0 or GIFT_ENOMEM; release sm in both cases. */
int gift__stats_build(const gift_shard_t *s, uint64_t seq, gift_stats_msg_t *sm);

/* Frees the arrays of sm. */
void gift__stats_release(gift_stats_msg_t *sm);

#endif
