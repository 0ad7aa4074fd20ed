/*
 * device.c: libgiftclient's device tensors (GIFT_MEMORY_CUDA), on the GPU
 * through gpu/gift_gpu.h. Built when CUDA is; device_stub.c stands in
 * otherwise. Everything here runs on the I/O thread, except
 * gift__dev_available (any thread), the table's free (after the I/O thread is
 * gone) and ready_cb (a CUDA driver thread).
 *
 * Per device used, one gift_gpu_ctx (its own non-blocking stream and copy
 * stream, cuBLAS handle, error word) created on the I/O thread, and the
 * scratch its jobs share: the transformed gradient p, the transform's work,
 * the device payloads, the sketch's Y and work. Per device wire: the error
 * feedback residual (device), the geometry epochs (device copies of the
 * host slots, uploaded when a job first needs them), pinned host copies of
 * every chunk's push payload (two steps: what is sent, and replayed after a
 * reconnect, like the host path's payload areas) and pinned staging for
 * the pull replies (two steps). All of it is allocated once, at declaration.
 *
 * Jobs. A push (prepare: G T + e; then per chunk encode, residual, copy of
 * the payload to pinned memory on the copy stream, so that chunk i's copy
 * overlaps chunk i + 1's encode) and a pull's decode (the chunks staged so
 * far, H2D and decode into the caller's out; after the last chunk T^-1) are
 * jobs. Each device runs one job at a time, in the order they were queued:
 * the context's error word is sticky until gift_gpu_sync, so a job that
 * records a data error (NaN in a gradient, a bad code in a reply) is
 * drained and the word cleared before the next job starts, and the error is
 * charged to the operation that caused it, never to a neighbour. The GPU
 * reports through host functions (gift_gpu_push_chunk's callback per chunk,
 * gift_gpu_notify at the end of a pull job): ready_cb only stores the status
 * and wakes the loop (uv_async_send through c->io->wake); the loop then
 * sends each chunk as it becomes ready (the table's poll), in the engine's
 * usual priority order.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "giftclient_internal.h"
#include "gift_gpu.h"

enum { JOB_PUSH = 1, JOB_PULL = 2 };

/* What a host function reports: written on a driver thread, read by the I/O
 * thread once `fired` is seen (release/acquire). */
typedef struct dev_report {
    gift_client_t *c;
    int st;
    int fired;
} dev_report_t;

typedef struct gift__job {
    struct gift__job *next;
    int kind;
    int queued; /* in its device's queue, or running */
    gift__wire_t *w;
    int slot;           /* push: ps index; pull: pl index */
    const float *src;   /* push: the caller's gradient */
    uint32_t nexp;      /* reports to come (push: chunks enqueued; pull: 1) */
    uint32_t nrep;      /* push: reports taken so far (the next chunk to report) */
    uint32_t first_bad; /* push: first chunk reported with an error */
    int err;
    uint64_t gen; /* pull: the pull (dwire.pgen) it decodes for */
    int finish;   /* pull: T^-1 ran, the pull is complete */
} gift__job_t;

typedef struct gift__gdev {
    int dev;
    gift_gpu_ctx_t *ctx;
    gift__job_t *head, *tail; /* queued */
    gift__job_t *run;         /* in flight */
    int kicking;
    /* Scratch shared by the device's jobs (one runs at a time). */
    float *p_dev, *work_dev, *y_dev, *skw_dev;
    uint8_t *pay_dev;
    size_t n_max, work_max, pay_max, y_max, skw_cap;
} gift__gdev_t;

struct gift__gpu {
    int n;
    gift__gdev_t *d;
};

struct gift__dwire {
    gift__gdev_t *d;
    float *e_dev; /* error-feedback residual, rows x cols */
    uint32_t ef_epoch;
    gift_gpu_geometry_t dgeo[GIFT__GEO_SLOTS];
    uint32_t dgen[GIFT__GEO_SLOTS];
    int dvalid[GIFT__GEO_SLOTS];
    size_t *pull_off; /* per chunk: offset of its reply in a pull stage */
    size_t pull_area;
    uint8_t *stage[2];           /* pinned: the replies of a pull, per step parity */
    uint8_t *staged[2], *dec[2]; /* per chunk: reply staged; decode enqueued */
    uint64_t pgen[2];
    gift__job_t push, pull[2];
    dev_report_t *rep; /* nchunks (push) + 2 (pulls) */
    int *st_host;      /* pinned, as many: the status the GPU copies out */
};

