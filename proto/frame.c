/*
 * frame.c: giftd's framing (gift_proto.h). No I/O happens here.
 *
 * The reader keeps one byte buffer per connection: bytes in [rpos, wpos)
 * are buffered and not yet returned as frames, [wpos, cap) is free. The
 * buffer grows geometrically and never shrinks; when the free tail is too
 * short it is first compacted (the unconsumed bytes moved to the front).
 * A frame handed out by gift_reader_next points into the buffer, so nothing
 * is moved or freed until the caller's next call on the reader: next only
 * advances rpos, and compaction happens lazily at the start of reserve/feed.
 *
 * Memory a peer can cause: the preamble of the frame at rpos is checked
 * (magic, header_len, payload_len against the limits) as soon as its 16
 * bytes are buffered, and only a frame that passed may make the buffer grow
 * to its full size. Through gift_reader_reserve the buffer never exceeds
 * 16 + max_header_bytes + max_frame_bytes. gift_reader_feed always takes
 * every byte it is given, so a caller that feeds more than that without
 * taking frames out makes it larger; that is bounded by the caller, not the
 * peer.
 *
 * Headers are unpacked with a per-reader arena as the protobuf-c allocator:
 * one block, reset before each header, so that steady-state decoding does no
 * malloc. A request that does not fit gets its own malloc, freed at the next
 * reset; if a frame needed more than the block, the block is reallocated at
 * the next reset to that size (up to ARENA_MAX), so a stream of similar
 * frames stops allocating after its first frames.
 */
#include <assert.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gift_proto.h"
#include "gift_proto_internal.h"

#define ARENA_ALIGN alignof(max_align_t)
/* The arena block is kept up to this many times max_header_bytes (and never
 * above ARENA_CEIL); a frame that needs more mallocs its excess each time. */
#define ARENA_HEADER_FACTOR 16u
#define ARENA_CEIL (64u * 1024u * 1024u)

/* An oversize arena allocation: this header, then the caller's bytes. The
 * union keeps the bytes after it aligned for any type. */
typedef union arena_big {
    union arena_big *next;
    max_align_t align_;
} arena_big_t;

typedef struct arena {
    ProtobufCAllocator pa; /* what protobuf-c calls; allocator_data is the arena */
    unsigned char *block;
    size_t size; /* bytes at block */
    size_t used; /* bytes handed out from block since the last reset */
    size_t need; /* bytes asked for since the last reset, block or not */
    size_t max;  /* the block is never grown above this */
    arena_big_t *bigs;
    int oom; /* an allocation failed since the last reset */
    uint64_t *allocs;
} arena_t;

struct gift_reader {
    uint8_t *buf;
    size_t cap;        /* bytes allocated at buf */
    size_t rpos;       /* first byte not yet returned in a frame */
    size_t wpos;       /* one past the last committed byte */
    size_t max_cap;    /* 16 + max_header + max_frame: the most reserve grows to */
    size_t head_total; /* size of the frame at rpos once its preamble passed; 0 before */
    uint32_t max_header;
    uint64_t max_frame;
    uint32_t handshake; /* frames at the start that may carry no payload */
    uint64_t frames;    /* frames returned so far */
    /* The front frame seen by gift_reader_peek (peeked: its env in peek_env)
     * and, once sunk, its payload's destination: buf then holds only its
     * preamble and header, at rpos, and sink_got of its sink_len payload
     * bytes are at sink (or were dropped, sink_drop). */
    int peeked;
    Gift__Envelope *peek_env;
    uint8_t *sink;
    size_t sink_len, sink_got;
    int sink_drop;
    int reserved_sink; /* the last reserve handed out sink (or the drop area) */
    int err;           /* sticky stream error, 0 while the stream is sound */
    uint64_t allocs;
    arena_t arena;
};

