/*
 * gift_util.h: small helpers every library may use.
 */
#ifndef GIFT_UTIL_H
#define GIFT_UTIL_H

#include <stddef.h>

/* Grows the array *p (of *cap elements of elem bytes) to hold at least need
 * elements, doubling from 16; keeps its contents. Returns 0, or GIFT_ENOMEM
 * with *p and *cap unchanged. Used for buffers that are reused, so they
 * settle at their largest size and stop allocating. */
int gift_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
