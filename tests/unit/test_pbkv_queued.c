/*
 * PBKV and calls that wait in the instance's queue (issue 35, the live-only loss). The coordinator
 * sends a call's forecast ("what comes after this call") when it dispatches the call, and the call
 * may then wait minutes for admission while running requests evict. Through the scheduler (no
 * model: tokens are made up), a request queued by sched_add marks its cached prefix as about to be
 * read (kv_cache_note_waiting), so under pbkv:
 *   - a new workflow's first call queued on a shared prefix whose users all ended (retired cache)
 *     keeps that prefix over another workflow's node of lower predicted value, and hits it when
 *     admitted;
 *   - a call queued on its own workflow's history keeps it although the forecast made at its
 *     dispatch no longer predicts its agent;
 *   - the mark goes when the request leaves the queue (cancelled: the prefix is worth what the
 *     forecasts say again; admitted and finished: retired cache again once its workflow ends).
 * A running request preempted back into the queue is marked again (what it computed is about to
 * be read). A node the queued prompt shares only a head of is counted whole, never split for it. Under LRU a
 * queued request changes nothing (no tick, no split): the least recent node is still the victim.
 * The scheduler's and the cache's full checks run after every step.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "worker/scheduler.h"

#define BS 4

/* A request of `agent` in `workflow` whose prompt is `blocks` whole blocks, block i filled from
 * bases[i], plus one token (a match never covers a whole prompt). */
static void make_req(SchedRequest *r, const char *id, const char *workflow, const char *agent, const int32_t *bases, int blocks, int max_tokens) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->workflow = strdup(workflow);
    r->agent = strdup(agent);
    int n_prompt = blocks * BS + 1;
    r->cap_tokens = n_prompt + max_tokens + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    assert_non_null(r->tokens);
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < BS; i++) r->tokens[b * BS + i] = bases[b] + i;
    r->tokens[blocks * BS] = 99999;
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
}

static void check(const Scheduler *s) {
    BraidError err;
    if (sched_check(s, &err)) fail_msg("%s", err.msg);
}

static void step(Scheduler *s, StepPlan *p) {
    BraidError err;
    if (sched_plan(s, p, &err) < 0) fail_msg("%s", err.msg);
    sched_commit(s, p);
    for (int i = 0; i < p->n; i++) {
        SchedRequest *r = p->entries[i].req;
        if (!p->entries[i].sample) continue;
        assert_int_equal(sched_append_token(r, 7), 0);
        if (r->n_tokens - r->n_prompt >= r->max_tokens) sched_finish(s, r, "length");
    }
    check(s);
}

static void run_to_idle(Scheduler *s, StepPlan *p) {
    while (!sched_idle(s)) step(s, p);
}

/* One finished call: its prompt enters the tree. */
static void serve(Scheduler *s, StepPlan *p, const char *id, const char *workflow, const char *agent, const int32_t *bases, int blocks) {
    SchedRequest r;
    make_req(&r, id, workflow, agent, bases, blocks, 1);
    assert_int_equal(sched_add(s, &r), 0);
    run_to_idle(s, p);
    sched_request_free(&r);
}

/* Device blocks the cache holds of the prompt made of bases (a match by no workflow). */
static int cached_blocks(Scheduler *s, const int32_t *bases, int blocks) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(&s->cache, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    int32_t tokens[8 * BS + 1];
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < BS; i++) tokens[b * BS + i] = bases[b] + i;
    tokens[blocks * BS] = 99999;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(&s->cache, &id, tokens, blocks * BS + 1, &m, &err), 0);
    int n = m.device_blocks;
    kv_cache_release(&s->cache, m.node, NULL, 0);
    return n;
}

/* Device blocks the cache holds of a request's current tokens (a match by no workflow). */
static int cached_of_request(Scheduler *s, const SchedRequest *r) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(&s->cache, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(&s->cache, &id, r->tokens, r->n_tokens, &m, &err), 0);
    int n = m.device_blocks;
    kv_cache_release(&s->cache, m.node, NULL, 0);
    return n;
}

static void predict(Scheduler *s, const char *workflow, const char *current, const char *agent, float prob) {
    BraidError err;
    const char *agents[1] = {agent};
    float p[1] = {prob}; /* k = 1 */
    assert_int_equal(sched_predict(s, workflow, current, 1, 1, agents, p, &err), 0);
    check(s);
}

static void setup(Scheduler *s, const EvictPolicy *policy) {
    BraidError err;
    SchedConfig cfg = {.device_blocks = 9, .block_size = BS, .max_batch_tokens = 64, .max_running = 1, .cache_enabled = true, .policy = policy};
    if (sched_init(s, &cfg, &err)) fail_msg("%s", err.msg);
}

static const int32_t SHARED[2] = {1000, 1100}, HISTORY[2] = {2000, 2100};
static const int32_t SHARED_Q[3] = {1000, 1100, 1200}; /* the shared prefix, then the new workflow's question */

