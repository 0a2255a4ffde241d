/*
 * Cache directives in the cache (Leyline, issue 18), on token ids (no model):
 * - PIN: a pinned prefix survives eviction pressure until its deadline, then goes like any other;
 *   a tenant's budget clips a pin to the blocks that fit; half the pool is never pinned;
 *   kv_cache_unpin_for releases pins (earliest deadline first);
 * - DECAY: a decayed node is the next victim whatever the policy says (under every registered
 *   policy, against its lowest-ranked cache: pbkv's retired class included);
 * - EVICT: the path from the span's block on leaves the cache, a locked node is deferred;
 * - SHARE: another tenant's request finds nothing of tenant A's cache unless A shared it with
 *   that tenant (or all), and then copies it exactly at the same positions;
 * - an amortized splice plans its downstream runs from the context's cached blocks (approximate,
 *   delta = dst - src), the run before the edit exactly, and clips to what is cached;
 * - splice and shared-prefix sources demoted to the host tier are loaded back (LOAD ops before
 *   the copies) instead of being recomputed (issue 36);
 * - conversation scopes (issue 36): approximate blocks a conversation's splice committed are
 *   matched (and hinted) by its later exact turns, by no other conversation's or exact request,
 *   by approx-mode requests as before; unstamped approximate blocks by approx mode only; a later
 *   turn's extension over them is stamped too; an exact commit of the same tokens clears it all.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"

#define BS 4

static double fake_now;
static double fake_clock(void) { return fake_now; }

static void make_cache(KvCache *c, int device_blocks) {
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = device_blocks, .clock = fake_clock};
    fake_now = 100.0;
    if (kv_cache_init(c, &cfg, &err)) fail_msg("%s", err.msg);
}

static CacheIdentity identity(KvCache *c, const char *tenant) {
    CacheIdentity id;
    BraidError err;
    if (kv_cache_identity(c, tenant, NULL, NULL, NULL, &id, &err)) fail_msg("%s", err.msg);
    return id;
}

static void fill(int32_t *t, int n, int seed) {
    for (int i = 0; i < n; i++) t[i] = seed * 1000 + i;
}

/* Commits n tokens (whole blocks) as a finished request would, then releases them. */
static void commit(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n) {
    BraidError err;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, id, tokens, n + 1, &m, &err), 0);
    int32_t table[64];
    int got = kv_cache_acquire(c, &m, table, &err);
    int blocks = n / BS;
    assert_int_equal(kv_cache_reserve(c, blocks - got, table + got), 0);
    RadixNode *lock = m.node;
    assert_int_equal(kv_cache_commit(c, id, tokens, blocks, table, &lock, true, &err), 0);
    kv_cache_release(c, lock, table, blocks);
    assert_int_equal(kv_cache_check(c, &err), 0);
}

/* Cached device tokens of a prefix (matched, then released). */
static int cached(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n) {
    BraidError err;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, id, tokens, n, &m, &err), 0);
    kv_cache_release(c, m.node, NULL, 0);
    return m.device_blocks * BS;
}

