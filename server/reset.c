/*
 * reset.c: `giftctl reset` over the wire (reset.h). A Reset comes after an
 * ordinary Hello (authenticated like any other when the shard has a key)
 * and must also carry the administrator's MAC (gift_auth_reset_mac), which
 * a worker's rank key cannot make. Every field is checked before anything
 * changes; nothing is allocated from the message. Reads and writes shard
 * state (shard_state.h), drops the store through declare.c, answers
 * through send.c, reaches persistence only through the journal table.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "admit.h"
#include "declare.h"
#include "log.h"
#include "peers.h"
#include "reset.h"
#include "send.h"

/* The workers connected as ranks (p, the requester, is none): their count,
 * and the first few ranks in ranks. */
static uint32_t workers_connected(const gift_shard_t *s, char *ranks, size_t cap)
{
    uint32_t n = 0;
    size_t len = 0;
    ranks[0] = '\0';
    for (uint32_t r = 0; r < s->by_rank_len; r++) {
        const gift_peer_t *q = s->by_rank[r];
        if (q == NULL || q->closing)
            continue;
        if (len + 16 < cap)
            len += (size_t)snprintf(ranks + len, cap - len, "%s%u", n ? "," : "", r);
        else if (len + 4 < cap && ranks[len - 1] != '.')
            len += (size_t)snprintf(ranks + len, cap - len, ",...");
        n++;
    }
    return n;
}

/* Closes every worker's connection: its pulls unparked, its rank released,
 * a fatal GIFT_ESTATE saying why. Returns how many were closed. */
static uint32_t close_workers(gift_shard_t *s, gift_peer_t *by, const char *run)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < s->by_rank_len; r++) {
        gift_peer_t *q = s->by_rank[r];
        if (q == NULL)
            continue;
        while (q->parked)
            gift__parked_unlink(s, q->parked);
        q->claimed = 0;
        s->by_rank[r] = NULL;
        if (!q->closing) {
            gift__send_error(s, q, GIFT_ESTATE, 1, 0, 0, 0, 0,
                             "shard %u was reset by `giftctl reset --force` (connection %" PRIu64
                             "): the state of run '%s' is gone; restart the run",
                             s->o.shard_id, by->id, run);
            n++;
        }
    }
    return n;
}

/*
 * Reset (gift.proto), the handler shard.c dispatches a Reset to.
 * Reads: the Reset (run id, force, the administrator's MAC), p's claim and
 * nonces, the shard's run id and the connections acting as ranks.
 * Owns: after every check has passed, the whole store (dropped through
 * declare.c), the parked pulls, the rank table and the adopted world size.
 * May call: admit.c, peers.c (unpark), declare.c, the journal's reset hook,
 * send.c (a fatal Error to every worker closed, the ResetAck to p).
 */
int gift__reset(gift_shard_t *s, gift_peer_t *p, const Gift__Reset *m)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__ResetAck ack = GIFT__RESET_ACK__INIT;
    const char *want = m->run_id != NULL ? m->run_id : "";
    char run[GIFT_RUN_ID_MAX + 1], ranks[128], err[512] = "";
    uint32_t busy;
    int rc = 0;

    if (p->claimed) { /* a worker's connection resetting its own run */
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, m->seq,
                         "reset refused: this connection acts as rank %u; reset with giftctl",
                         p->rank);
        return GIFT_EPROTO;
    }
    if (strnlen(want, GIFT_RUN_ID_MAX + 1) > GIFT_RUN_ID_MAX) {
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, m->seq,
                         "reset: run id longer than %d bytes", GIFT_RUN_ID_MAX);
        return GIFT_EPROTO;
    }
    if (s->o.auth != NULL) {
        uint8_t mac[GIFT_AUTH_MAC_BYTES];
        gift_auth_reset_mac(s->o.auth, p->nonce, p->cnonce, want, m->force, m->seq, mac);
        if (gift_auth_verify(m->auth_mac.data, m->auth_mac.len, mac) < 0) {
            gift__send_error(
                s, p, GIFT_EAUTH, 1, 0, 0, 0, m->seq,
                "reset refused: it needs the shared secret of this shard's "
                "auth_key_file (giftctl --auth-key-file), not a rank key; nothing changed");
            return GIFT_EAUTH;
        }
    }
    if (want[0] != '\0' && strcmp(want, s->run_id) != 0) {
        gift__send_error(s, p, GIFT_ERUNID, 1, 0, 0, 0, m->seq,
                         "reset refused: shard %u holds %s%s%s, not run '%s' (--run-id); nothing "
                         "changed",
                         s->o.shard_id, s->run_id[0] ? "run '" : "no run id", s->run_id,
                         s->run_id[0] ? "'" : "", want);
        return GIFT_ERUNID;
    }
    busy = workers_connected(s, ranks, sizeof ranks);
    snprintf(run, sizeof run, "%s", s->run_id);
    if (busy > 0 && !m->force) {
        char of[GIFT_RUN_ID_MAX + 16];
        snprintf(of, sizeof of, run[0] ? "of run '%s'" : "of a run without a run id%s", run);
        gift__send_error(s, p, GIFT_EBUSY, 1, 0, 0, 0, m->seq,
                         "reset refused: %u worker%s %s %s connected to shard %u (rank%s %s); "
                         "stop %s first, or pass --force to drop the run under %s; nothing changed",
                         busy, busy == 1 ? "" : "s", of, busy == 1 ? "is" : "are", s->o.shard_id,
                         busy == 1 ? "" : "s", ranks, busy == 1 ? "it" : "them",
                         busy == 1 ? "it" : "them");
        return GIFT_EBUSY;
    }
    ack.seq = m->seq;
    ack.shard_id = s->o.shard_id;
    ack.run_id = run;
    ack.tensors = (uint32_t)s->ntensors;
    ack.steps = gift__admit_newest_base(s);
    ack.closed = close_workers(s, p, run);
    /* Parked pulls point into the chunks: none may outlive them. */
    for (size_t i = 0; i < s->nchunks; i++)
        while (s->chunks[i].parked)
            gift__parked_unlink(s, s->chunks[i].parked);
    gift__shard_store_free(s);
    s->world = s->o.world_size; /* configured, or adopted again from the next Declare */
    s->words = (s->world + 63) / 64;
    s->c.restored_step = 0;
    if (s->jr != NULL) {
        rc = s->jr->reset(s, err, sizeof err);
        ack.files = rc == 0;
    }
    GIFT_LOG_WARN(p->id,
                  "reset (giftctl): dropped run '%s', %u tensors, steps below %" PRIu64
                  ", %u worker connections closed%s%s",
                  run, ack.tensors, ack.steps, ack.closed,
                  s->jr == NULL ? ""
                  : rc == 0
                      ? "; moved the checkpoint and step logs aside into a discarded-* folder of "
                      : "; ",
                  s->jr == NULL ? ""
                  : rc == 0     ? s->dir
                                : err);
    if (rc < 0) {
        gift__send_error(s, p, rc, 1, 0, 0, 0, m->seq,
                         "reset: the state in memory was dropped, but %s; fix it and reset again "
                         "(or restart giftd with --reset)",
                         err);
        return rc;
    }
    env.msg_case = GIFT__ENVELOPE__MSG_RESET_ACK;
    env.reset_ack = &ack;
    (void)gift__send_frame(s, p, &env, NULL, 0, 0);
    return 0;
}
