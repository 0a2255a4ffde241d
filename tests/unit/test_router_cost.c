/* The cost router (--router cost, router_cost.h / router.h): the estimate's parts, its choices
 * (the idle holder of a long prefix, an idle non-holder with a move when the holder is queued,
 * computing when the link is too slow to move, the emptiest cache among equals, locality under
 * congestion), the bookkeeping that feeds the queue estimate, learning the rates from finished
 * requests, and move_plan following a priced decision (and not one a later rule changed); the
 * measured rates per (lender, borrower) pair and link (same-node CUDA IPC vs staged) that FINISH
 * carries, and the choice they change; the score's price of the requests a prefill delays, and
 * blocks in flight to an instance counting as held there; a lender that answers between the layers of
 * its step costing a layer's share of it, not the rest of the step; requests queued for their own
 * prefill not counted as stalled by a new one. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "coord/move_plan.h"
#include "coord/router.h"
#include "coord/router_cost.h"
#include "transport/control_msg.h"

enum { BS = 16, BLOCK_BYTES = 368640 }; /* SmolLM2-135M: 16 tokens x 30 layers x K,V x 192 halves */

/* A cost router over n instances that all take part in moves; prefill 1000 tokens/s, 1 GB/s. */
static void cost_router(Router *r, int n) {
    assert_int_equal(router_init(r, n, 8), 0);
    r->mode = ROUTER_COST;
    r->cost = route_cost_model_init(true, 1000, 1e9, 0.002);
    for (int i = 0; i < n; i++) router_instance_kv(r, i, true, BLOCK_BYTES, BS);
}

static void prompt_hashes(uint64_t *h, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) h[i] = seed * 1000 + (uint64_t)i + 1;
}

/* TTFT = queue + prefill of what is not local + the move of what a lender has, when cheaper. */
static void test_estimate_parts(void **state) {
    (void)state;
    RouteCostModel m = route_cost_model_init(true, 1000, 1e9, 0.002);
    RouteCostInput in = {.queue_s = 0.5, .prompt_tokens = 1024, .block_size = BS, .local_blocks = 16, .source_blocks = 60,
                         .can_move = true, .bytes_per_token = BLOCK_BYTES / BS, .free_blocks = -1};
    RouteCostEstimate e = route_cost_estimate(&m, &in);
    assert_int_equal(e.moved_blocks, 44);
    assert_int_equal(e.computed_tokens, 1024 - 60 * BS);
    assert_true(fabs(e.move_s - (44.0 * BLOCK_BYTES / 1e9 + 0.002)) < 1e-9);
    assert_true(fabs(e.compute_s - 0.064) < 1e-9);
    assert_true(fabs(e.ttft_s - (0.5 + e.move_s + e.compute_s)) < 1e-9);
    assert_true(fabs(e.recompute_s - 44 * BS / 1000.0) < 1e-9);
    in.can_move = false; /* no move: the gap is computed */
    e = route_cost_estimate(&m, &in);
    assert_int_equal(e.moved_blocks, 0);
    assert_int_equal(e.computed_tokens, 1024 - 16 * BS);
    m.moves = false; /* --kv-moves off: the same */
    in.can_move = true;
    assert_int_equal(route_cost_estimate(&m, &in).moved_blocks, 0);
    /* A full cache: the new blocks evict as many cached ones, priced as prefill. */
    m.moves = true;
    in.free_blocks = 4;
    e = route_cost_estimate(&m, &in);
    assert_true(fabs(e.evicted_s - (1024 / BS - 16 - 4) * BS / 1000.0) < 1e-9);
    /* The score is the TTFT when nobody waits, and adds the extra work when requests wait. */
    assert_true(route_cost_score(&e, 0) == e.ttft_s);
    assert_true(route_cost_score(&e, 4) > e.ttft_s);
}

