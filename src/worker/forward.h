/*
 * forward.h — the llama forward pass over a batch of tokens from one or more sequences (CPU).
 *
 * A ForwardBatch is what the scheduler's step plan boils down to: token ids with explicit
 * positions, the KV slot each token's K/V goes to, and per sequence its block table and context
 * length. forward_run() embeds, runs every layer (RMSNorm, Q/K/V, RoPE, KV store, paged causal
 * attention, output projection, SwiGLU MLP), and writes fp32 logits for the requested rows.
 * Owns: scratch activations sized for the largest batch seen. Borrows the weights and the KV pool.
 * Thread-safety: one ForwardContext per thread of control; parallel inside (OpenMP/OpenBLAS).
 */
#ifndef BRAID_WORKER_FORWARD_H
#define BRAID_WORKER_FORWARD_H

#include <stdint.h>

#include "common/error.h"
#include "kernels/cpu/matmul.h"
#include "model/model_weights.h"
#include "worker/kv_pool.h"

typedef struct {
    int n_tokens;
    const int32_t *tokens;       /* (n_tokens) */
    const int32_t *positions;    /* (n_tokens) */
    const int32_t *slot_mapping; /* (n_tokens) global KV slot = block*block_size + offset; -1 = write nowhere */
    int n_seqs;
    const int32_t *seq_start;    /* (n_seqs + 1) tokens of sequence s are [seq_start[s], seq_start[s+1]) */
    const int32_t *const *block_tables; /* (n_seqs) block ids of each sequence, in order */
    const int32_t *seq_n_ctx;    /* (n_seqs) slots in each sequence's context including this batch's */
    int n_logits;
    const int32_t *logit_rows;   /* (n_logits) token indices whose logits are wanted */
} ForwardBatch;

typedef struct {
    const ModelWeights *weights;
    KvPool *kv;
    CpuScratch scratch;
    int capacity; /* tokens the activation buffers hold */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* (capacity, ·) activations */
    float *rope_cos, *rope_sin;                  /* (capacity, rope_dim/2) */
    int logits_capacity;
    float *final_hidden;                         /* (logits_capacity, dim) post-norm hidden states */
} ForwardContext;

void forward_init(ForwardContext *ctx, const ModelWeights *weights, KvPool *kv);
void forward_free(ForwardContext *ctx);

/* logits (n_logits, vocab). Fails (out of memory, invalid batch) with a message. */
int forward_run(ForwardContext *ctx, const ForwardBatch *batch, float *logits, BraidError *err);

#endif
