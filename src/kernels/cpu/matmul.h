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
 *                    rounding each activation to 8 bits (as llama.cpp's q8 activations do). The
 *                    default. A matrix packed for it (kernels/cpu/int8_pack.h) always takes it.
 * Threads: parallel inside (OpenMP); one CpuScratch per concurrent caller.
 */
#ifndef BRAID_KERNELS_CPU_MATMUL_H
#define BRAID_KERNELS_CPU_MATMUL_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/cpu/act_quant.h"
#include "model/model_weights.h"

typedef enum {
    CPU_MATMUL_FP32 = 0, /* the zero value */
    CPU_MATMUL_INT8 = 1,
} CpuMatmulMath;

/* The arithmetic of braid generate / batch / serve when none is asked for: int8. The issue-21 rule
 * for a faster default: top-1 agreement with transformers on the golden prompts at least
 * llama.cpp's. With the int8 head's top candidates refined in fp32 (cpu_matmul_refine_top) it is
 * 97.63% of all positions against llama.cpp's 96.73%, and ahead at clear margins and greedy steps
 * too (bench/RESULTS.md, issue 21); it decodes 1.7x llama.cpp single-stream on the 2-core VM
 * (best of 5 rounds), fp32 0.7-0.8x. fp32 stays one flag away (--cpu-matmul fp32): the closest to transformers (99.87%). */
#define CPU_MATMUL_DEFAULT CPU_MATMUL_INT8

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

/* Whether cpu_matmul(w, …, math) takes the int8 path: in int8 mode every matrix with integer
 * kernels (others keep fp32), and a packed matrix (kernels/cpu/int8_pack.h) always. */
bool cpu_matmul_takes_int8(const WeightMatrix *w, CpuMatmulMath math);

/* Most values per token cpu_matmul_refine_top recomputes. */
#define CPU_REFINE_MAX_TOP 32

/* For each token t of y (n_tokens, w->rows) = x · Wᵀ already computed, recomputes the `top` largest
 * values of y's row t from the dequantized weights and x in double precision, in place. What it is
 * for: the int8 vocabulary head's near-ties. Rounding the activations to 8 bits moves a logit by
 * ~1e-2, enough to swap two candidates the fp32 head tells apart; the candidates that can win are
 * among the few largest, and refining only those restores the fp32 ordering at the price of
 * `top` row dots per token. Deterministic per token, so batch-invariant. */
void cpu_matmul_refine_top(const WeightMatrix *w, const float *x, int n_tokens, float *y, int top);

/* "fp32" or "int8" (command-line flags); returns -1 for anything else. */
int cpu_matmul_math_parse(const char *text, CpuMatmulMath *math);

/* Copies the dequantized row `index` of W into out (cols floats): embedding lookup. */
void cpu_matrix_row(const WeightMatrix *w, int64_t index, float *out);

#endif
