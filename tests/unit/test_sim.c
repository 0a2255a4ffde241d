/*
 * Trace simulator: a cyclic workload where LRU always evicts the prefix needed next (0 hits) while
 * the Belady bound keeps reusing; exact hit accounting for a shared prefix; trace parse errors;
 * workflow-end events, per-workflow critical-path latency and per-agent TTFT; coarser blocks; the
 * per-request timeline rows (braid sim --timeline) add up to the totals; the cluster replay
 * (braid sim --instances): round-robin over 2 instances moves the prefix the other instance holds
 * (and computes it without moves), the cache-aware router keeps it local, prompt tokens by origin
 * add up.
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

#include "sim/sim_cluster.h"
#include "sim/simulator.h"
#include "sim/trace.h"

/* Writes requests whose prompts are 4 full blocks of prefix `pattern[i]` plus one token. */
static void write_trace(const char *path, const int *pattern, int n) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%d.0,\"id\":\"r%d\",\"prompt_tokens\":65,\"output_tokens\":0,"
                   "\"block_size\":16,\"blocks\":[",
                i, i, i);
        for (int b = 0; b < 4; b++) fprintf(f, "%s\"%016llx\"", b ? "," : "", (unsigned long long)(pattern[i] * 1000 + b + 1));
        fprintf(f, "]}\n");
        if (i == 2) fprintf(f, "{\"type\":\"workflow_end\",\"t\":2.5,\"workflow\":\"w\"}\n");
    }
    fclose(f);
}

