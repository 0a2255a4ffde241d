/*
 * simulator.h — replays a trace through the real cache code (src/cache: block pool, radix tree,
 * eviction policies) with no model, in arrival order, one request at a time.
 *
 * It drives the one cache object (src/cache/kv_cache.h) exactly as the scheduler does: each request
 * matches its cached prefix (block hashes stand in for tokens; never the whole prompt), loads the
 * host-tier part of it back, takes blocks for the rest of its prompt and its output (the cache
 * evicts or demotes per policy when short), then leaves its full prompt blocks in the cache.
 * Workflow ends reach the policy at their time. A cost model turns computed tokens and the blocks
 * copied between tiers into modeled time. Policies: any registered one, and "belady", the offline
 * bound, which evicts the node whose next use lies farthest in the future (known from the trace).
 *
 * Per workflow, the modeled latency is the model time on its critical path: its requests grouped
 * into stages by arrival time (a fan-out's calls arrive together), each stage as long as its
 * longest request. Tool and client time between stages is not modeled. Requests without a
 * workflow count as one-request workflows. With prefetch, the cache prefetches from the host tier
 * between requests (see SimConfig.prefetch). With SimConfig.timeline the result also holds one row
 * per request (its arrival time, tokens and modeled times), in trace order, for hit-rate-over-time
 * plots (braid sim --timeline; braid-bench plot reads the file). With SimConfig.lora_cache shared
 * (ForkKV) the cache holds base K/V keyed by tenant alone and adapted requests also hold residuals
 * in a second pool (sim_forkkv.h), as the live engine's DualRadixTree does. A trace whose lines carry
 * cache directives (pin, unpin, decay, evict, share, splice) is replayed on token ids with them
 * applied as the live scheduler applies them (sim_directives.h), unless ignore_directives.
 */
#ifndef BRAID_SIM_SIMULATOR_H
#define BRAID_SIM_SIMULATOR_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "sim/sim_directives.h"
#include "sim/sim_forkkv.h"
#include "sim/trace.h"

#define SIM_DEFAULT_PREFETCH_RHO 0.2 /* --prefetch-mode aggressive's rho: the paper's best (App. E.2) */

