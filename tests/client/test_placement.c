/*
 * test_placement.c: client/placement.c, chunking and shard placement.
 *
 * Every plan built here is checked against the contract of placement.h by
 * check_plan: whole-row chunks, as even as documented, covering each row
 * once, weights of rows x row_weight. Small random lists are also placed by
 * a slow reference (select the next chunk by the documented order, scan for
 * the lightest shard) and must match it bit for bit. The acceptance case is
 * the Llama tensor list, which must come within 1.15x of perfect balance.
 */
#include <check.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gift_error.h"
#include "placement.h"
#include "gift_test_check.h"
#include "gift_test_rng.h"

/* ck_assert_msg for loops: a passing ck_assert costs a write() to Check's
 * pipe; this one only calls into Check when it fails. */
#define require(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond))                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                             \
    } while (0)

#define MIB (1024u * 1024u)
#define MAX_TENSORS 512
#define MAX_SHARDS 16    /* the most shards a test asks for */
#define MAX_CHUNKS 16384 /* the most chunks the reference placement takes */

/* ---- state owned by the running test, released by the fixture ------------ */

static gift_plan_t g_plan[2];
static gift_plan_tensor_t g_t[MAX_TENSORS];

static void setup(void)
{
    memset(g_plan, 0, sizeof(g_plan));
    memset(g_t, 0, sizeof(g_t));
}

static void teardown(void)
{
    gift_plan_free(&g_plan[0]);
    gift_plan_free(&g_plan[1]);
}

/* ---- the contract of placement.h ----------------------------------------- */

/* Checks every documented property of p, built from t[0..n) over nshards with
 * chunk_bytes, that does not depend on the placement order. */
static void check_plan(const gift_plan_t *p, const gift_plan_tensor_t *t, size_t n,
                       uint32_t nshards, uint64_t chunk_bytes)
{
    static double sum[MAX_SHARDS];
    size_t i, k = 0;
    uint32_t s;

    require(p->chunks != NULL && p->first != NULL && p->shard_weight != NULL,
            "plan arrays chunks=%p first=%p shard_weight=%p", (void *)p->chunks, (void *)p->first,
            (void *)p->shard_weight);
    require(p->nshards == nshards, "nshards %" PRIu32 ", want %" PRIu32, p->nshards, nshards);
    require(p->first[0] == 0, "first[0] = %zu", p->first[0]);
    for (i = 0; i < n; i++) {
        uint64_t per = chunk_bytes / (4 * (uint64_t)t[i].cols);
        uint64_t c = (t[i].rows + (per ? per : 1) - 1) / (per ? per : 1);
        uint32_t base = (uint32_t)(t[i].rows / c), extra = (uint32_t)(t[i].rows % c);
        uint32_t row = 0, j;

        require(p->first[i + 1] - p->first[i] == c,
                "tensor %zu (%" PRIu32 " x %" PRIu32 ", chunk_bytes %" PRIu64 "): %zu chunks, "
                "want %" PRIu64,
                i, t[i].rows, t[i].cols, chunk_bytes, p->first[i + 1] - p->first[i], c);
        for (j = 0; j < c; j++, k++) {
            const gift_plan_chunk_t *ch = &p->chunks[k];
            uint32_t want = base + (j < extra);

            require(ch->tensor == i && ch->chunk == j,
                    "chunks[%zu] is tensor %" PRIu32 " chunk %" PRIu32 ", want %zu/%" PRIu32, k,
                    ch->tensor, ch->chunk, i, j);
            require(ch->row_begin == row && ch->rows == want,
                    "tensor %zu chunk %" PRIu32 ": rows [%" PRIu32 ", +%" PRIu32 "), want [%" PRIu32
                    ", +%" PRIu32 ")",
                    i, j, ch->row_begin, ch->rows, row, want);
            require(ch->rows >= 1 &&
                        (ch->rows == 1 || (uint64_t)ch->rows * 4 * t[i].cols <= chunk_bytes),
                    "tensor %zu chunk %" PRIu32 ": %" PRIu32 " rows of %" PRIu32
                    " cols exceed %" PRIu64 " bytes",
                    i, j, ch->rows, t[i].cols, chunk_bytes);
            require(ch->weight == ch->rows * t[i].row_weight,
                    "tensor %zu chunk %" PRIu32 ": weight %.17g, want %.17g", i, j, ch->weight,
                    ch->rows * t[i].row_weight);
            require(ch->shard < nshards, "tensor %zu chunk %" PRIu32 " on shard %" PRIu32, i, j,
                    ch->shard);
            row += ch->rows;
        }
        require(row == t[i].rows, "tensor %zu: chunks cover %" PRIu32 " rows of %" PRIu32, i, row,
                t[i].rows);
    }
    require(p->first[n] == k && p->nchunks == k, "first[n] = %zu, nchunks = %zu, want %zu",
            p->first[n], p->nchunks, k);

    /* Shard weights are the sums of their chunks (in some order: to 1e-12). */
    ck_assert_msg(nshards <= MAX_SHARDS, "%" PRIu32 " shards, at most %d here", nshards,
                  MAX_SHARDS);
    memset(sum, 0, sizeof(sum));
    for (k = 0; k < p->nchunks; k++)
        sum[p->chunks[k].shard] += p->chunks[k].weight;
    for (s = 0; s < nshards; s++)
        require(fabs(sum[s] - p->shard_weight[s]) <= 1e-12 * sum[s],
                "shard %" PRIu32 ": weight %.17g, chunks sum to %.17g", s, p->shard_weight[s],
                sum[s]);
}

