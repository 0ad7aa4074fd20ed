/*
 * giftclient_internal.h: libgiftclient's state, shared by its files.
 *
 *   client.c  the public API on the caller's side: options, the declared
 *             list (fusion, wire tensors, placement, buffers), operations
 *             and their hand-over to the I/O thread.
 *   mailbox.c the hand-over itself: the command queue, command and
 *             operation completion, the operation pool; wait, test, free.
 *   engine.c  everything the I/O thread does that is not a socket: the
 *             per-step push and pull state of every wire tensor, encode and
 *             decode, geometry epochs, frame handling, replay and timeouts.
 *             It reaches the network only through the gift__io_t table.
 *   conn.c    the engine's side of each shard's connection: the handshake,
 *             what a lost connection sends again, CMD_CONNECT/CMD_DECLARE.
 *   net.c     the only file that knows libuv: the thread, its loop,
 *             connections with backoff, one batched write per turn. It
 *             fills gift__io_t and calls the engine's gift__eng_* entries.
 *
 *   frames.c  the frames the engine sends, through that table.
 *   host.c    the host path of gift__path_t: encode, decode, transform on
 *             the CPU backend, and its codec threads; device.c is the
 *             device path.
 *   notes.c   the sentences of the client's last error (gift__client_note,
 *             gift__shard_addr): the lowest file, calling no other.
 *
 * Calls run one way, down (no file calls a file above it):
 *
 *   client.c -> device.c (gift__devices), net.c (gift__net_io: the table
 *               only), engine.c (gift__eng_free_wires), mailbox.c
 *   net.c    -> engine.c, conn.c (gift__eng_*), host.c (encode_more, pool)
 *   engine.c -> conn.c, host.c, frames.c, mailbox.c, notes.c
 *   device.c -> host.c (gift__pull_codec, gift__pull_len)
 *   conn.c   -> frames.c, mailbox.c, notes.c
 *   host.c, frames.c, mailbox.c -> notes.c at most
 *
 * Upward, only tables: client.c starts and joins the I/O thread through
 * c->io (gift__io_t), the engine reaches net.c only through c->io, a
 * tensor's host or device path only through gift__path_t and device.c's
 * lifecycle only through c->dev (gift__devices_t, which gift__client_new
 * sets from gift__devices()); the paths report back through c->eng
 * (gift__eng_ops_t, which the engine sets at declaration). The engine thus
 * runs in tests without sockets (tests/client/test_engine.c).
 *   device.c  device tensors (GIFT_MEMORY_CUDA) on the GPU through gpu/'s
 *             gift_gpu.h: contexts, device buffers, and the queue of GPU
 *             jobs of each device. Built when CUDA is; device_stub.c (no
 *             device exists) otherwise.
 *
 * Threads: the caller's thread builds the declared list and then only reads
 * it; every mutable field below is owned by the I/O thread, except those
 * marked "mu" (guarded by gift_client.mu) and the counters (atomic). A codec
 * thread (host.c, codec_threads > 0) runs a wire's push or a pull's T^-1 as
 * a job: while a job is active the I/O thread leaves what it writes (w->p,
 * its scratch in w->pwork, w->ef, the payloads of chunks not yet published,
 * the pull's target) and the geometry slots it pins alone; host.c's
 * gift__hjob_t says how they hand over.
 *
 * Wire tensors: what travels. A user tensor ("member") maps to a slice
 * [off, off + n) of exactly one wire tensor. Small Euclidean tensors are
 * fused into one 1 x N bucket per codec class, so that a step of many small
 * tensors costs one frame per bucket instead of one per tensor; every other
 * tensor is a wire tensor of its own (a 1-D tensor whose row would exceed a
 * chunk is reshaped into rows of a divisor of its length).
 */
#ifndef GIFT_GIFTCLIENT_INTERNAL_H
#define GIFT_GIFTCLIENT_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "gift/client.h"
#include "gift_codec.h"
#include "gift_auth.h"
#include "gift_proto.h"
#include "placement.h"

#define GIFT__FUSE_BYTES (64u * 1024u) /* tensors below this (FP32) are fused */
#define GIFT__GEO_SLOTS 3              /* geometry epochs kept per tensor */
#define GIFT__CHUNK_DEFAULT (4ull << 20)
#define GIFT__TIMEOUT_DEFAULT 60000
#define GIFT__CONNECT_TIMEOUT_DEFAULT 30000
#define GIFT__BACKOFF_MAX_DEFAULT 2000
#define GIFT__BACKOFF_MIN_MS 20
#define GIFT__REFRESH_DEFAULT 50
#define GIFT__CODEC_THREADS_MAX 64

/* Kinds carried in the top byte of a request's seq, so that an Error frame
 * finds the request it answers. */
enum { GIFT__SEQ_PUSH = 1, GIFT__SEQ_PULL = 2, GIFT__SEQ_SKETCH = 3, GIFT__SEQ_GEO = 4 };

