#include "cache/block_presence.h"

#include <stdlib.h>
#include <string.h>

enum { EMPTY = 0, TOMBSTONE = 1 };

/* 0 and 1 mark empty and deleted slots: hashes that happen to be those move aside. */
static uint64_t key_of(uint64_t hash) { return hash <= TOMBSTONE ? hash + 2 : hash; }

static int set_find(const HashSet *s, uint64_t key) {
    if (s->cap == 0) return -1;
    for (int i = (int)(key & (uint64_t)(s->cap - 1)), n = 0; n < s->cap; i = (i + 1) & (s->cap - 1), n++) {
        if (s->slots[i] == EMPTY) return -1;
        if (s->slots[i] == key) return i;
    }
    return -1;
}

static int set_rehash(HashSet *s, int cap) {
    uint64_t *old = s->slots;
    int old_cap = s->cap;
    s->slots = calloc((size_t)cap, sizeof *s->slots);
    if (!s->slots) {
        s->slots = old;
        return -1;
    }
    s->cap = cap;
    s->used = s->live = 0;
    for (int i = 0; i < old_cap; i++)
        if (old[i] > TOMBSTONE) {
            int j = (int)(old[i] & (uint64_t)(cap - 1));
            while (s->slots[j] != EMPTY) j = (j + 1) & (cap - 1);
            s->slots[j] = old[i];
            s->used++, s->live++;
        }
    free(old);
    return 0;
}

static int set_add(HashSet *s, uint64_t hash) {
    uint64_t key = key_of(hash);
    if (set_find(s, key) >= 0) return 0;
    /* Keep the table at most half full of live keys and tombstones together. */
    if (2 * (s->used + 1) > s->cap && set_rehash(s, s->cap == 0 ? 64 : (2 * (s->live + 1) > s->cap / 2 ? 2 * s->cap : s->cap)))
        return -1;
    int i = (int)(key & (uint64_t)(s->cap - 1));
    while (s->slots[i] > TOMBSTONE) i = (i + 1) & (s->cap - 1);
    if (s->slots[i] == EMPTY) s->used++;
    s->slots[i] = key;
    s->live++;
    return 0;
}

static void set_remove(HashSet *s, uint64_t hash) {
    int i = set_find(s, key_of(hash));
    if (i < 0) return;
    s->slots[i] = TOMBSTONE;
    s->live--;
}

int block_presence_init(BlockPresence *p, int ghost_capacity) {
    memset(p, 0, sizeof *p);
    p->ghost_capacity = ghost_capacity > 0 ? ghost_capacity : 1;
    p->ring = malloc((size_t)p->ghost_capacity * sizeof *p->ring);
    return p->ring ? 0 : -1;
}

void block_presence_free(BlockPresence *p) {
    free(p->present.slots);
    free(p->ghosts.slots);
    free(p->ring);
    memset(p, 0, sizeof *p);
}

static int add_ghost(BlockPresence *p, uint64_t hash) {
    if (p->ring_len == p->ghost_capacity) set_remove(&p->ghosts, p->ring[p->ring_next]); /* the oldest goes */
    else p->ring_len++;
    p->ring[p->ring_next] = hash;
    p->ring_next = (p->ring_next + 1) % p->ghost_capacity;
    return set_add(&p->ghosts, hash);
}

int block_presence_on_event(BlockPresence *p, const CacheEvent *ev) {
    if (ev->kind == CACHE_EVENT_CLEARED) {
        free(p->present.slots);
        free(p->ghosts.slots);
        memset(&p->present, 0, sizeof p->present);
        memset(&p->ghosts, 0, sizeof p->ghosts);
        p->ring_len = p->ring_next = 0;
        return 0;
    }
    if (ev->tier != CACHE_TIER_DEVICE) return 0;
    for (int i = 0; i < ev->n_blocks; i++) {
        if (ev->kind == CACHE_EVENT_STORED) {
            if (set_add(&p->present, ev->hashes[i])) return -1;
            set_remove(&p->ghosts, ev->hashes[i]); /* back: no longer a loss (the ring entry ages out) */
        } else if (ev->kind == CACHE_EVENT_REMOVED) {
            set_remove(&p->present, ev->hashes[i]);
            if (add_ghost(p, ev->hashes[i])) return -1;
        }
    }
    return 0;
}

bool block_presence_has(const BlockPresence *p, uint64_t hash) { return set_find(&p->present, key_of(hash)) >= 0; }

bool block_presence_evicted(const BlockPresence *p, uint64_t hash) { return set_find(&p->ghosts, key_of(hash)) >= 0; }

int block_presence_prefix(const BlockPresence *p, const uint64_t *chained, int n) {
    int k = 0;
    while (k < n && block_presence_has(p, chained[k])) k++;
    return k;
}
