#include "model/synthetic_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tensor_types.h"

#define SYNTHETIC_PREFIX "synthetic:"

typedef struct {
    const char *name;
    ModelConfig cfg;
} SyntheticShape;

/* Published hyperparameters of the architectures these shapes imitate. */
static const SyntheticShape SHAPES[] = {
    {"llama3-8b", {.arch = "llama", .name = "synthetic Llama-3-8B shape", .n_layers = 32, .dim = 4096, .ff_dim = 14336,
                   .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256, .context_length = 8192,
                   .rope_dim = 128, .rope_base = 500000.0f, .rope_position_scale = 1.0f,
                   .rope_pairing = ROPE_PAIRING_INTERLEAVED, .norm_eps = 1e-5f}},
    {"smollm2-135m", {.arch = "llama", .name = "synthetic SmolLM2-135M shape", .n_layers = 30, .dim = 576, .ff_dim = 1536,
                      .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .vocab_size = 49152, .context_length = 8192,
                      .rope_dim = 64, .rope_base = 100000.0f, .rope_position_scale = 1.0f,
                      .rope_pairing = ROPE_PAIRING_INTERLEAVED, .norm_eps = 1e-5f}},
};

bool synthetic_model_spec(const char *spec) { return strncmp(spec, SYNTHETIC_PREFIX, strlen(SYNTHETIC_PREFIX)) == 0; }

static WeightMatrix shape_only(const char *name, int64_t rows, int64_t cols) {
    return (WeightMatrix){.type = TENSOR_BF16, .rows = rows, .cols = cols, .row_bytes = (size_t)cols * 2, .data = NULL, .name = name};
}

int synthetic_model_create(const char *spec, ModelWeights *w, BraidError *err) {
    memset(w, 0, sizeof *w);
    const char *name = synthetic_model_spec(spec) ? spec + strlen(SYNTHETIC_PREFIX) : spec;
    const SyntheticShape *shape = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (strcmp(SHAPES[i].name, name) == 0) shape = &SHAPES[i];
    if (!shape) return braid_error_set(err, "unknown synthetic model '%s' (known: llama3-8b, smollm2-135m)", name);
    const ModelConfig *c = &shape->cfg;
    w->cfg = *c;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return braid_error_set(err, "synthetic model: out of memory");
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *L = &w->layers[l];
        L->wq = shape_only("attn_q", q_dim, c->dim);
        L->wk = shape_only("attn_k", kv_dim, c->dim);
        L->wv = shape_only("attn_v", kv_dim, c->dim);
        L->wo = shape_only("attn_output", c->dim, q_dim);
        L->w_gate = shape_only("ffn_gate", c->ff_dim, c->dim);
        L->w_up = shape_only("ffn_up", c->ff_dim, c->dim);
        L->w_down = shape_only("ffn_down", c->dim, c->ff_dim);
    }
    w->token_embd = shape_only("token_embd", c->vocab_size, c->dim);
    w->output = shape_only("output", c->vocab_size, c->dim);
    int64_t per_layer = q_dim * c->dim * 2 + kv_dim * c->dim * 2 + (int64_t)c->ff_dim * c->dim * 3;
    w->total_bytes = (size_t)(per_layer * c->n_layers + 2 * (int64_t)c->vocab_size * c->dim) * 2;
    return 0;
}

void synthetic_model_free(ModelWeights *w) {
    free(w->layers);
    memset(w, 0, sizeof *w);
}
