/*
 * The pbkv eviction policy on hand-built caches: retired workflows' cache goes first (the popular
 * before the private last), then the lowest K-step lookahead score — a node whose agent is
 * predicted next outlives a more recent node whose agent is not — and a new prediction re-ranks
 * existing nodes. A node counts every active workflow that used it (12 on one node: the score grows
 * with each, and it is not retired while one of them is active); past the bound on all nodes' uses
 * the documented approximation holds and is counted. A node several active workflows read (an
 * agent's head) keeps one read for the workflows still to come, a private one does not, unless
 * --pbkv-future is off. --pbkv-gamma reaches the policy; PBKV-LAE is retired-first then LRU. The cache's full check runs after every operation.
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

static void check(const KvCache *c) {
    BraidError err;
    if (kv_cache_check(c, &err)) fail_msg("%s", err.msg);
}

static void init(KvCache *c, int device_blocks) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = device_blocks, .policy = &evict_policy_pbkv};
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
}

/* One call of `agent` in `workflow`: its 2-block prompt (tokens from base) is computed and cached. */
static void call(KvCache *c, const char *workflow, const char *agent, int32_t base) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(c, NULL, NULL, workflow, agent, &id, &err)) fail_msg("%s", err.msg);
    int32_t tokens[2 * BS + 1], table[3];
    for (int i = 0; i < 2 * BS + 1; i++) tokens[i] = base + i;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, 2 * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(c, &m, table, &err);
    assert_int_equal(kv_cache_reserve(c, 2 - got, table + got), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, &id, tokens, 2, table, &lock, false, &err), 0);
    kv_cache_release(c, lock, table, 2);
    check(c);
}

/* Is the 2-block prompt starting at base still cached (for any workflow)? */
static bool cached(KvCache *c, int32_t base) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(c, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    int32_t tokens[2 * BS + 1];
    for (int i = 0; i < 2 * BS + 1; i++) tokens[i] = base + i;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, 2 * BS + 1, &m, &err), 0);
    int n = m.device_blocks;
    kv_cache_release(c, m.node, NULL, 0);
    return n == 2;
}

static void predict(KvCache *c, const char *workflow, const char *current, const char *a, float pa, const char *b, float pb) {
    BraidError err;
    const char *agents[2] = {a, b};
    float prob[2] = {pa, pb}; /* k = 1 */
    if (kv_cache_predict(c, workflow, current, 1, 2, agents, prob, &err)) fail_msg("%s", err.msg);
    check(c);
}

static void test_retired_first(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9); /* 8 blocks: four 2-block prompts */
    call(&c, "w1", "planner", 1000);
    call(&c, "w2", "planner", 2000);
    call(&c, "w1", "coder", 3000);
    call(&c, "w2", "coder", 4000);
    kv_cache_workflow_end(&c, "w1");
    check(&c);
    /* LRU would drop 1000 then 2000; pbkv drops w1's two prompts, the retired ones */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 4), 4);
    check(&c);
    assert_false(cached(&c, 1000));
    assert_false(cached(&c, 3000));
    assert_true(cached(&c, 2000));
    assert_true(cached(&c, 4000));
    kv_cache_free(&c);
}

static void test_popular_retired_last(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9);
    call(&c, "w1", "planner", 1000); /* a shared system prompt: three workflows use it */
    call(&c, "w2", "planner", 1000);
    call(&c, "w3", "planner", 1000);
    call(&c, "w1", "coder", 5000); /* private, used by one, more recent than nothing else */
    kv_cache_workflow_end(&c, "w1");
    kv_cache_workflow_end(&c, "w2");
    kv_cache_workflow_end(&c, "w3");
    call(&c, "w4", "coder", 6000); /* an active workflow's node */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 5000)); /* retired and private: first */
    assert_true(cached(&c, 1000));
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 1000)); /* retired but popular: next */
    assert_true(cached(&c, 6000));  /* active: last */
    check(&c);
    kv_cache_free(&c);
}

