/*
 * test_frame.c: proto/frame.c, the frame writer and the stream reader.
 *
 * Envelopes are filled with random values by walking the protobuf-c
 * descriptors, so every field of every message in gift.proto is exercised
 * and a field added later is covered without touching this file; decoded
 * headers are compared with the originals field by field, and a mismatch
 * names the field and both values.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_proto.h"
#include "gift_proto_internal.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"

#define N_MSG 15 /* message cases in Envelope: 1..N_MSG */

/* ck_assert_msg for hot loops: a passing ck_assert records its location with
 * a write() to Check's pipe, which costs seconds over millions of bytes fed
 * one at a time; this one only calls into Check when it fails. */
#define require(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

/* ---- random numbers ------------------------------------------------------ */

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    return rng_next(s) % n;
}

static void rng_fill(uint64_t *s, uint8_t *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        p[i] = (uint8_t)rng_next(s);
}

/* ---- allocations owned by the running test, freed by the fixture --------- */

static void **t_ptrs;
static size_t t_n, t_cap;

static void *t_alloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);

    ck_assert_msg(p != NULL, "calloc(%zu) failed", n);
    if (t_n == t_cap) {
        t_cap = t_cap ? 2 * t_cap : 256;
        t_ptrs = realloc(t_ptrs, t_cap * sizeof(*t_ptrs));
        ck_assert_msg(t_ptrs != NULL, "realloc of %zu pointers failed", t_cap);
    }
    t_ptrs[t_n++] = p;
    return p;
}

static void t_free_all(void)
{
    while (t_n > 0)
        free(t_ptrs[--t_n]);
    free(t_ptrs);
    t_ptrs = NULL;
    t_cap = 0;
}

/* A growable byte string (a stream of frames). */
typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
} bytes_t;

static uint8_t *bytes_grow(bytes_t *b, size_t n)
{
    if (b->cap - b->len < n) {
        size_t ncap = b->cap ? b->cap : 4096;

        while (ncap - b->len < n)
            ncap *= 2;
        b->p = realloc(b->p, ncap);
        ck_assert_msg(b->p != NULL, "realloc(%zu) failed", ncap);
        b->cap = ncap;
    }
    b->len += n;
    return b->p + b->len - n;
}

static void bytes_free(bytes_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- fixtures ------------------------------------------------------------- */

static gift_reader_t *rd;

static void setup(void)
{
    rd = gift_reader_new(NULL);
    ck_assert_ptr_nonnull(rd);
}

static void teardown(void)
{
    gift_reader_free(rd);
    rd = NULL;
    t_free_all();
}

/* Small limits, so that the edges are cheap to reach. */
#define SMALL_HDR 64u
#define SMALL_FRAME 1000u

static void setup_small(void)
{
    gift_limits_t lim = {SMALL_HDR, SMALL_FRAME, 0};

    rd = gift_reader_new(&lim);
    ck_assert_ptr_nonnull(rd);
}

/* ---- random envelopes, by descriptor --------------------------------------- */

static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    default:
        return 4;
    }
}

static void fill_message(ProtobufCMessage *m, uint64_t *s);

/* Stores one random value of fd's type at member. */
static void fill_value(void *member, const ProtobufCFieldDescriptor *fd, uint64_t *s)
{
    size_t n, i;

    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t v = rng_next(s) >> rng_below(s, 64);

        memcpy(member, &v, 8);
        break;
    }
    case PROTOBUF_C_TYPE_FLOAT:
        *(float *)member = (float)(int32_t)rng_next(s) / 7.0f;
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        *(double *)member = (double)(int64_t)rng_next(s) / 3.0;
        break;
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)member = (protobuf_c_boolean)(rng_next(s) & 1);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = fd->descriptor;

        *(int *)member = ed->values[rng_below(s, ed->n_values)].value;
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *str;

        n = rng_below(s, 24);
        str = t_alloc(n + 1);
        for (i = 0; i < n; i++)
            str[i] = (char)('a' + rng_below(s, 26));
        *(char **)member = str;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = member;

        b->len = rng_below(s, 40);
        b->data = t_alloc(b->len);
        rng_fill(s, b->data, b->len);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *md = fd->descriptor;
        ProtobufCMessage *sub = t_alloc(md->sizeof_message);

        md->message_init(sub);
        fill_message(sub, s);
        *(ProtobufCMessage **)member = sub;
        break;
    }
    default: { /* the 32-bit integers */
        uint32_t v = (uint32_t)(rng_next(s) >> rng_below(s, 64));

        memcpy(member, &v, 4);
        break;
    }
    }
}

/* Gives every field of m a random value (0..4 elements when repeated). */
static void fill_message(ProtobufCMessage *m, uint64_t *s)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    unsigned i;

    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        char *member = (char *)m + fd->offset;

        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            continue;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = rng_below(s, 5), k, es = elem_size(fd->type);
            char *arr = t_alloc(n * es);

            for (k = 0; k < n; k++)
                fill_value(arr + k * es, fd, s);
            *(size_t *)((char *)m + fd->quantifier_offset) = n;
            *(void **)member = arr;
        } else {
            fill_value(member, fd, s);
        }
    }
}

/* A random Envelope holding message case `which` (1..N_MSG); freed by the fixture. */
static Gift__Envelope *gen_env(int which, uint64_t *s)
{
    Gift__Envelope *env = t_alloc(sizeof(*env));
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&gift__envelope__descriptor, (unsigned)which);

    ck_assert_msg(fd != NULL, "Envelope has no field %d", which);
    gift__envelope__init(env);
    fill_value((char *)env + fd->offset, fd, s);
    env->msg_case = (Gift__Envelope__MsgCase)which;
    return env;
}

/* ---- comparison, by descriptor --------------------------------------------- */

static int msg_diff(const ProtobufCMessage *got, const ProtobufCMessage *want, const char *path,
                    char *why, size_t whylen);

/* Compares one value of fd's type. Returns 0 when equal, else 1 with both
 * values in why. */
static int value_diff(const void *g, const void *w, const ProtobufCFieldDescriptor *fd,
                      const char *path, char *why, size_t whylen)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *gs = *(char *const *)g, *ws = *(char *const *)w;

        gs = gs ? gs : "";
        ws = ws ? ws : "";
        if (strcmp(gs, ws) == 0)
            return 0;
        snprintf(why, whylen, "%s: got \"%s\", want \"%s\"", path, gs, ws);
        return 1;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *gb = g, *wb = w;

        if (gb->len == wb->len && (gb->len == 0 || memcmp(gb->data, wb->data, gb->len) == 0))
            return 0;
        snprintf(why, whylen, "%s: got %zu bytes, want %zu (or contents differ)", path, gb->len,
                 wb->len);
        return 1;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *gm = *(ProtobufCMessage *const *)g;
        const ProtobufCMessage *wm = *(ProtobufCMessage *const *)w;

        if (gm == NULL || wm == NULL) {
            if (gm == wm)
                return 0;
            snprintf(why, whylen, "%s: got %s, want %s", path, gm ? "a message" : "NULL",
                     wm ? "a message" : "NULL");
            return 1;
        }
        return msg_diff(gm, wm, path, why, whylen);
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double gd = *(const double *)g, wd = *(const double *)w;

        if (memcmp(&gd, &wd, sizeof(gd)) == 0)
            return 0;
        snprintf(why, whylen, "%s: got %.17g, want %.17g", path, gd, wd);
        return 1;
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        float gf = *(const float *)g, wf = *(const float *)w;

        if (memcmp(&gf, &wf, sizeof(gf)) == 0)
            return 0;
        snprintf(why, whylen, "%s: got %.9g, want %.9g", path, gf, wf);
        return 1;
    }
    default: {
        uint64_t gv = 0, wv = 0;
        size_t es = elem_size(fd->type);

        if (es == 8) {
            memcpy(&gv, g, 8);
            memcpy(&wv, w, 8);
        } else {
            uint32_t g32, w32;

            memcpy(&g32, g, 4);
            memcpy(&w32, w, 4);
            gv = g32;
            wv = w32;
        }
        if (gv == wv)
            return 0;
        snprintf(why, whylen, "%s: got %" PRIu64 ", want %" PRIu64, path, gv, wv);
        return 1;
    }
    }
}

