/*
 * kv_segments.c — segment reuse in the cache: chunks of committed sequences are indexed with the
 * tree's device blocks that hold them; a new sequence's chunks are looked up, admitted by mode,
 * and landed in its blocks with COPY_SLOTS operations (keys turned by the offset difference).
 *
 * Hashes: a chunk's own hash is position-independent (chunker.h) and seeded by the namespace and
 * the model seed; its left context is named by chaining the hashes of the chunks before it (the
 * chunking is a function of the tokens, so equal chains mean equal token prefixes); its window by
 * hashing the W tokens before it.
 *
 * Runs (issue 35): chunks reused one after another from the same source with the same shift
 * (the next entry starts where the last ended and its left chain is the last one's plus its chunk)
 * are planned as one span, so the span guards (worker/sched_span_guard.h: probe, head, min span,
 * tail) sit at the run's true boundary, where the left context starts to differ, and judge its
 * real length; the chunks inside a run share their K/V history, so they need no guard of their own.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/kv_segments.h"
#include "common/grow.h"

int segment_reuse_parse(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "off") == 0) return SEGMENT_REUSE_OFF;
    if (strcmp(name, "exact") == 0) return SEGMENT_REUSE_EXACT;
    if (strcmp(name, "approx") == 0) return SEGMENT_REUSE_APPROX;
    return -1;
}

const char *segment_reuse_name(SegmentReuseMode mode) {
    return mode == SEGMENT_REUSE_EXACT ? "exact" : mode == SEGMENT_REUSE_APPROX ? "approx" : "off";
}

int kv_segments_init(KvCache *c, const KvCacheConfig *cfg, BraidError *err) {
    if (!cfg->segments) return 0;
    int max_entries = cfg->segment_max_entries;
    if (max_entries <= 0) max_entries = (int)(((int64_t)cfg->device_blocks * cfg->block_size) / CHUNKER_MIN_TOKENS) + 1;
    if (chunker_config_init(&c->chunker, cfg->anchor_tokens, cfg->n_anchor_tokens, 0, 0, 0, err) ||
        segment_index_init(&c->segments, cfg->device_blocks, max_entries, err))
        return braid_error_wrap(err, "kv cache: segment index");
    c->segments_on = true;
    c->approx_window = cfg->approx_window > 0 ? cfg->approx_window : 0;
    c->model_seed = cfg->model_seed;
    return kv_segments_lsh_init(c, cfg, max_entries, err);
}

void kv_segments_free(KvCache *c) {
    segment_lsh_free(&c->lsh);
    segment_index_free(&c->segments);
    chunker_config_free(&c->chunker);
    free(c->chunks);
    free(c->seq_blocks);
}

void kv_segments_forget_blocks(KvCache *c, const int32_t *blocks, int n) {
    if (!c->segments_on) return;
    for (int i = 0; i < n; i++) segment_index_drop_block(&c->segments, blocks[i]);
    if (c->lsh_on)
        for (int i = 0; i < n; i++) segment_lsh_drop_block(&c->lsh, blocks[i]);
}

static uint64_t chunk_seed(const KvCache *c, const CacheIdentity *id) { return id->hash_seed ^ c->model_seed; }

static uint64_t chain_left(uint64_t left, uint64_t chunk_hash) { return XXH3_64bits_withSeed(&chunk_hash, sizeof chunk_hash, left); }

/* The W tokens before start (fewer at the sequence's start: the count is part of the hash). */
static uint64_t window_hash(const KvCache *c, uint64_t seed, const int32_t *tokens, int start) {
    int w = c->approx_window < start ? c->approx_window : start;
    if (w == 0) return 0;
    return XXH3_64bits_withSeed(tokens + start - w, (size_t)w * sizeof *tokens, seed ^ (uint64_t)w);
}

/* The tree's device blocks from the root to end, in sequence order, into c->seq_blocks; the
 * number of blocks before the first node marked approximate (all of them when none is). -1 when
 * out of memory or a node is off the device. */
static int exact_path_blocks(KvCache *c, const RadixNode *end) {
    int n = 0;
    for (const RadixNode *r = end; !radix_is_root(r); r = r->parent) n += r->n_blocks;
    if (braid_grow((void **)&c->seq_blocks, &c->cap_seq_blocks, n + 1, sizeof *c->seq_blocks)) return -1;
    int pos = n, exact = n;
    for (const RadixNode *r = end; !radix_is_root(r); r = r->parent) {
        if (!(r->meta.tiers & CACHE_ON_DEVICE)) return -1;
        pos -= r->n_blocks;
        memcpy(c->seq_blocks + pos, r->blocks, (size_t)r->n_blocks * sizeof *r->blocks);
        if (r->meta.approximate) exact = pos;
    }
    return exact;
}

