#include "cache/segment_index.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

int segment_index_init(SegmentIndex *idx, int n_device_blocks, int max_entries, BraidError *err) {
    memset(idx, 0, sizeof *idx);
    idx->max_entries = max_entries > 0 ? max_entries : 1;
    idx->n_buckets = 64;
    while (idx->n_buckets < 2 * idx->max_entries) idx->n_buckets *= 2;
    idx->buckets = malloc((size_t)idx->n_buckets * sizeof *idx->buckets);
    idx->by_block = calloc((size_t)n_device_blocks, sizeof *idx->by_block);
    if (!idx->buckets || !idx->by_block) {
        segment_index_free(idx);
        return braid_error_set(err, "segment index: out of memory for %d entries", max_entries);
    }
    memset(idx->buckets, 0xff, (size_t)idx->n_buckets * sizeof *idx->buckets);
    idx->n_device_blocks = n_device_blocks;
    return 0;
}

void segment_index_free(SegmentIndex *idx) {
    for (int i = 0; i < idx->n_slots; i++) free(idx->entries[i].blocks);
    for (int b = 0; idx->by_block && b < idx->n_device_blocks; b++) free(idx->by_block[b].ids);
    free(idx->entries);
    free(idx->free_stack);
    free(idx->buckets);
    free(idx->by_block);
    memset(idx, 0, sizeof *idx);
}

static int bucket_of(const SegmentIndex *idx, uint64_t hash) { return (int)(hash & (uint64_t)(idx->n_buckets - 1)); }

int segment_index_first(const SegmentIndex *idx, uint64_t hash) {
    int e = idx->buckets ? idx->buckets[bucket_of(idx, hash)] : -1;
    while (e >= 0 && idx->entries[e].key.hash != hash) e = idx->entries[e].next;
    return e;
}

int segment_index_next(const SegmentIndex *idx, int entry) {
    uint64_t hash = idx->entries[entry].key.hash;
    int e = idx->entries[entry].next;
    while (e >= 0 && idx->entries[e].key.hash != hash) e = idx->entries[e].next;
    return e;
}

static bool same_place(const SegmentEntry *e, const SegmentKey *k) {
    return e->key.hash == k->hash && e->key.left_hash == k->left_hash && e->key.pos == k->pos && e->key.len == k->len;
}

/* A slot for a new entry: a dead one, or a fresh one at the end. -1 when out of memory. */
static int take_slot(SegmentIndex *idx) {
    if (idx->n_free > 0) return idx->free_stack[--idx->n_free];
    if (braid_grow((void **)&idx->entries, &idx->cap_slots, idx->n_slots + 1, sizeof *idx->entries)) return -1;
    idx->entries[idx->n_slots] = (SegmentEntry){.next = -1};
    return idx->n_slots++;
}

static void ref_remove(SegmentRefs *r, int entry) {
    for (int i = 0; i < r->n; i++)
        if (r->ids[i] == entry) {
            r->ids[i] = r->ids[--r->n];
            return;
        }
}

static void unlink_entry(SegmentIndex *idx, int entry) {
    int *link = &idx->buckets[bucket_of(idx, idx->entries[entry].key.hash)];
    while (*link != entry) link = &idx->entries[*link].next;
    *link = idx->entries[entry].next;
}

/* Removes a live entry: out of its chain and every block's list, its slot back on the stack (which
 * has room for every slot: segment_index_add grows it first). */
static void remove_entry(SegmentIndex *idx, int entry) {
    SegmentEntry *e = &idx->entries[entry];
    unlink_entry(idx, entry);
    for (int i = 0; i < e->n_blocks; i++) ref_remove(&idx->by_block[e->blocks[i]], entry);
    e->live = false;
    e->n_blocks = 0;
    e->next = -1;
    idx->free_stack[idx->n_free++] = entry;
    idx->n_live--;
}

int segment_index_add(SegmentIndex *idx, const SegmentKey *key, const int32_t *blocks, int n_blocks) {
    for (int e = segment_index_first(idx, key->hash); e >= 0; e = segment_index_next(idx, e))
        if (same_place(&idx->entries[e], key)) return 1;
    if (idx->n_live >= idx->max_entries) {
        idx->refused_full++;
        return 2;
    }
    /* Every allocation first, so linking the entry in below cannot fail half-way. */
    if (braid_grow((void **)&idx->free_stack, &idx->cap_free, idx->n_slots + 1, sizeof *idx->free_stack)) return -1;
    for (int i = 0; i < n_blocks; i++) {
        SegmentRefs *r = &idx->by_block[blocks[i]];
        if (braid_grow((void **)&r->ids, &r->cap, r->n + 1, sizeof *r->ids)) return -1;
    }
    int32_t *copy = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *copy);
    int slot = copy ? take_slot(idx) : -1;
    if (slot < 0) {
        free(copy);
        return -1;
    }
    SegmentEntry *e = &idx->entries[slot];
    free(e->blocks);
    memcpy(copy, blocks, (size_t)n_blocks * sizeof *copy);
    int *head = &idx->buckets[bucket_of(idx, key->hash)];
    *e = (SegmentEntry){.key = *key, .blocks = copy, .n_blocks = n_blocks, .next = *head, .live = true};
    *head = slot;
    for (int i = 0; i < n_blocks; i++) {
        SegmentRefs *r = &idx->by_block[blocks[i]];
        r->ids[r->n++] = slot;
    }
    idx->n_live++;
    return 0;
}

void segment_index_drop_block(SegmentIndex *idx, int32_t block) {
    if (!idx->by_block || block <= 0 || block >= idx->n_device_blocks) return;
    SegmentRefs *r = &idx->by_block[block];
    while (r->n > 0) remove_entry(idx, r->ids[r->n - 1]);
}
