/*
 * braid sim --lora-cache shared (ForkKV's shared base cache, paper 002 § 5.1–5.2) on hand-built
 * traces written by the real trace writer (with token ids):
 *   - a second adapter on the same context inherits the base blocks (fork tokens) in shared mode,
 *     while separate mode misses; its forward still computes the whole residual range;
 *   - decoupled eviction: a tiny residual pool loses residuals while the base stays (a fork on the
 *     return), and a tiny base pool loses base blocks while the residual stays (a partial hit);
 *   - accounting: every pool passes kv_cache_check after every request and at the end, nothing is
 *     left in use, and the counters add up (b = hit + fork, r = hit + partial);
 *   - the memory figures: 23040 and 1920 bytes a token for SmolLM2-135M at rank 16, and shared
 *     mode's per-adapter residual bytes are 1/12 of separate mode's per-adapter bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim/simulator.h"
#include "sim/trace.h"
#include "sim/trace_writer.h"

enum { BS = 16, CONTEXT_BLOCKS = 4, PROMPT = CONTEXT_BLOCKS * BS + 1 };

typedef struct {
    int context;         /* which shared context the prompt opens with */
    const char *adapter; /* "" = the base model */
} Call;

/* Prompts: CONTEXT_BLOCKS full blocks of context `context`, then one token of the call's own. */
static void write_calls(const char *path, const Call *calls, int n, bool with_tokens) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        int32_t prompt[PROMPT];
        for (int k = 0; k < PROMPT - 1; k++) prompt[k] = 1000 * (calls[i].context + 1) + k;
        prompt[PROMPT - 1] = 90000 + i;
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        TraceRecord rec = {.seq = i, .t = i, .id = id, .workflow = "w", .agent = calls[i].adapter, .tenant = "acme",
                           .adapter = calls[i].adapter, .prompt = prompt, .prompt_tokens = PROMPT, .output_tokens = 0,
                           .block_size = BS, .with_tokens = with_tokens};
        assert_int_equal(trace_write_request(f, &rec), 0);
    }
    assert_int_equal(fclose(f), 0);
}

/* Replays calls with the pools checked after every request; fails the test on an error. */
/* The calls as a loaded trace (the file is gone again). */
static void load_calls(const Call *calls, int n, bool with_tokens, Trace *t) {
    char path[] = "/tmp/braid_forkkv_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_calls(path, calls, n, with_tokens);
    BraidError err;
    if (trace_load(path, t, &err)) fail_msg("%s", err.msg);
    unlink(path);
}