/* Compares two messages of one type field by field (for a oneof, the case
 * and the field set). Returns 0 when equal, else 1 with the first
 * difference in why ("push.codec.block: got 3, want 5"). */
static int msg_diff(const ProtobufCMessage *got, const ProtobufCMessage *want, const char *path,
                    char *why, size_t whylen)
{
    const ProtobufCMessageDescriptor *d = want->descriptor;
    char sub[256];
    unsigned i;

    if (got->descriptor != d) {
        snprintf(why, whylen, "%s: got a %s, want a %s", path, got->descriptor->name, d->name);
        return 1;
    }
    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        const char *gm = (const char *)got + fd->offset, *wm = (const char *)want + fd->offset;

        snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", fd->name);
        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t gc = *(const uint32_t *)((const char *)got + fd->quantifier_offset);
            uint32_t wc = *(const uint32_t *)((const char *)want + fd->quantifier_offset);

            if (gc != wc) {
                snprintf(why, whylen, "%s: oneof case %u, want %u", path, gc, wc);
                return 1;
            }
            if (wc == fd->id && value_diff(gm, wm, fd, sub, why, whylen))
                return 1;
        } else if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t gn = *(const size_t *)((const char *)got + fd->quantifier_offset);
            size_t wn = *(const size_t *)((const char *)want + fd->quantifier_offset);
            size_t es = elem_size(fd->type), k;
            char el[300];

            if (gn != wn) {
                snprintf(why, whylen, "%s: got %zu elements, want %zu", sub, gn, wn);
                return 1;
            }
            for (k = 0; k < wn; k++) {
                snprintf(el, sizeof(el), "%s[%zu]", sub, k);
                if (value_diff(*(char *const *)gm + k * es, *(char *const *)wm + k * es, fd, el,
                               why, whylen))
                    return 1;
            }
        } else if (value_diff(gm, wm, fd, sub, why, whylen)) {
            return 1;
        }
    }
    return 0;
}

/* ---- frames ----------------------------------------------------------------- */

/* What a frame in a stream should decode to. */
typedef struct expect {
    const Gift__Envelope *env;
    const uint8_t *payload; /* into the stream's bytes: valid until the stream grows */
    size_t payload_off;
    size_t payload_len;
} expect_t;

/* Appends a frame (head packed by gift_frame_pack_head, then payload) to b;
 * returns the payload's offset in b. */
static size_t frame_append(bytes_t *b, const Gift__Envelope *env, const uint8_t *payload,
                           size_t plen)
{
    size_t hs = gift_frame_head_size(env);
    long rc = gift_frame_pack_head(env, plen, bytes_grow(b, hs), hs);

    ck_assert_msg(rc == (long)hs, "pack_head(%s) = %ld, head size %zu", gift_msg_name(env), rc, hs);
    if (plen > 0)
        memcpy(bytes_grow(b, plen), payload, plen);
    return b->len - plen;
}

/* Writes a preamble by hand. */
static void put_preamble(uint8_t *p, const char *magic, uint32_t hlen, uint64_t plen)
{
    int i;

    memcpy(p, magic, 4);
    for (i = 0; i < 4; i++)
        p[4 + i] = (uint8_t)(hlen >> (8 * i));
    for (i = 0; i < 8; i++)
        p[8 + i] = (uint8_t)(plen >> (8 * i));
}

/* Checks a decoded frame against exp. */
static void check_frame(const gift_frame_t *f, const expect_t *exp, size_t idx)
{
    char why[512];
    size_t k;

    require(f->env != NULL, "frame %zu: env is NULL", idx);
    require(f->env->msg_case == exp->env->msg_case, "frame %zu: got %s, want %s", idx,
            gift_msg_name(f->env), gift_msg_name(exp->env));
    require(msg_diff(&f->env->base, &exp->env->base, "", why, sizeof(why)) == 0, "frame %zu: %s",
            idx, why);
    require(f->payload_len == exp->payload_len, "frame %zu (%s): payload_len %" PRIu64 ", want %zu",
            idx, gift_msg_name(exp->env), f->payload_len, exp->payload_len);
    if (exp->payload_len == 0) {
        require(f->payload == NULL, "frame %zu: empty payload at %p, want NULL", idx,
                (const void *)f->payload);
        return;
    }
    if (memcmp(f->payload, exp->payload, exp->payload_len) != 0) {
        for (k = 0; f->payload[k] == exp->payload[k]; k++)
            ;
        ck_abort_msg("frame %zu (%s): payload byte %zu of %zu is %u, want %u", idx,
                     gift_msg_name(exp->env), k, exp->payload_len, f->payload[k], exp->payload[k]);
    }
}

enum feed_mode { FEED_WHOLE, FEED_BYTES, FEED_RANDOM, FEED_RESERVE, FEED_MODES };
static const char *const mode_name[FEED_MODES] = {"whole", "bytes", "random", "reserve"};

/* Takes every ready frame out of r, checking each against exp[*next]. */
static void drain(gift_reader_t *r, const expect_t *exp, size_t n_exp, size_t *next,
                  const char *mode)
{
    gift_frame_t f;
    int rc;

    while ((rc = gift_reader_next(r, &f)) == 1) {
        require(*next < n_exp, "%s: frame %zu appeared, only %zu expected", mode, *next, n_exp);
        check_frame(&f, &exp[*next], *next);
        (*next)++;
    }
    require(rc == 0, "%s: next = %d (%s) before frame %zu", mode, rc, gift_strerror(rc), *next);
}

/* Hands data to r in pieces as mode says (FEED_RESERVE: through
 * reserve/commit with a random read size each time), takes frames out after
 * each piece, and checks that exactly the n_exp expected frames came out
 * and nothing is left over. */
static void feed_check(gift_reader_t *r, const uint8_t *data, size_t len, int mode, uint64_t seed,
                       const expect_t *exp, size_t n_exp)
{
    const char *mname = mode_name[mode];
    size_t off = 0, piece, got = 0;
    uint64_t s = seed;
    int rc;

    while (off < len) {
        if (mode == FEED_WHOLE)
            piece = len;
        else if (mode == FEED_BYTES)
            piece = 1;
        else if (rng_below(&s, 4) == 0)
            piece = 1 + rng_below(&s, 16);
        else
            piece = 1 + rng_below(&s, 65536);
        if (piece > len - off)
            piece = len - off;
        if (mode == FEED_RESERVE) {
            uint8_t *p;
            size_t avail;

            rc = gift_reader_reserve(r, 65536, &p, &avail);
            require(rc == 0, "reserve at %zu = %d (%s)", off, rc, gift_strerror(rc));
            require(avail > 0, "reserve at %zu: no room", off);
            if (piece > avail)
                piece = avail;
            memcpy(p, data + off, piece);
            gift_reader_commit(r, piece);
        } else {
            rc = gift_reader_feed(r, data + off, piece);
            require(rc == 0, "%s: feed of %zu at %zu = %d (%s)", mname, piece, off, rc,
                    gift_strerror(rc));
        }
        off += piece;
        drain(r, exp, n_exp, &got, mname);
    }
    require(got == n_exp, "%s: %zu frames of %zu came out", mname, got, n_exp);
    require(gift_reader_buffered(r) == 0, "%s: %zu bytes left buffered", mname,
            gift_reader_buffered(r));
    rc = gift_reader_eof(r);
    require(rc == 0, "%s: eof = %d (%s)", mname, rc, gift_strerror(rc));
}

/* ---- round trips ------------------------------------------------------------ */

