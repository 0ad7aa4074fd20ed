/*
 * test_integration.c: giftd end to end. Every test starts a real giftd
 * (GIFTD_BIN) on 127.0.0.1 with --port 0 --http-port 0, reads its ready line
 * from a pipe, talks to it over plain blocking sockets with a small raw
 * client built on proto/ (gift_frame_pack_head to send, a gift_reader fed
 * from recv to receive), and stops it with SIGTERM at teardown, asserting
 * exit status 0 (the drain) and a log free of sanitizer reports (the ASan
 * build instruments the daemon too).
 *
 * Bounded in time: every socket has SO_RCVTIMEO/SO_SNDTIMEO of a few
 * seconds, so a hang fails the test instead of stalling CTest. The daemon
 * gets PR_SET_PDEATHSIG, so a failing test (whose teardown does not run)
 * does not leave it behind. Its stderr goes to a file under $TMPDIR, named
 * in failure messages and removed when the test passes.
 */
#define _GNU_SOURCE

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gift_codec.h"
#include "gift_error.h"
#include "gift_proto.h"
#include "gift_test_check.h"
#include "gift_test_daemon.h"
#include "gift_test_frames.h"
#include "gift_test_rng.h"
#include "gift_test_time.h"

#define IO_TIMEOUT_MS 5000    /* per socket operation */
#define STOP_TIMEOUT_MS 10000 /* SIGTERM to exit */
#define LOG_WAIT_MS 5000

/* ------------------------------------------------------------------ */
/* Randomness (splitmix64 and clocks: tests/common)                     */
/* ------------------------------------------------------------------ */

/* Uniform in [-1, 1). */
static float rnd_unit(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* ------------------------------------------------------------------ */
/* The daemon                                                            */
/* ------------------------------------------------------------------ */

/* For failures where the server went away: the end of its log, which says
 * why (a sanitizer report, a fatal error, a crash). */
static const char *closed_why(int rc)
{
    static char buf[1600];
    const char *t;
    size_t n;
    if (rc == 1)
        return "";
    t = log_tail();
    n = strlen(t);
    snprintf(buf, sizeof buf, "\ngiftd log %s ends:\n%s", D.log_path,
             t + (n > 1400 ? n - 1400 : 0));
    return buf;
}

/* Waits until needle occurs at least `times` times in the log. */
static int log_wait(const char *needle, int times, int timeout_ms)
{
    double end = now_ms() + timeout_ms;
    do {
        if (log_count(needle) >= times)
            return 1;
        sleep_ms(10);
    } while (now_ms() < end);
    return log_count(needle) >= times;
}

/* Starts giftd (gift_test_daemon.h) with the common flags, --log-level
 * debug, and extra (NULL-terminated), and reads its ready line. */
static void daemon_start(const char *const *extra)
{
    static const char *const flags[] = {"--log-level", "debug", NULL};
    static const daemon_opts_t opts = {
        .log_prefix = "giftd-integ-", .flags = flags, .need_http_port = 1};
    daemon_start_opts(&opts, extra, 1);
}

static void daemon_teardown(void)
{
    daemon_teardown_ms(STOP_TIMEOUT_MS);
}

/* Resident set size of the daemon in bytes, or -1. */
static long daemon_rss(void)
{
    long kb = daemon_rss_kb();
    return kb < 0 ? -1 : kb * 1024;
}

/* ------------------------------------------------------------------ */
/* Raw client                                                            */
/* ------------------------------------------------------------------ */

typedef struct client {
    int fd;
    gift_reader_t *r;
    uint64_t seq;
    gift_frame_t f; /* the last frame received; valid until the next receive */
    const char *name;
} client_t;

static void sock_timeouts(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* A blocking TCP connection to 127.0.0.1:port with TCP_NODELAY and
 * timeouts. Returns the fd or -errno. */
static int tcp_connect(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -errno;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sock_timeouts(fd, IO_TIMEOUT_MS);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* Sends all len bytes. Returns 0 or -errno. */
static int send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void cl_open(client_t *c, const char *name)
{
    memset(c, 0, sizeof *c);
    c->name = name;
    c->fd = tcp_connect(D.port);
    ck_assert_msg(c->fd >= 0, "%s: connect to port %d: %s", name, D.port, strerror(-c->fd));
    c->r = gift_reader_new(NULL);
    ck_assert_msg(c->r != NULL, "gift_reader_new");
}

static void cl_close(client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    gift_reader_free(c->r);
    c->r = NULL;
}

/* Sends one frame: preamble + env, then payload. */
static void cl_send(client_t *c, const Gift__Envelope *env, const void *payload, size_t len)
{
    size_t need = gift_frame_head_size(env);
    uint8_t *head = malloc(need);
    long n;
    int rc;
    ck_assert_msg(head != NULL, "malloc");
    n = gift_frame_pack_head(env, len, head, need);
    ck_assert_msg(n == (long)need, "gift_frame_pack_head gave %ld, want %zu", n, need);
    rc = send_all(c->fd, head, (size_t)n);
    if (rc == 0 && len > 0)
        rc = send_all(c->fd, payload, len);
    free(head);
    ck_assert_msg(rc == 0, "%s: sending %s: %s", c->name, gift_msg_name(env), strerror(-rc));
}

/* Receives the next frame into c->f. Returns 1, 0 at EOF, GIFT_ETIMEDOUT,
 * GIFT_EIO (errno in *err) or a reader error. */
static int cl_recv_rc(client_t *c, int *err)
{
    for (;;) {
        uint8_t *p;
        size_t avail;
        ssize_t n;
        int rc = gift_reader_next(c->r, &c->f);
        if (rc != 0)
            return rc;
        if ((rc = gift_reader_reserve(c->r, 1u << 16, &p, &avail)) < 0)
            return rc;
        n = recv(c->fd, p, avail, 0);
        if (n > 0) {
            gift_reader_commit(c->r, (size_t)n);
            continue;
        }
        if (n == 0)
            return gift_reader_eof(c->r) < 0 ? GIFT_ETRUNCATED : 0;
        if (errno == EINTR)
            continue;
        if (err)
            *err = errno;
        return errno == EAGAIN || errno == EWOULDBLOCK ? GIFT_ETIMEDOUT : GIFT_EIO;
    }
}

static const char *case_name(Gift__Envelope__MsgCase m)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    env.msg_case = m;
    return gift_msg_name(&env);
}

/* Receives one frame and requires it to be of type want; an Error frame in
 * its place fails with the server's code and text. */
static const gift_frame_t *cl_expect(client_t *c, Gift__Envelope__MsgCase want, const char *what)
{
    int err = 0, rc = cl_recv_rc(c, &err);
    ck_assert_msg(rc == 1, "%s: %s: waiting for %s got %s (%s)%s", c->name, what, case_name(want),
                  rc == 0 ? "EOF" : gift_strerror(rc), err ? strerror(err) : "-", closed_why(rc));
    if (c->f.env->msg_case == want)
        return &c->f;
    if (c->f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR)
        ck_abort_msg("%s: %s: expected %s, got Error %d (%s) fatal=%d: %s", c->name, what,
                     case_name(want), c->f.env->error->code, gift_strerror(c->f.env->error->code),
                     c->f.env->error->fatal, c->f.env->error->text);
    ck_abort_msg("%s: %s: expected %s, got %s", c->name, what, case_name(want),
                 gift_msg_name(c->f.env));
    return NULL;
}

/* Receives an Error frame with this code and fatal flag. */
static const Gift__Error *cl_expect_error(client_t *c, int code, int fatal, const char *what)
{
    const Gift__Error *e;
    int err = 0, rc = cl_recv_rc(c, &err);
    ck_assert_msg(rc == 1, "%s: %s: waiting for Error %d (%s) got %s (%s)%s", c->name, what, code,
                  gift_strerror(code), rc == 0 ? "EOF" : gift_strerror(rc),
                  err ? strerror(err) : "-", closed_why(rc));
    ck_assert_msg(c->f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR,
                  "%s: %s: expected Error %d (%s), got %s", c->name, what, code,
                  gift_strerror(code), gift_msg_name(c->f.env));
    e = c->f.env->error;
    ck_assert_msg(e->code == code && (int)e->fatal == fatal,
                  "%s: %s: expected Error %d (%s) fatal=%d, got %d (%s) fatal=%d: %s", c->name,
                  what, code, gift_strerror(code), fatal, e->code, gift_strerror(e->code), e->fatal,
                  e->text);
    ck_assert_msg(e->text != NULL && e->text[0] != '\0', "%s: %s: Error without text", c->name,
                  what);
    return e;
}

/* The server must close the connection: recv returns 0 with nothing more. */
static void cl_expect_eof(client_t *c, const char *what)
{
    int err = 0, rc = cl_recv_rc(c, &err);
    ck_assert_msg(rc == 0, "%s: %s: expected the server to close, got %s%s%s (%s)", c->name, what,
                  rc == 1 ? "frame " : "", rc == 1 ? gift_msg_name(c->f.env) : "",
                  rc == 1 ? "" : gift_strerror(rc), err ? strerror(err) : "-");
}

/* The same, where the peer sent bytes that the server refused unread: its
 * close may then arrive as a reset (after the Error frame). */
static void cl_expect_eof_or_reset(client_t *c, const char *what)
{
    int err = 0, rc = cl_recv_rc(c, &err);
    ck_assert_msg(rc == 0 || err == ECONNRESET,
                  "%s: %s: expected the server to close, got %s%s%s (%s)", c->name, what,
                  rc == 1 ? "frame " : "", rc == 1 ? gift_msg_name(c->f.env) : "",
                  rc == 1 ? "" : gift_strerror(rc), err ? strerror(err) : "-");
}

/* ---- message builders ---------------------------------------------- */

static const Gift__Stats *cl_stats(client_t *c);

static void cl_send_hello(client_t *c, uint32_t version, uint32_t rank, uint32_t world,
                          const uint8_t *digest)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = version;
    h.rank = rank;
    h.world_size = world;
    h.client_name = (char *)c->name;
    if (digest != NULL) {
        h.cluster_digest.data = (uint8_t *)digest;
        h.cluster_digest.len = 8;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    cl_send(c, &env, NULL, 0);
}

static const Gift__HelloAck *cl_hello(client_t *c, uint32_t rank, uint32_t world,
                                      const uint8_t *digest)
{
    const Gift__HelloAck *a;
    cl_send_hello(c, GIFT_PROTOCOL_VERSION, rank, world, digest);
    a = cl_expect(c, GIFT__ENVELOPE__MSG_HELLO_ACK, "hello")->env->hello_ack;
    ck_assert_msg(a->protocol_version == GIFT_PROTOCOL_VERSION && a->world_size == world,
                  "%s: HelloAck protocol %u world %u, want %d and %u", c->name, a->protocol_version,
                  a->world_size, GIFT_PROTOCOL_VERSION, world);
    ck_assert_msg(a->server_version != NULL && a->server_version[0] != '\0',
                  "%s: HelloAck without server_version", c->name);
    return a;
}

static uint64_t cl_send_push(client_t *c, uint32_t key, uint32_t chunk, uint64_t step,
                             uint32_t epoch, Gift__Format fmt, uint32_t block, const void *payload,
                             size_t len)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    gift_test_fill_push(&env, &m, &codec, key, chunk, step, epoch, fmt, block, ++c->seq);
    cl_send(c, &env, payload, len);
    return m.seq;
}

static uint64_t cl_send_pull(client_t *c, uint32_t key, uint32_t chunk, uint64_t step,
                             uint32_t have_epoch)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Pull m = GIFT__PULL__INIT;
    gift_test_fill_pull(&env, &m, key, chunk, step, have_epoch, ++c->seq);
    cl_send(c, &env, NULL, 0);
    return m.seq;
}