/* ---- little-endian fields, byte by byte --------------------------------- */

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void put_le64(uint8_t *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

/* ---- header arena -------------------------------------------------------- */

/* protobuf-c's alloc: size bytes aligned for any type, from the block when
 * they fit, else from a malloc that the next reset frees. NULL (and the oom
 * flag) when that malloc fails. */
static void *arena_alloc(void *data, size_t size)
{
    arena_t *a = data;
    size_t asize = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    arena_big_t *big;
    void *p;

    if (asize < size || asize > SIZE_MAX - sizeof(arena_big_t)) {
        a->oom = 1;
        return NULL;
    }
    a->need = a->need > SIZE_MAX - asize ? SIZE_MAX : a->need + asize;
    if (a->block != NULL && asize <= a->size - a->used) {
        p = a->block + a->used;
        a->used += asize;
        return p;
    }
    if ((big = malloc(sizeof(*big) + asize)) == NULL) {
        a->oom = 1;
        return NULL;
    }
    (*a->allocs)++;
    big->next = a->bigs;
    a->bigs = big;
    return big + 1;
}

/* protobuf-c's free: nothing; memory comes back at the next reset. */
static void arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr;
}

/* Frees the oversize blocks, so no header is referenced afterwards. */
static void arena_release(arena_t *a)
{
    arena_big_t *big;

    while ((big = a->bigs) != NULL) {
        a->bigs = big->next;
        free(big);
    }
}

/* Forgets every allocation of the previous header. When that header needed
 * more than the block, first replaces the block with one of that size (a
 * power of two, at most a->max); if that malloc fails the arena carries on
 * with what it has. */
static void arena_reset(arena_t *a)
{
    size_t nsize = a->size ? a->size : GIFT__ARENA_MIN;
    unsigned char *nblock;

    arena_release(a);
    if (a->need > a->size && a->size < a->max) {
        while (nsize < a->need && nsize < a->max)
            nsize *= 2;
        if (nsize > a->max)
            nsize = a->max;
        if ((nblock = malloc(nsize)) != NULL) {
            (*a->allocs)++;
            free(a->block);
            a->block = nblock;
            a->size = nsize;
        }
    }
    a->used = 0;
    a->need = 0;
    a->oom = 0;
}

/* ---- reader ---------------------------------------------------------------- */

gift_reader_t *gift_reader_new(const gift_limits_t *lim)
{
    gift_reader_t *r;

    if ((r = calloc(1, sizeof(*r))) == NULL)
        goto out;
    r->allocs = 1;
    r->max_header = lim && lim->max_header_bytes ? lim->max_header_bytes : GIFT_MAX_HEADER_DEFAULT;
    r->max_frame = lim && lim->max_frame_bytes ? lim->max_frame_bytes : GIFT_MAX_FRAME_DEFAULT;
    r->handshake = lim ? lim->handshake_frames : 0;
    /* Keep every size sum and doubling below SIZE_MAX (a limit only bites on
     * a 32-bit host, or for an absurd max_frame_bytes). */
#if SIZE_MAX < UINT64_MAX
    if (r->max_header > SIZE_MAX / 4)
        r->max_header = (uint32_t)(SIZE_MAX / 4);
#endif
    if (r->max_frame > SIZE_MAX / 4)
        r->max_frame = SIZE_MAX / 4;
    r->max_cap = GIFT_PREAMBLE_BYTES + (size_t)r->max_header + (size_t)r->max_frame;

    r->arena.pa.alloc = arena_alloc;
    r->arena.pa.free = arena_free;
    r->arena.pa.allocator_data = &r->arena;
    r->arena.allocs = &r->allocs;
    r->arena.max = r->max_header > ARENA_CEIL / ARENA_HEADER_FACTOR
                       ? ARENA_CEIL
                       : (size_t)r->max_header * ARENA_HEADER_FACTOR;
    if (r->arena.max < GIFT__ARENA_MIN)
        r->arena.max = GIFT__ARENA_MIN;
    if ((r->arena.block = malloc(GIFT__ARENA_MIN)) == NULL)
        goto out_free_reader;
    r->allocs++;
    r->arena.size = GIFT__ARENA_MIN;
    return r;

out_free_reader:
    free(r);
    r = NULL;
out:
    return r;
}