/* Every message type, with payloads of 0, 1 and 1000 bytes, in every feed mode. */
START_TEST(test_roundtrip_each_type)
{
    static const size_t plens[] = {0, 1, 1000};
    int which = _i;
    uint64_t s = 1000 + (uint64_t)which;
    size_t k;
    int mode;

    for (k = 0; k < sizeof(plens) / sizeof(plens[0]); k++) {
        for (mode = 0; mode < FEED_MODES; mode++) {
            bytes_t b = {0};
            uint8_t *payload = t_alloc(plens[k]);
            expect_t exp;

            rng_fill(&s, payload, plens[k]);
            exp.env = gen_env(which, &s);
            exp.payload_len = plens[k];
            exp.payload_off = frame_append(&b, exp.env, payload, plens[k]);
            exp.payload = b.p + exp.payload_off;
            feed_check(rd, b.p, b.len, mode, s, &exp, 1);
            bytes_free(&b);
        }
    }
}
END_TEST

/* A payload of several MiB, in every feed mode (one byte at a time too). */
START_TEST(test_roundtrip_big_payload)
{
    const size_t plen = 5u * 1024 * 1024 + 3;
    uint64_t s = 77 + (uint64_t)_i;
    uint8_t *payload = t_alloc(plen);
    bytes_t b = {0};
    expect_t exp;

    rng_fill(&s, payload, plen);
    exp.env = gen_env(GIFT__ENVELOPE__MSG_PULL_REPLY, &s);
    exp.payload_len = plen;
    exp.payload_off = frame_append(&b, exp.env, payload, plen);
    exp.payload = b.p + exp.payload_off;
    feed_check(rd, b.p, b.len, _i, s, &exp, 1);
    bytes_free(&b);
}
END_TEST

/* Fields read back by name, for a reader of this file; the descriptor walk
 * above covers the rest. */
START_TEST(test_push_fields)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push push = GIFT__PUSH__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    const uint8_t payload[5] = {1, 2, 3, 4, 5};
    bytes_t b = {0};
    gift_frame_t f;
    int rc;

    codec.format = GIFT__FORMAT__FORMAT_FP8_E4M3;
    codec.block = 128;
    push.key = 7;
    push.chunk = 3;
    push.step = 1ull << 40;
    push.epoch = 2;
    push.codec = &codec;
    push.seq = 123456789;
    env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
    env.push = &push;
    frame_append(&b, &env, payload, sizeof(payload));
    ck_assert_int_eq(gift_reader_feed(rd, b.p, b.len), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == 1, "next = %d (%s)", rc, gift_strerror(rc));
    ck_assert_msg(f.env->msg_case == GIFT__ENVELOPE__MSG_PUSH, "case %d", (int)f.env->msg_case);
    ck_assert_str_eq(gift_msg_name(f.env), "push");
    ck_assert_msg(f.env->push->key == 7 && f.env->push->chunk == 3, "key %u chunk %u",
                  f.env->push->key, f.env->push->chunk);
    ck_assert_msg(f.env->push->step == 1ull << 40, "step %" PRIu64, f.env->push->step);
    ck_assert_msg(f.env->push->epoch == 2 && f.env->push->seq == 123456789, "epoch %u seq %" PRIu64,
                  f.env->push->epoch, f.env->push->seq);
    ck_assert_msg(f.env->push->codec != NULL &&
                      f.env->push->codec->format == GIFT__FORMAT__FORMAT_FP8_E4M3 &&
                      f.env->push->codec->block == 128,
                  "codec %d/%u", f.env->push->codec ? (int)f.env->push->codec->format : -1,
                  f.env->push->codec ? f.env->push->codec->block : 0);
    ck_assert_msg(f.payload_len == 5 && memcmp(f.payload, payload, 5) == 0, "payload_len %" PRIu64,
                  f.payload_len);
    bytes_free(&b);
}
END_TEST

/* One feed holding every message type back to back, some with payloads. */
START_TEST(test_back_to_back)
{
    expect_t exp[2 * N_MSG];
    uint8_t *payload;
    bytes_t b = {0};
    uint64_t s = 5;
    size_t i, plen;

    for (i = 0; i < 2 * N_MSG; i++) {
        plen = i % 3 == 0 ? 0 : rng_below(&s, 3000);
        payload = t_alloc(plen);
        rng_fill(&s, payload, plen);
        exp[i].env = gen_env((int)(i % N_MSG) + 1, &s);
        exp[i].payload_len = plen;
        exp[i].payload_off = frame_append(&b, exp[i].env, payload, plen);
    }
    for (i = 0; i < 2 * N_MSG; i++)
        exp[i].payload = b.p + exp[i].payload_off;
    feed_check(rd, b.p, b.len, FEED_WHOLE, 0, exp, 2 * N_MSG);
    bytes_free(&b);
}
END_TEST

START_TEST(test_msg_names)
{
    static const char *const names[N_MSG + 1] = {
        "none",     "hello", "hello_ack",     "declare", "declare_ack", "push",
        "push_ack", "pull",  "pull_reply",    "sketch",  "sketch_ack",  "geometry_request",
        "geometry", "error", "stats_request", "stats"};
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    int i;

    for (i = 0; i <= N_MSG; i++) {
        env.msg_case = (Gift__Envelope__MsgCase)i;
        ck_assert_msg(strcmp(gift_msg_name(&env), names[i]) == 0, "case %d: got %s, want %s", i,
                      gift_msg_name(&env), names[i]);
    }
    ck_assert_str_eq(gift_msg_name(NULL), "none");
}
END_TEST

/* ---- writer ----------------------------------------------------------------- */

START_TEST(test_pack_head_nospace)
{
    uint64_t s = 9;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_STATS, &s);
    Gift__Envelope empty = GIFT__ENVELOPE__INIT;
    size_t hs = gift_frame_head_size(env);
    const size_t caps[] = {0, 1, 15, 16, 17, hs - 1};
    uint8_t *buf = t_alloc(hs + 8);
    gift_frame_t f;
    long rc;
    size_t i;

    ck_assert_msg(hs > 20, "head size %zu", hs);
    for (i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        memset(buf, 0xa5, hs + 8);
        rc = gift_frame_pack_head(env, 10, buf, caps[i]);
        ck_assert_msg(rc == GIFT_ENOSPC, "cap %zu of %zu: got %ld, want GIFT_ENOSPC", caps[i], hs,
                      rc);
        ck_assert_msg(buf[0] == 0xa5, "cap %zu: buffer written on failure", caps[i]);
    }
    rc = gift_frame_pack_head(env, 0, buf, hs + 8);
    ck_assert_msg(rc == (long)hs, "exact: got %ld, want %zu", rc, hs);
    ck_assert_msg(memcmp(buf, "GIF1", 4) == 0, "magic %02x%02x%02x%02x", buf[0], buf[1], buf[2],
                  buf[3]);
    ck_assert_int_eq(gift_reader_feed(rd, buf, hs), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == 1, "next = %ld", rc);
    /* An Envelope with nothing set would be rejected by every reader. */
    rc = gift_frame_pack_head(&empty, 0, buf, hs + 8);
    ck_assert_msg(rc == GIFT_EINVAL, "empty envelope: got %ld, want GIFT_EINVAL", rc);
}
END_TEST

/* The preamble's fields are little-endian whatever the host. */
START_TEST(test_preamble_bytes)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest sr = GIFT__STATS_REQUEST__INIT;
    uint8_t buf[64];
    size_t hlen;
    long rc;

    sr.seq = 300;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &sr;
    hlen = gift__envelope__get_packed_size(&env);
    rc = gift_frame_pack_head(&env, 0x0102030405060708ull, buf, sizeof(buf));
    ck_assert_msg(rc == (long)(16 + hlen), "got %ld, want %zu", rc, 16 + hlen);
    ck_assert_msg(buf[4] == hlen && buf[5] == 0 && buf[6] == 0 && buf[7] == 0,
                  "header_len bytes %u %u %u %u, want %zu 0 0 0", buf[4], buf[5], buf[6], buf[7],
                  hlen);
    ck_assert_msg(buf[8] == 8 && buf[9] == 7 && buf[14] == 2 && buf[15] == 1,
                  "payload_len bytes %u %u .. %u %u, want 8 7 .. 2 1", buf[8], buf[9], buf[14],
                  buf[15]);
}
END_TEST

