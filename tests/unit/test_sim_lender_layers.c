/*
 * test_sim_lender_layers.c — braid sim's batching replay (sim_cluster_batch.h) against the live leader's
 * move behaviour of issue 33:
 *  - a busy lender answers a move's ask at the next layer boundary of its step in progress (the step split
 *    in --model-layers parts), not at the step's end, so a move asked early in a long step lands before a
 *    timeout that the between-steps answer misses;
 *  - a request routed without a move of its own onto an instance a move is heading for waits for that move
 *    when the move brings it more whole blocks than the instance holds (worker/import_followers.h), and then
 *    finds them cached; without the move's blocks in common it is queued at once;
 *  - the cost router prices that lender (lender_step_parts = --model-layers): a move priced by layers pays
 *    where one priced by steps does not;
 *  - READY carries the model's layer count to the coordinator (control_msg round trip), and the router's
 *    lender price takes it (route_cost_lender_step_parts), the constant only when none came.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "coord/router_cost.h"
#include "sim/sim_cluster.h"
#include "sim/trace.h"
#include "transport/control_msg.h"

typedef struct {
    double t;
    int prompt_tokens;
    int n_blocks;
    const int *blocks; /* block keys, NULL: blocks unique to the request */
} Req;

/* A trace of requests with one output token each; block b of a request is its key (or a unique one). */
static void load_trace(const Req *reqs, int n, Trace *t) {
    char path[] = "/tmp/braid_sim_layers_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%.6f,\"id\":\"r%d\",\"workflow\":\"\",\"agent\":\"\",\"prompt_tokens\":%d,"
                   "\"output_tokens\":1,\"block_size\":16,\"blocks\":[",
                i, reqs[i].t, i, reqs[i].prompt_tokens);
        for (int b = 0; b < reqs[i].n_blocks; b++)
            fprintf(f, "%s\"%016llx\"", b ? "," : "", (unsigned long long)(reqs[i].blocks ? reqs[i].blocks[b] : 100000 * (i + 1) + b));
        fprintf(f, "]}\n");
    }
    fclose(f);
    BraidError err;
    if (trace_load(path, t, &err)) fail_msg("%s", err.msg);
    unlink(path);
}

static void run(const Req *reqs, int n, const SimClusterConfig *cfg, SimClusterResult *r) {
    Trace t;
    load_trace(reqs, n, &t);
    BraidError err;
    if (sim_cluster_run(&t, cfg, r, &err)) fail_msg("%s", err.msg);
    assert_int_equal(r->requests, n);
    assert_true(r->local_tokens + r->remote_tokens + r->computed_tokens == r->prompt_tokens);
    trace_free(&t);
}

static SimClusterConfig config(void) {
    SimClusterConfig cfg = sim_cluster_config_default();
    cfg.n_instances = 2;
    cfg.kv_tokens = 8192;
    cfg.route = SIM_ROUTE_ROUND_ROBIN;
    cfg.prefill_s_per_token = 0.0025;
    cfg.step_s = 0.008;
    cfg.lender_step_tokens = 512;
    return cfg;
}

static const int head[] = {11, 12, 13, 14};

/* Round-robin: A (the head) on instance 0; C (400 tokens) keeps instance 1 in one step until c_end; D (2000
 * tokens) runs its 512-token steps on instance 0; B (the head) goes to instance 1 with a move from instance 0.
 * Instance 1 asks at c_end, early in D's first step (0.21 .. 1.498): between layers the lender answers
 * at the first of its 30 boundaries after c_end, between steps only at 1.498. */
static void test_lender_answers_between_layers(void **state) {
    (void)state;
    SimClusterConfig cfg = config();
    Req reqs[] = {{0.0, 65, 4, head}, {0.2, 400, 25, NULL}, {0.21, 2000, 125, NULL}, {0.25, 65, 4, head}};
    double c_end = 0.2 + cfg.step_s + 400 * cfg.prefill_s_per_token;
    double d_start = 0.21, d_step = cfg.step_s + 512 * cfg.prefill_s_per_token, layer = d_step / 30;
    double answer = d_start + ceil((c_end - d_start) / layer) * layer;
    double transfer = 64 * cfg.kv_bytes_per_token / cfg.link_bytes_per_s + cfg.link_latency_s;
    assert_true(answer < d_start + d_step - 0.2); /* the case is the one described */
    SimClusterResult r;
    assert_int_equal(cfg.n_layers, SIM_DEFAULT_MODEL_LAYERS); /* the default: SmolLM2-135M's 30 */
    assert_int_equal(SIM_DEFAULT_MODEL_LAYERS, 30);
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.remote_tokens, 64);
    assert_true(fabs(r.mean_move_s * 4 - (answer + transfer - 0.25)) < 1e-9); /* only B moved */
    /* Between steps (--model-layers 1): the answer waits for D's step to end. */
    cfg.n_layers = 1;
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_true(fabs(r.mean_move_s * 4 - (d_start + d_step + transfer - 0.25)) < 1e-9);
    /* A 0.1 s timeout from the ask: the answer between layers lands in time, the one between steps does not. */
    cfg.move_timeout_s = 0.1;
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 0);
    assert_int_equal(r.move_failures, 1);
    cfg.n_layers = 30;
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.move_failures, 0);
}

