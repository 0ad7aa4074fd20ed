/*
 * gift_policy.h: the geometry owner's per-tensor treatment (issue 24). Pure
 * numerics: no I/O, no wire; the same inputs give bit-identical outputs.
 *
 * At every epoch the owner of a tensor's geometry picks, for each tensor:
 * Euclidean (the identity transform) or GIFT at a rank k from a small set
 * ({k_max/4, k_max/2, k_max}, each at least 1, duplicates removed), and, when
 * a bit budget is set, the format (the declared push format or a smaller one:
 * f32 > bf16 > fp8 > nvfp4 in bytes). The choice minimises the predicted
 * whole-update error: the sum over tensors of each tensor's squared error in
 * its own whitened metric, which is what the whole-update figure
 * ||concat(errors)|| / ||concat(true)|| of bench/convergence_report.py
 * fidelity adds up.
 *
 * The prediction (issue 5's relative-error model, at rank k, in the metric of
 * the new geometry). The geometry gives A ~ U diag(lambda) U^T plus sigma2 on
 * U's complement, and L = (A + delta I)^-1/2. T_k (rank k) and L are both
 * diagonal in the basis [U, complement], so M = T_k^-1 L is too: on column i
 * of U, m_i = t_i^-1 l_i with t_i^-1 = (lambda_i + delta)^1/2 for i < k and
 * (sigma2_k + delta)^1/2 otherwise (1 for Euclidean), l_i = (lambda_i +
 * delta)^-1/2 for i < k_max and (sigma2_kmax + delta)^-1/2 on the complement.
 * For each option the chooser codes X = Gbar T_k with the real codec
 * (gift_encode, gift_decode: exact, not a constant per format) and measures
 * the error E = decode(encode(X)) - X through M:
 *   ||E M||^2 = m_c^2 ||E||^2 + sum_i (m_i^2 - m_c^2) ||E u_i||^2.
 * pred_err2 is that, times rows / nrows (the owner may hold only the first
 * nrows rows of the averaged gradient: chunk 0). It is the error of coding the
 * averaged gradient once: the pull leg's error exactly, and the push legs' to
 * first order of the relative-error model (W workers' rounding errors, each
 * about the same fraction of its element, average to about 1/W of it when
 * the workers' gradients are alike; a factor common to a tensor's options).
 *
 * The lag: Gbar is the latest average the owner decoded, i.e. the previous
 * step's (the step the geometry is used at is not known yet), and the metric
 * is the new geometry's estimate of A, not the step's own covariance. What
 * that costs is measured in bench/RESULTS.md (2026-12-02, `gift-bench policy`).
 *
 * Bits per element, geometry included: fp8 8 + 32/block (block from the input,
 * 0 = 128), nvfp4 4 + 8/16 + 32/(rows x cols), bf16 16, f32 32, from
 * gift_layout's unpadded section sizes; plus, for GIFT, the geometry: each
 * refresh every worker sends a Sketch (cols x ks f32) and receives the
 * Geometry (cols x ks + ks f32), amortised over `refresh` steps and the push
 * plus pull elements (2 x rows x cols per step):
 *   32 (2 cols ks + ks) / (2 rows cols refresh).
 * A Euclidean tensor counts no geometry bytes unless cfg.sketch_always is set
 * (the owner keeps sketching it to be able to re-decide). Transform GFLOP per
 * step per worker: T on push and T^-1 on pull, gift_transform_flops / 1e9 (8
 * rows cols k, or 4 rows cols^2 where the dense form applies; 0 for Euclidean).
 *
 * The joint choice: options per tensor are (mode, k, format); a greedy on the
 * resulting multiple-choice knapsack starts every tensor at its cheapest
 * option and repeatedly takes the upgrade with the largest error reduction per
 * unit of (budget and flop cap) used, among those that keep both limits; ties
 * by lower tensor index then lower option index. A move must cut that tensor's
 * predicted error by more than GIFT_POLICY_MIN_GAIN of it (GIFT that predicts
 * the same as Euclidean is not worth its flops and geometry bytes). Under AUTO
 * the result is then compared with the ALL, NONE and HITS assignments under
 * the same limits (each solved by the same greedy within its own options), and
 * one of them replaces it when it predicts a total more than
 * GIFT_POLICY_MIN_GAIN lower: by construction AUTO's predicted total is never
 * above ALL's or NONE's by more than that factor, 1 / (1 - MIN_GAIN), and
 * ties go to the cheaper per-tensor choices (a flat layer stays Euclidean).
 *
 * Policies: ALL: GIFT at k_max for every tensor with a non-identity geometry
 * (a smaller k from the set only when a flop cap binds), format from the
 * budget when set; NONE: Euclidean everywhere; HITS: GIFT where the last
 * step's fp8 boundary-hit rate >= hits_threshold (the GIFT paper's rule),
 * Euclidean where below, the declared treatment where unknown (< 0); AUTO: the
 * predicted best. Without gbar (first epoch) or with an identity geometry the
 * prediction is impossible: the declared treatment (GIFT at k_max when the
 * geometry is not the identity, declared format, unless the budget forces a
 * smaller one) under ALL/AUTO/HITS, Euclidean under NONE; pred_err2 is then 0
 * and pred_ratio 1 (unknown).
 */
#ifndef GIFT_POLICY_H
#define GIFT_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "gift_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { GIFT_POLICY_ALL = 0, GIFT_POLICY_NONE = 1, GIFT_POLICY_AUTO = 2, GIFT_POLICY_HITS = 3 };

