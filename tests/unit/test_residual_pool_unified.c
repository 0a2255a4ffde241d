/*
 * test_residual_pool_unified.c — ForkKV's unified base/residual pool (cache/residual_cache.h,
 * residual_cache_unify; issue 36): residual blocks live in base blocks borrowed from the base
 * KvCache, are given back when unused (no leak), are evicted in one LRU order with the base, and
 * never outlive the base blocks of the same tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cache/residual_cache.h"

enum { BS = 4, BASE_BLOCKS = 16, PER = 4 };

static void init_pools(KvCache *base, ResidualCache *rc) {
    BraidError err;
    KvCacheConfig cc = {.block_size = BS, .device_blocks = BASE_BLOCKS + 1};
    assert_int_equal(kv_cache_init(base, &cc, &err), 0);
    assert_int_equal(residual_cache_init(rc, BASE_BLOCKS * PER + 1, BS, NULL, NULL, &err), 0);
    assert_int_equal(residual_cache_unify(rc, base, PER, &err), 0);
}

static void free_pools(KvCache *base, ResidualCache *rc) {
    residual_cache_free(rc);
    assert_int_equal(kv_cache_in_use(base, CACHE_TIER_DEVICE), 0); /* every carrier came back */
    kv_cache_free(base);
}

static void fill(int32_t *tokens, int n, int seed) {
    for (int i = 0; i < n; i++) tokens[i] = seed * 1000 + i;
}

/* A request of the base model of `tenant` computes and caches tokens[0 .. n_blocks blocks). 0, or 1
 * when the base cannot supply its blocks. */
static int base_put(KvCache *c, const char *tenant, const int32_t *tokens, int n_blocks) {
    BraidError err;
    CacheIdentity id;
    assert_int_equal(kv_cache_identity(c, tenant, NULL, NULL, NULL, &id, &err), 0);
    KvCacheMatch m;
    int32_t table[BASE_BLOCKS];
    assert_int_equal(kv_cache_match(c, &id, tokens, n_blocks * BS + 1, &m, &err), 0);
    int got = kv_cache_acquire(c, &m, table, &err);
    assert_true(got >= 0);
    int ok = kv_cache_reserve(c, n_blocks - got, table + got) == 0;
    RadixNode *lock = m.node;
    if (ok) assert_int_equal(kv_cache_commit(c, &id, tokens, n_blocks, table, &lock, false, &err), 0);
    kv_cache_release(c, lock, table, ok ? n_blocks : got);
    kv_cache_identity_release(c, &id);
    return ok ? 0 : 1;
}

/* Blocks of tokens the base holds for `tenant` (a peek through a match). */
static int base_matched(KvCache *c, const char *tenant, const int32_t *tokens, int n_blocks) {
    BraidError err;
    CacheIdentity id;
    assert_int_equal(kv_cache_identity(c, tenant, NULL, NULL, NULL, &id, &err), 0);
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, &id, tokens, n_blocks * BS + 1, &m, &err), 0);
    kv_cache_release(c, m.node, NULL, 0);
    kv_cache_identity_release(c, &id);
    return m.device_blocks;
}

/* A forked request of `adapter`: holds its residual, grows it to n_blocks, commits, releases. */
static int residual_put(ResidualCache *rc, const char *adapter, const int32_t *tokens, int n_blocks) {
    BraidError err;
    ResidualHold h = {0};
    assert_int_equal(residual_cache_identity(rc, &h, "t", adapter, &err), 0);
    assert_int_equal(residual_cache_admit(rc, &h, tokens, n_blocks * BS + 1, &err), 0);
    int short_of = residual_cache_grow(rc, &h, n_blocks * BS, &err);
    assert_true(short_of >= 0);
    if (short_of == 0) assert_int_equal(residual_cache_commit(rc, &h, tokens, n_blocks, false, &err), 0);
    residual_cache_hold_free(rc, &h);
    assert_int_equal(residual_cache_check(rc, &err), 0);
    return short_of;
}

static int residual_matched(ResidualCache *rc, const char *adapter, const int32_t *tokens, int n_blocks) {
    BraidError err;
    ResidualHold h = {0};
    assert_int_equal(residual_cache_identity(rc, &h, "t", adapter, &err), 0);
    assert_int_equal(residual_cache_admit(rc, &h, tokens, n_blocks * BS + 1, &err), 0);
    int got = h.n_blocks;
    residual_cache_hold_free(rc, &h);
    return got;
}

/* Residual blocks take whole base blocks (PER to one), only as many as they need, and give them
 * back once unused: no carrier outlives the residuals it carries. */
