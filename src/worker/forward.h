/*
 * forward.h — the llama forward pass over a batch of tokens from one or more sequences (CPU).
 *
 * forward_run() takes a ForwardBatch (worker/forward_batch.h), embeds, runs every layer (RMSNorm,
 * Q/K/V (+ qwen2's biases, qwen3's per-head Q/K RMSNorm), RoPE in the model's pairing, KV store, paged causal attention, output projection, SwiGLU MLP), and writes fp32 logits for the requested rows.
 * With a LoraSet, each sequence's adapter (batch seq_adapter) adds its delta to Q/K/V and O
 * (worker/lora_forward.h); a ForkKV sequence (batch res_block_tables) instead stores its base K/V and
 * its K/V residuals apart and attends by ResidualAttention (kernels/cpu/residual_attention.h).
 * Owns: scratch activations sized for the largest batch seen. Borrows the weights and the KV pool.
 * Thread-safety: one ForwardContext per thread of control; parallel inside (OpenMP/OpenBLAS).
 */
#ifndef BRAID_WORKER_FORWARD_H
#define BRAID_WORKER_FORWARD_H

#include <stdint.h>

#include "common/error.h"
#include "kernels/cpu/matmul.h"
#include "model/lora_adapter.h"
#include "model/model_weights.h"
#include "worker/forward_batch.h"
#include "worker/kv_pool.h"
#include "worker/residual_pool.h"
#include "transport/tp_collective.h"

typedef struct {
    const ModelWeights *weights;
    KvPool *kv;
    TpCollective *tp;  /* tensor parallelism: weights are this rank's shard; NULL = the whole model */
    CpuMatmulMath math; /* arithmetic of every weight matmul (kernels/cpu/matmul.h); fp32 after forward_init */
    const LoraSet *lora; /* adapters the batch's seq_adapter ids name (worker/lora_forward.h); NULL = none */
    ResidualPool *res;   /* ForkKV residual pool (--lora-cache shared); NULL = none: batches with residual tables are refused */
    CpuScratch scratch;
    int capacity; /* tokens the activation buffers hold */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* (capacity, ·) activations */
    float *rope_cos, *rope_sin;                  /* (capacity, rope_dim/2) */
    float *k_res, *v_res;                        /* (capacity, res->rank) ForkKV residuals of the batch */
    float *rope_by_pos_cos, *rope_by_pos_sin;    /* (context_length, rope_dim/2), built at the first ForkKV batch */
    /* Optional (studies): called with the residual stream entering each layer, (n_tokens, dim). */
    void (*layer_probe)(void *probe_ctx, int layer, const float *x, int n_tokens, int dim);
    void *probe_ctx;
    /* Optional: called after each layer on the thread that runs the forward, so a long prefill step
     * can still do a little periodic work (the instance leader's heartbeat to the coordinator). */
    void (*between_layers)(void *ctx);
    void *between_layers_ctx;
    int logits_capacity;
    float *final_hidden;                         /* (logits_capacity, dim) post-norm hidden states */
} ForwardContext;

void forward_init(ForwardContext *ctx, const ModelWeights *weights, KvPool *kv);
void forward_free(ForwardContext *ctx);

/* logits (n_logits, vocab). Fails (out of memory, invalid batch) with a message. */
int forward_run(ForwardContext *ctx, const ForwardBatch *batch, float *logits, BraidError *err);

#endif
