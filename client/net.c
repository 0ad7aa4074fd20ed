/*
 * net.c: the only file of libgiftclient that knows libuv. The I/O thread and
 * its loop, one connection per shard with capped exponential backoff, the
 * zero-copy read path into each connection's frame reader, and the write
 * queue.
 *
 * Writes: frames queued during a loop turn are collected per connection
 * (heads packed into one buffer, payloads referenced, not copied) and go out
 * at the end of the turn (a uv_check handle) in ONE uv_write, sorted by
 * priority (stable); a large payload starts its write at once. Batches form a
 * small FIFO ring per connection, each with its own uv_write_t: up to
 * GIFT__NET_RING - 1 writes are in flight while the next batch collects.
 * libuv writes a stream's requests in order, so frames leave in the order
 * their batches were started (a Sketch queued before a Push goes first);
 * write callbacks come in the same order and release the oldest batch. With
 * every slot in flight, frames wait for the next turn. A payload's owner
 * counts the frames that reference it (*inflight) until their write is done
 * or dropped.
 *
 * A connection is never freed inside its own callbacks: dropping closes the
 * handle and the close callback releases its buffers and starts the backoff
 * timer that reconnects.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <uv.h>

#include "giftclient_internal.h"
#include "gift_batch.h"
#include "gift_util.h"

#define TICK_MS 10
#define GIFT__NET_RING 8 /* batches per connection: in flight + the collecting one */

/* One batch of queued frames (gift_batch.h; a frame's ref is its payload
 * owner's count of writes in flight, or NULL), with its write request and
 * the uv_buf_t array of that write. */
typedef struct out_batch {
    uv_write_t wreq;
    gift_batch_t b;
    uv_buf_t *bufs;
    size_t bufs_cap;
} out_batch_t;

typedef struct uconn {
    gift__net_t *net;
    uint32_t shard;
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_timer_t timer; /* backoff */
    gift_reader_t *reader;
    out_batch_t q[GIFT__NET_RING]; /* ring: q[head] .. are written, then one collects */
    unsigned head, writing;        /* oldest batch in flight, batches in flight */
    int tcp_active;                /* tcp initialised and its close callback not yet run */
    int connected;                 /* established and not being dropped */
    uint32_t backoff_ms;
    int rcvlowat; /* SO_RCVLOWAT set last (gift_sock_rcvlowat), 0: none */
} uconn_t;

struct gift__net {
    gift_client_t *c;
    uv_loop_t loop;
    uv_async_t async;
    uv_check_t check;
    uv_idle_t idle; /* active while a push is still encoding: no blocking poll */
    uv_timer_t tick;
    uconn_t *conns;
    gift_limits_t limits;
    int stopping;
};

static uint64_t hrtime_ns(void)
{
    return uv_hrtime();
}

/* ------------------------------------------------------------------ */
/* Write queue                                                           */
/* ------------------------------------------------------------------ */

/* A written or dropped frame: its payload's owner may reuse it now. */
static void item_release(void *ref, void *arg)
{
    gift_client_t *c = arg;
    (*(int *)ref)--;
    c->rescan = 1;
}

static void batch_release(gift_client_t *c, out_batch_t *b)
{
    gift_batch_release(&b->b, item_release, c);
}

static void batch_free(out_batch_t *b)
{
    gift_batch_free(&b->b);
    free(b->bufs);
    memset(b, 0, sizeof *b);
}

static void conn_drop(uconn_t *u);
static void on_write(uv_write_t *req, int status);

static out_batch_t *collecting(uconn_t *u)
{
    return &u->q[(u->head + u->writing) % GIFT__NET_RING];
}

/* Writes everything collected, in priority order, if the ring has a slot. */
#define GIFT__NET_EAGER_BYTES (256u << 10)

