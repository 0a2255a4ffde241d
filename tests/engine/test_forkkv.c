/*
 * ForkKV's forward on the CPU backend with the real model and the committed adapters
 * (--lora-cache shared; kernels/cpu/residual_attention.h, worker/forward.c):
 *   - one adapter, base and residual written by itself: the same logits as the adapter with a
 *     monolithic cache (separate mode) up to the fp16 rounding of storing the halves apart, and the
 *     same greedy token;
 *   - fork: a context prefilled by one adapter (its base K/V shared, not rewritten) and continued
 *     by another that computes only its residual: close to the second adapter's own full prefill,
 *     and closer than "full reuse" (the second adapter reading the first one's monolithic K/V);
 *   - a batch with residual tables on a backend without a residual pool is refused;
 *   - the engine with --lora-cache shared: one adapter's greedy output equals separate mode's; a
 *     second adapter on a cached prompt forks (base cached, residual computed) and its repeat is
 *     a full hit; a base evicted under pressure while the residual survives is a partial hit
 *     (decoupled eviction); a residual pool too small for everyone at once makes requests wait or
 *     preempt, never lose one, with both trees consistent at the end; a request that can never
 *     fit the residual pool is refused with a message;
 *   - --lora-cache auto: a separate cache while the cost model sees no memory pressure (separate
 *     mode's output, its own namespace's hits), a fork once it prices memory above attention, and
 *     a fork with no memory pressure when the adapter's residuals and the base hold the prompt
 *     (a separate run would recompute it: the recompute term).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "golden_io.h"
#include "model/lora_adapter.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/sched_forkkv.h"

enum { BS = 16, BLOCKS = 64, PLANNER = 1, CODER = 2 };

static BraidModel model;
static LoraSet lora;
static TokenList context, question; /* question follows the context */
static Backend shared_backend, plain_backend;

static int encode(const char *text, bool parse_special, TokenList *out) {
    return golden_encode(&model, text, parse_special, out);
}

