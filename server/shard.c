/*
 * shard.c: the shard store, sync aggregation and geometry owner of shard.h.
 * No sockets here: frames come in through gift_shard_handle and go out
 * through the io callbacks.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "gift_auth.h"
#include "gift_codec.h"
#include "log.h"
#include "shard.h"

#define MAX_EPOCH_RECS 4
#define REFRESH_DEFAULT 50
#define HEAD_MAX 4096 /* preamble + any header the shard sends, except Stats */

const double gift_lat_bounds[GIFT_LAT_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                  0.1,   0.25,   0.5,   1.0,  2.5,   INFINITY};

/* ------------------------------------------------------------------ */
/* Reference-counted buffers                                             */
/* ------------------------------------------------------------------ */

gift_rbuf_t *gift_rbuf_new(size_t cap)
{
    /* One calloc for the struct and the bytes, which start 64-byte aligned
     * (payload sections stay aligned for SIMD decode). calloc, not a
     * memset: a large buffer comes as fresh zero pages that are committed
     * only when first written, so declaring a chunk does not touch its
     * reply buffers. */
    size_t room = cap ? cap : 64;
    gift_rbuf_t *b;
    uintptr_t at;
    if (room > SIZE_MAX - sizeof *b - 64)
        return NULL;
    if ((b = calloc(1, sizeof *b + 64 + room)) == NULL)
        return NULL;
    at = ((uintptr_t)(b + 1) + 63) & ~(uintptr_t)63;
    b->data = (uint8_t *)at;
    b->refs = 1;
    b->cap = cap;
    return b;
}

void gift_rbuf_ref(gift_rbuf_t *b)
{
    b->refs++;
}

void gift_rbuf_unref(gift_rbuf_t *b)
{
    if (b == NULL || --b->refs > 0)
        return;
    free(b);
}

/* ------------------------------------------------------------------ */
/* State                                                                 */
/* ------------------------------------------------------------------ */

struct chunk;

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
    uint8_t nonce[GIFT_AUTH_NONCE_BYTES]; /* ... with this server nonce */
    uint32_t world;   /* the world size its Hello gave */
    uint32_t nparked; /* its entries in the parked pool */
    int claimed;      /* it holds s->by_rank[rank]: the rank's one live connection */
};

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
    uint64_t t_first;
    int warned; /* the stall warning for this step was logged */
} slot_t;

typedef struct reply {
    int valid;
    int durable; /* in the step log and synced: its pulls may be answered */
    int err; /* 0, or the code pulls of this step get (e.g. the mean overflowed) */
    uint64_t step;
    uint32_t epoch;
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
    uint64_t base;
    slot_t slot[2];   /* slot[step & 1] for steps base and base + 1 */
    reply_t reply[2]; /* reply[step & 1] for the last two finished steps */
    parked_t *parked;
    int pending; /* in s->pending: a finished step waits for the log's sync */
    /* Pull error feedback (the tensor's pull_ef): the residual of the last
     * finished step's mean encoding, in the coordinates of pres_epoch; n
     * floats, allocated at declaration. NULL without pull_ef. */
    float *pres;
    uint32_t pres_epoch;
} chunk_t;

typedef struct epoch_rec {
    uint32_t epoch;
    uint64_t valid_from;
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
    int sk_done;          /* a round completed: */
    uint64_t sk_done_step; /* its step, for replays after a reconnect */
    gift_rbuf_t *geo_buf;
    epoch_rec_t epochs[MAX_EPOCH_RECS];
    uint32_t nepochs;
    /* Status. */
    double hit_rate;
    uint64_t bytes_in, bytes_out;
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
    /* Persistence (checkpoint_steps > 0): the open step log of generation
     * gen, the step at which the next checkpoint is due, and whether a
     * restore is replaying the log (nothing is logged or answered then). */
    int persist;
    gift_log_t log;
    uint64_t gen;
    uint64_t ckpt_next;
    gift_ckpt_buf_t ckpt_buf; /* the checkpoint body, reused from one to the next */
    int replaying;
    /* Group commit: chunks whose finished steps wait for gift_shard_flush. */
    chunk_t **pending;
    size_t npending;
    char dir[4096];
    /* The connection acting as each rank (grown to the highest rank seen,
     * below 65536): one live connection per rank. */
    gift_peer_t **by_rank;
    uint32_t by_rank_len;
    uint64_t mem; /* bytes the declared store takes (store_need) */
    gift_shard_counters_t c;
    uint8_t head[HEAD_MAX];
};

/* ------------------------------------------------------------------ */
/* Helpers                                                               */
/* ------------------------------------------------------------------ */

static int bit_get(const uint64_t *b, uint32_t i)
{
    return (int)((b[i >> 6] >> (i & 63)) & 1u);
}

static void bit_set(uint64_t *b, uint32_t i)
{
    b[i >> 6] |= 1ull << (i & 63);
}

/* Saturating arithmetic for sizes computed from wire fields: a sum or
 * product that would wrap is UINT64_MAX, which no budget admits. */
static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t now_ns(const gift_shard_t *s)
{
    return s->io.now_ns ? s->io.now_ns() : 0;
}

static int format_from_wire(Gift__Format f)
{
    switch (f) {
    case GIFT__FORMAT__FORMAT_F32:
        return GIFT_FMT_F32;
    case GIFT__FORMAT__FORMAT_BF16:
        return GIFT_FMT_BF16;
    case GIFT__FORMAT__FORMAT_FP8_E4M3:
        return GIFT_FMT_E4M3;
    case GIFT__FORMAT__FORMAT_FP8_E5M2:
        return GIFT_FMT_E5M2;
    case GIFT__FORMAT__FORMAT_NVFP4:
        return GIFT_FMT_NVFP4;
    default:
        return GIFT_EFORMAT;
    }
}

/* Codec params from a wire Codec (NULL means f32). Returns 0 or GIFT_EFORMAT. */
static int codec_from_wire(const Gift__Codec *c, gift_codec_params_t *p)
{
    gift_layout_t l;
    int f = format_from_wire(c ? c->format : GIFT__FORMAT__FORMAT_F32);
    if (f < 0)
        return GIFT_EFORMAT;
    memset(p, 0, sizeof *p);
    p->fmt = (gift_format_t)f;
    p->block = c ? c->block : 0;
    return gift_layout(p, 1, &l);
}

static int codec_equal(const Gift__Codec *c, Gift__Format fmt, uint32_t block)
{
    Gift__Format f = c ? c->format : GIFT__FORMAT__FORMAT_F32;
    uint32_t b = c ? c->block : 0;
    if (f != fmt)
        return 0;
    if (f == GIFT__FORMAT__FORMAT_FP8_E4M3 || f == GIFT__FORMAT__FORMAT_FP8_E5M2)
        return (b ? b : GIFT_FP8_BLOCK_DEFAULT) == (block ? block : GIFT_FP8_BLOCK_DEFAULT);
    return 1;
}

static void count_error(gift_shard_t *s, int code)
{
    int i = -code;
    if (i >= 0 && i < 32)
        s->c.errors[i]++;
}

/* Packs env with payload_len into s->head and sends it with buf. */
static int send_frame(gift_shard_t *s, gift_peer_t *p, Gift__Envelope *env, gift_rbuf_t *buf,
                      size_t off, size_t len)
{
    uint8_t *head = s->head;
    size_t need = gift_frame_head_size(env);
    long n;
    int rc;
    if (need > sizeof s->head && (head = malloc(need)) == NULL)
        return GIFT_ENOMEM;
    if ((n = gift_frame_pack_head(env, len, head, need)) < 0) {
        rc = (int)n;
        goto out;
    }
    rc = s->io.send(p->ctx, head, (size_t)n, buf, off, len);
    if (rc == 0) {
        s->c.frames_out++;
        s->c.bytes_out += (uint64_t)n + len;
    }
out:
    if (head != s->head)
        free(head);
    return rc;
}

/* Sends an Error frame; with fatal set, also asks the glue to close. */
static void send_error(gift_shard_t *s, gift_peer_t *p, int code, int fatal, uint32_t key,
                       uint32_t chunk, uint64_t step, uint64_t seq, const char *fmt, ...)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Error e = GIFT__ERROR__INIT;
    char text[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    count_error(s, code);
    e.code = code;
    e.text = text;
    e.key = key;
    e.chunk = chunk;
    e.step = step;
    e.seq = seq;
    e.fatal = fatal != 0;
    env.msg_case = GIFT__ENVELOPE__MSG_ERROR;
    env.error = &e;
    gift_log(fatal ? GIFT_LOG_LEVEL_WARN : GIFT_LOG_LEVEL_INFO, p->id, "error %d (%s) to rank %u: %s%s", code,
             gift_strerror(code), p->rank, text, fatal ? "; closing" : "");
    (void)send_frame(s, p, &env, NULL, 0, 0);
    if (fatal && !p->closing) {
        p->closing = 1;
        s->io.close(p->ctx);
    }
}

/* ------------------------------------------------------------------ */
/* Creation and teardown                                                 */
/* ------------------------------------------------------------------ */

gift_shard_t *gift_shard_new(const gift_shard_opts_t *o, const gift_shard_io_t *io)
{
    gift_shard_t *s;
    if (o == NULL || io == NULL || io->send == NULL || io->close == NULL ||
        o->num_shards == 0 || o->shard_id >= o->num_shards)
        return NULL;
    if ((s = calloc(1, sizeof *s)) == NULL)
        return NULL;
    s->o = *o;
    if (s->o.max_parked == 0)
        s->o.max_parked = 65536;
    if (s->o.max_frame_bytes == 0)
        s->o.max_frame_bytes = GIFT_MAX_FRAME_DEFAULT;
    if (s->o.max_memory == 0)
        s->o.max_memory = gift_shard_memory_default();
    if (s->o.max_step_ahead == 0)
        s->o.max_step_ahead = GIFT_STEP_AHEAD_DEFAULT;
    if (!(s->o.damping > 0.0))
        s->o.damping = GIFT_DAMPING_DEFAULT;
    if (!(s->o.geometry_decay >= 0.0 && s->o.geometry_decay < 1.0)) {
        free(s);
        return NULL;
    }
    s->io = *io;
    s->log.fd = -1;
    s->o.data_dir = NULL;
    if (o->aggregate != GIFT_SHARD_ORDERED && o->aggregate != GIFT_SHARD_EAGER) {
        free(s);
        return NULL;
    }
    if (o->checkpoint_steps > 0) {
        if (o->data_dir == NULL || o->data_dir[0] == '\0' ||
            strlen(o->data_dir) >= sizeof s->dir) {
            free(s);
            return NULL;
        }
        strcpy(s->dir, o->data_dir);
        s->persist = 1;
    }
    s->world = o->world_size;
    s->words = (s->world + 63) / 64; /* 0 until a Hello sets the world size */
    if ((s->pool = calloc(s->o.max_parked, sizeof *s->pool)) == NULL) {
        free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < s->o.max_parked; i++) {
        s->pool[i].pnext = s->free_parked;
        s->free_parked = &s->pool[i];
    }
    return s;
}

static void store_free(gift_shard_t *s)
{
    for (size_t i = 0; i < s->nchunks; i++) {
        chunk_t *ch = &s->chunks[i];
        for (int j = 0; j < 2; j++) {
            free(ch->slot[j].acc);
            free(ch->slot[j].ranks);
            free(ch->slot[j].pay);
            gift_rbuf_unref(ch->reply[j].buf);
        }
        free(ch->pres);
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        free(t->name);
        free(t->by_id);
        if (t->owner && t->geometry) {
            gift_geometry_free(&t->geo);
            free(t->ysum);
            free(t->yr);
            free(t->tr);
            free(t->sk_ranks);
            gift_rbuf_unref(t->geo_buf);
        }
    }
    free(s->chunks);
    free(s->tensors);
    free(s->decl);
    free(s->pending);
    s->pending = NULL;
    s->npending = 0;
    s->decl = NULL;
    s->decl_len = 0;
    s->chunks = NULL;
    s->tensors = NULL;
    s->nchunks = s->ntensors = 0;
    s->declared = 0;
}

void gift_shard_free(gift_shard_t *s)
{
    if (s == NULL)
        return;
    store_free(s);
    gift_log_close(&s->log);
    gift_ckpt_buf_free(&s->ckpt_buf);
    free(s->pool);
    free(s->by_rank);
    free(s);
}

/* ------------------------------------------------------------------ */
/* Peers and parked pulls                                                */
/* ------------------------------------------------------------------ */

gift_peer_t *gift_shard_peer_open(gift_shard_t *s, void *ctx, uint64_t conn_id)
{
    gift_peer_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->ctx = ctx;
    p->id = conn_id;
    s->c.peers++;
    return p;
}

static void parked_unlink(gift_shard_t *s, parked_t *q)
{
    if (q->cprev)
        q->cprev->cnext = q->cnext;
    else
        q->ch->parked = q->cnext;
    if (q->cnext)
        q->cnext->cprev = q->cprev;
    if (q->pprev)
        q->pprev->pnext = q->pnext;
    else
        q->peer->parked = q->pnext;
    if (q->pnext)
        q->pnext->pprev = q->pprev;
    q->peer->nparked--;
    memset(q, 0, sizeof *q);
    q->pnext = s->free_parked;
    s->free_parked = q;
}

void gift_shard_peer_close(gift_shard_t *s, gift_peer_t *p)
{
    if (p == NULL)
        return;
    while (p->parked)
        parked_unlink(s, p->parked);
    if (p->claimed && p->rank < s->by_rank_len && s->by_rank[p->rank] == p)
        s->by_rank[p->rank] = NULL;
    s->c.peers--;
    free(p);
}

/* The parked pulls one connection may hold: max_parked_per_peer, or by
 * default what one worker can need (steps base and base + 1 of every chunk
 * here) and some room for repeats. Never more than the pool. */
static uint32_t peer_park_cap(const gift_shard_t *s)
{
    uint64_t cap = s->o.max_parked_per_peer ? s->o.max_parked_per_peer
                                            : add_sat(mul_sat(s->nchunks, 2), 64);
    return cap < s->o.max_parked ? (uint32_t)cap : s->o.max_parked;
}

