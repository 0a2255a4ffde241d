/*
 * test_sim_cluster_batch.c — braid sim --instances N with batching instances (sim_cluster_batch.h):
 * two requests share steps (faster together than one after the other, slower than one alone), a
 * step never computes more than --max-batch-tokens, --max-running 1 is one at a time again, a move
 * waits for the lender's and the borrower's loop turns (and fails at the move timeout), blocks reach the
 * router when the step that computed them ends, not before, and --closed-loop holds a workflow's next
 * stage until its previous one finished. As the live coordinator and client: --closed-loop runs as many
 * workflows at once as the trace's client did, each sent when its client is free; a workflow's end (the
 * trace's, or its last answer in the closed loop) clears its affinity; a move is planned by the coordinator's
 * move_plan() at the router's rates; a host tier keeps evicted blocks for later hits.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "sim/sim_cluster.h"
#include "sim/trace.h"

typedef struct {
    double t;
    int prefix;        /* requests with the same prefix share their 4 blocks (0: blocks unique to the request) */
    int prompt_tokens, output_tokens;
    const char *workflow; /* NULL: none */
} Req;

typedef struct {
    double t;
    const char *workflow;
} End;

/* A trace of n requests (request i a call of agents[i]; agents NULL: none) and n_ends workflow ends; prompts hold
 * their full blocks (prompt_tokens / 16 of them). */
static void load_trace_agents(const Req *reqs, const char *const *agents, int n, const End *ends, int n_ends, Trace *t) {
    char path[] = "/tmp/braid_sim_batch_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%.6f,\"id\":\"r%d\",\"workflow\":\"%s\",\"agent\":\"%s\",\"prompt_tokens\":%d,"
                   "\"output_tokens\":%d,\"block_size\":16,\"blocks\":[",
                i, reqs[i].t, i, reqs[i].workflow ? reqs[i].workflow : "", agents ? agents[i] : "", reqs[i].prompt_tokens,
                reqs[i].output_tokens);
        int key = reqs[i].prefix ? reqs[i].prefix : 1000 + i;
        for (int b = 0; b < reqs[i].prompt_tokens / 16; b++) fprintf(f, "%s\"%016llx\"", b ? "," : "", (unsigned long long)(key * 1000 + b + 1));
        fprintf(f, "]}\n");
    }
    for (int e = 0; e < n_ends; e++) fprintf(f, "{\"type\":\"workflow_end\",\"t\":%.6f,\"workflow\":\"%s\"}\n", ends[e].t, ends[e].workflow);
    fclose(f);
    BraidError err;
    if (trace_load(path, t, &err)) fail_msg("%s", err.msg);
    unlink(path);
}

static void load_trace_ends(const Req *reqs, int n, const End *ends, int n_ends, Trace *t) { load_trace_agents(reqs, NULL, n, ends, n_ends, t); }

static void load_trace(const Req *reqs, int n, Trace *t) { load_trace_ends(reqs, n, NULL, 0, t); }

static SimClusterConfig config(int instances, SimRoute route) {
    SimClusterConfig cfg = sim_cluster_config_default();
    cfg.n_instances = instances;
    cfg.kv_tokens = 4096;
    cfg.route = route;
    return cfg;
}

