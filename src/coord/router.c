#include "coord/router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "coord/move_plan.h"

int router_mode_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "cost")) return ROUTER_COST;
    if (!strcmp(name, "cache")) return ROUTER_CACHE_AWARE;
    if (!strcmp(name, "balanced")) return ROUTER_BALANCED;
    if (!strcmp(name, "round-robin")) return ROUTER_ROUND_ROBIN;
    return -1;
}

const char *router_mode_name(RouterMode mode) {
    return mode == ROUTER_COST ? "cost" : mode == ROUTER_BALANCED ? "balanced" : mode == ROUTER_ROUND_ROBIN ? "round-robin" : "cache";
}

int router_init(Router *r, int n, int load_slack) {
    memset(r, 0, sizeof *r);
    r->n_instances = n;
    r->load_slack = load_slack;
    r->index = calloc((size_t)n, sizeof *r->index);
    r->inflight = calloc((size_t)n, sizeof *r->inflight);
    r->load = calloc((size_t)n, sizeof *r->load);
    r->down = calloc((size_t)n, sizeof *r->down);
    r->affinity = strmap_create(256);
    r->pending_prefill = calloc((size_t)n, sizeof *r->pending_prefill);
    r->prefilling = calloc((size_t)n, sizeof *r->prefilling);
    r->can_move = calloc((size_t)n, sizeof *r->can_move);
    r->bytes_per_token = calloc((size_t)n, sizeof *r->bytes_per_token);
    r->match = calloc((size_t)n, sizeof *r->match);
    r->held = calloc((size_t)n, sizeof *r->held);
    r->estimate = calloc((size_t)n, sizeof *r->estimate);
    r->capacity_blocks = calloc((size_t)n, sizeof *r->capacity_blocks);
    r->links = calloc((size_t)n * (size_t)n, sizeof *r->links);
    /* Until the instances report and the coordinator learns, the move cost model's defaults. */
    r->cost = route_cost_model_init(true, MOVE_DEFAULT_PREFILL_TPS, MOVE_DEFAULT_LINK_GBPS * 1e9, MOVE_DEFAULT_LATENCY_S);
    if (!r->index || !r->inflight || !r->load || !r->down || !r->affinity || !r->pending_prefill || !r->prefilling || !r->can_move || !r->bytes_per_token || !r->match || !r->held || !r->estimate || !r->capacity_blocks || !r->links) {
        router_free(r);
        return -1;
    }
    for (int i = 0; i < n; i++) block_index_init(&r->index[i], BLOCK_INDEX_DEFAULT_MAX_BLOCKS);
    for (int i = 0; i < n; i++) block_index_init(&r->inflight[i], ROUTER_INFLIGHT_MAX_BLOCKS);
    return 0;
}

