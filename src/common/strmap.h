/*
 * strmap.h — open-addressing hash map from byte strings to int32 values (vocabularies, merge ranks).
 *
 * Contract: keys are copied into the map's own arena, so callers may free theirs. Insert of an
 * existing key overwrites its value. Removal frees the slot at once and the key's arena bytes when
 * dead bytes outweigh live ones (the arena is compacted), so a map whose keys come and go stays
 * bounded by its live keys. Not thread-safe for writers; concurrent readers are fine once
 * building is finished.
 */
#ifndef BRAID_COMMON_STRMAP_H
#define BRAID_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct StrMap StrMap;

StrMap *strmap_create(size_t expected_entries);
void strmap_destroy(StrMap *map);
/* Returns 0, or -1 when out of memory. */
int strmap_put(StrMap *map, const char *key, size_t key_len, int32_t value);
/* Returns 1 and sets *value when found, else 0. */
int strmap_get(const StrMap *map, const char *key, size_t key_len, int32_t *value);
/* Returns 1 when the key was there (now gone), else 0. Never fails. */
int strmap_remove(StrMap *map, const char *key, size_t key_len);
size_t strmap_count(const StrMap *map);
/* Bytes the arena has allocated (tests check it stays bounded under churn). */
size_t strmap_arena_bytes(const StrMap *map);

#endif
