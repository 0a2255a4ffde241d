#include "cache/evict_policy.h"

#include <string.h>

#include "cache/radix_tree.h"

static double lru_score(void *state, const RadixNode *node) {
    (void)state;
    return (double)node->meta.last_access;
}

const EvictPolicy evict_policy_lru = {
    .name = "lru",
    .score = lru_score,
};

const EvictPolicy *evict_policy_find(const char *name) {
    static const EvictPolicy *const all[] = {&evict_policy_lru};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}
