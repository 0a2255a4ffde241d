/*
 * kv_segments.h — internal to src/cache: the hooks by which kv_cache.c keeps its segment index
 * (segment_index.h) in step with the tree. The public side (find / place / drop) is in kv_cache.h.
 */
#ifndef BRAID_CACHE_KV_SEGMENTS_H
#define BRAID_CACHE_KV_SEGMENTS_H

#include "cache/kv_cache.h"

int kv_segments_init(KvCache *c, const KvCacheConfig *cfg, BraidError *err);
void kv_segments_free(KvCache *c);
/* After a commit: indexes the chunks of tokens[0 .. n_full blocks) that end before the last
 * committed token and before the first node marked approximate, with the tree's device blocks on
 * the path to end. Out of memory or a full index only leaves chunks unindexed. */
void kv_segments_register(KvCache *c, const CacheIdentity *id, const int32_t *tokens, int n_full, const RadixNode *end);
/* A node's device blocks leave the device tier. */
void kv_segments_forget_blocks(KvCache *c, const int32_t *blocks, int n);

/* Near-duplicate segments (kv_segments_lsh.c; each a no-op while the LSH index is off).
 * lsh_init: the LSH index beside a segment index of max_entries. lsh_register: indexes chunk ch
 * of tokens (its window hash and device blocks as the segment index has them). lsh_find: for a
 * chunk no exact-hash entry has, in approx mode: the best near-duplicate past tau_seg / tau_ctx,
 * and from it only tokens with equal ids whose W-token window is equal too (the prefix before the
 * first differing token when the window before the chunk matches; the common suffix from W tokens
 * past the last differing one), clipped to [lo, hi), added to the plan as approximate spans;
 * unless segment_lsh_anywhere, only when the plan is already approximate. -1 when out of memory. */
int kv_segments_lsh_init(KvCache *c, const KvCacheConfig *cfg, int max_entries, BraidError *err);
void kv_segments_lsh_register(KvCache *c, const CacheIdentity *id, uint64_t seed, const int32_t *tokens, const Chunk *ch,
                              uint64_t window_hash, const int32_t *blocks, int n_blocks);
int kv_segments_lsh_find(KvCache *c, const CacheIdentity *id, uint64_t seed, const int32_t *tokens, const Chunk *ch, int lo, int hi,
                         uint64_t window_hash, KvSegmentPlan *plan);

/* Adds a span to the plan: tokens [lo, hi) of the new sequence, from src_lo on in a source whose
 * blocks from block `base` on are `blocks`; holds the source blocks. -1 when out of memory. */
int kv_segments_add_span(KvCache *c, KvSegmentPlan *plan, int lo, int hi, int32_t src_lo, const int32_t *blocks, int base, bool exact);

#endif
