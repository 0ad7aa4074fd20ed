/*
 * fuzz_shard.c: libFuzzer harness for the shard's message handling
 * (server/shard.c), driven the way server/net.c drives it, without sockets.
 *
 * Four fake connections, each with its own gift_reader_t. The input is a
 * sequence of records, each one control byte c then, for a feed, a 16-bit
 * little-endian length n and n bytes:
 *   c & 3         the connection
 *   (c >> 2) & 3  0: feed n bytes to it (frames go to gift_shard_handle,
 *                    a reader error to gift_shard_reject, as net.c does);
 *                 1: the peer hangs up (gift_shard_peer_close, a new peer);
 *                 2: one second passes (gift_shard_tick);
 *                 3: every write in flight completes (payload references
 *                    are dropped).
 *   c & 0x10 with a feed: a sequence record instead of raw bytes. The
 *                 harness builds the frame from a few little-endian fields
 *                 (fields past the input's end are 0) and feeds it: so that
 *                 sizes and indices at their boundaries (rows, cols, chunk
 *                 ids, row offsets, steps, epochs, ranks) reach a Declare and
 *                 the pushes that follow it without the fuzzer having to
 *                 learn protobuf. A type byte t, then by t % 4:
 *                 0 Hello: u16 rank, u16 world.
 *                 1 Declare: u8 tensors (1..3), each u32 rows, u32 cols, u8
 *                   flags (bit 0 geometry, bits 1-3 push format, 4-6 pull
 *                   format, 7 pull error feedback), u32 rank, u32 basis; u8
 *                   chunks (0..8), each u8 key, u32 id, u32 row_begin, u32 rows.
 *                 2 Push, 3 Pull: u8 sel; sel < 128 names a chunk of the last
 *                   Declare (its payload sized from the declaration), else
 *                   u32 key, u32 chunk (and for a push u16 payload bytes);
 *                   then the step (sel & 64: u64, else u8), the epoch (sel &
 *                   32: u32, else 0), for a push u8 fill byte.
 * The shard takes its world size from the first Declare and has small limits
 * (64 KiB frames, 8 parked pulls, 64 MiB max_memory, 1 s stall warning, 2 s
 * stall timeout).
 *
 * The fake io checks what the shard sends (a well-formed preamble and an
 * Envelope that unpacks, a payload slice inside its buffer), that nothing is
 * sent to or closed on a peer after it is gone, and that no peer is closed
 * twice; a violation aborts. At the end every peer is closed, the shard is
 * freed while writes still hold payload references, and then those are
 * dropped, so ASan sees any leak, double free or use after free.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_codec.h"
#include "gift_proto.h"
#include "log.h"
#include "shard.h"

#define NPEER 4
#define MAX_REFS 4096

typedef struct fake {
    gift_peer_t *p;
    gift_reader_t *r;
    uint64_t id;
    int closed; /* io->close was called */
} fake_t;

static fake_t P[NPEER];
static gift_shard_t *S;
static uint64_t now;
static uint64_t next_id;
static gift_rbuf_t *refs[MAX_REFS];
static size_t nrefs;
static int verbose; /* GIFT_FUZZ_VERBOSE=1: print every frame the shard sends */

