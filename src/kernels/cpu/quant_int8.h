/*
 * quant_int8.h — integer dot products of GGUF 4-bit / 8-bit weight rows with int8-quantized
 * activations (kernels/cpu/act_quant.h) (CPU).
 *
 * Contract: for the supported types (Q4_0, Q4_1, Q8_0; quant_int8_supported) every (row, token)
 * value is defined by one canonical sequence, over the row's 32-element blocks b in order:
 *     isum  = Σ_j wq[j] · xq[j]                          exact int32 (Q4_0: wq = nibble − 8;
 *                                                       Q4_1: wq = nibble; Q8_0: wq = stored int8)
 *     acc   = fmaf((float)isum, d_w[b] · d_x[b], acc)     the product d_w · d_x rounded first
 *     off   = fmaf(m_w[b], dsum_x[b], off)                Q4_1 only (dsum_x = d_x · Σxq)
 *     value = acc + off  (Q4_1),  acc  (Q4_0, Q8_0)       acc and off start at 0
 * Each kernel below computes exactly that, whichever SIMD axis it uses (8 tokens in 8 lanes, or the
 * 32 elements of one block), so a token's value never depends on which kernel or batch computed it:
 * the decode arithmetic stays batch-invariant. The integer sums are exact on every path (the 4-bit
 * pair products fit int16 without saturation; 8-bit products are widened or bias-corrected), and
 * quant_int8_dot_reference is the same sequence in portable C.
 * AVX2 builds use _mm256_maddubs_epi16 / _mm256_madd_epi16, or AVX-512 VNNI's dpbusd when the
 * build targets it (same integers); other builds run the portable code.
 * Pure functions, thread-safe.
 */
#ifndef BRAID_KERNELS_CPU_QUANT_INT8_H
#define BRAID_KERNELS_CPU_QUANT_INT8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/act_quant.h"

/* True for the weight types these kernels take (Q4_0, Q4_1, Q8_0). */
bool quant_int8_supported(uint32_t type);

/* Most token groups one quant_int8_dot_groups call takes. */
#define QUANT_INT8_MAX_GROUPS 2

/* Where one weight row's blocks lie, whatever the matrix layout: block b starts at
 * base + b·block_stride; its fp16 scale is at + d_at, Q4_1's fp16 min at + m_at, and its k-th run
 * of four quantized bytes (the GGUF block's qs[4k..4k+3]) at + run_at + k·run_stride. */
typedef struct {
    const uint8_t *base;
    size_t block_stride;
    uint32_t d_at, m_at, run_at, run_stride;
} Int8Row;

/* The view of a row stored as in GGUF (contiguous blocks). Packed rows: int8_pack_row. */
Int8Row quant_int8_row(uint32_t type, const void *row);

/* out[8·i + l] = value of token (first_group + i)·8 + l, for n_groups (1..QUANT_INT8_MAX_GROUPS)
 * groups of a; each block of the row is unpacked once for all of them. Padding lanes give 0. */
void quant_int8_dot_groups(uint32_t type, Int8Row row, const Int8Activations *a, int first_group, int n_groups, float *out);

/* quant_int8_dot_groups for two rows at once (out0 for row0, out1 for row1), the same values;
 * the rows share the activation loads. */
void quant_int8_dot_groups_rows2(uint32_t type, Int8Row row0, Int8Row row1, const Int8Activations *a, int first_group,
                                 int n_groups, float *out0, float *out1);

/* out[i] = value of token first_token + i, for n_tokens (1..4) tokens taken one at a time. */
void quant_int8_dot_tokens(uint32_t type, const void *row, const Int8Activations *a, int first_token, int n_tokens,
                           float *out);

/* out[r] = value of token `token` for the 8 consecutive rows row0 + r·row_bytes (r < 8): one
 * token against eight rows, the rows in the SIMD lanes, so the per-block float steps are one
 * vector operation for all eight rows instead of a horizontal sum and scalar steps per row (the
 * decode of a single sequence). */
void quant_int8_dot_rows8(uint32_t type, const void *row0, size_t row_bytes, const Int8Activations *a, int token, float *out);

/* out[i·out_stride + r] = value of token first_token + i (i < n_tokens) for row r of one group of
 * a packed matrix (int8_pack.h), group pointing at the group's first chunk (a->nb chunks). The
 * packing puts run k of the eight rows side by side in one 32-byte vector, so each lane
 * accumulates its own row's block sum against the token's broadcast run: no horizontal sums, no
 * scattered scale loads, and a token's eight values are one store. Up to four tokens share each
 * block's unpacked weights. */
void quant_int8_dot_packed8(uint32_t type, const uint8_t *group, const Int8Activations *a, int first_token, int n_tokens,
                            float *out, size_t out_stride);

/* The canonical sequence in portable C for token `token` of a (the tests' reference; the portable
 * build's kernels), for a GGUF row or any row view. */
float quant_int8_dot_reference(uint32_t type, const void *row, const Int8Activations *a, int token);
float quant_int8_dot_reference_row(uint32_t type, Int8Row row, const Int8Activations *a, int token);

#endif
