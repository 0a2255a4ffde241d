#include "sim/sim_cluster.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "common/grow.h"
#include "cache/kv_cache.h"
#include "coord/router.h"
#include "sim/sim_cluster_batch.h"
#include "sim/sim_percentile.h"
#include "sim/simulator.h"

int sim_route_parse(const char *name) {
    switch (router_mode_parse(name)) {
    case ROUTER_COST: return SIM_ROUTE_COST;
    case ROUTER_CACHE_AWARE: return SIM_ROUTE_CACHE;
    case ROUTER_BALANCED: return SIM_ROUTE_BALANCED;
    case ROUTER_ROUND_ROBIN: return SIM_ROUTE_ROUND_ROBIN;
    default: return -1;
    }
}

static RouterMode router_mode_of(SimRoute route) {
    return route == SIM_ROUTE_ROUND_ROBIN ? ROUTER_ROUND_ROBIN
           : route == SIM_ROUTE_BALANCED  ? ROUTER_BALANCED
           : route == SIM_ROUTE_COST      ? ROUTER_COST
                                          : ROUTER_CACHE_AWARE;
}

const char *sim_route_name(SimRoute route) { return router_mode_name(router_mode_of(route)); }

int sim_cluster_replay_parse(const char *name) {
    return strcmp(name, "batch") == 0 ? SIM_REPLAY_BATCH : strcmp(name, "fifo") == 0 ? SIM_REPLAY_FIFO : -1;
}

SimClusterConfig sim_cluster_config_default(void) {
    SimConfig one = sim_config_default();
    /* The link: 10 GB/s and 20 us a move stand for a 100 Gb/s RDMA network between nodes. */
    return (SimClusterConfig){.n_instances = 4, .kv_tokens = one.kv_tokens, .route = SIM_ROUTE_COST, .load_slack = 8, .moves = true,
                              .prefill_s_per_token = one.prefill_s_per_token, .decode_s_per_token = one.decode_s_per_token,
                              .kv_bytes_per_token = one.kv_bytes_per_token, .link_bytes_per_s = 10e9, .link_latency_s = 20e-6,
                              .lender_step_tokens = 512, .move_timeout_s = 5.0, /* serve's --max-batch-tokens, --move-timeout */
                              .max_running = 64, .step_s = 0.008, /* serve's --max-running; the 2-core CPU's step (sim_tenants.h) */
                              .n_layers = SIM_DEFAULT_MODEL_LAYERS};
}

/* One request's time on its instance: it waits until start, prefills (and moves) until prefill_end,
 * decodes until finish. */
typedef struct {
    double start, prefill_end, finish;
} SimServed;

typedef struct {
    KvCache cache;
    bool up;
    SimServed *finish; /* the requests assigned to it and not finished (pruned as arrivals pass them) */
    int n_finish, cap_finish;
    double free_at;
    int served;
} SimInstance;

typedef struct {
    const SimClusterConfig *cfg;
    SimInstance *inst;
    Router router;
    int current;    /* the instance whose cache is being changed (its events feed its index) */
    int tpb;        /* tree tokens a block (two: the halves of the trace's chained hash) */
    int32_t *tokens, *table;
    uint64_t *hashes; /* the request's blocks as the caches hash them (the router's keys) */
    double *queue_s;  /* (n_instances) the cost router's queue ahead at the current arrival */
    double *wait_s;   /* (n_instances) how long each would take to answer a move at the current arrival */
    double *latency, *ttft; /* (trace requests) per request, for the percentiles */
} Cluster;

/* The registry, as the coordinator keeps it: inserted blocks stored on the instance, blocks gone
 * from it removed (the caches here have no host tier, so gone from the device is gone). */
static void on_event(void *ctx, const CacheEvent *ev) {
    Cluster *cl = ctx;
    if (ev->kind == CACHE_EVENT_STORED && ev->tier == CACHE_TIER_DEVICE) router_stored(&cl->router, cl->current, ev->hashes, ev->n_blocks);
    else if (ev->kind == CACHE_EVENT_REMOVED && ev->tiers_after == 0) router_evicted(&cl->router, cl->current, ev->hashes, ev->n_blocks);
    else if (ev->kind == CACHE_EVENT_CLEARED) router_cleared(&cl->router, cl->current);
}

/* Requests assigned to i and still running at time t. */
static int load_at(SimInstance *in, double t) {
    int live = 0;
    for (int k = 0; k < in->n_finish; k++)
        if (in->finish[k].finish > t) in->finish[live++] = in->finish[k];
    in->n_finish = live;
    return live;
}

