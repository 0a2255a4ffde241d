/*
 * segment_index.h — where cached chunks sit, for reuse at other offsets (the segment index of
 * cross-query KV reuse). Internal to src/cache: kv_cache.c owns one and keeps it consistent with
 * the device tier.
 *
 * An entry names one chunk (chunker.h) of a sequence whose blocks are in the radix tree on the
 * device: its position-independent hash and length, two hashes of what precedes it (the whole left
 * context, for exact admission, and the last W tokens, for approximate admission), the position
 * it starts at, and the device blocks that hold its slots. Lookup is by chunk hash (exact match,
 * chained buckets); an entry is removed as soon as any of its blocks leaves the device tier
 * (segment_index_drop_block), so every entry found points at live KV. Memory is bounded by
 * max_entries; beyond it new chunks are refused (counted), never older ones silently replaced.
 * Not thread-safe.
 */
#ifndef BRAID_CACHE_SEGMENT_INDEX_H
#define BRAID_CACHE_SEGMENT_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

typedef struct {
    uint64_t hash;        /* chunk hash (position-independent, namespaced) */
    uint64_t left_hash;   /* the whole left context (chained over the chunks before it) */
    uint64_t window_hash; /* the last W tokens before it (W fixed per index) */
    int32_t pos, len;     /* first position and token count in the source sequence */
} SegmentKey;

typedef struct {
    SegmentKey key;
    int32_t *blocks;      /* device blocks holding positions pos .. pos + len - 1 (block of p: blocks[p / bs - pos / bs]) */
    int n_blocks;
    int next;             /* bucket chain, -1 at its end */
    bool live;
} SegmentEntry;

typedef struct {
    int32_t *ids;
    int n, cap;
} SegmentRefs;

typedef struct {
    SegmentEntry *entries;
    int n_slots, cap_slots; /* entries[0..n_slots) ever used; dead ones are on the free stack */
    int *free_stack;
    int n_free, cap_free;
    int *buckets;           /* heads of chains, -1 empty */
    int n_buckets;          /* power of two */
    SegmentRefs *by_block;  /* (n_device_blocks) entries naming each block */
    int n_device_blocks;
    int max_entries, n_live;
    uint64_t refused_full;  /* chunks not indexed because max_entries were live */
} SegmentIndex;

int segment_index_init(SegmentIndex *idx, int n_device_blocks, int max_entries, BraidError *err);
void segment_index_free(SegmentIndex *idx);
/* Indexes a chunk held by blocks[0..n_blocks). Returns 0 when added, 1 when the same chunk at the
 * same position with the same left context is already there, 2 when full, -1 when out of memory. */
int segment_index_add(SegmentIndex *idx, const SegmentKey *key, const int32_t *blocks, int n_blocks);
/* The first live entry with this chunk hash, then the next ones (-1 at the end). */
int segment_index_first(const SegmentIndex *idx, uint64_t hash);
int segment_index_next(const SegmentIndex *idx, int entry);
static inline const SegmentEntry *segment_index_entry(const SegmentIndex *idx, int entry) { return &idx->entries[entry]; }
/* A device block left the tree's device tier: every entry that names it goes. */
void segment_index_drop_block(SegmentIndex *idx, int32_t block);

#endif