static void flush(uconn_t *u)
{
    out_batch_t *b = collecting(u);
    size_t nb = 0;
    int rc;

    if (u->writing >= GIFT__NET_RING - 1 || !u->connected || b->b.nitems == 0)
        return;
    if (gift_grow((void **)&b->bufs, &b->bufs_cap, 2 * b->b.nitems, sizeof(uv_buf_t)) < 0) {
        conn_drop(u);
        return;
    }
    gift_batch_sort(&b->b);
    for (size_t i = 0; i < b->b.nitems; i++) {
        const gift_batch_item_t *it = &b->b.items[i];
        b->bufs[nb++] = uv_buf_init((char *)b->b.heads + it->head_off, (unsigned)it->head_len);
        if (it->len > 0)
            b->bufs[nb++] = uv_buf_init((char *)it->payload, (unsigned)it->len);
    }
    b->wreq.data = u;
    if ((rc = uv_write(&b->wreq, (uv_stream_t *)&u->tcp, b->bufs, (unsigned)nb, on_write)) < 0) {
        conn_drop(u);
        return;
    }
    u->writing++;
}

static void on_write(uv_write_t *req, int status)
{
    uconn_t *u = req->data;
    /* Callbacks come in write order: req is the oldest batch's. */
    if (u->writing > 0 && req == &u->q[u->head].wreq) {
        batch_release(u->net->c, &u->q[u->head]);
        u->head = (u->head + 1) % GIFT__NET_RING;
        u->writing--;
    }
    if (status < 0)
        conn_drop(u);
}

static int queue_item(uconn_t *u, size_t head_len, const void *payload, size_t len, int64_t prio,
                      int *inflight, uint8_t **head)
{
    if (!u->connected)
        return GIFT_ECLOSED;
    return gift_batch_reserve(&collecting(u)->b, head_len, payload, len, inflight, prio, head);
}

static void queue_commit(gift_client_t *c, uconn_t *u, size_t head_len)
{
    gift_batch_item_t *it = gift_batch_commit(&collecting(u)->b, head_len);
    if (it->ref)
        (*(int *)it->ref)++;
    GIFT__STAT_ADD(c, frames_out, 1);
    GIFT__STAT_ADD(c, bytes_out, head_len + it->len);
    GIFT__PAYLOAD_ADD(c, payload_out, it->len);
}

static int net_queue(gift_client_t *c, uint32_t shard, const Gift__Envelope *env,
                     const void *payload, size_t len, int64_t prio, int *inflight)
{
    uconn_t *u = &c->net->conns[shard];
    size_t hl = gift_frame_head_size(env);
    uint8_t *head;
    long n;
    int rc;
    if ((rc = queue_item(u, hl, payload, len, prio, inflight, &head)) < 0)
        return rc;
    if ((n = gift_frame_pack_head(env, payload ? len : 0, head, hl)) < 0)
        return (int)n;
    queue_commit(c, u, (size_t)n);
    /* A large payload goes out at once rather than at the end of the turn,
     * so the shard decodes chunk i while this thread encodes chunk i + 1
     * (uv_write writes what the socket takes right away). Small frames
     * still collect into one write per turn, in priority order. */
    if (payload != NULL && len >= GIFT__NET_EAGER_BYTES)
        flush(u);
    return 0;
}