static void replay(const Call *calls, int n, SimLoraCache mode, int kv_tokens, int residual_tokens, SimResult *r) {
    Trace t;
    BraidError err;
    load_calls(calls, n, true, &t);
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = kv_tokens;
    cfg.lora_cache = mode;
    cfg.residual_tokens = residual_tokens;
    cfg.check_invariants = true;
    if (sim_run(&t, &cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->requests, n);
    assert_int_equal(r->invariant_checks, n + 1); /* after each request and at the end */
    assert_int_equal(r->too_large, 0);
    sim_result_free(r); /* the scalar results stay */
    trace_free(&t);
}

/* For adapted requests in shared mode: b = hit + fork, r = hit + partial, computed = prompt - hit. */
static void assert_counters_add_up(const SimResult *r) {
    assert_int_equal(r->base_hit_tokens, r->cached_tokens + r->fork_tokens);
    assert_int_equal(r->residual_hit_tokens, r->cached_tokens + r->partial_tokens);
    assert_int_equal(r->computed_tokens, r->prompt_tokens - r->cached_tokens);
}

static void test_second_adapter_forks_the_base(void **state) {
    (void)state;
    /* A, then B on the same context, then A again. */
    const Call calls[] = {{0, "lora-a"}, {0, "lora-b"}, {0, "lora-a"}};
    SimResult sep, shared;
    replay(calls, 3, SIM_LORA_SEPARATE, 100 * BS, 0, &sep);
    replay(calls, 3, SIM_LORA_SHARED, 100 * BS, 0, &shared);
    /* separate: B misses everything; only A's return hits */
    assert_int_equal(sep.base_hit_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(sep.cached_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(sep.fork_tokens, 0);
    /* shared: B inherits A's base blocks (a fork: its residual is computed), A's return hits both */
    assert_int_equal(shared.base_hit_tokens, 2 * CONTEXT_BLOCKS * BS);
    assert_int_equal(shared.residual_hit_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(shared.fork_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(shared.partial_tokens, 0);
    assert_counters_add_up(&shared);
    /* A fork runs the forward over its whole residual range: modeled prefill as in separate mode. */
    assert_int_equal(shared.computed_tokens, sep.computed_tokens);
    assert_true(shared.modeled_latency_s == sep.modeled_latency_s);
    /* Memory: one copy of the context's base blocks instead of one per adapter. At its peak (B's
     * admission) separate mode holds A's and B's context and B's partial last block; shared mode
     * holds the context once and B's partial block, and both adapters' residuals beside it. */
    assert_int_equal(sep.peaks.base_blocks, 2 * CONTEXT_BLOCKS + 1);
    assert_int_equal(shared.peaks.base_blocks, CONTEXT_BLOCKS + 1);
    assert_int_equal(shared.peaks.residual_blocks, 2 * CONTEXT_BLOCKS + 1);
    /* A base request (no adapter) in shared mode reads the same base blocks and holds no residual. */
    const Call with_base[] = {{0, "lora-a"}, {0, ""}};
    replay(with_base, 2, SIM_LORA_SHARED, 100 * BS, 0, &shared);
    assert_int_equal(shared.base_hit_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(shared.cached_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(shared.residual_hit_tokens, 0);
    assert_int_equal(shared.adapter_blocks_inserted, CONTEXT_BLOCKS);
}

static void test_tiny_residual_pool_keeps_the_base(void **state) {
    (void)state;
    /* Residual pool of one request's blocks: B's residual evicts A's; the base pool holds both. */
    const Call calls[] = {{0, "lora-a"}, {0, "lora-b"}, {0, "lora-a"}};
    SimResult r;
    replay(calls, 3, SIM_LORA_SHARED, 100 * BS, (CONTEXT_BLOCKS + 1) * BS, &r);
    assert_true(r.residual_evicted_blocks >= CONTEXT_BLOCKS);
    assert_int_equal(r.evicted_blocks, 0);
    /* A's return: base hit, residual recomputed (a fork again); B's first call forked too. */
    assert_int_equal(r.base_hit_tokens, 2 * CONTEXT_BLOCKS * BS);
    assert_int_equal(r.residual_hit_tokens, 0);
    assert_int_equal(r.fork_tokens, 2 * CONTEXT_BLOCKS * BS);
    assert_int_equal(r.cached_tokens, 0);
    assert_counters_add_up(&r);
}

static void test_tiny_base_pool_gives_partial_hits(void **state) {
    (void)state;
    /* Base pool of one request's blocks: A on context 1 evicts context 0's base blocks, while the
     * roomy residual pool keeps A's context-0 residual; A back on context 0 reuses it (partial hit)
     * and recomputes the base. */
    const Call calls[] = {{0, "lora-a"}, {1, "lora-a"}, {0, "lora-a"}};
    SimResult r;
    replay(calls, 3, SIM_LORA_SHARED, (CONTEXT_BLOCKS + 1) * BS, 100 * BS, &r);
    assert_true(r.evicted_blocks >= CONTEXT_BLOCKS);
    assert_int_equal(r.residual_evicted_blocks, 0);
    assert_int_equal(r.base_hit_tokens, 0);
    assert_int_equal(r.residual_hit_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(r.partial_tokens, CONTEXT_BLOCKS * BS);
    assert_int_equal(r.cached_tokens, 0);
    assert_counters_add_up(&r);
    /* The same trace in separate mode: the evicted blocks are simply gone. */
    SimResult sep;
    replay(calls, 3, SIM_LORA_SEPARATE, (CONTEXT_BLOCKS + 1) * BS, 0, &sep);
    assert_int_equal(sep.cached_tokens, 0);
    assert_int_equal(sep.partial_tokens, 0);
}

static void test_memory_figures(void **state) {
    (void)state;
    const Call calls[] = {{0, "lora-a"}, {0, "lora-b"}, {1, "lora-c"}, {0, "lora-b"}, {1, "lora-a"}};
    SimResult sep, shared;
    replay(calls, 5, SIM_LORA_SEPARATE, 1000 * BS, 0, &sep);
    replay(calls, 5, SIM_LORA_SHARED, 1000 * BS, 0, &shared);
    assert_true(shared.peaks.base_bytes_per_token == 23040.0);
    assert_true(shared.peaks.residual_bytes_per_token == 1920.0);
    assert_int_equal(shared.adapters, 3);
    /* With a cache that never evicts, each adapter's own tree keeps the same blocks in both modes,
     * so the measured per-adapter bytes ratio is the computed kv_dim / rank. */
    assert_int_equal(sep.evicted_blocks + shared.evicted_blocks + shared.residual_evicted_blocks, 0);
    assert_true(sep.adapter_blocks_inserted > 0);
    assert_int_equal(sep.adapter_blocks_inserted, shared.adapter_blocks_inserted);
    double sep_bytes = (double)sep.adapter_blocks_inserted * BS * sep.peaks.base_bytes_per_token;
    double shared_bytes = (double)shared.adapter_blocks_inserted * BS * shared.peaks.residual_bytes_per_token;
    assert_true(sep_bytes / shared_bytes == 12.0);
    /* The peak of both pools together is below separate mode's. */
    assert_true(shared.peaks.kv_bytes < sep.peaks.kv_bytes);
}

static void test_shared_mode_needs_token_ids(void **state) {
    (void)state;
    const Call calls[] = {{0, "lora-a"}};
    Trace t;
    load_calls(calls, 1, false, &t);
    BraidError err;
    SimConfig cfg = sim_config_default();
    cfg.lora_cache = SIM_LORA_SHARED;
    SimResult r;
    assert_int_equal(sim_run(&t, &cfg, &r, &err), -1);
    assert_non_null(strstr(err.msg, "r0 has no \"tokens\""));
    sim_result_free(&r);
    cfg.segment_reuse = 1;
    assert_int_equal(sim_run(&t, &cfg, &r, &err), -1);
    assert_non_null(strstr(err.msg, "segment reuse"));
    sim_result_free(&r);
    trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_adapter_forks_the_base),
        cmocka_unit_test(test_tiny_residual_pool_keeps_the_base),
        cmocka_unit_test(test_tiny_base_pool_gives_partial_hits),
        cmocka_unit_test(test_memory_figures),
        cmocka_unit_test(test_shared_mode_needs_token_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