/* How long instance `in` takes at time t to answer a move: the rest of the engine step it is in
 * (load_at pruned it to t). Prefilling: the rest of the prefill, at most one step of step_tokens;
 * decoding: one decode step; idle: 0. */
static double answer_wait_at(const SimInstance *in, double t, const SimClusterConfig *cfg) {
    for (int k = 0; k < in->n_finish; k++) {
        const SimServed *s = &in->finish[k];
        if (s->start > t) continue;
        if (t < s->prefill_end) {
            double step = cfg->lender_step_tokens > 0 ? cfg->lender_step_tokens * cfg->prefill_s_per_token : 0;
            return s->prefill_end - t < step ? s->prefill_end - t : step;
        }
        return s->finish - t < cfg->decode_s_per_token ? s->finish - t : cfg->decode_s_per_token;
    }
    return 0;
}

/* Serves r on instance i: its cached prefix, then (moves) the blocks the source instance holds past
 * it, then the rest computed; everything enters i's cache. Returns blocks matched locally and moved. */
static int serve_on(Cluster *cl, int i, const TraceRequest *r, int source, int *local_out, int *moved_out, BraidError *err) {
    KvCache *c = &cl->inst[i].cache;
    int bs_tree = cl->tpb;
    CacheIdentity id;
    cl->current = i;
    if (kv_cache_identity(c, r->tenant, r->adapter, r->workflow, r->agent, &id, err)) return -1;
    KvCacheMatch m;
    if (kv_cache_match(c, &id, cl->tokens, r->n_blocks * bs_tree + 1, &m, err)) return -1;
    int got = kv_cache_acquire(c, &m, cl->table, err);
    if (got < 0) return -1;
    int moved = 0;
    if (source >= 0) { /* what the source holds past our prefix comes over instead of being computed */
        int have = block_index_prefix(&cl->router.index[source], cl->hashes, r->n_blocks);
        moved = have > got ? have - got : 0;
    }
    int total = r->n_blocks, need = total - got;
    int ok = kv_cache_reserve(c, need, cl->table + got) == 0;
    RadixNode *lock = m.node;
    if (ok && kv_cache_commit(c, &id, cl->tokens, total, cl->table, &lock, false, err)) return -1;
    kv_cache_release(c, lock, cl->table, ok ? total : got);
    kv_cache_identity_release(c, &id);
    CacheOpList ops = {0};
    if (kv_cache_take_ops(c, &ops)) return braid_error_set(err, "sim cluster: out of memory");
    cache_ops_free(&ops);
    *local_out = got;
    *moved_out = ok ? moved : 0;
    return ok ? 1 : 0;
}

static void cluster_free(Cluster *cl) {
    for (int i = 0; cl->inst && i < cl->cfg->n_instances; i++) {
        if (cl->inst[i].up) kv_cache_free(&cl->inst[i].cache);
        free(cl->inst[i].finish);
    }
    free(cl->inst);
    router_free(&cl->router);
    free(cl->tokens);
    free(cl->table);
    free(cl->hashes);
    free(cl->queue_s);
    free(cl->wait_s);
    free(cl->latency);
    free(cl->ttft);
}

static int cluster_init(Cluster *cl, const Trace *t, const SimClusterConfig *cfg, BraidError *err) {
    memset(cl, 0, sizeof *cl);
    cl->cfg = cfg;
    cl->tpb = SIM_TOKENS_PER_BLOCK;
    int bs = t->block_size > 0 ? t->block_size : 16, max_blocks = 1;
    for (int k = 0; k < t->n; k++)
        if (t->reqs[k].n_blocks > max_blocks) max_blocks = t->reqs[k].n_blocks;
    /* The cost router's queue is exact here (FIFO: previous finish minus arrival). */
    if (sim_cluster_router_init(&cl->router, cfg, router_mode_of(cfg->route), bs, err)) return -1;
    cl->queue_s = calloc((size_t)cfg->n_instances, sizeof *cl->queue_s);
    cl->wait_s = calloc((size_t)cfg->n_instances, sizeof *cl->wait_s);
    cl->latency = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *cl->latency);
    cl->ttft = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *cl->ttft);
    cl->router.queue_s = cl->queue_s;
    if (cfg->lender_step_tokens > 0) cl->router.lender_wait_s = cl->wait_s;
    cl->inst = calloc((size_t)cfg->n_instances, sizeof *cl->inst);
    cl->tokens = malloc(((size_t)max_blocks * cl->tpb + 1) * sizeof *cl->tokens);
    cl->table = malloc(((size_t)max_blocks + 1) * sizeof *cl->table);
    cl->hashes = malloc(((size_t)max_blocks + 1) * sizeof *cl->hashes);
    if (!cl->inst || !cl->tokens || !cl->table || !cl->hashes || !cl->queue_s || !cl->wait_s || !cl->latency || !cl->ttft) return braid_error_set(err, "sim cluster: out of memory");
    KvCacheConfig cc = {.block_size = cl->tpb, .device_blocks = cfg->kv_tokens / bs + 1};
    for (int i = 0; i < cfg->n_instances; i++) {
        if (kv_cache_init(&cl->inst[i].cache, &cc, err)) return -1;
        cl->inst[i].up = true;
        kv_cache_set_observer(&cl->inst[i].cache, on_event, cl);
    }
    return 0;
}