static int net_queue_raw(gift_client_t *c, uint32_t shard, const uint8_t *head, size_t head_len,
                         int64_t prio)
{
    uconn_t *u = &c->net->conns[shard];
    uint8_t *h;
    int rc;
    if ((rc = queue_item(u, head_len, NULL, 0, prio, NULL, &h)) < 0)
        return rc;
    memcpy(h, head, head_len);
    queue_commit(c, u, head_len);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Connections                                                           */
/* ------------------------------------------------------------------ */

static void start_connect(uconn_t *u);

static void on_backoff(uv_timer_t *t)
{
    uconn_t *u = t->data;
    if (!u->net->stopping)
        start_connect(u);
}

static void on_tcp_closed(uv_handle_t *h)
{
    uconn_t *u = h->data;
    gift__net_t *net = u->net;
    u->tcp_active = 0;
    u->writing = 0;
    u->head = 0;
    for (int i = 0; i < GIFT__NET_RING; i++)
        batch_release(net->c, &u->q[i]);
    gift_reader_free(u->reader);
    u->reader = NULL;
    if (net->stopping)
        return;
    uv_timer_start(&u->timer, on_backoff, u->backoff_ms, 0);
    u->backoff_ms *= 2;
    if (u->backoff_ms > net->c->backoff_max_ms)
        u->backoff_ms = net->c->backoff_max_ms;
}

/* Closes the connection (if any); the close callback schedules a reconnect. */
static void conn_drop(uconn_t *u)
{
    int was = u->connected;
    if (!u->tcp_active || uv_is_closing((uv_handle_t *)&u->tcp))
        return;
    u->connected = 0;
    uv_read_stop((uv_stream_t *)&u->tcp);
    uv_close((uv_handle_t *)&u->tcp, on_tcp_closed);
    if (was)
        gift__eng_conn_down(u->net->c, u->shard);
}

static void net_drop(gift_client_t *c, uint32_t shard)
{
    conn_drop(&c->net->conns[shard]);
}

static void net_backoff_reset(gift_client_t *c, uint32_t shard)
{
    c->net->conns[shard].backoff_ms = GIFT__BACKOFF_MIN_MS;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    uconn_t *u = h->data;
    uint8_t *p = NULL;
    size_t avail = 0;
    if (u->reader == NULL ||
        gift_reader_reserve(u->reader, suggested < 65536 ? 65536 : suggested, &p, &avail) < 0) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init((char *)p, (unsigned)(avail > (1u << 30) ? (1u << 30) : avail));
}

/* A large frame (a pulled chunk's reply): let the kernel wake this thread
 * once it has most of it instead of once per loopback segment
 * (gift_sock_rcvlowat; small frames keep the default mark of 1). */
static void wake_for_frame(uconn_t *u)
{
    uv_os_fd_t fd;
    if (u->connected && uv_fileno((uv_handle_t *)&u->tcp, &fd) == 0)
        (void)gift_sock_rcvlowat(fd, gift_reader_missing(u->reader), &u->rcvlowat);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    uconn_t *u = st->data;
    gift_client_t *c = u->net->c;
    gift_frame_t f;
    int rc;

    (void)buf;
    if (n < 0) {
        /* EOF, a read error, or UV_ENOBUFS (a broken stream the reader refused). */
        conn_drop(u);
        return;
    }
    if (n == 0)
        return;
    gift_reader_commit(u->reader, (size_t)n);
    while (u->connected && (rc = gift_reader_next(u->reader, &f)) != 0) {
        if (rc < 0) {
            fprintf(stderr, "giftclient: shard %u sent a broken stream: %s\n", u->shard,
                    gift_strerror(rc));
            conn_drop(u);
            return;
        }
        GIFT__STAT_ADD(c, frames_in, 1);
        GIFT__STAT_ADD(c, bytes_in, GIFT_PREAMBLE_BYTES + f.header_len + f.payload_len);
        GIFT__PAYLOAD_ADD(c, payload_in, f.payload_len);
        if (gift__eng_frame(c, u->shard, &f) < 0) {
            conn_drop(u);
            return;
        }
    }
    /* A frame whose header is in and whose payload is not: the engine may
     * have it received straight into its destination (a pulled f32 chunk). */
    if (u->connected && rc == 0 && (rc = gift_reader_peek(u->reader, &f)) != 0) {
        void *dst;
        if (rc < 0) {
            fprintf(stderr, "giftclient: shard %u sent a broken stream: %s\n", u->shard,
                    gift_strerror(rc));
            conn_drop(u);
            return;
        }
        if ((dst = gift__eng_sink(c, u->shard, &f)) != NULL)
            (void)gift_reader_sink(u->reader, dst);
    }
    wake_for_frame(u);
}

/* A shard that vanished while this connection was idle (a parked pull, say:
 * its host rebooted, or a link went down and the shard dropped us) leaves a
 * half-open socket that no read or write would ever notice. Keepalive probes
 * after GIFT__NET_KEEPIDLE_S idle seconds, every GIFT__NET_KEEPINTVL_S, find
 * it within about a quarter of a minute (the reset that answers a probe, or
 * GIFT__NET_KEEPCNT silent probes), and unacknowledged data older than
 * GIFT__NET_USER_TIMEOUT_MS fails the socket as well; either way the
 * connection drops, reconnects and replays. Best effort: a failure here only
 * loses the early warning. */
#define GIFT__NET_KEEPIDLE_S 5
#define GIFT__NET_KEEPINTVL_S 2
#define GIFT__NET_KEEPCNT 4
#define GIFT__NET_USER_TIMEOUT_MS 30000
static void keepalive(uv_tcp_t *tcp)
{
    uv_os_fd_t fd;
    int v;
    if (uv_tcp_keepalive(tcp, 1, GIFT__NET_KEEPIDLE_S) < 0 ||
        uv_fileno((uv_handle_t *)tcp, &fd) < 0)
        return;
    v = GIFT__NET_KEEPINTVL_S;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &v, sizeof v);
    v = GIFT__NET_KEEPCNT;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &v, sizeof v);
    v = GIFT__NET_USER_TIMEOUT_MS;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof v);
}

