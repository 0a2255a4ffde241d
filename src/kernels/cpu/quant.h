/*
 * quant.h — dequantization and fp32 dot products over GGUF-quantized rows (CPU).
 *
 * Contract: every supported TensorType can be dequantized to fp32 and dotted with an fp32 vector.
 * The dot products compute in fp32 with the stored scales, so they agree with a dequantize-then-
 * multiply reference to fp32 rounding (the golden tests rely on that). Q4_0, Q4_1 and Q8_0 have
 * AVX2 paths, and so do the K-quants (Q4_K, Q5_K, Q6_K: fused per sub-block); Q5_0 (the CPU backend
 * re-encodes it as Q8_0, kernels/cpu/weight_widen.h) goes through a per-superblock dequantize.
 * Pure functions, thread-safe.
 */
#ifndef BRAID_KERNELS_CPU_QUANT_H
#define BRAID_KERNELS_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* out[0..n) = dequantized row; n must be a multiple of the type's block size. */
void quant_dequantize_row(uint32_t type, const void *row, float *out, int64_t n);

/* Sums of x over consecutive 32-element groups: sums[i] = x[32i] + … + x[32i+31]. Types with an
 * additive per-block offset (Q4_1, Q4_K) use these so the offset costs one multiply per block. */
void quant_block_sums(const float *x, int64_t n, float *sums);

/* Returns dot(row, x) over n elements; x_block_sums comes from quant_block_sums(x). */
float quant_dot_row(uint32_t type, const void *row, const float *x, const float *x_block_sums, int64_t n);

/* out[t] = dot(row, x + t*x_stride) for n_tokens (1..4) activation vectors, with their block sums
 * at x_block_sums + t*sums_stride. Each block is widened once for all tokens, and each result is
 * computed exactly as quant_dot_row computes it, so batching never changes a value. */
void quant_dot_row_tokens(uint32_t type, const void *row, const float *x, size_t x_stride, const float *x_block_sums,
                          size_t sums_stride, int n_tokens, int64_t n, float *out);

#endif
