/*
 * matmul.h — y = x · Wᵀ for a quantized weight matrix and a batch of fp32 activations (CPU).
 *
 * Contract: W is (rows, cols) in its stored GGUF type; x is (n_tokens, cols) fp32; y is
 * (n_tokens, rows) fp32. Small batches (decode) dot each quantized row directly, so weights are read
 * once per step at their quantized size; large batches (prefill) dequantize row panels into the
 * scratch and hand them to OpenBLAS sgemm. Both compute in fp32.
 * Threads: parallel inside (OpenMP); one CpuScratch per concurrent caller.
 */
#ifndef BRAID_KERNELS_CPU_MATMUL_H
#define BRAID_KERNELS_CPU_MATMUL_H

#include <stddef.h>

#include "model/model_weights.h"

typedef struct {
    float *panel;   /* dequantized weight rows for the sgemm path */
    size_t panel_cap;
    float *x_block_sums; /* (n_tokens, cols/32) */
    size_t x_block_sums_cap;
} CpuScratch;

void cpu_scratch_free(CpuScratch *scratch);

/* Batches of at least this many tokens take the dequantize + sgemm path. */
#define CPU_MATMUL_GEMM_MIN_TOKENS 32

/* Returns 0, or -1 when the scratch cannot grow (out of memory). */
int cpu_matmul(const WeightMatrix *w, const float *x, int n_tokens, float *y, CpuScratch *scratch);

/* Copies the dequantized row `index` of W into out (cols floats): embedding lookup. */
void cpu_matrix_row(const WeightMatrix *w, int64_t index, float *out);

#endif
