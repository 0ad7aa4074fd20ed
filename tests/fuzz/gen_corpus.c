/*
 * gen_corpus.c: writes the seed corpus of the fuzz harnesses.
 *
 *   gift-fuzz-corpus DIR     writes the seed files under DIR/reader and DIR/shard
 *
 * The committed files under tests/fuzz/corpus/ came from this program; run
 * it again after a protocol change. Every seed is a valid conversation: two
 * ranks say Hello, declare three tensors (f32, fp8 with GIFT geometry,
 * nvfp4 -> bf16), sketch, push and pull two steps, fetch the geometry and
 * ask for stats. The fuzzer mutates from there. Shard seeds use the record
 * format of fuzz_shard.c; reader seeds are one control byte (piece size and
 * input path) then the raw stream of rank 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gift_codec.h"
#include "gift_proto.h"

typedef struct out {
    uint8_t *p;
    size_t len, cap;
} out_t;

static void put(out_t *o, const void *b, size_t n)
{
    if (o->len + n > o->cap) {
        o->cap = (o->len + n) * 2 + 256;
        if ((o->p = realloc(o->p, o->cap)) == NULL)
            exit(1);
    }
    memcpy(o->p + o->len, b, n);
    o->len += n;
}

/* Appends one frame (env + payload) to o. */
static void frame(out_t *o, Gift__Envelope *env, const void *payload, size_t plen)
{
    uint8_t head[4096];
    long n = gift_frame_pack_head(env, plen, head, sizeof head);
    if (n < 0) {
        fprintf(stderr, "pack failed: %s\n", gift_strerror((int)n));
        exit(1);
    }
    put(o, head, (size_t)n);
    if (plen)
        put(o, payload, plen);
}

/* Appends a shard-harness record: feed the bytes of f to connection peer. */
static void record(out_t *o, int peer, const out_t *f)
{
    uint8_t h[3];
    size_t off = 0;
    while (off < f->len || f->len == 0) {
        size_t n = f->len - off > 65535 ? 65535 : f->len - off;
        h[0] = (uint8_t)(peer & 3);
        h[1] = (uint8_t)n;
        h[2] = (uint8_t)(n >> 8);
        put(o, h, 3);
        put(o, f->p + off, n);
        off += n;
        if (f->len == 0)
            break;
    }
}

static void op(out_t *o, int peer, int kind)
{
    uint8_t c = (uint8_t)((peer & 3) | (kind << 2));
    put(o, &c, 1);
}

static void save(const char *dir, const char *sub, const char *name, const out_t *o)
{
    char path[4096];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    if ((f = fopen(path, "wb")) == NULL || fwrite(o->p, 1, o->len, f) != o->len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* ---- the conversation ------------------------------------------------------ */

#define NT 3
static Gift__TensorDecl td[NT];
static Gift__TensorDecl *tdp[NT];
static Gift__Codec cpush[NT], cpull[NT];
static Gift__ChunkDecl cd[4];
static Gift__ChunkDecl *cdp[4];
static uint8_t digest[8];
static const struct {
    uint32_t key, chunk, row_begin, rows;
} CH[4] = {{0, 0, 0, 4}, {1, 0, 0, 4}, {1, 1, 4, 4}, {2, 0, 0, 1}};

static void tensors_init(void)
{
    static const char *names[NT] = {"w", "g", "n"};
    static const uint32_t rows[NT] = {4, 8, 1}, cols[NT] = {8, 16, 16};
    static const Gift__Format pf[NT] = {GIFT__FORMAT__FORMAT_F32, GIFT__FORMAT__FORMAT_FP8_E4M3,
                                        GIFT__FORMAT__FORMAT_NVFP4};
    static const Gift__Format lf[NT] = {GIFT__FORMAT__FORMAT_F32, GIFT__FORMAT__FORMAT_FP8_E4M3,
                                        GIFT__FORMAT__FORMAT_BF16};
    for (int i = 0; i < NT; i++) {
        gift__tensor_decl__init(&td[i]);
        gift__codec__init(&cpush[i]);
        gift__codec__init(&cpull[i]);
        cpush[i].format = pf[i];
        cpull[i].format = lf[i];
        if (pf[i] == GIFT__FORMAT__FORMAT_FP8_E4M3)
            cpush[i].block = cpull[i].block = 32;
        td[i].key = (uint32_t)i;
        td[i].name = (char *)names[i];
        td[i].rows = rows[i];
        td[i].cols = cols[i];
        td[i].push_codec = &cpush[i];
        td[i].pull_codec = &cpull[i];
        td[i].geometry = i == 1;
        td[i].rank = i == 1 ? 2 : 0;
        td[i].basis_cols = i == 1 ? 4 : 0;
        td[i].refresh = i == 1 ? 2 : 0;
        td[i].seed = 7;
        tdp[i] = &td[i];
    }
    for (int i = 0; i < 4; i++) {
        gift__chunk_decl__init(&cd[i]);
        cd[i].key = CH[i].key;
        cd[i].chunk = CH[i].chunk;
        cd[i].row_begin = CH[i].row_begin;
        cd[i].rows = CH[i].rows;
        cdp[i] = &cd[i];
    }
    gift_digest_bytes(gift_digest_tensors(tdp, NT), digest);
}

static void hello(out_t *o, uint32_t rank, uint32_t world, int with_digest)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = rank;
    h.world_size = world;
    h.client_name = (char *)"fuzz";
    if (with_digest) {
        h.cluster_digest.data = digest;
        h.cluster_digest.len = 8;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    frame(o, &env, NULL, 0);
}

static void declare(out_t *o)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Declare d = GIFT__DECLARE__INIT;
    d.n_tensors = NT;
    d.tensors = tdp;
    d.n_chunks = 4;
    d.chunks = cdp;
    d.digest.data = digest;
    d.digest.len = 8;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
    env.declare = &d;
    frame(o, &env, NULL, 0);
}

static void push(out_t *o, int c, uint64_t step, uint32_t epoch, uint32_t rank)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    const Gift__TensorDecl *t = &td[CH[c].key];
    gift_codec_params_t p;
    gift_layout_t l;
    size_t n = (size_t)CH[c].rows * t->cols;
    float x[256];
    uint8_t *pl;

    memset(&p, 0, sizeof p);
    p.fmt = (gift_format_t)t->push_codec->format;
    p.block = t->push_codec->block;
    if (gift_layout(&p, n, &l) < 0 || (pl = calloc(1, l.total)) == NULL)
        exit(1);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)((i * 7 + step * 3 + rank) % 13) - 6) * 0.25f;
    if (gift_encode(&p, x, n, pl, l.total) < 0)
        exit(1);
    m.key = CH[c].key;
    m.chunk = CH[c].chunk;
    m.step = step;
    m.epoch = epoch;
    m.codec = (Gift__Codec *)t->push_codec;
    m.seq = (1ull << 56) | (step << 8) | (uint64_t)c;
    env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
    env.push = &m;
    frame(o, &env, pl, l.total);
    free(pl);
}