/* Answers a pull that park refused: the connection's share or the pool. */
static void park_refused(gift_shard_t *s, gift_peer_t *p, const Gift__Pull *m)
{
    if (p->nparked >= peer_park_cap(s))
        send_error(s, p, GIFT_EBUSY, 0, m->key, m->chunk, m->step, m->seq,
                   "too many pulls waiting from this connection (%u; max_parked_per_peer %u)",
                   p->nparked, peer_park_cap(s));
    else
        send_error(s, p, GIFT_EBUSY, 0, m->key, m->chunk, m->step, m->seq,
                   "too many pulls waiting on this shard (max_parked %u)", s->o.max_parked);
}

/* p acts as its rank (any message but Hello and StatsRequest): its Hello's
 * world size must be the cluster's (a Hello before the world was known
 * could claim any), and it becomes the rank's one live connection. A
 * second connection for a connected rank is refused; with authentication
 * on, its handshake proved the rank's own key (gift_auth.h), so it is the
 * worker reconnecting and replaces the old connection, which is closed.
 * Returns 0, or a negative code after a fatal Error to p. */
static int claim_rank(gift_shard_t *s, gift_peer_t *p)
{
    gift_peer_t *q;
    if (p->claimed)
        return 0;
    if (s->world != 0 && p->world != s->world) {
        send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0,
                   "world size %u, the cluster has %u (from %s)", p->world, s->world,
                   s->o.world_size ? "world_size" : "the first Declare");
        return GIFT_EWORLD;
    }
    if (p->rank >= s->by_rank_len) {
        uint32_t n = p->rank + 1 > 2 * s->by_rank_len ? p->rank + 1 : 2 * s->by_rank_len;
        gift_peer_t **nb = realloc(s->by_rank, (size_t)n * sizeof *nb);
        if (nb == NULL) {
            send_error(s, p, GIFT_ENOMEM, 1, 0, 0, 0, 0, "out of memory for the rank table");
            return GIFT_ENOMEM;
        }
        memset(nb + s->by_rank_len, 0, (size_t)(n - s->by_rank_len) * sizeof *nb);
        s->by_rank = nb;
        s->by_rank_len = n;
    }
    q = s->by_rank[p->rank];
    if (q != NULL && q != p) {
        if (s->o.auth == NULL) {
            send_error(s, p, GIFT_EBUSY, 1, 0, 0, 0, 0,
                       "rank %u is already connected (connection %" PRIu64 "); one live "
                       "connection per rank: it must close first (or set auth_key_file, so that "
                       "a reconnect proves its rank and replaces it)",
                       p->rank, q->id);
            return GIFT_EBUSY;
        }
        GIFT_LOG_WARN(p->id, "rank %u reconnected and proved its key: closing its old "
                      "connection %" PRIu64, p->rank, q->id);
        while (q->parked)
            parked_unlink(s, q->parked);
        q->claimed = 0;
        send_error(s, q, GIFT_ECLOSED, 1, 0, 0, 0, 0,
                   "replaced by connection %" PRIu64 ", which proved the key of rank %u", p->id,
                   p->rank);
    }
    s->by_rank[p->rank] = p;
    p->claimed = 1;
    return 0;
}

static int park(gift_shard_t *s, gift_peer_t *p, chunk_t *ch, uint64_t step, uint64_t seq,
                uint32_t have_epoch)
{
    parked_t *q = s->free_parked;
    if (q == NULL || p->nparked >= peer_park_cap(s))
        return GIFT_EBUSY;
    s->free_parked = q->pnext;
    p->nparked++;
    memset(q, 0, sizeof *q);
    q->peer = p;
    q->ch = ch;
    q->step = step;
    q->seq = seq;
    q->have_epoch = have_epoch;
    q->cnext = ch->parked;
    if (ch->parked)
        ch->parked->cprev = q;
    ch->parked = q;
    q->pnext = p->parked;
    if (p->parked)
        p->parked->pprev = q;
    p->parked = q;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Declaration                                                           */
/* ------------------------------------------------------------------ */

static uint64_t placement_sig(Gift__ChunkDecl *const *c, size_t n)
{
    /* Order-independent: sum of a mix of each (key, chunk, rows, row_begin). */
    uint64_t sig = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t x = ((uint64_t)c[i]->key << 32) ^ c[i]->chunk;
        x ^= ((uint64_t)c[i]->row_begin << 20) ^ ((uint64_t)c[i]->rows << 44);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        sig += x ^ (x >> 31);
    }
    return sig;
}

/* Publishes g's current state as the newest geometry of t: the payload
 * buffer (U then lambda) and the epoch record. */
static int publish_geometry(gift_shard_t *s, tensor_t *t, uint64_t valid_from)
{
    size_t ub = (size_t)t->cols * t->ks * 4, lb = (size_t)t->ks * 4;
    gift_rbuf_t *b = t->geo_buf;
    if (b == NULL || b->refs > 1) {
        /* A write still holds the old basis: it keeps it, we take a new one. */
        gift_rbuf_t *nb = gift_rbuf_new(ub + lb);
        if (nb == NULL)
            return GIFT_ENOMEM;
        gift_rbuf_unref(b);
        t->geo_buf = b = nb;
    }
    memcpy(b->data, t->geo.U, ub);
    memcpy(b->data + ub, t->geo.lambda, lb);
    b->len = ub + lb;
    if (t->nepochs == MAX_EPOCH_RECS) {
        memmove(t->epochs, t->epochs + 1, (MAX_EPOCH_RECS - 1) * sizeof t->epochs[0]);
        t->nepochs--;
    }
    t->epochs[t->nepochs].epoch = t->geo.epoch;
    t->epochs[t->nepochs].valid_from = valid_from;
    t->nepochs++;
    (void)s;
    return 0;
}

uint64_t gift_shard_memory_default(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return 1ull << 40;
    return mul_sat((uint64_t)pages, (uint64_t)size) / 4 * 3;
}

uint64_t gift_shard_memory_committed(const gift_shard_t *s)
{
    return s->declared ? s->mem : 0;
}

/* What the geometry owner of t allocates: the basis and its LAPACK
 * workspace (codec/geometry.c), the sketch sums, with ordered aggregation
 * every rank's sketch, and two published copies of U and lambda. */
static uint64_t geometry_need(const gift_shard_t *s, const tensor_t *t)
{
    uint64_t dks = mul_sat(t->cols, t->ks), kk = mul_sat(t->ks, t->ks), n;
    n = mul_sat(dks, 4 + 16 + 4 + 8);          /* U, Q and B (double), ysum, 2 geo_buf */
    n = add_sat(n, mul_sat(kk, 16 + 16));       /* M, R, the eigenproblem */
    n = add_sat(n, mul_sat(t->ks, 64));         /* lambda, d, tau, ... */
    n = add_sat(n, mul_sat(t->cols, 64 * 8));   /* QR workspace (din x block) */
    n = add_sat(n, mul_sat(s->words, 8));       /* sk_ranks */
    if (s->o.aggregate == GIFT_SHARD_ORDERED)
        n = add_sat(n, mul_sat(s->world, add_sat(mul_sat(dks, 4), 8))); /* yr, tr */
    return n;
}

/* The bytes store_build will allocate for the checked declaration d: per
 * chunk its two accumulators, rank bitmaps and reply buffers, the kept
 * pushes of ordered aggregation (world per step), the pull residual; per
 * owned tensor its geometry; the tables and the packed Declare. Computed
 * with saturating arithmetic before anything is allocated. */
static uint64_t store_need(const gift_shard_t *s, const Gift__Declare *d)
{
    int ordered = s->o.aggregate == GIFT_SHARD_ORDERED;
    uint64_t n = gift__declare__get_packed_size(d);
    n = add_sat(n, mul_sat(s->ntensors, sizeof(tensor_t)));
    n = add_sat(n, mul_sat(s->nchunks, sizeof(chunk_t) + 2 * sizeof(chunk_t *)));
    for (size_t i = 0; i < s->ntensors; i++) {
        const tensor_t *t = &s->tensors[i];
        n = add_sat(n, strlen(t->name) + 1);
        if (t->owner && t->geometry)
            n = add_sat(n, geometry_need(s, t));
    }
    for (size_t i = 0; i < s->nchunks; i++) {
        const chunk_t *ch = &s->chunks[i];
        uint64_t per_step = mul_sat(ch->n, sizeof(float));
        per_step = add_sat(per_step, mul_sat(s->words, 8));
        per_step = add_sat(per_step, add_sat(ch->pull_l.total, sizeof(gift_rbuf_t) + 64));
        if (ordered)
            per_step = add_sat(per_step, mul_sat((ch->push_l.total + 63) & ~(uint64_t)63, s->world));
        n = add_sat(n, mul_sat(per_step, 2));
        if (ch->t->pull_ef)
            n = add_sat(n, mul_sat(ch->n, sizeof(float)));
    }
    return n;
}

/* Fails with GIFT_ENOMEM and a sentence in why when need is above the
 * budget: the figure, the budget, and the option that raises it. */
static int budget_check(const gift_shard_t *s, uint64_t need, const char *what, char *why,
                        size_t whylen)
{
    if (need <= s->o.max_memory)
        return 0;
    if (need == UINT64_MAX)
        snprintf(why, whylen, "%s needs more than 2^64 bytes; max_memory is %" PRIu64
                 " bytes (%.1f MiB)", what, s->o.max_memory, (double)s->o.max_memory / 1048576.0);
    else
        snprintf(why, whylen, "%s needs %" PRIu64 " bytes (%.1f MiB) of tensor memory on this "
                 "shard; max_memory is %" PRIu64 " bytes (%.1f MiB): raise max_memory "
                 "(--max-memory, GIFTD_MAX_MEMORY) or place the tensors on more shards",
                 what, need, (double)need / 1048576.0, s->o.max_memory,
                 (double)s->o.max_memory / 1048576.0);
    return GIFT_ENOMEM;
}

/* Checks and fixes the transform shape of a geometry tensor: its rank k
 * and basis width ks (declared, or the default policy), each named in the
 * error when out of range; the geometry math takes them as int. */
static int geometry_shape(const gift_shard_t *s, tensor_t *t, const Gift__TensorDecl *td,
                          char *why, size_t whylen)
{
    int k, ks;
    if (t->cols < 2 || t->cols > INT32_MAX || t->rows > INT32_MAX) {
        snprintf(why, whylen, "tensor %u has shape %u x %u: geometry needs 2 to 2^31-1 columns "
                 "and at most 2^31-1 rows", t->key, t->rows, t->cols);
        return GIFT_ESHAPE;
    }
    k = td->rank ? (td->rank > t->cols ? -1 : (int)td->rank)
                 : gift_rank_default((int)t->rows, (int)t->cols);
    if (k < 1) {
        snprintf(why, whylen, "tensor %u: rank %u is outside 1..%u (its columns)", t->key,
                 td->rank, t->cols);
        return GIFT_ESHAPE;
    }
    ks = td->basis_cols ? (td->basis_cols > t->cols ? -1 : (int)td->basis_cols)
                        : gift_basis_cols((int)t->cols, k, GIFT_OVERSAMPLE_DEFAULT);
    if (ks < k) {
        snprintf(why, whylen, "tensor %u: a basis of %u columns is outside rank %d..%u columns",
                 t->key, td->basis_cols, k, t->cols);
        return GIFT_ESHAPE;
    }
    t->k = (uint32_t)k;
    t->ks = (uint32_t)ks;
    if ((uint64_t)t->cols * t->ks * 4 > s->o.max_frame_bytes) {
        snprintf(why, whylen, "tensor %u: its sketch (%u x %u floats) is above max_frame_bytes "
                 "(%" PRIu64 ")", t->key, t->cols, t->ks, s->o.max_frame_bytes);
        return GIFT_ESHAPE;
    }
    return 0;
}

/* qsort order of a tensor's chunk index: ascending chunk id. */
static int chunk_id_cmp(const void *a, const void *b)
{
    uint32_t x = (*(chunk_t *const *)a)->id, y = (*(chunk_t *const *)b)->id;
    return (x > y) - (x < y);
}

/* Validates a Declare and builds the store from it. On error nothing is kept
 * and *why says what was wrong. */
