/*
 * weight_shard.h — one tensor-parallel rank's slice of a llama model's weights.
 *
 * Megatron-style split over T ranks: Q/K/V and gate/up are column-parallel (each rank keeps a
 * contiguous range of output rows: whole KV-head groups for attention, a block-aligned range of
 * the SwiGLU width for the MLP); O and down are row-parallel (each rank keeps the matching input
 * columns), so each rank's O and down outputs are partial sums that one all-reduce completes.
 * Embeddings, norms and the output head stay whole on every rank.
 * Heads are split as evenly as whole KV heads allow (SmolLM2's 3 KV heads over 2 ranks give 2 + 1),
 * so any T up to the number of KV heads works.
 * Row slices point into the source weights; column slices are repacked into buffers the shard
 * owns. The source ModelWeights (and its GGUF mapping) must outlive the shard; free the shard with
 * model_weights_free. The shard's cfg holds the local head counts and SwiGLU width.
 * Thread-safety: pure functions of their inputs.
 */
#ifndef BRAID_MODEL_WEIGHT_SHARD_H
#define BRAID_MODEL_WEIGHT_SHARD_H

#include "common/error.h"
#include "model/model_weights.h"

/* The half-open ranges rank `tp_rank` of `tp_size` owns. */
typedef struct {
    int kv_head_lo, kv_head_hi; /* KV heads */
    int head_lo, head_hi;       /* query heads (the KV heads' groups) */
    int ff_lo, ff_hi;           /* SwiGLU hidden units */
} TpShardRange;

/* Fails when the model cannot be split that way (more ranks than KV heads, a quantization block
 * that straddles a boundary). */
int tp_shard_range(const ModelConfig *cfg, uint32_t ff_type, int tp_rank, int tp_size, TpShardRange *out, BraidError *err);
int model_weights_shard(const ModelWeights *full, int tp_rank, int tp_size, ModelWeights *shard, BraidError *err);

#endif