static int cuda_rc(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    return e == cudaErrorMemoryAllocation ? GIFT_ENOMEM : GIFT_EIO;
}

static void say(gift__gdev_t *d, const gift__wire_t *w, const char *what, int rc)
{
    const char *why = d->ctx != NULL ? gift_gpu_last_error(d->ctx) : "";
    fprintf(stderr, "giftclient: %s on CUDA device %d: %s: %s%s%s%s\n", w != NULL ? w->name : "-",
            d->dev, what, gift_strerror(rc), why[0] ? " (" : "", why, why[0] ? ")" : "");
}

/* A driver thread: a chunk's payload (push) or a pull job's work is done. */
static void ready_cb(void *arg, int status)
{
    dev_report_t *r = arg;
    r->st = status;
    __atomic_store_n(&r->fired, 1, __ATOMIC_RELEASE);
    r->c->io->wake(r->c);
}

static int fired(dev_report_t *r)
{
    return __atomic_load_n(&r->fired, __ATOMIC_ACQUIRE);
}

int gift__dev_available(int device, const char *name)
{
    int n = gift_gpu_device_count();
    if (device >= 0 && device < n)
        return 0;
    fprintf(stderr,
            "giftclient: tensor %s asks for CUDA device %d, which this process does not "
            "have (%d device%s visible)\n",
            name, device, n, n == 1 ? "" : "s");
    return GIFT_ENODEV;
}

/* ------------------------------------------------------------------ */
/* Declaration and teardown                                              */
/* ------------------------------------------------------------------ */

static size_t max_sz(size_t a, size_t b)
{
    return a > b ? a : b;
}

static int dev_malloc(void **p, size_t bytes)
{
    return cuda_rc(cudaMalloc(p, bytes ? bytes : 4));
}

static const gift__path_t dev_path; /* below, with the entry points */

/* The device of g serving device number dev, or NULL. */
static gift__gdev_t *gdev_of(gift__gpu_t *g, int dev)
{
    for (int k = 0; k < g->n; k++)
        if (g->d[k].dev == dev)
            return &g->d[k];
    return NULL;
}

/* A context for every device that a device wire uses, and the size of what
 * each device's jobs share (the largest wire's). 0 or a code (said). */
static int gpu_devices(gift_client_t *c, gift__gpu_t *g)
{
    int rc;
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        gift__gdev_t *d;
        size_t push_area = 0, pull_area = 0;
        if (w->memory != GIFT_MEMORY_CUDA)
            continue;
        if ((d = gdev_of(g, w->device)) == NULL) {
            d = &g->d[g->n++];
            d->dev = w->device;
            if ((rc = gift_gpu_ctx_create(d->dev, NULL, &d->ctx)) < 0) {
                say(d, w, "creating a context", rc);
                return rc;
            }
        }
        for (uint32_t j = 0; j < w->nchunks; j++) {
            push_area += gift__chunk_of(c, w, j)->push_l.total;
            pull_area += gift__chunk_of(c, w, j)->pull_l.total;
        }
        d->n_max = max_sz(d->n_max, w->n);
        d->work_max = max_sz(d->work_max, w->geometry ? (size_t)w->rows * w->k : 0);
        d->pay_max = max_sz(d->pay_max, max_sz(push_area, pull_area));
        d->y_max = max_sz(d->y_max, w->geometry ? (size_t)w->cols * w->ks : 0);
    }
    return 0;
}

