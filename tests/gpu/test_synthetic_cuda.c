/*
 * Synthetic models on the CUDA backend against the CPU backend. Skips (exit 77) without a GPU.
 * - synthetic:smollm2-135m: the GPU generates its weights (kernels/cuda/memory_ops.cu) and the CPU
 *   generates them on the host (synthetic_model_materialize); the two must be the same bits, so the
 *   logits of a real-text prompt agree to bf16 arithmetic's tolerance (relative L2 error, and the
 *   argmax at most positions). Different weights would give unrelated logits (relative error ~1.4).
 * - synthetic:llama3-1b runs on the GPU (prefill + decode), logits finite (skipped with BRAID_TEST_QUICK).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

#define REL_L2_TOLERANCE 5e-2

static void load(const char *name, BraidModel *m) {
    char spec[4200];
    BraidError err;
    snprintf(spec, sizeof spec, "synthetic:%s:%s", name, test_model_path());
    if (braid_model_load(spec, m, &err)) fail_msg("%s", err.msg);
}

static int32_t *prompt(const BraidModel *m, int *n) {
    const char *text = "Synthetic weights, real tokens: the CUDA backend and the CPU backend must compute the same model "
                       "from the same seeds, position after position, through every layer of the network.";
    TokenList ids = {0};
    BraidError err;
    if (tokenizer_encode(&m->tokenizer, text, strlen(text), false, m->tokenizer.add_bos, &ids, &err)) fail_msg("%s", err.msg);
    *n = ids.n;
    return ids.ids;
}

static float *all_logits(const BraidModel *m, BackendKind kind, const int32_t *ids, int n) {
    SequenceRunner r;
    BraidError err;
    if (sequence_runner_init_math(&r, &m->weights, n + 1, kind, CPU_MATMUL_FP32, &err)) fail_msg("%s", err.msg);
    float *logits = malloc((size_t)n * m->weights.cfg.vocab_size * sizeof *logits);
    assert_non_null(logits);
    if (sequence_runner_eval(&r, ids, n, true, logits, &err)) fail_msg("%s", err.msg);
    sequence_runner_free(&r);
    return logits;
}

static void test_smollm2_cuda_matches_cpu(void **state) {
    (void)state;
    BraidModel m;
    load("smollm2-135m", &m);
    int n;
    int32_t *ids = prompt(&m, &n);
    size_t vocab = (size_t)m.weights.cfg.vocab_size;
    float *cpu = all_logits(&m, BACKEND_CPU, ids, n), *gpu = all_logits(&m, BACKEND_CUDA, ids, n);
    double sq_diff = 0, sq_ref = 0;
    int agree = 0;
    for (int t = 0; t < n; t++) {
        const float *a = cpu + t * vocab, *b = gpu + t * vocab;
        for (size_t v = 0; v < vocab; v++) {
            assert_false(isnan(b[v]));
            sq_diff += ((double)a[v] - b[v]) * ((double)a[v] - b[v]);
            sq_ref += (double)a[v] * a[v];
        }
        agree += sampler_argmax(a, (int)vocab) == sampler_argmax(b, (int)vocab);
    }
    double rel = sqrt(sq_diff / sq_ref);
    fprintf(stderr, "synthetic smollm2-135m, cuda vs cpu: %d positions, relative L2 error %.3e, argmax agrees at %d/%d\n", n, rel,
            agree, n);
    assert_true(rel <= REL_L2_TOLERANCE);
    assert_true(agree * 10 >= n * 8);
    free(cpu);
    free(gpu);
    free(ids);
    braid_model_free(&m);
}

static void test_llama3_1b_runs(void **state) {
    (void)state;
    BraidModel m;
    load("llama3-1b", &m);
    int n;
    int32_t *ids = prompt(&m, &n);
    SequenceRunner r;
    BraidError err;
    int vocab = m.weights.cfg.vocab_size;
    if (sequence_runner_init(&r, &m.weights, n + 16, BACKEND_CUDA, &err)) fail_msg("%s", err.msg);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    assert_non_null(logits);
    if (sequence_runner_eval(&r, ids, n, false, logits, &err)) fail_msg("%s", err.msg);
    for (int s = 0; s < 8; s++) {
        int32_t next = sampler_argmax(logits, vocab);
        assert_true(next >= 0 && next < vocab);
        if (sequence_runner_eval(&r, &next, 1, false, logits, &err)) fail_msg("%s", err.msg);
    }
    for (int v = 0; v < vocab; v++) assert_false(isnan(logits[v]) || isinf(logits[v]));
    sequence_runner_free(&r);
    free(logits);
    free(ids);
    braid_model_free(&m);
}

int main(void) {
    if (!backend_cuda_available()) {
        fprintf(stderr, "no CUDA backend or GPU here: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_cuda_matches_cpu),
        cmocka_unit_test(test_llama3_1b_runs),
    };
    /* BRAID_TEST_QUICK: the first test only (compute-sanitizer runs it; the 1B run is slow under it). */
    size_t n = getenv("BRAID_TEST_QUICK") ? 1 : sizeof tests / sizeof tests[0];
    return _cmocka_run_group_tests("test_synthetic_cuda", tests, n, NULL, NULL);
}
