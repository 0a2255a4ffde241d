/*
 * cuda_lora.h — LoRA adapters and ForkKV residuals on the CUDA backend: the device copy of a
 * LoraSet, the device residual pool, and the per-layer launches that give a step the CPU
 * backend's adapter semantics (worker/lora_forward.h, worker/forward.c).
 *
 * Per sequence of a mixed batch (ForwardBatch.seq_adapter; id 0 = the base model):
 *   - separate mode (no residual table): y += scale · B · (A · x) on Q, K, V (before RoPE, into
 *     the fused QKV output) and O (into the residual stream), kernels/cuda/lora_delta.cu;
 *   - ForkKV (a non-NULL res_block_tables entry): the Q and O deltas as above, but no K/V delta:
 *     x·A_k and x·A_v go to the residual pool at res_slot_mapping, the base K/V (no delta) to the
 *     base pool, and the sequence attends by ResidualAttention (kernels/cuda/residual_attention.cu)
 *     instead of the backend's ordinary attention, which must leave it out of its work lists.
 * Every token looks up its own sequence's adapter, so base tokens, tokens of several adapters and
 * ForkKV tokens share each launch. One difference from the CPU: a ForkKV sequence of the base
 * model (id 0) writes no residuals (the CPU writes zeros); ResidualAttention ignores them for id 0
 * either way, and the engine never forks the base model (sched_forked).
 *
 * Use: cuda_lora_prepare() once per step (validates the batch, packs and uploads the step's
 * adapter metadata on `stream`), then per layer, on the same stream, cuda_lora_project() after the
 * QKV GEMM, cuda_lora_attend() after the ordinary attention, cuda_lora_add_output() after the O
 * GEMM. Steps without any adapter work (cuda_lora_batch_adapted() false) need none of it.
 * Arithmetic: bf16 activations in, fp32 deltas and A/B, bf16 residual pool (the CPU keeps IEEE
 * halves): results match the CPU backend up to bf16 rounding, not bit for bit.
 * Owns: every device allocation of the adapters, the residual pool and the step metadata (pinned);
 * borrows the LoraSet only during create. Needs the backend's device current.
 * Not thread-safe: driven by the backend's thread; the pinned metadata is rewritten each step, so
 * a step must have finished (the backend synchronizes at its end) before the next prepare.
 */
#ifndef BRAID_WORKER_CUDA_LORA_H
#define BRAID_WORKER_CUDA_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "model/lora_adapter.h"
#include "model/model_config.h"
#include "worker/forward_batch.h"

/* Offsets (int32 elements) of the step's adapter metadata in the pinned and device buffers. */
typedef struct {
    size_t tok_adapter;  /* (T) adapter of each token's sequence: Q and O deltas */
    size_t kv_adapter;   /* (T) the same, 0 for ForkKV tokens: K and V deltas */
    size_t res_adapter;  /* (T) adapter of ForkKV tokens, 0 for the rest: residual store */
    size_t res_slots;    /* (T) residual slot of each token, -1 = none */
    size_t seq_adapter;  /* (S) */
    size_t dec_tiles;    /* (S, 2) ResidualAttention work of one-token ForkKV sequences: (seq, 0) */
    size_t pre_tiles;    /* (max_pre_tiles, 2) of longer ForkKV sequences: (seq, first row) */
    size_t res_tables;   /* (S, table_stride) residual block tables; last, so an upload stops after n_seqs rows */
    size_t total;
    int max_pre_tiles, table_stride;
} CudaLoraMeta;

/* What the packed step needs launched (host side). */
typedef struct {
    int n_tokens;
    bool any_adapter;  /* some token has an adapter: Q and O deltas */
    bool any_kv_delta; /* some non-ForkKV token has an adapter: K and V deltas */
    bool any_residual; /* some ForkKV sequence: residual store and ResidualAttention */
    int n_dec_tiles, dec_splits, n_pre_tiles, pre_splits;
} CudaLoraStep;

