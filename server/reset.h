/*
 * reset.h: the Reset request of `giftctl reset` (reset.c, gift.proto
 * "Reset"): the checks, then the shard drops all of its state.
 */
#ifndef GIFT_RESET_H
#define GIFT_RESET_H

#include "shard_state.h"

/* Answers p's Reset m: refused with a fatal Error (GIFT_EAUTH, GIFT_ERUNID,
 * GIFT_EBUSY, GIFT_EPROTO; nothing changed), or the shard drops its store,
 * run id and adopted world size, with persistence its checkpoint and step
 * logs too, and answers ResetAck. Returns 0 or the refusal's code. */
int gift__reset(gift_shard_t *s, gift_peer_t *p, const Gift__Reset *m);

#endif
