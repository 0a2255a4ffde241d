#include "coord/block_index.h"

#include <stdlib.h>
#include <string.h>

enum { SLOT_EMPTY = UINT32_MAX, SLOT_DELETED = UINT32_MAX - 1 };
#define BLOCK_INDEX_NONE UINT32_MAX

/* The hashes are already well mixed (XXH3), so the low bits index directly. */
static size_t home(size_t cap, uint64_t hash) { return (size_t)hash & (cap - 1); }

void block_index_init(BlockIndex *ix, size_t max_blocks) {
    memset(ix, 0, sizeof *ix);
    ix->max_blocks = max_blocks == 0 ? BLOCK_INDEX_DEFAULT_MAX_BLOCKS : max_blocks > BLOCK_INDEX_LIMIT ? BLOCK_INDEX_LIMIT : max_blocks;
    ix->free_head = ix->oldest = ix->newest = BLOCK_INDEX_NONE;
}

void block_index_free(BlockIndex *ix) {
    size_t max_blocks = ix->max_blocks;
    free(ix->slots);
    free(ix->entries);
    block_index_init(ix, max_blocks);
}

void block_index_clear(BlockIndex *ix) {
    uint64_t evicted = ix->evicted;
    block_index_free(ix);
    ix->evicted = evicted;
}

size_t block_index_bytes(const BlockIndex *ix) {
    return ix->cap * sizeof *ix->slots + ix->cap_entries * sizeof *ix->entries;
}

/* The slot holding hash, or SIZE_MAX. */
static size_t find_slot(const BlockIndex *ix, uint64_t hash) {
    if (!ix->cap) return SIZE_MAX;
    for (size_t j = home(ix->cap, hash); ix->slots[j] != SLOT_EMPTY; j = (j + 1) & (ix->cap - 1))
        if (ix->slots[j] != SLOT_DELETED && ix->entries[ix->slots[j]].hash == hash) return j;
    return SIZE_MAX;
}

/* A table of cap slots over the live entries, tombstones gone. Entries do not move. */
static int rehash(BlockIndex *ix, size_t cap) {
    uint32_t *slots = malloc(cap * sizeof *slots);
    if (!slots) return -1;
    memset(slots, 0xff, cap * sizeof *slots); /* SLOT_EMPTY */
    for (uint32_t e = ix->oldest; e != BLOCK_INDEX_NONE; e = ix->entries[e].newer) {
        size_t j = home(cap, ix->entries[e].hash);
        while (slots[j] != SLOT_EMPTY) j = (j + 1) & (cap - 1);
        slots[j] = e;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    ix->used = ix->count;
    return 0;
}

static void unlink_entry(BlockIndex *ix, uint32_t e) {
    BlockIndexEntry *en = &ix->entries[e];
    if (en->older != BLOCK_INDEX_NONE) ix->entries[en->older].newer = en->newer;
    else ix->oldest = en->newer;
    if (en->newer != BLOCK_INDEX_NONE) ix->entries[en->newer].older = en->older;
    else ix->newest = en->older;
}

static void link_newest(BlockIndex *ix, uint32_t e) {
    ix->entries[e].older = ix->newest;
    ix->entries[e].newer = BLOCK_INDEX_NONE;
    if (ix->newest != BLOCK_INDEX_NONE) ix->entries[ix->newest].newer = e;
    else ix->oldest = e;
    ix->newest = e;
}

/* Drops the entry in slot j: a tombstone in the table, the entry back on the free list. */
static void remove_at(BlockIndex *ix, size_t j) {
    uint32_t e = ix->slots[j];
    ix->slots[j] = SLOT_DELETED;
    unlink_entry(ix, e);
    ix->entries[e].newer = ix->free_head;
    ix->free_head = e;
    ix->count--;
}

/* An unused entry: from the free list, else a new one from the pool (grown by doubling, up to the
 * bound). BLOCK_INDEX_NONE when memory runs out. */
static uint32_t take_entry(BlockIndex *ix) {
    if (ix->free_head != BLOCK_INDEX_NONE) {
        uint32_t e = ix->free_head;
        ix->free_head = ix->entries[e].newer;
        return e;
    }
    if (ix->n_entries == ix->cap_entries) {
        size_t cap = ix->cap_entries ? ix->cap_entries * 2 : 64;
        if (cap > ix->max_blocks) cap = ix->max_blocks;
        BlockIndexEntry *grown = realloc(ix->entries, cap * sizeof *grown);
        if (!grown) return BLOCK_INDEX_NONE;
        ix->entries = grown;
        ix->cap_entries = cap;
    }
    return (uint32_t)ix->n_entries++;
}

/* Room for one more slot in use: rehash at 3/4 load, to twice the live count (so tombstones
 * alone never grow the table past what the bound needs). */
static int make_room(BlockIndex *ix) {
    if ((ix->used + 1) * 4 <= ix->cap * 3) return 0;
    size_t cap = 64;
    while (cap < (ix->count + 1) * 2) cap *= 2;
    return rehash(ix, cap);
}

int block_index_add(BlockIndex *ix, uint64_t hash) {
    size_t j = find_slot(ix, hash);
    if (j != SIZE_MAX) { /* stored again: it is the newest now */
        uint32_t e = ix->slots[j];
        unlink_entry(ix, e);
        link_newest(ix, e);
        return 0;
    }
    if (ix->count == ix->max_blocks) {
        remove_at(ix, find_slot(ix, ix->entries[ix->oldest].hash));
        ix->evicted++;
    }
    if (make_room(ix)) return -1;
    uint32_t e = take_entry(ix);
    if (e == BLOCK_INDEX_NONE) return -1;
    ix->entries[e].hash = hash;
    link_newest(ix, e);
    j = home(ix->cap, hash);
    while (ix->slots[j] != SLOT_EMPTY && ix->slots[j] != SLOT_DELETED) j = (j + 1) & (ix->cap - 1);
    if (ix->slots[j] == SLOT_EMPTY) ix->used++;
    ix->slots[j] = e;
    ix->count++;
    return 0;
}

void block_index_remove(BlockIndex *ix, uint64_t hash) {
    size_t j = find_slot(ix, hash);
    if (j != SIZE_MAX) remove_at(ix, j);
}

bool block_index_has(const BlockIndex *ix, uint64_t hash) { return find_slot(ix, hash) != SIZE_MAX; }

int block_index_prefix(const BlockIndex *ix, const uint64_t *hashes, int n) {
    int i = 0;
    while (i < n && block_index_has(ix, hashes[i])) i++;
    return i;
}
