/*
 * engine.c: what libgiftclient's I/O thread does, without sockets. Every
 * function here runs on the I/O thread; net.c calls in with frames,
 * connection events, the end of each loop turn and a periodic tick, and this
 * file reaches the network only through the client's gift__io_t table
 * (c->io->queue to send), which net.c fills and tests fake.
 *
 * Requests (one step of one member: push, pull or sketch) wait in their
 * member's FIFO until they can start, so a member's requests start in the
 * order they were made (a sketch before its step's push, a push before its
 * pull). A started request waits on the push or pull state of its wire
 * tensor for that step (two of each per tensor: step & 1):
 *
 *   push  IDLE -> ASSEMBLING (fused: until every member is in) -> SENT
 *         (chunks encoded a few per loop turn, each queued once encoded;
 *         one push per wire encodes at a time) -> ACKED (every PushAck). Its
 *         payloads are kept, with need_replay, until the pull of that step
 *         completes: a reconnect re-sends them (the shard acknowledges
 *         duplicates). A push of step t + 2 waits while they are needed.
 *   pull  IDLE -> PENDING (Pull per chunk) -> all chunks decoded, T^-1,
 *         copied out -> IDLE (or READY for a fused bucket, whose mean later
 *         members of the same step read).
 *
 * Every transition of both, failures included, and the function making it
 * are written down once, over enum gift__ps_state and enum gift__pl_state
 * (giftclient_internal.h); a change to one of them changes that comment.
 *
 * Geometry (docs/ARCHITECTURE.md): a geometry tensor's pushes and sketches
 * for step t need the epoch valid at t. After a sketch at step s, pushes of
 * later steps wait until chunk 0's reply for step s has said which epoch is
 * newest, and until that epoch has been fetched (GeometryRequest). Every
 * worker thus switches at the epoch's valid_from_step, and decodes each pull
 * with the epoch its reply names.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "giftclient_internal.h"

/* ------------------------------------------------------------------ */
/* Lists                                                                 */
/* ------------------------------------------------------------------ */

static void list_push(gift__list_t *l, gift__req_t *r)
{
    r->list = l;
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
}

static void list_push_front(gift__list_t *l, gift__req_t *r)
{
    r->list = l;
    r->prev = NULL;
    r->next = l->head;
    if (l->head)
        l->head->prev = r;
    else
        l->tail = r;
    l->head = r;
}

static void list_remove(gift__req_t *r)
{
    gift__list_t *l = r->list;
    if (l == NULL)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        l->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = NULL;
    r->list = NULL;
}

/* ------------------------------------------------------------------ */
/* Helpers                                                               */
/* ------------------------------------------------------------------ */

static gift__wire_t *wire_of(gift_client_t *c, const gift__req_t *r)
{
    return &c->wires[c->mem[r->id].wire];
}

/* The epoch valid for pushes of step t: the newest one valid from t or earlier. */
static gift__geo_t *geo_for_step(gift__wire_t *w, uint64_t t)
{
    gift__geo_t *best = NULL;
    for (int i = 0; i < GIFT__GEO_SLOTS; i++) {
        gift__geo_t *g = &w->geo[i];
        if (g->used && g->valid_from <= t && (best == NULL || g->g.epoch > best->g.epoch))
            best = g;
    }
    return best;
}

/* Whether the epoch for step t is known: no fetch outstanding and no sketch
 * of an earlier step whose outcome is still unknown. */
static int settled(const gift__wire_t *w, uint64_t t)
{
    return w->have_geo && !w->fetching && !(w->sk_pending && t > w->sk_step);
}

/* ------------------------------------------------------------------ */
/* Completion                                                            */
/* ------------------------------------------------------------------ */

/* pl's target is no longer to be written: no connection may go on
 * receiving a chunk into it (gift__eng_sink). */
static void unsink_pl(gift_client_t *c, const gift__wire_t *w, const gift__lstate_t *pl)
{
    if (c->io->unsink != NULL && pl->target != NULL)
        c->io->unsink(c, pl->target, pl->target + w->n);
}

/* Takes r out of whatever it waits on. A pull that was the decode target of
 * its (unfused) wire hands the pull over to the next request waiting on it,
 * restarted from scratch; with none left the pull is abandoned (late replies
 * are dropped). */
static void detach(gift_client_t *c, gift__req_t *r)
{
    gift__wire_t *w;
    gift__lstate_t *pl;
    if (r->list == NULL)
        return;
    w = wire_of(c, r);
    pl = &w->pl[r->step & 1];
    if (r->kind != GIFT__REQ_PULL || r->list != &pl->reqs || w->nmembers > 1 ||
        pl->target != r->out) {
        list_remove(r);
        return;
    }
    list_remove(r);
    if (pl->state != GIFT__PL_PENDING)
        return;
    unsink_pl(c, w, pl);
    if (pl->reqs.head == NULL) {
        pl->state = GIFT__PL_IDLE;
        return;
    }
    pl->target = pl->reqs.head->out;
    pl->ngot = 0;
    pl->err = 0;
    pl->epoch_set = 0;
    memset(pl->got, 0, w->nchunks);
    memset(pl->sent, 0, w->nchunks);
    w->path->pull_reset(w, pl);
    gift__send_pull_chunks(c, w, pl);
}

