/*
 * net.c: the only file of giftd that knows libuv. Listeners, connections,
 * the write queue with its back-pressure, the HTTP listener and signals.
 *
 * Connections: bytes are read straight into the connection's frame reader
 * (zero copy), complete frames go to the shard. Output frames are queued as
 * (head bytes, payload slice of a reference-counted buffer) pairs; one
 * uv_write is in flight per connection and carries everything queued so
 * far. The queue's arrays are reused, so steady state allocates nothing.
 * Past write_queue_bytes queued, the connection is not read until the queue
 * drains below half of it: a slow reader cannot make the shard grow.
 *
 * A connection is never freed inside its own callbacks: closing marks it,
 * and the close callback frees it (the Redis/libuv model).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "gift_batch.h"
#include "gift_util.h"
#include "log.h"
#include "server.h"

#define HTTP_MAX_REQUEST 8192
#define HTTP_MAX_CONNS_DEFAULT 16
#define HTTP_TIMEOUT_MS_DEFAULT 2000
#define HANDSHAKE_S_DEFAULT 10
#define READ_S_DEFAULT 60
#define IDLE_S_DEFAULT 300
#define BUFFER_BYTES_DEFAULT (1ull << 30)
/* Queued output of a connection that is not a rank's (a StatsRequest
 * answer is a few KiB): past it that connection is not read. */
#define NONRANK_QUEUE_BYTES (1ull << 20)
/* Connections past max_connections kept while the ones closed to make room
 * finish closing. */
#define CONN_SLACK 64

/* One batch of queued frames (gift_batch.h: heads packed in one buffer,
 * payloads referenced; a frame's ref is its gift_rbuf_t), and the uv_buf_t
 * array of its write. */
typedef struct out_batch {
    gift_batch_t b;
    uv_buf_t *bufs;
    size_t bufs_cap;
} out_batch_t;

typedef struct conn {
    uv_tcp_t tcp;
    uv_write_t wreq;
    struct gift_server *srv;
    uint64_t id;
    gift_reader_t *reader;
    gift_peer_t *peer;
    out_batch_t q[2]; /* q[cur] collects, q[!cur] is in flight */
    int cur;
    int writing;
    int reading;
    int closing;
    int in_list;
    uint64_t t_accept; /* uv_now at accept: the Hello must follow within handshake_timeout */
    uint64_t t_read;   /* uv_now at the last bytes read */
    uint64_t t_frame;  /* uv_now when the frame being read began (0: none) */
    uint64_t held_in;  /* bytes of the frame being read, counted in srv->held_in */
    int expired;       /* refused for a timeout; closing */
    int rcvlowat;      /* SO_RCVLOWAT set last (gift_sock_rcvlowat), 0: none */
    struct conn *next, *prev;
} conn_t;

/* A connection that has not completed its Hello (and the authentication, when
 * auth_key_file is set) handshake_timeout after accept is refused with
 * GIFT_ETIMEDOUT and closed, so silent connections cannot hold the
 * max_connections slots. Workers say Hello at once. After the Hello, a frame
 * must arrive whole within read_timeout of its first byte (a peer writing a
 * byte a second is closed), and a connection that is not a rank's one live
 * connection is closed after idle_timeout without a byte. A rank's connection
 * is never closed for idleness (a worker may wait long for a slow step, and
 * there is one per rank) nor to make room: when max_connections are open, a
 * new one closes the oldest connection that is not a rank's, so a worker
 * can always reconnect. */

typedef struct http_conn {
    uv_tcp_t tcp;
    uv_write_t wreq;
    uv_timer_t timer;
    struct gift_server *srv;
    char req[HTTP_MAX_REQUEST];
    size_t len;
    gift_str_t resp;
    int closing;
    int answered; /* the request is complete; the answer is being written */
    int handles;  /* open handles among tcp and timer */
    struct http_conn *next, *prev;
} http_conn_t;

struct gift_server {
    gift_server_opts_t o;
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_tcp_t http;
    int http_on;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t tick;
    uv_check_t flush; /* group commit of the step log, once per loop turn */
    gift_shard_t *shard;
    gift_limits_t limits;
    conn_t *conns;
    uint32_t nconns;
    uint32_t nhttp;
    uint64_t next_id;
    uint64_t held_in, held_out; /* partial frames, queued output: all connections */
    struct http_conn *https;    /* newest first */
    int port, http_port;
    int draining;
    gift_proc_info_t pi;
};

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