static void run_agents(const Req *reqs, const char *const *agents, int n, const End *ends, int n_ends, const SimClusterConfig *cfg,
                       SimClusterResult *r) {
    Trace t;
    load_trace_agents(reqs, agents, n, ends, n_ends, &t);
    BraidError err;
    if (sim_cluster_run(&t, cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->requests, n);
    assert_true(r->local_tokens + r->remote_tokens + r->computed_tokens == r->prompt_tokens);
    trace_free(&t);
}

static void run_ends(const Req *reqs, int n, const End *ends, int n_ends, const SimClusterConfig *cfg, SimClusterResult *r) {
    run_agents(reqs, NULL, n, ends, n_ends, cfg, r);
}

static void run(const Req *reqs, int n, const SimClusterConfig *cfg, SimClusterResult *r) { run_ends(reqs, n, NULL, 0, cfg, r); }

/* One request alone: a prefill step (step + 65 tokens), then 15 decode steps of one sequence
 * (decode_s_per_token each). Two at once: one step prefills both, and each decode step carries both
 * for one step's fixed cost. Together: less than twice the time alone, more than once. */
static void test_two_requests_share_steps(void **state) {
    (void)state;
    SimClusterConfig cfg = config(1, SIM_ROUTE_CACHE);
    Req one[] = {{0.0, 1, 65, 16, NULL}}, two[] = {{0.0, 1, 65, 16, NULL}, {0.0, 2, 65, 16, NULL}};
    SimClusterResult alone, both, fifo;
    run(one, 1, &cfg, &alone);
    double expect = cfg.step_s + 65 * cfg.prefill_s_per_token + 15 * cfg.decode_s_per_token;
    assert_true(fabs(alone.span_s - expect) < 1e-9);
    assert_true(fabs(alone.mean_ttft_s - (cfg.step_s + 65 * cfg.prefill_s_per_token)) < 1e-9);
    run(two, 2, &cfg, &both);
    assert_true(both.span_s > alone.span_s * 1.05);
    assert_true(both.span_s < alone.span_s * 1.9);
    assert_true(fabs(both.p99_latency_s - both.p50_latency_s) < 1e-9); /* they finish in the same step */
    /* The one-at-a-time replay: the second waits for the first. */
    cfg.replay = SIM_REPLAY_FIFO;
    run(two, 2, &cfg, &fifo);
    assert_true(fifo.span_s > both.span_s);
}

/* A 1000-token prompt with 256-token steps: 4 steps (256, 256, 256, 232), never more than 256. */
static void test_step_budget(void **state) {
    (void)state;
    SimClusterConfig cfg = config(1, SIM_ROUTE_CACHE);
    cfg.lender_step_tokens = 256;
    Req reqs[] = {{0.0, 0, 1000, 1, NULL}, {0.05, 0, 600, 4, NULL}};
    SimClusterResult r;
    run(reqs, 1, &cfg, &r);
    assert_int_equal(r.steps, 4);
    assert_int_equal(r.max_step_tokens, 256);
    assert_true(fabs(r.mean_ttft_s - (4 * cfg.step_s + 1000 * cfg.prefill_s_per_token)) < 1e-9);
    run(reqs, 2, &cfg, &r); /* the second joins the first's chunks: still at most 256 a step */
    assert_int_equal(r.max_step_tokens, 256);
    assert_true(r.steps >= (1000 + 600 + 255) / 256);
}

/* --max-running 1: a second sequence waits for the first to finish (one at a time again). */
static void test_max_running(void **state) {
    (void)state;
    SimClusterConfig cfg = config(1, SIM_ROUTE_CACHE);
    Req one[] = {{0.0, 1, 65, 8, NULL}}, three[] = {{0.0, 1, 65, 8, NULL}, {0.0, 2, 65, 8, NULL}, {0.0, 3, 65, 8, NULL}};
    SimClusterResult alone, r;
    run(one, 1, &cfg, &alone);
    cfg.max_running = 1;
    run(three, 3, &cfg, &r);
    assert_true(fabs(r.span_s - 3 * alone.span_s) < 1e-9);
    cfg.max_running = 64; /* the prefills add up, the decodes share steps */
    run(three, 3, &cfg, &r);
    assert_true(r.span_s < 0.9 * 3 * alone.span_s);
}

/* Round-robin: A (prefix 1) runs on instance 0 and is done; C and D, long and unique, keep both
 * instances busy; B (prefix 1) goes to instance 1 while it is in C's prefill step and instance 0 in
 * D's. Each side acts between its steps, as the leaders do: instance 1 asks when C's step ends, instance 0
 * answers when D's ends, then the blocks come over and land; with a move timeout (counted from the ask)
 * shorter than the lender's wait the move fails and the prefix is computed. */
static void test_move_waits_for_the_lenders_step(void **state) {
    (void)state;
    SimClusterConfig cfg = config(2, SIM_ROUTE_ROUND_ROBIN);
    Req reqs[] = {{0.0, 1, 65, 1, NULL}, {0.2, 0, 400, 1, NULL}, {0.21, 0, 400, 1, NULL}, {0.3, 1, 65, 1, NULL}};
    SimClusterResult r;
    run(reqs, 4, &cfg, &r);
    double d_end = 0.21 + cfg.step_s + 400 * cfg.prefill_s_per_token;
    double transfer = 64 * cfg.kv_bytes_per_token / cfg.link_bytes_per_s + cfg.link_latency_s;
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.moved_blocks, 4);
    assert_int_equal(r.remote_tokens, 64);
    assert_int_equal(r.move_failures, 0);
    assert_true(fabs(r.mean_move_s - (d_end - 0.3 + transfer) / 4) < 1e-9);
    /* The borrower is in C's step when B arrives: it asks (and the timeout starts) when that step ends. */
    double c_end = 0.2 + cfg.step_s + 400 * cfg.prefill_s_per_token;
    cfg.move_timeout_s = 0.5; /* past from B's arrival, not from the ask: it lands */
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.move_failures, 0);
    cfg.move_timeout_s = 0.005; /* the lender answers after the ask's deadline: the move fails then */
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 0);
    assert_int_equal(r.move_failures, 1);
    assert_int_equal(r.remote_tokens, 0);
    assert_true(fabs(r.mean_move_s - (c_end + 0.005 - 0.3) / 4) < 1e-9);
    cfg.moves = false;
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves + r.move_failures, 0);
}

