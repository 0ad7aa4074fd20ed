/*
 * client.c: the public API of libgiftclient (gift/client.h) on the caller's
 * side. Parses options, builds the declared list (fusion of small tensors,
 * wire tensors, placement, every per-tensor buffer, the packed Declare of
 * each shard), and hands operations to the I/O thread through a
 * mutex-protected queue and uv_async_send (net.c); completions come back
 * through one condition variable.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "giftclient_internal.h"

const char *gift_version(void)
{
#define GIFT__STR2(x) #x
#define GIFT__STR(x) GIFT__STR2(x)
    return GIFT__STR(GIFT_CLIENT_VERSION_MAJOR) "." GIFT__STR(
        GIFT_CLIENT_VERSION_MINOR) "." GIFT__STR(GIFT_CLIENT_VERSION_PATCH);
}

/* ------------------------------------------------------------------ */
/* Hand-over to the I/O thread (the mailbox is mailbox.c's)              */
/* ------------------------------------------------------------------ */

/* Queues a command and wakes the I/O thread. */
static void submit(gift_client_t *c, gift__cmd_t *cmd)
{
    gift__cmd_put(c, cmd);
    c->io->wake(c);
}

/* Submits a command and waits for the I/O thread to finish it. The engine
 * enforces the command's deadline, so the wait ends. */
static int run_cmd(gift_client_t *c, gift__cmd_t *cmd)
{
    submit(c, cmd);
    return gift__cmd_wait(c, cmd);
}

/* ------------------------------------------------------------------ */
/* Operations                                                            */
/* ------------------------------------------------------------------ */

static int start_op(gift_client_t *c, uint32_t id, uint64_t step, const float *grad, float *out,
                    gift_op_cb cb, void *arg, gift_op_t **opp)
{
    gift_op_t *op;

    if (opp != NULL)
        *opp = NULL;
    if (c == NULL || opp == NULL || !c->declared || id >= c->nmem || (grad == NULL && out == NULL))
        return GIFT_EINVAL;
    if ((op = gift__op_alloc(c)) == NULL)
        return GIFT_ENOMEM;
    op->cb = cb;
    op->arg = arg;
    if (grad != NULL) {
        gift__req_t *r = &op->req[op->nreq++];
        r->kind = GIFT__REQ_PUSH;
        r->id = id;
        r->step = step;
        r->in = grad;
        r->op = op;
    }
    if (out != NULL) {
        gift__req_t *r = &op->req[op->nreq++];
        r->kind = GIFT__REQ_PULL;
        r->id = id;
        r->step = step;
        r->out = out;
        r->op = op;
    }
    op->parts_left = op->nreq;
    op->deadline_ns = c->io->now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    op->cmd.kind = GIFT__CMD_OP;
    op->cmd.op = op;
    *opp = op;
    submit(c, &op->cmd);
    return 0;
}

int gift_push(gift_client_t *c, uint32_t id, uint64_t step, const float *grad, gift_op_cb cb,
              void *arg, gift_op_t **op)
{
    if (grad == NULL) {
        if (op)
            *op = NULL;
        return GIFT_EINVAL;
    }
    return start_op(c, id, step, grad, NULL, cb, arg, op);
}

int gift_pull(gift_client_t *c, uint32_t id, uint64_t step, float *out, gift_op_cb cb, void *arg,
              gift_op_t **op)
{
    if (out == NULL) {
        if (op)
            *op = NULL;
        return GIFT_EINVAL;
    }
    return start_op(c, id, step, NULL, out, cb, arg, op);
}

int gift_push_pull(gift_client_t *c, uint32_t id, uint64_t step, const float *grad, float *out,
                   gift_op_cb cb, void *arg, gift_op_t **op)
{
    if (grad == NULL || out == NULL) {
        if (op)
            *op = NULL;
        return GIFT_EINVAL;
    }
    return start_op(c, id, step, grad, out, cb, arg, op);
}

int gift_sketch_inputs(gift_client_t *c, uint32_t id, uint64_t step, const float *X, uint32_t n)
{
    gift__cmd_t cmd;
    const gift__wire_t *w;

    if (c == NULL || !c->declared || id >= c->nmem || X == NULL || n == 0)
        return GIFT_EINVAL;
    w = &c->wires[c->mem[id].wire];
    if (!w->geometry || step % w->refresh != 0)
        return GIFT_EINVAL;
    memset(&cmd, 0, sizeof cmd);
    cmd.kind = GIFT__CMD_SKETCH;
    cmd.deadline_ns = c->io->now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    cmd.req.kind = GIFT__REQ_SKETCH;
    cmd.req.cmd = &cmd;
    cmd.req.id = id;
    cmd.req.step = step;
    cmd.req.in = X;
    cmd.req.n = n;
    return run_cmd(c, &cmd);
}

void gift_client_stats(gift_client_t *c, gift_client_stats_t *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof *out);
    if (c == NULL)
        return;
    out->frames_out = __atomic_load_n(&c->st.frames_out, __ATOMIC_RELAXED);
    out->frames_in = __atomic_load_n(&c->st.frames_in, __ATOMIC_RELAXED);
    out->bytes_out = __atomic_load_n(&c->st.bytes_out, __ATOMIC_RELAXED);
    out->bytes_in = __atomic_load_n(&c->st.bytes_in, __ATOMIC_RELAXED);
    out->reconnects = __atomic_load_n(&c->st.reconnects, __ATOMIC_RELAXED);
    out->replays = __atomic_load_n(&c->st.replays, __ATOMIC_RELAXED);
    out->epochs_switched = __atomic_load_n(&c->st.epochs_switched, __ATOMIC_RELAXED);
}