/* Each device's shared scratch, as sized by gpu_devices. 0 or a code (said). */
static int gpu_scratch(gift__gpu_t *g)
{
    int rc = 0;
    for (int k = 0; k < g->n; k++) {
        gift__gdev_t *d = &g->d[k];
        if (cuda_rc(cudaSetDevice(d->dev)) < 0 ||
            (rc = dev_malloc((void **)&d->p_dev, d->n_max * sizeof(float))) < 0 ||
            (rc = dev_malloc((void **)&d->work_dev, d->work_max * sizeof(float))) < 0 ||
            (rc = dev_malloc((void **)&d->pay_dev, d->pay_max)) < 0 ||
            (rc = dev_malloc((void **)&d->y_dev, d->y_max * sizeof(float))) < 0) {
            rc = rc < 0 ? rc : GIFT_EIO;
            say(d, NULL, "allocating scratch", rc);
            return rc;
        }
    }
    return 0;
}

/* Device wire w's own buffers on its device (of g): the reports, pinned
 * push payloads and pull staging, the jobs, the residual and the geometry
 * slots; w->path becomes the device path. 0 or a code (said, but for the
 * first allocation). */
static int dwire_alloc(gift_client_t *c, gift__gpu_t *g, gift__wire_t *w)
{
    gift__dwire_t *dw;
    gift__gdev_t *d = gdev_of(g, w->device);
    size_t push_area = 0;
    uint32_t nr = w->nchunks + 2;
    int rc;

    if ((dw = calloc(1, sizeof *dw)) == NULL)
        return GIFT_ENOMEM;
    w->dw = dw;
    w->path = &dev_path;
    dw->d = d;
    (void)cudaSetDevice(d->dev);
    rc = GIFT_ENOMEM;
    if ((dw->pull_off = calloc(w->nchunks, sizeof *dw->pull_off)) == NULL ||
        (dw->rep = calloc(nr, sizeof *dw->rep)) == NULL ||
        (dw->st_host = gift_gpu_host_alloc(nr * sizeof(int))) == NULL)
        goto fail;
    for (uint32_t j = 0; j < w->nchunks; j++) {
        const gift__chunk_t *ch = gift__chunk_of(c, w, j);
        push_area += ch->push_l.total;
        dw->pull_off[j] = dw->pull_area;
        dw->pull_area += ch->pull_l.total;
    }
    for (uint32_t j = 0; j < nr; j++)
        dw->rep[j].c = c;
    for (int s = 0; s < 2; s++) {
        if ((w->ps[s].payload = gift_gpu_host_alloc(push_area)) == NULL ||
            (dw->stage[s] = gift_gpu_host_alloc(dw->pull_area)) == NULL ||
            (dw->staged[s] = calloc(w->nchunks, 1)) == NULL ||
            (dw->dec[s] = calloc(w->nchunks, 1)) == NULL)
            goto fail;
        dw->pull[s].kind = JOB_PULL;
        dw->pull[s].w = w;
        dw->pull[s].slot = s;
    }
    dw->push.kind = JOB_PUSH;
    dw->push.w = w;
    if (w->ef_on) {
        if ((rc = dev_malloc((void **)&dw->e_dev, w->n * sizeof(float))) < 0 ||
            (rc = cuda_rc(cudaMemset(dw->e_dev, 0, w->n * sizeof(float)))) < 0)
            goto fail;
    }
    if (w->geometry)
        for (int s = 0; s < GIFT__GEO_SLOTS; s++)
            if ((rc = gift_gpu_geometry_init(&dw->dgeo[s], (int)w->cols, (int)w->k, (int)w->ks)) <
                0)
                goto fail;
    return 0;
fail:
    say(d, w, "allocating its buffers", rc);
    return rc;
}

/* gift__devices_t.declare: contexts, shared scratch, then every device
 * wire's buffers (gpu_devices, gpu_scratch, dwire_alloc). */
static int dev_declare(gift_client_t *c)
{
    gift__gpu_t *g;
    int rc;
    size_t ndw = 0;

    for (size_t i = 0; i < c->nwires; i++)
        ndw += c->wires[i].memory == GIFT_MEMORY_CUDA;
    if (ndw == 0 || c->gpu != NULL)
        return 0;
    if ((g = calloc(1, sizeof *g)) == NULL || (g->d = calloc(ndw, sizeof *g->d)) == NULL) {
        free(g);
        return GIFT_ENOMEM;
    }
    c->gpu = g;
    if ((rc = gpu_devices(c, g)) < 0 || (rc = gpu_scratch(g)) < 0)
        return rc;
    for (size_t i = 0; i < c->nwires; i++)
        if (c->wires[i].memory == GIFT_MEMORY_CUDA && (rc = dwire_alloc(c, g, &c->wires[i])) < 0)
            return rc;
    return 0;
}

