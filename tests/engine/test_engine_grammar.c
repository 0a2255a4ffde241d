/*
 * test_engine_grammar — structured outputs through the serving engine on the real model
 * (SmolLM2-135M): 16 concurrent requests, greedy and sampled, under four schemas (a Pydantic-like
 * object with $defs, an array, an enum, a forced Hermes-style tool call); every request that stops
 * holds text that parses as JSON (the tool call: between its tags) and validates against its schema
 * (unit/schema_validate.c). A tiny KV pool forces preemption: the greedy outputs equal those of an
 * ample pool (the matcher state survives recompute). A spec that does not compile ends the request
 * with an error naming it. With BRAID_TEST_DEVICE=cuda the same runs use the CUDA backend (masks
 * applied on the device; ctest test_engine_grammar_cuda, skipped without a GPU).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/model.h"
#include "schema_validate.h"
#include "test_paths.h"
#include "worker/engine.h"

#define N_REQ 16
#define MAX_TOKENS 64

static BraidModel model;
static BackendKind device = BACKEND_CPU;

static const char *const SCHEMAS[4] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},\"age\":{\"type\":\"integer\"},"
    "\"city\":{\"$ref\":\"#/$defs/City\"},\"hobbies\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":16},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"city\"],\"$defs\":{\"City\":{\"enum\":[\"Paris\",\"London\",\"Tokyo\",\"Lima\"]}}}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":5}",
    "{\"type\":\"object\",\"properties\":{\"answer\":{\"enum\":[\"yes\",\"no\",\"maybe\"]},\"confidence\":{\"type\":\"number\"}},\"required\":[\"answer\",\"confidence\"]}",
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\",\"maxLength\":20}},\"required\":[\"city\"]}},\"required\":[\"name\",\"arguments\"]}]}",
};
static const char *const QUESTIONS[4] = {
    "Describe a fictional person as JSON with name, age, city and hobbies.",
    "Give a short list of small prime numbers as a JSON array.",
    "Is the sky blue? Answer as JSON with answer and confidence.",
    "What is the weather in Paris? Call the get_weather tool.",
};

static int setup(void **state) {
    (void)state;
    BraidError err;
    if (braid_model_load(test_model_path(), &model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    braid_model_free(&model);
    return 0;
}

static char *spec_for(int kind) {
    char *spec = malloc(2048);
    if (kind == 3)
        snprintf(spec, 2048, "{\"prefix\":\"<tool_call>\\n\",\"suffix\":\"\\n</tool_call>\",\"schema\":%s}", SCHEMAS[kind]);
    else
        snprintf(spec, 2048, "{\"schema\":%s}", SCHEMAS[kind]);
    return spec;
}

static void init_request(SchedRequest *r, int i, bool sampled) {
    char id[16];
    snprintf(id, sizeof id, "g%d", i);
    r->id = strdup(id);
    ChatMessage msgs[2] = {{.role = "system", .content = "You are a helpful assistant that replies in JSON."},
                           {.role = "user", .content = QUESTIONS[i % 4]}};
    BraidError err;
    char *text = chat_template_render(&model.chat, msgs, 2, &err);
    if (!text) fail_msg("%s", err.msg);
    TokenList tl = {0};
    if (tokenizer_encode(&model.tokenizer, text, strlen(text), true, model.tokenizer.add_bos, &tl, &err)) fail_msg("%s", err.msg);
    free(text);
    r->tokens = tl.ids;
    r->n_tokens = r->n_prompt = tl.n;
    r->cap_tokens = tl.cap;
    r->max_tokens = MAX_TOKENS;
    r->sampling = sampling_params_default();
    if (sampled) r->sampling = (SamplingParams){.temperature = 0.8f, .top_p = 0.95f, .top_k = 40, .seed = (uint64_t)i + 1};
    r->grammar_spec = spec_for(i % 4);
}

/* Checks one finished request's output; returns 1 when it stopped (and validated). */
static int check_output(const SchedRequest *r, int kind) {
    if (r->error[0]) fail_msg("request %s: %s", r->id, r->error);
    size_t len;
    char *text = tokenizer_decode(&model.tokenizer, r->tokens + r->n_prompt, r->n_tokens - r->n_prompt, &len);
    assert_non_null(text);
    int stopped = strcmp(r->finish_reason, "stop") == 0;
    if (!stopped) assert_string_equal(r->finish_reason, "length");
    if (stopped) {
        const char *body = text;
        size_t body_len = len;
        if (kind == 3) {
            assert_true(len > 24 && strncmp(text, "<tool_call>\n", 12) == 0 && strcmp(text + len - 13, "\n</tool_call>") == 0);
            body = text + 12;
            body_len = len - 25;
        }
        json_error_t jerr;
        json_t *value = json_loadb(body, body_len, JSON_DECODE_ANY, &jerr);
        if (!value) fail_msg("request %s: '%s' is not JSON: %s", r->id, text, jerr.text);
        json_t *schema = json_loads(SCHEMAS[kind], 0, &jerr);
        char why[256];
        if (!schema_validate(value, schema, schema, why, sizeof why)) fail_msg("request %s: '%s' does not validate: %s", r->id, text, why);
        json_decref(schema);
        json_decref(value);
    }
    free(text);
    return stopped;
}