static int check_config(const Trace *t, const SimClusterConfig *cfg, BraidError *err) {
    if (cfg->n_instances < 1 || cfg->n_instances > 4096) return braid_error_set(err, "sim cluster: --instances must be 1..4096");
    int bs = t->block_size > 0 ? t->block_size : 16;
    if (cfg->kv_tokens < 2 * bs) return braid_error_set(err, "sim cluster: the cache must hold at least 2 blocks");
    if (cfg->link_bytes_per_s <= 0 || cfg->link_latency_s < 0) return braid_error_set(err, "sim cluster: the link needs a bandwidth > 0");
    if (cfg->prefill_s_per_token <= 0) return braid_error_set(err, "sim cluster: the prefill cost must be > 0");
    if (cfg->host_kv_tokens < 0 || (cfg->host_kv_tokens > 0 && cfg->replay == SIM_REPLAY_FIFO))
        return braid_error_set(err, "sim cluster: a host tier needs the batching replay (--cluster-replay batch)");
    if (cfg->closed_loop_clients < 0) return braid_error_set(err, "sim cluster: the closed loop's clients must be >= 0");
    return 0;
}

int sim_cluster_router_init(Router *router, const SimClusterConfig *cfg, int router_mode, int block_size, BraidError *err) {
    if (router_init(router, cfg->n_instances, cfg->load_slack)) return braid_error_set(err, "sim cluster: out of memory");
    router->mode = (RouterMode)router_mode;
    /* The cost router's rates are the replay's own (live, it learns them) unless given a start. */
    router->cost = route_cost_model_init(cfg->moves, cfg->router_prefill_tps > 0 ? cfg->router_prefill_tps : 1.0 / cfg->prefill_s_per_token,
                                         cfg->router_link_bytes_per_s > 0 ? cfg->router_link_bytes_per_s : cfg->link_bytes_per_s,
                                         cfg->link_latency_s);
    router->cost.lender_step_tokens = cfg->lender_step_tokens;
    router->cost.move_timeout_s = cfg->move_timeout_s;
    for (int i = 0; i < cfg->n_instances; i++) {
        router_instance_kv(router, i, true, (uint64_t)(cfg->kv_bytes_per_token * block_size + 0.5), block_size);
        router_instance_capacity(router, i, (cfg->kv_tokens + cfg->host_kv_tokens) / block_size); /* device + host, as the coordinator */
    }
    return 0;
}

