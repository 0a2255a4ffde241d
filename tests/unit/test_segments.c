/*
 * Segment reuse in the cache (issue 17): the chunker, the segment index, and kv_cache's find /
 * place protocol, on token ids (no model):
 * - chunks start at anchor tokens; a message chunks the same way (same hashes) at any offset and
 *   after any preceding text; namespaces never share a hash; no chunk exceeds max_tokens;
 * - the index finds by hash, refuses a duplicate and, when full, a new chunk; dropping a block
 *   removes exactly the entries that name it;
 * - a committed sequence's chunks are found in another sequence at another offset: approximate
 *   mode reuses them (COPY_SLOTS operations covering exactly the span, delta = the offset
 *   difference), exact mode rejects them for their left context, but takes a chunk whose whole
 *   left context matches past the prefix cache's last whole block; the window admits only
 *   matching left windows; the sources are held until placed (eviction cannot free them), and
 *   after their blocks leave the device nothing is found;
 * - the scheduler: prefill skips the reused spans; an approximately reused request's blocks from
 *   the first reused span on enter the tree marked approximate (exact matches stop before them,
 *   approx-mode matches pass), and an exact commit of the same tokens replaces them;
 * - chunks reused from one source, adjacent with the same shift, are one span (issue 35).
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
#include "cache/segment_index.h"
#include "worker/scheduler.h"

#define BS 4
#define ANCHOR 1

static const int32_t anchors[] = {ANCHOR, 2};

/* A message: the anchor, then n tokens from seed (distinct, never an anchor). */
static int message(int32_t *out, int seed, int n) {
    out[0] = ANCHOR;
    for (int i = 0; i < n; i++) out[1 + i] = 100 + seed * 1000 + i;
    return n + 1;
}

static int split(const ChunkerConfig *cfg, uint64_t ns, const int32_t *t, int n, Chunk **chunks, int *cap) {
    BraidError err;
    int k = chunker_split(cfg, ns, t, n, chunks, cap, &err);
    assert_true(k > 0);
    return k;
}

static void test_chunker(void **state) {
    (void)state;
    ChunkerConfig cfg;
    BraidError err;
    assert_int_equal(chunker_config_init(&cfg, anchors, 2, 8, 40, 7, &err), 0);
    int32_t a[400], b[400];
    int na = message(a, 1, 30), nb = message(b, 2, 57);
    int shared = message(a + na, 3, 150);
    memcpy(b + nb, a + na, (size_t)shared * sizeof *a);
    Chunk *ca = NULL, *cb = NULL;
    int cap_a = 0, cap_b = 0;
    int ka = split(&cfg, 9, a, na + shared, &ca, &cap_a), kb = split(&cfg, 9, b, nb + shared, &cb, &cap_b);
    /* Chunks cover everything in order, start at anchors, stay within max_tokens. */
    for (int i = 0, at = 0; i < ka; at += ca[i].len, i++) {
        assert_int_equal(ca[i].start, at);
        assert_true(ca[i].len >= 1 && ca[i].len <= 40);
    }
    /* The shared message's chunks: the same lengths and hashes in both, shifted by nb - na. */
    int ia = 0, ib = 0;
    while (ca[ia].start < na) ia++;
    while (cb[ib].start < nb) ib++;
    assert_int_equal(ca[ia].start, na);
    assert_int_equal(ka - ia, kb - ib);
    assert_true(ka - ia >= 4); /* 151 tokens cut by content within max 40 */
    for (int i = 0; i < ka - ia; i++) {
        assert_int_equal(ca[ia + i].len, cb[ib + i].len);
        assert_true(ca[ia + i].hash == cb[ib + i].hash);
        assert_int_equal(cb[ib + i].start - ca[ia + i].start, nb - na);
    }
    /* Another namespace: other hashes for the same tokens. */
    Chunk *cc = NULL;
    int cap_c = 0;
    split(&cfg, 10, a, na + shared, &cc, &cap_c);
    assert_true(cc[ia].hash != ca[ia].hash);
    free(ca), free(cb), free(cc);
    chunker_config_free(&cfg);
}