static void test_carriers_follow_residuals(void **state) {
    (void)state;
    KvCache base;
    ResidualCache rc;
    init_pools(&base, &rc);
    int32_t doc[6 * BS];
    fill(doc, 6 * BS, 1);
    assert_int_equal(base_put(&base, "t", doc, 6), 0);
    assert_int_equal(residual_put(&rc, "coder", doc, 6), 0);
    assert_int_equal(residual_cache_carriers(&rc), 2); /* 6 residual blocks in base blocks of 4 */
    assert_int_equal(kv_cache_in_use(&base, CACHE_TIER_DEVICE), 2);
    assert_int_equal(kv_cache_free_blocks(&base, CACHE_TIER_DEVICE), BASE_BLOCKS - 6 - 2);
    /* A hold that grows and is dropped uncommitted returns what it borrowed. */
    BraidError err;
    ResidualHold h = {0};
    assert_int_equal(residual_cache_identity(&rc, &h, "t", "planner", &err), 0);
    assert_int_equal(residual_cache_admit(&rc, &h, doc, 6 * BS + 1, &err), 0);
    assert_int_equal(residual_cache_grow(&rc, &h, 6 * BS, &err), 0);
    assert_int_equal(residual_cache_carriers(&rc), 3);
    residual_cache_hold_free(&rc, &h);
    assert_int_equal(residual_cache_carriers(&rc), 2);
    assert_int_equal(residual_cache_check(&rc, &err), 0);
    /* Base pressure for every block: the residuals go first (they pin their base), then the base. */
    int32_t other[BASE_BLOCKS * BS];
    fill(other, BASE_BLOCKS * BS, 2);
    assert_int_equal(base_put(&base, "u", other, BASE_BLOCKS), 0);
    assert_int_equal(residual_cache_carriers(&rc), 0);
    assert_int_equal(residual_cache_cached(&rc), 0);
    assert_int_equal(base_matched(&base, "t", doc, 6), 0);
    assert_int_equal(residual_cache_check(&rc, &err), 0);
    free_pools(&base, &rc);
}

/* Whatever the pressure, a residual prefix cached is never longer than its base prefix cached. */
static void test_residual_never_outlives_base(void **state) {
    (void)state;
    KvCache base;
    ResidualCache rc;
    init_pools(&base, &rc);
    int32_t doc[8 * BS], other[4 * BS];
    fill(doc, 8 * BS, 1);
    assert_int_equal(base_put(&base, "t", doc, 8), 0);
    assert_int_equal(residual_put(&rc, "coder", doc, 8), 0);
    assert_int_equal(residual_put(&rc, "planner", doc, 3), 0); /* a shorter residual path, pinned at 3 */
    for (int k = 0; k < 12; k++) {
        fill(other, 4 * BS, 10 + k);
        base_put(&base, k % 2 ? "u" : "t", other, 1 + k % 4); /* touches newer than the document */
        int b = base_matched(&base, "t", doc, 8);
        assert_true(residual_matched(&rc, "coder", doc, 8) <= b);
        assert_true(residual_matched(&rc, "planner", doc, 8) <= b);
        BraidError err;
        assert_int_equal(residual_cache_check(&rc, &err), 0);
        assert_int_equal(kv_cache_check(&base, &err), 0);
    }
    free_pools(&base, &rc);
}

/* One LRU order over both trees: under base pressure the oldest goes, be it a base path or a
 * residual (and with a residual, its base path only after it). */
static void test_one_lru_order(void **state) {
    (void)state;
    KvCache base;
    ResidualCache rc;
    init_pools(&base, &rc);
    int32_t old_doc[4 * BS], doc[4 * BS], fresh[BASE_BLOCKS * BS];
    fill(old_doc, 4 * BS, 1);
    fill(doc, 4 * BS, 2);
    assert_int_equal(base_put(&base, "t", old_doc, 4), 0);          /* oldest */
    assert_int_equal(base_put(&base, "t", doc, 4), 0);
    assert_int_equal(residual_put(&rc, "coder", doc, 4), 0);        /* newest: 1 carrier */
    /* 16 - 4 - 4 - 1 = 7 free; a request of 9 blocks needs 2 more: the old document's go. */
    fill(fresh, BASE_BLOCKS * BS, 3);
    assert_int_equal(base_put(&base, "u", fresh, 9), 0);
    assert_int_equal(base_matched(&base, "t", old_doc, 4), 0);
    assert_int_equal(residual_matched(&rc, "coder", doc, 4), 4);
    assert_int_equal(base_matched(&base, "t", doc, 4), 4);
    free_pools(&base, &rc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_carriers_follow_residuals),
        cmocka_unit_test(test_residual_never_outlives_base),
        cmocka_unit_test(test_one_lru_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