/* ---- broken streams ------------------------------------------------------- */

/* Feeds a hand-made preamble (16 bytes only) and expects want from next. */
static void expect_preamble_error(const char *magic, uint32_t hlen, uint64_t plen, int want)
{
    uint8_t pre[16];
    gift_frame_t f;
    size_t cap;
    int rc;

    put_preamble(pre, magic, hlen, plen);
    rc = gift_reader_feed(rd, pre, sizeof(pre));
    ck_assert_msg(rc == 0, "feed = %d (%s)", rc, gift_strerror(rc));
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == want, "hlen %u plen %" PRIu64 ": next = %d (%s), want %d (%s)", hlen, plen,
                  rc, gift_strerror(rc), want, gift_strerror(want));
    cap = gift__reader_capacity(rd);
    ck_assert_msg(cap <= GIFT__READER_MIN_CAP, "buffer grew to %zu for a refused frame", cap);
}

START_TEST(test_bad_magic)
{
    static const char *const magics[] = {"GIF2", "gif1", "\0\0\0\0", "1FIG"};

    expect_preamble_error(magics[_i], 10, 10, GIFT_EBADMAGIC);
}
END_TEST

START_TEST(test_header_len_zero)
{
    expect_preamble_error("GIF1", 0, 10, GIFT_EHDRSIZE);
}
END_TEST

START_TEST(test_header_len_above_limit)
{
    expect_preamble_error("GIF1", GIFT_MAX_HEADER_DEFAULT + 1, 0, GIFT_EHDRSIZE);
}
END_TEST

START_TEST(test_header_len_huge)
{
    expect_preamble_error("GIF1", UINT32_MAX, 0, GIFT_EHDRSIZE);
}
END_TEST

START_TEST(test_payload_len_above_limit)
{
    expect_preamble_error("GIF1", 4, GIFT_MAX_FRAME_DEFAULT + 1, GIFT_EFRAMESIZE);
}
END_TEST

START_TEST(test_payload_len_huge)
{
    expect_preamble_error("GIF1", 4, UINT64_MAX, GIFT_EFRAMESIZE);
}
END_TEST

/* A refused preamble followed by more bytes: the feed that brings them is
 * refused and the buffer does not grow for them. */
START_TEST(test_refused_before_buffering)
{
    const size_t junk_len = 1u << 20;
    uint8_t pre[16], *junk = t_alloc(junk_len);
    int rc;

    put_preamble(pre, "GIF1", 4, 1ull << 40);
    ck_assert_int_eq(gift_reader_feed(rd, pre, sizeof(pre)), 0);
    rc = gift_reader_feed(rd, junk, junk_len);
    ck_assert_msg(rc == GIFT_EFRAMESIZE, "feed after the preamble = %d (%s)", rc,
                  gift_strerror(rc));
    ck_assert_msg(gift__reader_capacity(rd) <= GIFT__READER_MIN_CAP, "buffer grew to %zu",
                  gift__reader_capacity(rd));
    ck_assert_msg(gift_reader_buffered(rd) == 16, "buffered %zu, want 16",
                  gift_reader_buffered(rd));
}
END_TEST

/* handshake_frames: the first frames may carry no payload; a preamble that
 * announces one is refused before its payload is buffered; later frames may. */
START_TEST(test_handshake_no_payload)
{
    gift_limits_t lim = {0, 0, 2};
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    uint8_t head[256], pre[16], *big = t_alloc(1u << 20);
    gift_frame_t f;
    long n;
    int rc;

    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    n = gift_frame_pack_head(&env, 0, head, sizeof head);
    ck_assert_int_gt(n, 0);
    for (int ok = 0; ok < 2; ok++) {
        gift_reader_free(rd);
        rd = gift_reader_new(&lim);
        ck_assert_ptr_nonnull(rd);
        /* Frame 1: payload-free, accepted. */
        ck_assert_int_eq(gift_reader_feed(rd, head, (size_t)n), 0);
        ck_assert_int_eq(gift_reader_next(rd, &f), 1);
        if (ok) {
            /* Frame 2 payload-free too; frame 3 may carry one. */
            ck_assert_int_eq(gift_reader_feed(rd, head, (size_t)n), 0);
            ck_assert_int_eq(gift_reader_next(rd, &f), 1);
            n = gift_frame_pack_head(&env, 8, head, sizeof head);
            ck_assert_int_eq(gift_reader_feed(rd, head, (size_t)n), 0);
            ck_assert_int_eq(gift_reader_feed(rd, big, 8), 0);
            rc = gift_reader_next(rd, &f);
            ck_assert_msg(rc == 1 && f.payload_len == 8, "frame 3 with a payload: %d", rc);
            break;
        }
        /* Frame 2 announces 60 MiB: refused at its preamble, nothing buffered. */
        put_preamble(pre, "GIF1", (uint32_t)n - 16, 60ull << 20);
        ck_assert_int_eq(gift_reader_feed(rd, pre, sizeof pre), 0);
        rc = gift_reader_feed(rd, big, 1u << 20);
        ck_assert_msg(rc == GIFT_EPROTO, "payload in frame 2 = %d (%s)", rc, gift_strerror(rc));
        ck_assert_int_eq(gift_reader_next(rd, &f), GIFT_EPROTO);
        ck_assert_msg(gift__reader_capacity(rd) <= GIFT__READER_MIN_CAP, "buffer grew to %zu",
                      gift__reader_capacity(rd));
    }
}
END_TEST

/* Headers that are not an Envelope. */
START_TEST(test_garbage_header)
{
    static const struct {
        uint8_t b[12];
        uint32_t n;
    } hdrs[] = {
        {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 8}, /* unterminated varint */
        {{0x0a, 0x7f}, 2},                                     /* hello claims 127 bytes */
        {{0x0f}, 1},                                           /* wire type 7 */
        {{0x08, 0x05}, 2},                                     /* hello (a message) as a varint */
        {{0x2a, 0x02, 0x08}, 3},                               /* push claims 2 bytes, 1 follows */
        {{0x2a, 0x01, 0x08}, 3},                               /* push.key without its value */
        {{0x2a, 0x03, 0x2a, 0x01, 0x08}, 5}, /* push.codec.format without its value */
        {{0x00}, 1},                         /* field number 0 */
    };
    uint8_t frame[16 + 12];
    gift_frame_t f;
    int rc;

    put_preamble(frame, "GIF1", hdrs[_i].n, 0);
    memcpy(frame + 16, hdrs[_i].b, hdrs[_i].n);
    ck_assert_int_eq(gift_reader_feed(rd, frame, 16 + hdrs[_i].n), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == GIFT_EBADHEADER, "header %d: next = %d (%s), want GIFT_EBADHEADER", _i, rc,
                  gift_strerror(rc));
}
END_TEST

/* An Envelope that parses but has no message set: only a field this
 * version does not know (number 99, varint 0), or nothing but an unknown
 * length-delimited field. */