void kv_segments_register(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_full, const RadixNode *end) {
    if (!c->segments_on || n_full <= 0) return;
    /* Only exact K/V become sources: an exact-mode hit must equal a recompute. */
    int exact = exact_path_blocks(c, end);
    if (exact < n_full) n_full = exact;
    if (n_full <= 0) return;
    int bs = c->block_size, n_tokens = n_full * bs;
    BraidError err;
    uint64_t seed = chunk_seed(c, id), left = seed;
    int n_chunks = chunker_split(&c->chunker, seed, tokens, n_tokens, &c->chunks, &c->cap_chunks, &err);
    /* The last chunk may continue past what is committed: its end is not known yet. */
    for (int i = 0; i + 1 < n_chunks; i++) {
        const Chunk *ch = &c->chunks[i];
        SegmentKey key = {.hash = ch->hash, .left_hash = left, .window_hash = window_hash(c, seed, tokens, ch->start),
                          .pos = ch->start, .len = ch->len};
        int first = ch->start / bs, last = (ch->start + ch->len - 1) / bs;
        int rc = segment_index_add(&c->segments, &key, c->seq_blocks + first, last - first + 1);
        if (rc == 0) c->counters.segments_indexed++;
        else if (rc == 2) c->counters.segments_refused_full++;
        if (rc == 0) kv_segments_lsh_register(c, id, seed, tokens, ch, key.window_hash, c->seq_blocks + first, last - first + 1);
        left = chain_left(left, ch->hash);
    }
}

/* ---- lookup ---- */

typedef struct {
    int entry;  /* -1: none admitted */
    bool exact;
    bool found; /* some entry had the chunk's hash and length */
} SegmentChoice;

/* Entry `next` holds the chunk that follows entry `prev`'s in the same source: it starts where
 * prev's ends and its left context is prev's left context and chunk (equal chains mean equal
 * token prefixes, so the K/V of both were computed as one run). */
static bool continues_source(const KvCache *c, int prev, int next) {
    const SegmentKey *p = &segment_index_entry(&c->segments, prev)->key, *n = &segment_index_entry(&c->segments, next)->key;
    return n->pos == p->pos + p->len && n->left_hash == chain_left(p->left_hash, p->hash);
}

/* The entry to reuse for a chunk: one with the same left context if any (exact), else in
 * approximate mode one whose window matches, preferring one that continues the source of the
 * chunk reused just before (`follows`, -1 none: same source prefix, next position), so that the
 * two land as one run. */
static SegmentChoice choose(const KvCache *c, const Chunk *ch, uint64_t left, uint64_t window, SegmentReuseMode mode,
                            int follows) {
    SegmentChoice pick = {.entry = -1};
    for (int e = segment_index_first(&c->segments, ch->hash); e >= 0; e = segment_index_next(&c->segments, e)) {
        const SegmentKey *k = &segment_index_entry(&c->segments, e)->key;
        if (k->len != ch->len) continue;
        pick.found = true;
        if (k->left_hash == left && k->pos == ch->start) return (SegmentChoice){.entry = e, .exact = true, .found = true};
        if (mode != SEGMENT_REUSE_APPROX || k->window_hash != window) continue;
        if (pick.entry < 0 || (follows >= 0 && continues_source(c, follows, e))) pick.entry = e;
    }
    return pick;
}

static void release_holds(KvCache *c, KvSegmentPlan *plan) {
    if (!plan->held) return;
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    for (int i = 0; i < plan->n_src_blocks; i++) block_pool_release(dev, plan->src_blocks[i]);
    plan->held = false;
}

static void plan_reset(KvSegmentPlan *plan) {
    plan->n = 0;
    plan->n_src_blocks = 0;
    plan->reused_tokens = 0;
    plan->inexact = false;
    plan->first_inexact = 0;
    plan->lsh_tokens = 0;
}

