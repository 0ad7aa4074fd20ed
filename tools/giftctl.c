/*
 * giftctl: asks running giftd shards how they are.
 *
 *   giftctl [OPTIONS] ping     are the shards alive (HTTP /livez, or /readyz
 *                              with --ready, and a TCP connect to the
 *                              protocol port)?
 *   giftctl [OPTIONS] status   per shard and tensor: the oldest open step,
 *                              the ranks that have not pushed it, codecs,
 *                              geometry epoch, bytes, boundary-hit rate
 *   giftctl [OPTIONS] stats    per shard: the protocol counters
 *   giftctl [OPTIONS] policy   per geometry tensor a shard owns: the
 *                              treatment its policy chose for the newest
 *                              epoch (mode, rank, codecs, predicted ratio)
 *   giftctl [OPTIONS] reset    makes each shard drop all of its state (the
 *                              declared tensors, steps, run id, and its
 *                              checkpoint and step logs): a Reset after the
 *                              Hello; refused while workers are connected
 *                              (--force closes them) or when --run-id names
 *                              another run
 *
 * status, stats and policy speak the worker protocol (proto/gift.proto): a Hello
 * named "giftctl", then a StatsRequest. A Hello must carry the cluster's
 * world size, which a tool does not know (a Hello no longer fixes it, but
 * one of another world size than the shard's is refused); so giftctl reads
 * it from the shard's /metrics (giftd_world_size) first, and says hello
 * only once a worker has declared. --world
 * (or $GIFT_WORLD / $WORLD_SIZE when HTTP is off) overrides. The codec and
 * boundary-hit rate come from the Stats message when the shard fills them,
 * else from /metrics. A shard with an auth_key_file challenges the Hello;
 * giftctl answers with the key of --auth-key-file / $GIFT_AUTH_KEY_FILE
 * (gift_auth.h) and checks the shard's proof in the HelloAck; a reset also
 * carries the administrator's MAC (gift_auth_reset_mac), which only the
 * shared secret makes, never a worker's rank key.
 *
 * ping, status, stats and policy ask every shard at once (fanout_run: up to
 * FANOUT_MAX threads, each shard with its own --timeout from the start), and
 * print the answers in the order of --servers once all are in: dead shards
 * cost one timeout together, not one each. reset, the one command that
 * changes a shard, asks them one after another and prints each as it goes.
 *
 * Exit codes: 0 every shard answered (ping: and is live/ready); 1 some shard
 * did not, or refused; 2 usage error or a key file that cannot be loaded.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gift_auth.h"
#include "gift_proto.h"

#define GIFTCTL_VERSION "0.1.0"
#define HTTP_MAX (16u << 20) /* largest HTTP response read */
#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define FANOUT_MAX 64 /* shards asked at once */

typedef enum { CMD_PING, CMD_STATUS, CMD_STATS, CMD_POLICY, CMD_RESET } cmd_t;

typedef struct opts {
    cmd_t cmd;
    int json;
    int ready;
    long world;                /* 0: find out */
    double timeout;            /* seconds per shard */
    char *servers;             /* "h:p,h:p" */
    const char *auth_key_file; /* NULL/empty: no authentication */
    char *http;                /* "h:p,h:p", "off", or NULL: each server's port + 1 */
    const char *run_id;        /* reset: only a shard holding this run (NULL: any) */
    int force;                 /* reset: even with workers connected */
} opts_t;

/* One shard's endpoint and what we learned from it. */
typedef struct endpoint {
    char host[256];
    char port[16];
    char http_host[256];
    char http_port[16]; /* "" when HTTP is off */
} endpoint_t;

/* Codec and boundary-hit rate of one tensor, from /metrics. */
typedef struct hitrow {
    uint32_t key;
    char codec[32];
    double rate;
} hitrow_t;

typedef struct metrics_view {
    int have;      /* /metrics was read */
    long world;    /* giftd_world_size, -1 when absent */
    char err[256]; /* why /metrics could not be read */
    hitrow_t *hits;
    size_t nhits;
} metrics_view_t;

/* ------------------------------------------------------------------ */
/* Small helpers                                                         */
/* ------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Writes s as a JSON string literal. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Splits "host:port" or "[v6]:port" into its parts. Returns 0 or -1. */
static int split_hostport(const char *s, size_t len, char *host, size_t hcap, char *port,
                          size_t pcap)
{
    const char *colon, *h = s, *hend;
    if (len > 0 && s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (rb == NULL || rb + 1 >= s + len || rb[1] != ':')
            return -1;
        h = s + 1;
        hend = rb;
        colon = rb + 1;
    } else {
        colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (s[i] == ':')
                colon = s + i;
        if (colon == NULL)
            return -1;
        hend = colon;
    }
    size_t hl = (size_t)(hend - h), pl = (size_t)(s + len - colon - 1);
    if (hl == 0 || hl >= hcap || pl == 0 || pl >= pcap)
        return -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    memcpy(port, colon + 1, pl);
    port[pl] = 0;
    for (size_t i = 0; i < pl; i++)
        if (port[i] < '0' || port[i] > '9')
            return -1;
    long pn = strtol(port, NULL, 10);
    return pn >= 1 && pn <= 65535 ? 0 : -1;
}

/* Parses the server list (and the HTTP list) into *eps. Returns the count,
 * or -1 after printing what is wrong. */
static int parse_endpoints(const opts_t *o, endpoint_t **eps)
{
    size_t n = 0, cap = 0, nh = 0;
    endpoint_t *e = NULL;
    const char *p = o->servers;
    int http_off = o->http && strcmp(o->http, "off") == 0;

    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (n == cap) {
            cap = cap ? 2 * cap : 4;
            endpoint_t *ne = realloc(e, cap * sizeof *e);
            if (ne == NULL)
                goto fail;
            e = ne;
        }
        memset(&e[n], 0, sizeof e[n]);
        if (split_hostport(p, len, e[n].host, sizeof e[n].host, e[n].port, sizeof e[n].port) < 0) {
            fprintf(stderr, "giftctl: bad server \"%.*s\" (want host:port)\n", (int)len, p);
            goto fail;
        }
        if (!http_off && o->http == NULL) {
            int port = (int)strtol(e[n].port, NULL, 10);
            snprintf(e[n].http_host, sizeof e[n].http_host, "%s", e[n].host);
            snprintf(e[n].http_port, sizeof e[n].http_port, "%d", port + 1);
        }
        n++;
        if (end == NULL)
            break;
        p = end + 1;
    }
    if (n == 0) {
        fprintf(stderr, "giftctl: no servers given\n");
        goto fail;
    }
    if (o->http && !http_off) {
        p = o->http;
        while (*p) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (nh >= n) {
                fprintf(stderr, "giftctl: more --http endpoints than servers\n");
                goto fail;
            }
            if (split_hostport(p, len, e[nh].http_host, sizeof e[nh].http_host, e[nh].http_port,
                               sizeof e[nh].http_port) < 0) {
                fprintf(stderr, "giftctl: bad --http endpoint \"%.*s\"\n", (int)len, p);
                goto fail;
            }
            nh++;
            if (end == NULL)
                break;
            p = end + 1;
        }
        if (nh != n) {
            fprintf(stderr, "giftctl: %zu --http endpoints for %zu servers\n", nh, n);
            goto fail;
        }
    }
    *eps = e;
    return (int)n;