typedef struct {
    int n_ids;    /* adapters + 1 (id 0 = the base model); 0 = no adapters loaded */
    int max_rank; /* widest adapter rank */
    int n_layers, dim, q_dim, kv_dim, n_heads, n_kv_heads, head_dim, n_sms;
    int proj_in[LORA_PROJ_COUNT], proj_out[LORA_PROJ_COUNT]; /* lora_proj_dims of each projection */
    float **adapter_mem;          /* host array (n_ids) of device buffers: adapter k's A and B pairs, fp32 (entry 0 NULL) */
    const float **a_table, **b_table; /* device (n_layers, LORA_PROJ_COUNT, n_ids) pointers into adapter_mem, NULL = not adapted */
    int32_t *rank;                /* device (n_ids) */
    float *scale;                 /* device (n_ids) alpha / rank */
    float *shrink;                /* device (max_batch_tokens, max_rank): the per-token A·x of a delta */
    /* ForkKV residual pool (res_blocks == 0: none) */
    int res_blocks, res_rank, block_size;
    uint16_t **res_k, **res_v;    /* host arrays (n_layers) of device (res_blocks, block_size, res_rank) bf16 */
    float *partials;              /* device: ResidualAttention's split partial states */
    int partial_rows;             /* (tile, query, split) rows the partials hold per query head */
    CudaLoraMeta meta;
    int32_t *meta_host, *meta_dev; /* pinned host / device (meta.total) */
    CudaLoraStep step;
    size_t adapter_bytes;  /* device memory the adapters and their tables take */
    size_t residual_bytes; /* device memory the residual pool takes */
} CudaLora;

typedef struct {
    const LoraSet *set;   /* NULL or empty: no adapters (then residual_blocks must be 0) */
    const ModelConfig *model;
    int max_batch_tokens, max_seqs, block_size;
    int table_stride;     /* the backend's block-table row length */
    int residual_blocks;  /* ForkKV pool blocks incl. the null block; 0 = separate mode only */
    int residual_rank;    /* pool width: >= every adapter's rank, <= CUDA_LORA_MAX_RANK */
    int n_sms;            /* the device's, for ResidualAttention's split count */
} CudaLoraConfig;

/* Uploads the set's A/B matrices and creates the residual pool. Refuses adapters of rank above
 * CUDA_LORA_MAX_RANK and a residual pool narrower than the widest adapter. On failure everything
 * made so far is freed (cuda_lora_destroy is then a no-op). */
int cuda_lora_create(CudaLora *cl, const CudaLoraConfig *cfg, BraidError *err);
void cuda_lora_destroy(CudaLora *cl);

/* True when the batch needs any adapter work: some sequence names an adapter id other than 0, or
 * has a residual table. A batch that is false runs the base model exactly. */
bool cuda_lora_batch_adapted(const ForwardBatch *fb);

/* True when sequence s of fb attends by ResidualAttention (its res_block_tables entry is set). */
bool cuda_lora_seq_forked(const ForwardBatch *fb, int s);

/* Validates fb's adapter ids (against the loaded set), residual tables (against the pool) and
 * residual slots, then packs the step's metadata and enqueues its upload on stream. */
int cuda_lora_prepare(CudaLora *cl, const ForwardBatch *fb, cudaStream_t stream, BraidError *err);

/* Layer `layer`, after the fused QKV GEMM: qkv (n, q_dim + 2 kv_dim) fp32 += the Q, K, V deltas
 * of x (n, dim) bf16 (the attention input), and the residual store of the ForkKV tokens. */
int cuda_lora_project(CudaLora *cl, int layer, const uint16_t *x, float *qkv, cudaStream_t stream, BraidError *err);

/* Layer `layer`, after the ordinary attention: ResidualAttention of the ForkKV sequences, reading
 * the queries, base cache and sequence description of `base` (whose block tables are the base
 * ones) and writing their rows of base->out. rope is the forward's RoPE. */
int cuda_lora_attend(CudaLora *cl, int layer, const CudaAttention *base, const CudaRopeShape *rope, cudaStream_t stream,
                     BraidError *err);

/* Layer `layer`, after the O GEMM: x (n, dim) fp32 += the O deltas of att (n, q_dim) bf16. */
int cuda_lora_add_output(CudaLora *cl, int layer, const uint16_t *att, float *x, cudaStream_t stream, BraidError *err);

#endif