static void test_lookahead_beats_recency(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9);
    call(&c, "w1", "coder", 1000);  /* oldest: LRU's first victim */
    call(&c, "w2", "tester", 2000);
    call(&c, "w3", "analyzer", 3000);
    call(&c, "w4", "planner", 4000);
    predict(&c, "w1", "planner", "coder", 0.9f, "tester", 0.1f); /* w1's coder runs next */
    predict(&c, "w2", "coder", "coder", 0.2f, "tester", 0.3f);
    predict(&c, "w3", "tester", "coder", 0.5f, "analyzer", 0.05f);
    predict(&c, "w4", "coder", "planner", 0.6f, "tester", 0.4f);
    /* scores: w1/coder 0.9, w2/tester 0.3, w3/analyzer 0.05, w4/planner 0.6 */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 3000));
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 2000));
    assert_true(cached(&c, 1000));
    assert_true(cached(&c, 4000));
    /* a new prediction re-ranks: w1's coder is no longer expected */
    predict(&c, "w1", "coder", "coder", 0.0f, "tester", 0.0f);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 1000));
    assert_true(cached(&c, 4000));
    check(&c);
    kv_cache_free(&c);
}

static void test_multi_step_discount(void **state) {
    (void)state;
    KvCache c;
    init(&c, 5);
    call(&c, "w1", "coder", 1000);
    call(&c, "w2", "tester", 2000);
    BraidError err;
    const char *agents[2] = {"coder", "tester"};
    /* w1: coder certain at step 3 only (0.7^2 = 0.49); w2: tester at step 1 with 0.3 */
    float p1[6] = {0, 0, 0, 0, 1, 0}, p2[6] = {0, 0.3f, 0, 0, 0, 0};
    assert_int_equal(kv_cache_predict(&c, "w1", "planner", 3, 2, agents, p1, &err), 0);
    assert_int_equal(kv_cache_predict(&c, "w2", "planner", 3, 2, agents, p2, &err), 0);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 2000)); /* 0.3 < 0.49, though more recent */
    assert_true(cached(&c, 1000));
    check(&c);
    kv_cache_free(&c);
}

/* A workflow's agent that branches away from the tail of its previous call leaves that tail dead:
 * it goes before anything an active workflow may still read, however recent. */
static void test_passed_tail_is_retired(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9);
    call(&c, "w2", "tester", 2000); /* older, active, no prediction */
    call(&c, "w1", "coder", 1000);  /* blocks 1000..1007 */
    /* w1's coder again: the first block shared, then it goes on differently (a new tail) */
    BraidError err;
    CacheIdentity id;
    assert_int_equal(kv_cache_identity(&c, NULL, NULL, "w1", "coder", &id, &err), 0);
    int32_t tokens[3 * BS + 1], table[4];
    for (int i = 0; i < 3 * BS + 1; i++) tokens[i] = i < BS ? 1000 + i : 7000 + i;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(&c, &id, tokens, 3 * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(&c, &m, table, &err);
    assert_int_equal(got, 1);
    assert_int_equal(kv_cache_reserve(&c, 2, table + 1), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(&c, &id, tokens, 3, table, &lock, false, &err), 0);
    kv_cache_release(&c, lock, table, 3);
    check(&c);
    /* the old tail (block 1004..1007) goes first, before w2's older but live prompt */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 1), 1);
    check(&c);
    assert_true(cached(&c, 2000));
    assert_false(cached(&c, 1000));
    kv_cache_free(&c);
}

/* The device policy's view of the node ending the 2-block prompt at base: its score, and whether
 * it counts as retired cache (reclaimable). The match that finds it touches it (recency only). */