/* ------------------------------------------------------------------ */
/* Write queue                                                           */
/* ------------------------------------------------------------------ */

/* A written or dropped frame gives back its payload's reference. */
static void item_release(void *ref, void *arg)
{
    (void)arg;
    gift_rbuf_unref(ref);
}

static void batch_release(gift_server_t *s, out_batch_t *b)
{
    s->held_out -= b->b.bytes;
    gift_batch_release(&b->b, item_release, NULL);
}

static void batch_free(gift_server_t *s, out_batch_t *b)
{
    batch_release(s, b);
    gift_batch_free(&b->b);
    free(b->bufs);
    memset(b, 0, sizeof *b);
}

static uint64_t queued_bytes(const conn_t *c)
{
    return c->q[0].b.bytes + c->q[1].b.bytes;
}

/* Queued output past which a connection is not read: write_queue_bytes for
 * a rank's connection, NONRANK_QUEUE_BYTES (at most) for any other. */
static uint64_t queue_limit(const conn_t *c)
{
    uint64_t q = c->srv->o.write_queue_bytes;
    if (c->peer == NULL || !gift_shard_peer_claimed(c->peer))
        q = q < NONRANK_QUEUE_BYTES ? q : NONRANK_QUEUE_BYTES;
    return q;
}

static int over_budget(const gift_server_t *s)
{
    return s->held_in + s->held_out > s->o.max_buffer_bytes;
}

static void conn_close(conn_t *c);
static void on_write(uv_write_t *req, int status);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf);

/* Starts a write of everything collected, if none is in flight. */
static void conn_flush(conn_t *c)
{
    out_batch_t *b = &c->q[c->cur];
    size_t nb = 0;
    int rc;

    if (c->writing || b->b.nitems == 0)
        return;
    if (gift_grow((void **)&b->bufs, &b->bufs_cap, 2 * b->b.nitems, sizeof(uv_buf_t)) < 0) {
        GIFT_LOG_ERROR(c->id, "out of memory queueing a write; closing");
        conn_close(c);
        return;
    }
    for (size_t i = 0; i < b->b.nitems; i++) {
        const gift_batch_item_t *it = &b->b.items[i];
        b->bufs[nb++] = uv_buf_init((char *)b->b.heads + it->head_off, (unsigned)it->head_len);
        if (it->payload != NULL && it->len > 0)
            b->bufs[nb++] = uv_buf_init((char *)it->payload, (unsigned)it->len);
    }
    c->wreq.data = c;
    if ((rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, b->bufs, (unsigned)nb, on_write)) < 0) {
        GIFT_LOG_WARN(c->id, "write failed: %s", uv_strerror(rc));
        conn_close(c);
        return;
    }
    c->writing = 1;
    c->cur = !c->cur;
}

static void start_reading(conn_t *c)
{
    if (c->reading || c->closing)
        return;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = 1;
}

static void stop_reading(conn_t *c)
{
    if (!c->reading)
        return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = 0;
}

static void on_write(uv_write_t *req, int status)
{
    conn_t *c = req->data;
    out_batch_t *done = &c->q[!c->cur];

    c->writing = 0;
    batch_release(c->srv, done);
    if (status < 0) {
        if (!c->closing)
            GIFT_LOG_INFO(c->id, "write error: %s", uv_strerror(status));
        conn_close(c);
        return;
    }
    conn_flush(c);
    if (c->closing) {
        if (!c->writing)
            conn_close(c);
        return;
    }
    if (!c->reading && !c->srv->draining && queued_bytes(c) <= queue_limit(c) / 2)
        start_reading(c);
}

/* io->send for the shard. */
static int io_send(void *ctx, const uint8_t *head, size_t head_len, gift_rbuf_t *buf, size_t off,
                   size_t len)
{
    conn_t *c = ctx;
    out_batch_t *b = &c->q[c->cur];
    uint8_t *h;

    if (c->closing && c->peer == NULL)
        return GIFT_ECLOSED;
    if (gift_batch_reserve(&b->b, head_len, buf ? buf->data + off : NULL, len, buf, 0, &h) < 0)
        return GIFT_ENOMEM;
    memcpy(h, head, head_len);
    (void)gift_batch_commit(&b->b, head_len);
    if (buf)
        gift_rbuf_ref(buf);
    c->srv->held_out += head_len + (buf ? len : 0);
    if (queued_bytes(c) > queue_limit(c) && c->reading) {
        GIFT_LOG_DEBUG(c->id, "write queue at %llu bytes: pausing reads",
                       (unsigned long long)queued_bytes(c));
        stop_reading(c);
    }
    conn_flush(c);
    return 0;
}

