/*
 * The kvflow eviction policy (the KVFlow baseline) on hand-built caches: under pressure the cache
 * of the agent farthest from execution goes first (steps-to-execution from the most likely agent of
 * each predicted call, so an agent that is merely possible early still counts as far), a shared
 * prefix takes its nearest agent's value, priorities come in KVFlow's bands (far, not-in-graph and
 * untagged cache alike, by recency), a new prediction replaces the old one, a workflow end only
 * forgets the workflow (no retired-first class), the workflow map is bounded and survives removals,
 * and the host tier is LRU. After every operation the cache's full check runs, and every heap key must equal the
 * policy's current score (no stale keys).
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

#define BS 4

static void check(const KvCache *c) {
    BraidError err;
    if (kv_cache_check(c, &err)) fail_msg("%s", err.msg);
    for (int t = 0; t < CACHE_N_TIERS; t++) {
        const KvCacheTier *tier = &c->tiers[t];
        for (int i = 0; i < tier->heap.n; i++) {
            const RadixNode *n = tier->heap.nodes[i];
            assert_true(n->heap_key[t] == tier->policy->score(tier->state, n));
        }
    }
}

static void init(KvCache *c, int device_blocks, int host_blocks) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = device_blocks, .host_blocks = host_blocks, .policy = &evict_policy_kvflow};
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
    check(c);
}

/* n_blocks blocks of tokens base, base + 1, ... (plus one more token, so all of them can match) */
static void prompt(int32_t *tokens, int32_t base, int n_blocks) {
    for (int i = 0; i < n_blocks * BS + 1; i++) tokens[i] = base + i;
}

/* One call of `agent` in `workflow` (NULL = none): its prompt is matched, the rest computed,
 * everything committed and released. */
static void call_tokens(KvCache *c, const char *workflow, const char *agent, const int32_t *tokens, int n_blocks) {
    BraidError err;
    CacheIdentity id;
    if (kv_cache_identity(c, NULL, NULL, workflow, agent, &id, &err)) fail_msg("%s", err.msg);
    int32_t table[16];
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, n_blocks * BS + 1, &m, &err), 0);
    check(c);
    int got = kv_cache_acquire(c, &m, table, &err);
    assert_true(got >= 0);
    check(c);
    assert_int_equal(kv_cache_reserve(c, n_blocks - got, table + got), 0);
    check(c);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, &id, tokens, n_blocks, table, &lock, false, &err), 0);
    check(c);
    kv_cache_release(c, lock, table, n_blocks);
    check(c);
}

static void call(KvCache *c, const char *workflow, const char *agent, int32_t base, int n_blocks) {
    int32_t tokens[16 * BS + 1];
    prompt(tokens, base, n_blocks);
    call_tokens(c, workflow, agent, tokens, n_blocks);
}

/* Blocks of the prompt at base cached on a tier, found by walking the tree (a match would touch
 * the nodes and change the recency the tie-breaks use). */
static int resident(const KvCache *c, int32_t base, int n_blocks, unsigned tier_bit) {
    int32_t tokens[16 * BS + 1];
    prompt(tokens, base, n_blocks);
    const RadixNode *node = NULL;
    for (int i = 0; i < c->tree.n_roots; i++)
        if (c->tree.roots[i].ns == radix_namespace(0, 0)) node = c->tree.roots[i].root;
    int pos = 0, found = 0;
    while (node && pos < n_blocks) {
        const RadixNode *next = NULL;
        for (int i = 0; i < node->n_children && !next; i++)
            if (memcmp(node->children[i]->tokens, tokens + pos * BS, BS * sizeof *tokens) == 0) next = node->children[i];
        if (!next) break;
        for (int b = 0; b < next->n_blocks && pos < n_blocks; b++, pos++) {
            if (memcmp(next->tokens + b * BS, tokens + pos * BS, BS * sizeof *tokens) != 0) return found;
            if (next->meta.tiers & tier_bit) found++;
        }
        node = next;
    }
    return found;
}

static bool on_device(const KvCache *c, int32_t base, int n_blocks) { return resident(c, base, n_blocks, CACHE_ON_DEVICE) == n_blocks; }

static void predict(KvCache *c, const char *workflow, const char *current, int k, int n_agents, const char *const *agents,
                    const float *prob) {
    BraidError err;
    if (kv_cache_predict(c, workflow, current, k, n_agents, agents, prob, &err)) fail_msg("%s", err.msg);
    check(c);
}

