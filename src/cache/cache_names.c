#include "cache/cache_names.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/strmap.h"

static int table_init(CacheNameTable *t) {
    memset(t, 0, sizeof *t);
    if (!(t->map = strmap_create(64))) return -1;
    if (braid_grow((void **)&t->entries, &t->cap, 1, sizeof *t->entries)) return -1;
    t->entries[0] = (CacheNameEntry){0}; /* the idle list's sentinel: an empty circle */
    return 0;
}

static void table_free(CacheNameTable *t) {
    for (int i = 1; i <= t->n_ids; i++) free(t->entries[i].name);
    free(t->entries);
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

static bool id_live(const CacheNameTable *t, uint32_t id) { return id >= 1 && (int)id <= t->n_ids && t->entries[id].name; }

/* A free id when there is one, else a new one (room made in entries); -1 when out of memory. */
static int32_t take_id(CacheNameTable *t) {
    if (t->free_head) return t->free_head;
    if (braid_grow((void **)&t->entries, &t->cap, t->n_ids + 2, sizeof *t->entries)) return -1;
    t->entries[t->n_ids + 1] = (CacheNameEntry){0};
    return t->n_ids + 1;
}

int64_t cache_names_intern(CacheNames *names, CacheNameKind kind, const char *name) {
    if (!name || !*name) return 0;
    CacheNameTable *t = &names->kinds[kind];
    int32_t id;
    size_t len = strlen(name);
    if (strmap_get(t->map, name, len, &id)) return id;
    char *copy = strdup(name);
    if (!copy || (id = take_id(t)) < 0 || strmap_put(t->map, name, len, id)) {
        free(copy);
        return -1;
    }
    if (id == t->free_head) t->free_head = t->entries[id].next;
    else t->n_ids++;
    t->entries[id] = (CacheNameEntry){.name = copy};
    t->n_live++;
    return id;
}

uint32_t cache_names_find(const CacheNames *names, CacheNameKind kind, const char *name) {
    int32_t id;
    if (!name || !*name) return 0;
    return strmap_get(names->kinds[kind].map, name, strlen(name), &id) ? (uint32_t)id : 0;
}

const char *cache_names_get(const CacheNames *names, CacheNameKind kind, uint32_t id) {
    const CacheNameTable *t = &names->kinds[kind];
    return id_live(t, id) ? t->entries[id].name : "";
}

static void idle_unlink(CacheNameTable *t, uint32_t id) {
    CacheNameEntry *e = &t->entries[id];
    if (!e->idle) return;
    t->entries[e->prev].next = e->next;
    t->entries[e->next].prev = e->prev;
    e->idle = false;
    t->n_idle--;
}

void cache_names_release(CacheNames *names, CacheNameKind kind, uint32_t id) {
    CacheNameTable *t = &names->kinds[kind];
    if (!id_live(t, id)) return;
    CacheNameEntry *e = &t->entries[id];
    idle_unlink(t, id);
    strmap_remove(t->map, e->name, strlen(e->name));
    free(e->name);
    *e = (CacheNameEntry){.next = t->free_head};
    t->free_head = (int32_t)id;
    t->n_live--;
}

void cache_names_mark_idle(CacheNames *names, CacheNameKind kind, uint32_t id) {
    CacheNameTable *t = &names->kinds[kind];
    if (!id_live(t, id)) return;
    idle_unlink(t, id);
    CacheNameEntry *e = &t->entries[id], *sentinel = &t->entries[0];
    e->prev = sentinel->prev;
    e->next = 0;
    t->entries[sentinel->prev].next = (int32_t)id;
    sentinel->prev = (int32_t)id;
    e->idle = true;
    t->n_idle++;
}

void cache_names_mark_busy(CacheNames *names, CacheNameKind kind, uint32_t id) {
    CacheNameTable *t = &names->kinds[kind];
    if (id_live(t, id)) idle_unlink(t, id);
}

uint32_t cache_names_oldest_idle(const CacheNames *names, CacheNameKind kind) { return (uint32_t)names->kinds[kind].entries[0].next; }

int cache_names_live(const CacheNames *names, CacheNameKind kind) { return names->kinds[kind].n_live; }
int cache_names_idle(const CacheNames *names, CacheNameKind kind) { return names->kinds[kind].n_idle; }
int cache_names_max_id(const CacheNames *names, CacheNameKind kind) { return names->kinds[kind].n_ids; }
