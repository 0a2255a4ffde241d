#include "kernels/cpu/int8_pack.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/quant.h"
#include "model/tensor_types.h"

size_t int8_pack_chunk_bytes(uint32_t type) { return INT8_PACK_ROWS * tensor_type_block_bytes(type); }

bool int8_pack_supported(const WeightMatrix *w) {
    return quant_int8_supported(w->type) && w->cols % ACT_QUANT_BLOCK == 0 && w->rows > 0;
}

/* Offset of the quantized bytes inside a GGUF block (after d, and Q4_1's m). */
static size_t gguf_qs_offset(uint32_t type) { return type == TENSOR_Q4_1 ? 4 : 2; }

/* Bytes of quantized values per block: 16 nibble pairs or 32 int8. */
static size_t block_qs_bytes(uint32_t type) { return tensor_type_block_bytes(type) - gguf_qs_offset(type); }

/* Block b of a row, as GGUF stores it, from any row view. */
static void gguf_block(uint32_t type, Int8Row row, int64_t b, uint8_t *blk) {
    const uint8_t *src = row.base + (size_t)b * row.block_stride;
    memcpy(blk, src + row.d_at, 2);
    if (type == TENSOR_Q4_1) memcpy(blk + 2, src + row.m_at, 2);
    size_t qs = gguf_qs_offset(type);
    for (size_t k = 0; k < block_qs_bytes(type) / 4; k++) memcpy(blk + qs + 4 * k, src + row.run_at + k * row.run_stride, 4);
}

void int8_pack_dequantize_block(const WeightMatrix *w, int64_t r, int64_t b, float *out) {
    uint8_t blk[64];
    gguf_block(w->type, int8_pack_row(w, r), b, blk);
    quant_dequantize_row(w->type, blk, out, ACT_QUANT_BLOCK);
}

void int8_pack_dequantize_row(const WeightMatrix *w, int64_t r, float *out) {
    for (int64_t b = 0; b < w->cols / ACT_QUANT_BLOCK; b++) int8_pack_dequantize_block(w, r, b, out + b * ACT_QUANT_BLOCK);
}

/* The chunks of group g: each of the group's rows scattered into its lane. */
static void pack_group(const WeightMatrix *w, uint8_t *dst, int64_t g) {
    size_t block_bytes = tensor_type_block_bytes(w->type), qs = gguf_qs_offset(w->type);
    size_t runs = block_qs_bytes(w->type) / 4, scale_bytes = int8_pack_scale_bytes(w->type), chunk = int8_pack_chunk_bytes(w->type);
    int64_t nb = w->cols / ACT_QUANT_BLOCK;
    for (int lane = 0; lane < INT8_PACK_ROWS; lane++) {
        int64_t r = g * INT8_PACK_ROWS + lane;
        if (r >= w->rows) break; /* padding rows stay zero */
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * block_bytes;
            uint8_t *c = dst + (size_t)(g * nb + b) * chunk;
            memcpy(c + 2 * lane, blk, 2);
            if (w->type == TENSOR_Q4_1) memcpy(c + 2 * INT8_PACK_ROWS + 2 * lane, blk + 2, 2);
            for (size_t k = 0; k < runs; k++) memcpy(c + scale_bytes + 4 * INT8_PACK_ROWS * k + 4 * (size_t)lane, blk + qs + 4 * k, 4);
        }
    }
}

int int8_pack_matrix(const WeightMatrix *w, WeightMatrix *packed, uint8_t **buffer, BraidError *err) {
    if (w->layout != WEIGHT_LAYOUT_GGUF || !int8_pack_supported(w))
        return braid_error_set(err, "int8 pack: %s (%s, %lld columns) has no int8 kernels", w->name ? w->name : "matrix",
                               tensor_type_name(w->type), (long long)w->cols);
    int64_t groups = (w->rows + INT8_PACK_ROWS - 1) / INT8_PACK_ROWS;
    uint8_t *data = calloc((size_t)groups * INT8_PACK_ROWS, w->row_bytes);
    if (!data) return braid_error_set(err, "int8 pack: out of memory for %s (%lld rows)", w->name ? w->name : "matrix", (long long)w->rows);
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) pack_group(w, data, g);
    *packed = *w;
    packed->data = data;
    packed->layout = WEIGHT_LAYOUT_ROWS8;
    *buffer = data;
    return 0;
}

/* Packs *m in place of its view when it can take the int8 kernels; dst adopts the buffer. */
static int pack_into(ModelWeights *dst, WeightMatrix *m, BraidError *err) {
    if (!int8_pack_supported(m)) return 0;
    WeightMatrix packed;
    uint8_t *buffer;
    if (int8_pack_matrix(m, &packed, &buffer, err) || model_weights_adopt(dst, buffer, err)) return -1;
    *m = packed;
    return 0;
}

int int8_pack_model(const ModelWeights *src, ModelWeights *dst, BraidError *err) {
    *dst = *src;
    dst->owned = NULL; /* src keeps its own buffers; dst owns only what it packs */
    dst->n_owned = 0;
    dst->layers = malloc((size_t)src->cfg.n_layers * sizeof *dst->layers);
    if (!dst->layers) return braid_error_set(err, "int8 pack: out of memory");
    memcpy(dst->layers, src->layers, (size_t)src->cfg.n_layers * sizeof *dst->layers);
    int rc = pack_into(dst, &dst->output, err);
    for (int l = 0; rc == 0 && l < src->cfg.n_layers; l++) {
        LayerWeights *L = &dst->layers[l];
        WeightMatrix *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; rc == 0 && i < sizeof ms / sizeof ms[0]; i++) rc = pack_into(dst, ms[i], err);
        if (rc) braid_error_wrap(err, "layer %d", l);
    }
    if (rc) model_weights_free(dst);
    return rc;
}
