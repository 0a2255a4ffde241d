/*
 * matmul.h — y = x · Wᵀ for a quantized weight matrix and a batch of fp32 activations (CPU).
 *
 * Contract: W is (rows, cols) in its stored GGUF type; x is (n_tokens, cols) fp32; y is
 * (n_tokens, rows) fp32. Two arithmetics, chosen by the caller:
 *   CPU_MATMUL_FP32  small batches (decode) dot each quantized row directly in fp32, so weights are
 *                    read once per step at their quantized size; large batches (prefill) dequantize
 *                    row panels into the scratch and hand them to OpenBLAS sgemm. The golden tests
 *                    hold this path to HF transformers within 5e-2 (the fp16 KV cache's share).
 *   CPU_MATMUL_INT8  for Q4_0 / Q4_1 / Q8_0 weights, x is quantized to int8 per 32-element block
 *                    and dotted with integer instructions (kernels/cpu/matmul_int8.h) at every batch
 *                    size, so a token's result never depends on its batch; other types take the
 *                    fp32 path. About 4x the multiply-adds per instruction of fp32, at the cost of
 *                    rounding each activation to 8 bits (as llama.cpp's q8 activations do).
 * Threads: parallel inside (OpenMP); one CpuScratch per concurrent caller.
 */
#ifndef BRAID_KERNELS_CPU_MATMUL_H
#define BRAID_KERNELS_CPU_MATMUL_H

#include <stddef.h>

#include "kernels/cpu/act_quant.h"
#include "model/model_weights.h"

typedef enum {
    CPU_MATMUL_FP32 = 0, /* the zero value */
    CPU_MATMUL_INT8 = 1,
} CpuMatmulMath;

/* The arithmetic of braid generate / batch / serve when none is asked for: fp32. int8's top-1
 * agreement with transformers on the golden prompts ties llama.cpp's (97.05% vs 96.73% of all
 * positions, one fewer at clear margins; bench/RESULTS.md, issue 21) but within noise, and it tips
 * the demo's near-tie answer; it becomes the default once the side-by-side speed and a robust
 * agreement margin are measured on a quiet machine. */
#define CPU_MATMUL_DEFAULT CPU_MATMUL_FP32

typedef struct {
    float *panel;   /* dequantized weight rows for the sgemm path */
    size_t panel_cap;
    float *x_block_sums; /* (n_tokens, cols/32) */
    size_t x_block_sums_cap;
    Int8Activations acts; /* quantized activations for the int8 path */
} CpuScratch;

void cpu_scratch_free(CpuScratch *scratch);

/* fp32: batches of at least this many tokens take the dequantize + sgemm path. */
#define CPU_MATMUL_GEMM_MIN_TOKENS 32

/* Returns 0, or -1 when the scratch cannot grow (out of memory). */
int cpu_matmul(const WeightMatrix *w, const float *x, int n_tokens, float *y, CpuMatmulMath math, CpuScratch *scratch);

/* ys[i] = x · ws[i]ᵀ for `count` matrices that share the input x (Q/K/V, gate/up): the same values
 * as `count` cpu_matmul calls; in int8 the input is quantized once and all rows run in one parallel
 * loop. */
int cpu_matmul_shared_input(const WeightMatrix *const *ws, float *const *ys, int count, const float *x, int n_tokens,
                            CpuMatmulMath math, CpuScratch *scratch);

/* "fp32" or "int8" (command-line flags); returns -1 for anything else. */
int cpu_matmul_math_parse(const char *text, CpuMatmulMath *math);

/* Copies the dequantized row `index` of W into out (cols floats): embedding lookup. */
void cpu_matrix_row(const WeightMatrix *w, int64_t index, float *out);

#endif