static uint64_t cl_send_sketch(client_t *c, uint32_t key, uint64_t step, uint32_t epoch,
                               double trace, uint32_t din, uint32_t ks, const float *y)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Sketch m = GIFT__SKETCH__INIT;
    gift_test_fill_sketch(&env, &m, key, step, epoch, trace, din, ks, ++c->seq);
    cl_send(c, &env, y, (size_t)din * ks * sizeof(float));
    return m.seq;
}

static uint64_t cl_send_geometry_request(client_t *c, uint32_t key, uint32_t epoch)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__GeometryRequest m = GIFT__GEOMETRY_REQUEST__INIT;
    m.key = key;
    m.epoch = epoch;
    m.seq = ++c->seq;
    env.msg_case = GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST;
    env.geometry_request = &m;
    cl_send(c, &env, NULL, 0);
    return m.seq;
}

/* StatsRequest, then the Stats answer (valid until the next receive). */
static const Gift__Stats *cl_stats(client_t *c)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest m = GIFT__STATS_REQUEST__INIT;
    const Gift__Stats *st;
    m.seq = ++c->seq;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &m;
    cl_send(c, &env, NULL, 0);
    st = cl_expect(c, GIFT__ENVELOPE__MSG_STATS, "stats")->env->stats;
    ck_assert_msg(st->seq == m.seq, "%s: Stats seq %llu, want %llu", c->name,
                  (unsigned long long)st->seq, (unsigned long long)m.seq);
    return st;
}

static void cl_expect_push_ack(client_t *c, uint32_t key, uint32_t chunk, uint64_t step,
                               uint64_t seq, int duplicate, const char *what)
{
    const Gift__PushAck *a = cl_expect(c, GIFT__ENVELOPE__MSG_PUSH_ACK, what)->env->push_ack;
    ck_assert_msg(a->key == key && a->chunk == chunk && a->step == step && a->seq == seq &&
                      (int)a->duplicate == duplicate,
                  "%s: %s: PushAck key %u chunk %u step %llu seq %llu dup %d, want %u %u %llu "
                  "%llu %d",
                  c->name, what, a->key, a->chunk, (unsigned long long)a->step,
                  (unsigned long long)a->seq, a->duplicate, key, chunk, (unsigned long long)step,
                  (unsigned long long)seq, duplicate);
}

/* Polls Stats until the shard counts n connections (accepts race with the
 * requests of connections that already exist). */
static void wait_connections(client_t *c, uint32_t n)
{
    double end = now_ms() + 3000;
    uint32_t got;
    while ((got = cl_stats(c)->connections) != n && now_ms() < end)
        sleep_ms(10);
    ck_assert_msg(got == n, "%s: the shard counts %u connections, want %u", c->name, got, n);
}

/* ------------------------------------------------------------------ */
/* Clusters: tensor lists, Declare, payloads                             */
/* ------------------------------------------------------------------ */

#define MAX_T 8
#define MAX_C 16
#define MAX_RANKS 2

typedef struct tspec {
    const char *name;
    uint32_t rows, cols;
    Gift__Format push, pull;
    uint32_t push_block, pull_block;
    int geometry;
    uint32_t rank, basis_cols, refresh;
    uint64_t seed;
} tspec_t;

/* Short names for the tables. */
#define F32 GIFT__FORMAT__FORMAT_F32
#define BF16 GIFT__FORMAT__FORMAT_BF16
#define E4M3 GIFT__FORMAT__FORMAT_FP8_E4M3
#define NVFP4 GIFT__FORMAT__FORMAT_NVFP4

/* A chunk on this shard: {key, chunk, row_begin, rows}. */
typedef struct cspec {
    uint32_t key, chunk, row_begin, rows;
} cspec_t;

/* Holds pointers into itself: initialise in place, never copy. */
typedef struct cluster {
    const tspec_t *ts;
    const cspec_t *cs;
    size_t nt, nc;
    Gift__TensorDecl td[MAX_T];
    Gift__TensorDecl *tdp[MAX_T];
    Gift__Codec push[MAX_T], pull[MAX_T];
    Gift__ChunkDecl cd[MAX_C];
    Gift__ChunkDecl *cdp[MAX_C];
    uint8_t digest[8];
} cluster_t;

static void cluster_init(cluster_t *cl, const tspec_t *ts, size_t nt, const cspec_t *cs, size_t nc)
{
    ck_assert(nt <= MAX_T && nc <= MAX_C);
    memset(cl, 0, sizeof *cl);
    cl->ts = ts;
    cl->cs = cs;
    cl->nt = nt;
    cl->nc = nc;
    for (size_t i = 0; i < nt; i++) {
        Gift__TensorDecl *d = &cl->td[i];
        gift__tensor_decl__init(d);
        gift__codec__init(&cl->push[i]);
        gift__codec__init(&cl->pull[i]);
        cl->push[i].format = ts[i].push;
        cl->push[i].block = ts[i].push_block;
        cl->pull[i].format = ts[i].pull;
        cl->pull[i].block = ts[i].pull_block;
        d->key = (uint32_t)i;
        d->name = (char *)ts[i].name;
        d->rows = ts[i].rows;
        d->cols = ts[i].cols;
        d->push_codec = &cl->push[i];
        d->pull_codec = &cl->pull[i];
        d->geometry = ts[i].geometry;
        d->rank = ts[i].rank;
        d->basis_cols = ts[i].basis_cols;
        d->refresh = ts[i].refresh;
        d->seed = ts[i].seed;
        cl->tdp[i] = d;
    }
    for (size_t i = 0; i < nc; i++) {
        gift__chunk_decl__init(&cl->cd[i]);
        cl->cd[i].key = cs[i].key;
        cl->cd[i].chunk = cs[i].chunk;
        cl->cd[i].row_begin = cs[i].row_begin;
        cl->cd[i].rows = cs[i].rows;
        cl->cdp[i] = &cl->cd[i];
    }
    gift_digest_bytes(gift_digest_tensors(cl->tdp, nt), cl->digest);
}

static void cl_send_declare(client_t *c, const cluster_t *cl, const uint8_t *digest)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Declare d = GIFT__DECLARE__INIT;
    d.n_tensors = cl->nt;
    d.tensors = (Gift__TensorDecl **)cl->tdp;
    d.n_chunks = cl->nc;
    d.chunks = (Gift__ChunkDecl **)cl->cdp;
    d.digest.data = (uint8_t *)digest;
    d.digest.len = 8;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
    env.declare = &d;
    cl_send(c, &env, NULL, 0);
}

static void cl_declare(client_t *c, const cluster_t *cl)
{
    const Gift__DeclareAck *a;
    cl_send_declare(c, cl, cl->digest);
    a = cl_expect(c, GIFT__ENVELOPE__MSG_DECLARE_ACK, "declare")->env->declare_ack;
    ck_assert_msg(a->tensors == cl->nt && a->chunks == cl->nc,
                  "%s: DeclareAck %u tensors %u chunks, want %zu %zu", c->name, a->tensors,
                  a->chunks, cl->nt, cl->nc);
}

static gift_codec_params_t codec_params(Gift__Format f, uint32_t block)
{
    gift_codec_params_t p;
    memset(&p, 0, sizeof p);
    p.fmt = (gift_format_t)f; /* the wire enum and gift_format_t share values */
    p.block = block;
    return p;
}

static size_t chunk_n(const cluster_t *cl, size_t i)
{
    return (size_t)cl->cs[i].rows * cl->ts[cl->cs[i].key].cols;
}

static size_t payload_size(Gift__Format f, uint32_t block, size_t n)
{
    gift_codec_params_t p = codec_params(f, block);
    gift_layout_t l;
    ck_assert_msg(gift_layout(&p, n, &l) == 0, "gift_layout(%d, %zu)", (int)f, n);
    return l.total;
}

/* ------------------------------------------------------------------ */
/* One synchronous step over all chunks of a cluster                     */
/* ------------------------------------------------------------------ */

typedef struct stepctx {
    const cluster_t *cl;
    int nranks;
    uint64_t step;
    uint32_t push_epoch[MAX_C];   /* epoch every rank pushes (and the reply carries) */
    uint32_t latest_epoch[MAX_C]; /* PullReply.latest_epoch expected */
    float *x[MAX_RANKS][MAX_C];   /* the rank's gradient chunk */
    uint8_t *push[MAX_RANKS][MAX_C];
    size_t push_len[MAX_C], pull_len[MAX_C];
    uint64_t push_seq[MAX_RANKS][MAX_C], pull_seq[MAX_RANKS][MAX_C];
    int acked[MAX_RANKS][MAX_C];
    uint8_t *reply[MAX_RANKS][MAX_C]; /* copies of the PullReply payloads */
} stepctx_t;

/* Generates every rank's chunks for step (distinct, reproducible values) and
 * encodes them with the push codecs. Epochs default to 0. */
static void step_prepare(stepctx_t *x, const cluster_t *cl, int nranks, uint64_t step)
{
    memset(x, 0, sizeof *x);
    x->cl = cl;
    x->nranks = nranks;
    x->step = step;
    for (size_t i = 0; i < cl->nc; i++) {
        const tspec_t *t = &cl->ts[cl->cs[i].key];
        gift_codec_params_t pp = codec_params(t->push, t->push_block);
        size_t n = chunk_n(cl, i);
        x->push_len[i] = payload_size(t->push, t->push_block, n);
        x->pull_len[i] = payload_size(t->pull, t->pull_block, n);
        for (int r = 0; r < nranks; r++) {
            uint64_t s = 0x1234567ull ^ ((uint64_t)r << 56) ^ (step << 24) ^
                         ((uint64_t)cl->cs[i].key << 8) ^ cl->cs[i].chunk;
            float scale = 0.5f + (float)cl->cs[i].key;
            int rc;
            x->x[r][i] = malloc(n * sizeof(float));
            x->push[r][i] = malloc(x->push_len[i]);
            ck_assert(x->x[r][i] != NULL && x->push[r][i] != NULL);
            for (size_t e = 0; e < n; e++)
                x->x[r][i][e] = scale * rnd_unit(&s);
            rc = gift_encode(&pp, x->x[r][i], n, x->push[r][i], x->push_len[i]);
            ck_assert_msg(rc == 0, "gift_encode: %s", gift_strerror(rc));
        }
    }
}

