/*
 * host.c: the host path of gift__path_t (giftclient_internal.h): a wire
 * whose buffers are host memory is transformed, encoded, decoded and
 * transformed back on the I/O thread through the CPU backend
 * (gift__backend_cpu(), codec/gift_kernels.h), the sibling of the device
 * path in device.c. A push is encoded a few chunks per loop turn
 * (gift__host_encode_more, at the end of each turn) and each chunk is handed
 * to the engine as soon as it is encoded, as a device reports its chunks.
 * With codec threads (gift_client_opts_t.codec_threads) a push runs on one
 * of them instead and its chunks are handed over as it publishes them
 * (gift__hjob_t). The engine reaches this file only through the table; this
 * file reaches the engine only through c->eng (gift__eng_ops_t).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gift_kernels.h"
#include "giftclient_internal.h"

/* A push encodes about this many input bytes per loop turn (at least one
 * chunk): between turns the loop writes what was queued, so the shard
 * decodes chunk j while this thread encodes chunk j + 1. */
#define GIFT__ENCODE_TURN_BYTES (1u << 20)

/* T (inverse 0) or T^-1 of one chunk's rows, src to dst (may be equal):
 * every path cuts a tensor into its chunks and transforms them with the
 * whole tensor's rows as the form's work size (gift_transform_ws), so a
 * push or a pull gives the same bits on the I/O thread and on a codec
 * thread. scratch holds w->rows x w->k floats. A Hadamard wire (g NULL)
 * rotates the chunk's rows by w->hd instead (H D, or D H for the inverse;
 * rows never mix, no scratch): the same rule, residuals and threads as a
 * geometry's T. */
static int chunk_transform(gift_client_t *c, gift__wire_t *w, const gift_geometry_t *g, int inverse,
                           const gift__chunk_t *ch, const float *src, float *dst, float *scratch)
{
    GIFT__PASS(c, GIFT_PASS_TRANSFORM, ch->n);
    if (w->hadamard)
        return gift_hadamard_apply(&w->hd, inverse, src + ch->off, ch->rows, dst + ch->off);
    return gift_transform_ws(g, inverse, src + ch->off, (int)ch->rows, dst + ch->off, scratch,
                             (int)w->rows);
}

/* chunk_transform of chunks from .. w->nchunks - 1, src to dst. */
static int transform_chunks(gift_client_t *c, gift__wire_t *w, const gift_geometry_t *g,
                            int inverse, uint32_t from, const float *src, float *dst,
                            float *scratch)
{
    int rc = 0;
    for (uint32_t j = from; rc == 0 && j < w->nchunks; j++)
        rc = chunk_transform(c, w, g, inverse, gift__chunk_of(c, w, j), src, dst, scratch);
    return rc;
}

/* ps no longer transforms as it encodes: unpins its geometry. */
static void untransform(gift__pstate_t *ps)
{
    if (ps->tg != NULL)
        ps->tg->pinned--;
    ps->tg = NULL;
    ps->tsrc = NULL;
}

static void stop_encoding(gift_client_t *c, gift__wire_t *w)
{
    if (w->encoding == NULL)
        return;
    untransform(w->encoding);
    w->encoding = NULL;
    c->nencoding--;
    c->rescan = 1;
}

/* Encodes chunk ch of ps's push with error feedback: with v = p + e (p the
 * push's input, e the chunk's residual), the bytes gift_encode gives for v,
 * and e = v - decode(those bytes). One cache-resident pass over p and e
 * (gift_encode_mean_ef with scale 1: v = (p * 1 + 0) + e, the value of
 * p + e; only a zero's sign can differ, -0 + -0 giving +0, and the residual
 * does not). v is written out only where that pass does not go (stochastic
 * rounding, an fp8 block over 4096), into the push's scratch. After a failed
 * encode the chunk's residual is unspecified (all zeros after a non-finite
 * input on the one-pass path). Returns 0 or the encode's error. */
