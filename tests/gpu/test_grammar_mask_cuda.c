/*
 * test_grammar_mask_cuda.c — the grammar mask kernel (grammar_mask.cu) against the CPU path:
 * random logit rows and random allowed-token masks (dense, sparse, a single token), some rows left
 * unmasked; after cuda_apply_token_mask and cuda_argmax, every masked row's id equals
 * sampler_argmax_masked on the host, every unmasked row's equals sampler_argmax, and every
 * disallowed logit of a masked row is -inf while allowed ones are untouched. Skips (exit 77)
 * when no GPU is visible.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_kernels.h"
#include "worker/sampler.h"

#define CUDA_OK(call)                                                                                                \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        if (e_ != cudaSuccess) fail_msg("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_mask_kernel(void **state) {
    (void)state;
    const int vocab = 49152 + 7, rows = 12, words = (vocab + 31) / 32;
    float *logits = malloc((size_t)rows * vocab * sizeof *logits), *back = malloc((size_t)rows * vocab * sizeof *back);
    uint32_t *masks = calloc((size_t)rows * words, sizeof *masks);
    int32_t mask_rows[12], n_masks = 0, ids[12];
    for (size_t i = 0; i < (size_t)rows * vocab; i++) logits[i] = (float)((int64_t)(next_u64() % 2000001) - 1000000) / 1000.0f;
    for (int r = 0; r < rows; r++) {
        if (r % 4 == 3) continue; /* unmasked row */
        uint32_t *m = masks + (size_t)n_masks * words;
        int kind = r % 4;
        for (int t = 0; t < vocab; t++) {
            bool allow = kind == 0 ? next_u64() % 2 : kind == 1 ? next_u64() % 1000 == 0 : t == (r * 977) % vocab;
            if (allow) m[t >> 5] |= 1u << (t & 31);
        }
        mask_rows[n_masks++] = r;
    }
    float *d_logits;
    uint32_t *d_masks;
    int32_t *d_rows, *d_ids;
    void *scratch;
    CUDA_OK(cudaMalloc((void **)&d_logits, (size_t)rows * vocab * sizeof *d_logits));
    CUDA_OK(cudaMalloc((void **)&d_masks, (size_t)n_masks * words * sizeof *d_masks));
    CUDA_OK(cudaMalloc((void **)&d_rows, sizeof mask_rows));
    CUDA_OK(cudaMalloc((void **)&d_ids, sizeof ids));
    CUDA_OK(cudaMalloc(&scratch, (size_t)rows * CUDA_ARGMAX_PARTS * 8));
    CUDA_OK(cudaMemcpy(d_logits, logits, (size_t)rows * vocab * sizeof *logits, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_masks, masks, (size_t)n_masks * words * sizeof *masks, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_rows, mask_rows, sizeof mask_rows, cudaMemcpyHostToDevice));
    CUDA_OK(cuda_apply_token_mask(d_logits, vocab, d_masks, words, d_rows, n_masks, 0));
    CUDA_OK(cuda_argmax(d_logits, rows, vocab, scratch, d_ids, 0));
    CUDA_OK(cudaMemcpy(ids, d_ids, sizeof ids, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(back, d_logits, (size_t)rows * vocab * sizeof *back, cudaMemcpyDeviceToHost));
    for (int r = 0, k = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * vocab, *got = back + (size_t)r * vocab;
        if (k < n_masks && mask_rows[k] == r) {
            const uint32_t *m = masks + (size_t)k * words;
            assert_int_equal(ids[r], sampler_argmax_masked(row, vocab, m));
            for (int t = 0; t < vocab; t++) {
                if (sampler_mask_allows(m, t)) assert_true(got[t] == row[t]);
                else assert_true(isinf(got[t]) && got[t] < 0);
            }
            k++;
        } else {
            assert_int_equal(ids[r], sampler_argmax(row, vocab));
            assert_memory_equal(got, row, (size_t)vocab * sizeof *row);
        }
    }
    cudaFree(d_logits);
    cudaFree(d_masks);
    cudaFree(d_rows);
    cudaFree(d_ids);
    cudaFree(scratch);
    free(logits);
    free(back);
    free(masks);
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "no GPU visible: skipping the grammar mask kernel test\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mask_kernel)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
