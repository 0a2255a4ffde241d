/*
 * Workflow and agent ids stay bounded (src/cache/kv_cache.c, cache_names.c): 10^5 workflows that
 * each run a call and end leave the id table, the per-workflow index and the policies' per-workflow
 * state bounded by what is referenced at once, while workflows that are still running keep their
 * ids throughout; an id handed to a new workflow carries none of the old one's policy state (PBKV's
 * "retired", KVFlow's steps); workflows that never end are bounded by the idle limit; agent names
 * by theirs. kv_cache_check (which also checks that no referenced id was reclaimed and no ended,
 * unreferenced one kept) runs along the way.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "cache/kv_cache.h"

#define BS 4
#define DEVICE_BLOCKS 64
#define LIVE 8

static void check(const KvCache *c) {
    BraidError err;
    if (kv_cache_check(c, &err)) fail_msg("%s", err.msg);
}

static void init_cache(KvCache *c, const EvictPolicy *policy, int max_idle) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = DEVICE_BLOCKS, .policy = policy, .max_idle_workflows = max_idle};
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
}

static CacheIdentity identity(KvCache *c, const char *workflow, const char *agent) {
    CacheIdentity id;
    BraidError err;
    if (kv_cache_identity(c, NULL, NULL, workflow, agent, &id, &err)) fail_msg("%s", err.msg);
    return id;
}

/* One call of `id` over a one-block prompt unique to `seed`: computed, committed, released. The
 * node it leaves names the workflow until evicted. Returns the committed node. */
static const RadixNode *call(KvCache *c, const CacheIdentity *id, int seed) {
    int32_t tokens[BS + 1], table[1];
    for (int i = 0; i <= BS; i++) tokens[i] = seed * (BS + 1) + i;
    BraidError err;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, id, tokens, BS + 1, &m, &err), 0);
    assert_int_equal(kv_cache_acquire(c, &m, table, &err), 0);
    assert_int_equal(kv_cache_reserve(c, 1, table), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, id, tokens, 1, table, &lock, true, &err), 0);
    kv_cache_release(c, lock, table, 1);
    return lock;
}

static void predict(KvCache *c, const char *workflow, const char *agent) {
    const char *agents[1] = {agent};
    const float prob[1] = {0.9f};
    BraidError err;
    if (kv_cache_predict(c, workflow, agent, 1, 1, agents, prob, &err)) fail_msg("%s", err.msg);
}

static void test_ended_workflows_are_reclaimed(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, &evict_policy_pbkv, 0);
    char name[32];
    CacheIdentity live[LIVE];
    for (int i = 0; i < LIVE; i++) { /* running all along: requests hold their ids */
        snprintf(name, sizeof name, "live-%d", i);
        live[i] = identity(&c, name, "planner");
        call(&c, &live[i], 1000000 + i);
        predict(&c, name, "planner");
    }
    enum { WORKFLOWS = 100000 };
    int peak_max_id = 0;
    for (int i = 0; i < WORKFLOWS; i++) {
        snprintf(name, sizeof name, "wf-%d", i);
        CacheIdentity id = identity(&c, name, i % 2 ? "coder" : "planner");
        call(&c, &id, i);
        predict(&c, name, "coder");
        kv_cache_identity_release(&c, &id);
        kv_cache_workflow_end(&c, name);
        int max_id = kv_cache_workflows_max_id(&c);
        if (max_id > peak_max_id) peak_max_id = max_id;
        if (i % 997 == 0) check(&c);
    }
    check(&c);
    /* Referenced at once: the live ones, and the ended ones whose node is still cached (at most
     * one per device block). Without reclaiming it would be LIVE + WORKFLOWS. */
    assert_true(peak_max_id <= LIVE + DEVICE_BLOCKS + 1);
    assert_true(c.cap_workflows <= 2 * (LIVE + DEVICE_BLOCKS + 2));
    assert_true(kv_cache_workflows_live(&c) <= LIVE + DEVICE_BLOCKS);
    for (int i = 0; i < LIVE; i++) { /* the running workflows kept their ids */
        snprintf(name, sizeof name, "live-%d", i);
        assert_int_equal(cache_names_find(&c.names, CACHE_NAME_WORKFLOW, name), live[i].workflow);
    }
    assert_int_equal(cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "wf-0"), 0); /* long gone */
    for (int i = 0; i < LIVE; i++) kv_cache_identity_release(&c, &live[i]);
    check(&c);
    kv_cache_free(&c);
}

/* A reclaimed id reaches a new workflow clean: under PBKV, the ended workflow's "retired" would
 * otherwise put the new workflow's cache in the evict-first class. */
