/*
 * PBKV's conservative prefetch (kv_cache_prefetch) on hand-built caches with a host tier and the
 * pbkv policy: a node demoted to the host whose workflow's next agent is predicted is loaded back
 * into free device blocks (LOAD ops on the pending list, the node on both tiers, owned by the tree)
 * and a request that then matches it is a device hit and a prefetch hit, not a load-back; with no
 * free device blocks nothing is loaded and nothing is evicted for it; a retired or never-predicted
 * workflow's node, or one whose agent is not predicted, is never loaded; a node longer than what
 * the budget has left is split there and its first blocks loaded (the rest next time); the prefetch region includes retired cache but never active cache; a prefetched
 * node no request used yet is the first to give its blocks back (no store); candidates go highest value first and a loaded node's children follow it; a
 * prefetched node evicted unused counts as wasted. Aggressive mode (App. E, prefetch_rho > 0): a full
 * device of active cache gives up its lowest-scored node, within rho x the device, and the prefetched
 * node keeps its score; past the rho bound (or with rho 0) nothing is evicted. The cache's full check
 * runs after every step.
 * Through the scheduler (no model: tokens are made up): prefetch happens on pure-decode steps only,
 * its LOADs ride in that step's plan, and the budget leaves the running requests' remaining blocks.
 * Through braid sim: two workflows taking turns in a cache that holds one's prefix plus a request,
 * with prefetch between requests each prefix is back on the device before its workflow calls.
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

#include "cache/kv_cache.h"
#include "sim/simulator.h"
#include "sim/trace.h"
#include "worker/scheduler.h"

#define BS 4

static void check(const KvCache *c) {
    BraidError err;
    if (kv_cache_check(c, &err)) fail_msg("%s", err.msg);
}

/* rho: KvCacheConfig.prefetch_rho (0 = conservative prefetch, > 0 = aggressive) */
static void init_rho(KvCache *c, int device_blocks, int host_blocks, double rho) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = device_blocks, .host_blocks = host_blocks, .policy = &evict_policy_pbkv,
                         .prefetch_rho = rho};
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
}

static void init(KvCache *c, int device_blocks, int host_blocks) { init_rho(c, device_blocks, host_blocks, 0); }

/* tokens of a prompt: n_blocks blocks, block i filled from bases[i] */
static void fill(int32_t *tokens, const int32_t *bases, int n_blocks) {
    for (int b = 0; b < n_blocks; b++)
        for (int i = 0; i < BS; i++) tokens[b * BS + i] = bases[b] + i;
    tokens[n_blocks * BS] = 99999; /* one more token: a match never covers the whole prompt */
}

/* One call of `agent` in `workflow` with an n-block prompt: matched, loaded, computed, committed,
 * released, as the scheduler does. Returns the blocks it found on the device. */
static int call(KvCache *c, const char *workflow, const char *agent, const int32_t *bases, int n) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(c, NULL, NULL, workflow, agent, &id, &err)) fail_msg("%s", err.msg);
    int32_t tokens[8 * BS + 1], table[8];
    fill(tokens, bases, n);
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, n * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(c, &m, table, &err);
    assert_true(got >= 0);
    int device = m.device_blocks;
    assert_int_equal(kv_cache_reserve(c, n - got, table + got), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, &id, tokens, n, table, &lock, false, &err), 0);
    kv_cache_release(c, lock, table, n);
    check(c);
    return device;
}

/* Where the n-block prompt's blocks are now: device prefix, then host-only suffix. */
static void where(KvCache *c, const int32_t *bases, int n, int *device, int *host) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(c, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    int32_t tokens[8 * BS + 1];
    fill(tokens, bases, n);
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, n * BS + 1, &m, &err), 0);
    *device = m.device_blocks;
    *host = m.host_blocks;
    kv_cache_release(c, m.node, NULL, 0);
}

static void predict(KvCache *c, const char *workflow, const char *current, const char *agent, float p) {
    BraidError err;
    const char *agents[1] = {agent};
    float prob[1] = {p}; /* k = 1 */
    if (kv_cache_predict(c, workflow, current, 1, 1, agents, prob, &err)) fail_msg("%s", err.msg);
    check(c);
}

