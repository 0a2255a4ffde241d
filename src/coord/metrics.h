/*
 * metrics.h — the coordinator's metrics registry, rendered for `GET /metrics` in the Prometheus
 * text exposition format (version 0.0.4).
 *
 * Owns: every counter, gauge and histogram the coordinator exports (request outcomes and latencies,
 * token totals, in-flight/queued/rejected requests, the latest per-instance stats reported by the
 * worker leaders, and the model name). The braid_ families are Braid's own; alongside them the
 * vLLM-named families (`vllm:*`, one `engine` label per instance plus `model_name`, vLLM's types and
 * buckets) that routers and dashboards built for vLLM scrape.
 *
 * Callers: the HTTP threads record each finished request (metrics_record_request) and rejections;
 * the coordinator's MPI thread stores the absolute counters each instance leader sends
 * (metrics_set_instance); the `/metrics` handler calls metrics_render.
 *
 * Thread-safety: every function except create/destroy may be called from any thread concurrently.
 * One mutex guards the registry; recording holds it for a few arithmetic operations only, and
 * rendering copies a snapshot under the lock and formats it after releasing it, so a slow scrape
 * never stalls the request path. metrics_destroy must not race with any other call.
 *
 * Memory: metrics_create copies model_name; metrics_render returns a malloc'd NUL-terminated string
 * the caller frees. Label tables are fixed-size: at most METRICS_MAX_ENDPOINTS distinct endpoints
 * and METRICS_MAX_STATUS_PAIRS distinct (endpoint, status) pairs are tracked; beyond that, requests
 * are folded into the endpoint label METRICS_OVERFLOW_LABEL (status "0" for the pair table) so
 * memory stays bounded whatever callers pass.
 */
#ifndef BRAID_COORD_METRICS_H
#define BRAID_COORD_METRICS_H

enum {
    METRICS_LABEL_MAX = 32,        /* endpoint labels are truncated to this many bytes */
    METRICS_MAX_ENDPOINTS = 16,    /* distinct endpoint labels (latency/TTFT histograms) */
    METRICS_MAX_STATUS_PAIRS = 64, /* distinct (endpoint, status) pairs in braid_requests_total */
};

/* Endpoint label that absorbs requests once a label table is full. */
#define METRICS_OVERFLOW_LABEL "_other"

typedef struct Metrics Metrics; /* opaque */

/* n_instances: worker instances, labelled instance="0".."n-1" (negative is treated as 0).
 * model_name may be NULL (rendered as ""). Returns NULL on out of memory. */
Metrics *metrics_create(int n_instances, const char *model_name);
void metrics_destroy(Metrics *m);

/* One finished HTTP request. endpoint: "chat" or "completions" (others are labelled as given,
 * truncated to METRICS_LABEL_MAX bytes; NULL reads as "unknown"); status: HTTP status code; latency
 * and ttft in seconds (ttft < 0 = none, e.g. an error; only 2xx requests feed the TTFT histogram);
 * prompt/cached/completion token counts (negative counts read as 0). A negative or non-finite
 * latency is recorded as 0 so one bad clock reading cannot poison the sum. */
void metrics_record_request(Metrics *m, const char *endpoint, int status, double latency_s, double ttft_s,
                            int prompt_tokens, int cached_tokens, int completion_tokens);

/* Why a generation ended, as vllm:request_success_total's finished_reason label spells it. */
typedef enum {
    METRICS_FINISHED_STOP = 0, /* EOS, a stop string or a tool call */
    METRICS_FINISHED_LENGTH,   /* max_tokens or the context */
    METRICS_FINISHED_ABORT,    /* cancelled: the client went away */
    METRICS_FINISHED_ERROR,
    METRICS_FINISHED_N
} MetricsFinishedReason;

/* One finished generation (one choice of a request) on the instance that ran it, for the vLLM
 * families: vllm:request_success_total, vllm:e2e_request_latency_seconds,
 * vllm:time_to_first_token_seconds (ttft_s < 0: no token), vllm:inter_token_latency_seconds and
 * vllm:time_per_output_token_seconds (decode_s: first token to last, over generation_tokens - 1
 * gaps). An instance outside [0, n_instances) (never dispatched) is ignored. */
typedef struct {
    int instance;
    int finished_reason; /* MetricsFinishedReason */
    double e2e_s, ttft_s, decode_s;
    int generation_tokens;
} MetricsGeneration;
void metrics_record_generation(Metrics *m, const MetricsGeneration *g);

/* Latest absolute values from instance i (sent periodically by its leader): replace, don't add.
 * Counters per cache tier, never ratios: prompt tokens at first admission are device hits + host
 * hits + computed. Rendered per instance (instance="i") and, for the cache families, summed over
 * the instances (braid_prompt_tokens_cached_total{tier=...}, braid_kv_*). */