START_TEST(test_envelope_not_set)
{
    static const struct {
        uint8_t b[8];
        uint32_t n;
    } hdrs[] = {
        {{0x98, 0x06, 0x00}, 3},                /* field 99, varint 0 */
        {{0x82, 0x01, 0x03, 'a', 'b', 'c'}, 6}, /* field 16, 3 bytes */
    };
    uint8_t frame[16 + 8 + 4] = {0};
    gift_frame_t f;
    int rc;

    put_preamble(frame, "GIF1", hdrs[_i].n, 4);
    memcpy(frame + 16, hdrs[_i].b, hdrs[_i].n);
    ck_assert_int_eq(gift_reader_feed(rd, frame, 16 + hdrs[_i].n + 4), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == GIFT_EBADHEADER, "header %d: next = %d (%s), want GIFT_EBADHEADER", _i, rc,
                  gift_strerror(rc));
}
END_TEST

/* A stream that ends inside a frame: in the preamble, right after it, in
 * the header, at the start of the payload, in the payload, one byte short. */
START_TEST(test_truncated)
{
    uint64_t s = 31;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_GEOMETRY, &s);
    uint8_t payload[200];
    bytes_t b = {0};
    size_t hs, cuts[6], cut;
    gift_frame_t f;
    int rc;

    rng_fill(&s, payload, sizeof(payload));
    frame_append(&b, env, payload, sizeof(payload));
    hs = gift_frame_head_size(env);
    ck_assert_msg(hs > 18, "head size %zu", hs);
    cuts[0] = 7;
    cuts[1] = 16;
    cuts[2] = 16 + (hs - 16) / 2;
    cuts[3] = hs;
    cuts[4] = hs + 100;
    cuts[5] = b.len - 1;
    cut = cuts[_i];
    /* A whole frame first: eof is about the bytes after it only. */
    ck_assert_int_eq(gift_reader_feed(rd, b.p, b.len), 0);
    ck_assert_int_eq(gift_reader_next(rd, &f), 1);
    ck_assert_msg(gift_reader_missing(rd) == 0, "missing %zu after a whole frame",
                  gift_reader_missing(rd));
    ck_assert_int_eq(gift_reader_feed(rd, b.p, cut), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == 0, "cut at %zu of %zu: next = %d, want 0", cut, b.len, rc);
    ck_assert_msg(gift_reader_buffered(rd) == cut, "buffered %zu, want %zu",
                  gift_reader_buffered(rd), cut);
    /* What a socket reader may wait for: the rest of the frame, once its
     * preamble says how long it is. */
    ck_assert_msg(gift_reader_missing(rd) == (cut >= 16 ? b.len - cut : 0),
                  "cut at %zu of %zu: missing %zu, want %zu", cut, b.len, gift_reader_missing(rd),
                  cut >= 16 ? b.len - cut : 0);
    rc = gift_reader_eof(rd);
    ck_assert_msg(rc == GIFT_ETRUNCATED, "cut at %zu of %zu: eof = %d (%s), want GIFT_ETRUNCATED",
                  cut, b.len, rc, gift_strerror(rc));
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == GIFT_ETRUNCATED, "next after eof = %d, want sticky GIFT_ETRUNCATED", rc);
    ck_assert_msg(gift_reader_missing(rd) == 0, "missing %zu after a stream error",
                  gift_reader_missing(rd));
    bytes_free(&b);
}
END_TEST

START_TEST(test_eof_clean)
{
    uint64_t s = 2;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_PULL, &s);
    bytes_t b = {0};
    gift_frame_t f;
    int rc;

    rc = gift_reader_eof(rd);
    ck_assert_msg(rc == 0, "eof of a fresh reader = %d", rc);
    frame_append(&b, env, NULL, 0);
    ck_assert_int_eq(gift_reader_feed(rd, b.p, b.len), 0);
    ck_assert_int_eq(gift_reader_next(rd, &f), 1);
    rc = gift_reader_eof(rd);
    ck_assert_msg(rc == 0, "eof after a whole frame = %d (%s)", rc, gift_strerror(rc));
    bytes_free(&b);
}
END_TEST

/* After an error every entry point returns it, even when valid frames follow. */
START_TEST(test_sticky)
{
    static const int want[] = {GIFT_EBADMAGIC, GIFT_EBADHEADER};
    uint64_t s = 4;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_PUSH_ACK, &s);
    uint8_t bad[16 + 1], *p;
    bytes_t b = {0};
    gift_frame_t f;
    size_t avail;
    int rc, k;

    frame_append(&b, env, NULL, 0);
    ck_assert_int_eq(gift_reader_feed(rd, b.p, b.len), 0); /* a good frame first */
    ck_assert_int_eq(gift_reader_next(rd, &f), 1);
    put_preamble(bad, _i == 0 ? "GIFX" : "GIF1", 1, 0);
    bad[16] = 0x0f;
    ck_assert_int_eq(gift_reader_feed(rd, bad, sizeof(bad)), 0);
    /* A bad preamble is seen as soon as more bytes come; a bad header only by next. */
    rc = gift_reader_feed(rd, b.p, b.len);
    ck_assert_msg(rc == (_i == 0 ? GIFT_EBADMAGIC : 0), "feed after the bad frame = %d (%s)", rc,
                  gift_strerror(rc));
    for (k = 0; k < 3; k++) {
        rc = gift_reader_next(rd, &f);
        ck_assert_msg(rc == want[_i], "next #%d = %d (%s), want %d", k, rc, gift_strerror(rc),
                      want[_i]);
        rc = gift_reader_feed(rd, b.p, b.len);
        ck_assert_msg(rc == want[_i], "feed #%d = %d, want %d", k, rc, want[_i]);
        rc = gift_reader_reserve(rd, 100, &p, &avail);
        ck_assert_msg(rc == want[_i], "reserve #%d = %d, want %d", k, rc, want[_i]);
        rc = gift_reader_eof(rd);
        ck_assert_msg(rc == want[_i], "eof #%d = %d, want %d", k, rc, want[_i]);
    }
    bytes_free(&b);
}
END_TEST

/* ---- limits ------------------------------------------------------------------ */

/* An Error envelope whose packed size is exactly hlen. */
static Gift__Envelope *env_of_size(size_t hlen)
{
    Gift__Envelope *env = t_alloc(sizeof(*env));
    Gift__Error *err = t_alloc(sizeof(*err));
    char *text = t_alloc(hlen + 1);
    size_t n;

    gift__envelope__init(env);
    gift__error__init(err);
    env->msg_case = GIFT__ENVELOPE__MSG_ERROR;
    env->error = err;
    err->code = -3;
    for (n = 0; n < hlen; n++) {
        memset(text, 'x', n);
        text[n] = '\0';
        err->text = text;
        if (gift__envelope__get_packed_size(env) == hlen)
            return env;
    }
    ck_abort_msg("no Error envelope packs to %zu bytes", hlen);
    return NULL;
}

/* A header of exactly max_header_bytes and a payload of exactly
 * max_frame_bytes pass; one byte more of either is refused. */
START_TEST(test_limits_exact)
{
    Gift__Envelope *env = env_of_size(SMALL_HDR);
    uint8_t *payload = t_alloc(SMALL_FRAME);
    bytes_t b = {0};
    expect_t exp;
    gift_frame_t f;
    uint8_t pre[16];
    int rc;

    exp.env = env;
    exp.payload_len = SMALL_FRAME;
    exp.payload_off = frame_append(&b, env, payload, SMALL_FRAME);
    exp.payload = b.p + exp.payload_off;
    feed_check(rd, b.p, b.len, FEED_RANDOM, 3, &exp, 1);
    ck_assert_msg(gift__reader_capacity(rd) <= 16 + SMALL_HDR + SMALL_FRAME, "capacity %zu",
                  gift__reader_capacity(rd));
    bytes_free(&b);

    put_preamble(pre, "GIF1", SMALL_HDR + 1, 0);
    ck_assert_int_eq(gift_reader_feed(rd, pre, 16), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == GIFT_EHDRSIZE, "header of %u: next = %d", SMALL_HDR + 1, rc);
}
END_TEST

