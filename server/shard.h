/*
 * shard.h: one giftd shard's state and its message handling, without sockets.
 *
 * The shard holds the declared tensors and the chunks placed on it, sums
 * pushes in FP32 as they arrive, answers pulls with one reference-counted
 * encoded mean per (chunk, step), and owns the geometry of every tensor whose
 * chunk 0 it holds. It never includes <uv.h>: frames come in through
 * gift_shard_handle and go out through the gift_shard_io_t callbacks, so the
 * whole aggregation logic runs in unit tests with fake peers.
 *
 * The mean of a step is, element by element, fl(fl(sum) * fl(1/N)) + 0.0f,
 * where the + 0 turns -0 into +0; it is encoded with the tensor's pull codec.
 * How sum adds the decoded pushes is the aggregation mode:
 *
 *   ordered (the default)  in rank order 0, 1, ..., N-1, whatever order the
 *       pushes arrive in, so a step's reply is bit-identical from run to run.
 *       Each rank's encoded push is kept (world x 2 encoded chunks per chunk,
 *       allocated at declaration); a push that arrives in rank order is
 *       summed at once together with any kept pushes that now follow it, one
 *       that arrives early is decoded once to validate it and kept. Sketch
 *       sums of the geometry owner are rank-ordered the same way.
 *   eager  in arrival order, each push decoded into the sum as it arrives:
 *       no extra memory or decode, but the float sum depends on arrival order
 *       (with 3 or more ranks).
 *
 * Persistence (checkpoint_steps > 0): the shard keeps in data_dir a
 * checkpoint (declaration, per chunk its next step and the replies of its
 * last two finished steps, per owned tensor its epochs, geometry and the
 * sketches of an unfinished round) and a step log after it. A chunk's
 * finished step is appended to the log and fdatasynced before any pull of it
 * is answered; an accepted sketch before its SketchAck; a new epoch before it
 * is announced. Pushes of unfinished steps are not made durable: the client
 * keeps every push until the pull of its step completes and replays it after
 * a reconnect. A checkpoint is written every checkpoint_steps steps (the
 * oldest unfinished step over all chunks) and by gift_shard_checkpoint
 * (SIGTERM); it starts a new log generation.
 *
 * Steps (docs/ARCHITECTURE.md): every chunk has a base step b, the oldest
 * unfinished one, and accumulators for b and b + 1. A push for a step below
 * b is a replay and is acknowledged as a duplicate; one for b + 2 or later is
 * refused with GIFT_ESTEP. A pull for b or b + 1 is parked until the step
 * finishes; the replies of the last two finished steps are kept for late or
 * repeated pulls. Nothing is buffered without bound: parked pulls draw from
 * a pool of max_parked entries allocated at creation.
 *
 * Geometry: the owner of a tensor (the shard holding its chunk 0) sums the
 * Sketch frames of a refresh step; when every rank's sketch has arrived it
 * builds epoch e + 1, valid from the sketch step + 1, and advertises it in
 * chunk 0's PullReply.latest_epoch. A worker must send its Sketch for step t
 * before its chunk-0 Push for step t on the same connection, so the epoch is
 * always built before step t finishes. Pushes must carry the epoch valid for
 * their step (owner) or the same epoch as the other pushes of that step
 * (other shards); otherwise GIFT_EEPOCH.
 */
#ifndef GIFT_SHARD_H
#define GIFT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "gift_proto.h"
#include "rbuf.h"
#include "shard_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The types of this interface (the io table, the options, the counters and
 * the opaque gift_shard_t and gift_peer_t) are in shard_types.h. */

/* The default max_memory: three quarters of the machine's physical memory
 * (sysconf), or 1 TiB when that cannot be read. */
uint64_t gift_shard_memory_default(void);

/* The bytes the declared store takes (0 before a Declare). */
uint64_t gift_shard_memory_committed(const gift_shard_t *s);

/* The name of a pass kind (GIFT_SPASS_*, shard_types.h) in /metrics. */
const char *gift_shard_pass_name(int kind);

/* The upper bounds of the step latency histogram (gift_shard_counters_t). */
extern const double gift_lat_bounds[GIFT_LAT_BUCKETS];

/* Creates a shard. io is copied. Returns NULL when out of memory or when the
 * options are invalid. */
gift_shard_t *gift_shard_new(const gift_shard_opts_t *o, const gift_shard_io_t *io);
/* Frees everything, dropping references to buffers still in flight. */
void gift_shard_free(gift_shard_t *s);

/* A connection arrived; ctx is what io callbacks receive for it. Returns NULL
 * when out of memory. */
gift_peer_t *gift_shard_peer_open(gift_shard_t *s, void *ctx, uint64_t conn_id);
/* The connection is gone: its parked pulls are dropped, the peer freed. */
void gift_shard_peer_close(gift_shard_t *s, gift_peer_t *p);

/* Handles one frame from p. Replies go out through io->send. Returns 0 when
 * the connection may go on (request errors were answered with an Error
 * frame), or a negative code when the peer broke the protocol: an Error
 * frame with fatal = true was queued and io->close was called. */
int gift_shard_handle(gift_shard_t *s, gift_peer_t *p, const gift_frame_t *f);

/* Answers a broken stream (a reader error) with a fatal Error frame and
 * closes the peer. */
