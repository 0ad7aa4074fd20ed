/*
 * shard.c: the shard's message dispatch and sync aggregation (shard.h). No
 * sockets here: frames come in through gift_shard_handle and go out through
 * the io callbacks. Each message has its handler below, with a contract
 * saying what it reads, owns and may call. shard.c calls down into the
 * helper rooms, which never call back: the store's build and free in
 * declare.c, admission checks in admit.c, peers and parked pulls in
 * peers.c, frames in send.c, the aggregation arithmetic in aggregate.c, the
 * geometry owner's epochs in owner.c and its policy in policy_owner.c,
 * Stats in stats.c, giftctl reset in reset.c. Persistence (persist.c) is
 * reached only through the journal table (shard_state.h).
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "aggregate.h"
#include "declare.h"
#include "gift_auth.h"
#include "gift_codec.h"
#include "log.h"
#include "owner.h"
#include "peers.h"
#include "policy_owner.h"
#include "reset.h"
#include "send.h"
#include "shard_internal.h"
#include "stats.h"

const double gift_lat_bounds[GIFT_LAT_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                  0.1,   0.25,   0.5,   1.0,  2.5,   INFINITY};

/* ------------------------------------------------------------------ */
/* Helpers                                                               */
/* ------------------------------------------------------------------ */

static int hits_step(const gift_shard_t *s, uint64_t step)
{
    return s->o.hits_every && step % s->o.hits_every == 0;
}

/* ------------------------------------------------------------------ */
/* Creation and teardown                                                 */
/* ------------------------------------------------------------------ */

gift_shard_t *gift_shard_new(const gift_shard_opts_t *o, const gift_shard_io_t *io)
{
    gift_shard_t *s;
    if (o == NULL || io == NULL || io->send == NULL || io->close == NULL || o->num_shards == 0 ||
        o->shard_id >= o->num_shards)
        return NULL;
    if ((s = calloc(1, sizeof *s)) == NULL)
        return NULL;
    s->o = *o;
    if (s->o.max_parked == 0)
        s->o.max_parked = 65536;
    if (s->o.max_frame_bytes == 0)
        s->o.max_frame_bytes = GIFT_MAX_FRAME_DEFAULT;
    if (s->o.max_memory == 0)
        s->o.max_memory = gift_shard_memory_default();
    if (s->o.max_step_ahead == 0)
        s->o.max_step_ahead = GIFT_STEP_AHEAD_DEFAULT;
    if (!(s->o.damping > 0.0))
        s->o.damping = GIFT_DAMPING_DEFAULT;
    if (!(s->o.geometry_decay >= 0.0 && s->o.geometry_decay < 1.0) || !gift__pol_opts_ok(&s->o)) {
        free(s);
        return NULL;
    }
    s->io = *io;
    s->log.fd = -1;
    s->o.data_dir = NULL;
    if (o->aggregate != GIFT_SHARD_ORDERED && o->aggregate != GIFT_SHARD_EAGER) {
        free(s);
        return NULL;
    }
    if (o->checkpoint_steps > 0) {
        if (o->data_dir == NULL || o->data_dir[0] == '\0' || strlen(o->data_dir) >= sizeof s->dir) {
            free(s);
            return NULL;
        }
        strcpy(s->dir, o->data_dir);
        s->persist = 1;
    }
    s->world = o->world_size;
    s->words = (s->world + 63) / 64; /* 0 until a Hello sets the world size */
    if ((s->pool = calloc(s->o.max_parked, sizeof *s->pool)) == NULL) {
        free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < s->o.max_parked; i++) {
        s->pool[i].pnext = s->free_parked;
        s->free_parked = &s->pool[i];
    }
    return s;
}

void gift_shard_free(gift_shard_t *s)
{
    if (s == NULL)
        return;
    gift__shard_store_free(s);
    gift_log_close(&s->log);
    gift_ckpt_buf_free(&s->ckpt_buf);
    free(s->pool);
    free(s->by_rank);
    free(s);
}

/* ------------------------------------------------------------------ */
/* Declaration                                                           */
/* ------------------------------------------------------------------ */

/*
 * Declare (gift.proto): the tensor list and this shard's chunk placement.
 * Reads: the Declare (its digest, tensors and chunks), p's run id and world
 * size, and the store when one is declared already (digest, placement).
 * Owns: the first Declare builds the store (declare.c) and, when none is
 * configured, adopts p's world size; both are undone when the build or the
 * journal's record fails. A later Declare must match and changes nothing.
 * May call: admit.c (run id), declare.c, the journal's declare hook, send.c.
 * Returns 0 (a refusal is an Error to p), or GIFT_ERUNID after a fatal one.
 */
