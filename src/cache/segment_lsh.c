#include "cache/segment_lsh.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/grow.h"
#include "common/mix64.h"

int segment_lsh_init(SegmentLsh *l, int n_device_blocks, int max_entries, const int32_t *canon, int n_canon, BraidError *err) {
    memset(l, 0, sizeof *l);
    l->canon = canon;
    l->n_canon = canon ? n_canon : 0;
    l->max_entries = max_entries > 0 ? max_entries : 1;
    l->n_buckets = 64;
    /* About two chain heads per (entry, band) pair at the bound, capped so a huge bound does not
     * take its table up front. */
    while (l->n_buckets < 2 * l->max_entries * SEGMENT_LSH_BANDS && l->n_buckets < (1 << 22)) l->n_buckets *= 2;
    l->buckets = malloc((size_t)l->n_buckets * sizeof *l->buckets);
    l->by_block = calloc((size_t)n_device_blocks, sizeof *l->by_block);
    if (!l->buckets || !l->by_block) {
        segment_lsh_free(l);
        return braid_error_set(err, "segment lsh: out of memory for %d entries", max_entries);
    }
    memset(l->buckets, 0xff, (size_t)l->n_buckets * sizeof *l->buckets);
    l->n_device_blocks = n_device_blocks;
    return 0;
}

void segment_lsh_free(SegmentLsh *l) {
    for (int i = 0; i < l->n_slots; i++) {
        free(l->entries[i].tokens);
        free(l->entries[i].blocks);
    }
    for (int b = 0; l->by_block && b < l->n_device_blocks; b++) free(l->by_block[b].ids);
    free(l->entries);
    free(l->free_stack);
    free(l->buckets);
    free(l->by_block);
    memset(l, 0, sizeof *l);
}

/* ---- signatures ---- */



static int32_t canonical(const SegmentLsh *l, int32_t token) {
    return token >= 0 && token < l->n_canon ? l->canon[token] : token;
}

void segment_lsh_sign(const SegmentLsh *l, uint64_t seed, const int32_t *tokens, int n, LshSignature *out) {
    memset(out->min, 0xff, sizeof out->min);
    out->empty = n <= 0;
    if (n <= 0) return;
    int k = n < SEGMENT_LSH_SHINGLE ? n : SEGMENT_LSH_SHINGLE;
    for (int i = 0; i + k <= n; i++) {
        int32_t shingle[SEGMENT_LSH_SHINGLE];
        for (int j = 0; j < k; j++) shingle[j] = canonical(l, tokens[i + j]);
        uint64_t h = XXH3_64bits_withSeed(shingle, (size_t)k * sizeof *shingle, seed);
        /* One independent-looking value per hash function: the shingle's hash remixed with the
         * function's index (splitmix64 steps). */
        for (int f = 0; f < SEGMENT_LSH_HASHES; f++) {
            uint32_t v = (uint32_t)mix64_finalize(h + (uint64_t)(f + 1) * 0x9e3779b97f4a7c15ull);
            if (v < out->min[f]) out->min[f] = v;
        }
    }
}

double segment_lsh_similarity(const LshSignature *a, const LshSignature *b) {
    if (a->empty || b->empty) return a->empty && b->empty ? 1.0 : 0.0;
    int same = 0;
    for (int f = 0; f < SEGMENT_LSH_HASHES; f++) same += a->min[f] == b->min[f];
    return (double)same / SEGMENT_LSH_HASHES;
}

static uint64_t band_key(uint32_t tenant, uint32_t adapter, int band, const LshSignature *sig) {
    uint32_t key[4 + SEGMENT_LSH_ROWS] = {tenant, adapter, (uint32_t)band, sig->empty};
    memcpy(key + 4, sig->min + band * SEGMENT_LSH_ROWS, SEGMENT_LSH_ROWS * sizeof *key);
    return XXH3_64bits(key, sizeof key);
}

/* ---- entries ---- */

static int bucket_of(const SegmentLsh *l, uint64_t key) { return (int)(key & (uint64_t)(l->n_buckets - 1)); }

static int take_slot(SegmentLsh *l) {
    if (l->n_free > 0) return l->free_stack[--l->n_free];
    if (braid_grow((void **)&l->entries, &l->cap_slots, l->n_slots + 1, sizeof *l->entries)) return -1;
    memset(&l->entries[l->n_slots], 0, sizeof l->entries[l->n_slots]);
    return l->n_slots++;
}

static void ref_remove(SegmentRefs *r, int entry) {
    for (int i = 0; i < r->n; i++)
        if (r->ids[i] == entry) {
            r->ids[i] = r->ids[--r->n];
            return;
        }
}

static int *link_slot(SegmentLsh *l, int link) { return &l->entries[link / SEGMENT_LSH_BANDS].band_next[link % SEGMENT_LSH_BANDS]; }

static void unlink_band(SegmentLsh *l, int entry, int band) {
    int me = entry * SEGMENT_LSH_BANDS + band;
    int *at = &l->buckets[bucket_of(l, l->entries[entry].band_key[band])];
    while (*at != me) at = link_slot(l, *at);
    *at = l->entries[entry].band_next[band];
}