typedef struct {
    int kv_tokens;            /* device cache capacity in tokens */
    int host_kv_tokens;       /* host tier capacity in tokens (0 = no host tier) */
    const char *policy;       /* a registered policy (evict_policy_find) or "belady" */
    double prefill_s_per_token, decode_s_per_token;
    /* Copy cost of the host tier: bytes of K+V per token, copy bandwidth, fixed latency per
     * request that moves blocks (one batch of copies before its forward). */
    double kv_bytes_per_token, host_bandwidth_bytes_per_s, host_latency_s;
    /* Policies that take predictions (pbkv, kvflow) get each workflow's K-step forecast before
     * each of its calls: from a trained predictor file (kept learning only with predictor_learn),
     * or a Markov-`predictor_kind` predictor learning online from the trace as it replays. */
    const char *predictor_path;
    int predictor_kind;       /* 1 or 2 (default 1) */
    bool predictor_learn;
    bool forecast_run_cap;    /* the forecast's run cap (workflow_forecast.h), off by default */
    int horizon;              /* K (0 = WORKFLOW_FORECAST_DEFAULT_HORIZON) */
    double pbkv_gamma;        /* PBKV's discount gamma in (0, 1]; 0 = PBKV_DEFAULT_GAMMA */
    int pbkv_future;          /* PBKV's read for the workflows still to come: 1 on, -1 off, 0 = default (on) */
    /* The PBKV paper's App. E noise injection, lambda in [0, 1]: each forecast step reaches the
     * policy as (1 - lambda) P + lambda U, U uniform over the agents the predictor knows (END
     * keeps (1 - lambda) of its mass). 0 = the forecasts as predicted; 1 = no information. */
    double prediction_noise;
    /* Cache each request's generated blocks too, as the live engine does (they are unique to the
     * request: the trace has no hashes for them). Off = prompt blocks only. */
    bool cache_outputs;
    /* PBKV's conservative prefetch (kv_cache_prefetch): between two requests (the replay has no
     * steps; this stands for the idle time before the next arrival) host-tier nodes the policy
     * expects the next calls to use are loaded into free device blocks, never evicting anything.
     * Their copy time is on no request's TTFT (reported as prefetch_copy_s). Needs a policy with
     * prefetch_value (pbkv) and a host tier; otherwise nothing is prefetched. prefetch_max_blocks:
     * the most blocks one such gap loads (the live S_bw per step; 0 = no cap). */
    bool prefetch;
    int prefetch_max_blocks;
    /* 0 = conservative (above); in (0, 1]: the paper's aggressive variant (App. E), which may also
     * evict active cache, lowest score first, up to prefetch_rho x the device per gap
     * (KvCacheConfig.prefetch_rho). */
    double prefetch_rho;
    bool timeline;            /* fill SimResult.timeline, one row per request */
    /* Segment reuse (kv_cache.h SegmentReuseMode; 0 = off): the replay then runs the cache on the
     * trace's token ids (every request line needs "tokens") with the chunker's anchors (the model's
     * control tokens) and approximate mode's window; a reused token costs no prefill. Not with belady. */
    int segment_reuse;
    int approx_window;
    /* Approximate nodes earlier requests committed are not matched (braid serve --approx-prefix off). */
    bool no_approx_prefix;
    const int32_t *anchor_tokens;
    int n_anchor_tokens;
    /* Near-duplicate segments (KvCacheConfig.segment_lsh, approx mode only): the LSH index, its
     * thresholds (0 = defaults) and the tokenizer's canonical classes (token_canon.h; NULL = ids). */
    bool segment_lsh, segment_lsh_anywhere;
    double segment_tau_seg, segment_tau_ctx;
    const int32_t *segment_canon;
    int n_segment_canon;
    /* ForkKV (sim_forkkv.h). lora_cache SIM_LORA_SEPARATE (the default): the cache is keyed by
     * (tenant, adapter). SIM_LORA_SHARED: the kv_tokens cache holds base K/V keyed by tenant alone
     * (every request; the trace needs token ids) and each adapted request also holds its residual
     * (x·A, rank lora_rank) in a pool of residual_tokens tokens (0 = 2 x kv_tokens) with its own
     * LRU. A request computes from min(base match, residual match) and writes each part only past
     * its own match. kv_dim (the model's KV heads x head dim; 192 for SmolLM2-135M) and lora_rank
     * size a residual token at kv_bytes_per_token x lora_rank / kv_dim bytes. Not with segment reuse.
     * SIM_LORA_AUTO: shared's pools, and each adapted request forks or runs on its adapter's own
     * namespace of the base pool as sim_forkkv.h's SimAuto chooses (not with belady either).
     * fork_attention: ResidualAttention's extra time, added to every forked request's latency
     * (n_layers 0, the default: not charged). residual_unified (shared and auto): the residual
     * tree has no pool of its own; its blocks live in base blocks it borrows from the kv_tokens
     * cache (kv_dim / lora_rank residual blocks each; residual_tokens is then ignored), evicted in
     * one LRU order with the base, never outliving their base (cache/residual_cache.h). */
    SimLoraCache lora_cache;
    SimForkAttention fork_attention;
    bool residual_unified;
    int auto_cost;          /* auto's model: 0/4 the server's (forkkv_cost.h), 2 the corrected saving alone, 1 issue 36's first; 5/6 per context (sim_forkkv.h) */
    int residual_tokens;
    int lora_rank;
    int kv_dim;
    /* Runs kv_cache_check on every pool after each request and at the end (then also that no block
     * is left in use); a failure ends the replay with an error. For tests: it walks the trees. */
    bool check_invariants;
    /* Cache directives (sim_directives.h): a trace whose lines carry "directives" replays on token
     * ids and applies them; ignore_directives replays the same trace with none (the "off" arm).
     * pin_budget_tokens: pinned tokens a tenant may hold (0 = a quarter of kv_tokens, braid serve's default). */
    bool ignore_directives;
    int pin_budget_tokens;
} SimConfig;

/* One request as the replay served it (SimResult.timeline[i] is trace request i). */
typedef struct {
    double t;                 /* arrival time in the trace (s) */
    int prompt_tokens, cached_tokens, host_cached_tokens; /* cached includes the host-tier part */
    int reused_tokens;        /* segment reuse */
    double ttft_s, latency_s; /* modeled */
} SimRequestRow;

typedef struct {
    char *agent;
    int requests;
    double mean_ttft_s;
} SimAgentStats;

