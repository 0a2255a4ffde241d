/*
 * Serving engine with the committed LoRA adapters on the real model (CPU, fp32 arithmetic):
 *   - mixed batch: requests of the base model and of two adapters (the same prompt under each, and
 *     another prompt) run together, all prefilled in one step, give the same greedy outputs as
 *     each request run alone; the same prompt's output differs between the base model and each
 *     adapter, so the adapters are really applied per sequence;
 *   - the engine's adapter output is the single-sequence runner's with that adapter;
 *   - `separate` cache: a prompt cached under one adapter (or the base model) is a miss under
 *     another (cached_tokens 0) and a hit under the same one;
 *   - a request naming an adapter that is not loaded is refused with a message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_io.h"
#include "model/lora_adapter.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/engine.h"
#include "worker/sequence.h"

#define MAX_TOKENS 10
#define N_REQ 5

static BraidModel model;
static LoraSet lora;
static TokenList shared_prompt, other_prompt;

static int encode(const char *text, TokenList *out) {
    return golden_encode(&model, text, true, out);
}

static int setup(void **state) {
    (void)state;
    if (golden_load_model_and_adapters(&model, &lora)) return -1;
    /* Long enough for two full cache blocks of 16 tokens. */
    return encode("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                  "<|im_start|>user\nWrite the function subtract for a calculator app.<|im_end|>\n<|im_start|>assistant\n",
                  &shared_prompt) ||
                   encode("<|im_start|>user\nPlan the work to build a photo gallery.<|im_end|>\n<|im_start|>assistant\n", &other_prompt)
               ? -1
               : 0;
}

static int teardown(void **state) {
    (void)state;
    free(shared_prompt.ids);
    free(other_prompt.ids);
    lora_set_free(&lora);
    braid_model_free(&model);
    return 0;
}

typedef struct {
    const char *adapter; /* NULL = base model */
    const TokenList *prompt;
} Job;

/* base, coder and tester on the same prompt; planner and base on another. */
static const Job JOBS[N_REQ] = {{NULL, &shared_prompt}, {"coder", &shared_prompt}, {"tester", &shared_prompt},
                                {"planner", &other_prompt}, {NULL, &other_prompt}};

typedef struct {
    int32_t tokens[MAX_TOKENS];
    int n, cached;
    char error[sizeof(BraidError)];
} Output;

/* An engine with the adapters, the radix cache and fp32 arithmetic (that of the sequence runner). */
static void start_engine(Engine *e) {
    EngineConfig cfg = {.n_blocks = 256, .block_size = 16, .max_batch_tokens = 512, .max_running = 16, .cache_enabled = true,
                        .policy = &evict_policy_lru, .cpu_matmul_fp32 = true, .lora = &lora};
    BraidError err;
    if (engine_init(e, &model, &cfg, &err)) fail_msg("%s", err.msg);
}

static void init_request(SchedRequest *r, const char *id, const Job *job) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->adapter = job->adapter ? strdup(job->adapter) : NULL;
    r->cap_tokens = job->prompt->n + MAX_TOKENS + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    memcpy(r->tokens, job->prompt->ids, (size_t)job->prompt->n * sizeof *r->tokens);
    r->n_tokens = r->n_prompt = job->prompt->n;
    r->max_tokens = MAX_TOKENS;
    r->ignore_eos = true;
    r->sampling = sampling_params_default();
}

static void collect(SchedRequest *r, Output *out) {
    assert_int_equal(r->state, REQ_FINISHED);
    snprintf(out->error, sizeof out->error, "%s", r->error);
    out->n = r->n_tokens - r->n_prompt;
    memcpy(out->tokens, r->tokens + r->n_prompt, (size_t)out->n * sizeof(int32_t));
    out->cached = r->cached_tokens;
    sched_request_free(r);
}

/* Runs jobs[0..n) submitted together through engine e; *first_step gets the first step's sequences. */
static void run_together(Engine *e, const Job *jobs, int n, Output *out, int *first_step) {
    SchedRequest reqs[N_REQ];
    BraidError err;
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        init_request(&reqs[i], id, &jobs[i]);
        assert_int_equal(engine_submit(e, &reqs[i]), 0);
    }
    for (int step = 0; !sched_idle(&e->sched); step++) {
        int seqs = engine_step(e, &err);
        if (seqs < 0) fail_msg("%s", err.msg);
        if (step == 0 && first_step) *first_step = seqs;
    }
    for (int i = 0; i < n; i++) collect(&reqs[i], &out[i]);
}

