/*
 * kv_segments.c — segment reuse in the cache: chunks of committed sequences are indexed with the
 * tree's device blocks that hold them; a new sequence's chunks are looked up, admitted by mode,
 * and landed in its blocks with COPY_SLOTS operations (keys turned by the offset difference).
 *
 * Hashes: a chunk's own hash is position-independent (chunker.h) and seeded by the namespace and
 * the model seed; its left context is named by chaining the hashes of the chunks before it (the
 * chunking is a function of the tokens, so equal chains mean equal token prefixes); its window by
 * hashing the W tokens before it.
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

/* The entry to reuse for a chunk: one with the same left context if any (exact), else in
 * approximate mode one whose window matches. */
static SegmentChoice choose(const KvCache *c, const Chunk *ch, uint64_t left, uint64_t window, SegmentReuseMode mode) {
    SegmentChoice pick = {.entry = -1};
    for (int e = segment_index_first(&c->segments, ch->hash); e >= 0; e = segment_index_next(&c->segments, e)) {
        const SegmentKey *k = &segment_index_entry(&c->segments, e)->key;
        if (k->len != ch->len) continue;
        pick.found = true;
        if (k->left_hash == left && k->pos == ch->start) return (SegmentChoice){.entry = e, .exact = true, .found = true};
        if (mode == SEGMENT_REUSE_APPROX && pick.entry < 0 && k->window_hash == window) pick.entry = e;
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

/* Adds tokens [lo, hi) of chunk ch, found in entry, to the plan. */
static int add_span(KvCache *c, KvSegmentPlan *plan, const Chunk *ch, int lo, int hi, const SegmentEntry *entry, bool exact) {
    return kv_segments_add_span(c, plan, lo, hi, entry->key.pos + (lo - ch->start), entry->blocks, entry->key.pos / c->block_size, exact);
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
    for (int i = 0; i < n_chunks; i++) {
        const Chunk *ch = &c->chunks[i];
        int lo = ch->start > from ? ch->start : from, hi = ch->start + ch->len < limit ? ch->start + ch->len : limit;
        if (hi > lo) {
            SegmentChoice pick = choose(c, ch, left, window_hash(c, seed, tokens, ch->start), mode);
            if (pick.found) c->counters.segment_candidates++;
            if (pick.entry >= 0) {
                if (add_span(c, plan, ch, lo, hi, segment_index_entry(&c->segments, pick.entry), pick.exact)) {
                    kv_cache_drop_segments(c, plan);
                    return braid_error_set(err, "kv cache: out of memory planning segment reuse");
                }
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