static int make_backend(Backend *b, int residual_blocks) {
    BraidError err;
    BackendConfig bc = backend_config_default(BACKEND_CPU, &model.weights.cfg, BLOCKS, BS, 512);
    bc.lora = &lora;
    bc.residual_blocks = residual_blocks;
    bc.residual_rank = lora_set_max_rank(&lora);
    if (backend_create(b, &model.weights, &bc, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int setup(void **state) {
    (void)state;
    if (golden_load_model_and_adapters(&model, &lora)) return -1;
    if (encode("<|im_start|>system\nYou are part of a software team. The project is a calculator app written in C with "
               "functions add, subtract, multiply and divide, each in its own file, with unit tests for each.<|im_end|>\n",
               true, &context) ||
        encode("<|im_start|>user\nWrite the function subtract.<|im_end|>\n<|im_start|>assistant\n", false, &question))
        return -1;
    return make_backend(&shared_backend, BLOCKS) || make_backend(&plain_backend, 0) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    backend_destroy(&shared_backend);
    backend_destroy(&plain_backend);
    free(context.ids);
    free(question.ids);
    lora_set_free(&lora);
    braid_model_free(&model);
    return 0;
}

/* One sequence's prefill of tokens[0, n) in one batch. Base slots below base_from and residual
 * slots below res_from are cached already (written nowhere); res_table NULL = a monolithic cache.
 * Returns the last token's logits (malloc'd). */
static float *prefill(Backend *b, const int32_t *tokens, int n, int adapter, const int32_t *table, const int32_t *res_table,
                      int base_from, int res_from, BraidError *err) {
    int32_t *pos = malloc(n * sizeof *pos), *slots = malloc(n * sizeof *slots), *res_slots = malloc(n * sizeof *res_slots);
    int vocab = model.weights.cfg.vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    assert_true(pos && slots && res_slots && logits);
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        slots[t] = t >= base_from ? table[t / BS] * BS + t % BS : -1;
        res_slots[t] = res_table && t >= res_from ? res_table[t / BS] * BS + t % BS : -1;
    }
    int32_t seq_start[2] = {0, n}, n_ctx = n, row = n - 1, argmax, adapter_id = adapter;
    const int32_t *tables[1] = {table}, *res_tables[1] = {res_table};
    ForwardBatch batch = {.n_tokens = n, .tokens = tokens, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                          .seq_start = seq_start, .block_tables = tables, .seq_n_ctx = &n_ctx, .n_logits = 1,
                          .logit_rows = &row, .seq_adapter = &adapter_id,
                          .res_block_tables = res_table ? res_tables : NULL, .res_slot_mapping = res_table ? res_slots : NULL};
    ForwardOutput out = {.argmax = &argmax, .logits = logits};
    int rc = backend_forward(b, &batch, &out, err);
    free(pos);
    free(slots);
    free(res_slots);
    if (rc) {
        free(logits);
        return NULL;
    }
    return logits;
}

static int32_t *whole_prompt(int *n) {
    *n = context.n + question.n;
    int32_t *t = malloc(*n * sizeof *t);
    assert_non_null(t);
    memcpy(t, context.ids, context.n * sizeof *t);
    memcpy(t + context.n, question.ids, question.n * sizeof *t);
    return t;
}

static int argmax_of(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static double cosine(const float *a, const float *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb);
}

static const int32_t TABLE_A[8] = {1, 2, 3, 4, 5, 6, 7, 8}, TABLE_B[8] = {11, 12, 13, 14, 15, 16, 17, 18};
static const int32_t RES_A[8] = {21, 22, 23, 24, 25, 26, 27, 28}, RES_B[8] = {31, 32, 33, 34, 35, 36, 37, 38};

static void test_own_base_equals_separate(void **state) {
    (void)state;
    BraidError err;
    int n, vocab = model.weights.cfg.vocab_size;
    int32_t *tokens = whole_prompt(&n);
    assert_true(n <= 8 * BS);
    float *separate = prefill(&plain_backend, tokens, n, CODER, TABLE_A, NULL, 0, 0, &err);
    float *shared = prefill(&shared_backend, tokens, n, CODER, TABLE_A, RES_A, 0, 0, &err);
    assert_non_null(separate);
    assert_non_null(shared);
    double max_diff = 0;
    for (int v = 0; v < vocab; v++) max_diff = fmax(max_diff, fabs(separate[v] - shared[v]));
    printf("own base: max |logit diff| %.4f, cosine %.7f\n", max_diff, cosine(separate, shared, vocab));
    assert_true(max_diff < 0.25);
    assert_true(cosine(separate, shared, vocab) > 0.9999);
    assert_int_equal(argmax_of(separate, vocab), argmax_of(shared, vocab));
    free(separate);
    free(shared);
    free(tokens);
}

static void test_fork_beats_full_reuse(void **state) {
    (void)state;
    BraidError err;
    int n, vocab = model.weights.cfg.vocab_size, ctx_full = context.n / BS * BS;
    int32_t *tokens = whole_prompt(&n);
    assert_true(ctx_full >= BS);
    /* The planner's own answer: its monolithic cache from scratch. */
    float *own = prefill(&plain_backend, tokens, n, PLANNER, TABLE_B, NULL, 0, 0, &err);
    assert_non_null(own);
    /* The coder prefills the context in shared mode (base blocks TABLE_A), then the planner forks:
     * the context's whole base blocks are inherited (not rewritten), its residual computed. */
    float *coder = prefill(&shared_backend, context.ids, context.n, CODER, TABLE_A, RES_A, 0, 0, &err);
    assert_non_null(coder);
    float *fork = prefill(&shared_backend, tokens, n, PLANNER, TABLE_A, RES_B, ctx_full, 0, &err);
    assert_non_null(fork);
    /* Full reuse: the coder's monolithic context K/V read by the planner. */
    float *coder_plain = prefill(&plain_backend, context.ids, context.n, CODER, TABLE_A, NULL, 0, 0, &err);
    assert_non_null(coder_plain);
    float *reuse = prefill(&plain_backend, tokens, n, PLANNER, TABLE_A, NULL, ctx_full, 0, &err);
    assert_non_null(reuse);
    double c_fork = cosine(own, fork, vocab), c_reuse = cosine(own, reuse, vocab);
    printf("fork vs own: cosine %.6f (argmax %d vs %d); full reuse vs own: cosine %.6f (argmax %d)\n", c_fork,
           argmax_of(fork, vocab), argmax_of(own, vocab), c_reuse, argmax_of(reuse, vocab));
    assert_true(c_fork > 0.99);
    assert_true(c_fork > c_reuse);
    free(own);
    free(coder);
    free(fork);
    free(coder_plain);
    free(reuse);
    free(tokens);
}

static void test_refused_without_residual_pool(void **state) {
    (void)state;
    BraidError err;
    float *logits = prefill(&plain_backend, context.ids, context.n, CODER, TABLE_A, RES_A, 0, 0, &err);
    assert_null(logits);
    assert_non_null(strstr(err.msg, "residual pool"));
}


/* ---- the engine with --lora-cache shared ---- */

enum { MAX_TOKENS = 8 };

typedef struct {
    int32_t tokens[MAX_TOKENS];
    int n, cached;
    char error[sizeof(BraidError)];
} Output;

static void start_engine_mode(Engine *e, bool shared, bool automatic, int blocks, int residual_blocks) {
    EngineConfig cfg = {.n_blocks = blocks, .block_size = BS, .max_batch_tokens = 512, .max_running = 16, .cache_enabled = true,
                        .policy = &evict_policy_lru, .cpu_matmul_fp32 = true, .lora = &lora, .lora_shared = shared,
                        .lora_auto = automatic, .residual_blocks = residual_blocks};
    BraidError err;
    if (engine_init(e, &model, &cfg, &err)) fail_msg("%s", err.msg);
}

static void start_engine(Engine *e, bool shared, int blocks, int residual_blocks) {
    start_engine_mode(e, shared, false, blocks, residual_blocks);
}

static void init_request(SchedRequest *r, const char *id, const char *adapter, const int32_t *prompt, int n) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->adapter = adapter ? strdup(adapter) : NULL;
    r->cap_tokens = n + MAX_TOKENS + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    memcpy(r->tokens, prompt, (size_t)n * sizeof *r->tokens);
    r->n_tokens = r->n_prompt = n;
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

/* Submits n requests (adapters[i] on prompts[i]) together and runs the engine until idle. */
static void run_together(Engine *e, const char *const *adapters, int32_t *const *prompts, const int *lens, int n, Output *out) {
    SchedRequest *reqs = calloc((size_t)n, sizeof *reqs);
    BraidError err;
    assert_non_null(reqs);
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        init_request(&reqs[i], id, adapters[i], prompts[i], lens[i]);
        assert_int_equal(engine_submit(e, &reqs[i]), 0);
    }
    while (!sched_idle(&e->sched))
        if (engine_step(e, &err) < 0) fail_msg("%s", err.msg);
    if (sched_check(&e->sched, &err)) fail_msg("%s", err.msg);
    for (int i = 0; i < n; i++) collect(&reqs[i], &out[i]);
    free(reqs);
}

static void run_one(Engine *e, const char *adapter, int32_t *prompt, int n, Output *out) {
    run_together(e, &adapter, &prompt, &n, 1, out);
}

static void test_engine_own_adapter_equals_separate(void **state) {
    (void)state;
    int n;
    int32_t *tokens = whole_prompt(&n);
    Engine sep, sh;
    Output a, b;
    start_engine(&sep, false, 256, 0);
    start_engine(&sh, true, 256, 256);
    run_one(&sep, "coder", tokens, n, &a);
    run_one(&sh, "coder", tokens, n, &b);
    assert_string_equal(b.error, "");
    assert_int_equal(a.n, MAX_TOKENS);
    assert_memory_equal(a.tokens, b.tokens, sizeof a.tokens);
    engine_free(&sep);
    engine_free(&sh);
    free(tokens);
}

static void test_engine_fork_then_full_hit(void **state) {
    (void)state;
    int n;
    int32_t *tokens = whole_prompt(&n);
    Engine e;
    Output out[3];
    start_engine(&e, true, 256, 256);
    FILE *events = tmpfile();
    assert_non_null(events);
    e.sched.events = events;
    run_one(&e, "coder", tokens, n, &out[0]);
    uint64_t forks_before = e.sched.counters.fork_tokens;
    run_one(&e, "planner", tokens, n, &out[1]);
    int full = (n - 1) / BS * BS;
    /* The planner inherits the coder's base blocks (a fork) but has no residual yet. */
    assert_int_equal(out[1].cached, 0);
    assert_int_equal((int)(e.sched.counters.fork_tokens - forks_before), full);
    /* Its repeat finds base and residual: a full hit, and the same greedy output. */
    run_one(&e, "planner", tokens, n, &out[2]);
    assert_int_equal(out[2].cached, full);
    assert_memory_equal(out[1].tokens, out[2].tokens, sizeof out[1].tokens);
    /* The base was never duplicated: one adapter-free namespace holds it. */
    assert_true(residual_cache_cached(&e.sched.residual) > 0);
    /* The event log tells the two pools apart; the residual tree names the adapter. */
    char line[4096];
    int base_lines = 0, residual_lines = 0;
    rewind(events);
    while (fgets(line, sizeof line, events)) {
        base_lines += strstr(line, "\"pool\":\"base\"") != NULL;
        residual_lines += strstr(line, "\"pool\":\"residual\"") != NULL && strstr(line, "\"adapter\":\"planner\"") != NULL;
    }
    assert_true(base_lines > 0);
    assert_true(residual_lines > 0);
    engine_free(&e);
    fclose(events);
    free(tokens);
}

/* --lora-cache auto: with no regret measured, an adapted request takes a separate cache (its own
 * namespace, plain attention, the separate engine's output). Once the cost model prices memory
 * high, an adapter whose own copy is the only one stays separate (forking would only add a base
 * copy and a residual: the corrected saving, forkkv_cost.h), while another adapter over the same
 * context forks (the first copy is a duplicate a shared base folds away; nothing cached in the
 * base yet, so the separate engine's output), and a third inherits its base blocks. */
static void test_engine_auto_chooses_by_cost(void **state) {
    (void)state;
    int n;
    int32_t *tokens = whole_prompt(&n);
    int full = (n - 1) / BS * BS;
    Engine sep, e;
    Output ref, ref_planner, out[5];
    start_engine(&sep, false, 256, 0);
    run_one(&sep, "coder", tokens, n, &ref);
    run_one(&sep, "planner", tokens, n, &ref_planner);
    engine_free(&sep);
    start_engine_mode(&e, true, true, 256, 256);
    ForkKvCost *cost = sched_forkkv_cost(&e.sched);
    assert_non_null(cost);
    assert_true(cost->rho_decode > 1.0); /* measured at start-up */
    run_one(&e, "coder", tokens, n, &out[0]);
    assert_string_equal(out[0].error, "");
    assert_int_equal((int)e.sched.counters.forkkv_requests, 0); /* separate: no residual */
    assert_memory_equal(out[0].tokens, ref.tokens, sizeof ref.tokens);
    run_one(&e, "coder", tokens, n, &out[1]); /* its own namespace holds the prompt */
    assert_int_equal(out[1].cached, full);
    assert_int_equal((int)e.sched.counters.forkkv_requests, 0);
    cost->regret = 1.0; /* separate copies always evicted and reread: memory is worth more than attention */
    cost->token_s = 1.0;
    run_one(&e, "coder", tokens, n, &out[2]); /* its own copy alone: nothing to fold, stays separate */
    assert_int_equal((int)e.sched.counters.forkkv_requests, 0);
    assert_int_equal(out[2].cached, full);
    run_one(&e, "planner", tokens, n, &out[3]); /* coder's copy is a duplicate of its context: fork */
    assert_string_equal(out[3].error, "");
    assert_int_equal((int)e.sched.counters.forkkv_requests, 1);
    assert_memory_equal(out[3].tokens, ref_planner.tokens, sizeof ref_planner.tokens);
    uint64_t forks_before = e.sched.counters.fork_tokens;
    run_one(&e, "tester", tokens, n, &out[4]); /* the shared base holds it now */
    assert_int_equal((int)e.sched.counters.forkkv_requests, 2);
    assert_int_equal((int)(e.sched.counters.fork_tokens - forks_before), full);
    assert_string_equal(out[4].error, ""); /* its base K/V are the planner's: ForkKV's approximation */
    /* No regret now, so no memory saving: the planner forks again only because its residuals and
     * the base hold the context (a separate run would recompute all of it): issue 36's recompute
     * term, the only term for the fork here. */
    cost->regret = 0.0;
    Output again;
    run_one(&e, "planner", tokens, n, &again);
    assert_string_equal(again.error, "");
    assert_int_equal((int)e.sched.counters.forkkv_requests, 3);
    assert_int_equal(again.cached, full);
    /* The unified pool: the residuals live in base blocks (carriers), and the invariants hold. */
    assert_true(residual_cache_carriers(&e.sched.residual) > 0);
    BraidError err = {0};
    assert_int_equal(residual_cache_check(&e.sched.residual, &err), 0);
    engine_free(&e);
    free(tokens);
}

static void test_engine_partial_hit_after_base_eviction(void **state) {
    (void)state;
    int n;
    int32_t *tokens = whole_prompt(&n);
    Engine e;
    Output out;
    /* A base pool that holds about one prompt and its output; a roomy residual pool. */
    int blocks = (n + MAX_TOKENS) / BS + 3;
    start_engine(&e, true, blocks, 64);
    run_one(&e, "coder", tokens, n, &out);
    /* Base-model requests on other prompts push the coder's base blocks out; the base model has
     * no residual, so the residual tree is untouched. */
    for (int k = 0; k < 3; k++) {
        int32_t other[96];
        for (int i = 0; i < 96 && i < n; i++) other[i] = tokens[(i * 7 + k * 13) % n];
        run_one(&e, NULL, other, n < 96 ? n : 96, &out);
    }
    uint64_t partial_before = e.sched.counters.partial_hit_tokens;
    run_one(&e, "coder", tokens, n, &out);
    assert_string_equal(out.error, "");
    assert_true(e.sched.counters.partial_hit_tokens > partial_before);
    engine_free(&e);
    free(tokens);
}

static void test_engine_residual_pressure_loses_nothing(void **state) {
    (void)state;
    int n;
    int32_t *tokens = whole_prompt(&n);
    Engine e;
    enum { N = 6 };
    Output out[N];
    int need = (n + MAX_TOKENS + BS - 1) / BS;
    /* Room for two requests' residuals at once, six requests of four adapters. */
    start_engine(&e, true, 256, 2 * need + 1);
    const char *adapters[N] = {"planner", "coder", "tester", "summarizer", "coder", "planner"};
    int32_t *prompts[N];
    int lens[N];
    for (int i = 0; i < N; i++) prompts[i] = tokens, lens[i] = n;
    run_together(&e, adapters, prompts, lens, N, out);
    for (int i = 0; i < N; i++) {
        assert_string_equal(out[i].error, "");
        assert_int_equal(out[i].n, MAX_TOKENS);
    }
    assert_true(e.sched.counters.peak_residual_in_use <= 2 * need);
    engine_free(&e);
    free(tokens);
}

static void test_engine_refuses_what_never_fits(void **state) {
    (void)state;
    int n;
    int32_t *tokens = whole_prompt(&n);
    Engine e;
    start_engine(&e, true, 256, 2);
    SchedRequest r;
    init_request(&r, "big", "coder", tokens, n);
    assert_int_equal(engine_submit(&e, &r), -1);
    assert_non_null(strstr(r.error, "--residual-blocks"));
    sched_request_free(&r);
    engine_free(&e);
    free(tokens);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_base_equals_separate),
        cmocka_unit_test(test_fork_beats_full_reuse),
        cmocka_unit_test(test_refused_without_residual_pool),
        cmocka_unit_test(test_engine_own_adapter_equals_separate),
        cmocka_unit_test(test_engine_fork_then_full_hit),
        cmocka_unit_test(test_engine_auto_chooses_by_cost),
        cmocka_unit_test(test_engine_partial_hit_after_base_eviction),
        cmocka_unit_test(test_engine_residual_pressure_loses_nothing),
        cmocka_unit_test(test_engine_refuses_what_never_fits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