/* Frame priorities: larger is written first within one loop turn. */
#define GIFT__PRIO_CONTROL INT64_MAX
#define GIFT__PRIO_SKETCH (INT64_MAX - 1)

typedef struct gift__req gift__req_t;

/* An intrusive doubly-linked list of requests. */
typedef struct gift__list {
    gift__req_t *head, *tail;
} gift__list_t;

enum gift__req_kind { GIFT__REQ_PUSH = 1, GIFT__REQ_PULL = 2, GIFT__REQ_SKETCH = 3 };

/* One step of one member: a push, a pull, or a sketch. A request is in at
 * most one list at a time: its member's queue of deferred requests, or the
 * push/pull state it waits on. */
struct gift__req {
    gift__req_t *prev, *next;
    gift__list_t *list;
    struct gift_op *op;    /* push/pull: the operation; sketch: NULL */
    struct gift__cmd *cmd; /* sketch: the command */
    int active;            /* sketch: not finished yet */
    int kind;
    uint32_t id; /* member */
    uint64_t step;
    const float *in; /* push: grad; sketch: X */
    float *out;      /* pull */
    uint32_t n;      /* sketch: rows of X */
};

/* A command handed to the I/O thread (mu while queued). */
enum gift__cmd_kind {
    GIFT__CMD_OP = 1,  /* start op's requests */
    GIFT__CMD_CONNECT, /* connect to every shard */
    GIFT__CMD_DECLARE, /* declare the list everywhere, fetch epoch 0 */
    GIFT__CMD_SKETCH,  /* compute and send a sketch */
    GIFT__CMD_CLOSE    /* finish in-flight ops, stop the loop */
};

typedef struct gift__cmd {
    struct gift__cmd *next;
    int kind;
    int done, rc; /* mu */
    uint64_t deadline_ns;
    struct gift_op *op;
    gift__req_t req; /* sketch */
} gift__cmd_t;

/* An operation (gift_op_t): one or two requests (push_pull). */
struct gift_op {
    gift_client_t *c;
    struct gift_op *prev, *next; /* in-flight list (I/O thread) or free list (mu) */
    gift__req_t req[2];
    int nreq, parts_left;
    int status;
    uint64_t deadline_ns;
    gift_op_cb cb;
    void *arg;
    int done, in_cb, free_req; /* mu */
    int pooled;                /* mu: on the free list */
    int active[2];             /* I/O thread: req[i] not finished yet */
    gift__cmd_t cmd;           /* its hand-over to the I/O thread */
};

typedef struct gift__member {
    char *name;
    uint32_t rows, cols;
    uint32_t wire;
    size_t off, n;     /* slice of the wire tensor, elements */
    uint32_t index;    /* position within the wire's members */
    gift__list_t fifo; /* deferred requests, in submission order */
} gift__member_t;

typedef struct gift__chunk {
    uint32_t wire, idx, row_begin, rows, shard;
    size_t n, off; /* elements; off = row_begin * cols */
    gift_layout_t push_l, pull_l;
    size_t push_off; /* offset of its payload in a push state's area */
} gift__chunk_t;

/* The state of one step's push of a wire tensor (gift__pstate_t.state).
 * Every transition, and where it happens (engine.c unless named):
 *
 *   IDLE -> ASSEMBLING    try_push: a request of a new step takes the slot,
 *   ACKED -> ASSEMBLING   once the step t - 2 there is not ASSEMBLING or
 *                         SENT, none of its frames is being written
 *                         (inflight) and no pending pull of that step still
 *                         needs its payloads for a replay (need_replay).
 *   ASSEMBLING -> SENT    eng_push_begin, from the path's push (host.c
 *                         host_push, device.c dev_push) once every member
 *                         is in (fused) or at once; chunks are then encoded
 *                         and each queued as it is ready.
 *   ASSEMBLING -> IDLE    fail_ps: encode_send could not start the push (no
 *                         epoch for its step, or the path's push refused).
 *   SENT -> ACKED         on_push_ack: the last chunk's PushAck. Its
 *                         payloads are kept, with need_replay, until the
 *                         pull of that step completes (pull_complete).
 *   SENT -> IDLE          fail_ps: the path's push_fail (an encode failed)
 *                         or a shard's Error on it; eng_push_gone and
 *                         eng_push_chunk_ready: every request on it is gone
 *                         (timed out), so it stops sending.
 *   ACKED -> IDLE         fail_ps: a shard's Error on it (on_error).
 *
 * Nothing else writes it. SENT and ACKED hold payloads (gift__ps_has_payload):
 * those are what a reconnect replays (conn.c resync) and what an Error on
 * the push refers to. */
typedef enum gift__ps_state {
    GIFT__PS_IDLE = 0,
    GIFT__PS_ASSEMBLING,
    GIFT__PS_SENT,
    GIFT__PS_ACKED
} gift__ps_state_t;

