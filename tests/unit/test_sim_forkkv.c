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
 *     mode's per-adapter residual bytes are 1/12 of separate mode's per-adapter bytes;
 *   - ResidualAttention's time (--residual-attention): forked requests, and only they, pay exactly
 *     the cost model's penalty on their modeled latency (prefill part; decode part with outputs);
 *   - auto mode: with sharing free it keeps the first copies separate (no regret yet), then forks
 *     once separate copies thrash, computing fewer tokens than separate mode; with sharing priced
 *     out it keeps every request separate and replays exactly as separate mode.
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

#include "sim/simulator.h"
#include "sim/trace.h"
#include "sim/trace_writer.h"

/* cmocka of this distribution has no assert_double_equal */
#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

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

/* Replays calls with cfg (check_invariants set here). */
static void replay_with(const Call *calls, int n, SimConfig cfg, SimResult *r) {
    Trace t;
    BraidError err;
    load_calls(calls, n, true, &t);
    cfg.check_invariants = true;
    if (sim_run(&t, &cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->requests, n);
    assert_int_equal(r->invariant_checks, n + 1); /* after each request and at the end */
    assert_int_equal(r->too_large, 0);
    sim_result_free(r); /* the scalar results stay */
    trace_free(&t);
}

static void replay(const Call *calls, int n, SimLoraCache mode, int kv_tokens, int residual_tokens, SimResult *r) {
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = kv_tokens;
    cfg.lora_cache = mode;
    cfg.residual_tokens = residual_tokens;
    replay_with(calls, n, cfg, r);
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

static void test_residual_attention_is_charged_to_forks(void **state) {
    (void)state;
    const Call calls[] = {{0, "lora-a"}, {0, "lora-b"}, {0, ""}, {0, "lora-a"}};
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = 100 * BS;
    cfg.lora_cache = SIM_LORA_SHARED;
    SimResult free_attn, cpu_attn;
    replay_with(calls, 4, cfg, &free_attn);
    assert_int_equal(sim_fork_attention_parse("cpu", &cfg.fork_attention), 0);
    replay_with(calls, 4, cfg, &cpu_attn);
    /* The same cache behaviour; three adapted requests forked, the base-model one did not. */
    assert_int_equal(cpu_attn.computed_tokens, free_attn.computed_tokens);
    assert_int_equal(cpu_attn.forked_requests, 3);
    assert_near(free_attn.fork_attention_s, 0.0, 0.0);
    /* Computed prompt tokens: a 65 (all new), b 1 (the base forked, but its residual range is
     * computed: fork tokens count as computed, so 65), a again 1. Prefill penalty per request:
     * 30 layers x (1.58 - 1) x 50.6 ns x c x (65 - c / 2); no outputs, no decode part. */
    double want = 0;
    const int computed[] = {PROMPT, PROMPT, 1};
    for (int i = 0; i < 3; i++) want += 30 * 0.58 * 50.6e-9 * computed[i] * (PROMPT - computed[i] / 2.0);
    assert_near(cpu_attn.fork_attention_s, want, 1e-12);
    assert_near(cpu_attn.modeled_latency_s - free_attn.modeled_latency_s, want, 1e-9);
    /* Separate mode forks nothing and pays nothing, whatever the setting. */
    cfg.lora_cache = SIM_LORA_SEPARATE;
    SimResult sep;
    replay_with(calls, 4, cfg, &sep);
    assert_int_equal(sep.forked_requests, 0);
    assert_near(sep.fork_attention_s, 0.0, 0.0);
    /* Decode part: m outputs over n context cost 30 x (rho_d - 1) x 72.2 ns x m x (n + m / 2). */
    SimForkAttention a;
    assert_int_equal(sim_fork_attention_parse("2:1", &a), 0);
    assert_near(sim_fork_attention_s(&a, 1000, 0, 100), 30 * 1.0 * 72.2e-9 * 100 * 1050, 1e-12);
    assert_int_equal(sim_fork_attention_parse("none", &a), 0);
    assert_near(sim_fork_attention_s(&a, 1000, 1000, 100), 0.0, 0.0);
    assert_int_equal(sim_fork_attention_parse("2:", &a), -1);
    assert_int_equal(sim_fork_attention_parse("-1:2", &a), -1);
}

/* Four adapters cycle over one context, four rounds, in a pool that holds two separate copies. */
static void test_auto_forks_when_copies_thrash(void **state) {
    (void)state;
    enum { ROUNDS = 4, ADAPTERS = 4 };
    const char *names[ADAPTERS] = {"lora-a", "lora-b", "lora-c", "lora-d"};
    Call calls[ROUNDS * ADAPTERS];
    for (int i = 0; i < ROUNDS * ADAPTERS; i++) calls[i] = (Call){0, names[i % ADAPTERS]};
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = 2 * (CONTEXT_BLOCKS + 1) * BS;
    cfg.residual_tokens = 100 * BS;
    cfg.lora_cache = SIM_LORA_SEPARATE;
    SimResult sep, auto_free, auto_priced;
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &sep);
    assert_int_equal(sep.cached_tokens, 0); /* LRU over a cycle of four copies in room for two */
    cfg.lora_cache = SIM_LORA_AUTO;
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &auto_free);
    /* No regret before the first copies are evicted: the first round runs separate; then it forks. */
    assert_true(auto_free.separate_adapted_requests >= ADAPTERS);
    assert_true(auto_free.forked_requests > 0);
    assert_int_equal(auto_free.forked_requests + auto_free.separate_adapted_requests, ROUNDS * ADAPTERS);
    assert_true(auto_free.computed_tokens < sep.computed_tokens);
    assert_true(auto_free.modeled_latency_s < sep.modeled_latency_s);
    /* Sharing priced out (ResidualAttention 1e7x: above any saving here even for a one-token prefill,
     * since these calls decode nothing): every request separate, as separate mode. */
    assert_int_equal(sim_fork_attention_parse("1e7:1e7", &cfg.fork_attention), 0);
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &auto_priced);
    assert_int_equal(auto_priced.forked_requests, 0);
    assert_int_equal(auto_priced.separate_adapted_requests, ROUNDS * ADAPTERS);
    assert_int_equal(auto_priced.computed_tokens, sep.computed_tokens);
    assert_near(auto_priced.modeled_latency_s, sep.modeled_latency_s, 1e-9);
}

