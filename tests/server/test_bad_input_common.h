/*
 * test_bad_input_common.h: what test_bad_input.c and test_auth.c share: a
 * real giftd (GIFTD_BIN) started on 127.0.0.1 with --port 0 --http-port 0
 * by tests/common/gift_test_daemon.h (its ready line read from a pipe, its
 * stderr in a file under $TMPDIR, PR_SET_PDEATHSIG so that a failing test
 * leaves nothing behind), and a raw client over blocking sockets with
 * SO_RCVTIMEO/SO_SNDTIMEO: frames packed with gift_frame_pack_head, received
 * through a gift_reader_t, including the authentication handshake of
 * gift.proto done by hand.
 */
#ifndef TEST_BAD_INPUT_COMMON_H
#define TEST_BAD_INPUT_COMMON_H

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gift_auth.h"
#include "gift_error.h"
#include "gift_proto.h"
#include "gift_test_daemon.h"
#include "gift_test_keyfile.h"
#include "gift_test_time.h"

#define IO_TIMEOUT_MS 5000
#define STOP_TIMEOUT_MS 15000

/* Starts giftd (gift_test_daemon.h) with the common flags plus extra
 * (NULL-terminated). With expect_ready, reads its ready line and fails the
 * test without one; otherwise returns 0 when the ready line came, or the
 * exit status (> 0) when giftd exited first. */
static inline int daemon_start_ex(const char *const *extra, int expect_ready)
{
    static const daemon_opts_t opts = {.log_prefix = "giftd-sec-"};
    return daemon_start_opts(&opts, extra, expect_ready);
}

static inline void daemon_start(const char *const *extra)
{
    daemon_start_ex(extra, 1);
}

/* SIGTERM; the exit status must be 0 and the log clean. */
static inline void daemon_stop(void)
{
    daemon_stop_ms(STOP_TIMEOUT_MS);
}

static inline void daemon_teardown(void)
{
    daemon_teardown_ms(STOP_TIMEOUT_MS);
}

/* ------------------------------------------------------------------ */
/* Raw client                                                            */
/* ------------------------------------------------------------------ */

typedef struct raw {
    int fd;
    gift_reader_t *r;
    gift_frame_t f; /* the last frame received */
} raw_t;

