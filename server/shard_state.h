/*
 * shard_state.h: the shard's shared state, the lowest header of the rooms
 * that implement shard.h. shard.c dispatches the messages and calls down
 * into the helper rooms (admit.c, peers.c, send.c, stats.c, reset.c,
 * declare.c, aggregate.c, owner.c, policy_owner.c); they read and change
 * the state defined here and never call back up into shard.c. Data and the
 * shard's clock only: no function of any room is declared here. Not for
 * the glue (net.c, main.c): they see shard.h, where a shard and a peer are
 * opaque.
 *
 * The shard reaches persistence (persist.c) only through the journal hook
 * table gift_shard_journal_t, beside gift_shard_io_t, which persist.c
 * attaches when a restore opens the step log.
 */
#ifndef GIFT_SHARD_STATE_H
#define GIFT_SHARD_STATE_H

#include "checkpoint.h"
#include "gift_auth.h"
#include "shard_types.h"
#include "store.h"

#define GIFT_HEAD_MAX 4096 /* preamble + any header the shard sends, except Stats */
#define GIFT_RUN_ID_MAX 64 /* bytes of a run id (Hello.run_id), the terminator not counted */

/* A pull waiting for its step, linked into its chunk's list and its peer's. */
typedef struct parked {
    struct parked *cnext, *cprev;
    struct parked *pnext, *pprev;
    gift_peer_t *peer;
    struct chunk *ch;
    uint64_t step, seq;
    uint32_t have_epoch;
} parked_t;

struct gift_peer {
    void *ctx;
    uint64_t id;
    int hello;
    int closing;
    uint32_t rank;
    parked_t *parked;
    int challenged;                        /* authentication: an AuthChallenge was sent */
    uint8_t nonce[GIFT_AUTH_NONCE_BYTES];  /* ... with this server nonce */
    uint8_t cnonce[GIFT_AUTH_NONCE_BYTES]; /* the client nonce of its authenticated Hello */
    uint32_t world;                        /* the world size its Hello gave */
    uint32_t nparked;                      /* its entries in the parked pool */
    int claimed; /* it holds s->by_rank[rank]: the rank's one live connection */
    char run_id[GIFT_RUN_ID_MAX + 1]; /* its Hello's run id ("" when none) */
};

struct gift_shard {
    gift_shard_opts_t o;
    gift_shard_io_t io;
    uint32_t world;
    size_t words; /* uint64 words per rank bitmap */
    int declared;
    uint64_t digest;
    tensor_t *tensors;
    size_t ntensors;
    chunk_t *chunks;
    size_t nchunks;
    /* Sorted (key, chunk) signature of the placement, to compare re-declarations. */
    uint64_t placement;
    parked_t *pool;
    parked_t *free_parked;
    /* The Declare that built the store, packed, for checkpoints. */
    uint8_t *decl;
    size_t decl_len;
    /* The run whose state this is: the run id of the first Declare's
     * sender, kept in decl; "" when none (no check). */
    char run_id[GIFT_RUN_ID_MAX + 1];
    /* Persistence (checkpoint_steps > 0): the open step log of generation
     * gen, the step at which the next checkpoint is due, and whether a
     * restore is replaying the log (nothing is logged or answered then). */
    int persist;
    gift_log_t log;
    uint64_t gen;
    uint64_t ckpt_next;
    gift_ckpt_buf_t ckpt_buf; /* the checkpoint body, reused from one to the next */
    int replaying;
    /* The journal (persist.c), attached by gift_shard_restore when
     * persistence is on; NULL otherwise: nothing is logged. */
    const struct gift_shard_journal *jr;
    /* Group commit: chunks whose finished steps wait for gift_shard_flush. */
    chunk_t **pending;
    size_t npending;
    char dir[4096];
    /* The connection acting as each rank (grown to the highest rank seen,
     * below 65536): one live connection per rank. */
    gift_peer_t **by_rank;
    uint32_t by_rank_len;
    uint64_t mem; /* bytes the declared store takes (store_need) */
    /* The chooser's inputs and outputs (policy_owner.c), one per owned
     * geometry tensor, allocated at declaration when a policy is active. */
    void *pol_in, *pol_out;
    uint64_t pol_round; /* the sketch step pol_out was chosen for, when pol_round_ok */
    int pol_round_ok;
    gift_shard_counters_t c;
    uint8_t head[GIFT_HEAD_MAX];
};

/* What the shard asks of its journal. Every call is made only while
 * s->jr is set; each returns 0 or a negative code (GIFT_EIO), after which
 * the shard must not acknowledge what depends on the record. */
typedef struct gift_shard_journal {
    /* The world size and the packed Declare, synced; then schedules the
     * first checkpoint. */
    int (*declare)(gift_shard_t *s);
    /* A finished chunk step (its reply and pull residual): synced, or with
     * group commit left for sync. */
    int (*step)(gift_shard_t *s, const chunk_t *ch, const reply_t *r);
    /* An accepted sketch of rank for step (len bytes of Y), synced before
     * its SketchAck. */
    int (*sketch)(gift_shard_t *s, const tensor_t *t, uint64_t step, uint32_t rank, uint32_t epoch,
                  double trace, const uint8_t *Y, size_t len);
    /* The epoch that t's owner just published (a failure is logged: a
     * restart rebuilds it from the logged sketches). */
    void (*epoch)(gift_shard_t *s, const tensor_t *t);
    /* Group commit: one sync of every step appended since the last. */
    int (*sync)(gift_shard_t *s);
    /* Steps finished: writes a checkpoint when one is due. */
    void (*steps_done)(gift_shard_t *s);
    /* giftctl reset, the store already dropped: moves the checkpoint and
     * every step log aside (gift_ckpt_discard, nothing is unlinked) and
     * starts an empty log of generation 0. 0, or GIFT_EIO with a sentence
     * in err. */
    int (*reset)(gift_shard_t *s, char *err, size_t errlen);
} gift_shard_journal_t;

static inline uint64_t now_ns(const gift_shard_t *s)
{
    return s->io.now_ns ? s->io.now_ns() : 0;
}

#endif