static const char *const pass_names[GIFT_PASS_KINDS] = {
    [GIFT_PASS_ENCODE] = "encode",
    [GIFT_PASS_DECODE] = "decode",
    [GIFT_PASS_ACCUMULATE] = "accumulate",
    [GIFT_PASS_FUSED] = "fused",
    [GIFT_PASS_COPY] = "copy",
    [GIFT_PASS_CHECK] = "check",
    [GIFT_PASS_RESIDUAL] = "residual",
    [GIFT_PASS_TRANSFORM] = "transform",
};

const char *gift_pass_name(int kind)
{
    return kind >= 0 && kind < GIFT_PASS_KINDS ? pass_names[kind] : NULL;
}

/* The first release's size: every later field is filled only when the
 * caller's struct has room for it. */
#define GIFT__COUNTERS_V1 offsetof(gift_client_counters_t, codec_cpu_ns)

int gift_client_counters(gift_client_t *c, gift_client_counters_t *out)
{
    gift_client_counters_t v;
    size_t size;
    if (c == NULL || out == NULL || out->size < GIFT__COUNTERS_V1)
        return GIFT_EINVAL;
    size = out->size;
    memset(&v, 0, sizeof v);
    v.size = sizeof v;
    if (c->thread_started) {
        clockid_t cid;
        struct timespec ts;
        if (pthread_getcpuclockid(c->thread, &cid) == 0 && clock_gettime(cid, &ts) == 0)
            v.io_cpu_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    }
    v.payload_out = __atomic_load_n(&c->payload_out, __ATOMIC_RELAXED);
    v.payload_in = __atomic_load_n(&c->payload_in, __ATOMIC_RELAXED);
    for (int k = 0; k < GIFT_PASS_KINDS; k++)
        v.pass_bytes[k] = __atomic_load_n(&c->pass_bytes[k], __ATOMIC_RELAXED);
    v.codec_cpu_ns = __atomic_load_n(&c->codec_cpu_ns, __ATOMIC_RELAXED);
    memcpy(out, &v, size < sizeof v ? size : sizeof v);
    out->size = size;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Open and close                                                        */
/* ------------------------------------------------------------------ */

/* Parses a non-negative decimal integer up to max; -1 when it is not one. */
static long parse_uint(const char *s, long max)
{
    char *end;
    long v;
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v > max)
        return -1;
    return v;
}

/* $name as a number lo..max into *out: 1, or 0 when it is unset or empty, or
 * -1 when it is not such a number (said on stderr, in unit). */
static int env_number(const char *name, long lo, long max, const char *unit, long *out)
{
    const char *v = getenv(name);
    long n;
    if (v == NULL || *v == '\0')
        return 0;
    if ((n = parse_uint(v, max)) < lo) {
        fprintf(stderr, "giftclient: %s=%s is not a number of %s %ld..%ld\n", name, v, unit, lo,
                max);
        return -1;
    }
    *out = n;
    return 1;
}

/* Resolves "host:port" (host an IPv4 or IPv6 literal, "[v6]", or a name,
 * IPv4 preferred) into *ss. */
static int parse_server(const char *s, size_t len, struct sockaddr_storage *ss)
{
    char host[256], port[16];
    const char *colon;
    struct addrinfo hints, *res = NULL;
    size_t hl;
    int rc;

    if (len == 0 || len >= sizeof host)
        return GIFT_EINVAL;
    colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    if (colon == NULL || (size_t)(s + len - colon - 1) >= sizeof port || colon + 1 == s + len)
        return GIFT_EINVAL;
    hl = (size_t)(colon - s);
    if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
        memcpy(host, s + 1, hl - 2);
        host[hl - 2] = '\0';
    } else {
        memcpy(host, s, hl);
        host[hl] = '\0';
    }
    memcpy(port, colon + 1, (size_t)(s + len - colon - 1));
    port[s + len - colon - 1] = '\0';
    if (host[0] == '\0' || parse_uint(port, 65535) <= 0)
        return GIFT_EINVAL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_INET;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        hints.ai_family = AF_INET6;
        rc = getaddrinfo(host, port, &hints, &res);
    }
    if (rc != 0 || res == NULL)
        return GIFT_EINVAL;
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

static int parse_servers(gift_client_t *c, const char *list)
{
    size_t n = 1, i = 0;
    const char *p;
    if (list == NULL || *list == '\0')
        return GIFT_EINVAL;
    for (p = list; *p; p++)
        n += *p == ',';
    if (n > 65536 || (c->addrs = calloc(n, sizeof *c->addrs)) == NULL)
        return n > 65536 ? GIFT_EINVAL : GIFT_ENOMEM;
    for (p = list;; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t'))
            p++, len--;
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (parse_server(p, len, &c->addrs[i]) < 0)
            return GIFT_EINVAL;
        if (e == NULL)
            break;
        p = e + 1;
    }
    c->nshards = (uint32_t)n;
    return 0;
}

/* What the calling thread's last failed gift_client_open said. */
static _Thread_local char open_err[512];

static const char *env2(const char *a, const char *b)
{
    const char *v = getenv(a);
    if (v == NULL || *v == '\0')
        v = getenv(b);
    return v != NULL && *v != '\0' ? v : NULL;
}