START_TEST(test_limits_payload_plus_one)
{
    uint8_t pre[16];
    gift_frame_t f;
    int rc;

    put_preamble(pre, "GIF1", SMALL_HDR, SMALL_FRAME + 1);
    ck_assert_int_eq(gift_reader_feed(rd, pre, 16), 0);
    rc = gift_reader_next(rd, &f);
    ck_assert_msg(rc == GIFT_EFRAMESIZE, "payload of %u: next = %d", SMALL_FRAME + 1, rc);
}
END_TEST

/* Through reserve, the buffer never exceeds 16 + max_header + max_frame,
 * even when the caller asks for more and does not take frames out. */
START_TEST(test_reserve_bounded)
{
    uint64_t s = 8;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_SKETCH_ACK, &s);
    uint8_t payload[SMALL_FRAME] = {0};
    const size_t max_cap = 16 + SMALL_HDR + SMALL_FRAME;
    bytes_t b = {0};
    size_t avail, off = 0, frames = 0, n;
    gift_frame_t f;
    uint8_t *p;
    int rc;

    while (b.len < 4 * max_cap)
        frame_append(&b, env, payload, 100 + rng_below(&s, SMALL_FRAME - 100));
    while (off < b.len) {
        rc = gift_reader_reserve(rd, 1u << 20, &p, &avail);
        require(rc == 0, "reserve = %d (%s)", rc, gift_strerror(rc));
        require(gift__reader_capacity(rd) <= max_cap, "capacity %zu > %zu",
                gift__reader_capacity(rd), max_cap);
        if (avail == 0) { /* full of complete frames: take one */
            ck_assert_int_eq(gift_reader_next(rd, &f), 1);
            frames++;
            continue;
        }
        n = avail < b.len - off ? avail : b.len - off;
        memcpy(p, b.p + off, n);
        gift_reader_commit(rd, n);
        off += n;
    }
    while ((rc = gift_reader_next(rd, &f)) == 1)
        frames++;
    require(rc == 0 && gift_reader_buffered(rd) == 0, "next = %d, %zu bytes left", rc,
            gift_reader_buffered(rd));
    require(frames > 4, "only %zu frames", frames);
    bytes_free(&b);
}
END_TEST

/* feed takes everything it is given, even more than the limit at once. */
START_TEST(test_feed_takes_all)
{
    uint64_t s = 12;
    expect_t exp[20];
    uint8_t *payload = t_alloc(SMALL_FRAME);
    bytes_t b = {0};
    size_t i;

    for (i = 0; i < 20; i++) {
        exp[i].env = gen_env(GIFT__ENVELOPE__MSG_PULL, &s);
        exp[i].payload_len = SMALL_FRAME;
        rng_fill(&s, payload, SMALL_FRAME);
        exp[i].payload_off = frame_append(&b, exp[i].env, payload, SMALL_FRAME);
    }
    for (i = 0; i < 20; i++)
        exp[i].payload = b.p + exp[i].payload_off;
    ck_assert_msg(b.len > 16 + SMALL_HDR + SMALL_FRAME, "stream of %zu", b.len);
    feed_check(rd, b.p, b.len, FEED_WHOLE, 0, exp, 20);
    bytes_free(&b);
}
END_TEST

/* ---- buffer reuse and zero-copy ------------------------------------------ */

/* 1000 frames of one size: the buffer and the arena stop allocating after
 * the first frames. _i: 0 feeds each frame whole, 1 goes through reserve
 * and commit with socket-sized reads. */
START_TEST(test_buffer_reuse)
{
    const size_t plen = 256u * 1024;
    uint64_t s = 21;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_STATS, &s);
    uint8_t *payload = t_alloc(plen);
    bytes_t b = {0};
    size_t cap1 = 0, i, off, n, avail;
    uint64_t allocs2 = 0;
    gift_frame_t f;
    uint8_t *p;
    int rc;

    rng_fill(&s, payload, plen);
    payload[0] = 0;
    frame_append(&b, env, payload, plen);
    for (i = 0; i < 1000; i++) {
        b.p[b.len - plen] = (uint8_t)i; /* tell the frames apart */
        if (_i == 0) {
            ck_assert_int_eq(gift_reader_feed(rd, b.p, b.len), 0);
        } else {
            for (off = 0; off < b.len; off += n) {
                rc = gift_reader_reserve(rd, 65536, &p, &avail);
                require(rc == 0 && avail > 0, "reserve = %d, avail %zu", rc, avail);
                n = avail < 65536 ? avail : 65536;
                n = n < b.len - off ? n : b.len - off;
                memcpy(p, b.p + off, n);
                gift_reader_commit(rd, n);
                if (off + n < b.len) {
                    rc = gift_reader_next(rd, &f);
                    require(rc == 0, "frame %zu at %zu: next = %d", i, off + n, rc);
                }
            }
        }
        rc = gift_reader_next(rd, &f);
        require(rc == 1, "frame %zu: next = %d (%s)", i, rc, gift_strerror(rc));
        require(f.payload_len == plen && f.payload[0] == (uint8_t)i &&
                    memcmp(f.payload + 1, payload + 1, plen - 1) == 0,
                "frame %zu: payload_len %" PRIu64 ", first byte %u", i, f.payload_len,
                f.payload[0]);
        require(f.env->stats->seq == env->stats->seq, "frame %zu: seq %" PRIu64, i,
                f.env->stats->seq);
        if (i == 0)
            cap1 = gift__reader_capacity(rd);
        if (i == 1)
            allocs2 = gift__reader_allocs(rd);
        require(gift__reader_capacity(rd) == cap1, "frame %zu: capacity %zu, %zu after the first",
                i, gift__reader_capacity(rd), cap1);
        if (i >= 1)
            require(gift__reader_allocs(rd) == allocs2,
                    "frame %zu: %" PRIu64 " allocations, %" PRIu64 " after frame 1", i,
                    gift__reader_allocs(rd), allocs2);
    }
    require(cap1 >= b.len && cap1 <= 2 * b.len, "capacity %zu for frames of %zu", cap1, b.len);
    bytes_free(&b);
}
END_TEST

/* A header larger than the arena's first block (a Declare of 1500
 * tensors): decoded right, and after the first such frame the arena has
 * grown so the following ones allocate nothing. */
START_TEST(test_arena_large_header)
{
    const size_t n = 1500;
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Declare decl = GIFT__DECLARE__INIT;
    Gift__TensorDecl *t = t_alloc(n * sizeof(*t)), **tp = t_alloc(n * sizeof(*tp));
    Gift__Codec codec = GIFT__CODEC__INIT;
    char why[512];
    bytes_t b = {0};
    gift_frame_t f;
    uint64_t allocs = 0;
    size_t i;
    int rc;

    codec.format = GIFT__FORMAT__FORMAT_NVFP4;
    for (i = 0; i < n; i++) {
        gift__tensor_decl__init(&t[i]);
        t[i].key = (uint32_t)i;
        t[i].name = "layers.weight";
        t[i].rows = 4096;
        t[i].cols = 1024 + (uint32_t)i;
        t[i].push_codec = &codec;
        t[i].pull_codec = &codec;
        tp[i] = &t[i];
    }
    decl.n_tensors = n;
    decl.tensors = tp;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
    env.declare = &decl;
    frame_append(&b, &env, NULL, 0);
    ck_assert_msg(b.len - 16 <= GIFT_MAX_HEADER_DEFAULT, "header of %zu", b.len - 16);
    for (i = 0; i < 5; i++) {
        ck_assert_int_eq(gift_reader_feed(rd, b.p, b.len), 0);
        rc = gift_reader_next(rd, &f);
        ck_assert_msg(rc == 1, "frame %zu: next = %d (%s)", i, rc, gift_strerror(rc));
        ck_assert_msg(msg_diff(&f.env->base, &env.base, "", why, sizeof(why)) == 0, "frame %zu: %s",
                      i, why);
        if (i == 1)
            allocs = gift__reader_allocs(rd);
        if (i > 1)
            ck_assert_msg(gift__reader_allocs(rd) == allocs,
                          "frame %zu: %" PRIu64 " allocations, %" PRIu64 " after frame 1", i,
                          gift__reader_allocs(rd), allocs);
    }
    bytes_free(&b);
}
END_TEST

