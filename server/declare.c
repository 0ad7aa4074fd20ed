/*
 * declare.c: the shard's store built from a Declare and freed (declare.h).
 * store_build runs in steps, each of which checks or allocates one part and
 * returns 0 or a negative code (with a sentence in why where the peer sent
 * something wrong); the first that fails ends the build, and build_undo
 * frees whatever the earlier steps made.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "declare.h"
#include "gift_codec.h"
#include "gift_error.h"
#include "owner.h"
#include "policy_owner.h"

#define REFRESH_DEFAULT 50

void gift__shard_store_free(gift_shard_t *s)
{
    for (size_t i = 0; i < s->nchunks; i++) {
        chunk_t *ch = &s->chunks[i];
        for (int j = 0; j < 2; j++) {
            free(ch->slot[j].acc);
            free(ch->slot[j].ranks);
            free(ch->slot[j].pay);
            gift_rbuf_unref(ch->reply[j].buf);
        }
        free(ch->pres);
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        free(t->name);
        free(t->by_id);
        gift__pol_free(t);
        if (t->owner && t->geometry) {
            gift_geometry_free(&t->geo);
            free(t->ysum);
            free(t->yr);
            free(t->tr);
            free(t->sk_ranks);
            gift_rbuf_unref(t->geo_buf);
        }
    }
    free(s->chunks);
    free(s->tensors);
    free(s->pol_in);
    free(s->pol_out);
    s->pol_in = s->pol_out = NULL;
    s->pol_round_ok = 0;
    free(s->decl);
    free(s->pending);
    s->pending = NULL;
    s->npending = 0;
    s->decl = NULL;
    s->decl_len = 0;
    s->chunks = NULL;
    s->tensors = NULL;
    s->nchunks = s->ntensors = 0;
    s->declared = 0;
    s->run_id[0] = '\0';
}

uint64_t gift__declare_placement(Gift__ChunkDecl *const *c, size_t n)
{
    /* Order-independent: sum of a mix of each (key, chunk, rows, row_begin). */
    uint64_t sig = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t x = ((uint64_t)c[i]->key << 32) ^ c[i]->chunk;
        x ^= ((uint64_t)c[i]->row_begin << 20) ^ ((uint64_t)c[i]->rows << 44);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        sig += x ^ (x >> 31);
    }
    return sig;
}

/* The bytes of the tables of tensors and chunks that d lists. */
static uint64_t tables_need(const Gift__Declare *d)
{
    return gift__add_sat(gift__mul_sat(d->n_tensors, sizeof(tensor_t)),
                         gift__mul_sat(d->n_chunks, sizeof(chunk_t)));
}

/* Step 1: the tables of tensors and chunks (zeroed). */
static int tables_alloc(gift_shard_t *s, const Gift__Declare *d)
{
    size_t nt = d->n_tensors, nc = d->n_chunks;
    if ((s->tensors = calloc(nt, sizeof *s->tensors)) == NULL ||
        (nc && (s->chunks = calloc(nc, sizeof *s->chunks)) == NULL))
        return GIFT_ENOMEM;
    s->ntensors = nt;
    s->nchunks = nc;
    return 0;
}

/* Step 2, for each tensor: the i-th declaration td, checked (key, shape,
 * codecs, the geometry's rank and width) and copied into t. */
