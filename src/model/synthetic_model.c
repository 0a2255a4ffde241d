#include "model/synthetic_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mix64.h"
#include "model/tensor_types.h"

#define SYNTHETIC_PREFIX "synthetic:"

typedef struct {
    const char *name;
    ModelConfig cfg;
    int output_tied;
} SyntheticShape;

/* Published hyperparameters of the architectures these shapes imitate (Llama 3.2 1B's llama3 RoPE
 * scaling is left out: the frequencies do not change the cost of a step). */
static const SyntheticShape SHAPES[] = {
    {"llama3-8b",
     {.arch = "llama", .name = "synthetic Llama-3-8B shape", .n_layers = 32, .dim = 4096, .ff_dim = 14336, .n_heads = 32,
      .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256, .context_length = 8192, .rope_dim = 128, .rope_base = 500000.0f,
      .rope_position_scale = 1.0f, .rope_pairing = ROPE_PAIRING_INTERLEAVED, .norm_eps = 1e-5f},
     0},
    {"llama3-1b",
     {.arch = "llama", .name = "synthetic Llama-3.2-1B shape", .n_layers = 16, .dim = 2048, .ff_dim = 8192, .n_heads = 32,
      .n_kv_heads = 8, .head_dim = 64, .vocab_size = 128256, .context_length = 8192, .rope_dim = 64, .rope_base = 500000.0f,
      .rope_position_scale = 1.0f, .rope_pairing = ROPE_PAIRING_INTERLEAVED, .norm_eps = 1e-5f},
     1},
    {"smollm2-135m",
     {.arch = "llama", .name = "synthetic SmolLM2-135M shape", .n_layers = 30, .dim = 576, .ff_dim = 1536, .n_heads = 9,
      .n_kv_heads = 3, .head_dim = 64, .vocab_size = 49152, .context_length = 8192, .rope_dim = 64, .rope_base = 100000.0f,
      .rope_position_scale = 1.0f, .rope_pairing = ROPE_PAIRING_INTERLEAVED, .norm_eps = 1e-5f},
     1},
};

bool synthetic_model_spec(const char *spec) { return spec && strncmp(spec, SYNTHETIC_PREFIX, strlen(SYNTHETIC_PREFIX)) == 0; }

/* The NAME part of a spec: after the prefix, up to the tokenizer's ':'. */
static size_t spec_name(const char *spec, const char **name) {
    *name = synthetic_model_spec(spec) ? spec + strlen(SYNTHETIC_PREFIX) : spec;
    const char *colon = strchr(*name, ':');
    return colon ? (size_t)(colon - *name) : strlen(*name);
}

int synthetic_model_tokenizer_path(const char *spec, char *out, size_t cap, BraidError *err) {
    const char *name;
    size_t len = spec_name(spec, &name);
    const char *env = getenv("BRAID_MODEL"); /* the CLI's default model, when it names a file */
    const char *fallback = env && *env && !synthetic_model_spec(env) ? env : SYNTHETIC_TOKENIZER_DEFAULT;
    const char *path = name[len] == ':' && name[len + 1] ? name + len + 1 : fallback;
    if ((size_t)snprintf(out, cap, "%s", path) >= cap) return braid_error_set(err, "synthetic model: tokenizer path too long");
    return 0;
}

/* Matrix kinds, mixed into each matrix's seed. */
enum { M_Q = 1, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_EMBD, M_OUTPUT };

static WeightMatrix synthetic_matrix(const char *name, int64_t rows, int64_t cols, int layer, int kind) {
    uint64_t seed = mix64(0x5eed5eedull ^ ((uint64_t)(layer + 1) << 8) ^ (uint64_t)kind) | 1u; /* never 0: 0 means real data */
    return (WeightMatrix){.type = TENSOR_BF16, .rows = rows, .cols = cols, .row_bytes = (size_t)cols * 2, .data = NULL, .name = name,
                          .synth_seed = seed, .synth_index0 = 0, .synth_stride = cols, .synth_scale = sqrtf(3.0f / (float)cols)};
}

static int64_t matrix_elems(const WeightMatrix *m) { return m->rows * m->cols; }

int synthetic_model_create(const char *spec, int vocab_size, ModelWeights *w, BraidError *err) {
    memset(w, 0, sizeof *w);
    const char *name;
    size_t len = spec_name(spec, &name);
    const SyntheticShape *shape = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (strlen(SHAPES[i].name) == len && strncmp(SHAPES[i].name, name, len) == 0) shape = &SHAPES[i];
    if (!shape) return braid_error_set(err, "unknown synthetic model '%.*s' (known: %s)", (int)len, name, SYNTHETIC_MODEL_NAMES);
    ModelConfig *c = &w->cfg;
    *c = shape->cfg;
    if (vocab_size > 0 && vocab_size != c->vocab_size) {
        char name[sizeof c->name + 64];
        snprintf(name, sizeof name, "%s, vocabulary %d (the tokenizer's) instead of %d", shape->cfg.name, vocab_size,
                 shape->cfg.vocab_size);
        memcpy(c->name, name, sizeof c->name - 1);
        c->name[sizeof c->name - 1] = '\0';
        c->vocab_size = vocab_size;
    }
    float *ones = malloc((size_t)c->dim * sizeof *ones);
    if (!ones || model_weights_adopt(w, ones, err) || !(w->layers = calloc((size_t)c->n_layers, sizeof *w->layers))) {
        model_weights_free(w); /* model_weights_adopt freed ones if it failed */
        return braid_error_set(err, "synthetic model: out of memory");
    }
    for (int i = 0; i < c->dim; i++) ones[i] = 1.0f;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t elems = 0;
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *L = &w->layers[l];
        L->attn_norm = L->ffn_norm = ones;
        L->wq = synthetic_matrix("attn_q", q_dim, c->dim, l, M_Q);
        L->wk = synthetic_matrix("attn_k", kv_dim, c->dim, l, M_K);
        L->wv = synthetic_matrix("attn_v", kv_dim, c->dim, l, M_V);
        L->wo = synthetic_matrix("attn_output", c->dim, q_dim, l, M_O);
        L->w_gate = synthetic_matrix("ffn_gate", c->ff_dim, c->dim, l, M_GATE);
        L->w_up = synthetic_matrix("ffn_up", c->ff_dim, c->dim, l, M_UP);
        L->w_down = synthetic_matrix("ffn_down", c->dim, c->ff_dim, l, M_DOWN);
        const WeightMatrix *all[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) elems += matrix_elems(all[i]);
    }
    w->output_norm = ones;
    w->token_embd = synthetic_matrix("token_embd", c->vocab_size, c->dim, -1, M_EMBD);
    w->output_tied = shape->output_tied;
    w->output = w->output_tied ? w->token_embd : synthetic_matrix("output", c->vocab_size, c->dim, -1, M_OUTPUT);
    elems += matrix_elems(&w->token_embd) * (w->output_tied ? 1 : 2);
    w->total_bytes = (size_t)elems * 2;
    return 0;
}