static void check(int cond)
{
    if (!cond)
        abort();
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void refs_release(void)
{
    for (size_t i = 0; i < nrefs; i++)
        gift_rbuf_unref(refs[i]);
    nrefs = 0;
}

static int fake_send(void *ctx, const uint8_t *head, size_t head_len, gift_rbuf_t *buf, size_t off,
                     size_t len)
{
    fake_t *fp = ctx;
    Gift__Envelope *env;

    check(fp != NULL && fp->p != NULL);
    check(head_len >= GIFT_PREAMBLE_BYTES && memcmp(head, GIFT_FRAME_MAGIC, 4) == 0);
    check(GIFT_PREAMBLE_BYTES + (size_t)le32(head + 4) == head_len && le64(head + 8) == len);
    check(buf != NULL || len == 0);
    check(buf == NULL ||
          (buf->refs > 0 && off <= buf->len && len <= buf->len - off && buf->len <= buf->cap));
    env = gift__envelope__unpack(NULL, head_len - GIFT_PREAMBLE_BYTES, head + GIFT_PREAMBLE_BYTES);
    check(env != NULL && env->msg_case != GIFT__ENVELOPE__MSG__NOT_SET);
    if (env->msg_case == GIFT__ENVELOPE__MSG_ERROR)
        check(env->error->code < 0);
    if (verbose)
        fprintf(stderr, "conn %llu <- %s %s\n", (unsigned long long)fp->id, gift_msg_name(env),
                env->msg_case == GIFT__ENVELOPE__MSG_ERROR ? env->error->text : "");
    gift__envelope__free_unpacked(env, NULL);
    if (buf != NULL) {
        if (nrefs == MAX_REFS)
            refs_release();
        gift_rbuf_ref(buf);
        refs[nrefs++] = buf;
        if (len > 0) {
            volatile uint8_t x = buf->data[off] ^ buf->data[off + len - 1];
            (void)x;
        }
    }
    return 0;
}

static void fake_close(void *ctx)
{
    fake_t *fp = ctx;
    check(fp->p != NULL);
    check(!fp->closed);
    fp->closed = 1;
}

static uint64_t fake_now(void)
{
    return now;
}

static const gift_shard_io_t IO = {fake_send, fake_close, fake_now};

static void peer_open(fake_t *fp)
{
    gift_limits_t lim = {4096, 64 * 1024, 0};
    memset(fp, 0, sizeof *fp);
    fp->id = ++next_id;
    fp->p = gift_shard_peer_open(S, fp, fp->id);
    fp->r = gift_reader_new(&lim);
    check(fp->p != NULL && fp->r != NULL);
}

static void peer_gone(fake_t *fp)
{
    gift_shard_peer_close(S, fp->p);
    fp->p = NULL;
    gift_reader_free(fp->r);
    fp->r = NULL;
}

/* net.c's on_read after n bytes arrived. */
static void peer_feed(fake_t *fp, const uint8_t *data, size_t n)
{
    gift_frame_t f;
    int rc;

    if (fp->closed)
        return; /* net.c stops reading a closing connection */
    if ((rc = gift_reader_feed(fp->r, data, n)) < 0) {
        gift_frame_t g;
        rc = gift_reader_next(fp->r, &g);
        if (rc >= 0)
            rc = GIFT_ENOMEM;
        gift_shard_reject(S, fp->p, rc, gift_strerror(rc));
        return;
    }
    while (!fp->closed && (rc = gift_reader_next(fp->r, &f)) != 0) {
        if (rc < 0) {
            gift_shard_reject(S, fp->p, rc, gift_strerror(rc));
            return;
        }
        if (gift_shard_handle(S, fp->p, &f) < 0) {
            check(fp->closed);
            return;
        }
    }
}

/* Sequence records: a cursor whose reads past the end give zeros. */
typedef struct cur {
    const uint8_t *d;
    size_t n, pos;
} cur_t;

static uint64_t take(cur_t *c, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++, c->pos++)
        if (c->pos < c->n)
            v |= (uint64_t)c->d[c->pos] << (8 * i);
    return v;
}

/* The last Declare built, for pushes sized from it. */
#define SEQ_T 3
#define SEQ_C 8
static Gift__TensorDecl seq_t[SEQ_T];
static Gift__TensorDecl *seq_tp[SEQ_T];
static Gift__Codec seq_codec[2 * SEQ_T];
static Gift__ChunkDecl seq_c[SEQ_C];
static Gift__ChunkDecl *seq_cp[SEQ_C];
static size_t seq_nt, seq_nc;
static uint8_t seq_payload[64 * 1024];

