/*
 * The int8 decode arithmetic on the real model (--cpu-matmul int8): the engine with int8 stays
 * close to the engine with fp32 — logits of the golden prompts, and greedy continuations that differ
 * only at near-ties. The kernels themselves are checked bit for bit in test_int8_kernels.c.
 * Model-heavy (minutes under ASan), so scripts/test.sh runs it in the release build only.
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
#include "worker/backend.h"
#include "worker/engine.h"

/* Bounds for the real-model comparison, about twice the values measured (see
 * test_engine_int8_close_to_fp32). */
#define MAX_LOGIT_DIFF 6.0   /* largest |int8 − fp32| logit over every prompt position */
#define MAX_MEAN_DIFF 0.5    /* mean |int8 − fp32| logit */
#define MIN_TOP1_AGREEMENT 0.9
#define TIE_GAP 1.0          /* int8 may pick another token only where fp32's top-2 gap is under this */

/* Prompt logits (n, vocab) of one sequence through a CPU backend with the given arithmetic. */
static void prompt_logits(const BraidModel *m, CpuMatmulMath math, const int32_t *ids, int n, float *logits) {
    const int bs = 16, n_blocks = n / bs + 1; /* the sequence's blocks; block 0 of the pool is the null block */
    BackendConfig bc = backend_config_default(BACKEND_CPU, &m->weights.cfg, n_blocks + 1, bs, n);
    bc.max_seqs = 1;
    bc.cpu_matmul = math;
    Backend be;
    BraidError err;
    if (backend_create(&be, &m->weights, &bc, &err)) fail_msg("%s", err.msg);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *slots = malloc((size_t)n * sizeof *slots);
    int32_t *rows = malloc((size_t)n * sizeof *rows);
    int32_t *table = malloc((size_t)n_blocks * sizeof *table), *argmax = malloc((size_t)n * sizeof *argmax);
    assert_true(pos && slots && rows && table && argmax);
    for (int b = 0; b < n_blocks; b++) table[b] = b + 1;
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        slots[i] = table[i / bs] * bs + i % bs;
    }
    int32_t seq_start[2] = {0, n}, n_ctx = n;
    const int32_t *tables[1] = {table};
    ForwardBatch batch = {.n_tokens = n, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                          .seq_start = seq_start, .block_tables = tables, .seq_n_ctx = &n_ctx,
                          .n_logits = n, .logit_rows = rows};
    ForwardOutput out = {.argmax = argmax, .logits = logits};
    if (backend_forward(&be, &batch, &out, &err)) fail_msg("%s", err.msg);
    backend_destroy(&be);
    free(pos); free(slots); free(rows); free(table); free(argmax);
}

/* Greedy continuations of every prompt through one engine (all prompts in flight together). */
static void engine_greedy(const BraidModel *m, bool fp32, int32_t **prompts, const int *lens, int n_prompts, int n_gen,
                          int32_t *out /* (n_prompts, n_gen) */) {
    EngineConfig cfg = {.n_blocks = 512, .block_size = 16, .max_batch_tokens = 512, .max_running = 16, .cache_enabled = false,
                        .policy = &evict_policy_lru, .cpu_matmul_fp32 = fp32};
    Engine e;
    BraidError err;
    if (engine_init(&e, m, &cfg, &err)) fail_msg("%s", err.msg);
    SchedRequest *reqs = calloc((size_t)n_prompts, sizeof *reqs);
    assert_non_null(reqs);
    for (int i = 0; i < n_prompts; i++) {
        SchedRequest *r = &reqs[i];
        char id[16];
        snprintf(id, sizeof id, "p%d", i);
        r->id = strdup(id);
        r->cap_tokens = lens[i] + n_gen + 1;
        r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
        memcpy(r->tokens, prompts[i], (size_t)lens[i] * sizeof *r->tokens);
        r->n_tokens = r->n_prompt = lens[i];
        r->max_tokens = n_gen;
        r->ignore_eos = true;
        r->sampling = sampling_params_default();
        assert_int_equal(engine_submit(&e, r), 0);
    }
    while (!sched_idle(&e.sched))
        if (engine_step(&e, &err) < 0) fail_msg("%s", err.msg);
    for (int i = 0; i < n_prompts; i++) {
        assert_int_equal(reqs[i].n_tokens - reqs[i].n_prompt, n_gen);
        memcpy(out + (size_t)i * n_gen, reqs[i].tokens + reqs[i].n_prompt, (size_t)n_gen * sizeof *out);
        sched_request_free(&reqs[i]);
    }
    free(reqs);
    engine_free(&e);
}

/* fp32 top-2 gap after ids[0..n) (the last position's logits). */
static double fp32_gap_after(const BraidModel *m, const int32_t *ids, int n) {
    int vocab = m->weights.cfg.vocab_size;
    float *logits = malloc((size_t)n * vocab * sizeof *logits);
    assert_non_null(logits);
    prompt_logits(m, CPU_MATMUL_FP32, ids, n, logits);
    double gap = golden_top2_gap(logits + (size_t)(n - 1) * vocab, vocab);
    free(logits);
    return gap;
}