/* --residual-pool unified (issue 36): the residuals live in the base pool's blocks, so the pools
 * never hold more than kv_tokens' bytes, the invariants (no carrier leaked, every residual's base
 * held: sim_pools_check) hold after every request, and auto with sharing priced out is separate
 * mode exactly at the same kv_tokens: no memory is held back for residuals. */
static void test_unified_pool(void **state) {
    (void)state;
    enum { ROUNDS = 4, ADAPTERS = 4 };
    const char *names[ADAPTERS] = {"lora-a", "lora-b", "lora-c", "lora-d"};
    Call calls[ROUNDS * ADAPTERS];
    for (int i = 0; i < ROUNDS * ADAPTERS; i++) calls[i] = (Call){i % 3 == 2, names[i % ADAPTERS]};
    SimConfig cfg = sim_config_default();
    /* Room for three of the eight (adapter, context) copies, or both contexts' base and every residual. */
    cfg.kv_tokens = 3 * (CONTEXT_BLOCKS + 1) * BS;
    SimResult sep, shared, auto_priced, auto_free;
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &sep);
    cfg.residual_unified = true;
    cfg.lora_cache = SIM_LORA_SHARED;
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &shared);
    assert_true(shared.peaks.kv_bytes <= (double)cfg.kv_tokens * shared.peaks.base_bytes_per_token);
    assert_true(shared.peaks.residual_blocks > 0);
    assert_true(shared.computed_tokens < sep.computed_tokens); /* the copies that thrashed now share */
    cfg.lora_cache = SIM_LORA_AUTO;
    assert_int_equal(sim_fork_attention_parse("1e7:1e7", &cfg.fork_attention), 0);
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &auto_priced);
    assert_int_equal(auto_priced.forked_requests, 0);
    assert_int_equal(auto_priced.computed_tokens, sep.computed_tokens);
    assert_near(auto_priced.modeled_latency_s, sep.modeled_latency_s, 1e-9);
    cfg.fork_attention = (SimForkAttention){0};
    replay_with(calls, ROUNDS * ADAPTERS, cfg, &auto_free);
    assert_true(auto_free.forked_requests > 0);
    assert_true(auto_free.computed_tokens < sep.computed_tokens);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unified_pool),
        cmocka_unit_test(test_second_adapter_forks_the_base),
        cmocka_unit_test(test_tiny_residual_pool_keeps_the_base),
        cmocka_unit_test(test_tiny_base_pool_gives_partial_hits),
        cmocka_unit_test(test_memory_figures),
        cmocka_unit_test(test_shared_mode_needs_token_ids),
        cmocka_unit_test(test_residual_attention_is_charged_to_forks),
        cmocka_unit_test(test_auto_forks_when_copies_thrash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