static int handle_declare(gift_shard_t *s, gift_peer_t *p, const Gift__Declare *d_in)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__DeclareAck ack = GIFT__DECLARE_ACK__INIT;
    /* The Declare as kept: its run id is the sender's Hello's, never the
     * one the message carries. */
    Gift__Declare dk = *d_in;
    const Gift__Declare *d = &dk;
    char why[400] = "";
    uint64_t digest = gift_digest_tensors(d->tensors, d->n_tensors);
    uint64_t sig = gift__declare_placement(d->chunks, d->n_chunks);
    uint8_t want[8];
    int rc;

    dk.run_id = p->run_id;
    if (gift__admit_run_id(s, p, p->run_id) < 0)
        return GIFT_ERUNID;
    gift_digest_bytes(digest, want);
    if (d->digest.len != 8 || memcmp(d->digest.data, want, 8) != 0) {
        gift__send_error(s, p, GIFT_EDIGEST, 0, 0, 0, 0, 0,
                         "declare digest does not match its tensor list (%zu tensors)",
                         d->n_tensors);
        return 0;
    }
    if (s->declared) {
        if (digest != s->digest) {
            gift__send_error(s, p, GIFT_EDIGEST, 0, 0, 0, 0, 0,
                             "tensor list differs from the one already declared on this shard");
            return 0;
        }
        if (sig != s->placement) {
            gift__send_error(s, p, GIFT_EDIGEST, 0, 0, 0, 0, 0,
                             "chunk placement differs from the one already declared on this shard");
            return 0;
        }
    } else {
        int adopt = s->world == 0;
        if (adopt) {
            /* The world size of the first Declare's sender (gift__claim_rank
             * refuses peers of another from here on). */
            s->world = p->world;
            s->words = (s->world + 63) / 64;
        }
        if ((rc = gift__shard_declare_apply(s, d, why, sizeof why)) < 0) {
            if (adopt)
                s->world = 0, s->words = 0;
            gift__send_error(s, p, rc, 0, 0, 0, 0, 0, "declare refused: %s", why);
            return 0;
        }
        if (s->jr && (rc = s->jr->declare(s)) < 0) {
            /* Not durable: forget it, so that nothing is built on it. */
            gift__shard_store_free(s);
            if (adopt)
                s->world = 0, s->words = 0;
            gift__send_error(s, p, rc, 0, 0, 0, 0, 0,
                             "declare refused: cannot write it to the step log in %s", s->dir);
            return 0;
        }
        if (adopt)
            GIFT_LOG_INFO(p->id, "world size %u (from the first Declare, rank %u's Hello)",
                          s->world, p->rank);
        if (s->run_id[0])
            GIFT_LOG_INFO(p->id, "run '%s' (from the first Declare)", s->run_id);
        GIFT_LOG_INFO(p->id,
                      "declared %zu tensors, %zu chunks on this shard (%.1f MiB of "
                      "max_memory %.1f MiB)",
                      s->ntensors, s->nchunks, (double)s->mem / 1048576.0,
                      (double)s->o.max_memory / 1048576.0);
    }
    ack.tensors = (uint32_t)s->ntensors;
    ack.chunks = (uint32_t)s->nchunks;
    env.msg_case = GIFT__ENVELOPE__MSG_DECLARE_ACK;
    env.declare_ack = &ack;
    return gift__send_frame(s, p, &env, NULL, 0, 0) < 0 ? 0 : 0;
}

/* ------------------------------------------------------------------ */
/* Hello                                                                 */
/* ------------------------------------------------------------------ */

/* Authentication of p's Hello h (gift.proto): the first Hello is answered
 * with an AuthChallenge; the second's MAC is verified before anything it
 * says is read. On success ack carries the shard's MAC (written into mac)
 * and p keeps the client nonce, for a Reset's MAC. Returns 0 when h may be
 * read, 1 when the challenge was sent (nothing more to do), or a negative
 * code after a fatal Error. */
static int hello_auth(gift_shard_t *s, gift_peer_t *p, const Gift__Hello *h, Gift__HelloAck *ack,
                      uint8_t mac[GIFT_AUTH_MAC_BYTES])
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;

    if (!p->challenged) {
        Gift__AuthChallenge ch = GIFT__AUTH_CHALLENGE__INIT;
        if (gift_auth_nonce(p->nonce) < 0) {
            gift__send_error(s, p, GIFT_EIO, 1, 0, 0, 0, 0, "no random nonce (libsodium)");
            return GIFT_EIO;
        }
        p->challenged = 1;
        ch.server_nonce.data = p->nonce;
        ch.server_nonce.len = sizeof p->nonce;
        ch.version = GIFT_AUTH_VERSION;
        env.msg_case = GIFT__ENVELOPE__MSG_AUTH_CHALLENGE;
        env.auth_challenge = &ch;
        (void)gift__send_frame(s, p, &env, NULL, 0, 0);
        return 1;
    }
    if (h->auth_mac.len == 0) {
        gift__send_error(s, p, GIFT_EAUTH, 1, 0, 0, 0, 0,
                         "this shard requires authentication and the Hello carries no MAC "
                         "(is the client's auth key file, GIFT_AUTH_KEY_FILE, set?)");
        return GIFT_EAUTH;
    }
    if (h->client_nonce.len != GIFT_AUTH_NONCE_BYTES) {
        gift__send_error(s, p, GIFT_EAUTH, 1, 0, 0, 0, 0,
                         "Hello carries a client nonce of %zu bytes; %d needed",
                         h->client_nonce.len, GIFT_AUTH_NONCE_BYTES);
        return GIFT_EAUTH;
    }
    gift_auth_hello_mac(s->o.auth, p->nonce, h, mac);
    if (gift_auth_verify(h->auth_mac.data, h->auth_mac.len, mac) < 0) {
        gift__send_error(s, p, GIFT_EAUTH, 1, 0, 0, 0, 0,
                         "authentication failed: the Hello's MAC does not match this shard's key");
        return GIFT_EAUTH;
    }
    gift_auth_ack_mac(s->o.auth, h->rank, p->nonce, h->client_nonce.data, h->auth_mac.data, mac);
    ack->auth_mac.data = mac;
    ack->auth_mac.len = GIFT_AUTH_MAC_BYTES;
    memcpy(p->cnonce, h->client_nonce.data, sizeof p->cnonce); /* for a Reset's MAC */
    return 0;
}

/* What p's Hello h says, checked against the shard: its world size and
 * rank, its run id (kept in p->run_id, then admitted), the step it resumes
 * from and the cluster digest. Returns 0, or the code of the fatal Error
 * sent to p. */
static int hello_check(gift_shard_t *s, gift_peer_t *p, const Gift__Hello *h)
{
    uint8_t dg[8];

    if (h->world_size == 0 || h->world_size > 65536) {
        gift__send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0, "world size %u out of range 1..65536",
                         h->world_size);
        return GIFT_EWORLD;
    }
    if (s->world != 0 && h->world_size != s->world) {
        gift__send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0,
                         "world size %u, the cluster has %u: start every worker with WORLD_SIZE=%u",
                         h->world_size, s->world, s->world);
        return GIFT_EWORLD;
    }
    if (h->rank >= h->world_size) {
        gift__send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0, "rank %u outside 0..%u", h->rank,
                         h->world_size - 1);
        return GIFT_EWORLD;
    }
    if (h->run_id != NULL && strnlen(h->run_id, GIFT_RUN_ID_MAX + 1) > GIFT_RUN_ID_MAX) {
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0, "run id longer than %d bytes",
                         GIFT_RUN_ID_MAX);
        return GIFT_EPROTO;
    }
    snprintf(p->run_id, sizeof p->run_id, "%s", h->run_id ? h->run_id : "");
    if (gift__admit_run_id(s, p, p->run_id) < 0)
        return GIFT_ERUNID;
    if (gift__admit_resume(s, p, h->resume_step) < 0)
        return GIFT_ESTATE;
    if (s->declared && h->cluster_digest.len > 0) {
        gift_digest_bytes(s->digest, dg);
        if (h->cluster_digest.len != 8 || memcmp(h->cluster_digest.data, dg, 8) != 0) {
            gift__send_error(s, p, GIFT_EDIGEST, 1, 0, 0, 0, 0,
                             "cluster digest differs from the tensor list declared on this shard");
            return GIFT_EDIGEST;
        }
    }
    return 0;
}

