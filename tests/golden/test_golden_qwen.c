/*
 * The optional second real model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF: Q5_0, Q8_0, Q4_K and
 * Q6_K matrices, arch qwen2, tokenizer.ggml.pre = qwen2), against HF transformers loading the same
 * file (tests/golden/qwen, tools/golden/make_qwen_golden.py): the tokenizer on the corpus of the
 * default model's golden files, and per CPU arithmetic the top-20 logits at every prompt position
 * and the greedy continuation (teacher-forced; held where the reference's top-2 margin is clear).
 * Skipped (exit 77) when the model is absent: scripts/fetch-model.sh qwen fetches it
 * ($BRAID_QWEN_MODEL overrides the path).
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
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

typedef struct {
    const char *name;
    CpuMatmulMath math;
    double max_diff, mean_diff, clear_margin, min_top1;
} Bounds;

/* fp32: the fp16 KV cache's share, as for the default model (test_golden_logits.c): measured
 * (2026-11-27) worst 1.8e-2, mean 2.7e-3, prompt top-1 200/200, greedy 79/80 (one near-tie, agreeing).
 * int8: the activations of the Q8_0 (and widened Q5_0) matrices rounded to 8 bits: measured worst
 * 0.35, mean 4.5e-2, top-1 197/200, no clear-margin greedy miss. Bounds about 2-3x those. */
static const Bounds FP32 = {"fp32", CPU_MATMUL_FP32, 5e-2, 1e-2, 0.02, 0.98};
static const Bounds INT8 = {"int8", CPU_MATMUL_INT8, 1.0, 0.12, 0.5, 0.95};

static BraidModel model;

static const char *qwen_path(void) {
    const char *env = getenv("BRAID_QWEN_MODEL");
    return env && *env ? env : test_golden_path("../../models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
}

static void test_tokenizer(void **state) {
    (void)state;
    json_t *lines = golden_read_jsonl(test_golden_path("qwen/tokenize.jsonl"));
    assert_non_null(lines);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(lines); i++) {
        json_t *l = json_array_get(lines, i);
        const char *text = json_string_value(json_object_get(l, "text"));
        int n;
        int32_t *ids = golden_int_array(json_object_get(l, "ids"), &n);
        TokenList ours = {0};
        assert_int_equal(golden_encode(&model, text, true, &ours), 0);
        if (ours.n != n || (n && memcmp(ours.ids, ids, (size_t)n * sizeof *ids) != 0)) {
            fprintf(stderr, "  qwen tokenizer differs from HF for \"%s\" (%d vs %d ids)\n", text, ours.n, n);
            bad++;
        }
        free(ours.ids);
        free(ids);
    }
    fprintf(stderr, "qwen tokenizer: %zu strings, %d differ from HF\n", json_array_size(lines), bad);
    assert_int_equal(bad, 0);
    json_decref(lines);
}

static void check(const Bounds *b) {
    json_t *prompts = golden_read_jsonl(test_golden_path("qwen/logits.jsonl"));
    assert_non_null(prompts);
    int vocab = model.weights.cfg.vocab_size, top1 = 0, positions = 0;
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *p = json_array_get(prompts, i);
        const char *name = json_string_value(json_object_get(p, "name"));
        int n, n_greedy;
        int32_t *ids = golden_int_array(json_object_get(p, "ids"), &n);
        int32_t *greedy = golden_int_array(json_object_get(p, "greedy"), &n_greedy);
        BraidError err;
        SequenceRunner runner;
        assert_int_equal(sequence_runner_init_math(&runner, &model.weights, n + n_greedy + 1, BACKEND_CPU, b->math, &err), 0);
        float *logits = malloc((size_t)n * vocab * sizeof *logits), *scratch = malloc((size_t)vocab * sizeof *scratch);
        assert_true(logits && scratch);
        assert_int_equal(sequence_runner_eval(&runner, ids, n, true, logits, &err), 0);
        double mean, max_diff = golden_compare_top_logits(p, logits, n, vocab, &mean);
        json_t *top_ids = json_object_get(p, "top_ids");
        for (int pos = 0; pos < n; pos++)
            top1 += sampler_argmax(logits + (size_t)pos * vocab, vocab) ==
                    (int)json_integer_value(json_array_get(json_array_get(top_ids, (size_t)pos), 0));
        positions += n;
        char label[96];
        snprintf(label, sizeof label, "qwen %s %s", b->name, name);
        int ties = 0, ties_agree = 0;
        int mismatches = golden_greedy_mismatches(&runner, p, logits + (size_t)(n - 1) * vocab, scratch, vocab, b->clear_margin,
                                                  label, &ties, &ties_agree);
        fprintf(stderr, "golden %-22s %4d tokens, max |diff| %.2e, mean %.2e; greedy %d/%d match, %d near-ties (%d agree)\n", label,
                n, max_diff, mean, n_greedy - mismatches - ties, n_greedy, ties, ties_agree);
        assert_true(max_diff <= b->max_diff);
        assert_true(mean <= b->mean_diff);
        assert_int_equal(mismatches, 0);
        sequence_runner_free(&runner);
        free(logits);
        free(scratch);
        free(ids);
        free(greedy);
    }
    fprintf(stderr, "golden qwen %s: prompt top-1 %d/%d\n", b->name, top1, positions);
    assert_true(top1 >= b->min_top1 * positions);
    json_decref(prompts);
}

static void test_fp32(void **state) {
    (void)state;
    check(&FP32);
}

static void test_int8(void **state) {
    (void)state;
    check(&INT8);
}

int main(void) {
    const char *path = qwen_path();
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "test_golden_qwen: skipped, %s is absent (scripts/fetch-model.sh qwen fetches it)\n", path);
        return 77;
    }
    BraidError err;
    if (braid_model_load(path, &model, &err)) {
        fprintf(stderr, "test_golden_qwen: %s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tokenizer), cmocka_unit_test(test_fp32), cmocka_unit_test(test_int8)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    braid_model_free(&model);
    return rc;
}
