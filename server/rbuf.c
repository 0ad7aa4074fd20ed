/*
 * rbuf.c: the reference-counted buffers of rbuf.h.
 */
#include <stdlib.h>
#include <string.h>

#include "rbuf.h"

gift_rbuf_t *gift_rbuf_new(size_t cap)
{
    gift_rbuf_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return NULL;
    /* 64-byte alignment keeps payload sections aligned for SIMD decode. */
    if (posix_memalign((void **)&b->data, 64, cap ? cap : 64) != 0) {
        free(b);
        return NULL;
    }
    memset(b->data, 0, cap ? cap : 64);
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
    free(b->data);
    free(b);
}
