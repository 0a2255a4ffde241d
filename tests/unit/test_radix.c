/*
 * Radix prefix cache + block pool: deterministic cases (never the whole prompt, node split,
 * duplicates, namespaces, locking, LRU order) and a property test that serves thousands of random
 * requests (match, lock, allocate with eviction, insert, release) against a naive model of which
 * prefixes are cached, checking every match and the accounting invariant after every step.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/block_pool.h"
#include "cache/radix_tree.h"

#define BS 4

static void check_all(const RadixTree *t) {
    BraidError err;
    if (radix_check(t, &err)) fail_msg("%s", err.msg);
}

/* Simulates a request that computed n_blocks full blocks: allocates them, inserts, releases. */
static int insert_fresh(RadixTree *t, BlockPool *p, uint64_t ns, const int32_t *tokens, int n_blocks) {
    int32_t blocks[64];
    BraidError err;
    assert_int_equal(block_pool_alloc(p, n_blocks, blocks), 0);
    int cached;
    assert_int_equal(radix_insert(t, ns, tokens, n_blocks, blocks, &cached, NULL, &err), 0);
    for (int i = 0; i < n_blocks; i++) block_pool_release(p, blocks[i]);
    return cached;
}

static void test_match_insert_split(void **state) {
    (void)state;
    BlockPool p;
    RadixTree t;
    BraidError err;
    assert_int_equal(block_pool_init(&p, 32, &err), 0);
    assert_int_equal(radix_init(&t, &p, BS, &evict_policy_lru, NULL, &err), 0);
    uint64_t ns = radix_namespace(1, 0);
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = b[i] = 100 + i;
    b[9] = 7; /* b diverges inside block 2 */
    RadixMatch m;
    assert_int_equal(radix_match_prefix(&t, ns, a, 16, &m, &err), 0);
    assert_int_equal(m.n_blocks, 0);
    free(m.blocks);

    assert_int_equal(insert_fresh(&t, &p, ns, a, 3), 0);
    assert_int_equal(p.n_cached, 3);
    check_all(&t);
    /* a[0..13): 3 full blocks cached and 13 > 12, so all three match */
    assert_int_equal(radix_match_prefix(&t, ns, a, 13, &m, &err), 0);
    assert_int_equal(m.n_blocks, 3);
    free(m.blocks);
    /* exactly the cached 12 tokens: never the whole prompt, so (12 - 1) / 4 = 2 blocks, splitting the node */
    assert_int_equal(radix_match_prefix(&t, ns, a, 12, &m, &err), 0);
    assert_int_equal(m.n_blocks, 2);
    assert_int_equal(m.node->n_blocks, 2);
    assert_int_equal(m.node->n_children, 1);
    free(m.blocks);
    check_all(&t);
    /* b shares two blocks: insert reports them as already cached */
    assert_int_equal(insert_fresh(&t, &p, ns, b, 4), 2);
    assert_int_equal(p.n_cached, 3 + 2);
    assert_int_equal(p.n_free, 31 - 5);
    check_all(&t);
    /* other tenants and adapters see nothing */
    assert_int_equal(radix_match_prefix(&t, radix_namespace(2, 0), a, 13, &m, &err), 0);
    assert_int_equal(m.n_blocks, 0);
    free(m.blocks);
    assert_int_equal(radix_match_prefix(&t, radix_namespace(1, 5), a, 13, &m, &err), 0);
    assert_int_equal(m.n_blocks, 0);
    free(m.blocks);
    radix_free(&t);
    assert_int_equal(p.n_free, 31);
    block_pool_free(&p);
}

