/*
 * shard_types.h: the types of the shard's interface (shard.h): the io table
 * the glue fills in, the options, the counters, and the opaque handles of a
 * shard and a peer. No function is declared here, so that the rooms below
 * shard.c (shard_state.h and the helpers that include it) can use these
 * types without depending on shard.c; shard.h includes this header.
 */
#ifndef GIFT_SHARD_TYPES_H
#define GIFT_SHARD_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "rbuf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the shard needs from the I/O layer. */
typedef struct gift_shard_io {
    /* Queues one frame for the peer whose io context is ctx: head_len bytes of
     * preamble + header (copied by the callee before it returns), then len
     * payload bytes of buf starting at off. When buf is not NULL the callee
     * takes a reference and drops it once the bytes are written or the peer
     * is gone. Returns 0 or a negative code (the frame was not queued). */
    int (*send)(void *ctx, const uint8_t *head, size_t head_len, gift_rbuf_t *buf, size_t off,
                size_t len);
    /* Closes the peer once its queued frames are written; the glue later
     * calls gift_shard_peer_close. */
    void (*close)(void *ctx);
    /* Monotonic clock in nanoseconds. */
    uint64_t (*now_ns)(void);
} gift_shard_io_t;

typedef struct gift_shard_opts {
    uint32_t shard_id;
    uint32_t num_shards;
    /* 0: unknown until the first Declare that builds the store succeeds:
     * the world size of its sender's Hello (authenticated when auth is on)
     * is adopted then. A Hello alone never fixes it. */
    uint32_t world_size;
    uint64_t max_frame_bytes; /* largest payload a declaration may imply */
    uint32_t max_parked;      /* parked pulls, whole shard */
    /* Parked pulls one connection may hold; 0: 2 x the chunks on this shard
     * + 64 (what one worker can need: steps base and base + 1 of each). */
    uint32_t max_parked_per_peer;
    /* Bytes the declared tensors may commit (accumulators, reply buffers,
     * kept pushes, residuals, geometry): a Declare needing more is refused
     * before anything is allocated. 0: gift_shard_memory_default(). */
    uint64_t max_memory;
    /* How far past the shard's newest base step a chunk's first push may
     * be (a started chunk only takes base and base + 1). 0: the default,
     * GIFT_STEP_AHEAD_DEFAULT. */
    uint64_t max_step_ahead;
    double damping;        /* geometry damping (GIFT_DAMPING_DEFAULT) */
    double geometry_decay; /* covariance running average, [0, 1); 0: latest round only */
    uint32_t hits_every;   /* measure pull-codec boundary hits every N steps (0: never) */
    /* The geometry owner's per-tensor policy (policy_owner.h): GIFT_POLICY_*
     * of codec/gift_policy.h (0: all), the bit budget per element (0: none,
     * formats stay declared), the transform cap in GFLOP per step (0: none)
     * and the boundary-hit threshold of policy hits (0: the chooser's). */
    int policy;
    double budget_bits;
    double max_transform_gflops;
    double hits_threshold;
    uint32_t stall_warn_s;     /* log a step waiting this long for ranks (0: never) */
    uint32_t stall_timeout_s;  /* fail its parked pulls after this long (0: never) */
    int aggregate;             /* GIFT_SHARD_ORDERED (0, default) or GIFT_SHARD_EAGER */
    const char *data_dir;      /* checkpoints and the step log (copied) */
    uint32_t checkpoint_steps; /* 0: no persistence at all */
    /* 1: finished steps are appended to the step log without a sync, and
     * their pulls wait until the glue calls gift_shard_flush (once per
     * event-loop turn: one fdatasync for every step finished in the turn).
     * 0: each finished step is synced at once. */
    int group_commit;
    /* Shared-secret authentication at Hello (proto/gift_auth.h, gift.proto):
     * NULL for none. Not copied: the key must outlive the shard. */
    const struct gift_auth_key *auth;
} gift_shard_opts_t;

#define GIFT_STEP_AHEAD_DEFAULT 1000000

#define GIFT_SHARD_ORDERED 0
#define GIFT_SHARD_EAGER 1

typedef struct gift_shard gift_shard_t;
typedef struct gift_peer gift_peer_t;

/* Passes of the shard's own code over a chunk's elements, by kind
 * (gift_shard_counters_t.pass_bytes: 4 bytes per element each time one
 * runs; /metrics giftd_pass_bytes_total{pass=NAME}, gift_shard_pass_name). */
enum {
    GIFT_SPASS_DECODE,     /* a step's first push decoded into the sum */
    GIFT_SPASS_ACCUMULATE, /* a push decoded and added */
    GIFT_SPASS_FUSED,      /* the last push decoded, averaged and encoded in one walk */
    GIFT_SPASS_ENCODE,     /* the mean scaled and encoded */
    GIFT_SPASS_COPY,       /* an out-of-order push kept (ordered aggregation) */
    GIFT_SPASS_CHECK,      /* a payload checked without decoding; a boundary-hit count */
    GIFT_SPASS_RESIDUAL,   /* pull error feedback's extra walks */
    GIFT_SPASS_SCALE,      /* the mean materialised in the sum (hits, policy) */
    GIFT_SPASS_KINDS
};

/* Counters for /metrics and Stats. Codec-indexed arrays use gift_format_t. */
#define GIFT_LAT_BUCKETS 12
typedef struct gift_shard_counters {
    uint64_t frames_in, frames_out, bytes_in, bytes_out;
    uint64_t push_bytes_in[5], pull_bytes_out[5];   /* payload bytes, by codec */
    uint64_t push_frames_in[5], pull_frames_out[5]; /* counted pushes / replies, by codec */
    uint64_t pushes, duplicates, pulls, sketches, steps_finished, epochs_published;
    uint64_t pass_bytes[GIFT_SPASS_KINDS];
    uint64_t stalls;       /* chunk steps that waited past stall_warn */
    uint64_t window_moves; /* tentative windows moved down by a member's first push */
    /* Persistence. */
    uint64_t checkpoints, checkpoint_failures, log_records, log_bytes, log_failures;
    uint64_t restored_step; /* oldest unfinished step after a restore (0: none) */
    uint64_t errors[32];    /* by -code, 0..31 */
    uint32_t peers;
    /* Step latency (first push to finish) histogram, upper bounds in seconds:
     * 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 +Inf. */
    uint64_t lat_bucket[GIFT_LAT_BUCKETS];
    double lat_sum;
} gift_shard_counters_t;

#ifdef __cplusplus
}
#endif
#endif