static void test_index(void **state) {
    (void)state;
    SegmentIndex idx;
    BraidError err;
    assert_int_equal(segment_index_init(&idx, 16, 3, &err), 0);
    SegmentKey k1 = {.hash = 7, .left_hash = 1, .pos = 0, .len = 5}, k2 = {.hash = 7, .left_hash = 2, .pos = 9, .len = 5},
               k3 = {.hash = 8, .left_hash = 3, .pos = 3, .len = 2}, k4 = {.hash = 9, .pos = 1, .len = 1};
    const int32_t b1[] = {1, 2}, b2[] = {3, 4}, b3[] = {2};
    assert_int_equal(segment_index_add(&idx, &k1, b1, 2), 0);
    assert_int_equal(segment_index_add(&idx, &k1, b1, 2), 1); /* duplicate */
    assert_int_equal(segment_index_add(&idx, &k2, b2, 2), 0);
    assert_int_equal(segment_index_add(&idx, &k3, b3, 1), 0);
    assert_int_equal(segment_index_add(&idx, &k4, b3, 1), 2); /* full */
    int n7 = 0;
    for (int e = segment_index_first(&idx, 7); e >= 0; e = segment_index_next(&idx, e)) n7++;
    assert_int_equal(n7, 2);
    segment_index_drop_block(&idx, 2); /* named by k1 and k3 */
    assert_int_equal(idx.n_live, 1);
    int e = segment_index_first(&idx, 7);
    assert_true(e >= 0 && segment_index_entry(&idx, e)->key.left_hash == 2);
    assert_int_equal(segment_index_first(&idx, 8), -1);
    assert_int_equal(segment_index_add(&idx, &k4, b3, 1), 0); /* room again */
    segment_index_free(&idx);
}

/* In place (the tree keeps a pointer back to its cache), with an identity of no names. */
static void make_cache(KvCache *c, int window, CacheIdentity *id) {
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = 64, .segments = true, .anchor_tokens = anchors, .n_anchor_tokens = 2,
                         .approx_window = window};
    BraidError err;
    if (kv_cache_init(c, &cfg, &err) || kv_cache_identity(c, NULL, NULL, NULL, NULL, id, &err)) fail_msg("%s", err.msg);
}

/* Commits tokens[0..n) (whole blocks) as one sequence and releases it: its blocks stay cached. */
static void commit_sequence(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n) {
    int blocks = n / BS;
    int32_t table[64];
    assert_int_equal(kv_cache_reserve(c, blocks, table), 0);
    RadixNode *lock = NULL;
    BraidError err;
    assert_int_equal(kv_cache_commit(c, id, tokens, blocks, table, &lock, true, &err), 0);
    kv_cache_release(c, lock, table, blocks);
}

static void check_ops_cover(const KvCache *c, const KvSegmentPlan *plan, const int32_t *table, int n_table) {
    for (int s = 0; s < plan->n; s++) {
        const KvSegmentSpan *sp = &plan->spans[s];
        int covered = 0;
        for (int i = 0; i < c->pending.n; i++) {
            const CacheOp *op = &c->pending.ops[i];
            assert_int_equal(op->kind, CACHE_OP_COPY_SLOTS);
            if (op->delta != sp->dst_start - sp->src_pos) continue;
            int dst_token = -1;
            for (int b = 0; b < n_table; b++)
                if (table[b] == op->dst) dst_token = b * BS + op->dst_slot;
            if (dst_token >= sp->dst_start && dst_token < sp->dst_start + sp->n_tokens) covered += op->n_slots;
        }
        assert_int_equal(covered, sp->n_tokens);
    }
}