/*
 * Hello (gift.proto), the first message of every connection.
 * Reads: the Hello, the shard's options (auth key, world size), its run id,
 * digest and finished steps (through admit.c).
 * Owns: nothing beyond p's identity, which it sets once: p->hello, rank,
 * world, run_id, and with authentication p's nonces.
 * May call: hello_auth, hello_check, admit.c's run id and resume checks,
 * send.c. Changes no shard state: a Hello never fixes the world size.
 * Returns 0, or the code of the fatal Error sent (the peer is closed).
 */
static int handle_hello(gift_shard_t *s, gift_peer_t *p, const Gift__Hello *h)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__HelloAck ack = GIFT__HELLO_ACK__INIT;
    uint8_t mac[GIFT_AUTH_MAC_BYTES];
    int rc;

    if (p->hello) {
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0, "second Hello on one connection");
        return GIFT_EPROTO;
    }
    if (h->protocol_version != GIFT_PROTOCOL_VERSION) {
        gift__send_error(s, p, GIFT_EVERSION, 1, 0, 0, 0, 0,
                         "protocol version %u, this shard speaks %d", h->protocol_version,
                         GIFT_PROTOCOL_VERSION);
        return GIFT_EVERSION;
    }
    if (s->o.auth != NULL && (rc = hello_auth(s, p, h, &ack, mac)) != 0)
        return rc < 0 ? rc : 0;
    if ((rc = hello_check(s, p, h)) < 0)
        return rc;
    /* A Hello never fixes the world size (a stray or hostile one would lock
     * every worker out): it is configured, or adopted from the sender of
     * the first Declare (handle_declare); until then any is accepted, and
     * checked when the peer acts as its rank (gift__claim_rank). */
    p->hello = 1;
    p->rank = h->rank;
    p->world = h->world_size;
    GIFT_LOG_INFO(p->id, "hello from rank %u of %u (%s)%s", h->rank, h->world_size,
                  h->client_name && *h->client_name ? h->client_name : "unnamed",
                  s->o.auth ? ", authenticated" : "");
    ack.protocol_version = GIFT_PROTOCOL_VERSION;
    ack.shard_id = s->o.shard_id;
    ack.num_shards = s->o.num_shards;
    ack.max_frame_bytes = s->o.max_frame_bytes;
    ack.server_version = (char *)GIFT_CODEC_VERSION;
    ack.world_size = s->world ? s->world : h->world_size;
    env.msg_case = GIFT__ENVELOPE__MSG_HELLO_ACK;
    env.hello_ack = &ack;
    (void)gift__send_frame(s, p, &env, NULL, 0, 0);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Push, finish, pull                                                    */
/* ------------------------------------------------------------------ */

static chunk_t *find_chunk(gift_shard_t *s, uint32_t key, uint32_t id)
{
    if (!s->declared || key >= s->ntensors)
        return NULL;
    {
        const tensor_t *t = &s->tensors[key];
        uint32_t lo = 0, hi = t->nchunks;
        /* Binary search of the sorted sparse index. */
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (t->by_id[mid]->id < id)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < t->nchunks && t->by_id[lo]->id == id ? t->by_id[lo] : NULL;
    }
}

chunk_t *gift__shard_find_chunk(gift_shard_t *s, uint32_t key, uint32_t id)
{
    return find_chunk(s, key, id);
}

/* Empties a step slot for the step after it: no ranks, no count, no epoch.
 * The accumulator is not cleared: the step's first push overwrites it. */
static void slot_clear(const gift_shard_t *s, slot_t *sl)
{
    memset(sl->ranks, 0, s->words * sizeof(uint64_t));
    sl->count = 0;
    sl->next = 0;
    sl->fused = 0;
    sl->epoch = -1;
    sl->t_first = 0;
    sl->warned = 0;
}

/* Finishes step ch->base (all world pushes summed): mean, encode into the
 * step's reply buffer, wake parked pulls, advance; repeats while the next
 * step is complete too. */