static void pull(out_t *o, int c, uint64_t step)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Pull m = GIFT__PULL__INIT;
    m.key = CH[c].key;
    m.chunk = CH[c].chunk;
    m.step = step;
    m.seq = (2ull << 56) | (step << 8) | (uint64_t)c;
    env.msg_case = GIFT__ENVELOPE__MSG_PULL;
    env.pull = &m;
    frame(o, &env, NULL, 0);
}

static void sketch(out_t *o, uint64_t step, uint32_t epoch, uint32_t rank)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Sketch m = GIFT__SKETCH__INIT;
    float y[16 * 4];
    gift_geometry_t g;
    /* Y = A Q against the epoch-0 basis the shard starts from, with A
     * diagonal (1 + i + rank): a sketch the geometry update accepts. */
    if (gift_geometry_init(&g, 16, 2, 4, 7) < 0)
        exit(1);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 4; j++)
            y[i * 4 + j] = (float)(1 + i + (int)rank) * g.U[i * 4 + j];
    gift_geometry_free(&g);
    m.key = 1;
    m.step = step;
    m.epoch = epoch;
    m.trace = 4.0;
    m.din = 16;
    m.basis_cols = 4;
    m.seq = (3ull << 56) | step;
    env.msg_case = GIFT__ENVELOPE__MSG_SKETCH;
    env.sketch = &m;
    frame(o, &env, y, sizeof y);
}

static void geo_request(out_t *o)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__GeometryRequest m = GIFT__GEOMETRY_REQUEST__INIT;
    m.key = 1;
    m.seq = 4ull << 56;
    env.msg_case = GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST;
    env.geometry_request = &m;
    frame(o, &env, NULL, 0);
}

static void stats(out_t *o)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__StatsRequest m = GIFT__STATS_REQUEST__INIT;
    m.seq = 5ull << 56;
    env.msg_case = GIFT__ENVELOPE__MSG_STATS_REQUEST;
    env.stats_request = &m;
    frame(o, &env, NULL, 0);
}