static void remove_entry(SegmentLsh *l, int entry) {
    SegmentLshEntry *e = &l->entries[entry];
    for (int b = 0; b < SEGMENT_LSH_BANDS; b++) unlink_band(l, entry, b);
    for (int i = 0; i < e->n_blocks; i++) ref_remove(&l->by_block[e->blocks[i]], entry);
    free(e->tokens);
    free(e->blocks);
    e->tokens = NULL;
    e->blocks = NULL;
    e->n_blocks = 0;
    e->live = false;
    l->free_stack[l->n_free++] = entry;
    l->n_live--;
}

int segment_lsh_add(SegmentLsh *l, const SegmentLshKey *key, const int32_t *blocks, int n_blocks) {
    if (l->n_live >= l->max_entries) {
        l->refused_full++;
        return 2;
    }
    /* Every allocation first, so linking the entry in cannot fail half-way. */
    if (braid_grow((void **)&l->free_stack, &l->cap_free, l->n_slots + 1, sizeof *l->free_stack)) return -1;
    for (int i = 0; i < n_blocks; i++) {
        SegmentRefs *r = &l->by_block[blocks[i]];
        if (braid_grow((void **)&r->ids, &r->cap, r->n + 1, sizeof *r->ids)) return -1;
    }
    int32_t *tokens = malloc((size_t)(key->len > 0 ? key->len : 1) * sizeof *tokens);
    int32_t *copy = malloc((size_t)(n_blocks > 0 ? n_blocks : 1) * sizeof *copy);
    int slot = tokens && copy ? take_slot(l) : -1;
    if (slot < 0) {
        free(tokens);
        free(copy);
        return -1;
    }
    memcpy(tokens, key->tokens, (size_t)key->len * sizeof *tokens);
    memcpy(copy, blocks, (size_t)n_blocks * sizeof *copy);
    SegmentLshEntry *e = &l->entries[slot];
    *e = (SegmentLshEntry){.tenant = key->tenant, .adapter = key->adapter, .seg = *key->seg, .ctx = *key->ctx,
                           .window_hash = key->window_hash, .pos = key->pos, .len = key->len, .tokens = tokens,
                           .blocks = copy, .n_blocks = n_blocks, .live = true};
    for (int b = 0; b < SEGMENT_LSH_BANDS; b++) {
        e->band_key[b] = band_key(key->tenant, key->adapter, b, key->seg);
        int *head = &l->buckets[bucket_of(l, e->band_key[b])];
        e->band_next[b] = *head;
        *head = slot * SEGMENT_LSH_BANDS + b;
    }
    for (int i = 0; i < n_blocks; i++) {
        SegmentRefs *r = &l->by_block[blocks[i]];
        r->ids[r->n++] = slot;
    }
    l->n_live++;
    return 0;
}

static bool seen_before(const int *seen, int n, int entry) {
    for (int i = 0; i < n; i++)
        if (seen[i] == entry) return true;
    return false;
}

void segment_lsh_query(const SegmentLsh *l, uint32_t tenant, uint32_t adapter, const LshSignature *seg, const LshSignature *ctx,
                       double tau_seg, double tau_ctx, SegmentLshResult *out) {
    *out = (SegmentLshResult){.best = -1};
    if (!l->buckets || l->n_live == 0) return;
    int seen[SEGMENT_LSH_MAX_PROBE], n_seen = 0;
    for (int b = 0; b < SEGMENT_LSH_BANDS && n_seen < SEGMENT_LSH_MAX_PROBE; b++) {
        uint64_t key = band_key(tenant, adapter, b, seg);
        for (int link = l->buckets[bucket_of(l, key)]; link >= 0 && n_seen < SEGMENT_LSH_MAX_PROBE;) {
            int entry = link / SEGMENT_LSH_BANDS, band = link % SEGMENT_LSH_BANDS;
            const SegmentLshEntry *e = &l->entries[entry];
            link = e->band_next[band];
            /* The ids, not the key's hash, decide the namespace: no hash collision crosses it. */
            if (band != b || e->band_key[band] != key || e->tenant != tenant || e->adapter != adapter) continue;
            if (seen_before(seen, n_seen, entry)) continue;
            seen[n_seen++] = entry;
            double s = segment_lsh_similarity(seg, &e->seg);
            if (s < tau_seg) {
                out->n_below_seg++;
                continue;
            }
            double x = segment_lsh_similarity(ctx, &e->ctx);
            if (x < tau_ctx) {
                out->n_below_ctx++;
                continue;
            }
            if (out->best < 0 || s > out->seg_sim || (s == out->seg_sim && x > out->ctx_sim)) {
                out->best = entry;
                out->seg_sim = s;
                out->ctx_sim = x;
            }
        }
    }
    out->n_candidates = n_seen;
}

void segment_lsh_drop_block(SegmentLsh *l, int32_t block) {
    if (!l->by_block || block <= 0 || block >= l->n_device_blocks) return;
    SegmentRefs *r = &l->by_block[block];
    while (r->n > 0) remove_entry(l, r->ids[r->n - 1]);
}