/* The state of one step's pull of a wire tensor (gift__lstate_t.state):
 *
 *   IDLE, READY -> PENDING  try_pull: a request of a new step (a Pull per
 *                           chunk goes; detach restarts it for the next
 *                           request when its target's request leaves).
 *   PENDING -> READY        pull_complete: a fused bucket decoded, its mean
 *                           kept for later members of the same step.
 *   PENDING -> IDLE         pull_complete (unfused, or failed); fail_pl (a
 *                           shard's Error); detach (its last request left:
 *                           late replies are dropped). */
typedef enum gift__pl_state {
    GIFT__PL_IDLE = 0,
    GIFT__PL_PENDING,
    GIFT__PL_READY
} gift__pl_state_t;

/* One step's push of a wire tensor (two per tensor: step & 1). */
typedef struct gift__pstate {
    gift__ps_state_t state; /* transitions: above */
    uint64_t step;
    uint32_t epoch;
    int need_replay;  /* its pull has not completed: replay after a reconnect */
    int inflight;     /* frames of this payload in queued or in-flight writes */
    uint32_t npushed; /* fused: members in */
    uint8_t *pushed;  /* fused: per member */
    uint8_t *acked;   /* per chunk */
    uint8_t *sent;    /* per chunk: queued on the current connection */
    uint32_t nacked;
    uint32_t nenc; /* chunks encoded so far (SENT/ACKED: only these may be queued) */
    /* Its codecs: its epoch's decision (tr: the Push names the pull codec
     * too), else the declared ones (gift__ps_codecs). */
    gift_codec_params_t push, pull;
    int tr;
    const float *encp; /* while encoding: the transformed gradient (+ residual) */
    /* A transformed push on the host path: each chunk's rows of tsrc are
     * transformed into encp as that chunk is encoded (host.c encode_one),
     * under tg, which stays pinned until the last chunk is (or the wire is
     * quiesced). NULL: encp holds the whole input already. */
    struct gift__geo *tg;
    const float *tsrc;
    uint8_t *payload; /* every chunk's encoded payload, 64-aligned */
    float *asmb;      /* fused: the assembled gradient */
    /* f32 chunks whose payload is their elements exactly are sent from here,
     * checked but not copied (gift__ps_chunk_payload): asmb, or the caller's
     * grad (zc_user) when its op keeps grad unchanged until the step's pull
     * completes (a push_pull whose out does not overlap grad). NULL: every
     * chunk is sent from payload. zc_ok: the engine allows the caller's grad
     * for the push being started. */
    const float *zc;
    int zc_user, zc_ok;
    gift__list_t reqs;
} gift__pstate_t;

/* One step's pull of a wire tensor. */
typedef struct gift__lstate {
    gift__pl_state_t state; /* transitions: above */
    uint64_t step;
    uint32_t epoch;
    int epoch_set;
    int err;
    uint8_t *got, *sent; /* per chunk */
    uint32_t ngot;
    float *target; /* where chunks decode: the first request's out, or mean */
    float *mean;   /* fused: the decoded bucket, kept for later members */
    gift__list_t reqs;
} gift__lstate_t;

typedef struct gift__geo {
    gift_geometry_t g;
    /* The owner's decision for this epoch (gift.proto Geometry 12..17):
     * the codecs of its steps (the declared ones when tr is 0); Euclidean
     * and a lowered rank are in g (identity, k). */
    gift_codec_params_t push, pull;
    int tr;
    uint64_t valid_from;
    int used;
    uint32_t gen; /* bumped at every load (device copies compare it) */
    int pinned;   /* host.c: a codec thread's job reads it (not reloaded until quiesced) */
} gift__geo_t;

typedef struct gift__dwire gift__dwire_t; /* device.c: a device wire's buffers */
typedef struct gift__path gift__path_t;   /* how a wire's memory is encoded and decoded */
typedef struct gift__gpu gift__gpu_t;     /* device.c: a client's devices */

