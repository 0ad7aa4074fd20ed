/*
 * store.h: the records of a shard's store (tensors, their chunks, the
 * accumulator slots and finished replies of a chunk, the geometry owner's
 * state of a tensor), shared by the rooms that work on them: shard.c
 * (store, aggregation, dispatch), owner.c (epochs) and persist.c
 * (snapshot, journal, replay). Data only: no function of any of them is
 * declared here, so each can include it without depending on the others.
 */
#ifndef GIFT_STORE_H
#define GIFT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "gift_codec.h"
#include "gift_proto.h"
#include "rbuf.h"

#define MAX_EPOCH_RECS 4

struct parked;

/* The treatment the geometry owner's policy chose for a tensor's epoch
 * (policy_owner.h; gift.proto Geometry fields 12..17). set 0: the declared
 * treatment, and nothing of it travels. */
typedef struct gift_treat {
    int set;
    int euclid; /* T = I for this epoch's steps */
    uint32_t k; /* transform rank (1..declared k) */
    gift_codec_params_t push, pull;
    double pred_ratio, bits;
} gift_treat_t;

typedef struct slot {
    float *acc;
    uint64_t *ranks; /* bitmap of ranks that pushed */
    uint32_t count;
    /* Ordered aggregation: every rank's encoded push (world x pay_stride
     * bytes, allocated at declaration), and how many ranks, from 0, are
     * already summed into acc (always world when count reaches world). */
    uint8_t *pay;
    uint32_t next;
    /* The last push was summed, averaged and encoded into the step's reply
     * in one pass (fused_rc: that encode's result); acc was not written. */
    int fused, fused_rc;
    int64_t epoch; /* -1: no push yet */
    /* The step's codecs, fixed by its first accepted push (the declared
     * ones, or those of its epoch's decision) and the push payload's size. */
    gift_codec_params_t push, pull;
    size_t push_len, pull_len;
    uint64_t t_first;
    int warned; /* the stall warning for this step was logged */
} slot_t;

typedef struct reply {
    int valid;
    int durable; /* in the step log and synced: its pulls may be answered */
    int err;     /* 0, or the code pulls of this step get (e.g. the mean overflowed) */
    uint64_t step;
    uint32_t epoch;
    gift_codec_params_t pull; /* the codec of buf, len bytes */
    size_t len;
    gift_rbuf_t *buf;
} reply_t;

typedef struct tensor tensor_t;

typedef struct chunk {
    tensor_t *t;
    uint32_t id, row_begin, rows;
    size_t n;
    gift_layout_t push_l, pull_l;
    size_t pay_stride; /* push_l.total rounded up to 64 bytes */
    int started;
    /* The window was placed by a push and no step of it has finished yet
     * (a restored chunk never is): one rank's first frame has not anchored
     * it, and a member's lower first push moves it (shard.c, window_move). */
    int tentative;
    uint64_t base;
    slot_t slot[2];        /* slot[step & 1] for steps base and base + 1 */
    reply_t reply[2];      /* reply[step & 1] for the last two finished steps */
    struct parked *parked; /* pulls waiting for a step (shard_state.h) */
    int pending;           /* in s->pending: a finished step waits for the log's sync */
    /* Pull error feedback (the tensor's pull_ef): the residual of the last
     * finished step's mean encoding, in the coordinates of pres_epoch; n
     * floats, allocated at declaration. NULL without pull_ef. */
    float *pres;
    uint32_t pres_epoch;
} chunk_t;

typedef struct epoch_rec {
    uint32_t epoch;
    uint64_t valid_from;
    gift_treat_t tr; /* the policy's decision for it */
} epoch_rec_t;

struct tensor {
    uint32_t key;
    char *name;
    uint32_t rows, cols;
    gift_codec_params_t push, pull;
    Gift__Format push_fmt, pull_fmt;
    uint32_t push_block, pull_block;
    int geometry;
    int pull_ef; /* error feedback on the pulled mean (a lossy pull codec) */
    uint32_t k, ks, refresh;
    uint64_t seed;
    /* This shard's chunks of the tensor, sorted by chunk id: a sparse index
     * whose size is the number of chunks declared here, never an id's value. */
    chunk_t **by_id;
    uint32_t nchunks;
    int owner;
    /* Geometry owner state. */
    gift_geometry_t geo;
    int geo_ok;
    float *ysum;
    double trace_sum;
    float *yr;  /* ordered: every rank's sketch, world x cols x ks */
    double *tr; /* ordered: every rank's trace */
    uint64_t *sk_ranks;
    uint32_t sk_count;
    int sk_active;
    uint64_t sk_step;
    int sk_done;           /* a round completed: */
    uint64_t sk_done_step; /* its step, for replays after a reconnect */
    gift_rbuf_t *geo_buf;
    epoch_rec_t epochs[MAX_EPOCH_RECS];
    uint32_t nepochs;
    /* Policy (policy_owner.c): the latest finished mean of chunk 0 in
     * Euclidean coordinates (nrows x cols f32, allocated at declaration
     * when a policy other than all or a budget is set; gbar_ok once
     * filled), the step it is of, and the scratch of its T^-1. */
    float *gbar, *gbar_work, *gbar_d, *gbar_dinv;
    int gbar_ok;
    uint64_t gbar_step;
    /* Status. */
    double hit_rate;
    int hit_known; /* hit_rate was measured at least once */
    uint64_t bytes_in, bytes_out;
};

static inline int bit_get(const uint64_t *b, uint32_t i)
{
    return (int)((b[i >> 6] >> (i & 63)) & 1u);
}

static inline void bit_set(uint64_t *b, uint32_t i)
{
    b[i >> 6] |= 1ull << (i & 63);
}

#endif