static void finish_steps(gift_shard_t *s, chunk_t *ch)
{
    tensor_t *t = ch->t;
    while (ch->slot[ch->base & 1].count == s->world) {
        slot_t *sl = &ch->slot[ch->base & 1];
        reply_t *r = &ch->reply[ch->base & 1];
        uint64_t step = ch->base;
        int rc;

        /* On hits steps and those whose mean the policy keeps, acc ends holding it. */
        rc = gift__agg_mean(ch, sl, r, s->world,
                            hits_step(s, step) || gift__pol_wants_mean(ch, step), s->c.pass_bytes);
        r->pull = sl->pull;
        r->buf->len = r->len = sl->pull_len;
        r->err = rc < 0 ? rc : 0;
        r->step = step;
        r->epoch = sl->epoch < 0 ? 0 : (uint32_t)sl->epoch;
        r->valid = 1;
        if (rc < 0)
            GIFT_LOG_ERROR(0, "tensor %u chunk %u step %" PRIu64 ": encode failed: %s", t->key,
                           ch->id, step, gift_strerror(rc));
        if (rc == 0 && hits_step(s, step)) {
            gift_hits_t h;
            s->c.pass_bytes[GIFT_SPASS_CHECK] += 4u * (uint64_t)ch->n;
            if (gift_boundary_hits(&r->pull, sl->acc, r->buf->data, r->buf->cap, ch->n, &h) == 0 &&
                h.n > 0) {
                t->hit_rate = (double)(h.saturated + h.flushed) / (double)h.n;
                t->hit_known = 1;
            }
        }
        gift__pol_observe(ch, sl, r); /* before the journal: the step's record holds them */
        /* Durable before any pull of it is answered: synced now, or with
         * group commit at the next gift_shard_flush (its pulls wait). */
        r->durable = 1;
        if (s->jr && s->jr->step(s, ch, r) < 0) {
            r->err = GIFT_EIO;
        } else if (s->jr && s->o.group_commit && !s->replaying) {
            r->durable = 0;
            if (!ch->pending) {
                ch->pending = 1;
                s->pending[s->npending++] = ch;
            }
        }
        if (sl->t_first) {
            double lat = (double)(now_ns(s) - sl->t_first) * 1e-9;
            int b = 0;
            while (b < GIFT_LAT_BUCKETS - 1 && lat > gift_lat_bounds[b])
                b++;
            s->c.lat_bucket[b]++;
            s->c.lat_sum += lat;
        }
        slot_clear(s, sl);
        ch->base++;
        ch->tentative = 0;
        s->c.steps_finished++;
        /* Wake the pulls that waited for this step. */
        for (parked_t *q = r->durable ? ch->parked : NULL, *next; q != NULL; q = next) {
            next = q->cnext;
            if (q->step == step) {
                gift_peer_t *p = q->peer;
                uint64_t seq = q->seq;
                gift__parked_unlink(s, q);
                gift__send_reply(s, p, ch, r, seq);
            }
        }
    }
    if (s->jr)
        s->jr->steps_done(s);
}

/* The aggregation arithmetic's ordered add (aggregate.c), under the name
 * handle_push calls it by. */
static int ordered_add(gift_shard_t *s, chunk_t *ch, slot_t *sl, uint64_t step, uint32_t epoch,
                       int now, uint32_t rank, const uint8_t *payload, size_t len)
{
    return gift__agg_ordered_add(ch, sl, s->world,
                                 hits_step(s, step) || gift__pol_wants_mean(ch, step), step, epoch,
                                 now, rank, payload, len, s->c.pass_bytes);
}

/* Whether rank pushed into either step of ch's window. */
static int window_has_rank(const gift_shard_t *s, const chunk_t *ch, uint32_t rank)
{
    return (s->words > 0 && rank / 64 < s->words) &&
           (bit_get(ch->slot[0].ranks, rank) || bit_get(ch->slot[1].ranks, rank));
}

/*
 * A tentative window (no step of ch has finished) was placed by the first
 * push that reached it; a rank that has not pushed into it now pushes an
 * earlier step. Members of one run start at the same step, so the window
 * was placed by a connection far ahead of the members (a stranger's push
 * for step 999,999 before the real step 0): the window moves down to step,
 * the pushes it held are dropped with one log line naming their ranks and
 * steps, and the pulls parked on them are answered with GIFT_ESTEP, so that
 * nothing dropped stays silent. p's push is then handled as the first of
 * the new window.
 */
static void window_move(gift_shard_t *s, gift_peer_t *p, chunk_t *ch, uint64_t step)
{
    uint64_t old = ch->base;
    char ranks[96];
    size_t off = 0;

    ranks[0] = '\0';
    for (int i = 0; i < 2; i++) {
        slot_t *sl = &ch->slot[i];
        for (uint32_t r = 0; r < s->world && off + 12 < sizeof ranks; r++)
            if (bit_get(sl->ranks, r))
                off += (size_t)snprintf(ranks + off, sizeof ranks - off, "%s%u", off ? "," : "", r);
        slot_clear(s, sl);
    }
    GIFT_LOG_WARN(p->id,
                  "tensor %u chunk %u: rank %u's first push is for step %" PRIu64
                  ", below the window %" PRIu64 "..%" PRIu64 " that the first push placed "
                  "(ranks %s, no step finished): the window moves to step %" PRIu64
                  " and those pushes are dropped",
                  ch->t->key, ch->id, p->rank, step, old, old + 1, ranks[0] ? ranks : "none", step);
    ch->started = 0;
    ch->tentative = 0;
    ch->base = step;
    s->c.window_moves++;
    for (parked_t *q = ch->parked, *next; q != NULL; q = next) {
        gift_peer_t *qp = q->peer;
        uint64_t qstep = q->step, seq = q->seq;
        next = q->cnext;
        gift__parked_unlink(s, q);
        gift__send_error(s, qp, GIFT_ESTEP, 0, ch->t->key, ch->id, qstep, seq,
                         "pull for step %" PRIu64
                         " of tensor %u chunk %u: the window moved to step "
                         "%" PRIu64 ", where the members' first pushes are; the pushes of steps "
                         "%" PRIu64 "..%" PRIu64 " were dropped",
                         qstep, ch->t->key, ch->id, step, old, old + 1);
    }
}

/* The codecs a push claims (gift__pol_push_codecs) and their payloads' bytes. */
typedef struct push_codecs {
    gift_codec_params_t push, pull;
    size_t push_len, pull_len;
} push_codecs_t;

/* The epoch of p's push m into slot sl of ch: one step never mixes epochs
 * (the first accepted push fixes it), and the owner also knows which epoch
 * the step must use. Returns 0, or GIFT_EEPOCH after the Error to p. */
static int push_epoch(gift_shard_t *s, gift_peer_t *p, const chunk_t *ch, const slot_t *sl,
                      const Gift__Push *m)
{
    const tensor_t *t = ch->t;
    uint32_t want;
    if (!t->geometry)
        want = 0;
    else if (sl->epoch >= 0)
        want = (uint32_t)sl->epoch;
    else if (t->owner)
        want = gift__owner_epoch_for_step(t, m->step);
    else if (gift__admit_epoch_plausible(ch, m->step, m->epoch))
        want = m->epoch;
    else {
        gift__send_error(s, p, GIFT_EEPOCH, 0, m->key, m->chunk, m->step, m->seq,
                         "push encoded under epoch %u, which step %" PRIu64 " of tensor %u "
                         "cannot use: epochs grow by at most one per step (at most %u here)",
                         m->epoch, m->step, m->key, gift__admit_epoch_bound(ch, m->step));
        return GIFT_EEPOCH;
    }
    if (m->epoch != want) {
        gift__send_error(s, p, GIFT_EEPOCH, 0, m->key, m->chunk, m->step, m->seq,
                         "push encoded under epoch %u; step %" PRIu64 " of tensor %u uses "
                         "epoch %u",
                         m->epoch, m->step, m->key, want);
        return GIFT_EEPOCH;
    }
    return 0;
}

