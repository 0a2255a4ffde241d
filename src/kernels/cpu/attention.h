/*
 * attention.h — causal attention of one sequence's queries over its paged KV cache (CPU; fp16
 * cache, fp32 arithmetic).
 *
 * Layout (ARCHITECTURE § 4): per layer, K and V are (n_blocks, n_kv_heads, block_size, head_dim)
 * IEEE halves (decode attention streams the whole cache, so half the bytes of fp32), K stored after
 * RoPE; cpu_kv_store rounds to nearest even, the kernels widen the halves to fp32 exactly and
 * compute in fp32. Every slot records the position of its token in slot_pos
 * (n_blocks, block_size). A query at position p attends to the sequence's slots 0..n_ctx-1 (mapped
 * through block_table) whose recorded position is <= p, so causality follows the explicit
 * positions, not slot order. GQA: query head h reads KV head h / (n_heads / n_kv_heads).
 * Threads: parallel over tokens (or, for few tokens, GQA groups) inside (OpenMP). Thread-safe for
 * distinct outputs.
 */
#ifndef BRAID_KERNELS_CPU_ATTENTION_H
#define BRAID_KERNELS_CPU_ATTENTION_H

#include <stdint.h>

typedef struct {
    uint16_t *k;       /* (n_blocks, n_kv_heads, block_size, head_dim) IEEE half */
    uint16_t *v;       /* (n_blocks, n_kv_heads, block_size, head_dim) IEEE half */
    int32_t *slot_pos; /* (n_blocks, block_size), shared by all layers */
    int block_size, n_kv_heads, head_dim;
} KvLayerView;

/* Writes k_new/v_new (n_tokens, n_kv_heads*head_dim, fp32) into global slots slot_mapping[t]
 * (= block*block_size + offset) as halves rounded to nearest even (±inf past ±65504; the same bits
 * with or without F16C); slots < 0 are skipped (padding). */
void cpu_kv_store(const KvLayerView *kv, const int32_t *slot_mapping, const float *k_new, const float *v_new,
                  int n_tokens);

/* The sequences of a batch: tokens of sequence s are [seq_start[s], seq_start[s+1]), attending
 * over the first n_ctx[s] slots of block_tables[s]. */
typedef struct {
    int n_seqs;
    const int32_t *seq_start;            /* (n_seqs + 1) */
    const int32_t *const *block_tables;  /* (n_seqs) */
    const int32_t *n_ctx;                /* (n_seqs) */
} AttentionSeqs;

/* Attention for every token of a multi-sequence batch in one parallel region; q and out are
 * (n_tokens, n_heads*head_dim), q_pos (n_tokens). */
int cpu_attention_batch(const KvLayerView *kv, const AttentionSeqs *seqs, const float *q, const int32_t *q_pos, int n_tokens,
                        int n_heads, float *out);

/* out (n_tokens, n_heads*head_dim) = softmax(q·Kᵀ/√head_dim, causal by position) · V.
 * q is (n_tokens, n_heads*head_dim) with q_pos (n_tokens). */
int cpu_attention(const KvLayerView *kv, const int32_t *block_table, int n_ctx, const float *q, const int32_t *q_pos,
                  int n_tokens, int n_heads, float *out);

#endif
