/* braid sim --tenants (sim/sim_tenants.h): tenants sharing one instance, replayed through the live
 * scheduler. Tenant A floods the instance with long requests; tenant B sends small ones. Under
 * the CPU cost model (linear in tokens) first come, first served makes B's median latency ~180x
 * B alone; fair sharing must cut that by more than 10x (it is ~14x of alone: every shared step
 * still carries 64 of A's prompt tokens, which cost B's decode steps 20x their own) at >= 0.95x
 * of first come, first served's throughput, deterministically. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "sim/sim_tenants.h"
#include "sim/trace.h"

static void add_line(Trace *t, double at, const char *tenant, int i, int prompt, int output, double weight) {
    char line[512];
    snprintf(line, sizeof line,
             "{\"type\":\"request\",\"seq\":%d,\"t\":%.3f,\"id\":\"%s%d\",\"tenant\":\"%s\",\"prompt_tokens\":%d,"
             "\"output_tokens\":%d,\"block_size\":16,\"blocks\":[],\"weight\":%g}",
             t->n, at, tenant, i, tenant, prompt, output, weight);
    assert_int_equal(braid_grow((void **)&t->reqs, &t->cap, t->n + 1, sizeof *t->reqs), 0);
    BraidError err;
    int bs = 0;
    if (trace_parse_line(line, &t->reqs[t->n], &bs, &err) != TRACE_LINE_REQUEST) fail_msg("%s", err.msg);
    t->block_size = bs;
    t->n++;
}

/* A: 40 requests of 900 + 100 tokens, one every 2 s (more than the instance serves); B: 12
 * requests of 15 + 8 tokens, one every 3 s from t = 10. Lines in arrival order. */
static void flood_trace(Trace *t, double b_weight) {
    memset(t, 0, sizeof *t);
    int a = 0, b = 0;
    while (a < 40 || b < 12) {
        double ta = a < 40 ? 2.0 * a : 1e9, tb = b < 12 ? 10.0 + 3.0 * b : 1e9;
        if (ta <= tb) add_line(t, ta, "A", a, 900, 100, 1), a++;
        else add_line(t, tb, "B", b, 15, 8, b_weight), b++;
    }
}

static void run(const Trace *t, bool fair, const char *only, SimTenantsResult *r) {
    SimTenantsConfig cfg = sim_tenants_config_default();
    cfg.fair_share = fair;
    cfg.only_tenant = only;
    BraidError err;
    if (sim_tenants_run(t, &cfg, r, &err)) fail_msg("%s", err.msg);
}

static void fair_sharing_meets_the_goal_in_the_replay(void **state) {
    (void)state;
    Trace t;
    flood_trace(&t, 1);
    SimTenantsResult alone, fcfs, fair;
    run(&t, false, "B", &alone);
    run(&t, false, NULL, &fcfs);
    run(&t, true, NULL, &fair);
    assert_int_equal(alone.n_tenants, 1);
    assert_int_equal(fcfs.requests, 52);
    assert_int_equal(fcfs.refused + fair.refused, 0);
    double b_alone = alone.tenants[0].median_latency_s;
    double b_fcfs = sim_tenants_find(&fcfs, "B")->median_latency_s, b_fair = sim_tenants_find(&fair, "B")->median_latency_s;
    printf("B alone %.3f s, fcfs %.3f s (%.1fx), fair %.3f s (%.2fx); tokens/s fcfs %.2f fair %.2f (%.3f)\n", b_alone, b_fcfs,
           b_fcfs / b_alone, b_fair, b_fair / b_alone, fcfs.tokens_per_s, fair.tokens_per_s, fair.tokens_per_s / fcfs.tokens_per_s);
    assert_true(b_fcfs > 50 * b_alone);   /* the flood hurts without fair sharing */
    assert_true(b_fair * 10 < b_fcfs);    /* fair sharing takes most of that away */
    assert_true(sim_tenants_find(&fair, "B")->median_ttft_s * 10 < sim_tenants_find(&fcfs, "B")->median_ttft_s);
    assert_true(fair.tokens_per_s >= 0.95 * fcfs.tokens_per_s);
    /* every completion token is served in both arms */
    assert_int_equal(fair.completion_tokens, fcfs.completion_tokens);
    assert_int_equal(fair.completion_tokens, 40 * 100 + 12 * 8);
    /* deterministic: the same replay gives the same figures */
    SimTenantsResult again;
    run(&t, true, NULL, &again);
    assert_int_equal(again.steps, fair.steps);
    assert_true(again.makespan_s == fair.makespan_s);
    assert_true(sim_tenants_find(&again, "B")->median_latency_s == b_fair);
    sim_tenants_result_free(&again);
    sim_tenants_result_free(&alone), sim_tenants_result_free(&fcfs), sim_tenants_result_free(&fair);
    trace_free(&t);
}

/* One tenant: fair sharing changes nothing (the whole budget is its own, first come, first served). */
static void one_tenant_replays_the_same_either_way(void **state) {
    (void)state;
    Trace t;
    flood_trace(&t, 1);
    SimTenantsResult fcfs, fair;
    run(&t, false, "A", &fcfs);
    run(&t, true, "A", &fair);
    assert_int_equal(fcfs.steps, fair.steps);
    assert_true(fcfs.makespan_s == fair.makespan_s);
    assert_true(fcfs.tenants[0].median_latency_s == fair.tenants[0].median_latency_s);
    sim_tenants_result_free(&fcfs), sim_tenants_result_free(&fair);
    trace_free(&t);
}

/* Weights count: B at weight 4 gets a larger part of each shared step than at weight 1, so its
 * TTFT is no worse (and the trace's "weight" reaches the scheduler). */
static void weight_from_the_trace_favours_its_tenant(void **state) {
    (void)state;
    Trace t1, t4;
    flood_trace(&t1, 1);
    flood_trace(&t4, 4);
    for (int i = 0; i < t4.n; i++) assert_true(t4.reqs[i].weight == (strcmp(t4.reqs[i].tenant, "B") ? 1 : 4));
    SimTenantsResult w1, w4;
    run(&t1, true, NULL, &w1);
    run(&t4, true, NULL, &w4);
    assert_true(sim_tenants_find(&w4, "B")->median_ttft_s <= sim_tenants_find(&w1, "B")->median_ttft_s);
    sim_tenants_result_free(&w1), sim_tenants_result_free(&w4);
    trace_free(&t1), trace_free(&t4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fair_sharing_meets_the_goal_in_the_replay),
        cmocka_unit_test(one_tenant_replays_the_same_either_way),
        cmocka_unit_test(weight_from_the_trace_favours_its_tenant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
