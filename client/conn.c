/*
 * conn.c: the engine's side of each shard's connection (I/O thread): the
 * handshake (Hello, AuthChallenge, HelloAck, Declare, DeclareAck), what a
 * lost connection must send again, and the two commands that wait on the
 * connections (CMD_CONNECT, CMD_DECLARE). net.c reports connection events
 * here (gift__eng_conn_*); engine.c hands over the handshake's frames
 * (gift__conn_on_*) and asks whether a waiting command is done
 * (gift__conn_check_cmds). This file calls frames.c, mailbox.c, notes.c
 * and c->io, never engine.c.
 *
 * A connection's state (gift__conn_t.state, enum gift__conn_state):
 *
 *   DOWN -> HELLO (TCP up, Hello sent; a second Hello with the MAC after an
 *   AuthChallenge) -> READY (HelloAck checked, before declaration) or
 *   DECLARING (Declare sent) -> READY (DeclareAck: resync, replay). A drop
 *   at any point: DOWN, and net.c reconnects after the backoff.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "giftclient_internal.h"

/* ------------------------------------------------------------------ */
/* Commands that wait on the connections                                */
/* ------------------------------------------------------------------ */

/* CMD_CONNECT is done once every shard is READY (or one refused us),
 * CMD_DECLARE once every shard acknowledged the Declare and every geometry
 * tensor holds an epoch (or something failed): completes them. */
void gift__conn_check_cmds(gift_client_t *c)
{
    int all = 1, err = 0;
    if (c->cmd_connect != NULL) {
        for (uint32_t s = 0; s < c->nshards; s++) {
            if (c->conns[s].err && !err)
                err = c->conns[s].err;
            if (c->conns[s].state != GIFT__CONN_READY)
                all = 0;
        }
        if (err || all) {
            gift__cmd_t *cmd = c->cmd_connect;
            c->cmd_connect = NULL;
            /* Handed to the caller with the command (under the mutex). */
            c->max_frame = UINT64_MAX;
            for (uint32_t s = 0; s < c->nshards; s++)
                if (c->conns[s].max_frame && c->conns[s].max_frame < c->max_frame)
                    c->max_frame = c->conns[s].max_frame;
            gift__cmd_done(c, cmd, err);
        }
    }
    if (c->cmd_declare != NULL) {
        all = 1;
        err = c->geo_err;
        for (uint32_t s = 0; s < c->nshards; s++) {
            if (c->conns[s].err && !err)
                err = c->conns[s].err;
            if (!c->conns[s].declared)
                all = 0;
        }
        for (size_t i = 0; i < c->nwires; i++)
            if (c->wires[i].geometry && !c->wires[i].have_geo)
                all = 0;
        if (err || all) {
            gift__cmd_t *cmd = c->cmd_declare;
            c->cmd_declare = NULL;
            gift__cmd_done(c, cmd, err);
        }
    }
}

/* ------------------------------------------------------------------ */
/* Connection events (net.c)                                             */
/* ------------------------------------------------------------------ */

/* net.c: shard's TCP connection is up. Reads: connect_err, lost (whether
 * to say so). Owns: the connection's state (now HELLO), err, challenged.
 * May call: gift__send_hello (frames.c; it drops the connection when the
 * Hello cannot be queued), gift__shard_addr. */
void gift__eng_conn_up(gift_client_t *c, uint32_t shard)
{
    char a[64];
    if (c->conns[shard].connect_err != 0 || c->conns[shard].lost)
        fprintf(stderr, "giftclient: shard %u (%s): connected\n", shard,
                gift__shard_addr(c, shard, a, sizeof a));
    c->conns[shard].connect_err = 0;
    c->conns[shard].err = 0;
    c->conns[shard].state = GIFT__CONN_HELLO;
    c->conns[shard].challenged = 0;
    gift__send_hello(c, shard);
}

/* net.c: shard's connection is gone (after being up). Everything that was
 * queued on it must go again: clears the sent flags of its chunks in every
 * push and pull state and its geometry tensors' fetch_sent and sketches;
 * nothing is sent now (resync does, at the next DeclareAck). Owns: the
 * connection's state (DOWN), lost. Sends nothing, finishes nothing. */
