/*
 * test_util.c: common/util.c. gift_sock_rcvlowat on a real TCP pair on
 * 127.0.0.1: the mark it sets for each size of a missing frame, that the
 * kernel then holds the reader back until that many bytes are in, and that a
 * peer closing early still wakes it (a reader must never wait for bytes that
 * will not come).
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gift_test_check.h"
#include "gift_util.h"

static int rx = -1, tx = -1; /* the reading and the sending end */

static void setup(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_msg(l >= 0, "socket: %s", strerror(errno));
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(bind(l, (struct sockaddr *)&a, sizeof a) == 0, "bind: %s", strerror(errno));
    ck_assert_msg(listen(l, 1) == 0, "listen: %s", strerror(errno));
    ck_assert_int_eq(getsockname(l, (struct sockaddr *)&a, &len), 0);
    tx = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_msg(connect(tx, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
                  strerror(errno));
    rx = accept(l, NULL, NULL);
    ck_assert_msg(rx >= 0, "accept: %s", strerror(errno));
    close(l);
}

static void teardown(void)
{
    close(rx);
    close(tx);
    rx = tx = -1;
}

static int mark(int fd)
{
    int v = -1;
    socklen_t len = sizeof v;
    ck_assert_int_eq(getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &len), 0);
    return v;
}

/* 1 when rx polls readable within ms. */
static int readable(int ms)
{
    struct pollfd p = {.fd = rx, .events = POLLIN};
    int rc = poll(&p, 1, ms);
    ck_assert_msg(rc >= 0, "poll: %s", strerror(errno));
    return rc == 1 && (p.revents & (POLLIN | POLLHUP)) != 0;
}

static void send_all(size_t n)
{
    static char buf[64 * 1024];
    while (n > 0) {
        ssize_t k = send(tx, buf, n < sizeof buf ? n : sizeof buf, 0);
        ck_assert_msg(k > 0, "send: %s", strerror(errno));
        n -= (size_t)k;
    }
}

START_TEST(test_marks)
{
    static const struct {
        size_t missing;
        int want;
    } cases[] = {
        {0, 1},
        {1000, 1},
        {GIFT_RCVLOWAT_MIN - 1, 1},
        {GIFT_RCVLOWAT_MIN, (int)GIFT_RCVLOWAT_MIN},
        {300000, 300000},
        {GIFT_RCVLOWAT_MAX, (int)GIFT_RCVLOWAT_MAX},
        {5u << 20, (int)GIFT_RCVLOWAT_MAX},
        {17, 1},
    };
    int cur = 0;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = gift_sock_rcvlowat(rx, cases[i].missing, &cur);
        ck_assert_msg(rc == 0, "missing %zu: rc %d", cases[i].missing, rc);
        ck_assert_msg(cur == cases[i].want && mark(rx) == cases[i].want,
                      "missing %zu: cur %d, socket %d, want %d", cases[i].missing, cur, mark(rx),
                      cases[i].want);
    }
    /* A failed call keeps what it knew. */
    cur = 300000;
    ck_assert_int_eq(gift_sock_rcvlowat(-1, 1, &cur), -EBADF);
    ck_assert_int_eq(cur, 300000);
}
END_TEST

/* Sets the mark for a frame missing `missing` bytes, sends `sent` of them
 * (fewer) and checks that rx is held back; returns the mark. */
static int hold(size_t missing, size_t sent)
{
    int cur = 0;

    ck_assert_int_eq(gift_sock_rcvlowat(rx, missing, &cur), 0);
    send_all(sent);
    ck_assert_msg(!readable(200), "readable with %zu of %zu bytes in", sent, missing);
    return cur;
}

START_TEST(test_holds_until_in)
{
    int cur = hold(300000, 100000);

    send_all(200000);
    ck_assert_msg(readable(5000), "not readable with all 300000 bytes in");
    /* Back to the default: readable with a byte. */
    ck_assert_int_eq(gift_sock_rcvlowat(rx, 0, &cur), 0);
    ck_assert_int_eq(cur, 1);
    ck_assert_msg(readable(0), "not readable at mark 1 with bytes queued");
}
END_TEST

START_TEST(test_peer_close_wakes)
{
    hold(300000, 1000);
    ck_assert_int_eq(shutdown(tx, SHUT_WR), 0);
    ck_assert_msg(readable(5000), "a peer that closed with 1000 of 300000 bytes sent: not woken");
}
END_TEST

static Suite *util_suite(void)
{
    Suite *s = suite_create("common_util");
    TCase *tc = tcase_create("rcvlowat");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_marks);
    tcase_add_test(tc, test_holds_until_in);
    tcase_add_test(tc, test_peer_close_wakes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return gift_test_run(util_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
