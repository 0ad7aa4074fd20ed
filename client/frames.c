/*
 * frames.c: the frames the client's engine sends (giftclient_internal.h,
 * "frames.c"): Hello and Declare of a connection, the Push and Pull of
 * every chunk, GeometryRequest and Sketch. Each is queued through the
 * client's gift__io_t; a connection that cannot take its handshake is
 * dropped. Reads the engine's state, sets only the sent flags it keeps.
 */
#include <string.h>

#include "giftclient_internal.h"

static uint64_t next_seq(gift_client_t *c, int kind)
{
    c->seq = (c->seq + 1) & ((1ull << 56) - 1);
    return ((uint64_t)kind << 56) | c->seq;
}

static void codec_wire(Gift__Codec *cd, const gift_codec_params_t *p)
{
    gift__codec__init(cd);
    cd->format = (Gift__Format)p->fmt;
    cd->block = p->block;
}

int gift__send_push(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, gift__chunk_t *ch)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Push m = GIFT__PUSH__INIT;
    Gift__Codec cd, pcd;
    codec_wire(&cd, &ps->push); /* the declared codec, or its epoch's decision */
    codec_wire(&pcd, &ps->pull);
    m.pull_codec = ps->tr ? &pcd : NULL;
    m.key = w->key;
    m.chunk = ch->idx;
    m.step = ps->step;
    m.epoch = ps->epoch;
    m.codec = &cd;
    m.seq = next_seq(c, GIFT__SEQ_PUSH);
    env.msg_case = GIFT__ENVELOPE__MSG_PUSH;
    env.push = &m;
    return c->io->queue(c, ch->shard, &env, gift__ps_chunk_payload(ps, ch),
                        gift__ps_push_len(ps, ch), w->push_prio, &ps->inflight);
}

/* Queues every chunk of ps not yet queued on its shard's connection. */
void gift__send_push_chunks(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps,
                            uint32_t only_shard, int replay)
{
    for (uint32_t j = 0; j < w->nchunks; j++) {
        gift__chunk_t *ch = gift__chunk_of(c, w, j);
        if (j >= ps->nenc || ps->sent[j] || !gift__ready(c, ch->shard) ||
            (only_shard != UINT32_MAX && ch->shard != only_shard))
            continue;
        if (gift__send_push(c, w, ps, ch) == 0) {
            ps->sent[j] = 1;
            if (replay)
                GIFT__STAT_ADD(c, replays, 1);
        }
    }
}

/* Queues the Pull of every chunk of pl not yet queued. A chunk whose push of
 * the same step this worker has not queued yet waits for it (a fused bucket
 * still assembling, a connection coming back): a shard refuses a pull for a
 * chunk that nobody has pushed, and on one connection the push goes first.
 * A Pull behind this worker's own push takes that push's priority, so it
 * leaves right behind it rather than behind every push of the turn: the
 * shard parks it as soon as the chunk's data is in and replies the moment
 * the chunk completes, while later chunks are still arriving. Behind all the
 * pushes, a turn's Pulls reached the shard only once the last push had
 * crossed the link, and the replies started only then (measured on a
 * shaped link: RESULTS, time to quality). */
void gift__send_pull_chunks(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl)
{
    const gift__pstate_t *ps = &w->ps[pl->step & 1];
    int own_push = ps->state != GIFT__PS_IDLE && ps->step == pl->step;
    for (uint32_t j = 0; j < w->nchunks; j++) {
        gift__chunk_t *ch = gift__chunk_of(c, w, j);
        Gift__Envelope env = GIFT__ENVELOPE__INIT;
        Gift__Pull m = GIFT__PULL__INIT;
        if (pl->got[j] || pl->sent[j] || !gift__ready(c, ch->shard) || (own_push && !ps->sent[j]))
            continue;
        m.key = w->key;
        m.chunk = ch->idx;
        m.step = pl->step;
        m.have_epoch = w->geometry ? w->newest : 0;
        m.seq = next_seq(c, GIFT__SEQ_PULL);
        env.msg_case = GIFT__ENVELOPE__MSG_PULL;
        env.pull = &m;
        if (c->io->queue(c, ch->shard, &env, NULL, 0, own_push ? w->push_prio : w->pull_prio,
                         NULL) == 0)
            pl->sent[j] = 1;
    }
}

void gift__send_geo_request(gift_client_t *c, gift__wire_t *w)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__GeometryRequest m = GIFT__GEOMETRY_REQUEST__INIT;
    uint32_t s = gift__owner_of(c, w);
    if (!w->fetching || w->fetch_sent || !gift__ready(c, s))
        return;
    m.key = w->key;
    m.epoch = w->newest;
    m.seq = next_seq(c, GIFT__SEQ_GEO);
    env.msg_case = GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST;
    env.geometry_request = &m;
    if (c->io->queue(c, s, &env, NULL, 0, GIFT__PRIO_CONTROL, NULL) == 0)
        w->fetch_sent = 1;
}

void gift__send_sketch(gift_client_t *c, gift__wire_t *w)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Sketch m = GIFT__SKETCH__INIT;
    uint32_t s = gift__owner_of(c, w);
    if (!w->sk_unsent || !gift__ready(c, s))
        return;
    m.key = w->key;
    m.step = w->sk_step;
    m.epoch = w->sk_epoch;
    m.trace = w->sk_trace;
    m.din = w->cols;
    m.basis_cols = w->ks;
    m.seq = next_seq(c, GIFT__SEQ_SKETCH);
    env.msg_case = GIFT__ENVELOPE__MSG_SKETCH;
    env.sketch = &m;
    if (c->io->queue(c, s, &env, w->Y, (size_t)w->cols * w->ks * sizeof(float), GIFT__PRIO_SKETCH,
                     &w->sk_inflight) == 0)
        w->sk_unsent = 0;
}

/* The first Hello of a connection, or (once an AuthChallenge arrived) the
 * second, which carries the MAC (gift.proto, "Authentication"). */
void gift__send_hello(gift_client_t *c, uint32_t shard)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Hello h = GIFT__HELLO__INIT;
    gift__conn_t *cn = &c->conns[shard];
    h.protocol_version = GIFT_PROTOCOL_VERSION;
    h.rank = (uint32_t)c->rank;
    h.world_size = (uint32_t)c->world;
    if (c->io_declared) {
        h.cluster_digest.data = c->digest;
        h.cluster_digest.len = 8;
    }
    h.client_name = c->name;
    h.run_id = c->run_id;
    h.resume_step = cn->resume; /* the shard checks it still holds what we pulled */
    if (c->auth != NULL) {
        if (!cn->challenged && gift_auth_nonce(cn->cnonce) < 0) {
            c->io->drop(c, shard);
            return;
        }
        h.client_nonce.data = cn->cnonce;
        h.client_nonce.len = sizeof cn->cnonce;
        if (cn->challenged) {
            gift_auth_hello_mac(c->auth, cn->snonce, &h, cn->hello_mac);
            h.auth_mac.data = cn->hello_mac;
            h.auth_mac.len = sizeof cn->hello_mac;
        }
    }
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO;
    env.hello = &h;
    if (c->io->queue(c, shard, &env, NULL, 0, GIFT__PRIO_CONTROL, NULL) < 0)
        c->io->drop(c, shard);
}

void gift__send_declare(gift_client_t *c, uint32_t shard)
{
    if (c->io->queue_raw(c, shard, c->decl_head[shard], c->decl_len[shard], GIFT__PRIO_CONTROL) <
        0) {
        c->io->drop(c, shard);
        return;
    }
    c->conns[shard].state = GIFT__CONN_DECLARING;
}
