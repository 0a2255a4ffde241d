/*
 * weight_convert.h — turns GGUF weight matrices into bf16 for a device backend, optionally one
 * tensor-parallel shard of them.
 *
 * A shard is a rectangle of the (rows = output features, cols = inputs) matrix: column-parallel
 * layers (Q/K/V, gate/up) take a range of rows, row-parallel layers (O, down) a range of columns.
 * Values are dequantized to fp32 exactly as the CPU kernels see them, then rounded to nearest
 * even bf16 (NaN stays NaN). Pure functions, thread-safe.
 */
#ifndef BRAID_MODEL_WEIGHT_CONVERT_H
#define BRAID_MODEL_WEIGHT_CONVERT_H

#include <stdint.h>

#include "common/error.h"
#include "model/model_weights.h"

/* Rows [row0, row0 + n_rows) and columns [col0, col0 + n_cols) of m, as bf16, row-major with
 * n_cols per row, into out. Fails when the rectangle leaves the matrix or memory runs out. */
int weight_to_bf16(const WeightMatrix *m, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols, uint16_t *out,
                   BraidError *err);

#endif