/* io->close for the shard: close once the queue is written. */
static void io_close(void *ctx)
{
    conn_t *c = ctx;
    c->closing = 1;
    stop_reading(c);
    if (!c->writing)
        conn_close(c);
}

/* ------------------------------------------------------------------ */
/* Connections                                                           */
/* ------------------------------------------------------------------ */

static void on_conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    gift_server_t *s = c->srv;

    if (c->peer)
        gift_shard_peer_close(s->shard, c->peer);
    c->peer = NULL;
    if (c->in_list) {
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        s->nconns--;
    }
    batch_free(s, &c->q[0]);
    batch_free(s, &c->q[1]);
    s->held_in -= c->held_in;
    gift_reader_free(c->reader);
    GIFT_LOG_DEBUG(c->id, "connection closed");
    free(c);
}

static void conn_close(conn_t *c)
{
    c->closing = 1;
    if (uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    stop_reading(c);
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    uint8_t *p = NULL;
    size_t avail = 0;
    if (gift_reader_reserve(c->reader, suggested < 65536 ? 65536 : suggested, &p, &avail) < 0) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init((char *)p, (unsigned)(avail > (1u << 30) ? (1u << 30) : avail));
}

/* The text of a reader error for the peer. */
static const char *stream_error_text(int rc)
{
    if (rc == GIFT_EPROTO)
        return "a frame with a payload during the handshake (Hello and its authentication "
               "carry none)";
    return gift_strerror(rc);
}

/* After a read, the frame being read (if any): one that carries a payload
 * makes the peer claim its rank before the payload is buffered (only a
 * rank's connection pushes); its size counts in held_in; the time of its
 * first byte is kept for read_timeout. Past max_buffer_bytes a connection
 * that is not a rank's is closed. A rank's is not paused for it: it holds
 * at most one partial frame and write_queue_bytes of output, and pausing it
 * inside a frame could stall every rank for good. Returns 0, or -1 when the
 * connection is being closed. */
static int conn_account(conn_t *c)
{
    gift_server_t *s = c->srv;
    size_t buffered = gift_reader_buffered(c->reader), missing = gift_reader_missing(c->reader);
    uint64_t total = (uint64_t)buffered + missing;
    uint64_t head_max =
        GIFT_PREAMBLE_BYTES + (uint64_t)(s->limits.max_header_bytes ? s->limits.max_header_bytes
                                                                    : GIFT_MAX_HEADER_DEFAULT);

    if (buffered == 0)
        c->t_frame = 0;
    else if (c->t_frame == 0)
        c->t_frame = uv_now(&s->loop);
    if (missing > 0 && total > head_max && !gift_shard_peer_claimed(c->peer) &&
        gift_shard_peer_claim(s->shard, c->peer) < 0)
        return -1;
    s->held_in = s->held_in - c->held_in + total;
    c->held_in = total;
    if (over_budget(s) && !gift_shard_peer_claimed(c->peer)) {
        char text[256];
        snprintf(text, sizeof text,
                 "the shard holds %llu bytes of partial frames and unsent replies "
                 "(max_buffer_bytes %llu)",
                 (unsigned long long)(s->held_in + s->held_out),
                 (unsigned long long)s->o.max_buffer_bytes);
        gift_shard_reject(s->shard, c->peer, GIFT_EBUSY, text);
        return -1;
    }
    return 0;
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    conn_t *c = st->data;
    gift_frame_t f;
    int rc;

    (void)buf;
    if (n == UV_ENOBUFS) {
        /* The reader refused to give room: a bad preamble (sticky error,
         * which next() returns) or no memory. */
        rc = gift_reader_next(c->reader, &f);
        if (rc >= 0)
            rc = GIFT_ENOMEM;
        GIFT_LOG_WARN(c->id, "malformed stream: %s", stream_error_text(rc));
        gift_shard_reject(c->srv->shard, c->peer, rc, stream_error_text(rc));
        return;
    }
    if (n < 0) {
        if (n != UV_EOF)
            GIFT_LOG_INFO(c->id, "read error: %s", uv_strerror((int)n));
        else if ((rc = gift_reader_eof(c->reader)) < 0)
            GIFT_LOG_INFO(c->id, "peer closed inside a frame (%zu bytes buffered)",
                          gift_reader_buffered(c->reader));
        conn_close(c);
        return;
    }
    gift_reader_commit(c->reader, (size_t)n);
    c->t_read = uv_now(&c->srv->loop);
    while (!c->closing && (rc = gift_reader_next(c->reader, &f)) != 0) {
        if (rc < 0) {
            GIFT_LOG_WARN(c->id, "malformed stream: %s", stream_error_text(rc));
            gift_shard_reject(c->srv->shard, c->peer, rc, stream_error_text(rc));
            return;
        }
        c->t_frame = 0;
        if (gift_shard_handle(c->srv->shard, c->peer, &f) < 0)
            return;
    }
    if (!c->closing && conn_account(c) < 0)
        return;
    if (!c->closing) {
        /* A push of a large chunk: wake this loop once it has mostly
         * arrived, not once per loopback segment (gift_sock_rcvlowat). The
         * worker's CPU, which sends it, pays for every wake-up. */
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
            (void)gift_sock_rcvlowat(fd, gift_reader_missing(c->reader), &c->rcvlowat);
    }
}

/* max_connections are open and c is one more: closes the oldest
 * connection that is not a rank's (a rank's is never closed to make room,
 * so a worker can always reconnect). Returns 0, or -1 when there is none,
 * or too many are still closing. */
static int make_room(gift_server_t *s, conn_t *c)
{
    conn_t *oldest = NULL;
    char text[200];
    if (s->nconns > s->o.max_connections + CONN_SLACK)
        return -1;
    for (conn_t *x = s->conns; x != NULL; x = x->next)
        if (x != c && !x->closing && x->peer != NULL && !gift_shard_peer_claimed(x->peer))
            oldest = x;
    if (oldest == NULL)
        return -1;
    snprintf(text, sizeof text,
             "closed to make room for a new connection (max_connections %u; "
             "connections that are not a rank's are closed oldest first)",
             s->o.max_connections);
    gift_shard_reject(s->shard, oldest->peer, GIFT_EBUSY, text);
    return 0;
}

static void on_connection(uv_stream_t *l, int status)
{
    gift_server_t *s = l->data;
    conn_t *c;

    if (status < 0) {
        GIFT_LOG_WARN(0, "accept failed: %s", uv_strerror(status));
        return;
    }
    if ((c = calloc(1, sizeof *c)) == NULL)
        return;
    c->srv = s;
    c->id = ++s->next_id;
    uv_tcp_init(&s->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) < 0 ||
        (c->reader = gift_reader_new(&s->limits)) == NULL ||
        (c->peer = gift_shard_peer_open(s->shard, c, c->id)) == NULL) {
        conn_close(c);
        return;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    c->in_list = 1;
    c->t_accept = uv_now(&s->loop);
    s->nconns++;
    uv_tcp_nodelay(&c->tcp, 1);
    /* A worker that vanished (power, link) is found by keepalive probes and
     * its connection closed, instead of holding a slot and its parked pulls. */
    (void)uv_tcp_keepalive(&c->tcp, 1, 30);
    {
        struct sockaddr_storage ss;
        int len = sizeof ss;
        char host[64] = "?";
        if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET6)
                uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof host);
            else
                uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
        }
        GIFT_LOG_DEBUG(c->id, "connection from %s", host);
    }
    if (s->nconns > s->o.max_connections && make_room(s, c) < 0) {
        char text[160];
        snprintf(text, sizeof text,
                 "too many connections (max_connections %u, each a rank's "
                 "or still closing)",
                 s->o.max_connections);
        gift_shard_reject(s->shard, c->peer, GIFT_EBUSY, text);
        return;
    }
    c->t_read = c->t_accept;
    start_reading(c);
}