/* Frees every device resource (the GPU idle, no host function pending). */
static void dev_release(gift_client_t *c)
{
    gift__gpu_t *g = c->gpu;
    int prev = -1;
    if (g == NULL)
        return;
    /* dev_free may run on the caller's thread: keep its device. */
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void)cudaGetLastError();
        prev = -1;
    }
    for (size_t i = 0; i < c->nwires; i++) {
        gift__wire_t *w = &c->wires[i];
        gift__dwire_t *dw = w->dw;
        if (dw == NULL)
            continue;
        (void)cudaSetDevice(dw->d->dev);
        if (dw->e_dev != NULL)
            cudaFree(dw->e_dev);
        for (int s = 0; s < GIFT__GEO_SLOTS; s++)
            if (dw->dgeo[s].U_dev != NULL)
                gift_gpu_geometry_free(&dw->dgeo[s]);
        for (int s = 0; s < 2; s++) {
            gift_gpu_host_free(w->ps[s].payload);
            w->ps[s].payload = NULL;
            gift_gpu_host_free(dw->stage[s]);
            free(dw->staged[s]);
            free(dw->dec[s]);
        }
        gift_gpu_host_free(dw->st_host);
        free(dw->rep);
        free(dw->pull_off);
        free(dw);
        w->dw = NULL;
    }
    for (int k = 0; k < g->n; k++) {
        gift__gdev_t *d = &g->d[k];
        (void)cudaSetDevice(d->dev);
        cudaFree(d->p_dev);
        cudaFree(d->work_dev);
        cudaFree(d->pay_dev);
        cudaFree(d->y_dev);
        cudaFree(d->skw_dev);
        gift_gpu_ctx_free(d->ctx);
    }
    free(g->d);
    free(g);
    c->gpu = NULL;
    if (prev >= 0)
        (void)cudaSetDevice(prev);
}

static void dev_close(gift_client_t *c)
{
    gift__gpu_t *g = c->gpu;
    if (g == NULL)
        return;
    for (int k = 0; k < g->n; k++) {
        gift__gdev_t *d = &g->d[k];
        gift__job_t *j = d->run;
        if (d->ctx == NULL)
            continue;
        (void)cudaSetDevice(d->dev);
        (void)gift_gpu_sync(d->ctx);
        /* A host function may run just after the stream work it follows. */
        if (j != NULL) {
            gift__dwire_t *dw = j->w->dw;
            for (int spin = 0; spin < 2000; spin++) {
                int pending = 0;
                if (j->kind == JOB_PUSH) {
                    for (uint32_t q = j->nrep; q < j->nexp; q++)
                        pending |= !fired(&dw->rep[q]);
                } else {
                    pending = !fired(&dw->rep[j->w->nchunks + j->slot]);
                }
                if (!pending)
                    break;
                nanosleep(&(struct timespec){0, 1000000}, NULL);
            }
        }
        d->run = d->head = d->tail = NULL;
    }
    dev_release(c);
}

static void dev_free(gift_client_t *c)
{
    dev_release(c);
}

/* ------------------------------------------------------------------ */
/* Jobs                                                                  */
/* ------------------------------------------------------------------ */

static void dev_kick(gift_client_t *c, gift__gdev_t *d);

static void job_queue(gift_client_t *c, gift__job_t *j)
{
    gift__gdev_t *d = j->w->dw->d;
    if (j->queued)
        return;
    j->queued = 1;
    j->next = NULL;
    if (d->tail)
        d->tail->next = j;
    else
        d->head = j;
    d->tail = j;
    dev_kick(c, d);
}

/* Geometry slot G of w on the device (uploaded when stale); the device is
 * idle, so the upload is waited for: the host slot may be reloaded later. */
