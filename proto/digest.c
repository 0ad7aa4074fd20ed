/*
 * digest.c: the cluster digest, a fingerprint of the declared tensor list
 * that every worker and every shard compute the same way. It guards against
 * workers with different models or settings, not against an attacker (that
 * is what authentication is for), so a 64-bit FNV-1a over a canonical text
 * form is enough and needs no library.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gift_proto.h"

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

uint64_t gift_digest_tensors(Gift__TensorDecl *const *t, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    char line[512];
    for (size_t i = 0; i < n; i++) {
        const Gift__TensorDecl *d = t[i];
        int push_fmt = d->push_codec ? (int)d->push_codec->format : 0;
        unsigned push_blk = d->push_codec ? d->push_codec->block : 0;
        int pull_fmt = d->pull_codec ? (int)d->pull_codec->format : 0;
        unsigned pull_blk = d->pull_codec ? d->pull_codec->block : 0;
        int len = snprintf(line, sizeof line,
                           "%" PRIu32 " %" PRIu32 " %" PRIu32 " %d %u %d %u %d %" PRIu32 " %" PRIu32
                           " %" PRIu32 " %" PRIu64 " ",
                           d->key, d->rows, d->cols, push_fmt, push_blk, pull_fmt, pull_blk,
                           (int)d->geometry, d->rank, d->basis_cols, d->refresh, d->seed);
        h = fnv1a(h, line, (size_t)len);
        h = fnv1a(h, d->name ? d->name : "", d->name ? strlen(d->name) : 0);
        if (d->pull_error_feedback) /* absent from older lists: their digest is unchanged */
            h = fnv1a(h, " pull-ef", 8);
        if (d->transform != GIFT__TRANSFORM__TRANSFORM_NONE) { /* absent: unchanged, as above */
            len = snprintf(line, sizeof line, " transform %d", (int)d->transform);
            h = fnv1a(h, line, (size_t)len);
        }
        h = fnv1a(h, "\n", 1);
    }
    return h;
}

void gift_digest_bytes(uint64_t d, uint8_t out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(d >> (8 * i));
}