/* ------------------------------------------------------------------ */
/* HTTP                                                                  */
/* ------------------------------------------------------------------ */

static void on_http_closed(uv_handle_t *h)
{
    http_conn_t *hc = h->data;
    gift_server_t *s = hc->srv;
    if (--hc->handles > 0)
        return;
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        s->https = hc->next;
    if (hc->next)
        hc->next->prev = hc->prev;
    s->nhttp--;
    gift_str_free(&hc->resp);
    free(hc);
}

static void http_close(http_conn_t *hc)
{
    if (hc->closing)
        return;
    hc->closing = 1;
    uv_timer_stop(&hc->timer);
    uv_close((uv_handle_t *)&hc->timer, on_http_closed);
    uv_close((uv_handle_t *)&hc->tcp, on_http_closed);
}

static void on_http_write(uv_write_t *req, int status)
{
    (void)status;
    http_close(req->data);
}

static void on_http_timeout(uv_timer_t *t)
{
    http_close(t->data);
}

static void on_http_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    http_conn_t *hc = h->data;
    (void)suggested;
    *buf = uv_buf_init(hc->req + hc->len, (unsigned)(sizeof hc->req - 1 - hc->len));
}

/* Is c a token character of an HTTP method (RFC 9110 tchar)? */
static int http_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Checks the len bytes of a request head received so far, before it is
 * complete, so that garbage is answered at once rather than at the idle
 * timeout: the request line must be METHOD SP TARGET SP HTTP/x.y CRLF (a
 * method of 1..15 token characters, a target of visible ASCII), at most
 * HTTP_MAX_LINE bytes, and no byte of the head may be NUL or a control
 * character other than HTAB, CR and LF. Returns 0 when the bytes so far
 * can still begin a valid request, or -1 with why in *why (a static string,
 * the 400's one-line body). */
#define HTTP_MAX_LINE 1024
static int http_head_check(const char *req, size_t len, const char **why)
{
    size_t i, m = 0, t = 0, v = 0;
    int part = 0; /* 0 method, 1 target, 2 version, 3 after the request line */
    static const char version[] = "HTTP/d.d\r\n";

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)req[i];
        if (c == 0 || c == 0x7f || (c < 0x20 && c != '\t' && c != '\r' && c != '\n')) {
            *why = "bad request: NUL or control byte in the request\n";
            return -1;
        }
        if (part == 3)
            continue;
        if (i >= HTTP_MAX_LINE) {
            *why = "bad request: request line over 1024 bytes\n";
            return -1;
        }
        if (part == 0) {
            if (c == ' ' && m > 0) {
                part = 1;
            } else if (!http_tchar(c) || ++m > 15) {
                *why = "bad request: not an HTTP request line (want METHOD SP TARGET SP "
                       "HTTP/1.1)\n";
                return -1;
            }
        } else if (part == 1) {
            if (c == ' ' && t > 0) {
                part = 2;
            } else if (c <= ' ' || c >= 0x7f) {
                *why = "bad request: not an HTTP request line (want METHOD SP TARGET SP "
                       "HTTP/1.1)\n";
                return -1;
            } else {
                t++;
            }
        } else {
            char want = version[v];
            int fits = want == 'd' ? (c >= '0' && c <= '9') : c == (unsigned char)want;
            if (!fits) {
                *why = "bad request: not an HTTP request line (want METHOD SP TARGET SP "
                       "HTTP/1.1)\n";
                return -1;
            }
            if (version[++v] == '\0')
                part = 3;
        }
    }
    return 0;
}