/* A long prompt whose prefix an idle instance holds goes there, with nothing to move. */
static void test_idle_holder_wins(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 3);
    uint64_t h[64];
    prompt_hashes(h, 64, 1);
    router_stored(&r, 1, h, 64);
    RouteDecision d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 1);
    assert_true(route_decision_priced(&d));
    assert_false(d.move);
    assert_int_equal(d.matched_blocks, 64);
    assert_string_equal(d.reason, "cost-local");
    assert_true(d.est_ttft_s < 0.05); /* only the 10-token tail is computed */
    router_free(&r);
}

/* The holder is queued: an idle instance takes the request and the prefix is moved in; move_plan
 * follows the router's choice. Queue and load come from the books (router_charge). */
static void test_queued_holder_loses_to_a_move(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 3);
    uint64_t h[64], other[200];
    prompt_hashes(h, 64, 1);
    prompt_hashes(other, 200, 2);
    router_stored(&r, 1, h, 64);
    /* A 3200-token prompt already sent to the holder: 3.2 s of prefill ahead there. */
    RouteDecision busy = router_pick_prompt(&r, other, 200, 3200, NULL);
    assert_int_equal(busy.instance, 0); /* nobody holds it: the emptiest, lowest instance computes it */
    busy.instance = 1, busy.priced_for = 1, busy.matched_blocks = 0, busy.move = false;
    RouteCharge charge = router_charge(&r, &busy, 3200, 1.0);
    router_assigned(&r, 1, NULL);
    assert_true(r.pending_prefill[1] == 3200);
    assert_true(charge.ahead_tokens == 0);
    RouteDecision d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_not_equal(d.instance, 1);
    assert_true(d.move);
    assert_int_equal(d.source, 1);
    assert_int_equal(d.source_blocks, 64);
    assert_string_equal(d.reason, "cost-move");
    MoveCostModel m = move_cost_model_default();
    bool can[3] = {true, true, true};
    uint64_t bytes[3] = {BLOCK_BYTES, BLOCK_BYTES, BLOCK_BYTES};
    MovePlan p = move_plan(&m, &d, can, bytes, BS);
    assert_int_equal(p.source, 1);
    assert_int_equal(p.blocks, 64);
    /* The holder's first token came: its queue empties and it wins again. */
    router_prefill_done(&r, &charge);
    assert_true(r.pending_prefill[1] == 0);
    router_prefill_done(&r, &charge); /* settled once */
    assert_true(r.pending_prefill[1] == 0);
    router_finished(&r, 1);
    assert_int_equal(router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL).instance, 1);
    router_free(&r);
}

/* A busy lender answers a move between its engine steps: the move waits the rest of its current
 * step (at most --max-batch-tokens of prefill), and a move that would take --move-timeout or more
 * is not planned (live it is abandoned after the timeout and the prefix recomputed). */
static void test_busy_lender_step(void **state) {
    (void)state;
    RouteCostModel m = route_cost_model_init(true, 1000, 1e9, 0.002);
    assert_true(route_cost_lender_wait_s(&m, 3.2) == 0); /* no step size: answers at once (the old model) */
    m.lender_step_tokens = 512;
    assert_true(fabs(route_cost_lender_wait_s(&m, 3.2) - 0.512) < 1e-12); /* one step of 512 tokens at 1000/s */
    assert_true(fabs(route_cost_lender_wait_s(&m, 0.1) - 0.1) < 1e-12);   /* the rest of a shorter queue */
    assert_true(route_cost_lender_wait_s(&m, 0) == 0);                    /* idle */
    RouteCostInput in = {.prompt_tokens = 1024, .block_size = BS, .source_blocks = 60, .can_move = true,
                         .bytes_per_token = BLOCK_BYTES / BS, .free_blocks = -1, .lender_queue_s = 3.2};
    RouteCostEstimate e = route_cost_estimate(&m, &in);
    assert_int_equal(e.moved_blocks, 60);
    assert_true(fabs(e.move_s - (0.512 + 60.0 * BLOCK_BYTES / 1e9 + 0.002)) < 1e-9);
    m.move_timeout_s = 0.5; /* the same move no longer lands in time */
    e = route_cost_estimate(&m, &in);
    assert_int_equal(e.moved_blocks, 0);
    assert_int_equal(e.computed_tokens, 1024);

    /* The router: the holder has 3.2 s of prefill queued; with steps of 512 tokens and a 5 s timeout
     * the idle instance moves the prefix in, with 8000-token steps and a 2 s timeout it computes. */
    Router r;
    cost_router(&r, 2);
    r.cost.lender_step_tokens = 512;
    r.cost.move_timeout_s = 5;
    uint64_t h[64];
    prompt_hashes(h, 64, 1);
    router_stored(&r, 1, h, 64);
    RouteDecision busy = {.instance = 1, .priced_for = 1, .priced = true, .source = -1};
    router_charge(&r, &busy, 3200, 1.0);
    router_assigned(&r, 1, NULL);
    RouteDecision d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 0);
    assert_true(d.move);
    assert_true(d.est_move_s > 0.512);
    r.cost.lender_step_tokens = 8000;
    r.cost.move_timeout_s = 2;
    d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 0);
    assert_false(d.move);
    assert_string_equal(d.reason, "cost-compute");
    router_free(&r);
}

