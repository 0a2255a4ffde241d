#include "coord/router.h"

#include <stdlib.h>
#include <string.h>

int router_init(Router *r, int n, int load_slack) {
    memset(r, 0, sizeof *r);
    r->n_instances = n;
    r->load_slack = load_slack;
    r->index = calloc((size_t)n, sizeof *r->index);
    r->load = calloc((size_t)n, sizeof *r->load);
    r->down = calloc((size_t)n, sizeof *r->down);
    r->affinity = strmap_create(256);
    if (!r->index || !r->load || !r->down || !r->affinity) {
        router_free(r);
        return -1;
    }
    for (int i = 0; i < n; i++) block_index_init(&r->index[i], BLOCK_INDEX_DEFAULT_MAX_BLOCKS);
    return 0;
}

void router_free(Router *r) {
    for (int i = 0; r->index && i < r->n_instances; i++) block_index_free(&r->index[i]);
    free(r->index);
    free(r->load);
    free(r->down);
    if (r->affinity) strmap_destroy(r->affinity);
    memset(r, 0, sizeof *r);
}

static int affinity_of(const Router *r, const char *workflow) {
    int32_t v = 0;
    if (!workflow || !*workflow || !strmap_get(r->affinity, workflow, strlen(workflow), &v)) return -1;
    return v - 1;
}

/* Is candidate a better choice than best? Cache first, then affinity, then load, then index. */
static int better(const Router *r, int cand, int cand_match, int best, int best_match, int affine) {
    if (best < 0) return 1;
    if (cand_match != best_match) return cand_match > best_match;
    if ((cand == affine) != (best == affine)) return cand == affine;
    return r->load[cand] < r->load[best];
}

/* The live instance other than chosen with the longest cached prefix, when longer than chosen's. */
static void find_source(const Router *r, const uint64_t *hashes, int n_hashes, RouteDecision *d) {
    d->source = -1;
    d->source_blocks = 0;
    for (int i = 0; i < r->n_instances; i++) {
        if (r->down[i] || i == d->instance) continue;
        int match = block_index_prefix(&r->index[i], hashes, n_hashes);
        if (match > d->matched_blocks && match > d->source_blocks) d->source = i, d->source_blocks = match;
    }
}

static RouteDecision pick_round_robin(Router *r, const uint64_t *hashes, int n_hashes) {
    for (int k = 0; k < r->n_instances; k++) {
        int i = (r->next_turn + k) % r->n_instances;
        if (r->down[i]) continue;
        r->next_turn = (i + 1) % r->n_instances;
        return (RouteDecision){.instance = i, .matched_blocks = block_index_prefix(&r->index[i], hashes, n_hashes), .reason = "round-robin"};
    }
    return (RouteDecision){.instance = -1, .reason = "none alive"};
}

static RouteDecision pick_cache_aware(Router *r, const uint64_t *hashes, int n_hashes, const char *workflow) {
    int min_load = -1;
    for (int i = 0; i < r->n_instances; i++)
        if (!r->down[i] && (min_load < 0 || r->load[i] < min_load)) min_load = r->load[i];
    int affine = affinity_of(r, workflow), best = -1, best_match = 0, any_match = 0;
    for (int i = 0; i < r->n_instances; i++) {
        if (r->down[i] || r->load[i] > min_load + r->load_slack) continue; /* dead, or badly unbalanced: skip it */
        int match = block_index_prefix(&r->index[i], hashes, n_hashes);
        any_match |= match > 0;
        if (better(r, i, match, best, best_match, affine)) best = i, best_match = match;
    }
    if (best < 0) return (RouteDecision){.instance = -1, .reason = "none alive"};
    const char *reason = best_match > 0 ? "cache" : best == affine && any_match == 0 && affine >= 0 ? "affinity" : "load";
    return (RouteDecision){.instance = best, .matched_blocks = best_match, .reason = reason};
}

/* Least loaded first: whatever prefix it lacks, a move can bring. */
static RouteDecision pick_balanced(Router *r, const uint64_t *hashes, int n_hashes, const char *workflow) {
    int affine = affinity_of(r, workflow), best = -1, best_match = 0;
    for (int i = 0; i < r->n_instances; i++) {
        if (r->down[i]) continue;
        int match = block_index_prefix(&r->index[i], hashes, n_hashes);
        bool take = best < 0 || r->load[i] < r->load[best] ||
                    (r->load[i] == r->load[best] && (match > best_match || (match == best_match && i == affine && best != affine)));
        if (take) best = i, best_match = match;
    }
    if (best < 0) return (RouteDecision){.instance = -1, .reason = "none alive"};
    return (RouteDecision){.instance = best, .matched_blocks = best_match, .reason = best_match > 0 ? "cache" : "load"};
}

RouteDecision router_pick(Router *r, const uint64_t *hashes, int n_hashes, const char *workflow) {
    RouteDecision d = r->mode == ROUTER_ROUND_ROBIN ? pick_round_robin(r, hashes, n_hashes)
                      : r->mode == ROUTER_BALANCED  ? pick_balanced(r, hashes, n_hashes, workflow)
                                                    : pick_cache_aware(r, hashes, n_hashes, workflow);
    if (d.instance >= 0) find_source(r, hashes, n_hashes, &d);
    else d.source = -1;
    return d;
}

void router_assigned(Router *r, int instance, const char *workflow) {
    r->load[instance]++;
    if (!workflow || !*workflow) return;
    /* Affinity is only a tiebreak: rather than let the table grow without bound with workflow ids,
     * start it afresh when it gets large (ended workflows leave their ids behind). */
    if (strmap_count(r->affinity) >= ROUTER_MAX_AFFINITY) {
        StrMap *fresh = strmap_create(256);
        if (fresh) strmap_destroy(r->affinity), r->affinity = fresh;
    }
    strmap_put(r->affinity, workflow, strlen(workflow), instance + 1);
}

void router_workflow_ended(Router *r, const char *workflow) {
    int32_t v;
    if (workflow && strmap_get(r->affinity, workflow, strlen(workflow), &v)) strmap_put(r->affinity, workflow, strlen(workflow), 0);
}

void router_finished(Router *r, int instance) {
    if (r->load[instance] > 0) r->load[instance]--;
}

void router_stored(Router *r, int instance, const uint64_t *hashes, int n) {
    if (r->down[instance]) return; /* a late report from a dead instance */
    for (int i = 0; i < n; i++) block_index_add(&r->index[instance], hashes[i]);
}

void router_evicted(Router *r, int instance, const uint64_t *hashes, int n) {
    for (int i = 0; i < n; i++) block_index_remove(&r->index[instance], hashes[i]);
}

void router_cleared(Router *r, int instance) { block_index_clear(&r->index[instance]); }

void router_registry_size(const Router *r, unsigned long long *blocks, unsigned long long *bytes, unsigned long long *evicted) {
    *blocks = *bytes = *evicted = 0;
    for (int i = 0; i < r->n_instances; i++) {
        *blocks += r->index[i].count;
        *bytes += block_index_bytes(&r->index[i]);
        *evicted += r->index[i].evicted;
    }
}

void router_instance_down(Router *r, int instance) {
    r->down[instance] = true;
    r->load[instance] = 0;
    router_cleared(r, instance);
}

void router_instance_up(Router *r, int instance) {
    r->load[instance] = 0;
    r->down[instance] = false;
}
