/*
 * gift_proto_internal.h: what proto/ shares with its own tests and nothing
 * else. Not installed; callers outside proto/ and tests/proto/ must not use it.
 */
#ifndef GIFT_PROTO_INTERNAL_H
#define GIFT_PROTO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gift_proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Smallest buffer a reader allocates (when limits allow it). */
#define GIFT__READER_MIN_CAP 4096u
/* Size of the header arena a reader allocates when it is created. */
#define GIFT__ARENA_MIN 4096u

/* Bytes currently allocated for the reader's input buffer. */
size_t gift__reader_capacity(const gift_reader_t *r);

/* How many times the reader has called malloc or realloc since it was
 * created (its buffer, its header arena and the arena's oversize blocks). */
uint64_t gift__reader_allocs(const gift_reader_t *r);

#ifdef __cplusplus
}
#endif
#endif