/* A busy lender that answers between the layers of its step (serve's leader, the CPU backend's step
 * pulse) makes a borrower wait a layer's share of the step, not the rest of it: with the live setting
 * (ROUTE_COST_LIVE_LENDER_STEP_PARTS) the idle non-holder moves the prefix from the holder in a long
 * step, where pricing a whole step (the old model, still braid sim's lender) ran past the move timeout
 * and recomputed it (live 4-node arms: the baselines' moves landed in 0.14-0.25 s while cost planned none). */
static void test_lender_answers_between_layers(void **state) {
    (void)state;
    RouteCostModel m = route_cost_model_init(true, 100, 1e9, 0.002); /* 10 ms a prefill token: a 512-token step is 5.12 s */
    m.lender_step_tokens = 512;
    m.move_timeout_s = 5;
    assert_true(fabs(route_cost_lender_wait_s(&m, 20) - 5.12) < 1e-9); /* between steps: the rest of the step */
    m.lender_step_parts = ROUTE_COST_LIVE_LENDER_STEP_PARTS;
    assert_true(fabs(route_cost_lender_wait_s(&m, 20) - 5.12 / ROUTE_COST_LIVE_LENDER_STEP_PARTS) < 1e-9);
    assert_true(fabs(route_cost_lender_wait_s(&m, 0.1) - 0.1) < 1e-12); /* a shorter queue: its rest */

    Router r;
    cost_router(&r, 2);
    r.cost = m;
    r.cost.lender_step_parts = 1;
    uint64_t h[40];
    prompt_hashes(h, 40, 3);
    router_stored(&r, 1, h, 30); /* the holder lends 30 of the prompt's 40 blocks */
    RouteDecision busy = {.instance = 1, .priced_for = 1, .priced = true, .source = -1};
    router_charge(&r, &busy, 2000, 1.0); /* 20 s of prefill queued on the holder */
    router_assigned(&r, 1, NULL);
    RouteDecision d = router_pick_prompt(&r, h, 40, 40 * BS, NULL);
    assert_int_equal(d.instance, 0);
    assert_false(d.move); /* 5.12 s of lender wait reaches the 5 s timeout: computed */
    r.cost.lender_step_parts = ROUTE_COST_LIVE_LENDER_STEP_PARTS;
    d = router_pick_prompt(&r, h, 40, 40 * BS, NULL);
    assert_int_equal(d.instance, 0);
    assert_true(d.move);
    assert_int_equal(d.source, 1);
    assert_true(d.est_move_s < 1.0); /* a layer's share (0.32 s) + the transfer, not the step */
    router_free(&r);
}

/* A link too slow to move: the idle non-holder computes the prefix rather than waiting for it, or
 * the queued holder wins when computing is slower than its queue; no move either way. */