static int encode_ef(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps,
                     const gift_codec_params_t *cp, const gift__chunk_t *ch, uint8_t *pay)
{
    float *e = w->ef.e + ch->off, *q;
    const float *pc = ps->encp + ch->off;
    int rc = GIFT_EFORMAT;

    if (!cp->stochastic)
        rc = gift_encode_mean_ef(cp, pc, ch->n, 1.0f, e, pay, gift__ps_push_len(ps, ch));
    if (rc != GIFT_EFORMAT) {
        GIFT__PASS(c, GIFT_PASS_RESIDUAL, ch->n); /* encode and residual in one walk */
        return rc;
    }
    q = (w->nmembers > 1 ? ps->asmb : w->p) + ch->off;
    if (q != pc) {
        memcpy(q, pc, ch->n * sizeof(float));
        GIFT__PASS(c, GIFT_PASS_COPY, ch->n);
    }
    gift_vec_add(q, e, ch->n);
    GIFT__PASS(c, GIFT_PASS_RESIDUAL, ch->n);
    GIFT__PASS(c, GIFT_PASS_ENCODE, ch->n);
    GIFT__PASS(c, GIFT_PASS_DECODE, ch->n);
    if ((rc = gift_encode(cp, q, ch->n, pay, gift__ps_push_len(ps, ch))) < 0 ||
        (rc = gift_decode(cp, pay, gift__ps_push_len(ps, ch), ch->n, e)) < 0)
        return rc;
    gift_vec_sub(q, e, ch->n, e);
    GIFT__PASS(c, GIFT_PASS_RESIDUAL, ch->n);
    return 0;
}

/* Encodes chunk j of ps's push into its payload area: transformed first
 * (its rows of ps->tsrc into w->p, under ps->tg, with scratch: w->rows x
 * w->k floats), then with error feedback (encode_ef), checked where it lies
 * (f32 sent from ps->zc), or encoded. Touches the chunk's payload, its
 * residual, its slice of w->p and scratch only, so a codec thread may run it
 * (the counters are atomic). 0 or the transform's or encode's error. */
static int encode_one(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, uint32_t j,
                      float *scratch)
{
    gift__chunk_t *ch = gift__chunk_of(c, w, j);
    gift_codec_params_t cp = ps->push;
    uint8_t *pay = ps->payload + ch->push_off;
    int rc;
    if (ps->tsrc != NULL && w->hadamard && !w->ef_on && !cp.stochastic &&
        cp.fmt != GIFT_FMT_NVFP4) {
        /* Rotated and encoded slice by slice in one walk, the rotated chunk
         * never written (the same bytes as the two steps). */
        GIFT__PASS(c, GIFT_PASS_ENCODE, ch->n);
        return gift_hadamard_encode(&cp, &w->hd, ps->tsrc + ch->off, ch->rows, pay,
                                    gift__ps_push_len(ps, ch));
    }
    if (ps->tsrc != NULL && (rc = chunk_transform(c, w, ps->tg != NULL ? &ps->tg->g : NULL, 0, ch,
                                                  ps->tsrc, w->p, scratch)) < 0)
        return rc;
    cp.sr.seed = c->seed;
    cp.sr.rank = (uint32_t)c->rank;
    cp.sr.key = w->key;
    cp.sr.chunk = ch->idx;
    cp.sr.step = ps->step;
    if (w->ef_on)
        return encode_ef(c, w, ps, &cp, ch, pay);
    if (ps->zc != NULL && gift__zc_chunk(ps, ch)) {
        /* Sent from where it is: only f32 encode's check of it. */
        rc = gift_payload_check(&cp, ps->zc + ch->off, (size_t)ch->n * 4u, ch->n) < 0
                 ? GIFT_ENONFINITE
                 : 0;
        GIFT__PASS(c, GIFT_PASS_CHECK, ch->n);
        return rc;
    }
    rc = gift__backend_cpu()->encode(NULL, &cp, ps->encp + ch->off, ch->n, pay,
                                     gift__ps_push_len(ps, ch));
    GIFT__PASS(c, GIFT_PASS_ENCODE, ch->n);
    return rc;
}

/* Encodes the next chunks of w's push (at least one, then while under budget
 * bytes of input), updates the residual of each, and queues each Push as
 * soon as it is encoded, followed by the Pull of the same chunk when that
 * pull waits. A chunk that fails to encode (NaN/Inf: GIFT_ENONFINITE) is
 * never sent and fails the push; the chunks before it were already queued
 * and the shard keeps them (a retry of the step is acknowledged as a
 * duplicate for those). Returns the input bytes encoded. */