void router_free(Router *r) {
    for (int i = 0; r->index && i < r->n_instances; i++) block_index_free(&r->index[i]);
    for (int i = 0; r->inflight && i < r->n_instances; i++) block_index_free(&r->inflight[i]);
    free(r->index);
    free(r->inflight);
    free(r->load);
    free(r->down);
    free(r->pending_prefill);
    free(r->prefilling);
    free(r->can_move);
    free(r->bytes_per_token);
    free(r->match);
    free(r->held);
    free(r->picked);
    free(r->estimate);
    free(r->capacity_blocks);
    free(r->links);
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

static int block_size_of(const Router *r) { return r->block_size > 0 ? r->block_size : 16; }

/* Work ahead on instance i, in prefill tokens: charged prefills not yet past their first token,
 * and a fixed weight per running request. */
static double ahead_tokens(const Router *r, int i) {
    if (r->queue_s) return r->queue_s[i] > 0 ? r->queue_s[i] / r->cost.s_per_token : 0;
    return r->pending_prefill[i] + r->load[i] * r->cost.running_tokens;
}

/* Room left in instance i's cache by the router's index, in blocks; -1 when its size is unknown. */
static long free_blocks(const Router *r, int i) {
    if (r->capacity_blocks[i] <= 0) return -1;
    long held = (long)r->index[i].count;
    return held < r->capacity_blocks[i] ? r->capacity_blocks[i] - held : 0;
}

/* Is estimate a (instance i) better than b (instance best)? The lower score (route_cost_score);
 * near-ties (within a microsecond or a millionth) to the workflow's last instance, then to more of
 * the prefix held here, then to the less loaded, then to the emptier cache (prefixes spread over
 * the cluster's caches instead of churning the first instances'); the lower index otherwise. */
static bool cheaper(const Router *r, int i, const RouteCostEstimate *a, int best, const RouteCostEstimate *b, int affine) {
    if (best < 0) return true;
    double tol = 1e-6 + 1e-6 * fmax(a->score_s, b->score_s);
    if (fabs(a->score_s - b->score_s) > tol) return a->score_s < b->score_s;
    if ((i == affine) != (best == affine)) return i == affine;
    if (r->match[i] != r->match[best]) return r->match[i] > r->match[best];
    if (r->load[i] != r->load[best]) return r->load[i] < r->load[best];
    return r->index[i].count < r->index[best].count;
}

/* The two instances that can lend with the longest cached prefixes (r->match filled). */
static void top_lenders(const Router *r, int *first, int *second) {
    *first = *second = -1;
    for (int i = 0; i < r->n_instances; i++) {
        if (r->down[i] || !r->can_move[i] || r->held[i] == 0) continue;
        if (*first < 0 || r->held[i] > r->held[*first]) *second = *first, *first = i;
        else if (*second < 0 || r->held[i] > r->held[*second]) *second = i;
    }
}

/* The prompt's blocks will be cached on instance i when its prefill is done (routed there). All of
 * them, those i holds now included: if they are evicted before the request's turn, it computes
 * them again, and a request queued behind it still finds them. */
static void expect_blocks(Router *r, int i, const uint64_t *hashes, int n) {
    for (int k = 0; k < n; k++)
        block_index_add(&r->inflight[i], hashes[k]);
}

/* The requests a prefill added to instance i delays: those decoding on i (a batching engine runs one
 * step at a time: each running sequence waits while the step computes the chunk), and the later
 * arrivals while queues last (backlog: requests waiting per instance). Those on i still waiting for
 * their own prefill are ahead of it (first come, first served) and not stalled by it: counting them
 * made an instance crowded with queued requests look costly for a short prefill and an idle-decoding
 * one cheap, so a request's prefill interrupted a decode rather than queue behind a prefix being
 * computed. Given the queue in seconds (r->queue_s: braid sim's one-request-at-a-time replay), those
 * on i are all ahead of it and only the later arrivals wait. */
static double delayed_by(const Router *r, int i, double backlog) {
    int decoding = r->load[i] - r->prefilling[i];
    return (r->queue_s || decoding < 0 ? 0 : decoding) + backlog;
}

/* Remembers the prompt being routed (a failed copy only forgets it: in flight is a guess). */
static void keep_picked(Router *r, const uint64_t *hashes, int n) {
    r->n_picked = 0;
    if (n <= 0 || braid_grow((void **)&r->picked, &r->cap_picked, n, sizeof *r->picked)) return;
    memcpy(r->picked, hashes, (size_t)n * sizeof *hashes);
    r->n_picked = n;
}

static RouteDecision pick_cost(Router *r, const uint64_t *hashes, int n_hashes, int prompt_tokens, const char *workflow) {
    int bs = block_size_of(r);
    if (prompt_tokens < n_hashes * bs) prompt_tokens = n_hashes * bs;
    for (int i = 0; i < r->n_instances; i++) {
        r->held[i] = r->down[i] ? 0 : block_index_prefix(&r->index[i], hashes, n_hashes);
        int coming = r->down[i] ? 0 : block_index_prefix(&r->inflight[i], hashes, n_hashes);
        r->match[i] = coming > r->held[i] ? coming : r->held[i];
    }
    int first, second, affine = affinity_of(r, workflow), best = -1, best_source = -1, live = 0;
    top_lenders(r, &first, &second);
    double backlog = 0;
    for (int i = 0; i < r->n_instances; i++) {
        if (r->down[i]) continue;
        int source = first != i ? first : second;
        RouteCostInput in = {.queue_s = ahead_tokens(r, i) * r->cost.s_per_token, .prompt_tokens = prompt_tokens, .block_size = bs,
                             .local_blocks = r->match[i], .source_blocks = source >= 0 ? r->held[source] : 0,
                             .can_move = source >= 0 && r->can_move[i], .bytes_per_token = source >= 0 ? r->bytes_per_token[source] : 0,
                             .free_blocks = free_blocks(r, i),
                             .link_bytes_per_s = source >= 0 ? r->links[(size_t)source * r->n_instances + i].bytes_per_s : 0,
                             .lender_queue_s = source < 0 ? 0 : r->lender_wait_s ? r->lender_wait_s[source] : ahead_tokens(r, source) * r->cost.s_per_token};
        r->estimate[i] = route_cost_estimate(&r->cost, &in);
        backlog += r->load[i] > 1 ? r->load[i] - 1 : 0; /* requests waiting behind the one running */
        live++;
    }
    backlog = live > 0 ? backlog / live : 0;
    RouteCostEstimate best_e = {0};
    for (int i = 0; i < r->n_instances; i++) {
        if (r->down[i]) continue;
        RouteCostEstimate *e = &r->estimate[i];
        e->score_s = route_cost_score(e, delayed_by(r, i, backlog));
        if (cheaper(r, i, e, best, &best_e, affine)) best = i, best_e = *e, best_source = first != i ? first : second;
    }
    if (best < 0) return (RouteDecision){.instance = -1, .source = -1, .reason = "none alive"};
    RouteDecision d = {.instance = best, .matched_blocks = r->match[best], .source = -1, .priced = true, .priced_for = best,
                       .move = best_e.moved_blocks > 0,
                       .est_ttft_s = best_e.ttft_s, .est_queue_s = best_e.queue_s, .est_move_s = best_e.move_s,
                       .est_recompute_s = best_e.recompute_s};
    if (best_source >= 0 && r->held[best_source] > d.matched_blocks) d.source = best_source, d.source_blocks = r->held[best_source];
    keep_picked(r, hashes, n_hashes); /* router_charge records them as in flight to the instance it is sent to */
    d.reason = d.move ? "cost-move" : d.matched_blocks > 0 ? "cost-local" : "cost-compute";
    return d;
}

RouteDecision router_pick_prompt(Router *r, const uint64_t *hashes, int n_hashes, int prompt_tokens, const char *workflow) {
    if (r->mode == ROUTER_COST) return pick_cost(r, hashes, n_hashes, prompt_tokens, workflow);
    RouteDecision d = r->mode == ROUTER_ROUND_ROBIN ? pick_round_robin(r, hashes, n_hashes)
                      : r->mode == ROUTER_BALANCED  ? pick_balanced(r, hashes, n_hashes, workflow)
                                                    : pick_cache_aware(r, hashes, n_hashes, workflow);
    if (d.instance >= 0) find_source(r, hashes, n_hashes, &d);
    else d.source = -1;
    return d;
}

RouteDecision router_pick(Router *r, const uint64_t *hashes, int n_hashes, const char *workflow) {
    return router_pick_prompt(r, hashes, n_hashes, n_hashes * block_size_of(r), workflow);
}

void router_instance_kv(Router *r, int instance, bool can_move, uint64_t block_bytes, int block_size) {
    r->can_move[instance] = can_move;
    if (block_size > 0) r->block_size = block_size;
    r->bytes_per_token[instance] = block_size > 0 ? (double)block_bytes / block_size : 0;
}

RouteCharge router_charge(Router *r, const RouteDecision *d, int prompt_tokens, double now) {
    RouteCharge c = {.instance = -1, .t_dispatch = now};
    if (d->instance < 0 || d->instance >= r->n_instances) return c;
    int bs = block_size_of(r), i = d->instance;
    bool move = route_decision_priced(d) && d->move && d->source >= 0;
    int have = move && d->source_blocks > d->matched_blocks ? d->source_blocks : d->matched_blocks;
    double computed = prompt_tokens - (double)have * bs;
    c.instance = i;
    c.prefill_tokens = computed > 1 ? computed : 1; /* at least the last token is always computed */
    c.ahead_tokens = ahead_tokens(r, i);
    c.moved_bytes = move ? (double)(d->source_blocks - d->matched_blocks) * bs * r->bytes_per_token[i] : 0;
    c.prefill_open = true;
    r->pending_prefill[i] += c.prefill_tokens;
    r->prefilling[i]++;
    if (r->mode == ROUTER_COST) expect_blocks(r, i, r->picked, r->n_picked);
    r->n_picked = 0;
    return c;
}

void router_prefill_done(Router *r, RouteCharge *c) {
    if (!c->prefill_open || c->instance < 0 || c->instance >= r->n_instances) return;
    c->prefill_open = false;
    if (r->prefilling[c->instance] > 0) r->prefilling[c->instance]--;
    double left = r->pending_prefill[c->instance] - c->prefill_tokens;
    r->pending_prefill[c->instance] = left > 1e-9 ? left : 0;
    if (!(left > 1e-9)) block_index_clear(&r->inflight[c->instance]); /* no prefill pending: whatever was coming has come */
}

void router_learn(Router *r, RouteCharge *c, double ttft_s, int computed_tokens, int moved_tokens) {
    router_prefill_done(r, c);
    if (c->t_dispatch <= 0 || c->instance < 0 || c->instance >= r->n_instances || r->down[c->instance] || ttft_s <= 0) return;
    if (c->moved_bytes > 0 && moved_tokens <= 0) return; /* its move failed: the TTFT holds a timeout, not a rate */
    double moved_bytes = moved_tokens > 0 ? moved_tokens * r->bytes_per_token[c->instance] : 0;
    route_cost_learn(&r->cost, ttft_s, c->ahead_tokens, computed_tokens, moved_bytes);
}

void router_learn_move(Router *r, int lender, int borrower, int moved_tokens, double move_s, int link) {
    if (lender < 0 || borrower < 0 || lender >= r->n_instances || borrower >= r->n_instances || lender == borrower || moved_tokens <= 0) return;
    double bytes = moved_tokens * r->bytes_per_token[borrower];
    route_link_learn(&r->links[(size_t)lender * r->n_instances + borrower], bytes, move_s, link);
}

const RouteLinkRate *router_link(const Router *r, int lender, int borrower) {
    if (lender < 0 || borrower < 0 || lender >= r->n_instances || borrower >= r->n_instances) return NULL;
    const RouteLinkRate *l = &r->links[(size_t)lender * r->n_instances + borrower];
    return l->samples > 0 ? l : NULL;
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

void router_cleared(Router *r, int instance) {
    block_index_clear(&r->index[instance]);
    block_index_clear(&r->inflight[instance]);
}

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
    r->pending_prefill[instance] = 0;
    r->prefilling[instance] = 0;
    router_cleared(r, instance);
}

void router_instance_up(Router *r, int instance) {
    r->load[instance] = 0;
    r->pending_prefill[instance] = 0;
    r->prefilling[instance] = 0;
    r->down[instance] = false;
}

void router_instance_capacity(Router *r, int instance, long blocks) {
    r->capacity_blocks[instance] = blocks > 0 ? blocks : 0;
    /* In flight to it: no more than its cache holds (older entries are forgotten first). */
    size_t bound = blocks > 0 && (size_t)blocks < ROUTER_INFLIGHT_MAX_BLOCKS ? (size_t)blocks : ROUTER_INFLIGHT_MAX_BLOCKS;
    if (bound != r->inflight[instance].max_blocks) {
        block_index_free(&r->inflight[instance]);
        block_index_init(&r->inflight[instance], bound);
    }
}
