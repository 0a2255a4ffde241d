/*
 * radix_tree.h — the structure of the prefix cache: a radix tree over token ids at block
 * granularity (the LRU baseline is SGLang's RadixCache). Internal to src/cache: only kv_cache.c
 * changes it; other modules see RadixNode as an opaque handle plus its metadata (policies read it).
 *
 * Each edge carries whole blocks: block_size token ids per block, the chained content hash of each
 * block, and where the block's KV lives: a device block id and/or a host block id (meta.tiers says
 * which arrays are valid). Sequences are keyed by a namespace (interned tenant and adapter ids)
 * first. Children never share a first block. The tree owns its nodes (and frees a node's
 * meta.uses with it); it knows nothing of pools,
 * locks' meaning or eviction order (kv_cache.c keeps those).
 * Not thread-safe.
 */
#ifndef BRAID_CACHE_RADIX_TREE_H
#define BRAID_CACHE_RADIX_TREE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/evict_policy.h"
#include "common/error.h"

typedef struct RadixNode {
    struct RadixNode *parent;
    struct RadixNode **children;
    int n_children, cap_children;
    int32_t *tokens;      /* (n_blocks * block_size) the edge label */
    int32_t *blocks;      /* (n_blocks) device block ids, valid when meta.tiers has CACHE_ON_DEVICE */
    int32_t *host_blocks; /* (n_blocks) host block ids, valid when meta.tiers has CACHE_ON_HOST */
    uint64_t *hashes;     /* (n_blocks) chained content hash of each block */
    int n_blocks;
    int lock_ref;         /* active locks on this node or a descendant */
    int heap_pos[CACHE_N_TIERS]; /* index in each tier's eviction heap, -1 when not in it */
    double heap_key[CACHE_N_TIERS];
    /* Compared before heap_key: 0 for a decayed node (Leyline DECAY goes before everything the
     * policy ranks, whatever its scores), 1 otherwise. Set with heap_key (kv_cache.c node_key). */
    uint8_t heap_class[CACHE_N_TIERS];
    int pin_pos;          /* index in the cache's pinned-node list, -1 when not pinned (kv_hints.c) */
    uint64_t ns;          /* namespace: (tenant id << 32) | adapter id */
    CacheNodeMeta meta;
} RadixNode;

typedef struct {
    uint64_t ns;
    RadixNode *root;
} RadixRoot;

typedef void (*RadixSplitFn)(void *ctx, RadixNode *upper, RadixNode *lower);

typedef struct RadixTree {
    int block_size;
    RadixRoot *roots;
    int n_roots, cap_roots;
    RadixSplitFn on_split; /* told after a node is split in two: the upper half has a copy of its meta,
                            * meta.uses its own array (may be NULL) */
    void *split_ctx;
} RadixTree;

/* The namespace key of interned (tenant, adapter) ids. */
uint64_t radix_namespace(uint32_t tenant, uint32_t adapter);

int radix_init(RadixTree *tree, int block_size, BraidError *err);
/* Frees every node; visit (may be NULL) sees each non-root node first, children before parents. */
void radix_free(RadixTree *tree, void (*visit)(void *ctx, RadixNode *node), void *ctx);
/* The root of a namespace, created when new; NULL when out of memory. */
RadixNode *radix_root(RadixTree *tree, uint64_t ns);
static inline int radix_is_root(const RadixNode *n) { return n->parent == NULL; }

/* Follows tokens (max_blocks whole blocks) down from root as far as the tree continues them,
 * splitting the last node so the walk ends on a node boundary. Calls step(ctx, node) for every
 * node passed, in order. Returns the number of blocks matched, -1 when out of memory. *end gets
 * the last node passed (root when none). */
int radix_walk(RadixTree *tree, RadixNode *root, const int32_t *tokens, int max_blocks, RadixNode **end,
               void (*step)(void *ctx, RadixNode *node), void *ctx);
/* radix_walk that stops before a child for which enter(ctx, child, pos) says false (pos: the
 * blocks matched before it), without splitting it. */
int radix_walk_while(RadixTree *tree, RadixNode *root, const int32_t *tokens, int max_blocks, RadixNode **end,
                     bool (*enter)(void *ctx, const RadixNode *child, int pos), void (*step)(void *ctx, RadixNode *node), void *ctx);
/* Read-only radix_walk: the whole blocks of tokens (at most max_blocks) the tree continues from
 * root, stopping before a child enter(ctx, child) refuses (NULL: none refused); splits nothing. */
int radix_peek(const RadixNode *root, int block_size, const int32_t *tokens, int max_blocks,
               bool (*enter)(const void *ctx, const RadixNode *child), const void *ctx);
/* Whole blocks at the head of token runs a[0, n_a) and b[0, n_b) that hold the same tokens (0 when
 * block_size <= 0). */
int radix_shared_blocks(const int32_t *a, int n_a, const int32_t *b, int n_b, int block_size);
/* A new leaf under parent with n_blocks blocks of tokens; arrays of ids and hashes are allocated,
 * uninitialized, meta zeroed. NULL when out of memory. */
RadixNode *radix_add_leaf(RadixTree *tree, RadixNode *parent, const int32_t *tokens, int n_blocks);
/* Splits node after its first k blocks (0 < k < n_blocks): a new upper node takes them, with a copy
 * of the metadata, and node keeps the rest as its only child; on_split is told. Returns the upper
 * node, NULL when out of memory (nothing changed). */
RadixNode *radix_split(RadixTree *tree, RadixNode *node, int k);
/* Unlinks a childless non-root node from its parent and frees it. */
void radix_remove_leaf(RadixTree *tree, RadixNode *node);

#endif