static size_t encode_chunks(gift_client_t *c, gift__wire_t *w, size_t budget)
{
    gift__pstate_t *ps = w->encoding;
    size_t done = 0;
    int rc;

    if (ps == NULL)
        return 0;
    if (c->eng->push_gone(ps)) {
        stop_encoding(c, w);
        return 0;
    }
    while (ps->nenc < w->nchunks && (done == 0 || done < budget)) {
        uint32_t j = ps->nenc;
        if ((rc = encode_one(c, w, ps, j, w->work)) < 0) {
            stop_encoding(c, w);
            c->eng->push_fail(c, ps, rc);
            return done;
        }
        ps->nenc = j + 1;
        done += gift__chunk_of(c, w, j)->n * sizeof(float);
        c->eng->push_chunk_ready(c, w, ps, j);
    }
    if (ps->nenc == w->nchunks)
        stop_encoding(c, w);
    return done;
}

/* ------------------------------------------------------------------ */
/* The codec threads (gift_client_opts_t.codec_threads)                  */
/* ------------------------------------------------------------------ */

/* Work on a codec thread. A push (HJOB_PUSH): the residual's rebase or
 * reset, then each chunk's transform (its rows of G T into w->p, on its
 * scratch) and encode, in chunk order. The I/O thread queues it and then
 * touches none of what it writes (w->p, the scratch, w->ef, the chunks'
 * payloads not yet published) nor the geometry slots it reads (pinned:
 * on_geometry quiesces before reloading one) until it is done; it sends each
 * chunk once `pub` says it is encoded (gift__host_encode_more). One push job
 * per wire: the engine starts a wire's next push only when this one is no
 * longer encoding. A pull's T^-1 (HJOB_FINISH, one per pull slot, for a wire
 * in one chunk: inverse_on_pool): every chunk is decoded into pl->target,
 * which nothing else writes until the pull completes; once the job is done
 * the I/O thread completes the pull (host_finish then takes the job's
 * result). Each job has its own rows x k scratch: w->pwork holds three (the
 * push's, then each pull slot's). */
typedef struct gift__pool gift__pool_t;

enum { HJOB_PUSH = 0, HJOB_FINISH = 1, HJOB_PER_WIRE = 3 };

typedef struct gift__hjob {
    struct gift__hjob *next; /* pool queue (pool mu) */
    int kind;
    gift__wire_t *w;
    float *scratch;     /* rows x k, this job's own */
    gift__lstate_t *pl; /* finish: the pull, and its step when queued */
    uint64_t step;
    int finished; /* finish: done and not yet taken by host_finish (I/O thread) */
    gift__pstate_t *ps;
    const float *src;
    gift__geo_t *G, *old; /* pinned while the job is active */
    uint32_t epoch;
    int active;   /* I/O thread: queued or running, not yet retired */
    uint32_t pub; /* atomic: chunks encoded; release after each */
    int err;      /* the failing chunk's code, written before done */
    int done;     /* atomic: the thread is finished with it (pool mu for the wait) */
} gift__hjob_t;

struct gift__pool {
    gift_client_t *c;
    pthread_t *th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv, donecv;
    gift__hjob_t *head, *tail;
    int stop;
};

/* The job's work, on a codec thread. */
static void hjob_run(gift_client_t *c, gift__hjob_t *j)
{
    gift__wire_t *w = j->w;
    gift__pstate_t *ps = j->ps;
    int rc = 0;

    if (j->kind == HJOB_FINISH) {
        j->err = transform_chunks(c, w, &j->G->g, 1, 0, j->pl->target, j->pl->target, j->scratch);
        return;
    }
    if (w->ef_on && w->ef.epoch != j->epoch) {
        if (j->old == NULL || j->G == NULL ||
            gift_ef_rebase(&w->ef, &j->old->g, &j->G->g, j->scratch) < 0)
            gift_ef_reset(&w->ef, j->epoch);
    }
    for (uint32_t k = 0; rc == 0 && k < w->nchunks; k++) {
        if ((rc = encode_one(c, w, ps, k, j->scratch)) == 0)
            __atomic_store_n(&j->pub, k + 1, __ATOMIC_RELEASE);
        if (k + 1 == w->nchunks || rc < 0 || (k & 3) == 3)
            c->io->wake(c); /* the I/O thread sends what is published */
    }
    j->err = rc;
}