static void test_lock_and_lru_order(void **state) {
    (void)state;
    BlockPool p;
    RadixTree t;
    BraidError err;
    assert_int_equal(block_pool_init(&p, 16, &err), 0);
    assert_int_equal(radix_init(&t, &p, BS, &evict_policy_lru, NULL, &err), 0);
    uint64_t ns = radix_namespace(0, 0);
    int32_t s1[8] = {1, 1, 1, 1, 2, 2, 2, 2}, s2[8] = {3, 3, 3, 3, 4, 4, 4, 4}, s3[8] = {5, 5, 5, 5, 6, 6, 6, 6};
    insert_fresh(&t, &p, ns, s1, 2);
    insert_fresh(&t, &p, ns, s2, 2);
    insert_fresh(&t, &p, ns, s3, 2);
    RadixMatch m;
    int32_t q1[9] = {1, 1, 1, 1, 2, 2, 2, 2, 9};
    assert_int_equal(radix_match_prefix(&t, ns, q1, 9, &m, &err), 0); /* s1 becomes most recent */
    assert_int_equal(m.n_blocks, 2);
    radix_lock(&t, m.node);
    check_all(&t);
    int32_t out[16];
    /* s1 is locked; LRU evicts s2 first (older than s3) */
    assert_int_equal(radix_evict(&t, 2, out), 2);
    int32_t q2[9] = {3, 3, 3, 3, 4, 4, 4, 4, 9};
    RadixMatch m2;
    assert_int_equal(radix_match_prefix(&t, ns, q2, 9, &m2, &err), 0);
    assert_int_equal(m2.n_blocks, 0);
    free(m2.blocks);
    /* everything unlocked goes; the locked path stays */
    assert_int_equal(radix_evict(&t, 100, out), 2);
    assert_int_equal(radix_evictable_blocks(&t), 0);
    assert_int_equal(t.cached_blocks, 2);
    check_all(&t);
    radix_unlock(&t, m.node);
    free(m.blocks);
    assert_int_equal(radix_evictable_blocks(&t), 2);
    assert_int_equal(radix_evict(&t, 100, out), 2);
    assert_int_equal(t.cached_blocks, 0);
    assert_int_equal(p.n_free, 15);
    check_all(&t);
    radix_free(&t);
    block_pool_free(&p);
}

/* ---- property test ---- */

typedef struct {
    uint64_t key;   /* hash of (namespace, tokens of the prefix through this block) */
    int32_t block;
} ModelEntry;

typedef struct {
    ModelEntry *entries;
    int n, cap;
} NaiveModel;

static uint64_t prefix_key(uint64_t ns, const int32_t *tokens, int n_tokens) {
    uint64_t h = 1469598103934665603ull ^ ns;
    for (int i = 0; i < n_tokens; i++) h = (h ^ (uint32_t)tokens[i]) * 1099511628211ull;
    return h;
}

static int32_t model_find(const NaiveModel *m, uint64_t key) {
    for (int i = 0; i < m->n; i++)
        if (m->entries[i].key == key) return m->entries[i].block;
    return -1;
}

static void model_add(NaiveModel *m, uint64_t key, int32_t block) {
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 64;
        m->entries = realloc(m->entries, (size_t)m->cap * sizeof *m->entries);
    }
    m->entries[m->n++] = (ModelEntry){key, block};
}

static void model_remove_block(NaiveModel *m, int32_t block) {
    for (int i = 0; i < m->n; i++)
        if (m->entries[i].block == block) {
            m->entries[i] = m->entries[--m->n];
            return;
        }
    fail_msg("evicted block %d was not cached in the model", block);
}

typedef struct {
    uint64_t ns;
    int32_t tokens[64];
    int n_tokens;
    RadixNode *node;
    int32_t blocks[17];
    int n_matched, n_blocks; /* n_blocks includes the partial block, if any */
} Request;

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void evict_and_record(RadixTree *t, NaiveModel *model, Request *active, int n_active, int need) {
    int32_t out[4096];
    int n = radix_evict(t, need, out);
    for (int i = 0; i < n; i++) {
        for (int r = 0; r < n_active; r++)
            for (int b = 0; b < active[r].n_matched; b++)
                if (active[r].blocks[b] == out[i]) fail_msg("evicted block %d that a running request has locked", out[i]);
        model_remove_block(model, out[i]);
    }
}