typedef struct {
    int waiting, running; /* queue depth and running sequences now */
    int pool_used_blocks, pool_total_blocks; /* device tier: blocks held by requests, usable blocks */
    int host_used_blocks, host_total_blocks; /* host tier: blocks holding KV, usable blocks (0 = off) */
    unsigned long long cached_prompt_tokens_device, cached_prompt_tokens_host, computed_prompt_tokens;
    unsigned long long demoted_blocks, loaded_blocks, host_evicted_blocks, device_evicted_blocks;
    unsigned long long preemptions, generated_tokens;
    unsigned long long prefetched_blocks, prefetch_hit_blocks, prefetch_wasted_blocks;
    unsigned long long segment_reused_tokens, segment_candidates, segments_exact, segments_approx;
    unsigned long long segments_rejected_context, segments_rejected_window, segment_flops_saved;
    unsigned long long directive_requests, pins, pin_expired_blocks, pin_revoked_blocks, spliced_tokens, shared_hit_tokens,
        directive_evicted_blocks;
    int pinned_blocks; /* gauge */
    int residual_used_blocks, residual_total_blocks; /* ForkKV residual pool (gauges; 0 when off) */
    unsigned long long residual_hit_tokens, fork_tokens, partial_hit_tokens, residual_evicted_blocks;
    /* KV block moves between instances (worker/kv_moves.h). */
    unsigned long long moved_in_blocks, moved_in_bytes, move_failures, lent_blocks;
    unsigned long long move_declines; /* planned moves that ended without a read or a fault */
    unsigned long long move_followers; /* requests that waited behind a move in flight to their instance */
    /* Approximate segment guards: LSH near-duplicate candidates / admissions / tokens; probes by result. */
    unsigned long long segment_lsh_candidates, segment_lsh_admitted, segment_lsh_reused_tokens;
    unsigned long long segment_probes_ok, segment_probes_rejected;
} InstanceStats;

/* Stores a copy of *s for instance `instance`. The index comes from an MPI peer, so an index out
 * of [0, n_instances) or a NULL s is logged and ignored rather than trusted. */
void metrics_set_instance(Metrics *m, int instance, const InstanceStats *s);

/* Instance i has nothing left to run (the coordinator saw its last request finish): its waiting,
 * running and held-blocks gauges drop to 0 at once instead of at its next stats report, so a
 * scrape right after a burst does not show requests that are gone. Counters are kept. Same index
 * checks as metrics_set_instance. */
void metrics_instance_idle(Metrics *m, int instance);

/* Instance i died: braid_instance_up{instance="i"} drops to 0, braid_instances_alive by one,
 * braid_instance_failures_total grows by one (once per instance), its gauges of work in flight drop
 * to 0 and later stats for it are ignored. Counters are kept. Same index checks as above. */
void metrics_instance_down(Metrics *m, int instance);
/* Instance i came back (--restart-instances) and is ready: braid_instance_up{instance="i"} is 1
 * again and braid_instance_restarts_total grows by one. Same index checks as above. */
void metrics_instance_restarted(Metrics *m, int instance);
/* A restarted instance's re-warm finished (warm_start.h): braid_instance_rewarms_total grows by
 * one, braid_instance_rewarm_heads_total by the heads prefilled on it and
 * braid_instance_rewarm_prompt_tokens_total by their prompt tokens. Same index checks as above. */
void metrics_count_rewarm(Metrics *m, int instance, int heads, long long prompt_tokens);

/* Coordinator-side gauges: requests accepted but not finished (braid_requests_inflight), and
 * requests waiting in the coordinator's own queue (braid_requests_queued). */
void metrics_set_inflight(Metrics *m, int inflight);
void metrics_set_queued(Metrics *m, int queued);

/* The coordinator's content-hash registry (the router's per-instance block indexes, summed):
 * hashes held, bytes allocated, and hashes evicted to stay within the bound (block_index.h). */
typedef struct {
    unsigned long long blocks, bytes, evicted;
} RegistryMetrics;
void metrics_set_registry(Metrics *m, const RegistryMetrics *r);

/* The coordinator's workflow forecasts (src/predict/workflow_forecast.h), absolute values:
 * workflows active now in the tracker, forecasts sent to the instances (one per call, whatever the
 * number of instances), and the online top-1 accuracy of each forecast's first step as counts
 * (calls the previous forecast predicted, and those it got right). */
typedef struct {
    int workflows_active;
    unsigned long long forecasts_sent, step1_correct, step1_total;
} WorkflowMetrics;
void metrics_set_workflows(Metrics *m, const WorkflowMetrics *w);

/* Lines rendered verbatim at the end of every scrape: whole families (HELP, TYPE, samples), each
 * line ending in '\n', that do not change while serving (e.g. braid_rank_binding_info, which
 * `braid serve` sets at start-up). Copies text; NULL clears it. Returns 0, or -1 on out of memory
 * (the previous text stays). */
int metrics_set_static_text(Metrics *m, const char *text);

/* Requests rejected with 429 because the queue was full. */
void metrics_count_rejected(Metrics *m);
/* One request the coordinator's progress watchdog answered 500 (braid_requests_watchdog_total). */
void metrics_count_watchdog(Metrics *m);
/* The start-up warm start's outcome (braid_warm_start_heads_total{outcome=warmed|refused|left_out}
 * and braid_warm_start_lines_skipped_total{reason=...}, reasons as manifest_heads.h counts them). */
typedef struct {
    long long warmed, refused, left_out;
    long long skipped_invalid, skipped_vocab, skipped_stale, skipped_tenant;
} WarmStartMetrics;
void metrics_set_warm_start(Metrics *m, const WarmStartMetrics *w);

/* Renders the Prometheus text exposition format (version 0.0.4) into a malloc'd NUL-terminated
 * string; caller frees. NULL on out of memory. */
char *metrics_render(Metrics *m);

#endif
