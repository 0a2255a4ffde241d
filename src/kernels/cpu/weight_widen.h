/*
 * weight_widen.h — lossless re-encoding of weight types that have no fast CPU kernels into one
 * that has them (CPU).
 *
 * Q5_0 → Q8_0: a Q5_0 element is d·(q − 16) with q in [0, 32) and an fp16 d per 32 elements; the
 * Q8_0 block with the same d and int8 values q − 16 holds exactly the same numbers. Widened, a
 * Q5_0 matrix (most of a Qwen2.5 Q4_K_M file, whose 896-wide rows do not fit K-quant superblocks)
 * takes the AVX2 fp32 dot and the int8 kernels instead of a per-token scalar dequantization, for
 * 34/22 of its bytes. Results are those of the Q5_0 weights (the values are equal; only the
 * summation order of the faster kernels differs, as it does between any two types).
 * Owns nothing: weight_widen_model's buffers belong to the ModelWeights it fills.
 * Thread-safety: pure functions of their inputs.
 */
#ifndef BRAID_KERNELS_CPU_WEIGHT_WIDEN_H
#define BRAID_KERNELS_CPU_WEIGHT_WIDEN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "model/model_weights.h"

/* Whether w is re-encoded by weight_widen_matrix (a Q5_0 matrix in GGUF layout). */
bool weight_widen_applies(const WeightMatrix *w);

/* w as Q8_0 in a new malloc'd buffer (*buffer, the caller frees it); *out views it. -1 with err
 * when w does not apply or memory runs out. */
int weight_widen_matrix(const WeightMatrix *w, WeightMatrix *out, uint8_t **buffer, BraidError *err);

/* dst = a copy of src whose layer matrices and output head that apply are widened into buffers
 * dst owns; the rest stay views of src's storage, so src must outlive dst (free dst with
 * model_weights_free). When no matrix applies, dst is left zeroed (dst->layers == NULL) and 0 is
 * returned: use src itself. -1 with err naming the matrix on failure. */
int weight_widen_model(const ModelWeights *src, ModelWeights *dst, BraidError *err);

#endif