static void run(const char *path, const char *policy, int kv_tokens, SimResult *r) {
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = kv_tokens;
    cfg.policy = policy;
    if (sim_run(&t, &cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->workflow_ends, 1);
    sim_result_free(r); /* the scalar results stay */
    trace_free(&t);
}

static void test_belady_beats_lru_on_a_cycle(void **state) {
    (void)state;
    char path[] = "/tmp/braid_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int pattern[30];
    for (int i = 0; i < 30; i++) pattern[i] = i % 3; /* A B C A B C … */
    write_trace(path, pattern, 30);
    SimResult lru, belady;
    /* 9 blocks: two cached prefixes (8) and the request's own partial block */
    run(path, "lru", 9 * 16, &lru);
    run(path, "belady", 9 * 16, &belady);
    fprintf(stderr, "sim cycle: lru hit rate %.3f, belady %.3f\n", lru.hit_rate, belady.hit_rate);
    assert_int_equal(lru.requests, 30);
    assert_int_equal(lru.cached_tokens, 0); /* LRU always drops the prefix needed next */
    assert_true(belady.cached_tokens >= 13 * 64);
    assert_true(belady.modeled_latency_s < lru.modeled_latency_s);
    /* with room for all three prefixes both policies hit on every repeat */
    SimResult roomy;
    run(path, "lru", 13 * 16, &roomy);
    assert_int_equal(roomy.cached_tokens, 27 * 64);
    assert_int_equal(roomy.evicted_blocks, 0);
    unlink(path);
}

/* The timeline: one row per request in trace order, arrival times from the trace, and the rows'
 * tokens and latencies add up to the result's totals. */
static void test_timeline_rows(void **state) {
    (void)state;
    char path[] = "/tmp/braid_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int pattern[12];
    for (int i = 0; i < 12; i++) pattern[i] = i % 3;
    write_trace(path, pattern, 12);
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = 13 * 16;
    SimResult r;
    if (sim_run(&t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    assert_null(r.timeline); /* only when asked */
    sim_result_free(&r);
    cfg.timeline = true;
    if (sim_run(&t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.n_timeline, 12);
    uint64_t prompt = 0, cached = 0;
    double latency = 0;
    for (int i = 0; i < 12; i++) {
        const SimRequestRow *row = &r.timeline[i];
        assert_true(row->t == (double)i);
        assert_int_equal(row->prompt_tokens, 65);
        assert_int_equal(row->cached_tokens, i < 3 ? 0 : 64); /* the first of each prefix misses, repeats hit */
        assert_int_equal(row->host_cached_tokens, 0);
        assert_true(row->ttft_s > 0 && row->latency_s >= row->ttft_s);
        prompt += (uint64_t)row->prompt_tokens;
        cached += (uint64_t)row->cached_tokens;
        latency += row->latency_s;
    }
    assert_int_equal(prompt, r.prompt_tokens);
    assert_int_equal(cached, r.cached_tokens);
    assert_true(latency > r.modeled_latency_s - 1e-9 && latency < r.modeled_latency_s + 1e-9);
    sim_result_free(&r);
    assert_null(r.timeline);
    trace_free(&t);
    unlink(path);
}

static void test_parse_errors(void **state) {
    (void)state;
    TraceRequest r;
    int bs = 0;
    BraidError err;
    assert_int_equal(trace_parse_line("{\"type\":\"workflow_end\",\"t\":1}", &r, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "workflow"));
    assert_int_equal(trace_parse_line("{\"type\":\"workflow_end\",\"t\":1.5,\"workflow\":\"w9\"}", &r, &bs, &err),
                     TRACE_LINE_WORKFLOW_END);
    assert_string_equal(r.workflow, "w9");
    trace_request_free(&r);
    assert_int_equal(trace_parse_line("{\"type\":\"pool_occupancy\"}", &r, &bs, &err), TRACE_LINE_SKIP);
    assert_int_equal(trace_parse_line("not json", &r, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "not a JSON object"));
    assert_int_equal(trace_parse_line("{\"type\":\"request\",\"prompt_tokens\":5}", &r, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "needs blocks"));
    assert_int_equal(trace_parse_line("{\"type\":\"request\",\"prompt_tokens\":40,\"output_tokens\":1,\"block_size\":16,"
                                      "\"blocks\":[\"zz\"]}", &r, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "hex"));
    assert_int_equal(trace_parse_line("{\"type\":\"request\",\"prompt_tokens\":20,\"output_tokens\":1,\"block_size\":16,"
                                      "\"blocks\":[\"1\",\"2\"]}", &r, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "more blocks"));
    assert_int_equal(trace_parse_line("{\"type\":\"request\",\"prompt_tokens\":40,\"output_tokens\":1,\"block_size\":16,"
                                      "\"blocks\":[\"ab\",\"cd\"],\"tenant\":\"x\"}", &r, &bs, &err), 1);
    assert_int_equal(r.n_blocks, 2);
    assert_int_equal(r.blocks[1], 0xcd);
    assert_int_equal(bs, 16);
    trace_request_free(&r);
    Trace t;
    assert_int_equal(trace_load("/nonexistent/trace.jsonl", &t, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/trace.jsonl"));
}

/* Workflow w: a planner call at t=0 (40 prompt tokens), then a fan-out of two calls at t=1 (40 and
 * 80 tokens, sharing the first two blocks with the planner's prompt); workflow v: one call. */
static void test_workflows_and_agents(void **state) {
    (void)state;
    char path[] = "/tmp/braid_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    const char *line =
        "{\"type\":\"request\",\"seq\":%d,\"t\":%g,\"workflow\":\"%s\",\"agent\":\"%s\",\"prompt_tokens\":%d,"
        "\"output_tokens\":10,\"block_size\":16,\"blocks\":[%s]}\n";
    fprintf(f, line, 0, 0.0, "w", "planner", 40, "\"a1\",\"a2\"");
    fprintf(f, line, 1, 1.0, "w", "mapper", 40, "\"a1\",\"a2\"");
    fprintf(f, line, 2, 1.0, "w", "mapper", 80, "\"a1\",\"a2\",\"b3\",\"b4\",\"b5\"");
    fprintf(f, line, 3, 0.5, "v", "planner", 40, "\"c1\",\"c2\"");
    fprintf(f, "{\"type\":\"workflow_end\",\"t\":3,\"workflow\":\"w\"}\n");
    fclose(f);
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    SimConfig cfg = sim_config_default();
    cfg.prefill_s_per_token = 0.001;
    cfg.decode_s_per_token = 0.01;
    SimResult r;
    if (sim_run(&t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.workflows, 2);
    assert_int_equal(r.workflow_ends, 1);
    /* w: planner 40 computed + 10 out = 0.14 s; stage 2 = the longer mapper: 80 - 32 cached = 48
     * computed -> 0.148 s (its sibling: 8 computed -> 0.108 s). v: 0.14 s. */
    assert_float_equal(r.mean_workflow_latency_s, (0.14 + 0.148 + 0.14) / 2, 1e-9);
    assert_int_equal(r.n_agents, 2);
    assert_string_equal(r.agents[0].agent, "planner");
    assert_int_equal(r.agents[0].requests, 2);
    assert_float_equal(r.agents[0].mean_ttft_s, 0.040, 1e-9);
    assert_float_equal(r.agents[1].mean_ttft_s, (0.008 + 0.048) / 2, 1e-9);
    sim_result_free(&r);
    /* 32-token blocks: every second chained hash, so the 40-token prompts keep one block. */
    assert_int_equal(trace_coarsen_blocks(&t, 2, &err), 0);
    assert_int_equal(t.block_size, 32);
    assert_int_equal(t.reqs[3].n_blocks, 2); /* sorted by arrival: the 80-token mapper is last */
    assert_true(t.reqs[3].blocks[0] == 0xa2 && t.reqs[3].blocks[1] == 0xb4);
    trace_free(&t);
    unlink(path);
}

static void cluster_run(const char *path, SimRoute route, bool moves, SimClusterResult *r) {
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    SimClusterConfig cfg = sim_cluster_config_default();
    cfg.n_instances = 2;
    cfg.kv_tokens = 1024;
    cfg.route = route;
    cfg.moves = moves;
    if (sim_cluster_run(&t, &cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->requests, 6);
    assert_true(r->local_tokens + r->remote_tokens + r->computed_tokens == r->prompt_tokens);
    trace_free(&t);
}

static void test_cluster_moves(void **state) {
    (void)state;
    char path[] = "/tmp/braid_sim_cluster_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int pattern[] = {1, 1, 1, 1, 1, 1}; /* one 4-block prefix, six times, one request at a time */
    write_trace(path, pattern, 6);
    SimClusterResult rr_moves, rr_off, cache;
    /* Round-robin alternates: the first request on each instance is cold; instance 1's first one
     * takes instance 0's 4 blocks by a move (or computes them). */
    cluster_run(path, SIM_ROUTE_ROUND_ROBIN, true, &rr_moves);
    assert_int_equal(rr_moves.moves, 1);
    assert_int_equal(rr_moves.remote_tokens, 64);
    assert_int_equal(rr_moves.local_tokens, 4 * 64);
    assert_int_equal(rr_moves.computed_tokens, 6 * 65 - 5 * 64);
    cluster_run(path, SIM_ROUTE_ROUND_ROBIN, false, &rr_off);
    assert_int_equal(rr_off.remote_tokens, 0);
    assert_int_equal(rr_off.computed_tokens, 6 * 65 - 4 * 64);
    assert_true(rr_off.mean_latency_s > rr_moves.mean_latency_s);
    /* The cache-aware router sends every repeat to the instance holding the prefix. */
    cluster_run(path, SIM_ROUTE_CACHE, true, &cache);
    assert_int_equal(cache.moves, 0);
    assert_int_equal(cache.local_tokens, 5 * 64);
    /* The cost router (the default): the holder is idle at every repeat, so it keeps them local. */
    SimClusterResult cost;
    cluster_run(path, SIM_ROUTE_COST, true, &cost);
    assert_int_equal(cost.moves, 0);
    assert_int_equal(cost.local_tokens, 5 * 64);
    assert_true(cost.p99_latency_s >= cost.p50_latency_s && cost.p50_latency_s > 0);
    assert_true(cost.mean_ttft_s > 0 && cost.mean_ttft_s <= cost.mean_latency_s);
    assert_int_equal(sim_cluster_config_default().route, SIM_ROUTE_COST);
    assert_int_equal(sim_route_parse("cost"), SIM_ROUTE_COST);
    assert_int_equal(sim_route_parse("nope"), -1);
    unlink(path);
}

/* A lender answers a move between its engine steps: a move from an instance still prefilling waits
 * for the rest of its step, and fails (computed, counted) when that reaches the move timeout. */
static void test_cluster_busy_lender(void **state) {
    (void)state;
    char path[] = "/tmp/braid_sim_lender_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (int i = 0; i < 2; i++) /* the same 4-block prefix at t = 0 and t = 0.01: round-robin puts them apart */
        fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%s,\"id\":\"r%d\",\"prompt_tokens\":65,\"output_tokens\":0,"
                   "\"block_size\":16,\"blocks\":[\"a1\",\"a2\",\"a3\",\"a4\"]}\n", i, i ? "0.01" : "0.0", i);
    fclose(f);
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    SimClusterConfig cfg = sim_cluster_config_default();
    cfg.n_instances = 2;
    cfg.kv_tokens = 1024;
    cfg.route = SIM_ROUTE_ROUND_ROBIN;
    cfg.replay = SIM_REPLAY_FIFO; /* the one-at-a-time replay's lender model (test_cluster_batch_lender: the batching one's) */
    SimClusterResult r;
    if (sim_cluster_run(&t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    /* Instance 0 prefills 65 tokens until 0.1625 s: the move waits until then, then lands. */
    double wait = 65 * cfg.prefill_s_per_token - 0.01, transfer = 64 * cfg.kv_bytes_per_token / cfg.link_bytes_per_s + cfg.link_latency_s;
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.move_failures, 0);
    assert_int_equal(r.remote_tokens, 64);
    assert_true(fabs(r.mean_move_s - (wait + transfer) / 2) < 1e-9);
    cfg.move_timeout_s = 0.1; /* the lender's step outlasts the timeout: the move fails, the prefix is computed */
    if (sim_cluster_run(&t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.moves, 0);
    assert_int_equal(r.move_failures, 1);
    assert_int_equal(r.remote_tokens, 0);
    assert_int_equal(r.computed_tokens, 2 * 65);
    assert_true(fabs(r.mean_move_s - 0.1 / 2) < 1e-9);
    cfg.lender_step_tokens = 0; /* a lender that answers at once (the old model): it lands */
    if (sim_cluster_run(&t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.move_failures, 0);
    trace_free(&t);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_busy_lender),
        cmocka_unit_test(test_belady_beats_lru_on_a_cycle),
        cmocka_unit_test(test_timeline_rows),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_workflows_and_agents),
        cmocka_unit_test(test_cluster_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