static void step_free(stepctx_t *x)
{
    for (int r = 0; r < MAX_RANKS; r++)
        for (size_t i = 0; i < MAX_C; i++) {
            free(x->x[r][i]);
            free(x->push[r][i]);
            free(x->reply[r][i]);
        }
    memset(x, 0, sizeof *x);
}

/* Rank r pushes every chunk, then pulls every chunk of the step. */
static void step_send(stepctx_t *x, client_t *c, int r)
{
    const cluster_t *cl = x->cl;
    for (size_t i = 0; i < cl->nc; i++) {
        const tspec_t *t = &cl->ts[cl->cs[i].key];
        x->push_seq[r][i] =
            cl_send_push(c, cl->cs[i].key, cl->cs[i].chunk, x->step, x->push_epoch[i], t->push,
                         t->push_block, x->push[r][i], x->push_len[i]);
    }
    for (size_t i = 0; i < cl->nc; i++)
        x->pull_seq[r][i] =
            cl_send_pull(c, cl->cs[i].key, cl->cs[i].chunk, x->step, x->latest_epoch[i]);
}

/* Reads rank r's frames until all its PushAcks (and, with replies set, all
 * its PullReplies) have arrived, checking each as it comes. */
static void step_wait(stepctx_t *x, client_t *c, int r, int replies)
{
    const cluster_t *cl = x->cl;
    for (;;) {
        size_t want = 0, i;
        const gift_frame_t *f;
        for (i = 0; i < cl->nc; i++)
            want += !x->acked[r][i] + (replies && x->reply[r][i] == NULL);
        if (want == 0)
            return;
        {
            int err = 0, rc = cl_recv_rc(c, &err);
            ck_assert_msg(rc == 1, "%s: step %llu: %zu frames missing, got %s (%s)%s", c->name,
                          (unsigned long long)x->step, want, rc == 0 ? "EOF" : gift_strerror(rc),
                          err ? strerror(err) : "-", closed_why(rc));
        }
        f = &c->f;
        if (f->env->msg_case == GIFT__ENVELOPE__MSG_PUSH_ACK) {
            const Gift__PushAck *a = f->env->push_ack;
            for (i = 0; i < cl->nc && x->push_seq[r][i] != a->seq; i++)
                ;
            ck_assert_msg(i < cl->nc && !x->acked[r][i], "%s: unexpected PushAck seq %llu", c->name,
                          (unsigned long long)a->seq);
            ck_assert_msg(a->key == cl->cs[i].key && a->chunk == cl->cs[i].chunk &&
                              a->step == x->step && !a->duplicate,
                          "%s: PushAck key %u chunk %u step %llu dup %d, want %u %u %llu 0",
                          c->name, a->key, a->chunk, (unsigned long long)a->step, a->duplicate,
                          cl->cs[i].key, cl->cs[i].chunk, (unsigned long long)x->step);
            x->acked[r][i] = 1;
        } else if (f->env->msg_case == GIFT__ENVELOPE__MSG_PULL_REPLY) {
            const Gift__PullReply *p = f->env->pull_reply;
            const tspec_t *t;
            for (i = 0; i < cl->nc && x->pull_seq[r][i] != p->seq; i++)
                ;
            ck_assert_msg(replies && i < cl->nc && x->reply[r][i] == NULL,
                          "%s: unexpected PullReply seq %llu (key %u chunk %u step %llu)", c->name,
                          (unsigned long long)p->seq, p->key, p->chunk,
                          (unsigned long long)p->step);
            t = &cl->ts[cl->cs[i].key];
            ck_assert_msg(p->key == cl->cs[i].key && p->chunk == cl->cs[i].chunk &&
                              p->step == x->step && p->contributors == (uint32_t)x->nranks,
                          "%s: PullReply key %u chunk %u step %llu contributors %u, want %u %u "
                          "%llu %d",
                          c->name, p->key, p->chunk, (unsigned long long)p->step, p->contributors,
                          cl->cs[i].key, cl->cs[i].chunk, (unsigned long long)x->step, x->nranks);
            ck_assert_msg(p->epoch == x->push_epoch[i] && p->latest_epoch == x->latest_epoch[i],
                          "%s: PullReply key %u chunk %u step %llu: epoch %u latest %u, want %u "
                          "%u",
                          c->name, p->key, p->chunk, (unsigned long long)p->step, p->epoch,
                          p->latest_epoch, x->push_epoch[i], x->latest_epoch[i]);
            ck_assert_msg(
                p->codec != NULL && p->codec->format == t->pull &&
                    (t->pull != GIFT__FORMAT__FORMAT_FP8_E4M3 || p->codec->block == t->pull_block),
                "%s: PullReply key %u: codec %d/%u, want %d/%u", c->name, p->key,
                p->codec ? (int)p->codec->format : -1, p->codec ? p->codec->block : 0, (int)t->pull,
                t->pull_block);
            ck_assert_msg(f->payload_len == x->pull_len[i],
                          "%s: PullReply key %u chunk %u: %llu payload bytes, want %zu", c->name,
                          p->key, p->chunk, (unsigned long long)f->payload_len, x->pull_len[i]);
            x->reply[r][i] = malloc(x->pull_len[i]);
            ck_assert(x->reply[r][i] != NULL);
            memcpy(x->reply[r][i], f->payload, x->pull_len[i]);
        } else if (f->env->msg_case == GIFT__ENVELOPE__MSG_ERROR) {
            ck_abort_msg("%s: step %llu: Error %d (%s) key %u chunk %u seq %llu: %s", c->name,
                         (unsigned long long)x->step, f->env->error->code,
                         gift_strerror(f->env->error->code), f->env->error->key,
                         f->env->error->chunk, (unsigned long long)f->env->error->seq,
                         f->env->error->text);
        } else {
            ck_abort_msg("%s: step %llu: unexpected %s", c->name, (unsigned long long)x->step,
                         gift_msg_name(f->env));
        }
    }
}

/* Every rank got the same bytes; they are the pull encoding of the FP32 mean
 * of the decoded pushes; for an f32 pull codec the decoded mean equals the
 * exact mean of the rank's values within 1e-6 relative. */
static void step_verify(const stepctx_t *x)
{
    const cluster_t *cl = x->cl;
    for (size_t i = 0; i < cl->nc; i++) {
        const tspec_t *t = &cl->ts[cl->cs[i].key];
        gift_codec_params_t pp = codec_params(t->push, t->push_block);
        gift_codec_params_t qp = codec_params(t->pull, t->pull_block);
        size_t n = chunk_n(cl, i), bad = 0;
        float *acc = calloc(n, sizeof(float));
        uint8_t *want = calloc(1, x->pull_len[i]);
        const float inv = 1.0f / (float)x->nranks;
        int rc;

        ck_assert(acc != NULL && want != NULL);
        for (int r = 1; r < x->nranks; r++)
            ck_assert_msg(memcmp(x->reply[0][i], x->reply[r][i], x->pull_len[i]) == 0,
                          "step %llu key %u chunk %u: ranks 0 and %d got different bytes",
                          (unsigned long long)x->step, cl->cs[i].key, cl->cs[i].chunk, r);
        for (int r = 0; r < x->nranks; r++) {
            rc = gift_decode_acc(&pp, x->push[r][i], x->push_len[i], n, acc);
            ck_assert_msg(rc == 0, "gift_decode_acc: %s", gift_strerror(rc));
        }
        for (size_t e = 0; e < n; e++)
            acc[e] = acc[e] * inv + 0.0f; /* the shard's mean (shard.h) */
        rc = gift_encode(&qp, acc, n, want, x->pull_len[i]);
        ck_assert_msg(rc == 0, "gift_encode: %s", gift_strerror(rc));
        for (size_t b = 0; b < x->pull_len[i]; b++)
            bad += want[b] != x->reply[0][i][b];
        ck_assert_msg(bad == 0,
                      "step %llu key %u (%s) chunk %u: %zu of %zu reply bytes differ from the "
                      "%s encoding of the FP32 mean",
                      (unsigned long long)x->step, cl->cs[i].key, t->name, cl->cs[i].chunk, bad,
                      x->pull_len[i], gift_format_name(qp.fmt));
        if (t->push == GIFT__FORMAT__FORMAT_F32 && t->pull == GIFT__FORMAT__FORMAT_F32) {
            rc = gift_decode(&qp, x->reply[0][i], x->pull_len[i], n, acc);
            ck_assert_msg(rc == 0, "gift_decode: %s", gift_strerror(rc));
            for (size_t e = 0; e < n; e++) {
                double exact = 0.0;
                for (int r = 0; r < x->nranks; r++)
                    exact += (double)x->x[r][i][e];
                exact /= x->nranks;
                ck_assert_msg(fabs((double)acc[e] - exact) <= 1e-6 * fabs(exact),
                              "step %llu key %u chunk %u elem %zu: mean %.9g, exact %.9g",
                              (unsigned long long)x->step, cl->cs[i].key, cl->cs[i].chunk, e,
                              (double)acc[e], exact);
            }
        }
        free(acc);
        free(want);
    }
}

/* ------------------------------------------------------------------ */
/* HTTP                                                                  */
/* ------------------------------------------------------------------ */

/* Sends req to the HTTP port and reads the response until the server
 * closes. Returns the status code; the whole response in *resp (malloc). */
static int http_request(const char *req, char **resp)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int fd = tcp_connect(D.http_port), status = -1, rc;
    ck_assert_msg(fd >= 0, "connect to http port %d: %s", D.http_port, strerror(-fd));
    ck_assert(buf != NULL);
    rc = send_all(fd, req, strlen(req));
    ck_assert_msg(rc == 0, "http send: %s", strerror(-rc));
    for (;;) {
        ssize_t n;
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert(buf != NULL);
        }
        n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        ck_assert_msg(n >= 0, "http recv: %s", strerror(errno));
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    ck_assert_msg(sscanf(buf, "HTTP/1.%*d %d", &status) == 1, "not an HTTP response: \"%.200s\"",
                  buf);
    if (resp)
        *resp = buf;
    else
        free(buf);
    return status;
}

/* The value of the first sample line of /metrics that starts with prefix
 * (a metric name with its opening labels, or the name and a space). */