void gift_reader_free(gift_reader_t *r)
{
    if (r == NULL)
        return;
    arena_release(&r->arena);
    free(r->arena.block);
    free(r->buf);
    free(r);
}

/* Checks the preamble of the frame at rpos once its 16 bytes are buffered.
 * Returns 1 (and sets head_total) when it passed, 0 while fewer than 16
 * bytes are buffered, or GIFT_EBADMAGIC, GIFT_EHDRSIZE or GIFT_EFRAMESIZE,
 * which becomes the reader's sticky error. Nothing past the preamble is
 * looked at, so this runs before the rest of the frame is buffered. */
static int reader_head(gift_reader_t *r)
{
    const uint8_t *p;
    uint32_t hlen;
    uint64_t plen;
    int rc;

    if (r->head_total != 0)
        return 1;
    if (r->wpos - r->rpos < GIFT_PREAMBLE_BYTES)
        return 0;
    p = r->buf + r->rpos;
    hlen = get_le32(p + 4);
    plen = get_le64(p + 8);
    if (memcmp(p, GIFT_FRAME_MAGIC, 4) != 0) {
        rc = GIFT_EBADMAGIC;
        goto fail;
    }
    if (hlen == 0 || hlen > r->max_header) {
        rc = GIFT_EHDRSIZE;
        goto fail;
    }
    if (plen > r->max_frame) {
        rc = GIFT_EFRAMESIZE;
        goto fail;
    }
    if (plen > 0 && r->frames < r->handshake) {
        rc = GIFT_EPROTO; /* a payload where the handshake allows none */
        goto fail;
    }
    r->head_total = GIFT_PREAMBLE_BYTES + (size_t)hlen + (size_t)plen;
    return 1;

fail:
    r->err = rc;
    return rc;
}

/* Makes at least want bytes free after wpos. Compacts first when that is
 * enough; otherwise grows the buffer to at least need_cap (>= buffered +
 * want), doubling when that is more, never above limit (>= need_cap).
 * Invalidates pointers into the buffer. Returns 0 or GIFT_ENOMEM (the
 * buffer then holds the same bytes, perhaps compacted). */
static int reader_space(gift_reader_t *r, size_t want, size_t need_cap, size_t limit)
{
    size_t used = r->wpos - r->rpos, ncap;
    uint8_t *nbuf;

    if (used == 0)
        r->rpos = r->wpos = 0;
    if (r->cap - r->wpos >= want)
        return 0;
    if (r->rpos > 0) {
        memmove(r->buf, r->buf + r->rpos, used);
        r->rpos = 0;
        r->wpos = used;
        if (r->cap - r->wpos >= want)
            return 0;
    }
    ncap = r->cap <= limit / 2 ? 2 * r->cap : limit;
    if (ncap < need_cap)
        ncap = need_cap;
    if ((nbuf = realloc(r->buf, ncap)) == NULL)
        return GIFT_ENOMEM;
    r->allocs++;
    r->buf = nbuf;
    r->cap = ncap;
    return 0;
}

/* The zero-copy path has the caller's read size in want (libuv suggests
 * 64 KiB), which is a wish, so "room" in the contract is:
 * - on the first call, max(want, GIFT__READER_MIN_CAP) bytes are allocated;
 * - while the frame at the front has passed its preamble check but is
 *   incomplete, at least min(want, rest of that frame) bytes are free; when
 *   that needs a growth, the buffer grows to hold the whole frame (one
 *   allocation) and no more;
 * - while fewer than 16 bytes of the next frame are buffered, the current
 *   buffer is reused (compacted when need be), never grown;
 * - when complete frames fill the buffer (the caller did not take them),
 *   it grows for want, up to 16 + max_header_bytes + max_frame_bytes, and
 *   *avail is 0 once it holds that much.
 * A buffered preamble that fails its check is reported here already. */