/* A failed op's push was sent from the caller's grad (ps->zc_user), which
 * the caller may reuse once the op completes: its chunks are copied into the
 * push's own payload, where a replay after a reconnect finds them, and the
 * connections still writing from grad are dropped (closing a libuv stream
 * cancels its pending writes; what reached a shard is a truncated frame,
 * which it discards). */
static void zc_release(gift_client_t *c, gift_op_t *op)
{
    for (int i = 0; i < op->nreq; i++) {
        gift__req_t *r = &op->req[i];
        gift__wire_t *w;
        gift__pstate_t *ps;
        if (r->kind != GIFT__REQ_PUSH)
            continue;
        w = wire_of(c, r);
        ps = &w->ps[r->step & 1];
        if (ps->zc == NULL || !ps->zc_user || ps->zc != r->in || ps->step != r->step)
            continue;
        for (uint32_t j = 0; j < ps->nenc; j++) {
            const gift__chunk_t *ch = gift__chunk_of(c, w, j);
            if (gift__zc_chunk(ps, ch)) {
                memcpy(ps->payload + ch->push_off, ps->zc + ch->off, (size_t)ch->n * 4u);
                GIFT__PASS(c, GIFT_PASS_COPY, ch->n);
            }
        }
        ps->zc = NULL;
        if (ps->inflight > 0)
            for (uint32_t j = 0; j < w->nchunks; j++)
                c->io->drop(c, gift__chunk_of(c, w, j)->shard);
    }
}

/* Finishes request r with rc. A failure fails the other half of a push_pull
 * too; the operation completes when both halves have finished. */
static void req_finish(gift_client_t *c, gift__req_t *r, int rc)
{
    gift_op_t *op;
    if (r->kind == GIFT__REQ_SKETCH) {
        if (!r->active)
            return;
        r->active = 0;
        detach(c, r);
        gift__cmd_done(c, r->cmd, rc);
        return;
    }
    op = r->op;
    if (!op->active[r - op->req])
        return;
    op->active[r - op->req] = 0;
    detach(c, r);
    if (rc < 0 && op->status == 0)
        op->status = rc;
    op->parts_left--;
    if (rc < 0)
        for (int i = 0; i < op->nreq; i++)
            if (op->active[i]) {
                op->active[i] = 0;
                detach(c, &op->req[i]);
                op->parts_left--;
            }
    if (op->parts_left == 0) {
        if (op->status < 0) {
            /* Failed from outside its device work (timeout, Error frame):
             * the GPU may still read grad or write out; wait for it. */
            gift__wire_t *w = wire_of(c, r);
            w->path->quiesce(c, w);
            zc_release(c, op);
        }
        if (op->prev)
            op->prev->next = op->next;
        else
            c->ops = op->next;
        if (op->next)
            op->next->prev = op->prev;
        op->prev = op->next = NULL;
        c->rescan = 1;
        gift__op_complete(c, op);
    }
}

static void finish_all(gift_client_t *c, gift__list_t *l, int rc)
{
    while (l->head != NULL)
        req_finish(c, l->head, rc);
}

static void fail_ps(gift_client_t *c, gift__pstate_t *ps, int rc)
{
    ps->state = GIFT__PS_IDLE;
    ps->need_replay = 0; /* ps->zc stays for zc_release: writes may still read grad */
    finish_all(c, &ps->reqs, rc);
    c->rescan = 1;
}

static void fail_pl(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl, int rc)
{
    unsink_pl(c, w, pl);
    pl->state = GIFT__PL_IDLE;
    finish_all(c, &pl->reqs, rc);
    c->rescan = 1;
}

/* ------------------------------------------------------------------ */
/* Push                                                                  */
/* ------------------------------------------------------------------ */

static int eng_push_gone(gift__pstate_t *ps)
{
    if (ps->state == GIFT__PS_SENT && ps->reqs.head != NULL)
        return 0;
    /* Failed, or every request gone (timed out): the source may be gone. */
    if (ps->state == GIFT__PS_SENT) {
        ps->state = GIFT__PS_IDLE;
        ps->need_replay = 0;
    }
    return 1;
}

/* ps's step starts sending under epoch: nothing encoded, acked or sent yet;
 * encp is what the chunks are encoded from (NULL on a device wire). */
static void eng_push_begin(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, uint32_t epoch,
                           const float *encp)
{
    if (w->pushed_once && epoch != w->last_epoch)
        GIFT__STAT_ADD(c, epochs_switched, 1);
    w->last_epoch = epoch;
    w->pushed_once = 1;
    ps->state = GIFT__PS_SENT;
    ps->epoch = epoch;
    ps->need_replay = 1;
    ps->nacked = 0;
    ps->nenc = 0;
    ps->encp = encp;
    memset(ps->acked, 0, w->nchunks);
    memset(ps->sent, 0, w->nchunks);
    w->encoding = ps;
}

/* Starts ps's push of src under the epoch valid for its step, on the wire's
 * path: the host's (host_push), or a device's, which reports each chunk
 * once its payload is in host memory (eng_push_chunk_ready). */
static void encode_send(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src)
{
    gift__geo_t *G = NULL;
    int rc;

    if (w->geometry && (G = geo_for_step(w, ps->step)) == NULL) {
        fail_ps(c, ps, GIFT_EEPOCH);
        return;
    }
    if ((rc = w->path->push(c, w, ps, src, G, G != NULL ? G->g.epoch : 0)) < 0)
        fail_ps(c, ps, rc);
}

/* Whether ps, holding step t - 2 (or older), must keep its slot for that
 * step (a request of a later step then waits): it is still assembling or
 * sending, a frame of it is being written, or the pending pull pl of that
 * step may still need its payloads for a replay. */