/* Sums the payload of rank's push m into slot sl of ch (base: the step the
 * chunk finishes next). Returns 0, or the decode error (nothing was summed). */
static int push_add(gift_shard_t *s, chunk_t *ch, slot_t *sl, uint32_t rank, const Gift__Push *m,
                    const gift_frame_t *f, uint64_t base)
{
    int rc;
    if (s->o.aggregate == GIFT_SHARD_ORDERED)
        return ordered_add(s, ch, sl, m->step, m->epoch, m->step == base, rank, f->payload,
                           f->payload_len);
    /* The first push of a step overwrites the accumulator instead of
     * adding to a cleared one: v and 0 + v differ only for v = -0,
     * and the +0 of the mean's scaling makes the bytes the same. */
    if (sl->count == 0)
        rc = gift_decode(&sl->push, f->payload, f->payload_len, ch->n, sl->acc);
    else
        rc = gift_decode_acc(&sl->push, f->payload, f->payload_len, ch->n, sl->acc);
    s->c.pass_bytes[sl->count == 0 ? GIFT_SPASS_DECODE : GIFT_SPASS_ACCUMULATE] +=
        4u * (uint64_t)ch->n;
    return rc;
}

/* A new push m of p into slot sl of ch (step base or base + 1, p's rank not
 * in the slot yet): its epoch and codecs checked, its payload summed; then
 * p's rank, the slot's first-push time and epoch, the counters and, for the
 * chunk's first push, the window's base are recorded. Returns 0, or a
 * negative code after the Error to p (the push is not counted). */
static int push_accept(gift_shard_t *s, gift_peer_t *p, chunk_t *ch, slot_t *sl,
                       const Gift__Push *m, const gift_frame_t *f, uint64_t base,
                       const push_codecs_t *pc)
{
    char why[256];
    int rc;

    if ((rc = push_epoch(s, p, ch, sl, m)) < 0)
        return rc;
    if (gift__pol_step_codecs(ch, sl, m->step, m->epoch, &pc->push, &pc->pull, pc->push_len,
                              pc->pull_len, why, sizeof why) < 0) {
        gift__send_error(s, p, GIFT_ECODEC, 0, m->key, m->chunk, m->step, m->seq, "%s", why);
        return GIFT_ECODEC;
    }
    if ((rc = push_add(s, ch, sl, p->rank, m, f, base)) < 0) {
        gift__send_error(s, p, rc, 0, m->key, m->chunk, m->step, m->seq,
                         "push payload rejected: %s", gift_strerror(rc));
        return rc;
    }
    if (!ch->started) {
        ch->started = 1;
        ch->tentative = 1;
        ch->base = base;
    }
    bit_set(sl->ranks, p->rank);
    if (sl->count++ == 0)
        sl->t_first = now_ns(s);
    sl->epoch = m->epoch;
    s->c.pushes++;
    s->c.push_bytes_in[sl->push.fmt] += f->payload_len;
    s->c.push_frames_in[sl->push.fmt]++;
    ch->t->bytes_in += f->payload_len;
    return 0;
}

/* Acknowledges p's push m; dup: a replay or repeat, acknowledged but not
 * summed again. */
static void push_ack(gift_shard_t *s, gift_peer_t *p, const Gift__Push *m, int dup)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__PushAck ack = GIFT__PUSH_ACK__INIT;
    ack.key = m->key;
    ack.chunk = m->chunk;
    ack.step = m->step;
    ack.duplicate = dup;
    ack.seq = m->seq;
    env.msg_case = GIFT__ENVELOPE__MSG_PUSH_ACK;
    env.push_ack = &ack;
    (void)gift__send_frame(s, p, &env, NULL, 0, 0);
}

/*
 * Push (gift.proto): rank p->rank's encoded contribution to one chunk step.
 * Reads: the Push and its payload, the chunk's window (base, slots) and the
 * tensor's epochs and codecs (policy_owner.c, owner.c).
 * Owns: the slot of the pushed step, which it fills (push_accept); the
 * chunk's window, which the first push places and a member's earlier first
 * push moves (window_move); the push counters.
 * May call: admit.c (first step, epochs), policy_owner.c (codecs),
 * aggregate.c (ordered sums), send.c, and finish_steps, which finishes
 * every step that is now complete and answers its parked pulls.
 * Returns 0: a refused push is answered with an Error, never fatal.
 */
static int handle_push(gift_shard_t *s, gift_peer_t *p, const Gift__Push *m, const gift_frame_t *f)
{
    chunk_t *ch = find_chunk(s, m->key, m->chunk);
    push_codecs_t pc;
    uint64_t base;
    char why[256];
    int dup = 0;

    if (ch == NULL) {
        gift__send_error(s, p, GIFT_ENOKEY, 0, m->key, m->chunk, m->step, m->seq,
                         "push for tensor %u chunk %u, which this shard does not hold", m->key,
                         m->chunk);
        return 0;
    }
    /* The declared codecs, or those of the epoch's decision (policy_owner.h). */
    if (gift__pol_push_codecs(ch, m, &pc.push, &pc.pull, &pc.push_len, &pc.pull_len, why,
                              sizeof why) < 0) {
        gift__send_error(s, p, GIFT_ECODEC, 0, m->key, m->chunk, m->step, m->seq, "%s", why);
        return 0;
    }
    if (f->payload_len != pc.push_len) {
        gift__send_error(s, p, GIFT_ESHAPE, 0, m->key, m->chunk, m->step, m->seq,
                         "push payload is %" PRIu64 " bytes; chunk %u of tensor %u needs %zu",
                         f->payload_len, m->chunk, m->key, pc.push_len);
        return 0;
    }
    /* A chunk's first accepted push fixes its base step; a refused one must
     * not, nor may one far past the shard's other chunks (a push for step
     * 10^12 would make every real push a duplicate). */
    if (!ch->started && gift__admit_first_step(s, p, ch, m) < 0)
        return 0;
    if (ch->started && ch->tentative && m->step < ch->base && !window_has_rank(s, ch, p->rank))
        window_move(s, p, ch, m->step);
    base = ch->started ? ch->base : m->step;
    if (m->step < base) {
        dup = 1;
    } else if (m->step - base > 1) {
        gift__send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                         "push for step %" PRIu64 " while step %" PRIu64
                         " is unfinished (window is %" PRIu64 "..%" PRIu64 ")",
                         m->step, base, base, base + 1);
        return 0;
    } else {
        slot_t *sl = &ch->slot[m->step & 1];
        if (bit_get(sl->ranks, p->rank))
            dup = 1;
        else if (push_accept(s, p, ch, sl, m, f, base, &pc) < 0)
            return 0;
    }
    if (dup)
        s->c.duplicates++;
    push_ack(s, p, m, dup);
    if (!dup)
        finish_steps(s, ch);
    return 0;
}