void gift__eng_conn_down(gift_client_t *c, uint32_t shard)
{
    char a[64];
    c->conns[shard].state = GIFT__CONN_DOWN;
    if (c->conns[shard].ever_ready) {
        if (!c->conns[shard].lost)
            fprintf(stderr,
                    "giftclient: shard %u (%s): connection lost; reconnecting (backoff "
                    "up to %u ms) and replaying what it may not have counted\n",
                    shard, gift__shard_addr(c, shard, a, sizeof a), c->backoff_max_ms);
        c->conns[shard].lost = 1;
    }
    for (size_t i = 0; c->io_declared && i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        for (uint32_t j = 0; j < w->nchunks; j++) {
            if (gift__chunk_of(c, w, j)->shard != shard)
                continue;
            w->ps[0].sent[j] = w->ps[1].sent[j] = 0;
            w->pl[0].sent[j] = w->pl[1].sent[j] = 0;
        }
        if (w->geometry && gift__owner_of(c, w) == shard) {
            w->fetch_sent = 0;
            if (w->sk_pending)
                w->sk_unsent = 1;
        }
    }
}

/* net.c: a connect failed with code (a negative errno): kept for the
 * timeout's message (gift__note_unreached), and logged at most every 5 s
 * per shard while it goes on. Owns: connect_err, connect_log_ns; reads
 * c->io->now_ns. */
void gift__eng_conn_failed(gift_client_t *c, uint32_t shard, int code)
{
    gift__conn_t *cn = &c->conns[shard];
    uint64_t now = c->io->now_ns();
    char a[64];
    int first = cn->connect_err == 0;
    cn->connect_err = code < 0 ? code : -EIO;
    if (first || now - cn->connect_log_ns >= 5000000000ull) {
        cn->connect_log_ns = now;
        fprintf(stderr, "giftclient: shard %u (%s): %s; retrying\n", shard,
                gift__shard_addr(c, shard, a, sizeof a),
                cn->connect_err == -ECONNREFUSED ? "connection refused (is giftd listening there?)"
                                                 : strerror(-cn->connect_err));
    }
}

/* A connection became ready (declared): geometry requests, then sketches,
 * then pushes whose pull has not completed (oldest step first), then pulls. */
static void resync(gift_client_t *c, uint32_t shard, int replay)
{
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        if (w->geometry && gift__owner_of(c, w) == shard) {
            gift__send_geo_request(c, w);
            gift__send_sketch(c, w);
        }
    }
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        int a = w->ps[0].step <= w->ps[1].step ? 0 : 1;
        for (int k = 0; k < 2; k++) {
            gift__pstate_t *ps = &w->ps[k ? !a : a];
            if (gift__ps_has_payload(ps) && ps->need_replay)
                gift__send_push_chunks(c, w, ps, shard, replay);
        }
    }
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        for (int k = 0; k < 2; k++)
            if (w->pl[k].state == GIFT__PL_PENDING)
                gift__send_pull_chunks(c, w, &w->pl[k]);
    }
}

/* on_auth_challenge: the shard requires authentication; answer with a
 * Hello that carries the MAC, or, without a key, with one that does not
 * (the shard then refuses it with GIFT_EAUTH).
 *   Reads:    m (the reader's, until this returns), c->auth; the connection
 *             must be HELLO and not challenged yet.
 *   Owns:     the connection's snonce and challenged.
 *   May call: gift__send_hello (frames.c).
 *   Returns 0, or GIFT_EPROTO (net.c drops the connection). */
int gift__conn_on_auth_challenge(gift_client_t *c, uint32_t shard, const Gift__AuthChallenge *m)
{
    gift__conn_t *cn = &c->conns[shard];
    if (cn->state != GIFT__CONN_HELLO || cn->challenged ||
        m->server_nonce.len != GIFT_AUTH_NONCE_BYTES)
        return GIFT_EPROTO;
    memcpy(cn->snonce, m->server_nonce.data, GIFT_AUTH_NONCE_BYTES);
    cn->challenged = 1;
    if (c->auth == NULL)
        fprintf(stderr,
                "giftclient: shard %u requires authentication; set GIFT_AUTH_KEY_FILE "
                "to its key file\n",
                shard);
    gift__send_hello(c, shard);
    return 0;
}