static int slot_held(const gift__pstate_t *ps, const gift__lstate_t *pl)
{
    switch (ps->state) {
    case GIFT__PS_ASSEMBLING:
    case GIFT__PS_SENT:
        return 1;
    case GIFT__PS_IDLE:
    case GIFT__PS_ACKED:
        break;
    }
    if (ps->inflight > 0)
        return 1;
    return ps->need_replay && pl->state == GIFT__PL_PENDING && pl->step == ps->step;
}

/* Starts a push request, or returns 0 when it must wait. */
static int try_push(gift_client_t *c, gift__req_t *r)
{
    gift__member_t *m = &c->mem[r->id];
    gift__wire_t *w = &c->wires[m->wire];
    gift__pstate_t *ps = &w->ps[r->step & 1];
    int fused = w->nmembers > 1;

    if (w->sk_err) {
        int rc = w->sk_err;
        w->sk_err = 0;
        req_finish(c, r, rc);
        return 1;
    }
    if (w->geometry && !settled(w, r->step))
        return 0;
    if (w->encoding != NULL) /* one push of a wire encodes at a time (scratch, residual) */
        return 0;
    if (ps->state != GIFT__PS_IDLE) {
        if (ps->step == r->step) {
            if (fused && ps->state == GIFT__PS_ASSEMBLING && !ps->pushed[m->index])
                goto add;
            req_finish(c, r, GIFT_EINVAL); /* this step was pushed already */
            return 1;
        }
        if (ps->step > r->step) {
            req_finish(c, r, GIFT_ESTEP);
            return 1;
        }
        if (slot_held(ps, &w->pl[r->step & 1]))
            return 0;
    }
    if (ps->inflight > 0) /* a failed push's chunks still being written from payload */
        return 0;
    /* The caller's grad may be sent from where it is when this op keeps it
     * unchanged until the step's pull completes (gift__pstate_t.zc). */
    ps->zc_ok = !fused && r->op != NULL && r->op->nreq == 2 &&
                r->op->req[1].kind == GIFT__REQ_PULL && r->op->req[1].step == r->step &&
                ((uintptr_t)(r->op->req[1].out + w->n) <= (uintptr_t)r->in ||
                 (uintptr_t)(r->in + w->n) <= (uintptr_t)r->op->req[1].out);
    ps->state = GIFT__PS_ASSEMBLING;
    ps->step = r->step;
    ps->need_replay = 0;
    ps->npushed = 0;
    memset(ps->sent, 0, w->nchunks);
    memset(ps->acked, 0, w->nchunks);
    if (fused)
        memset(ps->pushed, 0, w->nmembers);
add:
    list_push(&ps->reqs, r);
    if (!fused) {
        encode_send(c, w, ps, r->in);
        return 1;
    }
    memcpy(ps->asmb + m->off, r->in, m->n * sizeof(float));
    GIFT__PASS(c, GIFT_PASS_COPY, m->n);
    ps->pushed[m->index] = 1;
    if (++ps->npushed == w->nmembers)
        encode_send(c, w, ps, ps->asmb);
    return 1;
}

/* ------------------------------------------------------------------ */
/* Pull                                                                  */
/* ------------------------------------------------------------------ */

static int try_pull(gift_client_t *c, gift__req_t *r)
{
    gift__member_t *m = &c->mem[r->id];
    gift__wire_t *w = &c->wires[m->wire];
    gift__lstate_t *pl = &w->pl[r->step & 1];
    int fused = w->nmembers > 1;

    if (pl->state == GIFT__PL_PENDING) {
        if (pl->step != r->step)
            return 0;
        list_push(&pl->reqs, r);
        return 1;
    }
    if (fused && pl->state == GIFT__PL_READY && pl->step == r->step) {
        memcpy(r->out, pl->mean + m->off, m->n * sizeof(float));
        GIFT__PASS(c, GIFT_PASS_COPY, m->n);
        req_finish(c, r, 0);
        return 1;
    }
    pl->state = GIFT__PL_PENDING;
    pl->step = r->step;
    pl->ngot = 0;
    pl->err = 0;
    pl->epoch_set = 0;
    memset(pl->got, 0, w->nchunks);
    memset(pl->sent, 0, w->nchunks);
    pl->target = fused ? pl->mean : r->out;
    w->path->pull_reset(w, pl);
    list_push(&pl->reqs, r);
    gift__send_pull_chunks(c, w, pl);
    return 1;
}

/* Every chunk of pl has arrived: T^-1, copy out, complete. */
static void pull_complete(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl)
{
    gift__pstate_t *ps = &w->ps[pl->step & 1];
    int rc = pl->err, rc1 = 0, fused = w->nmembers > 1;

    if (rc == 0)
        rc = w->path->finish(c, w, pl);
    if (ps->state != GIFT__PS_IDLE && ps->step == pl->step) {
        ps->need_replay = 0;
        ps->zc = NULL; /* nothing is replayed from it any more */
    }
    pl->state = (rc == 0 && fused) ? GIFT__PL_READY : GIFT__PL_IDLE;
    while (pl->reqs.head != NULL) {
        gift__req_t *r = pl->reqs.head;
        const gift__member_t *m = &c->mem[r->id];
        list_remove(r);
        if (rc == 0) {
            if (fused) {
                memcpy(r->out, pl->mean + m->off, m->n * sizeof(float));
                GIFT__PASS(c, GIFT_PASS_COPY, m->n);
            } else if (r->out != pl->target) {
                rc1 = w->path->copy(w, r->out, pl->target, w->n);
                if (w->path->is_host)
                    GIFT__PASS(c, GIFT_PASS_COPY, w->n);
            }
        }
        req_finish(c, r, rc < 0 ? rc : rc1);
        rc1 = 0;
    }
    c->rescan = 1;
}