/*
 * Pull (gift.proto): the mean of one chunk step.
 * Reads: the Pull, the chunk's window and its two kept replies.
 * Owns: nothing of the store; a pull of an unfinished (or finished but not
 * yet synced) step takes an entry of the parked pool (peers.c), answered
 * by finish_steps, gift_shard_flush or gift_shard_tick.
 * May call: peers.c (park), send.c (the reply or an Error).
 * Returns 0: a refused pull is answered with an Error, never fatal.
 */
static int handle_pull(gift_shard_t *s, gift_peer_t *p, const Gift__Pull *m)
{
    chunk_t *ch = find_chunk(s, m->key, m->chunk);
    int rc;

    if (ch == NULL) {
        gift__send_error(s, p, GIFT_ENOKEY, 0, m->key, m->chunk, m->step, m->seq,
                         "pull for tensor %u chunk %u, which this shard does not hold", m->key,
                         m->chunk);
        return 0;
    }
    s->c.pulls++;
    if (!ch->started) {
        gift__send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                         "pull for step %" PRIu64 " of tensor %u chunk %u before any push", m->step,
                         m->key, m->chunk);
        return 0;
    }
    if (m->step < ch->base) {
        const reply_t *r = &ch->reply[m->step & 1];
        if (r->valid && r->step == m->step && !r->durable) {
            /* Finished, not yet synced: answered by gift_shard_flush. */
            if ((rc = gift__park(s, p, ch, m->step, m->seq, m->have_epoch)) < 0)
                gift__park_refused(s, p, m);
            return 0;
        }
        if (r->valid && r->step == m->step) {
            gift__send_reply(s, p, ch, r, m->seq);
            return 0;
        }
        gift__send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                         "pull for step %" PRIu64 ": only steps %" PRIu64 "..%" PRIu64 " are kept",
                         m->step, ch->base >= 2 ? ch->base - 2 : 0, ch->base + 1);
        return 0;
    }
    if (m->step - ch->base > 1) {
        gift__send_error(s, p, GIFT_ESTEP, 0, m->key, m->chunk, m->step, m->seq,
                         "pull for step %" PRIu64 " while step %" PRIu64 " is unfinished", m->step,
                         ch->base);
        return 0;
    }
    if ((rc = gift__park(s, p, ch, m->step, m->seq, m->have_epoch)) < 0)
        gift__park_refused(s, p, m);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Geometry owner                                                        */
/* ------------------------------------------------------------------ */

static tensor_t *find_owned(gift_shard_t *s, gift_peer_t *p, uint32_t key, uint64_t step,
                            uint64_t seq)
{
    tensor_t *t;
    if (!s->declared || key >= s->ntensors) {
        gift__send_error(s, p, GIFT_ENOKEY, 0, key, 0, step, seq, "unknown tensor %u", key);
        return NULL;
    }
    t = &s->tensors[key];
    if (!t->geometry || !t->owner) {
        gift__send_error(s, p, GIFT_ENOKEY, 0, key, 0, step, seq, "tensor %u: %s", key,
                         t->geometry
                             ? "this shard is not its geometry owner (chunk 0 lives elsewhere)"
                             : "geometry is off for this tensor");
        return NULL;
    }
    return t;
}

/* The first step >= from that no chunk of t on this shard has accepted a
 * push for: a new epoch must not start inside a step that already holds
 * pushes encoded under the old one (a worker may push ahead, pipelined). */
static uint64_t first_clean_step(const tensor_t *t, uint64_t from)
{
    uint64_t v = from;
    for (uint32_t i = 0; i < t->nchunks; i++) {
        const chunk_t *ch = t->by_id[i];
        uint64_t s;
        if (ch == NULL || !ch->started)
            continue;
        s = from > ch->base ? from : ch->base;
        while (s <= ch->base + 1 && ch->slot[s & 1].count > 0)
            s++;
        if (s > v)
            v = s;
    }
    return v;
}

int gift__shard_round_finish(gift_shard_t *s, tensor_t *t)
{
    uint64_t step = t->sk_step;
    gift_treat_t tr;
    int rc;
    if ((rc = gift__owner_build(t, s->world, s->o.aggregate == GIFT_SHARD_ORDERED, s->o.damping,
                                s->o.geometry_decay)) < 0) {
        GIFT_LOG_ERROR(
            0, "tensor %u: geometry update at step %" PRIu64 " failed (%s); keeping epoch %u",
            t->key, step, gift_strerror(rc), t->geo.epoch);
        gift__count_error(s, rc);
        return rc;
    }
    gift__pol_decide(s, t, &tr, step);
    if ((rc = gift__owner_publish_round(t, first_clean_step(t, step + 1))) < 0) {
        gift__count_error(s, rc);
        return rc;
    }
    t->epochs[t->nepochs - 1].tr = tr;
    s->c.epochs_published++;
    GIFT_LOG_INFO(
        0, "tensor %u: epoch %u published, valid from step %" PRIu64 " (sigma2 %.3g, delta %.3g)",
        t->key, t->geo.epoch, t->epochs[t->nepochs - 1].valid_from, t->geo.sigma2, t->geo.delta);
    return rc;
}

