/*
 * gift_test_time.h: monotonic clocks and sleeps for the tests. The includer
 * defines _POSIX_C_SOURCE (or _GNU_SOURCE) before any system header.
 */
#ifndef GIFT_TEST_TIME_H
#define GIFT_TEST_TIME_H

#include <errno.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Sleeps ms milliseconds, resuming after signals. */
static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

#endif