static int store_build(gift_shard_t *s, const Gift__Declare *d, char *why, size_t whylen)
{
    int rc = GIFT_ENOMEM;
    size_t nt = d->n_tensors, nc = d->n_chunks;
    int ordered = s->o.aggregate == GIFT_SHARD_ORDERED;

    why[0] = '\0';
    if (nt == 0) {
        snprintf(why, whylen, "the tensor list is empty");
        return GIFT_EINVAL;
    }
    /* The tables first (bounded by the message, but checked all the same),
     * the buffers once the declaration is known to be valid. */
    if ((rc = budget_check(s, add_sat(mul_sat(nt, sizeof(tensor_t)), mul_sat(nc, sizeof(chunk_t))),
                           "the declaration's tables", why, whylen)) < 0)
        return rc;
    rc = GIFT_ENOMEM;
    if ((s->tensors = calloc(nt, sizeof *s->tensors)) == NULL ||
        (nc && (s->chunks = calloc(nc, sizeof *s->chunks)) == NULL))
        goto fail;
    s->ntensors = nt;
    s->nchunks = nc;
    for (size_t i = 0; i < nt; i++) {
        const Gift__TensorDecl *td = d->tensors[i];
        tensor_t *t = &s->tensors[i];
        gift_layout_t l;
        if (td->key != i) {
            snprintf(why, whylen, "tensor %zu has key %u: keys must be 0..n-1 in order", i,
                     td->key);
            rc = GIFT_EINVAL;
            goto fail;
        }
        if (td->rows == 0 || td->cols == 0 || (uint64_t)td->rows * td->cols > (1ull << 40)) {
            snprintf(why, whylen, "tensor %u has shape %u x %u", td->key, td->rows, td->cols);
            rc = GIFT_ESHAPE;
            goto fail;
        }
        if (codec_from_wire(td->push_codec, &t->push) < 0 ||
            codec_from_wire(td->pull_codec, &t->pull) < 0 ||
            gift_layout(&t->push, 1, &l) < 0 || gift_layout(&t->pull, 1, &l) < 0) {
            snprintf(why, whylen, "tensor %u has an unknown codec or block size", td->key);
            rc = GIFT_ECODEC;
            goto fail;
        }
        t->key = td->key;
        if ((t->name = strdup(td->name ? td->name : "")) == NULL)
            goto fail;
        t->rows = td->rows;
        t->cols = td->cols;
        t->push_fmt = td->push_codec ? td->push_codec->format : GIFT__FORMAT__FORMAT_F32;
        t->pull_fmt = td->pull_codec ? td->pull_codec->format : GIFT__FORMAT__FORMAT_F32;
        t->push_block = td->push_codec ? td->push_codec->block : 0;
        t->pull_block = td->pull_codec ? td->pull_codec->block : 0;
        t->geometry = td->geometry;
        t->seed = td->seed;
        t->refresh = td->refresh ? td->refresh : REFRESH_DEFAULT;
        /* f32 pulls are exact: nothing to feed back. */
        t->pull_ef = td->pull_error_feedback && t->pull.fmt != GIFT_FMT_F32;
        if (t->geometry && (rc = geometry_shape(s, t, td, why, whylen)) < 0)
            goto fail;
        rc = GIFT_ENOMEM;
    }
    /* Count each tensor's chunks, so that its index is sized by what is
     * declared (bounded by the message) and never by a chunk id's value. */
    for (size_t i = 0; i < nc; i++) {
        const Gift__ChunkDecl *cd = d->chunks[i];
        if (cd->key >= nt) {
            snprintf(why, whylen, "chunk %u names tensor %u of %zu", cd->chunk, cd->key, nt);
            rc = GIFT_ENOKEY;
            goto fail;
        }
        s->tensors[cd->key].nchunks++;
    }
    for (size_t i = 0; i < nt; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->nchunks && (t->by_id = calloc(t->nchunks, sizeof *t->by_id)) == NULL)
            goto fail;
        t->nchunks = 0;
    }
    for (size_t i = 0; i < nc; i++) {
        const Gift__ChunkDecl *cd = d->chunks[i];
        chunk_t *ch = &s->chunks[i];
        tensor_t *t = &s->tensors[cd->key];
        /* A tensor has at most rows chunks, so a valid id is below rows. */
        if (cd->rows == 0 || (uint64_t)cd->row_begin + cd->rows > t->rows ||
            cd->chunk >= t->rows) {
            snprintf(why, whylen, "chunk %u of tensor %u: rows [%u, %" PRIu64 ") outside 0..%u",
                     cd->chunk, cd->key, cd->row_begin, (uint64_t)cd->row_begin + cd->rows,
                     t->rows);
            rc = GIFT_ESHAPE;
            goto fail;
        }
        t->by_id[t->nchunks++] = ch;
        ch->t = t;
        ch->id = cd->chunk;
        ch->row_begin = cd->row_begin;
        ch->rows = cd->rows;
        ch->n = (size_t)cd->rows * t->cols;
        if (gift_layout(&t->push, ch->n, &ch->push_l) < 0 ||
            gift_layout(&t->pull, ch->n, &ch->pull_l) < 0 ||
            ch->push_l.total > s->o.max_frame_bytes || ch->pull_l.total > s->o.max_frame_bytes) {
            snprintf(why, whylen,
                     "chunk %u of tensor %u: payload above max_frame_bytes (%" PRIu64 ")",
                     cd->chunk, cd->key, s->o.max_frame_bytes);
            rc = GIFT_ESHAPE;
            goto fail;
        }
        if (cd->chunk == 0)
            t->owner = 1;
    }
    for (size_t i = 0; i < nt; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->nchunks > 1)
            qsort(t->by_id, t->nchunks, sizeof *t->by_id, chunk_id_cmp);
        for (uint32_t j = 1; j < t->nchunks; j++)
            if (t->by_id[j]->id == t->by_id[j - 1]->id) {
                snprintf(why, whylen, "chunk %u of tensor %u declared twice", t->by_id[j]->id,
                         t->key);
                rc = GIFT_EINVAL;
                goto fail;
            }
    }
    /* Within max_memory before the first buffer is allocated. */
    s->mem = store_need(s, d);
    if ((rc = budget_check(s, s->mem, "the declaration", why, whylen)) < 0)
        goto fail;
    rc = GIFT_ENOMEM;
    /* Allocate every buffer now, once: nothing per message afterwards. */
    for (size_t i = 0; i < nc; i++) {
        chunk_t *ch = &s->chunks[i];
        ch->pay_stride = (ch->push_l.total + 63) & ~(size_t)63;
        for (int j = 0; j < 2; j++) {
            if ((ch->slot[j].acc = calloc(ch->n, sizeof(float))) == NULL ||
                (ch->slot[j].ranks = calloc(s->words, sizeof(uint64_t))) == NULL ||
                (ch->reply[j].buf = gift_rbuf_new(ch->pull_l.total)) == NULL)
                goto fail;
            if (ordered && posix_memalign((void **)&ch->slot[j].pay, 64,
                                          ch->pay_stride * s->world) != 0) {
                ch->slot[j].pay = NULL;
                goto fail;
            }
            ch->slot[j].epoch = -1;
        }
        if (ch->t->pull_ef && (ch->pres = calloc(ch->n, sizeof(float))) == NULL)
            goto fail;
    }
    if (nc > 0 && (s->pending = calloc(nc, sizeof *s->pending)) == NULL)
        goto fail;
    s->npending = 0;
    for (size_t i = 0; i < nt; i++) {
        tensor_t *t = &s->tensors[i];
        if (!t->owner || !t->geometry)
            continue;
        if ((rc = gift_geometry_init(&t->geo, (int)t->cols, (int)t->k, (int)t->ks, t->seed)) < 0) {
            snprintf(why, whylen, "tensor %u: geometry init failed (%s)", t->key,
                     gift_strerror(rc));
            goto fail;
        }
        t->geo_ok = 1;
        rc = GIFT_ENOMEM;
        if ((t->ysum = calloc((size_t)t->cols * t->ks, sizeof(float))) == NULL ||
            (t->sk_ranks = calloc(s->words, sizeof(uint64_t))) == NULL ||
            (ordered && ((t->yr = calloc((size_t)t->cols * t->ks * s->world, sizeof(float))) ==
                             NULL ||
                         (t->tr = calloc(s->world, sizeof(double))) == NULL)) ||
            publish_geometry(s, t, 0) < 0)
            goto fail;
    }
    s->declared = 1;
    return 0;
fail:
    if (rc == GIFT_ENOMEM && why[0] == '\0')
        snprintf(why, whylen, "out of memory while allocating the declared buffers");
    /* Owner flags are set before geometry init; free only what was made. */
    for (size_t i = 0; i < s->ntensors; i++)
        if (!s->tensors[i].geo_ok)
            s->tensors[i].geometry = s->tensors[i].owner ? 0 : s->tensors[i].geometry;
    store_free(s);
    return rc;
}

/* Builds the store from d (already checked against its digest) and keeps
 * its packed form for checkpoints. On error nothing is kept. */
static int declare_apply(gift_shard_t *s, const Gift__Declare *d, char *why, size_t whylen)
{
    size_t len = gift__declare__get_packed_size(d);
    uint8_t *buf = malloc(len ? len : 1);
    int rc;
    if (buf == NULL) {
        snprintf(why, whylen, "out of memory");
        return GIFT_ENOMEM;
    }
    gift__declare__pack(d, buf);
    if ((rc = store_build(s, d, why, whylen)) < 0) {
        free(buf);
        return rc;
    }
    s->digest = gift_digest_tensors(d->tensors, d->n_tensors);
    s->placement = placement_sig(d->chunks, d->n_chunks);
    s->decl = buf;
    s->decl_len = len;
    return 0;
}

static int log_append(gift_shard_t *s, uint32_t type, const void *const *parts,
                      const size_t *lens, int n, int sync);
static void ckpt_schedule(gift_shard_t *s);

static int handle_declare(gift_shard_t *s, gift_peer_t *p, const Gift__Declare *d)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__DeclareAck ack = GIFT__DECLARE_ACK__INIT;
    char why[400] = "";
    uint64_t digest = gift_digest_tensors(d->tensors, d->n_tensors);
    uint64_t sig = placement_sig(d->chunks, d->n_chunks);
    uint8_t want[8];
    int rc;

    gift_digest_bytes(digest, want);
    if (d->digest.len != 8 || memcmp(d->digest.data, want, 8) != 0) {
        send_error(s, p, GIFT_EDIGEST, 0, 0, 0, 0, 0,
                   "declare digest does not match its tensor list (%zu tensors)", d->n_tensors);
        return 0;
    }
    if (s->declared) {
        if (digest != s->digest) {
            send_error(s, p, GIFT_EDIGEST, 0, 0, 0, 0, 0,
                       "tensor list differs from the one already declared on this shard");
            return 0;
        }
        if (sig != s->placement) {
            send_error(s, p, GIFT_EDIGEST, 0, 0, 0, 0, 0,
                       "chunk placement differs from the one already declared on this shard");
            return 0;
        }
    } else {
        int adopt = s->world == 0;
        if (adopt) {
            /* The world size of the first Declare's sender (claim_rank
             * refuses peers of another from here on). */
            s->world = p->world;
            s->words = (s->world + 63) / 64;
        }
        if ((rc = declare_apply(s, d, why, sizeof why)) < 0) {
            if (adopt)
                s->world = 0, s->words = 0;
            send_error(s, p, rc, 0, 0, 0, 0, 0, "declare refused: %s", why);
            return 0;
        }
        if (s->persist) {
            /* The world size, then the Declare. */
            uint8_t wb[4] = {(uint8_t)s->world, (uint8_t)(s->world >> 8),
                             (uint8_t)(s->world >> 16), (uint8_t)(s->world >> 24)};
            const void *parts[2] = {wb, s->decl};
            size_t lens[2] = {4, s->decl_len};
            if ((rc = log_append(s, GIFT_LOG_DECLARE, parts, lens, 2, 1)) < 0) {
                /* Not durable: forget it, so that nothing is built on it. */
                store_free(s);
                if (adopt)
                    s->world = 0, s->words = 0;
                send_error(s, p, rc, 0, 0, 0, 0, 0,
                           "declare refused: cannot write it to the step log in %s", s->dir);
                return 0;
            }
        }
        ckpt_schedule(s);
        if (adopt)
            GIFT_LOG_INFO(p->id, "world size %u (from the first Declare, rank %u's Hello)",
                          s->world, p->rank);
        GIFT_LOG_INFO(p->id, "declared %zu tensors, %zu chunks on this shard (%.1f MiB of "
                      "max_memory %.1f MiB)", s->ntensors, s->nchunks,
                      (double)s->mem / 1048576.0, (double)s->o.max_memory / 1048576.0);
    }
    ack.tensors = (uint32_t)s->ntensors;
    ack.chunks = (uint32_t)s->nchunks;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE_ACK;
    env.declare_ack = &ack;
    return send_frame(s, p, &env, NULL, 0, 0) < 0 ? 0 : 0;
}

/* ------------------------------------------------------------------ */
/* Hello                                                                 */
/* ------------------------------------------------------------------ */

static int handle_hello(gift_shard_t *s, gift_peer_t *p, const Gift__Hello *h)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__HelloAck ack = GIFT__HELLO_ACK__INIT;
    uint8_t dg[8], mac[GIFT_AUTH_MAC_BYTES];

    if (p->hello) {
        send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0, "second Hello on one connection");
        return GIFT_EPROTO;
    }
    if (h->protocol_version != GIFT_PROTOCOL_VERSION) {
        send_error(s, p, GIFT_EVERSION, 1, 0, 0, 0, 0,
                   "protocol version %u, this shard speaks %d", h->protocol_version,
                   GIFT_PROTOCOL_VERSION);
        return GIFT_EVERSION;
    }
    if (s->o.auth != NULL) {
        /* Authentication (gift.proto): challenge the first Hello, verify the
         * second before looking at anything it says. */
        if (!p->challenged) {
            Gift__AuthChallenge ch = GIFT__AUTH_CHALLENGE__INIT;
            if (gift_auth_nonce(p->nonce) < 0) {
                send_error(s, p, GIFT_EIO, 1, 0, 0, 0, 0, "no random nonce (libsodium)");
                return GIFT_EIO;
            }
            p->challenged = 1;
            ch.server_nonce.data = p->nonce;
            ch.server_nonce.len = sizeof p->nonce;
            ch.version = GIFT_AUTH_VERSION;
            env.msg_case = GIFT__ENVELOPE__MSG_AUTH_CHALLENGE;
            env.auth_challenge = &ch;
            (void)send_frame(s, p, &env, NULL, 0, 0);
            return 0;
        }
        if (h->auth_mac.len == 0) {
            send_error(s, p, GIFT_EAUTH, 1, 0, 0, 0, 0,
                       "this shard requires authentication and the Hello carries no MAC "
                       "(is the client's auth key file, GIFT_AUTH_KEY_FILE, set?)");
            return GIFT_EAUTH;
        }
        if (h->client_nonce.len != GIFT_AUTH_NONCE_BYTES) {
            send_error(s, p, GIFT_EAUTH, 1, 0, 0, 0, 0, "Hello carries a client nonce of %zu "
                       "bytes; %d needed", h->client_nonce.len, GIFT_AUTH_NONCE_BYTES);
            return GIFT_EAUTH;
        }
        gift_auth_hello_mac(s->o.auth, p->nonce, h, mac);
        if (gift_auth_verify(h->auth_mac.data, h->auth_mac.len, mac) < 0) {
            send_error(s, p, GIFT_EAUTH, 1, 0, 0, 0, 0,
                       "authentication failed: the Hello's MAC does not match this shard's key");
            return GIFT_EAUTH;
        }
        gift_auth_ack_mac(s->o.auth, h->rank, p->nonce, h->client_nonce.data, h->auth_mac.data, mac);
        ack.auth_mac.data = mac;
        ack.auth_mac.len = sizeof mac;
    }
    if (h->world_size == 0 || h->world_size > 65536) {
        send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0, "world size %u out of range 1..65536",
                   h->world_size);
        return GIFT_EWORLD;
    }
    if (s->world != 0 && h->world_size != s->world) {
        send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0, "world size %u, the cluster has %u",
                   h->world_size, s->world);
        return GIFT_EWORLD;
    }
    if (h->rank >= h->world_size) {
        send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0, "rank %u outside 0..%u", h->rank,
                   h->world_size - 1);
        return GIFT_EWORLD;
    }
    if (s->declared && h->cluster_digest.len > 0) {
        gift_digest_bytes(s->digest, dg);
        if (h->cluster_digest.len != 8 || memcmp(h->cluster_digest.data, dg, 8) != 0) {
            send_error(s, p, GIFT_EDIGEST, 1, 0, 0, 0, 0,
                       "cluster digest differs from the tensor list declared on this shard");
            return GIFT_EDIGEST;
        }
    }
    /* A Hello never fixes the world size (a stray or hostile one would lock
     * every worker out): it is configured, or adopted from the sender of
     * the first Declare (handle_declare); until then any is accepted, and
     * checked when the peer acts as its rank (claim_rank). */
    p->hello = 1;
    p->rank = h->rank;
    p->world = h->world_size;
    GIFT_LOG_INFO(p->id, "hello from rank %u of %u (%s)%s", h->rank, h->world_size,
             h->client_name && *h->client_name ? h->client_name : "unnamed",
             s->o.auth ? ", authenticated" : "");
    ack.protocol_version = GIFT_PROTOCOL_VERSION;
    ack.shard_id = s->o.shard_id;
    ack.num_shards = s->o.num_shards;
    ack.max_frame_bytes = s->o.max_frame_bytes;
    ack.server_version = (char *)GIFT_CODEC_VERSION;
    ack.world_size = s->world ? s->world : h->world_size;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO_ACK;
    env.hello_ack = &ack;
    (void)send_frame(s, p, &env, NULL, 0, 0);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Push, finish, pull                                                    */
