#include "cli/sim_cluster_report.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/timeutil.h"

int sim_cluster_report(const Trace *trace, const SimClusterConfig *cfg, bool json) {
    SimClusterResult r;
    BraidError err;
    double t0 = braid_now_seconds();
    if (sim_cluster_run(trace, cfg, &r, &err)) {
        fprintf(stderr, "braid sim: %s\n", err.msg);
        return 1;
    }
    double p = r.prompt_tokens ? (double)r.prompt_tokens : 1;
    printf("cluster: %d instances x %d tokens, router %s, moves %s (link %.1f GB/s, %.0f us), %s\n", cfg->n_instances, cfg->kv_tokens,
           sim_route_name(cfg->route), cfg->moves ? "on" : "off", cfg->link_bytes_per_s / 1e9, cfg->link_latency_s * 1e6,
           cfg->replay == SIM_REPLAY_FIFO ? "one request at a time per instance (fifo)" : "batching instances");
    if (cfg->replay == SIM_REPLAY_BATCH)
        printf("steps %llu (at most %d tokens; --max-batch-tokens %d, --max-running %d, %.1f ms a step); preemptions %llu\n",
               (unsigned long long)r.steps, r.max_step_tokens, cfg->lender_step_tokens, cfg->max_running, cfg->step_s * 1e3,
               (unsigned long long)r.preemptions);
    printf("requests %d (%d larger than an instance's cache); prompt tokens %llu: local %.1f%%, moved in %.1f%%, computed %.1f%%\n",
           r.requests, r.too_large, (unsigned long long)r.prompt_tokens, 100 * r.local_tokens / p, 100 * r.remote_tokens / p,
           100 * r.computed_tokens / p);
    if (r.move_failures) printf("moves that failed (the lender busy past --move-timeout %.1f s; their blocks computed): %llu\n", cfg->move_timeout_s,
                                (unsigned long long)r.move_failures);
    printf("moves %llu (%llu blocks, %.1f MiB); modeled latency mean %.3f s, p50 %.3f s, p99 %.3f s (wait %.3f s, move %.4f s); "
           "TTFT mean %.3f s, p99 %.3f s; busiest instance %.1f%% of requests; span %.1f s; replayed in %.2f s\n",
           (unsigned long long)r.moves, (unsigned long long)r.moved_blocks, r.moved_bytes / (1 << 20), r.mean_latency_s, r.p50_latency_s,
           r.p99_latency_s, r.mean_wait_s, r.mean_move_s, r.mean_ttft_s, r.p99_ttft_s, 100 * r.max_share, r.span_s,
           braid_now_seconds() - t0);
    if (json) {
        json_t *o = json_pack("{s:i, s:s, s:b, s:i, s:I, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "instances",
                              cfg->n_instances, "router", sim_route_name(cfg->route), "moves", cfg->moves,
                              "requests", r.requests, "prompt_tokens", (json_int_t)r.prompt_tokens, "local_hit", r.local_tokens / p,
                              "remote_hit", r.remote_tokens / p, "computed", r.computed_tokens / p, "moves_made", (json_int_t)r.moves,
                              "moved_blocks", (json_int_t)r.moved_blocks, "moved_bytes", r.moved_bytes, "mean_latency_s",
                              r.mean_latency_s, "mean_wait_s", r.mean_wait_s, "mean_move_s", r.mean_move_s, "max_share", r.max_share,
                              "span_s", r.span_s);
        if (o) {
            json_object_set_new(o, "computed_tokens", json_integer((json_int_t)r.computed_tokens));
            json_object_set_new(o, "p50_latency_s", json_real(r.p50_latency_s));
            json_object_set_new(o, "p99_latency_s", json_real(r.p99_latency_s));
            json_object_set_new(o, "mean_ttft_s", json_real(r.mean_ttft_s));
            json_object_set_new(o, "p99_ttft_s", json_real(r.p99_ttft_s));
            json_object_set_new(o, "link_gbps", json_real(cfg->link_bytes_per_s / 1e9));
            json_object_set_new(o, "move_failures", json_integer((json_int_t)r.move_failures));
            json_object_set_new(o, "replay", json_string(cfg->replay == SIM_REPLAY_FIFO ? "fifo" : "batch"));
            json_object_set_new(o, "steps", json_integer((json_int_t)r.steps));
            json_object_set_new(o, "preemptions", json_integer((json_int_t)r.preemptions));
            json_object_set_new(o, "import_waits", json_integer((json_int_t)r.import_waits));
            json_object_set_new(o, "model_layers", json_integer(cfg->n_layers));
        }
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (s) puts(s);
        free(s);
        json_decref(o);
    }
    return 0;
}
