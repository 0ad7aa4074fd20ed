/*
 * rbuf.h: reference-counted byte buffers. A step's encoded mean is one
 * buffer shared by every pull of the step and by the writes that carry it;
 * a published geometry basis likewise. No sockets, no shard state.
 */
#ifndef GIFT_RBUF_H
#define GIFT_RBUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A reference-counted byte buffer: reply payloads shared by every pull of a
 * step and by the writes that carry them. */
typedef struct gift_rbuf {
    uint32_t refs;
    size_t len; /* bytes in use */
    size_t cap;
    uint8_t *data;
} gift_rbuf_t;

/* Allocates a buffer of cap bytes with one reference. NULL when out of memory. */
gift_rbuf_t *gift_rbuf_new(size_t cap);
void gift_rbuf_ref(gift_rbuf_t *b);
/* Drops a reference; frees the buffer with the last one. NULL is allowed. */
void gift_rbuf_unref(gift_rbuf_t *b);

#ifdef __cplusplus
}
#endif
#endif
