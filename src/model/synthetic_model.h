/*
 * synthetic_model.h — model shapes without a file, for benchmarks of large models that cannot be
 * downloaded here (`--model synthetic:llama3-8b`).
 *
 * synthetic_model_create() fills a ModelWeights whose config is a known architecture's and whose
 * matrices have shapes but no data (data == NULL, type BF16): a device backend that supports it
 * (CUDA) generates seeded random bf16 values in place. Nothing here reads or writes tensors.
 * Owns: the layer table (free with synthetic_model_free).
 */
#ifndef BRAID_MODEL_SYNTHETIC_MODEL_H
#define BRAID_MODEL_SYNTHETIC_MODEL_H

#include <stdbool.h>

#include "common/error.h"
#include "model/model_weights.h"

/* True when spec names a synthetic model ("synthetic:NAME"). */
bool synthetic_model_spec(const char *spec);
/* NAME is llama3-8b or smollm2-135m; fails with the list of known names otherwise. */
int synthetic_model_create(const char *spec, ModelWeights *weights, BraidError *err);
void synthetic_model_free(ModelWeights *weights);

#endif
