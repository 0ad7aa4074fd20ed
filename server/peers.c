/*
 * peers.c: the shard's peers (peers.h): opening and closing one, the pool
 * of parked pulls linked into their chunk's list and their peer's, and the
 * one live connection per rank. Reads and writes shard state
 * (shard_state.h), answers through send.c; calls nothing of shard.c.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "log.h"
#include "peers.h"
#include "send.h"
#include "shard.h"

/* ------------------------------------------------------------------ */
/* Peers and parked pulls                                                */
/* ------------------------------------------------------------------ */

gift_peer_t *gift_shard_peer_open(gift_shard_t *s, void *ctx, uint64_t conn_id)
{
    gift_peer_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->ctx = ctx;
    p->id = conn_id;
    s->c.peers++;
    return p;
}

void gift__parked_unlink(gift_shard_t *s, parked_t *q)
{
    if (q->cprev)
        q->cprev->cnext = q->cnext;
    else
        q->ch->parked = q->cnext;
    if (q->cnext)
        q->cnext->cprev = q->cprev;
    if (q->pprev)
        q->pprev->pnext = q->pnext;
    else
        q->peer->parked = q->pnext;
    if (q->pnext)
        q->pnext->pprev = q->pprev;
    q->peer->nparked--;
    memset(q, 0, sizeof *q);
    q->pnext = s->free_parked;
    s->free_parked = q;
}

void gift_shard_peer_close(gift_shard_t *s, gift_peer_t *p)
{
    if (p == NULL)
        return;
    while (p->parked)
        gift__parked_unlink(s, p->parked);
    if (p->claimed && p->rank < s->by_rank_len && s->by_rank[p->rank] == p)
        s->by_rank[p->rank] = NULL;
    s->c.peers--;
    free(p);
}

/* Answers a pull that park refused: the connection's share or the pool. */
void gift__park_refused(gift_shard_t *s, gift_peer_t *p, const Gift__Pull *m)
{
    if (p->nparked >= gift__admit_park_cap(s))
        gift__send_error(s, p, GIFT_EBUSY, 0, m->key, m->chunk, m->step, m->seq,
                         "too many pulls waiting from this connection (%u; max_parked_per_peer %u)",
                         p->nparked, gift__admit_park_cap(s));
    else
        gift__send_error(s, p, GIFT_EBUSY, 0, m->key, m->chunk, m->step, m->seq,
                         "too many pulls waiting on this shard (max_parked %u)", s->o.max_parked);
}

/* p acts as its rank (any message but Hello and StatsRequest): its Hello's
 * world size must be the cluster's (a Hello before the world was known
 * could claim any), and it becomes the rank's one live connection. A
 * second connection for a connected rank is refused; with authentication
 * on, its handshake proved the rank's own key (gift_auth.h), so it is the
 * worker reconnecting and replaces the old connection, which is closed.
 * Returns 0, or a negative code after a fatal Error to p. */
int gift__claim_rank(gift_shard_t *s, gift_peer_t *p)
{
    gift_peer_t *q;
    if (p->claimed)
        return 0;
    if (s->world != 0 && p->world != s->world) {
        gift__send_error(s, p, GIFT_EWORLD, 1, 0, 0, 0, 0,
                         "world size %u, the cluster has %u (from %s)", p->world, s->world,
                         s->o.world_size ? "world_size" : "the first Declare");
        return GIFT_EWORLD;
    }
    if (p->rank >= s->by_rank_len) {
        uint32_t n = p->rank + 1 > 2 * s->by_rank_len ? p->rank + 1 : 2 * s->by_rank_len;
        gift_peer_t **nb = realloc(s->by_rank, (size_t)n * sizeof *nb);
        if (nb == NULL) {
            gift__send_error(s, p, GIFT_ENOMEM, 1, 0, 0, 0, 0, "out of memory for the rank table");
            return GIFT_ENOMEM;
        }
        memset(nb + s->by_rank_len, 0, (size_t)(n - s->by_rank_len) * sizeof *nb);
        s->by_rank = nb;
        s->by_rank_len = n;
    }
    q = s->by_rank[p->rank];
    if (q != NULL && q != p) {
        if (s->o.auth == NULL) {
            gift__send_error(
                s, p, GIFT_EBUSY, 1, 0, 0, 0, 0,
                "rank %u is already connected (connection %" PRIu64 "); one live "
                "connection per rank: it must close first (or set auth_key_file, so that "
                "a reconnect proves its rank and replaces it)",
                p->rank, q->id);
            return GIFT_EBUSY;
        }
        GIFT_LOG_WARN(p->id,
                      "rank %u reconnected and proved its key: closing its old "
                      "connection %" PRIu64,
                      p->rank, q->id);
        while (q->parked)
            gift__parked_unlink(s, q->parked);
        q->claimed = 0;
        gift__send_error(s, q, GIFT_ECLOSED, 1, 0, 0, 0, 0,
                         "replaced by connection %" PRIu64 ", which proved the key of rank %u",
                         p->id, p->rank);
    }
    s->by_rank[p->rank] = p;
    p->claimed = 1;
    return 0;
}

int gift__park(gift_shard_t *s, gift_peer_t *p, chunk_t *ch, uint64_t step, uint64_t seq,
               uint32_t have_epoch)
{
    parked_t *q = s->free_parked;
    if (q == NULL || p->nparked >= gift__admit_park_cap(s))
        return GIFT_EBUSY;
    s->free_parked = q->pnext;
    p->nparked++;
    memset(q, 0, sizeof *q);
    q->peer = p;
    q->ch = ch;
    q->step = step;
    q->seq = seq;
    q->have_epoch = have_epoch;
    q->cnext = ch->parked;
    if (ch->parked)
        ch->parked->cprev = q;
    ch->parked = q;
    q->pnext = p->parked;
    if (p->parked)
        p->parked->pprev = q;
    p->parked = q;
    return 0;
}

int gift_shard_peer_ready(const gift_peer_t *p)
{
    return p->hello;
}

int gift_shard_peer_claimed(const gift_peer_t *p)
{
    return p->claimed;
}

int gift_shard_peer_claim(gift_shard_t *s, gift_peer_t *p)
{
    if (p->closing)
        return GIFT_ECLOSED;
    if (!p->hello) {
        gift__send_error(s, p, s->o.auth ? GIFT_EAUTH : GIFT_EPROTO, 1, 0, 0, 0, 0,
                         "a frame with a payload before the Hello%s completed",
                         s->o.auth ? " and its authentication" : "");
        return s->o.auth ? GIFT_EAUTH : GIFT_EPROTO;
    }
    if (s->world == 0) {
        gift__send_error(s, p, GIFT_EPROTO, 1, 0, 0, 0, 0,
                         "a frame with a payload before any Declare on this shard");
        return GIFT_EPROTO;
    }
    return gift__claim_rank(s, p);
}