static double metric(const char *text, const char *prefix)
{
    const char *p = text;
    size_t pl = strlen(prefix);
    while (p != NULL && *p != '\0') {
        if (strncmp(p, prefix, pl) == 0) {
            /* The value follows the last space (label values may hold spaces). */
            const char *eol = strchr(p, '\n'), *v = NULL;
            for (const char *q = p; *q != '\0' && (eol == NULL || q < eol); q++)
                if (*q == ' ')
                    v = q;
            ck_assert(v != NULL);
            return strtod(v + 1, NULL);
        }
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    ck_abort_msg("no metric line starting with \"%s\"", prefix);
    return 0.0;
}

static char *metrics_get(void)
{
    char *resp = NULL;
    int st = http_request("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &resp);
    ck_assert_msg(st == 200, "GET /metrics: %d", st);
    return resp;
}

/* ------------------------------------------------------------------ */
/* Fixtures                                                              */
/* ------------------------------------------------------------------ */

static void setup_world1(void)
{
    static const char *const a[] = {"--world-size", "1", NULL};
    daemon_start(a);
}

static void setup_world2(void)
{
    static const char *const a[] = {"--world-size", "2", NULL};
    daemon_start(a);
}

static void setup_session(void)
{
    static const char *const a[] = {
        "--world-size", "2", "--num-shards", "2", "--shard-id", "0", NULL};
    daemon_start(a);
}

static void setup_maxconn(void)
{
    static const char *const a[] = {"--max-connections", "2", NULL};
    daemon_start(a);
}

static void setup_backpressure(void)
{
    static const char *const a[] = {"--world-size", "1", "--write-queue-bytes", "64k", NULL};
    daemon_start(a);
}

/* ------------------------------------------------------------------ */
/* Full session, world size 2                                            */
/* ------------------------------------------------------------------ */

/* Shard 0 of 2. Tensor 4 is geometry-enabled with its chunk 0 here (this
 * shard owns its geometry); tensor 5 is geometry-enabled with only chunk 1
 * here (owned elsewhere). */
static const tspec_t S_TENSORS[] = {
    {.name = "embed.f32", .rows = 8, .cols = 16, .push = F32, .pull = F32},
    {.name = "attn.bf16", .rows = 4, .cols = 64, .push = BF16, .pull = BF16},
    {.name = "mlp.e4m3", .rows = 3, .cols = 100, .push = E4M3, .pull = E4M3, .pull_block = 32},
    {.name = "head.nvfp4", .rows = 5, .cols = 48, .push = NVFP4, .pull = BF16},
    {.name = "proj.geo",
     .rows = 16,
     .cols = 32,
     .push = F32,
     .pull = F32,
     .geometry = 1,
     .rank = 8,
     .basis_cols = 12,
     .refresh = 2,
     .seed = 7},
    {.name = "out.geo_remote",
     .rows = 8,
     .cols = 16,
     .push = E4M3,
     .pull = NVFP4,
     .geometry = 1,
     .seed = 11},
};
static const cspec_t S_CHUNKS[] = {
    {0, 0, 0, 4}, {0, 1, 4, 4}, {1, 0, 0, 4}, {2, 0, 0, 3},
    {3, 0, 0, 5}, {4, 0, 0, 8}, {5, 1, 4, 4},
};
#define S_NT (sizeof S_TENSORS / sizeof S_TENSORS[0])
#define S_NC (sizeof S_CHUNKS / sizeof S_CHUNKS[0])
#define S_GEO_KEY 4u
#define S_GEO_CHUNK 5 /* index in S_CHUNKS */
#define S_STEPS 6
#define S_REFRESH 2 /* the step at which both ranks sketch */
#define S_DIN 32
#define S_K 8
#define S_KS 12
#define S_SKETCH_ROWS 24

/* Requests key's geometry and checks the header; returns the payload (malloc). */
static float *geometry_fetch(client_t *c, uint32_t key, uint32_t epoch, uint64_t valid_from,
                             int identity, Gift__Geometry *out)
{
    uint64_t seq = cl_send_geometry_request(c, key, epoch);
    const gift_frame_t *f = cl_expect(c, GIFT__ENVELOPE__MSG_GEOMETRY, "geometry request");
    const Gift__Geometry *g = f->env->geometry;
    size_t want = ((size_t)S_DIN * S_KS + S_KS) * sizeof(float);
    float *p;
    ck_assert_msg(g->key == key && g->seq == seq && g->epoch == epoch &&
                      g->valid_from_step == valid_from && (int)g->identity == identity,
                  "%s: Geometry key %u seq %llu epoch %u valid_from %llu identity %d, want %u "
                  "%llu %u %llu %d",
                  c->name, g->key, (unsigned long long)g->seq, g->epoch,
                  (unsigned long long)g->valid_from_step, g->identity, key, (unsigned long long)seq,
                  epoch, (unsigned long long)valid_from, identity);
    ck_assert_msg(g->din == S_DIN && g->rank == S_K && g->basis_cols == S_KS,
                  "%s: Geometry din %u rank %u basis_cols %u, want %d %d %d", c->name, g->din,
                  g->rank, g->basis_cols, S_DIN, S_K, S_KS);
    ck_assert_msg(f->payload_len == want, "%s: Geometry payload %llu bytes, want %zu", c->name,
                  (unsigned long long)f->payload_len, want);
    p = malloc(want);
    ck_assert(p != NULL);
    memcpy(p, f->payload, want);
    if (out != NULL)
        *out = *g; /* scalars only are used */
    return p;
}

/* U (din x ks) has orthonormal columns. */
static void check_orthonormal(const float *U, int din, int ks, const char *what)
{
    for (int a = 0; a < ks; a++)
        for (int b = 0; b < ks; b++) {
            double d = 0.0;
            for (int r = 0; r < din; r++)
                d += (double)U[r * ks + a] * U[r * ks + b];
            ck_assert_msg(fabs(d - (a == b ? 1.0 : 0.0)) < 1e-4, "%s: U column %d . column %d = %g",
                          what, a, b, d);
        }
}

START_TEST(test_session_world2)
{
    static cluster_t cl;
    client_t c[2];
    const Gift__HelloAck *ha;
    float *q, *y[2], *geo1[2] = {NULL, NULL}, x[S_SKETCH_ROWS * S_DIN], work[S_SKETCH_ROWS * S_KS];
    double trace[2];
    Gift__Geometry g1;
    const Gift__Stats *st;

    cluster_init(&cl, S_TENSORS, S_NT, S_CHUNKS, S_NC);
    cl_open(&c[0], "rank0");
    cl_open(&c[1], "rank1");

    /* Rank 0 says hello with the digest before anything is declared, rank 1
     * after, when the shard checks it. Both declare; the second declaration
     * is the same list and is acknowledged. */
    ha = cl_hello(&c[0], 0, 2, cl.digest);
    ck_assert_msg(ha->shard_id == 0 && ha->num_shards == 2 &&
                      ha->max_frame_bytes == GIFT_MAX_FRAME_DEFAULT,
                  "HelloAck shard %u of %u, max_frame_bytes %llu", ha->shard_id, ha->num_shards,
                  (unsigned long long)ha->max_frame_bytes);
    cl_declare(&c[0], &cl);
    cl_hello(&c[1], 1, 2, cl.digest);
    cl_declare(&c[1], &cl);

    /* Epoch 0: the identity transform and the random starting basis Q,
     * which the sketches are taken against. */
    q = geometry_fetch(&c[0], S_GEO_KEY, 0, 0, 1, NULL);
    check_orthonormal(q, S_DIN, S_KS, "epoch 0 basis");
    /* Only the owner of chunk 0 answers geometry requests. */
    cl_send_geometry_request(&c[0], 5, 0);
    cl_expect_error(&c[0], GIFT_ENOKEY, 0, "geometry of a tensor owned elsewhere");
    cl_send_geometry_request(&c[0], 0, 0);
    cl_expect_error(&c[0], GIFT_ENOKEY, 0, "geometry of a tensor without geometry");
    cl_send_geometry_request(&c[1], 42, 0);
    cl_expect_error(&c[1], GIFT_ENOKEY, 0, "geometry of an unknown tensor");

    for (int r = 0; r < 2; r++) {
        uint64_t s = 0xABCDEF00ull + (uint64_t)r;
        int rc;
        for (size_t e = 0; e < S_SKETCH_ROWS * S_DIN; e++)
            x[e] = rnd_unit(&s);
        y[r] = malloc(S_DIN * S_KS * sizeof(float));
        ck_assert(y[r] != NULL);
        rc = gift_sketch(x, S_SKETCH_ROWS, S_DIN, q, S_KS, y[r], &trace[r], work);
        ck_assert_msg(rc == 0, "gift_sketch: %s", gift_strerror(rc));
    }

    for (uint64_t step = 0; step < S_STEPS; step++) {
        stepctx_t sx;
        uint32_t have = step >= S_REFRESH + 1 ? 1 : 0;
        step_prepare(&sx, &cl, 2, step);
        /* Tensor 4 chunk 0: pushes of steps after the refresh use epoch 1;
         * the owner advertises epoch 1 from the refresh step's replies on. */
        sx.push_epoch[S_GEO_CHUNK] = have;
        sx.latest_epoch[S_GEO_CHUNK] = step >= S_REFRESH ? 1 : 0;
        for (int r = 0; r < 2; r++) {
            if (step == S_REFRESH) {
                /* The sketch goes before the chunk-0 push of the same step. */
                uint64_t seq =
                    cl_send_sketch(&c[r], S_GEO_KEY, step, 0, trace[r], S_DIN, S_KS, y[r]);
                const Gift__SketchAck *a =
                    cl_expect(&c[r], GIFT__ENVELOPE__MSG_SKETCH_ACK, "sketch")->env->sketch_ack;
                ck_assert_msg(
                    a->key == S_GEO_KEY && a->step == step && a->seq == seq && !a->duplicate,
                    "rank %d SketchAck key %u step %llu seq %llu dup %d", r, a->key,
                    (unsigned long long)a->step, (unsigned long long)a->seq, a->duplicate);
                if (r == 0) {
                    /* A repeated sketch is acknowledged and ignored. */
                    seq = cl_send_sketch(&c[0], S_GEO_KEY, step, 0, trace[0], S_DIN, S_KS, y[0]);
                    a = cl_expect(&c[0], GIFT__ENVELOPE__MSG_SKETCH_ACK, "sketch again")
                            ->env->sketch_ack;
                    ck_assert_msg(a->seq == seq && a->duplicate,
                                  "repeated sketch: seq %llu dup %d, want %llu 1",
                                  (unsigned long long)a->seq, a->duplicate,
                                  (unsigned long long)seq);
                }
            }
            if (step == S_REFRESH + 1 && r == 0) {
                /* A push still encoded under the old epoch is refused. */
                const Gift__Error *e;
                uint64_t seq = cl_send_push(&c[0], S_GEO_KEY, 0, step, 0, GIFT__FORMAT__FORMAT_F32,
                                            0, sx.push[0][S_GEO_CHUNK], sx.push_len[S_GEO_CHUNK]);
                e = cl_expect_error(&c[0], GIFT_EEPOCH, 0, "push under a stale epoch");
                ck_assert_msg(e->key == S_GEO_KEY && e->chunk == 0 && e->step == step &&
                                  e->seq == seq,
                              "EEPOCH context key %u chunk %u step %llu seq %llu", e->key, e->chunk,
                              (unsigned long long)e->step, (unsigned long long)e->seq);
            }
            step_send(&sx, &c[r], r);
            /* Rank 0's pulls park until rank 1 has pushed. */
            step_wait(&sx, &c[r], r, r == 1);
        }
        step_wait(&sx, &c[0], 0, 1);
        step_verify(&sx);
        step_free(&sx);

        if (step == S_REFRESH) {
            /* Both ranks fetch the new epoch: the same bytes, valid from the
             * step after the refresh. */
            for (int r = 0; r < 2; r++)
                geo1[r] = geometry_fetch(&c[r], S_GEO_KEY, 1, S_REFRESH + 1, 0, &g1);
            ck_assert_msg(memcmp(geo1[0], geo1[1], ((size_t)S_DIN * S_KS + S_KS) * 4) == 0,
                          "ranks fetched different epoch-1 geometries");
            ck_assert_msg(fabs(g1.trace - (trace[0] + trace[1])) <= 1e-9 * g1.trace,
                          "epoch 1 trace %.17g, want %.17g", g1.trace, trace[0] + trace[1]);
            check_orthonormal(geo1[0], S_DIN, S_KS, "epoch 1 basis");
            ck_assert_msg(memcmp(geo1[0], q, (size_t)S_DIN * S_KS * 4) != 0,
                          "epoch 1 kept the epoch 0 basis");
            for (int j = 0; j < S_KS; j++) {
                float l = geo1[0][S_DIN * S_KS + j];
                ck_assert_msg(isfinite(l) && l >= -1e-5f &&
                                  (j == 0 || l <= geo1[0][S_DIN * S_KS + j - 1]),
                              "epoch 1 lambda[%d] = %g not descending and >= 0", j, (double)l);
            }
        }
    }

    st = cl_stats(&c[0]);
    ck_assert_msg(st->shard_id == 0 && st->connections == 2 && st->pushes == 2 * S_NC * S_STEPS &&
                      st->steps_finished == S_NC * S_STEPS && st->pulls >= 2 * S_NC * S_STEPS,
                  "Stats shard %u connections %u pushes %llu steps %llu pulls %llu", st->shard_id,
                  st->connections, (unsigned long long)st->pushes,
                  (unsigned long long)st->steps_finished, (unsigned long long)st->pulls);
    ck_assert_msg(st->n_tensors == S_NT, "Stats has %zu tensors", st->n_tensors);
    for (size_t i = 0; i < S_NT; i++) {
        const Gift__TensorStats *ts = st->tensors[i];
        ck_assert_msg(
            ts->key == i && strcmp(ts->name, S_TENSORS[i].name) == 0 &&
                ts->step_finished == S_STEPS && ts->n_missing_ranks == 2 &&
                ts->epoch == (i == S_GEO_KEY ? 1u : 0u) && ts->bytes_in > 0 && ts->bytes_out > 0,
            "TensorStats %zu: key %u name %s step %llu missing %zu epoch %u in %llu "
            "out %llu",
            i, ts->key, ts->name, (unsigned long long)ts->step_finished, ts->n_missing_ranks,
            ts->epoch, (unsigned long long)ts->bytes_in, (unsigned long long)ts->bytes_out);
    }

    free(q);
    for (int r = 0; r < 2; r++) {
        free(y[r]);
        free(geo1[r]);
        cl_close(&c[r]);
    }
}
END_TEST

/* ------------------------------------------------------------------ */
/* Bad clients next to good ones                                         */
/* ------------------------------------------------------------------ */

static const tspec_t B_TENSORS[] = {
    {.name = "b.f32", .rows = 16, .cols = 16, .push = F32, .pull = F32},
    {.name = "b.e4m3", .rows = 8, .cols = 64, .push = E4M3, .pull = F32},
};
static const cspec_t B_CHUNKS[] = {{0, 0, 0, 16}, {1, 0, 0, 8}};
static cluster_t B_CL;
/* The good workers. A bad request that needs a rank comes on rank 1's own
 * connection: a second connection acting as a live rank is refused whole
 * (one live connection per rank), before the request is looked at. */
static client_t B_G[2];

/* Rank 1's connection, for a case; bad_rank_give_back returns it. */
static client_t bad_rank_take(void)
{
    return B_G[1];
}

static void bad_rank_give_back(const client_t *c)
{
    B_G[1] = *c;
}

/* A fresh connection; the bad cases open their own. */
static void bad_open(client_t *c, const char *name)
{
    cl_open(c, name);
}

static void bad_fatal_close(client_t *c, int code, const char *what)
{
    cl_expect_error(c, code, 1, what);
    cl_expect_eof(c, what);
    cl_close(c);
}

static void send_raw(client_t *c, const void *p, size_t len)
{
    int rc = send_all(c->fd, p, len);
    ck_assert_msg(rc == 0, "%s: send: %s", c->name, strerror(-rc));
}

static void preamble(uint8_t out[16], uint32_t hlen, uint64_t plen)
{
    memcpy(out, GIFT_FRAME_MAGIC, 4);
    for (int i = 0; i < 4; i++)
        out[4 + i] = (uint8_t)(hlen >> (8 * i));
    for (int i = 0; i < 8; i++)
        out[8 + i] = (uint8_t)(plen >> (8 * i));
}

static void bad_garbage(void)
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: giftd\r\n\r\n";
    client_t c;
    bad_open(&c, "garbage");
    send_raw(&c, req, sizeof req - 1);
    bad_fatal_close(&c, GIFT_EBADMAGIC, "garbage bytes");
}

static void bad_frame_size(void)
{
    uint8_t p[16];
    client_t c;
    bad_open(&c, "framesize");
    /* Only the preamble: the answer must come before any payload does. */
    preamble(p, 8, 1ull << 40);
    send_raw(&c, p, sizeof p);
    bad_fatal_close(&c, GIFT_EFRAMESIZE, "payload_len 2^40");
}

static void bad_header_size(void)
{
    uint8_t p[16];
    client_t c;
    bad_open(&c, "hdrsize");
    preamble(p, 1u << 20, 0);
    send_raw(&c, p, sizeof p);
    bad_fatal_close(&c, GIFT_EHDRSIZE, "header_len 1 MiB");
}

static void bad_header_zero(void)
{
    uint8_t p[16];
    client_t c;
    bad_open(&c, "hdrzero");
    preamble(p, 0, 4);
    send_raw(&c, p, sizeof p);
    bad_fatal_close(&c, GIFT_EHDRSIZE, "header_len 0");
}

static void bad_header_garbage(void)
{
    uint8_t p[16 + 8];
    client_t c;
    bad_open(&c, "badheader");
    preamble(p, 8, 0);
    memset(p + 16, 0xFF, 8);
    send_raw(&c, p, sizeof p);
    bad_fatal_close(&c, GIFT_EBADHEADER, "undecodable header");
}

/* Sends part of a frame and closes: the server logs it and carries on. */
static void truncated(int hello, size_t cut)
{
    static const char needle[] = "peer closed inside a frame";
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    uint8_t head[256], body[1024];
    long n;
    int before = log_count(needle);
    client_t c;

    bad_open(&c, "truncated");
    if (hello)
        cl_hello(&c, 1, 2, NULL);
    m.key = 0;
    m.step = 1;
    env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
    env.push = &m;
    n = gift_frame_pack_head(&env, sizeof body, head, sizeof head);
    ck_assert(n > 0);
    memset(body, 0x3C, sizeof body);
    if (cut <= (size_t)n) {
        send_raw(&c, head, cut);
    } else {
        send_raw(&c, head, (size_t)n);
        send_raw(&c, body, cut - (size_t)n);
    }
    cl_close(&c);
    ck_assert_msg(log_wait(needle, before + 1, LOG_WAIT_MS),
                  "no \"%s\" in the log after a truncated frame; log %s:\n%s", needle, D.log_path,
                  log_tail());
}

static void bad_truncated_payload(void)
{
    truncated(1, 100 + 64);
}

static void bad_truncated_preamble(void)
{
    truncated(0, 10);
}

/* Request errors are answered and the connection stays usable. */
static void bad_nokey(void)
{
    static const float z[16];
    const Gift__Error *e;
    const Gift__Stats *st;
    uint64_t seq;
    client_t c = bad_rank_take();

    seq = cl_send_push(&c, 99, 0, 0, 0, GIFT__FORMAT__FORMAT_F32, 0, z, sizeof z);
    e = cl_expect_error(&c, GIFT_ENOKEY, 0, "push for an undeclared key");
    ck_assert_msg(e->key == 99 && e->seq == seq, "ENOKEY context key %u seq %llu", e->key,
                  (unsigned long long)e->seq);
    seq = cl_send_pull(&c, 0, 7, 0, 0);
    e = cl_expect_error(&c, GIFT_ENOKEY, 0, "pull for an undeclared chunk");
    ck_assert_msg(e->key == 0 && e->chunk == 7 && e->seq == seq, "ENOKEY context chunk %u seq %llu",
                  e->chunk, (unsigned long long)e->seq);
    st = cl_stats(&c);
    ck_assert_msg(st->connections == 2 && st->n_tensors == 2,
                  "Stats on the erring connection: %u connections, %zu tensors (want 2, 2)",
                  st->connections, st->n_tensors);
    bad_rank_give_back(&c);
}

/* Wrong codec, wrong size, step out of the window, NaN payload: each is
 * refused without touching the accumulator of the step in flight. */
static void bad_push_nonfatal(void)
{
    const Gift__Stats *st = NULL;
    float x[256];
    uint8_t bf[512];
    uint64_t seq, step;
    client_t c = bad_rank_take();

    st = cl_stats(&c);
    step = st->tensors[0]->step_finished; /* the step rank 0 is in */
    for (int i = 0; i < 256; i++)
        x[i] = 1000.0f + (float)i;
    memset(bf, 0, sizeof bf);
    seq = cl_send_push(&c, 0, 0, step, 0, GIFT__FORMAT__FORMAT_BF16, 0, bf, sizeof bf);
    ck_assert(cl_expect_error(&c, GIFT_ECODEC, 0, "push with the wrong codec")->seq == seq);
    seq = cl_send_push(&c, 0, 0, step, 0, GIFT__FORMAT__FORMAT_F32, 0, x, sizeof x - 64);
    ck_assert(cl_expect_error(&c, GIFT_ESHAPE, 0, "push of the wrong size")->seq == seq);
    seq = cl_send_push(&c, 0, 0, step + 2, 0, GIFT__FORMAT__FORMAT_F32, 0, x, sizeof x);
    ck_assert(cl_expect_error(&c, GIFT_ESTEP, 0, "push two steps ahead")->seq == seq);
    seq = cl_send_push(&c, 0, 0, step, 3, GIFT__FORMAT__FORMAT_F32, 0, x, sizeof x);
    ck_assert(cl_expect_error(&c, GIFT_EEPOCH, 0, "push with an epoch on a plain tensor")->seq ==
              seq);
    x[100] = NAN;
    seq = cl_send_push(&c, 0, 0, step, 0, GIFT__FORMAT__FORMAT_F32, 0, x, sizeof x);
    ck_assert(cl_expect_error(&c, GIFT_EBADCODE, 0, "push holding NaN")->seq == seq);
    st = cl_stats(&c);
    ck_assert_msg(st->tensors[0]->n_missing_ranks == 1 && st->tensors[0]->missing_ranks[0] == 1,
                  "after refused pushes rank 1 must still be missing (%zu missing)",
                  st->tensors[0]->n_missing_ranks);
    bad_rank_give_back(&c);
}

static void bad_push_before_hello(void)
{
    static const float z[256];
    client_t c;
    bad_open(&c, "nohello");
    cl_send_push(&c, 0, 0, 0, 0, GIFT__FORMAT__FORMAT_F32, 0, z, sizeof z);
    /* Refused at its preamble: the payload stays unread. */
    cl_expect_error(&c, GIFT_EPROTO, 1, "push before Hello");
    cl_expect_eof_or_reset(&c, "push before Hello");
    cl_close(&c);
}

static void bad_second_hello(void)
{
    client_t c;
    bad_open(&c, "hello2");
    cl_hello(&c, 0, 2, NULL);
    cl_send_hello(&c, GIFT_PROTOCOL_VERSION, 0, 2, NULL);
    bad_fatal_close(&c, GIFT_EPROTO, "second Hello");
}

static void bad_version(void)
{
    client_t c;
    bad_open(&c, "version");
    cl_send_hello(&c, GIFT_PROTOCOL_VERSION + 1, 0, 2, NULL);
    bad_fatal_close(&c, GIFT_EVERSION, "protocol version");
}

static void bad_world(void)
{
    client_t c;
    bad_open(&c, "world");
    cl_send_hello(&c, GIFT_PROTOCOL_VERSION, 0, 3, NULL);
    bad_fatal_close(&c, GIFT_EWORLD, "world size 3 of 2");
    bad_open(&c, "rank");
    cl_send_hello(&c, GIFT_PROTOCOL_VERSION, 2, 2, NULL);
    bad_fatal_close(&c, GIFT_EWORLD, "rank 2 of 2");
}

static void bad_digest(void)
{
    uint8_t d[8];
    client_t c;
    memcpy(d, B_CL.digest, 8);
    d[3] ^= 0x40;
    bad_open(&c, "digest");
    cl_send_hello(&c, GIFT_PROTOCOL_VERSION, 1, 2, d);
    bad_fatal_close(&c, GIFT_EDIGEST, "Hello with another cluster's digest");
}

static void bad_declare_mismatch(void)
{
    static cluster_t other;
    static tspec_t t[2];
    uint8_t d[8];
    client_t c = bad_rank_take();
    memcpy(t, B_TENSORS, sizeof t);
    t[1].cols = 32;
    cluster_init(&other, t, 2, B_CHUNKS, 2);
    cl_send_declare(&c, &other, other.digest);
    cl_expect_error(&c, GIFT_EDIGEST, 0, "declare of another tensor list");
    memcpy(d, B_CL.digest, 8);
    d[0] ^= 1;
    cl_send_declare(&c, &B_CL, d);
    cl_expect_error(&c, GIFT_EDIGEST, 0, "declare with a digest that does not match");
    cl_stats(&c);
    bad_rank_give_back(&c);
}

static void bad_server_message(void)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__PullReply m = GIFT__PULL_REPLY__INIT;
    client_t c;
    bad_open(&c, "servermsg");
    cl_hello(&c, 1, 2, NULL);
    env.msg_case = GIFT__ENVELOPE__MSG_PULL_REPLY;
    env.pull_reply = &m;
    cl_send(&c, &env, NULL, 0);
    bad_fatal_close(&c, GIFT_EPROTO, "a client sending a PullReply");
}