static void test_find_and_place(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 0, &id);
    BraidError err;
    int32_t a[256], b[256];
    int na = message(a, 1, 10), nb = message(b, 2, 17);
    int shared = message(a + na, 3, 90);
    memcpy(b + nb, a + na, (size_t)shared * sizeof *a);
    int la = na + shared, lb = nb + shared + message(b + nb + shared, 4, 6);
    a[la++] = ANCHOR; /* the shared message's last chunk ends before the end: it is indexed */
    commit_sequence(&c, &id, a, la / BS * BS);
    assert_true(c.counters.segments_indexed > 0);
    KvSegmentPlan plan = {0};
    /* Exact: every candidate has another left context. */
    assert_int_equal(kv_cache_find_segments(&c, &id, b, lb, 0, SEGMENT_REUSE_EXACT, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    assert_true(c.counters.segment_candidates > 0);
    assert_int_equal(c.counters.segments_rejected_context, c.counters.segment_candidates);
    /* Approximate (window 0): the shared message comes over, shifted by nb - na. */
    int in_use = kv_cache_in_use(&c, CACHE_TIER_DEVICE);
    assert_int_equal(kv_cache_find_segments(&c, &id, b, lb, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_true(plan.n > 0 && plan.inexact);
    assert_true(plan.reused_tokens >= shared - 2 * 40 && plan.reused_tokens <= shared);
    for (int s = 0; s < plan.n; s++) {
        assert_int_equal(plan.spans[s].dst_start - plan.spans[s].src_pos, nb - na);
        assert_false(plan.spans[s].exact);
        assert_true(plan.spans[s].dst_start >= nb && plan.spans[s].dst_start + plan.spans[s].n_tokens <= nb + shared);
    }
    assert_true(kv_cache_in_use(&c, CACHE_TIER_DEVICE) > in_use); /* the sources are held */
    /* Eviction drops every cached node (no host tier), but not the held sources' memory. */
    kv_cache_evict(&c, CACHE_TIER_DEVICE, 64);
    int distinct = 0; /* adjacent spans can share a source block */
    for (int i = 0; i < plan.n_src_blocks; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= plan.src_blocks[j] == plan.src_blocks[i];
        distinct += !seen;
    }
    assert_int_equal(kv_cache_in_use(&c, CACHE_TIER_DEVICE), in_use + distinct);
    assert_int_equal(kv_cache_cached(&c, CACHE_TIER_DEVICE), 0);
    int32_t table[64];
    assert_int_equal(kv_cache_reserve(&c, (lb + BS - 1) / BS, table), 0);
    assert_int_equal(kv_cache_place_segments(&c, &plan, table, &err), 0);
    check_ops_cover(&c, &plan, table, (lb + BS - 1) / BS);
    assert_int_equal(c.counters.segment_reused_tokens, (uint64_t)plan.reused_tokens);
    kv_cache_release(&c, NULL, table, (lb + BS - 1) / BS);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    /* The eviction above dropped every cached block: the index is empty, nothing is found. */
    assert_int_equal(c.segments.n_live, 0);
    assert_int_equal(kv_cache_find_segments(&c, &id, b, lb, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_int_equal(plan.n, 0);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

/* Exact reuse: a sequence diverging mid-block from a cached one takes the shared chunk's tail
 * past the prefix match's last whole block (same left context, same positions). */
static void test_exact_tail(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 0, &id);
    BraidError err;
    int32_t a[128], b[128];
    int n = message(a, 1, 12); /* 13 tokens: blocks of 4 end at 12, the message at 13 */
    n += message(a + n, 2, 20);
    memcpy(b, a, sizeof a);
    int nb = 13 + message(b + 13, 5, 9);
    commit_sequence(&c, &id, a, n / BS * BS);
    KvCacheMatch m;
    assert_int_equal(kv_cache_match(&c, &id, b, nb, &m, &err), 0);
    assert_int_equal(m.device_blocks, 3);
    kv_cache_release(&c, m.node, NULL, 0);
    KvSegmentPlan plan = {0};
    assert_int_equal(kv_cache_find_segments(&c, &id, b, nb, 12, SEGMENT_REUSE_EXACT, &plan, &err), 0);
    assert_int_equal(plan.n, 1);
    assert_true(plan.spans[0].exact);
    assert_int_equal(plan.spans[0].dst_start, 12);
    assert_int_equal(plan.spans[0].n_tokens, 1);
    assert_int_equal(plan.spans[0].src_pos, 12);
    assert_false(plan.inexact);
    kv_cache_drop_segments(&c, &plan);
    assert_int_equal(kv_cache_in_use(&c, CACHE_TIER_DEVICE), 0);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

/* The approximate window: a chunk is admitted only when the W tokens before it match. */
static void test_window(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 3, &id);
    BraidError err;
    int32_t a[128], b[128], d[128];
    int na = message(a, 1, 10);
    int shared = message(a + na, 3, 30);
    int tail = message(a + na + shared, 6, 8);
    memcpy(b, a, sizeof a);
    b[1] = 7; /* other left context far from the shared message: its last 3 tokens still match */
    memcpy(d, a, sizeof a);
    d[na - 1] = 8; /* right before it: the window differs */
    commit_sequence(&c, &id, a, (na + shared + tail) / BS * BS);
    KvSegmentPlan plan = {0};
    assert_int_equal(kv_cache_find_segments(&c, &id, b, na + shared + 1, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_true(plan.n > 0);
    uint64_t rejected = c.counters.segments_rejected_window;
    assert_int_equal(kv_cache_find_segments(&c, &id, d, na + shared + 1, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    /* The message's first chunk is refused; later ones have the message itself as their window. */
    assert_true(c.counters.segments_rejected_window > rejected);
    for (int s = 0; s < plan.n; s++) assert_true(plan.spans[s].dst_start > na);
    kv_cache_drop_segments(&c, &plan);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

/* A span's source blocks are whole and in order: the number its token range covers. */
static void check_span_blocks(const KvSegmentPlan *plan, int s) {
    const KvSegmentSpan *sp = &plan->spans[s];
    assert_int_equal(sp->n_blocks, (sp->src_pos + sp->n_tokens - 1) / BS - sp->src_pos / BS + 1);
    assert_true(sp->first_block + sp->n_blocks <= plan->n_src_blocks);
}

/* Issue 35: chunks reused from one source with the same shift, adjacent in both sequences, are
 * one span (the guards judge runs, not ~16-token chunks); a gap, or a neighbour from another
 * source, starts a new one. */
static void test_adjacent_chunks_one_run(void **state) {
    (void)state;
    KvCache c;
    CacheIdentity id;
    make_cache(&c, 0, &id);
    BraidError err;
    int32_t a[256], b[256], d[256];
    int na = message(a, 1, 10), nb = message(b, 2, 17);
    int shared = message(a + na, 3, 90);
    memcpy(b + nb, a + na, (size_t)shared * sizeof *a);
    int la = na + shared, lb = nb + shared + message(b + nb + shared, 4, 6);
    la += message(a + la, 5, 10); /* so that the shared message's last chunk is committed and indexed */
    a[la++] = ANCHOR;
    commit_sequence(&c, &id, a, la / BS * BS);
    KvSegmentPlan plan = {0};
    uint64_t approx_before = c.counters.segments_approx;
    assert_int_equal(kv_cache_find_segments(&c, &id, b, lb, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_true(c.counters.segments_approx - approx_before >= 3); /* several chunks were reused ... */
    assert_int_equal(plan.n, 1);                                 /* ... as one run */
    assert_int_equal(plan.spans[0].n_tokens, shared);
    assert_int_equal(plan.reused_tokens, shared);
    assert_int_equal(plan.spans[0].dst_start, nb);
    assert_int_equal(plan.spans[0].dst_start - plan.spans[0].src_pos, nb - na);
    assert_int_equal(plan.first_inexact, nb);
    check_span_blocks(&plan, 0);
    int32_t table[64];
    int n_table = (lb + BS - 1) / BS;
    assert_int_equal(kv_cache_reserve(&c, n_table, table), 0);
    assert_int_equal(kv_cache_place_segments(&c, &plan, table, &err), 0);
    check_ops_cover(&c, &plan, table, n_table);
    c.pending.n = 0;
    kv_cache_release(&c, NULL, table, n_table);

    /* A token changed in the middle: its chunk is not found, the run splits around it. */
    memcpy(d, b, sizeof b);
    int changed = nb + 45;
    d[changed] = 9;
    assert_int_equal(kv_cache_find_segments(&c, &id, d, lb, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_int_equal(plan.n, 2);
    for (int s = 0; s < plan.n; s++) {
        const KvSegmentSpan *sp = &plan.spans[s];
        assert_false(changed >= sp->dst_start && changed < sp->dst_start + sp->n_tokens);
        check_span_blocks(&plan, s);
    }
    kv_cache_drop_segments(&c, &plan);

    /* The next message from another source at the position that continues the first one's: the
     * same shift and adjacent, but other K/V history, so two spans. */
    int32_t e[256], f[256];
    int ne = message(e, 7, 10);   /* as long as a's first message */
    ne += message(e + ne, 8, 90); /* as long as the shared one */
    int other = message(e + ne, 9, 20); /* this one comes to f (a and e fit the 64 blocks together) */
    int le = ne + other;
    e[le++] = ANCHOR;
    commit_sequence(&c, &id, e, le / BS * BS);
    int nf = message(f, 2, 17);
    memcpy(f + nf, a + na, (size_t)shared * sizeof *a);
    memcpy(f + nf + shared, e + ne, (size_t)other * sizeof *e);
    int lf = nf + shared + other + message(f + nf + shared + other, 4, 6);
    assert_int_equal(kv_cache_find_segments(&c, &id, f, lf, 0, SEGMENT_REUSE_APPROX, &plan, &err), 0);
    assert_int_equal(plan.n, 2);
    assert_int_equal(plan.spans[0].dst_start, nf);
    assert_int_equal(plan.spans[0].n_tokens, shared);
    assert_int_equal(plan.spans[1].dst_start, nf + shared);
    assert_int_equal(plan.spans[1].dst_start - plan.spans[1].src_pos, plan.spans[0].dst_start - plan.spans[0].src_pos);
    check_span_blocks(&plan, 0);
    check_span_blocks(&plan, 1);
    kv_cache_drop_segments(&c, &plan);
    assert_int_equal(kv_cache_in_use(&c, CACHE_TIER_DEVICE), 0);
    assert_int_equal(kv_cache_check(&c, &err), 0);
    kv_cache_segment_plan_free(&plan);
    kv_cache_free(&c);
}

/* The scheduler: prefill skips reused spans, and an approximate request commits nothing from its
 * first reused span on. */
static void test_scheduler(void **state) {
    (void)state;
    Scheduler s;
    SchedConfig cfg = {.device_blocks = 256, .block_size = BS, .max_batch_tokens = 512, .max_running = 4, .cache_enabled = true,
                       .segments = true, .anchor_tokens = anchors, .n_anchor_tokens = 2, .flops_per_token = 10};
    BraidError err;
    assert_int_equal(sched_init(&s, &cfg, &err), 0);
    int32_t a[256], b[256];
    int na = message(a, 1, 10), nb = message(b, 2, 17);
    int shared = message(a + na, 3, 90);
    memcpy(b + nb, a + na, (size_t)shared * sizeof *a);
    int la = na + shared + message(a + na + shared, 5, 4), lb = nb + shared + message(b + nb + shared, 4, 6);
    SchedRequest ra = {0}, rb = {0};
    ra.id = strdup("a"), rb.id = strdup("b");
    ra.tokens = malloc(sizeof a), rb.tokens = malloc(sizeof b);
    memcpy(ra.tokens, a, sizeof a), memcpy(rb.tokens, b, sizeof b);
    ra.n_tokens = ra.n_prompt = la, rb.n_tokens = rb.n_prompt = lb;
    ra.cap_tokens = rb.cap_tokens = 256;
    ra.max_tokens = rb.max_tokens = 4;
    ra.segment_mode = rb.segment_mode = SEGMENT_REUSE_APPROX;
    StepPlan plan = {0};
    assert_int_equal(sched_add(&s, &ra), 0);
    assert_true(sched_plan(&s, &plan, &err) > 0);
    sched_commit(&s, &plan);
    sched_finish(&s, &ra, "stop");
    assert_int_equal(sched_add(&s, &rb), 0);
    int n_entries = sched_plan(&s, &plan, &err);
    assert_true(rb.reused_tokens > 0);
    const KvSegmentSpan *first = &rb.segments.spans[0];
    assert_int_equal(plan.entries[0].start, 0);
    assert_int_equal(plan.entries[0].count, first->dst_start); /* stops where the reused span starts */
    /* One entry per gap, all in this step (the budget holds the prompt): together they are exactly
     * the tokens no span covers, in order, and only the last samples. */
    int covered = 0, at = 0, span = 0;
    for (int i = 0; i < n_entries; i++) {
        const PlanEntry *pe = &plan.entries[i];
        assert_ptr_equal(pe->req, &rb);
        while (span < rb.segments.n && rb.segments.spans[span].dst_start == at) at += rb.segments.spans[span++].n_tokens;
        assert_int_equal(pe->start, at);
        at += pe->count;
        covered += pe->count;
        assert_int_equal(pe->sample, i == n_entries - 1);
    }
    assert_int_equal(at, rb.n_tokens);
    assert_int_equal(covered + rb.reused_tokens, rb.n_tokens);
    int copy_ops = 0;
    for (int i = 0; i < plan.ops.n; i++) copy_ops += plan.ops.ops[i].kind == CACHE_OP_COPY_SLOTS;
    assert_true(copy_ops > 0);
    int first_inexact = rb.segments.first_inexact;
    int steps = 0;
    while (rb.n_computed < rb.n_tokens - 1 && steps++ < 20) {
        sched_commit(&s, &plan);
        if (rb.n_computed >= rb.n_tokens - 1) break;
        assert_true(sched_plan(&s, &plan, &err) > 0);
    }
    assert_true(steps <= 1); /* the whole prompt in one step */
    assert_int_equal(s.counters.segment_reused_prompt_tokens, (uint64_t)rb.reused_tokens);
    assert_true(s.counters.segment_flops_saved == 10.0 * rb.reused_tokens);
    sched_finish(&s, &rb, "stop");
    /* b's blocks from first_inexact on entered the tree marked approximate: an exact request's
     * match stops before them, an approx-mode request's goes through and learns where they start. */
    KvCacheMatch m;
    CacheIdentity exact_id = rb.identity;
    exact_id.approx_ok = exact_id.has_approx = false;
    assert_int_equal(kv_cache_match(&s.cache, &exact_id, b, lb, &m, &err), 0);
    assert_true(m.device_blocks * BS <= first_inexact);
    assert_int_equal(m.approx_from_block, -1);
    kv_cache_release(&s.cache, m.node, NULL, 0);
    assert_int_equal(kv_cache_match(&s.cache, &rb.identity, b, lb, &m, &err), 0);
    assert_int_equal(m.device_blocks, (lb - 1) / BS);
    assert_int_equal(m.approx_from_block, first_inexact / BS);
    kv_cache_release(&s.cache, m.node, NULL, 0);
    /* An exact computation of the same tokens replaces the approximate blocks. */
    int full = (lb - 1) / BS, free_before = kv_cache_free_blocks(&s.cache, CACHE_TIER_DEVICE);
    int32_t table[64];
    assert_int_equal(kv_cache_reserve(&s.cache, full, table), 0);
    RadixNode *lock = NULL;
    assert_int_equal(kv_cache_commit(&s.cache, &exact_id, b, full, table, &lock, true, &err), 0);
    kv_cache_release(&s.cache, lock, table, full);
    assert_int_equal(kv_cache_match(&s.cache, &exact_id, b, lb, &m, &err), 0);
    assert_int_equal(m.device_blocks, full);
    assert_int_equal(m.approx_from_block, -1);
    kv_cache_release(&s.cache, m.node, NULL, 0);
    /* The caller's blocks under the exact nodes and the replaced approximate ones went back to
     * the free list: as many as it reserved. */
    assert_int_equal(kv_cache_free_blocks(&s.cache, CACHE_TIER_DEVICE), free_before);
    assert_int_equal(sched_check(&s, &err), 0);
    sched_request_free(&ra);
    sched_request_free(&rb);
    plan_free(&plan);
    sched_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunker),     cmocka_unit_test(test_index),  cmocka_unit_test(test_find_and_place),
        cmocka_unit_test(test_exact_tail),  cmocka_unit_test(test_window), cmocka_unit_test(test_scheduler),
        cmocka_unit_test(test_adjacent_chunks_one_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
