#include "common/strmap.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash; /* 0 marks an empty slot */
    uint32_t key_offset;
    uint32_t key_len;
    int32_t value;
} StrMapSlot;

struct StrMap {
    StrMapSlot *slots;
    size_t capacity; /* power of two */
    size_t count;
    char *arena;
    size_t arena_used, arena_cap;
    size_t arena_dead; /* bytes of removed keys still in the arena */
};

static uint64_t strmap_hash(const char *key, size_t len) {
    /* FNV-1a, then a finalizer so low bits are well mixed for masking. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)key[i]) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

StrMap *strmap_create(size_t expected_entries) {
    StrMap *map = calloc(1, sizeof *map);
    if (!map) return NULL;
    map->capacity = 16;
    while (map->capacity < expected_entries * 2) map->capacity <<= 1;
    map->slots = calloc(map->capacity, sizeof *map->slots);
    map->arena_cap = expected_entries * 8 + 64;
    map->arena = malloc(map->arena_cap);
    if (!map->slots || !map->arena) {
        strmap_destroy(map);
        return NULL;
    }
    return map;
}

void strmap_destroy(StrMap *map) {
    if (!map) return;
    free(map->slots);
    free(map->arena);
    free(map);
}

static StrMapSlot *strmap_find_slot(const StrMap *map, const char *key, size_t len, uint64_t h) {
    size_t mask = map->capacity - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        StrMapSlot *s = &map->slots[i];
        if (s->hash == 0) return s;
        if (s->hash == h && s->key_len == len && memcmp(map->arena + s->key_offset, key, len) == 0) return s;
    }
}

static int strmap_grow(StrMap *map) {
    StrMap bigger = *map;
    bigger.capacity = map->capacity * 2;
    bigger.slots = calloc(bigger.capacity, sizeof *bigger.slots);
    if (!bigger.slots) return -1;
    for (size_t i = 0; i < map->capacity; i++) {
        const StrMapSlot *s = &map->slots[i];
        if (!s->hash) continue;
        size_t mask = bigger.capacity - 1, j = s->hash & mask;
        while (bigger.slots[j].hash) j = (j + 1) & mask;
        bigger.slots[j] = *s;
    }
    free(map->slots);
    map->slots = bigger.slots;
    map->capacity = bigger.capacity;
    return 0;
}

int strmap_put(StrMap *map, const char *key, size_t key_len, int32_t value) {
    if ((map->count + 1) * 2 > map->capacity && strmap_grow(map) != 0) return -1;
    uint64_t h = strmap_hash(key, key_len);
    StrMapSlot *s = strmap_find_slot(map, key, key_len, h);
    if (s->hash) {
        s->value = value;
        return 0;
    }
    if (map->arena_used + key_len > map->arena_cap) {
        size_t cap = map->arena_cap * 2 + key_len;
        char *arena = realloc(map->arena, cap);
        if (!arena) return -1;
        map->arena = arena;
        map->arena_cap = cap;
    }
    if (map->arena_used + key_len > UINT32_MAX) return -1;
    memcpy(map->arena + map->arena_used, key, key_len);
    s->hash = h;
    s->key_offset = (uint32_t)map->arena_used;
    s->key_len = (uint32_t)key_len;
    s->value = value;
    map->arena_used += key_len;
    map->count++;
    return 0;
}

int strmap_get(const StrMap *map, const char *key, size_t key_len, int32_t *value) {
    const StrMapSlot *s = strmap_find_slot(map, key, key_len, strmap_hash(key, key_len));
    if (!s->hash) return 0;
    *value = s->value;
    return 1;
}

/* Backward-shift deletion: later slots of the probe run move up, so lookups need no tombstones. */
static void strmap_clear_slot(StrMap *map, size_t hole) {
    size_t mask = map->capacity - 1;
    map->slots[hole].hash = 0;
    for (size_t j = (hole + 1) & mask; map->slots[j].hash; j = (j + 1) & mask) {
        size_t home = map->slots[j].hash & mask;
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        map->slots[hole] = map->slots[j];
        map->slots[j].hash = 0;
        hole = j;
    }
}

/* Copies the live keys into a fresh arena of their size; on allocation failure the old one stays
 * (correct, only larger). */
static void strmap_compact(StrMap *map) {
    size_t live = map->arena_used - map->arena_dead, used = 0;
    char *arena = malloc(live * 2 + 64);
    if (!arena) return;
    for (size_t i = 0; i < map->capacity; i++) {
        StrMapSlot *s = &map->slots[i];
        if (!s->hash) continue;
        memcpy(arena + used, map->arena + s->key_offset, s->key_len);
        s->key_offset = (uint32_t)used;
        used += s->key_len;
    }
    free(map->arena);
    map->arena = arena;
    map->arena_cap = live * 2 + 64;
    map->arena_used = used;
    map->arena_dead = 0;
}

int strmap_remove(StrMap *map, const char *key, size_t key_len) {
    StrMapSlot *s = strmap_find_slot(map, key, key_len, strmap_hash(key, key_len));
    if (!s->hash) return 0;
    map->arena_dead += s->key_len;
    map->count--;
    strmap_clear_slot(map, (size_t)(s - map->slots));
    if (map->arena_dead > 4096 && map->arena_dead * 2 > map->arena_used) strmap_compact(map);
    return 1;
}

size_t strmap_count(const StrMap *map) { return map->count; }

size_t strmap_arena_bytes(const StrMap *map) { return map->arena_cap; }