static void on_connect(uv_connect_t *req, int status)
{
    uconn_t *u = req->data;
    gift__net_t *net = u->net;
    if (status == UV_ECANCELED || net->stopping || uv_is_closing((uv_handle_t *)&u->tcp))
        return;
    if (status < 0) {
        gift__eng_conn_failed(net->c, u->shard, status); /* a negative errno */
        uv_close((uv_handle_t *)&u->tcp, on_tcp_closed);
        return;
    }
    uv_tcp_nodelay(&u->tcp, 1);
    keepalive(&u->tcp);
    u->rcvlowat = 0; /* a new socket */
    if ((u->reader = gift_reader_new(&net->limits)) == NULL ||
        uv_read_start((uv_stream_t *)&u->tcp, on_alloc, on_read) < 0) {
        uv_close((uv_handle_t *)&u->tcp, on_tcp_closed);
        return;
    }
    u->connected = 1;
    u->head = 0;
    u->writing = 0;
    gift__eng_conn_up(net->c, u->shard);
}

static void start_connect(uconn_t *u)
{
    gift__net_t *net = u->net;
    int rc;
    if (u->tcp_active)
        return;
    uv_tcp_init(&net->loop, &u->tcp);
    u->tcp.data = u;
    u->tcp_active = 1;
    u->creq.data = u;
    rc = uv_tcp_connect(&u->creq, &u->tcp, (const struct sockaddr *)&net->c->addrs[u->shard],
                        on_connect);
    if (rc < 0)
        uv_close((uv_handle_t *)&u->tcp, on_tcp_closed);
}

static void net_connect_all(gift_client_t *c)
{
    for (uint32_t s = 0; s < c->nshards; s++)
        start_connect(&c->net->conns[s]);
}

/* ------------------------------------------------------------------ */
/* The loop                                                              */
/* ------------------------------------------------------------------ */

static void on_async(uv_async_t *a)
{
    gift__net_t *net = a->data;
    gift__eng_commands(net->c);
}

static void on_idle(uv_idle_t *h)
{
    (void)h;
}

/* The end of every loop turn: encode the next chunks of pushes still being
 * encoded, start what became possible, then write. */
static void on_check(uv_check_t *h)
{
    gift__net_t *net = h->data;
    if (!net->stopping)
        gift__host_encode_more(net->c);
    gift__eng_turn_end(net->c);
    if (net->stopping)
        return;
    /* More to encode: the next turn polls without blocking. */
    if (net->c->nencoding > 0)
        uv_idle_start(&net->idle, on_idle);
    else
        uv_idle_stop(&net->idle);
    for (uint32_t s = 0; s < net->c->nshards; s++)
        flush(&net->conns[s]);
}

static void on_tick(uv_timer_t *t)
{
    gift__net_t *net = t->data;
    gift__eng_tick(net->c);
}