int gift_reader_reserve(gift_reader_t *r, size_t want, uint8_t **ptr, size_t *avail)
{
    size_t used = r->wpos - r->rpos, limit, need_cap, min_cap;
    int rc;

    if (r->err != 0)
        return r->err;
    r->reserved_sink = 0;
    if (r->sink != NULL && r->sink_got < r->sink_len) {
        size_t left = r->sink_len - r->sink_got;
        r->reserved_sink = 1;
        if (!r->sink_drop) {
            *ptr = r->sink + r->sink_got;
            *avail = left;
            return 0;
        }
        /* Dropped: read into the free tail of buf, which commit leaves free. */
        if ((rc = reader_space(r, 1, r->cap > GIFT__READER_MIN_CAP ? r->cap : GIFT__READER_MIN_CAP,
                               r->max_cap)) < 0)
            return rc;
        *ptr = r->buf + r->wpos;
        *avail = r->cap - r->wpos < left ? r->cap - r->wpos : left;
        return 0;
    }
    if ((rc = reader_head(r)) < 0)
        return rc;
    limit = r->cap > r->max_cap ? r->cap : r->max_cap;
    min_cap = GIFT__READER_MIN_CAP < limit ? GIFT__READER_MIN_CAP : limit;
    if (want == 0)
        want = 1;
    if (rc == 1 && used < r->head_total) {
        if (want > r->head_total - used)
            want = r->head_total - used;
        need_cap = r->head_total;
    } else if (rc == 0 && r->cap > 0) {
        if (want > r->cap - used)
            want = r->cap - used; /* >= 1: cap >= min_cap > 16 > used */
        need_cap = r->cap;
    } else {
        if (want > limit - used)
            want = limit - used;
        need_cap = used + want;
    }
    if (need_cap < min_cap)
        need_cap = min_cap;
    if ((rc = reader_space(r, want, need_cap, limit)) < 0)
        return rc;
    *ptr = r->buf + r->wpos;
    *avail = r->cap - r->wpos;
    return 0;
}

void gift_reader_commit(gift_reader_t *r, size_t n)
{
    if (r->reserved_sink) {
        assert(n <= r->sink_len - r->sink_got);
        r->sink_got += n;
        r->reserved_sink = 0;
        return;
    }
    assert(n <= r->cap - r->wpos);
    r->wpos += n;
}

/* Unpacks the header of the frame at p (hlen bytes after its preamble) into
 * the arena. GIFT_ENOMEM is not sticky (the frame stays buffered for a
 * retry); a header that does not unpack, or names no message, is the
 * stream's sticky GIFT_EBADHEADER. */
static int unpack_head(gift_reader_t *r, const uint8_t *p, uint32_t hlen, Gift__Envelope **out)
{
    Gift__Envelope *env;
    arena_reset(&r->arena);
    env = gift__envelope__unpack(&r->arena.pa, hlen, p + GIFT_PREAMBLE_BYTES);
    if (env == NULL && r->arena.oom)
        return GIFT_ENOMEM;
    if (env == NULL || env->msg_case == GIFT__ENVELOPE__MSG__NOT_SET) {
        r->err = GIFT_EBADHEADER;
        return r->err;
    }
    *out = env;
    return 0;
}

int gift_reader_peek(gift_reader_t *r, gift_frame_t *f)
{
    const uint8_t *p;
    Gift__Envelope *env;
    uint32_t hlen;
    int rc;

    if (r->err != 0)
        return r->err;
    if (r->peeked || r->sink != NULL)
        return 0;
    if ((rc = reader_head(r)) <= 0)
        return rc;
    p = r->buf + r->rpos;
    hlen = get_le32(p + 4);
    if (r->wpos - r->rpos < GIFT_PREAMBLE_BYTES + (size_t)hlen ||
        r->wpos - r->rpos >= r->head_total)
        return 0; /* the header is not in yet, or the frame is complete */
    if ((rc = unpack_head(r, p, hlen, &env)) < 0)
        return rc;
    r->peeked = 1;
    r->peek_env = env;
    f->env = env;
    f->header_len = hlen;
    f->payload_len = r->head_total - GIFT_PREAMBLE_BYTES - hlen;
    f->payload = NULL;
    return 1;
}