typedef struct gift__wire {
    uint32_t key;
    char *name;
    uint32_t rows, cols;
    size_t n;
    gift_codec_params_t push, pull;
    int ef_on, geometry, prio;
    int pull_ef; /* declared with pull_error_feedback: the shards keep the pull residual */
    /* Declared with GIFT_TRANSFORM_HADAMARD (issue 42; never fused, never
     * geometry): each chunk's rows are rotated by hd into p before encoding,
     * and back in place after decoding. */
    int hadamard;
    gift_hadamard_t hd;
    uint32_t k, ks, refresh;
    uint64_t seed;
    uint32_t *members, nmembers;
    uint32_t chunk0, nchunks; /* into gift_client.chunks */
    int64_t push_prio, pull_prio;
    gift__pstate_t ps[2];
    gift__pstate_t *encoding; /* the push still being encoded, a few chunks per turn */
    gift__lstate_t pl[2];
    float *p;    /* transformed gradient (geometry or EF) */
    float *work; /* rows * k */
    gift_ef_t ef;
    /* Geometry. */
    gift__geo_t geo[GIFT__GEO_SLOTS];
    int have_geo;
    uint32_t newest;          /* newest epoch held */
    int fetching, fetch_sent; /* a GeometryRequest is outstanding */
    int sk_pending;           /* a sketch was sent; chunk 0's reply for sk_step not seen */
    int sk_unsent;
    uint64_t sk_step;
    uint32_t sk_epoch;
    double sk_trace;
    int sk_inflight;
    int sk_err;
    float *Y, *skw;
    size_t skw_cap;
    uint32_t last_epoch; /* epoch of the last push (switch counting) */
    int pushed_once;
    /* Device tensors (GIFT_MEMORY_CUDA; never fused): */
    int memory, device;
    gift__dwire_t *dw;        /* NULL for host wires; set on the I/O thread at declare */
    const gift__path_t *path; /* host or device path; set on the I/O thread at declare */
    struct gift__hjob *hjob;  /* host.c: its push and pulls' T^-1 on codec threads */
    float *pwork;             /* their scratch, 3 x rows * k (w->work is the I/O thread's) */
} gift__wire_t;

/* The memory path of a wire: how its pushes are transformed and encoded and
 * its pulls decoded and transformed back, for the kind of memory its
 * buffers live in. The engine calls only these, never a device function of
 * its own choosing: the host path (host.c) runs the CPU backend
 * (gift__backend_cpu(), codec/gift_kernels.h) on the I/O thread, the device
 * path (device.c) queues the same work as jobs on the wire's GPU through
 * gift__backend_cuda's entry points; both report back through c->eng
 * (gift__eng_ops_t below). Set for every wire at declaration (CMD_DECLARE),
 * a device wire's by the device table's declare. */
struct gift__path {
    /* Starts ps's push of src (step and slot set) under G (NULL: Euclidean)
     * and epoch: c->eng->push_begin, then encodes and queues its chunks.
     * Returns 0, or a code when it could not start (nothing was sent: the
     * engine fails the push). */
    int (*push)(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src,
                const gift__geo_t *G, uint32_t epoch);
    int turns;   /* 1: gift__host_encode_more encodes its pushes, a few chunks a turn */
    int is_host; /* 1: the host path (the wire's memory is the caller's, on the CPU) */
    /* A pull starts or restarts on pl: forget what was staged. */
    void (*pull_reset)(gift__wire_t *w, gift__lstate_t *pl);
    /* Chunk ch's checked reply payload: decoded into pl->target now (host),
     * or 0 and later (device). 0 or the decode's code. */
    int (*decode)(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl, const gift__chunk_t *ch,
                  const void *payload, size_t len);
    /* Chunk ch is in (pl->got, ngot counted; payload NULL when refused):
     * completes pl once its last chunk is decoded. */
    void (*chunk_done)(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl,
                       const gift__chunk_t *ch, const void *payload, size_t len);
    /* Every chunk of pl decoded: T^-1 in place when it is not done already.
     * 0 or a code (GIFT_EEPOCH: the epoch is not held). */
    int (*finish)(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl);
    /* dst = src, n floats of the wire's memory. 0 or a code. */
    int (*copy)(gift__wire_t *w, float *dst, const float *src, size_t n);
    /* The sketch of r's X against G's basis into w->Y and w->sk_trace.
     * 1 when it must wait (the device is busy), else 0 or a code. */
    int (*sketch)(gift_client_t *c, gift__wire_t *w, const gift__req_t *r, const gift__geo_t *G);
    /* An operation on w failed from outside its memory's work (a timeout, a
     * shard's Error): returns once nothing reads its input or writes its out. */
    void (*quiesce)(gift_client_t *c, gift__wire_t *w);
};

/* The engine's entries that a memory path calls back (host.c, device.c; I/O
 * thread). engine.c fills this table and hands it over at declaration
 * (CMD_DECLARE sets c->eng before any path runs), so that the paths, below
 * the engine, name none of its functions.
 *   push_begin        ps's step starts sending under epoch (nothing encoded,
 *                     acked or sent yet; w->encoding = ps); encp is what the
 *                     chunks are encoded from on the host (NULL on a device).
 *   push_chunk_ready  chunk j of ps is encoded, its payload in ps->payload:
 *                     queue it, and the pull of that chunk when it waits.
 *   push_fail         the push failed with rc (its requests finish with it).
 *   push_encoded      the path is done with w's push (w->encoding cleared).
 *   pull_done         every chunk of pl is decoded and transformed back in
 *                     pl->target, or pl failed with pl->err.
 *   push_gone         1 when ps's push has failed or every request on it is
 *                     gone (the caller's gradient may be gone too): its step
 *                     is then given up, not replayed. */