/* ------------------------------------------------------------------ */

static chunk_t *find_chunk(gift_shard_t *s, uint32_t key, uint32_t id)
{
    if (!s->declared || key >= s->ntensors)
        return NULL;
    {
        const tensor_t *t = &s->tensors[key];
        uint32_t lo = 0, hi = t->nchunks;
        /* Binary search of the sorted sparse index. */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (t->by_id[mid]->id < id)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < t->nchunks && t->by_id[lo]->id == id ? t->by_id[lo] : NULL;
    }
}

/* The epoch the owner expects for pushes of step. */
static uint32_t epoch_for_step(const tensor_t *t, uint64_t step)
{
    uint32_t e = t->nepochs ? t->epochs[0].epoch : 0;
    for (uint32_t i = 0; i < t->nepochs; i++)
        if (t->epochs[i].valid_from <= step)
            e = t->epochs[i].epoch;
    return e;
}

static uint32_t latest_epoch(const tensor_t *t)
{
    return t->nepochs ? t->epochs[t->nepochs - 1].epoch : 0;
}

static void send_reply(gift_shard_t *s, gift_peer_t *p, chunk_t *ch, const reply_t *r,
                       uint64_t seq)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__PullReply pr = GIFT__PULL_REPLY__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    tensor_t *t = ch->t;

    if (r->err) {
        send_error(s, p, r->err, 0, t->key, ch->id, r->step, seq,
                   "step %" PRIu64 " of tensor %u chunk %u could not be encoded: %s", r->step,
                   t->key, ch->id, gift_strerror(r->err));
        return;
    }
    codec.format = t->pull_fmt;
    codec.block = t->pull_block;
    pr.key = t->key;
    pr.chunk = ch->id;
    pr.step = r->step;
    pr.epoch = r->epoch;
    pr.codec = &codec;
    pr.contributors = s->world;
    pr.seq = seq;
    pr.latest_epoch = (t->owner && t->geometry && ch->id == 0) ? latest_epoch(t) : 0;
    env.msg_case = GIFT__ENVELOPE__MSG_PULL_REPLY;
    env.pull_reply = &pr;
    if (send_frame(s, p, &env, r->buf, 0, ch->pull_l.total) == 0) {
        s->c.pull_bytes_out[t->pull.fmt] += ch->pull_l.total;
        s->c.pull_frames_out[t->pull.fmt]++;
        t->bytes_out += ch->pull_l.total;
    }
}

/* Appends a finished chunk step to the step log (a no-op while replaying). */
static int log_step(gift_shard_t *s, chunk_t *ch, const reply_t *r)
{
    uint8_t h[28], pe[4];
    const void *parts[4];
    size_t lens[4];
    int nparts = 2;
    gift_ckpt_buf_t b = {0};
    int rc;
    if (s->replaying)
        return 0;
    /* key, chunk, step, epoch, err, reply length, the reply bytes; with pull
     * error feedback then the residual's epoch and the residual. */
    b.p = h;
    b.cap = sizeof h;
    gift_ckpt_put_u32(&b, ch->t->key);
    gift_ckpt_put_u32(&b, ch->id);
    gift_ckpt_put_u64(&b, r->step);
    gift_ckpt_put_u32(&b, r->epoch);
    gift_ckpt_put_u32(&b, (uint32_t)r->err);
    gift_ckpt_put_u32(&b, r->err ? 0u : (uint32_t)ch->pull_l.total);
    parts[0] = h;
    lens[0] = b.len;
    parts[1] = r->buf->data;
    lens[1] = r->err ? 0 : ch->pull_l.total;
    if (ch->pres != NULL) {
        /* Pull error feedback: the residual after this step, so a replay
         * of the log resumes it (its epoch, then n floats). */
        gift_ckpt_buf_t eb = {.p = pe, .cap = sizeof pe};
        gift_ckpt_put_u32(&eb, ch->pres_epoch);
        parts[2] = pe;
        lens[2] = sizeof pe;
        parts[3] = ch->pres;
        lens[3] = ch->n * sizeof(float);
        nparts = 4;
    }
    if ((rc = log_append(s, GIFT_LOG_STEP, parts, lens, nparts, !s->o.group_commit)) < 0)
        GIFT_LOG_ERROR(0, "tensor %u chunk %u step %" PRIu64 " is not durable: its pulls fail "
                       "with %s", ch->t->key, ch->id, r->step, gift_strerror(GIFT_EIO));
    return rc;
}

static void maybe_checkpoint(gift_shard_t *s);

/* The pull residual for a step of epoch: zeroed when it belongs to another. */
static void pres_for_epoch(chunk_t *ch, uint32_t epoch)
{
    if (ch->pres_epoch != epoch) {
        memset(ch->pres, 0, ch->n * sizeof *ch->pres);
        ch->pres_epoch = epoch;
    }
}

/* Pull error feedback: encodes v = mean + residual into the reply and keeps
 * v - decode(encode(v)) as the next step's residual (gift_encode_mean_ef,
 * slice by slice in cache). The residual belongs to the coordinates of one
 * geometry epoch; a step of another epoch starts from zero (non-owner shards
 * hold no geometry to rebase it with). On the steps that sample boundary
 * hits (hits: they read v from acc), or for an fp8 block the slices cannot
 * walk, the same arithmetic in passes over acc, which ends holding v. On an
 * encode error (an overflowed mean) the residual is dropped (zeroed). */
static int encode_mean_ef(chunk_t *ch, slot_t *sl, reply_t *r, float inv, int hits)
{
    const tensor_t *t = ch->t;
    float *acc = sl->acc, *e = ch->pres;
    int rc;
    pres_for_epoch(ch, sl->epoch < 0 ? 0 : (uint32_t)sl->epoch);
    if (!hits && (rc = gift_encode_mean_ef(&t->pull, acc, ch->n, inv, e, r->buf->data,
                                           r->buf->cap)) != GIFT_EFORMAT)
        return rc;
    for (size_t i = 0; i < ch->n; i++)
        acc[i] = (acc[i] * inv + 0.0f) + e[i];
    if ((rc = gift_encode(&t->pull, acc, ch->n, r->buf->data, r->buf->cap)) < 0 ||
        (rc = gift_decode(&t->pull, r->buf->data, ch->pull_l.total, ch->n, e)) < 0) {
        memset(e, 0, ch->n * sizeof *e);
        return rc;
    }
    gift_vec_sub(acc, e, ch->n, e);
    return 0;
}

/* A step's reply buffer, free of writes still sending an older step from
 * it (those keep the old buffer). 0, or GIFT_ENOMEM with refs still > 1. */
static int reply_writable(chunk_t *ch, reply_t *r)
{
    if (r->buf->refs > 1) {
        gift_rbuf_t *nb = gift_rbuf_new(ch->pull_l.total);
        if (nb == NULL)
            return GIFT_ENOMEM;
        gift_rbuf_unref(r->buf);
        r->buf = nb;
    }
    return 0;
}

/* Finishes step ch->base (all world pushes summed): mean, encode into the
 * step's reply buffer, wake parked pulls, advance; repeats while the next
 * step is complete too. */
static void finish_steps(gift_shard_t *s, chunk_t *ch)
{
    tensor_t *t = ch->t;
    while (ch->slot[ch->base & 1].count == s->world) {
        slot_t *sl = &ch->slot[ch->base & 1];
        reply_t *r = &ch->reply[ch->base & 1];
        const float inv = 1.0f / (float)s->world;
        uint64_t step = ch->base;
        int rc;

        /* Writes of step - 2 still hold the buffer: leave it to them. */
        (void)reply_writable(ch, r);
        /* The mean is acc * (1/N) + 0 (the +0 makes it the sum a zeroed
         * accumulator would give, see handle_push). Encoded already when the
         * last push was fused with it (add_in_order). On the steps that
         * measure boundary hits the mean is materialised in place; otherwise
         * scaling and encoding are one cache-resident pass (the same bytes). */
        if (sl->fused) {
            rc = sl->fused_rc;
        } else if (r->buf->refs > 1) {
            rc = GIFT_ENOMEM;
        } else if (ch->pres != NULL) {
            rc = encode_mean_ef(ch, sl, r, inv, s->o.hits_every && step % s->o.hits_every == 0);
        } else if (s->o.hits_every && step % s->o.hits_every == 0) {
            for (size_t i = 0; i < ch->n; i++)
                sl->acc[i] = sl->acc[i] * inv + 0.0f;
            rc = gift_encode(&t->pull, sl->acc, ch->n, r->buf->data, r->buf->cap);
        } else {
            rc = gift_encode_mean(&t->pull, sl->acc, ch->n, inv, r->buf->data, r->buf->cap);
        }
        r->buf->len = ch->pull_l.total;
        r->err = rc < 0 ? rc : 0;
        r->step = step;
        r->epoch = sl->epoch < 0 ? 0 : (uint32_t)sl->epoch;
        r->valid = 1;
        if (rc < 0)
            GIFT_LOG_ERROR(0, "tensor %u chunk %u step %" PRIu64 ": encode failed: %s",
                     t->key, ch->id, step, gift_strerror(rc));
        /* Durable before any pull of it is answered: synced now, or with
         * group commit at the next gift_shard_flush (its pulls wait). */
        r->durable = 1;
        if (s->persist && log_step(s, ch, r) < 0) {
            r->err = GIFT_EIO;
        } else if (s->persist && s->o.group_commit && !s->replaying) {
            r->durable = 0;
            if (!ch->pending) {
                ch->pending = 1;
                s->pending[s->npending++] = ch;
            }
        }
        if (rc == 0 && s->o.hits_every && step % s->o.hits_every == 0) {
            gift_hits_t h;
            if (gift_boundary_hits(&t->pull, sl->acc, r->buf->data, r->buf->cap, ch->n, &h) == 0 &&
                h.n > 0)
                t->hit_rate = (double)(h.saturated + h.flushed) / (double)h.n;
        }
        if (sl->t_first) {
            double lat = (double)(now_ns(s) - sl->t_first) * 1e-9;
            int b = 0;
            while (b < GIFT_LAT_BUCKETS - 1 && lat > gift_lat_bounds[b])
                b++;
            s->c.lat_bucket[b]++;
            s->c.lat_sum += lat;
        }
        /* The accumulator is not cleared: the step's first push overwrites it. */
        memset(sl->ranks, 0, s->words * sizeof(uint64_t));
        sl->count = 0;
        sl->next = 0;
        sl->fused = 0;
        sl->epoch = -1;
        sl->t_first = 0;
        sl->warned = 0;
        ch->base++;
        s->c.steps_finished++;
        /* Wake the pulls that waited for this step. */
        for (parked_t *q = r->durable ? ch->parked : NULL, *next; q != NULL; q = next) {
            next = q->cnext;
            if (q->step == step) {
                gift_peer_t *p = q->peer;
                uint64_t seq = q->seq;
                parked_unlink(s, q);
                send_reply(s, p, ch, r, seq);
            }
        }
    }
    maybe_checkpoint(s);
}

/* Sums the push of rank sl->next (in rank order) into sl. The last one of a
 * step that finish_steps finishes right after (now: it is ch->base) is
 * fused with the mean's encoding (gift_decode_encode_mean, or with pull
 * error feedback gift_decode_encode_mean_ef on the residual of the step's
 * epoch, straight into the step's reply buffer, acc not written): the same
 * bytes and residual, one pass over the sum less and no write of it. Not on
 * the steps that sample boundary hits (they read the mean from acc), nor for
 * layouts it cannot walk (GIFT_EFORMAT: the two-step path). Returns 0 or the
 * payload's error. */
static int add_in_order(gift_shard_t *s, chunk_t *ch, slot_t *sl, uint64_t step, uint32_t epoch,
                        int now, const uint8_t *payload, size_t len)
{
    const gift_codec_params_t *cp = &ch->t->push;
    if (now && sl->next + 1 == s->world && !(s->o.hits_every && step % s->o.hits_every == 0)) {
        reply_t *r = &ch->reply[step & 1];
        if (reply_writable(ch, r) == 0) {
            const float *acc = sl->next == 0 ? NULL : sl->acc;
            const float inv = 1.0f / (float)s->world;
            int rc;
            if (ch->pres != NULL) {
                /* A refused payload must not cost the residual: checked
                 * before a new epoch's reset (the call checks it too). */
                if (ch->pres_epoch != epoch &&
                    (rc = gift_payload_check(cp, payload, len, ch->n)) < 0)
                    return rc;
                pres_for_epoch(ch, epoch);
                rc = gift_decode_encode_mean_ef(cp, payload, len, acc, ch->n, inv, &ch->t->pull,
                                                ch->pres, r->buf->data, r->buf->cap);
            } else {
                rc = gift_decode_encode_mean(cp, payload, len, acc, ch->n, inv, &ch->t->pull,
                                             r->buf->data, r->buf->cap);
            }
            if (rc == GIFT_EBADCODE)
                return rc; /* the payload: refused, as a decode would */
            if (rc != GIFT_EFORMAT) {
                sl->fused = 1;
                sl->fused_rc = rc; /* 0, or the encode's (an overflowed mean) */
                return 0;
            }
        }
    }
    if (sl->next == 0)
        return gift_decode(cp, payload, len, ch->n, sl->acc);
    return gift_decode_acc(cp, payload, len, ch->n, sl->acc);
}

