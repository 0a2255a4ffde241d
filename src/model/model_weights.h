/*
 * model_weights.h — views of a llama-family model's tensors inside a GGUF mapping.
 *
 * Owns: the per-layer table and any small vectors it had to convert to fp32 (norm weights stored
 * as F16/BF16). Matrix data stays in the GGUF mapping, quantized, and is read by the kernels in its
 * stored type; the GgufFile must outlive the ModelWeights.
 * Checks every tensor's presence, type and shape against the config and fails with the tensor name.
 * Biases (qwen2's attn_{q,k,v}.bias) and per-head Q/K norm weights (qwen3's attn_{q,k}_norm) are
 * fp32 vectors like the norms, NULL when the architecture has none.
 * Thread-safety: read-only after load.
 */
#ifndef BRAID_MODEL_MODEL_WEIGHTS_H
#define BRAID_MODEL_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "model/gguf.h"
#include "model/model_config.h"

/* How a matrix's bytes are arranged. */
typedef enum {
    WEIGHT_LAYOUT_GGUF = 0,  /* as stored in the file: row after row (the zero value) */
    WEIGHT_LAYOUT_ROWS8 = 1, /* the CPU int8 kernels' packing: eight rows interleaved block by block
                                (kernels/cpu/int8_pack.h); made by the CPU backend, never by the loader */
} WeightLayout;

/* A matrix of `rows` output features, each a row of `cols` inputs stored in `type`; row_bytes is
 * the size of one row in that type whatever the layout. */
typedef struct {
    uint32_t type;
    int64_t rows, cols;
    size_t row_bytes;
    const uint8_t *data;
    const char *name;
    WeightLayout layout;
} WeightMatrix;

typedef struct {
    const float *attn_norm; /* (dim) */
    const float *ffn_norm;  /* (dim) */
    WeightMatrix wq;        /* (n_heads*head_dim, dim) */
    WeightMatrix wk, wv;    /* (n_kv_heads*head_dim, dim) */
    WeightMatrix wo;        /* (dim, n_heads*head_dim) */
    WeightMatrix w_gate, w_up; /* (ff_dim, dim) */
    WeightMatrix w_down;    /* (dim, ff_dim) */
    const float *bq;        /* (n_heads*head_dim) Q bias added after the projection, or NULL (cfg.qkv_bias) */
    const float *bk, *bv;   /* (n_kv_heads*head_dim) K / V biases, or NULL */
    const float *q_norm;    /* (head_dim) RMSNorm weight of every Q head before RoPE, or NULL (cfg.qk_norm) */
    const float *k_norm;    /* (head_dim) the same for every K head */
} LayerWeights;

typedef struct {
    ModelConfig cfg;
    WeightMatrix token_embd;  /* (vocab, dim) */
    WeightMatrix output;      /* (vocab, dim); the embedding itself when tied */
    int output_tied;
    const float *output_norm; /* (dim) */
    const float *rope_freq_factors; /* (rope_dim/2) llama3-style divisors, or NULL */
    LayerWeights *layers;     /* (n_layers) */
    void **owned;             /* buffers this struct frees: fp32 copies made at load, repacked shards */
    int n_owned;
    size_t total_bytes;
} ModelWeights;

int model_weights_load(const GgufFile *file, const ModelConfig *cfg, ModelWeights *weights, BraidError *err);
void model_weights_free(ModelWeights *weights);
/* Hands a malloc'd buffer to the weights, freed by model_weights_free. On failure frees it and returns -1. */
int model_weights_adopt(ModelWeights *weights, void *buffer, BraidError *err);

#endif
