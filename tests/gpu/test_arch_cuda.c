/*
 * qwen2 / qwen3 on the CUDA backend against transformers' reference logits (tests/golden/arch):
 * the Q/K/V bias and per-head Q/K norm kernel (cuda_qkv_bias_norm), NEOX RoPE, head_dim from
 * key_length, Q5_K / Q5_0 / Q8_0 converted to bf16. Variants whose attention shape the CUDA kernels
 * do not take (qwen2-tiny-f32's head_dim 16) are reported and left out. With the optional real
 * model present (scripts/fetch-model.sh qwen: GQA group 7), its reference prompts too
 * (tests/golden/qwen). Skips (exit 77) without a GPU.
 * Bounds: bf16 weights and KV, as test_cuda_backend's; the argmax must match the reference
 * wherever its top-2 margin is clear of that noise.
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
#include <unistd.h>

#include "golden_io.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

#define MAX_TOLERANCE 1.0
#define MEAN_TOLERANCE 0.1
#define CLEAR_MARGIN 1.0

/* Returns 1 when checked, 0 when the CUDA backend refuses the model's shape. */
static int check_model(const char *model_path, const char *golden_path, const char *label) {
    BraidModel m;
    BraidError err;
    if (braid_model_load(model_path, &m, &err)) fail_msg("%s: %s", label, err.msg);
    json_t *prompts = golden_read_jsonl(golden_path);
    assert_non_null(prompts);
    int vocab = m.weights.cfg.vocab_size, checked = 1;
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *p = json_array_get(prompts, i);
        int n;
        int32_t *ids = golden_int_array(json_object_get(p, "ids"), &n);
        SequenceRunner r;
        if (sequence_runner_init(&r, &m.weights, n + 1, BACKEND_CUDA, &err)) {
            if (!strstr(err.msg, "unsupported attention shape")) fail_msg("%s: %s", label, err.msg);
            fprintf(stderr, "arch cuda %s: left out (%s)\n", label, err.msg);
            free(ids);
            checked = 0;
            break;
        }
        float *logits = malloc((size_t)n * vocab * sizeof *logits);
        assert_non_null(logits);
        if (sequence_runner_eval(&r, ids, n, true, logits, &err)) fail_msg("%s: %s", label, err.msg);
        double mean, max_diff = golden_compare_top_logits(p, logits, n, vocab, &mean);
        json_t *top_ids = json_object_get(p, "top_ids"), *top_logits = json_object_get(p, "top_logits");
        int agree = 0, clear_miss = 0;
        for (int pos = 0; pos < n; pos++) {
            json_t *vals = json_array_get(top_logits, (size_t)pos);
            double gap = json_number_value(json_array_get(vals, 0)) - json_number_value(json_array_get(vals, 1));
            int ok = sampler_argmax(logits + (size_t)pos * vocab, vocab) ==
                     (int)json_integer_value(json_array_get(json_array_get(top_ids, (size_t)pos), 0));
            agree += ok;
            clear_miss += !ok && gap >= CLEAR_MARGIN;
        }
        fprintf(stderr, "arch cuda %s %s: %d tokens, max |diff| %.3f, mean %.4f, top-1 %d/%d\n", label,
                json_string_value(json_object_get(p, "name")), n, max_diff, mean, agree, n);
        assert_true(max_diff <= MAX_TOLERANCE);
        assert_true(mean <= MEAN_TOLERANCE);
        assert_int_equal(clear_miss, 0);
        sequence_runner_free(&r);
        free(logits);
        free(ids);
    }
    json_decref(prompts);
    braid_model_free(&m);
    return checked;
}

static void test_tiny_models(void **state) {
    (void)state;
    static const char *const variants[] = {"qwen2-tiny-f32", "qwen3-tiny-f16", "qwen3-tiny-q8_0", "qwen2-tiny-q5_k"};
    int checked = 0;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char model[256], golden[256], model_path[4096];
        snprintf(model, sizeof model, "arch/%s.gguf", variants[i]);
        snprintf(golden, sizeof golden, "arch/%s.jsonl", variants[i]);
        snprintf(model_path, sizeof model_path, "%s", test_golden_path(model));
        checked += check_model(model_path, test_golden_path(golden), variants[i]);
    }
    assert_true(checked >= 3); /* both qwen3 variants and the Q5_K qwen2 */
}

static void test_real_qwen(void **state) {
    (void)state;
    const char *env = getenv("BRAID_QWEN_MODEL");
    char path[4096];
    snprintf(path, sizeof path, "%s", env && *env ? env : test_golden_path("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"));
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "arch cuda: %s absent, real-model check left out (scripts/fetch-model.sh qwen)\n", path);
        return;
    }
    assert_int_equal(check_model(path, test_golden_path("qwen/logits.jsonl"), "qwen2.5-coder-0.5b"), 1);
}

int main(void) {
    if (!backend_cuda_available()) {
        fprintf(stderr, "test_arch_cuda: skipped, no CUDA GPU (or a build without CUDA)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiny_models), cmocka_unit_test(test_real_qwen)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