typedef struct gift__eng_ops {
    void (*push_begin)(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, uint32_t epoch,
                       const float *encp);
    void (*push_chunk_ready)(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, uint32_t j);
    void (*push_fail)(gift_client_t *c, gift__pstate_t *ps, int rc);
    void (*push_encoded)(gift_client_t *c, gift__wire_t *w);
    void (*pull_done)(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl);
    int (*push_gone)(gift__pstate_t *ps);
} gift__eng_ops_t;

enum gift__conn_state {
    GIFT__CONN_DOWN = 0,
    GIFT__CONN_HELLO,     /* TCP up, Hello sent */
    GIFT__CONN_DECLARING, /* Declare sent */
    GIFT__CONN_READY
};

typedef struct gift__conn {
    int state;
    int err;                 /* the shard refused the handshake (a code) */
    int ever_ready;          /* reached READY at least once */
    int lost;                /* dropped after being ready: the next READY is a reconnect */
    int connect_err;         /* the last failed connect: a negative errno (libuv), 0: none */
    uint64_t connect_log_ns; /* when a failed connect was last logged (rate limit) */
    int declared;            /* a DeclareAck arrived */
    uint64_t
        resume; /* 1 + the newest step a PullReply of this shard answered (Hello.resume_step) */
    uint64_t max_frame;
    /* Authentication of this connection (gift.proto): */
    int challenged;                         /* an AuthChallenge arrived */
    uint8_t cnonce[GIFT_AUTH_NONCE_BYTES];  /* ours, sent in both Hellos */
    uint8_t snonce[GIFT_AUTH_NONCE_BYTES];  /* the shard's */
    uint8_t hello_mac[GIFT_AUTH_MAC_BYTES]; /* what our second Hello carried */
} gift__conn_t;

typedef struct gift__net gift__net_t;

/* What the engine (and client.c) needs of the network, the way the shard
 * uses gift_shard_io_t: net.c fills it (gift__net_io), a test fakes it.
 * Every entry but start, join, wake and now_ns runs on the I/O thread. */
typedef struct gift__io {
    /* Caller (gift_client_open): the loop, its handles, the codec threads
     * and the I/O thread (c->thread_started). 0 or a code. NULL in a fake. */
    int (*start)(gift_client_t *c);
    /* Caller (close), after CMD_CLOSE completed: joins the I/O thread and
     * frees the loop. NULL in a fake. */
    void (*join)(gift_client_t *c);
    /* Any thread: commands are queued, run gift__eng_commands soon. */
    void (*wake)(gift_client_t *c);
    /* Starts connecting to every shard that has no connection. */
    void (*connect)(gift_client_t *c);
    /* Closes every handle: the loop ends once they are closed. */
    void (*shutdown)(gift_client_t *c);
    /* Closes shard's connection; gift__eng_conn_down follows when it was up,
     * and a reconnect after the backoff. */
    void (*drop)(gift_client_t *c, uint32_t shard);
    /* The shard's handshake succeeded: its next reconnect waits the least. */
    void (*backoff_reset)(gift_client_t *c, uint32_t shard);
    /* Queues a frame for shard: env packed with payload_len = len, then len
     * bytes of payload (not copied: it must stay unchanged until the write
     * completes, tracked by *inflight, incremented now and decremented when
     * the write is done or dropped; inflight may be NULL without payload).
     * Written at the end of the loop turn, in priority order. Returns 0,
     * GIFT_ECLOSED (no connection) or GIFT_ENOMEM. */
    int (*queue)(gift_client_t *c, uint32_t shard, const Gift__Envelope *env, const void *payload,
                 size_t len, int64_t prio, int *inflight);
    /* Same with a head already packed (preamble + header, payload_len 0). */
    int (*queue_raw)(gift_client_t *c, uint32_t shard, const uint8_t *head, size_t head_len,
                     int64_t prio);
    /* Any thread: a monotonic clock in nanoseconds. */
    uint64_t (*now_ns)(void);
    /* No payload may be received into [lo, hi) any more: a connection
     * receiving one there (gift__eng_sink) drops the rest of it and skips
     * the frame. NULL: the io never sinks. */
    void (*unsink)(gift_client_t *c, const void *lo, const void *hi);
} gift__io_t;