typedef struct {
    int32_t tokens[N_REQ][MAX_TOKENS];
    int n[N_REQ];
    int stopped, preemptions;
} Outputs;

static void serve(int n_blocks, int n_req, bool sampled_half, Outputs *o) {
    EngineConfig cfg = {.n_blocks = n_blocks, .block_size = 16, .max_batch_tokens = 256, .max_running = N_REQ, .cache_enabled = true,
                        .policy = &evict_policy_lru, .device = device};
    Engine e;
    BraidError err;
    if (engine_init(&e, &model, &cfg, &err)) fail_msg("%s", err.msg);
    static SchedRequest reqs[N_REQ];
    memset(reqs, 0, sizeof reqs);
    for (int i = 0; i < n_req; i++) {
        init_request(&reqs[i], i, sampled_half && i % 2 == 1);
        if (engine_submit(&e, &reqs[i])) fail_msg("request %d refused: %s", i, reqs[i].error);
    }
    while (!sched_idle(&e.sched))
        if (engine_step(&e, &err) < 0) fail_msg("%s", err.msg);
    memset(o, 0, sizeof *o);
    for (int i = 0; i < n_req; i++) {
        SchedRequest *r = &reqs[i];
        if (i < 4 && getenv("BRAID_TEST_VERBOSE")) {
            size_t len;
            char *text = tokenizer_decode(&model.tokenizer, r->tokens + r->n_prompt, r->n_tokens - r->n_prompt, &len);
            fprintf(stderr, "  %s (%s): %s\n", r->id, r->finish_reason, text ? text : "?");
            free(text);
        }
        assert_int_equal(r->state, REQ_FINISHED);
        o->stopped += check_output(r, i % 4);
        o->n[i] = r->n_tokens - r->n_prompt;
        memcpy(o->tokens[i], r->tokens + r->n_prompt, (size_t)o->n[i] * sizeof(int32_t));
        o->preemptions += r->preemptions;
        sched_request_free(r);
    }
    engine_free(&e);
}

static void test_constrained_batch(void **state) {
    (void)state;
    static Outputs o;
    serve(1024, N_REQ, true, &o);
    fprintf(stderr, "grammar engine: %d of %d requests stopped with valid JSON\n", o.stopped, N_REQ);
    assert_true(o.stopped * 2 >= N_REQ);
}

static void test_preemption_keeps_matcher(void **state) {
    (void)state;
    static Outputs small, big;
    /* ~50-token prompts + up to 64 generated: 8 requests need ~60 blocks; 20 force preemption. */
    serve(20, 8, false, &small);
    serve(1024, 8, false, &big);
    fprintf(stderr, "grammar engine: %d preemptions in the tiny pool\n", small.preemptions);
    assert_true(small.preemptions > 0);
    /* CUDA: batch composition changes bf16 rounding, so only validity (checked in serve) holds. */
    for (int i = 0; device == BACKEND_CPU && i < 8; i++) {
        assert_int_equal(small.n[i], big.n[i]);
        assert_memory_equal(small.tokens[i], big.tokens[i], (size_t)small.n[i] * sizeof(int32_t));
    }
}

static void test_bad_spec_is_an_error(void **state) {
    (void)state;
    EngineConfig cfg = {.n_blocks = 64, .block_size = 16, .max_batch_tokens = 64, .max_running = 4, .device = device};
    Engine e;
    BraidError err;
    if (engine_init(&e, &model, &cfg, &err)) fail_msg("%s", err.msg);
    SchedRequest r;
    memset(&r, 0, sizeof r);
    init_request(&r, 0, false);
    free(r.grammar_spec);
    r.grammar_spec = strdup("{\"schema\":{\"type\":\"object\",\"patternProperties\":{}}}");
    assert_int_equal(engine_submit(&e, &r), -1);
    assert_string_equal(r.finish_reason, "error");
    assert_non_null(strstr(r.error, "patternProperties"));
    sched_request_free(&r);
    engine_free(&e);
}

int main(void) {
    const char *dev = getenv("BRAID_TEST_DEVICE");
    if (dev && strcmp(dev, "cuda") == 0) {
        if (!backend_cuda_available()) {
            fprintf(stderr, "no CUDA backend or GPU here: skipping\n");
            return 77;
        }
        device = BACKEND_CUDA;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_spec_is_an_error),
        cmocka_unit_test(test_constrained_batch),
        cmocka_unit_test(test_preemption_keeps_matcher),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
