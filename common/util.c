/* util.c: see gift_util.h. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "gift_error.h"
#include "gift_util.h"

int gift_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t ncap = *cap ? *cap : 16;
    void *np;
    if (need <= *cap)
        return 0;
    while (ncap < need)
        ncap *= 2;
    if ((np = realloc(*p, ncap * elem)) == NULL)
        return GIFT_ENOMEM;
    *p = np;
    *cap = ncap;
    return 0;
}

int gift_sock_rcvlowat(int fd, size_t missing, int *cur)
{
    int want = 1;
    if (missing >= GIFT_RCVLOWAT_MIN)
        want = (int)(missing < GIFT_RCVLOWAT_MAX ? missing : GIFT_RCVLOWAT_MAX);
    if (want == *cur)
        return 0;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) < 0)
        return -errno;
    *cur = want;
    return 0;
}
