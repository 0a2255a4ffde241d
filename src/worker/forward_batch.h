/*
 * forward_batch.h — what one step of the forward pass computes, independent of the backend.
 *
 * A ForwardBatch is what the scheduler's step plan boils down to: token ids with explicit
 * positions, the KV slot each token's K/V goes to, and per sequence its block table and context
 * length. Tokens of one sequence are contiguous and are the last tokens of that sequence's
 * context (queries attend to slots [0, n_ctx) of their block table, causally by recorded
 * position). Plain data; the caller owns every array.
 */
#ifndef BRAID_WORKER_FORWARD_BATCH_H
#define BRAID_WORKER_FORWARD_BATCH_H

#include <stdint.h>

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
    /* (n_seqs) LoRA adapter id of each sequence (model/lora_adapter.h: 0 = the base model, k = the
     * backend's adapter k); NULL = every sequence runs the base model. */
    const int32_t *seq_adapter;
    /* ForkKV (--lora-cache shared; kernels/cpu/residual_attention.h). res_block_tables (n_seqs, or
     * NULL = none): sequence s with a non-NULL entry keeps its adapter's K/V residuals (x·A_k,
     * x·A_v) in the backend's residual pool at those blocks (same token order as its base table),
     * its base K/V (no adapter delta) in the base pool, and attends by ResidualAttention. Its
     * tokens' residuals go to res_slot_mapping[t] (-1 = already cached there: write nowhere), and
     * a base slot of -1 likewise means the base K/V of that token is cached and shared. */
    const int32_t *const *res_block_tables;
    const int32_t *res_slot_mapping; /* (n_tokens) */
} ForwardBatch;

#endif