static void bad_pull_payload(void)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Pull m = GIFT__PULL__INIT;
    static const uint8_t junk[32];
    client_t c;
    bad_open(&c, "pullpayload");
    cl_hello(&c, 1, 2, NULL);
    env.msg_case = GIFT__ENVELOPE__MSG_PULL;
    env.pull = &m;
    cl_send(&c, &env, junk, sizeof junk);
    bad_fatal_close(&c, GIFT_EPROTO, "a Pull carrying a payload");
}

typedef struct bad_case {
    const char *name;
    void (*fn)(void);
} bad_case_t;

static const bad_case_t BAD_CASES[] = {
    {"garbage bytes", bad_garbage},
    {"oversized payload length", bad_frame_size},
    {"oversized header length", bad_header_size},
    {"zero header length", bad_header_zero},
    {"undecodable header", bad_header_garbage},
    {"truncated frame, then close", bad_truncated_payload},
    {"truncated preamble, then close", bad_truncated_preamble},
    {"push and pull for an undeclared key", bad_nokey},
    {"refused pushes", bad_push_nonfatal},
    {"push before Hello", bad_push_before_hello},
    {"second Hello", bad_second_hello},
    {"wrong protocol version", bad_version},
    {"wrong world size or rank", bad_world},
    {"wrong cluster digest", bad_digest},
    {"mismatched Declare", bad_declare_mismatch},
    {"server-only message", bad_server_message},
    {"Pull with a payload", bad_pull_payload},
};
#define N_BAD (sizeof BAD_CASES / sizeof BAD_CASES[0])