/*
 * Sketch (gift.proto): rank p->rank's sketch of a geometry tensor this
 * shard owns, for the round of one refresh step.
 * Reads: the Sketch and its payload, the tensor's owner state (owner.c).
 * Owns: the tensor's sketch round, which it adds to (owner.c); the round's
 * last sketch builds and publishes the next epoch (gift__shard_round_finish).
 * May call: owner.c, policy_owner.c (through the round's finish), the
 * journal's sketch and epoch hooks (durable before the SketchAck), send.c.
 * Returns 0: a refused sketch is answered with an Error, never fatal.
 */
static int handle_sketch(gift_shard_t *s, gift_peer_t *p, const Gift__Sketch *m,
                         const gift_frame_t *f)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__SketchAck ack = GIFT__SKETCH_ACK__INIT;
    tensor_t *t = find_owned(s, p, m->key, m->step, m->seq);
    char why[256];
    size_t ny;
    int dup, rc;

    if (t == NULL)
        return 0;
    ny = (size_t)t->cols * t->ks;
    rc = gift__owner_sketch_check(t, m, p->rank, f->payload, f->payload_len, why, sizeof why);
    if (rc < 0) {
        gift__send_error(s, p, rc, 0, m->key, 0, m->step, m->seq, "%s", why);
        return 0;
    }
    if (rc == GIFT__SKETCH_RESTART)
        GIFT_LOG_WARN(p->id,
                      "tensor %u: sketches of step %" PRIu64 " incomplete (%u of %u); starting "
                      "step %" PRIu64,
                      t->key, t->sk_step, t->sk_count, s->world, m->step);
    dup = rc == GIFT__SKETCH_DUP;
    /* Durable before the SketchAck. */
    if (!dup && s->jr &&
        (rc = s->jr->sketch(s, t, m->step, p->rank, m->epoch, m->trace, f->payload, ny * 4)) < 0) {
        gift__send_error(s, p, rc, 0, m->key, 0, m->step, m->seq,
                         "sketch not accepted: cannot write it to the step log in %s", s->dir);
        return 0;
    }
    if (!dup) {
        if (!t->sk_active)
            gift__owner_sketch_begin(t, s->words, m->step);
        gift__owner_sketch_add(t, s->o.aggregate == GIFT_SHARD_ORDERED, p->rank, m->trace,
                               f->payload);
        s->c.sketches++;
    }
    ack.key = m->key;
    ack.step = m->step;
    ack.duplicate = dup;
    ack.seq = m->seq;
    env.msg_case = GIFT__ENVELOPE__MSG_SKETCH_ACK;
    env.sketch_ack = &ack;
    (void)gift__send_frame(s, p, &env, NULL, 0, 0);
    if (!dup && t->sk_count == s->world && gift__shard_round_finish(s, t) > 0 && s->jr)
        s->jr->epoch(s, t);
    return 0;
}

/* GeometryRequest (gift.proto): the newest epoch of a tensor this shard
 * owns. Reads the owner's published payload; owns and changes nothing;
 * calls send.c. Returns 0. */
static int handle_geometry_request(gift_shard_t *s, gift_peer_t *p, const Gift__GeometryRequest *m)
{
    tensor_t *t = find_owned(s, p, m->key, 0, m->seq);
    if (t != NULL)
        gift__send_geometry(s, p, t, m->seq);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Stats (stats.c builds the message)                                    */
/* ------------------------------------------------------------------ */

/* StatsRequest (gift.proto): answered with the shard's counters and
 * per-tensor status, which stats.c reads into a message it owns until it is
 * sent and released. Changes nothing of the shard; calls stats.c and
 * send.c. Returns 0. */
static int handle_stats(gift_shard_t *s, gift_peer_t *p, const Gift__StatsRequest *m)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    gift_stats_msg_t sm;

    if (gift__stats_build(s, m->seq, &sm) < 0) {
        gift__send_error(s, p, GIFT_ENOMEM, 0, 0, 0, 0, m->seq, "out of memory for stats");
    } else {
        env.msg_case = GIFT__ENVELOPE__MSG_STATS;
        env.stats = &sm.st;
        (void)gift__send_frame(s, p, &env, NULL, 0, 0);
    }
    gift__stats_release(&sm);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Dispatch                                                              */
/* ------------------------------------------------------------------ */

/* A Declare claimed p's rank (gift__claim_rank); a refused first Declare,
 * which fixed nothing, or one of another run, gives the claim back, so that
 * a peer whose Declares fail (or whose Hello named another world) does not
 * keep a rank from its worker. */
static int declare_claimed(gift_shard_t *s, gift_peer_t *p, const Gift__Declare *d)
{
    int first = !s->declared;
    int rc = handle_declare(s, p, d);
    if (((first && !s->declared) || rc == GIFT_ERUNID) && p->claimed && s->by_rank[p->rank] == p) {
        s->by_rank[p->rank] = NULL;
        p->claimed = 0;
    }
    return rc;
}

void gift_shard_reject(gift_shard_t *s, gift_peer_t *p, int code, const char *text)
{
    gift__send_error(s, p, code, 1, 0, 0, 0, 0, "%s", text ? text : gift_strerror(code));
}

int gift_shard_handle(gift_shard_t *s, gift_peer_t *p, const gift_frame_t *f)
{
    const Gift__Envelope *env = f->env;

    if (p->closing)
        return GIFT_ECLOSED;
    s->c.frames_in++;
    s->c.bytes_in += GIFT_PREAMBLE_BYTES + f->header_len + f->payload_len;
    if (env->msg_case != GIFT__ENVELOPE__MSG_PUSH && env->msg_case != GIFT__ENVELOPE__MSG_SKETCH &&
        f->payload_len != 0) {
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0,
                         "%s carries a payload of %" PRIu64 " bytes", gift_msg_name(env),
                         f->payload_len);
        return GIFT_EPROTO;
    }
    if (env->msg_case == GIFT__ENVELOPE__MSG_HELLO) {
        /* protobuf-c ends a string at its first NUL, so "runA\0evil" would
         * be read as run "runA": a Hello that does not pack back to its own
         * length (a NUL in a string, or an encoding no protobuf-c client
         * writes) is refused rather than read as something it does not say. */
        if (gift__envelope__get_packed_size(env) != f->header_len) {
            gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0,
                             "Hello of %" PRIu64 " header bytes reads back as %zu: a string in it "
                             "(run id, client name) holds a NUL byte, or it is not canonically "
                             "encoded",
                             (uint64_t)f->header_len, gift__envelope__get_packed_size(env));
            return GIFT_EPROTO;
        }
        return handle_hello(s, p, env->hello);
    }
    if (!p->hello) {
        int code = s->o.auth ? GIFT_EAUTH : GIFT_EPROTO;
        gift__send_error(s, p, code, 1, 0, 0, 0, 0, "%s before %s", gift_msg_name(env),
                         s->o.auth ? "authentication" : "Hello");
        return code;
    }
    /* Acting as a rank (not before the world size is known: a Declare
     * makes it known, anything else is refused below). */
    if ((env->msg_case == GIFT__ENVELOPE__MSG_DECLARE ||
         (s->world != 0 &&
          (env->msg_case == GIFT__ENVELOPE__MSG_PUSH || env->msg_case == GIFT__ENVELOPE__MSG_PULL ||
           env->msg_case == GIFT__ENVELOPE__MSG_SKETCH ||
           env->msg_case == GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST)))) {
        int rc = gift__claim_rank(s, p);
        if (rc < 0)
            return rc;
    }
    if (env->msg_case != GIFT__ENVELOPE__MSG_DECLARE &&
        env->msg_case != GIFT__ENVELOPE__MSG_RESET &&
        env->msg_case != GIFT__ENVELOPE__MSG_STATS_REQUEST && !s->declared) {
        gift__send_error(s, p, GIFT_ENOKEY, 0, 0, 0, 0, 0, "%s before any Declare on this shard",
                         gift_msg_name(env));
        return 0;
    }
    switch (env->msg_case) {
    case GIFT__ENVELOPE__MSG_DECLARE:
        return declare_claimed(s, p, env->declare);
    case GIFT__ENVELOPE__MSG_PUSH:
        return handle_push(s, p, env->push, f);
    case GIFT__ENVELOPE__MSG_PULL:
        return handle_pull(s, p, env->pull);
    case GIFT__ENVELOPE__MSG_SKETCH:
        return handle_sketch(s, p, env->sketch, f);
    case GIFT__ENVELOPE__MSG_GEOMETRY_REQUEST:
        return handle_geometry_request(s, p, env->geometry_request);
    case GIFT__ENVELOPE__MSG_STATS_REQUEST:
        return handle_stats(s, p, env->stats_request);
    case GIFT__ENVELOPE__MSG_RESET:
        return gift__reset(s, p, env->reset);
    default:
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0, "a client may not send %s",
                         gift_msg_name(env));
        return GIFT_EPROTO;
    }
}