static void test_tiny_link_falls_back_to_compute(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 2);
    r.cost.link_bytes_per_s = 1e3; /* 1 kB/s */
    uint64_t h[64];
    prompt_hashes(h, 64, 1);
    router_stored(&r, 1, h, 64);
    RouteDecision busy = {.instance = 1, .reason = "test", .source = -1};
    router_charge(&r, &busy, 5000, 1.0); /* 5 s of prefill ahead on the holder */
    RouteDecision d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 0);
    assert_false(d.move);
    assert_string_equal(d.reason, "cost-compute");
    MoveCostModel m = move_cost_model_default();
    bool can[2] = {true, true};
    uint64_t bytes[2] = {BLOCK_BYTES, BLOCK_BYTES};
    assert_int_equal(move_plan(&m, &d, can, bytes, BS).source, -1); /* the classic rule would move at 1 GB/s */
    /* A short queue on the holder: waiting for it beats computing 1024 tokens. */
    r.pending_prefill[1] = 100;
    d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 1);
    assert_false(d.move);
    /* Moves off in the model: never a move, even on a fast link. */
    r.cost.link_bytes_per_s = 1e12;
    r.cost.moves = false;
    r.pending_prefill[1] = 5000;
    d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_false(d.move);
    router_free(&r);
}

/* Among equals the emptiest cache wins (prefixes spread over the cluster's caches); a lender that
 * takes no part in moves lends nothing; a dead holder is not a lender. */
static void test_ties_and_lenders(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 3);
    uint64_t h[8], junk[20];
    prompt_hashes(h, 8, 1);
    prompt_hashes(junk, 20, 3);
    router_stored(&r, 0, junk, 20);
    router_stored(&r, 1, junk, 10);
    RouteDecision d = router_pick_prompt(&r, h, 8, 8 * BS, NULL);
    assert_int_equal(d.instance, 2);
    router_stored(&r, 0, h, 8);
    r.pending_prefill[0] = 50000;
    router_instance_kv(&r, 0, false, BLOCK_BYTES, BS); /* instance 0 cannot lend */
    d = router_pick_prompt(&r, h, 8, 8 * BS, NULL);
    assert_int_not_equal(d.instance, 0);
    assert_false(d.move);
    assert_int_equal(d.source, -1);
    router_instance_kv(&r, 0, true, BLOCK_BYTES, BS);
    assert_true(router_pick_prompt(&r, h, 8, 8 * BS, NULL).move);
    router_instance_down(&r, 0);
    assert_true(r.pending_prefill[0] == 0);
    d = router_pick_prompt(&r, h, 8, 8 * BS, NULL);
    assert_false(d.move);
    assert_int_not_equal(d.instance, 0);
    router_free(&r);
}

/* Congested (requests waiting everywhere) and the caches full: copying a prefix into another
 * instance would evict as much, so the holder keeps it even with a somewhat longer queue; idle,
 * the same queue difference sends it away with a move. */
static void test_congestion_keeps_locality(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 2);
    uint64_t h[64];
    prompt_hashes(h, 64, 1);
    router_stored(&r, 0, h, 64);
    router_instance_capacity(&r, 0, 64);
    router_instance_capacity(&r, 1, 64);
    uint64_t fill[64];
    prompt_hashes(fill, 64, 9);
    router_stored(&r, 1, fill, 64); /* instance 1's cache is full of something else */
    r.pending_prefill[0] = 300;     /* 0.3 s more ahead on the holder */
    RouteDecision d = router_pick_prompt(&r, h, 64, 64 * BS, NULL);
    assert_int_equal(d.instance, 1); /* idle cluster: the sooner first token, by a move */
    assert_true(d.move);
    for (int k = 0; k < 6; k++) router_assigned(&r, 0, NULL), router_assigned(&r, 1, NULL); /* 5 waiting on each */
    d = router_pick_prompt(&r, h, 64, 64 * BS, NULL);
    assert_int_equal(d.instance, 0);
    assert_false(d.move);
    router_free(&r);
}