/* Ordered aggregation of rank's push into sl (its bit is not set yet): in
 * rank order it is summed at once, followed by every kept push that now
 * follows without a gap; out of order it is validated (gift_payload_check:
 * the checks of a decode, without decoding) and kept. now: step is the one
 * finish_steps finishes next; epoch: the step's (every push of a step has
 * it). Returns 0, or the decode error (nothing kept). */
static int ordered_add(gift_shard_t *s, chunk_t *ch, slot_t *sl, uint64_t step, uint32_t epoch,
                       int now, uint32_t rank, const uint8_t *payload, size_t len)
{
    const gift_codec_params_t *cp = &ch->t->push;
    int rc;
    if (rank != sl->next) {
        if ((rc = gift_payload_check(cp, payload, len, ch->n)) < 0)
            return rc;
        memcpy(sl->pay + (size_t)rank * ch->pay_stride, payload, len);
        return 0;
    }
    if ((rc = add_in_order(s, ch, sl, step, epoch, now, payload, len)) < 0)
        return rc;
    sl->next++;
    while (sl->next < s->world && bit_get(sl->ranks, sl->next)) {
        /* Validated when it arrived. */
        rc = add_in_order(s, ch, sl, step, epoch, now,
                          sl->pay + (size_t)sl->next * ch->pay_stride, ch->push_l.total);
        if (rc < 0)
            return rc;
        sl->next++;
    }
    return 0;
}

/* The newest base step over the shard's started chunks (0 when none). */
static uint64_t newest_base(const gift_shard_t *s)
{
    uint64_t b = 0;
    for (size_t i = 0; i < s->nchunks; i++)
        if (s->chunks[i].started && s->chunks[i].base > b)
            b = s->chunks[i].base;
    return b;
}

/* The first push of a chunk fixes its window, so it may be at most
 * max_step_ahead past the newest base step of the shard. Returns 0, or
 * GIFT_ESTEP after answering it. */
static int first_step_check(gift_shard_t *s, gift_peer_t *p, const chunk_t *ch, const Gift__Push *m)
{
    uint64_t newest = newest_base(s);
    if (m->step <= newest || m->step - newest <= s->o.max_step_ahead)
        return 0;
    send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
               "push for step %" PRIu64 " is the first of tensor %u chunk %u and more than "
               "max_step_ahead (%" PRIu64 ") past this shard's newest step %" PRIu64
               "; raise max_step_ahead (--max-step-ahead) if the run really starts there",
               m->step, ch->t->key, ch->id, s->o.max_step_ahead, newest);
    return GIFT_ESTEP;
}

/* A shard that does not own a tensor's geometry cannot check a push's
 * epoch against the owner's, but epochs only grow, at most one per sketch
 * round (one round per step): the epoch of step is at most step + 1, at
 * least that of the chunk's last finished step, and at most one more per
 * step since. epoch_bound is the largest such epoch. */
static uint64_t epoch_bound_u64(const chunk_t *ch, uint64_t step)
{
    const reply_t *r = ch->started && ch->base > 0 ? &ch->reply[(ch->base - 1) & 1] : NULL;
    if (r != NULL && r->valid && r->step == ch->base - 1 && step > r->step)
        return add_sat(r->epoch, step - r->step);
    return add_sat(step, 1);
}

static uint32_t epoch_bound(const chunk_t *ch, uint64_t step)
{
    uint64_t b = epoch_bound_u64(ch, step);
    return b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
}

static int epoch_plausible(const chunk_t *ch, uint64_t step, uint32_t epoch)
{
    const reply_t *r = ch->started && ch->base > 0 ? &ch->reply[(ch->base - 1) & 1] : NULL;
    if (r != NULL && r->valid && r->step == ch->base - 1 && epoch < r->epoch)
        return 0;
    return epoch <= epoch_bound_u64(ch, step);
}

static int handle_push(gift_shard_t *s, gift_peer_t *p, const Gift__Push *m, const gift_frame_t *f)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__PushAck ack = GIFT__PUSH_ACK__INIT;
    chunk_t *ch = find_chunk(s, m->key, m->chunk);
    tensor_t *t;
    slot_t *sl;
    uint64_t base;
    int rc, dup = 0;

    if (ch == NULL) {
        send_error(s, p, GIFT_ENOKEY, 0, m->key, m->chunk, m->step, m->seq,
                   "push for tensor %u chunk %u, which this shard does not hold", m->key,
                   m->chunk);
        return 0;
    }
    t = ch->t;
    if (!codec_equal(m->codec, t->push_fmt, t->push_block)) {
        send_error(s, p, GIFT_ECODEC, 0, m->key, m->chunk, m->step, m->seq,
                   "push codec differs from tensor %u's declared push codec %s", m->key,
                   gift_format_name(t->push.fmt));
        return 0;
    }
    if (f->payload_len != ch->push_l.total) {
        send_error(s, p, GIFT_ESHAPE, 0, m->key, m->chunk, m->step, m->seq,
                   "push payload is %" PRIu64 " bytes; chunk %u of tensor %u needs %zu",
                   f->payload_len, m->chunk, m->key, ch->push_l.total);
        return 0;
    }
    /* A chunk's first accepted push fixes its base step; a refused one must
     * not, nor may one far past the shard's other chunks (a push for step
     * 10^12 would make every real push a duplicate). */
    if (!ch->started && (rc = first_step_check(s, p, ch, m)) < 0)
        return 0;
    base = ch->started ? ch->base : m->step;
    if (m->step < base) {
        dup = 1;
    } else if (m->step - base > 1) {
        send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                   "push for step %" PRIu64 " while step %" PRIu64
                   " is unfinished (window is %" PRIu64 "..%" PRIu64 ")",
                   m->step, base, base, base + 1);
        return 0;
    } else {
        sl = &ch->slot[m->step & 1];
        if (bit_get(sl->ranks, p->rank)) {
            dup = 1;
        } else {
            uint32_t want;
            /* One step never mixes epochs: the first accepted push fixes it;
             * the owner also knows which epoch the step must use. */
            if (!t->geometry)
                want = 0;
            else if (sl->epoch >= 0)
                want = (uint32_t)sl->epoch;
            else if (t->owner)
                want = epoch_for_step(t, m->step);
            else if (epoch_plausible(ch, m->step, m->epoch))
                want = m->epoch;
            else {
                send_error(s, p, GIFT_EEPOCH, 0, m->key, m->chunk, m->step, m->seq,
                           "push encoded under epoch %u, which step %" PRIu64 " of tensor %u "
                           "cannot use: epochs grow by at most one per step (at most %u here)",
                           m->epoch, m->step, m->key, epoch_bound(ch, m->step));
                return 0;
            }
            if (m->epoch != want) {
                send_error(s, p, GIFT_EEPOCH, 0, m->key, m->chunk, m->step, m->seq,
                           "push encoded under epoch %u; step %" PRIu64 " of tensor %u uses "
                           "epoch %u",
                           m->epoch, m->step, m->key, want);
                return 0;
            }
            if (s->o.aggregate == GIFT_SHARD_ORDERED)
                rc = ordered_add(s, ch, sl, m->step, m->epoch, m->step == base, p->rank,
                                 f->payload, f->payload_len);
            /* The first push of a step overwrites the accumulator instead of
             * adding to a cleared one: v and 0 + v differ only for v = -0,
             * and the +0 of the mean's scaling makes the bytes the same. */
            else if (sl->count == 0)
                rc = gift_decode(&t->push, f->payload, f->payload_len, ch->n, sl->acc);
            else
                rc = gift_decode_acc(&t->push, f->payload, f->payload_len, ch->n, sl->acc);
            if (rc < 0) {
                send_error(s, p, rc, 0, m->key, m->chunk, m->step, m->seq,
                           "push payload rejected: %s", gift_strerror(rc));
                return 0;
            }
            if (!ch->started) {
                ch->started = 1;
                ch->base = base;
            }
            bit_set(sl->ranks, p->rank);
            if (sl->count++ == 0)
                sl->t_first = now_ns(s);
            sl->epoch = m->epoch;
            s->c.pushes++;
            s->c.push_bytes_in[t->push.fmt] += f->payload_len;
            s->c.push_frames_in[t->push.fmt]++;
            t->bytes_in += f->payload_len;
        }
    }
    if (dup)
        s->c.duplicates++;
    ack.key = m->key;
    ack.chunk = m->chunk;
    ack.step = m->step;
    ack.duplicate = dup;
    ack.seq = m->seq;
    env.msg_case = GIFT__ENVELOPE__MSG_PUSH_ACK;
    env.push_ack = &ack;
    (void)send_frame(s, p, &env, NULL, 0, 0);
    if (!dup)
        finish_steps(s, ch);
    return 0;
}

static int handle_pull(gift_shard_t *s, gift_peer_t *p, const Gift__Pull *m)
{
    chunk_t *ch = find_chunk(s, m->key, m->chunk);
    int rc;

    if (ch == NULL) {
        send_error(s, p, GIFT_ENOKEY, 0, m->key, m->chunk, m->step, m->seq,
                   "pull for tensor %u chunk %u, which this shard does not hold", m->key,
                   m->chunk);
        return 0;
    }
    s->c.pulls++;
    if (!ch->started) {
        send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                   "pull for step %" PRIu64 " of tensor %u chunk %u before any push", m->step,
                   m->key, m->chunk);
        return 0;
    }
    if (m->step < ch->base) {
        const reply_t *r = &ch->reply[m->step & 1];
        if (r->valid && r->step == m->step && !r->durable) {
            /* Finished, not yet synced: answered by gift_shard_flush. */
            if ((rc = park(s, p, ch, m->step, m->seq, m->have_epoch)) < 0)
                park_refused(s, p, m);
            return 0;
        }
        if (r->valid && r->step == m->step) {
            send_reply(s, p, ch, r, m->seq);
            return 0;
        }
        send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                   "pull for step %" PRIu64 ": only steps %" PRIu64 "..%" PRIu64 " are kept",
                   m->step, ch->base >= 2 ? ch->base - 2 : 0, ch->base + 1);
        return 0;
    }
    if (m->step - ch->base > 1) {
        send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                   "pull for step %" PRIu64 " while step %" PRIu64 " is unfinished", m->step,
                   ch->base);
        return 0;
    }
    if ((rc = park(s, p, ch, m->step, m->seq, m->have_epoch)) < 0)
        park_refused(s, p, m);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Geometry owner                                                        */
/* ------------------------------------------------------------------ */

static tensor_t *find_owned(gift_shard_t *s, gift_peer_t *p, uint32_t key, uint64_t step,
                            uint64_t seq)
{
    tensor_t *t;
    if (!s->declared || key >= s->ntensors) {
        send_error(s, p, GIFT_ENOKEY, 0, key, 0, step, seq, "unknown tensor %u", key);
        return NULL;
    }
    t = &s->tensors[key];
    if (!t->geometry || !t->owner) {
        send_error(s, p, GIFT_ENOKEY, 0, key, 0, step, seq,
                   "tensor %u: %s", key,
                   t->geometry ? "this shard is not its geometry owner (chunk 0 lives elsewhere)"
                               : "geometry is off for this tensor");
        return NULL;
    }
    return t;
}

/* The first step >= from that no chunk of t on this shard has accepted a
 * push for: a new epoch must not start inside a step that already holds
 * pushes encoded under the old one (a worker may push ahead, pipelined). */
static uint64_t first_clean_step(const tensor_t *t, uint64_t from)
{
    uint64_t v = from;
    for (uint32_t i = 0; i < t->nchunks; i++) {
        const chunk_t *ch = t->by_id[i];
        uint64_t s;
        if (ch == NULL || !ch->started)
            continue;
        s = from > ch->base ? from : ch->base;
        while (s <= ch->base + 1 && ch->slot[s & 1].count > 0)
            s++;
        if (s > v)
            v = s;
    }
    return v;
}

static void send_geometry(gift_shard_t *s, gift_peer_t *p, tensor_t *t, uint64_t seq)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Geometry g = GIFT__GEOMETRY__INIT;
    g.key = t->key;
    g.epoch = t->geo.epoch;
    g.valid_from_step = t->nepochs ? t->epochs[t->nepochs - 1].valid_from : 0;
    g.din = t->cols;
    g.rank = t->k;
    g.basis_cols = t->ks;
    g.trace = t->geo.trace;
    g.sigma2 = t->geo.sigma2;
    g.delta = t->geo.delta;
    g.identity = t->geo.identity != 0;
    g.seq = seq;
    env.msg_case = GIFT__ENVELOPE__MSG_GEOMETRY;
    env.geometry = &g;
    (void)send_frame(s, p, &env, t->geo_buf, 0, t->geo_buf->len);
}

/* Starts the sketch round of step for t, forgetting any unfinished one. */
static void sketch_begin(gift_shard_t *s, tensor_t *t, uint64_t step)
{
    memset(t->ysum, 0, (size_t)t->cols * t->ks * sizeof(float));
    memset(t->sk_ranks, 0, s->words * sizeof(uint64_t));
    t->trace_sum = 0.0;
    t->sk_count = 0;
    t->sk_step = step;
    t->sk_active = 1;
}

/* Adds rank's sketch Y (cols x ks floats, possibly unaligned) to the round:
 * summed at once (eager) or kept for the rank-ordered sum (ordered). */
static void sketch_add(gift_shard_t *s, tensor_t *t, uint32_t rank, double trace,
                       const uint8_t *Y)
{
    size_t ny = (size_t)t->cols * t->ks;
    if (s->o.aggregate == GIFT_SHARD_ORDERED) {
        memcpy(t->yr + rank * ny, Y, ny * sizeof(float));
        t->tr[rank] = trace;
    } else {
        for (size_t i = 0; i < ny; i++) {
            float y;
            memcpy(&y, Y + 4 * i, 4);
            t->ysum[i] += y;
        }
        t->trace_sum += trace;
    }
    bit_set(t->sk_ranks, rank);
    t->sk_count++;
    s->c.sketches++;
}

static void log_epoch(gift_shard_t *s, tensor_t *t);

