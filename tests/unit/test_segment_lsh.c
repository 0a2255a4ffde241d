/*
 * Near-duplicate segment reuse (issue 35, paper 003 § 3.1 / § 3.4): the MinHash/LSH index
 * (segment_lsh.h) and its use by the cache's segment lookup (kv_segments_lsh.c), on token ids:
 * - signatures: equal content gives similarity 1, a few changed tokens a high one, unrelated
 *   content a low one; the canonical map makes tokens of one class equal for the index only;
 * - the index is bounded (refuses and counts past max_entries, room again after a drop), a query
 *   never returns another tenant's or adapter's entry, dropping a block removes its entries;
 * - in the cache (approx mode, LSH on): a chunk with a few tokens changed takes the cached copy's
 *   equal tokens and never the changed ones; an unrelated sequence takes nothing; another tenant
 *   takes nothing; exact mode never asks the LSH index; the window guard starts the suffix W
 *   tokens past the change; after eviction the index is empty and nothing is found; by default a
 *   near-duplicate is taken only past the plan's first approximate span (anywhere: also before).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunker.h"
#include "cache/kv_cache.h"
#include "cache/segment_lsh.h"

#define BS 4
#define ANCHOR 1

static const int32_t anchors[] = {ANCHOR, 2};

/* A message: the anchor, then n tokens from seed (distinct, never an anchor). */
static int message(int32_t *out, int seed, int n) {
    out[0] = ANCHOR;
    for (int i = 0; i < n; i++) out[1 + i] = 100 + seed * 1000 + i;
    return n + 1;
}

static void test_signatures(void **state) {
    (void)state;
    SegmentLsh l;
    BraidError err;
    int32_t canon[2000];
    for (int i = 0; i < 2000; i++) canon[i] = i;
    canon[1500] = 1400; /* one class: 1400 and 1500 */
    assert_int_equal(segment_lsh_init(&l, 8, 4, canon, 2000, &err), 0);
    int32_t a[40], b[40], u[40];
    for (int i = 0; i < 40; i++) a[i] = b[i] = 1000 + i, u[i] = 5000 + i;
    b[20] = 7;
    LshSignature sa, sb, su, sa2;
    segment_lsh_sign(&l, 11, a, 40, &sa);
    segment_lsh_sign(&l, 11, b, 40, &sb);
    segment_lsh_sign(&l, 11, u, 40, &su);
    assert_true(segment_lsh_similarity(&sa, &sa) == 1.0);
    assert_true(segment_lsh_similarity(&sa, &sb) >= 0.6); /* true Jaccard 35/41 */
    assert_true(segment_lsh_similarity(&sa, &su) <= 0.2);
    /* The canonical map: 1400 and 1500 are one class, for the index only. */
    a[10] = 1400;
    segment_lsh_sign(&l, 11, a, 40, &sa);
    a[10] = 1500;
    segment_lsh_sign(&l, 11, a, 40, &sa2);
    assert_true(segment_lsh_similarity(&sa, &sa2) == 1.0);
    segment_lsh_free(&l);
    assert_int_equal(segment_lsh_init(&l, 8, 4, NULL, 0, &err), 0); /* no map: ids as they are */
    segment_lsh_sign(&l, 11, a, 40, &sa2);
    a[10] = 1400;
    segment_lsh_sign(&l, 11, a, 40, &sa);
    assert_true(segment_lsh_similarity(&sa, &sa2) < 1.0);
    /* Empty contexts: like each other only. */
    LshSignature e1, e2;
    segment_lsh_sign(&l, 11, a, 0, &e1);
    segment_lsh_sign(&l, 11, a, 0, &e2);
    assert_true(segment_lsh_similarity(&e1, &e2) == 1.0);
    assert_true(segment_lsh_similarity(&e1, &sa) == 0.0);
    segment_lsh_free(&l);
}