static double node_score(KvCache *c, int32_t base, bool *retired) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(c, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    int32_t tokens[2 * BS + 1];
    for (int i = 0; i < 2 * BS + 1; i++) tokens[i] = base + i;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, 2 * BS + 1, &m, &err), 0);
    assert_int_equal(m.device_blocks, 2);
    const KvCacheTier *dev = &c->tiers[CACHE_TIER_DEVICE];
    double score = dev->policy->score(dev->state, m.node);
    if (retired) *retired = dev->policy->reclaimable(dev->state, m.node);
    kv_cache_release(c, m.node, NULL, 0);
    return score;
}

/* Eq. 2 sums over every active workflow of a node: a shared prompt's score grows with each of 12
 * workflows that use it and predict its agent (there is no cap on the users a node counts), and
 * twelve small expectations together outweigh one large one. */
static void test_popularity_counts_every_workflow(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9);
    char name[16];
    double last = 0;
    for (int k = 1; k <= 12; k++) {
        snprintf(name, sizeof name, "w%d", k);
        call(&c, name, "coder", 1000); /* the shared prompt */
        predict(&c, name, "planner", "coder", 0.1f, "tester", 0.0f);
        double score = node_score(&c, 1000, NULL);
        if (k > 1 && !(score - last > 0.04e12)) fail_msg("score with %d users %.6g, with %d %.6g: it must grow", k, score, k - 1, last);
        last = score;
    }
    call(&c, "wx", "tester", 2000); /* one workflow, more recent, 0.9 for its agent */
    predict(&c, "wx", "planner", "coder", 0.0f, "tester", 0.9f);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 2000)); /* 0.9 < 12 x 0.1 */
    assert_true(cached(&c, 1000));
    check(&c);
    kv_cache_free(&c);
}

/* A node two or more active workflows read (an agent's head) keeps one read for the workflows still
 * to come (PBKV_NEW_WORKFLOWS_WEIGHT): three workflows called the decomposer on a shared prompt and none
 * predicts it again (Eq. 2 alone values it 0), yet it outlives a more recent private prompt whose
 * agent is predicted with 0.5; a private prompt whose agent is not predicted gets nothing and goes
 * first. Without the weight the shared head, the least recent of the value-0 nodes, goes first. */
static void test_shared_head_kept_for_new_workflows(void **state) {
    (void)state;
    KvCache c;
    init(&c, 8); /* room for the three prompts and a spare */
    char name[16];
    for (int k = 1; k <= 3; k++) {
        snprintf(name, sizeof name, "w%d", k);
        call(&c, name, "decomposer", 1000); /* the decomposer's head, shared */
        predict(&c, name, "decomposer", "retriever", 0.9f, "verifier", 0.1f);
    }
    call(&c, "w4", "verifier", 2000); /* private, its agent predicted with 0.5 */
    predict(&c, "w4", "verifier", "retriever", 0.5f, "verifier", 0.5f);
    call(&c, "w5", "refiner", 3000); /* private, its agent not predicted */
    predict(&c, "w5", "refiner", "retriever", 0.9f, "verifier", 0.1f);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_true(cached(&c, 1000));
    assert_true(cached(&c, 2000));
    assert_false(cached(&c, 3000));
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_true(cached(&c, 1000)); /* 1 for the workflows to come > 0.5 */
    assert_false(cached(&c, 2000));
    check(&c);
    kv_cache_free(&c);
}

/* --pbkv-future reaches the policy: the shared head of test_shared_head_kept_for_new_workflows
 * (three of five active workflows read it, none predicts its agent again) against a private prompt
 * predicted at 0.5. On (the default, and 1) the head's read for the workflows to come keeps it; off
 * (-1) the head is worth 0 and goes before the predicted prompt. A value outside -1..1 is refused. */
