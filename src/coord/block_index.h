/*
 * block_index.h — the set of chained block hashes one instance holds in its prefix cache, as the
 * coordinator knows it from the instance's KV events (KV_EVENTS: blocks inserted are added, blocks
 * gone from every tier removed).
 *
 * Open addressing over uint64 keys with tombstones; the key 0 and 1 are reserved as the empty and
 * deleted markers, so a hash that happens to be 0 or 1 is nudged to 2 (a one-in-2^63 collision the
 * router can live with: the index is advisory, never used for correctness).
 * Owns its table. Not thread-safe (the coordinator's MPI thread).
 */
#ifndef BRAID_COORD_BLOCK_INDEX_H
#define BRAID_COORD_BLOCK_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *slots;
    size_t cap, count, used; /* used = live + tombstones */
} BlockIndex;

void block_index_init(BlockIndex *ix);
void block_index_free(BlockIndex *ix);
/* Returns 0, or -1 when the table cannot grow (the hash is then not recorded). */
int block_index_add(BlockIndex *ix, uint64_t hash);
void block_index_remove(BlockIndex *ix, uint64_t hash);
bool block_index_has(const BlockIndex *ix, uint64_t hash);
/* How many of hashes[0..n) are present before the first absent one: the cached prefix in blocks. */
int block_index_prefix(const BlockIndex *ix, const uint64_t *hashes, int n);

#endif