START_TEST(test_bad_clients)
{
    client_t *g = B_G;
    uint64_t step = 0;
    char *m;

    cluster_init(&B_CL, B_TENSORS, 2, B_CHUNKS, 2);
    cl_open(&g[0], "good0");
    cl_open(&g[1], "good1");
    cl_hello(&g[0], 0, 2, NULL);
    cl_declare(&g[0], &B_CL);
    cl_hello(&g[1], 1, 2, B_CL.digest);
    cl_declare(&g[1], &B_CL);

    /* Each bad client acts while rank 0 has pushed its step and its pulls
     * are parked; rank 1 then completes the step, and both must get the
     * right mean. */
    for (size_t i = 0; i <= N_BAD; i++, step++) {
        stepctx_t sx;
        step_prepare(&sx, &B_CL, 2, step);
        step_send(&sx, &g[0], 0);
        step_wait(&sx, &g[0], 0, 0);
        if (i < N_BAD)
            BAD_CASES[i].fn();
        step_send(&sx, &g[1], 1);
        step_wait(&sx, &g[1], 1, 1);
        step_wait(&sx, &g[0], 0, 1);
        step_verify(&sx);
        step_free(&sx);
    }
    {
        const Gift__Stats *st = cl_stats(&g[0]);
        ck_assert_msg(st->connections == 2 && st->pushes == 2 * 2 * (N_BAD + 1),
                      "after the bad clients: %u connections, %llu pushes (want 2, %zu)",
                      st->connections, (unsigned long long)st->pushes, 4 * (N_BAD + 1));
    }
    /* Every refusal is counted by code. */
    m = metrics_get();
    ck_assert_msg(metric(m, "giftd_errors_total{code=\"-8\",") == 1.0, "EBADMAGIC count");
    ck_assert_msg(metric(m, "giftd_errors_total{code=\"-10\",") == 1.0, "EFRAMESIZE count");
    ck_assert_msg(metric(m, "giftd_errors_total{code=\"-9\",") == 2.0, "EHDRSIZE count");
    ck_assert_msg(metric(m, "giftd_errors_total{code=\"-12\",") == 1.0, "EBADHEADER count");
    ck_assert_msg(metric(m, "giftd_errors_total{code=\"-13\",") == 2.0, "ENOKEY count");
    ck_assert_msg(metric(m, "giftd_connections ") == 2.0, "giftd_connections");
    free(m);
    cl_close(&g[0]);
    cl_close(&g[1]);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Step window and duplicates                                            */
/* ------------------------------------------------------------------ */

#define W_N 32 /* 4 x 8 f32 */

static uint64_t push_f32(client_t *c, uint64_t step, const float *x)
{
    return cl_send_push(c, 0, 0, step, 0, GIFT__FORMAT__FORMAT_F32, 0, x, W_N * sizeof(float));
}

/* A PullReply for step with the f32 mean of a and b; returns nothing. */
static void expect_reply_mean(client_t *c, uint64_t step, uint64_t seq, const float *a,
                              const float *b)
{
    const gift_frame_t *f = cl_expect(c, GIFT__ENVELOPE__MSG_PULL_REPLY, "pull");
    const Gift__PullReply *p = f->env->pull_reply;
    float got[W_N];
    ck_assert_msg(p->step == step && p->seq == seq && f->payload_len == W_N * sizeof(float),
                  "%s: PullReply step %llu seq %llu len %llu, want %llu %llu %zu", c->name,
                  (unsigned long long)p->step, (unsigned long long)p->seq,
                  (unsigned long long)f->payload_len, (unsigned long long)step,
                  (unsigned long long)seq, W_N * sizeof(float));
    memcpy(got, f->payload, sizeof got);
    for (int e = 0; e < W_N; e++)
        ck_assert_msg(got[e] == (a[e] + b[e]) * 0.5f, "%s: step %llu elem %d: %g, want %g", c->name,
                      (unsigned long long)step, e, (double)got[e], (double)((a[e] + b[e]) * 0.5f));
}

START_TEST(test_step_window)
{
    static const tspec_t t[] = {{.name = "w", .rows = 4, .cols = 8, .push = F32, .pull = F32}};
    static const cspec_t ch[] = {{0, 0, 0, 4}};
    static cluster_t cl;
    float a[16][W_N], b[16][W_N];
    const Gift__Stats *st;
    const Gift__Error *e;
    client_t c[2];
    uint64_t seq, pseq;
    char *m;

    for (int s = 0; s < 16; s++)
        for (int i = 0; i < W_N; i++) {
            a[s][i] = (float)(s * 100 + i) * 0.25f;
            b[s][i] = -(float)(s * 37 + 3 * i) * 0.5f;
        }
    cluster_init(&cl, t, 1, ch, 1);
    cl_open(&c[0], "rank0");
    cl_open(&c[1], "rank1");
    cl_hello(&c[0], 0, 2, NULL);
    cl_hello(&c[1], 1, 2, NULL);
    /* Before any Declare only Declare and Stats are served. */
    cl_send_pull(&c[0], 0, 0, 0, 0);
    cl_expect_error(&c[0], GIFT_ENOKEY, 0, "pull before Declare");
    cl_declare(&c[0], &cl);

    /* Nothing pushed yet: no step to pull. */
    seq = cl_send_pull(&c[0], 0, 0, 10, 0);
    ck_assert(cl_expect_error(&c[0], GIFT_ESTEP, 0, "pull before any push")->seq == seq);

    /* The first push starts the chunk at its step (10): base 10, window 10..11. */
    seq = push_f32(&c[0], 10, a[10]);
    cl_expect_push_ack(&c[0], 0, 0, 10, seq, 0, "push 10");
    seq = push_f32(&c[0], 12, a[12]);
    e = cl_expect_error(&c[0], GIFT_ESTEP, 0, "push for base + 2");
    ck_assert_msg(e->key == 0 && e->chunk == 0 && e->step == 12 && e->seq == seq,
                  "ESTEP context key %u chunk %u step %llu seq %llu", e->key, e->chunk,
                  (unsigned long long)e->step, (unsigned long long)e->seq);
    /* The connection stays usable. */
    seq = push_f32(&c[0], 10, a[10]);
    cl_expect_push_ack(&c[0], 0, 0, 10, seq, 1, "duplicate push 10");
    seq = push_f32(&c[0], 11, a[11]);
    cl_expect_push_ack(&c[0], 0, 0, 11, seq, 0, "push 11 (base + 1)");
    seq = cl_send_pull(&c[0], 0, 0, 12, 0);
    ck_assert(cl_expect_error(&c[0], GIFT_ESTEP, 0, "pull for base + 2")->seq == seq);
    st = cl_stats(&c[0]);
    ck_assert_msg(st->n_tensors == 1 && st->tensors[0]->step_finished == 10 &&
                      st->tensors[0]->n_missing_ranks == 1 && st->tensors[0]->missing_ranks[0] == 1,
                  "Stats: step %llu, %zu missing",
                  (unsigned long long)st->tensors[0]->step_finished,
                  st->tensors[0]->n_missing_ranks);

    /* Rank 0 waits for step 10; rank 1 completes 10 and 11. */
    pseq = cl_send_pull(&c[0], 0, 0, 10, 0);
    seq = push_f32(&c[1], 10, b[10]);
    cl_expect_push_ack(&c[1], 0, 0, 10, seq, 0, "rank 1 push 10");
    expect_reply_mean(&c[0], 10, pseq, a[10], b[10]);
    seq = push_f32(&c[1], 11, b[11]);
    cl_expect_push_ack(&c[1], 0, 0, 11, seq, 0, "rank 1 push 11");
    /* Finished steps are still served, and replays are duplicates. */
    seq = cl_send_pull(&c[1], 0, 0, 10, 0);
    expect_reply_mean(&c[1], 10, seq, a[10], b[10]);
    seq = cl_send_pull(&c[0], 0, 0, 11, 0);
    expect_reply_mean(&c[0], 11, seq, a[11], b[11]);
    seq = push_f32(&c[0], 10, a[10]);
    cl_expect_push_ack(&c[0], 0, 0, 10, seq, 1, "replay of finished step 10");
    seq = push_f32(&c[1], 11, b[11]);
    cl_expect_push_ack(&c[1], 0, 0, 11, seq, 1, "replay of finished step 11");
    /* Window is now 12..13. */
    seq = push_f32(&c[1], 14, b[14]);
    ck_assert(cl_expect_error(&c[1], GIFT_ESTEP, 0, "push for 14 at base 12")->seq == seq);
    for (uint64_t s = 12; s <= 13; s++) {
        seq = push_f32(&c[0], s, a[s]);
        cl_expect_push_ack(&c[0], 0, 0, s, seq, 0, "push");
        seq = push_f32(&c[1], s, b[s]);
        cl_expect_push_ack(&c[1], 0, 0, s, seq, 0, "push");
    }
    /* Only the last two finished steps (12, 13) are kept. */
    seq = cl_send_pull(&c[0], 0, 0, 11, 0);
    ck_assert(cl_expect_error(&c[0], GIFT_ESTEP, 0, "pull of a forgotten step")->seq == seq);
    seq = cl_send_pull(&c[0], 0, 0, 12, 0);
    expect_reply_mean(&c[0], 12, seq, a[12], b[12]);
    seq = cl_send_pull(&c[1], 0, 0, 13, 0);
    expect_reply_mean(&c[1], 13, seq, a[13], b[13]);

    st = cl_stats(&c[1]);
    ck_assert_msg(st->pushes == 8 && st->steps_finished == 4,
                  "Stats pushes %llu steps %llu, want 8 4", (unsigned long long)st->pushes,
                  (unsigned long long)st->steps_finished);
    m = metrics_get();
    ck_assert_msg(metric(m, "giftd_duplicate_pushes_total ") == 3.0,
                  "giftd_duplicate_pushes_total %g, want 3",
                  metric(m, "giftd_duplicate_pushes_total "));
    ck_assert_msg(metric(m, "giftd_errors_total{code=\"-17\",") == 5.0, "ESTEP count %g, want 5",
                  metric(m, "giftd_errors_total{code=\"-17\","));
    free(m);
    cl_close(&c[0]);
    cl_close(&c[1]);
}
END_TEST

/* ------------------------------------------------------------------ */
/* max_connections                                                       */
/* ------------------------------------------------------------------ */

START_TEST(test_max_connections)
{
    client_t c1, c2, c3, c4;
    const Gift__Stats *st;
    double end;
    int ok = 0;

    cl_open(&c1, "conn1");
    cl_open(&c2, "conn2");
    cl_hello(&c1, 0, 1, NULL);
    cl_hello(&c2, 0, 1, NULL);
    /* Full: the oldest connection that is not a rank's (none here has
     * declared, pushed or pulled) is closed to make room, so that idle
     * connections cannot lock a worker out. */
    cl_open(&c3, "conn3");
    bad_fatal_close(&c1, GIFT_EBUSY, "the oldest of two when a third comes, max_connections 2");
    cl_hello(&c3, 0, 1, NULL);
    st = cl_stats(&c3);
    ck_assert_msg(st->connections == 2, "connections %u after making room, want 2",
                  st->connections);
    cl_stats(&c2);

    /* A slot frees when a connection goes (once giftd has seen it go, or
     * conn4 would make room by closing c2). */
    cl_close(&c1);
    cl_close(&c3);
    end = now_ms() + 3000;
    while (cl_stats(&c2)->connections > 1 && now_ms() < end)
        sleep_ms(20);
    end = now_ms() + 3000;
    while (!ok && now_ms() < end) {
        int err = 0, rc;
        cl_open(&c4, "conn4");
        cl_send_hello(&c4, GIFT_PROTOCOL_VERSION, 0, 1, NULL);
        rc = cl_recv_rc(&c4, &err);
        ck_assert_msg(rc == 1, "conn4: %s", rc == 0 ? "EOF" : gift_strerror(rc));
        if (c4.f.env->msg_case == GIFT__ENVELOPE__MSG_HELLO_ACK) {
            ok = 1;
        } else {
            ck_assert_msg(c4.f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR &&
                              c4.f.env->error->code == GIFT_EBUSY,
                          "conn4: got %s", gift_msg_name(c4.f.env));
            cl_close(&c4);
            sleep_ms(20);
        }
    }
    ck_assert_msg(ok, "no connection accepted within 3 s after one of two closed");
    cl_stats(&c4);
    cl_stats(&c2);
    cl_close(&c2);
    cl_close(&c4);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Back-pressure                                                         */
/* ------------------------------------------------------------------ */

#define BP_ROWS 256
#define BP_COLS 256
#define BP_N (BP_ROWS * BP_COLS) /* 256 KiB of f32 per push and per reply */
#define BP_STEPS 300
#define BP_REQS (3 * BP_STEPS)   /* Push, Pull, Pull per step */
#define BP_RSS_LIMIT (32l << 20) /* reading everything would add ~75 MiB of replies */

static void bp_pattern(float *x, uint64_t step)
{
    for (uint32_t e = 0; e < BP_N; e++)
        x[e] = (float)((int)((e * 2654435761u + (uint32_t)step * 40503u) % 4096u) - 2048) * 0.125f;
}

/* Builds request j (step 1 + j / 3: push, pull, pull) into head; its
 * payload is pat (the pattern of that step) for pushes. */
static size_t bp_request(uint64_t seq0, size_t j, uint8_t *head, size_t cap, size_t *plen)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push pu = GIFT__PUSH__INIT;
    Gift__Pull pl = GIFT__PULL__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    uint64_t step = 1 + j / 3;
    long n;
    *plen = 0;
    if (j % 3 == 0) {
        pu.step = step;
        pu.codec = &codec;
        pu.seq = seq0 + j + 1;
        env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
        env.push = &pu;
        *plen = BP_N * sizeof(float);
    } else {
        pl.step = step;
        pl.seq = seq0 + j + 1;
        env.msg_case = GIFT__ENVELOPE__MSG_PULL;
        env.pull = &pl;
    }
    n = gift_frame_pack_head(&env, *plen, head, cap);
    ck_assert(n > 0);
    return (size_t)n;
}

START_TEST(test_backpressure)
{
    static const tspec_t t[] = {
        {.name = "bp", .rows = BP_ROWS, .cols = BP_COLS, .push = F32, .pull = F32}};
    static const cspec_t ch[] = {{0, 0, 0, BP_ROWS}};
    static cluster_t cl;
    float *spat = malloc(BP_N * sizeof(float)), *rpat = malloc(BP_N * sizeof(float));
    uint8_t head[128];
    size_t hlen = 0, plen = 0, off = 0, j = 0, k = 0, sent_at_stall = 0;
    uint64_t seq0, spat_step = 0, rpat_step = 0;
    long rss0, rss1 = 0;
    double t0, last, end;
    client_t c;
    int stalled = 0, fl;

    ck_assert(spat != NULL && rpat != NULL);
    cluster_init(&cl, t, 1, ch, 1);
    cl_open(&c, "bp");
    cl_hello(&c, 0, 1, NULL);
    cl_declare(&c, &cl);
    /* Step 0 the plain way, so every per-chunk buffer exists. */
    bp_pattern(spat, 0);
    seq0 = cl_send_push(&c, 0, 0, 0, 0, GIFT__FORMAT__FORMAT_F32, 0, spat, BP_N * sizeof(float));
    cl_expect_push_ack(&c, 0, 0, 0, seq0, 0, "push 0");
    seq0 = cl_send_pull(&c, 0, 0, 0, 0);
    ck_assert(cl_expect(&c, GIFT__ENVELOPE__MSG_PULL_REPLY, "pull 0")->payload_len ==
              BP_N * sizeof(float));
    seq0 = c.seq;
    rss0 = daemon_rss();
    ck_assert_msg(rss0 > 0, "cannot read the daemon's RSS");

    fl = fcntl(c.fd, F_GETFL);
    ck_assert(fl >= 0 && fcntl(c.fd, F_SETFL, fl | O_NONBLOCK) == 0);
    t0 = last = now_ms();
    end = t0 + 90000;
    hlen = bp_request(seq0, 0, head, sizeof head, &plen);

    /* Phase 1: write without reading until the server stops taking bytes.
     * Phase 2: read everything, writing the rest as the server allows. */
    while (k < BP_REQS) {
        struct pollfd pfd = {.fd = c.fd, .events = 0};
        ck_assert_msg(now_ms() < end,
                      "back-pressure test over 90 s: %zu of %d requests sent, "
                      "%zu replies read",
                      j, BP_REQS, k);
        if (j < BP_REQS)
            pfd.events |= POLLOUT;
        if (stalled)
            pfd.events |= POLLIN;
        if (!stalled && now_ms() - last > 500) {
            stalled = 1;
            sent_at_stall = j;
            rss1 = daemon_rss();
            ck_assert_msg(rss1 > 0 && rss1 - rss0 < BP_RSS_LIMIT,
                          "daemon RSS grew from %ld to %ld bytes while the client did not read "
                          "(%zu of %d requests taken)",
                          rss0, rss1, j, BP_REQS);
            ck_assert_msg(log_count("pausing reads") > 0,
                          "no \"pausing reads\" in the log; log %s:\n%s", D.log_path, log_tail());
            fprintf(stderr,
                    "test_backpressure: stalled after %zu of %d requests (%.0f ms); daemon RSS "
                    "%ld -> %ld KiB\n",
                    sent_at_stall, BP_REQS, now_ms() - t0, rss0 >> 10, rss1 >> 10);
            continue;
        }
        if (poll(&pfd, 1, 50) < 0 && errno != EINTR)
            ck_abort_msg("poll: %s", strerror(errno));
        if (pfd.revents & POLLOUT) {
            for (;;) {
                const uint8_t *src;
                size_t len;
                ssize_t n;
                if (j % 3 == 0 && spat_step != 1 + j / 3) {
                    spat_step = 1 + j / 3;
                    bp_pattern(spat, spat_step);
                }
                if (off < hlen) {
                    src = head + off;
                    len = hlen - off;
                } else {
                    src = (const uint8_t *)spat + (off - hlen);
                    len = hlen + plen - off;
                }
                n = send(c.fd, src, len, MSG_NOSIGNAL);
                if (n < 0) {
                    ck_assert_msg(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR,
                                  "send: %s", strerror(errno));
                    break;
                }
                last = now_ms();
                off += (size_t)n;
                if (off == hlen + plen) {
                    off = 0;
                    if (++j == BP_REQS)
                        break;
                    hlen = bp_request(seq0, j, head, sizeof head, &plen);
                }
            }
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            uint8_t *p;
            size_t avail;
            ssize_t n;
            int rc = gift_reader_reserve(c.r, 1u << 20, &p, &avail);
            ck_assert_msg(rc == 0, "reader: %s", gift_strerror(rc));
            n = recv(c.fd, p, avail, 0);
            ck_assert_msg(n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)),
                          "recv after %zu replies: %s", k, n == 0 ? "EOF" : strerror(errno));
            if (n > 0)
                gift_reader_commit(c.r, (size_t)n);
            while ((rc = gift_reader_next(c.r, &c.f)) == 1) {
                const Gift__Envelope *env = c.f.env;
                uint64_t step = 1 + k / 3, seq = seq0 + k + 1;
                ck_assert_msg(k < BP_REQS, "more replies than requests");
                if (k % 3 == 0) {
                    ck_assert_msg(env->msg_case == GIFT__ENVELOPE__MSG_PUSH_ACK &&
                                      env->push_ack->seq == seq && env->push_ack->step == step &&
                                      !env->push_ack->duplicate,
                                  "reply %zu: want PushAck seq %llu step %llu, got %s", k,
                                  (unsigned long long)seq, (unsigned long long)step,
                                  gift_msg_name(env));
                } else {
                    ck_assert_msg(
                        env->msg_case == GIFT__ENVELOPE__MSG_PULL_REPLY &&
                            env->pull_reply->seq == seq && env->pull_reply->step == step &&
                            c.f.payload_len == BP_N * sizeof(float),
                        "reply %zu: want PullReply seq %llu step %llu, got %s", k,
                        (unsigned long long)seq, (unsigned long long)step, gift_msg_name(env));
                    if (rpat_step != step) {
                        rpat_step = step;
                        bp_pattern(rpat, step);
                    }
                    ck_assert_msg(memcmp(c.f.payload, rpat, BP_N * sizeof(float)) == 0,
                                  "reply %zu (step %llu): payload differs from the push", k,
                                  (unsigned long long)step);
                }
                k++;
            }
            ck_assert_msg(rc == 0, "reader: %s", gift_strerror(rc));
        }
    }
    ck_assert_msg(stalled && sent_at_stall < BP_REQS,
                  "the server took all %d requests while none of its replies were read", BP_REQS);
    fprintf(stderr, "test_backpressure: %d requests, all replies in order, %.0f ms\n", BP_REQS,
            now_ms() - t0);
    ck_assert(fcntl(c.fd, F_SETFL, fl) == 0);
    {
        const Gift__Stats *st = cl_stats(&c);
        ck_assert_msg(st->pushes == BP_STEPS + 1 && st->steps_finished == BP_STEPS + 1,
                      "Stats pushes %llu steps %llu", (unsigned long long)st->pushes,
                      (unsigned long long)st->steps_finished);
    }
    cl_close(&c);
    free(spat);
    free(rpat);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Lifecycle: SIGTERM with clients, HTTP endpoints                       */
