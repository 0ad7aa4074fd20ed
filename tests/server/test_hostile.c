/*
 * test_hostile.c: hostile peers against a real giftd, one case per class of
 * attack, each beside a healthy worker pair (ranks 0 and 1 of 2, raw
 * connections) that pushes and pulls an f32 tensor step after step and
 * checks every mean exactly, before, during and after the attack:
 *
 *   wrap     wire fields at their boundary values (ids, rows, steps), a
 *            Declare whose chunk id is 2^32-1, unclear geometry shapes, a
 *            payload during the handshake; a Hello alone must not fix the
 *            world size.
 *   memory   a Declare of 64 chunks of 64 MiB against max_memory 64M: refused
 *            before anything is allocated (RSS, same process, before/after).
 *   slots    idle connections past max_connections, a reconnecting rank, a
 *            payload from a connection that is not a rank's, a trickling
 *            writer (read_timeout), an idle one (idle_timeout), replies
 *            never read, one connection parking too many pulls.
 *   http     64 idle HTTP connections and /livez still answers.
 *   rank     a far-future first push, an impostor of a live rank, an epoch
 *            of 4e9 on a shard that does not own the geometry.
 *   auth     a worker holding rank 1's key cannot speak as rank 0; its
 *            authenticated reconnect replaces its old connection.
 *   stranger a first push far ahead of the members (moved back by their
 *            own first pushes; the limit does not chain), a Hello claiming
 *            progress before the first step (refused alone), a run id with
 *            a NUL byte.
 *   world    giftd without world_size does not start; a rogue first Hello
 *            of world 65536 is refused and the pair runs.
 *   churn    rounds of bad connections; RSS before and after each round.
 *
 * Every test starts its own giftd on 127.0.0.1 with port 0 (Check forks per
 * test) and stops it with SIGTERM, asserting exit 0 and a clean log.
 */
#define _GNU_SOURCE

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gift_test_check.h"
#include "gift_test_frames.h"
#include "test_bad_input_common.h"

#if defined(__has_feature)
#define GIFT_HAS_ASAN_ __has_feature(address_sanitizer)
#elif defined(__SANITIZE_ADDRESS__)
#define GIFT_HAS_ASAN_ 1
#else
#define GIFT_HAS_ASAN_ 0
#endif

#define ROWS 4
#define COLS 16
#define N (ROWS * COLS)

/* ------------------------------------------------------------------ */
/* The tensor list and raw requests                                      */
/* ------------------------------------------------------------------ */

/* Tensor 0: f32 4 x 16, chunk 0 here. Tensor 1: geometry 8 x 16 (rank 4),
 * only its chunk 1 here, so this shard is not its geometry owner. */
static Gift__TensorDecl TD[2];
static Gift__TensorDecl *TDP[2];
static Gift__ChunkDecl CD[2];
static Gift__ChunkDecl *CDP[2];
static uint8_t DG[8];
static uint64_t SEQ = 1;

static void list_init(void)
{
    for (int i = 0; i < 2; i++) {
        gift__tensor_decl__init(&TD[i]);
        gift__chunk_decl__init(&CD[i]);
        TDP[i] = &TD[i];
        CDP[i] = &CD[i];
    }
    TD[0].key = 0;
    TD[0].name = (char *)"h";
    TD[0].rows = ROWS;
    TD[0].cols = COLS;
    TD[1].key = 1;
    TD[1].name = (char *)"g";
    TD[1].rows = 2 * ROWS;
    TD[1].cols = COLS;
    TD[1].geometry = 1;
    TD[1].rank = 4;
    TD[1].basis_cols = 4;
    CD[0].key = 0;
    CD[0].chunk = 0;
    CD[0].rows = ROWS;
    CD[1].key = 1;
    CD[1].chunk = 1;
    CD[1].row_begin = ROWS;
    CD[1].rows = ROWS;
    gift_digest_bytes(gift_digest_tensors(TDP, 2), DG);
}

/* Sends a Declare of the given lists with their own digest. */
static void send_declare(raw_t *c, Gift__TensorDecl **t, size_t nt, Gift__ChunkDecl **ch, size_t nc)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Declare d = GIFT__DECLARE__INIT;
    uint8_t dg[8];
    gift_digest_bytes(gift_digest_tensors(t, nt), dg);
    d.tensors = t;
    d.n_tensors = nt;
    d.chunks = ch;
    d.n_chunks = nc;
    d.digest.data = dg;
    d.digest.len = 8;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
    env.declare = &d;
    ck_assert_msg(raw_send(c, &env, NULL, 0) == 0, "send declare: %s", strerror(errno));
}

static void declare_std(raw_t *c)
{
    send_declare(c, TDP, 2, CDP, 2);
    raw_expect(c, GIFT__ENVELOPE__MSG_DECLARE_ACK, "declare");
}