/* Finished requests teach the rates: TTFT over the tokens it waited for and computed; a move's
 * share of its TTFT over the bytes it brought. Nonsense samples change nothing. */
static void test_learning(void **state) {
    (void)state;
    RouteCostModel m = route_cost_model_init(true, 1000, 1e9, 0.0);
    for (int k = 0; k < 40; k++) route_cost_learn(&m, 0.5, 0, 100, 0); /* 200 tokens/s measured */
    assert_true(fabs(1.0 / m.s_per_token - 200) < 2);
    assert_int_equal(m.prefill_samples, 40);
    double before = m.s_per_token;
    route_cost_learn(&m, -1, 0, 100, 0);
    route_cost_learn(&m, NAN, 0, 100, 0);
    route_cost_learn(&m, 1.0, 0, 0, 0); /* nothing computed or queued: not a prefill sample */
    route_cost_learn(&m, 1.0, 0, 10, 0); /* 10 tokens: the TTFT is overhead, not prefill */
    assert_true(m.s_per_token == before);
    /* Moves of 100 MB whose TTFT is 1.1 s with 20 tokens computed (0.1 s): the link runs at 100 MB/s.
     * From a 1 GB/s prior the samples (lower bounds) pull it down slowly; one slow outlier barely
     * moves it; a faster sample lifts it at once. */
    route_cost_learn(&m, 1.1, 0, 20, 100e6);
    assert_true(m.link_bytes_per_s < 1e9 && m.link_bytes_per_s > 850e6);
    for (int k = 0; k < 400; k++) route_cost_learn(&m, 1.1, 0, 20, 100e6);
    assert_true(fabs(m.link_bytes_per_s - 100e6) / 100e6 < 0.02);
    route_cost_learn(&m, 10.1, 0, 20, 100e6); /* a move that seemed to take 10 s */
    assert_true(m.link_bytes_per_s > 85e6);
    route_cost_learn(&m, 0.2, 0, 20, 100e6); /* 1 GB/s seen: the link is at least that fast */
    assert_true(m.link_bytes_per_s > 250e6);
    assert_true(fabs(1.0 / m.s_per_token - 200) < 2); /* the prefill rate is not touched by move samples */

    /* Through the router's books: the charge records the queue ahead at dispatch. */
    Router r;
    cost_router(&r, 1);
    RouteDecision d = {.instance = 0, .source = -1, .reason = "test"};
    RouteCharge a = router_charge(&r, &d, 1000, 10.0);
    RouteCharge b = router_charge(&r, &d, 1000, 10.0);
    assert_true(b.ahead_tokens == 1000);
    router_learn(&r, &a, 2.0, 1000, 0);
    router_learn(&r, &b, 4.0, 1000, 0);
    assert_true(r.pending_prefill[0] == 0);
    assert_true(1.0 / r.cost.s_per_token < 1000); /* 500 tokens/s samples pulled it down */
    RouteDecision moving = {.instance = 0, .source = 1, .source_blocks = 40, .priced = true, .priced_for = 0, .move = true};
    RouteCharge failed = router_charge(&r, &moving, 1000, 11.0);
    assert_true(failed.moved_bytes > 0);
    double before_fail = r.cost.s_per_token;
    router_learn(&r, &failed, 5.5, 1000, 0); /* the move timed out: nothing learned, the queue settled */
    assert_true(r.cost.s_per_token == before_fail);
    assert_true(r.pending_prefill[0] == 0);
    RouteCharge never = {0};
    double s = r.cost.s_per_token;
    router_learn(&r, &never, 1.0, 100, 0); /* never charged: nothing learned */
    assert_true(r.cost.s_per_token == s);
    router_free(&r);
}