static void evict(KvCache *c, CacheTier tier, int n) {
    assert_int_equal(kv_cache_evict(c, tier, n), n);
    check(c);
}

static uint64_t next_random(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static const char *const XWY[3] = {"X", "W", "Y"};
/* k = 3 over {X, W, Y}: X is the most likely next call, W the second, Y the third — although Y
 * has some chance at every step (its shortest path would be 1; its steps-to-execution is 3). */
static const float XWY_PROB[9] = {0.8f, 0.1f, 0.1f, /* call 1 */
                                  0.1f, 0.7f, 0.2f, /* call 2 */
                                  0.1f, 0.2f, 0.6f /* call 3 */};

static void test_farthest_first(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9, 0); /* 8 blocks: four 2-block prompts */
    call(&c, "w1", "router", 1000, 2); /* LRU order is the reverse of KVFlow's here */
    call(&c, "w1", "X", 2000, 2);
    call(&c, "w1", "W", 3000, 2);
    call(&c, "w1", "Y", 4000, 2);
    predict(&c, "w1", "router", 3, 3, XWY, XWY_PROB);
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 4000, 2)); /* Y: 3 steps away */
    assert_true(on_device(&c, 1000, 2) && on_device(&c, 2000, 2) && on_device(&c, 3000, 2));
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 3000, 2)); /* W: 2 */
    assert_true(on_device(&c, 1000, 2) && on_device(&c, 2000, 2));
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 2000, 2)); /* X: next */
    assert_true(on_device(&c, 1000, 2));  /* the agent running now: last */
    kv_cache_free(&c);
}

static void test_shared_prefix_takes_nearest_agent(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9, 0);
    int32_t shared[3 * BS + 1];
    prompt(shared, 5000, 3);
    shared[2 * BS] = 9000; /* Y's private third block after the shared two */
    call(&c, "w1", "X", 5000, 2);          /* X's prompt is the shared prefix */
    call_tokens(&c, "w1", "Y", shared, 3); /* Y's: the prefix + a private block */
    call(&c, "w2", "Z", 5000, 2);          /* another workflow's agent (not in any graph) uses it too */
    call(&c, "w1", "W", 2000, 2);          /* newest */
    predict(&c, "w1", "router", 3, 3, XWY, XWY_PROB);
    evict(&c, CACHE_TIER_DEVICE, 1);
    assert_int_equal(resident(&c, 5000, 2, CACHE_ON_DEVICE), 2);
    assert_true(on_device(&c, 2000, 2));
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_DEVICE), 4); /* Y's private block went */
    /* the prefix (agents X = 1, Y = 3, w2's Z = not in graph) takes X's 1 and outlives W's 2, though
     * LRU, or a rule taking Y's or Z's value, would drop it first */
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 2000, 2));
    assert_true(on_device(&c, 5000, 2));
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 5000, 2));
    kv_cache_free(&c);
}

static void test_bands_tie_by_recency(void **state) {
    (void)state;
    KvCache c;
    init(&c, 9, 0);
    static const char *const XY[2] = {"X", "Y"};
    static const float p[6] = {1, 0, 1, 0, 0, 1}; /* X next, Y in 3 */
    call(&c, "w1", "Q", 1000, 2);   /* w1's agent the graph does not name */
    call(&c, NULL, NULL, 2000, 2);  /* no workflow, no agent */
    call(&c, "w1", "Y", 3000, 2);   /* 3 steps away: the same band as the two above (hold_step 4) */
    call(&c, "w1", "X", 4000, 2);   /* next */
    predict(&c, "w1", "router", 3, 2, XY, p);
    /* within the far band KVFlow does not rank 3 against "not in graph" or "untagged": recency */
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 1000, 2));
    assert_true(on_device(&c, 2000, 2) && on_device(&c, 3000, 2));
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 2000, 2));
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 3000, 2));
    assert_true(on_device(&c, 4000, 2));
    kv_cache_free(&c);
}

