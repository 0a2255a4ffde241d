/*
 * Forward pass against HF transformers running the same GGUF in fp32 (tests/golden/logits.jsonl),
 * once per CPU arithmetic. fp32: for every prompt, the top-20 reference logits at every position
 * agree within 5e-2 (mean within 1e-2), and the 32-token greedy continuation matches step by step
 * (teacher-forced on the reference tokens, so a near-tie does not end the comparison) except where
 * the reference's top-2 margin is under 1e-3. int8 (the default): the same checks with the bounds
 * below, greedy tokens held where the margin is clear (≥ 0.5) and the near-ties reported; its
 * top-1 agreement is compared with llama.cpp's by bench/golden_agreement.py. Prompts over 200
 * tokens exercise RoPE far from position 0.
 * Why 5e-2 and not fp32-tight: the KV cache holds K and V in fp16 (as llama.cpp's does by
 * default), which moves logits by up to ~3e-2 (mean ≤ 5e-3) on these prompts; with an fp32 cache
 * the worst difference was 8e-5. A real forward-pass bug (RoPE, masking, GQA mapping) moves them
 * by far more, and test_ops checks each kernel against a double-precision reference at 1e-5.
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

#include "golden_io.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

/* What each CPU arithmetic is held to. fp32 is the reference-accurate path; int8 rounds every
 * matmul input to 8 bits per 32-element block (as llama.cpp's q8_0 / q8_1 do), which moves logits
 * by up to a few tenths and flips the greedy token where the reference's top-2 margin is small.
 * Its bounds are about twice the values measured on these prompts (bench/RESULTS.md, issue 21). */
typedef struct {
    const char *name;
    CpuMatmulMath math;
    double max_logit_diff;  /* largest |ours − reference| over the top-20 logits of every prompt position */
    double mean_logit_diff; /* mean of the same */
    double clear_margin;    /* greedy tokens must match wherever the reference's top-2 margin is at least this */
    double min_top1;        /* share of prompt positions whose argmax is the reference's top-1 */
} ArithmeticBounds;

/* int8 measured (2026-11-25): worst |diff| 2.38, worst prompt mean 0.28, prompt top-1 1232 / 1273
 * (96.8%); no greedy token differs where the margin is 0.5 or more (57 of 62 below it agree). */
#define INT8_MAX_DIFF 5.0
#define INT8_MEAN_DIFF 0.5
#define INT8_CLEAR_MARGIN 0.5
#define INT8_MIN_TOP1 0.95
static const ArithmeticBounds FP32_BOUNDS = {"fp32", CPU_MATMUL_FP32, 5e-2, 1e-2, 1e-3, 0.99};
static const ArithmeticBounds INT8_BOUNDS = {"int8", CPU_MATMUL_INT8, INT8_MAX_DIFF, INT8_MEAN_DIFF, INT8_CLEAR_MARGIN, INT8_MIN_TOP1};

typedef GoldenModel Fixture;

static int setup(void **state) {
    static Fixture fx;
    if (golden_model_load(&fx)) return -1;
    *state = &fx;
    return 0;
}

static int teardown(void **state) {
    golden_model_free(*state);
    return 0;
}

/* Positions p < n − 1 whose argmax is the reference's top-1 there. */
static int prompt_top1_agreement(const json_t *p, const float *logits, int n, int vocab) {
    json_t *top_ids = json_object_get(p, "top_ids");
    int agree = 0;
    for (int pos = 0; pos + 1 < n; pos++)
        agree += sampler_argmax(logits + (size_t)pos * vocab, vocab) ==
                 (int)json_integer_value(json_array_get(json_array_get(top_ids, (size_t)pos), 0));
    return agree;
}

