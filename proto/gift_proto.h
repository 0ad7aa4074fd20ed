/*
 * gift_proto.h: giftd's framing. No I/O: the writer packs a preamble and a
 * header into a caller's buffer; the reader takes bytes in and hands complete
 * frames out (hiredis's redisReaderFeed / redisReaderGetReply model).
 *
 * Frame = 16-byte preamble {magic "GIF1", u32 header_len, u64 payload_len},
 * all little-endian, then header_len bytes of a packed Gift__Envelope
 * (proto/gift.proto), then payload_len bytes of raw payload.
 *
 * Both lengths are checked against the reader's limits before any byte of
 * the frame is buffered beyond the preamble, so a peer cannot make the
 * reader allocate more than 16 + max_header_bytes + max_frame_bytes (nor
 * more than 16 + max_header_bytes during the handshake_frames first frames).
 */
#ifndef GIFT_PROTO_H
#define GIFT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "gift.pb-c.h"
#include "gift_error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GIFT_PROTOCOL_VERSION 1
#define GIFT_FRAME_MAGIC "GIF1"
#define GIFT_PREAMBLE_BYTES 16
#define GIFT_MAX_HEADER_DEFAULT (64u * 1024u)          /* bytes */
#define GIFT_MAX_FRAME_DEFAULT (64ull * 1024u * 1024u) /* payload bytes */

typedef struct gift_limits {
    uint32_t max_header_bytes; /* 0: GIFT_MAX_HEADER_DEFAULT */
    uint64_t max_frame_bytes;  /* largest payload; 0: GIFT_MAX_FRAME_DEFAULT */
    /* The first handshake_frames frames of the stream must carry no payload
     * (0: no such rule). Every handshake frame (Hello, AuthChallenge,
     * HelloAck, the second Hello of authentication) is payload-free, so a
     * server that reads with 2 here (1 without authentication) cannot be made
     * to buffer a payload by a peer that has not authenticated: a preamble
     * announcing one is refused with GIFT_EPROTO before anything of it is
     * buffered. */
    uint32_t handshake_frames;
} gift_limits_t;

/* One decoded frame. env and payload point into the reader (payload: or
 * into the caller's sink, gift_reader_sink) and stay valid until the next
 * gift_reader_next, gift_reader_peek, gift_reader_reserve, gift_reader_feed
 * or gift_reader_free on the same reader. */
typedef struct gift_frame {
    Gift__Envelope *env;    /* the header; env->msg_case says which message */
    uint32_t header_len;    /* bytes of the packed header on the wire */
    const uint8_t *payload; /* payload_len bytes (NULL when 0) */
    uint64_t payload_len;
} gift_frame_t;

typedef struct gift_reader gift_reader_t;

/* Creates a reader with the given limits (NULL: defaults). Returns NULL when
 * out of memory. The reader's buffer grows to the largest frame seen and is
 * then reused; header unpacking uses an arena reset per frame. */
gift_reader_t *gift_reader_new(const gift_limits_t *lim);
void gift_reader_free(gift_reader_t *r);

/* Zero-copy input: returns in *ptr a region of at least min(want, room)
 * bytes, in *avail its size, to read socket bytes into; then call
 * gift_reader_commit with the count actually written. Returns 0, GIFT_ENOMEM,
 * or the reader's sticky error. A preamble already buffered is checked here,
 * so GIFT_EBADMAGIC, GIFT_EHDRSIZE or GIFT_EFRAMESIZE (sticky) can first
 * show up from reserve or feed. */
int gift_reader_reserve(gift_reader_t *r, size_t want, uint8_t **ptr, size_t *avail);
void gift_reader_commit(gift_reader_t *r, size_t n);

/* Copying input: appends all len bytes. Returns 0, GIFT_ENOMEM or the sticky error. */
int gift_reader_feed(gift_reader_t *r, const void *buf, size_t len);

/* Takes the next complete frame. Returns 1 and fills *f when a frame is
 * ready; 0 when more bytes are needed; a negative code when the stream is
 * broken: GIFT_EBADMAGIC, GIFT_EHDRSIZE, GIFT_EFRAMESIZE, GIFT_EBADHEADER,
 * GIFT_EPROTO (a payload in a handshake frame).
 * Errors are sticky: after one, every call returns it again. GIFT_ENOMEM
 * (header unpacking ran out of memory) is not: the frame stays buffered. */
int gift_reader_next(gift_reader_t *r, gift_frame_t *f);

/* To be called when the peer has closed its side: GIFT_ETRUNCATED when part
 * of a frame is buffered, else 0 (or the sticky error). */
int gift_reader_eof(gift_reader_t *r);

/* Receiving a payload into the caller's memory (the client's pull replies):
 *
 * gift_reader_peek returns 1 and fills *f (env, header_len, payload_len;
 * payload NULL) once the front frame's preamble and header are buffered
 * while its payload is not complete yet, once per frame; else 0 (a complete
 * frame waits for gift_reader_next, or nothing to peek), or the header's
 * unpacking error (GIFT_EBADHEADER, sticky; GIFT_ENOMEM, not). f->env stays
 * valid until the frame is taken by gift_reader_next.
 *
 * gift_reader_sink(r, dst), right after a peek that returned 1, puts the
 * frame's payload at dst (payload_len bytes, the caller's): the bytes
 * already buffered are copied there now, and reserve hands out the rest of
 * dst to read into. gift_reader_next then returns the frame with payload ==
 * dst. Returns 0, or GIFT_EINVAL when no frame was just peeked.
 *
 * gift_reader_unsink: dst must not be written any more. The rest of the
 * payload is read into the reader's own buffer and dropped, and the frame
 * is skipped (gift_reader_next never returns it). Nothing when not sinking.
 * gift_reader_sinking says whether a sink is active, and where. While a
 * sink is active, bytes go in through reserve/commit only (feed refuses
 * them with GIFT_EINVAL). */
int gift_reader_peek(gift_reader_t *r, gift_frame_t *f);
int gift_reader_sink(gift_reader_t *r, void *dst);
void gift_reader_unsink(gift_reader_t *r);
const void *gift_reader_sinking(const gift_reader_t *r);

/* Bytes buffered and not yet returned as frames. */
size_t gift_reader_buffered(const gift_reader_t *r);

/* Bytes still missing from the frame being read, as gift_reader_next last
 * saw it: 0 before its 16-byte preamble has been seen and once nothing is
 * missing. A socket reader can ask the kernel not to wake it before they
 * have arrived (gift_sock_rcvlowat). */
size_t gift_reader_missing(const gift_reader_t *r);

/* Size of preamble + packed header for env. */
size_t gift_frame_head_size(const Gift__Envelope *env);

/* Packs the preamble (with payload_len) and env into buf (cap bytes).
 * Returns the number of bytes written (gift_frame_head_size(env)) or
 * GIFT_ENOSPC (nothing written), or GIFT_EINVAL when env has no message set.
 * The payload is sent after it by the caller. */
long gift_frame_pack_head(const Gift__Envelope *env, uint64_t payload_len, uint8_t *buf,
                          size_t cap);

/* The cluster digest of a declared tensor list (proto/digest.c): 64-bit
 * FNV-1a over a canonical text of every field, in list order. Workers send it
 * as 8 little-endian bytes (gift_digest_bytes) in Hello and Declare. */
uint64_t gift_digest_tensors(Gift__TensorDecl *const *t, size_t n);
void gift_digest_bytes(uint64_t d, uint8_t out[8]);

/* A short name for the message in env ("push", "pull_reply", ...). */
const char *gift_msg_name(const Gift__Envelope *env);

#ifdef __cplusplus
}
#endif
#endif
