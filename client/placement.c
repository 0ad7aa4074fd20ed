/*
 * placement.c: chunking and greedy longest-processing-time placement
 * (placement.h).
 *
 * Every worker must compute the same plan from the same declared list, so
 * nothing here depends on the C library or on the machine beyond IEEE
 * arithmetic: a chunk's weight is one multiply, stored before it is used; the
 * shard weights are sums taken in the placement order; the placement order is
 * a total order (weight descending, tensor ascending, chunk ascending), so the
 * in-place heapsort below cannot leave two chunks in an order that another
 * sort would change. The only allocations are the plan's three arrays: the
 * chunks are sorted into placement order inside the plan's own array, placed,
 * then moved back to tensor-major order.
 */
#include "placement.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gift_error.h"

/* Number of chunks for a tensor of rows x cols: rows over the whole FP32 rows
 * that fit in chunk_bytes (at least one), rounded up. Never above rows. */
static uint32_t plan_tensor_chunks(uint32_t rows, uint32_t cols, uint64_t chunk_bytes)
{
    uint64_t per = chunk_bytes / (4 * (uint64_t)cols);

    if (per == 0)
        per = 1;
    return (uint32_t)(rows / per + (rows % per != 0));
}

/* Whether chunk a is placed before chunk b: heavier first, then lower tensor
 * index, then lower chunk index. A strict total order on distinct chunks. */
static int plan_before(const gift_plan_chunk_t *a, const gift_plan_chunk_t *b)
{
    if (a->weight != b->weight)
        return a->weight > b->weight;
    if (a->tensor != b->tensor)
        return a->tensor < b->tensor;
    return a->chunk < b->chunk;
}

static void plan_swap(gift_plan_chunk_t *a, gift_plan_chunk_t *b)
{
    gift_plan_chunk_t tmp = *a;

    *a = *b;
    *b = tmp;
}

/* Restores the heap below root in c[0..n): a parent is placed after its
 * children, so c[0] is the chunk placed last. */
static void plan_sift_down(gift_plan_chunk_t *c, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;

        if (child >= n)
            return;
        if (child + 1 < n && plan_before(&c[child], &c[child + 1]))
            child++;
        if (!plan_before(&c[root], &c[child]))
            return;
        plan_swap(&c[root], &c[child]);
        root = child;
    }
}

/* Sorts c[0..n) into placement order in place, without allocating. */
static void plan_sort(gift_plan_chunk_t *c, size_t n)
{
    size_t i;

    for (i = n / 2; i-- > 0;)
        plan_sift_down(c, i, n);
    for (i = n; i-- > 1;) {
        plan_swap(&c[0], &c[i]);
        plan_sift_down(c, 0, i);
    }
}

int gift_plan_build(const gift_plan_tensor_t *t, size_t n, uint32_t nshards, uint64_t chunk_bytes,
                    gift_plan_t *out)
{
    gift_plan_t p;
    uint64_t total = 0;
    double sum = 0.0;
    size_t i, k;
    int rc = GIFT_EINVAL;

    memset(&p, 0, sizeof(p));
    if (out != NULL)
        memset(out, 0, sizeof(*out));
    /* Tensor indices are uint32_t, so at most UINT32_MAX + 1 tensors. */
    if (t == NULL || out == NULL || n == 0 || n - 1 > UINT32_MAX || nshards == 0 || chunk_bytes < 4)
        goto out;
    for (i = 0; i < n; i++) {
        double w = t[i].rows * t[i].row_weight;

        /* !(x > 0) also refuses NaN; a finite total keeps every shard sum finite. */
        if (t[i].rows == 0 || t[i].cols == 0 || !(t[i].row_weight > 0.0) || !isfinite(w))
            goto out;
        sum += w;
        if (!isfinite(sum))
            goto out;
        total += plan_tensor_chunks(t[i].rows, t[i].cols, chunk_bytes);
    }

    rc = GIFT_ENOMEM;
    if (total > SIZE_MAX / sizeof(*p.chunks) || n >= SIZE_MAX / sizeof(*p.first))
        goto out;
    p.nchunks = (size_t)total;
    p.nshards = nshards;
    p.chunks = malloc(p.nchunks * sizeof(*p.chunks));
    p.first = malloc((n + 1) * sizeof(*p.first));
    p.shard_weight = calloc(nshards, sizeof(*p.shard_weight));
    if (p.chunks == NULL || p.first == NULL || p.shard_weight == NULL)
        goto out_free_plan;

    /* Cut each tensor: the first rows % c chunks get one row more. */
    k = 0;
    for (i = 0; i < n; i++) {
        uint32_t c = plan_tensor_chunks(t[i].rows, t[i].cols, chunk_bytes);
        uint32_t base = t[i].rows / c, extra = t[i].rows % c, row = 0, j;

        p.first[i] = k;
        for (j = 0; j < c; j++, k++) {
            gift_plan_chunk_t *ch = &p.chunks[k];

            ch->tensor = (uint32_t)i;
            ch->chunk = j;
            ch->row_begin = row;
            ch->rows = base + (j < extra);
            ch->shard = 0;
            ch->weight = ch->rows * t[i].row_weight;
            row += ch->rows;
        }
    }
    p.first[n] = k;

    /* Greedy LPT: each chunk, heaviest first, to the lightest shard so far. */
    plan_sort(p.chunks, p.nchunks);
    for (k = 0; k < p.nchunks; k++) {
        uint32_t s, best = 0;

        for (s = 1; s < nshards; s++)
            if (p.shard_weight[s] < p.shard_weight[best])
                best = s;
        p.chunks[k].shard = best;
        p.shard_weight[best] += p.chunks[k].weight;
    }

    /* Back to tensor-major order: each swap puts one chunk at its home. */
    for (k = 0; k < p.nchunks; k++) {
        size_t home;

        while ((home = p.first[p.chunks[k].tensor] + p.chunks[k].chunk) != k)
            plan_swap(&p.chunks[k], &p.chunks[home]);
    }

    *out = p;
    return 0;

out_free_plan:
    gift_plan_free(&p);
out:
    return rc;
}

void gift_plan_free(gift_plan_t *p)
{
    if (p == NULL)
        return;
    free(p->chunks);
    free(p->first);
    free(p->shard_weight);
    memset(p, 0, sizeof(*p));
}

double gift_plan_imbalance(const gift_plan_t *p)
{
    double sum = 0.0, max = 0.0;
    uint32_t s;

    if (p == NULL || p->shard_weight == NULL || p->nshards == 0)
        return 0.0;
    for (s = 0; s < p->nshards; s++) {
        sum += p->shard_weight[s];
        if (p->shard_weight[s] > max)
            max = p->shard_weight[s];
    }
    if (!(sum > 0.0))
        return 0.0;
    return max / (sum / p->nshards);
}