/* ------------------------------------------------------------------ */
/* Sketch                                                                */
/* ------------------------------------------------------------------ */

static int try_sketch(gift_client_t *c, gift__req_t *r)
{
    gift__wire_t *w = wire_of(c, r);
    gift__pstate_t *ps = &w->ps[r->step & 1];
    gift__geo_t *G;
    int rc;

    if (!settled(w, r->step) || w->sk_inflight > 0)
        return 0;
    if (ps->state != GIFT__PS_IDLE && ps->step >= r->step) {
        /* The step's push went first: the sketch would arrive after it. */
        req_finish(c, r, GIFT_EINVAL);
        return 1;
    }
    if ((G = gift__geo_by_epoch(w, w->newest)) == NULL) {
        req_finish(c, r, GIFT_EEPOCH);
        return 1;
    }
    if ((rc = w->path->sketch(c, w, r, G)) == 1)
        return 0; /* a device busy with a push or a pull: after it */
    if (rc < 0) {
        req_finish(c, r, rc);
        return 1;
    }
    w->sk_epoch = w->newest;
    w->sk_step = r->step;
    w->sk_pending = 1;
    w->sk_unsent = 1;
    gift__send_sketch(c, w);
    req_finish(c, r, 0);
    return 1;
}

/* ------------------------------------------------------------------ */
/* Member queues                                                         */
/* ------------------------------------------------------------------ */

/* Starts the requests at the head of m's queue while they can start. */
static void fifo_run(gift_client_t *c, gift__member_t *m)
{
    gift__req_t *r;
    while ((r = m->fifo.head) != NULL) {
        int ok;
        list_remove(r);
        switch (r->kind) {
        case GIFT__REQ_PUSH:
            ok = try_push(c, r);
            break;
        case GIFT__REQ_PULL:
            ok = try_pull(c, r);
            break;
        default:
            ok = try_sketch(c, r);
            break;
        }
        if (!ok) {
            list_push_front(&m->fifo, r);
            return;
        }
    }
}

static void rescan(gift_client_t *c)
{
    if (!c->io_declared) /* the caller may still be building the list */
        return;
    for (int round = 0; round < 8 && c->rescan; round++) {
        c->rescan = 0;
        for (size_t i = 0; i < c->nmem; i++)
            if (c->mem[i].fifo.head != NULL)
                fifo_run(c, &c->mem[i]);
    }
}

/* ------------------------------------------------------------------ */
/* Commands                                                              */
/* ------------------------------------------------------------------ */

/* Closing: once no operation is in flight, fail what waits and stop. */
static void check_close(gift_client_t *c)
{
    gift__cmd_t *cmd;
    if (!c->closing || c->cmd_close == NULL || c->ops != NULL)
        return;
    for (size_t i = 0; c->io_declared && i < c->nmem; i++)
        while (c->mem[i].fifo.head != NULL)
            req_finish(c, c->mem[i].fifo.head, GIFT_ECLOSED);
    if (c->cmd_connect) {
        cmd = c->cmd_connect;
        c->cmd_connect = NULL;
        gift__cmd_done(c, cmd, GIFT_ECLOSED);
    }
    if (c->cmd_declare) {
        cmd = c->cmd_declare;
        c->cmd_declare = NULL;
        gift__cmd_done(c, cmd, GIFT_ECLOSED);
    }
    cmd = c->cmd_close;
    c->cmd_close = NULL;
    c->dev->close(c); /* no host function may wake the loop once it stops */
    c->io->shutdown(c);
    gift__cmd_done(c, cmd, 0);
}

static const gift__eng_ops_t eng_ops; /* below, with the entries it holds */