/* A later rule that changes the instance voids the estimate: move_plan decides by its own rule. */
static void test_overridden_decision(void **state) {
    (void)state;
    RouteDecision d = {.instance = 2, .matched_blocks = 0, .source = 0, .source_blocks = 10, .priced = true, .priced_for = 1,
                       .move = false, .reason = "cost-local"};
    assert_false(route_decision_priced(&d));
    MoveCostModel m = move_cost_model_default();
    bool can[3] = {true, true, true};
    uint64_t bytes[3] = {BLOCK_BYTES, BLOCK_BYTES, BLOCK_BYTES};
    assert_int_equal(move_plan(&m, &d, can, bytes, BS).source, 0);
    d.priced_for = 2; /* still its own estimate, which said no move */
    assert_int_equal(move_plan(&m, &d, can, bytes, BS).source, -1);
    assert_int_equal(router_mode_parse("cost"), ROUTER_COST);
    assert_int_equal(router_mode_parse("balanced"), ROUTER_BALANCED);
    assert_int_equal(router_mode_parse("random"), -1);
    assert_string_equal(router_mode_name(ROUTER_COST), "cost");
}

/* Measured move rates per ordered pair: a fast measured pair turns the choice into a move that the
 * slow shared rate refused; other pairs keep the shared rate; a sample over another link starts
 * the pair afresh; the FINISH message carries the time and link. */
static void test_measured_pair_rates(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 3);
    r.cost.link_bytes_per_s = 1e3; /* the shared (prior) rate: far too slow to move */
    uint64_t h[64];
    prompt_hashes(h, 64, 1);
    router_stored(&r, 1, h, 64);
    RouteDecision busy = {.instance = 1, .reason = "test", .source = -1};
    router_charge(&r, &busy, 5000, 1.0); /* 5 s of prefill ahead on the holder */
    RouteDecision d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 0);
    assert_false(d.move);
    assert_null(router_link(&r, 1, 0));
    /* Samples that say nothing are ignored; so is a pair of one instance. */
    router_learn_move(&r, 1, 0, 0, 0.001, MOVE_LINK_CUDA_IPC);
    router_learn_move(&r, 1, 0, 1024, 0, MOVE_LINK_CUDA_IPC);
    router_learn_move(&r, 1, 1, 1024, 0.001, MOVE_LINK_CUDA_IPC);
    router_learn_move(&r, -1, 0, 1024, 0.001, MOVE_LINK_CUDA_IPC);
    assert_null(router_link(&r, 1, 0));
    /* 1024 tokens (64 blocks, 23.6 MB) in 1 ms over IPC: 23.6 GB/s from 1 to 0. */
    router_learn_move(&r, 1, 0, 1024, 0.001, MOVE_LINK_CUDA_IPC);
    const RouteLinkRate *l = router_link(&r, 1, 0);
    assert_non_null(l);
    assert_int_equal(l->link, MOVE_LINK_CUDA_IPC);
    assert_true(fabs(l->bytes_per_s - 1024.0 * BLOCK_BYTES / BS / 0.001) < 1);
    assert_null(router_link(&r, 0, 1)); /* ordered pairs */
    d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_int_equal(d.instance, 0);
    assert_true(d.move);
    assert_int_equal(d.source, 1);
    assert_string_equal(d.reason, "cost-move");
    assert_int_equal(r.estimate[2].moved_blocks, 0); /* 1 -> 2 was never measured: the shared 1 kB/s */
    /* A second IPC sample, 4x slower: the average moves toward it, in the log domain, partly. */
    router_learn_move(&r, 1, 0, 1024, 0.004, MOVE_LINK_CUDA_IPC);
    double fast = 1024.0 * BLOCK_BYTES / BS / 0.001;
    assert_true(l->bytes_per_s < fast && l->bytes_per_s > fast / 4);
    assert_int_equal(l->samples, 2);
    /* The pair now goes over host staging at 1 kB/s: the IPC history is dropped, not averaged. */
    router_learn_move(&r, 1, 0, 1, (double)BLOCK_BYTES / BS / 1e3, MOVE_LINK_CUDA_STAGED);
    assert_int_equal(l->samples, 1);
    assert_int_equal(l->link, MOVE_LINK_CUDA_STAGED);
    assert_true(fabs(l->bytes_per_s - 1e3) < 1e-6);
    d = router_pick_prompt(&r, h, 64, 64 * BS + 10, NULL);
    assert_false(d.move);
    router_free(&r);
    /* The borrower's measurement travels on FINISH. */
    WireBuf b = {0};
    msg_finish_encode(&b, &(MsgFinish){.req_id = 9, .error = "", .directive_outcomes = "", .move_s = 0.0125, .move_link = MOVE_LINK_CUDA_IPC});
    WireReader rd = wire_reader(b.data, b.len);
    MsgFinish f;
    assert_int_equal(msg_finish_decode(&rd, &f), 0);
    assert_true(f.move_s == 0.0125);
    assert_int_equal(f.move_link, MOVE_LINK_CUDA_IPC);
    msg_finish_free(&f);
    wire_buf_free(&b);
}

