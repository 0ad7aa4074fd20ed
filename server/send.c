/*
 * send.c: the frames a shard sends (send.h): packing a header into the
 * shard's head buffer, handing it to io->send with its payload, and the
 * counters of what went out. Reads the store; changes nothing in it.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "owner.h"
#include "policy_owner.h"
#include "send.h"

void gift__count_error(gift_shard_t *s, int code)
{
    int i = -code;
    if (i >= 0 && i < 32)
        s->c.errors[i]++;
}

int gift__send_frame(gift_shard_t *s, gift_peer_t *p, Gift__Envelope *env, gift_rbuf_t *buf,
                     size_t off, size_t len)
{
    uint8_t *head = s->head;
    size_t need = gift_frame_head_size(env);
    long n;
    int rc;
    if (need > sizeof s->head && (head = malloc(need)) == NULL)
        return GIFT_ENOMEM;
    if ((n = gift_frame_pack_head(env, len, head, need)) < 0) {
        rc = (int)n;
        goto out;
    }
    rc = s->io.send(p->ctx, head, (size_t)n, buf, off, len);
    if (rc == 0) {
        s->c.frames_out++;
        s->c.bytes_out += (uint64_t)n + len;
    }
out:
    if (head != s->head)
        free(head);
    return rc;
}

void gift__send_verror(gift_shard_t *s, gift_peer_t *p, int code, int fatal, uint32_t key,
                       uint32_t chunk, uint64_t step, uint64_t seq, const char *fmt, va_list ap)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Error e = GIFT__ERROR__INIT;
    char text[512];

    vsnprintf(text, sizeof text, fmt, ap);
    gift__count_error(s, code);
    e.code = code;
    e.text = text;
    e.key = key;
    e.chunk = chunk;
    e.step = step;
    e.seq = seq;
    e.fatal = fatal != 0;
    env.msg_case = GIFT__ENVELOPE__MSG_ERROR;
    env.error = &e;
    gift_log(fatal ? GIFT_LOG_LEVEL_WARN : GIFT_LOG_LEVEL_INFO, p->id,
             "error %d (%s) to rank %u: %s%s", code, gift_strerror(code), p->rank, text,
             fatal ? "; closing" : "");
    (void)gift__send_frame(s, p, &env, NULL, 0, 0);
    if (fatal && !p->closing) {
        p->closing = 1;
        s->io.close(p->ctx);
    }
}

void gift__send_error(gift_shard_t *s, gift_peer_t *p, int code, int fatal, uint32_t key,
                      uint32_t chunk, uint64_t step, uint64_t seq, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gift__send_verror(s, p, code, fatal, key, chunk, step, seq, fmt, ap);
    va_end(ap);
}

void gift__send_reply(gift_shard_t *s, gift_peer_t *p, const chunk_t *ch, const reply_t *r,
                      uint64_t seq)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__PullReply pr = GIFT__PULL_REPLY__INIT;
    Gift__Codec codec = GIFT__CODEC__INIT;
    tensor_t *t = ch->t;

    if (r->err == GIFT_EIO && s->persist && s->log.err_no != 0) {
        /* The step log failed (persist.c): the mean exists but is in no
         * log, so it is never answered (it would be lost on a restart). */
        gift__send_error(s, p, r->err, 0, t->key, ch->id, r->step, seq,
                         "step %" PRIu64 " of tensor %u chunk %u could not be made durable: "
                         "the step log %s could not be written (%s), and this shard logs "
                         "nothing more; free space on (or repair) the filesystem of %s, then "
                         "restart giftd, which resumes from the last durable step",
                         r->step, t->key, ch->id, s->log.path, strerror(s->log.err_no), s->dir);
        return;
    }
    if (r->err) {
        gift__send_error(s, p, r->err, 0, t->key, ch->id, r->step, seq,
                         "step %" PRIu64 " of tensor %u chunk %u could not be encoded: %s", r->step,
                         t->key, ch->id, gift_strerror(r->err));
        return;
    }
    codec.format = (Gift__Format)r->pull.fmt; /* the step's (the declared, or its epoch's) */
    codec.block = r->pull.block;
    pr.key = t->key;
    pr.chunk = ch->id;
    pr.step = r->step;
    pr.epoch = r->epoch;
    pr.codec = &codec;
    pr.contributors = s->world;
    pr.seq = seq;
    pr.latest_epoch = (t->owner && t->geometry && ch->id == 0) ? gift__owner_latest_epoch(t) : 0;
    env.msg_case = GIFT__ENVELOPE__MSG_PULL_REPLY;
    env.pull_reply = &pr;
    if (gift__send_frame(s, p, &env, r->buf, 0, r->len) == 0) {
        s->c.pull_bytes_out[r->pull.fmt] += r->len;
        s->c.pull_frames_out[r->pull.fmt]++;
        t->bytes_out += r->len;
    }
}

void gift__send_geometry(gift_shard_t *s, gift_peer_t *p, const tensor_t *t, uint64_t seq)
{
    Gift__Envelope env = GIFT__ENVELOPE__INIT;
    Gift__Geometry g = GIFT__GEOMETRY__INIT;
    Gift__Codec push, pull;
    g.key = t->key;
    g.epoch = t->geo.epoch;
    g.valid_from_step = t->nepochs ? t->epochs[t->nepochs - 1].valid_from : 0;
    g.din = t->cols;
    g.rank = t->k;
    g.basis_cols = t->ks;
    g.trace = t->geo.trace;
    g.sigma2 = t->geo.sigma2;
    g.delta = t->geo.delta;
    g.identity = t->geo.identity != 0;
    g.seq = seq;
    gift__pol_geometry_wire(t, &g, &push, &pull);
    env.msg_case = GIFT__ENVELOPE__MSG_GEOMETRY;
    env.geometry = &g;
    (void)gift__send_frame(s, p, &env, t->geo_buf, 0, t->geo_buf->len);
}