/* Every rank's sketch is in: builds and publishes the next epoch. */
static void sketch_complete(gift_shard_t *s, tensor_t *t)
{
    uint64_t step = t->sk_step;
    int rc;
    t->sk_active = 0;
    if (s->o.aggregate == GIFT_SHARD_ORDERED) {
        size_t ny = (size_t)t->cols * t->ks;
        memset(t->ysum, 0, ny * sizeof(float));
        t->trace_sum = 0.0;
        for (uint32_t r = 0; r < s->world; r++) {
            const float *y = t->yr + r * ny;
            for (size_t i = 0; i < ny; i++)
                t->ysum[i] += y[i];
            t->trace_sum += t->tr[r];
        }
    }
    /* geometry_decay: the epoch averages onto t->geo with weights decay^age over
     * the rounds seen (gift_geometry_decay_at, the epoch number counting the
     * rounds; after an identity epoch it overcounts and b is merely nearer
     * decay), a function of the published state, which checkpoints and epoch
     * records restore exactly. */
    if ((rc = gift_geometry_update_decay(
             &t->geo, t->ysum, t->trace_sum, s->o.damping,
             gift_geometry_decay_at(s->o.geometry_decay, t->geo.epoch))) < 0) {
        GIFT_LOG_ERROR(0, "tensor %u: geometry update at step %" PRIu64
                          " failed (%s); keeping epoch %u",
                       t->key, step, gift_strerror(rc), t->geo.epoch);
        count_error(s, rc);
    } else if ((rc = publish_geometry(s, t, first_clean_step(t, step + 1))) < 0) {
        count_error(s, rc);
    } else {
        t->sk_done = 1;
        t->sk_done_step = step;
        s->c.epochs_published++;
        log_epoch(s, t);
        GIFT_LOG_INFO(0,
                      "tensor %u: epoch %u published, valid from step %" PRIu64
                      " (sigma2 %.3g, delta %.3g)",
                      t->key, t->geo.epoch, t->epochs[t->nepochs - 1].valid_from, t->geo.sigma2,
                      t->geo.delta);
    }
}

static int handle_sketch(gift_shard_t *s, gift_peer_t *p, const Gift__Sketch *m,
                         const gift_frame_t *f)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__SketchAck ack = GIFT__SKETCH_ACK__INIT;
    tensor_t *t = find_owned(s, p, m->key, m->step, m->seq);
    size_t ny;
    int dup = 0, rc;

    if (t == NULL)
        return 0;
    ny = (size_t)t->cols * t->ks;
    if (m->din != t->cols || m->basis_cols != t->ks || f->payload_len != ny * 4) {
        send_error(s, p, GIFT_ESHAPE, 0, m->key, 0, m->step, m->seq,
                   "sketch of %u x %u (%" PRIu64 " bytes); tensor %u needs %u x %u", m->din,
                   m->basis_cols, f->payload_len, m->key, t->cols, t->ks);
        return 0;
    }
    if (t->sk_done && m->step == t->sk_done_step && m->epoch + 1 == t->geo.epoch) {
        /* A replay of the round that built the newest epoch. */
        dup = 1;
        goto ack;
    }
    if (m->epoch != t->geo.epoch) {
        send_error(s, p, GIFT_EEPOCH, 0, m->key, 0, m->step, m->seq,
                   "sketch against the basis of epoch %u; the newest is %u", m->epoch,
                   t->geo.epoch);
        return 0;
    }
    if (!(m->trace >= 0.0) || !isfinite(m->trace)) {
        send_error(s, p, GIFT_EBADCODE, 0, m->key, 0, m->step, m->seq,
                   "sketch trace %g is not a finite non-negative number", m->trace);
        return 0;
    }
    for (size_t i = 0; i < ny; i++) {
        float y;
        memcpy(&y, f->payload + 4 * i, 4);
        if (!isfinite(y)) {
            send_error(s, p, GIFT_EBADCODE, 0, m->key, 0, m->step, m->seq,
                       "sketch holds NaN or Inf at element %zu", i);
            return 0;
        }
    }
    if (t->sk_active && m->step != t->sk_step) {
        if (m->step < t->sk_step) {
            dup = 1;
        } else {
            GIFT_LOG_WARN(p->id,
                     "tensor %u: sketches of step %" PRIu64 " incomplete (%u of %u); starting "
                     "step %" PRIu64,
                     t->key, t->sk_step, t->sk_count, s->world, m->step);
            t->sk_active = 0;
        }
    }
    if (!dup && t->sk_active && bit_get(t->sk_ranks, p->rank))
        dup = 1;
    if (!dup && s->persist) {
        /* Durable before the SketchAck. */
        uint8_t h[36];
        const void *parts[2] = {h, f->payload};
        size_t lens[2] = {0, ny * 4};
        gift_ckpt_buf_t b = {h, 0, sizeof h, 0};
        gift_ckpt_put_u32(&b, t->key);
        gift_ckpt_put_u64(&b, m->step);
        gift_ckpt_put_u32(&b, p->rank);
        gift_ckpt_put_u32(&b, m->epoch);
        gift_ckpt_put_f64(&b, m->trace);
        gift_ckpt_put_u64(&b, ny * 4);
        lens[0] = b.len;
        if ((rc = log_append(s, GIFT_LOG_SKETCH, parts, lens, 2, 1)) < 0) {
            send_error(s, p, rc, 0, m->key, 0, m->step, m->seq,
                       "sketch not accepted: cannot write it to the step log in %s", s->dir);
            return 0;
        }
    }
    if (!dup) {
        if (!t->sk_active)
            sketch_begin(s, t, m->step);
        sketch_add(s, t, p->rank, m->trace, f->payload);
    }
ack:
    ack.key = m->key;
    ack.step = m->step;
    ack.duplicate = dup;
    ack.seq = m->seq;
    env.msg_case = GIFT__ENVELOPE__MSG_SKETCH_ACK;
    env.sketch_ack = &ack;
    (void)send_frame(s, p, &env, NULL, 0, 0);
    if (!dup && t->sk_count == s->world)
        sketch_complete(s, t);
    return 0;
}

static int handle_geometry_request(gift_shard_t *s, gift_peer_t *p, const Gift__GeometryRequest *m)
{
    tensor_t *t = find_owned(s, p, m->key, 0, m->seq);
    if (t != NULL)
        send_geometry(s, p, t, m->seq);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Stats                                                                 */
/* ------------------------------------------------------------------ */

int gift_shard_tensor_status(const gift_shard_t *s, size_t index, gift_tensor_status_t *out,
                             uint64_t *missing, size_t words)
{
    const tensor_t *t;
    const chunk_t *oldest = NULL;
    if (index >= s->ntensors || out == NULL)
        return GIFT_ENOKEY;
    t = &s->tensors[index];
    memset(out, 0, sizeof *out);
    out->key = t->key;
    out->name = t->name;
    out->owner = t->owner && t->geometry;
    out->epoch = out->owner ? latest_epoch(t) : 0;
    out->hit_rate = t->hit_rate;
    out->bytes_in = t->bytes_in;
    out->bytes_out = t->bytes_out;
    out->push_codec = gift_format_name(t->push.fmt);
    out->pull_codec = gift_format_name(t->pull.fmt);
    for (uint32_t i = 0; i < t->nchunks; i++) {
        const chunk_t *ch = t->by_id[i];
        if (ch && ch->started && (oldest == NULL || ch->base < oldest->base))
            oldest = ch;
    }
    if (missing)
        memset(missing, 0, words * sizeof(uint64_t));
    if (oldest != NULL) {
        const slot_t *sl = &oldest->slot[oldest->base & 1];
        out->has_step = 1;
        out->step = oldest->base;
        out->missing = s->world - sl->count;
        for (uint32_t r = 0; missing && r < s->world && (r >> 6) < words; r++)
            if (!bit_get(sl->ranks, r))
                bit_set(missing, r);
    }
    return 0;
}

static int handle_stats(gift_shard_t *s, gift_peer_t *p, const Gift__StatsRequest *m)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Stats st = GIFT__STATS__INIT;
    Gift__TensorStats *ts = NULL, **tsp = NULL;
    uint32_t *ranks = NULL;
    uint64_t *bm = NULL;
    size_t nt = s->ntensors, nr = 0;

    st.shard_id = s->o.shard_id;
    st.frames_in = s->c.frames_in;
    st.frames_out = s->c.frames_out;
    st.bytes_in = s->c.bytes_in;
    st.bytes_out = s->c.bytes_out;
    st.pushes = s->c.pushes;
    st.pulls = s->c.pulls;
    st.steps_finished = s->c.steps_finished;
    st.connections = s->c.peers;
    st.seq = m->seq;
    if (nt > 0) {
        ts = calloc(nt, sizeof *ts);
        tsp = calloc(nt, sizeof *tsp);
        ranks = calloc(nt * (size_t)s->world, sizeof *ranks);
        bm = calloc(s->words ? s->words : 1, sizeof *bm);
        if (ts == NULL || tsp == NULL || ranks == NULL || bm == NULL) {
            send_error(s, p, GIFT_ENOMEM, 0, 0, 0, 0, m->seq, "out of memory for stats");
            goto out;
        }
        for (size_t i = 0; i < nt; i++) {
            gift_tensor_status_t ss;
            gift__tensor_stats__init(&ts[i]);
            tsp[i] = &ts[i];
            gift_shard_tensor_status(s, i, &ss, bm, s->words);
            ts[i].key = ss.key;
            ts[i].name = (char *)ss.name;
            ts[i].step_finished = ss.has_step ? ss.step : 0;
            ts[i].epoch = ss.epoch;
            ts[i].bytes_in = ss.bytes_in;
            ts[i].bytes_out = ss.bytes_out;
            ts[i].push_codec = (char *)ss.push_codec;
            ts[i].pull_codec = (char *)ss.pull_codec;
            ts[i].boundary_hit_rate = ss.hit_rate;
            ts[i].missing_ranks = ranks + nr;
            if (ss.has_step)
                for (uint32_t r = 0; r < s->world; r++)
                    if (bit_get(bm, r))
                        ranks[nr + ts[i].n_missing_ranks++] = r;
            nr += ts[i].n_missing_ranks;
        }
        st.n_tensors = nt;
        st.tensors = tsp;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_STATS;
    env.stats = &st;
    (void)send_frame(s, p, &env, NULL, 0, 0);
out:
    free(ts);
    free(tsp);
    free(ranks);
    free(bm);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                              */
/* ------------------------------------------------------------------ */

int gift_shard_peer_ready(const gift_peer_t *p)
{
    return p->hello;
}

/* A Declare claimed p's rank (claim_rank); a refused first Declare, which
 * fixed nothing, gives the claim back, so that a peer whose Declares fail
 * (or whose Hello named another world) does not keep a rank from its worker. */
static int declare_claimed(gift_shard_t *s, gift_peer_t *p, const Gift__Declare *d)
{
    int first = !s->declared;
    int rc = handle_declare(s, p, d);
    if (first && !s->declared && p->claimed && s->by_rank[p->rank] == p) {
        s->by_rank[p->rank] = NULL;
        p->claimed = 0;
    }
    return rc;
}

int gift_shard_peer_claimed(const gift_peer_t *p)
{
    return p->claimed;
}

int gift_shard_peer_claim(gift_shard_t *s, gift_peer_t *p)
{
    if (p->closing)
        return GIFT_ECLOSED;
    if (!p->hello) {
        send_error(s, p, s->o.auth ? GIFT_EAUTH : GIFT_EPROTO, 1, 0, 0, 0, 0,
                   "a frame with a payload before the Hello%s completed",
                   s->o.auth ? " and its authentication" : "");
        return s->o.auth ? GIFT_EAUTH : GIFT_EPROTO;
    }
    if (s->world == 0) {
        send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0,
                   "a frame with a payload before any Declare on this shard");
        return GIFT_EPROTO;
    }
    return claim_rank(s, p);
}

void gift_shard_reject(gift_shard_t *s, gift_peer_t *p, int code, const char *text)
{
    send_error(s, p, code, 1, 0, 0, 0, 0, "%s", text ? text : gift_strerror(code));
}

int gift_shard_handle(gift_shard_t *s, gift_peer_t *p, const gift_frame_t *f)
{
    const Gift__Envelope *env = f->env;

    if (p->closing)
        return GIFT_ECLOSED;
    s->c.frames_in++;
    s->c.bytes_in += GIFT_PREAMBLE_BYTES + f->header_len + f->payload_len;
    if (env->msg_case != GIFT__ENVELOPE__MSG_PUSH && env->msg_case != GIFT__ENVELOPE__MSG_SKETCH &&
        f->payload_len != 0) {
        send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0, "%s carries a payload of %" PRIu64 " bytes",
                   gift_msg_name(env), f->payload_len);
        return GIFT_EPROTO;
    }
    if (env->msg_case == GIFT__ENVELOPE__MSG_HELLO)
        return handle_hello(s, p, env->hello);
    if (!p->hello) {
        int code = s->o.auth ? GIFT_EAUTH : GIFT_EPROTO;
        send_error(s, p, code, 1, 0, 0, 0, 0, "%s before %s", gift_msg_name(env),
                   s->o.auth ? "authentication" : "Hello");
        return code;
    }
    /* Acting as a rank (not before the world size is known: a Declare
     * makes it known, anything else is refused below). */
    if ((env->msg_case == GIFT__ENVELOPE__MSG_DECLARE ||
         (s->world != 0 && (env->msg_case == GIFT__ENVELOPE__MSG_PUSH ||
                            env->msg_case == GIFT__ENVELOPE__MSG_PULL ||
                            env->msg_case == GIFT__ENVELOPE__MSG_SKETCH ||
                            env->msg_case == GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST)))) {
        int rc = claim_rank(s, p);
        if (rc < 0)
            return rc;
    }
    if (env->msg_case != GIFT__ENVELOPE__MSG_DECLARE &&
        env->msg_case != GIFT__ENVELOPE__MSG_STATS_REQUEST && !s->declared) {
        send_error(s, p, GIFT_ENOKEY, 0, 0, 0, 0, 0, "%s before any Declare on this shard",
                   gift_msg_name(env));
        return 0;
    }
    switch (env->msg_case) {
    case GIFT__ENVELOPE__MSG_DECLARE:
        return declare_claimed(s, p, env->declare);
    case GIFT__ENVELOPE__MSG_PUSH:
        return handle_push(s, p, env->push, f);
    case GIFT__ENVELOPE__MSG_PULL:
        return handle_pull(s, p, env->pull);
    case GIFT__ENVELOPE__MSG_SKETCH:
        return handle_sketch(s, p, env->sketch, f);
    case GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST:
        return handle_geometry_request(s, p, env->geometry_request);
    case GIFT__ENVELOPE__MSG_STATS_REQUEST:
        return handle_stats(s, p, env->stats_request);
    default:
        send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0, "a client may not send %s",
                   gift_msg_name(env));
        return GIFT_EPROTO;
    }
}

