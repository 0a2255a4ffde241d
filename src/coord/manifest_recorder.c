/*
 * manifest_recorder.c — a fixed-capacity table of chunk counts: chained hash buckets for lookup,
 * and a min-heap on (count, first-seen order) that names the entry to replace when full.
 */
#include "coord/manifest_recorder.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunker.h"
#include "cache/content_hash.h"
#include "common/log.h"
#include "coord/manifest_line.h"

typedef struct {
    ManifestLine line; /* the chunk, its namespace, where it was first seen, its count */
    uint64_t seq;      /* first-seen order: the older of two equal counts goes first */
    int heap_pos;
    int next;          /* next entry in the same bucket, -1 at the end */
} RecEntry;

struct ManifestRecorder {
    pthread_mutex_t mu;
    ChunkerConfig chunker;
    uint64_t model_seed;
    RecEntry *entries; /* (capacity); the first n are live */
    int capacity, n;
    int *buckets;      /* (n_buckets) first entry of each chain, -1 when empty */
    int n_buckets;
    int *heap;         /* (n) entry indices, the least (count, seq) on top */
    uint64_t next_seq;
    Chunk *chunks;     /* scratch for one prompt's chunks */
    int cap_chunks;
    FILE *out;
    char *out_path;
    long long evicted, lines_written;
};

/* ---- the heap ---- */

static bool entry_less(const ManifestRecorder *r, int a, int b) {
    const RecEntry *x = &r->entries[a], *y = &r->entries[b];
    return x->line.count != y->line.count ? x->line.count < y->line.count : x->seq < y->seq;
}

static void heap_set(ManifestRecorder *r, int pos, int entry) {
    r->heap[pos] = entry;
    r->entries[entry].heap_pos = pos;
}

static void heap_sift_down(ManifestRecorder *r, int pos) {
    for (;;) {
        int least = pos, left = 2 * pos + 1, right = left + 1;
        if (left < r->n && entry_less(r, r->heap[left], r->heap[least])) least = left;
        if (right < r->n && entry_less(r, r->heap[right], r->heap[least])) least = right;
        if (least == pos) return;
        int moved = r->heap[pos];
        heap_set(r, pos, r->heap[least]);
        heap_set(r, least, moved);
        pos = least;
    }
}

static void heap_sift_up(ManifestRecorder *r, int pos) {
    while (pos > 0) {
        int parent = (pos - 1) / 2;
        if (!entry_less(r, r->heap[pos], r->heap[parent])) return;
        int moved = r->heap[pos];
        heap_set(r, pos, r->heap[parent]);
        heap_set(r, parent, moved);
        pos = parent;
    }
}

/* ---- the buckets ---- */

static int bucket_of(const ManifestRecorder *r, uint64_t hash) { return (int)(hash % (uint64_t)r->n_buckets); }

static bool same_name(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static int find_entry(const ManifestRecorder *r, uint64_t hash, const char *tenant, const char *adapter) {
    for (int i = r->buckets[bucket_of(r, hash)]; i >= 0; i = r->entries[i].next) {
        const ManifestLine *l = &r->entries[i].line;
        if (l->content_hash == hash && same_name(l->tenant, tenant) && same_name(l->adapter, adapter)) return i;
    }
    return -1;
}

static void unlink_entry(ManifestRecorder *r, int entry) {
    int *link = &r->buckets[bucket_of(r, r->entries[entry].line.content_hash)];
    while (*link != entry) link = &r->entries[*link].next;
    *link = r->entries[entry].next;
}

/* ---- life cycle ---- */

ManifestRecorder *manifest_recorder_create(const ManifestRecorderConfig *cfg, BraidError *err) {
    ManifestRecorder *r = calloc(1, sizeof *r);
    if (!r) return braid_error_set(err, "manifest recorder: out of memory"), NULL;
    r->capacity = cfg->capacity > 0 ? cfg->capacity : MANIFEST_RECORDER_DEFAULT_CAPACITY;
    r->n_buckets = 2 * r->capacity + 1;
    r->model_seed = cfg->model_seed;
    pthread_mutex_init(&r->mu, NULL);
    r->entries = calloc((size_t)r->capacity, sizeof *r->entries);
    r->heap = calloc((size_t)r->capacity, sizeof *r->heap);
    r->buckets = malloc((size_t)r->n_buckets * sizeof *r->buckets);
    if (!r->entries || !r->heap || !r->buckets) {
        manifest_recorder_destroy(r);
        return braid_error_set(err, "manifest recorder: out of memory for %d entries", cfg->capacity), NULL;
    }
    for (int i = 0; i < r->n_buckets; i++) r->buckets[i] = -1;
    if (chunker_config_init(&r->chunker, cfg->anchors, cfg->n_anchors, 0, 0, 0, err)) {
        manifest_recorder_destroy(r);
        return braid_error_wrap(err, "manifest recorder"), NULL;
    }
    if (cfg->out_path && (!(r->out_path = strdup(cfg->out_path)) || !(r->out = fopen(cfg->out_path, "w")))) {
        braid_error_set(err, "manifest recorder: cannot write %s", cfg->out_path);
        manifest_recorder_destroy(r);
        return NULL;
    }
    return r;
}

void manifest_recorder_destroy(ManifestRecorder *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) manifest_line_free(&r->entries[i].line);
    if (r->out && fclose(r->out)) LOG_WARN("manifest", "closing %s failed; its last lines may be lost", r->out_path);
    chunker_config_free(&r->chunker);
    pthread_mutex_destroy(&r->mu);
    free(r->entries);
    free(r->heap);
    free(r->buckets);
    free(r->chunks);
    free(r->out_path);
    free(r);
}