/* Places p's chunks again the slow way (next chunk by the documented total
 * order, then the lightest shard, ties to the lower index) and requires the
 * same shards and bit-identical shard weights. */
static void check_reference_placement(const gift_plan_t *p)
{
    static unsigned char done[MAX_CHUNKS];
    static double w[MAX_SHARDS];
    size_t step, k;

    ck_assert_msg(p->nchunks <= MAX_CHUNKS && p->nshards <= MAX_SHARDS,
                  "%zu chunks over %" PRIu32 " shards, at most %d over %d here", p->nchunks,
                  p->nshards, MAX_CHUNKS, MAX_SHARDS);
    memset(done, 0, sizeof(done));
    memset(w, 0, sizeof(w));
    for (step = 0; step < p->nchunks; step++) {
        size_t best = SIZE_MAX;
        uint32_t s, to = 0;

        for (k = 0; k < p->nchunks; k++) {
            const gift_plan_chunk_t *a = &p->chunks[k];

            if (done[k])
                continue;
            /* Tensor-major order already breaks ties: the first heaviest wins. */
            if (best == SIZE_MAX || a->weight > p->chunks[best].weight)
                best = k;
        }
        for (s = 1; s < p->nshards; s++)
            if (w[s] < w[to])
                to = s;
        done[best] = 1;
        w[to] += p->chunks[best].weight;
        require(p->chunks[best].shard == to,
                "step %zu: tensor %" PRIu32 " chunk %" PRIu32 " (weight %.17g) on shard %" PRIu32
                ", reference puts it on %" PRIu32,
                step, p->chunks[best].tensor, p->chunks[best].chunk, p->chunks[best].weight,
                p->chunks[best].shard, to);
    }
    for (k = 0; k < p->nshards; k++)
        require(memcmp(&w[k], &p->shard_weight[k], sizeof(double)) == 0,
                "shard %zu: weight %.17g, reference %.17g", k, p->shard_weight[k], w[k]);
}

/* Requires a and b to be the same plan, field by field (memcmp would read the
 * padding of gift_plan_chunk_t). */
