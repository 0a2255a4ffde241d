/*
 * int8_pack.h — the packed weight layout of the CPU int8 arithmetic (WEIGHT_LAYOUT_ROWS8), and
 * the packing of a model's matrices into it (CPU).
 *
 * Why: a single sequence's decode dots one token with every row. In GGUF order a row's block is
 * contiguous, so a kernel that keeps eight rows in the eight 32-bit SIMD lanes must gather their
 * scales and add each row's partial sums across lanes, block after block. Packed, the same bytes
 * are rearranged so that one 32-byte load holds the same four-byte run of eight rows, one row per
 * lane, and the eight rows' scales are one 16-byte load; the token's run is broadcast and each lane
 * accumulates its own row (kernels/cpu/quant_int8.h, quant_int8_dot_packed8). The values computed
 * are the canonical sequence's, bit for bit, so packing changes speed and nothing else.
 *
 * Layout, for Q4_0 / Q4_1 / Q8_0 with cols a multiple of 32 (nb blocks per row): rows in groups of
 * 8 (the last group padded with all-zero rows, whose values are 0 and never read back); group g is
 * nb chunks of 8·block_bytes bytes, chunk b holding block b of the group's rows:
 *     [ d of rows 0..7: 8 fp16 ][ Q4_1: m of rows 0..7: 8 fp16 ][ run 0 of rows 0..7 ][ run 1 … ]
 * where run k of row r (four bytes: the GGUF block's qs[4k..4k+3], unchanged) lies at
 * scale_bytes + 32·k + 4·r. A packed matrix takes the same bytes as the GGUF one, plus the padding.
 * Owns nothing: int8_pack_model's buffers belong to the ModelWeights it fills.
 */
#ifndef BRAID_KERNELS_CPU_INT8_PACK_H
#define BRAID_KERNELS_CPU_INT8_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/cpu/quant_int8.h"
#include "model/model_weights.h"
#include "model/tensor_types.h"

#define INT8_PACK_ROWS 8

/* Bytes of a chunk's scale header: the 8 fp16 scales, and Q4_1's 8 fp16 mins. */
static inline size_t int8_pack_scale_bytes(uint32_t type) { return type == TENSOR_Q4_1 ? 4 * INT8_PACK_ROWS : 2 * INT8_PACK_ROWS; }

/* Bytes of one chunk (block b of a group's 8 rows): 8 GGUF blocks. */
size_t int8_pack_chunk_bytes(uint32_t type);

/* Whether W can be packed (and so take the int8 kernels): a supported type, whole 32-element blocks. */
bool int8_pack_supported(const WeightMatrix *w);

/* Packs W (GGUF layout) into a new buffer: *packed is W's view of it (layout ROWS8), *buffer the
 * malloc'd storage for the caller to free. Returns 0, or -1 with err set (unsupported type or
 * layout, out of memory). */
int int8_pack_matrix(const WeightMatrix *w, WeightMatrix *packed, uint8_t **buffer, BraidError *err);

/* The first chunk of the group holding row r (r a multiple of 8). */
static inline const uint8_t *int8_pack_group(const WeightMatrix *w, int64_t r) {
    return w->data + (size_t)r * w->row_bytes;
}

/* The view of row r of a packed matrix, for code that takes one row at a time (dequantization, the
 * one-row kernels). */
static inline Int8Row int8_pack_row(const WeightMatrix *w, int64_t r) {
    int64_t lane = r % INT8_PACK_ROWS;
    uint32_t scale_bytes = (uint32_t)int8_pack_scale_bytes(w->type);
    return (Int8Row){.base = int8_pack_group(w, r - lane),
                     .block_stride = int8_pack_chunk_bytes(w->type),
                     .d_at = (uint32_t)(2 * lane),
                     .m_at = (uint32_t)(2 * INT8_PACK_ROWS + 2 * lane),
                     .run_at = scale_bytes + 4 * (uint32_t)lane,
                     .run_stride = 4 * INT8_PACK_ROWS};
}

/* Row r of a packed matrix as cols floats (the GGUF dequantization of its blocks); _block: the 32
 * floats of its block b. */
void int8_pack_dequantize_row(const WeightMatrix *w, int64_t r, float *out);
void int8_pack_dequantize_block(const WeightMatrix *w, int64_t r, int64_t b, float *out);

/* A copy of `src` whose matrices the int8 kernels take (every layer matrix and the output head of
 * a packable type) packed into buffers *dst owns; other matrices (the token embedding, unsupported
 * types) stay views of src's storage, so src must outlive dst. Release with model_weights_free.
 * Returns 0, or -1 with err naming the matrix. */
int int8_pack_model(const ModelWeights *src, ModelWeights *dst, BraidError *err);

#endif