struct gift_client {
    /* Configuration (immutable after open). */
    int rank, world;
    uint32_t nshards;
    struct sockaddr_storage *addrs;
    uint64_t chunk_bytes;
    uint32_t timeout_ms, connect_timeout_ms, backoff_max_ms;
    uint64_t seed;
    char name[128];
    char run_id[65];       /* presented at Hello ("" = none): at most 64 bytes */
    char last_err[512];    /* gift_client_last_error: what the last failure said (under mu) */
    gift_auth_key_t *auth; /* the shared secret, or NULL: no authentication */
    const struct gift__devices *dev; /* the device lifecycle (gift__devices()) */
    /* The declared list (immutable after gift_declare). */
    int declared;       /* caller: operations may start */
    uint64_t max_frame; /* smallest max_frame_bytes of the shards, from open */
    gift__member_t *mem;
    size_t nmem;
    gift__wire_t *wires;
    size_t nwires;
    gift__chunk_t *chunks;
    size_t nchunks;
    uint8_t **decl_head; /* per shard: the packed Declare frame */
    size_t *decl_len;
    uint8_t digest[8];
    /* Threads. */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gift__cmd_t *subq_head, *subq_tail; /* mu */
    struct gift_op *free_ops;           /* mu */
    struct gift_op **all_ops;           /* mu: every op allocated, for close */
    size_t nall_ops, all_ops_cap;       /* mu */
    gift__net_t *net;
    const gift__io_t *io;       /* the network, as the engine sees it */
    const gift__eng_ops_t *eng; /* the engine, as the memory paths see it (set at declare) */
    gift_client_stats_t st;     /* atomic counters */
    /* Atomic: gift_client_counters (the I/O thread's CPU time is read then). */
    uint64_t payload_out, payload_in;
    uint64_t pass_bytes[GIFT_PASS_KINDS];
    uint64_t codec_cpu_ns; /* the codec threads' CPU, added after each job */
    /* I/O thread. */
    gift__conn_t *conns;
    struct gift_op *ops; /* in flight */
    gift__cmd_t *cmd_connect, *cmd_declare, *cmd_close;
    int geo_err;     /* a GeometryRequest failed during declare */
    int io_declared; /* the I/O thread's own "declared" (Hello digest, Declare) */
    int rescan;
    size_t nencoding;        /* wires whose push is still being encoded, a few chunks a turn */
    int codec_threads;       /* configuration: threads of the codec pool (0: none) */
    struct gift__pool *pool; /* host.c: the codec threads, or NULL */
    size_t npool;            /* codec-thread jobs queued, running or not yet retired */
    int closing;
    int lost; /* a shard lost the run's state (GIFT_ESTATE): every operation fails with it */
    gift__gpu_t *gpu; /* device.c: contexts and job queues, or NULL */
    uint64_t seq;
    uint64_t backoff_reset_ns;
};

/* The host path (host.c), every wire's unless the device table's declare gives it a
 * device's. */
extern const gift__path_t gift__host_path;
/* The codec threads (host.c; c->codec_threads of them, none when 0): started
 * by net.c before the I/O thread runs, stopped (each finishing its job, then
 * joined) before the loop closes the handle that wakes it. 0 or GIFT_ENOMEM. */
int gift__host_pool_start(gift_client_t *c);
void gift__host_pool_stop(gift_client_t *c);
/* At declaration, after the device table's (I/O thread): with codec threads,
 * each host wire of its own gets its jobs (freed with the wires). 0 or
 * GIFT_ENOMEM. */
int gift__host_declare(gift_client_t *c);

/* The policy's decision, on the host path (host.c). */
/* Loads Geometry m (its payload already in G->g.U and G->g.lambda) into G:
 * the transform of its decision (Euclidean: identity; a lowered rank) and
 * its codecs, each checked: a rank above the declared one, an unknown codec
 * or one larger than a declared buffer is GIFT_ESHAPE and G is not loaded. */
int gift__geo_load(gift_client_t *c, gift__wire_t *w, gift__geo_t *G, const Gift__Geometry *m);
/* ps's codecs from its epoch G (NULL: the declared ones). */
void gift__ps_codecs(const gift__wire_t *w, gift__pstate_t *ps, const gift__geo_t *G);
/* The pull codec of w's steps under epoch e (the declared one when e is not
 * held or carries no decision), and its payload bytes for chunk ch. */
const gift_codec_params_t *gift__pull_codec(gift__wire_t *w, uint32_t e);
size_t gift__pull_len(gift__wire_t *w, uint32_t e, const gift__chunk_t *ch);

/* Payload bytes of ps's push of chunk ch. */
static inline size_t gift__ps_push_len(const gift__pstate_t *ps, const gift__chunk_t *ch)
{
    gift_layout_t l;
    if (!ps->tr || gift_layout(&ps->push, ch->n, &l) < 0)
        return ch->push_l.total;
    return l.total;
}

/* 1 when ps holds a step's payloads (SENT or ACKED): a reconnect replays
 * them while need_replay, a shard's Error on the push fails it. */
static inline int gift__ps_has_payload(const gift__pstate_t *ps)
{
    return ps->state == GIFT__PS_SENT || ps->state == GIFT__PS_ACKED;
}

/* Whether chunk ch of ps goes out from ps->zc: f32, its payload exactly its
 * elements (no padding to send). */
static inline int gift__zc_chunk(const gift__pstate_t *ps, const gift__chunk_t *ch)
{
    return ps->push.fmt == GIFT_FMT_F32 && gift__ps_push_len(ps, ch) == (size_t)ch->n * 4u;
}