/* ---- recording ---- */

/* Appends the entry's line to the output file, one whole line per write, flushed. */
static void append_line(ManifestRecorder *r, const ManifestLine *l) {
    if (!r->out) return;
    char *text = manifest_line_format(l);
    size_t n = text ? strlen(text) : 0;
    if (text) text[n] = '\n'; /* replaces the terminator: the line goes out in one fwrite */
    bool ok = text && fwrite(text, 1, n + 1, r->out) == n + 1 && fflush(r->out) == 0;
    free(text);
    if (ok) {
        r->lines_written++;
        return;
    }
    LOG_WARN("manifest", "writing %s failed; no more chunks are appended to it", r->out_path);
    fclose(r->out);
    r->out = NULL;
}

/* A free slot: the next unused one, or the least-counted entry's (forgotten first). */
static int take_slot(ManifestRecorder *r) {
    if (r->n < r->capacity) {
        int slot = r->n++;
        heap_set(r, slot, slot);
        return slot;
    }
    int slot = r->heap[0];
    unlink_entry(r, slot);
    manifest_line_free(&r->entries[slot].line);
    r->evicted++;
    return slot;
}

static int add_entry(ManifestRecorder *r, const Chunk *c, const Chunk *prev, const char *tenant, const char *adapter,
                     const int32_t *tokens) {
    ManifestLine l = {.content_hash = c->hash, .n_tokens = c->len, .count = 1, .position = c->start,
                      .prev_hash = prev ? prev->hash : 0, .has_prev = prev != NULL};
    l.tokens = malloc((size_t)c->len * sizeof *l.tokens);
    if ((tenant && tenant[0] && !(l.tenant = strdup(tenant))) || (adapter && adapter[0] && !(l.adapter = strdup(adapter))) || !l.tokens) {
        manifest_line_free(&l);
        return -1;
    }
    memcpy(l.tokens, tokens + c->start, (size_t)c->len * sizeof *l.tokens);
    int slot = take_slot(r);
    RecEntry *e = &r->entries[slot];
    e->line = l;
    e->seq = r->next_seq++;
    int b = bucket_of(r, l.content_hash);
    e->next = r->buckets[b];
    r->buckets[b] = slot;
    /* Its (count 1, newest) key belongs below every other count-1 entry. */
    heap_sift_down(r, e->heap_pos);
    heap_sift_up(r, e->heap_pos);
    append_line(r, &e->line);
    return 0;
}

int manifest_recorder_observe(ManifestRecorder *r, const char *tenant, const char *adapter, const int32_t *tokens, int n) {
    uint64_t ns = content_hash_namespace(tenant, adapter) ^ r->model_seed;
    BraidError err;
    pthread_mutex_lock(&r->mu);
    int n_chunks = chunker_split(&r->chunker, ns, tokens, n, &r->chunks, &r->cap_chunks, &err), rc = n_chunks < 0 ? -1 : 0;
    for (int k = 0; rc == 0 && k < n_chunks; k++) {
        const Chunk *c = &r->chunks[k];
        int at = find_entry(r, c->hash, tenant, adapter);
        if (at < 0) {
            rc = add_entry(r, c, k > 0 ? &r->chunks[k - 1] : NULL, tenant, adapter, tokens);
            continue;
        }
        r->entries[at].line.count++;
        heap_sift_down(r, r->entries[at].heap_pos);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---- export ---- */

typedef struct {
    long long count;
    uint64_t seq;
    int entry;
} HotKey;

/* Most counted first; of equal counts, first seen first. */
static int compare_hot_first(const void *a, const void *b) {
    const HotKey *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Appends text and a newline to *buf (len, cap); -1 when out of memory. */
static int append_text(char **buf, size_t *len, size_t *cap, const char *text) {
    size_t n = strlen(text);
    if (*len + n + 2 > *cap) {
        size_t grown_cap = (*len + n + 2) * 2;
        char *grown = realloc(*buf, grown_cap);
        if (!grown) return -1;
        *buf = grown;
        *cap = grown_cap;
    }
    memcpy(*buf + *len, text, n);
    *len += n;
    (*buf)[(*len)++] = '\n';
    (*buf)[*len] = '\0';
    return 0;
}

char *manifest_recorder_export(ManifestRecorder *r, long long min_count, const char *only_tenant) {
    pthread_mutex_lock(&r->mu);
    HotKey *order = malloc(((size_t)r->n + 1) * sizeof *order);
    int n = 0;
    size_t len = 0, cap = 1;
    char *buf = calloc(1, 1);
    for (int i = 0; order && i < r->n; i++) {
        const ManifestLine *l = &r->entries[i].line;
        if (l->count >= min_count && (!only_tenant || same_name(l->tenant, only_tenant)))
            order[n++] = (HotKey){.count = l->count, .seq = r->entries[i].seq, .entry = i};
    }
    if (order) qsort(order, (size_t)n, sizeof *order, compare_hot_first);
    for (int i = 0; buf && order && i < n; i++) {
        char *text = manifest_line_format(&r->entries[order[i].entry].line);
        if (!text || append_text(&buf, &len, &cap, text)) free(buf), buf = NULL;
        free(text);
    }
    pthread_mutex_unlock(&r->mu);
    if (!order) free(buf), buf = NULL;
    free(order);
    return buf;
}

ManifestRecorderStats manifest_recorder_stats(ManifestRecorder *r) {
    pthread_mutex_lock(&r->mu);
    ManifestRecorderStats s = {.entries = r->n, .capacity = r->capacity, .evicted = r->evicted, .lines_written = r->lines_written};
    pthread_mutex_unlock(&r->mu);
    return s;
}