/* The score: the TTFT plus the work the choice adds x the requests it delays. */
static void test_score_prices_delayed_requests(void **state) {
    (void)state;
    RouteCostEstimate e = {.ttft_s = 2.0, .compute_s = 0.5, .evicted_s = 0.25};
    assert_true(route_cost_score(&e, 0) == 2.0);
    assert_true(route_cost_score(&e, -1) == 2.0);
    assert_true(fabs(route_cost_score(&e, 4) - (2.0 + 4 * 0.75)) < 1e-12);
}

/* A prefill on a crowded instance stalls every sequence running there (one step at a time): the
 * router prefers the instance with a longer queue but fewer requests to stall. Instance 0 runs 10
 * requests with no prefill pending (TTFT 1.08 s), instance 1 one request with 500 tokens of prefill
 * pending (TTFT 1.51 s); nobody holds the 1000-token prompt. The bare TTFT picks 0; 1000 tokens
 * computed there delay 10 requests, on 1 one. */
static void test_prefill_stalls_the_crowded_instance(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 2);
    for (int k = 0; k < 10; k++) router_assigned(&r, 0, NULL);
    router_assigned(&r, 1, NULL);
    r.pending_prefill[1] = 500;
    uint64_t h[62];
    prompt_hashes(h, 62, 3);
    RouteDecision d = router_pick_prompt(&r, h, 62, 1000, NULL);
    assert_int_equal(d.instance, 1);
    assert_true(r.estimate[0].ttft_s < r.estimate[1].ttft_s); /* the TTFT alone would have picked 0 */
    /* A one-request-at-a-time server (braid sim's FIFO replay gives the queue in seconds): those on
     * instance 0 are ahead of the new request, not stalled by it; the sooner first token wins. */
    double queue_s[2] = {0.08, 0.508};
    r.queue_s = queue_s;
    assert_int_equal(router_pick_prompt(&r, h, 62, 1000, NULL).instance, 0);
    r.queue_s = NULL;
    router_free(&r);
}

/* Requests still waiting for their own prefill are ahead of a new one (first come, first served),
 * not stalled by its prefill: only those decoding are. Instance 0 has 10 requests queued with 5
 * prefill tokens each (TTFT 1.13 s for the new 1000-token prompt); instance 1 has 4 decoding and
 * 500 tokens of prefill pending (TTFT 1.53 s). Counting every request on an instance as delayed
 * would price 10 on 0 against 4 on 1 and send the prompt to 1, where it stalls 4 decodes and
 * waits longer itself; it goes to 0. Once those 10 are past their first token they decode and
 * count. */