/* One tensor of rows x cols with one chunk (id, rows from 0): refused with
 * code; returns the error text (static). */
/* The TensorDecl.transform declare_refused sends (0: none). */
static uint32_t decl_transform;

static const char *declare_refused(raw_t *c, uint32_t rows, uint32_t cols, uint32_t id,
                                   uint32_t crows, int geometry, uint32_t rank, uint32_t basis,
                                   int code, const char *what)
{
    static char text[512];
    Gift__TensorDecl t = GIFT__TENSOR_DECL__INIT, *tp = &t;
    Gift__ChunkDecl ch = GIFT__CHUNK_DECL__INIT, *cp = &ch;
    t.name = (char *)"x";
    t.rows = rows;
    t.cols = cols;
    t.geometry = geometry;
    t.rank = rank;
    t.basis_cols = basis;
    t.transform = (Gift__Transform)decl_transform;
    ch.chunk = id;
    ch.rows = crows;
    send_declare(c, &tp, 1, &cp, 1);
    raw_expect_error(c, code, 0, what);
    snprintf(text, sizeof text, "%s", c->f.env->error->text);
    return text;
}

static uint64_t send_push(raw_t *c, uint32_t key, uint32_t chunk, uint64_t step, uint32_t epoch,
                          const float *x, size_t n)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    uint64_t seq = SEQ++;
    gift_test_fill_push(&env, &m, &codec, key, chunk, step, epoch, GIFT__FORMAT__FORMAT_F32, 0,
                        seq);
    ck_assert_msg(raw_send(c, &env, x, n * sizeof *x) == 0, "send push: %s", strerror(errno));
    return seq;
}

static uint64_t send_pull(raw_t *c, uint32_t key, uint32_t chunk, uint64_t step)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Pull m = GIFT__PULL__INIT;
    uint64_t seq = SEQ++;
    gift_test_fill_pull(&env, &m, key, chunk, step, 0, seq);
    ck_assert_msg(raw_send(c, &env, NULL, 0) == 0, "send pull: %s", strerror(errno));
    return seq;
}

static void expect_push_ack(raw_t *c, int dup, const char *what)
{
    const gift_frame_t *f = raw_expect(c, GIFT__ENVELOPE__MSG_PUSH_ACK, what);
    ck_assert_msg(f->env->push_ack->duplicate == (dup != 0), "%s: duplicate %d, want %d", what,
                  f->env->push_ack->duplicate, dup);
}

/* Sends the preamble and header of env announcing payload_len bytes (the
 * payload, if any, is the caller's). */
static void send_head(raw_t *c, const Gift__Envelope *env, uint64_t payload_len)
{
    uint8_t head[256];
    long n = gift_frame_pack_head(env, payload_len, head, sizeof head);
    ck_assert_msg(n > 0, "pack %s: %ld", gift_msg_name(env), n);
    ck_assert_msg(raw_send_bytes(c, head, (size_t)n) == 0, "send %s", gift_msg_name(env));
}

/* The next frame is Error{code, fatal} whose text holds needle. */
static void expect_error_text(raw_t *c, int code, int fatal, const char *needle, const char *what)
{
    raw_expect_error_frame(c, code, fatal, what);
    ck_assert_msg(needle == NULL || strstr(c->f.env->error->text, needle) != NULL,
                  "%s: error text \"%s\" lacks \"%s\"", what, c->f.env->error->text, needle);
    if (fatal)
        raw_expect_eof(c, what);
}

/* ------------------------------------------------------------------ */
/* The healthy pair                                                      */
/* ------------------------------------------------------------------ */

typedef struct pair {
    raw_t w[2];
    uint64_t step;
} pair_t;

static void fill(float *x, int rank, uint64_t step)
{
    for (int i = 0; i < N; i++)
        x[i] = (float)(rank + 1) * (float)(step + 1) + 0.25f * (float)i;
}

/* The reply of step must be the exact mean of the two ranks' values. */
static void check_mean(raw_t *c, uint64_t step, const char *what)
{
    const gift_frame_t *f = raw_expect(c, GIFT__ENVELOPE__MSG_PULL_REPLY, what);
    float got[N];
    ck_assert_msg(f->env->pull_reply->step == step && f->payload_len == sizeof got,
                  "%s: reply of step %llu with %llu bytes (want step %llu, %zu bytes)", what,
                  (unsigned long long)f->env->pull_reply->step, (unsigned long long)f->payload_len,
                  (unsigned long long)step, sizeof got);
    memcpy(got, f->payload, sizeof got);
    for (int i = 0; i < N; i++) {
        float want = 1.5f * (float)(step + 1) + 0.25f * (float)i;
        ck_assert_msg(got[i] == want, "%s: step %llu element %d is %g, the mean is %g", what,
                      (unsigned long long)step, i, (double)got[i], (double)want);
    }
}

