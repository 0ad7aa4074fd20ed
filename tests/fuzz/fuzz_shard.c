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
 * The shard takes its world size from the first Hello and has small limits
 * (64 KiB frames, 8 parked pulls, 1 s stall warning, 2 s stall timeout).
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
    o.hits_every = 1;
    o.stall_warn_s = 1;
    o.stall_timeout_s = 2;
    now = 1000000000ull;
    next_id = 0;
    nrefs = 0;
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