static void on_http_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    http_conn_t *hc = st->data;
    gift_server_t *s = hc->srv;
    const char *why;
    uv_buf_t out;

    (void)buf;
    if (n < 0 || hc->closing) {
        http_close(hc);
        return;
    }
    hc->len += (size_t)n;
    hc->req[hc->len] = '\0';
    if (http_head_check(hc->req, hc->len, &why) < 0) {
        /* Garbage: answered at once, not left to the idle timeout. */
        uv_read_stop(st);
        hc->answered = 1;
        gift_str_printf(&hc->resp,
                        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                        "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                        strlen(why), why);
        goto send;
    }
    if (strstr(hc->req, "\r\n\r\n") == NULL) {
        if (hc->len >= sizeof hc->req - 1) {
            static const char too_big[] = "HTTP/1.1 431 Request Header Fields Too Large\r\n"
                                          "Content-Length: 0\r\nConnection: close\r\n\r\n";
            uv_read_stop(st);
            hc->answered = 1;
            gift_str_printf(&hc->resp, "%s", too_big);
            goto send;
        }
        return;
    }
    uv_read_stop(st);
    hc->answered = 1;
    s->pi.open_connections = s->nconns;
    s->pi.draining = s->draining;
    gift_http_respond(hc->req, hc->len, s->shard, &s->pi, &hc->resp);
send:
    out = uv_buf_init(hc->resp.p, (unsigned)hc->resp.len);
    hc->wreq.data = hc;
    if (uv_write(&hc->wreq, st, &out, 1, on_http_write) < 0)
        http_close(hc);
}

