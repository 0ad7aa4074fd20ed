/*
 * owner.h: the geometry owner of a tensor, as pure epoch state.
 *
 * The shard holding a tensor's chunk 0 owns its geometry (shard.h,
 * "Geometry"): it sums the Sketch frames of a refresh round in rank order (ordered)
 * or as they arrive (eager), builds the next epoch from the sum and
 * publishes it with the step it is valid from. These functions work on the
 * owner fields of tensor_t (store.h) and on nothing else: no peer, no frame,
 * no log, no file. They return what they built; the shard answers the peers,
 * logs and journals it (shard.c, persist.c).
 *
 * Buffers: t->ysum, t->sk_ranks (and t->yr, t->tr when ordered) and
 * t->geo_buf are allocated with the store (shard.c's store_build); the owner
 * only replaces t->geo_buf when a write still holds the old basis.
 */
#ifndef GIFT_OWNER_H
#define GIFT_OWNER_H

#include "store.h"

/* The largest trace a sketch may carry: far above any layer's E|a|^2, and
 * low enough that 65536 ranks' sketches (each bounded by twice it) sum in
 * f32 without overflow. */
#define GIFT_SKETCH_TRACE_MAX 1e30

/* The epoch the owner expects for pushes of step: the newest whose
 * valid_from is not after it (the oldest kept one before any). */
uint32_t gift__owner_epoch_for_step(const tensor_t *t, uint64_t step);

/* The newest published epoch (0 before any record). */
uint32_t gift__owner_latest_epoch(const tensor_t *t);

/* Publishes t->geo as the newest geometry of t: copies U then lambda into
 * the payload buffer (a new one when a write still holds the old) and
 * appends the epoch record, dropping the oldest of MAX_EPOCH_RECS. Returns
 * 0 or GIFT_ENOMEM (nothing changed). */
int gift__owner_publish(tensor_t *t, uint64_t valid_from);

/* Starts the sketch round of step, forgetting any unfinished one (words:
 * uint64 words of a rank bitmap). */
void gift__owner_sketch_begin(tensor_t *t, size_t words, uint64_t step);

/* Adds rank's sketch Y (cols x ks floats, possibly unaligned) and trace to
 * the round: kept for the rank-ordered sum (ordered) or summed at once. The
 * caller checked rank, shape and values. */
void gift__owner_sketch_add(tensor_t *t, int ordered, uint32_t rank, double trace,
                            const uint8_t *Y);

/* What gift__owner_sketch_check says of a sketch. */
enum {
    GIFT__SKETCH_NEW = 0,     /* accept it into the round (starting one if none is open) */
    GIFT__SKETCH_DUP = 1,     /* a replay: acknowledge it as a duplicate, add nothing */
    GIFT__SKETCH_RESTART = 2, /* accept it into a new round: the open one, of an older step,
                               * was incomplete and is dropped (sk_step, sk_count still
                               * name it, for the caller's warning) */
};

/* Checks rank's Sketch m (len payload bytes at Y) against t's owner state:
 * shape, epoch, a finite non-negative trace, finite values, and whether it
 * belongs to the open round, starts a new one or repeats one. Returns one of
 * the values above, or GIFT_ESHAPE, GIFT_EEPOCH or GIFT_EBADCODE with a
 * sentence for the peer in why. */
int gift__owner_sketch_check(tensor_t *t, const Gift__Sketch *m, uint32_t rank, const uint8_t *Y,
                             uint64_t len, char *why, size_t whylen);

/* Ends the round: sums the kept sketches in rank order 0..world-1 (ordered)
 * and updates t->geo from the sum with damping and the decayed running
 * average (gift_geometry_update_decay, gift_codec.h). Returns the new epoch (> 0, not yet
 * published), or the update's negative code: t->geo keeps its epoch. */
int gift__owner_build(tensor_t *t, uint32_t world, int ordered, double damping, double decay);

/* Publishes the epoch that gift__owner_build made, valid from valid_from,
 * and marks the round done (a replayed sketch of its step is a duplicate).
 * Returns the epoch, or GIFT_ENOMEM. */
int gift__owner_publish_round(tensor_t *t, uint64_t valid_from);

/* Sets t->geo to a saved epoch (from a checkpoint or the step log) and
 * refreshes the published payload; its epoch records are the caller's. U
 * and lambda may be unaligned. Returns 0 or the geometry's error for
 * values that do not make a valid transform. */
int gift__owner_restore(tensor_t *t, uint32_t epoch, int identity, double trace, double sigma2,
                        double delta, const uint8_t *U, const uint8_t *lambda);

#endif