static int geo_dev(gift__gdev_t *d, gift__wire_t *w, const gift__geo_t *G,
                   const gift_gpu_geometry_t **out)
{
    gift__dwire_t *dw = w->dw;
    int s = (int)(G - w->geo), rc;
    if (!dw->dvalid[s] || dw->dgen[s] != G->gen) {
        dw->dvalid[s] = 0;
        if ((rc = gift_gpu_geometry_upload(d->ctx, &dw->dgeo[s], &G->g)) < 0 ||
            (rc = gift_gpu_sync(d->ctx)) < 0)
            return rc;
        dw->dvalid[s] = 1;
        dw->dgen[s] = G->gen;
    }
    *out = &dw->dgeo[s];
    return 0;
}

/* The push job is over (every report in): clear a data error, reset the
 * residual it left undefined, let the wire push again. */
static void push_retire(gift_client_t *c, gift__gdev_t *d, gift__job_t *j)
{
    gift__wire_t *w = j->w;
    if (j->err != 0) {
        (void)gift_gpu_sync(d->ctx);
        if (w->ef_on && j->first_bad < w->nchunks) {
            /* From the failing chunk on, the residual update read a decode
             * that wrote nothing: start those chunks' residual afresh. */
            size_t off = gift__chunk_of(c, w, j->first_bad)->off;
            (void)cudaMemsetAsync(w->dw->e_dev + off, 0, (w->n - off) * sizeof(float),
                                  (cudaStream_t)gift_gpu_ctx_stream(d->ctx));
            (void)gift_gpu_sync(d->ctx);
        }
    }
    c->eng->push_encoded(c, w);
}

/* Enqueues a push; returns 1 when reports are to come, 0 when it is over. */
static int run_push(gift_client_t *c, gift__gdev_t *d, gift__job_t *j)
{
    gift__wire_t *w = j->w;
    gift__dwire_t *dw = w->dw;
    gift__pstate_t *ps = &w->ps[j->slot];
    const gift_gpu_geometry_t *dg = NULL;
    gift__geo_t *G = NULL;
    int rc = 0;

    j->nexp = j->nrep = 0;
    j->err = 0;
    j->first_bad = UINT32_MAX;
    if (c->eng->push_gone(ps)) { /* failed or abandoned while it waited */
        c->eng->push_encoded(c, w);
        return 0;
    }
    (void)cudaSetDevice(d->dev);
    if (w->geometry) {
        if ((G = gift__geo_by_epoch(w, ps->epoch)) == NULL)
            rc = GIFT_EEPOCH;
        else
            rc = geo_dev(d, w, G, &dg);
    }
    if (rc == 0 && w->ef_on && dw->ef_epoch != ps->epoch) {
        /* The residual follows the geometry (gift_ef_rebase), else restarts. */
        gift__geo_t *old = gift__geo_by_epoch(w, dw->ef_epoch);
        const gift_gpu_geometry_t *dold = NULL;
        if (old == NULL || G == NULL || geo_dev(d, w, old, &dold) < 0 ||
            gift_gpu_transform(d->ctx, dold, 1, dw->e_dev, (int)w->rows, dw->e_dev, d->work_dev) <
                0 ||
            gift_gpu_transform(d->ctx, dg, 0, dw->e_dev, (int)w->rows, dw->e_dev, d->work_dev) < 0)
            rc = cuda_rc(cudaMemsetAsync(dw->e_dev, 0, w->n * sizeof(float),
                                         (cudaStream_t)gift_gpu_ctx_stream(d->ctx)));
        dw->ef_epoch = ps->epoch;
    }
    if (rc == 0)
        rc = gift_gpu_push_prepare(d->ctx, dg, j->src, (int)w->rows, (int)w->cols,
                                   w->ef_on ? dw->e_dev : NULL, d->p_dev, d->work_dev);
    for (uint32_t k = 0; rc == 0 && k < w->nchunks; k++) {
        const gift__chunk_t *ch = gift__chunk_of(c, w, k);
        gift_codec_params_t cp = ps->push;
        cp.sr.seed = c->seed;
        cp.sr.rank = (uint32_t)c->rank;
        cp.sr.key = w->key;
        cp.sr.chunk = ch->idx;
        cp.sr.step = ps->step;
        dw->rep[k].fired = 0;
        rc = gift_gpu_push_chunk(d->ctx, &cp, d->p_dev + ch->off, ch->n,
                                 w->ef_on ? dw->e_dev + ch->off : NULL, d->pay_dev + ch->push_off,
                                 ps->payload + ch->push_off, gift__ps_push_len(ps, ch),
                                 &dw->st_host[k], ready_cb, &dw->rep[k]);
        if (rc == 0)
            j->nexp++;
    }
    if (rc < 0) {
        if (rc != GIFT_EEPOCH)
            say(d, w, "push", rc);
        j->err = rc;
        j->first_bad = j->nexp;
        c->eng->push_fail(c, ps, rc);
        if (j->nexp == 0) {
            push_retire(c, d, j);
            return 0;
        }
    }
    return 1;
}