static void check_same_plan(const gift_plan_t *a, const gift_plan_t *b, size_t n)
{
    size_t k;

    require(a->nchunks == b->nchunks && a->nshards == b->nshards,
            "nchunks %zu vs %zu, nshards %" PRIu32 " vs %" PRIu32, a->nchunks, b->nchunks,
            a->nshards, b->nshards);
    for (k = 0; k <= n; k++)
        require(a->first[k] == b->first[k], "first[%zu]: %zu vs %zu", k, a->first[k], b->first[k]);
    for (k = 0; k < a->nchunks; k++) {
        const gift_plan_chunk_t *x = &a->chunks[k], *y = &b->chunks[k];

        require(x->tensor == y->tensor && x->chunk == y->chunk && x->row_begin == y->row_begin &&
                    x->rows == y->rows && x->shard == y->shard &&
                    memcmp(&x->weight, &y->weight, sizeof(double)) == 0,
                "chunks[%zu]: %" PRIu32 "/%" PRIu32 " rows %" PRIu32 "+%" PRIu32 " shard %" PRIu32
                " w %.17g vs %" PRIu32 "/%" PRIu32 " rows %" PRIu32 "+%" PRIu32 " shard %" PRIu32
                " w %.17g",
                k, x->tensor, x->chunk, x->row_begin, x->rows, x->shard, x->weight, y->tensor,
                y->chunk, y->row_begin, y->rows, y->shard, y->weight);
    }
    for (k = 0; k < a->nshards; k++)
        require(memcmp(&a->shard_weight[k], &b->shard_weight[k], sizeof(double)) == 0,
                "shard_weight[%zu]: %.17g vs %.17g", k, a->shard_weight[k], b->shard_weight[k]);
}

static void build_ok(gift_plan_t *p, const gift_plan_tensor_t *t, size_t n, uint32_t nshards,
                     uint64_t chunk_bytes)
{
    int rc = gift_plan_build(t, n, nshards, chunk_bytes, p);

    ck_assert_msg(rc == 0,
                  "gift_plan_build(n=%zu, nshards=%" PRIu32 ", chunk_bytes=%" PRIu64 ") = %d (%s)",
                  n, nshards, chunk_bytes, rc, gift_strerror(rc));
    check_plan(p, t, n, nshards, chunk_bytes);
}

/* ---- the Llama tensor list ----------------------------------------------- */

typedef struct llama_cfg {
    const char *name;
    uint32_t d, h, layers, vocab;
} llama_cfg_t;

static const llama_cfg_t llama[] = {
    {"llama-7b", 4096, 11008, 32, 32000},
    {"small", 512, 1376, 8, 32000},
};

/* Bytes per element on the wire, push plus pull. */
static const struct {
    const char *name;
    double bytes;
} wire[] = {
    {"fp8+fp8", 2 * 1.03},
    {"f32+f32", 2 * 4.0},
};

static void put(gift_plan_tensor_t *t, size_t *n, uint32_t rows, uint32_t cols, double per_elem)
{
    ck_assert_msg(*n < MAX_TENSORS, "more than %d tensors", MAX_TENSORS);
    t[*n].rows = rows;
    t[*n].cols = cols;
    t[*n].row_weight = cols * per_elem;
    (*n)++;
}

/* Fills t with the tensors of cfg in model order (rows x cols as the weight
 * matrices are stored: out x in); returns their number. */
static size_t llama_tensors(gift_plan_tensor_t *t, const llama_cfg_t *cfg, double per_elem)
{
    size_t n = 0;
    uint32_t l;

    put(t, &n, cfg->vocab, cfg->d, per_elem); /* embedding */
    for (l = 0; l < cfg->layers; l++) {
        put(t, &n, 1, cfg->d, per_elem);      /* attention RMSNorm */
        put(t, &n, cfg->d, cfg->d, per_elem); /* q */
        put(t, &n, cfg->d, cfg->d, per_elem); /* k */
        put(t, &n, cfg->d, cfg->d, per_elem); /* v */
        put(t, &n, cfg->d, cfg->d, per_elem); /* o */
        put(t, &n, 1, cfg->d, per_elem);      /* MLP RMSNorm */
        put(t, &n, cfg->h, cfg->d, per_elem); /* gate */
        put(t, &n, cfg->h, cfg->d, per_elem); /* up */
        put(t, &n, cfg->d, cfg->h, per_elem); /* down */
    }
    put(t, &n, 1, cfg->d, per_elem);          /* final RMSNorm */
    put(t, &n, cfg->vocab, cfg->d, per_elem); /* LM head */
    return n;
}