static void run_alone(const Job *job, Output *out) {
    Engine e;
    start_engine(&e);
    run_together(&e, job, 1, out, NULL);
    engine_free(&e);
}

static bool same_output(const Output *a, const Output *b) {
    return a->n == b->n && memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t)) == 0;
}

static void test_mixed_batch_equals_alone(void **state) {
    (void)state;
    Engine e;
    start_engine(&e);
    Output mixed[N_REQ], alone[N_REQ];
    int first_step = 0;
    run_together(&e, JOBS, N_REQ, mixed, &first_step);
    engine_free(&e);
    assert_int_equal(first_step, N_REQ); /* every sequence, of three adapters and the base, in one step */
    for (int i = 0; i < N_REQ; i++) {
        run_alone(&JOBS[i], &alone[i]);
        assert_string_equal(mixed[i].error, "");
        assert_int_equal(mixed[i].n, MAX_TOKENS);
        if (!same_output(&mixed[i], &alone[i])) fail_msg("request %d (%s): mixed batch and alone differ", i, JOBS[i].adapter);
    }
    /* The same prompt under the base model and each adapter: the adapters change the output. */
    assert_false(same_output(&mixed[0], &mixed[1]));
    assert_false(same_output(&mixed[0], &mixed[2]));
    assert_false(same_output(&mixed[1], &mixed[2]));
    assert_false(same_output(&mixed[3], &mixed[4]));
}

/* The engine's greedy tokens for the coder adapter are the single-sequence runner's. */
static void test_engine_matches_sequence_runner(void **state) {
    (void)state;
    Output out;
    run_alone(&JOBS[1], &out);
    SequenceRunner runner;
    BraidError err;
    int id = lora_set_find(&lora, "coder");
    if (sequence_runner_init_adapter(&runner, &model.weights, &lora, id, shared_prompt.n + MAX_TOKENS + 1, BACKEND_CPU, CPU_MATMUL_FP32, &err))
        fail_msg("%s", err.msg);
    float *logits = malloc((size_t)model.weights.cfg.vocab_size * sizeof *logits);
    assert_non_null(logits);
    assert_int_equal(sequence_runner_eval(&runner, shared_prompt.ids, shared_prompt.n, false, logits, &err), 0);
    for (int k = 0; k < MAX_TOKENS; k++) {
        int32_t next = sampler_argmax(logits, model.weights.cfg.vocab_size);
        assert_int_equal(next, out.tokens[k]);
        assert_int_equal(sequence_runner_eval(&runner, &next, 1, false, logits, &err), 0);
    }
    free(logits);
    sequence_runner_free(&runner);
}

/* Identical tokens under different adapters never share KV blocks; under the same one they do. */
static void test_cache_is_separate_per_adapter(void **state) {
    (void)state;
    Engine e;
    start_engine(&e);
    const Job order[] = {{NULL, &shared_prompt}, {"coder", &shared_prompt}, {"tester", &shared_prompt},
                         {"coder", &shared_prompt}, {NULL, &shared_prompt}};
    Output out[5];
    for (int i = 0; i < 5; i++) run_together(&e, &order[i], 1, &out[i], NULL);
    engine_free(&e);
    assert_true(shared_prompt.n >= 32);
    assert_int_equal(out[0].cached, 0);
    assert_int_equal(out[1].cached, 0); /* cached under the base model only */
    assert_int_equal(out[2].cached, 0); /* cached under the base model and coder only */
    assert_true(out[3].cached >= 32);   /* coder again */
    assert_true(out[4].cached >= 32);   /* the base model again */
    assert_true(same_output(&out[1], &out[3]));
    assert_true(same_output(&out[0], &out[4]));
}

static void test_unknown_adapter_is_refused(void **state) {
    (void)state;
    Engine e;
    start_engine(&e);
    SchedRequest r;
    const Job job = {"summarise", &other_prompt};
    init_request(&r, "bad", &job);
    assert_int_equal(engine_submit(&e, &r), -1);
    assert_int_equal(r.state, REQ_FINISHED);
    assert_string_equal(r.finish_reason, "error");
    assert_non_null(strstr(r.error, "unknown LoRA adapter 'summarise'"));
    sched_request_free(&r);
    engine_free(&e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_batch_equals_alone),
        cmocka_unit_test(test_engine_matches_sequence_runner),
        cmocka_unit_test(test_cache_is_separate_per_adapter),
        cmocka_unit_test(test_unknown_adapter_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
