/*
 * bench_cache_policy — PBKV's scheduler overheads (paper App. F) on Braid's cache object: the time
 * of one eviction, of one forecast taken by the policy (which re-keys the tier's heap), and of one
 * node's score, with a cache of N nodes spread over W active workflows of A agents.
 *   bench_cache_policy [--policy pbkv] [--nodes 4096] [--workflows 1024] [--agents 5] [--repeats 5]
 * Prints one JSON line: microseconds per eviction (one node), per forecast (the policy takes it and
 * the cache re-keys that workflow's nodes), per node re-keyed.
 * Each figure is the best of --repeats passes (noise only ever adds time).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "common/timeutil.h"

#define BS 4

typedef struct {
    const char *policy;
    int nodes, workflows, agents, repeats;
} Args;

/* One 1-block prompt per node, node i in workflow i % W, called by agent i % A. */
static int fill(KvCache *c, const Args *a, BraidError *err) {
    char wf[32], agent[32];
    for (int i = 0; i < a->nodes; i++) {
        snprintf(wf, sizeof wf, "wf%d", i % a->workflows);
        snprintf(agent, sizeof agent, "agent%d", i % a->agents);
        CacheIdentity id;
        int32_t tokens[BS + 1], table[1];
        for (int t = 0; t <= BS; t++) tokens[t] = i * 8 + t;
        KvCacheMatch m;
        if (kv_cache_identity(c, NULL, NULL, wf, agent, &id, err) || kv_cache_match(c, &id, tokens, BS + 1, &m, err)) return -1;
        if (kv_cache_acquire(c, &m, table, err) < 0 || kv_cache_reserve(c, 1, table) != 0) return braid_error_set(err, "bench: pool full");
        RadixNode *lock = m.node;
        if (kv_cache_commit(c, &id, tokens, 1, table, &lock, false, err)) return -1;
        kv_cache_release(c, lock, table, 1);
    }
    return 0;
}

/* A forecast for workflow w: agent (w + s) % A likely at step s. */
static int forecast(KvCache *c, const Args *a, int w, const char *const *names, float *prob, BraidError *err) {
    char wf[32];
    snprintf(wf, sizeof wf, "wf%d", w);
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < a->agents; i++) prob[s * a->agents + i] = i == (w + s) % a->agents ? 0.8f : 0.2f / (float)(a->agents - 1);
    return kv_cache_predict(c, wf, names[w % a->agents], 4, a->agents, names, prob, err);
}

static int run(const Args *a, double *evict_us, double *forecast_us, double *score_us, BraidError *err) {
    KvCacheConfig cfg = {.block_size = BS, .device_blocks = a->nodes + 1, .policy = evict_policy_find(a->policy)};
    if (!cfg.policy) return braid_error_set(err, "bench: unknown policy %s", a->policy);
    KvCache c;
    char **names = calloc((size_t)a->agents, sizeof *names);
    float *prob = malloc((size_t)4 * a->agents * sizeof *prob);
    if (!names || !prob || kv_cache_init(&c, &cfg, err)) return braid_error_set(err, "bench: set-up failed");
    for (int i = 0; i < a->agents; i++) {
        names[i] = malloc(32);
        snprintf(names[i], 32, "agent%d", i);
    }
    int rc = fill(&c, a, err);
    double t0 = braid_now_seconds();
    for (int w = 0; rc == 0 && w < a->workflows; w++) rc = forecast(&c, a, w, (const char *const *)names, prob, err);
    *forecast_us = 1e6 * (braid_now_seconds() - t0) / a->workflows;
    /* A forecast re-keys the nodes its workflow uses (nodes / workflows of them here): its cost per
     * node is the cost of one score update (score + heap sift). */
    *score_us = *forecast_us / ((double)a->nodes / a->workflows);
    int n_evict = a->nodes / 4;
    t0 = braid_now_seconds();
    int freed = rc == 0 ? kv_cache_evict(&c, CACHE_TIER_DEVICE, n_evict) : 0;
    *evict_us = 1e6 * (braid_now_seconds() - t0) / (freed ? freed : 1);
    kv_cache_free(&c);
    for (int i = 0; i < a->agents; i++) free(names[i]);
    free(names);
    free(prob);
    return rc;
}

int main(int argc, char **argv) {
    Args a = {.policy = "pbkv", .nodes = 4096, .workflows = 1024, .agents = 5, .repeats = 5};
    static const struct option opts[] = {{"policy", required_argument, 0, 'p'}, {"nodes", required_argument, 0, 'n'},
                                         {"workflows", required_argument, 0, 'w'}, {"agents", required_argument, 0, 'a'},
                                         {"repeats", required_argument, 0, 'r'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'p': a.policy = optarg; break;
        case 'n': a.nodes = atoi(optarg); break;
        case 'w': a.workflows = atoi(optarg); break;
        case 'a': a.agents = atoi(optarg); break;
        case 'r': a.repeats = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: bench_cache_policy [--policy pbkv] [--nodes N] [--workflows W] [--agents A] [--repeats R]\n");
            return 2;
        }
    }
    if (a.nodes < 4 || a.workflows < 1 || a.agents < 2 || a.repeats < 1) {
        fprintf(stderr, "bench_cache_policy: --nodes >= 4, --workflows >= 1, --agents >= 2, --repeats >= 1\n");
        return 2;
    }
    double best_evict = 1e30, best_forecast = 1e30, best_score = 1e30;
    for (int r = 0; r < a.repeats; r++) {
        double e = 0, f = 0, s = 0;
        BraidError err;
        if (run(&a, &e, &f, &s, &err)) {
            fprintf(stderr, "bench_cache_policy: %s\n", err.msg);
            return 1;
        }
        if (e < best_evict) best_evict = e;
        if (f < best_forecast) best_forecast = f;
        if (s < best_score) best_score = s;
    }
    printf("{\"policy\":\"%s\",\"nodes\":%d,\"workflows\":%d,\"agents\":%d,\"evict_us_per_node\":%.3f,\"forecast_us\":%.2f,"
           "\"score_us_per_node\":%.4f}\n",
           a.policy, a.nodes, a.workflows, a.agents, best_evict, best_forecast, best_score);
    return 0;
}
