/*
 * synthetic_lora.h — random LoRA adapters shaped for a base model, without an adapter file.
 *
 * `--lora NAME=synthetic:RANK[:SEED]` (and any other place that loads an adapter by path) gives an
 * adapter of rank RANK on Q, K, V and O of every layer, with deterministic pseudo-random fp32
 * pairs: A uniform in ±sqrt(3 / in) (unit-variance x · Aᵀ), B uniform in ±0.02 · sqrt(3 / rank),
 * alpha = RANK (scale 1), so the delta is a few percent of a unit-variance projection. SEED
 * (default: a hash of NAME) picks the values. The point is the synthetic models of issue 34
 * (synthetic:llama3-8b has no real adapters): ForkKV's memory, bandwidth and kernels see an
 * adapter of the right shape; the outputs are meaningless by construction.
 * Thread-safety: pure functions.
 */
#ifndef BRAID_MODEL_SYNTHETIC_LORA_H
#define BRAID_MODEL_SYNTHETIC_LORA_H

#include <stdbool.h>

#include "common/error.h"
#include "model/lora_adapter.h"
#include "model/model_config.h"

/* True when an adapter path names a synthetic adapter ("synthetic:..."). */
bool synthetic_lora_spec(const char *path);

/* Builds the adapter `name` for base from spec "synthetic:RANK[:SEED]"; 1 <= RANK <= LORA_MAX_RANK.
 * On failure out is left empty and err names the spec. */
int synthetic_lora_create(const char *spec, const char *name, const ModelConfig *base, LoraAdapter *out, BraidError *err);

#endif