static int tensor_read(gift_shard_t *s, tensor_t *t, const Gift__TensorDecl *td, size_t i,
                       char *why, size_t whylen)
{
    gift_layout_t l;
    if (td->key != i) {
        snprintf(why, whylen, "tensor %zu has key %u: keys must be 0..n-1 in order", i, td->key);
        return GIFT_EINVAL;
    }
    if (td->rows == 0 || td->cols == 0 || (uint64_t)td->rows * td->cols > (1ull << 40)) {
        snprintf(why, whylen, "tensor %u has shape %u x %u", td->key, td->rows, td->cols);
        return GIFT_ESHAPE;
    }
    if (gift__pol_codec_from_wire(td->push_codec, &t->push) < 0 ||
        gift__pol_codec_from_wire(td->pull_codec, &t->pull) < 0 ||
        gift_layout(&t->push, 1, &l) < 0 || gift_layout(&t->pull, 1, &l) < 0) {
        snprintf(why, whylen, "tensor %u has an unknown codec or block size", td->key);
        return GIFT_ECODEC;
    }
    /* The shard does no math for a rotation, but a value no worker knows
     * (2^32-1 from a hostile Declare) or a rotation on top of the geometry
     * would fix a tensor list no real worker can match. */
    if ((uint32_t)td->transform > GIFT__TRANSFORM__TRANSFORM_HADAMARD ||
        (td->transform != GIFT__TRANSFORM__TRANSFORM_NONE && td->geometry)) {
        snprintf(why, whylen,
                 "tensor %u declares transform %u%s: known are 0 (none) and 1 (hadamard, "
                 "without geometry)",
                 td->key, (uint32_t)td->transform, td->geometry ? " with geometry" : "");
        return GIFT_ESHAPE;
    }
    t->key = td->key;
    if ((t->name = strdup(td->name ? td->name : "")) == NULL)
        return GIFT_ENOMEM;
    t->rows = td->rows;
    t->cols = td->cols;
    t->push_fmt = td->push_codec ? td->push_codec->format : GIFT__FORMAT__FORMAT_F32;
    t->pull_fmt = td->pull_codec ? td->pull_codec->format : GIFT__FORMAT__FORMAT_F32;
    t->push_block = td->push_codec ? td->push_codec->block : 0;
    t->pull_block = td->pull_codec ? td->pull_codec->block : 0;
    t->geometry = td->geometry;
    t->seed = td->seed;
    t->refresh = td->refresh ? td->refresh : REFRESH_DEFAULT;
    /* f32 pulls are exact: nothing to feed back. */
    t->pull_ef = td->pull_error_feedback && t->pull.fmt != GIFT_FMT_F32;
    if (t->geometry)
        return gift__admit_geometry_shape(s, t, td, why, whylen);
    return 0;
}

/* Step 3: each tensor's chunk index, sized by the chunks declared for it
 * (bounded by the message) and never by a chunk id's value. */
static int index_alloc(gift_shard_t *s, const Gift__Declare *d, char *why, size_t whylen)
{
    for (size_t i = 0; i < d->n_chunks; i++) {
        const Gift__ChunkDecl *cd = d->chunks[i];
        if (cd->key >= s->ntensors) {
            snprintf(why, whylen, "chunk %u names tensor %u of %zu", cd->chunk, cd->key,
                     s->ntensors);
            return GIFT_ENOKEY;
        }
        s->tensors[cd->key].nchunks++;
    }
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->nchunks && (t->by_id = calloc(t->nchunks, sizeof *t->by_id)) == NULL)
            return GIFT_ENOMEM;
        t->nchunks = 0;
    }
    return 0;
}

/* Step 4, for each chunk: the declaration cd, checked against its tensor
 * (rows, payload sizes) and placed into ch and the tensor's index. */
static int chunk_read(gift_shard_t *s, chunk_t *ch, const Gift__ChunkDecl *cd, char *why,
                      size_t whylen)
{
    tensor_t *t = &s->tensors[cd->key];
    /* A tensor has at most rows chunks, so a valid id is below rows. */
    if (cd->rows == 0 || (uint64_t)cd->row_begin + cd->rows > t->rows || cd->chunk >= t->rows) {
        snprintf(why, whylen, "chunk %u of tensor %u: rows [%u, %" PRIu64 ") outside 0..%u",
                 cd->chunk, cd->key, cd->row_begin, (uint64_t)cd->row_begin + cd->rows, t->rows);
        return GIFT_ESHAPE;
    }
    t->by_id[t->nchunks++] = ch;
    ch->t = t;
    ch->id = cd->chunk;
    ch->row_begin = cd->row_begin;
    ch->rows = cd->rows;
    ch->n = (size_t)cd->rows * t->cols;
    if (gift_layout(&t->push, ch->n, &ch->push_l) < 0 ||
        gift_layout(&t->pull, ch->n, &ch->pull_l) < 0 || ch->push_l.total > s->o.max_frame_bytes ||
        ch->pull_l.total > s->o.max_frame_bytes) {
        snprintf(why, whylen, "chunk %u of tensor %u: payload above max_frame_bytes (%" PRIu64 ")",
                 cd->chunk, cd->key, s->o.max_frame_bytes);
        return GIFT_ESHAPE;
    }
    if (cd->chunk == 0)
        t->owner = 1;
    return 0;
}