static void *thread_main(void *arg)
{
    gift__net_t *net = arg;
    uv_run(&net->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void on_closed_noop(uv_handle_t *h)
{
    (void)h;
}

static void net_shutdown(gift_client_t *c)
{
    gift__net_t *net = c->net;
    if (net->stopping)
        return;
    net->stopping = 1;
    gift__host_pool_stop(c); /* its threads wake the loop through net->async */
    for (uint32_t s = 0; s < c->nshards; s++) {
        uconn_t *u = &net->conns[s];
        uv_timer_stop(&u->timer);
        uv_close((uv_handle_t *)&u->timer, on_closed_noop);
        u->connected = 0;
        if (u->tcp_active && !uv_is_closing((uv_handle_t *)&u->tcp))
            uv_close((uv_handle_t *)&u->tcp, on_tcp_closed);
    }
    uv_close((uv_handle_t *)&net->async, on_closed_noop);
    uv_close((uv_handle_t *)&net->check, on_closed_noop);
    uv_close((uv_handle_t *)&net->idle, on_closed_noop);
    uv_close((uv_handle_t *)&net->tick, on_closed_noop);
}

static void net_wake(gift_client_t *c)
{
    uv_async_send(&c->net->async);
}

static void net_unsink(gift_client_t *c, const void *lo, const void *hi)
{
    for (uint32_t i = 0; i < c->nshards; i++) {
        uconn_t *u = &c->net->conns[i];
        const uint8_t *d = u->reader != NULL ? gift_reader_sinking(u->reader) : NULL;
        if (d != NULL && (uintptr_t)d >= (uintptr_t)lo && (uintptr_t)d < (uintptr_t)hi)
            gift_reader_unsink(u->reader);
    }
}

static int net_start(gift_client_t *c);
static void net_join(gift_client_t *c);

/* The engine's way to the network (gift__io_t): filled here, faked by
 * tests/client/test_engine.c. */
static const gift__io_t net_io = {
    .start = net_start,
    .join = net_join,
    .wake = net_wake,
    .connect = net_connect_all,
    .shutdown = net_shutdown,
    .drop = net_drop,
    .backoff_reset = net_backoff_reset,
    .queue = net_queue,
    .queue_raw = net_queue_raw,
    .now_ns = hrtime_ns,
    .unsink = net_unsink,
};

const gift__io_t *gift__net_io(void)
{
    return &net_io;
}

/* The loop, its handles, the codec threads and the I/O thread (gift__io_t.start). */
static int net_start(gift_client_t *c)
{
    gift__net_t *net = calloc(1, sizeof *net);
    if (net == NULL || (net->conns = calloc(c->nshards, sizeof *net->conns)) == NULL) {
        free(net);
        return GIFT_ENOMEM;
    }
    net->c = c;
    /* Replies may be large (a whole chunk of FP32); headers are small. */
    net->limits.max_header_bytes = 1u << 20;
    net->limits.max_frame_bytes = 1ull << 32;
    if (uv_loop_init(&net->loop) < 0) {
        free(net->conns);
        free(net);
        return GIFT_EIO;
    }
    uv_async_init(&net->loop, &net->async, on_async);
    net->async.data = net;
    uv_check_init(&net->loop, &net->check);
    net->check.data = net;
    uv_check_start(&net->check, on_check);
    uv_idle_init(&net->loop, &net->idle);
    net->idle.data = net;
    uv_timer_init(&net->loop, &net->tick);
    net->tick.data = net;
    uv_timer_start(&net->tick, on_tick, TICK_MS, TICK_MS);
    for (uint32_t s = 0; s < c->nshards; s++) {
        uconn_t *u = &net->conns[s];
        u->net = net;
        u->shard = s;
        u->backoff_ms = GIFT__BACKOFF_MIN_MS;
        uv_timer_init(&net->loop, &u->timer);
        u->timer.data = u;
    }
    c->net = net;
    c->io = &net_io;
    if (gift__host_pool_start(c) < 0 || pthread_create(&c->thread, NULL, thread_main, net) != 0) {
        net_shutdown(c);
        uv_run(&net->loop, UV_RUN_DEFAULT);
        uv_loop_close(&net->loop);
        free(net->conns);
        free(net);
        c->net = NULL;
        return GIFT_ENOMEM;
    }
    c->thread_started = 1;
    return 0;
}

/* After CMD_CLOSE completed: joins the thread and frees the loop (gift__io_t.join). */
static void net_join(gift_client_t *c)
{
    gift__net_t *net = c->net;
    if (!c->thread_started)
        return;
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
    gift__host_pool_stop(c); /* stopped by net_shutdown already; a no-op then */
    if (uv_loop_close(&net->loop) != 0)
        fprintf(stderr, "giftclient: the event loop still held handles at close\n");
    for (uint32_t s = 0; s < c->nshards; s++) {
        for (int i = 0; i < GIFT__NET_RING; i++)
            batch_free(&net->conns[s].q[i]);
    }
    free(net->conns);
    free(net);
    c->net = NULL;
}
