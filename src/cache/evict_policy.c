#include "cache/evict_policy.h"

#include <string.h>

#include "cache/radix_tree.h"

static double lru_score(void *state, const RadixNode *node) {
    (void)state;
    return (double)node->meta.last_access;
}

const EvictPolicy evict_policy_lru = {
    .name = "lru",
    .description = "least recently used node first (SGLang's RadixCache baseline)",
    .score = lru_score,
};

static const EvictPolicy *const REGISTRY[] = {&evict_policy_lru, &evict_policy_pbkv, &evict_policy_kvflow, &evict_policy_pbkv_lae};

int evict_policy_list(const EvictPolicy *const **policies) {
    *policies = REGISTRY;
    return (int)(sizeof REGISTRY / sizeof REGISTRY[0]);
}

const EvictPolicy *evict_policy_find(const char *name) {
    for (size_t i = 0; i < sizeof REGISTRY / sizeof REGISTRY[0]; i++)
        if (strcmp(REGISTRY[i]->name, name) == 0) return REGISTRY[i];
    return NULL;
}