/* ------------------------------------------------------------------ */

START_TEST(test_sigterm_with_clients)
{
    static const tspec_t t[] = {{.name = "s", .rows = 4, .cols = 4, .push = F32, .pull = F32}};
    static const cspec_t ch[] = {{0, 0, 0, 4}};
    static cluster_t cl;
    static const float x[16];
    uint8_t pre[16];
    client_t a, b, h;
    uint64_t seq;
    double dt;

    cluster_init(&cl, t, 1, ch, 1);
    cl_open(&a, "active");
    cl_hello(&a, 0, 1, NULL);
    cl_declare(&a, &cl);
    seq = cl_send_push(&a, 0, 0, 0, 0, GIFT__FORMAT__FORMAT_F32, 0, x, sizeof x);
    cl_expect_push_ack(&a, 0, 0, 0, seq, 0, "push 0");
    cl_send_pull(&a, 0, 0, 1, 0); /* parks: step 1 has no push */
    cl_open(&b, "idle");
    cl_open(&h, "halfframe");
    preamble(pre, 8, 0);
    send_raw(&h, pre, 10); /* part of a preamble */
    wait_connections(&a, 3);

    dt = daemon_stop_ms(5000);
    fprintf(stderr, "test_sigterm_with_clients: exit 0 after %.0f ms\n", dt);
    ck_assert_msg(log_count("draining: 3 connections") == 1, "no drain of 3 connections; log:\n%s",
                  log_tail());
    cl_expect_eof(&a, "after SIGTERM (parked pull dropped)");
    cl_expect_eof(&b, "after SIGTERM");
    cl_expect_eof(&h, "after SIGTERM");
    cl_close(&a);
    cl_close(&b);
    cl_close(&h);
}
END_TEST