#define GIFT_POLICY_HITS_DEFAULT                                                                   \
    1e-3                           /* boundary hits per element (our default, not the paper's)     \
                                    */
#define GIFT_POLICY_MIN_GAIN 0.01  /* hysteresis: a move must cut pred_err2 by more than 1% */
#define GIFT_POLICY_MAX_OPTIONS 16 /* options per tensor (3 ranks x 4 formats + Euclidean) */
#define GIFT_POLICY_INFEASIBLE 1   /* gift_policy_choose: the limits cannot be met */

/* "all" | "none" | "auto" | "hits" -> GIFT_POLICY_*, else GIFT_EINVAL. */
int gift_policy_parse(const char *s);
/* The name gift_policy_parse reads, or "?" for an unknown value. */
const char *gift_policy_name(int policy);

typedef struct gift_policy_cfg {
    int policy;            /* GIFT_POLICY_* */
    double budget_bits;    /* > 0: average bits per element over the n tensors (element-weighted,
                              geometry amortised counted in); <= 0: unset, each tensor keeps its
                              declared format */
    double max_gflops;     /* > 0: cap on transform GFLOP per step per worker over the n tensors;
                              <= 0: none */
    double hits_threshold; /* hits policy: GIFT where the fp8 boundary-hit rate >= this (0 or less:
                              GIFT_POLICY_HITS_DEFAULT) */
    int sketch_always;     /* 1: Euclidean tensors still send their sketch every refresh (so the
                              owner can re-decide): their bits count the sketch; 0: they count
                              no geometry bytes */
} gift_policy_cfg_t;

typedef struct gift_policy_in { /* one tensor, as the geometry owner holds it */
    uint32_t rows, cols;        /* the whole tensor */
    uint32_t k_max, ks;         /* declared rank and basis columns */
    uint32_t refresh;           /* steps per epoch (geometry bytes amortised over it) */
    int declared_format;        /* gift_format_t of the declared push codec: the largest the chooser
                                   may pick */
    const gift_geometry_t *geo; /* the new epoch's geometry at k_max (identity allowed: then only
                                   Euclidean) */
    const float *gbar;          /* nrows x cols row-major, the latest averaged gradient the owner
                                   decoded, Euclidean coordinates; NULL: none yet */
    uint32_t nrows;             /* rows of gbar (the owner may hold only chunk 0) */
    double hit_rate;            /* fp8 boundary-hit rate of the last step, < 0 unknown */
    uint32_t block;             /* fp8 block of the tensor's codec (0: GIFT_FP8_BLOCK_DEFAULT) */
} gift_policy_in_t;

typedef struct gift_policy_choice {
    int gift;          /* 1: GIFT transform at rank k; 0: Euclidean (identity epoch) */
    uint32_t k;        /* 1..k_max when gift, 0 otherwise */
    int format;        /* gift_format_t for push and pull of this tensor */
    double pred_err2;  /* predicted squared error of the averaged update, this tensor's whitened
                          metric (0 when there is no prediction) */
    double pred_ratio; /* sqrt(pred_err2 / Euclidean declared-format pred_err2) (1 if unknown) */
    double bits;       /* bits per element incl. amortised geometry */
    double gflops;     /* transform GFLOP per step per worker */
} gift_policy_choice_t;

/*
 * Chooses for n tensors jointly (see the top of this file). Returns 0, or
 * GIFT_POLICY_INFEASIBLE (positive) when the budget or the flop cap cannot be
 * met even by the cheapest option of every tensor (Euclidean at the smallest
 * allowed format): out then holds those cheapest choices, or GIFT_EINVAL (NULL
 * pointers, n == 0, an unknown policy, zero sizes, k_max outside 1..ks or ks
 * above cols, a geometry whose din/ks differ from cols/ks or whose k differs
 * from k_max, nrows outside 1..rows with gbar set, a declared format that is
 * not a codec format, non-finite cfg values), GIFT_ENONFINITE (gbar holds
 * NaN/Inf) or GIFT_ENOMEM; out is untouched on a negative return. Same
 * inputs -> identical outputs (bitwise) on every call and every machine with
 * the same BLAS.
 */
int gift_policy_choose(const gift_policy_cfg_t *cfg, const gift_policy_in_t *in, size_t n,
                       gift_policy_choice_t *out);

/*
 * The rank-k geometry of a chosen epoch, for the owner and every worker
 * alike: dst (gift_geometry_init'ed with din = src->din, k, ks = src->ks) gets
 * src's U, lambda, trace and delta, with sigma2 recomputed for rank k,
 * (trace - sum of the first k lambda) / (din - k) (0 when k == din, clamped
 * at 0), and c, d, c_inv, d_inv through gift_geometry_load: bit-identical on
 * every machine. The basis (all ks columns, the next sketch's Q) is kept.
 * k == src->k copies src's sigma2 exactly. Returns 0 or GIFT_EINVAL.
 */
int gift_policy_geometry_at(const gift_geometry_t *src, uint32_t k, gift_geometry_t *dst);

/* Bits per element of one tensor under a format and mode, geometry amortised
 * as above (gift: 1 counts the sketch and geometry; sketch only when
 * sketch_always and !gift). Negative code for bad arguments. */
double gift_policy_bits(const gift_policy_in_t *in, int format, int gift, int sketch_always);

#ifdef __cplusplus
}
#endif
#endif