/* ---- chunking ------------------------------------------------------------ */

/* Hand-computed cuts: {rows, cols, chunk_bytes, expected rows per chunk}. */
static const struct {
    uint32_t rows, cols;
    uint64_t chunk_bytes;
    uint32_t want[8];
    uint32_t nwant;
} cuts[] = {
    /* 16-byte rows, 3 per chunk: 4 chunks, 10 % 4 = 2 of them one longer. */
    {10, 4, 48, {3, 3, 2, 2}, 4},
    /* chunk_bytes not a multiple of a row: still 3 rows. */
    {10, 4, 63, {3, 3, 2, 2}, 4},
    /* exact multiple. */
    {12, 4, 48, {3, 3, 3, 3}, 4},
    /* fits in one chunk. */
    {7, 4, 4096, {7}, 1},
    /* rows of 400 bytes over 64-byte chunks: one row each. */
    {5, 100, 64, {1, 1, 1, 1, 1}, 5},
    /* the smallest chunk_bytes: one float per chunk. */
    {3, 1, 4, {1, 1, 1}, 3},
    /* 11 rows, 4 per chunk: 3 chunks, 11 % 3 = 2 longer. */
    {11, 1, 16, {4, 4, 3}, 3},
    /* 1-D tensors: one chunk even when the row exceeds chunk_bytes. */
    {1, 4096, 4 * MIB, {1}, 1},
    {1, 8 * MIB, 4 * MIB, {1}, 1},
    {1, 1, 4, {1}, 1},
    /* chunk_bytes far above anything: one chunk. */
    {100000, 7, UINT64_MAX, {100000}, 1},
};

START_TEST(test_cut_by_hand)
{
    size_t i;

    for (i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        gift_plan_tensor_t t = {cuts[i].rows, cuts[i].cols, 1.5};
        gift_plan_t *p = &g_plan[0];
        uint32_t j, row = 0;

        build_ok(p, &t, 1, 1, cuts[i].chunk_bytes);
        ck_assert_msg(p->nchunks == cuts[i].nwant,
                      "%" PRIu32 " x %" PRIu32 " at %" PRIu64 " bytes: %zu chunks, want %" PRIu32,
                      t.rows, t.cols, cuts[i].chunk_bytes, p->nchunks, cuts[i].nwant);
        for (j = 0; j < cuts[i].nwant; j++) {
            ck_assert_msg(p->chunks[j].rows == cuts[i].want[j] && p->chunks[j].row_begin == row,
                          "%" PRIu32 " x %" PRIu32 " at %" PRIu64 " bytes, chunk %" PRIu32
                          ": rows [%" PRIu32 ", +%" PRIu32 "), want [%" PRIu32 ", +%" PRIu32 ")",
                          t.rows, t.cols, cuts[i].chunk_bytes, j, p->chunks[j].row_begin,
                          p->chunks[j].rows, row, cuts[i].want[j]);
            row += cuts[i].want[j];
        }
        ck_assert_msg(p->shard_weight[0] == t.rows * 1.5,
                      "case %zu: shard weight %.17g, want %.17g", i, p->shard_weight[0],
                      t.rows * 1.5);
        ck_assert_msg(gift_plan_imbalance(p) == 1.0, "case %zu, one shard: imbalance %.17g", i,
                      gift_plan_imbalance(p));
        gift_plan_free(p);
    }
}
END_TEST

/* The Llama shapes at 4 MiB: q is 16 chunks of 256 rows, gate 43 of 256,
 * down (4096 rows of 44032 bytes: 95 per chunk) 44 chunks of 94 or 93. */