void gift__eng_commands(gift_client_t *c)
{
    gift__cmd_t *cmd, *next;
    if (c->gpu != NULL) /* a host function of a device job may have woken us */
        c->dev->poll(c);
    cmd = gift__take_commands(c);
    for (; cmd != NULL; cmd = next) {
        next = cmd->next;
        switch (cmd->kind) {
        case GIFT__CMD_OP: {
            gift_op_t *op = cmd->op;
            gift__member_t *m = &c->mem[op->req[0].id];
            op->prev = NULL;
            op->next = c->ops;
            if (c->ops)
                c->ops->prev = op;
            c->ops = op;
            for (int i = 0; i < op->nreq; i++) {
                op->active[i] = 1;
                list_push(&m->fifo, &op->req[i]);
            }
            if (c->closing || c->lost) {
                req_finish(c, &op->req[0], c->closing ? GIFT_ECLOSED : c->lost);
                break;
            }
            fifo_run(c, m);
            break;
        }
        case GIFT__CMD_SKETCH: {
            gift__member_t *m = &c->mem[cmd->req.id];
            if (c->closing || c->lost) {
                gift__cmd_done(c, cmd, c->closing ? GIFT_ECLOSED : c->lost);
                break;
            }
            cmd->req.active = 1;
            list_push(&m->fifo, &cmd->req);
            fifo_run(c, m);
            break;
        }
        case GIFT__CMD_CONNECT:
            c->cmd_connect = cmd;
            c->io->connect(c);
            break;
        case GIFT__CMD_DECLARE: {
            int rc;
            c->eng = &eng_ops; /* the paths' way back, before any of them runs */
            for (size_t i = 0; i < c->nwires; i++)
                c->wires[i].path = &gift__host_path; /* a device wire's: c->dev->declare */
            rc = c->dev->declare(c);
            if (rc == 0)
                rc = gift__host_declare(c); /* the codec threads' jobs of host wires */
            if (rc < 0) {
                gift__cmd_done(c, cmd, rc);
                break;
            }
            c->io_declared = 1;
            c->cmd_declare = cmd;
            c->geo_err = 0;
            for (size_t i = 0; i < c->nwires; i++)
                if (c->wires[i].geometry) {
                    c->wires[i].fetching = 1;
                    c->wires[i].fetch_sent = 0;
                }
            for (uint32_t s = 0; s < c->nshards; s++)
                if (c->conns[s].state == GIFT__CONN_READY)
                    gift__send_declare(c, s);
            gift__conn_check_cmds(c);
            break;
        }
        case GIFT__CMD_CLOSE:
            c->closing = 1;
            c->cmd_close = cmd;
            check_close(c);
            break;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Frames                                                                */
/* ------------------------------------------------------------------ */

static gift__wire_t *wire_key(gift_client_t *c, uint32_t key)
{
    return c->io_declared && key < c->nwires ? &c->wires[key] : NULL;
}

/* on_push_ack: a shard counted one chunk of a push.
 *   Reads:    a (the reader's, until this returns); the chunk must be the
 *             shard's and its push SENT for a->step (else it is late: ignored).
 *   Owns:     ps->acked, nacked and, at the last chunk, ps->state (ACKED);
 *             sets c->rescan.
 *   May call: finish_all (the push's requests complete: gift__op_complete).
 *   Never fails the connection. */
static void on_push_ack(gift_client_t *c, uint32_t shard, const Gift__PushAck *a)
{
    gift__wire_t *w = wire_key(c, a->key);
    gift__pstate_t *ps;
    if (w == NULL || a->chunk >= w->nchunks || gift__chunk_of(c, w, a->chunk)->shard != shard)
        return;
    ps = &w->ps[a->step & 1];
    if (ps->state != GIFT__PS_SENT || ps->step != a->step || ps->acked[a->chunk])
        return;
    ps->acked[a->chunk] = 1;
    if (++ps->nacked == w->nchunks) {
        ps->state = GIFT__PS_ACKED;
        finish_all(c, &ps->reqs, 0);
        c->rescan = 1;
    }
}

/* A PullReply whose header is in and whose payload is not (net.c): where
 * its payload can be received directly, or NULL. Reads f's header and the
 * pull's state, owns nothing, changes nothing and calls no other file. Only an f32 chunk of a
 * host wire whose pull waits for exactly that chunk, codec and length: the
 * payload is then the chunk's elements, and host_decode only checks them
 * where they landed. Everything is checked again when the frame is whole
 * (on_pull_reply); a reply refused then leaves the chunk's part of the
 * target unspecified, and the pull fails or asks again. */
void *gift__eng_sink(gift_client_t *c, uint32_t shard, const gift_frame_t *f)
{
    const Gift__PullReply *m =
        f->env->msg_case == GIFT__ENVELOPE__MSG_PULL_REPLY ? f->env->pull_reply : NULL;
    gift__wire_t *w;
    gift__lstate_t *pl;
    const gift__chunk_t *ch;

    if (m == NULL || (w = wire_key(c, m->key)) == NULL || !w->path->is_host ||
        m->chunk >= w->nchunks)
        return NULL;
    ch = gift__chunk_of(c, w, m->chunk);
    pl = &w->pl[m->step & 1];
    if (ch->shard != shard || pl->state != GIFT__PL_PENDING || pl->step != m->step ||
        pl->got[m->chunk] || pl->target == NULL ||
        (w->geometry && pl->epoch_set && m->epoch != pl->epoch))
        return NULL;
    if (gift__pull_codec(w, m->epoch)->fmt != GIFT_FMT_F32 || m->codec == NULL ||
        (int)m->codec->format != (int)GIFT_FMT_F32 || f->payload_len != (uint64_t)ch->n * 4u ||
        gift__pull_len(w, m->epoch, ch) != f->payload_len)
        return NULL;
    return pl->target + ch->off;
}

/* on_pull_reply: one chunk of a pull (the payload whole: f->payload).
 *   Reads:    m and f (the reader's, until this returns: a path that needs
 *             the payload later copies it); chunk 0's latest_epoch and step.
 *   Owns:     the geometry fetch flags and sk_pending of w; the pull's
 *             epoch, err, got and ngot; the shard's resume step.
 *   May call: gift__send_geo_request (frames.c), the wire's path: decode,
 *             then chunk_done (which completes the pull through c->eng once
 *             its last chunk is in). A late or foreign reply is dropped.
 *   Never fails the connection: a bad chunk fails the pull (pl->err). */
static void on_pull_reply(gift_client_t *c, uint32_t shard, const Gift__PullReply *m,
                          const gift_frame_t *f)
{
    gift__wire_t *w = wire_key(c, m->key);
    gift__lstate_t *pl;
    gift__chunk_t *ch;
    int rc;

    if (w == NULL || m->chunk >= w->nchunks)
        return;
    ch = gift__chunk_of(c, w, m->chunk);
    if (ch->shard != shard)
        return;
    if (w->geometry && m->chunk == 0) {
        /* Chunk 0's reply names the newest epoch: fetch it if it is new. The
         * sketch round of sk_step is decided once its step has finished. */
        if (m->latest_epoch > w->newest && !w->fetching) {
            w->fetching = 1;
            w->fetch_sent = 0;
            gift__send_geo_request(c, w);
        }
        if (w->sk_pending && m->step >= w->sk_step) {
            w->sk_pending = 0;
            c->rescan = 1;
        }
    }
    pl = &w->pl[m->step & 1];
    if (pl->state != GIFT__PL_PENDING || pl->step != m->step || pl->got[m->chunk])
        return; /* late: the pull was abandoned or answered already */
    if (m->step < UINT64_MAX && m->step + 1 > c->conns[shard].resume)
        c->conns[shard].resume = m->step + 1; /* the shard finished that step */
    if (w->geometry && pl->epoch_set && m->epoch != pl->epoch) {
        rc = GIFT_EEPOCH;
    } else {
        pl->epoch = m->epoch; /* its decision's pull codec (host.c) decodes it */
        pl->epoch_set = 1;
        if (f->payload_len != gift__pull_len(w, m->epoch, ch) || m->codec == NULL ||
            (int)m->codec->format != (int)gift__pull_codec(w, m->epoch)->fmt)
            rc = GIFT_ESHAPE;
        else
            rc = w->path->decode(c, w, pl, ch, f->payload, (size_t)f->payload_len);
    }
    if (rc < 0 && pl->err == 0)
        pl->err = rc;
    pl->got[m->chunk] = 1;
    pl->ngot++;
    w->path->chunk_done(c, w, pl, ch, rc == 0 ? f->payload : NULL, (size_t)f->payload_len);
}

/* on_geometry: an epoch of a geometry tensor (basis and spectrum as the
 * payload, the owner's decision in m), answering our GeometryRequest.
 *   Reads:    m and f (the reader's: the payload is copied into a slot).
 *   Owns:     w->geo[] (a free slot or the oldest epoch's), newest,
 *             have_geo, fetching, fetch_sent; c->geo_err during declare;
 *             sets c->rescan (pushes waiting on the epoch retry).
 *   May call: the path's quiesce (a codec thread's job still reads the slot),
 *             gift__geo_load (host.c: the decision, checked),
 *             gift__conn_check_cmds (CMD_DECLARE waits for first epochs).
 *   Never fails the connection: a bad epoch fails the declare or is left. */
static void on_geometry(gift_client_t *c, const Gift__Geometry *m, const gift_frame_t *f)
{
    gift__wire_t *w = wire_key(c, m->key);
    gift__geo_t *slot = NULL;
    size_t dks;
    int rc;

    if (w == NULL || !w->geometry)
        return;
    dks = (size_t)w->cols * w->ks;
    w->fetching = 0;
    w->fetch_sent = 0;
    c->rescan = 1;
    if (m->din != w->cols || m->rank != w->k || m->basis_cols != w->ks ||
        f->payload_len != (dks + w->ks) * sizeof(float)) {
        if (c->cmd_declare)
            c->geo_err = GIFT_ESHAPE;
        gift__conn_check_cmds(c);
        return;
    }
    if (gift__geo_by_epoch(w, m->epoch) != NULL) {
        gift__conn_check_cmds(c);
        return;
    }
    /* Replace a free slot, else the oldest epoch. */
    for (int i = 0; i < GIFT__GEO_SLOTS; i++)
        if (!w->geo[i].used) {
            slot = &w->geo[i];
            break;
        }
    if (slot == NULL) {
        slot = &w->geo[0];
        for (int i = 1; i < GIFT__GEO_SLOTS; i++)
            if (w->geo[i].g.epoch < slot->g.epoch)
                slot = &w->geo[i];
    }
    if (slot->pinned) /* a codec thread's job still reads it (host.c) */
        w->path->quiesce(c, w);
    /* The payload need not be aligned: copy it into the slot, then load in place. */
    slot->used = 0;
    memcpy(slot->g.U, f->payload, dks * sizeof(float));
    memcpy(slot->g.lambda, f->payload + dks * sizeof(float), w->ks * sizeof(float));
    rc = gift__geo_load(c, w, slot, m); /* its decision too (host.c) */
    if (rc < 0) {
        if (c->cmd_declare)
            c->geo_err = rc;
        gift__conn_check_cmds(c);
        return;
    }
    slot->valid_from = m->valid_from_step;
    slot->used = 1;
    slot->gen++;
    if (!w->have_geo || m->epoch > w->newest)
        w->newest = m->epoch;
    w->have_geo = 1;
    gift__conn_check_cmds(c);
}

/* A shard lost the run's state: what is in flight fails with code, and so
 * does every later operation (gift__eng_commands). */
static void fail_everything(gift_client_t *c, int code)
{
    c->lost = code;
    while (c->ops != NULL) {
        gift_op_t *op = c->ops;
        for (int i = 0; i < op->nreq; i++)
            if (op->active[i]) {
                req_finish(c, &op->req[i], code); /* fails the other half and unlinks op */
                break;
            }
        if (c->ops == op) /* nothing was active: cannot happen, but never spin */
            break;
    }
    for (size_t i = 0; c->io_declared && i < c->nmem; i++)
        for (gift__req_t *r = c->mem[i].fifo.head, *rn; r != NULL; r = rn) {
            rn = r->next;
            if (r->kind == GIFT__REQ_SKETCH) /* the others belong to the ops above */
                req_finish(c, r, code);
        }
}

/* on_error: a shard's Error. seq 0: about the connection (Hello or
 * Declare refused, or fatal); else seq's top byte names the request kind.
 *   Reads:    e (the reader's, until this returns), the connection's state.
 *   Owns:     cn->err (a refused handshake); the push or pull state of
 *             e->step (failed: IDLE); w->sk_err and the sketch flags;
 *             the geometry fetch flags and c->geo_err; c->lost (GIFT_ESTATE).
 *   May call: gift__client_note and gift__note_refusal (notes.c), fail_ps,
 *             fail_pl and fail_everything (requests complete with the
 *             code), gift__conn_check_cmds (a waiting command fails).
 *   Never fails the connection itself: the shard closes it if it must. */
static void on_error(gift_client_t *c, uint32_t shard, const Gift__Error *e)
{
    int kind = (int)(e->seq >> 56), code = e->code < 0 ? e->code : GIFT_EIO;
    gift__conn_t *cn = &c->conns[shard];
    gift__wire_t *w = wire_key(c, e->key);
    char a[64];

    if (e->seq == 0) {
        /* About the connection: Hello or Declare refused, or a fatal error. */
        if (cn->state == GIFT__CONN_HELLO || cn->state == GIFT__CONN_DECLARING) {
            gift__client_note(c, "shard %u (%s) refused the %s: %s (%s)", shard,
                              gift__shard_addr(c, shard, a, sizeof a),
                              cn->state == GIFT__CONN_HELLO ? "Hello" : "Declare",
                              e->text ? e->text : "", gift_strerror(code));
            cn->err = code;
            gift__conn_check_cmds(c);
        } else {
            gift__client_note(c, "shard %u (%s): %s (%s)", shard,
                              gift__shard_addr(c, shard, a, sizeof a), e->text ? e->text : "",
                              gift_strerror(code));
        }
        if (code == GIFT_ESTATE) /* no later step can be exact: fail now, not at the timeout */
            fail_everything(c, code);
        return;
    }
    if (w == NULL)
        return;
    switch (kind) {
    case GIFT__SEQ_PUSH: {
        gift__pstate_t *ps = &w->ps[e->step & 1];
        if (ps->step == e->step && gift__ps_has_payload(ps)) {
            gift__note_refusal(c, shard, "push", e, code);
            fail_ps(c, ps, code);
        }
        break;
    }
    case GIFT__SEQ_PULL: {
        gift__lstate_t *pl = &w->pl[e->step & 1];
        if (pl->step == e->step && pl->state == GIFT__PL_PENDING) {
            gift__note_refusal(c, shard, "pull", e, code);
            fail_pl(c, w, pl, code);
        }
        break;
    }
    case GIFT__SEQ_SKETCH:
        w->sk_err = code;
        w->sk_pending = 0;
        w->sk_unsent = 0;
        c->rescan = 1;
        break;
    case GIFT__SEQ_GEO:
        w->fetching = 0;
        w->fetch_sent = 0;
        if (c->cmd_declare)
            c->geo_err = code;
        gift__conn_check_cmds(c);
        c->rescan = 1;
        break;
    default:
        break;
    }
}

/* net.c: one whole frame from shard. Checks that only PullReply and
 * Geometry carry a payload and that a connection in HELLO hears only its
 * handshake, then hands the frame to its handler: the handshake's to conn.c
 * (gift__conn_on_*), the rest to the on_* above. f and its envelope are
 * the reader's until this returns. 0, or a negative code: net.c drops the
 * connection. */
int gift__eng_frame(gift_client_t *c, uint32_t shard, const gift_frame_t *f)
{
    const Gift__Envelope *env = f->env;
    gift__conn_t *cn = &c->conns[shard];

    if (env->msg_case != GIFT__ENVELOPE__MSG_PULL_REPLY &&
        env->msg_case != GIFT__ENVELOPE__MSG_GEOMETRY && f->payload_len != 0)
        return GIFT_EPROTO;
    if (cn->state == GIFT__CONN_HELLO && env->msg_case != GIFT__ENVELOPE__MSG_HELLO_ACK &&
        env->msg_case != GIFT__ENVELOPE__MSG_AUTH_CHALLENGE &&
        env->msg_case != GIFT__ENVELOPE__MSG_ERROR)
        return GIFT_EPROTO;
    switch (env->msg_case) {
    case GIFT__ENVELOPE__MSG_AUTH_CHALLENGE:
        return gift__conn_on_auth_challenge(c, shard, env->auth_challenge);
    case GIFT__ENVELOPE__MSG_HELLO_ACK:
        return gift__conn_on_hello_ack(c, shard, env->hello_ack);
    case GIFT__ENVELOPE__MSG_DECLARE_ACK:
        return gift__conn_on_declare_ack(c, shard);
    case GIFT__ENVELOPE__MSG_PUSH_ACK:
        on_push_ack(c, shard, env->push_ack);
        return 0;
    case GIFT__ENVELOPE__MSG_PULL_REPLY:
        on_pull_reply(c, shard, env->pull_reply, f);
        return 0;
    case GIFT__ENVELOPE__MSG_SKETCH_ACK:
    case GIFT__ENVELOPE__MSG_STATS:
        return 0;
    case GIFT__ENVELOPE__MSG_GEOMETRY:
        on_geometry(c, env->geometry, f);
        return 0;
    case GIFT__ENVELOPE__MSG_ERROR:
        on_error(c, shard, env->error);
        return 0;
    default:
        return GIFT_EPROTO;
    }
}

/* ------------------------------------------------------------------ */
/* Time                                                                  */
/* ------------------------------------------------------------------ */

void gift__eng_tick(gift_client_t *c)
{
    uint64_t now = c->io->now_ns();
    gift_op_t *op;
    int noted = 0;

    if (c->gpu != NULL) /* device reports, should a wake-up have been missed */
        c->dev->poll(c);
    /* Each pass completes (and unlinks) one expired operation. */
    for (;;) {
        for (op = c->ops; op != NULL && now < op->deadline_ns; op = op->next)
            ;
        if (op == NULL)
            break;
        if (!noted++)
            gift__note_timeout(c);
        for (int i = 0; i < op->nreq; i++)
            if (op->active[i]) {
                req_finish(c, &op->req[i], GIFT_ETIMEDOUT); /* fails the other half too */
                break;
            }
    }
    for (size_t i = 0; c->io_declared && i < c->nmem; i++)
        for (gift__req_t *r = c->mem[i].fifo.head, *rn; r != NULL; r = rn) {
            rn = r->next;
            if (r->kind == GIFT__REQ_SKETCH && now >= r->cmd->deadline_ns)
                req_finish(c, r, GIFT_ETIMEDOUT);
        }
    if (c->cmd_connect && now >= c->cmd_connect->deadline_ns) {
        gift__cmd_t *cmd = c->cmd_connect;
        int err = 0;
        c->cmd_connect = NULL;
        for (uint32_t s = 0; s < c->nshards && !err; s++)
            err = c->conns[s].err;
        if (!err)
            gift__note_unreached(c);
        gift__cmd_done(c, cmd, err ? err : GIFT_ETIMEDOUT);
    }
    if (c->cmd_declare && now >= c->cmd_declare->deadline_ns) {
        gift__cmd_t *cmd = c->cmd_declare;
        c->cmd_declare = NULL;
        gift__cmd_done(c, cmd, GIFT_ETIMEDOUT);
    }
    rescan(c);
    check_close(c);
}

void gift__eng_turn_end(gift_client_t *c)
{
    rescan(c);
    check_close(c);
}

/* ------------------------------------------------------------------ */
/* The memory paths' reports (host.c, device.c, through c->eng)         */
/* ------------------------------------------------------------------ */

static void eng_push_chunk_ready(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, uint32_t j)
{
    gift__chunk_t *ch = gift__chunk_of(c, w, j);
    gift__lstate_t *pl = &w->pl[ps->step & 1];
    if (ps->state != GIFT__PS_SENT)
        return;
    if (ps->reqs.head == NULL) { /* every request gone (timed out): stop sending */
        ps->state = GIFT__PS_IDLE;
        ps->need_replay = 0;
        c->rescan = 1;
        return;
    }
    if (j + 1 > ps->nenc)
        ps->nenc = j + 1;
    if (gift__ready(c, ch->shard) && !ps->sent[j] && gift__send_push(c, w, ps, ch) == 0)
        ps->sent[j] = 1;
    if (pl->state == GIFT__PL_PENDING && pl->step == ps->step)
        gift__send_pull_chunks(c, w, pl);
}

static void eng_push_fail(gift_client_t *c, gift__pstate_t *ps, int rc)
{
    if (ps->state == GIFT__PS_SENT)
        fail_ps(c, ps, rc);
}

static void eng_push_encoded(gift_client_t *c, gift__wire_t *w)
{
    w->encoding = NULL;
    c->rescan = 1;
}

static void eng_pull_done(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl)
{
    if (pl->state == GIFT__PL_PENDING)
        pull_complete(c, w, pl);
}

/* The engine as the memory paths see it (c->eng, set at CMD_DECLARE). */
static const gift__eng_ops_t eng_ops = {
    .push_begin = eng_push_begin,
    .push_chunk_ready = eng_push_chunk_ready,
    .push_fail = eng_push_fail,
    .push_encoded = eng_push_encoded,
    .pull_done = eng_pull_done,
    .push_gone = eng_push_gone,
};

/* ------------------------------------------------------------------ */
/* Teardown                                                              */
/* ------------------------------------------------------------------ */

void gift__eng_free_wires(gift_client_t *c)
{
    c->dev->free(c); /* device buffers and pinned payloads first */
    if (c->wires == NULL)
        return;
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        for (int j = 0; j < 2; j++) {
            free(w->ps[j].payload);
            free(w->ps[j].acked);
            free(w->ps[j].sent);
            free(w->ps[j].pushed);
            free(w->ps[j].asmb);
            free(w->pl[j].got);
            free(w->pl[j].sent);
            free(w->pl[j].mean);
        }
        free(w->p);
        free(w->work);
        free(w->pwork);
        free(w->hjob);
        free(w->Y);
        free(w->skw);
        gift_ef_free(&w->ef);
        gift_hadamard_free(&w->hd);
        for (int s = 0; s < GIFT__GEO_SLOTS; s++)
            gift_geometry_free(&w->geo[s].g);
        free(w->members);
        free(w->name);
    }
    free(c->wires);
    c->wires = NULL;
}
