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

/* Rotation angles for the RoPE of one position: cos/sin (rope_dim/2). Matches the usual fp32
 * computation inv_freq_i = 1 / base^(2i/rope_dim), angle = pos · scale · inv_freq_i / factor_i. */
void cpu_rope_angles(int32_t pos, int rope_dim, float base, float position_scale, const float *freq_factors,
                     float *cos_out, float *sin_out);

/* Rotates the first rope_dim dimensions of each of n_heads heads of x (n_heads, head_dim). */
void cpu_rope_apply(float *x, int n_heads, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v,
                    const float *sin_v);

/* In-place numerically stable softmax over n values. */
void cpu_softmax(float *x, int n);

#endif