/* Frees what open and declare allocated; the I/O thread is gone. */
static void client_free(gift_client_t *c)
{
    gift__eng_free_wires(c);
    for (size_t i = 0; i < c->nmem; i++)
        free(c->mem[i].name);
    free(c->mem);
    free(c->chunks);
    if (c->decl_head)
        for (uint32_t i = 0; i < c->nshards; i++)
            free(c->decl_head[i]);
    free(c->decl_head);
    free(c->decl_len);
    gift__ops_free(c);
    free(c->conns);
    free(c->addrs);
    gift_auth_key_clear(c->auth);
    free(c->auth);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The caller's options as a whole struct: fields beyond opts->size are
 * defaults (rank and codec_threads -1: from the environment). 0, or
 * GIFT_EINVAL when opts is too short to name the servers. */
static int opts_copy(const gift_client_opts_t *opts, gift_client_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->rank = -1;
    o->codec_threads = -1;
    if (opts != NULL) {
        size_t n = opts->size;
        if (n < offsetof(gift_client_opts_t, servers))
            return GIFT_EINVAL;
        memcpy(o, opts, n < sizeof *o ? n : sizeof *o);
        if (n <= offsetof(gift_client_opts_t, rank))
            o->rank = -1;
        if (n <= offsetof(gift_client_opts_t, codec_threads))
            o->codec_threads = -1;
    }
    return 0;
}

/* The numbers of the configuration, each from o or else the environment:
 * rank and world, chunk bytes, timeouts, backoff, seed, codec threads.
 * 0, or GIFT_EINVAL (a bad value; the codec threads' is said on stderr). */
static int config_numbers(gift_client_t *c, const gift_client_opts_t *o)
{
    long rank, world, num = 0;
    int got;

    rank = o->rank >= 0 ? o->rank : parse_uint(env2("GIFT_RANK", "RANK"), 65535);
    world = o->world_size > 0 ? o->world_size : parse_uint(env2("GIFT_WORLD", "WORLD_SIZE"), 65536);
    if (rank < 0 || world < 1 || world > 65536 || rank >= world)
        return GIFT_EINVAL;
    c->rank = (int)rank;
    c->world = (int)world;
    c->chunk_bytes = o->chunk_bytes ? o->chunk_bytes : GIFT__CHUNK_DEFAULT;
    if (!o->chunk_bytes &&
        (got = env_number("GIFT_CHUNK_BYTES", 64, 1l << 30, "bytes", &num)) != 0) {
        if (got < 0)
            return GIFT_EINVAL;
        c->chunk_bytes = (uint64_t)num;
    }
    if (c->chunk_bytes < 64)
        return GIFT_EINVAL;
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : GIFT__TIMEOUT_DEFAULT;
    if (!o->timeout_ms &&
        (got = env_number("GIFT_TIMEOUT_MS", 1, UINT32_MAX, "milliseconds", &num)) != 0) {
        if (got < 0)
            return GIFT_EINVAL;
        c->timeout_ms = (uint32_t)num;
    }
    c->connect_timeout_ms =
        o->connect_timeout_ms ? o->connect_timeout_ms : GIFT__CONNECT_TIMEOUT_DEFAULT;
    c->backoff_max_ms = o->backoff_max_ms ? o->backoff_max_ms : GIFT__BACKOFF_MAX_DEFAULT;
    c->seed = o->seed ? o->seed : 1;
    if (o->codec_threads != -1) {
        if (o->codec_threads < 0 || o->codec_threads > GIFT__CODEC_THREADS_MAX) {
            fprintf(stderr,
                    "giftclient: opts.codec_threads %d: want 0..%d, or -1 for "
                    "$GIFT_CODEC_THREADS\n",
                    o->codec_threads, GIFT__CODEC_THREADS_MAX);
            return GIFT_EINVAL;
        }
        c->codec_threads = o->codec_threads;
    } else if ((got = env_number("GIFT_CODEC_THREADS", 0, GIFT__CODEC_THREADS_MAX, "threads",
                                 &num)) != 0) {
        if (got < 0)
            return GIFT_EINVAL;
        c->codec_threads = (int)num;
    }
    return 0;
}

/* The client's name and run id (at most 64 bytes), from o or else the
 * environment. 0, or GIFT_EINVAL (said on stderr). */
static int config_names(gift_client_t *c, const gift_client_opts_t *o)
{
    const char *v = o->name;
    if (v != NULL && *v != '\0')
        snprintf(c->name, sizeof c->name, "%s", v);
    else
        snprintf(c->name, sizeof c->name, "gift-%ld", (long)getpid());
    v = o->run_id != NULL ? o->run_id : getenv("GIFT_RUN_ID");
    if (v != NULL && strlen(v) >= sizeof c->run_id) {
        fprintf(stderr, "giftclient: run id (%s) of %zu bytes; at most %zu are allowed\n",
                o->run_id != NULL ? "opts.run_id" : "GIFT_RUN_ID", strlen(v), sizeof c->run_id - 1);
        return GIFT_EINVAL;
    }
    snprintf(c->run_id, sizeof c->run_id, "%s", v != NULL ? v : "");
    return 0;
}

/* The shared key, when o or GIFT_AUTH_KEY_FILE names a key file: loaded
 * into c->auth and checked against this worker's rank. 0 (none named, or
 * loaded), GIFT_ENOMEM or GIFT_EAUTH (said on stderr). */
static int config_auth(gift_client_t *c, const gift_client_opts_t *o)
{
    const char *v = o->auth_key_file != NULL ? o->auth_key_file : getenv("GIFT_AUTH_KEY_FILE");
    char err[512], warn[512];
    if (v == NULL || *v == '\0')
        return 0;
    if ((c->auth = malloc(sizeof *c->auth)) == NULL)
        return GIFT_ENOMEM;
    if (gift_auth_key_load(v, c->auth, err, sizeof err, warn, sizeof warn) < 0) {
        fprintf(stderr, "giftclient: %s\n", err);
        return GIFT_EAUTH;
    }
    if (warn[0])
        fprintf(stderr, "giftclient: warning: %s\n", warn);
    if (c->auth->rank_bound && c->auth->rank != (uint32_t)c->rank) {
        fprintf(stderr,
                "giftclient: auth key file %s is rank %u's key; this worker is rank "
                "%d\n",
                v, c->auth->rank, c->rank);
        return GIFT_EAUTH;
    }
    return 0;
}

int gift__client_new(const gift_client_opts_t *opts, gift_client_t **out)
{
    gift_client_opts_t o;
    gift_client_t *c;
    int rc;

    if (out == NULL)
        return GIFT_EINVAL;
    *out = NULL;
    if ((rc = opts_copy(opts, &o)) < 0)
        return rc;
    if ((c = calloc(1, sizeof *c)) == NULL)
        return GIFT_ENOMEM;
    c->dev = gift__devices();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    rc = GIFT_EINVAL;
    if (parse_servers(c, o.servers ? o.servers : getenv("GIFT_SERVERS")) < 0)
        goto fail;
    if ((rc = config_numbers(c, &o)) < 0 || (rc = config_names(c, &o)) < 0 ||
        (rc = config_auth(c, &o)) < 0)
        goto fail;
    rc = GIFT_ENOMEM;
    if ((c->conns = calloc(c->nshards, sizeof *c->conns)) == NULL)
        goto fail;
    *out = c;
    return 0;
fail:
    client_free(c);
    return rc;
}

int gift_client_open(const gift_client_opts_t *opts, gift_client_t **out)
{
    gift_client_t *c;
    gift__cmd_t cmd;
    int rc;

    open_err[0] = '\0';
    if ((rc = gift__client_new(opts, out)) < 0)
        return rc;
    c = *out;
    *out = NULL;
    c->io = gift__net_io();
    if ((rc = c->io->start(c)) < 0) {
        client_free(c);
        return rc;
    }
    memset(&cmd, 0, sizeof cmd);
    cmd.kind = GIFT__CMD_CONNECT;
    cmd.deadline_ns = c->io->now_ns() + (uint64_t)c->connect_timeout_ms * 1000000ull;
    if ((rc = run_cmd(c, &cmd)) < 0) {
        pthread_mutex_lock(&c->mu);
        snprintf(open_err, sizeof open_err, "%s", c->last_err);
        pthread_mutex_unlock(&c->mu);
        gift_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gift_client_last_error(gift_client_t *c, char *buf, size_t len)
{
    size_t n;
    if (buf == NULL || len == 0)
        return GIFT_EINVAL;
    if (c == NULL) {
        snprintf(buf, len, "%s", open_err);
    } else {
        pthread_mutex_lock(&c->mu);
        snprintf(buf, len, "%s", c->last_err);
        pthread_mutex_unlock(&c->mu);
    }
    n = strlen(buf);
    return (int)n;
}

void gift_client_close(gift_client_t *c)
{
    gift__cmd_t cmd;
    if (c == NULL)
        return;
    if (c->thread_started) {
        memset(&cmd, 0, sizeof cmd);
        cmd.kind = GIFT__CMD_CLOSE;
        run_cmd(c, &cmd);
        c->io->join(c);
    }
    client_free(c);
}

/* ------------------------------------------------------------------ */
/* Declaration                                                           */
/* ------------------------------------------------------------------ */

static int fp8(gift_codec_t f)
{
    return f == GIFT_CODEC_FP8_E4M3 || f == GIFT_CODEC_FP8_E5M2;
}

/* The class of a fusable tensor: tensors fuse only with their own class. */
typedef struct fuse_class {
    gift_codec_t push, pull;
    uint32_t block;
    int ef, sr, prio, pef;
    uint32_t wire; /* the open bucket */
    size_t total;  /* its elements so far */
} fuse_class_t;

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void *aligned(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    memset(p, 0, bytes ? bytes : 64);
    return p;
}

static int geo_alloc(gift_geometry_t *g, int din, int k, int ks, int dense)
{
    memset(g, 0, sizeof *g);
    g->din = din;
    g->k = k;
    g->ks = ks;
    g->U = aligned((size_t)din * ks * sizeof(float));
    g->lambda = calloc((size_t)ks, sizeof(float));
    g->d = calloc((size_t)k, sizeof(float));
    g->d_inv = calloc((size_t)k, sizeof(float));
    if (g->U == NULL || g->lambda == NULL || g->d == NULL || g->d_inv == NULL)
        return GIFT_ENOMEM;
    /* T and T^-1 as matrices where one product beats the thin form (host
     * wires: a device wire transforms on the GPU). */
    if (dense && gift_geometry_dense_floats(din, k) > 0 &&
        (g->dense = aligned(gift_geometry_dense_floats(din, k) * sizeof(float))) == NULL)
        return GIFT_ENOMEM;
    g->identity = 1;
    g->c = g->c_inv = 1.0f;
    return 0;
}

/* Allocates every host buffer of wire w, once (docs/ARCHITECTURE.md). A
 * device wire's payload areas (pinned), scratch and residual (device) are
 * allocated by the device table's declare on the I/O thread. */
static int wire_alloc(gift_client_t *c, gift__wire_t *w)
{
    size_t area = 0;
    int fused = w->nmembers > 1, dev = w->memory == GIFT_MEMORY_CUDA;

    for (uint32_t j = 0; j < w->nchunks; j++) {
        gift__chunk_t *ch = &c->chunks[w->chunk0 + j];
        ch->push_off = area;
        area += ch->push_l.total;
    }
    for (int j = 0; j < 2; j++) {
        gift__pstate_t *ps = &w->ps[j];
        gift__lstate_t *pl = &w->pl[j];
        if ((!dev && (ps->payload = aligned(area)) == NULL) ||
            (ps->acked = calloc(w->nchunks, 1)) == NULL ||
            (ps->sent = calloc(w->nchunks, 1)) == NULL ||
            (pl->got = calloc(w->nchunks, 1)) == NULL || (pl->sent = calloc(w->nchunks, 1)) == NULL)
            return GIFT_ENOMEM;
        if (fused && ((ps->pushed = calloc(w->nmembers, 1)) == NULL ||
                      (ps->asmb = aligned(w->n * sizeof(float))) == NULL ||
                      (pl->mean = aligned(w->n * sizeof(float))) == NULL))
            return GIFT_ENOMEM;
    }
    if (!dev && !fused && (w->geometry || w->ef_on || w->hadamard) &&
        (w->p = aligned(w->n * sizeof(float))) == NULL)
        return GIFT_ENOMEM;
    /* The signs from the name and key alone (epoch 0: no epochs yet), so
     * every worker derives the same rotation. */
    if (w->hadamard &&
        gift_hadamard_init(&w->hd, w->cols, gift_hadamard_seed(w->name, w->key, 0)) < 0)
        return GIFT_ENOMEM;
    if (!dev && w->ef_on && gift_ef_init(&w->ef, (int)w->rows, (int)w->cols) < 0)
        return GIFT_ENOMEM;
    if (w->geometry) {
        if ((!dev && (w->work = aligned((size_t)w->rows * w->k * sizeof(float))) == NULL) ||
            (!dev && !fused && c->codec_threads > 0 &&
             (w->pwork = aligned(3 * (size_t)w->rows * w->k * sizeof(float))) == NULL) ||
            (w->Y = aligned((size_t)w->cols * w->ks * sizeof(float))) == NULL)
            return GIFT_ENOMEM;
        for (int s = 0; s < GIFT__GEO_SLOTS; s++)
            if (geo_alloc(&w->geo[s].g, (int)w->cols, (int)w->k, (int)w->ks, !dev) < 0)
                return GIFT_ENOMEM;
    }
    return 0;
}

/* Bytes a row of cols elements costs under p (scales and codes, unpadded). */
static double row_bytes(const gift_codec_params_t *p, uint32_t cols)
{
    gift_layout_t l;
    if (gift_layout(p, cols, &l) < 0)
        return 4.0 * cols;
    return (double)(l.scale_bytes + l.code_bytes);
}

static Gift__Format wire_format(gift_format_t f)
{
    return (Gift__Format)f; /* the same values, by construction */
}

/* Builds the TensorDecls, the digest and each shard's packed Declare. */
static int build_declares(gift_client_t *c)
{
    size_t nw = c->nwires;
    Gift__TensorDecl *td = calloc(nw, sizeof *td);
    Gift__TensorDecl **tdp = calloc(nw, sizeof *tdp);
    Gift__Codec *codecs = calloc(2 * nw, sizeof *codecs);
    Gift__ChunkDecl *cd = calloc(c->nchunks, sizeof *cd);
    Gift__ChunkDecl **cdp = calloc(c->nchunks, sizeof *cdp);
    int rc = GIFT_ENOMEM;

    if (td == NULL || tdp == NULL || codecs == NULL || cd == NULL || cdp == NULL ||
        (c->decl_head = calloc(c->nshards, sizeof *c->decl_head)) == NULL ||
        (c->decl_len = calloc(c->nshards, sizeof *c->decl_len)) == NULL)
        goto out;
    for (size_t i = 0; i < nw; i++) {
        const gift__wire_t *w = &c->wires[i];
        gift__tensor_decl__init(&td[i]);
        gift__codec__init(&codecs[2 * i]);
        gift__codec__init(&codecs[2 * i + 1]);
        codecs[2 * i].format = wire_format(w->push.fmt);
        codecs[2 * i].block = w->push.block;
        codecs[2 * i + 1].format = wire_format(w->pull.fmt);
        codecs[2 * i + 1].block = w->pull.block;
        td[i].key = w->key;
        td[i].name = w->name;
        td[i].rows = w->rows;
        td[i].cols = w->cols;
        td[i].push_codec = &codecs[2 * i];
        td[i].pull_codec = &codecs[2 * i + 1];
        td[i].geometry = w->geometry != 0;
        td[i].rank = w->geometry ? w->k : 0;
        td[i].basis_cols = w->geometry ? w->ks : 0;
        td[i].refresh = w->geometry ? w->refresh : 0;
        td[i].seed = w->seed;
        td[i].pull_error_feedback = w->pull_ef != 0;
        td[i].transform =
            w->hadamard ? GIFT__TRANSFORM__TRANSFORM_HADAMARD : GIFT__TRANSFORM__TRANSFORM_NONE;
        tdp[i] = &td[i];
    }
    gift_digest_bytes(gift_digest_tensors(tdp, nw), c->digest);
    for (uint32_t s = 0; s < c->nshards; s++) {
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__Declare d = GIFT__DECLARE__INIT;
        size_t nc = 0, need;
        long n;
        for (size_t i = 0; i < c->nchunks; i++) {
            const gift__chunk_t *ch = &c->chunks[i];
            if (ch->shard != s)
                continue;
            gift__chunk_decl__init(&cd[nc]);
            cd[nc].chunk = ch->idx;
            cd[nc].row_begin = ch->row_begin;
            cd[nc].rows = ch->rows;
            cd[nc].key = ch->wire;
            cdp[nc] = &cd[nc];
            nc++;
        }
        d.n_tensors = nw;
        d.tensors = tdp;
        d.n_chunks = nc;
        d.chunks = cdp;
        d.digest.data = c->digest;
        d.digest.len = 8;
        env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
        env.declare = &d;
        need = gift_frame_head_size(&env);
        if (need > GIFT_PREAMBLE_BYTES + GIFT_MAX_HEADER_DEFAULT) {
            rc = GIFT_EINVAL; /* the declaration would exceed the shards' header limit */
            goto out;
        }
        if ((c->decl_head[s] = malloc(need)) == NULL)
            goto out;
        if ((n = gift_frame_pack_head(&env, 0, c->decl_head[s], need)) < 0) {
            rc = (int)n;
            goto out;
        }
        c->decl_len[s] = (size_t)n;
    }
    rc = 0;
out:
    free(td);
    free(tdp);
    free(codecs);
    free(cd);
    free(cdp);
    return rc;
}

/* Copies the n descriptors (each carries its own size) into *out (the
 * caller frees it, also on error) and checks each: shape, codecs, fp8 block,
 * geometry rank, memory kind and device. 0, GIFT_EINVAL, GIFT_ENOMEM or the
 * device's code. */
static int descs_copy(const gift_tensor_desc_t *tensors, size_t n, gift_tensor_desc_t **out)
{
    gift_tensor_desc_t *d;
    int rc = GIFT_EINVAL;

    *out = NULL;
    if ((d = calloc(n, sizeof *d)) == NULL)
        return GIFT_ENOMEM;
    *out = d;
    for (size_t i = 0; i < n; i++) {
        const gift_tensor_desc_t *in =
            (const gift_tensor_desc_t *)((const char *)tensors + i * tensors[0].size);
        size_t sz = tensors[0].size;
        gift_codec_params_t p;
        gift_layout_t l;
        if (sz < offsetof(gift_tensor_desc_t, push_codec))
            return rc;
        memcpy(&d[i], in, sz < sizeof d[i] ? sz : sizeof d[i]);
        d[i].size = sizeof d[i];
        if (d[i].rows == 0 || d[i].cols == 0 || (uint64_t)d[i].rows * d[i].cols > UINT32_MAX ||
            (unsigned)d[i].push_codec > GIFT_CODEC_NVFP4 ||
            (unsigned)d[i].pull_codec > GIFT_CODEC_NVFP4)
            return rc;
        memset(&p, 0, sizeof p);
        p.fmt = GIFT_FMT_E4M3;
        p.block = d[i].fp8_block;
        if (gift_layout(&p, 1, &l) < 0)
            return rc;
        if (d[i].geometry) {
            if (d[i].cols < 2 || d[i].rank > d[i].cols)
                return rc;
        }
        if (d[i].transform != GIFT_TRANSFORM_NONE) {
            const char *nm = d[i].name ? d[i].name : "(unnamed)";
            if (d[i].transform != GIFT_TRANSFORM_HADAMARD) {
                fprintf(stderr, "gift_declare: tensor %s: unknown transform %d\n", nm,
                        d[i].transform);
                return rc;
            }
            if (d[i].geometry) {
                fprintf(stderr,
                        "gift_declare: tensor %s: the Hadamard transform is a "
                        "treatment of its own, not one with geometry\n",
                        nm);
                return rc;
            }
            if (d[i].memory == GIFT_MEMORY_CUDA) {
                fprintf(stderr,
                        "gift_declare: tensor %s: the Hadamard transform has no device "
                        "path yet; declare it in host memory (GIFT_MEMORY_HOST)\n",
                        nm);
                return rc;
            }
        }
        if (d[i].memory == GIFT_MEMORY_CUDA) {
            int drc = gift__dev_available(d[i].device, d[i].name ? d[i].name : "(unnamed)");
            if (drc < 0) {
                rc = drc;
                return rc;
            }
        } else if (d[i].memory != GIFT_MEMORY_HOST) {
            return rc;
        }
    }
    return 0;
}

/* Fuses tensor d (nel elements, FP8 block blk) into the bucket of its
 * codec class in cls (ncls classes so far), opening a class or a new bucket
 * when one would exceed a chunk: member m's wire and offset. Its wire. */
static gift__wire_t *member_fuse(gift_client_t *c, fuse_class_t *cls, size_t *ncls,
                                 const gift_tensor_desc_t *d, uint32_t blk, size_t nel,
                                 gift__member_t *m)
{
    fuse_class_t *k = NULL;
    gift__wire_t *w;
    for (size_t j = 0; j < *ncls && k == NULL; j++)
        if (cls[j].push == d->push_codec && cls[j].pull == d->pull_codec && cls[j].block == blk &&
            cls[j].ef == (d->error_feedback != 0) && cls[j].sr == (d->stochastic != 0) &&
            cls[j].prio == d->priority && cls[j].pef == (d->pull_error_feedback != 0))
            k = &cls[j];
    if (k == NULL) {
        k = &cls[(*ncls)++];
        k->push = d->push_codec;
        k->pull = d->pull_codec;
        k->block = blk;
        k->ef = d->error_feedback != 0;
        k->sr = d->stochastic != 0;
        k->prio = d->priority;
        k->pef = d->pull_error_feedback != 0;
        k->wire = UINT32_MAX;
    }
    if (k->wire == UINT32_MAX || (k->total + nel) * 4 > c->chunk_bytes) {
        /* The class's bucket is full (or there is none yet): open one. */
        k->wire = (uint32_t)c->nwires++;
        k->total = 0;
        c->wires[k->wire].rows = 1;
    }
    w = &c->wires[k->wire];
    m->wire = k->wire;
    m->off = k->total;
    k->total += nel;
    w->cols = (uint32_t)k->total;
    return w;
}

/* A wire of its own for tensor d (nel elements) and member m: its shape,
 * or, for a Euclidean row wider than a chunk, rows of a divisor of its
 * length. Its wire. */
static gift__wire_t *member_own(gift_client_t *c, const gift_tensor_desc_t *d, size_t nel,
                                gift__member_t *m)
{
    gift__wire_t *w;
    m->wire = (uint32_t)c->nwires++;
    m->off = 0;
    w = &c->wires[m->wire];
    w->rows = d->rows;
    w->cols = d->cols;
    if (!d->geometry && d->transform == GIFT_TRANSFORM_NONE &&
        (uint64_t)d->cols * 4 > c->chunk_bytes) {
        /* A row wider than a chunk: re-cut the (Euclidean) tensor into
         * rows of a divisor of its length, at least 8 rows a chunk. */
        size_t cmax = (size_t)(c->chunk_bytes / 32), cc;
        if (cmax < 1)
            cmax = 1;
        for (cc = cmax < nel ? cmax : nel; cc > 1 && nel % cc != 0; cc--)
            ;
        w->cols = (uint32_t)cc;
        w->rows = (uint32_t)(nel / cc);
    }
    return w;
}

/* The wire's codecs, flags and geometry rank, from its first member's
 * tensor d. 0, or GIFT_EINVAL (no rank fits). */
static int wire_from_first(gift__wire_t *w, const gift_tensor_desc_t *d)
{
    w->push.fmt = (gift_format_t)d->push_codec;
    w->pull.fmt = (gift_format_t)d->pull_codec;
    w->push.block = fp8(d->push_codec) ? d->fp8_block : 0;
    w->pull.block = fp8(d->pull_codec) ? d->fp8_block : 0;
    w->push.stochastic = d->stochastic != 0;
    w->ef_on = d->error_feedback != 0;
    w->pull_ef = d->pull_error_feedback != 0;
    w->geometry = d->geometry != 0;
    w->hadamard = d->transform == GIFT_TRANSFORM_HADAMARD;
    w->prio = d->priority;
    w->memory = d->memory;
    w->device = d->device;
    if (w->geometry) {
        int k = d->rank ? (int)d->rank : gift_rank_default((int)d->rows, (int)d->cols);
        int ks = gift_basis_cols((int)d->cols, k, GIFT_OVERSAMPLE_DEFAULT);
        if (k < 1 || ks < k)
            return GIFT_EINVAL;
        w->k = (uint32_t)k;
        w->ks = (uint32_t)ks;
        w->refresh = d->refresh ? d->refresh : GIFT__REFRESH_DEFAULT;
    }
    return 0;
}

/* Maps every tensor to a member of a wire tensor: small Euclidean host
 * tensors are fused into one 1 x N bucket per codec class (in declaration
 * order, a new bucket when one would exceed a chunk: member_fuse), every
 * other tensor is a wire of its own (a row wider than a chunk re-cut:
 * member_own). Sets each wire's codecs, flags and geometry rank
 * (wire_from_first). 0, GIFT_EINVAL or GIFT_ENOMEM. */
static int members_build(gift_client_t *c, const gift_tensor_desc_t *d, size_t n)
{
    fuse_class_t *cls = NULL;
    size_t ncls = 0;
    int rc;

    rc = GIFT_ENOMEM;
    if ((c->mem = calloc(n, sizeof *c->mem)) == NULL ||
        (c->wires = calloc(n, sizeof *c->wires)) == NULL || (cls = calloc(n, sizeof *cls)) == NULL)
        goto out_free_cls;
    c->nmem = n;
    for (size_t i = 0; i < n; i++) {
        gift__member_t *m = &c->mem[i];
        size_t nel = (size_t)d[i].rows * d[i].cols;
        uint32_t blk = fp8(d[i].push_codec) || fp8(d[i].pull_codec)
                           ? (d[i].fp8_block ? d[i].fp8_block : GIFT_FP8_BLOCK_DEFAULT)
                           : 0;
        gift__wire_t *w;
        char nb[32];

        if (d[i].name == NULL)
            snprintf(nb, sizeof nb, "tensor%zu", i);
        if ((m->name = strdup(d[i].name ? d[i].name : nb)) == NULL)
            goto out_free_cls;
        m->rows = d[i].rows;
        m->cols = d[i].cols;
        m->n = nel;
        if (!d[i].geometry && d[i].transform == GIFT_TRANSFORM_NONE &&
            d[i].memory == GIFT_MEMORY_HOST && nel * 4 < GIFT__FUSE_BYTES &&
            nel * 4 <= c->chunk_bytes)
            w = member_fuse(c, cls, &ncls, &d[i], blk, nel, m);
        else
            w = member_own(c, &d[i], nel, m);
        if (w->nmembers == 0 && wire_from_first(w, &d[i]) < 0) {
            rc = GIFT_EINVAL; /* rc stays GIFT_ENOMEM for the strdup above */
            goto out_free_cls;
        }
        m->index = w->nmembers++;
    }
    rc = 0;
out_free_cls:
    free(cls);
    return rc;
}

/* Each wire's key, length, seed, name, member list and the priorities of
 * its pushes and pulls. 0 or GIFT_ENOMEM. */
static int wires_name(gift_client_t *c, size_t n)
{
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        w->key = (uint32_t)i;
        w->n = (size_t)w->rows * w->cols;
        w->seed = mix64(c->seed + 0x9E3779B97F4A7C15ull * (i + 1));
        if ((w->members = calloc(w->nmembers, sizeof *w->members)) == NULL)
            return GIFT_ENOMEM;
        w->nmembers = 0;
    }
    for (size_t i = 0; i < n; i++) {
        gift__wire_t *w = &c->wires[c->mem[i].wire];
        w->members[w->nmembers++] = (uint32_t)i;
    }
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        const gift__member_t *first = &c->mem[w->members[0]];
        uint32_t lo = w->members[0], hi = w->members[w->nmembers - 1];
        char nm[300];
        if (w->nmembers == 1)
            snprintf(nm, sizeof nm, "%s", first->name);
        else
            snprintf(nm, sizeof nm, "fused:%.200s+%u", first->name, w->nmembers - 1);
        if ((w->name = strdup(nm)) == NULL)
            return GIFT_ENOMEM;
        /* The tensor's priority first; then, within a turn, pushes before
         * pulls that have no push of their own (a shard refuses a pull for a
         * chunk nobody has pushed yet); pushes later-declared first, pulls
         * earlier-declared first. A Pull behind its own push takes the push's
         * priority instead (gift__send_pull_chunks). */
        w->push_prio = (int64_t)w->prio * (1ll << 33) + (1ll << 32) + hi;
        w->pull_prio = (int64_t)w->prio * (1ll << 33) + (int64_t)(UINT32_MAX - lo);
    }
    return 0;
}

/* Places the wires' chunks on the shards (gift_plan_build), checks every
 * chunk's payloads against max_frame and allocates each wire's buffers.
 * 0, GIFT_EINVAL or GIFT_ENOMEM. */
static int chunks_place(gift_client_t *c, uint64_t max_frame)
{
    gift_plan_tensor_t *pt = NULL;
    gift_plan_t plan;
    int rc = GIFT_ENOMEM, planned = 0;

    memset(&plan, 0, sizeof plan);
    if ((pt = calloc(c->nwires, sizeof *pt)) == NULL)
        goto out_free_plan;
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        pt[i].rows = w->rows;
        pt[i].cols = w->cols;
        pt[i].row_weight = row_bytes(&w->push, w->cols) + row_bytes(&w->pull, w->cols);
    }
    if ((rc = gift_plan_build(pt, c->nwires, c->nshards, c->chunk_bytes, &plan)) < 0)
        goto out_free_plan;
    planned = 1;
    rc = GIFT_ENOMEM;
    if ((c->chunks = calloc(plan.nchunks, sizeof *c->chunks)) == NULL)
        goto out_free_plan;
    c->nchunks = plan.nchunks;
    for (size_t i = 0; i < plan.nchunks; i++) {
        const gift_plan_chunk_t *pc = &plan.chunks[i];
        gift__chunk_t *ch = &c->chunks[i];
        const gift__wire_t *w = &c->wires[pc->tensor];
        ch->wire = pc->tensor;
        ch->idx = pc->chunk;
        ch->row_begin = pc->row_begin;
        ch->rows = pc->rows;
        ch->shard = pc->shard;
        ch->n = (size_t)pc->rows * w->cols;
        ch->off = (size_t)pc->row_begin * w->cols;
        if (gift_layout(&w->push, ch->n, &ch->push_l) < 0 ||
            gift_layout(&w->pull, ch->n, &ch->pull_l) < 0 || ch->push_l.total > max_frame ||
            ch->pull_l.total > max_frame) {
            rc = GIFT_EINVAL;
            goto out_free_plan;
        }
    }
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        w->chunk0 = (uint32_t)plan.first[i];
        w->nchunks = (uint32_t)(plan.first[i + 1] - plan.first[i]);
        if (w->geometry && (uint64_t)w->cols * (w->ks + 1) * 4 > max_frame) {
            rc = GIFT_EINVAL;
            goto out_free_plan;
        }
        if ((rc = wire_alloc(c, w)) < 0)
            goto out_free_plan;
    }
    rc = 0;
