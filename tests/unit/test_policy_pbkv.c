/*
 * The pbkv eviction policy on hand-built caches: retired workflows' cache goes first (the popular
 * before the private last), then the lowest K-step lookahead score — a node whose agent is
 * predicted next outlives a more recent node whose agent is not — and a new prediction re-ranks
 * existing nodes. The cache's full check runs after every operation.
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retired_first),
        cmocka_unit_test(test_popular_retired_last),
        cmocka_unit_test(test_lookahead_beats_recency),
        cmocka_unit_test(test_multi_step_discount),
        cmocka_unit_test(test_passed_tail_is_retired),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