/* 8 device blocks: w0's decomposer computed the shared 2-block prefix and w0 ended (retired
 * cache); w1's coder holds a 2-block history that w1's forecast values at 0.5. */
static void retired_shared_and_active_history(Scheduler *s, StepPlan *p, const EvictPolicy *policy) {
    setup(s, policy);
    serve(s, p, "r0", "w0", "decomposer", SHARED, 2);
    sched_workflow_end(s, "w0");
    serve(s, p, "r1", "w1", "coder", HISTORY, 2);
    predict(s, "w1", "planner", "coder", 0.5f);
    assert_int_equal(cached_blocks(s, SHARED, 2), 2);
    assert_int_equal(cached_blocks(s, HISTORY, 2), 2);
}

static void test_queued_call_keeps_retired_shared_prefix(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    retired_shared_and_active_history(&s, &p, &evict_policy_pbkv);
    /* w2's first call (the decomposer again) reaches the instance and waits */
    predict(&s, "w2", "decomposer", "retriever", 0.9f); /* its forecast: what comes after it */
    SchedRequest r;
    make_req(&r, "r2", "w2", "decomposer", SHARED_Q, 3, 1);
    assert_int_equal(sched_add(&s, &r), 0);
    assert_true(r.waiting_noted);
    /* a running request's reservation evicts 2 blocks while r waits */
    assert_int_equal(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2), 2);
    check(&s);
    assert_int_equal(cached_blocks(&s, SHARED, 2), 2);  /* about to be read: kept */
    assert_int_equal(cached_blocks(&s, HISTORY, 2), 0); /* predicted at 0.5: went */
    run_to_idle(&s, &p);
    assert_int_equal(r.cached_tokens, 2 * BS); /* the shared prefix was a hit */
    assert_false(r.waiting_noted);
    /* the mark went with the admission: once w2 ends the prefix is retired cache again */
    sched_workflow_end(&s, "w2");
    serve(&s, &p, "r3", "w3", "coder", HISTORY, 2);
    predict(&s, "w3", "planner", "coder", 0.5f);
    assert_true(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2) >= 2); /* the question's block, then the prefix */
    check(&s);
    assert_int_equal(cached_blocks(&s, HISTORY, 2), 2);
    assert_true(cached_blocks(&s, SHARED, 2) < 2);
    sched_request_free(&r);
    plan_free(&p);
    sched_free(&s);
}

static void test_cancelled_queued_call_takes_its_mark_back(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    retired_shared_and_active_history(&s, &p, &evict_policy_pbkv);
    SchedRequest r;
    make_req(&r, "r2", "w2", "decomposer", SHARED_Q, 3, 1);
    assert_int_equal(sched_add(&s, &r), 0);
    sched_cancel(&s, &r);
    assert_false(r.waiting_noted);
    /* w2 is still active but nothing waits on the prefix and no forecast values it: 0 < 0.5 */
    assert_int_equal(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2), 2);
    check(&s);
    assert_int_equal(cached_blocks(&s, SHARED, 2), 0);
    assert_int_equal(cached_blocks(&s, HISTORY, 2), 2);
    sched_request_free(&r);
    plan_free(&p);
    sched_free(&s);
}

/* The retriever case: w1's retriever call is dispatched with the forecast "after it, the verifier"
 * (its own agent not predicted), and waits; w3's verifier history is predicted at 0.6. */
static void test_queued_call_keeps_own_history_past_its_forecast(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    setup(&s, &evict_policy_pbkv);
    static const int32_t R_HIST[2] = {3000, 3100}, R_NEXT[3] = {3000, 3100, 3200}, V_HIST[2] = {4000, 4100};
    serve(&s, &p, "a", "w1", "retriever", R_HIST, 2);
    serve(&s, &p, "b", "w3", "verifier", V_HIST, 2);
    predict(&s, "w3", "planner", "verifier", 0.6f);
    predict(&s, "w1", "retriever", "verifier", 0.9f); /* the waiting call's forecast: not itself */
    SchedRequest r;
    make_req(&r, "c", "w1", "retriever", R_NEXT, 3, 1);
    assert_int_equal(sched_add(&s, &r), 0);
    assert_int_equal(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2), 2);
    check(&s);
    assert_int_equal(cached_blocks(&s, R_HIST, 2), 2);
    assert_int_equal(cached_blocks(&s, V_HIST, 2), 0);
    run_to_idle(&s, &p);
    assert_int_equal(r.cached_tokens, 2 * BS);
    sched_request_free(&r);
    plan_free(&p);
    sched_free(&s);
}

/* A queued prompt that shares only the head of a node: the node is counted whole and not split
 * (the tree's shape, and so LRU's victims, stay as they were). */
