/*
 * LoRA adapters against peft + transformers (tests/golden/lora/lora_logits.jsonl, written by
 * tools/train_lora.py with the same fp16-rounded adapters that adapters/ holds): for the
 * base model and each of the four adapters, on every reference prompt, the top-10 logits at every
 * prompt position agree within 5e-2 (mean within 1e-2; the fp16 KV cache's share, as in
 * test_golden_logits) and the 16 greedy tokens match (teacher-forced; near-ties under 1e-3 excused).
 * The adapters must matter: on every prompt each adapter moves the logits by more than 1.0 from
 * the base model's, and on some prompt some adapter's next token differs from the base model's.
 * A wrong permutation of Q/K's B rows, a transposed A or B, a wrong scale or a delta applied to
 * the wrong sequence moves the logits by far more than the tolerance.
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
#include "model/lora_adapter.h"
#include "test_paths.h"
#include "worker/sampler.h"
#include "worker/sequence.h"

#define LOGIT_TOLERANCE 5e-2
#define MEAN_TOLERANCE 1e-2
#define MARGIN_TIE 1e-3
#define ADAPTER_EFFECT 1.0 /* least max |adapter - base| logit difference on a prompt */
#define MAX_PROMPTS 8

typedef struct {
    BraidModel model;
    LoraSet lora;
    json_t *records;
} Fixture;

static int setup(void **state) {
    static Fixture fx;
    BraidError err;
    if (braid_model_load(test_model_path(), &fx.model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    if (golden_load_adapters(&fx.model.weights.cfg, &fx.lora)) return -1;
    if (!(fx.records = golden_read_jsonl(test_golden_path("lora/lora_logits.jsonl")))) return -1;
    *state = &fx;
    return 0;
}

static int teardown(void **state) {
    Fixture *fx = *state;
    json_decref(fx->records);
    lora_set_free(&fx->lora);
    braid_model_free(&fx->model);
    return 0;
}

/* The last prompt position's logits of the base model per prompt name, to compare adapters with. */
typedef struct {
    char name[32];
    float *logits; /* (vocab) */
} BaseLogits;

static const BaseLogits *base_of(const BaseLogits *base, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(base[i].name, name) == 0) return &base[i];
    return NULL;
}

static void test_adapters_match_peft(void **state) {
    Fixture *fx = *state;
    int vocab = fx->model.weights.cfg.vocab_size, n_base = 0, adapter_records = 0, next_token_changed = 0;
    BaseLogits base[MAX_PROMPTS];
    bool adapter_seen[TEST_N_ADAPTERS + 1] = {false};
    for (size_t i = 0; i < json_array_size(fx->records); i++) {
        json_t *p = json_array_get(fx->records, i);
        const char *adapter = json_string_value(json_object_get(p, "adapter")), *name = json_string_value(json_object_get(p, "name"));
        int id = lora_set_find(&fx->lora, adapter), n;
        assert_true(id >= 0);
        adapter_seen[id] = true;
        int32_t *ids = golden_int_array(json_object_get(p, "ids"), &n);
        int n_greedy = (int)json_array_size(json_object_get(p, "greedy"));
        SequenceRunner runner;
        BraidError err;
        if (sequence_runner_init_adapter(&runner, &fx->model.weights, &fx->lora, id, n + n_greedy + 1, BACKEND_CPU, CPU_MATMUL_FP32, &err))
            fail_msg("%s", err.msg);
        float *logits = malloc((size_t)n * vocab * sizeof *logits);
        assert_non_null(logits);
        assert_int_equal(sequence_runner_eval(&runner, ids, n, true, logits, &err), 0);
        double mean, max_diff = golden_compare_top_logits(p, logits, n, vocab, &mean);
        const float *last = logits + (size_t)(n - 1) * vocab;
        double effect = 0;
        if (id == 0) {
            assert_true(n_base < MAX_PROMPTS);
            snprintf(base[n_base].name, sizeof base[n_base].name, "%s", name);
            assert_non_null(base[n_base].logits = malloc((size_t)vocab * sizeof(float)));
            memcpy(base[n_base++].logits, last, (size_t)vocab * sizeof(float));
        } else {
            const BaseLogits *b = base_of(base, n_base, name);
            assert_non_null(b); /* the fixture lists the base model's records first */
            for (int v = 0; v < vocab; v++) effect = fmax(effect, fabs(last[v] - b->logits[v]));
            next_token_changed += sampler_argmax(last, vocab) != sampler_argmax(b->logits, vocab);
            adapter_records++;
        }
        int ties = 0, ties_agreeing = 0;
        float *scratch = malloc((size_t)vocab * sizeof *scratch);
        assert_non_null(scratch);
        int mismatches = golden_greedy_mismatches(&runner, p, last, scratch, vocab, MARGIN_TIE, name, &ties, &ties_agreeing);
        fprintf(stderr, "lora golden: %-10s %-8s %3d tokens, max |diff| %.2e, mean %.2e; greedy %d/%d match, %d near-ties; "
                        "max |adapter - base| %.2f\n",
                adapter[0] ? adapter : "(base)", name, n, max_diff, mean, n_greedy - mismatches - ties, n_greedy, ties, effect);
        assert_true(max_diff <= LOGIT_TOLERANCE);
        assert_true(mean <= MEAN_TOLERANCE);
        assert_int_equal(mismatches, 0);
        if (id) assert_true(effect > ADAPTER_EFFECT);
        sequence_runner_free(&runner);
        free(scratch);
        free(logits);
        free(ids);
    }
    for (int id = 0; id <= TEST_N_ADAPTERS; id++) assert_true(adapter_seen[id]);
    assert_true(adapter_records >= TEST_N_ADAPTERS * 3);
    assert_true(next_token_changed > 0);
    for (int i = 0; i < n_base; i++) free(base[i].logits);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_adapters_match_peft)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