static void test_queued_requests_are_not_stalled(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 2);
    RouteCharge queued[10], decoding[4];
    RouteDecision to0 = {.instance = 0, .source = -1}, to1 = {.instance = 1, .source = -1};
    for (int k = 0; k < 10; k++) queued[k] = router_charge(&r, &to0, 5, 1.0), router_assigned(&r, 0, NULL);
    for (int k = 0; k < 4; k++) {
        decoding[k] = router_charge(&r, &to1, 5, 1.0);
        router_assigned(&r, 1, NULL);
        router_prefill_done(&r, &decoding[k]);
    }
    r.pending_prefill[1] = 500;
    uint64_t h[62];
    prompt_hashes(h, 62, 4);
    RouteDecision d = router_pick_prompt(&r, h, 62, 1000, NULL);
    assert_int_equal(d.instance, 0);
    assert_true(r.estimate[0].ttft_s < r.estimate[1].ttft_s);
    for (int k = 0; k < 10; k++) router_prefill_done(&r, &queued[k]); /* now 10 decode on 0 */
    r.pending_prefill[1] = 500;
    assert_int_equal(router_pick_prompt(&r, h, 62, 1000, NULL).instance, 1);
    router_free(&r);
}

/* Blocks in flight: the prompt blocks of a request charged to an instance count as held there
 * (a request queued behind it finds them cached), even if the instance evicts them meanwhile (the
 * queued request computes them again); they cannot be lent; they are forgotten once no prefill is
 * pending there. Only the charged instance gets them, not the one the router first picked. */
static void test_inflight_blocks_count_as_local(void **state) {
    (void)state;
    Router r;
    cost_router(&r, 3);
    uint64_t a[64], b[70];
    prompt_hashes(a, 64, 5);
    prompt_hashes(b, 70, 5); /* b extends a */
    RouteDecision first = router_pick_prompt(&r, a, 64, 64 * BS + 10, NULL);
    assert_int_equal(first.instance, 0);
    first.instance = 2, first.priced_for = 2; /* a later rule (a pin, a cache key) sends it to 2 */
    RouteCharge ca = router_charge(&r, &first, 64 * BS + 10, 1.0);
    router_assigned(&r, 2, NULL);
    /* The others are busier still: 20 s of prefill each. */
    RouteDecision other = {.instance = 0, .source = -1};
    RouteCharge c0 = router_charge(&r, &other, 20000, 1.0);
    other.instance = 1;
    RouteCharge c1 = router_charge(&r, &other, 20000, 1.0);
    RouteDecision d = router_pick_prompt(&r, b, 70, 70 * BS + 10, NULL);
    assert_int_equal(d.instance, 2);
    assert_int_equal(d.matched_blocks, 64);
    assert_string_equal(d.reason, "cost-local");
    assert_int_equal(d.source, -1); /* in flight is not stored: nothing to lend */
    assert_true(fabs(r.estimate[2].compute_s - (6 * BS + 10) / 1000.0) < 1e-9);
    assert_int_equal(r.match[0], 0);
    router_evicted(&r, 2, a, 64); /* evicted before its turn: the queued request computes them again */
    router_pick_prompt(&r, b, 70, 70 * BS + 10, NULL);
    assert_int_equal(r.match[2], 64);
    router_prefill_done(&r, &ca); /* its first token: nothing pending on 2 any more */
    router_pick_prompt(&r, b, 70, 70 * BS + 10, NULL);
    assert_int_equal(r.match[2], 0);
    router_prefill_done(&r, &c0), router_prefill_done(&r, &c1);
    router_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimate_parts),        cmocka_unit_test(test_idle_holder_wins),
        cmocka_unit_test(test_queued_holder_loses_to_a_move), cmocka_unit_test(test_tiny_link_falls_back_to_compute),
        cmocka_unit_test(test_ties_and_lenders),      cmocka_unit_test(test_congestion_keeps_locality),
        cmocka_unit_test(test_learning),              cmocka_unit_test(test_overridden_decision),
        cmocka_unit_test(test_measured_pair_rates),   cmocka_unit_test(test_busy_lender_step),
        cmocka_unit_test(test_score_prices_delayed_requests), cmocka_unit_test(test_prefill_stalls_the_crowded_instance),
        cmocka_unit_test(test_inflight_blocks_count_as_local), cmocka_unit_test(test_queued_requests_are_not_stalled),
        cmocka_unit_test(test_lender_answers_between_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