/* Takes a push's chunk reports in order; 1 while some are to come. */
static int poll_push(gift_client_t *c, gift__gdev_t *d, gift__job_t *j)
{
    gift__wire_t *w = j->w;
    gift__dwire_t *dw = w->dw;
    gift__pstate_t *ps = &w->ps[j->slot];
    while (j->nrep < j->nexp && fired(&dw->rep[j->nrep])) {
        uint32_t k = j->nrep++;
        int st = dw->rep[k].st;
        if (j->err != 0)
            continue;
        if (st == 0) {
            c->eng->push_chunk_ready(c, w, ps, k);
        } else {
            j->err = st;
            j->first_bad = k;
            c->eng->push_fail(c, ps, st);
        }
    }
    if (j->nrep < j->nexp)
        return 1;
    push_retire(c, d, j);
    return 0;
}

static int pull_more(const gift__wire_t *w, int slot)
{
    for (uint32_t k = 0; k < w->nchunks; k++)
        if (w->dw->staged[slot][k] && !w->dw->dec[slot][k])
            return 1;
    return 0;
}

/* Enqueues the decode of the replies staged so far, and T^-1 after the
 * last; returns 1 when a report is to come, 0 when the job is over. */
static int run_pull(gift_client_t *c, gift__gdev_t *d, gift__job_t *j)
{
    gift__wire_t *w = j->w;
    gift__dwire_t *dw = w->dw;
    gift__lstate_t *pl = &w->pl[j->slot];
    dev_report_t *rep = &dw->rep[w->nchunks + j->slot];
    const gift_gpu_geometry_t *dg = NULL;
    uint32_t enq = 0;
    int rc = 0, last = 1;

    j->gen = dw->pgen[j->slot];
    j->finish = 0;
    j->nexp = 0;
    if (pl->state != GIFT__PL_PENDING)
        return 0;
    if (pl->err != 0) {
        if (pl->ngot == w->nchunks)
            c->eng->pull_done(c, w, pl);
        return 0;
    }
    (void)cudaSetDevice(d->dev);
    for (uint32_t k = 0; k < w->nchunks; k++)
        last &= dw->staged[j->slot][k] || dw->dec[j->slot][k];
    if (last && w->geometry) {
        /* The epoch's upload first: it waits for the device, idle now. */
        gift__geo_t *G = gift__geo_by_epoch(w, pl->epoch);
        rc = G == NULL ? GIFT_EEPOCH : geo_dev(d, w, G, &dg);
    }
    for (uint32_t k = 0; rc == 0 && k < w->nchunks; k++) {
        const gift__chunk_t *ch = gift__chunk_of(c, w, k);
        if (!dw->staged[j->slot][k] || dw->dec[j->slot][k])
            continue;
        rc = gift_gpu_pull_chunk(d->ctx, gift__pull_codec(w, pl->epoch),
                                 dw->stage[j->slot] + dw->pull_off[k],
                                 gift__pull_len(w, pl->epoch, ch), ch->n,
                                 d->pay_dev + dw->pull_off[k], pl->target + ch->off);
        if (rc == 0) {
            dw->dec[j->slot][k] = 1;
            enq++;
        }
    }
    if (rc == 0 && last) {
        rc = gift_gpu_pull_finish(d->ctx, dg, (int)w->rows, pl->target, d->work_dev);
        j->finish = 1;
    }
    if (rc == 0 && enq == 0 && !j->finish)
        return 0;
    if (rc == 0) {
        rep->fired = 0;
        rc = gift_gpu_notify(d->ctx, &dw->st_host[w->nchunks + j->slot], ready_cb, rep);
    }
    if (rc < 0) {
        if (rc != GIFT_EEPOCH)
            say(d, w, "pull", rc);
        (void)gift_gpu_sync(d->ctx);
        if (pl->err == 0)
            pl->err = rc;
        if (pl->ngot == w->nchunks)
            c->eng->pull_done(c, w, pl);
        return 0;
    }
    j->nexp = 1;
    return 1;
}

