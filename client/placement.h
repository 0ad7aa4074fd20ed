/*
 * placement.h: how libgiftclient cuts tensors into chunks and places the
 * chunks on shards (docs/ARCHITECTURE.md, "Tensors, chunks and
 * placement"). Pure functions of the declared list: every worker computes
 * the same plan.
 *
 * Chunks: a tensor of rows x cols is cut into whole-row chunks of at most
 * chunk_bytes of FP32 (at least one row each), as even as possible: with
 * c = ceil(rows / max(1, floor(chunk_bytes / (4 cols)))) chunks, the first
 * rows % c chunks get one row more than the others.
 *
 * Placement: greedy longest-processing-time. Chunks are taken in order of
 * descending weight (ties: lower tensor index, then lower chunk index), each
 * to the shard with the least weight so far (ties: lower shard index). The
 * weight of a chunk is given by the caller per row (wire bytes per row of the
 * push and pull codecs), so shards balance the bytes they actually carry.
 */
#ifndef GIFT_PLACEMENT_H
#define GIFT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct gift_plan_tensor {
    uint32_t rows, cols;
    double row_weight; /* bytes a row costs on the wire (push + pull); > 0 */
} gift_plan_tensor_t;

typedef struct gift_plan_chunk {
    uint32_t tensor; /* index into the declared list */
    uint32_t chunk;  /* index within the tensor, from 0 */
    uint32_t row_begin;
    uint32_t rows;
    uint32_t shard;
    double weight;
} gift_plan_chunk_t;

typedef struct gift_plan {
    gift_plan_chunk_t *chunks; /* tensor-major, chunk order */
    size_t nchunks;
    size_t *first;        /* first[t]: index of tensor t's chunk 0; first[n] = nchunks */
    double *shard_weight; /* nshards entries */
    uint32_t nshards;
} gift_plan_t;

/* Builds the plan. Returns 0, GIFT_EINVAL (n == 0, nshards == 0, a zero
 * dimension or weight, chunk_bytes < 4) or GIFT_ENOMEM. Free with
 * gift_plan_free. */
int gift_plan_build(const gift_plan_tensor_t *t, size_t n, uint32_t nshards, uint64_t chunk_bytes,
                    gift_plan_t *out);
void gift_plan_free(gift_plan_t *p);

/* Heaviest shard's weight over the mean shard weight (1.0 is perfect). */
double gift_plan_imbalance(const gift_plan_t *p);

#endif