fail:
    free(e);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Sockets with a deadline                                               */
/* ------------------------------------------------------------------ */

/* Connects to host:port before deadline. Returns a non-blocking socket, or
 * -1 with a sentence in err. */
static int tcp_connect(const char *host, const char *port, double deadline, char *err,
                       size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL, *ai;
    int fd = -1, rc;

    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(host, port, &hints, &res)) != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    snprintf(err, errlen, "no address for %s", host);
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            snprintf(err, errlen, "socket: %s", strerror(errno));
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            double left = deadline - now_s();
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            rc = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
            if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                break;
            snprintf(err, errlen, "connect %s:%s: %s", host, port,
                     rc == 0 ? "timed out" : strerror(soerr ? soerr : errno));
        } else {
            snprintf(err, errlen, "connect %s:%s: %s", host, port, strerror(errno));
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Sends all len bytes before deadline. Returns 0 or -1. */
static int send_all(int fd, const void *buf, size_t len, double deadline)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        double left = deadline - now_s();
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
            return -1;
    }
    return 0;
}

/* Reads up to cap bytes before deadline. Returns the count (0 at EOF) or -1
 * (error or timeout). */
static ssize_t recv_some(int fd, void *buf, size_t cap, double deadline)
{
    for (;;) {
        ssize_t n = recv(fd, buf, cap, 0);
        if (n >= 0)
            return n;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        double left = deadline - now_s();
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
            return -1;
    }
}

/* ------------------------------------------------------------------ */
/* HTTP                                                                  */
/* ------------------------------------------------------------------ */

/* GET path from the endpoint's HTTP port. Returns the status code and the
 * body in *body (malloc'd, NUL-terminated; the caller frees it), or -1 with
 * a sentence in err. */