static void test_prediction_replaces_previous(void **state) {
    (void)state;
    KvCache c;
    init(&c, 5, 0);
    static const char *const XY[2] = {"X", "Y"};
    static const float x_first[6] = {1, 0, 0, 0, 0, 1}, y_first[6] = {0, 1, 0, 0, 1, 0};
    call(&c, "w1", "Y", 1000, 2);
    call(&c, "w1", "X", 2000, 2);
    predict(&c, "w1", "router", 3, 2, XY, x_first);
    predict(&c, "w1", "router", 3, 2, XY, y_first); /* now Y next, X in 3 */
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 2000, 2)); /* X, though more recent and once next */
    assert_true(on_device(&c, 1000, 2));
    kv_cache_free(&c);
}

static void test_workflow_end_only_forgets(void **state) {
    (void)state;
    KvCache c;
    init(&c, 7, 0);
    static const char *const A[1] = {"A"}, *const DC[2] = {"D", "C"};
    static const float a_next[1] = {1}, c_second[4] = {1, 0, 0, 1};
    call(&c, "w2", "B", 1000, 2); /* w2: never predicted */
    call(&c, "w3", "C", 2000, 2);
    call(&c, "w1", "A", 3000, 2);
    predict(&c, "w1", "router", 1, 1, A, a_next);  /* A: 1 */
    predict(&c, "w3", "router", 2, 2, DC, c_second); /* C: 2 */
    kv_cache_workflow_end(&c, "w1");
    check(&c);
    /* A falls out of the graph: the far band with B, and B is older. No retired-first class. */
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 1000, 2));
    assert_true(on_device(&c, 3000, 2));
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 3000, 2)); /* before the end it would have outlived C */
    assert_true(on_device(&c, 2000, 2));
    kv_cache_workflow_end(&c, "w9"); /* unknown: nothing */
    check(&c);
    kv_cache_free(&c);
}

static void test_map_is_bounded(void **state) {
    (void)state;
    KvCache c;
    init(&c, 5, 0);
    static const char *const A[1] = {"A"}, *const DC[2] = {"D", "C"};
    static const float a_next[1] = {1}, c_second[4] = {1, 0, 0, 1};
    call(&c, "first", "A", 1000, 2);
    call(&c, "last", "C", 2000, 2);
    predict(&c, "first", "router", 1, 1, A, a_next); /* A: 1, the least recently updated */
    predict(&c, "last", "router", 2, 2, DC, c_second); /* C: 2 */
    char name[32];
    for (int i = 0; i < 4095; i++) { /* 4097 workflows in all: "first" is forgotten */
        snprintf(name, sizeof name, "filler-%d", i);
        predict(&c, name, "router", 1, 1, A, a_next);
    }
    kv_cache_workflow_end(&c, "filler-7"); /* removal from the middle of the map */
    check(&c);
    evict(&c, CACHE_TIER_DEVICE, 2);
    assert_false(on_device(&c, 1000, 2));
    assert_true(on_device(&c, 2000, 2));
    kv_cache_free(&c);
}

/* Scattered workflow ids crowd and interleave in the map's probe runs: ending half of the
 * workflows must leave every other one findable (its cache keeps "next" and outlives the ended
 * ones). */
static void test_map_removal_keeps_others(void **state) {
    (void)state;
    enum { N = 200, NAMES = 16384 };
    KvCache c;
    init(&c, N + 1, 0);
    static const char *const A[1] = {"A"};
    static const float a_next[1] = {1};
    char name[32];
    for (int i = 0; i < NAMES; i++) { /* interned in order: consecutive ids */
        BraidError err;
        CacheIdentity id;
        snprintf(name, sizeof name, "wf-%d", i);
        if (kv_cache_identity(&c, NULL, NULL, name, NULL, &id, &err)) fail_msg("%s", err.msg);
    }
    static bool taken[NAMES];
    int pick[N];
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int j = 0; j < N; j++) {
        do pick[j] = (int)(next_random(&rng) % NAMES);
        while (taken[pick[j]]);
        taken[pick[j]] = true;
        snprintf(name, sizeof name, "wf-%d", pick[j]);
        call(&c, name, "A", 1000 + 100 * j, 1);
        predict(&c, name, "router", 1, 1, A, a_next);
    }
    for (int j = 1; j < N; j += 2) {
        snprintf(name, sizeof name, "wf-%d", pick[j]);
        kv_cache_workflow_end(&c, name);
        check(&c);
    }
    evict(&c, CACHE_TIER_DEVICE, N / 2);
    for (int j = 0; j < N; j++) assert_int_equal(on_device(&c, 1000 + 100 * j, 1), j % 2 == 0);
    kv_cache_free(&c);
}

