/*
 * act_quant.h — fp32 activations quantized to int8 per 32-element block, the input of the
 * integer-dot matmul (kernels/cpu/quant_int8.h) (CPU).
 *
 * Contract: each token's row of `cols` floats (cols a multiple of 32) is cut into blocks of 32.
 * Block b of token t gets the scale d = max|x| / 127 and the values
 *     q[j] = round-half-even(x[j] · (127 / max|x|))   in [-127, 127]
 * (all zero with d = 0 for an all-zero block), plus the exact Σq and the fp32 product d · (float)Σq
 * that offset-carrying weight types (Q4_1) use. A token's values depend only on its own row, never
 * on the other tokens of the batch, and the SIMD and scalar builds produce the same bytes.
 *
 * Layouts (nb = cols / 32, tokens padded with all-zero tokens to n_groups · 8):
 *   rows         (n_groups·8, cols) row-major: a token's block is 32 contiguous bytes
 *   interleaved  groups of 8 tokens, one token per 32-bit SIMD lane: within group g and block b,
 *                run k (elements 4k..4k+3) of lane l lies at byte ((g·nb + b)·8 + k)·32 + 4l
 *   d, sum, dsum per-block scalars at index (g·nb + b)·8 + l, so a group's 8 lanes are contiguous
 * Owns its buffers: zero-initialize, fill with act_quant_fill (grows them), release with act_quant_free.
 * Thread-safety: one Int8Activations per caller; act_quant_token may run concurrently for distinct
 * tokens.
 */
#ifndef BRAID_KERNELS_CPU_ACT_QUANT_H
#define BRAID_KERNELS_CPU_ACT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ACT_QUANT_BLOCK 32
#define ACT_QUANT_GROUP 8 /* tokens per interleaved group: the 32-bit lanes of a 256-bit vector */

typedef struct {
    int n_tokens, cols, nb, n_groups; /* shape of the last fill */
    int8_t *rows;        /* (n_groups*8, cols) */
    int8_t *interleaved; /* (n_groups, nb, 8 runs, 8 lanes, 4) */
    bool rows_only;      /* filled by act_quant_reserve_rows: `interleaved` is not written */
    float *d;            /* (n_groups, nb, 8) block scale */
    float *dsum;         /* (n_groups, nb, 8) d · Σq */
    int32_t *sum;        /* (n_groups, nb, 8) Σq */
    size_t cap_values, cap_blocks;
} Int8Activations;

/* Quantizes x (n_tokens, cols) into a. Returns 0, or -1 when the buffers cannot grow (out of memory). */
int act_quant_fill(Int8Activations *a, const float *x, int n_tokens, int cols);
void act_quant_free(Int8Activations *a);

/* act_quant_fill in two steps, for callers that spread the tokens over threads: reserve sets the
 * shape (-1 when out of memory), then act_quant_token(a, x, t) for every t < n_groups·8 (padding
 * tokens included) fills token t from x (n_tokens, cols); distinct t may run concurrently. */
int act_quant_reserve(Int8Activations *a, int n_tokens, int cols);
void act_quant_token(Int8Activations *a, const float *x, int t);
/* act_quant_reserve for callers that read only `rows`, d, sum and dsum of the real tokens (the
 * packed kernels): act_quant_token then skips the interleaved layout, and padding tokens need not
 * be filled. A single decode token is quantized once instead of eight times. */
int act_quant_reserve_rows(Int8Activations *a, int n_tokens, int cols);

/* One block: q[0..32) and d, Σq as above. Exposed for the tests' reference. */
void act_quant_block(const float *x, int8_t *q, float *d, int32_t *sum);

/* Index of token t's block b in d / sum / dsum. */
static inline size_t act_quant_meta_index(const Int8Activations *a, int token, int block) {
    size_t group = (size_t)(token / ACT_QUANT_GROUP), lane = (size_t)(token % ACT_QUANT_GROUP);
    return (group * (size_t)a->nb + (size_t)block) * ACT_QUANT_GROUP + lane;
}

#endif
