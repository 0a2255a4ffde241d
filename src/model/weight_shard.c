#include "model/weight_shard.h"

#include <stdlib.h>
#include <string.h>

#include "model/tensor_types.h"

int tp_shard_range(const ModelConfig *c, uint32_t ff_type, int rank, int size, TpShardRange *r, BraidError *err) {
    if (size < 1 || rank < 0 || rank >= size) return braid_error_set(err, "tp: rank %d of %d is not valid", rank, size);
    if (size > c->n_kv_heads)
        return braid_error_set(err, "tp: %d ranks cannot split %d KV heads (at most %d ranks)", size, c->n_kv_heads, c->n_kv_heads);
    int group = c->n_heads / c->n_kv_heads;
    r->kv_head_lo = rank * c->n_kv_heads / size;
    r->kv_head_hi = (rank + 1) * c->n_kv_heads / size;
    r->head_lo = r->kv_head_lo * group;
    r->head_hi = r->kv_head_hi * group;
    /* The down projection is sliced by columns, so the SwiGLU split falls on quantization blocks. */
    int unit = (int)tensor_type_block_elems(ff_type);
    if (unit < 1 || c->ff_dim % unit)
        return braid_error_set(err, "tp: SwiGLU width %d is not a multiple of the %s block (%d)", c->ff_dim, tensor_type_name(ff_type), unit);
    int n_units = c->ff_dim / unit;
    if (n_units < size) return braid_error_set(err, "tp: SwiGLU width %d is too narrow for %d ranks", c->ff_dim, size);
    r->ff_lo = rank * n_units / size * unit;
    r->ff_hi = (rank + 1) * n_units / size * unit;
    return 0;
}

/* Output rows [lo, hi): a view into the same storage. */
static WeightMatrix slice_rows(const WeightMatrix *w, int64_t lo, int64_t hi) {
    WeightMatrix s = *w;
    s.rows = hi - lo;
    if (w->data) s.data = w->data + (size_t)lo * w->row_bytes;
    else s.synth_index0 += (uint64_t)lo * (uint64_t)w->synth_stride; /* synthetic: the same elements, generated later */
    return s;
}

/* Input columns [lo, hi) of every row, repacked contiguously into a buffer the shard adopts. */
static int slice_cols(ModelWeights *shard, const WeightMatrix *w, int64_t lo, int64_t hi, WeightMatrix *out, BraidError *err) {
    size_t block = tensor_type_block_elems(w->type), block_bytes = tensor_type_block_bytes(w->type);
    if (lo % (int64_t)block || hi % (int64_t)block)
        return braid_error_set(err, "tp: %s columns [%lld, %lld) are not aligned to its %s block of %zu", w->name, (long long)lo,
                               (long long)hi, tensor_type_name(w->type), block);
    size_t offset = (size_t)lo / block * block_bytes, row_bytes = tensor_row_bytes(w->type, (uint64_t)(hi - lo));
    if (!w->data) { /* synthetic (model/synthetic_model.h): no bytes to repack, the slice's elements move */
        *out = *w;
        out->cols = hi - lo;
        out->row_bytes = row_bytes;
        out->synth_index0 += (uint64_t)lo;
        return 0;
    }
    uint8_t *data = malloc((size_t)w->rows * row_bytes);
    if (!data || model_weights_adopt(shard, data, err)) return braid_error_set(err, "tp: out of memory slicing %s", w->name);
    for (int64_t r = 0; r < w->rows; r++) memcpy(data + (size_t)r * row_bytes, w->data + (size_t)r * w->row_bytes + offset, row_bytes);
    *out = *w;
    out->cols = hi - lo;
    out->row_bytes = row_bytes;
    out->data = data;
    return 0;
}

static int shard_layer(ModelWeights *shard, const LayerWeights *L, const TpShardRange *r, int head_dim, LayerWeights *out,
                       BraidError *err) {
    *out = *L;
    out->wq = slice_rows(&L->wq, (int64_t)r->head_lo * head_dim, (int64_t)r->head_hi * head_dim);
    out->wk = slice_rows(&L->wk, (int64_t)r->kv_head_lo * head_dim, (int64_t)r->kv_head_hi * head_dim);
    out->wv = slice_rows(&L->wv, (int64_t)r->kv_head_lo * head_dim, (int64_t)r->kv_head_hi * head_dim);
    out->w_gate = slice_rows(&L->w_gate, r->ff_lo, r->ff_hi);
    out->w_up = slice_rows(&L->w_up, r->ff_lo, r->ff_hi);
    /* A bias follows its projection's output rows; per-head norm weights are the same for every head. */
    if (L->bq) out->bq = L->bq + (size_t)r->head_lo * head_dim;
    if (L->bk) out->bk = L->bk + (size_t)r->kv_head_lo * head_dim;
    if (L->bv) out->bv = L->bv + (size_t)r->kv_head_lo * head_dim;
    if (slice_cols(shard, &L->wo, (int64_t)r->head_lo * head_dim, (int64_t)r->head_hi * head_dim, &out->wo, err) ||
        slice_cols(shard, &L->w_down, r->ff_lo, r->ff_hi, &out->w_down, err))
        return -1;
    return 0;
}

int model_weights_shard(const ModelWeights *full, int rank, int size, ModelWeights *shard, BraidError *err) {
    memset(shard, 0, sizeof *shard);
    const ModelConfig *c = &full->cfg;
    TpShardRange r;
    if (tp_shard_range(c, full->layers[0].w_down.type, rank, size, &r, err)) return -1;
    *shard = *full;
    shard->owned = NULL;
    shard->n_owned = 0;
    shard->cfg.n_heads = r.head_hi - r.head_lo;
    shard->cfg.n_kv_heads = r.kv_head_hi - r.kv_head_lo;
    shard->cfg.ff_dim = r.ff_hi - r.ff_lo;
    shard->layers = calloc((size_t)c->n_layers, sizeof *shard->layers);
    if (!shard->layers) return braid_error_set(err, "tp: out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        if (shard_layer(shard, &full->layers[l], &r, c->head_dim, &shard->layers[l], err)) {
            model_weights_free(shard);
            return braid_error_wrap(err, "layer %d", l);
        }
    }
    return 0;
}