static void on_http_connection(uv_stream_t *l, int status)
{
    gift_server_t *s = l->data;
    http_conn_t *hc;

    if (status < 0)
        return;
    if ((hc = calloc(1, sizeof *hc)) == NULL)
        return;
    hc->srv = s;
    s->nhttp++;
    uv_tcp_init(&s->loop, &hc->tcp);
    uv_timer_init(&s->loop, &hc->timer);
    hc->tcp.data = hc;
    hc->timer.data = hc;
    hc->handles = 2;
    hc->next = s->https;
    if (s->https)
        s->https->prev = hc;
    s->https = hc;
    if (uv_accept(l, (uv_stream_t *)&hc->tcp) < 0) {
        http_close(hc);
        return;
    }
    if (s->nhttp > s->o.http_max_connections) {
        /* Full: the oldest connection still silent makes room, so that idle
         * connections cannot make /livez fail; a probe asks at once. */
        http_conn_t *oldest = NULL;
        for (http_conn_t *x = hc->next; x != NULL; x = x->next)
            if (!x->closing && !x->answered)
                oldest = x;
        if (oldest == NULL) {
            http_close(hc);
            return;
        }
        http_close(oldest);
    }
    uv_timer_start(&hc->timer, on_http_timeout, s->o.http_timeout_ms, 0);
    uv_read_start((uv_stream_t *)&hc->tcp, on_http_alloc, on_http_read);
}

/* ------------------------------------------------------------------ */
/* Signals and lifetime                                                  */
/* ------------------------------------------------------------------ */

static void on_handle_closed_noop(uv_handle_t *h)
{
    (void)h;
}

/* Stops accepting, stops reading, and lets queued replies go out; the loop
 * ends when the last connection has closed. */
static void drain(gift_server_t *s)
{
    if (s->draining)
        return;
    s->draining = 1;
    GIFT_LOG_INFO(0, "draining: %u connections", s->nconns);
    if (!uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, on_handle_closed_noop);
    if (s->http_on && !uv_is_closing((uv_handle_t *)&s->http))
        uv_close((uv_handle_t *)&s->http, on_handle_closed_noop);
    for (conn_t *c = s->conns; c != NULL; c = c->next) {
        c->closing = 1;
        stop_reading(c);
        if (!c->writing) {
            conn_flush(c);
            if (!c->writing)
                conn_close(c);
        }
    }
    uv_close((uv_handle_t *)&s->tick, on_handle_closed_noop);
    uv_close((uv_handle_t *)&s->flush, on_handle_closed_noop);
    uv_close((uv_handle_t *)&s->sigterm, on_handle_closed_noop);
    uv_close((uv_handle_t *)&s->sigint, on_handle_closed_noop);
    uv_close((uv_handle_t *)&s->sighup, on_handle_closed_noop);
}

/* After each turn's I/O callbacks: one fdatasync for every step finished in
 * the turn, then the pulls that waited for it are answered. */
static void on_flush(uv_check_t *h)
{
    gift_server_t *s = h->data;
    gift_shard_flush(s->shard);
}

/* Past max_buffer_bytes: closes the connection that is not a rank's with
 * the most queued output (one that asks and never reads). */
static void shed_largest(gift_server_t *s)
{
    conn_t *big = NULL;
    char text[256];
    for (conn_t *c = s->conns; c != NULL; c = c->next)
        if (!c->closing && c->peer != NULL && !gift_shard_peer_claimed(c->peer) &&
            (big == NULL || queued_bytes(c) > queued_bytes(big)))
            big = c;
    if (big == NULL || queued_bytes(big) == 0)
        return;
    snprintf(text, sizeof text,
             "the shard holds %llu bytes of partial frames and unsent replies "
             "(max_buffer_bytes %llu); this connection's %llu are the most",
             (unsigned long long)(s->held_in + s->held_out),
             (unsigned long long)s->o.max_buffer_bytes, (unsigned long long)queued_bytes(big));
    gift_shard_reject(s->shard, big->peer, GIFT_EBUSY, text);
}

