/*
 * matmul_int8.h — y = x · Wᵀ through int8 activations and integer dot products (CPU), the
 * int8 path of cpu_matmul (kernels/cpu/matmul.h).
 *
 * Contract: ys[i] = x · ws[i]ᵀ for `count` matrices sharing the input x (one for most layers;
 * Q, K, V or gate, up together). Every type satisfies quant_int8_supported, and all have the same
 * cols, a multiple of 32; x is (n_tokens, cols) fp32, ys[i] is (n_tokens, ws[i]->rows) fp32.
 * Each token's row of x is quantized to int8 blocks (kernels/cpu/act_quant.h) once, then every
 * weight row passes over the tokens eight or sixteen at a time (the row's blocks are unpacked
 * once for all of them), and one or two tokens pass over eight rows at a time. Matrices may be in
 * GGUF or packed layout (kernels/cpu/int8_pack.h); packed ones make the one- and two-token case
 * several times faster (single-sequence decode), and the values are the same. Every y value follows
 * quant_int8.h's canonical sequence, so it is the same whatever the batch size, the token's place
 * in it, or the thread count.
 * Threads: one parallel loop (OpenMP) over groups of rows of all the matrices; `acts` is the
 * caller's scratch.
 */
#ifndef BRAID_KERNELS_CPU_MATMUL_INT8_H
#define BRAID_KERNELS_CPU_MATMUL_INT8_H

#include "kernels/cpu/act_quant.h"
#include "model/model_weights.h"

/* Returns 0, or -1 when the activation scratch cannot grow (out of memory). */
int matmul_int8(const WeightMatrix *const *ws, float *const *ys, int count, const float *x, int n_tokens,
                Int8Activations *acts);

#endif