static void pair_join(pair_t *p, int r)
{
    raw_open(&p->w[r]);
    raw_hello(&p->w[r], (uint32_t)r, 2);
    declare_std(&p->w[r]);
}

static void pair_open(pair_t *p)
{
    memset(p, 0, sizeof *p);
    pair_join(p, 0);
    pair_join(p, 1);
}

/* One step: both push, both pull, both means exact. */
static void pair_step(pair_t *p)
{
    float x[N];
    char what[64];
    snprintf(what, sizeof what, "healthy pair, step %llu", (unsigned long long)p->step);
    for (int r = 0; r < 2; r++) {
        fill(x, r, p->step);
        send_push(&p->w[r], 0, 0, p->step, 0, x, N);
        expect_push_ack(&p->w[r], 0, what);
    }
    for (int r = 0; r < 2; r++) {
        send_pull(&p->w[r], 0, 0, p->step);
        check_mean(&p->w[r], p->step, what);
    }
    p->step++;
}

static void pair_close(pair_t *p)
{
    raw_close(&p->w[0]);
    raw_close(&p->w[1]);
}

static long rss_kb(void)
{
    long kb = daemon_rss_kb();
    ck_assert_msg(kb > 0, "no VmRSS for giftd pid %d", (int)D.pid);
    return kb;
}

static void setup(void)
{
    list_init();
}

/* ------------------------------------------------------------------ */
/* 1. Wrap-around and boundary values                                    */
/* ------------------------------------------------------------------ */