static int prefetch(KvCache *c, int budget) {
    int loaded = -1;
    assert_int_equal(kv_cache_prefetch(c, budget, 0, &loaded), 0);
    check(c);
    return loaded;
}

static const int32_t A[2] = {1000, 1100}, B[2] = {2000, 2100}, C[2] = {3000, 3100};

/* Device of 4 blocks, host of 16: w1/coder's A demoted to the host (STOREs taken into *stores),
 * w2/tester's B still on the device, 2 device blocks free. */
static void demote_a_rho(KvCache *c, CacheOpList *stores, double rho) {
    init_rho(c, 5, 17, rho);
    call(c, "w1", "coder", A, 2);
    call(c, "w2", "tester", B, 2);
    assert_int_equal(kv_cache_evict(c, CACHE_TIER_DEVICE, 2), 2); /* A: the least recent, no forecast yet */
    check(c);
    int d, h;
    where(c, A, 2, &d, &h);
    assert_int_equal(d, 0);
    assert_int_equal(h, 2);
    assert_int_equal(kv_cache_free_blocks(c, CACHE_TIER_DEVICE), 2);
    assert_int_equal(kv_cache_take_ops(c, stores), 0);
    assert_int_equal(stores->n, 2);
}

static void demote_a(KvCache *c, CacheOpList *stores) { demote_a_rho(c, stores, 0); }

static void test_predicted_node_prefetched_and_hit(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0}, ops = {0};
    demote_a(&c, &stores);
    predict(&c, "w1", "planner", "coder", 0.8f); /* w1's next call: its coder, which used A */
    assert_int_equal(prefetch(&c, 1), 1);        /* a budget of 1: A's first block, split off */
    assert_int_equal(c.n_nodes, 3);
    assert_int_equal(prefetch(&c, 8), 1);        /* its rest; the budget is capped by the free blocks */
    assert_int_equal(c.counters.prefetched_blocks, 2);
    assert_int_equal(c.counters.loaded_blocks, 0); /* load-backs on a hit: none */
    assert_int_equal(c.counters.device_evicted_blocks, 2);
    assert_int_equal(kv_cache_free_blocks(&c, CACHE_TIER_DEVICE), 0);
    assert_int_equal(kv_cache_in_use(&c, CACHE_TIER_DEVICE), 0); /* owned by the tree, held by no request */
    /* the op list: one LOAD per block, from A's host copies */
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    assert_int_equal(ops.n, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ops.ops[i].kind, CACHE_OP_LOAD);
        assert_int_equal(ops.ops[i].src, stores.ops[i].dst);
        assert_true(ops.ops[i].dst > 0);
    }
    assert_true(ops.ops[0].dst != ops.ops[1].dst);
    int d, h;
    where(&c, A, 2, &d, &h);
    assert_int_equal(d, 2);
    assert_int_equal(h, 0);
    /* on both tiers: nothing more to prefetch, and a second call finds no candidates */
    assert_int_equal(prefetch(&c, 8), 0);
    /* w1's coder calls: a device hit, a prefetch hit, no load-back */
    cache_ops_clear(&ops);
    assert_int_equal(call(&c, "w1", "coder", A, 2), 2);
    assert_int_equal(c.counters.prefetch_hit_blocks, 2);
    assert_int_equal(c.counters.host_hit_blocks, 0);
    assert_int_equal(c.counters.loaded_blocks, 0);
    assert_int_equal(c.counters.prefetch_wasted_blocks, 0);
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    assert_int_equal(ops.n, 0);
    /* used once, then evicted: not wasted, and demoted without a copy (the host copy stayed) */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 4), 4);
    check(&c);
    assert_int_equal(c.counters.prefetch_wasted_blocks, 0);
    assert_int_equal(c.counters.prefetch_hit_blocks, 2);
    cache_ops_free(&stores);
    cache_ops_free(&ops);
    kv_cache_free(&c);
}