int kv_segments_add_span(KvCache *c, KvSegmentPlan *plan, int lo, int hi, int32_t src_lo, const int32_t *blocks, int base, bool exact) {
    int bs = c->block_size;
    int32_t src_hi = src_lo + (hi - lo);
    int first = src_lo / bs - base, n_blocks = (src_hi - 1) / bs - base - first + 1;
    if (braid_grow((void **)&plan->spans, &plan->cap, plan->n + 1, sizeof *plan->spans) ||
        braid_grow((void **)&plan->src_blocks, &plan->cap_src_blocks, plan->n_src_blocks + n_blocks, sizeof *plan->src_blocks))
        return -1;
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    for (int i = 0; i < n_blocks; i++) {
        int32_t b = blocks[first + i];
        block_pool_hold(dev, b);
        plan->src_blocks[plan->n_src_blocks + i] = b;
    }
    plan->held = true;
    plan->spans[plan->n++] = (KvSegmentSpan){.dst_start = lo, .n_tokens = hi - lo, .src_pos = src_lo, .exact = exact,
                                              .first_block = plan->n_src_blocks, .n_blocks = n_blocks};
    plan->n_src_blocks += n_blocks;
    plan->reused_tokens += hi - lo;
    if (!exact && (!plan->inexact || lo < plan->first_inexact)) {
        plan->inexact = true;
        plan->first_inexact = lo;
    }
    return 0;
}

/* Extends the plan's last span by tokens [lo, hi) from src_lo on (blocks from block `base` on are
 * `blocks`) when they continue it in both sequences with the same exactness: one run, so the span
 * guards (sched_span_guard.h) judge its real length and boundary, not a chunk's. The caller has
 * checked that the source is the same (continues_source). Returns 1 when extended, 0 when the
 * tokens must be a span of their own, -1 when out of memory. */
static int extend_last_span(KvCache *c, KvSegmentPlan *plan, int lo, int hi, int32_t src_lo, const int32_t *blocks, int base,
                            bool exact) {
    if (plan->n == 0) return 0;
    KvSegmentSpan *sp = &plan->spans[plan->n - 1];
    if (sp->exact != exact || sp->dst_start + sp->n_tokens != lo || sp->src_pos + sp->n_tokens != src_lo) return 0;
    int bs = c->block_size;
    int first = src_lo / bs, last = (src_lo + (hi - lo) - 1) / bs;
    int have_last = (sp->src_pos + sp->n_tokens - 1) / bs; /* the span's last source block, by block number */
    /* A source block both hold must be the same block (it is, for one source; checked all the same). */
    if (first == have_last && plan->src_blocks[sp->first_block + sp->n_blocks - 1] != blocks[first - base]) return 0;
    if (sp->first_block + sp->n_blocks != plan->n_src_blocks) return 0; /* its blocks are not the list's tail */
    int from = first > have_last ? first : have_last + 1, n_new = last >= from ? last - from + 1 : 0;
    if (braid_grow((void **)&plan->src_blocks, &plan->cap_src_blocks, plan->n_src_blocks + n_new, sizeof *plan->src_blocks))
        return -1;
    BlockPool *dev = &c->tiers[CACHE_TIER_DEVICE].pool;
    for (int i = 0; i < n_new; i++) {
        int32_t b = blocks[from - base + i];
        block_pool_hold(dev, b);
        plan->src_blocks[plan->n_src_blocks + i] = b;
    }
    plan->held = true;
    plan->n_src_blocks += n_new;
    sp->n_blocks += n_new;
    sp->n_tokens += hi - lo;
    plan->reused_tokens += hi - lo;
    return 1;
}

/* Adds tokens [lo, hi) of chunk ch, found in entry, to the plan: as the continuation of the last
 * span when `continues` (the entry follows the last span's source chunk) and the positions line up,
 * else as a span of its own. -1 when out of memory. */
static int add_span(KvCache *c, KvSegmentPlan *plan, const Chunk *ch, int lo, int hi, const SegmentEntry *entry, bool exact,
                    bool continues) {
    int32_t src_lo = entry->key.pos + (lo - ch->start);
    int base = entry->key.pos / c->block_size;
    if (continues) {
        int rc = extend_last_span(c, plan, lo, hi, src_lo, entry->blocks, base, exact);
        if (rc != 0) return rc < 0 ? -1 : 0;
    }
    return kv_segments_add_span(c, plan, lo, hi, src_lo, entry->blocks, base, exact);
}

