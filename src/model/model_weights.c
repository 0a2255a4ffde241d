#include "model/model_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tensor_types.h"

static int load_matrix(const GgufFile *f, const char *name, int64_t rows, int64_t cols, WeightMatrix *m, BraidError *err) {
    const GgufTensor *t = gguf_find_tensor(f, name);
    if (!t) return braid_error_set(err, "model: tensor '%s' is missing", name);
    if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
        return braid_error_set(err, "model: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                               (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (long long)cols, (long long)rows);
    m->type = t->type;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = tensor_row_bytes(t->type, (uint64_t)cols);
    m->data = t->data;
    m->name = t->name;
    return 0;
}

/* Norm weights and RoPE factors are used as fp32 vectors; convert when stored otherwise. */
static int load_vector(const GgufFile *f, const char *name, int64_t n, ModelWeights *w, const float **out, BraidError *err) {
    const GgufTensor *t = gguf_find_tensor(f, name);
    if (!t) return braid_error_set(err, "model: tensor '%s' is missing", name);
    if (t->n_dims != 1 || (int64_t)t->ne[0] != n)
        return braid_error_set(err, "model: tensor '%s' has %llu elements in %u dims, expected a vector of %lld", name,
                               (unsigned long long)t->ne[0], t->n_dims, (long long)n);
    if (t->type == TENSOR_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        *out = t->data;
        return 0;
    }
    if (t->type != TENSOR_F32 && t->type != TENSOR_F16 && t->type != TENSOR_BF16)
        return braid_error_set(err, "model: vector '%s' has type %s; expected F32, F16 or BF16", name, tensor_type_name(t->type));
    float *v = malloc((size_t)n * sizeof *v);
    if (!v || model_weights_adopt(w, v, err)) return braid_error_set(err, "model: out of memory converting '%s'", name);
    const uint8_t *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        if (t->type == TENSOR_F32) { memcpy(&v[i], src + 4 * i, 4); continue; }
        memcpy(&h, src + 2 * i, 2);
        v[i] = t->type == TENSOR_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    *out = v;
    return 0;
}

static int load_layer(const GgufFile *f, const ModelConfig *c, int l, ModelWeights *w, BraidError *err) {
    LayerWeights *L = &w->layers[l];
    char name[96];
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
#define LAYER_NAME(suffix) (snprintf(name, sizeof name, "blk.%d.%s", l, suffix), name)
    if (load_vector(f, LAYER_NAME("attn_norm.weight"), c->dim, w, &L->attn_norm, err) ||
        load_vector(f, LAYER_NAME("ffn_norm.weight"), c->dim, w, &L->ffn_norm, err) ||
        load_matrix(f, LAYER_NAME("attn_q.weight"), q_dim, c->dim, &L->wq, err) ||
        load_matrix(f, LAYER_NAME("attn_k.weight"), kv_dim, c->dim, &L->wk, err) ||
        load_matrix(f, LAYER_NAME("attn_v.weight"), kv_dim, c->dim, &L->wv, err) ||
        load_matrix(f, LAYER_NAME("attn_output.weight"), c->dim, q_dim, &L->wo, err) ||
        load_matrix(f, LAYER_NAME("ffn_gate.weight"), c->ff_dim, c->dim, &L->w_gate, err) ||
        load_matrix(f, LAYER_NAME("ffn_up.weight"), c->ff_dim, c->dim, &L->w_up, err) ||
        load_matrix(f, LAYER_NAME("ffn_down.weight"), c->dim, c->ff_dim, &L->w_down, err))
        return -1;
    if (c->qkv_bias && (load_vector(f, LAYER_NAME("attn_q.bias"), q_dim, w, &L->bq, err) ||
                        load_vector(f, LAYER_NAME("attn_k.bias"), kv_dim, w, &L->bk, err) ||
                        load_vector(f, LAYER_NAME("attn_v.bias"), kv_dim, w, &L->bv, err)))
        return -1;
    if (c->qk_norm && (load_vector(f, LAYER_NAME("attn_q_norm.weight"), c->head_dim, w, &L->q_norm, err) ||
                       load_vector(f, LAYER_NAME("attn_k_norm.weight"), c->head_dim, w, &L->k_norm, err)))
        return -1;
#undef LAYER_NAME
    return 0;
}

int model_weights_load(const GgufFile *f, const ModelConfig *cfg, ModelWeights *w, BraidError *err) {
    memset(w, 0, sizeof *w);
    w->cfg = *cfg;
    w->layers = calloc((size_t)cfg->n_layers, sizeof *w->layers);
    if (!w->layers) return braid_error_set(err, "model: out of memory");
    if (load_matrix(f, "token_embd.weight", cfg->vocab_size, cfg->dim, &w->token_embd, err) ||
        load_vector(f, "output_norm.weight", cfg->dim, w, &w->output_norm, err))
        goto fail;
    if (gguf_find_tensor(f, "output.weight")) {
        if (load_matrix(f, "output.weight", cfg->vocab_size, cfg->dim, &w->output, err)) goto fail;
    } else {
        w->output = w->token_embd;
        w->output_tied = 1;
    }
    if (gguf_find_tensor(f, "rope_freqs.weight") &&
        load_vector(f, "rope_freqs.weight", cfg->rope_dim / 2, w, &w->rope_freq_factors, err))
        goto fail;
    for (int l = 0; l < cfg->n_layers; l++)
        if (load_layer(f, cfg, l, w, err)) goto fail;
    for (uint64_t i = 0; i < f->n_tensors; i++) w->total_bytes += f->tensors[i].nbytes;
    return 0;
fail:
    model_weights_free(w);
    return -1;
}

int model_weights_adopt(ModelWeights *w, void *buffer, BraidError *err) {
    void **grown = realloc(w->owned, (size_t)(w->n_owned + 1) * sizeof *grown);
    if (!grown) {
        free(buffer);
        return braid_error_set(err, "model: out of memory");
    }
    w->owned = grown;
    w->owned[w->n_owned++] = buffer;
    return 0;
}

void model_weights_free(ModelWeights *w) {
    for (int i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->owned);
    free(w->layers);
    memset(w, 0, sizeof *w);
}