static const Gift__Format seq_fmt[5] = {GIFT__FORMAT__FORMAT_F32, GIFT__FORMAT__FORMAT_BF16,
                                        GIFT__FORMAT__FORMAT_FP8_E4M3,
                                        GIFT__FORMAT__FORMAT_FP8_E5M2, GIFT__FORMAT__FORMAT_NVFP4};

/* Bytes of a push of chunk i of the last Declare (0 when it cannot be sent). */
static size_t seq_push_len(size_t i)
{
    const Gift__ChunkDecl *ch = seq_cp[i];
    const Gift__TensorDecl *t;
    gift_codec_params_t p = {0};
    gift_layout_t l;
    uint64_t n;
    if (ch->key >= seq_nt)
        return 0;
    t = seq_tp[ch->key];
    n = (uint64_t)ch->rows * t->cols;
    p.fmt = (gift_format_t)t->push_codec->format;
    if (n == 0 || n > sizeof seq_payload || gift_layout(&p, (size_t)n, &l) < 0 ||
        l.total > sizeof seq_payload)
        return 0;
    return l.total;
}

/* Builds the frame of one sequence record from c and feeds it to fp. */
static void seq_record(fake_t *fp, cur_t *c)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    Gift__Declare d = GIFT__DECLARE__INIT;
    Gift__Push pu = GIFT__PUSH__INIT;
    Gift__Pull pl = GIFT__PULL__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    uint8_t head[8192], dg[8];
    size_t plen = 0;
    long n;
    int type = (int)(take(c, 1) % 4);

    if (type == 0) {
        h.protocol_version = GIFT_PROTOCOL_VERSION;
        h.rank = (uint32_t)take(c, 2);
        h.world_size = (uint32_t)take(c, 2);
        env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
        env.hello = &h;
    } else if (type == 1) {
        seq_nt = 1 + take(c, 1) % SEQ_T;
        for (size_t i = 0; i < seq_nt; i++) {
            Gift__TensorDecl *t = &seq_t[i];
            unsigned flags;
            gift__tensor_decl__init(t);
            gift__codec__init(&seq_codec[2 * i]);
            gift__codec__init(&seq_codec[2 * i + 1]);
            t->key = (uint32_t)i;
            t->name = (char *)"t";
            t->rows = (uint32_t)take(c, 4);
            t->cols = (uint32_t)take(c, 4);
            flags = (unsigned)take(c, 1);
            t->geometry = flags & 1;
            seq_codec[2 * i].format = seq_fmt[((flags >> 1) & 7) % 5];
            seq_codec[2 * i + 1].format = seq_fmt[((flags >> 4) & 7) % 5];
            t->push_codec = &seq_codec[2 * i];
            t->pull_codec = &seq_codec[2 * i + 1];
            t->pull_error_feedback = (flags >> 7) & 1;
            t->rank = (uint32_t)take(c, 4);
            t->basis_cols = (uint32_t)take(c, 4);
            seq_tp[i] = t;
        }
        seq_nc = take(c, 1) % (SEQ_C + 1);
        for (size_t i = 0; i < seq_nc; i++) {
            Gift__ChunkDecl *ch = &seq_c[i];
            gift__chunk_decl__init(ch);
            ch->key = (uint32_t)take(c, 1);
            ch->chunk = (uint32_t)take(c, 4);
            ch->row_begin = (uint32_t)take(c, 4);
            ch->rows = (uint32_t)take(c, 4);
            seq_cp[i] = ch;
        }
        gift_digest_bytes(gift_digest_tensors(seq_tp, seq_nt), dg);
        d.tensors = seq_tp;
        d.n_tensors = seq_nt;
        d.chunks = seq_cp;
        d.n_chunks = seq_nc;
        d.digest.data = dg;
        d.digest.len = 8;
        env.msg_case = GIFT__ENVELOPE__MSG_DECLARE;
        env.declare = &d;
    } else {
        unsigned sel = (unsigned)take(c, 1);
        uint32_t key, chunk;
        uint64_t step;
        if (sel < 128 && seq_nc > 0) {
            size_t i = sel % seq_nc;
            key = seq_cp[i]->key;
            chunk = seq_cp[i]->chunk;
            plen = seq_push_len(i);
            if (key < seq_nt)
                codec.format = seq_tp[key]->push_codec->format;
        } else {
            key = (uint32_t)take(c, 4);
            chunk = (uint32_t)take(c, 4);
            if (type == 2)
                plen = (size_t)take(c, 2);
        }
        step = take(c, (sel & 64) ? 8 : 1);
        if (type == 2) {
            pu.key = key;
            pu.chunk = chunk;
            pu.step = step;
            pu.epoch = (sel & 32) ? (uint32_t)take(c, 4) : 0;
            pu.codec = &codec;
            pu.seq = ++next_id;
            memset(seq_payload, (int)take(c, 1), plen);
            env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
            env.push = &pu;
        } else {
            pl.key = key;
            pl.chunk = chunk;
            pl.step = step;
            pl.have_epoch = (sel & 32) ? (uint32_t)take(c, 4) : 0;
            pl.seq = ++next_id;
            env.msg_case = GIFT__ENVELOPE__MSG_PULL;
            env.pull = &pl;
            plen = 0;
        }
    }
    if ((n = gift_frame_pack_head(&env, plen, head, sizeof head)) < 0)
        return;
    peer_feed(fp, head, (size_t)n);
    if (plen > 0)
        peer_feed(fp, seq_payload, plen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gift_shard_opts_t o;
    size_t pos = 0;

    verbose = getenv("GIFT_FUZZ_VERBOSE") != NULL;
    gift_log_set_level(verbose ? GIFT_LOG_LEVEL_DEBUG : GIFT_LOG_LEVEL_ERROR);
    memset(&o, 0, sizeof o);
    o.shard_id = 0;
    o.num_shards = 1;
    o.world_size = 0;
    o.max_frame_bytes = 64 * 1024;
    o.max_parked = 8;
    /* A small budget: a Declare of a large world (ordered aggregation keeps
     * world pushes per chunk) is refused fast instead of committing GiBs. */
    o.max_memory = 64ull << 20;
    o.hits_every = 1;
    o.stall_warn_s = 1;
    o.stall_timeout_s = 2;
    now = 1000000000ull;
    next_id = 0;
    nrefs = 0;
    seq_nt = seq_nc = 0;
    S = gift_shard_new(&o, &IO);
    check(S != NULL);
    for (int i = 0; i < NPEER; i++)
        peer_open(&P[i]);
    while (pos < size) {
        uint8_t c = data[pos++];
        fake_t *fp = &P[c & 3];
        switch ((c >> 2) & 3) {
        case 0: {
            size_t n;
            if (c & 0x10) {
                cur_t cu = {data, size, pos};
                seq_record(fp, &cu);
                pos = cu.pos < size ? cu.pos : size;
                break;
            }
            if (size - pos < 2) {
                pos = size;
                break;
            }
            n = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
            pos += 2;
            if (n > size - pos)
                n = size - pos;
            peer_feed(fp, data + pos, n);
            pos += n;
            break;
        }
        case 1:
            peer_gone(fp);
            peer_open(fp);
            break;
        case 2:
            now += 1000000000ull;
            gift_shard_tick(S);
            break;
        default:
            refs_release();
            break;
        }
        /* The glue frees a closed connection once its writes are done. */
        for (int i = 0; i < NPEER; i++)
            if (P[i].closed) {
                peer_gone(&P[i]);
                peer_open(&P[i]);
            }
    }
    for (int i = 0; i < NPEER; i++)
        peer_gone(&P[i]);
    check(gift_shard_counters(S)->peers == 0);
    gift_shard_free(S);
    S = NULL;
    refs_release();
    return 0;
}
