/*
 * residual_attention.h — ForkKV's ResidualAttention on the CPU (paper 002 § 5.3, Algorithm 1):
 * causal attention of one sequence's queries over a disaggregated KV cache.
 *
 * The cache of an adapted sequence is split: the base pool (KvLayerView, attention.h) holds
 * K_base = RoPE(x·W_k) and V_base = x·W_v, shared by every adapter on the same tokens; the
 * residual pool holds, per token, K_res = x·A_k and V_res = x·A_v (rank r, no RoPE), this
 * adapter's own. The full K/V the adapter would have cached are
 *     K_j = K_base_j + scale · RoPE_j(B_k · K_res_j)        V_j = V_base_j + scale · B_v · V_res_j
 * and this kernel attends over them without materialising them in the pools: per block of the
 * context it rebuilds K_j in a small tile (deferred RoPE at the slot's recorded position), takes
 * the scores, and runs an online softmax over two accumulators, acc (head_dim) += p·V_base and
 * acc_r (r) += p·V_res; the V up-projection happens once at the end, out = (acc + scale·B_v·acc_r)
 * / l (matrix associativity). Masking, GQA and positions are attention.h's: a query at position p
 * attends to slots whose recorded position (base pool slot_pos) is <= p.
 * B_k or B_v NULL: that projection is not adapted (its residual is ignored).
 * Arithmetic: fp16 storage widened exactly, fp32 compute; the result equals attention over the
 * materialised K/V up to fp32 reassociation and the rounding of storing the halves apart.
 * Cost: rebuilding a key is rank × head_dim multiply-adds per slot and KV head (shared by the
 * group's query heads), against head_dim for each query head's dot product. A call with more than
 * one query tile (a prefill chunk) rebuilds the context's keys once, into a context-sized buffer,
 * and every tile reads them; a decode step (one tile) rebuilds inside its KV head's work item.
 * Folding the residual into the query instead (q·RoPE_p(B_k·k_res) = (B_kᵀ·RoPE_p⁻¹·q)·k_res)
 * does not save work: the deferred RoPE depends on each slot's position, so the folded query is
 * again rank × head_dim per slot, and per query head rather than per KV head.
 * Threads: parallel over (KV head, query tile) inside (OpenMP), and over (KV head, run of blocks)
 * for the once-per-call key rebuild. Thread-safe for distinct outputs.
 */
#ifndef BRAID_KERNELS_CPU_RESIDUAL_ATTENTION_H
#define BRAID_KERNELS_CPU_RESIDUAL_ATTENTION_H

#include <stdint.h>

#include "kernels/cpu/attention.h"
#include "model/model_config.h"

/* One layer of the residual pool: per slot, rank halves of K_res and, apart, rank of V_res. */
typedef struct {
    uint16_t *k;    /* (n_blocks, block_size, rank) IEEE half: x·A_k */
    uint16_t *v;    /* (n_blocks, block_size, rank) IEEE half: x·A_v */
    int block_size, rank; /* rank: the pool's width (the widest adapter's); an adapter uses its first r */
} ResidualLayerView;

/* An adapter's up-projections for one layer, as lora_adapter.h holds them. */
typedef struct {
    const float *b_k;  /* (n_kv_heads*head_dim, r) row-major, or NULL */
    const float *b_v;  /* (n_kv_heads*head_dim, r) row-major, or NULL */
    int rank;          /* r <= the pool's rank */
    float scale;       /* alpha / r */
} ResidualAdapter;

/* RoPE angles by position: cos/sin (n_positions, rope_dim/2), from cpu_rope_angles. */
typedef struct {
    const float *cos, *sin;
    int n_positions, rope_dim, head_dim;
    RopePairing pairing;
} RopeTable;

/* Writes k_res / v_res (n_tokens, rank_in fp32 each; rank_in <= rank) into slots slot_mapping[t]
 * of the residual layer (slots < 0 skipped); lanes past rank_in are zeroed. */
void cpu_residual_store(const ResidualLayerView *res, const int32_t *slot_mapping, const float *k_res, const float *v_res,
                        int rank_in, int n_tokens);

/* out (n_tokens, n_heads*head_dim) = ResidualAttention of q (n_tokens, n_heads*head_dim) at
 * q_pos over the first n_ctx slots of block_table (base) and res_block_table (residual; the same
 * token order). Every recorded position must be < rope->n_positions. -1 when out of memory. */
int cpu_residual_attention(const KvLayerView *kv, const int32_t *block_table, const ResidualLayerView *res,
                           const int32_t *res_block_table, int n_ctx, const ResidualAdapter *ad, const RopeTable *rope,
                           const float *q, const int32_t *q_pos, int n_tokens, int n_heads, float *out);

/* The same result by the former schedule: every (KV head, query tile) work item rebuilds the keys
 * of the blocks it reads (a prefill chunk of n queries rebuilds them n / 16 times). Bitwise equal
 * to cpu_residual_attention; kept as its reference for tests and bench_residual_attention. */
int cpu_residual_attention_per_tile(const KvLayerView *kv, const int32_t *block_table, const ResidualLayerView *res,
                                    const int32_t *res_block_table, int n_ctx, const ResidualAdapter *ad, const RopeTable *rope,
                                    const float *q, const int32_t *q_pos, int n_tokens, int n_heads, float *out);

#endif
