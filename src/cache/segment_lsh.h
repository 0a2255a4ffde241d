/*
 * segment_lsh.h — near-duplicate chunks for segment reuse: a bounded MinHash/LSH index over
 * canonicalized chunk content (paper 003 § 3.1 "Signatures and Index", § 3.4 candidate
 * retrieval). Internal to src/cache: kv_cache.c owns one beside its segment index and keeps it in
 * step with the device tier through the same hooks (kv_segments.c).
 *
 * Canonicalization (for index keys only; reused K/V always belong to the original token ids, and
 * kv_segments.c reuses only the tokens whose ids are equal): a token id t maps to canon[t] when
 * the caller gave a map and t < n_canon (the engine builds one from the vocabulary: lowercased,
 * whitespace-trimmed token text, every all-digit token one class so numbers, ids and timestamps
 * are masked), else to itself. A chunk's signature is the MinHash (SEGMENT_LSH_HASHES minima) of
 * its canonical SEGMENT_LSH_SHINGLE-token shingles, seeded by the namespace's content seed; the
 * fraction of equal minima estimates the Jaccard similarity of the two shingle sets. A left
 * context signature is the same over the SEGMENT_LSH_CTX_TOKENS tokens before the chunk.
 *
 * Index: SEGMENT_LSH_BANDS bands of SEGMENT_LSH_ROWS minima; an entry is in one bucket chain per
 * band, keyed by (tenant id, adapter id, band, its minima). A query visits only its own bands'
 * chains and compares the interned tenant and adapter ids exactly, so nothing is ever found across
 * namespaces (tenants, adapters) even when their content seeds collide. Entries name the device
 * blocks that hold their slots; segment_lsh_drop_block removes every entry naming a block, so a
 * hit always points at live K/V. Memory is bounded by max_entries: beyond it new chunks are
 * refused and counted, never older ones replaced. A query examines at most SEGMENT_LSH_MAX_PROBE
 * distinct entries. Not thread-safe.
 */
#ifndef BRAID_CACHE_SEGMENT_LSH_H
#define BRAID_CACHE_SEGMENT_LSH_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/segment_index.h"
#include "common/error.h"

#define SEGMENT_LSH_HASHES 32
#define SEGMENT_LSH_ROWS 2
#define SEGMENT_LSH_BANDS (SEGMENT_LSH_HASHES / SEGMENT_LSH_ROWS)
/* Chunks are short (8..256 tokens, ~24 typical): 3-token shingles keep one changed token from
 * removing most of a chunk's shingles (the paper's k = 6..10 is for 64..128-token windows). */
#define SEGMENT_LSH_SHINGLE 3
#define SEGMENT_LSH_CTX_TOKENS 64
#define SEGMENT_LSH_MAX_PROBE 64

typedef struct {
    uint32_t min[SEGMENT_LSH_HASHES];
    bool empty; /* no tokens: similar only to another empty one */
} LshSignature;

typedef struct {
    uint32_t tenant, adapter;     /* interned namespace ids (CacheIdentity) */
    LshSignature seg, ctx;
    uint64_t window_hash;         /* the exact W-token window before it (kv_segments.c's) */
    int32_t pos, len;             /* where it starts in its source sequence, and its tokens */
    int32_t *tokens;              /* (len) original token ids */
    int32_t *blocks;              /* device blocks holding pos .. pos + len - 1 */
    int n_blocks;
    uint64_t band_key[SEGMENT_LSH_BANDS];
    int band_next[SEGMENT_LSH_BANDS]; /* chain links: entry * SEGMENT_LSH_BANDS + band, -1 at the end */
    bool live;
} SegmentLshEntry;

typedef struct {
    const int32_t *canon;         /* (n_canon) canonical class of each token id; NULL = identity */
    int n_canon;
    SegmentLshEntry *entries;
    int n_slots, cap_slots;
    int *free_stack;
    int n_free, cap_free;
    int *buckets;                 /* heads of chains (links as above), -1 empty */
    int n_buckets;                /* power of two */
    SegmentRefs *by_block;
    int n_device_blocks;
    int max_entries, n_live;
    uint64_t refused_full;
} SegmentLsh;

/* A new entry's content. */
typedef struct {
    uint32_t tenant, adapter;
    const LshSignature *seg, *ctx;
    uint64_t window_hash;
    int32_t pos, len;
    const int32_t *tokens;
} SegmentLshKey;

/* The outcome of a query: entries examined (same namespace, sharing a band), how many fell short
 * of tau_seg or tau_ctx, and the best one that passed both (-1 when none) with its similarities. */
typedef struct {
    int n_candidates, n_below_seg, n_below_ctx;
    int best;
    double seg_sim, ctx_sim;
} SegmentLshResult;

/* canon (may be NULL) is borrowed: it must outlive the index. */
int segment_lsh_init(SegmentLsh *l, int n_device_blocks, int max_entries, const int32_t *canon, int n_canon, BraidError *err);
void segment_lsh_free(SegmentLsh *l);

/* The MinHash signature of tokens[0..n), canonicalized, seeded by the namespace seed. */
void segment_lsh_sign(const SegmentLsh *l, uint64_t seed, const int32_t *tokens, int n, LshSignature *out);
/* Estimated Jaccard similarity: the fraction of equal minima (1 for two empty, 0 for one). */
double segment_lsh_similarity(const LshSignature *a, const LshSignature *b);

/* Indexes a chunk held by blocks[0..n_blocks). 0 added, 2 full (refused, counted), -1 out of memory. */
int segment_lsh_add(SegmentLsh *l, const SegmentLshKey *key, const int32_t *blocks, int n_blocks);
/* Entries of (tenant, adapter) sharing a band with seg; the best by segment similarity among those
 * with seg >= tau_seg and ctx >= tau_ctx. */
void segment_lsh_query(const SegmentLsh *l, uint32_t tenant, uint32_t adapter, const LshSignature *seg, const LshSignature *ctx,
                       double tau_seg, double tau_ctx, SegmentLshResult *out);
static inline const SegmentLshEntry *segment_lsh_entry(const SegmentLsh *l, int entry) { return &l->entries[entry]; }
/* A device block left the device tier: every entry naming it goes. */
void segment_lsh_drop_block(SegmentLsh *l, int32_t block);

#endif
