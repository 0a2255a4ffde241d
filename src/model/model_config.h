/*
 * model_config.h — hyperparameters of a llama-family model, read from GGUF metadata.
 *
 * Architectures (general.architecture; every other key is read as "<arch>.<key>"):
 *   llama  Llama 1/2/3.x, SmolLM, Mistral 7B; Q/K rows stored permuted for interleaved RoPE
 *   qwen2  Qwen2 / Qwen2.5: the llama block plus a bias on the Q, K and V projections; NEOX RoPE
 *          (half-split pairing)
 *   qwen3  Qwen3 (dense): no bias, RMSNorm over head_dim of each Q and K head (weights
 *          attn_q_norm / attn_k_norm) after the projections and before RoPE; head_dim from
 *          attention.key_length (may differ from embedding_length / head_count); NEOX RoPE
 * Any other architecture is refused with its name.
 * Sliding-window attention (<arch>.attention.sliding_window, e.g. Mistral 7B v0.1's 4096) is
 * honoured by capping context_length at the window: within it, windowed attention is full attention.
 *
 * Contract: model_config_from_gguf() validates everything the forward pass relies on (head counts
 * divide, GQA ratio integral, RoPE dimension even) and fails with a message naming the key.
 * Plain value type; no ownership.
 */
#ifndef BRAID_MODEL_MODEL_CONFIG_H
#define BRAID_MODEL_MODEL_CONFIG_H

#include <stdbool.h>

#include "common/error.h"
#include "model/gguf.h"

/* How RoPE pairs the dimensions of a head. GGUF files of the llama architecture store Q/K rows
 * permuted for the interleaved pairing (2i, 2i+1); HF checkpoints use half-split (i, i + d/2). */
typedef enum { ROPE_PAIRING_INTERLEAVED = 0, ROPE_PAIRING_HALF_SPLIT = 1 } RopePairing;

typedef enum { MODEL_ARCH_LLAMA = 0, MODEL_ARCH_QWEN2 = 1, MODEL_ARCH_QWEN3 = 2 } ModelArch;

typedef struct {
    char arch[32];
    ModelArch arch_kind;
    char name[128];
    int n_layers;
    int dim;          /* embedding width */
    int ff_dim;       /* SwiGLU hidden width */
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab_size;
    int context_length;
    int rope_dim;     /* rotated dimensions per head (<= head_dim) */
    float rope_base;
    float rope_position_scale; /* linear scaling: positions are multiplied by this (1 = none) */
    RopePairing rope_pairing;
    float norm_eps;
    bool qkv_bias;      /* attn_q/k/v.bias added after the projections (qwen2; a llama file that has them) */
    bool qk_norm;       /* per-head RMSNorm of Q and K before RoPE (qwen3) */
    int sliding_window; /* the file's attention window (0: none); context_length is capped at it */
} ModelConfig;

int model_config_from_gguf(const GgufFile *file, ModelConfig *cfg, BraidError *err);
const char *rope_pairing_name(RopePairing pairing);
/* The architectures model_config_from_gguf accepts, for messages: "llama, qwen2, qwen3". */
const char *model_arch_supported_list(void);

#endif