START_TEST(test_http_endpoints)
{
    char *resp = NULL;
    int st;

    st = http_request("GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    ck_assert_msg(st == 200, "GET /livez: %d", st);
    st = http_request("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    ck_assert_msg(st == 200, "GET /readyz: %d", st);
    st = http_request("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", NULL);
    ck_assert_msg(st == 404, "GET /nope: %d", st);
    st = http_request("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", NULL);
    ck_assert_msg(st == 405, "POST /metrics: %d", st);
    st = http_request("POST /livez HTTP/1.0\r\n\r\n", NULL);
    ck_assert_msg(st == 405, "POST /livez: %d", st);
    st = http_request("NONSENSE\r\n\r\n", NULL);
    ck_assert_msg(st == 400, "malformed request line: %d", st);
    st = http_request("GET /metrics HTTP/1.0\r\n\r\n", &resp);
    ck_assert_msg(st == 200 && strstr(resp, "text/plain") != NULL &&
                      strstr(resp, "# HELP giftd_") != NULL &&
                      strstr(resp, "# TYPE giftd_") != NULL &&
                      strstr(resp, "\ngiftd_connections 0\n") != NULL,
                  "GET /metrics: %d\n%.400s", st, resp);
    free(resp);
}
END_TEST

/* ------------------------------------------------------------------ */

static Suite *integration_suite(void)
{
    Suite *s = suite_create("server_integration");
    TCase *tc;

    tc = tcase_create("session");
    tcase_add_checked_fixture(tc, setup_session, daemon_teardown);
    tcase_add_test(tc, test_session_world2);
    suite_add_tcase(s, tc);

    tc = tcase_create("bad_clients");
    tcase_add_checked_fixture(tc, setup_world2, daemon_teardown);
    tcase_add_test(tc, test_bad_clients);
    tcase_add_test(tc, test_step_window);
    suite_add_tcase(s, tc);

    tc = tcase_create("limits");
    tcase_add_checked_fixture(tc, setup_maxconn, daemon_teardown);
    tcase_add_test(tc, test_max_connections);
    suite_add_tcase(s, tc);

    tc = tcase_create("backpressure");
    tcase_add_checked_fixture(tc, setup_backpressure, daemon_teardown);
    tcase_add_test(tc, test_backpressure);
    suite_add_tcase(s, tc);

    tc = tcase_create("lifecycle");
    tcase_add_checked_fixture(tc, setup_world1, daemon_teardown);
    tcase_add_test(tc, test_sigterm_with_clients);
    tcase_add_test(tc, test_http_endpoints);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* Writes to a closed socket must fail with EPIPE, not kill the test. */
    signal(SIGPIPE, SIG_IGN);
    return gift_test_run(integration_suite(), CK_NORMAL) == 0 ? 0 : 1;
}