/* The time limits of one connection, once a second (the rules above http_conn_t). */
static void conn_check_time(gift_server_t *s, conn_t *c, uint64_t now)
{
    char text[160];
    if (c->closing || c->expired || c->peer == NULL)
        return;
    if (!gift_shard_peer_ready(c->peer)) {
        if (now - c->t_accept < (uint64_t)s->o.handshake_timeout_s * 1000)
            return;
        snprintf(text, sizeof text, "no Hello within %u s of connecting (handshake_timeout)",
                 s->o.handshake_timeout_s);
    } else if (c->t_frame != 0 && c->reading &&
               now - c->t_frame >= (uint64_t)s->o.read_timeout_s * 1000) {
        snprintf(text, sizeof text,
                 "a frame begun %llu s ago is still incomplete "
                 "(read_timeout %u s; %zu bytes of it arrived)",
                 (unsigned long long)((now - c->t_frame) / 1000), s->o.read_timeout_s,
                 gift_reader_buffered(c->reader));
    } else if (!gift_shard_peer_claimed(c->peer) && queued_bytes(c) == 0 &&
               now - c->t_read >= (uint64_t)s->o.idle_timeout_s * 1000) {
        snprintf(text, sizeof text,
                 "idle for %llu s and not a rank's connection "
                 "(idle_timeout %u s)",
                 (unsigned long long)((now - c->t_read) / 1000), s->o.idle_timeout_s);
    } else {
        return;
    }
    c->expired = 1;
    gift_shard_reject(s->shard, c->peer, GIFT_ETIMEDOUT, text);
}

static void on_tick(uv_timer_t *t)
{
    gift_server_t *s = t->data;
    uint64_t now = uv_now(&s->loop);
    gift_shard_tick(s->shard);
    for (conn_t *c = s->conns; c != NULL; c = c->next)
        conn_check_time(s, c, now);
    if (over_budget(s))
        shed_largest(s);
}

static void exit_now(int signum)
{
    (void)signum;
    _exit(1);
}

static void on_signal(uv_signal_t *h, int signum)
{
    gift_server_t *s = h->data;
    if (signum == SIGHUP) {
        GIFT_LOG_INFO(0, "SIGHUP: reloading the log level");
        if (s->o.reload_cb)
            s->o.reload_cb(s->o.reload_arg);
        return;
    }
    GIFT_LOG_INFO(0, "%s: finishing in-flight replies, then exiting (again to exit now)",
                  signum == SIGTERM ? "SIGTERM" : "SIGINT");
    {
        /* Nothing is read from here on, so this is the final state. */
        char err[512];
        gift_shard_flush(s->shard);
        if (gift_shard_checkpoint(s->shard, err, sizeof err) < 0)
            GIFT_LOG_ERROR(0,
                           "checkpoint at exit failed: %s (the step log still holds every "
                           "finished step)",
                           err);
    }
    /* The signal handles close in drain(): a second signal reaches these. */
    signal(SIGTERM, exit_now);
    signal(SIGINT, exit_now);
    drain(s);
}