/* Chunk ch's push payload. */
static inline const uint8_t *gift__ps_chunk_payload(const gift__pstate_t *ps,
                                                    const gift__chunk_t *ch)
{
    if (ps->zc != NULL && gift__zc_chunk(ps, ch))
        return (const uint8_t *)(ps->zc + ch->off);
    return ps->payload + ch->push_off;
}

/* The geometry slot of w holding epoch e, or NULL. */
static inline gift__geo_t *gift__geo_by_epoch(gift__wire_t *w, uint32_t e)
{
    for (int i = 0; i < GIFT__GEO_SLOTS; i++)
        if (w->geo[i].used && w->geo[i].g.epoch == e)
            return &w->geo[i];
    return NULL;
}

/* Counters (any thread). */
#define GIFT__STAT_ADD(c, field, v) __atomic_fetch_add(&(c)->st.field, (v), __ATOMIC_RELAXED)
/* A pass of kind over n elements (gift_client_counters_t.pass_bytes). */
#define GIFT__PASS(c, kind, n)                                                                     \
    __atomic_fetch_add(&(c)->pass_bytes[(kind)], (uint64_t)(n)*4u, __ATOMIC_RELAXED)
#define GIFT__PAYLOAD_ADD(c, field, v) __atomic_fetch_add(&(c)->field, (v), __ATOMIC_RELAXED)

/* Chunk j of wire w. */
static inline gift__chunk_t *gift__chunk_of(gift_client_t *c, const gift__wire_t *w, uint32_t j)
{
    return &c->chunks[w->chunk0 + j];
}

/* The shard that owns w's geometry (holds its chunk 0). */
static inline uint32_t gift__owner_of(gift_client_t *c, const gift__wire_t *w)
{
    return gift__chunk_of(c, w, 0)->shard;
}

/* 1 when shard's connection has shaken hands (and declared, once declared). */
static inline int gift__ready(const gift_client_t *c, uint32_t shard)
{
    return c->conns[shard].state == GIFT__CONN_READY;
}

/* ---- mailbox.c ---- */
/* Caller: appends cmd to the queue (its done and rc cleared); the caller
 * then wakes the I/O thread (c->io->wake). */
void gift__cmd_put(gift_client_t *c, gift__cmd_t *cmd);
/* Caller: waits until cmd is done; returns its rc. */
int gift__cmd_wait(gift_client_t *c, gift__cmd_t *cmd);
/* Takes every queued command, in order (I/O thread). */
gift__cmd_t *gift__take_commands(gift_client_t *c);
/* Marks a command done with rc and wakes its waiter (I/O thread). */
void gift__cmd_done(gift_client_t *c, gift__cmd_t *cmd, int rc);
/* Takes an operation from the pool (or allocates one, kept until
 * gift__ops_free), zeroed and owned by c. NULL when out of memory. */
struct gift_op *gift__op_alloc(gift_client_t *c);
/* Completes an operation: status, callback, wake-up (I/O thread). */
void gift__op_complete(gift_client_t *c, struct gift_op *op);
/* Frees every operation ever allocated (close, no thread left). */
void gift__ops_free(gift_client_t *c);

/* ---- client.c (internal steps, for tests/client/test_engine.c) ---- */
/* gift_client_open without the network: options, servers, rank, auth, the
 * per-shard connection state. c->io is NULL until gift_client_open (or a
 * test) sets it. 0 or a code; free with gift_client_close. */
int gift__client_new(const gift_client_opts_t *opts, gift_client_t **out);
/* gift_declare without the hand-over: checks the list, builds the wire
 * tensors, placement, buffers and each shard's packed Declare. 0 or a code
 * (what was built goes at close). */
int gift__declare_build(gift_client_t *c, const gift_tensor_desc_t *tensors, size_t n);

/* ---- frames.c (I/O thread): what the engine sends, through c->io ---- */
/* Queues the Push of chunk ch of ps (its payload; ps->inflight counts the
 * write). 0 or the queue's code. */
int gift__send_push(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, gift__chunk_t *ch);
/* Queues every encoded chunk of ps not yet queued on its shard's connection
 * (only_shard: that shard alone, or UINT32_MAX); replay counts them. */
void gift__send_push_chunks(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps,
                            uint32_t only_shard, int replay);
/* Queues the Pull of every chunk of pl not yet queued; a chunk whose push of
 * the same step is not queued yet waits for it. */
void gift__send_pull_chunks(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl);
/* The GeometryRequest of w, when one is wanted and not yet sent. */
void gift__send_geo_request(gift_client_t *c, gift__wire_t *w);
/* w's computed sketch (w->Y), when not yet sent. */
void gift__send_sketch(gift_client_t *c, gift__wire_t *w);
/* The first Hello of a connection, or the second (with the MAC) after an
 * AuthChallenge; drops the connection when it cannot be queued. */