void gift_shard_reject(gift_shard_t *s, gift_peer_t *p, int code, const char *text);

/* 1 once the peer's Hello (and authentication, when on) has succeeded. */
int gift_shard_peer_ready(const gift_peer_t *p);

/* 1 when p is its rank's one live connection: it sent a Declare, Push,
 * Pull, Sketch or GeometryRequest (a StatsRequest does not count). The glue
 * never closes such a connection to make room or for being idle. */
int gift_shard_peer_claimed(const gift_peer_t *p);

/* The glue calls this when p starts a frame that carries a payload, before
 * buffering it: only a rank's connection may send one (a Push or Sketch),
 * so p claims its rank here. Returns 0, or a negative code after a fatal
 * Error frame (io->close called): no Hello yet, the world size not known
 * yet (no Declare), or the rank held by another connection. */
int gift_shard_peer_claim(gift_shard_t *s, gift_peer_t *p);

/* Called about once a second by the glue: a chunk step that some ranks have
 * pushed and others not for stall_warn_s seconds is logged once, naming the
 * missing ranks; past stall_timeout_s its parked pulls fail with
 * GIFT_ETIMEDOUT (the step itself stays open for the late ranks). */
void gift_shard_tick(gift_shard_t *s);

/* Loads the shard's state from opts.data_dir when checkpoint_steps > 0: the
 * checkpoint if there is one, then the records of its step log; then opens
 * the log for appending and attaches the journal (persist.c; without a
 * restore nothing is logged). Call once, before any peer. Returns 1 when
 * state was restored, 0 when there was none (or persistence is off), or a negative code
 * with a sentence in err: a checkpoint or log that is corrupt, truncated, of
 * another shard or cluster, or unreadable is refused whole and the shard
 * must not serve (the caller exits). */
int gift_shard_restore(gift_shard_t *s, char *err, size_t errlen);

/* Before any restore: checks that data_dir holds only what its checkpoint
 * (read in part, not verified) accounts for (gift_ckpt_audit). 0, or
 * GIFT_ECONFIG with one sentence in err naming the files and the choices
 * (a damaged checkpoint returns 0: gift_shard_restore refuses it). Changes
 * nothing. */
int gift_shard_datadir_check(const char *dir, char *err, size_t errlen);

/* Group commit: syncs the step log once and answers the pulls that waited
 * for the steps finished since the last flush. Cheap when there are none. */
void gift_shard_flush(gift_shard_t *s);

/* Writes a checkpoint now (tmp, fsync, rename, fsync dir) and starts a new
 * step-log generation. A no-op returning 0 when persistence is off or
 * nothing was declared. Returns 0 or GIFT_EIO/GIFT_ENOMEM with err set. */
int gift_shard_checkpoint(gift_shard_t *s, char *err, size_t errlen);
/* The same in checkpoint format version `version` (GIFT_CKPT_VERSION_MIN..,
 * checkpoint.h): an older one only to test that files of earlier versions
 * still load. GIFT_EINVAL for a version this giftd cannot write. */
int gift_shard_checkpoint_version(gift_shard_t *s, uint32_t version, char *err, size_t errlen);

/* Read-only views for metrics and status. */
const gift_shard_counters_t *gift_shard_counters(const gift_shard_t *s);
uint32_t gift_shard_world_size(const gift_shard_t *s);
size_t gift_shard_tensor_count(const gift_shard_t *s);

/* Per-tensor status: the oldest unfinished step over the tensor's chunks on
 * this shard, the ranks that have not pushed it (bitmap in missing, up to
 * 64 * words ranks), its epoch and the pull-codec boundary-hit rate of the
 * last measured step. Returns 0 or GIFT_ENOKEY. */
typedef struct gift_tensor_status {
    uint32_t key;
    const char *name;
    int has_step;     /* 0 when nothing was pushed yet */
    uint64_t step;    /* oldest unfinished step */
    uint32_t missing; /* ranks still missing for that step */
    uint32_t epoch;   /* newest published epoch (owner) */
    int owner;
    double hit_rate; /* boundary hits / codes, last measured step */
    uint64_t bytes_in, bytes_out;
    const char *push_codec, *pull_codec;
    /* The newest epoch's decision (owner only; the declared treatment when
     * no policy changed it): "gift" or "euclidean", the transform rank, the
     * epoch's codecs, the chooser's predicted error ratio and bits per
     * element (0 when the chooser did not run). */
    const char *mode, *epoch_push_codec, *epoch_pull_codec;
    uint32_t rank;
    double pred_ratio, bits;
} gift_tensor_status_t;
int gift_shard_tensor_status(const gift_shard_t *s, size_t index, gift_tensor_status_t *out,
                             uint64_t *missing_bitmap, size_t words);

/* The policy the shard runs (giftd --policy, budget_bits, max_transform_gflops). */
typedef struct gift_shard_policy {
    const char *name; /* gift_policy_name */
    double budget_bits, max_transform_gflops;
} gift_shard_policy_t;
void gift_shard_policy(const gift_shard_t *s, gift_shard_policy_t *out);

/* Returns 1 when ready to serve (always, once created); for /readyz. */
int gift_shard_ready(const gift_shard_t *s);

#ifdef __cplusplus
}
#endif
#endif