/* One rank's whole session as frames, phase by phase. */
static void phase(out_t *o, int ph, uint32_t rank)
{
    switch (ph) {
    case 0:
        hello(o, rank, 2, 0);
        break;
    case 1:
        declare(o);
        break;
    case 2:
        sketch(o, 0, 0, rank);
        for (int c = 0; c < 4; c++)
            push(o, c, 0, 0, rank);
        break;
    case 3:
        for (int c = 0; c < 4; c++)
            pull(o, c, 0);
        geo_request(o);
        break;
    case 4:
        for (int c = 0; c < 4; c++)
            push(o, c, 1, c == 1 || c == 2 ? 1 : 0, rank);
        for (int c = 0; c < 4; c++)
            pull(o, c, 1);
        stats(o);
        break;
    }
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    char sub[4096];
    out_t rd = {0}, sh = {0};

    tensors_init();
    snprintf(sub, sizeof sub, "%s/reader", dir);
    mkdir(sub, 0755);
    snprintf(sub, sizeof sub, "%s/shard", dir);
    mkdir(sub, 0755);

    /* Shard: the full two-rank session, interleaved phase by phase. */
    for (int ph = 0; ph < 5; ph++)
        for (uint32_t r = 0; r < 2; r++) {
            out_t f = {0};
            phase(&f, ph, r);
            record(&sh, (int)r, &f);
            if (r == 0)
                put(&rd, f.p, f.len);
            free(f.p);
        }
    save(dir, "shard", "session", &sh);

    /* Reader: rank 0's stream in pieces of 1, 16 and 61 bytes, both paths. */
    {
        static const uint8_t ctl[4] = {0x00, 0x0f, 0x3c, 0x8f};
        static const char *names[4] = {"stream-1", "stream-16", "stream-61", "stream-16-zc"};
        for (int i = 0; i < 4; i++) {
            out_t o = {0};
            put(&o, &ctl[i], 1);
            put(&o, rd.p, rd.len);
            save(dir, "reader", names[i], &o);
            free(o.p);
        }
    }

    /* Shard: rank 0 alone; its pulls park, time passes (stall warning and
     * timeout), then it hangs up and comes back on another connection. */
    {
        out_t o = {0};
        for (int ph = 0; ph < 4; ph++) {
            out_t f = {0};
            phase(&f, ph, 0);
            record(&o, 0, &f);
            free(f.p);
        }
        op(&o, 0, 2);
        op(&o, 0, 2);
        op(&o, 0, 2);
        op(&o, 0, 1);
        {
            out_t f = {0};
            hello(&f, 0, 2, 1);
            stats(&f);
            record(&o, 1, &f);
            free(f.p);
        }
        op(&o, 0, 3);
        save(dir, "shard", "stall-hangup", &o);
        free(o.p);
    }

    /* Shard: frames split across records, and a world-size mismatch. */
    {
        out_t o = {0}, f = {0}, a = {0}, b = {0};
        hello(&f, 0, 2, 0);
        declare(&f);
        push(&f, 0, 0, 0, 0);
        put(&a, f.p, f.len / 2);
        put(&b, f.p + f.len / 2, f.len - f.len / 2);
        record(&o, 2, &a);
        record(&o, 2, &b);
        free(f.p);
        memset(&f, 0, sizeof f);
        hello(&f, 1, 3, 0);
        record(&o, 3, &f);
        save(dir, "shard", "split-and-bad-world", &o);
        free(o.p);
        free(f.p);
        free(a.p);
        free(b.p);
    }
    /* Reader (64 KiB limits, control bit 6) and shard: a Declare of many
     * small tensors, whose header unpacks to far more than the 4 KiB header
     * arena, then a push to the last one. */
    {
        enum { NBIG = 120 };
        static Gift__TensorDecl bt[NBIG];
        static Gift__TensorDecl *btp[NBIG];
        static Gift__ChunkDecl bc[NBIG];
        static Gift__ChunkDecl *bcp[NBIG];
        static char names[NBIG][16];
        uint8_t bd[8];
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__Declare d = GIFT__DECLARE__INIT;
        out_t f = {0}, o = {0}, r = {0};
        uint8_t ctl = 0x4f;
        for (int i = 0; i < NBIG; i++) {
            gift__tensor_decl__init(&bt[i]);
            snprintf(names[i], sizeof names[i], "t%d", i);
            bt[i].key = (uint32_t)i;
            bt[i].name = names[i];
            bt[i].rows = 1;
            bt[i].cols = 16;
            btp[i] = &bt[i];
            gift__chunk_decl__init(&bc[i]);
            bc[i].key = (uint32_t)i;
            bc[i].rows = 1;
            bcp[i] = &bc[i];
        }
        gift_digest_bytes(gift_digest_tensors(btp, NBIG), bd);
        d.n_tensors = NBIG;
        d.tensors = btp;
        d.n_chunks = NBIG;
        d.chunks = bcp;
        d.digest.data = bd;
        d.digest.len = 8;
        env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
        env.declare = &d;
        hello(&f, 0, 1, 0);
        frame(&f, &env, NULL, 0);
        {
            Gift__Envelope pe = GIFT__ENVELOPE__INIT;
            Gift__Push m = GIFT__PUSH__INIT;
            float x[16] = {1, 2, 3, 4};
            uint8_t pl[64] = {0};
            memcpy(pl, x, sizeof x);
            m.key = NBIG - 1;
            m.step = 0;
            pe.msg_case = GIFT__ENVELOPE__MSG_PUSH;
            pe.push = &m;
            frame(&f, &pe, pl, sizeof pl);
        }
        stats(&f);
        record(&o, 0, &f);
        save(dir, "shard", "many-tensors", &o);
        put(&r, &ctl, 1);
        put(&r, f.p, f.len);
        save(dir, "reader", "many-tensors-64k", &r);
        free(f.p);
        free(o.p);
        free(r.p);
    }
    free(rd.p);
    free(sh.p);
    return 0;
}