/* 1 while the pull job's report is to come, 0 when over, 2 to run again. */
static int poll_pull(gift_client_t *c, gift__gdev_t *d, gift__job_t *j)
{
    gift__wire_t *w = j->w;
    gift__dwire_t *dw = w->dw;
    gift__lstate_t *pl = &w->pl[j->slot];
    dev_report_t *rep = &dw->rep[w->nchunks + j->slot];
    int st;

    if (!fired(rep))
        return 1;
    st = rep->st;
    if (st != 0)
        (void)gift_gpu_sync(d->ctx); /* clears the word for the next job */
    if (j->gen != dw->pgen[j->slot] || pl->state != GIFT__PL_PENDING)
        return pl->state == GIFT__PL_PENDING && pull_more(w, j->slot) ? 2 : 0; /* stale */
    if (st != 0 && pl->err == 0)
        pl->err = st;
    if (j->finish || (pl->err != 0 && pl->ngot == w->nchunks)) {
        c->eng->pull_done(c, w, pl);
        return 0;
    }
    return pull_more(w, j->slot) ? 2 : 0;
}

static int run_job(gift_client_t *c, gift__gdev_t *d, gift__job_t *j)
{
    return j->kind == JOB_PUSH ? run_push(c, d, j) : run_pull(c, d, j);
}

/* Starts queued jobs while the device is idle. */
static void dev_kick(gift_client_t *c, gift__gdev_t *d)
{
    if (d->kicking)
        return;
    d->kicking = 1;
    while (d->run == NULL && d->head != NULL) {
        gift__job_t *j = d->head;
        d->head = j->next;
        if (d->head == NULL)
            d->tail = NULL;
        j->next = NULL;
        if (run_job(c, d, j))
            d->run = j;
        else
            j->queued = 0;
    }
    d->kicking = 0;
}

static void dev_quiesce(gift_client_t *c, gift__wire_t *w)
{
    gift__gdev_t *d;
    (void)c;
    if (w->dw == NULL)
        return;
    d = w->dw->d;
    if (d->run == NULL || d->run->w != w)
        return;
    /* The caller's buffers are touched only on the context's stream (the
     * push's transform/copy, the pull's decode and T^-1); the copy stream
     * moves payloads between the library's own buffers. The job's reports
     * still arrive and are taken as stale. */
    (void)cudaSetDevice(d->dev);
    (void)cudaStreamSynchronize((cudaStream_t)gift_gpu_ctx_stream(d->ctx));
}

static void dev_poll(gift_client_t *c)
{
    gift__gpu_t *g = c->gpu;
    for (int k = 0; g != NULL && k < g->n; k++) {
        gift__gdev_t *d = &g->d[k];
        while (d->run != NULL) {
            gift__job_t *j = d->run;
            int r = j->kind == JOB_PUSH ? poll_push(c, d, j) : poll_pull(c, d, j);
            if (r == 1)
                break;
            d->run = NULL;
            j->queued = 0;
            c->rescan = 1; /* a sketch may wait for the device to be idle */
            if (r == 2)
                job_queue(c, j);
            dev_kick(c, d);
        }
    }
}

/* ------------------------------------------------------------------ */
/* The engine's entry points                                             */
/* ------------------------------------------------------------------ */

