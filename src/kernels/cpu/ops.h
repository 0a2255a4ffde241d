/*
 * ops.h — elementwise and per-row kernels of the llama forward pass (CPU, fp32).
 *
 * Contract: pure functions over caller-owned buffers; shapes in comments. Thread-safe.
 */
#ifndef BRAID_KERNELS_CPU_OPS_H
#define BRAID_KERNELS_CPU_OPS_H

#include <stdint.h>

#include "model/model_config.h"

/* out (n) = x / rms(x) * weight. out may alias x. */
void cpu_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);

/* x (n) += y (n) */
void cpu_add_inplace(float *x, const float *y, int n);

/* gate (n) = silu(gate) * up; parallel inside (OpenMP) for batch-sized n. */
void cpu_swiglu(float *gate, const float *up, int n);

/* Inverse frequency of RoPE pair i (0 <= i < rope_dim/2): 1 / base^(2i/rope_dim), divided by
 * freq_factors[i] (llama3-style rope_freqs) when given. The one definition the forward pass and the
 * ROTATE cache operation share, so a rotated key can never disagree with a recomputed one. */
float cpu_rope_inv_freq(int i, int rope_dim, float base, const float *freq_factors);

/* Rotation angles for the RoPE of one position: cos/sin (rope_dim/2). Matches the usual fp32
 * computation angle = (pos · scale) · cpu_rope_inv_freq(i). pos may be negative: the angles of a
 * position difference Δ give the rotation R(Δ) with R(p + Δ) = R(Δ) R(p) (ROTATE uses this). */
void cpu_rope_angles(int32_t pos, int rope_dim, float base, float position_scale, const float *freq_factors,
                     float *cos_out, float *sin_out);

/* Rotates the first rope_dim dimensions of each of n_heads heads of x (n_heads, head_dim). */
void cpu_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v,
                    const float *sin_v);

/* Largest head_dim cpu_rope_rotate_f16 takes (it widens one row on the stack). */
#define CPU_ROPE_MAX_HEAD_DIM 1024

/* Rotates, in place, the first rope_dim dimensions of n_rows IEEE-half rows of head_dim values
 * (rows (n_rows, head_dim), e.g. a KV block's keys) by the angles cos/sin (rope_dim/2): each row is
 * widened to fp32 exactly, rotated in fp32 like cpu_rope_apply (AVX2/F16C 8 lanes at a time where
 * the build has them; then a product may be fused, a last-bit fp32 difference), and rounded back
 * to nearest even once. Dimensions past rope_dim are untouched. head_dim <=
 * CPU_ROPE_MAX_HEAD_DIM (asserted). */
void cpu_rope_rotate_f16(uint16_t *rows, int n_rows, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v,
                         const float *sin_v);

/* In-place numerically stable softmax over n values. */
void cpu_softmax(float *x, int n);

#endif