static void test_no_free_blocks_no_prefetch(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0}, ops = {0};
    demote_a(&c, &stores);
    call(&c, "w3", "planner", C, 2); /* takes the 2 free blocks: the device is full of B and C */
    predict(&c, "w1", "planner", "coder", 0.9f);
    uint64_t evicted = c.counters.device_evicted_blocks, stored = c.counters.stored_blocks;
    assert_int_equal(prefetch(&c, 8), 0);
    assert_int_equal(c.counters.prefetched_blocks, 0);
    assert_int_equal(c.counters.device_evicted_blocks, evicted); /* nothing evicted for a prefetch */
    assert_int_equal(c.counters.stored_blocks, stored);
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    assert_int_equal(ops.n, 0);
    int d, h;
    where(&c, B, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, C, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, A, 2, &d, &h);
    assert_int_equal(h, 2);
    cache_ops_free(&stores);
    cache_ops_free(&ops);
    kv_cache_free(&c);
}

static void test_retired_unknown_unpredicted_never_prefetched(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0};
    /* never predicted */
    demote_a(&c, &stores);
    assert_int_equal(prefetch(&c, 8), 0);
    /* predicted, but another agent than the one that used A */
    predict(&c, "w1", "coder", "tester", 1.0f);
    assert_int_equal(prefetch(&c, 8), 0);
    /* predicted, then retired */
    predict(&c, "w1", "planner", "coder", 0.9f);
    kv_cache_workflow_end(&c, "w1");
    check(&c);
    assert_int_equal(prefetch(&c, 8), 0);
    assert_int_equal(c.counters.prefetched_blocks, 0);
    /* the prefetch value is the policy's: lru has none, so it never prefetches */
    KvCache lru;
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 5, .host_blocks = 17};
    if (kv_cache_init(&lru, &cfg, &err)) fail_msg("%s", err.msg);
    call(&lru, "w1", "coder", A, 2);
    assert_int_equal(kv_cache_evict(&lru, CACHE_TIER_DEVICE, 2), 2);
    assert_int_equal(prefetch(&lru, 8), 0);
    kv_cache_free(&lru);
    cache_ops_free(&stores);
    kv_cache_free(&c);
}

static void test_prefetched_unused_is_wasted(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0};
    demote_a(&c, &stores);
    predict(&c, "w1", "planner", "coder", 0.8f);
    assert_int_equal(prefetch(&c, 8), 2);
    uint64_t stored = c.counters.stored_blocks;
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 4), 4);
    check(&c);
    assert_int_equal(c.counters.prefetch_wasted_blocks, 2);
    assert_int_equal(c.counters.prefetch_hit_blocks, 0);
    assert_int_equal(c.counters.stored_blocks, stored + 2); /* B stored; A's host copy was kept */
    /* w1's coder now finds A on the host again: a load-back, not a prefetch hit */
    assert_int_equal(call(&c, "w1", "coder", A, 2), 0);
    assert_int_equal(c.counters.host_hit_blocks, 2);
    assert_int_equal(c.counters.prefetch_hit_blocks, 0);
    cache_ops_free(&stores);
    kv_cache_free(&c);
}

/* The prefetch region includes retired cache (§4.3): with the device full of w2's active B and
 * w3's retired C, A is loaded into C's room (C demoted, as any eviction would), B untouched. */
static void test_prefetch_reclaims_retired_cache(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0};
    demote_a(&c, &stores);
    call(&c, "w3", "planner", C, 2); /* the device is full of B and C */
    kv_cache_workflow_end(&c, "w3");
    predict(&c, "w1", "planner", "coder", 0.9f);
    assert_int_equal(prefetch(&c, 8), 2);
    int d, h;
    where(&c, A, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, B, 2, &d, &h);
    assert_int_equal(d, 2); /* active cache is never evicted for a prefetch */
    where(&c, C, 2, &d, &h);
    assert_int_equal(d, 0);
    assert_int_equal(h, 2);
    /* with nothing retired left, nothing more is taken: w3's C is back on the host only */
    cache_ops_free(&stores);
    kv_cache_free(&c);
}

