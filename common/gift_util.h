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

/* Frames at least this far from complete make a TCP reader wait for more of
 * them (gift_sock_rcvlowat), up to GIFT_RCVLOWAT_MAX bytes at a time. */
#define GIFT_RCVLOWAT_MIN (128u * 1024u)
#define GIFT_RCVLOWAT_MAX (1024u * 1024u)

/* Sets the TCP socket fd's receive low-water mark (SO_RCVLOWAT) for a frame
 * with `missing` bytes still to come (gift_reader_missing): min(missing,
 * GIFT_RCVLOWAT_MAX) when missing >= GIFT_RCVLOWAT_MIN, else 1 (the
 * default), so that the kernel wakes the reader, and the sender's softirq
 * calls into the reader's wait queue, once per large piece of a big frame
 * instead of once per loopback segment (64 KiB). Never above what the
 * frame still needs, so a peer that sends whole frames is never waited for;
 * a peer that closes early still wakes the reader (end of stream is always
 * readable). Linux raises the socket's receive buffer to hold the mark if it
 * must (tcp_set_rcvlowat).
 * *cur holds the value set last (0: never set); no system call when it does
 * not change. Best effort: a failed setsockopt leaves the old mark and
 * returns -errno. */
int gift_sock_rcvlowat(int fd, size_t missing, int *cur);

#endif