/* on_hello_ack: the shard's answer to our Hello. Checks its protocol, its
 * place in GIFT_SERVERS, its world size and, with a key, its proof of the
 * key; then declares (once declared) or makes the connection READY.
 *   Reads:    a (the reader's, until this returns), c->nshards, c->world,
 *             c->auth, c->lost, c->io_declared, the connection's nonces.
 *   Owns:     the connection's state (READY or, via the Declare, DECLARING),
 *             err, max_frame, lost, ever_ready; the reconnects counter.
 *   May call: gift__send_declare (frames.c), c->io->backoff_reset,
 *             gift__client_note, gift__conn_check_cmds (CMD_CONNECT).
 *   Returns 0, or the refusal's code (net.c drops the connection). */
int gift__conn_on_hello_ack(gift_client_t *c, uint32_t shard, const Gift__HelloAck *a)
{
    gift__conn_t *cn = &c->conns[shard];
    char ad[64];
    if (cn->state != GIFT__CONN_HELLO)
        return GIFT_EPROTO;
    gift__shard_addr(c, shard, ad, sizeof ad);
    if (a->protocol_version != GIFT_PROTOCOL_VERSION) {
        gift__client_note(c, "shard %u (%s) speaks protocol %u; this client %d", shard, ad,
                          a->protocol_version, GIFT_PROTOCOL_VERSION);
        cn->err = GIFT_EVERSION;
    } else if (a->shard_id != shard || a->num_shards != c->nshards) {
        gift__client_note(c,
                          "server %u of GIFT_SERVERS (%s) is shard %u of %u (want %u of %u): "
                          "list the shards in order",
                          shard, ad, a->shard_id, a->num_shards, shard, c->nshards);
        cn->err = GIFT_EINVAL;
    } else if (a->world_size != 0 && a->world_size != (uint32_t)c->world) {
        gift__client_note(c,
                          "shard %u (%s) serves a world of %u ranks; this worker has world "
                          "size %d (WORLD_SIZE / GIFT_WORLD): start every worker with the same",
                          shard, ad, a->world_size, c->world);
        cn->err = GIFT_EWORLD;
    } else if (c->auth != NULL) {
        /* The shard must prove the key too, or it gets no gradients. */
        uint8_t want[GIFT_AUTH_MAC_BYTES] = {0};
        if (cn->challenged)
            gift_auth_ack_mac(c->auth, (uint32_t)c->rank, cn->snonce, cn->cnonce, cn->hello_mac,
                              want);
        if (!cn->challenged || gift_auth_verify(a->auth_mac.data, a->auth_mac.len, want) < 0) {
            fprintf(stderr, "giftclient: shard %u %s; refusing it\n", shard,
                    cn->challenged ? "failed to prove the shared key"
                                   : "does not ask for authentication, but a key is set");
            cn->err = GIFT_EAUTH;
        }
    }
    if (cn->err) {
        gift__conn_check_cmds(c);
        return cn->err;
    }
    if (c->lost) /* never declare again into a shard that lost (or dropped) the run */
        return cn->err = c->lost;
    cn->max_frame = a->max_frame_bytes;
    c->io->backoff_reset(c, shard);
    if (c->io_declared) {
        gift__send_declare(c, shard);
    } else {
        cn->state = GIFT__CONN_READY;
        if (cn->lost)
            GIFT__STAT_ADD(c, reconnects, 1);
        cn->lost = 0;
        cn->ever_ready = 1;
        gift__conn_check_cmds(c);
    }
    return 0;
}

/* on_declare_ack: the shard holds our Declare; the connection is READY.
 *   Reads:    the connection's state (must be DECLARING) and lost (a
 *             reconnect: its replayed pushes are counted as replays).
 *   Owns:     the connection's state, declared, lost, ever_ready; the
 *             reconnects counter; sets c->rescan (waiting requests retry).
 *   May call: resync (frames.c's gift__send_*: geometry requests, sketches,
 *             the pushes still needed, pending pulls), gift__conn_check_cmds
 *             (CMD_DECLARE).
 *   Returns 0, or GIFT_EPROTO (net.c drops the connection). */
int gift__conn_on_declare_ack(gift_client_t *c, uint32_t shard)
{
    gift__conn_t *cn = &c->conns[shard];
    int again = cn->lost;
    if (cn->state != GIFT__CONN_DECLARING)
        return GIFT_EPROTO;
    cn->state = GIFT__CONN_READY;
    cn->declared = 1;
    if (again)
        GIFT__STAT_ADD(c, reconnects, 1);
    cn->lost = 0;
    cn->ever_ready = 1;
    resync(c, shard, again);
    gift__conn_check_cmds(c);
    c->rescan = 1;
    return 0;
}
