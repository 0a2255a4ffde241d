#include "coord/block_index.h"

#include <stdlib.h>
#include <string.h>

enum { EMPTY = 0, DELETED = 1 };

static uint64_t key_of(uint64_t h) { return h <= DELETED ? 2 : h; }

/* The hashes are already well mixed (XXH3), so the low bits index directly. */
static size_t home(const BlockIndex *ix, uint64_t key) { return (size_t)key & (ix->cap - 1); }

void block_index_init(BlockIndex *ix) { memset(ix, 0, sizeof *ix); }

void block_index_free(BlockIndex *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof *ix);
}

static int rehash(BlockIndex *ix, size_t cap) {
    uint64_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    BlockIndex grown = {.slots = slots, .cap = cap};
    for (size_t i = 0; i < ix->cap; i++) {
        uint64_t k = ix->slots[i];
        if (k == EMPTY || k == DELETED) continue;
        size_t j = home(&grown, k);
        while (grown.slots[j] != EMPTY) j = (j + 1) & (cap - 1);
        grown.slots[j] = k;
        grown.count++;
    }
    grown.used = grown.count;
    free(ix->slots);
    *ix = grown;
    return 0;
}

int block_index_add(BlockIndex *ix, uint64_t hash) {
    uint64_t key = key_of(hash);
    if ((ix->used + 1) * 4 > ix->cap * 3) {
        size_t cap = ix->cap ? ix->cap : 64;
        while ((ix->count + 1) * 2 > cap) cap *= 2;
        if (rehash(ix, cap)) return -1;
    }
    size_t j = home(ix, key), tomb = (size_t)-1;
    for (; ix->slots[j] != EMPTY; j = (j + 1) & (ix->cap - 1)) {
        if (ix->slots[j] == key) return 0;
        if (ix->slots[j] == DELETED && tomb == (size_t)-1) tomb = j;
    }
    if (tomb != (size_t)-1) j = tomb;
    else ix->used++;
    ix->slots[j] = key;
    ix->count++;
    return 0;
}

static size_t find(const BlockIndex *ix, uint64_t key) {
    if (!ix->cap) return (size_t)-1;
    for (size_t j = home(ix, key); ix->slots[j] != EMPTY; j = (j + 1) & (ix->cap - 1))
        if (ix->slots[j] == key) return j;
    return (size_t)-1;
}

void block_index_remove(BlockIndex *ix, uint64_t hash) {
    size_t j = find(ix, key_of(hash));
    if (j == (size_t)-1) return;
    ix->slots[j] = DELETED;
    ix->count--;
}

bool block_index_has(const BlockIndex *ix, uint64_t hash) { return find(ix, key_of(hash)) != (size_t)-1; }

int block_index_prefix(const BlockIndex *ix, const uint64_t *hashes, int n) {
    int i = 0;
    while (i < n && block_index_has(ix, hashes[i])) i++;
    return i;
}