/* The cache router sees a prefix when the step that computed it ends: a repeat arriving during that
 * step finds nothing cached anywhere (routed by load, to the idle instance), one after it finds it. */
static void test_blocks_reach_the_router_at_commit(void **state) {
    (void)state;
    SimClusterConfig cfg = config(2, SIM_ROUTE_CACHE);
    cfg.moves = false;
    Req during[] = {{0.0, 1, 65, 1, NULL}, {0.05, 1, 65, 1, NULL}}, after[] = {{0.0, 1, 65, 1, NULL}, {0.5, 1, 65, 1, NULL}};
    SimClusterResult r;
    run(during, 2, &cfg, &r);
    assert_int_equal(r.local_tokens, 0);
    assert_true(r.max_share < 0.6); /* one each */
    run(after, 2, &cfg, &r);
    assert_int_equal(r.local_tokens, 64);
    assert_true(r.max_share > 0.9);
}

/* --closed-loop: a workflow's second call, recorded at a time when the replay has not finished its first,
 * is sent when the first finishes (and finds its prefix there: 64 tokens); open loop it is sent at its
 * trace time and shares the first's steps (an earlier end). A call of another workflow is not held. */
static void test_closed_loop(void **state) {
    (void)state;
    SimClusterConfig cfg = config(2, SIM_ROUTE_CACHE);
    cfg.moves = false;
    Req reqs[] = {{0.0, 1, 65, 4, "w"}, {0.15, 1, 65, 4, "w"}, {0.15, 2, 65, 1, "v"}}; /* 0.15: past a stage's 0.1 s */
    SimClusterResult open, closed;
    run(reqs, 2, &cfg, &open);
    cfg.closed_loop = true;
    run(reqs, 2, &cfg, &closed);
    assert_int_equal(closed.local_tokens, 64);
    double first = cfg.step_s + 65 * cfg.prefill_s_per_token + 3 * cfg.decode_s_per_token;
    assert_true(fabs(closed.span_s - (first + cfg.step_s + cfg.prefill_s_per_token + 3 * cfg.decode_s_per_token)) < 1e-9);
    assert_true(open.span_s < closed.span_s - 0.01);
    cfg.closed_loop_clients = 2; /* v's call goes at once, on the idle instance */
    run(reqs, 3, &cfg, &closed);
    assert_true(closed.max_share < 0.7);
}