static void test_pin_survives_until_deadline(void **state) {
    (void)state;
    KvCache c;
    make_cache(&c, 1 + 16);
    CacheIdentity a = identity(&c, "a");
    int32_t t[40], u[64];
    fill(t, 40, 1);
    commit(&c, &a, t, 16); /* 4 blocks */
    KvHintOutcome out;
    BraidError err;
    assert_int_equal(kv_cache_pin(&c, &a, t, 16, 30.0, 100, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(out.blocks, 4);
    assert_int_equal(kv_cache_pinned(&c), 4);
    /* Pressure: the other 12 blocks are all anyone gets. */
    int32_t table[16];
    assert_int_equal(kv_cache_reserve(&c, 13, table), 1);
    assert_int_equal(kv_cache_reserve(&c, 12, table), 0);
    for (int i = 0; i < 12; i++) kv_cache_release(&c, NULL, &table[i], 1);
    assert_int_equal(cached(&c, &a, t, 17), 16);
    /* Past the deadline the pin expires and pressure takes the blocks. */
    fake_now += 31.0;
    kv_cache_step(&c, fake_now);
    assert_int_equal(kv_cache_pinned(&c), 0);
    assert_int_equal(kv_cache_reserve(&c, 16, table), 0);
    assert_int_equal(cached(&c, &a, t, 17), 0);
    for (int i = 0; i < 16; i++) kv_cache_release(&c, NULL, &table[i], 1);
    fill(u, 64, 2);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

static void test_pin_budget_clips_and_unpin(void **state) {
    (void)state;
    KvCache c;
    make_cache(&c, 1 + 20);
    CacheIdentity a = identity(&c, "a"), b = identity(&c, "b");
    int32_t t[40], u[40];
    fill(t, 40, 1);
    fill(u, 40, 2);
    commit(&c, &a, t, 24); /* 6 blocks */
    commit(&c, &b, u, 40); /* 10 blocks */
    KvHintOutcome out;
    BraidError err;
    assert_int_equal(kv_cache_pin(&c, &a, t, 24, 60.0, 2, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_CLIPPED);
    assert_int_equal(out.blocks, 2);
    assert_int_equal(out.blocks_asked, 6);
    assert_int_equal(kv_cache_pinned_by(&c, a.tenant), 2);
    /* Re-pinning the same prefix costs nothing more: still clipped at 2. */
    assert_int_equal(kv_cache_pin(&c, &a, t, 8, 60.0, 2, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(kv_cache_pinned_by(&c, a.tenant), 2);
    /* Half the pool (10 blocks) at most, whatever the budget. */
    assert_int_equal(kv_cache_pin(&c, &b, u, 40, 10.0, 1000, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_CLIPPED);
    assert_int_equal(out.blocks, 8);
    assert_int_equal(kv_cache_pinned(&c), 10);
    /* Releasing for an admission goes earliest deadline first: b's (10 s) before a's (60 s). */
    assert_true(kv_cache_unpin_for(&c, 5) >= 5);
    assert_int_equal(kv_cache_pinned_by(&c, a.tenant), 2);
    assert_int_equal(kv_cache_pinned_by(&c, b.tenant), 0);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

static void test_decay_and_evict(void **state) {
    (void)state;
    KvCache c;
    make_cache(&c, 1 + 32);
    CacheIdentity a = identity(&c, "a");
    int32_t t[40], u[40], v[40];
    fill(t, 40, 1);
    fill(u, 40, 2);
    fill(v, 40, 3);
    commit(&c, &a, t, 16);
    commit(&c, &a, u, 16);
    commit(&c, &a, v, 16);
    /* LRU would take t first; decaying v's last two blocks makes them the first victims. */
    KvHintOutcome out;
    BraidError err;
    assert_int_equal(kv_cache_decay(&c, &a, v, 8, 16, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(out.blocks, 2);
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 2), 2);
    assert_int_equal(cached(&c, &a, v, 17), 8);
    assert_int_equal(cached(&c, &a, t, 17), 16);
    /* EVICT from token 5 (block 1) on: blocks 1..3 of u go, block 0 stays. */
    assert_int_equal(kv_cache_evict_from(&c, &a, u, 16, 5, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(out.blocks, 3);
    assert_int_equal(cached(&c, &a, u, 17), 4);
    /* A path in use is deferred (decayed), not dropped. */
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(&c, &a, t, 17, &m, &err), 0);
    assert_int_equal(kv_cache_evict_from(&c, &a, t, 16, 0, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_DEFERRED);
    kv_cache_release(&c, m.node, NULL, 0);
    assert_int_equal(cached(&c, &a, t, 17), 16);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

/* One call of `agent` in `workflow` (NULL: none) under `tenant`: n tokens committed and released. */
static void workflow_call(KvCache *c, const char *workflow, const char *agent, const int32_t *tokens, int n) {
    CacheIdentity id;
    BraidError err;
    if (kv_cache_identity(c, "a", NULL, workflow, agent, &id, &err)) fail_msg("%s", err.msg);
    commit(c, &id, tokens, n);
    kv_cache_identity_release(c, &id);
}

/* DECAY goes first under every policy (the documented order), even against what a policy ranks
 * lowest of all: a retired workflow's cache under pbkv (whose scores sit far below every other
 * class), the farthest band under kvflow, the oldest node under lru. The decayed node is the most
 * recent and, for the policies that take predictions, the one predicted next with certainty. */
static void test_decay_first_under_policy(void **state) {
    const EvictPolicy *policy = *state;
    KvCache c;
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 1 + 24, .clock = fake_clock, .policy = policy};
    fake_now = 100.0;
    if (kv_cache_init(&c, &cfg, &err)) fail_msg("%s", err.msg);
    int32_t old[20], retired[20], hot[20];
    fill(old, 20, 1);
    fill(retired, 20, 2);
    fill(hot, 20, 3);
    workflow_call(&c, "w-old", "planner", old, 16);         /* active, least recently used */
    workflow_call(&c, "w-retired", "planner", retired, 16); /* its workflow ends: retired cache */
    workflow_call(&c, "w-hot", "coder", hot, 16);           /* the most recent, predicted next */
    kv_cache_workflow_end(&c, "w-retired");
    const char *agents[] = {"coder", "planner"};
    const float next[] = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f}; /* k = 3: coder at every step */
    assert_int_equal(kv_cache_predict(&c, "w-hot", "coder", 3, 2, agents, next, &err), 0);
    CacheIdentity a = identity(&c, "a");
    KvHintOutcome out;
    assert_int_equal(kv_cache_decay(&c, &a, hot, 0, 16, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(out.blocks, 4);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    /* The first four victims are the decayed blocks, whatever the policy thinks of them. */
    assert_int_equal(kv_cache_evict(&c, CACHE_TIER_DEVICE, 4), 4);
    assert_int_equal(cached(&c, &a, hot, 17), 0);
    assert_int_equal(cached(&c, &a, retired, 17), 16);
    assert_int_equal(cached(&c, &a, old, 17), 16);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

/* Every registered policy has its decay-order test above (a new policy needs one in main). */
static void test_decay_order_covers_registry(void **state) {
    const EvictPolicy *const *tested = *state, *const *all;
    int n = evict_policy_list(&all);
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int j = 0; tested[j]; j++) found |= tested[j] == all[i];
        if (!found) fail_msg("policy %s has no decay-order test", all[i]->name);
    }
}

static void test_share_is_opt_in(void **state) {
    (void)state;
    KvCache c;
    make_cache(&c, 1 + 32);
    CacheIdentity a = identity(&c, "a"), b = identity(&c, "b"), x = identity(&c, "x");
    int32_t t[40];
    fill(t, 40, 1);
    commit(&c, &a, t, 24);
    KvSegmentPlan plan = {0};
    BraidError err;
    /* Not shared: b finds nothing of a's. */
    assert_int_equal(kv_cache_plan_shared(&c, &b, t, 30, 0, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    KvHintOutcome out;
    const char *with[] = {"b"};
    assert_int_equal(kv_cache_share(&c, &a, t, 16, false, with, 1, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    assert_int_equal(out.blocks, 4);
    /* b copies the 16 shared tokens exactly, at the same positions; x still sees nothing. */
    assert_int_equal(kv_cache_plan_shared(&c, &b, t, 30, 0, &plan, &err), 16);
    assert_int_equal(plan.n, 1);
    assert_int_equal(plan.spans[0].dst_start, 0);
    assert_int_equal(plan.spans[0].src_pos, 0);
    assert_int_equal(plan.spans[0].n_tokens, 16);
    assert_true(plan.spans[0].exact);
    kv_cache_drop_segments(&c, &plan);
    assert_int_equal(kv_cache_plan_shared(&c, &x, t, 30, 0, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    /* Shared with all: x sees it too. */
    assert_int_equal(kv_cache_share(&c, &a, t, 24, true, NULL, 0, &out, &err), 0);
    assert_int_equal(kv_cache_plan_shared(&c, &x, t, 30, 0, &plan, &err), 24);
    kv_cache_drop_segments(&c, &plan);
    assert_int_equal(c.counters.shared_hit_tokens, 16 + 24);
    kv_cache_segment_plan_free(&plan);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

static void test_splice_plan(void **state) {
    (void)state;
    KvCache c;
    make_cache(&c, 1 + 32);
    CacheIdentity a = identity(&c, "a");
    a.approx_ok = true;
    /* Context: 40 tokens, 36 cached (9 blocks); the splice replaces [10, 12) by 5 tokens. */
    int32_t ctx[40], p[44];
    fill(ctx, 40, 1);
    commit(&c, &a, ctx, 36);
    memcpy(p, ctx, 10 * sizeof *p);
    for (int i = 0; i < 5; i++) p[10 + i] = 7000 + i;
    memcpy(p + 15, ctx + 12, 28 * sizeof *p);
    CacheSpliceRun runs[] = {{.dst = 0, .src = 0, .len = 10, .index = -1}, {.dst = 15, .src = 12, .len = 28, .index = 0}};
    CacheDirectives d = {.splice_mode = CACHE_SPLICE_AMORTIZE, .first_edit = 10, .context = ctx, .n_context = 40, .runs = runs, .n_runs = 2};
    KvSegmentPlan plan = {0};
    int reused[2];
    BraidError err;
    /* From 8 (the prefix match's two whole blocks): tokens 8..9 exactly, then the shifted run up to
     * what is cached (context 12..35 -> 15..38). */
    assert_int_equal(kv_cache_plan_splice(&c, &a, &d, 43, 8, &plan, reused, &err), 0);
    assert_int_equal(plan.n, 2);
    assert_int_equal(plan.spans[0].dst_start, 8);
    assert_int_equal(plan.spans[0].n_tokens, 2);
    assert_true(plan.spans[0].exact);
    assert_int_equal(plan.spans[1].dst_start, 15);
    assert_int_equal(plan.spans[1].src_pos, 12);
    assert_int_equal(plan.spans[1].n_tokens, 24);
    assert_false(plan.spans[1].exact);
    assert_true(plan.inexact);
    assert_int_equal(plan.first_inexact, 15);
    assert_int_equal(reused[0], 2);
    assert_int_equal(reused[1], 24);
    kv_cache_drop_segments(&c, &plan);
    kv_cache_segment_plan_free(&plan);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

static int count_ops(const CacheOpList *ops, int kind) {
    int n = 0;
    for (int i = 0; i < ops->n; i++) n += ops->ops[i].kind == kind;
    return n;
}

/* Fills the device pool with another sequence, so that `tokens` (committed before) is demoted to
 * the host tier; the STOREs are taken. */
static void demote_by_pressure(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n, int seed, int fill_tokens) {
    int32_t other[96];
    fill(other, fill_tokens, seed);
    commit(c, id, other, fill_tokens);
    assert_int_equal(cached(c, id, tokens, n + 1), 0);
    CacheOpList ops = {0};
    assert_int_equal(kv_cache_take_ops(c, &ops), 0);
    assert_true(count_ops(&ops, CACHE_OP_STORE) > 0);
    cache_ops_free(&ops);
}

static void test_sources_from_host(void **state) {
    (void)state;
    KvCache c;
    BraidError err;
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 1 + 24, .host_blocks = 1 + 64, .clock = fake_clock};
    if (kv_cache_init(&c, &cfg, &err)) fail_msg("%s", err.msg);
    CacheIdentity a = identity(&c, "a");
    a.approx_ok = true;
    int32_t ctx[40], p[44];
    fill(ctx, 40, 1);
    commit(&c, &a, ctx, 36);
    demote_by_pressure(&c, &a, ctx, 36, 2, 64);
    memcpy(p, ctx, 10 * sizeof *p);
    for (int i = 0; i < 5; i++) p[10 + i] = 7000 + i;
    memcpy(p + 15, ctx + 12, 28 * sizeof *p);
    CacheSpliceRun runs[] = {{.dst = 0, .src = 0, .len = 10, .index = -1}, {.dst = 15, .src = 12, .len = 28, .index = 0}};
    CacheDirectives d = {.splice_mode = CACHE_SPLICE_AMORTIZE, .first_edit = 10, .context = ctx, .n_context = 40, .runs = runs, .n_runs = 2};
    KvSegmentPlan plan = {0};
    int reused[2];
    uint64_t host_hits = c.counters.host_hit_blocks;
    /* The context is on the host only: its 9 blocks are loaded back, then copied as on the device. */
    assert_int_equal(kv_cache_plan_splice(&c, &a, &d, 43, 0, &plan, reused, &err), 0);
    assert_int_equal(reused[0], 10);
    assert_int_equal(reused[1], 24);
    assert_int_equal(c.counters.host_hit_blocks - host_hits, 9);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    int32_t table[11];
    assert_int_equal(kv_cache_reserve(&c, 11, table), 0);
    assert_int_equal(kv_cache_place_segments(&c, &plan, table, &err), 0);
    CacheOpList ops = {0};
    assert_int_equal(kv_cache_take_ops(&c, &ops), 0);
    int loads = count_ops(&ops, CACHE_OP_LOAD), first_copy = -1, last_load = -1;
    for (int i = 0; i < ops.n; i++) {
        if (ops.ops[i].kind == CACHE_OP_LOAD) last_load = i;
        if (ops.ops[i].kind == CACHE_OP_COPY_SLOTS && first_copy < 0) first_copy = i;
    }
    assert_int_equal(loads, 9);
    assert_true(first_copy > last_load); /* the copies read what was loaded */
    cache_ops_free(&ops);
    kv_cache_release(&c, NULL, table, 11);
    assert_int_equal(kv_cache_check(&c, &err), 0);

    /* A prefix shared with tenant b, demoted to the host: b copies it after loading it. */
    int32_t doc[33];
    fill(doc, 33, 3);
    commit(&c, &a, doc, 32);
    KvHintOutcome out;
    assert_int_equal(kv_cache_share(&c, &a, doc, 32, true, NULL, 0, &out, &err), 0);
    assert_int_equal(out.status, KV_HINT_ACCEPTED);
    demote_by_pressure(&c, &a, doc, 32, 4, 96);
    CacheIdentity b = identity(&c, "b");
    KvSegmentPlan shared = {0};
    assert_int_equal(kv_cache_plan_shared(&c, &b, doc, 33, 0, &shared, &err), 32);
    assert_int_equal(shared.n, 1);
    assert_true(shared.spans[0].exact);
    kv_cache_drop_segments(&c, &shared);
    kv_cache_segment_plan_free(&shared);
    kv_cache_segment_plan_free(&plan);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

/* Matched tokens (device or host) of a prefix, and where approximate K/V start (-1: none). */
static int matched(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n, int *approx_from) {
    BraidError err;
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(c, id, tokens, n, &m, &err), 0);
    kv_cache_release(c, m.node, NULL, 0);
    if (approx_from) *approx_from = m.approx_from_block < 0 ? -1 : m.approx_from_block * BS;
    return (m.device_blocks + m.host_blocks) * BS;
}

static CacheIdentity in_conversation(KvCache *c, const char *workflow, bool approx_from_block2) {
    CacheIdentity id = identity(c, "a");
    id.approx_scope = cache_workflow_scope(workflow);
    id.scope_commits = true;
    id.has_approx = approx_from_block2;
    id.approx_from_block = approx_from_block2 ? 2 : 0;
    return id;
}

static void test_conversation_scope(void **state) {
    (void)state;
    KvCache c;
    make_cache(&c, 1 + 32);
    BraidError err;
    int32_t t[48];
    fill(t, 48, 3);
    /* Conversation W's amortized splice: blocks 0-1 exact, 2-7 approximate. */
    CacheIdentity w_splice = in_conversation(&c, "W", true);
    commit(&c, &w_splice, t, 32);
    CacheIdentity w_turn = in_conversation(&c, "W", false), v_turn = in_conversation(&c, "V", false);
    CacheIdentity plain = identity(&c, "a"), approx_mode = identity(&c, "a");
    approx_mode.approx_ok = true;
    int from;
    assert_int_equal(matched(&c, &w_turn, t, 33, &from), 32); /* W's next turn hits the spliced blocks */
    assert_int_equal(from, 8);
    assert_int_equal(matched(&c, &v_turn, t, 33, &from), 8); /* another workflow: the exact prefix only */
    assert_int_equal(from, -1);
    assert_int_equal(matched(&c, &plain, t, 33, NULL), 8);
    assert_int_equal(matched(&c, &approx_mode, t, 33, NULL), 32);
    assert_int_equal(cache_workflow_scope("W") == cache_conversation_scope("W") ? 1 : 0, 0);
    assert_int_equal(cache_workflow_scope(NULL), 0);
    /* Hints walk the same way: W's pin covers its approximate blocks, V's only the exact ones. */
    KvHintOutcome out;
    assert_int_equal(kv_cache_pin(&c, &v_turn, t, 32, 10.0, 64, &out, &err), 0);
    assert_int_equal(out.blocks, 2);
    assert_int_equal(kv_cache_pin(&c, &w_turn, t, 32, 10.0, 64, &out, &err), 0);
    assert_int_equal(out.blocks, 8);
    /* W's next turn computed blocks 8-11 over the approximate ones: they are W's too. */
    w_turn.has_approx = true;
    w_turn.approx_from_block = 2;
    commit(&c, &w_turn, t, 48);
    w_turn.has_approx = false;
    assert_int_equal(matched(&c, &w_turn, t, 48, NULL), 44);
    assert_int_equal(matched(&c, &v_turn, t, 48, NULL), 8);
    /* Approximate blocks of an approx-mode request carry no conversation: approx mode only. */
    int32_t u[24];
    fill(u, 24, 4);
    CacheIdentity approx_commit = in_conversation(&c, "W", true);
    approx_commit.scope_commits = false;
    commit(&c, &approx_commit, u, 24);
    assert_int_equal(matched(&c, &w_turn, u, 25, NULL), 8);
    assert_int_equal(matched(&c, &approx_mode, u, 25, NULL), 24);
    /* An exact commit of the same tokens replaces the approximate blocks: everyone hits them. */
    commit(&c, &v_turn, t, 48);
    assert_int_equal(matched(&c, &plain, t, 48, &from), 44);
    assert_int_equal(from, -1);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_free(&c);
}

/* A named test of test_decay_first_under_policy per policy. */
#define DECAY_TEST(p) {"test_decay_first_" #p, test_decay_first_under_policy, NULL, NULL, (void *)&evict_policy_##p}
static const EvictPolicy *const DECAY_TESTED[] = {&evict_policy_lru, &evict_policy_pbkv, &evict_policy_kvflow, &evict_policy_pbkv_lae, NULL};

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_survives_until_deadline), cmocka_unit_test(test_pin_budget_clips_and_unpin),
        cmocka_unit_test(test_decay_and_evict),             cmocka_unit_test(test_share_is_opt_in),
        DECAY_TEST(lru), DECAY_TEST(pbkv), DECAY_TEST(kvflow), DECAY_TEST(pbkv_lae),
        cmocka_unit_test_prestate(test_decay_order_covers_registry, (void *)DECAY_TESTED),
        cmocka_unit_test(test_splice_plan),                 cmocka_unit_test(test_conversation_scope),
        cmocka_unit_test(test_sources_from_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