out_free_plan:
    if (planned)
        gift_plan_free(&plan);
    free(pt);
    return rc;
}

int gift__declare_build(gift_client_t *c, const gift_tensor_desc_t *tensors, size_t n)
{
    gift_tensor_desc_t *d = NULL;
    uint64_t max_frame = UINT64_MAX;
    int rc;

    if (c == NULL || tensors == NULL || n == 0 || n > (1u << 24) || c->declared || c->wires != NULL)
        return GIFT_EINVAL;
    if ((rc = descs_copy(tensors, n, &d)) == 0 && (rc = members_build(c, d, n)) == 0 &&
        (rc = wires_name(c, n)) == 0) {
        if (c->max_frame)
            max_frame = c->max_frame;
        if ((rc = chunks_place(c, max_frame)) == 0)
            rc = build_declares(c);
    }
    free(d);
    return rc;
}

int gift_declare(gift_client_t *c, const gift_tensor_desc_t *tensors, size_t n)
{
    gift__cmd_t cmd;
    int rc;

    if ((rc = gift__declare_build(c, tensors, n)) < 0)
        return rc;
    c->declared = 1;
    memset(&cmd, 0, sizeof cmd);
    cmd.kind = GIFT__CMD_DECLARE;
    cmd.deadline_ns = c->io->now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    rc = run_cmd(c, &cmd);
    if (rc < 0)
        c->declared = 0; /* no operation may start; the buffers go at close */
    return rc;
}