void gift_shard_tick(gift_shard_t *s)
{
    uint64_t now = now_ns(s);
    for (size_t i = 0; s->declared && i < s->nchunks; i++) {
        chunk_t *ch = &s->chunks[i];
        slot_t *sl = &ch->slot[ch->base & 1];
        double waited;
        if (!ch->started || sl->count == 0 || sl->count >= s->world)
            continue;
        waited = (double)(now - sl->t_first) * 1e-9;
        if (s->o.stall_warn_s && waited >= s->o.stall_warn_s && !sl->warned) {
            char ranks[256];
            size_t len = 0;
            uint32_t shown = 0;
            ranks[0] = '\0';
            for (uint32_t r = 0; r < s->world && len + 16 < sizeof ranks; r++)
                if (!bit_get(sl->ranks, r)) {
                    len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%u",
                                            shown++ ? "," : "", r);
                }
            if (shown < s->world - sl->count)
                snprintf(ranks + len, sizeof ranks - len, ",...");
            GIFT_LOG_WARN(0,
                          "stall: tensor %u (%s) chunk %u step %" PRIu64
                          " has waited %.0f s; %u of %u ranks pushed, missing ranks %s",
                          ch->t->key, ch->t->name, ch->id, ch->base, waited, sl->count, s->world,
                          ranks);
            sl->warned = 1;
            s->c.stalls++;
        }
        if (s->o.stall_timeout_s && waited >= s->o.stall_timeout_s) {
            for (parked_t *q = ch->parked, *next; q != NULL; q = next) {
                next = q->cnext;
                if (q->step == ch->base) {
                    gift_peer_t *p = q->peer;
                    uint64_t seq = q->seq;
                    parked_unlink(s, q);
                    send_error(s, p, GIFT_ETIMEDOUT, 0, ch->t->key, ch->id, ch->base, seq,
                               "step %" PRIu64 " of tensor %u chunk %u waited %.0f s for %u "
                               "missing ranks (stall_timeout %u s)",
                               ch->base, ch->t->key, ch->id, waited, s->world - sl->count,
                               s->o.stall_timeout_s);
                }
            }
        }
    }
}

const gift_shard_counters_t *gift_shard_counters(const gift_shard_t *s)
{
    return &s->c;
}

uint32_t gift_shard_world_size(const gift_shard_t *s)
{
    return s->world;
}

size_t gift_shard_tensor_count(const gift_shard_t *s)
{
    return s->ntensors;
}

int gift_shard_ready(const gift_shard_t *s)
{
    return s != NULL;
}

/* ------------------------------------------------------------------ */
/* Persistence (checkpoint.h holds the file formats)                     */
/* ------------------------------------------------------------------ */

static int log_append(gift_shard_t *s, uint32_t type, const void *const *parts,
                      const size_t *lens, int n, int sync)
{
    int rc;
    uint64_t before = s->log.bytes;
    if (!s->persist || s->replaying)
        return 0;
    if ((rc = gift_log_append(&s->log, type, parts, lens, n, sync)) < 0) {
        s->c.log_failures++;
        return rc;
    }
    s->c.log_records++;
    s->c.log_bytes += s->log.bytes - before;
    return 0;
}

void gift_shard_flush(gift_shard_t *s)
{
    int rc;
    if (s->npending == 0)
        return;
    rc = gift_log_sync(&s->log);
    if (rc < 0)
        s->c.log_failures++;
    for (size_t i = 0; i < s->npending; i++) {
        chunk_t *ch = s->pending[i];
        ch->pending = 0;
        for (int j = 0; j < 2; j++)
            if (ch->reply[j].valid && !ch->reply[j].durable) {
                if (rc < 0)
                    ch->reply[j].err = GIFT_EIO;
                ch->reply[j].durable = 1;
            }
        for (parked_t *q = ch->parked, *next; q != NULL; q = next) {
            const reply_t *r = &ch->reply[q->step & 1];
            next = q->cnext;
            if (q->step < ch->base && r->valid && r->step == q->step) {
                gift_peer_t *p = q->peer;
                uint64_t seq = q->seq;
                parked_unlink(s, q);
                send_reply(s, p, ch, r, seq);
            }
        }
    }
    s->npending = 0;
}

static void log_epoch(gift_shard_t *s, tensor_t *t)
{
    uint8_t h[64];
    gift_ckpt_buf_t b = {h, 0, sizeof h, 0};
    const void *parts[3];
    size_t lens[3];
    if (!s->persist || s->replaying)
        return;
    gift_ckpt_put_u32(&b, t->key);
    gift_ckpt_put_u64(&b, t->sk_done_step);
    gift_ckpt_put_u32(&b, t->geo.epoch);
    gift_ckpt_put_u64(&b, t->epochs[t->nepochs - 1].valid_from);
    gift_ckpt_put_u32(&b, (uint32_t)t->geo.identity);
    gift_ckpt_put_f64(&b, t->geo.trace);
    gift_ckpt_put_f64(&b, t->geo.sigma2);
    gift_ckpt_put_f64(&b, t->geo.delta);
    parts[0] = h;
    lens[0] = b.len;
    parts[1] = t->geo.U;
    lens[1] = (size_t)t->cols * t->ks * sizeof(float);
    parts[2] = t->geo.lambda;
    lens[2] = (size_t)t->ks * sizeof(float);
    /* If this fails, a restart rebuilds the epoch from the logged sketches. */
    if (log_append(s, GIFT_LOG_EPOCH, parts, lens, 3, 1) < 0)
        GIFT_LOG_ERROR(0, "tensor %u: epoch %u not written to the step log", t->key,
                       t->geo.epoch);
}

/* The oldest unfinished step over the chunks that have started (0 if none). */
static uint64_t min_base(const gift_shard_t *s)
{
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < s->nchunks; i++)
        if (s->chunks[i].started && s->chunks[i].base < m)
            m = s->chunks[i].base;
    return m == UINT64_MAX ? 0 : m;
}

static void ckpt_schedule(gift_shard_t *s)
{
    uint64_t cs = s->o.checkpoint_steps;
    if (cs)
        s->ckpt_next = (min_base(s) / cs + 1) * cs;
}

static void maybe_checkpoint(gift_shard_t *s)
{
    char err[512];
    if (!s->persist || s->replaying || min_base(s) < s->ckpt_next)
        return;
    if (gift_shard_checkpoint(s, err, sizeof err) < 0)
        GIFT_LOG_ERROR(0, "checkpoint failed: %s (the step log keeps growing)", err);
}

/* Sets t's geometry to a saved epoch and refreshes the published payload
 * (its epoch records are the caller's). U and lambda may be unaligned. */
static int geo_restore(tensor_t *t, uint32_t epoch, int identity, double trace, double sigma2,
                       double delta, const uint8_t *U, const uint8_t *lambda)
{
    size_t ub = (size_t)t->cols * t->ks * 4, lb = (size_t)t->ks * 4;
    int rc;
    memcpy(t->geo.U, U, ub);
    memcpy(t->geo.lambda, lambda, lb);
    if ((rc = gift_geometry_load(&t->geo, t->geo.U, t->geo.lambda, trace, sigma2, delta, epoch,
                                 identity)) < 0)
        return rc;
    memcpy(t->geo_buf->data, U, ub);
    memcpy(t->geo_buf->data + ub, lambda, lb);
    t->geo_buf->len = ub + lb;
    return 0;
}

/* The checkpoint body: see gift_shard_restore's parser for the same order. */
static int snapshot_build(gift_shard_t *s, uint64_t gen, gift_ckpt_buf_t *b)
{
    gift_ckpt_put_u32(b, s->o.shard_id);
    gift_ckpt_put_u32(b, s->o.num_shards);
    gift_ckpt_put_u32(b, s->world);
    gift_ckpt_put_u32(b, (uint32_t)s->o.aggregate);
    gift_ckpt_put_u64(b, gen);
    gift_ckpt_put_blob(b, s->decl, s->decl_len);
    gift_ckpt_put_u64(b, s->nchunks);
    for (size_t i = 0; i < s->nchunks; i++) {
        const chunk_t *ch = &s->chunks[i];
        gift_ckpt_put_u32(b, ch->t->key);
        gift_ckpt_put_u32(b, ch->id);
        gift_ckpt_put_u32(b, (uint32_t)ch->started);
        gift_ckpt_put_u64(b, ch->base);
        for (int j = 0; j < 2; j++) {
            const reply_t *r = &ch->reply[j];
            int has = r->valid && !r->err;
            gift_ckpt_put_u32(b, (uint32_t)r->valid);
            gift_ckpt_put_u32(b, (uint32_t)r->err);
            gift_ckpt_put_u64(b, r->step);
            gift_ckpt_put_u32(b, r->epoch);
            gift_ckpt_put_blob(b, r->buf->data, has ? ch->pull_l.total : 0);
        }
        if (ch->pres != NULL) { /* pull error feedback (the declaration says so) */
            gift_ckpt_put_u32(b, ch->pres_epoch);
            gift_ckpt_put_blob(b, ch->pres, ch->n * sizeof(float));
        }
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        const tensor_t *t = &s->tensors[i];
        size_t ny = (size_t)t->cols * t->ks;
        if (!t->owner || !t->geometry)
            continue;
        gift_ckpt_put_u32(b, t->key);
        gift_ckpt_put_u32(b, t->nepochs);
        for (uint32_t e = 0; e < t->nepochs; e++) {
            gift_ckpt_put_u32(b, t->epochs[e].epoch);
            gift_ckpt_put_u64(b, t->epochs[e].valid_from);
        }
        gift_ckpt_put_u32(b, t->geo.epoch);
        gift_ckpt_put_u32(b, (uint32_t)t->geo.identity);
        gift_ckpt_put_f64(b, t->geo.trace);
        gift_ckpt_put_f64(b, t->geo.sigma2);
        gift_ckpt_put_f64(b, t->geo.delta);
        gift_ckpt_put_blob(b, t->geo.U, ny * 4);
        gift_ckpt_put_blob(b, t->geo.lambda, (size_t)t->ks * 4);
        gift_ckpt_put_u32(b, (uint32_t)t->sk_active);
        gift_ckpt_put_u64(b, t->sk_step);
        gift_ckpt_put_u32(b, t->sk_count);
        gift_ckpt_put_blob(b, t->sk_ranks, s->words * 8);
        gift_ckpt_put_u32(b, (uint32_t)t->sk_done);
        gift_ckpt_put_u64(b, t->sk_done_step);
        gift_ckpt_put_blob(b, t->ysum, ny * 4);
        gift_ckpt_put_f64(b, t->trace_sum);
        gift_ckpt_put_blob(b, t->yr, t->yr ? ny * 4 * s->world : 0);
        gift_ckpt_put_blob(b, t->tr, t->tr ? 8 * (size_t)s->world : 0);
    }
    gift_ckpt_put_u32(b, 0x454e4421u); /* "!DNE": end of body */
    return b->err;
}

int gift_shard_checkpoint(gift_shard_t *s, char *err, size_t errlen)
{
    gift_ckpt_buf_t *b = &s->ckpt_buf;
    gift_log_t nl;
    uint64_t gen = s->gen + 1;
    uint64_t t0 = now_ns(s);
    int rc;

    err[0] = '\0';
    if (!s->persist || !s->declared)
        return 0;
    b->len = 0;
    b->err = 0;
    if ((rc = snapshot_build(s, gen, b)) < 0) {
        snprintf(err, errlen, "out of memory building the checkpoint");
        goto out;
    }
    if ((rc = gift_ckpt_write(s->dir, b->p, b->len, err, errlen)) < 0)
        goto out;
    /* The checkpoint names generation gen: its log starts empty and the
     * previous one is no longer read. */
    if ((rc = gift_log_open(&nl, s->dir, gen, 1, err, errlen)) < 0)
        goto out;
    gift_log_close(&s->log);
    s->log = nl;
    s->gen = gen;
    gift_log_remove_others(s->dir, gen);
    s->c.checkpoints++;
    GIFT_LOG_INFO(0, "checkpoint %" PRIu64 " written: %zu bytes, oldest unfinished step %" PRIu64
                     " (%.1f ms)",
                  gen, b->len, min_base(s), (double)(now_ns(s) - t0) * 1e-6);
out:
    if (rc < 0)
        s->c.checkpoint_failures++;
    ckpt_schedule(s);
    return rc;
}

static int restore_declare(gift_shard_t *s, const uint8_t *p, size_t len, char *err,
                           size_t errlen)
{
    char why[256] = "";
    Gift__Declare *d = gift__declare__unpack(NULL, len, p);
    int rc;
    if (d == NULL) {
        snprintf(err, errlen, "the saved declaration does not parse");
        return GIFT_EIO;
    }
    if (s->world == 0) {
        snprintf(err, errlen, "a declaration is saved but no world size");
        gift__declare__free_unpacked(d, NULL);
        return GIFT_EIO;
    }
    if ((rc = declare_apply(s, d, why, sizeof why)) < 0)
        snprintf(err, errlen, "the saved declaration is refused: %s", why);
    gift__declare__free_unpacked(d, NULL);
    return rc;
}