int gift_reader_sink(gift_reader_t *r, void *dst)
{
    size_t hh, have;
    if (!r->peeked || r->sink != NULL || dst == NULL || r->err != 0)
        return GIFT_EINVAL;
    hh = GIFT_PREAMBLE_BYTES + get_le32(r->buf + r->rpos + 4);
    have = r->wpos - r->rpos - hh; /* < the payload: the frame is not complete */
    r->sink = dst;
    r->sink_len = r->head_total - hh;
    r->sink_got = have;
    r->sink_drop = 0;
    memcpy(dst, r->buf + r->rpos + hh, have);
    r->wpos = r->rpos + hh;
    return 0;
}

void gift_reader_unsink(gift_reader_t *r)
{
    if (r->sink != NULL)
        r->sink_drop = 1;
}

const void *gift_reader_sinking(const gift_reader_t *r)
{
    return r->sink != NULL && !r->sink_drop ? r->sink : NULL;
}

/* The sunk front frame, complete: its frame (or, dropped, 0 and skipped). */
static int sink_next(gift_reader_t *r, gift_frame_t *f)
{
    size_t hh = GIFT_PREAMBLE_BYTES + get_le32(r->buf + r->rpos + 4);
    int drop = r->sink_drop;
    f->env = r->peek_env;
    f->header_len = (uint32_t)(hh - GIFT_PREAMBLE_BYTES);
    f->payload_len = r->sink_len;
    f->payload = r->sink;
    r->rpos += hh;
    r->head_total = 0;
    r->frames++;
    r->peeked = 0;
    r->peek_env = NULL;
    r->sink = NULL;
    r->sink_len = r->sink_got = 0;
    r->sink_drop = 0;
    return drop ? 0 : 1;
}

/* Takes all len bytes. The buffer grows to hold them (and, once the front
 * frame's preamble has passed, that whole frame), past the usual limit when
 * the caller hands over more than it, so the caller bounds this growth. */
int gift_reader_feed(gift_reader_t *r, const void *buf, size_t len)
{
    size_t used = r->wpos - r->rpos, limit, need_cap, min_cap;
    int rc;

    if (r->err != 0)
        return r->err;
    if (r->sink != NULL)
        return GIFT_EINVAL; /* a sunk payload is read through reserve only */
    if ((rc = reader_head(r)) < 0)
        return rc;
    if (len == 0)
        return 0;
    if (len > SIZE_MAX / 2 - used)
        return GIFT_ENOMEM;
    limit = r->cap > r->max_cap ? r->cap : r->max_cap;
    if (len > limit - used)
        limit = used + len;
    min_cap = GIFT__READER_MIN_CAP < limit ? GIFT__READER_MIN_CAP : limit;
    need_cap = used + len;
    if (rc == 1 && need_cap < r->head_total)
        need_cap = r->head_total;
    if (need_cap < min_cap)
        need_cap = min_cap;
    if ((rc = reader_space(r, len, need_cap, limit)) < 0)
        return rc;
    memcpy(r->buf + r->wpos, buf, len);
    r->wpos += len;
    return 0;
}

int gift_reader_next(gift_reader_t *r, gift_frame_t *f)
{
    const uint8_t *p;
    Gift__Envelope *env;
    uint32_t hlen;
    int rc;

    if (r->err != 0)
        return r->err;
    if (r->sink != NULL) {
        if (r->sink_got < r->sink_len)
            return 0;
        if (sink_next(r, f) == 1)
            return 1;
        /* dropped: on to the next frame */
    }
    if ((rc = reader_head(r)) <= 0)
        return rc;
    if (r->wpos - r->rpos < r->head_total)
        return 0;
    p = r->buf + r->rpos;
    hlen = get_le32(p + 4);
    if (r->peeked) { /* peeked while incomplete, not sunk: its header is unpacked */
        env = r->peek_env;
        r->peeked = 0;
        r->peek_env = NULL;
        goto have_env;
    }
    if ((rc = unpack_head(r, p, hlen, &env)) < 0)
        return rc;
have_env:
    f->env = env;
    f->header_len = (uint32_t)hlen;
    f->payload_len = r->head_total - GIFT_PREAMBLE_BYTES - hlen;
    f->payload = f->payload_len ? p + GIFT_PREAMBLE_BYTES + hlen : NULL;
    r->rpos += r->head_total;
    r->head_total = 0;
    r->frames++;
    return 1;
}

