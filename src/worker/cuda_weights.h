/*
 * cuda_weights.h — the model's weights on a CUDA device, in bf16, laid out for the forward pass.
 *
 * Q/K/V are fused into one (q_dim + 2 kv_dim, dim) matrix and gate/up into one (2 ff, dim)
 * matrix, so each becomes one GEMM. Norm weights, Q/K/V biases (fused like the matrix) and RoPE
 * inverse frequencies are fp32. Weights
 * come from the GGUF views (dequantized and rounded to bf16 on the host, one matrix at a time) or,
 * for a synthetic model (data == NULL), are generated on the device, bit-identical to the host's
 * synthetic_weight_bf16 (model/synthetic_model.h).
 * Owns: all device allocations (free with cuda_weights_free). Needs a current CUDA device.
 */
#ifndef BRAID_WORKER_CUDA_WEIGHTS_H
#define BRAID_WORKER_CUDA_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "model/model_weights.h"

typedef struct {
    uint16_t *wqkv, *wo, *w_gate_up, *w_down;
    float *attn_norm, *ffn_norm;
    float *bqkv;           /* (q_dim + 2 kv_dim) fused Q|K|V bias (qwen2), or NULL */
    float *q_norm, *k_norm; /* (head_dim) per-head Q/K RMSNorm weights (qwen3), or NULL */
} CudaLayerWeights;

typedef struct {
    CudaLayerWeights *layers;
    uint16_t *token_embd;  /* (vocab, dim) */
    uint16_t *output;      /* (vocab, dim); the same allocation as token_embd when tied */
    float *output_norm;
    float *rope_inv_freq;  /* (rope_dim / 2) */
    int n_layers;
    size_t bytes;
} CudaWeights;

int cuda_weights_upload(CudaWeights *cw, const ModelWeights *w, BraidError *err);
void cuda_weights_free(CudaWeights *cw);

#endif
