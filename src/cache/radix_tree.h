/*
 * radix_tree.h — the prefix cache: a radix tree over token ids at block granularity (the LRU
 * baseline is SGLang's RadixCache).
 *
 * Each edge carries whole blocks: block_size token ids per block and the KV block id holding them.
 * Sequences are keyed by a namespace (tenant, adapter) first, so no match crosses tenants or
 * adapters. Partial last blocks never enter the tree; they stay private to their request.
 * Contracts:
 *  - radix_match_prefix never matches the whole prompt (at least one token is left to compute).
 *    The caller must radix_lock() the returned node before using the blocks, and hold each block in
 *    the pool for as long as it reads it.
 *  - radix_insert takes ownership of the blocks past the already-cached prefix; for the cached part
 *    it reports how many of the caller's blocks are duplicates (the caller releases those).
 *  - Locked nodes (and their ancestors) are never evicted. The evictable-leaf set is kept
 *    incrementally; eviction asks the EvictPolicy for victims among it.
 * Memory: nodes are owned by the tree. Not thread-safe (the instance leader's thread).
 */
#ifndef BRAID_CACHE_RADIX_TREE_H
#define BRAID_CACHE_RADIX_TREE_H

#include <stdint.h>

#include "cache/block_pool.h"
#include "cache/evict_policy.h"
#include "common/error.h"

typedef struct RadixNode {
    struct RadixNode *parent;
    struct RadixNode **children;
    int n_children, cap_children;
    int32_t *tokens; /* (n_blocks * block_size) the edge label */
    int32_t *blocks; /* (n_blocks) */
    int n_blocks;
    int lock_ref;        /* active locks on this node or a descendant */
    int evictable_index; /* position in the evictable set, -1 when not in it */
    uint64_t ns;         /* namespace (tenant, adapter) */
    CacheNodeMeta meta;
} RadixNode;

typedef struct {
    uint64_t ns;
    RadixNode *root;
} RadixRoot;

typedef struct {
    uint64_t matches, matched_tokens, inserted_blocks, evicted_blocks, evicted_nodes;
} RadixCounters;

typedef struct RadixTree {
    int block_size;
    BlockPool *pool;
    const EvictPolicy *policy;
    void *policy_state;
    RadixRoot *roots;
    int n_roots, cap_roots;
    RadixNode **evictable;
    int n_evictable, cap_evictable;
    uint64_t tick;
    int cached_blocks; /* blocks owned by the tree */
    RadixCounters counters;
} RadixTree;

typedef struct {
    RadixNode *node; /* deepest matched node (a root when nothing matched) */
    int n_blocks;
    int32_t *blocks; /* (n_blocks), malloc'd; caller frees */
} RadixMatch;

/* Builds the namespace key of a (tenant, adapter) pair. */
uint64_t radix_namespace(uint32_t tenant, uint32_t adapter);
/* The namespace of tenant and adapter names (NULL or "" = none); every producer of cache keys and
 * traces uses this one mapping so the same names always meet in the same namespace. */
uint64_t radix_namespace_for(const char *tenant, const char *adapter);

int radix_init(RadixTree *tree, BlockPool *pool, int block_size, const EvictPolicy *policy, void *policy_state, BraidError *err);
void radix_free(RadixTree *tree);

/* Longest cached prefix of tokens[0..n) in namespace ns, in whole blocks, at most (n-1) tokens. */
int radix_match_prefix(RadixTree *tree, uint64_t ns, const int32_t *tokens, int n, RadixMatch *out, BraidError *err);
/* Inserts the first n_blocks full blocks of tokens with their KV blocks. *cached_blocks gets how
 * many leading blocks were already in the tree (those of `blocks` are duplicates). *end_node gets
 * the node ending the inserted path (may be NULL). */
int radix_insert(RadixTree *tree, uint64_t ns, const int32_t *tokens, int n_blocks, const int32_t *blocks, int *cached_blocks,
                 RadixNode **end_node, BraidError *err);
void radix_lock(RadixTree *tree, RadixNode *node);
void radix_unlock(RadixTree *tree, RadixNode *node);
/* Evicts unlocked leaves chosen by the policy until at least need_blocks blocks were released or
 * nothing evictable is left. Evicted block ids go to evicted_out (capacity: need_blocks plus the
 * largest node, so pass cached_blocks to be safe) when non-NULL. Returns the number of blocks. */
int radix_evict(RadixTree *tree, int need_blocks, int32_t *evicted_out);
/* Blocks that eviction could release right now. */
int radix_evictable_blocks(const RadixTree *tree);
/* Full-walk consistency check (tests, debug builds): ownership flags, lock counts, evictable set. */
int radix_check(const RadixTree *tree, BraidError *err);

#endif
