/*
 * model_config.h — hyperparameters of a llama-family model, read from GGUF metadata.
 *
 * Contract: model_config_from_gguf() validates everything the forward pass relies on (head counts
 * divide, GQA ratio integral, RoPE dimension even) and fails with a message naming the key.
 * Plain value type; no ownership.
 */
#ifndef BRAID_MODEL_MODEL_CONFIG_H
#define BRAID_MODEL_MODEL_CONFIG_H

#include "common/error.h"
#include "model/gguf.h"

/* How RoPE pairs the dimensions of a head. GGUF files of the llama architecture store Q/K rows
 * permuted for the interleaved pairing (2i, 2i+1); HF checkpoints use half-split (i, i + d/2). */
typedef enum { ROPE_PAIRING_INTERLEAVED = 0, ROPE_PAIRING_HALF_SPLIT = 1 } RopePairing;

typedef struct {
    char arch[32];
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
} ModelConfig;

int model_config_from_gguf(const GgufFile *file, ModelConfig *cfg, BraidError *err);
const char *rope_pairing_name(RopePairing pairing);

#endif