static int start_request(RadixTree *t, BlockPool *p, NaiveModel *model, Request *r, Request *active, int n_active) {
    BraidError err;
    RadixMatch m;
    assert_int_equal(radix_match_prefix(t, r->ns, r->tokens, r->n_tokens, &m, &err), 0);
    /* expected: the longest cached prefix in whole blocks, at most n - 1 tokens */
    int limit = (r->n_tokens - 1) / BS, expect = 0;
    while (expect < limit && model_find(model, prefix_key(r->ns, r->tokens, (expect + 1) * BS)) >= 0) expect++;
    if (m.n_blocks != expect) fail_msg("match of %d tokens gave %d blocks, model says %d", r->n_tokens, m.n_blocks, expect);
    for (int b = 0; b < m.n_blocks; b++)
        assert_int_equal(m.blocks[b], model_find(model, prefix_key(r->ns, r->tokens, (b + 1) * BS)));
    radix_lock(t, m.node);
    for (int b = 0; b < m.n_blocks; b++) block_pool_hold(p, m.blocks[b]);
    r->node = m.node;
    r->n_matched = m.n_blocks;
    memcpy(r->blocks, m.blocks, (size_t)m.n_blocks * sizeof *m.blocks);
    free(m.blocks);
    r->n_blocks = (r->n_tokens + BS - 1) / BS;
    int need = r->n_blocks - r->n_matched;
    if (need > p->n_free) evict_and_record(t, model, active, n_active, need - p->n_free);
    if (block_pool_alloc(p, need, r->blocks + r->n_matched) == 0) return 0;
    /* could not fit: give everything back, as a scheduler would before requeueing */
    for (int b = 0; b < r->n_matched; b++) block_pool_release(p, r->blocks[b]);
    radix_unlock(t, r->node);
    return -1;
}

static void finish_request(RadixTree *t, BlockPool *p, NaiveModel *model, Request *r) {
    BraidError err;
    int full = r->n_tokens / BS, cached;
    assert_int_equal(radix_insert(t, r->ns, r->tokens, full, r->blocks, &cached, NULL, &err), 0);
    assert_true(cached >= r->n_matched);
    for (int b = cached; b < full; b++) model_add(model, prefix_key(r->ns, r->tokens, (b + 1) * BS), r->blocks[b]);
    for (int b = 0; b < r->n_blocks; b++) block_pool_release(p, r->blocks[b]);
    radix_unlock(t, r->node);
}

static void make_tokens(Request *r, const int32_t bases[4][64]) {
    /* a shared base prefix of random length, then random tokens from a tiny alphabet */
    const int32_t *base = bases[rnd() % 4];
    int keep = (int)(rnd() % 64), n = 1 + (int)(rnd() % 64);
    for (int i = 0; i < n; i++) r->tokens[i] = i < keep ? base[i] : (int32_t)(rnd() % 3);
    r->n_tokens = n;
    r->ns = radix_namespace((uint32_t)(rnd() % 2), (uint32_t)(rnd() % 2));
}

static void test_property_against_naive_model(void **state) {
    (void)state;
    BlockPool p;
    RadixTree t;
    BraidError err;
    assert_int_equal(block_pool_init(&p, 80, &err), 0);
    assert_int_equal(radix_init(&t, &p, BS, &evict_policy_lru, NULL, &err), 0);
    NaiveModel model = {0};
    Request active[8];
    int n_active = 0, served = 0, rejected = 0;
    int32_t bases[4][64];
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 64; i++) bases[b][i] = (int32_t)(rnd() % 5);
    for (int step = 0; step < 20000; step++) {
        uint64_t op = rnd() % 10;
        if (op < 5 && n_active < 8) {
            make_tokens(&active[n_active], (const int32_t(*)[64])bases);
            if (start_request(&t, &p, &model, &active[n_active], active, n_active) == 0) n_active++;
            else rejected++;
        } else if (op < 9 && n_active > 0) {
            int i = (int)(rnd() % (uint64_t)n_active);
            finish_request(&t, &p, &model, &active[i]);
            active[i] = active[--n_active];
            served++;
        } else {
            evict_and_record(&t, &model, active, n_active, 1 + (int)(rnd() % 8));
        }
        if (radix_check(&t, &err)) fail_msg("step %d: %s", step, err.msg);
        assert_int_equal(t.cached_blocks, model.n);
    }
    while (n_active > 0) finish_request(&t, &p, &model, &active[--n_active]);
    check_all(&t);
    fprintf(stderr, "radix property: %d requests served, %d could not fit, %llu evicted blocks, %llu matched tokens\n", served,
            rejected, (unsigned long long)t.counters.evicted_blocks, (unsigned long long)t.counters.matched_tokens);
    assert_true(served > 5000 && t.counters.evicted_blocks > 100 && t.counters.matched_tokens > 1000);
    free(model.entries);
    radix_free(&t);
    assert_int_equal(p.n_free, 79);
    block_pool_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_insert_split),
        cmocka_unit_test(test_lock_and_lru_order),
        cmocka_unit_test(test_property_against_naive_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