/* A 0.05 s move latency: B's 4-block head is worth a move (4 x 40 ms to compute), one block is not. Round-robin:
 * A (the head) on instance 0; B (the head) to instance 1 with a move (landing 0.05 s later); F to instance 0; E
 * to instance 1 while B's move is on the way, its first block B's, its second its own: no move of its own, and
 * the move brings it 1 block where instance 1 holds none, so it waits for the landing and finds that block
 * cached. With blocks of its own only (nothing in common with B's), E is queued at once. */
static void test_request_waits_for_the_import_in_flight(void **state) {
    (void)state;
    SimClusterConfig cfg = config();
    cfg.link_latency_s = 0.05;
    static const int e_blocks[] = {11, 99};
    Req reqs[] = {{0.0, 65, 4, head}, {0.5, 65, 4, head}, {0.51, 17, 1, NULL}, {0.52, 33, 2, e_blocks}};
    SimClusterResult r;
    run(reqs, 4, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.remote_tokens, 64);
    assert_int_equal(r.local_tokens, 16); /* E's first block, brought by B's move */
    assert_int_equal(r.import_waits, 1);
    /* B (from 0.5) and E (from 0.52) both start at the landing; A and F at once. */
    double land = 0.5 + 64 * cfg.kv_bytes_per_token / cfg.link_bytes_per_s + cfg.link_latency_s;
    assert_true(fabs(r.mean_wait_s * 4 - ((land - 0.5) + (land - 0.52))) < 1e-9);
    /* A request sharing nothing with the move is not held. */
    Req other[] = {{0.0, 65, 4, head}, {0.5, 65, 4, head}, {0.51, 17, 1, NULL}, {0.52, 33, 2, NULL}};
    run(other, 4, &cfg, &r);
    assert_int_equal(r.import_waits, 0);
    assert_int_equal(r.local_tokens, 0);
}

/* The cost router prices the replay's lender as it answers (lender_step_parts = --model-layers). A (the head) runs
 * on instance 0, then D (2000 tokens, 512-token steps of 1.29 s) keeps it busy; B (the head) comes early in D's
 * first step (D shares the head, so it runs on instance 0). Between layers instance 0 answers a move within
 * 1.29 / 30 s, less than computing B's 4 blocks (0.16 s): B goes to the idle instance 1 and moves the head. Priced
 * between steps (--model-layers 1: a whole step's wait) the move does not pay and instance 1 computes the head. */
static void test_router_prices_the_lender_by_layers(void **state) {
    (void)state;
    SimClusterConfig cfg = config();
    cfg.route = SIM_ROUTE_COST;
    static int d_blocks[125] = {11, 12, 13, 14};
    for (int b = 4; b < 125; b++) d_blocks[b] = 500 + b;
    Req reqs[] = {{0.0, 65, 4, head}, {0.2, 2000, 125, d_blocks}, {0.3, 65, 4, head}};
    SimClusterResult r;
    run(reqs, 3, &cfg, &r);
    assert_int_equal(r.moves, 1);
    assert_int_equal(r.remote_tokens, 64);
    assert_int_equal(r.move_failures, 0);
    assert_int_equal(r.local_tokens, 64); /* D found the head on instance 0 */
    cfg.n_layers = 1;
    run(reqs, 3, &cfg, &r);
    assert_int_equal(r.moves + r.move_failures, 0);
    assert_int_equal(r.remote_tokens, 0);
    assert_int_equal(r.local_tokens, 64);
    assert_true(r.max_share < 0.7); /* B computed the head on instance 1 */
    /* --router-lender-parts 1: the lender answers between layers, but the router prices a whole step: no move. */
    cfg.n_layers = 30;
    cfg.router_lender_parts = 1;
    run(reqs, 3, &cfg, &r);
    assert_int_equal(r.moves + r.move_failures, 0);
    cfg.router_lender_parts = 30;
    run(reqs, 3, &cfg, &r);
    assert_int_equal(r.moves, 1);
}

/* READY carries the layer count; the coordinator's router prices a busy lender's wait by it. */
static void test_ready_carries_the_layer_count(void **state) {
    (void)state;
    MsgReady m = {.ok = 1, .n_blocks = 256, .block_size = 16, .context_length = 8192, .kv_moves = 1, .block_bytes = 368704,
                  .error = "", .n_layers = 30};
    WireBuf b = {0};
    msg_ready_encode(&b, &m);
    WireReader rd = wire_reader(b.data, b.len);
    MsgReady d;
    assert_int_equal(msg_ready_decode(&rd, &d), 0);
    assert_int_equal(d.n_layers, 30);
    assert_int_equal(d.n_blocks, 256);
    assert_int_equal(d.block_bytes, 368704);
    assert_string_equal(d.error, "");
    msg_ready_free(&d);
    wire_buf_free(&b);
    assert_int_equal(route_cost_lender_step_parts(30), 30);
    assert_int_equal(route_cost_lender_step_parts(24), 24);
    assert_int_equal(route_cost_lender_step_parts(0), ROUTE_COST_LIVE_LENDER_STEP_PARTS); /* no count came */
    RouteCostModel cm = route_cost_model_init(true, 100, 1e9, 0); /* 10 ms a token */
    cm.lender_step_tokens = 512;
    cm.lender_step_parts = route_cost_lender_step_parts(30);
    assert_true(fabs(route_cost_lender_wait_s(&cm, 20) - 5.12 / 30) < 1e-9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lender_answers_between_layers),
        cmocka_unit_test(test_request_waits_for_the_import_in_flight),
        cmocka_unit_test(test_router_prices_the_lender_by_layers),
        cmocka_unit_test(test_ready_carries_the_layer_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