/* This thread's CPU time in nanoseconds (0 when the clock is not there). */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *pool_main(void *arg)
{
    gift__pool_t *pool = arg;
    uint64_t cpu = thread_cpu_ns();
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        gift__hjob_t *j;
        while (!pool->stop && pool->head == NULL)
            pthread_cond_wait(&pool->cv, &pool->mu);
        if (pool->head == NULL) /* stopping, and nothing is queued */
            break;
        j = pool->head;
        pool->head = j->next;
        if (pool->head == NULL)
            pool->tail = NULL;
        pthread_mutex_unlock(&pool->mu);
        hjob_run(pool->c, j);
        {
            uint64_t now = thread_cpu_ns();
            __atomic_fetch_add(&pool->c->codec_cpu_ns, now - cpu, __ATOMIC_RELAXED);
            cpu = now;
        }
        pthread_mutex_lock(&pool->mu);
        __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&pool->donecv);
        pool->c->io->wake(pool->c);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

int gift__host_pool_start(gift_client_t *c)
{
    gift__pool_t *pool;
    if (c->codec_threads <= 0 || c->pool != NULL)
        return 0;
    if ((pool = calloc(1, sizeof *pool)) == NULL ||
        (pool->th = calloc((size_t)c->codec_threads, sizeof *pool->th)) == NULL) {
        free(pool);
        return GIFT_ENOMEM;
    }
    pool->c = c;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pthread_cond_init(&pool->donecv, NULL);
    c->pool = pool;
    for (int i = 0; i < c->codec_threads; i++) {
        if (pthread_create(&pool->th[i], NULL, pool_main, pool) != 0) {
            gift__host_pool_stop(c);
            return GIFT_ENOMEM;
        }
        pool->started++;
    }
    return 0;
}

void gift__host_pool_stop(gift_client_t *c)
{
    gift__pool_t *pool = c->pool;
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->started; i++)
        pthread_join(pool->th[i], NULL);
    pthread_cond_destroy(&pool->cv);
    pthread_cond_destroy(&pool->donecv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->th);
    free(pool);
    c->pool = NULL;
}

int gift__host_declare(gift_client_t *c)
{
    for (size_t i = 0; c->pool != NULL && i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        if (!w->path->is_host || w->nmembers != 1 || w->hjob != NULL ||
            (w->geometry && w->pwork == NULL))
            continue;
        if ((w->hjob = calloc(HJOB_PER_WIRE, sizeof *w->hjob)) == NULL)
            return GIFT_ENOMEM;
    }
    return 0;
}

/* Waits until w's job (if any) is finished with everything it reads and
 * writes (I/O thread). */
static void hjob_wait(gift_client_t *c, gift__wire_t *w)
{
    for (int k = 0; w->hjob != NULL && k < HJOB_PER_WIRE; k++) {
        gift__hjob_t *j = &w->hjob[k];
        if (!j->active || __atomic_load_n(&j->done, __ATOMIC_ACQUIRE))
            continue;
        pthread_mutex_lock(&c->pool->mu);
        while (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&c->pool->donecv, &c->pool->mu);
        pthread_mutex_unlock(&c->pool->mu);
    }
}