int gift_reader_eof(gift_reader_t *r)
{
    if (r->err == 0 && reader_head(r) >= 0 && (r->wpos != r->rpos || r->sink != NULL))
        r->err = GIFT_ETRUNCATED;
    return r->err;
}

size_t gift_reader_buffered(const gift_reader_t *r)
{
    return r->wpos - r->rpos;
}

size_t gift_reader_missing(const gift_reader_t *r)
{
    size_t used = r->wpos - r->rpos;
    if (r->err == 0 && r->sink != NULL)
        return r->sink_len - r->sink_got;
    return r->err == 0 && r->head_total > used ? r->head_total - used : 0;
}

size_t gift__reader_capacity(const gift_reader_t *r)
{
    return r->cap;
}

uint64_t gift__reader_allocs(const gift_reader_t *r)
{
    return r->allocs;
}

/* ---- writer ---------------------------------------------------------------- */

size_t gift_frame_head_size(const Gift__Envelope *env)
{
    return GIFT_PREAMBLE_BYTES + gift__envelope__get_packed_size(env);
}

long gift_frame_pack_head(const Gift__Envelope *env, uint64_t payload_len, uint8_t *buf, size_t cap)
{
    size_t hlen = gift__envelope__get_packed_size(env), packed;

    if (env->msg_case == GIFT__ENVELOPE__MSG__NOT_SET || hlen == 0 || hlen > UINT32_MAX)
        return GIFT_EINVAL;
    if (cap < GIFT_PREAMBLE_BYTES || cap - GIFT_PREAMBLE_BYTES < hlen)
        return GIFT_ENOSPC;
    memcpy(buf, GIFT_FRAME_MAGIC, 4);
    put_le32(buf + 4, (uint32_t)hlen);
    put_le64(buf + 8, payload_len);
    packed = gift__envelope__pack(env, buf + GIFT_PREAMBLE_BYTES);
    assert(packed == hlen);
    (void)packed;
    return (long)(GIFT_PREAMBLE_BYTES + hlen);
}

const char *gift_msg_name(const Gift__Envelope *env)
{
    if (env == NULL)
        return "none";
    switch (env->msg_case) {
    case GIFT__ENVELOPE__MSG__NOT_SET:
        return "none";
    case GIFT__ENVELOPE__MSG_HELLO:
        return "hello";
    case GIFT__ENVELOPE__MSG_HELLO_ACK:
        return "hello_ack";
    case GIFT__ENVELOPE__MSG_DECLARE:
        return "declare";
    case GIFT__ENVELOPE__MSG_DECLARE_ACK:
        return "declare_ack";
    case GIFT__ENVELOPE__MSG_PUSH:
        return "push";
    case GIFT__ENVELOPE__MSG_PUSH_ACK:
        return "push_ack";
    case GIFT__ENVELOPE__MSG_PULL:
        return "pull";
    case GIFT__ENVELOPE__MSG_PULL_REPLY:
        return "pull_reply";
    case GIFT__ENVELOPE__MSG_SKETCH:
        return "sketch";
    case GIFT__ENVELOPE__MSG_SKETCH_ACK:
        return "sketch_ack";
    case GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST:
        return "geometry_request";
    case GIFT__ENVELOPE__MSG_GEOMETRY:
        return "geometry";
    case GIFT__ENVELOPE__MSG_ERROR:
        return "error";
    case GIFT__ENVELOPE__MSG_STATS_REQUEST:
        return "stats_request";
    case GIFT__ENVELOPE__MSG_STATS:
        return "stats";
    case GIFT__ENVELOPE__MSG_AUTH_CHALLENGE:
        return "auth_challenge";
    case GIFT__ENVELOPE__MSG_RESET:
        return "reset";
    case GIFT__ENVELOPE__MSG_RESET_ACK:
        return "reset_ack";
    default:
        return "unknown";
    }
}