static void test_future_option(void **state) {
    (void)state;
    const int futures[3] = {0, 1, -1};
    for (int f = 0; f < 3; f++) {
        KvCache c;
        BraidError err;
        KvCacheConfig cfg = {.block_size = BS, .device_blocks = 8, .policy = &evict_policy_pbkv, .policy_options = {.future = futures[f]}};
        if (kv_cache_init(&c, &cfg, &err)) fail_msg("%s", err.msg);
        char name[16];
        for (int k = 1; k <= 3; k++) {
            snprintf(name, sizeof name, "w%d", k);
            call(&c, name, "decomposer", 1000);
            predict(&c, name, "decomposer", "retriever", 0.9f, "verifier", 0.1f);
        }
        call(&c, "w4", "verifier", 2000);
        predict(&c, "w4", "verifier", "retriever", 0.5f, "verifier", 0.5f);
        call(&c, "w5", "refiner", 3000);
        predict(&c, "w5", "refiner", "retriever", 0.9f, "verifier", 0.1f);
        assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 4), 4); /* two of the three prompts go */
        bool on = futures[f] >= 0;
        assert_int_equal(cached(&c, 1000), on);  /* on: 1 > 0.5; off: 0, older than w5's prompt */
        assert_int_equal(cached(&c, 2000), !on); /* off: the only one with value left */
        assert_false(cached(&c, 3000));
        check(&c);
        kv_cache_free(&c);
    }
    KvCache c;
    BraidError err;
    KvCacheConfig bad = {.block_size = BS, .device_blocks = 8, .policy = &evict_policy_pbkv, .policy_options = {.future = 2}};
    assert_int_not_equal(kv_cache_init(&c, &bad, &err), 0);
    assert_non_null(strstr(err.msg, "future"));
}

/* A node is retired only when every workflow that used it ended: with 12 users, the 4 most recent
 * ending leaves it active (and ranked by recency against another active node), as does all but
 * the oldest ending; the last end retires it. */
static void test_not_retired_while_a_user_is_active(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9);
    call(&c, "wy", "tester", 2000); /* an active workflow's prompt, older than the shared one */
    char name[16];
    for (int k = 1; k <= 12; k++) {
        snprintf(name, sizeof name, "w%d", k);
        call(&c, name, "coder", 1000);
    }
    bool retired = true;
    for (int k = 12; k >= 1; k--) {
        snprintf(name, sizeof name, "w%d", k);
        kv_cache_workflow_end(&c, name);
        check(&c);
        node_score(&c, 1000, &retired);
        if (retired != (k == 1)) fail_msg("after w12..w%d ended the shared prompt is %s", k, retired ? "retired" : "active");
        if (k == 9) { /* its four newest users ended: the older prompt, still active, goes first (LRU) */
            call(&c, "wz", "tester", 3000);
            assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
            assert_false(cached(&c, 2000));
            assert_true(cached(&c, 1000));
            assert_true(cached(&c, 3000));
        }
    }
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2); /* retired now: first */
    assert_false(cached(&c, 1000));
    assert_true(cached(&c, 3000));
    check(&c);
    kv_cache_free(&c);
}

/* Past the bound on all nodes' uses the counts degrade to the documented approximation (a node's
 * least recent user gives way), the total never passes the bound, and it is counted. */
static void test_use_bound_holds(void **state) {
    (void)state;
    KvCache c;
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 9, .policy = &evict_policy_pbkv, .max_node_uses = 5};
    if (kv_cache_init(&c, &cfg, &err)) fail_msg("%s", err.msg);
    char name[16];
    for (int k = 1; k <= 8; k++) {
        snprintf(name, sizeof name, "w%d", k);
        call(&c, name, "coder", 1000);
        assert_true(c.n_uses <= 5);
    }
    assert_int_equal(c.n_uses, 5); /* w4..w8: for w6, w7, w8 the node's least recent user gave way */
    assert_int_equal(c.counters.uses_over_bound, 3);
    call(&c, "w9", "coder", 2000); /* a node with no users, at the bound: it does not learn of w9 */
    assert_int_equal(c.n_uses, 5);
    assert_int_equal(c.counters.uses_over_bound, 4);
    kv_cache_workflow_end(&c, "w8");
    check(&c);
    assert_int_equal(c.n_uses, 4);
    kv_cache_free(&c);
}