/* A prefetched node no request used yet gives its blocks back first (its host copy stayed: no
 * store): a request that needs room takes A's blocks, not w2's B, although A's predicted value is
 * higher than B's. So a prefetch never makes a request demote what it would have kept. */
static void test_prefetched_unused_yields_first(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0};
    demote_a(&c, &stores);
    predict(&c, "w1", "planner", "coder", 0.8f);
    assert_int_equal(prefetch(&c, 8), 2); /* the device: B and A */
    uint64_t stored = c.counters.stored_blocks;
    const int32_t D[2] = {4000, 4100};
    assert_int_equal(call(&c, "w4", "planner", D, 2), 0);
    int d, h;
    where(&c, B, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, A, 2, &d, &h);
    assert_int_equal(d, 0);
    assert_int_equal(h, 2);
    assert_int_equal(c.counters.stored_blocks, stored); /* A's host copy was there: nothing copied */
    assert_int_equal(c.counters.prefetch_wasted_blocks, 2);
    cache_ops_free(&stores);
    kv_cache_free(&c);
}

/* Aggressive prefetch (App. E, rho = 0.5 of a 4-block device: up to 2 active blocks per call). The
 * device is full of active cache, w2's B (its tester predicted at 0.5) and w3's C (no forecast:
 * score 0), and w1's coder (0.9) wants A back. Conservative loads nothing (test_no_free_blocks_no_prefetch);
 * aggressive evicts the lowest-scored active node, C, although it is the more recent, and loads A;
 * B stays. A then keeps its own score: the next eviction takes B (0.5), not A (0.9), where the
 * conservative mode would give A back first (test_prefetched_unused_yields_first). */
static void test_aggressive_displaces_lowest_scored(void **state) {
    (void)state;
    KvCache c;
    CacheOpList stores = {0};
    demote_a_rho(&c, &stores, 0.5);
    call(&c, "w3", "planner", C, 2); /* the device is full of B and C, both active */
    predict(&c, "w2", "planner", "tester", 0.5f);
    predict(&c, "w1", "planner", "coder", 0.9f);
    assert_int_equal(prefetch(&c, 8), 2);
    assert_int_equal(c.counters.prefetched_blocks, 2);
    assert_int_equal(c.counters.prefetch_displaced_blocks, 2);
    int d, h;
    where(&c, A, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, B, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, C, 2, &d, &h);
    assert_int_equal(d, 0);
    assert_int_equal(h, 2); /* demoted, as any eviction would */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    check(&c);
    where(&c, A, 2, &d, &h);
    assert_int_equal(d, 2);
    where(&c, B, 2, &d, &h);
    assert_int_equal(d, 0);
    assert_int_equal(c.counters.prefetch_wasted_blocks, 0);
    assert_int_equal(call(&c, "w1", "coder", A, 2), 2); /* the displacement paid: a device hit */
    assert_int_equal(c.counters.prefetch_hit_blocks, 2);
    cache_ops_free(&stores);
    kv_cache_free(&c);
}

/* rho bounds the displacement: at 0.25 of a 4-block device (1 block) neither 2-block node may go,
 * so nothing is evicted or loaded; the same with rho 0 (conservative). A rho outside [0, 1] is
 * refused at init. */
static void test_aggressive_rho_bound(void **state) {
    (void)state;
    const double rhos[2] = {0.25, 0};
    for (int i = 0; i < 2; i++) {
        KvCache c;
        CacheOpList stores = {0};
        demote_a_rho(&c, &stores, rhos[i]);
        call(&c, "w3", "planner", C, 2);
        predict(&c, "w1", "planner", "coder", 0.9f);
        uint64_t evicted = c.counters.device_evicted_blocks;
        assert_int_equal(prefetch(&c, 8), 0);
        assert_int_equal(c.counters.device_evicted_blocks, evicted);
        assert_int_equal(c.counters.prefetch_displaced_blocks, 0);
        int d, h;
        where(&c, B, 2, &d, &h);
        assert_int_equal(d, 2);
        where(&c, C, 2, &d, &h);
        assert_int_equal(d, 2);
        cache_ops_free(&stores);
        kv_cache_free(&c);
    }
    KvCache c;
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 5, .host_blocks = 17, .policy = &evict_policy_pbkv, .prefetch_rho = 1.5};
    assert_int_equal(kv_cache_init(&c, &cfg, &err), -1);
}

