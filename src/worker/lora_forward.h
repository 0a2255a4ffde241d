/*
 * lora_forward.h — the LoRA deltas of the attention projections in the CPU forward pass, per
 * sequence of a mixed batch.
 *
 * A ForwardBatch may carry seq_adapter (worker/forward_batch.h): sequence s runs the base model
 * (id 0) or adapter id k of the LoraSet (model/lora_adapter.h). For every token of a sequence with
 * an adapter that adapts projection P of layer l,
 *     y[t] += scale · B · (A · x[t])        (A: (rank, in), B: (out, rank), scale = alpha / rank)
 * where x is the projection's input and y its output before RoPE (Q/K) and before the residual
 * add (O). Tokens of base sequences and of other adapters are untouched, so one step can mix them.
 * Arithmetic: fp32, accumulated in a fixed order per token, so a token's result never depends on
 * the rest of the batch.
 * Threads: parallel over tokens (OpenMP); no allocation, no state.
 */
#ifndef BRAID_WORKER_LORA_FORWARD_H
#define BRAID_WORKER_LORA_FORWARD_H

#include <stdbool.h>

#include "common/error.h"
#include "model/lora_adapter.h"
#include "model/model_config.h"
#include "worker/forward_batch.h"

/* Refuses a batch whose seq_adapter names an id the set does not hold (set may be NULL: then only
 * id 0, or no seq_adapter, is valid). */
int lora_forward_check_batch(const LoraSet *set, const ForwardBatch *b, BraidError *err);

/* y (n_tokens, out) += each adapted sequence's delta of projection `proj` of `layer` on x (n_tokens, in).
 * No-op when set is NULL or the batch has no seq_adapter. */
void lora_forward_add(const LoraSet *set, const ForwardBatch *b, const ModelConfig *c, int layer, LoraProj proj, const float *x,
                      float *y);

/* True when sequence seq of b is a ForkKV sequence (its res_block_tables entry is set): then
 * lora_forward_add leaves its K and V alone and lora_forward_residual gives their residuals. */
bool lora_forward_has_residual(const ForwardBatch *b, int seq);

/* k_res, v_res (n_tokens, width) = A_k·x and A_v·x (x: the attention input, (n_tokens, dim)) for
 * each token of a ForkKV sequence, zero past the adapter's rank and for every other token (width
 * >= every adapter's rank). No-op without residual tables. */
void lora_forward_residual(const LoraSet *set, const ForwardBatch *b, const ModelConfig *c, int layer, const float *x, int width,
                           float *k_res, float *v_res);

#endif
