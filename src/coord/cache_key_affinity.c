/* prompt_cache_key routing; the contract is in cache_key_affinity.h. */
#include "coord/cache_key_affinity.h"

#include <stdlib.h>
#include <string.h>

#include "coord/block_index.h"

void cache_key_affinity_free(CacheKeyAffinity *a) {
    if (a->instance_of) strmap_destroy(a->instance_of);
    memset(a, 0, sizeof *a);
}

char *cache_key_affinity_scoped(const char *tenant, const char *key) {
    if (!key) return NULL;
    if (!tenant) tenant = "";
    size_t nt = strlen(tenant), nk = strlen(key);
    char *s = malloc(nt + nk + 2);
    if (!s) return NULL;
    memcpy(s, tenant, nt);
    s[nt] = '\x1f'; /* a control character: check_label keeps it out of tenant names, so no two pairs collide */
    memcpy(s + nt + 1, key, nk + 1);
    return s;
}

static int key_instance(const CacheKeyAffinity *a, const char *key) {
    int32_t v = 0;
    if (!a->instance_of || !strmap_get(a->instance_of, key, strlen(key), &v)) return -1;
    return v - 1;
}

static int least_live_load(const Router *r) {
    int min_load = -1;
    for (int i = 0; i < r->n_instances; i++)
        if (!r->down[i] && (min_load < 0 || r->load[i] < min_load)) min_load = r->load[i];
    return min_load;
}

void cache_key_affinity_route(CacheKeyAffinity *a, const Router *r, const char *key, const uint64_t *hashes, int n_hashes,
                              RouteDecision *d) {
    if (!key || d->instance < 0 || r->mode == ROUTER_ROUND_ROBIN) return;
    a->routed++;
    int k = key_instance(a, key);
    if (k < 0 || k >= r->n_instances || k == d->instance || r->down[k]) return;
    if (r->load[k] > least_live_load(r) + r->load_slack) return; /* badly unbalanced: load wins, as in the router */
    int k_match = block_index_prefix(&r->index[k], hashes, n_hashes);
    if (d->matched_blocks - k_match > CACHE_KEY_SHORT_OVERLAP_BLOCKS) return; /* a long real hit elsewhere beats the hint */
    int chosen = d->instance, chosen_match = d->matched_blocks;
    d->instance = k;
    d->matched_blocks = k_match;
    d->reason = "cache_key";
    /* The cost router's estimate priced the instance it chose, not this one: drop it, and let
     * move_plan judge a move from the chosen instance on its own rule. */
    d->priced = false;
    d->move = false;
    if (chosen_match > k_match && chosen_match > d->source_blocks) d->source = chosen, d->source_blocks = chosen_match;
    else if (d->source == k) d->source = -1, d->source_blocks = 0;
    a->overridden++;
}

void cache_key_affinity_assigned(CacheKeyAffinity *a, const char *key, int instance) {
    if (!key || instance < 0) return;
    if (!a->instance_of || strmap_count(a->instance_of) >= CACHE_KEY_MAX_KEYS) {
        StrMap *fresh = strmap_create(256);
        if (!fresh) return;
        if (a->instance_of) strmap_destroy(a->instance_of);
        a->instance_of = fresh;
    }
    strmap_put(a->instance_of, key, strlen(key), instance + 1); /* out of memory: the key just routes as if new */
}
