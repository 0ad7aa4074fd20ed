/*
 * peers.h: the shard's peers and parked pulls (peers.c), for shard.c.
 */
#ifndef GIFT_PEERS_H
#define GIFT_PEERS_H

#include <stdint.h>

#include "shard_state.h"

/* Parks p's pull of ch for step (answered when the step finishes) in the
 * shared pool. Returns 0, or GIFT_EBUSY when the pool or p's share of it
 * (gift__admit_park_cap) is full: nothing is parked then. */
int gift__park(gift_shard_t *s, gift_peer_t *p, chunk_t *ch, uint64_t step, uint64_t seq,
               uint32_t have_epoch);

/* Unlinks q from its chunk's and its peer's lists and returns it to the
 * pool. */
void gift__parked_unlink(gift_shard_t *s, parked_t *q);

/* Answers the pull m that gift__park refused: p's share or the pool. */
void gift__park_refused(gift_shard_t *s, gift_peer_t *p, const Gift__Pull *m);

/* p acts as its rank: its world size must be the cluster's, and it
 * becomes the rank's one live connection (with authentication a proven
 * reconnect replaces the old one, which is closed). Returns 0, or a
 * negative code after a fatal Error to p. */
int gift__claim_rank(gift_shard_t *s, gift_peer_t *p);

#endif