START_TEST(test_cut_llama)
{
    size_t n = llama_tensors(g_t, &llama[0], 1.0);
    gift_plan_t *p = &g_plan[0];
    struct {
        size_t tensor;
        size_t nchunks;
        uint32_t first_rows, last_rows;
    } want[] = {{0, 125, 256, 256}, {1, 1, 1, 1},    {2, 16, 256, 256},
                {7, 43, 256, 256},  {9, 44, 94, 93}, {n - 1, 125, 256, 256}};
    size_t i;

    build_ok(p, g_t, n, 8, 4 * MIB);
    for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        size_t t = want[i].tensor, f = p->first[t], c = p->first[t + 1] - f;

        ck_assert_msg(c == want[i].nchunks && p->chunks[f].rows == want[i].first_rows &&
                          p->chunks[f + c - 1].rows == want[i].last_rows,
                      "tensor %zu (%" PRIu32 " x %" PRIu32 "): %zu chunks of %" PRIu32 "..%" PRIu32
                      " rows, want %zu of %" PRIu32 "..%" PRIu32,
                      t, g_t[t].rows, g_t[t].cols, c, p->chunks[f].rows, p->chunks[f + c - 1].rows,
                      want[i].nchunks, want[i].first_rows, want[i].last_rows);
    }
}
END_TEST

/* Random small lists, with weights from a few values so ties are common:
 * the contract holds and the placement matches the slow reference. */
START_TEST(test_random_lists)
{
    static const double weights[] = {1.0, 2.0, 0.5, 3.25, 0.1};
    uint64_t seed = 0x5eed0000u;
    int round;

    for (round = 0; round < 128; round++) {
        size_t n = 1 + rng_next(&seed) % 12, i;
        uint32_t nshards = 1 + (uint32_t)(rng_next(&seed) % 9);
        uint64_t chunk_bytes = 4 + rng_next(&seed) % 4096;

        for (i = 0; i < n; i++) {
            g_t[i].rows = 1 + (uint32_t)(rng_next(&seed) % 60);
            g_t[i].cols = 1 + (uint32_t)(rng_next(&seed) % 300);
            g_t[i].row_weight = weights[rng_next(&seed) % 5] * (rng_next(&seed) % 2 ? 1 : 3);
        }
        build_ok(&g_plan[0], g_t, n, nshards, chunk_bytes);
        check_reference_placement(&g_plan[0]);
        gift_plan_free(&g_plan[0]);
    }
}
END_TEST

/* ---- placement ----------------------------------------------------------- */

/* Ties by hand. Four chunks of equal weight alternate over two shards from
 * shard 0; heavier chunks go first, each to the lightest shard. */
START_TEST(test_ties_by_hand)
{
    gift_plan_tensor_t eq[] = {{4, 1, 1.0}};
    /* one chunk each, weights 1, 3, 2, 2. */
    gift_plan_tensor_t mix[] = {{1, 8, 1.0}, {1, 8, 3.0}, {1, 8, 2.0}, {1, 8, 2.0}};
    const uint32_t want_eq[] = {0, 1, 0, 1};
    /* 3 -> s0; 2 (tensor 2) -> s1; 2 (tensor 3) -> s1 (2 < 3); 1 -> s0 (3 < 4). */
    const uint32_t want_mix[] = {0, 0, 1, 1};
    size_t k;

    build_ok(&g_plan[0], eq, 1, 2, 4);
    for (k = 0; k < 4; k++)
        ck_assert_msg(g_plan[0].chunks[k].shard == want_eq[k],
                      "equal chunks: chunk %zu on shard %" PRIu32 ", want %" PRIu32, k,
                      g_plan[0].chunks[k].shard, want_eq[k]);
    build_ok(&g_plan[1], mix, 4, 2, 4 * MIB);
    for (k = 0; k < 4; k++)
        ck_assert_msg(g_plan[1].chunks[k].shard == want_mix[k],
                      "mixed: tensor %zu on shard %" PRIu32 ", want %" PRIu32, k,
                      g_plan[1].chunks[k].shard, want_mix[k]);
    ck_assert_msg(g_plan[1].shard_weight[0] == 4.0 && g_plan[1].shard_weight[1] == 4.0,
                  "mixed: shard weights %.17g %.17g, want 4 4", g_plan[1].shard_weight[0],
                  g_plan[1].shard_weight[1]);
    ck_assert_msg(gift_plan_imbalance(&g_plan[1]) == 1.0, "mixed: imbalance %.17g",
                  gift_plan_imbalance(&g_plan[1]));
}
END_TEST