void synthetic_model_free(ModelWeights *w) { model_weights_free(w); }

/* The same arithmetic as fill_random_bf16_kernel (kernels/cuda/memory_ops.cu): 24 bits of the
 * mixed index as a uniform in [0, 1), scaled to [-scale, scale), rounded to nearest even. */
uint16_t synthetic_weight_bf16(uint64_t seed, uint64_t index, float scale) {
    float u = (float)(mix64(seed ^ (index * 0x2545f4914f6cdd1dull)) >> 40) * (1.0f / 16777216.0f);
    return fp32_to_bf16((2.0f * u - 1.0f) * scale);
}

void synthetic_matrix_fill_bf16(const WeightMatrix *m, uint16_t *out) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < m->rows; r++) {
        uint64_t base = m->synth_index0 + (uint64_t)r * (uint64_t)m->synth_stride;
        uint16_t *row = out + (size_t)r * (size_t)m->cols;
        for (int64_t c = 0; c < m->cols; c++) row[c] = synthetic_weight_bf16(m->synth_seed, base + (uint64_t)c, m->synth_scale);
    }
}

static bool is_unmaterialized(const WeightMatrix *m) { return m->data == NULL && m->synth_seed != 0; }

/* Every matrix of w (the tied output head once), into a malloc'd array; NULL when out of memory. */
static WeightMatrix **all_matrices(ModelWeights *w, int *n) {
    WeightMatrix **all = malloc(((size_t)w->cfg.n_layers * 7 + 2) * sizeof *all);
    if (!all) return NULL;
    *n = 0;
    for (int l = 0; l < w->cfg.n_layers; l++) {
        LayerWeights *L = &w->layers[l];
        WeightMatrix *layer[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) all[(*n)++] = layer[i];
    }
    all[(*n)++] = &w->token_embd;
    if (!w->output_tied) all[(*n)++] = &w->output;
    return all;
}

bool synthetic_model_has_unmaterialized(const ModelWeights *w) {
    if (!w->layers) return false;
    const LayerWeights *L = &w->layers[0];
    /* A model is synthetic as a whole: its first matrix says. */
    return is_unmaterialized(&L->wq) || is_unmaterialized(&w->token_embd);
}

static int check_fits(const ModelWeights *w, WeightMatrix *const *all, int n, BraidError *err) {
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        if (is_unmaterialized(all[i])) bytes += (size_t)matrix_elems(all[i]) * 2;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double physical = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    if (physical > 0 && (double)bytes > 0.75 * physical)
        return braid_error_set(err, "synthetic model %s: its bf16 weights (%.1f GiB) do not fit in this host's memory (%.1f GiB); "
                                    "run it on a GPU (--device cuda) or pick a smaller shape (%s)",
                               w->cfg.name, (double)bytes / (1u << 30), physical / (1u << 30), SYNTHETIC_MODEL_NAMES);
    return 0;
}

int synthetic_model_materialize(const ModelWeights *src, ModelWeights *dst, BraidError *err) {
    memset(dst, 0, sizeof *dst);
    *dst = *src;
    dst->owned = NULL;
    dst->n_owned = 0;
    dst->layers = malloc((size_t)src->cfg.n_layers * sizeof *dst->layers);
    if (!dst->layers) return braid_error_set(err, "synthetic model: out of memory");
    memcpy(dst->layers, src->layers, (size_t)src->cfg.n_layers * sizeof *dst->layers);
    int n = 0;
    WeightMatrix **all = all_matrices(dst, &n);
    int rc = all ? check_fits(dst, all, n, err) : braid_error_set(err, "synthetic model: out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        WeightMatrix *m = all[i];
        if (!is_unmaterialized(m)) continue;
        uint16_t *data = malloc((size_t)matrix_elems(m) * 2);
        if (!data || model_weights_adopt(dst, data, err)) {
            rc = braid_error_set(err, "synthetic model: out of memory generating %s (%lld x %lld)", m->name, (long long)m->rows,
                                 (long long)m->cols);
            break;
        }
        synthetic_matrix_fill_bf16(m, data);
        m->data = (const uint8_t *)data;
    }
    free(all);
    if (rc == 0 && dst->output_tied) dst->output = dst->token_embd;
    if (rc) model_weights_free(dst);
    return rc;
}
