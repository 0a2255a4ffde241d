/*
 * cache_names.h — interning of the names a request carries (tenant, adapter, workflow, agent)
 * into small ids, one table per kind.
 *
 * Ids are assigned in order of first appearance from 1; 0 stands for "no name" (NULL or "").
 * Lookups compare the whole string, so two names never share an id (unlike a hash of them).
 * Names are copied. Not thread-safe.
 */
#ifndef BRAID_CACHE_CACHE_NAMES_H
#define BRAID_CACHE_CACHE_NAMES_H

#include <stdint.h>

typedef enum { CACHE_NAME_TENANT = 0, CACHE_NAME_ADAPTER, CACHE_NAME_WORKFLOW, CACHE_NAME_AGENT, CACHE_NAME_KINDS } CacheNameKind;

struct StrMap;

typedef struct {
    struct StrMap *map;
    char **names; /* (n + 1) names[0] = "" */
    int n, cap;
} CacheNameTable;

typedef struct {
    CacheNameTable kinds[CACHE_NAME_KINDS];
} CacheNames;

int cache_names_init(CacheNames *names);
void cache_names_free(CacheNames *names);
/* The id of name (interning it when new): 0 for NULL or "", -1 when out of memory. */
int64_t cache_names_intern(CacheNames *names, CacheNameKind kind, const char *name);
/* The id of a known name, 0 when none or unknown. */
uint32_t cache_names_find(const CacheNames *names, CacheNameKind kind, const char *name);
/* "" for 0 or an unknown id. */
const char *cache_names_get(const CacheNames *names, CacheNameKind kind, uint32_t id);

#endif