/* reserve/commit: data written straight into the reader's buffer, commits
 * of any size including 0, and a payload that stays valid until the next
 * call on the reader. */
START_TEST(test_reserve_commit)
{
    uint64_t s = 44;
    expect_t exp[3];
    uint8_t *payload = t_alloc(100000), *p;
    bytes_t b = {0};
    size_t i, off = 0, avail, n, got = 0;
    int rc;

    for (i = 0; i < 3; i++) {
        exp[i].env = gen_env((int)(3 * i + 2), &s);
        exp[i].payload_len = i == 1 ? 0 : 30000 * i + 7;
        rng_fill(&s, payload, exp[i].payload_len);
        exp[i].payload_off = frame_append(&b, exp[i].env, payload, exp[i].payload_len);
    }
    for (i = 0; i < 3; i++)
        exp[i].payload = b.p + exp[i].payload_off;
    while (off < b.len) {
        size_t want = 1 + rng_below(&s, 5000);

        rc = gift_reader_reserve(rd, want, &p, &avail);
        require(rc == 0, "reserve(%zu) = %d (%s)", want, rc, gift_strerror(rc));
        require(avail >= 1, "reserve(%zu) at %zu: avail %zu", want, off, avail);
        n = rng_below(&s, 3) == 0 ? 0 : 1 + rng_below(&s, avail);
        n = n < b.len - off ? n : b.len - off;
        memcpy(p, b.p + off, n);
        gift_reader_commit(rd, n);
        off += n;
        drain(rd, exp, 3, &got, "reserve");
    }
    require(got == 3, "%zu frames", got);
    require(gift_reader_eof(rd) == 0, "eof = %d", gift_reader_eof(rd));
    bytes_free(&b);
}
END_TEST

/* Payloads received into the caller's memory: three frames (payloads of
 * 30007, 0 and 60007 bytes) through reserve/commit in random pieces; each
 * frame with a payload that peek sees before it is complete is, by _i's
 * bits, sunk into its own buffer (kept), sunk and then unsunk part way
 * (dropped: next never returns it), or left in the reader. A peek comes
 * once per frame; missing() counts what the sink still lacks; feed refuses
 * bytes while a sink is active; the frame after each one is intact. */
START_TEST(test_sink)
{
    uint64_t s = 45 + (uint64_t)_i;
    expect_t exp[3];
    uint8_t *payload = t_alloc(100000), *p, *dst[3];
    bytes_t b = {0};
    size_t i, off = 0, avail, n, got = 0, sunk_at[3] = {0};
    int rc, mode[3], state[3] = {0}; /* 0 not peeked, 1 peeked, 2 sunk, 3 unsunk */
    gift_frame_t f;

    for (i = 0; i < 3; i++) {
        exp[i].env = gen_env((int)(3 * i + 2), &s);
        exp[i].payload_len = i == 1 ? 0 : 30000 * i + 7;
        rng_fill(&s, payload, exp[i].payload_len);
        exp[i].payload_off = frame_append(&b, exp[i].env, payload, exp[i].payload_len);
        dst[i] = t_alloc(exp[i].payload_len + 1);
        mode[i] = (_i >> (2 * i)) & 3; /* 0 leave, 1 sink, 2 sink then unsink, 3 sink */
    }
    for (i = 0; i < 3; i++)
        exp[i].payload = b.p + exp[i].payload_off;
    while (off < b.len) {
        size_t want = 1 + rng_below(&s, 5000);

        rc = gift_reader_reserve(rd, want, &p, &avail);
        require(rc == 0, "reserve(%zu) = %d (%s)", want, rc, gift_strerror(rc));
        require(avail >= 1, "reserve(%zu) at %zu: avail %zu", want, off, avail);
        n = 1 + rng_below(&s, avail < 7000 ? avail : 7000);
        n = n < b.len - off ? n : b.len - off;
        memcpy(p, b.p + off, n);
        gift_reader_commit(rd, n);
        off += n;
        while ((rc = gift_reader_next(rd, &f)) == 1) {
            while (got < 3 && state[got] == 3)
                got++; /* dropped: never returned */
            require(got < 3, "a frame after the last");
            check_frame(&f, &exp[got], got);
            if (state[got] == 2)
                require(f.payload == dst[got], "frame %zu: payload at %p, want its sink %p", got,
                        (const void *)f.payload, (const void *)dst[got]);
            got++;
        }
        require(rc == 0, "next = %d (%s)", rc, gift_strerror(rc));
        for (i = 0; i < 3; i++)
            if (state[i] == 2 && mode[i] == 2 && off > sunk_at[i] + 10000 &&
                off < exp[i].payload_off + exp[i].payload_len) {
                gift_reader_unsink(rd);
                require(gift_reader_sinking(rd) == NULL, "frame %zu: still sinking", i);
                state[i] = 3;
            }
        rc = gift_reader_peek(rd, &f);
        require(rc >= 0, "peek = %d", rc);
        if (rc == 1) {
            size_t k = got;
            while (k < 3 && state[k] == 3)
                k++;
            require(k < 3 && state[k] == 0, "peek of frame %zu in state %d", k,
                    k < 3 ? state[k] : -1);
            require(f.payload == NULL && f.payload_len == exp[k].payload_len &&
                        f.env->msg_case == exp[k].env->msg_case,
                    "peek of frame %zu: payload %p len %" PRIu64 " (want %zu)", k,
                    (const void *)f.payload, f.payload_len, exp[k].payload_len);
            require(gift_reader_peek(rd, &f) == 0, "frame %zu peeked twice", k);
            state[k] = 1;
            if (mode[k] != 0) {
                require(gift_reader_sink(rd, dst[k]) == 0, "sink of frame %zu", k);
                require(gift_reader_sinking(rd) == dst[k], "frame %zu: sinking %p", k,
                        gift_reader_sinking(rd));
                require(gift_reader_missing(rd) == exp[k].payload_off + exp[k].payload_len - off,
                        "frame %zu: missing %zu, want %zu", k, gift_reader_missing(rd),
                        exp[k].payload_off + exp[k].payload_len - off);
                require(gift_reader_feed(rd, "x", 1) == GIFT_EINVAL, "feed while sinking");
                state[k] = 2;
                sunk_at[k] = off;
            }
        }
    }
    while (got < 3 && state[got] == 3)
        got++;
    require(got == 3, "%zu frames", got);
    require(gift_reader_eof(rd) == 0, "eof = %d", gift_reader_eof(rd));
    require(gift_reader_sink(rd, dst[0]) == GIFT_EINVAL, "sink with nothing peeked");
    bytes_free(&b);
}
END_TEST

/* A stream that ends inside a sunk payload is truncated. */
START_TEST(test_sink_truncated)
{
    uint64_t s = 46;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_PULL_REPLY, &s);
    uint8_t payload[4000], dst[4000], *p;
    bytes_t b = {0};
    size_t hs, avail;
    gift_frame_t f;

    rng_fill(&s, payload, sizeof payload);
    frame_append(&b, env, payload, sizeof payload);
    hs = gift_frame_head_size(env);
    ck_assert_int_eq(gift_reader_reserve(rd, hs + 10, &p, &avail), 0);
    memcpy(p, b.p, hs + 10);
    gift_reader_commit(rd, hs + 10);
    ck_assert_int_eq(gift_reader_next(rd, &f), 0);
    ck_assert_int_eq(gift_reader_peek(rd, &f), 1);
    ck_assert_int_eq(gift_reader_sink(rd, dst), 0);
    ck_assert_int_eq(gift_reader_reserve(rd, 100, &p, &avail), 0);
    ck_assert_msg(p == dst + 10 && avail == sizeof dst - 10, "reserve in the sink: %p + %zu",
                  (void *)p, avail);
    memcpy(p, b.p + hs + 10, 100);
    gift_reader_commit(rd, 100);
    ck_assert_int_eq(gift_reader_next(rd, &f), 0);
    ck_assert_msg(memcmp(dst, payload, 110) == 0, "the sunk bytes differ");
    ck_assert_int_eq(gift_reader_eof(rd), GIFT_ETRUNCATED);
    bytes_free(&b);
}
END_TEST