/* A shared first block P (w1/coder and w2/tester), then w1/coder's Q and w2/tester's R, all
 * demoted. Candidates start at the top of the host part (P: its parent is a root); P's children
 * follow once it is loaded, highest value first. */
static void test_order_and_closure(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9, 33);
    const int32_t pq[3] = {500, 600, 700}, pr[3] = {500, 800, 900};
    call(&c, "w1", "coder", pq, 3);
    call(&c, "w2", "tester", pr, 3);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 5), 5);
    check(&c);
    predict(&c, "w1", "planner", "coder", 0.6f);
    predict(&c, "w2", "planner", "tester", 0.9f);
    /* P (0.6 + 0.9) first, then R (0.9) before Q (0.6); only 3 blocks of budget: Q stays */
    assert_int_equal(prefetch(&c, 3), 3);
    int d, h;
    where(&c, pr, 3, &d, &h);
    assert_int_equal(d, 3);
    where(&c, pq, 3, &d, &h);
    assert_int_equal(d, 1);
    assert_int_equal(h, 2);
    /* the rest next time */
    assert_int_equal(prefetch(&c, 8), 2);
    where(&c, pq, 3, &d, &h);
    assert_int_equal(d, 3);
    assert_int_equal(c.counters.prefetched_blocks, 5);
    kv_cache_free(&c);
}

/* ---- through the scheduler ---- */

static void make_req(SchedRequest *r, const char *id, const char *workflow, const char *agent, int32_t base, int n_prompt, int max_tokens) {
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    r->workflow = strdup(workflow);
    r->agent = strdup(agent);
    r->cap_tokens = n_prompt + max_tokens + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    assert_non_null(r->tokens);
    for (int i = 0; i < n_prompt; i++) r->tokens[i] = base + i;
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
}

/* One step with made-up sampled tokens; returns the plan's entry count. */
static int step(Scheduler *s, StepPlan *p) {
    BraidError err;
    int n = sched_plan(s, p, &err);
    if (n < 0) fail_msg("%s", err.msg);
    sched_commit(s, p);
    for (int i = 0; i < p->n; i++) {
        SchedRequest *r = p->entries[i].req;
        if (!p->entries[i].sample) continue;
        assert_int_equal(sched_append_token(r, 7), 0);
        if (r->n_tokens - r->n_prompt >= r->max_tokens) sched_finish(s, r, "length");
    }
    if (sched_check(s, &err)) fail_msg("%s", err.msg);
    return n;
}

static void run_to_idle(Scheduler *s, StepPlan *p) {
    while (!sched_idle(s)) step(s, p);
}

/* w1/coder's 2-block prompt computed, finished, then demoted to the host tier, and w1's coder
 * predicted next. */
static void sched_setup(Scheduler *s, StepPlan *p, int device_blocks, bool prefetch) {
    BraidError err;
    SchedConfig cfg = {.device_blocks = device_blocks, .host_blocks = 33, .block_size = BS, .max_batch_tokens = 64, .max_running = 4,
                       .cache_enabled = true, .policy = &evict_policy_pbkv, .prefetch = prefetch};
    if (sched_init(s, &cfg, &err)) fail_msg("%s", err.msg);
    SchedRequest r1;
    make_req(&r1, "r1", "w1", "coder", 1000, 2 * BS + 1, 3);
    assert_int_equal(sched_add(s, &r1), 0);
    run_to_idle(s, p);
    sched_request_free(&r1);
    kv_cache_evict(&s->cache, CACHE_TIER_DEVICE, device_blocks);
    if (sched_check(s, &err)) fail_msg("%s", err.msg);
    assert_int_equal(kv_cache_cached(&s->cache, CACHE_TIER_DEVICE), 0);
    const char *agents[1] = {"coder"};
    float prob[1] = {0.9f};
    assert_int_equal(sched_predict(s, "w1", "planner", 1, 1, agents, prob, &err), 0);
}