static int http_get(const endpoint_t *e, const char *path, double deadline, char **body, char *err,
                    size_t errlen)
{
    char req[512];
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int fd, status = -1;

    *body = NULL;
    if (e->http_port[0] == 0) {
        snprintf(err, errlen, "HTTP is off for this shard");
        return -1;
    }
    if ((fd = tcp_connect(e->http_host, e->http_port, deadline, err, errlen)) < 0)
        return -1;
    int rl = snprintf(req, sizeof req,
                      "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: giftctl/" GIFTCTL_VERSION
                      "\r\nConnection: close\r\n\r\n",
                      path, e->http_host);
    if (send_all(fd, req, (size_t)rl, deadline) < 0) {
        snprintf(err, errlen, "HTTP %.200s:%s: send failed", e->http_host, e->http_port);
        goto out;
    }
    for (;;) {
        if (len + 4096 + 1 > cap) {
            if (cap >= HTTP_MAX) {
                snprintf(err, errlen, "HTTP %s: response over %u bytes", path, HTTP_MAX);
                goto out;
            }
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (nb == NULL) {
                snprintf(err, errlen, "out of memory");
                goto out;
            }
            buf = nb;
        }
        ssize_t n = recv_some(fd, buf + len, cap - len - 1, deadline);
        if (n < 0) {
            snprintf(err, errlen, "no complete answer to GET %.32s", path);
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        snprintf(err, errlen, "HTTP %s: not an HTTP response", path);
        status = -1;
        goto out;
    }
    char *sep = strstr(buf, "\r\n\r\n");
    const char *b = sep ? sep + 4 : "";
    size_t bl = strlen(b);
    if ((*body = malloc(bl + 1)) == NULL) {
        snprintf(err, errlen, "out of memory");
        status = -1;
        goto out;
    }
    memcpy(*body, b, bl + 1);
out:
    free(buf);
    close(fd);
    return status;
}

/* Reads the value of label name from a Prometheus label set "{a="x",b="y"}"
 * into out. Returns 0 or -1. */
static int label_value(const char *labels, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = labels;
    while ((p = strstr(p, name)) != NULL) {
        if ((p == labels || p[-1] == '{' || p[-1] == ',') && strncmp(p + nl, "=\"", 2) == 0) {
            const char *v = p + nl + 2;
            size_t i = 0;
            while (*v && *v != '"' && *v != '\n') {
                if (*v == '\\' && v[1])
                    v++;
                if (i + 1 < cap)
                    out[i++] = *v;
                v++;
            }
            out[i] = 0;
            return *v == '"' ? 0 : -1;
        }
        p += nl;
    }
    return -1;
}

/* Fetches /metrics and keeps what giftctl needs from it. */
static void metrics_read(const endpoint_t *e, double deadline, metrics_view_t *m)
{
    char *body = NULL;
    memset(m, 0, sizeof *m);
    m->world = -1;
    int status = http_get(e, "/metrics", deadline, &body, m->err, sizeof m->err);
    if (status != 200) {
        if (status > 0)
            snprintf(m->err, sizeof m->err, "GET /metrics answered %d", status);
        free(body);
        return;
    }
    m->have = 1;
    for (char *line = body; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (strncmp(line, "giftd_world_size ", 17) == 0) {
            m->world = strtol(line + 17, NULL, 10);
        } else if (strncmp(line, "giftd_boundary_hit_ratio{", 25) == 0) {
            char *close = strrchr(line, '}');
            char keybuf[16];
            hitrow_t h = {0};
            if (close && label_value(line + 24, "key", keybuf, sizeof keybuf) == 0) {
                h.key = (uint32_t)strtoul(keybuf, NULL, 10);
                if (label_value(line + 24, "codec", h.codec, sizeof h.codec) < 0)
                    h.codec[0] = 0;
                h.rate = strtod(close + 1, NULL);
                hitrow_t *nh = realloc(m->hits, (m->nhits + 1) * sizeof *nh);
                if (nh) {
                    m->hits = nh;
                    m->hits[m->nhits++] = h;
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(body);
}

static const hitrow_t *metrics_hit(const metrics_view_t *m, uint32_t key)
{
    for (size_t i = 0; i < m->nhits; i++)
        if (m->hits[i].key == key)
            return &m->hits[i];
    return NULL;
}

/* The codecs and boundary-hit rate of one tensor: from the Stats message
 * when the shard fills them, else from /metrics (pull codec only). */
typedef struct tensor_extra {
    const char *push_codec, *pull_codec; /* NULL: unknown */
    int have_rate;
    double rate;
} tensor_extra_t;

static tensor_extra_t tensor_extra(const Gift__TensorStats *ts, const metrics_view_t *m)
{
    tensor_extra_t x = {0};
    const hitrow_t *h = metrics_hit(m, ts->key);
    if (ts->pull_codec && *ts->pull_codec) {
        x.pull_codec = ts->pull_codec;
        x.push_codec = ts->push_codec && *ts->push_codec ? ts->push_codec : NULL;
        x.have_rate = 1;
        x.rate = ts->boundary_hit_rate;
    } else if (h) {
        x.pull_codec = h->codec[0] ? h->codec : NULL;
        x.have_rate = 1;
        x.rate = h->rate;
    }
    return x;
}

/* ------------------------------------------------------------------ */
/* The protocol                                                          */
/* ------------------------------------------------------------------ */

typedef struct conn {
    int fd;
    gift_reader_t *rd;
    double deadline;
} conn_t;

static int conn_send(conn_t *c, Gift__Envelope *env)
{
    uint8_t buf[1024];
    long n = gift_frame_pack_head(env, 0, buf, sizeof buf);
    if (n < 0)
        return -1;
    return send_all(c->fd, buf, (size_t)n, c->deadline);
}

/* Waits for the next frame. Returns 1 with *f, or -1 with a sentence. */
static int conn_next(conn_t *c, gift_frame_t *f, char *err, size_t errlen)
{
    for (;;) {
        int rc = gift_reader_next(c->rd, f);
        if (rc == 1)
            return 1;
        if (rc < 0) {
            snprintf(err, errlen, "bad frame from the shard: %s", gift_strerror(rc));
            return -1;
        }
        uint8_t *p;
        size_t avail;
        if ((rc = gift_reader_reserve(c->rd, 65536, &p, &avail)) < 0) {
            snprintf(err, errlen, "bad frame from the shard: %s", gift_strerror(rc));
            return -1;
        }
        ssize_t n = recv_some(c->fd, p, avail, c->deadline);
        if (n <= 0) {
            snprintf(err, errlen, "%s",
                     n == 0 ? "the shard closed the connection"
                            : "no answer from the shard in time");
            return -1;
        }
        gift_reader_commit(c->rd, (size_t)n);
    }
}

/* Fills err from an Error frame. */
static void error_text(const Gift__Error *e, char *err, size_t errlen)
{
    snprintf(err, errlen, "shard refused: %s",
             e->text && *e->text ? e->text : gift_strerror(e->code));
}

/* A connection that has said hello, and the nonces of its handshake. */
typedef struct session {
    conn_t c;
    uint32_t shard_id;
    uint8_t cnonce[GIFT_AUTH_NONCE_BYTES], snonce[GIFT_AUTH_NONCE_BYTES];
} session_t;

static void session_close(session_t *x)
{
    gift_reader_free(x->c.rd);
    if (x->c.fd >= 0)
        close(x->c.fd);
    x->c.rd = NULL;
    x->c.fd = -1;
}

/* Connects and says hello with world size `world` (answering the challenge
 * with key, and checking the shard's proof). Returns 0 with *x open, or -1
 * with a sentence in err (*x closed). */
static int session_open(const endpoint_t *e, uint32_t world, const gift_auth_key_t *key,
                        double deadline, session_t *x, char *err, size_t errlen)
{
    conn_t c = {.fd = -1, .rd = NULL, .deadline = deadline};
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello hello = GIFT__HELLO__INIT;
    gift_frame_t f;
    gift_limits_t lim = {.max_header_bytes = 64u << 20, .max_frame_bytes = 0};
    uint8_t *cnonce = x->cnonce, *snonce = x->snonce;
    uint8_t mac[GIFT_AUTH_MAC_BYTES], want[GIFT_AUTH_MAC_BYTES];
    int rc = -1, challenged = 0;

    if ((c.fd = tcp_connect(e->host, e->port, deadline, err, errlen)) < 0)
        return -1;
    if ((c.rd = gift_reader_new(&lim)) == NULL) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    hello.protocol_version = GIFT_PROTOCOL_VERSION;
    hello.rank =
        key != NULL && key->rank_bound ? key->rank : 0; /* a rank key speaks for its rank */
    hello.world_size = world;
    hello.client_name = "giftctl";
    if (key != NULL) {
        if (gift_auth_nonce(cnonce) < 0) {
            snprintf(err, errlen, "no random bytes for the client nonce");
            goto out;
        }
        hello.client_nonce.data = cnonce;
        hello.client_nonce.len = GIFT_AUTH_NONCE_BYTES;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &hello;
    if (conn_send(&c, &env) < 0) {
        snprintf(err, errlen, "sending Hello failed");
        goto out;
    }
    if (conn_next(&c, &f, err, errlen) < 0)
        goto out;
    if (f.env->msg_case == GIFT__ENVELOPE__MSG_AUTH_CHALLENGE) {
        /* The shard has an auth_key_file: answer with the MAC (gift_auth.h). */
        const Gift__AuthChallenge *ch = f.env->auth_challenge;
        if (key == NULL) {
            snprintf(err, errlen,
                     "the shard requires authentication: give its key with "
                     "--auth-key-file or GIFT_AUTH_KEY_FILE");
            goto out;
        }
        if (ch->server_nonce.len != GIFT_AUTH_NONCE_BYTES || ch->version != GIFT_AUTH_VERSION) {
            snprintf(err, errlen, "unexpected authentication challenge (version %u)", ch->version);
            goto out;
        }
        memcpy(snonce, ch->server_nonce.data, GIFT_AUTH_NONCE_BYTES);
        gift_auth_hello_mac(key, snonce, &hello, mac);
        hello.auth_mac.data = mac;
        hello.auth_mac.len = sizeof mac;
        challenged = 1;
        if (conn_send(&c, &env) < 0) {
            snprintf(err, errlen, "sending Hello failed");
            goto out;
        }
        if (conn_next(&c, &f, err, errlen) < 0)
            goto out;
    }
    if (f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR) {
        error_text(f.env->error, err, errlen);
        goto out;
    }
    if (f.env->msg_case != GIFT__ENVELOPE__MSG_HELLO_ACK) {
        snprintf(err, errlen, "expected hello_ack, got %s", gift_msg_name(f.env));
        goto out;
    }
    if (challenged) {
        const Gift__HelloAck *ack = f.env->hello_ack;
        gift_auth_ack_mac(key, hello.rank, snonce, cnonce, mac, want);
        if (gift_auth_verify(ack->auth_mac.data, ack->auth_mac.len, want) < 0) {
            snprintf(err, errlen, "the shard did not prove that it holds the key");
            goto out;
        }
    }
    x->shard_id = f.env->hello_ack->shard_id;
    rc = 0;
out:
    x->c = c;
    if (rc < 0)
        session_close(x);
    return rc;
}

/* Says hello with world size `world` and asks for Stats. Returns 0 and *out,
 * a copy that outlives the connection (the caller frees it with
 * gift__stats__free_unpacked), or -1 with a sentence in err. */
static int fetch_stats(const endpoint_t *e, uint32_t world, const gift_auth_key_t *key,
                       double deadline, Gift__Stats **out, char *err, size_t errlen)
{
    session_t x;
    conn_t c;
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest req = GIFT__STATS_REQUEST__INIT;
    gift_frame_t f;
    int rc = -1;

    *out = NULL;
    if (session_open(e, world, key, deadline, &x, err, errlen) < 0)
        return -1;
    c = x.c;
    req.seq = 1;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &req;
    if (conn_send(&c, &env) < 0) {
        snprintf(err, errlen, "sending StatsRequest failed");
        goto out;
    }
    for (;;) {
        if (conn_next(&c, &f, err, errlen) < 0)
            goto out;
        if (f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR) {
            error_text(f.env->error, err, errlen);
            goto out;
        }
        if (f.env->msg_case == GIFT__ENVELOPE__MSG_STATS)
            break;
        /* Anything else (none is expected) is skipped. */
    }
    /* The frame lives in the reader: keep a copy of our own. */
    size_t sz = gift__stats__get_packed_size(f.env->stats);
    uint8_t *tmp = malloc(sz ? sz : 1);
    if (tmp == NULL) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    gift__stats__pack(f.env->stats, tmp);
    *out = gift__stats__unpack(NULL, sz, tmp);
    free(tmp);
    if (*out == NULL) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    session_close(&x);
    return rc;
}

/* What a shard said to a Reset. */
typedef struct reset_result {
    int ok;
    uint32_t shard_id;
    char run_id[72];
    uint32_t tensors, closed;
    uint64_t steps;
    int files;
} reset_result_t;

/* Says hello and sends a Reset (with the administrator's MAC when key is
 * set). Returns 0 with *r, or -1 with a sentence in err (a refusal quotes
 * the shard). */
static int send_reset(const opts_t *o, const endpoint_t *e, uint32_t world,
                      const gift_auth_key_t *key, double deadline, reset_result_t *r, char *err,
                      size_t errlen)
{
    session_t x;
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Reset req = GIFT__RESET__INIT;
    uint8_t mac[GIFT_AUTH_MAC_BYTES];
    gift_frame_t f;
    int rc = -1;

    memset(r, 0, sizeof *r);
    if (session_open(e, world, key, deadline, &x, err, errlen) < 0)
        return -1;
    r->shard_id = x.shard_id;
    req.run_id = (char *)(o->run_id ? o->run_id : "");
    req.force = o->force;
    req.seq = 1;
    if (key != NULL) {
        gift_auth_reset_mac(key, x.snonce, x.cnonce, req.run_id, req.force, req.seq, mac);
        req.auth_mac.data = mac;
        req.auth_mac.len = sizeof mac;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_RESET;
    env.reset = &req;
    if (conn_send(&x.c, &env) < 0) {
        snprintf(err, errlen, "sending Reset failed");
        goto out;
    }
    for (;;) {
        if (conn_next(&x.c, &f, err, errlen) < 0)
            goto out;
        if (f.env->msg_case == GIFT__ENVELOPE__MSG_ERROR) {
            error_text(f.env->error, err, errlen);
            goto out;
        }
        if (f.env->msg_case == GIFT__ENVELOPE__MSG_RESET_ACK)
            break;
    }
    {
        const Gift__ResetAck *a = f.env->reset_ack;
        r->ok = 1;
        r->shard_id = a->shard_id;
        snprintf(r->run_id, sizeof r->run_id, "%.64s", a->run_id ? a->run_id : "");
        r->tensors = a->tensors;
        r->closed = a->closed;
        r->steps = a->steps;
        r->files = a->files;
    }
    rc = 0;
out:
    session_close(&x);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Asking every shard at once                                            */
/* ------------------------------------------------------------------ */

/* The read-only commands (ping, status, stats, policy) ask all shards at
 * once, so that dead shards cost one --timeout together rather than one
 * each: up to FANOUT_MAX threads (the main one among them) take the shards
 * in turn, each running the same blocking code with its own deadline, and
 * write only their own shard's result; the results are printed afterwards
 * in the order of --servers. Nothing here is shared but the counter. */
typedef struct fanout {
    void (*one)(struct fanout *f, int i); /* asks shard i */
    const opts_t *o;
    const endpoint_t *eps;
    const gift_auth_key_t *key;
    void *results; /* one per shard, of the command's type */
    int n;
    int next; /* the next shard to ask, under mu */
    pthread_mutex_t mu;
} fanout_t;

static void *fanout_worker(void *arg)
{
    fanout_t *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        int i = f->next < f->n ? f->next++ : -1;
        pthread_mutex_unlock(&f->mu);
        if (i < 0)
            return NULL;
        f->one(f, i);
    }
}

/* Runs f->one for every shard, concurrently. A thread that cannot be
 * started leaves its shards to the others (at worst, to this thread:
 * one after another, as before). */
static void fanout_run(fanout_t *f)
{
    pthread_t th[FANOUT_MAX];
    int want = f->n < FANOUT_MAX ? f->n : FANOUT_MAX, started = 0;
    pthread_mutex_init(&f->mu, NULL);
    f->next = 0;
    for (int t = 1; t < want; t++) {
        if (pthread_create(&th[started], NULL, fanout_worker, f) != 0)
            break;
        started++;
    }
    (void)fanout_worker(f);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    pthread_mutex_destroy(&f->mu);
}

/* ------------------------------------------------------------------ */
/* Commands                                                              */
/* ------------------------------------------------------------------ */

/* Decides the world size for the Hello: --world, else /metrics, else the
 * environment. Returns it (0: no worker has said hello, so there is nothing
 * to ask), or -1 with a sentence. */
static long world_for(const opts_t *o, const metrics_view_t *m, char *err, size_t errlen)
{
    const char *env;
    if (o->world > 0)
        return o->world;
    if (m->have && m->world >= 0)
        return m->world;
    if (((env = getenv("GIFT_WORLD")) && *env) || ((env = getenv("WORLD_SIZE")) && *env))
        return strtol(env, NULL, 10);
    snprintf(err, errlen, "world size unknown (%.200s); pass --world N", m->err);
    return -1;
}

static void print_human_bytes(char *out, size_t cap, uint64_t b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f%s" : "%.0f%s", v, u[i]);
}

/* What one shard said to a ping. */
typedef struct ping_result {
    int ok, status;
    double ms;
    char err[256];
} ping_result_t;

static void ping_one(fanout_t *f, int i)
{
    const opts_t *o = f->o;
    const endpoint_t *e = &f->eps[i];
    ping_result_t *r = &((ping_result_t *)f->results)[i];
    const char *path = o->ready ? "/readyz" : "/livez";
    double t0 = now_s(), deadline = t0 + o->timeout;
    char *body = NULL;
    int tcp_ok;
    r->status = -1;
    r->err[0] = 0;
    int fd = tcp_connect(e->host, e->port, deadline, r->err, sizeof r->err);
    tcp_ok = fd >= 0;
    if (fd >= 0)
        close(fd);
    if (tcp_ok && e->http_port[0])
        r->status = http_get(e, path, deadline, &body, r->err, sizeof r->err);
    free(body);
    r->ok = tcp_ok && (e->http_port[0] == 0 || r->status == 200);
    if (tcp_ok && r->status > 0 && r->status != 200)
        snprintf(r->err, sizeof r->err, "%s answered %d", path, r->status);
    r->ms = (now_s() - t0) * 1e3;
}

static int run_ping(const opts_t *o, const endpoint_t *eps, int n)
{
    int bad = 0;
    ping_result_t *res = calloc((size_t)n, sizeof *res);
    fanout_t f = {.one = ping_one, .o = o, .eps = eps, .results = res, .n = n};
    if (res == NULL) {
        fprintf(stderr, "giftctl: out of memory\n");
        return EXIT_FAIL;
    }
    fanout_run(&f);
    if (o->json)
        printf("{\"command\":\"ping\",\"shards\":[");
    for (int i = 0; i < n; i++) {
        const endpoint_t *e = &eps[i];
        const ping_result_t *r = &res[i];
        bad |= !r->ok;
        if (o->json) {
            printf("%s{\"server\":", i ? "," : "");
            json_str(stdout, e->host);
            printf(",\"port\":%s,\"http_port\":%s,\"ok\":%s,\"http_status\":%d,\"ms\":%.3f",
                   e->port, e->http_port[0] ? e->http_port : "null", r->ok ? "true" : "false",
                   r->status, r->ms);
            if (!r->ok) {
                printf(",\"error\":");
                json_str(stdout, r->err);
            }
            printf("}");
        } else if (r->ok) {
            printf("%s:%s %s (%.1f ms)\n", e->host, e->port,
                   e->http_port[0] ? (o->ready ? "ready" : "live") : "accepting", r->ms);
        } else {
            printf("%s:%s DOWN: %s\n", e->host, e->port, r->err);
        }
    }
    if (o->json)
        printf("],\"ok\":%s}\n", bad ? "false" : "true");
    free(res);
    return bad ? EXIT_FAIL : 0;
}

/* giftctl policy: the geometry owner's decision for the newest epoch of
 * each tensor this shard owns (TensorStats.policy_owner). */
static void policy_table(const Gift__Stats *st)
{
    size_t owned = 0;
    for (size_t t = 0; t < st->n_tensors; t++)
        owned += st->tensors[t]->policy_owner;
    printf(", %zu geometry tensors owned here\n", owned);
    if (owned)
        printf("  %4s  %-24s %5s  %-9s %5s  %-9s %-9s %7s %6s\n", "key", "tensor", "epoch", "mode",
               "k", "push", "pull", "ratio", "bits");
    for (size_t t = 0; t < st->n_tensors; t++) {
        const Gift__TensorStats *ts = st->tensors[t];
        char ratio[32] = "-", bits[32] = "-";
        if (!ts->policy_owner)
            continue;
        if (ts->predicted_ratio > 0.0)
            snprintf(ratio, sizeof ratio, "%.3f", ts->predicted_ratio);
        if (ts->bits > 0.0)
            snprintf(bits, sizeof bits, "%.2f", ts->bits);
        printf("  %4u  %-24s %5u  %-9s %5u  %-9s %-9s %7s %6s\n", ts->key, ts->name ? ts->name : "",
               ts->epoch, ts->mode ? ts->mode : "", ts->transform_rank,
               ts->epoch_push_codec ? ts->epoch_push_codec : "",
               ts->epoch_pull_codec ? ts->epoch_pull_codec : "", ratio, bits);
    }
}

static void policy_json(const Gift__Stats *st)
{
    int first = 1;
    printf(",\"tensors\":[");
    for (size_t t = 0; st && t < st->n_tensors; t++) {
        const Gift__TensorStats *ts = st->tensors[t];
        if (!ts->policy_owner)
            continue;
        printf("%s{\"key\":%u,\"name\":", first ? "" : ",", ts->key);
        first = 0;
        json_str(stdout, ts->name ? ts->name : "");
        printf(",\"epoch\":%u,\"mode\":", ts->epoch);
        json_str(stdout, ts->mode ? ts->mode : "");
        printf(",\"rank\":%u,\"push_codec\":", ts->transform_rank);
        json_str(stdout, ts->epoch_push_codec ? ts->epoch_push_codec : "");
        printf(",\"pull_codec\":");
        json_str(stdout, ts->epoch_pull_codec ? ts->epoch_pull_codec : "");
        printf(",\"predicted_ratio\":%.6g,\"bits\":%.6g}", ts->predicted_ratio, ts->bits);
    }
    printf("]");
}

/* What one shard said to status, stats or policy. */
typedef struct stats_result {
    metrics_view_t m;
    Gift__Stats *st;
    char err[512];
    long world;
    int ok;
} stats_result_t;

static void stats_one(fanout_t *f, int i)
{
    const opts_t *o = f->o;
    const endpoint_t *e = &f->eps[i];
    stats_result_t *r = &((stats_result_t *)f->results)[i];
    double deadline = now_s() + o->timeout;

    memset(r, 0, sizeof *r);
    /* The shard's own port first: a wrong --servers is named as such, not
     * as a failure of the HTTP port next to it. */
    {
        char cerr[400];
        int fd = tcp_connect(e->host, e->port, deadline, cerr, sizeof cerr);
        if (fd < 0) {
            snprintf(r->err, sizeof r->err,
                     "shard protocol port: %s (is giftd running there? "
                     "check --servers / GIFT_SERVERS)",
                     cerr);
            r->world = -1;
            return;
        }
        close(fd);
    }
    metrics_read(e, deadline, &r->m);
    r->world = world_for(o, &r->m, r->err, sizeof r->err);
    if (r->world > 65536) {
        snprintf(r->err, sizeof r->err, "world size %ld out of range", r->world);
        r->world = -1;
    }
    if (r->world > 0)
        r->ok = fetch_stats(e, (uint32_t)r->world, f->key, deadline, &r->st, r->err,
                            sizeof r->err) == 0;
    else if (r->world == 0)
        r->ok = 1; /* no worker yet: nothing declared, nothing to ask */
}

static int run_status_or_stats(const opts_t *o, const endpoint_t *eps, int n,
                               const gift_auth_key_t *key)
{
    int bad = 0;
    stats_result_t *res = calloc((size_t)n, sizeof *res);
    fanout_t f = {.one = stats_one, .o = o, .eps = eps, .key = key, .results = res, .n = n};
    if (res == NULL) {
        fprintf(stderr, "giftctl: out of memory\n");
        return EXIT_FAIL;
    }
    fanout_run(&f);
    if (o->json)
        printf("{\"command\":\"%s\",\"shards\":[", o->cmd == CMD_STATUS   ? "status"
                                                   : o->cmd == CMD_POLICY ? "policy"
                                                                          : "stats");
    for (int i = 0; i < n; i++) {
        const endpoint_t *e = &eps[i];
        metrics_view_t m = res[i].m;
        Gift__Stats *st = res[i].st;
        const char *err = res[i].err;
        long world = res[i].world;
        int ok = res[i].ok;

        bad |= !ok;
        if (o->json) {
            printf("%s{\"server\":", i ? "," : "");
            json_str(stdout, e->host);
            printf(",\"port\":%s,\"ok\":%s,\"world_size\":%ld", e->port, ok ? "true" : "false",
                   world < 0 ? 0 : world);
            if (!ok) {
                printf(",\"error\":");
                json_str(stdout, err);
            }
            if (st) {
                printf(",\"shard_id\":%u", st->shard_id);
                if (o->cmd == CMD_STATS)
                    printf(",\"frames_in\":%" PRIu64 ",\"frames_out\":%" PRIu64
                           ",\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",\"pushes\":%" PRIu64
                           ",\"pulls\":%" PRIu64 ",\"steps_finished\":%" PRIu64
                           ",\"connections\":%u,\"tensors\":%zu",
                           st->frames_in, st->frames_out, st->bytes_in, st->bytes_out, st->pushes,
                           st->pulls, st->steps_finished, st->connections, st->n_tensors);
            }
            if (o->cmd == CMD_POLICY && ok)
                policy_json(st);
            if (o->cmd == CMD_STATUS && ok) {
                printf(",\"tensors\":[");
                for (size_t t = 0; st && t < st->n_tensors; t++) {
                    const Gift__TensorStats *ts = st->tensors[t];
                    tensor_extra_t x = tensor_extra(ts, &m);
                    printf("%s{\"key\":%u,\"name\":", t ? "," : "", ts->key);
                    json_str(stdout, ts->name);
                    printf(",\"step\":%" PRIu64 ",\"missing_ranks\":[", ts->step_finished);
                    for (size_t r = 0; r < ts->n_missing_ranks; r++)
                        printf("%s%u", r ? "," : "", ts->missing_ranks[r]);
                    printf("],\"codec\":");
                    if (x.pull_codec)
                        json_str(stdout, x.pull_codec);
                    else
                        printf("null");
                    printf(",\"push_codec\":");
                    if (x.push_codec)
                        json_str(stdout, x.push_codec);
                    else
                        printf("null");
                    printf(",\"epoch\":%u,\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64
                           ",\"boundary_hit_rate\":",
                           ts->epoch, ts->bytes_in, ts->bytes_out);
                    if (x.have_rate)
                        printf("%.6g", x.rate);
                    else
                        printf("null");
                    printf("}");
                }
                printf("]");
            }
            printf("}");
        } else {
            printf("shard %s:%s", e->host, e->port);
            if (st)
                printf(" (id %u)", st->shard_id);
            if (!ok) {
                printf(": ERROR %s\n", err);
            } else if (world == 0) {
                printf(": no worker has connected yet\n");
            } else if (o->cmd == CMD_POLICY) {
                policy_table(st);
            } else if (o->cmd == CMD_STATS) {
                printf(", world %ld\n  frames in %" PRIu64 " out %" PRIu64 ", bytes in %" PRIu64
                       " out %" PRIu64 "\n  pushes %" PRIu64 ", pulls %" PRIu64
                       ", chunk steps finished %" PRIu64 ", connections %u, tensors %zu\n",
                       world, st->frames_in, st->frames_out, st->bytes_in, st->bytes_out,
                       st->pushes, st->pulls, st->steps_finished, st->connections, st->n_tensors);
            } else {
                printf(", world %ld, %zu tensors\n", world, st->n_tensors);
                if (st->n_tensors)
                    printf("  %4s  %-24s %8s  %-14s %-9s %5s %10s %10s %9s\n", "key", "tensor",
                           "step", "missing", "codec", "epoch", "in", "out", "hits");
                for (size_t t = 0; t < st->n_tensors; t++) {
                    const Gift__TensorStats *ts = st->tensors[t];
                    tensor_extra_t x = tensor_extra(ts, &m);
                    char miss[64] = "-", bi[32], bo[32], hit[32] = "-", codec[40] = "-";
                    size_t ml = 0;
                    for (size_t r = 0; r < ts->n_missing_ranks && ml < sizeof miss - 8; r++)
                        ml += (size_t)snprintf(miss + ml, sizeof miss - ml, "%s%u", r ? "," : "",
                                               ts->missing_ranks[r]);
                    if (ts->n_missing_ranks && ml >= sizeof miss - 8)
                        snprintf(miss + sizeof miss - 8, 8, ",...");
                    print_human_bytes(bi, sizeof bi, ts->bytes_in);
                    print_human_bytes(bo, sizeof bo, ts->bytes_out);
                    if (x.have_rate)
                        snprintf(hit, sizeof hit, "%.2e", x.rate);
                    if (x.push_codec && x.pull_codec && strcmp(x.push_codec, x.pull_codec) != 0)
                        snprintf(codec, sizeof codec, "%.18s/%.18s", x.push_codec, x.pull_codec);
                    else if (x.pull_codec)
                        snprintf(codec, sizeof codec, "%.38s", x.pull_codec);
                    printf("  %4u  %-24s %8" PRIu64 "  %-14s %-9s %5u %10s %10s %9s\n", ts->key,
                           ts->name ? ts->name : "", ts->step_finished, miss, codec, ts->epoch, bi,
                           bo, hit);
                }
            }
        }
        if (st)
            gift__stats__free_unpacked(st, NULL);
        free(m.hits);
    }
    if (o->json)
        printf("],\"ok\":%s}\n", bad ? "false" : "true");
    free(res);
    return bad ? EXIT_FAIL : 0;
}

/* giftctl reset: per shard a Reset, and what it dropped or why not. */
static int run_reset(const opts_t *o, const endpoint_t *eps, int n, const gift_auth_key_t *key)
{
    int bad = 0;
    if (o->json)
        printf("{\"command\":\"reset\",\"shards\":[");
    for (int i = 0; i < n; i++) {
        const endpoint_t *e = &eps[i];
        double deadline = now_s() + o->timeout;
        metrics_view_t m;
        reset_result_t r = {0};
        char err[600] = "";
        long world;
        {
            char cerr[400];
            int fd = tcp_connect(e->host, e->port, deadline, cerr, sizeof cerr);
            if (fd < 0) {
                snprintf(err, sizeof err,
                         "shard protocol port: %s (is giftd running there? "
                         "check --servers / GIFT_SERVERS)",
                         cerr);
                memset(&m, 0, sizeof m);
                goto report;
            }
            close(fd);
        }
        metrics_read(e, deadline, &m);
        /* A Hello must carry the shard's world size; a shard that has none
         * yet (nothing declared) takes any. */
        world = world_for(o, &m, err, sizeof err);
        if (world > 65536) {
            snprintf(err, sizeof err, "world size %ld out of range", world);
            world = -1;
        }
        if (world >= 0)
            (void)send_reset(o, e, world > 0 ? (uint32_t)world : 1, key, deadline, &r, err,
                             sizeof err);
    report:
        bad |= !r.ok;
        if (o->json) {
            printf("%s{\"server\":", i ? "," : "");
            json_str(stdout, e->host);
            printf(",\"port\":%s,\"ok\":%s", e->port, r.ok ? "true" : "false");
            if (r.ok) {
                printf(",\"shard_id\":%u,\"run_id\":", r.shard_id);
                json_str(stdout, r.run_id);
                printf(",\"tensors\":%u,\"steps\":%" PRIu64 ",\"closed\":%u,\"files\":%s",
                       r.tensors, r.steps, r.closed, r.files ? "true" : "false");
            } else {
                printf(",\"error\":");
                json_str(stdout, err);
            }
            printf("}");
        } else if (r.ok) {
            printf("shard %s:%s (id %u): reset: ", e->host, e->port, r.shard_id);
            if (r.tensors == 0 && r.run_id[0] == '\0')
                printf("it held nothing");
            else
                printf("dropped %s%s%s, %u tensors, steps below %" PRIu64,
                       r.run_id[0] ? "run '" : "the state of a run without a run id", r.run_id,
                       r.run_id[0] ? "'" : "", r.tensors, r.steps);
            if (r.closed)
                printf(", closed %u worker connection%s", r.closed, r.closed == 1 ? "" : "s");
            printf("%s; it adopts the next run\n",
                   r.files ? ", moved its checkpoint and step logs aside (data_dir/discarded-*/)"
                           : "");
        } else {
            printf("shard %s:%s: NOT RESET: %s\n", e->host, e->port, err);
        }
        free(m.hits);
    }
    if (o->json)
        printf("],\"ok\":%s}\n", bad ? "false" : "true");
    return bad ? EXIT_FAIL : 0;
}

/* ------------------------------------------------------------------ */
/* main                                                                  */
/* ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f, "Usage: giftctl [OPTION...] ping|status|stats|policy|reset\n"
               "       giftctl --auth-key-file SECRET rank-key RANK > rank.key\n"
               "\n"
               "Asks running giftd shards how they are, or resets them.\n"
               "\n"
               "Commands:\n"
               "  ping     each shard accepts connections and its /livez (with --ready:\n"
               "           /readyz) answers 200\n"
               "  status   per shard and tensor: the oldest open step, the ranks that have\n"
               "           not pushed it, codec, geometry epoch, bytes in and out,\n"
               "           boundary-hit rate of the pull codec\n"
               "  stats    per shard: frames, bytes, pushes, pulls, finished steps,\n"
               "           connections\n"
               "  policy   per geometry tensor a shard owns: the newest epoch's treatment\n"
               "           (gift or euclidean, rank, push and pull codecs, the predicted\n"
               "           error ratio and bits per element of giftd's policy)\n"
               "  reset    makes each shard drop all of its state: tensors, steps, run id\n"
               "           and its checkpoint and step logs, so that the next run starts\n"
               "           there; refused while workers are connected (see --force) or\n"
               "           when --run-id names another run; prints what each shard did\n"
               "  rank-key RANK  prints the key file of one rank, derived from the shared\n"
               "           secret: give each worker only its own (GIFT_AUTH_KEY_FILE), and\n"
               "           it cannot authenticate as another rank\n"
               "\n"
               "Options:\n"
               "  -s, --servers LIST  host:port,... of the shards' protocol ports\n"
               "                      (default $GIFT_SERVERS, else 127.0.0.1:7070)\n"
               "      --http LIST     host:port,... of their HTTP ports, one per server, or\n"
               "                      \"off\" (default: each server's port + 1)\n"
               "  -w, --world N       world size to say hello with (default: giftd_world_size\n"
               "                      from /metrics, else $GIFT_WORLD or $WORLD_SIZE)\n"
               "  -t, --timeout SEC   per shard (default 5); ping, status, stats and policy\n"
               "                      ask every shard at once (up to 64), so dead shards\n"
               "                      cost about one SEC in all; reset asks them in turn\n"
               "      --ready         ping: require /readyz rather than /livez\n"
               "      --run-id ID     reset: only a shard holding run ID (GIFT_RUN_ID)\n"
               "      --force         reset: even with workers connected (they are closed\n"
               "                      and fail with GIFT_ESTATE)\n"
               "      --auth-key-file FILE  the shards' shared secret, for status, stats and\n"
               "                      reset against shards with auth_key_file set (default\n"
               "                      $GIFT_AUTH_KEY_FILE; reset needs the secret itself, not\n"
               "                      a rank key); ping needs none\n"
               "  -j, --json          one JSON object on stdout\n"
               "  -h, --help          this text\n"
               "      --version       the version\n"
               "\n"
               "Exit status: 0 every shard answered (ping: and is live or ready),\n"
               "1 some shard did not or refused (reset: was not reset), 2 usage error or\n"
               "unusable key file.\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"servers", required_argument, NULL, 's'},
                                       {"http", required_argument, NULL, 'H'},
                                       {"world", required_argument, NULL, 'w'},
                                       {"timeout", required_argument, NULL, 't'},
                                       {"ready", no_argument, NULL, 'r'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"auth-key-file", required_argument, NULL, 'k'},
                                       {"run-id", required_argument, NULL, 'R'},
                                       {"force", no_argument, NULL, 'F'},
                                       {"help", no_argument, NULL, 'h'},
                                       {"version", no_argument, NULL, 'V'},
                                       {NULL, 0, NULL, 0}};
    static gift_auth_key_t key; /* static: 4 KiB */
    opts_t o = {.timeout = 5.0};
    endpoint_t *eps = NULL;
    int c, n, rc, have_key = 0;
    char *end;

    while ((c = getopt_long(argc, argv, "s:w:t:jh", lo, NULL)) != -1) {
        switch (c) {
        case 's':
            o.servers = optarg;
            break;
        case 'H':
            o.http = optarg;
            break;
        case 'w':
            o.world = strtol(optarg, &end, 10);
            if (*end || o.world < 1 || o.world > 65536) {
                fprintf(stderr, "giftctl: --world wants 1..65536, got \"%s\"\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 't':
            o.timeout = strtod(optarg, &end);
            if (*end || !(o.timeout > 0 && o.timeout <= 3600)) {
                fprintf(stderr, "giftctl: --timeout wants seconds in (0, 3600], got \"%s\"\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        case 'r':
            o.ready = 1;
            break;
        case 'k':
            o.auth_key_file = optarg;
            break;
        case 'R':
            if (optarg[0] == '\0' || strlen(optarg) > 64) {
                fprintf(stderr, "giftctl: --run-id wants 1 to 64 bytes, got %zu\n", strlen(optarg));
                return EXIT_USAGE;
            }
            o.run_id = optarg;
            break;
        case 'F':
            o.force = 1;
            break;
        case 'j':
            o.json = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("giftctl %s\n", GIFTCTL_VERSION);
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind == argc - 2 && strcmp(argv[optind], "rank-key") == 0) {
        char err[512], warn[512], text[160];
        long r = strtol(argv[optind + 1], &end, 10);
        if (*end || r < 0 || r > 65535) {
            fprintf(stderr, "giftctl: rank-key wants a rank 0..65535, got \"%s\"\n",
                    argv[optind + 1]);
            return EXIT_USAGE;
        }
        if (o.auth_key_file == NULL)
            o.auth_key_file = getenv("GIFT_AUTH_KEY_FILE");
        if (o.auth_key_file == NULL ||
            gift_auth_key_load(o.auth_key_file, &key, err, sizeof err, warn, sizeof warn) < 0) {
            fprintf(stderr, "giftctl: rank-key: %s\n",
                    o.auth_key_file ? err : "needs the shared secret (--auth-key-file)");
            return EXIT_USAGE;
        }
        if (key.rank_bound) {
            fprintf(stderr, "giftctl: rank-key: %s is a rank key, not the shared secret\n",
                    o.auth_key_file);
            gift_auth_key_clear(&key);
            return EXIT_USAGE;
        }
        gift_auth_rank_key_format(&key, (uint32_t)r, text, sizeof text);
        gift_auth_key_clear(&key);
        fputs(text, stdout);
        return ferror(stdout) ? 1 : 0;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "giftctl: %s\n", optind >= argc ? "no command" : "one command only");
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[optind], "ping") == 0)
        o.cmd = CMD_PING;
    else if (strcmp(argv[optind], "status") == 0)
        o.cmd = CMD_STATUS;
    else if (strcmp(argv[optind], "stats") == 0)
        o.cmd = CMD_STATS;
    else if (strcmp(argv[optind], "policy") == 0)
        o.cmd = CMD_POLICY;
    else if (strcmp(argv[optind], "reset") == 0)
        o.cmd = CMD_RESET;
    else {
        fprintf(stderr, "giftctl: unknown command \"%s\"\n", argv[optind]);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (o.servers == NULL) {
        o.servers = getenv("GIFT_SERVERS");
        if (o.servers == NULL || *o.servers == 0)
            o.servers = "127.0.0.1:7070";
    }
    if ((n = parse_endpoints(&o, &eps)) < 0)
        return EXIT_USAGE;
    if (o.auth_key_file == NULL)
        o.auth_key_file = getenv("GIFT_AUTH_KEY_FILE");
    if (o.cmd != CMD_PING && o.auth_key_file && *o.auth_key_file) {
        char err[512], warn[512];
        if (gift_auth_key_load(o.auth_key_file, &key, err, sizeof err, warn, sizeof warn) < 0) {
            fprintf(stderr, "giftctl: %s\n", err);
            free(eps);
            return EXIT_USAGE;
        }
        if (warn[0])
            fprintf(stderr, "giftctl: warning: %s\n", warn);
        have_key = 1;
        if (o.cmd == CMD_RESET && key.rank_bound) {
            fprintf(stderr,
                    "giftctl: reset: %s holds rank %u's key; a reset needs the shards' "
                    "shared secret (their auth_key_file)\n",
                    o.auth_key_file, key.rank);
            gift_auth_key_clear(&key);
            free(eps);
            return EXIT_USAGE;
        }
    }
    if ((o.run_id || o.force) && o.cmd != CMD_RESET) {
        fprintf(stderr, "giftctl: --run-id and --force are options of reset only\n");
        gift_auth_key_clear(&key);
        free(eps);
        return EXIT_USAGE;
    }
    rc = o.cmd == CMD_PING    ? run_ping(&o, eps, n)
         : o.cmd == CMD_RESET ? run_reset(&o, eps, n, have_key ? &key : NULL)
                              : run_status_or_stats(&o, eps, n, have_key ? &key : NULL);
    gift_auth_key_clear(&key);
    free(eps);
    fflush(stdout);
    return rc;
}