/* Once a preamble has passed and the buffer must grow, reserve and feed
 * grow it straight to that frame's size (one allocation, not a doubling per
 * step), and reserve no further, whatever the caller asks for. */
START_TEST(test_grow_to_frame_size)
{
    uint64_t s = 45;
    Gift__Envelope *env = gen_env(GIFT__ENVELOPE__MSG_PUSH, &s);
    const size_t plen = 1u << 20;
    uint8_t *payload = t_alloc(plen), *p;
    bytes_t b = {0};
    size_t avail, cap;
    uint64_t allocs;
    gift_reader_t *r2;

    frame_append(&b, env, payload, plen);
    ck_assert_int_eq(gift_reader_reserve(rd, 100, &p, &avail), 0);
    cap = gift__reader_capacity(rd);
    ck_assert_msg(cap == GIFT__READER_MIN_CAP && avail == cap, "first reserve: cap %zu avail %zu",
                  cap, avail);
    memcpy(p, b.p, 20);
    gift_reader_commit(rd, 20);
    ck_assert_int_eq(gift_reader_reserve(rd, 100, &p, &avail), 0);
    ck_assert_msg(gift__reader_capacity(rd) == GIFT__READER_MIN_CAP && avail == cap - 20,
                  "room for 100 left: capacity %zu, avail %zu", gift__reader_capacity(rd), avail);
    allocs = gift__reader_allocs(rd);
    ck_assert_int_eq(gift_reader_reserve(rd, 8192, &p, &avail), 0);
    cap = gift__reader_capacity(rd);
    ck_assert_msg(cap == b.len && avail == b.len - 20,
                  "frame of %zu: capacity %zu, avail %zu (want the frame's size)", b.len, cap,
                  avail);
    ck_assert_msg(gift__reader_allocs(rd) == allocs + 1, "%" PRIu64 " allocations for one growth",
                  gift__reader_allocs(rd) - allocs);
    ck_assert_int_eq(gift_reader_reserve(rd, 64u << 20, &p, &avail), 0);
    ck_assert_msg(gift__reader_capacity(rd) == b.len && avail == b.len - 20,
                  "asked for 64 MiB: capacity %zu, avail %zu", gift__reader_capacity(rd), avail);

    r2 = gift_reader_new(NULL);
    ck_assert_ptr_nonnull(r2);
    ck_assert_int_eq(gift_reader_feed(r2, b.p, 20), 0);
    ck_assert_int_eq(gift_reader_feed(r2, b.p + 20, 100), 0);
    ck_assert_msg(gift__reader_capacity(r2) == GIFT__READER_MIN_CAP, "feed: capacity %zu",
                  gift__reader_capacity(r2));
    ck_assert_int_eq(gift_reader_feed(r2, b.p + 120, 8192), 0);
    ck_assert_msg(gift__reader_capacity(r2) == b.len, "feed: capacity %zu for a frame of %zu",
                  gift__reader_capacity(r2), b.len);
    gift_reader_free(r2);
    bytes_free(&b);
}
END_TEST

/* ---- randomized stream ------------------------------------------------------- */

/* 2000 random frames of random types and payload sizes, concatenated and
 * handed over in random pieces (_i 0: feed, 1: reserve/commit). */
START_TEST(test_random_stream)
{
    const size_t n = 2000;
    expect_t *exp = t_alloc(n * sizeof(*exp));
    uint8_t *payload = t_alloc(200000);
    uint64_t s = 0xabcdef + (uint64_t)_i;
    bytes_t b = {0};
    size_t i, plen;

    for (i = 0; i < n; i++) {
        uint64_t r = rng_below(&s, 100);

        plen = r < 20 ? 0 : r < 90 ? rng_below(&s, 2000) : rng_below(&s, 200000);
        rng_fill(&s, payload, plen);
        exp[i].env = gen_env(1 + (int)rng_below(&s, N_MSG), &s);
        exp[i].payload_len = plen;
        exp[i].payload_off = frame_append(&b, exp[i].env, payload, plen);
    }
    for (i = 0; i < n; i++)
        exp[i].payload = b.p + exp[i].payload_off;
    feed_check(rd, b.p, b.len, _i == 0 ? FEED_RANDOM : FEED_RESERVE, s, exp, n);
    bytes_free(&b);
}
END_TEST

/* ---- suite --------------------------------------------------------------- */

static Suite *frame_suite(void)
{
    Suite *s = suite_create("proto_frame");
    TCase *rt = tcase_create("roundtrip"), *wr = tcase_create("writer");
    TCase *bad = tcase_create("broken"), *lim = tcase_create("limits");
    TCase *reuse = tcase_create("reuse"), *rnd = tcase_create("random");

    tcase_add_checked_fixture(rt, setup, teardown);
    tcase_add_loop_test(rt, test_roundtrip_each_type, 1, N_MSG + 1);
    tcase_add_loop_test(rt, test_roundtrip_big_payload, 0, FEED_MODES);
    tcase_add_test(rt, test_push_fields);
    tcase_add_test(rt, test_back_to_back);
    tcase_add_test(rt, test_msg_names);
    suite_add_tcase(s, rt);

    tcase_add_checked_fixture(wr, setup, teardown);
    tcase_add_test(wr, test_pack_head_nospace);
    tcase_add_test(wr, test_preamble_bytes);
    suite_add_tcase(s, wr);

    tcase_add_checked_fixture(bad, setup, teardown);
    tcase_add_loop_test(bad, test_bad_magic, 0, 4);
    tcase_add_test(bad, test_header_len_zero);
    tcase_add_test(bad, test_header_len_above_limit);
    tcase_add_test(bad, test_header_len_huge);
    tcase_add_test(bad, test_payload_len_above_limit);
    tcase_add_test(bad, test_payload_len_huge);
    tcase_add_test(bad, test_refused_before_buffering);
    tcase_add_test(bad, test_handshake_no_payload);
    tcase_add_loop_test(bad, test_garbage_header, 0, 8);
    tcase_add_loop_test(bad, test_envelope_not_set, 0, 2);
    tcase_add_loop_test(bad, test_truncated, 0, 6);
    tcase_add_test(bad, test_eof_clean);
    tcase_add_loop_test(bad, test_sticky, 0, 2);
    suite_add_tcase(s, bad);

    tcase_add_checked_fixture(lim, setup_small, teardown);
    tcase_add_test(lim, test_limits_exact);
    tcase_add_test(lim, test_limits_payload_plus_one);
    tcase_add_test(lim, test_reserve_bounded);
    tcase_add_test(lim, test_feed_takes_all);
    suite_add_tcase(s, lim);

    tcase_add_checked_fixture(reuse, setup, teardown);
    tcase_add_loop_test(reuse, test_buffer_reuse, 0, 2);
    tcase_add_test(reuse, test_arena_large_header);
    tcase_add_test(reuse, test_reserve_commit);
    tcase_add_test(reuse, test_grow_to_frame_size);
    tcase_add_loop_test(reuse, test_sink, 0, 64);
    tcase_add_test(reuse, test_sink_truncated);
    suite_add_tcase(s, reuse);

    tcase_add_checked_fixture(rnd, setup, teardown);
    tcase_add_loop_test(rnd, test_random_stream, 0, 2);
    suite_add_tcase(s, rnd);
    return s;
}

int main(void)
{
    return gift_test_run(frame_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
