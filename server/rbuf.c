/*
 * rbuf.c: the reference-counted buffers of rbuf.h.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rbuf.h"

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
