#include "kernels/cpu/weight_widen.h"

#include <stdlib.h>
#include <string.h>

#include "model/tensor_types.h"

bool weight_widen_applies(const WeightMatrix *w) {
    return w->type == TENSOR_Q5_0 && w->layout == WEIGHT_LAYOUT_GGUF && w->data && w->cols % QK5_0 == 0;
}

static void widen_block(const BlockQ5_0 *src, BlockQ8_0 *dst) {
    uint32_t qh = (uint32_t)src->qh[0] | (uint32_t)src->qh[1] << 8 | (uint32_t)src->qh[2] << 16 | (uint32_t)src->qh[3] << 24;
    dst->d = src->d;
    for (int j = 0; j < QK5_0 / 2; j++) {
        dst->qs[j] = (int8_t)((int)((src->qs[j] & 0x0F) | ((qh >> j) & 1) << 4) - 16);
        dst->qs[j + QK5_0 / 2] = (int8_t)((int)((src->qs[j] >> 4) | ((qh >> (j + QK5_0 / 2)) & 1) << 4) - 16);
    }
}

int weight_widen_matrix(const WeightMatrix *w, WeightMatrix *out, uint8_t **buffer, BraidError *err) {
    if (!weight_widen_applies(w))
        return braid_error_set(err, "widen: %s (%s) is not a Q5_0 matrix in file layout", w->name ? w->name : "matrix",
                               tensor_type_name(w->type));
    size_t row_bytes = tensor_row_bytes(TENSOR_Q8_0, (uint64_t)w->cols);
    int64_t nb = w->cols / QK5_0;
    uint8_t *data = malloc((size_t)w->rows * row_bytes);
    if (!data) return braid_error_set(err, "widen: out of memory for %s (%lld rows)", w->name ? w->name : "matrix", (long long)w->rows);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < w->rows; r++) {
        const BlockQ5_0 *src = (const BlockQ5_0 *)(w->data + (size_t)r * w->row_bytes);
        BlockQ8_0 *dst = (BlockQ8_0 *)(data + (size_t)r * row_bytes);
        for (int64_t b = 0; b < nb; b++) widen_block(&src[b], &dst[b]);
    }
    *out = *w;
    out->type = TENSOR_Q8_0;
    out->row_bytes = row_bytes;
    out->data = data;
    *buffer = data;
    return 0;
}

static int widen_into(ModelWeights *dst, WeightMatrix *m, BraidError *err) {
    if (!weight_widen_applies(m)) return 0;
    WeightMatrix wide;
    uint8_t *buffer = NULL;
    if (weight_widen_matrix(m, &wide, &buffer, err) || model_weights_adopt(dst, buffer, err)) return -1;
    *m = wide;
    return 0;
}

int weight_widen_model(const ModelWeights *src, ModelWeights *dst, BraidError *err) {
    memset(dst, 0, sizeof *dst);
    bool any = weight_widen_applies(&src->output);
    for (int l = 0; !any && l < src->cfg.n_layers; l++) {
        const LayerWeights *L = &src->layers[l];
        const WeightMatrix *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) any = any || weight_widen_applies(ms[i]);
    }
    if (!any) return 0;
    *dst = *src;
    dst->owned = NULL; /* src keeps its own buffers; dst owns only what it widens */
    dst->n_owned = 0;
    dst->layers = malloc((size_t)src->cfg.n_layers * sizeof *dst->layers);
    if (!dst->layers) {
        memset(dst, 0, sizeof *dst);
        return braid_error_set(err, "widen: out of memory");
    }
    memcpy(dst->layers, src->layers, (size_t)src->cfg.n_layers * sizeof *dst->layers);
    int rc = widen_into(dst, &dst->output, err);
    for (int l = 0; rc == 0 && l < src->cfg.n_layers; l++) {
        LayerWeights *L = &dst->layers[l];
        WeightMatrix *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; rc == 0 && i < sizeof ms / sizeof ms[0]; i++) rc = widen_into(dst, ms[i], err);
        if (rc) braid_error_wrap(err, "layer %d", l);
    }
    if (rc) model_weights_free(dst);
    return rc;
}