/* qsort order of a tensor's chunk index: ascending chunk id. */
static int chunk_id_cmp(const void *a, const void *b)
{
    uint32_t x = (*(chunk_t *const *)a)->id, y = (*(chunk_t *const *)b)->id;
    return (x > y) - (x < y);
}

/* Step 5: each tensor's index sorted by chunk id, which must be unique. */
static int index_sort(gift_shard_t *s, char *why, size_t whylen)
{
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        if (t->nchunks > 1)
            qsort(t->by_id, t->nchunks, sizeof *t->by_id, chunk_id_cmp);
        for (uint32_t j = 1; j < t->nchunks; j++)
            if (t->by_id[j]->id == t->by_id[j - 1]->id) {
                snprintf(why, whylen, "chunk %u of tensor %u declared twice", t->by_id[j]->id,
                         t->key);
                return GIFT_EINVAL;
            }
    }
    return 0;
}

/* Step 6, once the declaration is known to be valid and within max_memory:
 * every chunk's slots, reply buffers, kept pushes (ordered aggregation) and
 * pull residual, and the group commit's pending list. Nothing is allocated
 * per message afterwards. */
static int buffers_alloc(gift_shard_t *s)
{
    int ordered = s->o.aggregate == GIFT_SHARD_ORDERED;
    for (size_t i = 0; i < s->nchunks; i++) {
        chunk_t *ch = &s->chunks[i];
        ch->pay_stride = (ch->push_l.total + 63) & ~(size_t)63;
        for (int j = 0; j < 2; j++) {
            if ((ch->slot[j].acc = calloc(ch->n, sizeof(float))) == NULL ||
                (ch->slot[j].ranks = calloc(s->words, sizeof(uint64_t))) == NULL ||
                (ch->reply[j].buf = gift_rbuf_new(ch->pull_l.total)) == NULL)
                return GIFT_ENOMEM;
            if (ordered &&
                posix_memalign((void **)&ch->slot[j].pay, 64, ch->pay_stride * s->world) != 0) {
                ch->slot[j].pay = NULL;
                return GIFT_ENOMEM;
            }
            ch->slot[j].epoch = -1;
            ch->slot[j].push = ch->t->push;
            ch->slot[j].pull = ch->reply[j].pull = ch->t->pull;
            ch->slot[j].push_len = ch->push_l.total;
            ch->slot[j].pull_len = ch->reply[j].len = ch->pull_l.total;
        }
        if (ch->t->pull_ef && (ch->pres = calloc(ch->n, sizeof(float))) == NULL)
            return GIFT_ENOMEM;
    }
    if (s->nchunks > 0 && (s->pending = calloc(s->nchunks, sizeof *s->pending)) == NULL)
        return GIFT_ENOMEM;
    s->npending = 0;
    return 0;
}

/* Step 7: the geometry owner's state of every geometry tensor whose chunk 0
 * is here (its thin geometry, sketch sums and epoch 0, published). */
static int owners_init(gift_shard_t *s, char *why, size_t whylen)
{
    int ordered = s->o.aggregate == GIFT_SHARD_ORDERED;
    for (size_t i = 0; i < s->ntensors; i++) {
        tensor_t *t = &s->tensors[i];
        int rc;
        if (!t->owner || !t->geometry)
            continue;
        /* Thin: the owner never applies T to what it serves (admit.c's
         * geometry_need counts no dense form). */
        if ((rc = gift_geometry_init_thin(&t->geo, (int)t->cols, (int)t->k, (int)t->ks, t->seed)) <
            0) {
            snprintf(why, whylen, "tensor %u: geometry init failed (%s)", t->key,
                     gift_strerror(rc));
            return rc;
        }
        t->geo_ok = 1;
        if ((t->ysum = calloc((size_t)t->cols * t->ks, sizeof(float))) == NULL ||
            (t->sk_ranks = calloc(s->words, sizeof(uint64_t))) == NULL ||
            (ordered &&
             ((t->yr = calloc((size_t)t->cols * t->ks * s->world, sizeof(float))) == NULL ||
              (t->tr = calloc(s->world, sizeof(double))) == NULL)) ||
            gift__owner_publish(t, 0) < 0)
            return GIFT_ENOMEM;
    }
    return 0;
}