/* More shards than chunks: one chunk per shard, the rest empty. */
START_TEST(test_more_shards_than_chunks)
{
    gift_plan_tensor_t t[] = {{1, 4, 1.0}, {1, 4, 2.0}};
    double imb;

    build_ok(&g_plan[0], t, 2, 5, 4 * MIB);
    ck_assert_msg(g_plan[0].chunks[1].shard == 0 && g_plan[0].chunks[0].shard == 1,
                  "shards %" PRIu32 " %" PRIu32 ", want 1 0", g_plan[0].chunks[0].shard,
                  g_plan[0].chunks[1].shard);
    imb = gift_plan_imbalance(&g_plan[0]);
    ck_assert_msg(fabs(imb - 2.0 / (3.0 / 5)) < 1e-12, "imbalance %.17g, want %.17g", imb,
                  2.0 / (3.0 / 5));
}
END_TEST

/* The same list gives the same plan; another shard count gives another. */
START_TEST(test_deterministic)
{
    int c;

    for (c = 0; c < 4; c++) {
        const llama_cfg_t *cfg = &llama[c % 2];
        size_t n = llama_tensors(g_t, cfg, wire[c / 2].bytes), k, moved = 0;

        build_ok(&g_plan[0], g_t, n, 3, 4 * MIB);
        build_ok(&g_plan[1], g_t, n, 3, 4 * MIB);
        check_same_plan(&g_plan[0], &g_plan[1], n);
        check_reference_placement(&g_plan[0]);
        gift_plan_free(&g_plan[1]);

        build_ok(&g_plan[1], g_t, n, 4, 4 * MIB);
        for (k = 0; k < g_plan[0].nchunks; k++)
            moved += g_plan[0].chunks[k].shard != g_plan[1].chunks[k].shard;
        ck_assert_msg(moved > 0, "%s %s: 3 and 4 shards give the same placement of %zu chunks",
                      cfg->name, wire[c / 2].name, g_plan[0].nchunks);
        gift_plan_free(&g_plan[0]);
        gift_plan_free(&g_plan[1]);
    }
}
END_TEST

/* The acceptance figure: Llama lists over 2, 3 and 8 shards at 4 MiB, FP8 or
 * f32 both ways; the heaviest shard carries at most 1.15x the mean. Every
 * case is built before the verdict, so a failure lists all twelve. */
START_TEST(test_llama_balance)
{
    static const uint32_t shards[] = {2, 3, 8};
    char report[1024];
    size_t len = 0;
    int c, worst = -1;
    double worst_imb = 0.0;

    for (c = 0; c < 12; c++) {
        const llama_cfg_t *cfg = &llama[c / 6];
        uint32_t nshards = shards[c % 3], s;
        const char *codec = wire[(c / 3) % 2].name;
        size_t n = llama_tensors(g_t, cfg, wire[(c / 3) % 2].bytes);
        double imb, max = 0.0, sum = 0.0;

        build_ok(&g_plan[0], g_t, n, nshards, 4 * MIB);
        imb = gift_plan_imbalance(&g_plan[0]);
        for (s = 0; s < nshards; s++) {
            sum += g_plan[0].shard_weight[s];
            max = fmax(max, g_plan[0].shard_weight[s]);
        }
        ck_assert_msg(fabs(imb - max / (sum / nshards)) < 1e-12,
                      "%s %s %" PRIu32 " shards: gift_plan_imbalance %.6f, max/mean %.6f",
                      cfg->name, codec, nshards, imb, max / (sum / nshards));
        len += (size_t)snprintf(report + len, sizeof(report) - len,
                                "\n  %-8s %s %" PRIu32 " shards, %4zu chunks: %.4f", cfg->name,
                                codec, nshards, g_plan[0].nchunks, imb);
        if (imb > worst_imb) {
            worst_imb = imb;
            worst = c;
        }
        gift_plan_free(&g_plan[0]);
    }
    ck_assert_msg(worst_imb <= 1.15, "case %d: imbalance %.4f > 1.15; all cases:%s", worst,
                  worst_imb, report);
}
END_TEST

