/*
 * grammar_mask.cu — structured outputs on the device: a grammar's allowed-token bitmask applied
 * to logit rows before the greedy argmax (grammar/grammar.h makes the masks on the host; the
 * backend uploads them, cuda_apply_token_mask sets every disallowed logit to -inf, cuda_argmax
 * runs again). One thread per vocabulary entry of a row, grid (parts of the vocabulary, masks).
 */
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace {

__global__ void apply_token_mask_kernel(float *logits, int vocab, const uint32_t *mask, int words, const int32_t *rows) {
    float *row = logits + (size_t)rows[blockIdx.y] * vocab;
    const uint32_t *m = mask + (size_t)blockIdx.y * words;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vocab; v += gridDim.x * blockDim.x)
        if (!((m[v >> 5] >> (v & 31)) & 1u)) row[v] = -INFINITY;
}

}  // namespace

extern "C" cudaError_t cuda_apply_token_mask(float *logits, int vocab, const uint32_t *mask, int words, const int32_t *rows,
                                             int n_masks, cudaStream_t stream) {
    if (n_masks <= 0 || vocab <= 0) return cudaSuccess;
    int parts = (vocab + 255) / 256;
    if (parts > 64) parts = 64;
    apply_token_mask_kernel<<<dim3(parts, n_masks), 256, 0, stream>>>(logits, vocab, mask, words, rows);
    return cudaGetLastError();
}
