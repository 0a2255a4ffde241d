/*
 * Prefetch copies off the forward's critical path (PBKV §4.3) on the CPU backend with the real model:
 * - overlap: with the copy thread held, an overlapped LOAD list is accepted and a forward over
 *   other blocks runs to completion while the copy is still in flight (the forward never waits for
 *   it); after backend_sync the loaded blocks decode with logits bit-identical to the original;
 *   a plain backend_apply_cache_ops waits for earlier overlapped copies first (list order);
 * - through the engine (pbkv, host tier, prefetch on, S_bw auto): a workflow's prefix demoted to
 *   the host and predicted is prefetched on pure-decode steps, the copies go to the copy thread,
 *   the next call hits it, and every request's greedy tokens are identical with and without the
 *   copy thread (sync_copies); the engine measured a copy rate and a step time, so S_bw is measured.
 * With BRAID_PREFETCH_TIMING=1 a report (no timing assertion): a decode step alone, with 64 LOADs
 * before it, and with them on the copy thread, in interleaved rounds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "worker/copy_thread.h"
#include "worker/engine.h"
#include "worker/kv_pool.h"
#include "worker/sampler.h"

#define BS 16
#define PROMPT 48
#define DEV_BLOCKS 16
#define HOST_BLOCKS 8

static BraidModel model;

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

static void ids_from(int32_t base, int32_t *ids, int n) {
    for (int i = 0; i < n; i++) ids[i] = base + (i * 37) % 500;
}

static int32_t prefill(Backend *b, const int32_t *ids, const int32_t *table) {
    int32_t pos[PROMPT], slots[PROMPT], start[] = {0, PROMPT}, ctx[] = {PROMPT}, row[] = {PROMPT - 1}, next;
    for (int t = 0; t < PROMPT; t++) pos[t] = t, slots[t] = table[t / BS] * BS + t % BS;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = PROMPT, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = &next};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    return next;
}

/* Decodes `token` at position PROMPT over table[0..3]; returns the logits (caller frees). */
static float *decode(Backend *b, int32_t token, const int32_t *table) {
    int32_t pos[] = {PROMPT}, slots[] = {table[3] * BS}, start[] = {0, 1}, ctx[] = {PROMPT + 1}, row[] = {0}, next;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = 1, .tokens = &token, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    float *logits = malloc((size_t)model.weights.cfg.vocab_size * sizeof *logits);
    assert_non_null(logits);
    ForwardOutput out = {.argmax = &next, .logits = logits};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    return logits;
}

static void apply_ok(Backend *b, const CacheOp *ops, int n, bool overlapped) {
    BraidError err;
    int rc = overlapped ? backend_apply_cache_ops_overlapped(b, ops, n, &err) : backend_apply_cache_ops(b, ops, n, &err);
    if (rc) fail_msg("%s", err.msg);
}