static void test_index_bounds_and_namespaces(void **state) {
    (void)state;
    SegmentLsh l;
    BraidError err;
    assert_int_equal(segment_lsh_init(&l, 16, 2, NULL, 0, &err), 0);
    int32_t t[24];
    for (int i = 0; i < 24; i++) t[i] = 300 + i;
    LshSignature seg, ctx;
    segment_lsh_sign(&l, 5, t, 24, &seg);
    segment_lsh_sign(&l, 5, t, 0, &ctx);
    SegmentLshKey k = {.tenant = 1, .adapter = 0, .seg = &seg, .ctx = &ctx, .pos = 0, .len = 24, .tokens = t};
    const int32_t b1[] = {1, 2, 3, 4, 5, 6}, b2[] = {7, 8, 9, 10, 11, 12}, b3[] = {13};
    assert_int_equal(segment_lsh_add(&l, &k, b1, 6), 0);
    k.tenant = 2;
    assert_int_equal(segment_lsh_add(&l, &k, b2, 6), 0);
    k.tenant = 3;
    assert_int_equal(segment_lsh_add(&l, &k, b3, 1), 2); /* full: refused and counted */
    assert_int_equal(l.refused_full, 1);
    assert_int_equal(l.n_live, 2);
    SegmentLshResult r;
    segment_lsh_query(&l, 1, 0, &seg, &ctx, 0.5, 0.5, &r);
    assert_int_equal(r.n_candidates, 1); /* tenant 2's identical entry is never seen */
    assert_true(segment_lsh_entry(&l, r.best)->tenant == 1 && segment_lsh_entry(&l, r.best)->blocks[0] == 1);
    segment_lsh_query(&l, 1, 7, &seg, &ctx, 0.5, 0.5, &r); /* another adapter of tenant 1 */
    assert_int_equal(r.n_candidates, 0);
    assert_int_equal(r.best, -1);
    segment_lsh_query(&l, 3, 0, &seg, &ctx, 0.5, 0.5, &r);
    assert_int_equal(r.best, -1);
    /* Dropping a block removes the entries that name it, and makes room. */
    segment_lsh_drop_block(&l, 3);
    assert_int_equal(l.n_live, 1);
    segment_lsh_query(&l, 1, 0, &seg, &ctx, 0.5, 0.5, &r);
    assert_int_equal(r.best, -1);
    segment_lsh_query(&l, 2, 0, &seg, &ctx, 0.5, 0.5, &r);
    assert_true(r.best >= 0);
    k.tenant = 3;
    assert_int_equal(segment_lsh_add(&l, &k, b3, 1), 0);
    segment_lsh_drop_block(&l, 9);
    segment_lsh_drop_block(&l, 13);
    assert_int_equal(l.n_live, 0);
    segment_lsh_free(&l);
}

/* ---- in the cache ---- */

typedef struct {
    int32_t a[256], b[256];
    int n;         /* both sequences' length */
    int edit;      /* the position changed in b */
    int chunk_lo, chunk_hi; /* a's chunk holding it */
} NearDup;

static void make_cache(KvCache *c, int window, bool lsh, const char *tenant, CacheIdentity *id) {
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 128, .segments = true, .anchor_tokens = anchors, .n_anchor_tokens = 2,
                         .approx_window = window, .segment_lsh = lsh, .segment_tau_seg = 0.4, .segment_tau_ctx = 0.4};
    BraidError err;
    if (kv_cache_init(c, &cfg, &err) || kv_cache_identity(c, tenant, NULL, NULL, NULL, id, &err)) fail_msg("%s", err.msg);
}

static void identity(KvCache *c, const char *tenant, CacheIdentity *id) {
    BraidError err;
    if (kv_cache_identity(c, tenant, NULL, NULL, NULL, id, &err)) fail_msg("%s", err.msg);
}

/* a: two messages and a closing anchor; b: a with one token changed in the middle of a's longest
 * chunk of the second message past its first two (found with the cache's own chunking, so the
 * test does not depend on where content cuts fall). With same_lead b starts with a's first
 * message (an exact prefix); else with another one of the same length, so the second message's
 * chunks come over approximately (with their window) before the edited one. */
static void make_near_dup(const KvCache *c, const CacheIdentity *id, bool same_lead, NearDup *d) {
    int na = message(d->a, 1, 12);
    int nm = message(d->a + na, 3, 200);
    d->n = na + nm;
    d->a[d->n++] = ANCHOR;
    memcpy(d->b, d->a, sizeof d->a);
    if (!same_lead) message(d->b, 2, 12);
    Chunk *ch = NULL;
    int cap = 0;
    BraidError err;
    int k = chunker_split(&c->chunker, id->hash_seed ^ c->model_seed, d->a, d->n, &ch, &cap, &err);
    assert_true(k > 0);
    int best = -1, first = 0;
    while (ch[first].start < na) first++;
    for (int i = first + 2; i + 1 < k; i++)
        if (best < 0 || ch[i].len > ch[best].len) best = i;
    assert_true(best >= 0 && ch[best].len >= 14);
    d->chunk_lo = ch[best].start;
    d->chunk_hi = ch[best].start + ch[best].len;
    d->edit = d->chunk_lo + ch[best].len / 2;
    d->b[d->edit] = 99999;
    free(ch);
}

static void commit_sequence(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n) {
    int blocks = n / BS;
    int32_t table[128];
    assert_int_equal(kv_cache_reserve(c, blocks, table), 0);
    RadixNode *lock = NULL;
    BraidError err;
    assert_int_equal(kv_cache_commit(c, id, tokens, blocks, table, &lock, true, &err), 0);
    kv_cache_release(c, lock, table, blocks);
}