void gift__send_hello(gift_client_t *c, uint32_t shard);
/* The shard's packed Declare; the connection is DECLARING (or dropped). */
void gift__send_declare(gift_client_t *c, uint32_t shard);

/* ---- notes.c: the client's last error; calls no other file of client/ ---- */
/* Writes the printf-formatted sentence into c->last_err (under c->mu) and
 * on stderr, prefixed "giftclient: " (any thread). */
void gift__client_note(gift_client_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* "host:port" of shard's address, in buf (len bytes). */
const char *gift__shard_addr(const gift_client_t *c, uint32_t shard, char *buf, size_t len);
/* The sentences of gift__client_note that the engine leaves (I/O thread): */
/* The shard refused request `what` (push, pull) with Error e of code. */
void gift__note_refusal(gift_client_t *c, uint32_t shard, const char *what, const Gift__Error *e,
                        int code);
/* An operation timed out: after how long, and a shard that is not
 * connected, the likely culprit, when there is one. */
void gift__note_timeout(gift_client_t *c);
/* The connect timed out: the first shard not reached, and why. */
void gift__note_unreached(gift_client_t *c);

/* ---- conn.c (I/O thread): each shard's connection, as the engine sees it ---- */
/* net.c's connection events: TCP up (a Hello goes), down (what was queued
 * on it must go again), a connect failed with code (a negative errno). */
void gift__eng_conn_up(gift_client_t *c, uint32_t shard);
void gift__eng_conn_down(gift_client_t *c, uint32_t shard);
void gift__eng_conn_failed(gift_client_t *c, uint32_t shard, int code);
/* The handshake's frames, from gift__eng_frame: 0, or a code to drop the
 * connection. */
int gift__conn_on_auth_challenge(gift_client_t *c, uint32_t shard, const Gift__AuthChallenge *m);
int gift__conn_on_hello_ack(gift_client_t *c, uint32_t shard, const Gift__HelloAck *a);
int gift__conn_on_declare_ack(gift_client_t *c, uint32_t shard);
/* Completes CMD_CONNECT and CMD_DECLARE when what they wait for is there
 * (or failed): every shard READY; every shard declared and every geometry
 * tensor's first epoch in. */
void gift__conn_check_cmds(gift_client_t *c);

/* ---- host.c (I/O thread) ---- */
/* The end of a loop turn, before gift__eng_turn_end: encodes about 1 MiB of
 * the host pushes still encoding, higher priority first. */
void gift__host_encode_more(gift_client_t *c);

/* ---- engine.c (I/O thread) ---- */
void gift__eng_commands(gift_client_t *c);
/* A frame from shard; returns 0, or a negative code to drop the connection. */
int gift__eng_frame(gift_client_t *c, uint32_t shard, const gift_frame_t *f);
/* A frame whose header is in and payload not yet: where to receive its
 * payload (payload_len bytes), or NULL to buffer it as usual. */
void *gift__eng_sink(gift_client_t *c, uint32_t shard, const gift_frame_t *f);
void gift__eng_tick(gift_client_t *c);
void gift__eng_turn_end(gift_client_t *c);

/* Frees the per-wire buffers (any thread, once the I/O thread is gone). */
void gift__eng_free_wires(gift_client_t *c);
/* The paths' reports (push_begin, push_chunk_ready, ...) are not here: they
 * reach the engine through c->eng (gift__eng_ops_t). */

/* ---- device.c (device_stub.c without CUDA) ---- */
/* 0 when device is a CUDA device of this process, else GIFT_ENODEV with a
 * line on stderr naming tensor `name` (any thread; queries the device count
 * only). */
int gift__dev_available(int device, const char *name);
/* The device lifecycle, as a table the engine calls through c->dev (set
 * by gift__client_new from gift__devices()), so that the engine names no
 * device function and device.c's reports (gift__eng_*) run one way.
 * device.c fills it; without CUDA device_stub.c fills it with no-ops. */
typedef struct gift__devices {
    /* I/O thread, at declaration: a context per device used, every device
     * wire's device buffers and pinned staging (ps->payload), and its path
     * (w->path: the device path of gift__path_t). 0 or a code (said on
     * stderr). */
    int (*declare)(gift_client_t *c);
    /* Takes the reports of finished GPU work (host functions woke the loop). */
    void (*poll)(gift_client_t *c);
    /* I/O thread, closing: waits for the devices, frees every device resource. */
    void (*close)(gift_client_t *c);
    /* Any thread, once the I/O thread is gone: frees what close did not. */
    void (*free)(gift_client_t *c);
} gift__devices_t;

/* This build's device table (static storage). */
const gift__devices_t *gift__devices(void);

/* ---- net.c ---- */
/* The libuv network's table (static storage): gift_client_open sets c->io
 * to it and starts the I/O thread through c->io->start, close joins it
 * through c->io->join, so client.c names no other function of net.c. */
const gift__io_t *gift__net_io(void);

#endif