int kv_cache_find_segments(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int from,
                           SegmentReuseMode mode, KvSegmentPlan *plan, BraidError *err) {
    kv_cache_drop_segments(c, plan);
    return kv_cache_find_more_segments(c, id, tokens, n_tokens, from, mode, plan, err);
}

int kv_cache_find_more_segments(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_tokens, int from,
                                SegmentReuseMode mode, KvSegmentPlan *plan, BraidError *err) {
    if (!c->segments_on || mode == SEGMENT_REUSE_OFF || n_tokens < 2) return 0;
    uint64_t seed = chunk_seed(c, id), left = seed;
    int limit = n_tokens - 1;
    int n_chunks = chunker_split(&c->chunker, seed, tokens, n_tokens, &c->chunks, &c->cap_chunks, err);
    if (n_chunks < 0) return -1;
    /* The entry reused for the chunk just before, while the plan's last span is its (-1 none). */
    int prev_entry = -1;
    for (int i = 0; i < n_chunks; i++) {
        const Chunk *ch = &c->chunks[i];
        int lo = ch->start > from ? ch->start : from, hi = ch->start + ch->len < limit ? ch->start + ch->len : limit;
        int follows = prev_entry;
        prev_entry = -1;
        if (hi > lo) {
            SegmentChoice pick = choose(c, ch, left, window_hash(c, seed, tokens, ch->start), mode, follows);
            if (pick.found) c->counters.segment_candidates++;
            if (pick.entry >= 0) {
                bool continues = follows >= 0 && continues_source(c, follows, pick.entry);
                if (add_span(c, plan, ch, lo, hi, segment_index_entry(&c->segments, pick.entry), pick.exact, continues)) {
                    kv_cache_drop_segments(c, plan);
                    return braid_error_set(err, "kv cache: out of memory planning segment reuse");
                }
                prev_entry = pick.entry;
                if (pick.exact) c->counters.segments_exact++;
                else c->counters.segments_approx++;
            } else if (pick.found) {
                if (mode == SEGMENT_REUSE_APPROX) c->counters.segments_rejected_window++;
                else c->counters.segments_rejected_context++;
            } else if (mode == SEGMENT_REUSE_APPROX && c->lsh_on) { /* never in exact mode */
                if (kv_segments_lsh_find(c, id, seed, tokens, ch, lo, hi, window_hash(c, seed, tokens, ch->start), plan)) {
                    kv_cache_drop_segments(c, plan);
                    return braid_error_set(err, "kv cache: out of memory planning segment reuse");
                }
            }
        }
        left = chain_left(left, ch->hash);
    }
    return 0;
}

/* COPY_SLOTS for one span: one operation per overlap of a source block and a target block. */
static int span_ops(KvCache *c, const KvSegmentPlan *plan, const KvSegmentSpan *sp, const int32_t *table) {
    int bs = c->block_size, base = sp->src_pos / bs;
    int32_t delta = sp->dst_start - sp->src_pos;
    for (int done = 0; done < sp->n_tokens;) {
        int dst = sp->dst_start + done, src = sp->src_pos + done;
        int run = sp->n_tokens - done;
        if (run > bs - dst % bs) run = bs - dst % bs;
        if (run > bs - src % bs) run = bs - src % bs;
        int32_t src_block = plan->src_blocks[sp->first_block + src / bs - base];
        if (cache_ops_push_slots(&c->pending, src_block, src % bs, table[dst / bs], dst % bs, run, delta)) return -1;
        done += run;
    }
    return 0;
}

int kv_cache_place_segments(KvCache *c, KvSegmentPlan *plan, const int32_t *table, BraidError *err) {
    int before = c->pending.n;
    for (int i = 0; i < plan->n; i++)
        if (span_ops(c, plan, &plan->spans[i], table)) {
            c->pending.n = before;
            kv_cache_drop_segments(c, plan);
            return braid_error_set(err, "kv cache: out of memory placing reused segments");
        }
    c->counters.segment_reused_tokens += (uint64_t)plan->reused_tokens;
    /* List order keeps the sources intact: any later operation or forward that could overwrite a
     * released block comes after these copies. */
    release_holds(c, plan);
    return 0;
}

void kv_cache_drop_segments(KvCache *c, KvSegmentPlan *plan) {
    release_holds(c, plan);
    plan_reset(plan);
}

void kv_cache_segment_plan_free(KvSegmentPlan *plan) {
    free(plan->spans);
    free(plan->src_blocks);
    memset(plan, 0, sizeof *plan);
}
