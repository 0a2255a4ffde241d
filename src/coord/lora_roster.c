/* The run-time adapters every instance must hold; the contract is in lora_roster.h. */
#include "coord/lora_roster.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

static int find(const LoraRoster *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->entries[i].name, name) == 0) return i;
    return -1;
}

int lora_roster_put(LoraRoster *r, const char *name, const char *path, int generation) {
    char *n = strdup(name), *p = strdup(path);
    if (!n || !p || braid_grow((void **)&r->entries, &r->cap, r->n + 1, sizeof *r->entries)) {
        free(n);
        free(p);
        return -1;
    }
    lora_roster_take(r, name);
    r->entries[r->n++] = (LoraRosterEntry){.name = n, .path = p, .generation = generation};
    return 0;
}

void lora_roster_take(LoraRoster *r, const char *name) {
    int i = find(r, name);
    if (i < 0) return;
    free(r->entries[i].name);
    free(r->entries[i].path);
    memmove(&r->entries[i], &r->entries[i + 1], (size_t)(r->n - i - 1) * sizeof *r->entries); /* load order kept */
    r->n--;
}

void lora_roster_free(LoraRoster *r) {
    for (int i = 0; i < r->n; i++) free(r->entries[i].name), free(r->entries[i].path);
    free(r->entries);
    memset(r, 0, sizeof *r);
}
