/* Ownership helpers for CacheDirectives; the contract is in cache_directive.h. */
#include "cache/cache_directive.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

void cache_directives_free(CacheDirectives *d) {
    if (!d) return;
    free(d->context);
    free(d->runs);
    for (int i = 0; i < d->n_hints; i++) {
        for (int j = 0; j < d->hints[i].n_with; j++) free(d->hints[i].with[j]);
        free(d->hints[i].with);
    }
    free(d->hints);
    memset(d, 0, sizeof *d);
}

static void *copy_array(const void *src, size_t n, size_t size) {
    if (n == 0) return NULL;
    void *p = malloc(n * size);
    if (p) memcpy(p, src, n * size);
    return p;
}

int cache_directives_copy(CacheDirectives *dst, const CacheDirectives *src) {
    *dst = *src;
    dst->context = copy_array(src->context, (size_t)src->n_context, sizeof *src->context);
    dst->runs = copy_array(src->runs, (size_t)src->n_runs, sizeof *src->runs);
    dst->hints = copy_array(src->hints, (size_t)src->n_hints, sizeof *src->hints);
    bool ok = (!src->n_context || dst->context) && (!src->n_runs || dst->runs) && (!src->n_hints || dst->hints);
    for (int i = 0; ok && i < src->n_hints; i++) {
        CacheHint *h = &dst->hints[i];
        h->with = NULL;
        int n = h->n_with;
        h->n_with = 0;
        if (n == 0) continue;
        if (!(h->with = calloc((size_t)n, sizeof *h->with))) ok = false;
        for (int j = 0; ok && j < n; j++, h->n_with++)
            if (!(h->with[j] = strdup(src->hints[i].with[j]))) ok = false;
    }
    if (!ok) {
        /* hints past the failure have their source's pointers: clear them before freeing */
        for (int i = 0; dst->hints && i < src->n_hints; i++)
            if (dst->hints[i].with == src->hints[i].with) dst->hints[i].n_with = 0, dst->hints[i].with = NULL;
        cache_directives_free(dst);
        return -1;
    }
    return 0;
}

const char *cache_hint_op_name(int op) {
    switch (op) {
    case CACHE_HINT_PIN: return "pin";
    case CACHE_HINT_DECAY: return "decay";
    case CACHE_HINT_EVICT: return "evict";
    case CACHE_HINT_SHARE: return "share";
    case CACHE_HINT_UNPIN: return "unpin";
    default: return "?";
    }
}

static uint64_t scope_of(uint64_t kind, const char *name) {
    if (!name || !name[0]) return 0;
    uint64_t h = XXH3_64bits_withSeed(name, strlen(name), kind);
    return h ? h : 1;
}

uint64_t cache_conversation_scope(const char *conversation_id) { return scope_of(0x636f6e76u, conversation_id); }
uint64_t cache_workflow_scope(const char *workflow) { return scope_of(0x776f726bu, workflow); }