/* ---- bad arguments ------------------------------------------------------- */

START_TEST(test_bad_arguments)
{
    const gift_plan_tensor_t ok[] = {{4, 4, 1.0}, {2, 3, 0.5}};
    const gift_plan_tensor_t bad[] = {
        {0, 4, 1.0}, {4, 0, 1.0},      {4, 4, 0.0},  {4, 4, -1.0},
        {4, 4, NAN}, {4, 4, INFINITY}, {4, 4, -0.0}, {2, 4, DBL_MAX},
    };
    gift_plan_t *p = &g_plan[0];
    size_t i;
    int rc;

#define EXPECT_EINVAL(call, what)                                                                  \
    do {                                                                                           \
        memset(p, 0xa5, sizeof(*p));                                                               \
        rc = (call);                                                                               \
        ck_assert_msg(rc == GIFT_EINVAL, "%s: got %d (%s), want GIFT_EINVAL", what, rc,            \
                      gift_strerror(rc));                                                          \
        ck_assert_msg(p->chunks == NULL && p->first == NULL && p->shard_weight == NULL &&          \
                          p->nchunks == 0,                                                         \
                      "%s: plan not cleared on failure", what);                                    \
        gift_plan_free(p);                                                                         \
    } while (0)

    EXPECT_EINVAL(gift_plan_build(ok, 0, 2, 4 * MIB, p), "n = 0");
    EXPECT_EINVAL(gift_plan_build(ok, 2, 0, 4 * MIB, p), "nshards = 0");
    EXPECT_EINVAL(gift_plan_build(ok, 2, 2, 0, p), "chunk_bytes = 0");
    EXPECT_EINVAL(gift_plan_build(ok, 2, 2, 3, p), "chunk_bytes = 3");
    EXPECT_EINVAL(gift_plan_build(NULL, 2, 2, 4 * MIB, p), "t = NULL");
    rc = gift_plan_build(ok, 2, 2, 4 * MIB, NULL);
    ck_assert_msg(rc == GIFT_EINVAL, "out = NULL: got %d, want GIFT_EINVAL", rc);

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gift_plan_tensor_t t[3] = {ok[0], bad[i], ok[1]};
        char what[96];

        snprintf(what, sizeof(what), "tensor 1 = {%" PRIu32 ", %" PRIu32 ", %g}", bad[i].rows,
                 bad[i].cols, bad[i].row_weight);
        EXPECT_EINVAL(gift_plan_build(t, 3, 2, 4 * MIB, p), what);
    }
#undef EXPECT_EINVAL

    /* The limits themselves are fine; freeing twice or NULL is harmless. */
    build_ok(p, ok, 2, 1, 4);
    gift_plan_free(p);
    gift_plan_free(p);
    gift_plan_free(NULL);
    ck_assert_msg(gift_plan_imbalance(p) == 0.0, "imbalance of a freed plan: %g",
                  gift_plan_imbalance(p));
}
END_TEST

static Suite *placement_suite(void)
{
    Suite *s = suite_create("placement");
    TCase *cut = tcase_create("chunking"), *place = tcase_create("placement");
    TCase *bad = tcase_create("bad arguments");

    tcase_add_checked_fixture(cut, setup, teardown);
    tcase_add_test(cut, test_cut_by_hand);
    tcase_add_test(cut, test_cut_llama);
    tcase_add_test(cut, test_random_lists);
    suite_add_tcase(s, cut);

    tcase_add_checked_fixture(place, setup, teardown);
    tcase_add_test(place, test_ties_by_hand);
    tcase_add_test(place, test_more_shards_than_chunks);
    tcase_add_test(place, test_deterministic);
    tcase_add_test(place, test_llama_balance);
    suite_add_tcase(s, place);

    tcase_add_checked_fixture(bad, setup, teardown);
    tcase_add_test(bad, test_bad_arguments);
    suite_add_tcase(s, bad);
    return s;
}

int main(void)
{
    return gift_test_run(placement_suite(), CK_NORMAL) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