/* Applies the checkpoint body. Returns 0 or a negative code with err. */
static int snapshot_load(gift_shard_t *s, const uint8_t *body, size_t len, char *err,
                         size_t errlen)
{
    gift_ckpt_cur_t c = {body, len, 0, 0};
    uint32_t shard_id, num_shards, world, agg;
    const uint8_t *decl;
    size_t dlen, n;
    uint64_t nch;
    int rc;

    shard_id = gift_ckpt_get_u32(&c);
    num_shards = gift_ckpt_get_u32(&c);
    world = gift_ckpt_get_u32(&c);
    agg = gift_ckpt_get_u32(&c);
    s->gen = gift_ckpt_get_u64(&c);
    decl = gift_ckpt_get_blob(&c, &dlen, len);
    if (c.err)
        goto short_body;
    if (shard_id != s->o.shard_id || num_shards != s->o.num_shards) {
        snprintf(err, errlen, "the checkpoint is of shard %u of %u; this is shard %u of %u",
                 shard_id, num_shards, s->o.shard_id, s->o.num_shards);
        return GIFT_ECONFIG;
    }
    if (world == 0 || world > 65536 || (s->world != 0 && world != s->world)) {
        snprintf(err, errlen, "the checkpoint has world size %u; this shard is set to %u", world,
                 s->world);
        return GIFT_ECONFIG;
    }
    s->world = world;
    s->words = (world + 63) / 64;
    if (dlen == 0)
        goto end; /* nothing was declared */
    if ((rc = restore_declare(s, decl, dlen, err, errlen)) < 0)
        return rc;
    nch = gift_ckpt_get_u64(&c);
    if (c.err || nch != s->nchunks) {
        snprintf(err, errlen, "the checkpoint lists %" PRIu64 " chunks; its declaration has %zu",
                 nch, s->nchunks);
        return GIFT_EIO;
    }
    for (size_t i = 0; i < s->nchunks; i++) {
        chunk_t *ch = &s->chunks[i];
        uint32_t key = gift_ckpt_get_u32(&c), id = gift_ckpt_get_u32(&c);
        ch->started = gift_ckpt_get_u32(&c) != 0;
        ch->base = gift_ckpt_get_u64(&c);
        if (c.err)
            goto short_body;
        if (key != ch->t->key || id != ch->id) {
            snprintf(err, errlen, "chunk %zu of the checkpoint is %u/%u, not %u/%u", i, key, id,
                     ch->t->key, ch->id);
            return GIFT_EIO;
        }
        for (int j = 0; j < 2; j++) {
            reply_t *r = &ch->reply[j];
            const uint8_t *p;
            r->valid = gift_ckpt_get_u32(&c) != 0;
            r->durable = 1;
            r->err = (int)gift_ckpt_get_u32(&c);
            r->step = gift_ckpt_get_u64(&c);
            r->epoch = gift_ckpt_get_u32(&c);
            p = gift_ckpt_get_blob(&c, &n, ch->pull_l.total);
            if (c.err)
                goto short_body;
            if (r->valid && !r->err && n != ch->pull_l.total) {
                snprintf(err, errlen, "reply of tensor %u chunk %u has %zu bytes, not %zu", key,
                         id, n, ch->pull_l.total);
                return GIFT_EIO;
            }
            memcpy(r->buf->data, p, n);
            r->buf->len = ch->pull_l.total;
        }
        if (ch->pres != NULL) {
            const uint8_t *p;
            ch->pres_epoch = gift_ckpt_get_u32(&c);
            p = gift_ckpt_get_blob(&c, &n, ch->n * sizeof(float));
            if (c.err)
                goto short_body;
            if (n != ch->n * sizeof(float)) {
                snprintf(err, errlen, "the pull residual of tensor %u chunk %u has %zu bytes, "
                                      "not %zu", key, id, n, ch->n * sizeof(float));
                return GIFT_EIO;
            }
            memcpy(ch->pres, p, n);
        }
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        size_t ny = (size_t)t->cols * t->ks, ul, ll, yl;
        const uint8_t *U, *L, *p;
        uint32_t epoch, identity;
        double trace, sigma2, delta;
        if (!t->owner || !t->geometry)
            continue;
        if (gift_ckpt_get_u32(&c) != t->key || c.err)
            goto short_body;
        t->nepochs = gift_ckpt_get_u32(&c);
        if (t->nepochs == 0 || t->nepochs > MAX_EPOCH_RECS)
            goto short_body;
        for (uint32_t e = 0; e < t->nepochs; e++) {
            t->epochs[e].epoch = gift_ckpt_get_u32(&c);
            t->epochs[e].valid_from = gift_ckpt_get_u64(&c);
        }
        epoch = gift_ckpt_get_u32(&c);
        identity = gift_ckpt_get_u32(&c);
        trace = gift_ckpt_get_f64(&c);
        sigma2 = gift_ckpt_get_f64(&c);
        delta = gift_ckpt_get_f64(&c);
        U = gift_ckpt_get_blob(&c, &ul, ny * 4);
        L = gift_ckpt_get_blob(&c, &ll, (size_t)t->ks * 4);
        if (c.err || ul != ny * 4 || ll != (size_t)t->ks * 4)
            goto short_body;
        if ((rc = geo_restore(t, epoch, (int)identity, trace, sigma2, delta, U, L)) < 0) {
            snprintf(err, errlen, "tensor %u: the saved geometry of epoch %u is invalid (%s)",
                     t->key, epoch, gift_strerror(rc));
            return GIFT_EIO;
        }
        t->sk_active = gift_ckpt_get_u32(&c) != 0;
        t->sk_step = gift_ckpt_get_u64(&c);
        t->sk_count = gift_ckpt_get_u32(&c);
        p = gift_ckpt_get_blob(&c, &n, s->words * 8);
        if (c.err || n != s->words * 8)
            goto short_body;
        memcpy(t->sk_ranks, p, n);
        t->sk_done = gift_ckpt_get_u32(&c) != 0;
        t->sk_done_step = gift_ckpt_get_u64(&c);
        p = gift_ckpt_get_blob(&c, &yl, ny * 4);
        if (c.err || yl != ny * 4)
            goto short_body;
        memcpy(t->ysum, p, yl);
        t->trace_sum = gift_ckpt_get_f64(&c);
        p = gift_ckpt_get_blob(&c, &yl, ny * 4 * (size_t)s->world);
        if (c.err)
            goto short_body;
        if (t->yr && yl == ny * 4 * (size_t)s->world)
            memcpy(t->yr, p, yl);
        else if (t->sk_active && t->sk_count > 0 && (t->yr != NULL) != (yl != 0)) {
            snprintf(err, errlen,
                     "tensor %u: a sketch round saved under aggregate = %s cannot continue "
                     "under aggregate = %s",
                     t->key, agg == GIFT_SHARD_ORDERED ? "ordered" : "eager",
                     t->yr ? "ordered" : "eager");
            return GIFT_ECONFIG;
        }
        p = gift_ckpt_get_blob(&c, &yl, 8 * (size_t)s->world);
        if (c.err)
            goto short_body;
        if (t->tr && yl == 8 * (size_t)s->world)
            memcpy(t->tr, p, yl);
    }
end:
    if (gift_ckpt_get_u32(&c) != 0x454e4421u || c.err || c.off != c.len)
        goto short_body;
    return 0;
short_body:
    snprintf(err, errlen, "the checkpoint body is inconsistent at byte %zu of %zu", c.off,
             c.len);
    return GIFT_EIO;
}

typedef struct replay_ctx {
    gift_shard_t *s;
    char *err;
    size_t errlen;
    uint64_t records;
} replay_ctx_t;

static int replay_record(uint32_t type, const uint8_t *body, size_t len, void *arg)
{
    replay_ctx_t *x = arg;
    gift_shard_t *s = x->s;
    gift_ckpt_cur_t c = {body, len, 0, 0};
    x->records++;
    if (type == GIFT_LOG_DECLARE) {
        uint32_t world = gift_ckpt_get_u32(&c);
        if (c.err || world == 0 || world > 65536 || (s->world != 0 && world != s->world)) {
            snprintf(x->err, x->errlen, "the step log declares world size %u; this shard has %u",
                     world, s->world);
            return GIFT_EIO;
        }
        if (s->declared) {
            if (len - 4 == s->decl_len && memcmp(body + 4, s->decl, len - 4) == 0)
                return 0;
            snprintf(x->err, x->errlen, "the step log declares a second, different tensor list");
            return GIFT_EIO;
        }
        s->world = world;
        s->words = (world + 63) / 64;
        return restore_declare(s, body + 4, len - 4, x->err, x->errlen);
    }
    if (!s->declared) {
        snprintf(x->err, x->errlen, "the step log has a record of type %u before any declaration",
                 type);
        return GIFT_EIO;
    }
    if (type == GIFT_LOG_STEP) {
        uint32_t key = gift_ckpt_get_u32(&c), id = gift_ckpt_get_u32(&c);
        uint64_t step = gift_ckpt_get_u64(&c);
        uint32_t epoch = gift_ckpt_get_u32(&c), e = gift_ckpt_get_u32(&c);
        uint32_t n = gift_ckpt_get_u32(&c);
        chunk_t *ch = find_chunk(s, key, id);
        size_t extra = ch != NULL && ch->pres != NULL ? 4 + ch->n * sizeof(float) : 0;
        reply_t *r;
        if (c.err || ch == NULL || (e == 0 && n != ch->pull_l.total) ||
            c.len - c.off != n + extra) {
            snprintf(x->err, x->errlen, "a step record of tensor %u chunk %u does not fit the "
                                        "declaration", key, id);
            return GIFT_EIO;
        }
        if (ch->started && step < ch->base)
            return 0; /* already in the checkpoint */
        if (ch->started && step != ch->base) {
            snprintf(x->err, x->errlen, "tensor %u chunk %u: the step log jumps from step %" PRIu64
                                        " to %" PRIu64, key, id, ch->base, step);
            return GIFT_EIO;
        }
        r = &ch->reply[step & 1];
        r->valid = 1;
        r->durable = 1;
        r->err = (int)e;
        r->step = step;
        r->epoch = epoch;
        memcpy(r->buf->data, body + c.off, n);
        r->buf->len = ch->pull_l.total;
        if (ch->pres != NULL) {
            c.off += n;
            ch->pres_epoch = gift_ckpt_get_u32(&c);
            memcpy(ch->pres, body + c.off, ch->n * sizeof(float));
        }
        ch->started = 1;
        ch->base = step + 1;
        return 0;
    }
    if (type == GIFT_LOG_SKETCH || type == GIFT_LOG_EPOCH) {
        uint32_t key = gift_ckpt_get_u32(&c);
        uint64_t step = gift_ckpt_get_u64(&c);
        tensor_t *t = key < s->ntensors ? &s->tensors[key] : NULL;
        size_t ny;
        if (c.err || t == NULL || !t->owner || !t->geometry) {
            snprintf(x->err, x->errlen, "a geometry record names tensor %u, which this shard "
                                        "does not own", key);
            return GIFT_EIO;
        }
        ny = (size_t)t->cols * t->ks;
        if (type == GIFT_LOG_SKETCH) {
            uint32_t rank = gift_ckpt_get_u32(&c);
            uint32_t epoch = gift_ckpt_get_u32(&c);
            double trace = gift_ckpt_get_f64(&c);
            size_t yl;
            const uint8_t *Y = gift_ckpt_get_blob(&c, &yl, ny * 4);
            (void)epoch;
            if (c.err || yl != ny * 4 || rank >= s->world) {
                snprintf(x->err, x->errlen, "a sketch record of tensor %u is malformed", key);
                return GIFT_EIO;
            }
            if ((t->sk_done && step <= t->sk_done_step) ||
                (t->sk_active && (step < t->sk_step ||
                                  (step == t->sk_step && bit_get(t->sk_ranks, rank)))))
                return 0;
            if (!t->sk_active || step != t->sk_step)
                sketch_begin(s, t, step);
            sketch_add(s, t, rank, trace, Y);
            return 0;
        } else {
            uint32_t epoch = gift_ckpt_get_u32(&c);
            uint64_t valid_from = gift_ckpt_get_u64(&c);
            uint32_t identity = gift_ckpt_get_u32(&c);
            double trace = gift_ckpt_get_f64(&c), sigma2 = gift_ckpt_get_f64(&c),
                   delta = gift_ckpt_get_f64(&c);
            const uint8_t *U = body + c.off, *L = U + ny * 4;
            int rc;
            if (c.err || c.len - c.off != ny * 4 + (size_t)t->ks * 4) {
                snprintf(x->err, x->errlen, "an epoch record of tensor %u is malformed", key);
                return GIFT_EIO;
            }
            if (epoch <= t->geo.epoch)
                return 0;
            if ((rc = geo_restore(t, epoch, (int)identity, trace, sigma2, delta, U, L)) < 0) {
                snprintf(x->err, x->errlen, "tensor %u: the logged epoch %u is invalid (%s)", key,
                         epoch, gift_strerror(rc));
                return GIFT_EIO;
            }
            /* publish_geometry re-copies U and lambda and appends the record. */
            if ((rc = publish_geometry(s, t, valid_from)) < 0)
                return rc;
            t->sk_active = 0;
            t->sk_done = 1;
            t->sk_done_step = step;
            return 0;
        }
    }
    snprintf(x->err, x->errlen, "the step log has a record of unknown type %u", type);
    return GIFT_EIO;
}

int gift_shard_restore(gift_shard_t *s, char *err, size_t errlen)
{
    uint8_t *body = NULL;
    size_t len = 0;
    replay_ctx_t x = {s, err, errlen, 0};
    int rc, have, torn = 0;

    err[0] = '\0';
    if (!s->persist)
        return 0;
    if ((rc = gift_ckpt_mkdir(s->dir, err, errlen)) < 0)
        return rc;
    s->replaying = 1;
    if ((have = gift_ckpt_read(s->dir, &body, &len, err, errlen)) < 0) {
        rc = have;
        goto fail;
    }
    if (have && (rc = snapshot_load(s, body, len, err, errlen)) < 0) {
        size_t n = strlen(err);
        /* Prefix the file's name: "DIR/checkpoint: why". */
        if (n + strlen(s->dir) + 14 < errlen) {
            size_t pre = strlen(s->dir) + 13;
            memmove(err + pre, err, n + 1);
            memcpy(err, s->dir, strlen(s->dir));
            memcpy(err + strlen(s->dir), "/checkpoint: ", 13);
        }
        goto fail;
    }
    if ((rc = gift_log_replay(s->dir, s->gen, replay_record, &x, &torn, err, errlen)) < 0)
        goto fail;
    s->replaying = 0;
    gift_log_remove_others(s->dir, s->gen);
    if ((rc = gift_log_open(&s->log, s->dir, s->gen, 0, err, errlen)) < 0)
        goto fail;
    free(body);
    /* A round whose last sketch was logged but whose epoch was not. */
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->owner && t->geometry && t->sk_active && t->sk_count == s->world)
            sketch_complete(s, t);
    }
    ckpt_schedule(s);
    if (!have && x.records == 0)
        return 0;
    s->c.restored_step = min_base(s);
    GIFT_LOG_INFO(0,
                  "restored from %s: checkpoint %s (generation %" PRIu64 "), %" PRIu64
                  " log records%s; %zu tensors, %zu chunks, world %u, oldest unfinished step "
                  "%" PRIu64,
                  s->dir, have ? "found" : "absent", s->gen, x.records,
                  torn ? " (an unfinished last record dropped)" : "", s->ntensors, s->nchunks,
                  s->world, min_base(s));
    return 1;
fail:
    s->replaying = 0;
    free(body);
    store_free(s);
    return rc < 0 ? rc : GIFT_EIO;
}