void gift_shard_tick(gift_shard_t *s)
{
    uint64_t now = now_ns(s);
    for (size_t i = 0; s->declared && i < s->nchunks; i++) {
        chunk_t *ch = &s->chunks[i];
        slot_t *sl = &ch->slot[ch->base & 1];
        double waited;
        if (!ch->started || sl->count == 0 || sl->count >= s->world)
            continue;
        waited = (double)(now - sl->t_first) * 1e-9;
        if (s->o.stall_warn_s && waited >= s->o.stall_warn_s && !sl->warned) {
            char ranks[256];
            size_t len = 0;
            uint32_t shown = 0;
            ranks[0] = '\0';
            for (uint32_t r = 0; r < s->world && len + 16 < sizeof ranks; r++)
                if (!bit_get(sl->ranks, r)) {
                    len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%u",
                                            shown++ ? "," : "", r);
                }
            if (shown < s->world - sl->count)
                snprintf(ranks + len, sizeof ranks - len, ",...");
            GIFT_LOG_WARN(0,
                          "stall: tensor %u (%s) chunk %u step %" PRIu64
                          " has waited %.0f s; %u of %u ranks pushed, missing ranks %s",
                          ch->t->key, ch->t->name, ch->id, ch->base, waited, sl->count, s->world,
                          ranks);
            sl->warned = 1;
            s->c.stalls++;
        }
        if (s->o.stall_timeout_s && waited >= s->o.stall_timeout_s) {
            for (parked_t *q = ch->parked, *next; q != NULL; q = next) {
                next = q->cnext;
                if (q->step == ch->base) {
                    gift_peer_t *p = q->peer;
                    uint64_t seq = q->seq;
                    gift__parked_unlink(s, q);
                    gift__send_error(s, p, GIFT_ETIMEDOUT, 0, ch->t->key, ch->id, ch->base, seq,
                                     "step %" PRIu64 " of tensor %u chunk %u waited %.0f s for %u "
                                     "missing ranks (stall_timeout %u s)",
                                     ch->base, ch->t->key, ch->id, waited, s->world - sl->count,
                                     s->o.stall_timeout_s);
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ */
/* Group commit (the journal writes, the shard answers)                  */
/* ------------------------------------------------------------------ */

void gift_shard_flush(gift_shard_t *s)
{
    int rc;
    if (s->npending == 0)
        return;
    rc = s->jr->sync(s);
    for (size_t i = 0; i < s->npending; i++) {
        chunk_t *ch = s->pending[i];
        ch->pending = 0;
        for (int j = 0; j < 2; j++)
            if (ch->reply[j].valid && !ch->reply[j].durable) {
                if (rc < 0)
                    ch->reply[j].err = GIFT_EIO;
                ch->reply[j].durable = 1;
            }
        for (parked_t *q = ch->parked, *next; q != NULL; q = next) {
            const reply_t *r = &ch->reply[q->step & 1];
            next = q->cnext;
            if (q->step < ch->base && r->valid && r->step == q->step) {
                gift_peer_t *p = q->peer;
                uint64_t seq = q->seq;
                gift__parked_unlink(s, q);
                gift__send_reply(s, p, ch, r, seq);
            }
        }
    }
    s->npending = 0;
}