/* --pbkv-gamma reaches the policy: w1's coder is certain at step 3 only, w2's tester has 0.3 at
 * step 1. With the default 0.7, 0.7^2 = 0.49 keeps w1; with 0.5, 0.25 < 0.3 and w1 goes first. */
static void test_gamma_option(void **state) {
    (void)state;
    const double gammas[2] = {0.0, 0.5};
    for (int g = 0; g < 2; g++) {
        KvCache c;
        BraidError err;
        KvCacheConfig cfg = {.block_size = BS, .device_blocks = 5, .policy = &evict_policy_pbkv, .policy_options = {.gamma = gammas[g]}};
        if (kv_cache_init(&c, &cfg, &err)) fail_msg("%s", err.msg);
        call(&c, "w1", "coder", 1000);
        call(&c, "w2", "tester", 2000);
        const char *agents[2] = {"coder", "tester"};
        float p1[6] = {0, 0, 0, 0, 1, 0}, p2[6] = {0, 0.3f, 0, 0, 0, 0};
        assert_int_equal(kv_cache_predict(&c, "w1", "planner", 3, 2, agents, p1, &err), 0);
        assert_int_equal(kv_cache_predict(&c, "w2", "planner", 3, 2, agents, p2, &err), 0);
        assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
        assert_int_equal(cached(&c, 1000), g == 0);
        assert_int_equal(cached(&c, 2000), g == 1);
        check(&c);
        kv_cache_free(&c);
    }
    /* Out of (0, 1]: the cache refuses to start, saying why. */
    KvCache c;
    BraidError err;
    KvCacheConfig bad = {.block_size = BS, .device_blocks = 5, .policy = &evict_policy_pbkv, .policy_options = {.gamma = 1.5}};
    assert_int_not_equal(kv_cache_init(&c, &bad, &err), 0);
    assert_non_null(strstr(err.msg, "gamma"));
}

/* PBKV-LAE, the lifecycle half alone: retired cache first (as pbkv), then plain recency, whatever
 * the forecasts say (it takes none). */
static void test_lae_lifecycle_only(void **state) {
    (void)state;
    KvCache c;
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 9, .policy = &evict_policy_pbkv_lae};
    if (kv_cache_init(&c, &cfg, &err)) fail_msg("%s", err.msg);
    call(&c, "w1", "coder", 1000);  /* oldest, predicted next with 0.9: pbkv would keep it */
    call(&c, "w2", "tester", 2000); /* its workflow ends: retired */
    call(&c, "w3", "planner", 3000);
    call(&c, "w4", "coder", 4000);
    predict(&c, "w1", "planner", "coder", 0.9f, "tester", 0.1f);
    kv_cache_workflow_end(&c, "w2");
    check(&c);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 2000)); /* retired: first, though not the oldest (a miss touches nothing) */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_false(cached(&c, 1000)); /* then LRU: the forecast is not read */
    assert_true(cached(&c, 3000));
    assert_true(cached(&c, 4000));
    check(&c);
    kv_cache_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retired_first),
        cmocka_unit_test(test_popular_retired_last),
        cmocka_unit_test(test_lookahead_beats_recency),
        cmocka_unit_test(test_multi_step_discount),
        cmocka_unit_test(test_passed_tail_is_retired),
        cmocka_unit_test(test_popularity_counts_every_workflow),
        cmocka_unit_test(test_shared_head_kept_for_new_workflows),
        cmocka_unit_test(test_future_option),
        cmocka_unit_test(test_not_retired_while_a_user_is_active),
        cmocka_unit_test(test_use_bound_holds),
        cmocka_unit_test(test_gamma_option),
        cmocka_unit_test(test_lae_lifecycle_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