int sim_cluster_run(const Trace *t, const SimClusterConfig *cfg, SimClusterResult *res, BraidError *err) {
    memset(res, 0, sizeof *res);
    if (check_config(t, cfg, err)) return -1;
    if (cfg->replay == SIM_REPLAY_BATCH) return sim_cluster_batch_run(t, cfg, (int)router_mode_of(cfg->route), res, err);
    Cluster cl;
    int rc = cluster_init(&cl, t, cfg, err);
    int bs = t->block_size > 0 ? t->block_size : 16;
    double t0 = t->n > 0 ? t->reqs[0].t : 0, last = t0, sum_latency = 0, sum_wait = 0, sum_move = 0;
    for (int k = 0; rc == 0 && k < t->n; k++) {
        const TraceRequest *r = &t->reqs[k];
        sim_hash_tokens(r->blocks, r->n_blocks, cl.tokens);
        content_hash_blocks(content_hash_namespace(r->tenant, r->adapter), cl.tokens, r->n_blocks, cl.tpb, cl.hashes, NULL);
        for (int i = 0; i < cfg->n_instances; i++) {
            cl.router.load[i] = load_at(&cl.inst[i], r->t);
            cl.queue_s[i] = cl.inst[i].free_at > r->t ? cl.inst[i].free_at - r->t : 0;
            cl.wait_s[i] = answer_wait_at(&cl.inst[i], r->t, cfg);
        }
        /* Never the whole prompt: the last block's worth is always computed, as live. */
        int usable = r->prompt_tokens > 0 ? (r->prompt_tokens - 1) / bs : 0;
        if (usable > r->n_blocks) usable = r->n_blocks;
        RouteDecision d = router_pick_prompt(&cl.router, cl.hashes, usable, r->prompt_tokens, r->workflow);
        int src = -1;
        if (route_decision_priced(&d)) src = cfg->moves && d.move ? d.source : -1; /* the cost router weighed the move already */
        else if (cfg->moves && d.source >= 0) {
            double gain = d.source_blocks - d.matched_blocks;
            double move_s = gain * bs * cfg->kv_bytes_per_token / cfg->link_bytes_per_s + cfg->link_latency_s;
            if (move_s < gain * bs * cfg->prefill_s_per_token) src = d.source;
        }
        int local = 0, moved = 0;
        int ok = serve_on(&cl, d.instance, r, src, &local, &moved, err);
        if (ok < 0) {
            rc = -1;
            break;
        }
        if (local > usable) local = usable;
        if (local + moved > usable) moved = usable - local > 0 ? usable - local : 0;
        if (!ok) res->too_large++;
        double move_s = 0;
        if (moved > 0) { /* the lender answers after its current step; too late and the move fails */
            move_s = (cfg->lender_step_tokens > 0 ? cl.wait_s[src] : 0) + moved * bs * cfg->kv_bytes_per_token / cfg->link_bytes_per_s +
                     cfg->link_latency_s;
            if (cfg->move_timeout_s > 0 && move_s >= cfg->move_timeout_s) {
                res->move_failures++;
                move_s = cfg->move_timeout_s;
                moved = 0;
            }
        }
        int computed = r->prompt_tokens - (local + moved) * bs;
        SimInstance *in = &cl.inst[d.instance];
        double start = r->t > in->free_at ? r->t : in->free_at;
        double finish = start + move_s + computed * cfg->prefill_s_per_token + r->output_tokens * cfg->decode_s_per_token;
        in->free_at = finish;
        in->served++;
        if (braid_grow((void **)&in->finish, &in->cap_finish, in->n_finish + 1, sizeof *in->finish)) {
            rc = braid_error_set(err, "sim cluster: out of memory");
            break;
        }
        in->finish[in->n_finish++] = (SimServed){.start = start, .prefill_end = start + move_s + computed * cfg->prefill_s_per_token, .finish = finish};
        cl.latency[res->requests] = finish - r->t;
        cl.ttft[res->requests] = start + move_s + computed * cfg->prefill_s_per_token - r->t;
        res->requests++;
        res->prompt_tokens += (uint64_t)r->prompt_tokens;
        res->local_tokens += (uint64_t)local * bs;
        res->remote_tokens += (uint64_t)moved * bs;
        res->computed_tokens += (uint64_t)computed;
        res->moves += moved > 0;
        res->moved_blocks += (uint64_t)moved;
        res->moved_bytes += moved * bs * cfg->kv_bytes_per_token;
        sum_latency += finish - r->t;
        sum_wait += start - r->t;
        sum_move += move_s;
        if (finish > last) last = finish;
    }
    if (rc == 0 && res->requests > 0) {
        res->mean_latency_s = sum_latency / res->requests;
        res->mean_wait_s = sum_wait / res->requests;
        res->mean_move_s = sum_move / res->requests;
        res->span_s = last - t0;
        res->p50_latency_s = sim_percentile(cl.latency, res->requests, 0.50);
        res->p99_latency_s = sim_percentile(cl.latency, res->requests, 0.99);
        double sum_ttft = 0;
        for (int k = 0; k < res->requests; k++) sum_ttft += cl.ttft[k];
        res->mean_ttft_s = sum_ttft / res->requests;
        res->p99_ttft_s = sim_percentile(cl.ttft, res->requests, 0.99);
        for (int i = 0; i < cfg->n_instances; i++)
            if ((double)cl.inst[i].served / res->requests > res->max_share) res->max_share = (double)cl.inst[i].served / res->requests;
    }
    cluster_free(&cl);
    return rc;
}