/* Appends j to the pool's queue (its fields set) and counts it active. */
static void hjob_enqueue(gift_client_t *c, gift__hjob_t *j)
{
    gift__pool_t *pool = c->pool;
    j->next = NULL;
    j->active = 1;
    if (j->G != NULL)
        j->G->pinned++;
    if (j->old != NULL)
        j->old->pinned++;
    c->npool++;
    pthread_mutex_lock(&pool->mu);
    if (pool->tail != NULL)
        pool->tail->next = j;
    else
        pool->head = j;
    pool->tail = j;
    pthread_cond_signal(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
}

/* j is done: unpins its geometry and counts it inactive (I/O thread). */
static void hjob_retire(gift_client_t *c, gift__hjob_t *j)
{
    j->active = 0;
    if (j->G != NULL)
        j->G->pinned--;
    if (j->old != NULL)
        j->old->pinned--;
    c->npool--;
}

/* Queues ps's push of src on a codec thread (the engine's push_begin done). */
static void hjob_queue(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src,
                       gift__geo_t *G, uint32_t epoch)
{
    gift__hjob_t *j = &w->hjob[HJOB_PUSH];
    memset(j, 0, sizeof *j);
    j->kind = HJOB_PUSH;
    j->w = w;
    j->scratch = w->pwork;
    j->ps = ps;
    j->src = src;
    j->G = G;
    j->old = w->ef_on && w->ef.epoch != epoch ? gift__geo_by_epoch(w, w->ef.epoch) : NULL;
    j->epoch = epoch;
    hjob_enqueue(c, j);
}

/* Sends what w's job has published; once it is done, retires it (and fails
 * the push when a chunk failed to encode). I/O thread. */
static void hjob_collect(gift_client_t *c, gift__wire_t *w)
{
    gift__hjob_t *j = &w->hjob[HJOB_PUSH];
    gift__pstate_t *ps = j->ps;
    int done = __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
    uint32_t pub = __atomic_load_n(&j->pub, __ATOMIC_ACQUIRE);

    while (ps->nenc < pub) {
        uint32_t k = ps->nenc;
        ps->nenc = k + 1; /* also when the push is gone: its chunks are encoded */
        c->eng->push_chunk_ready(c, w, ps, k);
    }
    if (!done)
        return;
    hjob_retire(c, j);
    untransform(ps);
    c->eng->push_encoded(c, w); /* w->encoding = NULL: the wire's next push may start */
    if (j->err < 0)
        c->eng->push_fail(c, ps, j->err);
}

/* A pull's T^-1 is done: the pull completes (host_finish takes the result),
 * unless it failed or moved on meanwhile (I/O thread). */
static void finish_collect(gift_client_t *c, gift__wire_t *w, gift__hjob_t *j)
{
    gift__lstate_t *pl = j->pl;
    hjob_retire(c, j);
    if (pl->state != GIFT__PL_PENDING || pl->step != j->step || pl->ngot != w->nchunks)
        return;
    j->finished = 1;
    c->eng->pull_done(c, w, pl);
    j->finished = 0;
}

/* The turn's encoding: first what the codec threads have published, then
 * about GIFT__ENCODE_TURN_BYTES on this thread, pushes of higher priority
 * first (the order their frames would have been sorted in). */
void gift__host_encode_more(gift_client_t *c)
{
    size_t done = 0;
    for (size_t i = 0; c->npool > 0 && i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        if (w->hjob == NULL)
            continue;
        if (w->hjob[HJOB_PUSH].active)
            hjob_collect(c, w);
        for (int k = HJOB_FINISH; k < HJOB_PER_WIRE; k++)
            if (w->hjob[k].active && __atomic_load_n(&w->hjob[k].done, __ATOMIC_ACQUIRE))
                finish_collect(c, w, &w->hjob[k]);
    }
    while (c->nencoding > 0 && done < GIFT__ENCODE_TURN_BYTES) {
        gift__wire_t *best = NULL;
        for (size_t i = 0; i < c->nwires; i++)
            if (c->wires[i].encoding != NULL && c->wires[i].path->turns &&
                (c->wires[i].hjob == NULL || !c->wires[i].hjob[HJOB_PUSH].active) &&
                (best == NULL || c->wires[i].push_prio > best->push_prio))
                best = &c->wires[i];
        if (best == NULL) { /* cannot happen: nencoding counts these */
            c->nencoding = 0;
            break;
        }
        done += encode_chunks(c, best, GIFT__ENCODE_TURN_BYTES - done);
    }
}

/* ps's chunks are transformed as they are encoded, from src under epoch's
 * geometry, pinned until the last one is (untransform); a Hadamard wire's
 * under its fixed rotation (tg stays NULL). */
static void transform_as_encoded(gift__wire_t *w, gift__pstate_t *ps, const float *src,
                                 uint32_t epoch)
{
    ps->tg = w->hadamard ? NULL : gift__geo_by_epoch(w, epoch);
    ps->tsrc = src;
    if (ps->tg != NULL)
        ps->tg->pinned++;
}

/* The host path's push (gift__path_t.push): rebases or resets the residual
 * (error feedback), then transforms (geometry) and encodes the chunks one by
 * one, a few per loop turn (encode_chunks), queueing each as soon as it is
 * encoded, so that the shard works on chunk j while this thread transforms
 * chunk j + 1. With codec threads, a wire of its own that is not sent as it
 * lies does all of that on one of them instead (hjob_queue). */
static int host_push(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src,
                     const gift__geo_t *G, uint32_t epoch)
{
    int transformed = (G != NULL && !G->g.identity) || w->hadamard;
    const float *p = transformed ? w->p : src;
    int pooled = c->pool != NULL && w->hjob != NULL; /* gift__host_declare gave it jobs */

    gift__ps_codecs(w, ps, G);
    ps->zc = NULL;
    ps->zc_user = 0;
    if (p == src && !w->ef_on && ps->push.fmt == GIFT_FMT_F32 && (src == ps->asmb || ps->zc_ok)) {
        ps->zc = src;
        ps->zc_user = src != ps->asmb;
        pooled = 0; /* checked where it lies, nothing to encode */
    }
    if (transformed && !w->hadamard && gift__geo_by_epoch(w, epoch) == NULL)
        return GIFT_EEPOCH; /* cannot happen: G is the slot of epoch */
    if (pooled) {
        c->eng->push_begin(c, w, ps, epoch, p);
        if (transformed)
            transform_as_encoded(w, ps, src, epoch);
        hjob_queue(c, w, ps, src, G != NULL ? gift__geo_by_epoch(w, epoch) : NULL, epoch);
        return 0;
    }
    if (w->ef_on && w->ef.epoch != epoch) { /* the residual is added as each chunk encodes */
        gift__geo_t *old = gift__geo_by_epoch(w, w->ef.epoch);
        if (old == NULL || G == NULL || gift_ef_rebase(&w->ef, &old->g, &G->g, w->work) < 0)
            gift_ef_reset(&w->ef, epoch);
    }
    c->eng->push_begin(c, w, ps, epoch, p);
    if (transformed)
        transform_as_encoded(w, ps, src, epoch);
    c->nencoding++;
    encode_chunks(c, w, GIFT__ENCODE_TURN_BYTES);
    return 0;
}

static void host_pull_reset(gift__wire_t *w, gift__lstate_t *pl)
{
    (void)w;
    (void)pl;
}

/* With two codec threads or more, a wire of its own in one chunk takes its
 * pulls' T^-1 there once the chunk is in (host_chunk_done); else each
 * chunk's T^-1 follows its decode on this thread (host_decode), where it
 * runs while the later chunks are still on the wire. Measured (bench/
 * RESULTS.md, transforms per chunk): one 64 MiB tensor in 16 chunks 1.19x
 * and 1.25x faster with its T^-1 here than on a codec thread after its
 * last chunk; the llama list's mostly one-chunk tensors 0.90x with every
 * T^-1 here, 1.05x and 1.09x with this rule. */
static int inverse_on_pool(const gift_client_t *c, const gift__wire_t *w)
{
    return c->pool != NULL && c->codec_threads >= 2 && w->hjob != NULL && w->nchunks == 1;
}

/* Decodes a chunk into its place in pl's target, then (geometry, T^-1 not
 * left to a codec thread) transforms it back there, so that the pull's T^-1
 * runs while its later chunks are still on their way. */
static int host_decode(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl,
                       const gift__chunk_t *ch, const void *payload, size_t len)
{
    const gift__geo_t *G;
    int rc;
    if ((const float *)payload == pl->target + ch->off) {
        /* Received where it belongs (gift__eng_sink): f32 decode's check alone. */
        GIFT__PASS(c, GIFT_PASS_CHECK, ch->n);
        rc = gift_payload_check(gift__pull_codec(w, pl->epoch), payload, len, ch->n);
    } else {
        GIFT__PASS(c, GIFT_PASS_DECODE, ch->n);
        rc = gift__backend_cpu()->decode(NULL, gift__pull_codec(w, pl->epoch), payload, len, ch->n,
                                         pl->target + ch->off);
    }
    if (rc == 0 && w->hadamard) /* rotated back as it lands, like a geometry's chunks */
        return chunk_transform(c, w, NULL, 1, ch, pl->target, pl->target, NULL);
    if (rc < 0 || !w->geometry || inverse_on_pool(c, w))
        return rc;
    if ((G = gift__geo_by_epoch(w, pl->epoch)) == NULL)
        return GIFT_EEPOCH;
    if (G->g.identity)
        return 0;
    return chunk_transform(c, w, &G->g, 1, ch, pl->target, pl->target, w->work);
}

/* Every chunk of pl is in: where inverse_on_pool says so, its T^-1 goes to
 * a codec thread and the pull completes when that is done (finish_collect);
 * else it completes now (each chunk was transformed back as it came). With
 * one codec thread the T^-1 stays here: the two threads then split each
 * tensor's two GEMMs, which measured better than both on the codec thread
 * (bench/RESULTS.md, codec threads). */
static void host_chunk_done(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl,
                            const gift__chunk_t *ch, const void *payload, size_t len)
{
    gift__geo_t *G;
    (void)ch;
    (void)payload;
    (void)len;
    if (pl->ngot != w->nchunks)
        return;
    if (inverse_on_pool(c, w) && w->geometry && pl->err == 0 &&
        (G = gift__geo_by_epoch(w, pl->epoch)) != NULL && !G->g.identity) {
        int slot = (int)(pl - w->pl);
        gift__hjob_t *j = &w->hjob[HJOB_FINISH + slot];
        if (!j->active) {
            memset(j, 0, sizeof *j);
            j->kind = HJOB_FINISH;
            j->w = w;
            j->scratch = w->pwork + (size_t)(1 + slot) * w->rows * w->k;
            j->pl = pl;
            j->step = pl->step;
            j->G = G;
            hjob_enqueue(c, j);
            return;
        }
    }
    c->eng->pull_done(c, w, pl);
}

/* T^-1 of the pulled mean, in place, under the epoch it came in (or what a
 * codec thread's T^-1 of it returned), unless each chunk had its own
 * (host_decode). */
static int host_finish(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl)
{
    gift__geo_t *G;
    if (!w->geometry || !inverse_on_pool(c, w))
        return 0;
    if (w->hjob != NULL) {
        gift__hjob_t *j = &w->hjob[HJOB_FINISH + (int)(pl - w->pl)];
        if (j->finished && j->pl == pl && j->step == pl->step)
            return j->err;
    }
    if ((G = gift__geo_by_epoch(w, pl->epoch)) == NULL)
        return GIFT_EEPOCH;
    if (G->g.identity)
        return 0;
    return transform_chunks(c, w, &G->g, 1, 0, pl->target, pl->target, w->work);
}

static int host_copy(gift__wire_t *w, float *dst, const float *src, size_t n)
{
    (void)w;
    memcpy(dst, src, n * sizeof(float));
    return 0;
}

/* The sketch of X against G's basis into w->Y and w->sk_trace, its scratch
 * grown once to the largest X seen. */
static int host_sketch(gift_client_t *c, gift__wire_t *w, const gift__req_t *r,
                       const gift__geo_t *G)
{
    size_t need = (size_t)r->n * w->ks;
    (void)c;
    if (need > w->skw_cap) {
        float *nw = realloc(w->skw, need * sizeof(float));
        if (nw == NULL)
            return GIFT_ENOMEM;
        w->skw = nw;
        w->skw_cap = need;
    }
    return gift_sketch(r->in, (int)r->n, (int)w->cols, G->g.U, (int)w->ks, w->Y, &w->sk_trace,
                       w->skw);
}

/* Nothing on this thread reads the caller's memory once a call returns; a
 * codec thread's push may: wait for it. A push encoding on this thread
 * transforms the rest of its chunks now (from the caller's memory, still
 * there: quiesce comes before a failed operation completes), so that it
 * reads neither that memory nor its geometry slot (on_geometry quiesces
 * before reloading a pinned one) after this. */
static void host_quiesce(gift_client_t *c, gift__wire_t *w)
{
    gift__pstate_t *ps = w->encoding;
    int rc;
    hjob_wait(c, w);
    if (ps == NULL || ps->tsrc == NULL || (w->hjob != NULL && w->hjob[HJOB_PUSH].active))
        return; /* nothing transforms later, or the job is done and collect unpins it */
    rc = transform_chunks(c, w, ps->tg != NULL ? &ps->tg->g : NULL, 0, ps->nenc, ps->tsrc, w->p,
                          w->work);
    untransform(ps);
    if (rc < 0) {
        stop_encoding(c, w);
        c->eng->push_fail(c, ps, rc);
    }
}

const gift__path_t gift__host_path = {
    .push = host_push,
    .turns = 1,
    .is_host = 1,
    .pull_reset = host_pull_reset,
    .decode = host_decode,
    .chunk_done = host_chunk_done,
    .finish = host_finish,
    .copy = host_copy,
    .sketch = host_sketch,
    .quiesce = host_quiesce,
};

/* ------------------------------------------------------------------ */
/* The owner's decision (gift.proto Geometry fields 12..17)              */
/* ------------------------------------------------------------------ */

/* decl with the format and block of wire codec m: 0, or GIFT_ESHAPE for an
 * unknown format or block, or one that does not fit every chunk's buffer
 * (push: the push areas; else the pull buffers). */
static int treat_codec(gift_client_t *c, const gift__wire_t *w, const Gift__Codec *m,
                       const gift_codec_params_t *decl, int push, gift_codec_params_t *out)
{
    gift_layout_t l;
    *out = *decl;
    if (m == NULL)
        return 0;
    if ((uint32_t)m->format >= (uint32_t)GIFT_FMT_COUNT_)
        return GIFT_ESHAPE;
    out->fmt = (gift_format_t)m->format;
    out->block = m->block;
    for (uint32_t j = 0; j < w->nchunks; j++) {
        const gift__chunk_t *ch = gift__chunk_of(c, w, j);
        if (gift_layout(out, ch->n, &l) < 0 ||
            l.total > (push ? ch->push_l.total : ch->pull_l.total))
            return GIFT_ESHAPE;
    }
    return 0;
}

int gift__geo_load(gift_client_t *c, gift__wire_t *w, gift__geo_t *G, const Gift__Geometry *m)
{
    gift_codec_params_t push, pull;
    uint32_t k = m->transform_rank ? m->transform_rank : w->k;
    double sigma2 = m->sigma2;
    int rc;

    if (k > w->k || (rc = treat_codec(c, w, m->push_codec, &w->push, 1, &push)) < 0 ||
        (rc = treat_codec(c, w, m->pull_codec, &w->pull, 0, &pull)) < 0)
        return GIFT_ESHAPE;
    G->g.k = (int)k;
    if (k < w->k) {
        /* The lowered rank's sigma2, from the lambda and trace just received. */
        G->g.trace = m->trace;
        sigma2 = gift_geometry_rank_sigma2(&G->g, (int)k);
    }
    if ((rc = gift_geometry_load(&G->g, G->g.U, G->g.lambda, m->trace, sigma2, m->delta, m->epoch,
                                 m->identity || m->euclidean)) < 0) {
        G->g.k = (int)w->k;
        return rc;
    }
    G->push = push;
    G->pull = pull;
    G->tr =
        m->euclidean || m->transform_rank != 0 || m->push_codec != NULL || m->pull_codec != NULL;
    return 0;
}

void gift__ps_codecs(const gift__wire_t *w, gift__pstate_t *ps, const gift__geo_t *G)
{
    ps->tr = G != NULL && G->tr;
    ps->push = ps->tr ? G->push : w->push;
    ps->pull = ps->tr ? G->pull : w->pull;
}

const gift_codec_params_t *gift__pull_codec(gift__wire_t *w, uint32_t e)
{
    const gift__geo_t *G = w->geometry ? gift__geo_by_epoch(w, e) : NULL;
    return G != NULL && G->tr ? &G->pull : &w->pull;
}

size_t gift__pull_len(gift__wire_t *w, uint32_t e, const gift__chunk_t *ch)
{
    const gift_codec_params_t *p = gift__pull_codec(w, e);
    gift_layout_t l;
    if (p == &w->pull || gift_layout(p, ch->n, &l) < 0)
        return ch->pull_l.total;
    return l.total;
}