static void check_arithmetic(Fixture *fx, const ArithmeticBounds *bounds) {
    const ModelConfig *cfg = &fx->model.weights.cfg;
    size_t n_prompts = json_array_size(fx->prompts);
    int long_prompts = 0, near_ties = 0, greedy_steps = 0, top1 = 0, positions = 0;
    double worst = 0.0, worst_mean = 0.0;
    assert_true(n_prompts >= 8);
    for (size_t i = 0; i < n_prompts; i++) {
        json_t *p = json_array_get(fx->prompts, i);
        const char *name = json_string_value(json_object_get(p, "name"));
        const char *text = json_string_value(json_object_get(p, "text"));
        int n, n_greedy;
        int32_t *ids = golden_int_array(json_object_get(p, "ids"), &n);
        int32_t *greedy = golden_int_array(json_object_get(p, "greedy"), &n_greedy);
        json_t *margins = json_object_get(p, "greedy_margins");
        if (n > 200) long_prompts++;

        /* Our tokenizer must produce the same prompt ids. */
        TokenList ours = {0};
        BraidError err;
        assert_int_equal(tokenizer_encode(&fx->model.tokenizer, text, strlen(text), true, false, &ours, &err), 0);
        assert_int_equal(ours.n, n);
        assert_memory_equal(ours.ids, ids, (size_t)n * sizeof *ids);
        free(ours.ids);

        SequenceRunner runner;
        assert_int_equal(sequence_runner_init_math(&runner, &fx->model.weights, n + n_greedy + 1, BACKEND_CPU, bounds->math, &err), 0);
        float *logits = malloc((size_t)n * cfg->vocab_size * sizeof *logits);
        assert_non_null(logits);
        assert_int_equal(sequence_runner_eval(&runner, ids, n, true, logits, &err), 0);
        double mean, max_diff = golden_compare_top_logits(p, logits, n, cfg->vocab_size, &mean); /* infinite on a size mismatch */
        if (max_diff > worst) worst = max_diff;
        if (mean > worst_mean) worst_mean = mean;
        top1 += prompt_top1_agreement(p, logits, n, cfg->vocab_size);
        positions += n - 1;

        /* Greedy continuation, teacher-forced on the reference tokens. */
        const float *step_logits = logits + (size_t)(n - 1) * cfg->vocab_size;
        int mismatches = 0, ties = 0, ties_agreeing = 0;
        for (int s = 0; s < n_greedy; s++) {
            int32_t mine = sampler_argmax(step_logits, cfg->vocab_size);
            double margin = json_number_value(json_array_get(margins, (size_t)s));
            if (margin < bounds->clear_margin) {
                ties++;
                ties_agreeing += mine == greedy[s];
            } else if (mine != greedy[s]) {
                fprintf(stderr, "  %s %s: greedy step %d: braid %d, reference %d (margin %.4g)\n", bounds->name, name, s, mine,
                        greedy[s], margin);
                mismatches++;
            }
            if (s + 1 < n_greedy) {
                assert_int_equal(sequence_runner_eval(&runner, &greedy[s], 1, false, logits, &err), 0);
                step_logits = logits;
            }
        }
        greedy_steps += n_greedy;
        near_ties += ties;
        fprintf(stderr, "logits golden %s: %-20s %4d tokens, max |diff| %.2e, mean %.2e; greedy %d/%d match, %d near-ties (%d agree)\n",
                bounds->name, name, n, max_diff, mean, n_greedy - mismatches - ties, n_greedy, ties, ties_agreeing);
        assert_true(max_diff <= bounds->max_logit_diff);
        assert_true(mean <= bounds->mean_logit_diff);
        assert_int_equal(mismatches, 0);
        sequence_runner_free(&runner);
        free(logits);
        free(ids);
        free(greedy);
    }
    fprintf(stderr, "logits golden %s: %zu prompts (%d over 200 tokens), worst |diff| %.2e (mean %.2e), prompt top-1 %d/%d, "
            "%d of %d greedy steps were near-ties (margin < %g)\n", bounds->name, n_prompts, long_prompts, worst, worst_mean, top1,
            positions, near_ties, greedy_steps, bounds->clear_margin);
    assert_true(long_prompts >= 3);
    assert_true(top1 >= bounds->min_top1 * positions);
}

static void test_fp32_logits_and_greedy(void **state) { check_arithmetic(*state, &FP32_BOUNDS); }
static void test_int8_logits_and_greedy(void **state) { check_arithmetic(*state, &INT8_BOUNDS); }

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fp32_logits_and_greedy), cmocka_unit_test(test_int8_logits_and_greedy)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
