/*
 * synthetic_model.h — model shapes without a weights file, for measuring large models that cannot
 * be downloaded or carried (`--model synthetic:llama3-8b`, vLLM's `--load-format dummy` idea).
 *
 * synthetic_model_create() fills a ModelWeights whose config is a known architecture's and whose
 * matrices are synthetic (model_weights.h: data NULL, synth_seed set): element (r, c) of a matrix
 * is a deterministic pseudo-random bf16 value, uniform in [-scale, scale) with scale sqrt(3 / cols)
 * (the variance of a 1/sqrt(fan-in) initialization), a pure function of the matrix's seed and the
 * element's index. Norm weights are ones. Nothing is generated here: the CUDA backend generates
 * the values on the GPU, the CPU backend on the host (synthetic_model_materialize), and both get
 * the same bits, so the two backends (and any tensor-parallel split) compute the same model.
 *
 * A spec is "synthetic:NAME" or "synthetic:NAME:TOKENIZER.gguf"; braid_model_load (model.h) takes
 * it like a path, loading the tokenizer and chat template of TOKENIZER.gguf (default: $BRAID_MODEL
 * when it names a file, else SYNTHETIC_TOKENIZER_DEFAULT, the CLI's default model, relative to the
 * working directory like it) and sizing the vocabulary to that
 * tokenizer, so the prompts and outputs are real text.
 * Owns: the layer table and the ones vector (model_weights_free releases them).
 * Thread-safety: pure functions of their inputs.
 */
#ifndef BRAID_MODEL_SYNTHETIC_MODEL_H
#define BRAID_MODEL_SYNTHETIC_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "model/model_weights.h"

#define SYNTHETIC_TOKENIZER_DEFAULT "models/SmolLM2-135M-Instruct.Q4_1.gguf"
/* The names synthetic_model_create knows, for messages. */
#define SYNTHETIC_MODEL_NAMES "llama3-8b, llama3-1b, smollm2-135m"

/* True when spec names a synthetic model ("synthetic:NAME[:TOKENIZER]"). */
bool synthetic_model_spec(const char *spec);
/* The tokenizer GGUF a spec names, else $BRAID_MODEL (a file), else SYNTHETIC_TOKENIZER_DEFAULT;
 * written into out (cap bytes). */
int synthetic_model_tokenizer_path(const char *spec, char *out, size_t cap, BraidError *err);
/* NAME (with or without the "synthetic:" prefix and tokenizer suffix) must be a known shape; fails
 * with the list otherwise. vocab_size > 0 replaces the shape's vocabulary (to match a tokenizer);
 * 0 keeps it. */
int synthetic_model_create(const char *spec, int vocab_size, ModelWeights *weights, BraidError *err);
void synthetic_model_free(ModelWeights *weights);

/* True when any matrix of w is synthetic (has no data). */
bool synthetic_model_has_unmaterialized(const ModelWeights *w);
/* A copy of src whose synthetic matrices have host bf16 data (owned by dst; free it with
 * model_weights_free); the real matrices and vectors stay borrowed from src. Refuses, naming the
 * size, when the bf16 matrices would take more than 3/4 of physical memory. */
int synthetic_model_materialize(const ModelWeights *src, ModelWeights *dst, BraidError *err);
/* One synthetic element as bf16 bits: the same function the CUDA kernel computes. */
uint16_t synthetic_weight_bf16(uint64_t seed, uint64_t index, float scale);
/* Rows [0, m->rows) of a synthetic matrix as bf16, row-major (m->rows * m->cols values). */
void synthetic_matrix_fill_bf16(const WeightMatrix *m, uint16_t *out);

#endif