static inline int tcp_connect_to(int port, int timeout_ms)
{
    struct sockaddr_in a;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline void raw_open(raw_t *c)
{
    memset(c, 0, sizeof *c);
    c->fd = tcp_connect_to(D.port, IO_TIMEOUT_MS);
    ck_assert_msg(c->fd >= 0, "connect to giftd port %d: %s", D.port, strerror(errno));
    c->r = gift_reader_new(NULL);
    ck_assert_msg(c->r != NULL, "gift_reader_new");
}

static inline void raw_close(raw_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    gift_reader_free(c->r);
    c->r = NULL;
}

/* Sends len bytes; returns 0 or -errno (the server may have closed). */
static inline int raw_send_bytes(raw_t *c, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static inline int raw_send(raw_t *c, const Gift__Envelope *env, const void *payload, size_t len)
{
    uint8_t head[8192];
    long n = gift_frame_pack_head(env, len, head, sizeof head);
    int rc;
    ck_assert_msg(n > 0, "pack %s: %ld", gift_msg_name(env), n);
    if ((rc = raw_send_bytes(c, head, (size_t)n)) < 0)
        return rc;
    return len ? raw_send_bytes(c, payload, len) : 0;
}

/* Receives one frame into c->f: 1, 0 at EOF (or a reset), GIFT_ETIMEDOUT,
 * or the reader's error. */
static inline int raw_recv(raw_t *c)
{
    for (;;) {
        uint8_t buf[65536];
        ssize_t n;
        int rc = gift_reader_next(c->r, &c->f);
        if (rc != 0)
            return rc;
        n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return GIFT_ETIMEDOUT;
        if (n <= 0)
            return 0;
        if ((rc = gift_reader_feed(c->r, buf, (size_t)n)) < 0)
            return rc;
    }
}

static inline const char *raw_desc(raw_t *c, int rc)
{
    static char buf[512];
    if (rc == 1 && c->f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR)
        snprintf(buf, sizeof buf, "error %d (%s)", c->f.env->error->code, c->f.env->error->text);
    else if (rc == 1)
        snprintf(buf, sizeof buf, "%s", gift_msg_name(c->f.env));
    else
        snprintf(buf, sizeof buf, "%s", rc == 0 ? "end of stream" : gift_strerror(rc));
    return buf;
}

/* The next frame must be msg. */
static inline const gift_frame_t *raw_expect(raw_t *c, Gift__Envelope__MsgCase msg,
                                             const char *what)
{
    int rc = raw_recv(c);
    ck_assert_msg(rc == 1 && c->f.env->msg_case == msg, "%s: expected message %d, got %s", what,
                  (int)msg, raw_desc(c, rc));
    return &c->f;
}

/* The peer closes: EOF (or a reset) within the timeout, no more frames. */
static inline void raw_expect_eof(raw_t *c, const char *what)
{
    int rc = raw_recv(c);
    ck_assert_msg(rc == 0, "%s: expected the shard to close, got %s", what, raw_desc(c, rc));
}

/* The next frame is Error{code, fatal} (in c->f); the close that follows a
 * fatal one is left to the caller. */
static inline void raw_expect_error_frame(raw_t *c, int code, int fatal, const char *what)
{
    int rc = raw_recv(c);
    ck_assert_msg(rc == 1 && c->f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR &&
                      c->f.env->error->code == code && c->f.env->error->fatal == (fatal != 0),
                  "%s: expected error %d (%s)%s, got %s", what, code, gift_strerror(code),
                  fatal ? " fatal" : "", raw_desc(c, rc));
}

/* The next frame is Error{code, fatal}; a fatal one is followed by EOF. */
static inline void raw_expect_error(raw_t *c, int code, int fatal, const char *what)
{
    raw_expect_error_frame(c, code, fatal, what);
    if (fatal)
        raw_expect_eof(c, what);
}

/* The resume_step raw_send_hello and raw_hello_mac put in the Hello (0). */
static uint64_t raw_resume_step;

static inline void raw_send_hello(raw_t *c, uint32_t rank, uint32_t world, const uint8_t *cnonce,
                                  const uint8_t *mac)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = rank;
    h.world_size = world;
    h.resume_step = raw_resume_step;
    h.client_name = (char *)"raw-test";
    if (cnonce) {
        h.client_nonce.data = (uint8_t *)cnonce;
        h.client_nonce.len = GIFT_AUTH_NONCE_BYTES;
    }
    if (mac) {
        h.auth_mac.data = (uint8_t *)mac;
        h.auth_mac.len = GIFT_AUTH_MAC_BYTES;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    ck_assert_msg(raw_send(c, &env, NULL, 0) == 0, "send hello: %s", strerror(errno));
}

/* The MAC of the Hello raw_send_hello builds. */
static inline void raw_hello_mac(const gift_auth_key_t *key, const uint8_t *snonce, uint32_t rank,
                                 uint32_t world, const uint8_t *cnonce, uint8_t *mac)
{
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = rank;
    h.world_size = world;
    h.resume_step = raw_resume_step;
    h.client_nonce.data = (uint8_t *)cnonce;
    h.client_nonce.len = GIFT_AUTH_NONCE_BYTES;
    gift_auth_hello_mac(key, snonce, &h, mac);
}

/* Hello without authentication; expects HelloAck. */
static inline void raw_hello(raw_t *c, uint32_t rank, uint32_t world)
{
    raw_send_hello(c, rank, world, NULL, NULL);
    raw_expect(c, GIFT__ENVELOPE__MSG_HELLO_ACK, "hello");
}

/* The whole authenticated handshake with key; expects HelloAck and checks
 * the shard's MAC. */
static inline void raw_hello_auth(raw_t *c, const gift_auth_key_t *key, uint32_t rank,
                                  uint32_t world)
{
    uint8_t cn[GIFT_AUTH_NONCE_BYTES], sn[GIFT_AUTH_NONCE_BYTES], mac[GIFT_AUTH_MAC_BYTES],
        want[GIFT_AUTH_MAC_BYTES];
    const gift_frame_t *f;
    ck_assert(gift_auth_nonce(cn) == 0);
    raw_send_hello(c, rank, world, cn, NULL);
    f = raw_expect(c, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "first hello");
    ck_assert_msg(f->env->auth_challenge->server_nonce.len == GIFT_AUTH_NONCE_BYTES,
                  "server nonce of %zu bytes", f->env->auth_challenge->server_nonce.len);
    memcpy(sn, f->env->auth_challenge->server_nonce.data, sizeof sn);
    raw_hello_mac(key, sn, rank, world, cn, mac);
    raw_send_hello(c, rank, world, cn, mac);
    f = raw_expect(c, GIFT__ENVELOPE__MSG_HELLO_ACK, "authenticated hello");
    gift_auth_ack_mac(key, rank, sn, cn, mac, want);
    ck_assert_msg(gift_auth_verify(f->env->hello_ack->auth_mac.data,
                                   f->env->hello_ack->auth_mac.len, want) == 0,
                  "the HelloAck's MAC (%zu bytes) does not prove the key",
                  f->env->hello_ack->auth_mac.len);
}

/* Stats round trip: the connection works. */
static inline const Gift__Stats *raw_stats(raw_t *c)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest m = GIFT__STATS_REQUEST__INIT;
    m.seq = 77;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &m;
    ck_assert_msg(raw_send(c, &env, NULL, 0) == 0, "send stats request");
    return raw_expect(c, GIFT__ENVELOPE__MSG_STATS, "stats")->env->stats;
}

#endif