/* --closed-loop as braid-bench run's client: workflow a (two calls) and b (one call), recorded by one
 * client (b's first call came after a's last one). Each call alone takes `one`; the replay sends a's second
 * call when its first answers (not at its trace time, 5 s later) and b's when a has ended: 3 x one. With
 * two clients b runs beside a: 2 x one. */
static void test_closed_loop_clients(void **state) {
    (void)state;
    SimClusterConfig cfg = config(2, SIM_ROUTE_CACHE);
    cfg.moves = false;
    cfg.closed_loop = true;
    Req reqs[] = {{0.0, 1, 65, 4, "a"}, {5.0, 2, 65, 4, "a"}, {10.0, 3, 65, 4, "b"}};
    double one = cfg.step_s + 65 * cfg.prefill_s_per_token + 3 * cfg.decode_s_per_token;
    SimClusterResult r;
    run(reqs, 3, &cfg, &r);
    assert_true(fabs(r.span_s - 3 * one) < 1e-9);
    assert_true(fabs(r.mean_latency_s - one) < 1e-9); /* each sent when its client was free: no queue */
    cfg.closed_loop_clients = 2;
    run(reqs, 3, &cfg, &r);
    assert_true(fabs(r.span_s - 2 * one) < 1e-9);
    /* The trace's workflow end says when the client moved on: b started before a ended, two clients. */
    cfg.closed_loop_clients = 0;
    End ends[] = {{11.0, "a"}, {12.0, "b"}};
    run_ends(reqs, 3, ends, 2, &cfg, &r);
    assert_true(fabs(r.span_s - 2 * one) < 1e-9);
}

/* A workflow's end clears its affinity, as the coordinator's POST /v1/workflows/{id}/end does. The cache
 * router, unique prompts: x to instance 0, w to instance 1 (less loaded), y to 0 (tie: the lower index);
 * all done, w's next call goes back to instance 1 by affinity (shares 2 / 4), unless w's end came first:
 * then the tie goes to instance 0 (3 / 4). (In the closed loop the end is w's last answer in the replay.) */
static void test_workflow_end_clears_affinity(void **state) {
    (void)state;
    SimClusterConfig cfg = config(2, SIM_ROUTE_CACHE);
    cfg.moves = false;
    Req reqs[] = {{0.0, 0, 65, 1, "x"}, {0.001, 0, 65, 1, "w"}, {0.002, 0, 65, 1, "y"}, {2.0, 0, 65, 1, "w"}};
    End ends[] = {{1.5, "w"}};
    SimClusterResult r;
    run(reqs, 4, &cfg, &r);
    assert_true(fabs(r.max_share - 0.5) < 1e-9);
    run_ends(reqs, 4, ends, 1, &cfg, &r);
    assert_true(fabs(r.max_share - 0.75) < 1e-9);
}

/* The move is planned as the coordinator plans it (move_plan.h), at the router's rates (serve's
 * --move-gbps): a link the router takes for 1 kB/s makes recomputing cheaper, so no move, however fast
 * the replay's own link. */
static void test_move_planned_at_the_routers_rates(void **state) {
    (void)state;
    SimClusterConfig cfg = config(2, SIM_ROUTE_ROUND_ROBIN);
    Req reqs[] = {{0.0, 1, 65, 1, NULL}, {0.5, 1, 65, 1, NULL}};
    SimClusterResult r;
    run(reqs, 2, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.remote_tokens, 64);
    cfg.router_link_bytes_per_s = 1e3;
    run(reqs, 2, &cfg, &r);
    assert_int_equal(r.moves + r.move_failures, 0);
    assert_int_equal(r.remote_tokens, 0);
}

/* A host tier (serve's): a prefix pushed out of a 128-token device cache by a longer prompt is still a
 * hit from the host when it comes again; without one it is computed again. */