static void test_host_tier_is_lru(void **state) {
    (void)state;
    KvCache c;
    init(&c, 5, 5); /* 4 device blocks, 4 host blocks */
    static const char *const XY[2] = {"X", "Y"};
    static const float p[6] = {1, 0, 0, 0, 0, 1}; /* X next, Y in 3 */
    call(&c, "w1", "X", 1000, 2); /* older */
    call(&c, "w1", "Y", 2000, 2);
    predict(&c, "w1", "router", 3, 2, XY, p);
    evict(&c, CACHE_TIER_DEVICE, 4); /* both demoted, Y first */
    assert_int_equal(resident(&c, 1000, 2, CACHE_ON_HOST), 2);
    assert_int_equal(resident(&c, 2000, 2, CACHE_ON_HOST), 2);
    evict(&c, CACHE_TIER_HOST, 2); /* KVFlow's evict_host: least recently used, whatever the graph says */
    assert_int_equal(resident(&c, 1000, 2, CACHE_ON_HOST), 0);
    assert_int_equal(resident(&c, 2000, 2, CACHE_ON_HOST), 2);
    kv_cache_free(&c);
}

/* Random calls, predictions, ends and evictions over both tiers: the cache stays consistent and no
 * heap key goes stale. */
static void test_random_operations(void **state) {
    (void)state;
    KvCache c;
    init(&c, 17, 9);
    static const char *const WF[4] = {"w0", "w1", "w2", NULL}, *const AG[5] = {"a", "b", "c", "d", "e"};
    uint64_t rng = 88172645463325252ull;
    for (int op = 0; op < 3000; op++) {
        int kind = (int)(next_random(&rng) % 10);
        const char *wf = WF[next_random(&rng) % 4];
        if (kind < 5) {
            int32_t tokens[4 * BS + 1];
            int n = 1 + (int)(next_random(&rng) % 4);
            prompt(tokens, 0, n);
            for (int b = 1; b < n; b++) tokens[b * BS] = (int32_t)(next_random(&rng) % 3); /* branching */
            const char *agent = wf ? AG[next_random(&rng) % 5] : NULL;
            BraidError err;
            CacheIdentity id;
            if (kv_cache_identity(&c, NULL, NULL, wf, agent, &id, &err)) fail_msg("%s", err.msg);
            int32_t table[8];
            KvCacheMatch m;
            assert_int_equal(kv_cache_match(&c, &id, tokens, n * BS + 1, &m, &err), 0);
            int got = kv_cache_acquire(&c, &m, table, &err);
            assert_true(got >= 0);
            RadixNode *lock = m.node;
            if (kv_cache_reserve(&c, n - got, table + got) == 0) {
                assert_int_equal(kv_cache_commit(&c, &id, tokens, n, table, &lock, false, &err), 0);
                kv_cache_release(&c, lock, table, n);
            } else {
                kv_cache_release(&c, lock, table, got);
            }
            check(&c);
        } else if (kind < 8 && wf) {
            float prob[3 * 5];
            for (int i = 0; i < 15; i++) prob[i] = (float)(next_random(&rng) % 4) / 8.0f;
            predict(&c, wf, AG[next_random(&rng) % 5], 1 + (int)(next_random(&rng) % 3), 5, AG, prob);
        } else if (kind == 8 && wf) {
            kv_cache_workflow_end(&c, wf);
            check(&c);
        } else {
            CacheTier t = next_random(&rng) % 2 ? CACHE_TIER_DEVICE : CACHE_TIER_HOST;
            kv_cache_evict(&c, t, 1 + (int)(next_random(&rng) % 3));
            check(&c);
        }
    }
    kv_cache_free(&c);
}

static void test_registered(void **state) {
    (void)state;
    assert_ptr_equal(evict_policy_find("kvflow"), &evict_policy_kvflow);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_farthest_first),
        cmocka_unit_test(test_shared_prefix_takes_nearest_agent),
        cmocka_unit_test(test_bands_tie_by_recency),
        cmocka_unit_test(test_prediction_replaces_previous),
        cmocka_unit_test(test_workflow_end_only_forgets),
        cmocka_unit_test(test_map_is_bounded),
        cmocka_unit_test(test_map_removal_keeps_others),
        cmocka_unit_test(test_host_tier_is_lru),
        cmocka_unit_test(test_random_operations),
        cmocka_unit_test(test_registered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