static void test_sched_prefetches_on_pure_decode(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    sched_setup(&s, &p, 17, true);
    SchedRequest r2, r3;
    make_req(&r2, "r2", "w2", "tester", 2000, 2 * BS + 1, 4);
    assert_int_equal(sched_add(&s, &r2), 0);
    step(&s, &p); /* admission and prefill: no prefetch */
    assert_false(p.pure_decode);
    assert_int_equal(s.cache.counters.prefetched_blocks, 0);
    step(&s, &p); /* r2's first decode, nothing waiting: A comes back */
    assert_true(p.pure_decode);
    assert_int_equal(s.cache.counters.prefetched_blocks, 2);
    assert_int_equal(s.counters.prefetch_steps, 1);
    int loads = 0;
    for (int i = 0; i < p.ops.n; i++) loads += p.ops.ops[i].kind == CACHE_OP_LOAD;
    assert_int_equal(loads, 2); /* in this step's plan, before its forward */
    run_to_idle(&s, &p);
    assert_int_equal(s.cache.counters.prefetched_blocks, 2);
    /* w1's coder calls again: its prompt is on the device */
    make_req(&r3, "r3", "w1", "coder", 1000, 2 * BS + 1, 2);
    assert_int_equal(sched_add(&s, &r3), 0);
    run_to_idle(&s, &p);
    assert_int_equal(r3.cached_tokens, 2 * BS);
    assert_int_equal(r3.cached_tokens_host, 0);
    assert_int_equal(s.cache.counters.prefetch_hit_blocks, 2);
    assert_int_equal(s.counters.cached_prompt_tokens_host, 0);
    sched_request_free(&r2);
    sched_request_free(&r3);
    plan_free(&p);
    sched_free(&s);
}

static void test_sched_budget_leaves_running_room(void **state) {
    (void)state;
    Scheduler s;
    StepPlan p = {0};
    /* 8 device blocks; r2 will need all that A's prefetch would take: blocks_for(9 + 20) = 8 */
    sched_setup(&s, &p, 9, true);
    SchedRequest r2;
    make_req(&r2, "r2", "w2", "tester", 2000, 2 * BS + 1, 20);
    assert_int_equal(sched_add(&s, &r2), 0);
    run_to_idle(&s, &p);
    assert_true(s.counters.pure_decode_steps > 10);
    assert_int_equal(s.cache.counters.prefetched_blocks, 0);
    assert_int_equal(r2.preemptions, 0);
    sched_request_free(&r2);
    plan_free(&p);
    sched_free(&s);
    /* prefetch off: never, whatever the room */
    sched_setup(&s, &p, 17, false);
    make_req(&r2, "r2", "w2", "tester", 2000, 2 * BS + 1, 4);
    assert_int_equal(sched_add(&s, &r2), 0);
    run_to_idle(&s, &p);
    assert_true(s.counters.pure_decode_steps > 0);
    assert_int_equal(s.cache.counters.prefetched_blocks, 0);
    sched_request_free(&r2);
    plan_free(&p);
    sched_free(&s);
}

/* ---- through the simulator ---- */

/* Workflows w1 and w2 take turns calling their coder with the same private 4-block prompt (+1
 * token) and 64 output tokens; 10 device blocks hold one prefix plus one request (9 blocks), so
 * each call pushes the other workflow's prefix to the host, and the output blocks are free again
 * after each request. */