static void dev_push_job(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src)
{
    gift__job_t *j = &w->dw->push;
    j->slot = (int)(ps - w->ps);
    j->src = src;
    job_queue(c, j);
}

static void dev_pull_reset(gift__wire_t *w, gift__lstate_t *pl)
{
    int s = (int)(pl - w->pl);
    w->dw->pgen[s]++;
    memset(w->dw->staged[s], 0, w->nchunks);
    memset(w->dw->dec[s], 0, w->nchunks);
}

static void dev_pull_chunk(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl,
                           const gift__chunk_t *ch, const void *payload, size_t len)
{
    gift__dwire_t *dw = w->dw;
    int s = (int)(pl - w->pl);
    if (payload != NULL && len == gift__pull_len(w, pl->epoch, ch)) {
        memcpy(dw->stage[s] + dw->pull_off[ch->idx], payload, len);
        dw->staged[s][ch->idx] = 1;
    }
    job_queue(c, &dw->pull[s]);
}

static int dev_sketch(gift_client_t *c, gift__wire_t *w, const gift__req_t *r, const gift__geo_t *G)
{
    gift__gdev_t *d = w->dw->d;
    const gift_gpu_geometry_t *dg;
    size_t need = (size_t)r->n * w->ks;
    int rc;

    (void)c;
    if (d->run != NULL || d->head != NULL)
        return 1;
    (void)cudaSetDevice(d->dev);
    if ((rc = geo_dev(d, w, G, &dg)) < 0)
        return rc;
    if (need > d->skw_cap) {
        /* X's row count is the caller's: grown once to the largest seen. */
        cudaFree(d->skw_dev);
        d->skw_dev = NULL;
        d->skw_cap = 0;
        if ((rc = dev_malloc((void **)&d->skw_dev, need * sizeof(float))) < 0)
            return rc;
        d->skw_cap = need;
    }
    if ((rc = gift_gpu_sketch(d->ctx, r->in, (int)r->n, (int)w->cols, dg->U_dev, (int)w->ks,
                              d->y_dev, &w->sk_trace, d->skw_dev)) < 0) {
        if (rc != GIFT_ENONFINITE)
            say(d, w, "sketch", rc);
        return rc;
    }
    return cuda_rc(cudaMemcpy(w->Y, d->y_dev, (size_t)w->cols * w->ks * sizeof(float),
                              cudaMemcpyDeviceToHost));
}

static int dev_copy(gift__wire_t *w, float *dst, const float *src, size_t n)
{
    (void)cudaSetDevice(w->dw->d->dev);
    return cuda_rc(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice));
}

/* The device path's push: begun as the engine's, then the push job runs the
 * transform, residual and encoding on the wire's GPU. */
static int dev_push(gift_client_t *c, gift__wire_t *w, gift__pstate_t *ps, const float *src,
                    const gift__geo_t *G, uint32_t epoch)
{
    gift__ps_codecs(w, ps, G);
    c->eng->push_begin(c, w, ps, epoch, NULL); /* not in nencoding: the device reports */
    dev_push_job(c, w, ps, src);
    return 0;
}

/* Replies are decoded by the pull job, once staged (dev_pull_chunk). */
static int dev_decode(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl,
                      const gift__chunk_t *ch, const void *payload, size_t len)
{
    (void)c, (void)w, (void)pl, (void)ch, (void)payload, (void)len;
    return 0;
}

/* T^-1 ran on the device with the decode. */
static int dev_finish(gift_client_t *c, gift__wire_t *w, gift__lstate_t *pl)
{
    (void)c, (void)w, (void)pl;
    return 0;
}

static const gift__path_t dev_path = {
    .push = dev_push,
    .turns = 0,
    .is_host = 0,
    .pull_reset = dev_pull_reset,
    .decode = dev_decode,
    .chunk_done = dev_pull_chunk,
    .finish = dev_finish,
    .copy = dev_copy,
    .sketch = dev_sketch,
    .quiesce = dev_quiesce,
};

static const gift__devices_t DEVICES = {dev_declare, dev_poll, dev_close, dev_free};

const gift__devices_t *gift__devices(void)
{
    return &DEVICES;
}