static int listen_on(gift_server_t *s, uv_tcp_t *h, int port, uv_connection_cb cb, int *bound,
                     char *err, size_t errlen)
{
    struct sockaddr_storage addr;
    struct sockaddr_storage got;
    int len = sizeof got, rc;

    if (uv_ip4_addr(s->o.bind, port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(s->o.bind, port, (struct sockaddr_in6 *)&addr) != 0) {
        snprintf(err, errlen, "bind address '%s' is not an IPv4 or IPv6 address", s->o.bind);
        return GIFT_ECONFIG;
    }
    uv_tcp_init(&s->loop, h);
    h->data = s;
    if ((rc = uv_tcp_bind(h, (struct sockaddr *)&addr, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)h, 511, cb)) < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", s->o.bind, port, uv_strerror(rc));
        return GIFT_EIO;
    }
    if (uv_tcp_getsockname(h, (struct sockaddr *)&got, &len) == 0)
        *bound = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                 : ((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

int gift_server_new(const gift_server_opts_t *o, gift_server_t **out, char *err, size_t errlen)
{
    gift_shard_io_t io = {.send = io_send, .close = io_close, .now_ns = now_ns};
    gift_server_t *s;
    int rc;

    *out = NULL;
    if ((s = calloc(1, sizeof *s)) == NULL) {
        snprintf(err, errlen, "out of memory");
        return GIFT_ENOMEM;
    }
    s->o = *o;
    if (s->o.write_queue_bytes == 0)
        s->o.write_queue_bytes = 256ull << 20;
    if (s->o.handshake_timeout_s == 0)
        s->o.handshake_timeout_s = HANDSHAKE_S_DEFAULT;
    if (s->o.read_timeout_s == 0)
        s->o.read_timeout_s = READ_S_DEFAULT;
    if (s->o.idle_timeout_s == 0)
        s->o.idle_timeout_s = IDLE_S_DEFAULT;
    if (s->o.max_buffer_bytes == 0)
        s->o.max_buffer_bytes = BUFFER_BYTES_DEFAULT;
    if (s->o.http_max_connections == 0)
        s->o.http_max_connections = HTTP_MAX_CONNS_DEFAULT;
    if (s->o.http_timeout_ms == 0)
        s->o.http_timeout_ms = HTTP_TIMEOUT_MS_DEFAULT;
    s->limits.max_header_bytes = o->max_header_bytes;
    s->limits.max_frame_bytes = o->max_frame_bytes;
    /* Hello (and, with authentication, its answer to the challenge) comes
     * first and carries no payload: a peer that has not said Hello cannot
     * make giftd buffer a large frame (proto/gift_proto.h); after it, only a
     * rank's connection can (conn_account). */
    s->limits.handshake_frames = o->shard.auth ? 2 : 1;
    s->o.shard.max_frame_bytes = o->max_frame_bytes;
    s->o.shard.group_commit = 1; /* on_flush calls gift_shard_flush every turn */
    s->pi.started_unix = (uint64_t)time(NULL);
    if ((rc = uv_loop_init(&s->loop)) < 0) {
        snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
        free(s);
        return GIFT_EIO;
    }
    if ((s->shard = gift_shard_new(&s->o.shard, &io)) == NULL) {
        snprintf(err, errlen, "cannot create the shard (shard_id %u of %u, or out of memory)",
                 o->shard.shard_id, o->shard.num_shards);
        rc = GIFT_ECONFIG;
        goto fail_loop;
    }
    /* A damaged checkpoint or log stops giftd here, before it listens:
     * serving from half a state would break "nothing acknowledged is lost". */
    if ((rc = gift_shard_restore(s->shard, err, errlen)) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen,
                 "cannot restore the shard's state: %s (refusing to start; move "
                 "data_dir aside to start empty)",
                 why);
        goto fail_shard;
    }
    if ((rc = listen_on(s, &s->listener, o->port, on_connection, &s->port, err, errlen)) < 0)
        goto fail_shard;
    if (o->http_port >= 0) {
        if ((rc = listen_on(s, &s->http, o->http_port, on_http_connection, &s->http_port, err,
                            errlen)) < 0) {
            uv_close((uv_handle_t *)&s->listener, NULL);
            goto fail_shard;
        }
        s->http_on = 1;
    } else {
        s->http_port = -1;
    }
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_init(&s->loop, &s->sighup);
    s->sigterm.data = s->sigint.data = s->sighup.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sighup, on_signal, SIGHUP);
    uv_timer_init(&s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, on_tick, 1000, 1000);
    uv_check_init(&s->loop, &s->flush);
    s->flush.data = s;
    uv_check_start(&s->flush, on_flush);
    signal(SIGPIPE, SIG_IGN);
    *out = s;
    return 0;
fail_shard:
    gift_shard_free(s->shard);
    uv_run(&s->loop, UV_RUN_NOWAIT);
fail_loop:
    uv_loop_close(&s->loop);
    free(s);
    return rc;
}

int gift_server_run(gift_server_t *s)
{
    int rc = uv_run(&s->loop, UV_RUN_DEFAULT);
    (void)rc;
    GIFT_LOG_INFO(0, "stopped");
    return 0;
}

void gift_server_free(gift_server_t *s)
{
    if (s == NULL)
        return;
    if (!s->draining)
        drain(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&s->loop) != 0)
        GIFT_LOG_WARN(0, "event loop still held handles at exit");
    gift_shard_free(s->shard);
    free(s);
}

int gift_server_port(const gift_server_t *s)
{
    return s->port;
}

int gift_server_http_port(const gift_server_t *s)
{
    return s->http_port;
}