/* cap: SimConfig.prefetch_max_blocks (0 = none). The cache's full check runs after every request. */
static void sim_alternating(bool prefetch, int cap, SimResult *r) {
    char path[] = "/tmp/braid_prefetch_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (int i = 0; i < 20; i++) {
        int w = i % 2 + 1;
        fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%d.0,\"workflow\":\"w%d\",\"agent\":\"coder\",\"prompt_tokens\":65,"
                   "\"output_tokens\":64,\"block_size\":16,\"blocks\":[",
                i, i, w);
        for (int b = 0; b < 4; b++) fprintf(f, "%s\"%016llx\"", b ? "," : "", (unsigned long long)(w * 1000 + b + 1));
        fprintf(f, "]}\n");
    }
    fclose(f);
    Trace t;
    BraidError err;
    if (trace_load(path, &t, &err)) fail_msg("%s", err.msg);
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = 10 * 16;
    cfg.host_kv_tokens = 32 * 16;
    cfg.policy = "pbkv";
    cfg.prefetch = prefetch;
    cfg.prefetch_max_blocks = cap;
    cfg.check_invariants = true;
    if (sim_run(&t, &cfg, r, &err)) fail_msg("%s", err.msg);
    sim_result_free(r); /* the scalar results stay */
    trace_free(&t);
    unlink(path);
}

static void test_sim_prefetch_between_requests(void **state) {
    (void)state;
    SimResult off, on, capped;
    sim_alternating(false, 0, &off);
    sim_alternating(true, 0, &on);
    sim_alternating(true, 1, &capped); /* one block per gap: each prefix loaded a block at a time, split off */
    fprintf(stderr, "sim prefetch: off host %llu / device %llu cached tokens; on host %llu / device %llu, prefetched %llu, "
                    "used %llu, wasted %llu\n",
            (unsigned long long)off.host_cached_tokens, (unsigned long long)off.device_cached_tokens,
            (unsigned long long)on.host_cached_tokens, (unsigned long long)on.device_cached_tokens,
            (unsigned long long)on.prefetched_blocks, (unsigned long long)on.prefetch_hit_blocks,
            (unsigned long long)on.prefetch_wasted_blocks);
    assert_int_equal(off.prefetched_blocks, 0);
    assert_true(off.host_cached_tokens > 0);
    /* the same prompts are hits either way; prefetch moves them from host loads to device hits */
    assert_int_equal(on.cached_tokens, off.cached_tokens);
    assert_true(on.prefetch_hit_blocks > 0);
    assert_true(on.device_cached_tokens > off.device_cached_tokens);
    assert_true(on.host_cached_tokens < off.host_cached_tokens);
    assert_int_equal(on.device_cached_tokens - off.device_cached_tokens, off.host_cached_tokens - on.host_cached_tokens);
    assert_true(on.prefetch_hit_blocks + on.prefetch_wasted_blocks <= on.prefetched_blocks);
    assert_true(on.copy_s < off.copy_s);
    assert_true(on.prefetch_copy_s > 0);
    assert_true(on.modeled_latency_s < off.modeled_latency_s);
    /* capped at 1 block per gap: partial loads, still hits, never more than one block a gap */
    assert_true(capped.prefetched_blocks > 0 && capped.prefetched_blocks <= 19);
    assert_true(capped.prefetch_hit_blocks > 0);
    assert_int_equal(capped.cached_tokens, off.cached_tokens);
    assert_true(capped.prefetch_hit_blocks + capped.prefetch_wasted_blocks <= capped.prefetched_blocks);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predicted_node_prefetched_and_hit),
        cmocka_unit_test(test_no_free_blocks_no_prefetch),
        cmocka_unit_test(test_retired_unknown_unpredicted_never_prefetched),
        cmocka_unit_test(test_prefetched_unused_is_wasted),
        cmocka_unit_test(test_prefetch_reclaims_retired_cache),
        cmocka_unit_test(test_prefetched_unused_yields_first),
        cmocka_unit_test(test_aggressive_displaces_lowest_scored),
        cmocka_unit_test(test_aggressive_rho_bound),
        cmocka_unit_test(test_order_and_closure),
        cmocka_unit_test(test_sched_prefetches_on_pure_decode),
        cmocka_unit_test(test_sched_budget_leaves_running_room),
        cmocka_unit_test(test_sim_prefetch_between_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
