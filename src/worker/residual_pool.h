/*
 * residual_pool.h — the worker's memory for ForkKV residuals (--lora-cache shared; CPU backend;
 * the CUDA backend keeps its own bf16 pool of the same layout, worker/cuda_lora.h).
 *
 * Owns: per layer, K_res and V_res arrays (n_blocks, block_size, rank) of IEEE halves: x·A_k and
 * x·A_v of the adapted sequences (no RoPE), `rank` wide (the widest loaded adapter's; narrower
 * adapters leave their upper lanes zero). Block ids are the residual tree's (cache/residual_cache.h),
 * independent of the base pool's; block 0 is the null block. A residual block takes
 * n_layers·block_size·2·rank halves against the base block's n_layers·block_size·2·kv_dim: the
 * kv_dim / rank memory ratio of ForkKV (12 for SmolLM2-135M at rank 16).
 * Thread-safety: the forward writes the slots of the sequences in its batch; no locking.
 */
#ifndef BRAID_WORKER_RESIDUAL_POOL_H
#define BRAID_WORKER_RESIDUAL_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/cpu/residual_attention.h"
#include "model/model_config.h"

typedef struct {
    int n_layers, n_blocks, block_size, rank;
    uint16_t **k, **v; /* per layer (n_blocks, block_size, rank) */
    size_t bytes;
} ResidualPool;

int residual_pool_create(ResidualPool *pool, const ModelConfig *cfg, int n_blocks, int block_size, int rank, BraidError *err);
void residual_pool_destroy(ResidualPool *pool);
ResidualLayerView residual_pool_layer(const ResidualPool *pool, int layer);
/* Bytes one residual block takes across all layers (K + V). */
size_t residual_pool_block_bytes(const ModelConfig *cfg, int block_size, int rank);

#endif