/* A failed build: why says so when nothing more precise was said, and what
 * the steps made is freed. */
static void build_undo(gift_shard_t *s, int rc, char *why, size_t whylen)
{
    if (rc == GIFT_ENOMEM && why[0] == '\0')
        snprintf(why, whylen, "out of memory while allocating the declared buffers");
    /* Owner flags are set before geometry init; free only what was made. */
    for (size_t i = 0; i < s->ntensors; i++)
        if (!s->tensors[i].geo_ok)
            s->tensors[i].geometry = s->tensors[i].owner ? 0 : s->tensors[i].geometry;
    gift__shard_store_free(s);
}

/* The steps in their order: the tables, the tensors, the chunks and their
 * index, then (within max_memory) the buffers, the owners' state and the
 * policy's. On error nothing is kept and *why says what was wrong. */
static int store_build(gift_shard_t *s, const Gift__Declare *d, char *why, size_t whylen)
{
    int rc;

    why[0] = '\0';
    if (d->n_tensors == 0) {
        snprintf(why, whylen, "the tensor list is empty");
        return GIFT_EINVAL;
    }
    /* The tables first (bounded by the message, but checked all the same),
     * the buffers once the declaration is known to be valid. */
    if ((rc = gift__admit_budget(s, tables_need(d), "the declaration's tables", why, whylen)) < 0)
        return rc;
    if ((rc = tables_alloc(s, d)) < 0)
        goto fail;
    for (size_t i = 0; i < d->n_tensors; i++)
        if ((rc = tensor_read(s, &s->tensors[i], d->tensors[i], i, why, whylen)) < 0)
            goto fail;
    if ((rc = index_alloc(s, d, why, whylen)) < 0)
        goto fail;
    for (size_t i = 0; i < d->n_chunks; i++)
        if ((rc = chunk_read(s, &s->chunks[i], d->chunks[i], why, whylen)) < 0)
            goto fail;
    if ((rc = index_sort(s, why, whylen)) < 0)
        goto fail;
    /* Within max_memory before the first buffer is allocated. */
    s->mem = gift__admit_store_need(s, d) + gift__pol_mem_need(s);
    if ((rc = gift__admit_budget(s, s->mem, "the declaration", why, whylen)) < 0 ||
        (rc = buffers_alloc(s)) < 0 || (rc = owners_init(s, why, whylen)) < 0 ||
        (rc = gift__pol_alloc(s)) < 0)
        goto fail;
    gift__pol_epoch0(s);
    s->declared = 1;
    return 0;
fail:
    build_undo(s, rc, why, whylen);
    return rc;
}

int gift__shard_declare_apply(gift_shard_t *s, const Gift__Declare *d, char *why, size_t whylen)
{
    size_t len = gift__declare__get_packed_size(d);
    uint8_t *buf = malloc(len ? len : 1);
    int rc;
    if (buf == NULL) {
        snprintf(why, whylen, "out of memory");
        return GIFT_ENOMEM;
    }
    /* The run id comes from a peer or from disk: bounded before it is kept. */
    if (d->run_id != NULL && strnlen(d->run_id, GIFT_RUN_ID_MAX + 1) > GIFT_RUN_ID_MAX) {
        snprintf(why, whylen, "its run id is longer than %d bytes", GIFT_RUN_ID_MAX);
        free(buf);
        return GIFT_EPROTO;
    }
    gift__declare__pack(d, buf);
    if ((rc = store_build(s, d, why, whylen)) < 0) {
        free(buf);
        return rc;
    }
    snprintf(s->run_id, sizeof s->run_id, "%s", d->run_id ? d->run_id : "");
    s->digest = gift_digest_tensors(d->tensors, d->n_tensors);
    s->placement = gift__declare_placement(d->chunks, d->n_chunks);
    s->decl = buf;
    s->decl_len = len;
    return 0;
}
