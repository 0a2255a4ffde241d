/*
 * block_index.h — the set of chained block hashes one instance holds in its prefix cache, as the
 * coordinator knows it from the instance's KV events (KV_EVENTS: blocks inserted are added, blocks
 * gone from every tier removed). Part of the global content-hash registry (one index per instance).
 *
 * Bounded memory: at most max_blocks hashes. Adding a new hash to a full index first evicts the
 * least recently stored one (store order; adding a hash already present refreshes it), counted in
 * `evicted`. The index is advisory (the router's guess of where a prefix is cached, never used for
 * correctness), so forgetting the oldest entries only costs a worse route for those blocks; and
 * the oldest stored blocks are the likeliest to have left the instance already.
 *
 * Layout: an entry pool (hash + store-order links, 16 bytes per block) that grows up to max_blocks
 * and never moves an entry, and an open-addressing table of 32-bit entry indexes (linear probing,
 * tombstones, rehashed at 3/4 load to a power of two at least twice the live count). Neither ever
 * exceeds what max_blocks needs: at most 16 + 16 bytes per block of the bound (the default bound:
 * 16 MiB of entries + 8 MiB of table), ~25 bytes per block held when full
 * (bench/bench_registry.c measures it). Any 64-bit hash value is a valid key.
 * Owns its memory. Not thread-safe (the coordinator's MPI thread).
 */
#ifndef BRAID_COORD_BLOCK_INDEX_H
#define BRAID_COORD_BLOCK_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Per instance: 2^20 blocks (16 Mi tokens at 16 tokens a block) in at most 24 MiB. */
#define BLOCK_INDEX_DEFAULT_MAX_BLOCKS ((size_t)1 << 20)
/* The most an index can be asked to hold (entry indexes are 32-bit, two values reserved). */
#define BLOCK_INDEX_LIMIT ((size_t)1 << 31)

typedef struct {
    uint64_t hash;
    uint32_t older, newer; /* store-order neighbours, BLOCK_INDEX_NONE at the ends */
} BlockIndexEntry;

typedef struct {
    uint32_t *slots;          /* (cap) entry index, or the empty / deleted markers */
    size_t cap, used;         /* slots; live + tombstones */
    BlockIndexEntry *entries; /* (cap_entries) pool; unused entries chain through `newer` from free_head */
    size_t n_entries, cap_entries;
    uint32_t free_head, oldest, newest;
    size_t count, max_blocks;
    uint64_t evicted;         /* hashes dropped to stay within max_blocks */
} BlockIndex;

/* max_blocks 0: BLOCK_INDEX_DEFAULT_MAX_BLOCKS; above BLOCK_INDEX_LIMIT: BLOCK_INDEX_LIMIT. */
void block_index_init(BlockIndex *ix, size_t max_blocks);
void block_index_free(BlockIndex *ix);
/* Empties the index, keeping its bound and eviction count. */
void block_index_clear(BlockIndex *ix);
/* Returns 0, or -1 when memory runs out (the hash is then not recorded; the index stays valid). */
int block_index_add(BlockIndex *ix, uint64_t hash);
void block_index_remove(BlockIndex *ix, uint64_t hash);
bool block_index_has(const BlockIndex *ix, uint64_t hash);
/* How many of hashes[0..n) are present before the first absent one: the cached prefix in blocks. */
int block_index_prefix(const BlockIndex *ix, const uint64_t *hashes, int n);
/* Bytes the index holds allocated (table and entry pool). */
size_t block_index_bytes(const BlockIndex *ix);

#endif
