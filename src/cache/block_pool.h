/*
 * block_pool.h — accounting for one pool of fixed-size KV blocks (metadata only: no tensors).
 *
 * Owns: per-block holder counts, the "owned by the radix tree" flag, and the free list.
 * Block 0 is the null block: never handed out, never counted. Every other block is exactly one of
 *   free    — on the free list;
 *   cached  — owned by the radix tree, held by no request (evictable once its node is a leaf);
 *   in use  — held by at least one request (private, or shared with the tree).
 * Invariant (block_pool_check, run by the tests and debug builds): free + cached + in use == total.
 * Alloc and free are O(1) per block. Not thread-safe: one instance leader owns its pool.
 */
#ifndef BRAID_CACHE_BLOCK_POOL_H
#define BRAID_CACHE_BLOCK_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"

typedef struct {
    int n_blocks;      /* including the null block */
    int32_t *holders;  /* (n_blocks) requests holding each block */
    uint8_t *in_tree;  /* (n_blocks) 1 when the radix tree owns the block */
    int32_t *free_list;
    int n_free;
    int n_cached;      /* in_tree && holders == 0 */
    int n_in_use;      /* holders > 0 */
} BlockPool;

int block_pool_init(BlockPool *pool, int n_blocks, BraidError *err);
void block_pool_free(BlockPool *pool);
int block_pool_total(const BlockPool *pool); /* usable blocks: n_blocks - 1 */

/* Takes n free blocks, each held once by the caller. All or nothing: returns -1 (and takes none)
 * when fewer than n are free. */
int block_pool_alloc(BlockPool *pool, int n, int32_t *out);
/* Adds / drops one holder. A block nobody holds and the tree does not own returns to the free list. */
void block_pool_hold(BlockPool *pool, int32_t block);
void block_pool_release(BlockPool *pool, int32_t block);
/* The radix tree takes (owned = true) or gives up ownership of a block. */
void block_pool_set_in_tree(BlockPool *pool, int32_t block, bool owned);

/* Returns 0 when the counters agree with a full recount and add up to the total; else -1 with err. */
int block_pool_check(const BlockPool *pool, BraidError *err);

#endif
