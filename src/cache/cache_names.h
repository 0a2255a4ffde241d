/*
 * cache_names.h — interning of the names a request carries (tenant, adapter, workflow, agent)
 * into small ids, one table per kind.
 *
 * Ids start at 1; 0 stands for "no name" (NULL or ""). Lookups compare the whole string, so two
 * live names never share an id (unlike a hash of them). Names are copied.
 *
 * Reclaiming. A name can be released: its id returns to a free list and the next new name of that
 * kind gets it, so ids (and every table a caller indexes by id) stay bounded by the most names live
 * at once, not by all names ever seen. Only the caller knows when nothing refers to an id any more
 * (kv_cache.c: a workflow that ended and that no node or request names); releasing earlier makes
 * the old holders silently refer to the next name. To bound names nobody ends, a table keeps an
 * "idle" list in the order names were marked idle: the caller marks a name idle when nothing
 * refers to it and busy when something does again, and releases the oldest idle ones past its
 * bound.
 *
 * Not thread-safe.
 */
#ifndef BRAID_CACHE_CACHE_NAMES_H
#define BRAID_CACHE_CACHE_NAMES_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { CACHE_NAME_TENANT = 0, CACHE_NAME_ADAPTER, CACHE_NAME_WORKFLOW, CACHE_NAME_AGENT, CACHE_NAME_KINDS } CacheNameKind;

struct StrMap;

typedef struct {
    char *name;          /* NULL for 0 and for free ids */
    int32_t prev, next;  /* idle list links (entry 0 is its sentinel); free ids chain through next */
    bool idle;
} CacheNameEntry;

typedef struct {
    struct StrMap *map;
    CacheNameEntry *entries; /* (cap) entries[0] is the idle list's sentinel */
    int n_ids;               /* ids handed out so far, live or free: entries[1..n_ids] */
    int cap;
    int n_live, n_idle;
    int32_t free_head;       /* 0 = no free id */
} CacheNameTable;

typedef struct {
    CacheNameTable kinds[CACHE_NAME_KINDS];
} CacheNames;

int cache_names_init(CacheNames *names);
void cache_names_free(CacheNames *names);
/* The id of name (interning it when new, on a freed id first): 0 for NULL or "", -1 when out of
 * memory. A new name starts busy. */
int64_t cache_names_intern(CacheNames *names, CacheNameKind kind, const char *name);
/* The id of a known name, 0 when none or unknown. */
uint32_t cache_names_find(const CacheNames *names, CacheNameKind kind, const char *name);
/* "" for 0 or an unknown id. */
const char *cache_names_get(const CacheNames *names, CacheNameKind kind, uint32_t id);
/* Forgets a live id's name; the id is handed out again. No-op for 0 or a free id. */
void cache_names_release(CacheNames *names, CacheNameKind kind, uint32_t id);
/* Idle: moves the id to the young end of the idle list (marking an idle one again refreshes it).
 * Busy: takes it off the list. */
void cache_names_mark_idle(CacheNames *names, CacheNameKind kind, uint32_t id);
void cache_names_mark_busy(CacheNames *names, CacheNameKind kind, uint32_t id);
/* The id marked idle longest ago, 0 when none is idle. */
uint32_t cache_names_oldest_idle(const CacheNames *names, CacheNameKind kind);
int cache_names_live(const CacheNames *names, CacheNameKind kind);
int cache_names_idle(const CacheNames *names, CacheNameKind kind);
/* The largest id ever handed out (tables indexed by id need this many + 1 entries). */
int cache_names_max_id(const CacheNames *names, CacheNameKind kind);

#endif
