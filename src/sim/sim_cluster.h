/*
 * sim_cluster.h — braid sim with N instances: the router, KV block moves between instances over a
 * modeled network, and a queue per instance (issue 19's "beyond one machine").
 *
 * Each instance is one copy of the real cache (src/cache, device tier, LRU; batch: any policy) of kv_tokens tokens;
 * the router is the live one (coord/router.h: the longest cached prefix within the load slack, or
 * round-robin, balanced, or the cost model, the default), fed by the instances' cache events exactly as the coordinator's registry is (blocks
 * inserted are stored on the instance, blocks that leave it removed). Its decision also names the
 * instance holding the longest prefix; with moves on, the chosen instance takes the missing blocks
 * from it when the move is cheaper than recomputing them (move time = blocks x block bytes / link
 * bandwidth + link latency, the live cost model; move_plan.h), and they enter its cache as if
 * computed there. Two replays (SimClusterConfig.replay): SIM_REPLAY_BATCH, the default, runs each
 * instance's live scheduler step by step with continuous batching (sim_cluster_batch.h, which says how);
 * SIM_REPLAY_FIFO, the model before it, kept for comparison (braid sim --cluster-replay fifo) and
 * described in the rest of this comment. Requests are replayed in arrival order. An instance serves one request at a
 * time (FIFO): a request starts at max(arrival, the instance's previous finish) and takes its move
 * time + computed prompt tokens x prefill cost + output tokens x decode cost. Load (the router's)
 * is the requests assigned to an instance and not finished at the arrival.
 * A lender answers a move between its engine steps, as live: a busy lender (work queued ahead of the
 * arrival) first finishes its current step, min(its queue ahead, lender_step_tokens x prefill cost).
 * A move whose wait + transfer reaches move_timeout_s fails as live does: the request waits the
 * timeout, then computes the blocks (counted computed, not moved, and in move_failures).
 * The cost router (router_cost.h) prices each instance with the exact queue ahead (its previous
 * finish less the arrival: the replay knows it, where the live coordinator estimates it), the
 * prefill cost and the link: the rates it would learn live are the replay's own; its decision says
 * whether to move, and the replay follows it.
 * Latency percentiles are over requests (arrival to finish); TTFT = arrival to the end of the
 * prefill (wait + move + computed prompt tokens).
 * Modeled, not measured: in FIFO there is no batching, so queues are longer than a batching engine's
 * and which instance holds which blocks at an arrival differs from a live run's.
 */
#ifndef BRAID_SIM_SIM_CLUSTER_H
#define BRAID_SIM_SIM_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/evict_policy.h"
#include "common/error.h"
#include "sim/trace.h"

typedef enum { SIM_ROUTE_CACHE = 0, SIM_ROUTE_ROUND_ROBIN, SIM_ROUTE_BALANCED, SIM_ROUTE_COST } SimRoute;

/* --router's names ("cost", "cache", "balanced", "round-robin"); -1 for anything else. */
int sim_route_parse(const char *name);
const char *sim_route_name(SimRoute route);

/* How an instance serves its requests: the live scheduler's steps (batching), or one at a time. */
typedef enum { SIM_REPLAY_BATCH = 0, SIM_REPLAY_FIFO } SimClusterReplay;

/* --cluster-replay's names ("batch", "fifo"); -1 for anything else. */
int sim_cluster_replay_parse(const char *name);

