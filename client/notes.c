/*
 * notes.c: the sentences the engine leaves in the client's last error
 * (gift_client_last_error) when something fails: which shard (its index
 * and address), what it said or what did not happen, and the fix. Reads
 * the engine's connection state; changes nothing but c->last_err (I/O
 * thread). The lowest file of client/: it calls no other file of it, so
 * every file above may note a failure (gift__client_note) and name a shard
 * (gift__shard_addr).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "giftclient_internal.h"

void gift__client_note(gift_client_t *c, const char *fmt, ...)
{
    char text[sizeof c->last_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "giftclient: %s\n", text);
    pthread_mutex_lock(&c->mu);
    memcpy(c->last_err, text, sizeof text);
    pthread_mutex_unlock(&c->mu);
}

const char *gift__shard_addr(const gift_client_t *c, uint32_t shard, char *buf, size_t len)
{
    const struct sockaddr_storage *a = &c->addrs[shard];
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)a;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        snprintf(buf, len, "%s:%u", host, port);
    } else {
        const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)a;
        inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
        port = ntohs(in->sin6_port);
        snprintf(buf, len, "[%s]:%u", host, port);
    }
    return buf;
}

void gift__note_refusal(gift_client_t *c, uint32_t shard, const char *what, const Gift__Error *e,
                        int code)
{
    char a[64];
    gift__client_note(
        c, "shard %u (%s) refused the %s of tensor %u chunk %u step %" PRIu64 ": %s (%s)", shard,
        gift__shard_addr(c, shard, a, sizeof a), what, e->key, e->chunk, e->step,
        e->text ? e->text : "", gift_strerror(code));
}

void gift__note_timeout(gift_client_t *c)
{
    char a[64];
    for (uint32_t s = 0; s < c->nshards; s++)
        if (c->conns[s].state != GIFT__CONN_READY) {
            gift__client_note(c,
                              "an operation timed out after %u ms (timeout_ms, GIFT_TIMEOUT_MS) "
                              "while shard %u (%s) is not connected%s",
                              c->timeout_ms, s, gift__shard_addr(c, s, a, sizeof a),
                              c->conns[s].connect_err == -ECONNREFUSED ? ": connection refused"
                                                                       : "");
            return;
        }
    gift__client_note(c,
                      "an operation timed out after %u ms (timeout_ms, GIFT_TIMEOUT_MS) with "
                      "every shard connected: a rank may be missing (giftctl status)",
                      c->timeout_ms);
}

void gift__note_unreached(gift_client_t *c)
{
    for (uint32_t s = 0; s < c->nshards; s++) {
        const gift__conn_t *cn = &c->conns[s];
        char a[64];
        if (cn->state == GIFT__CONN_READY)
            continue;
        gift__client_note(c, "shard %u (%s) not reached within %u ms (connect_timeout_ms): %s", s,
                          gift__shard_addr(c, s, a, sizeof a), c->connect_timeout_ms,
                          cn->connect_err == -ECONNREFUSED
                              ? "connection refused: is giftd running there, and is "
                                "GIFT_SERVERS right?"
                          : cn->connect_err              ? strerror(-cn->connect_err)
                          : cn->state == GIFT__CONN_DOWN ? "no connection"
                                                         : "no answer to the Hello");
        return;
    }
}