START_TEST(test_hostile_wrap)
{
    static const char *const flags[] = {"--max-memory", "256M", NULL};
    pair_t p;
    raw_t a;
    float x[N];
    const char *t;

    daemon_start(flags);
    /* Before anything is declared: a Hello of world 7 and refused Declares. */
    raw_open(&a);
    raw_hello(&a, 0, 7);
    declare_refused(&a, UINT32_MAX, 1, UINT32_MAX, 1, 0, 0, 0, GIFT_ESHAPE,
                    "rows 2^32-1, chunk id 2^32-1");
    declare_refused(&a, 1, UINT32_MAX, 0, 1, 0, 0, 0, GIFT_ESHAPE, "cols 2^32-1 (4 GiB chunk)");
    declare_refused(&a, 2, 2, 0, UINT32_MAX, 0, 0, 0, GIFT_ESHAPE, "chunk rows 2^32-1");
    t = declare_refused(&a, 8, 16, 0, 8, 1, 20, 0, GIFT_ESHAPE, "rank 20 of 16 columns");
    ck_assert_msg(strstr(t, "4294967295") == NULL && strstr(t, "rank 20") != NULL,
                  "geometry error text \"%s\"", t);
    t = declare_refused(&a, 8, 16, 0, 8, 1, 4, 2, GIFT_ESHAPE, "basis 2 below rank 4");
    ck_assert_msg(strstr(t, "basis of 2 columns") != NULL, "basis error text \"%s\"", t);
    t = declare_refused(&a, UINT32_MAX, 4, 0, 1, 1, 0, 0, GIFT_ESHAPE, "geometry rows 2^32-1");
    ck_assert_msg(strstr(t, "2^31-1") != NULL, "rows error text \"%s\"", t);
    /* A transform no worker knows, and a rotation on top of the geometry. */
    decl_transform = UINT32_MAX;
    t = declare_refused(&a, 8, 16, 0, 8, 0, 0, 0, GIFT_ESHAPE, "transform 2^32-1");
    ck_assert_msg(strstr(t, "transform 4294967295") != NULL, "transform error text \"%s\"", t);
    decl_transform = 1;
    t = declare_refused(&a, 8, 16, 0, 8, 1, 4, 0, GIFT_ESHAPE, "hadamard with geometry");
    ck_assert_msg(strstr(t, "with geometry") != NULL, "transform error text \"%s\"", t);
    decl_transform = 0;

    /* None of that fixed the world size: the pair of 2 declares and steps. */
    pair_open(&p);
    pair_step(&p);
    /* The world-7 peer is refused once it acts. */
    fill(x, 0, 0);
    send_push(&a, 0, 0, p.step, 0, x, N);
    expect_error_text(&a, GIFT_EWORLD, 1, "world size 7", "push after a Hello of world 7");
    raw_close(&a);

    /* Boundary values on rank 0's own connection: each refused, nothing kept. */
    send_push(&p.w[0], 0, 0, UINT64_MAX, 0, x, N);
    raw_expect_error_frame(&p.w[0], GIFT_ESTEP, 0, "push for step 2^64-1");
    ck_assert_msg(strstr(p.w[0].f.env->error->text, "..0)") == NULL &&
                      strstr(p.w[0].f.env->error->text, "18446744073709551615..") == NULL,
                  "step error text \"%s\"", p.w[0].f.env->error->text);
    send_push(&p.w[0], 0, UINT32_MAX, 0, 0, x, N);
    raw_expect_error(&p.w[0], GIFT_ENOKEY, 0, "push for chunk 2^32-1");
    send_push(&p.w[0], UINT32_MAX, 0, 0, 0, x, N);
    raw_expect_error(&p.w[0], GIFT_ENOKEY, 0, "push for key 2^32-1");
    send_pull(&p.w[0], 0, 0, UINT64_MAX);
    raw_expect_error(&p.w[0], GIFT_ESTEP, 0, "pull for step 2^64-1");
    send_pull(&p.w[0], 0, UINT32_MAX, 0);
    raw_expect_error(&p.w[0], GIFT_ENOKEY, 0, "pull for chunk 2^32-1");
    pair_step(&p);

    /* A payload during the handshake is named as such. */
    raw_open(&a);
    send_push(&a, 0, 0, 0, 0, x, N);
    expect_error_text(&a, GIFT_EPROTO, 1, "during the handshake", "push before Hello");
    raw_close(&a);
    pair_step(&p);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* 2. Memory budget                                                      */
/* ------------------------------------------------------------------ */

START_TEST(test_hostile_memory)
{
    static const char *const flags[] = {"--max-memory", "64M", NULL};
    Gift__TensorDecl t = GIFT__TENSOR_DECL__INIT, *tp = &t;
    static Gift__ChunkDecl ch[64];
    static Gift__ChunkDecl *cp[64];
    long before, after_declare, after_steps;
    pair_t p;
    raw_t a;

    daemon_start(flags);
    before = rss_kb();
    raw_open(&a);
    raw_hello(&a, 0, 3);
    /* 64 chunks of 4096 x 4096 f32 (64 MiB each): accumulators, replies and
     * kept pushes would be about 12 GiB. */
    t.name = (char *)"big";
    t.rows = 64 * 4096;
    t.cols = 4096;
    for (int i = 0; i < 64; i++) {
        gift__chunk_decl__init(&ch[i]);
        ch[i].chunk = (uint32_t)i;
        ch[i].row_begin = (uint32_t)i * 4096;
        ch[i].rows = 4096;
        cp[i] = &ch[i];
    }
    for (int k = 0; k < 3; k++) {
        send_declare(&a, &tp, 1, cp, 64);
        expect_error_text(&a, GIFT_ENOMEM, 0, "max_memory is 67108864 bytes",
                          "64 chunks of 64 MiB with max_memory 64M");
        ck_assert_msg(strstr(a.f.env->error->text, "--max-memory") != NULL,
                      "budget error text names no option: \"%s\"", a.f.env->error->text);
    }
    /* One chunk of 64 MiB also needs more than 64 MiB (two replies, two
     * accumulators, kept pushes). */
    send_declare(&a, &tp, 1, cp, 1);
    raw_expect_error(&a, GIFT_ENOMEM, 0, "one 64 MiB chunk with max_memory 64M");
    after_declare = rss_kb();
    /* Nothing was allocated for the refused declarations. */
    ck_assert_msg(after_declare - before < 16 * 1024,
                  "RSS went from %ld kB to %ld kB after refused declarations", before,
                  after_declare);
    /* The refused Declares fixed no world size (the attacker said 3). */
    pair_open(&p);
    for (int i = 0; i < 5; i++)
        pair_step(&p);
    after_steps = rss_kb();
    printf("hostile memory: VmRSS %ld kB at start, %ld kB after 4 refused declarations "
           "(64 x 64 MiB and 1 x 64 MiB, max_memory 64M), %ld kB after the pair's 5 steps\n",
           before, after_declare, after_steps);
    raw_close(&a);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* 3. Slots and buffers                                                  */
/* ------------------------------------------------------------------ */

#define IDLE 10

START_TEST(test_hostile_slots)
{
    static const char *const flags[] = {"--max-connections",
                                        "8",
                                        "--read-timeout",
                                        "2",
                                        "--idle-timeout",
                                        "3",
                                        "--max-parked-per-peer",
                                        "16",
                                        NULL};
    static raw_t idle[IDLE];
    pair_t p;
    raw_t a, b;
    float x[N];
    long before, after;
    int evicted = 0;

    daemon_start(flags);
    pair_open(&p);
    pair_step(&p);

    /* Idle connections past max_connections: the oldest that is not a
     * rank's makes room each time; the pair is never touched. */
    for (int i = 0; i < IDLE; i++) {
        raw_open(&idle[i]);
        raw_hello(&idle[i], 0, 2);
    }
    for (int i = 0; i < IDLE; i++) {
        struct pollfd pfd = {.fd = idle[i].fd, .events = POLLIN};
        if (poll(&pfd, 1, 200) > 0) {
            raw_expect_error(&idle[i], GIFT_EBUSY, 1, "an idle connection making room");
            evicted++;
        }
    }
    ck_assert_msg(evicted == IDLE + 2 - 8, "%d idle connections closed to make room, want %d",
                  evicted, IDLE + 2 - 8);
    pair_step(&p);
    /* Rank 1 reconnects while idle connections fill every slot. */
    raw_close(&p.w[1]);
    usleep(200 * 1000);
    pair_join(&p, 1);
    pair_step(&p);

    /* A payload frame from a connection that is not its rank's: refused at
     * its preamble, before the 1 MiB is buffered. */
    raw_open(&a);
    raw_hello(&a, 0, 2);
    {
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__Push m = GIFT__PUSH__INIT;
        m.key = 0;
        env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
        env.push = &m;
        send_head(&a, &env, 1u << 20);
        ck_assert(raw_send_bytes(&a, x, sizeof x) == 0);
    }
    expect_error_text(&a, GIFT_EBUSY, 1, "rank 0 is already connected",
                      "a 1 MiB push from a second connection of rank 0");
    raw_close(&a);

    /* A trickling writer: three bytes of a frame, then nothing; and b,
     * silent after its Hello. */
    raw_open(&b);
    raw_hello(&b, 0, 2);
    raw_open(&a);
    raw_hello(&a, 1, 2);
    ck_assert(raw_send_bytes(&a, "GIF", 3) == 0);
    expect_error_text(&a, GIFT_ETIMEDOUT, 1, "read_timeout", "a frame that never completes");
    raw_close(&a);
    expect_error_text(&b, GIFT_ETIMEDOUT, 1, "idle_timeout", "a connection idle after Hello");
    raw_close(&b);
    for (int i = 0; i < IDLE; i++)
        raw_close(&idle[i]);
    pair_step(&p);

    /* Replies never read: 20,000 StatsRequests on a connection that reads
     * nothing. The shard stops reading it once 1 MiB of answers wait. */
    before = rss_kb();
    raw_open(&a);
    raw_hello(&a, 0, 2);
    {
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__StatsRequest m = GIFT__STATS_REQUEST__INIT;
        uint8_t head[64];
        long n;
        struct timeval tv = {0, 200 * 1000};
        int sent = 0;
        env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
        env.stats_request = &m;
        n = gift_frame_pack_head(&env, 0, head, sizeof head);
        ck_assert(n > 0);
        /* A short send timeout: the sends stop once giftd stops reading. */
        setsockopt(a.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        while (sent < 20000 && raw_send_bytes(&a, head, (size_t)n) == 0)
            sent++;
        pair_step(&p);
        after = rss_kb();
        printf("hostile slots: %d StatsRequests never read; VmRSS %ld kB before, %ld kB "
               "after\n",
               sent, before, after);
        ck_assert_msg(GIFT_HAS_ASAN_ || after - before < 32 * 1024,
                      "unread replies grew RSS from %ld to %ld kB", before, after);
    }
    raw_close(&a);

    /* One connection parking more pulls than its share (16). */
    {
        int busy = 0;
        for (int i = 0; i < 30; i++)
            send_pull(&p.w[0], 0, 0, p.step);
        for (int i = 0; i < 30 - 16; i++) {
            expect_error_text(&p.w[0], GIFT_EBUSY, 0, "max_parked_per_peer",
                              "pull past the connection's share");
            busy++;
        }
        /* Rank 1 still parks. */
        send_pull(&p.w[1], 0, 0, p.step);
        for (int r = 0; r < 2; r++) {
            fill(x, r, p.step);
            send_push(&p.w[r], 0, 0, p.step, 0, x, N);
        }
        expect_push_ack(&p.w[0], 0, "rank 0's push with 16 parked pulls");
        expect_push_ack(&p.w[1], 0, "rank 1's push");
        check_mean(&p.w[1], p.step, "rank 1's parked pull");
        for (int i = 0; i < 16; i++)
            check_mean(&p.w[0], p.step, "rank 0's parked pulls");
        ck_assert_int_eq(busy, 14);
        p.step++;
    }
    pair_step(&p);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* 4. HTTP                                                               */
/* ------------------------------------------------------------------ */

/* GET path on the HTTP port; returns the status code (-1: no answer). */
static int http_get(const char *path)
{
    char req[128], buf[4096];
    size_t len = 0;
    int fd = tcp_connect_to(D.http_port, IO_TIMEOUT_MS), status = -1;
    ssize_t n;
    if (fd < 0)
        return -1;
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: giftd\r\n\r\n", path);
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) < 0) {
        close(fd);
        return -1;
    }
    while (len + 1 < sizeof buf && (n = recv(fd, buf + len, sizeof buf - 1 - len, 0)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    close(fd);
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        return -1;
    return status;
}

START_TEST(test_hostile_http)
{
    static const char *const flags[] = {"--http-max-connections", "4", NULL};
    int fds[64];
    pair_t p;

    daemon_start(flags);
    pair_open(&p);
    pair_step(&p);
    for (int i = 0; i < 64; i++) {
        fds[i] = tcp_connect_to(D.http_port, IO_TIMEOUT_MS);
        ck_assert_msg(fds[i] >= 0, "idle HTTP connection %d: %s", i, strerror(errno));
    }
    for (int k = 0; k < 5; k++) {
        int st = http_get(k % 2 ? "/readyz" : "/livez");
        ck_assert_msg(st == 200, "probe %d with 64 idle HTTP connections: status %d", k, st);
        pair_step(&p);
    }
    for (int i = 0; i < 64; i++)
        close(fds[i]);
    ck_assert_int_eq(http_get("/livez"), 200);
    pair_step(&p);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* 5. Silent acceptance: step window, impostors, epochs                  */
/* ------------------------------------------------------------------ */

START_TEST(test_hostile_rank)
{
    pair_t p;
    raw_t a;
    float x[N];

    daemon_start(NULL);
    pair_open(&p);
    /* The first push of the chunk claims step 10^12: refused, so the real
     * step-0 pushes are not taken for replays. */
    fill(x, 0, 0);
    send_push(&p.w[0], 0, 0, 1000000000000ull, 0, x, N);
    expect_error_text(&p.w[0], GIFT_ESTEP, 0, "max_step_ahead", "first push for step 10^12");
    pair_step(&p);
    pair_step(&p);

    /* An impostor of live rank 1: its Hello passes, acting is refused. */
    raw_open(&a);
    raw_hello(&a, 1, 2);
    for (int i = 0; i < N; i++)
        x[i] = 1e6f;
    send_push(&a, 0, 0, p.step, 0, x, N);
    expect_error_text(&a, GIFT_EBUSY, 1, "rank 1 is already connected",
                      "a push from a second connection of rank 1");
    raw_close(&a);
    pair_step(&p); /* the mean holds no 1e6 */

    /* This shard holds chunk 1 of tensor 1, not its geometry owner: an
     * epoch of 4e9 at step 0 is refused, epoch 0 is taken. */
    fill(x, 0, 0);
    send_push(&p.w[0], 1, 1, 0, 4000000000u, x, N);
    expect_error_text(&p.w[0], GIFT_EEPOCH, 0, "at most", "epoch 4e9 on a non-owner shard");
    for (int r = 0; r < 2; r++) {
        fill(x, r, 0);
        send_push(&p.w[r], 1, 1, 0, 0, x, N);
        expect_push_ack(&p.w[r], 0, "tensor 1 chunk 1 step 0, epoch 0");
    }
    send_pull(&p.w[0], 1, 1, 0);
    {
        const gift_frame_t *f =
            raw_expect(&p.w[0], GIFT__ENVELOPE__MSG_PULL_REPLY, "tensor 1 chunk 1 step 0");
        ck_assert_msg(f->env->pull_reply->epoch == 0, "reply epoch %u", f->env->pull_reply->epoch);
    }
    /* A Hello of another world size once the world is known. */
    raw_open(&a);
    raw_send_hello(&a, 0, 7, NULL, NULL);
    raw_expect_error(&a, GIFT_EWORLD, 1, "Hello of world 7 in a world of 2");
    raw_close(&a);
    pair_step(&p);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* 5b. Authentication binds the rank                                     */
/* ------------------------------------------------------------------ */

START_TEST(test_hostile_auth)
{
    static const char secret[] = "hostile suite shared secret, 41 bytes ok\n";
    const char *path = key_file_write("hostile", secret, sizeof secret - 1, 0600);
    const char *flags[] = {"--auth-key-file", path, NULL};
    gift_auth_key_t k, k1;
    char err[256], warn[256];
    uint8_t cn[GIFT_AUTH_NONCE_BYTES], sn[GIFT_AUTH_NONCE_BYTES], mac[GIFT_AUTH_MAC_BYTES];
    pair_t p;
    raw_t a;

    ck_assert_msg(gift_auth_key_load(path, &k, err, sizeof err, warn, sizeof warn) == 0, "%s", err);
    gift_auth_rank_key(&k, 1, &k1);
    daemon_start(flags);
    memset(&p, 0, sizeof p);
    for (int r = 0; r < 2; r++) {
        raw_open(&p.w[r]);
        raw_hello_auth(&p.w[r], r == 1 ? &k1 : &k, (uint32_t)r, 2);
        declare_std(&p.w[r]);
    }
    pair_step(&p);

    /* Rank 1's key cannot speak for rank 0. */
    raw_open(&a);
    ck_assert(gift_auth_nonce(cn) == 0);
    raw_send_hello(&a, 0, 2, cn, NULL);
    memcpy(sn,
           raw_expect(&a, GIFT__ENVELOPE__MSG_AUTH_CHALLENGE, "challenge")
               ->env->auth_challenge->server_nonce.data,
           sizeof sn);
    raw_hello_mac(&k1, sn, 0, 2, cn, mac);
    raw_send_hello(&a, 0, 2, cn, mac);
    raw_expect_error(&a, GIFT_EAUTH, 1, "rank 1's key claiming rank 0");
    raw_close(&a);
    pair_step(&p);

    /* Rank 1 reconnects (authenticated with its key): the new connection
     * replaces the old one once it acts. */
    raw_open(&a);
    raw_hello_auth(&a, &k1, 1, 2);
    declare_std(&a);
    expect_error_text(&p.w[1], GIFT_ECLOSED, 1, "replaced by connection",
                      "rank 1's old connection");
    raw_close(&p.w[1]);
    p.w[1] = a;
    pair_step(&p);
    pair_close(&p);
    gift_auth_key_clear(&k);
    gift_auth_key_clear(&k1);
    daemon_stop();
    unlink(path);
}
END_TEST

/* ------------------------------------------------------------------ */
/* 5c. Strangers cannot change the run's state                           */
/* ------------------------------------------------------------------ */

/* Sends a Hello of rank / world with resume_step and run_id, packed by
 * hand; when nul is set, the byte of run_id at nul is made a NUL on the
 * wire (protobuf-c cannot pack one). */
static void send_hello_ex(raw_t *c, uint32_t rank, uint32_t world, uint64_t resume,
                          const char *run_id, int nul)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    uint8_t buf[512];
    size_t n;
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = rank;
    h.world_size = world;
    h.client_name = (char *)"stranger";
    h.resume_step = resume;
    h.run_id = (char *)run_id;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    n = gift__envelope__get_packed_size(&env);
    ck_assert_msg(n + 16 <= sizeof buf, "Hello of %zu bytes", n);
    memcpy(buf, GIFT_FRAME_MAGIC, 4);
    for (int i = 0; i < 4; i++)
        buf[4 + i] = (uint8_t)(n >> (8 * i));
    memset(buf + 8, 0, 8);
    gift__envelope__pack(&env, buf + 16);
    if (nul >= 0) {
        uint8_t *at = memmem(buf + 16, n, run_id, strlen(run_id));
        ck_assert_msg(at != NULL, "run id '%s' not found in the packed Hello", run_id);
        at[nul] = 0;
    }
    ck_assert_msg(raw_send_bytes(c, buf, 16 + n) == 0, "send hello: %s", strerror(errno));
}

START_TEST(test_hostile_stranger)
{
    static const char *const flags[] = {"--world-size", "2", NULL};
    pair_t p;
    raw_t a;
    float x[N];
    char log[65536];

    daemon_start(flags);
    /* Rank 0 is here; before rank 1, a stranger takes its free seat and
     * places tensor 0's window at step 999,999 (below max_step_ahead 10^6
     * from step 0): accepted, but tentative. */
    memset(&p, 0, sizeof p);
    pair_join(&p, 0);
    raw_open(&a);
    raw_hello(&a, 1, 2);
    declare_std(&a);
    fill(x, 1, 0);
    send_push(&a, 0, 0, 999999, 0, x, N);
    expect_push_ack(&a, 0, "a stranger's first push for step 999,999");
    /* The limit does not chain: another chunk's first push is counted from
     * the shard's lowest anchored step (0), not from 999,999. */
    send_push(&a, 1, 1, 1000005, 0, x, N);
    expect_error_text(&a, GIFT_ESTEP, 0, "lowest open step 0",
                      "a first push for step 10^6 + 5 after one at 999,999");
    raw_close(&a);
    usleep(200 * 1000);
    pair_join(&p, 1);
    /* Before the first step: a stranger's Hello claiming progress to step
     * 10 is refused alone (no auth: it proves nothing); the members' run
     * goes on, and their step-0 pushes move the window back to step 0. */
    raw_open(&a);
    send_hello_ex(&a, 0, 2, 10, NULL, -1);
    expect_error_text(&a, GIFT_ESTATE, 1, "lost this run's state",
                      "a stranger's Hello with resume_step 10");
    raw_close(&a);
    pair_step(&p);
    pair_step(&p);
    log_read(log, sizeof log, 0);
    ck_assert_msg(strstr(log, "the window moves to step 0") != NULL,
                  "the log does not name the moved window:\n%s", log);
    /* A run id with a NUL in it is refused, not read as its prefix. */
    raw_open(&a);
    send_hello_ex(&a, 0, 2, 0, "runAXevil", 4);
    expect_error_text(&a, GIFT_EPROTO, 1, "NUL", "a Hello whose run id is \"runA\\0evil\"");
    raw_close(&a);
    pair_step(&p);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* No peer decides the cluster's shape: giftd without world_size does not
 * start (exit 2, a message naming --world-size N and auto); with it, the
 * probe's rogue first Hello of world 65536 (which would then have declared a
 * 1x1 tensor and fixed the world) is refused, and the real pair runs. */
START_TEST(test_hostile_world)
{
    static const char *const flags[] = {"--world-size", "2", NULL};
    char cmd[512], out[1024];
    size_t n;
    FILE *f;
    int rc;
    pair_t p;
    raw_t a;

    snprintf(cmd, sizeof cmd, "'%s' --bind 127.0.0.1 --port 0 --http-port off 2>&1", GIFTD_BIN);
    f = popen(cmd, "r");
    ck_assert_msg(f != NULL, "popen: %s", strerror(errno));
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    rc = pclose(f);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 2,
                  "giftd without world_size: status %d, want exit 2; output:\n%s", rc, out);
    ck_assert_msg(strstr(out, "world_size is not set") && strstr(out, "--world-size N") &&
                      strstr(out, "--world-size auto"),
                  "giftd without world_size says:\n%s", out);

    daemon_start(flags);
    raw_open(&a);
    raw_send_hello(&a, 0, 65536, NULL, NULL);
    raw_expect_error(&a, GIFT_EWORLD, 1, "a rogue first Hello of world 65536");
    ck_assert_msg(strstr(a.f.env->error->text, "the cluster has 2"), "text: %s",
                  a.f.env->error->text);
    raw_close(&a);
    pair_open(&p);
    pair_step(&p);
    pair_step(&p);
    pair_close(&p);
    daemon_stop();
}
END_TEST

/* ------------------------------------------------------------------ */
/* 6. Connection churn                                                   */
/* ------------------------------------------------------------------ */

#define CHURN_ROUNDS 4
#define CHURN_CONNS 2500

START_TEST(test_hostile_churn)
{
    long rss[CHURN_ROUNDS + 1];
    pair_t p;

    daemon_start(NULL);
    pair_open(&p);
    for (int i = 0; i < 3; i++)
        pair_step(&p);
    rss[0] = rss_kb();
    for (int round = 1; round <= CHURN_ROUNDS; round++) {
        for (int i = 0; i < CHURN_CONNS; i++) {
            raw_t a;
            raw_open(&a);
            switch (i % 3) {
            case 0:
                (void)raw_send_bytes(&a, "GET / HTTP/1.1\r\n\r\n", 18);
                raw_expect_error(&a, GIFT_EBADMAGIC, 1, "garbage");
                break;
            case 1:
                raw_hello(&a, 0, 2);
                break;
            default: {
                uint8_t pre[16] = {'G', 'I', 'F', '1', 8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
                (void)raw_send_bytes(&a, pre, sizeof pre);
                raw_expect_error(&a, GIFT_EFRAMESIZE, 1, "2^32-byte payload");
                break;
            }
            }
            raw_close(&a);
        }
        pair_step(&p);
        rss[round] = rss_kb();
    }
    printf("hostile churn: VmRSS kB after warm-up %ld", rss[0]);
    for (int r = 1; r <= CHURN_ROUNDS; r++)
        printf(", after %d bad connections %ld (%+.1f%%)", r * CHURN_CONNS, rss[r],
               100.0 * (double)(rss[r] - rss[0]) / (double)rss[0]);
    printf("\n");
    /* Growth must flatten: the last round adds little to the one before. */
    ck_assert_msg(GIFT_HAS_ASAN_ || rss[CHURN_ROUNDS] - rss[CHURN_ROUNDS - 1] < 2048,
                  "RSS still growing: %ld kB -> %ld kB in the last round", rss[CHURN_ROUNDS - 1],
                  rss[CHURN_ROUNDS]);
    pair_close(&p);
    daemon_stop();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("hostile");
    TCase *tc = tcase_create("hostile");
    tcase_add_checked_fixture(tc, setup, daemon_teardown);
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_hostile_wrap);
    tcase_add_test(tc, test_hostile_memory);
    tcase_add_test(tc, test_hostile_slots);
    tcase_add_test(tc, test_hostile_http);
    tcase_add_test(tc, test_hostile_rank);
    tcase_add_test(tc, test_hostile_auth);
    tcase_add_test(tc, test_hostile_stranger);
    tcase_add_test(tc, test_hostile_world);
    tcase_add_test(tc, test_hostile_churn);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return gift_test_run(suite(), CK_NORMAL) ? 1 : 0;
}