static void test_host_tier(void **state) {
    (void)state;
    SimClusterConfig cfg = config(1, SIM_ROUTE_CACHE);
    cfg.kv_tokens = 128;
    Req reqs[] = {{0.0, 1, 65, 1, NULL}, {1.0, 2, 113, 1, NULL}, {2.0, 1, 65, 1, NULL}};
    SimClusterResult r;
    run(reqs, 3, &cfg, &r);
    assert_int_equal(r.local_tokens, 0);
    cfg.host_kv_tokens = 1024;
    run(reqs, 3, &cfg, &r);
    assert_int_equal(r.local_tokens, 64);
    cfg.replay = SIM_REPLAY_FIFO; /* the one-at-a-time replay has none */
    Trace t;
    load_trace(reqs, 3, &t);
    BraidError err;
    assert_int_not_equal(sim_cluster_run(&t, &cfg, &r, &err), 0);
    trace_free(&t);
}

/* --policy in the batch replay: each instance's scheduler runs the named policy, and a workflow's end
 * (the client's, as the trace says) reaches every instance's cache. In 9 blocks, a and b hold 4 each
 * and c needs 5: LRU evicts a's (the least recent), pbkv b's (its workflow ended: retired cache), so
 * a's call that comes back hits under pbkv only. */
static void test_policy_hears_workflow_ends(void **state) {
    (void)state;
    SimClusterConfig cfg = config(1, SIM_ROUTE_CACHE);
    cfg.kv_tokens = 144;
    Req reqs[] = {{0.0, 1, 65, 1, "a"}, {1.0, 2, 65, 1, "b"}, {2.0, 3, 65, 1, "c"}, {3.0, 1, 65, 1, "a"}};
    End ends[] = {{1.5, "b"}};
    SimClusterResult r;
    run_ends(reqs, 4, ends, 1, &cfg, &r);
    assert_int_equal(r.local_tokens, 0);
    cfg.policy = &evict_policy_pbkv;
    run_ends(reqs, 4, ends, 1, &cfg, &r);
    assert_int_equal(r.local_tokens, 64);
    run(reqs, 4, &cfg, &r); /* no end: b is as active as a, and the older goes */
    assert_int_equal(r.local_tokens, 0);
}

/* A policy that takes predictions gets each call's forecast at dispatch (an online Markov-1 predictor
 * here): w0 taught it that p's next call is p again, so a's prefix (read by p) is worth more than b's
 * (read by z, which predicts nothing) when c needs room, and a's next call hits; without forecasts
 * (LRU, or pbkv that never hears one) a's, the older, goes. w0's ended blocks go first in both. */
static void test_policy_gets_forecasts_at_dispatch(void **state) {
    (void)state;
    SimClusterConfig cfg = config(1, SIM_ROUTE_CACHE);
    cfg.kv_tokens = 176; /* 11 blocks */
    Req reqs[] = {{0.0, 10, 17, 1, "w0"}, {1.0, 11, 17, 1, "w0"}, {2.0, 1, 65, 1, "a"},
                  {3.0, 2, 65, 1, "b"}, {4.0, 3, 65, 1, "c"}, {5.0, 1, 65, 1, "a"}};
    const char *const agents[] = {"p", "p", "p", "z", "z", "p"};
    End ends[] = {{1.5, "w0"}};
    SimClusterResult r;
    run_agents(reqs, agents, 6, ends, 1, &cfg, &r);
    assert_int_equal(r.local_tokens, 0);
    cfg.policy = &evict_policy_pbkv;
    run_agents(reqs, agents, 6, ends, 1, &cfg, &r);
    assert_int_equal(r.local_tokens, 64);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_requests_share_steps),
        cmocka_unit_test(test_step_budget),
        cmocka_unit_test(test_max_running),
        cmocka_unit_test(test_move_waits_for_the_lenders_step),
        cmocka_unit_test(test_blocks_reach_the_router_at_commit),
        cmocka_unit_test(test_closed_loop),
        cmocka_unit_test(test_closed_loop_clients),
        cmocka_unit_test(test_workflow_end_clears_affinity),
        cmocka_unit_test(test_move_planned_at_the_routers_rates),
        cmocka_unit_test(test_host_tier),
        cmocka_unit_test(test_policy_hears_workflow_ends),
        cmocka_unit_test(test_policy_gets_forecasts_at_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
