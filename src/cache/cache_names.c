#include "cache/cache_names.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/strmap.h"

static int table_init(CacheNameTable *t) {
    memset(t, 0, sizeof *t);
    if (!(t->map = strmap_create(64))) return -1;
    if (braid_grow((void **)&t->names, &t->cap, 1, sizeof *t->names)) return -1;
    t->names[0] = NULL;
    return 0;
}

static void table_free(CacheNameTable *t) {
    for (int i = 1; i <= t->n; i++) free(t->names[i]);
    free(t->names);
    strmap_destroy(t->map);
    memset(t, 0, sizeof *t);
}

int cache_names_init(CacheNames *names) {
    memset(names, 0, sizeof *names);
    for (int k = 0; k < CACHE_NAME_KINDS; k++)
        if (table_init(&names->kinds[k])) {
            cache_names_free(names);
            return -1;
        }
    return 0;
}

void cache_names_free(CacheNames *names) {
    for (int k = 0; k < CACHE_NAME_KINDS; k++) table_free(&names->kinds[k]);
}

int64_t cache_names_intern(CacheNames *names, CacheNameKind kind, const char *name) {
    if (!name || !*name) return 0;
    CacheNameTable *t = &names->kinds[kind];
    int32_t id;
    size_t len = strlen(name);
    if (strmap_get(t->map, name, len, &id)) return id;
    char *copy = strdup(name);
    if (!copy || braid_grow((void **)&t->names, &t->cap, t->n + 2, sizeof *t->names) || strmap_put(t->map, name, len, t->n + 1)) {
        free(copy);
        return -1;
    }
    t->names[++t->n] = copy;
    return t->n;
}

uint32_t cache_names_find(const CacheNames *names, CacheNameKind kind, const char *name) {
    int32_t id;
    if (!name || !*name) return 0;
    return strmap_get(names->kinds[kind].map, name, strlen(name), &id) ? (uint32_t)id : 0;
}

const char *cache_names_get(const CacheNames *names, CacheNameKind kind, uint32_t id) {
    const CacheNameTable *t = &names->kinds[kind];
    return id >= 1 && (int)id <= t->n ? t->names[id] : "";
}