static void test_forward_does_not_wait_for_copies(void **state) {
    (void)state;
    Backend b;
    BackendConfig cfg = backend_config_default(BACKEND_CPU, &model.weights.cfg, DEV_BLOCKS, BS, 64);
    cfg.host_blocks = HOST_BLOCKS;
    BraidError err;
    if (backend_create(&b, &model.weights, &cfg, &err)) fail_msg("%s", err.msg);
    assert_non_null(b.copier);
    int32_t p[PROMPT], q[PROMPT];
    ids_from(1000, p, PROMPT);
    ids_from(3000, q, PROMPT);
    const int32_t orig[] = {1, 2, 3, 4}, loaded[] = {5, 6, 7, 8}, other[] = {9, 10, 11, 12};
    int32_t next = prefill(&b, p, orig);
    float *ref = decode(&b, next, orig);
    const CacheOp store[] = {{CACHE_OP_STORE, 1, 1, 0, 0, 0, 0}, {CACHE_OP_STORE, 2, 2, 0, 0, 0, 0}, {CACHE_OP_STORE, 3, 3, 0, 0, 0, 0}};
    apply_ok(&b, store, 3, false);
    /* Held: the overlapped LOADs cannot start; the forward over other blocks still completes. */
    copy_thread_hold(b.copier, true);
    const CacheOp load[] = {{CACHE_OP_LOAD, 1, 5, 0, 0, 0, 0}, {CACHE_OP_LOAD, 2, 6, 0, 0, 0, 0}, {CACHE_OP_LOAD, 3, 7, 0, 0, 0, 0}};
    apply_ok(&b, load, 3, true);
    assert_true(copy_thread_busy(b.copier));
    int32_t next_q = prefill(&b, q, other);
    float *q_logits = decode(&b, next_q, other);
    assert_true(copy_thread_busy(b.copier)); /* both forwards ran beside the pending copy */
    copy_thread_hold(b.copier, false);
    if (backend_sync(&b, &err)) fail_msg("%s", err.msg);
    assert_false(copy_thread_busy(b.copier));
    assert_int_equal(b.overlapped_ops, 3);
    assert_true(b.load_bytes > 0.0 && b.load_seconds > 0.0); /* the thread's LOADs were timed */
    float *via_load = decode(&b, next, loaded);
    assert_memory_equal(ref, via_load, (size_t)model.weights.cfg.vocab_size * sizeof *ref);
    /* A plain list waits for the overlapped one before it (held again, then released by a sync inside). */
    copy_thread_hold(b.copier, true);
    const CacheOp load2[] = {{CACHE_OP_LOAD, 1, 13, 0, 0, 0, 0}};
    apply_ok(&b, load2, 1, true);
    copy_thread_hold(b.copier, false);
    const CacheOp copy[] = {{CACHE_OP_COPY, 13, 14, 0, 0, 0, 0}};
    apply_ok(&b, copy, 1, false); /* syncs first: block 13 holds the loaded data when copied */
    size_t n = (size_t)model.weights.cfg.n_layers * model.weights.cfg.n_kv_heads * BS * model.weights.cfg.head_dim;
    float *a = malloc(n * sizeof *a), *o = malloc(n * sizeof *o);
    assert_non_null(a);
    assert_non_null(o);
    if (backend_read_block(&b, 14, a, NULL, NULL, &err) || backend_read_block(&b, 1, o, NULL, NULL, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(a, o, n * sizeof *a);
    free(a);
    free(o);
    free(ref);
    free(q_logits);
    free(via_load);
    backend_destroy(&b);
}

/* ---- timing report (BRAID_PREFETCH_TIMING=1; prints, asserts only correctness) ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One decode step of a sequence over `table` with `n_load` LOADs beside it: none, inline (before the
 * forward, as before this change) or overlapped (copy thread, synced after the forward). Seconds. */
static double timed_step(Backend *b, int32_t token, const int32_t *table, const CacheOp *loads, int n_load, int arm) {
    BraidError err;
    double t0 = braid_now_seconds();
    if (arm == 1 && backend_apply_cache_ops(b, loads, n_load, &err)) fail_msg("%s", err.msg);
    if (arm == 2 && backend_apply_cache_ops_overlapped(b, loads, n_load, &err)) fail_msg("%s", err.msg);
    free(decode(b, token, table));
    if (backend_sync(b, &err)) fail_msg("%s", err.msg);
    return braid_now_seconds() - t0;
}

static void test_overlap_timing_report(void **state) {
    (void)state;
    const char *on = getenv("BRAID_PREFETCH_TIMING");
    if (!on || strcmp(on, "1") != 0) skip();
    enum { LOADS = 64, ROUNDS = 15 };
    Backend b;
    BackendConfig cfg = backend_config_default(BACKEND_CPU, &model.weights.cfg, 8 + LOADS, BS, 64);
    cfg.host_blocks = LOADS + 1;
    BraidError err;
    if (backend_create(&b, &model.weights, &cfg, &err)) fail_msg("%s", err.msg);
    int32_t p[PROMPT];
    ids_from(1000, p, PROMPT);
    const int32_t table[] = {1, 2, 3, 4};
    int32_t next = prefill(&b, p, table);
    CacheOp loads[LOADS];
    for (int i = 0; i < LOADS; i++) loads[i] = (CacheOp){CACHE_OP_LOAD, 1 + i, 8 + i, 0, 0, 0, 0};
    for (int arm = 0; arm < 3; arm++) timed_step(&b, next, table, loads, LOADS, arm); /* first touch of the pages */
    double t[3][ROUNDS];
    for (int r = 0; r < ROUNDS; r++) /* interleaved rounds: the arms see the same machine */
        for (int arm = 0; arm < 3; arm++) t[arm][r] = timed_step(&b, next, table, loads, LOADS, arm);
    for (int arm = 0; arm < 3; arm++) qsort(t[arm], ROUNDS, sizeof t[arm][0], cmp_double);
    double block_mb = (double)kv_pool_block_bytes(&model.weights.cfg, BS) / 1e6;
    fprintf(stderr, "decode step + %d LOADs (%.1f MB), median of %d interleaved rounds: none %.2f ms, inline %.2f ms, "
                    "copy thread %.2f ms; copy rate %.2f GB/s\n",
            LOADS, LOADS * block_mb, ROUNDS, t[0][ROUNDS / 2] * 1e3, t[1][ROUNDS / 2] * 1e3, t[2][ROUNDS / 2] * 1e3,
            b.load_bytes / b.load_seconds / 1e9);
    backend_destroy(&b);
}

/* ---- through the engine ---- */

static void make_req(SchedRequest *r, const char *id, const char *workflow, const char *agent, int32_t base, int n_prompt, int max_tokens) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->workflow = strdup(workflow);
    r->agent = strdup(agent);
    r->cap_tokens = n_prompt + max_tokens + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    assert_non_null(r->tokens);
    ids_from(base, r->tokens, n_prompt);
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
}

static void run_to_idle(Engine *e) {
    BraidError err;
    while (!sched_idle(&e->sched))
        if (engine_step(e, &err) < 0) fail_msg("%s", err.msg);
}

typedef struct {
    int32_t out2[8], out3[8];
    int n3_cached;
    uint64_t prefetched, prefetch_hits, overlapped_ops;
    bool measured, has_copier;
} Run;

/* w1/coder's 3-block prompt computed, then demoted; w1's coder predicted next; w2's request decodes
 * (pure-decode steps prefetch w1's prefix back); then w1's coder calls again. */
static void engine_run(bool sync_copies, Run *out) {
    EngineConfig cfg = {.n_blocks = 17, .block_size = BS, .max_batch_tokens = 128, .max_running = 4, .host_blocks = 33,
                        .cache_enabled = true, .policy = &evict_policy_pbkv, .prefetch = true, .sync_copies = sync_copies};
    Engine e;
    BraidError err;
    if (engine_init(&e, &model, &cfg, &err)) fail_msg("%s", err.msg);
    out->has_copier = e.backend.copier != NULL;
    SchedRequest r1, r2, r3;
    make_req(&r1, "r1", "w1", "coder", 1000, 3 * BS + 1, 3);
    assert_int_equal(sched_add(&e.sched, &r1), 0);
    run_to_idle(&e);
    kv_cache_evict(&e.sched.cache, CACHE_TIER_DEVICE, 17);
    const char *agents[1] = {"coder"};
    float prob[1] = {0.9f};
    assert_int_equal(sched_predict(&e.sched, "w1", "planner", 1, 1, agents, prob, &err), 0);
    make_req(&r2, "r2", "w2", "tester", 2000, 2 * BS + 1, 8);
    assert_int_equal(sched_add(&e.sched, &r2), 0);
    run_to_idle(&e);
    make_req(&r3, "r3", "w1", "coder", 1000, 3 * BS + 1, 8);
    assert_int_equal(sched_add(&e.sched, &r3), 0);
    run_to_idle(&e);
    memcpy(out->out2, r2.tokens + r2.n_prompt, sizeof out->out2);
    memcpy(out->out3, r3.tokens + r3.n_prompt, sizeof out->out3);
    out->n3_cached = r3.cached_tokens;
    out->prefetched = e.sched.cache.counters.prefetched_blocks;
    out->prefetch_hits = e.sched.cache.counters.prefetch_hit_blocks;
    out->overlapped_ops = e.backend.overlapped_ops;
    out->measured = prefetch_budget_measured(&e.prefetch_budget);
    fprintf(stderr, "S_bw (%s): copy %.2f GB/s, pure-decode forward %.2f ms, block %zu bytes -> %d blocks\n",
            sync_copies ? "inline copies" : "copy thread", e.prefetch_budget.bytes_per_second / 1e9,
            e.prefetch_budget.step_seconds * 1e3, e.prefetch_budget.block_bytes, prefetch_budget_blocks(&e.prefetch_budget));
    sched_request_free(&r1);
    sched_request_free(&r2);
    sched_request_free(&r3);
    engine_free(&e);
}

static void test_engine_tokens_equal_with_and_without_copy_thread(void **state) {
    (void)state;
    Run threaded, inline_;
    engine_run(false, &threaded);
    engine_run(true, &inline_);
    assert_true(threaded.has_copier);
    assert_false(inline_.has_copier);
    assert_int_equal(threaded.prefetched, 3);
    assert_int_equal(threaded.prefetch_hits, 3);
    assert_int_equal(threaded.n3_cached, 3 * BS);
    assert_true(threaded.overlapped_ops >= 3); /* the prefetch's LOADs went to the copy thread */
    assert_true(threaded.measured);            /* S_bw came from a measured copy rate and step time */
    assert_int_equal(inline_.prefetched, 3);
    assert_int_equal(inline_.n3_cached, 3 * BS);
    assert_memory_equal(threaded.out2, inline_.out2, sizeof threaded.out2);
    assert_memory_equal(threaded.out3, inline_.out3, sizeof threaded.out3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_does_not_wait_for_copies),
        cmocka_unit_test(test_engine_tokens_equal_with_and_without_copy_thread),
        cmocka_unit_test(test_overlap_timing_report),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