static void test_reused_id_starts_clean_pbkv(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, &evict_policy_pbkv, 0);
    predict(&c, "old", "planner");
    uint32_t old = cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "old");
    assert_true(old > 0);
    kv_cache_workflow_end(&c, "old"); /* nothing names it: reclaimed at once */
    assert_int_equal(cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "old"), 0);
    CacheIdentity id = identity(&c, "new", "planner");
    assert_int_equal(id.workflow, old);
    const RadixNode *node = call(&c, &id, 7);
    assert_true(c.tiers[CACHE_TIER_DEVICE].policy->score(c.tiers[CACHE_TIER_DEVICE].state, node) >= 0); /* not retired (< -1e14) */
    kv_cache_identity_release(&c, &id);
    check(&c);
    kv_cache_free(&c);
}

/* An ended workflow leaves its nodes' uses (a node lists active workflows only), so its id is
 * reclaimed at once when no request holds it, while its cached node stays retired (its count of
 * workflows seen says it was used) until it goes. A request still holding the id keeps it. */
static void test_ended_workflow_reclaimed_node_stays_retired(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, &evict_policy_pbkv, 0);
    CacheIdentity id = identity(&c, "w", "planner");
    const RadixNode *node = call(&c, &id, 1);
    kv_cache_workflow_end(&c, "w"); /* still held by the request */
    assert_int_equal(cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "w"), id.workflow);
    assert_int_equal(node->meta.n_uses, 0);
    check(&c);
    kv_cache_identity_release(&c, &id);
    assert_int_equal(cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "w"), 0);
    const KvCacheTier *dev = &c.tiers[CACHE_TIER_DEVICE];
    assert_true(dev->policy->reclaimable(dev->state, node));
    check(&c);
    kv_cache_evict(&c, CACHE_TIER_DEVICE, DEVICE_BLOCKS);
    check(&c);
    kv_cache_free(&c);
}

/* Workflows that never end: past the idle bound the least recently idle id goes, and under KVFlow
 * its steps-to-execution do not reach the next workflow given the id. */
static void test_idle_bound_and_kvflow_reset(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, &evict_policy_kvflow, 1);
    predict(&c, "a", "x"); /* "a": agent x runs now (steps 0), nothing else names it: idle */
    uint32_t a = cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "a");
    predict(&c, "b", "y"); /* a second idle workflow: "a" goes */
    assert_int_equal(cache_names_find(&c.names, CACHE_NAME_WORKFLOW, "a"), 0);
    CacheIdentity id = identity(&c, "c", "x");
    assert_int_equal(id.workflow, a);
    const RadixNode *node = call(&c, &id, 3);
    /* "c" has no forecast: band 0 (below 2^40), not the protected band "a"'s agent x had */
    assert_true(c.tiers[CACHE_TIER_DEVICE].policy->score(c.tiers[CACHE_TIER_DEVICE].state, node) < 1099511627776.0);
    kv_cache_identity_release(&c, &id);
    char name[32];
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof name, "forever-%d", i);
        predict(&c, name, "x");
    }
    assert_true(kv_cache_workflows_max_id(&c) <= 4 + DEVICE_BLOCKS);
    check(&c);
    kv_cache_free(&c);
}

static void test_agent_names_bounded(void **state) {
    (void)state;
    KvCache c;
    init_cache(&c, NULL, 0);
    char name[32];
    for (int i = 0; i < 3 * KV_CACHE_MAX_AGENT_NAMES; i++) {
        snprintf(name, sizeof name, "agent-%d", i);
        CacheIdentity id = identity(&c, NULL, name);
        assert_true(id.agent > 0);
    }
    assert_int_equal(cache_names_live(&c.names, CACHE_NAME_AGENT), KV_CACHE_MAX_AGENT_NAMES);
    assert_true(cache_names_max_id(&c.names, CACHE_NAME_AGENT) <= KV_CACHE_MAX_AGENT_NAMES + 1);
    snprintf(name, sizeof name, "agent-%d", 3 * KV_CACHE_MAX_AGENT_NAMES - 1); /* the most recent stays */
    assert_true(cache_names_find(&c.names, CACHE_NAME_AGENT, name) > 0);
    assert_int_equal(cache_names_find(&c.names, CACHE_NAME_AGENT, "agent-0"), 0);
    kv_cache_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ended_workflows_are_reclaimed),
        cmocka_unit_test(test_reused_id_starts_clean_pbkv),
        cmocka_unit_test(test_ended_workflow_reclaimed_node_stays_retired),
        cmocka_unit_test(test_idle_bound_and_kvflow_reset),
        cmocka_unit_test(test_agent_names_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