static void test_partly_shared_node_counted_unsplit(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    setup(&s, &evict_policy_pbkv);
    static const int32_t R_HIST[2] = {3000, 3100}, R_HEAD[2] = {3000, 3900}, V_HIST[2] = {4000, 4100};
    serve(&s, &p, "a", "w1", "retriever", R_HIST, 2);
    serve(&s, &p, "b", "w3", "verifier", V_HIST, 2);
    predict(&s, "w3", "planner", "verifier", 0.6f);
    predict(&s, "w1", "retriever", "verifier", 0.9f);
    int nodes = s.cache.n_nodes;
    SchedRequest r;
    make_req(&r, "c", "w1", "retriever", R_HEAD, 2, 1);
    assert_int_equal(sched_add(&s, &r), 0);
    assert_true(r.waiting_noted);
    assert_int_equal(s.cache.n_nodes, nodes); /* not split */
    assert_int_equal(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2), 2);
    check(&s);
    assert_int_equal(cached_blocks(&s, R_HIST, 2), 2);
    assert_int_equal(cached_blocks(&s, V_HIST, 2), 0);
    run_to_idle(&s, &p);
    assert_int_equal(r.cached_tokens, BS);
    sched_request_free(&r);
    plan_free(&p);
    sched_free(&s);
}

static void test_lru_order_unchanged_by_a_queued_call(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    retired_shared_and_active_history(&s, &p, &evict_policy_lru);
    SchedRequest r;
    make_req(&r, "r2", "w2", "decomposer", SHARED_Q, 3, 1);
    assert_int_equal(sched_add(&s, &r), 0);
    assert_int_equal(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2), 2);
    check(&s);
    assert_int_equal(cached_blocks(&s, SHARED, 2), 0); /* the least recent, queued call or not */
    assert_int_equal(cached_blocks(&s, HISTORY, 2), 2);
    sched_cancel(&s, &r);
    sched_request_free(&r);
    plan_free(&p);
    sched_free(&s);
}

/* A running request preempted for room goes back to the queue: what it computed is in the tree
 * and about to be read again, so it is marked like a queued call (and the mark goes when it is
 * admitted again). w1's retriever and w3's verifier run together in 8 blocks and both grow to 5:
 * one is preempted. When the other finishes, its history (predicted at 0.5) goes before the
 * preempted call's prefix, although the forecast no longer predicts the preempted call's agent. */
static void test_preempted_call_marked_again(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    BraidError err;
    SchedConfig cfg = {.device_blocks = 9, .block_size = BS, .max_batch_tokens = 64, .max_running = 2, .cache_enabled = true, .policy = &evict_policy_pbkv};
    if (sched_init(&s, &cfg, &err)) fail_msg("%s", err.msg);
    static const int32_t R_HIST[2] = {3000, 3100}, V_HIST[2] = {4000, 4100};
    SchedRequest a, b;
    make_req(&a, "a", "w1", "retriever", R_HIST, 2, 11); /* 9 + 11 tokens: 5 blocks each */
    make_req(&b, "b", "w3", "verifier", V_HIST, 2, 11);
    assert_int_equal(sched_add(&s, &a), 0);
    assert_int_equal(sched_add(&s, &b), 0);
    while (a.preemptions == 0 && b.preemptions == 0 && !sched_idle(&s)) step(&s, &p);
    SchedRequest *victim = a.preemptions > 0 ? &a : &b, *other = victim == &a ? &b : &a;
    assert_int_equal(victim->preemptions, 1);
    assert_int_equal(victim->state, REQ_WAITING);
    assert_true(victim->waiting_noted); /* marked again: it will read what it computed */
    while (other->state != REQ_FINISHED) step(&s, &p);
    assert_int_equal(victim->state, REQ_WAITING); /* no room yet: the other's history is in the tree */
    predict(&s, other->workflow, "planner", other->agent, 0.5f);
    predict(&s, victim->workflow, victim->agent, "planner", 0.9f); /* its forecast: not itself */
    int victim_blocks = cached_of_request(&s, victim), other_blocks = cached_of_request(&s, other);
    assert_true(victim_blocks >= 2);
    assert_true(other_blocks >= 2);
    assert_int_equal(kv_cache_evict(&s.cache, CACHE_TIER_DEVICE, 2), 2);
    check(&s);
    assert_int_equal(cached_of_request(&s, victim), victim_blocks); /* about to be read: kept */
    assert_int_equal(cached_of_request(&s, other), other_blocks - 2);
    run_to_idle(&s, &p);
    assert_false(victim->waiting_noted); /* the mark went with the second admission */
    assert_int_equal(victim->state, REQ_FINISHED);
    sched_request_free(&a);
    sched_request_free(&b);
    plan_free(&p);
    sched_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queued_call_keeps_retired_shared_prefix),
        cmocka_unit_test(test_cancelled_queued_call_takes_its_mark_back),
        cmocka_unit_test(test_queued_call_keeps_own_history_past_its_forecast),
        cmocka_unit_test(test_partly_shared_node_counted_unsplit),
        cmocka_unit_test(test_lru_order_unchanged_by_a_queued_call),
        cmocka_unit_test(test_preempted_call_marked_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