typedef struct {
    int requests, too_large;  /* too_large: needed more blocks than the whole cache */
    uint64_t prompt_tokens, cached_tokens, evicted_blocks;
    uint64_t segment_reused_tokens; /* prompt tokens past the cached prefix taken from reused segments */
    /* the cache's near-duplicate counters (KvCacheCounters.segment_lsh_*) */
    uint64_t segment_lsh_candidates, segment_lsh_admitted, segment_lsh_rejected, segment_lsh_reused_tokens, segment_lsh_refused_full;
    /* cached_tokens = device_cached_tokens + host_cached_tokens (loaded back before the forward); in
     * shared LoRA mode these two are the base tree's match, and cached_tokens is min(base, residual) */
    uint64_t device_cached_tokens, host_cached_tokens;
    uint64_t demoted_blocks, loaded_blocks, stored_blocks, host_evicted_blocks;
    double copy_s;            /* modeled time spent copying between tiers (in modeled_latency_s) */
    /* prefetch: blocks loaded ahead, of them acquired by a later request (device hits), and evicted
     * from the device again unused; their copy time (idle time, not in modeled_latency_s) */
    uint64_t prefetched_blocks, prefetch_hit_blocks, prefetch_wasted_blocks;
    uint64_t prefetch_displaced_blocks; /* aggressive prefetch: active device blocks evicted for it */
    double prefetch_copy_s;
    uint64_t predicted_calls, correct_next; /* step-1 top-1 accuracy of the forecasts, as they happened */
    uint64_t uses_over_bound; /* KvCacheCounters.uses_over_bound: 0 while every node counted all its active workflows */
    double modeled_latency_s; /* sum over requests */
    double mean_ttft_s;
    double hit_rate;          /* cached prompt tokens / prompt tokens */
    int workflows, workflow_ends;
    double mean_workflow_latency_s;
    SimAgentStats *agents;    /* in order of first appearance */
    int n_agents;
    SimRequestRow *timeline;  /* with SimConfig.timeline: n_timeline rows, trace order; else NULL */
    int n_timeline;
    uint64_t computed_tokens; /* prompt tokens prefilled: prompt - cached - segment-reused */
    /* ForkKV, summed over requests. base_hit: b, the base tree's match (separate mode: cached_tokens).
     * For adapted requests in shared mode: residual_hit r, the residual tree's match; cached is
     * min(b, r); fork max(0, b - r) (base inherited, residual computed); partial max(0, r - b)
     * (residual survived its evicted base, which is recomputed). */
    uint64_t base_hit_tokens, residual_hit_tokens, fork_tokens, partial_tokens;
    uint64_t residual_evicted_blocks;
    /* forked requests (shared, or auto's choice) and auto's separate adapted requests; the
     * ResidualAttention time charged to the forked ones (in modeled_latency_s) */
    int forked_requests, separate_adapted_requests;
    double fork_attention_s;
    int adapters;             /* distinct adapters in the trace */
    /* Blocks that adapted requests put into an adapter's own tree (separate: the cache; shared: the
     * residual tree). With a cache that never evicts this is what the adapters keep cached. */
    uint64_t adapter_blocks_inserted;
    SimMemoryPeaks peaks;     /* pool occupancy peaks and the bytes a token of each pool takes */
    int invariant_checks;     /* SimConfig.check_invariants: checks passed */
    /* Directives: what they did. Tokens copied by a splice or from a shared prefix count as hits:
     * cached_tokens = device_cached_tokens + host_cached_tokens + directives.spliced_tokens +
     * directives.shared_tokens (of requests admitted with their copies). */
    SimDirectiveStats directives;
} SimResult;

SimConfig sim_config_default(void);
/* In the replay's trees a block is two int32 "tokens": the two halves of its chained hash. */
enum { SIM_TOKENS_PER_BLOCK = 2 };
void sim_hash_tokens(const uint64_t *blocks, int n, int32_t *out);
/* The residual pool's size in tokens the replay uses (0 in separate mode). */
int sim_config_residual_tokens(const SimConfig *cfg);
/* Fills result (release it with sim_result_free, also after an error). */
int sim_run(const Trace *trace, const SimConfig *cfg, SimResult *result, BraidError *err);
void sim_result_free(SimResult *result);

#endif