static bool covered(const KvSegmentPlan *plan, int pos) {
    for (int s = 0; s < plan->n; s++)
        if (pos >= plan->spans[s].dst_start && pos < plan->spans[s].dst_start + plan->spans[s].n_tokens) return true;
    return false;
}

/* Tokens of [lo, hi) the plan covers. */
static int covered_in(const KvSegmentPlan *plan, int lo, int hi) {
    int n = 0;
    for (int p = lo; p < hi; p++) n += covered(plan, p);
    return n;
}

/* Every span's source tokens equal its target tokens (nothing but equal ids is reused). */
static void check_equal_ids(const KvSegmentPlan *plan, const int32_t *src, const int32_t *dst) {
    for (int s = 0; s < plan->n; s++)
        for (int i = 0; i < plan->spans[s].n_tokens; i++)
            assert_int_equal(src[plan->spans[s].src_pos + i], dst[plan->spans[s].dst_start + i]);
}

static void test_near_duplicate_found(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 0, true, NULL, &id);
    NearDup d;
    make_near_dup(&c, &id, false, &d);
    commit_sequence(&c, &id, d.a, d.n / BS * BS);
    assert_true(c.counters.segment_lsh_indexed > 0);
    assert_int_equal(c.lsh.n_live, (int)c.counters.segment_lsh_indexed);
    BraidError err;
    KvSegmentPlan plan = {0};
    assert_int_equal(kv_cache_find_segments(&c, &id, d.b, d.n, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_true(c.counters.segment_lsh_candidates >= 1);
    assert_true(c.counters.segment_lsh_admitted >= 1);
    assert_false(covered(&plan, d.edit)); /* the changed token is computed */
    /* The edited chunk's other tokens come from a's copy: all but the change and the few tokens
     * whose content cut moved with it. */
    assert_true(covered_in(&plan, d.chunk_lo, d.chunk_hi) >= d.chunk_hi - d.chunk_lo - 4);
    assert_true(c.counters.segment_lsh_reused_tokens > 0);
    assert_int_equal(plan.lsh_tokens, (int)c.counters.segment_lsh_reused_tokens);
    check_equal_ids(&plan, d.a, d.b);
    assert_true(plan.inexact);
    /* Without the LSH index the edited chunk is computed whole (only exact-hash chunks come). */
    KvCache off;
    CacheIdentity id_off;
    make_cache(&off, 0, false, NULL, &id_off);
    commit_sequence(&off, &id_off, d.a, d.n / BS * BS);
    KvSegmentPlan plan_off = {0};
    assert_int_equal(kv_cache_find_segments(&off, &id_off, d.b, d.n, 0, SEGMENT_REUSE_APPROX, &plan_off, &err), 0);
    assert_true(plan.reused_tokens > plan_off.reused_tokens);
    assert_int_equal(off.counters.segment_lsh_candidates, 0);
    kv_cache_segment_plan_free(&plan_off);
    kv_cache_free(&off);
    /* An unrelated sequence: nothing. */
    int32_t u[128];
    int nu = message(u, 7, 60);
    nu += message(u + nu, 8, 40);
    uint64_t admitted = c.counters.segment_lsh_admitted;
    assert_int_equal(kv_cache_find_segments(&c, &id, u, nu, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    assert_int_equal(c.counters.segment_lsh_admitted, admitted);
    kv_cache_segment_plan_free(&plan);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

static void test_never_across_tenants(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity t1, t2;
    make_cache(&c, 0, true, "t1", &t1);
    identity(&c, "t2", &t2);
    NearDup d;
    make_near_dup(&c, &t1, false, &d);
    commit_sequence(&c, &t1, d.a, d.n / BS * BS);
    /* t2 sends the same near-duplicate: t1's entries are invisible to it. */
    BraidError err;
    KvSegmentPlan plan = {0};
    assert_int_equal(kv_cache_find_segments(&c, &t2, d.b, d.n, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    assert_int_equal(c.counters.segment_lsh_candidates, 0);
    /* t1 itself finds it. */
    assert_int_equal(kv_cache_find_segments(&c, &t1, d.b, d.n, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_true(c.counters.segment_lsh_admitted >= 1);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

static void test_exact_mode_never_uses_lsh(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 0, true, NULL, &id);
    NearDup d;
    make_near_dup(&c, &id, false, &d);
    commit_sequence(&c, &id, d.a, d.n / BS * BS);
    BraidError err;
    KvSegmentPlan plan = {0};
    /* From the prefix cache's divergence block on, as the scheduler asks. */
    assert_int_equal(kv_cache_find_segments(&c, &id, d.b, d.n, d.edit / BS * BS, SEGMENT_REUSE_EXACT, &plan, &err), 0);
    assert_false(plan.inexact);
    for (int s = 0; s < plan.n; s++) assert_true(plan.spans[s].exact);
    assert_int_equal(covered_in(&plan, d.edit, d.chunk_hi), 0);
    assert_int_equal(c.counters.segment_lsh_candidates, 0);
    assert_int_equal(c.counters.segment_lsh_admitted, 0);
    assert_int_equal(c.counters.segment_lsh_reused_tokens, 0);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

/* W = 5: the suffix past the change starts 5 tokens after it. */
static void test_window_guard(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 5, true, NULL, &id);
    NearDup d;
    make_near_dup(&c, &id, false, &d);
    commit_sequence(&c, &id, d.a, d.n / BS * BS);
    BraidError err;
    KvSegmentPlan plan = {0};
    assert_int_equal(kv_cache_find_segments(&c, &id, d.b, d.n, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_true(c.counters.segment_lsh_admitted >= 1);
    assert_int_equal(covered_in(&plan, d.edit, d.edit + 6), 0);
    assert_true(covered_in(&plan, d.chunk_lo, d.edit) > 0); /* the prefix: its window is equal */
    check_equal_ids(&plan, d.a, d.b);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

static void test_gone_after_eviction(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 0, true, NULL, &id);
    NearDup d;
    make_near_dup(&c, &id, false, &d);
    commit_sequence(&c, &id, d.a, d.n / BS * BS);
    assert_true(c.lsh.n_live > 0);
    kv_cache_evict(&c, CACHE_TIER_DEVICE, 128);
    assert_int_equal(c.lsh.n_live, 0);
    BraidError err;
    KvSegmentPlan plan = {0};
    assert_int_equal(kv_cache_find_segments(&c, &id, d.b, d.n, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    assert_int_equal(c.counters.segment_lsh_candidates, 0);
    kv_cache_segment_plan_free(&plan);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

/* b shares a's exact prefix up to the edited chunk: the plan is exact there, so by default the
 * near-duplicate is not taken (it would make an exact sequence approximate); anywhere takes it. */
static void test_follow_rule(void **state) {
    (void)state;
    for (int anywhere = 0; anywhere < 2; anywhere++) {
        KvCacheConfig cfg = {.block_size = BS, .device_blocks = 128, .segments = true, .anchor_tokens = anchors, .n_anchor_tokens = 2,
                             .segment_lsh = true, .segment_lsh_anywhere = anywhere, .segment_tau_seg = 0.4, .segment_tau_ctx = 0.4};
        KvCache c;
        CacheIdentity id;
        BraidError err;
        if (kv_cache_init(&c, &cfg, &err) || kv_cache_identity(&c, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
        NearDup d;
        make_near_dup(&c, &id, true, &d);
        commit_sequence(&c, &id, d.a, d.n / BS * BS);
        KvSegmentPlan plan = {0};
        /* From the prefix cache's last whole block before the edit on, as the scheduler asks. */
        assert_int_equal(kv_cache_find_segments(&c, &id, d.b, d.n, d.edit / BS * BS, SEGMENT_REUSE_APPROX, &plan, &err), 0);
        if (anywhere) {
            assert_true(c.counters.segment_lsh_admitted >= 1);
            assert_true(plan.inexact && plan.lsh_tokens > 0);
            assert_false(covered(&plan, d.edit));
            check_equal_ids(&plan, d.a, d.b);
        } else {
            assert_int_equal(c.counters.segment_lsh_candidates, 0);
            assert_int_equal(plan.lsh_tokens, 0);
            assert_int_equal(covered_in(&plan, d.edit, d.chunk_hi), 0);
        }
        kv_cache_segment_plan_free(&plan);
        kv_cache_free(&c);
    }
}

/* A bound of 2 entries in the cache: the rest are refused and counted. */
static void test_cache_bound(void **state) {
    (void)state;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 128, .segments = true, .anchor_tokens = anchors, .n_anchor_tokens = 2,
                         .segment_max_entries = 2, .segment_lsh = true};
    KvCache c;
    CacheIdentity id;
    BraidError err;
    if (kv_cache_init(&c, &cfg, &err) || kv_cache_identity(&c, NULL, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    NearDup d;
    make_near_dup(&c, &id, false, &d);
    commit_sequence(&c, &id, d.a, d.n / BS * BS);
    assert_int_equal(c.lsh.n_live, 2);
    assert_true(c.lsh.max_entries == 2);
    /* The segment index refuses first (the LSH index follows it), so nothing reaches the LSH's own bound. */
    assert_true(c.counters.segments_refused_full > 0);
    kv_cache_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signatures),          cmocka_unit_test(test_index_bounds_and_namespaces),
        cmocka_unit_test(test_near_duplicate_found), cmocka_unit_test(test_never_across_tenants),
        cmocka_unit_test(test_exact_mode_never_uses_lsh), cmocka_unit_test(test_window_guard),
        cmocka_unit_test(test_gone_after_eviction), cmocka_unit_test(test_follow_rule),
        cmocka_unit_test(test_cache_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
