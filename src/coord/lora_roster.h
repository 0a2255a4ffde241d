/*
 * lora_roster.h — the adapters loaded at run time that every instance must hold (coord/http/http_lora.h):
 * name, file and generation of each, in load order, so an instance that comes back after a restart
 * (--restart-instances; it starts with its --lora adapters only) is sent every one of them again
 * before it takes requests (coordinator.c: on READY of a revived instance, LORA_LOAD for each entry;
 * the instance rejoins routing when all have answered).
 *
 * The coordinator records a load when it sends it (put), takes back a load no instance accepted,
 * and takes an adapter out when an unload was carried out by some instance. Owns copies of the strings. Not thread-safe: the coordinator holds its
 * mutex around every call.
 */
#ifndef BRAID_COORD_LORA_ROSTER_H
#define BRAID_COORD_LORA_ROSTER_H

typedef struct {
    char *name, *path;
    int generation;
} LoraRosterEntry;

typedef struct {
    LoraRosterEntry *entries;
    int n, cap;
} LoraRoster;

/* Records adapter `name` (replacing an entry of that name). -1 when out of memory (nothing changed). */
int lora_roster_put(LoraRoster *r, const char *name, const char *path, int generation);
/* Forgets adapter `name` (no entry: nothing happens). */
void lora_roster_take(LoraRoster *r, const char *name);
void lora_roster_free(LoraRoster *r);

#endif
