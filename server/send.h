/*
 * send.h: the frames a shard sends to a peer (send.c), through the io table
 * of shard.h. Each packs a header (preamble + protobuf) into the shard's
 * head buffer, or a malloc'd one when it does not fit, and queues it with
 * its payload; io->send copies the header and takes its own reference on a
 * payload buffer. Counters of frames, bytes and errors are kept here.
 */
#ifndef GIFT_SEND_H
#define GIFT_SEND_H

#include <stdarg.h>

#include "shard_state.h"

/* Counts an error code sent or met (s->c.errors by -code, 0..31). */
void gift__count_error(gift_shard_t *s, int code);

/* Packs env, announcing len payload bytes, and sends it with buf's bytes
 * [off, off + len) (buf may be NULL with len 0). Returns 0, GIFT_ENOMEM, or
 * io->send's code (nothing was queued). */
int gift__send_frame(gift_shard_t *s, gift_peer_t *p, Gift__Envelope *env, gift_rbuf_t *buf,
                     size_t off, size_t len);

/* Sends an Error frame of code with the text fmt makes, naming key, chunk,
 * step and the request's seq, and logs it; with fatal set the peer is also
 * marked closing and io->close is called (once). */
void gift__send_verror(gift_shard_t *s, gift_peer_t *p, int code, int fatal, uint32_t key,
                       uint32_t chunk, uint64_t step, uint64_t seq, const char *fmt, va_list ap);

/* The same with the text's arguments. */
void gift__send_error(gift_shard_t *s, gift_peer_t *p, int code, int fatal, uint32_t key,
                      uint32_t chunk, uint64_t step, uint64_t seq, const char *fmt, ...);

/* Answers a pull of ch with the finished step r (its shared reply buffer,
 * or an Error when the step could not be encoded). */
void gift__send_reply(gift_shard_t *s, gift_peer_t *p, const chunk_t *ch, const reply_t *r,
                      uint64_t seq);

/* Sends t's newest published geometry (the owner's payload buffer). */
void gift__send_geometry(gift_shard_t *s, gift_peer_t *p, const tensor_t *t, uint64_t seq);

#endif