/* Compares prompt logits position by position; returns the largest |diff|, adds to the totals. */
static double compare_prompt(const BraidModel *m, const int32_t *ids, int n, double *diff_sum, long *count, int *top1_same,
                             double *worst_gap) {
    int vocab = m->weights.cfg.vocab_size;
    float *a = malloc((size_t)n * vocab * sizeof *a), *b = malloc((size_t)n * vocab * sizeof *b);
    assert_true(a && b);
    prompt_logits(m, CPU_MATMUL_FP32, ids, n, a);
    prompt_logits(m, CPU_MATMUL_INT8, ids, n, b);
    double worst = 0.0;
    for (int p = 0; p < n; p++) {
        const float *ra = a + (size_t)p * vocab, *rb = b + (size_t)p * vocab;
        int best_a = 0, best_b = 0;
        for (int v = 0; v < vocab; v++) {
            double d = fabs((double)ra[v] - rb[v]);
            *diff_sum += d;
            if (d > worst) worst = d;
            if (ra[v] > ra[best_a]) best_a = v;
            if (rb[v] > rb[best_b]) best_b = v;
        }
        *count += vocab;
        if (best_a == best_b) (*top1_same)++;
        else if (golden_top2_gap(ra, vocab) > *worst_gap) *worst_gap = golden_top2_gap(ra, vocab);
    }
    free(a);
    free(b);
    return worst;
}

/* Measured on SmolLM2-135M-Instruct.Q4_1 over the 9 golden prompts (1282 positions), 2026-11-23:
 *   prompt logits, int8 vs fp32: max |diff| 3.14, mean |diff| 0.17; top-1 agrees at 1232 of 1282
 *   positions (96.1%), and where it does not, fp32's top-2 gap is at most 0.70;
 *   engine greedy continuations of 32 tokens: 3 of 9 identical; the other 6 part (after 0, 0, 16,
 *   17, 22 and 24 tokens) where fp32's top-2 gap is at most 0.15, then run on from different text.
 * Rounding activations to 8 bits moves logits by tenths and so flips near-ties; a kernel bug moves
 * them by far more, or flips clear choices, which the bounds catch. */
static void test_engine_int8_close_to_fp32(void **state) {
    (void)state;
    GoldenModel g;
    if (golden_model_load(&g)) fail_msg("cannot load the model and golden prompts");
    const int n_gen = 32;
    int n_prompts = (int)json_array_size(g.prompts);
    int32_t **ids = calloc((size_t)n_prompts, sizeof *ids);
    int *lens = calloc((size_t)n_prompts, sizeof *lens);
    assert_true(ids && lens);
    double worst = 0.0, diff_sum = 0.0, worst_tie = 0.0;
    long count = 0;
    int top1_same = 0, positions = 0;
    for (int i = 0; i < n_prompts; i++) {
        ids[i] = golden_int_array(json_object_get(json_array_get(g.prompts, (size_t)i), "ids"), &lens[i]);
        double w = compare_prompt(&g.model, ids[i], lens[i], &diff_sum, &count, &top1_same, &worst_tie);
        if (w > worst) worst = w;
        positions += lens[i];
    }
    int32_t *greedy_fp32 = malloc((size_t)n_prompts * n_gen * sizeof(int32_t));
    int32_t *greedy_int8 = malloc((size_t)n_prompts * n_gen * sizeof(int32_t));
    assert_true(greedy_fp32 && greedy_int8);
    engine_greedy(&g.model, true, ids, lens, n_prompts, n_gen, greedy_fp32);
    engine_greedy(&g.model, false, ids, lens, n_prompts, n_gen, greedy_int8);
    int identical = 0;
    double worst_part_gap = 0.0;
    for (int i = 0; i < n_prompts; i++) {
        int k = 0;
        while (k < n_gen && greedy_fp32[i * n_gen + k] == greedy_int8[i * n_gen + k]) k++;
        if (k == n_gen) {
            identical++;
            continue;
        }
        int32_t *seq = malloc((size_t)(lens[i] + k) * sizeof *seq);
        assert_non_null(seq);
        memcpy(seq, ids[i], (size_t)lens[i] * sizeof *seq);
        memcpy(seq + lens[i], greedy_fp32 + (size_t)i * n_gen, (size_t)k * sizeof *seq);
        double gap = fp32_gap_after(&g.model, seq, lens[i] + k);
        free(seq);
        fprintf(stderr, "int8 vs fp32 prompt %d: greedy continuations part at token %d, where fp32's top-2 gap is %.3f\n", i,
                k, gap);
        if (gap > worst_part_gap) worst_part_gap = gap;
    }
    double mean = diff_sum / (double)count;
    fprintf(stderr, "int8 vs fp32: logits max |diff| %.3f, mean %.3f; top-1 agrees at %d of %d positions (disagreements at "
                    "fp32 gaps <= %.3f); %d of %d greedy continuations identical (the others part at gaps <= %.3f)\n",
            worst, mean, top1_same, positions, worst_tie, identical, n_prompts, worst_part_gap);
    assert_true(worst <= MAX_LOGIT_DIFF);
    assert_true(mean <= MAX_MEAN_DIFF);
    assert_true(top1_same >= MIN_TOP1_AGREEMENT * positions);
    assert_true(worst_tie < TIE_GAP);
    assert_true(worst_part_gap < TIE_GAP);
    for (int i = 0; i < n_prompts; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(greedy_fp32);
    free(greedy_int8);
    golden_model_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_int8_close_to_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