typedef struct {
    SimClusterReplay replay;
    int n_instances;
    int kv_tokens;               /* per instance */
    SimRoute route;
    int load_slack;              /* the router's --route-slack */
    bool moves;
    double prefill_s_per_token, decode_s_per_token;
    double kv_bytes_per_token;
    double link_bytes_per_s, link_latency_s; /* one move over the network */
    int lender_step_tokens;      /* serve's --max-batch-tokens: batch, each step's token budget (>= 1); fifo, a busy lender answers a
                                    move between engine steps of this many prefill tokens (0: at once) */
    int max_running;             /* batch: serve's --max-running, sequences in a step */
    /* The cost router's starting rates, as serve's --move-prefill-tps / --move-gbps (live it starts there and
     * learns from measured TTFTs; the batch replay's router learns the same way from the replay's). 0: the
     * replay's own prefill rate / link. */
    double router_prefill_tps, router_link_bytes_per_s;
    /* batch: the workflows are replayed as braid-bench run's client ran them (sim_cluster_batch.h): closed_loop_clients
     * workflows at a time (0: as many as the trace ran at once), each stage (calls within 0.1 s of each other) sent when
     * the stage before it has finished in the replay, a workflow's first stage when a client is free; off: at the
     * trace's times (open loop). For a trace recorded from a live run whose replay is not exactly as fast as it was. */
    bool closed_loop;
    int closed_loop_clients;
    /* batch: each instance's host tier below its device cache, in tokens (serve's host tier; 0: none). The router
     * counts it in the instance's capacity, as the coordinator does (device + host blocks). */
    int host_kv_tokens;
    /* batch: where to write one JSON line per request as it finishes (id, workflow, arrival, instance, lender,
     * cached and moved tokens, TTFT), for comparing the replay's placements with a live run's; NULL: none. */
    FILE *route_log;
    double step_s;               /* batch: a step's fixed cost (braid sim --step-ms) */
    /* batch: the model's layer count (braid sim --model-layers; default SIM_DEFAULT_MODEL_LAYERS). A busy lender answers a
     * move's ask at the next layer boundary of its step in progress (its step split in n_layers equal parts), as a live
     * leader does between two layers (the CPU backend's step pulse), and the router prices the lender so
     * (RouteCostModel.lender_step_parts = n_layers). <= 1: it answers between steps. The fifo replay always answers
     * between steps. */
    int n_layers;
    /* batch: the router's lender_step_parts when not n_layers (braid sim --router-lender-parts; 0: n_layers). For
     * replaying a live run whose coordinator priced the lender otherwise (before READY carried the layer count it
     * used ROUTE_COST_LIVE_LENDER_STEP_PARTS). */
    int router_lender_parts;
    double move_timeout_s;       /* a move not done by then fails and its blocks are computed (serve's --move-timeout); 0: never */
    /* batch: each instance's eviction policy (NULL: LRU) and its options (--pbkv-gamma). A policy that takes predictions
     * (pbkv, kvflow) gets the coordinator's: each call's forecast reaches every instance when the call is dispatched
     * (before it queues), from a trained predictor file (predictor_path, learning on with predictor_learn) or an online
     * Markov-predictor_kind one, over horizon steps (0: the default); a workflow's end reaches every instance's cache. */
    const EvictPolicy *policy;
    EvictPolicyOptions policy_options;
    const char *predictor_path;
    int predictor_kind;
    bool predictor_learn;
    bool forecast_run_cap; /* the forecast's run cap (workflow_forecast.h) */
    int horizon;
    int admit_output;            /* batch: each instance's --admit-output (worker/sched_admit.h; 0 = off) */
} SimClusterConfig;

typedef struct {
    int requests, too_large;     /* too_large: more blocks than one instance holds */
    uint64_t prompt_tokens, local_tokens, remote_tokens, computed_tokens;
    uint64_t moves, moved_blocks;
    uint64_t move_failures;      /* moves that did not land within move_timeout_s (their blocks computed) */
    double moved_bytes;
    double mean_latency_s, mean_wait_s, mean_move_s;
    double p50_latency_s, p99_latency_s, mean_ttft_s, p99_ttft_s;
    double span_s;               /* first arrival to last finish */
    double max_share;            /* the busiest instance's share of the requests */
    uint64_t steps;              /* batch: engine steps run, over all instances */
    int max_step_tokens;         /* batch: the most tokens (prefill chunks + decodes) one step computed */
    uint64_t preemptions;        /* batch: running requests the schedulers preempted (decode out of blocks), all instances */
    uint64_t import_waits;       /* batch: requests held until a move toward their instance ended (sim_cluster_batch.h) */
} SimClusterResult;

/* SmolLM2-135M's layer count (its GGUF's llama.block_count), the default model's. */
#define SIM_DEFAULT_MODEL_LAYERS 30

SimClusterConfig sim_cluster_config_default(void);
int sim_cluster_run(const Trace *t, const SimClusterConfig *cfg, SimClusterResult *res, BraidError *err);

#endif
