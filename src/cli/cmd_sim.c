/* braid sim — replays a trace through the cache code with a cost model; no model is loaded. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "common/timeutil.h"
#include "simulator.h"
#include "trace.h"

static const char sim_usage[] =
    "usage: braid sim --trace PATH --kv-tokens N [--policy lru|belady] [--prefill-ms-per-token X]\n"
    "                 [--decode-ms-per-token Y] [--json]\n"
    "  Replays the trace (docs/TRACE_FORMAT.md) through Braid's block pool and radix cache in arrival\n"
    "  order, one request at a time, with a cache of N tokens (block size from the trace).\n"
    "  belady evicts the block used farthest in the future: the offline bound for any policy.\n"
    "  --json prints one JSON object as the last line.\n";

int cmd_sim(int argc, char **argv) {
    enum { O_TRACE = 256, O_KV, O_POLICY, O_PREFILL, O_DECODE, O_JSON };
    static const struct option opts[] = {
        {"trace", required_argument, 0, O_TRACE}, {"kv-tokens", required_argument, 0, O_KV},
        {"policy", required_argument, 0, O_POLICY}, {"prefill-ms-per-token", required_argument, 0, O_PREFILL},
        {"decode-ms-per-token", required_argument, 0, O_DECODE}, {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    SimConfig cfg = sim_config_default();
    const char *trace_path = NULL;
    int json = 0, have_kv = 0, c;
    long v;
    double d;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_TRACE: trace_path = optarg; break;
        case O_KV: if (cli_parse_int("--kv-tokens", optarg, 1, 1L << 30, &v)) return 2; cfg.kv_tokens = (int)v; have_kv = 1; break;
        case O_POLICY:
            if (strcmp(optarg, "lru") && strcmp(optarg, "belady")) {
                fprintf(stderr, "braid sim: --policy expects lru or belady, got '%s'\n", optarg);
                return 2;
            }
            cfg.policy = optarg;
            break;
        case O_PREFILL: if (cli_parse_float("--prefill-ms-per-token", optarg, 0, 1e6, &d)) return 2; cfg.prefill_s_per_token = d / 1e3; break;
        case O_DECODE: if (cli_parse_float("--decode-ms-per-token", optarg, 0, 1e6, &d)) return 2; cfg.decode_s_per_token = d / 1e3; break;
        case O_JSON: json = 1; break;
        case 'h': fputs(sim_usage, stdout); return 0;
        default: fputs(sim_usage, stderr); return 2;
        }
    }
    if (!trace_path || !have_kv) {
        fprintf(stderr, "braid sim: --trace and --kv-tokens are required\n%s", sim_usage);
        return 2;
    }
    Trace trace;
    BraidError err;
    if (trace_load(trace_path, &trace, &err)) {
        fprintf(stderr, "braid sim: %s\n", err.msg);
        return 1;
    }
    SimResult r;
    double t0 = braid_now_seconds();
    int rc = sim_run(&trace, &cfg, &r, &err);
    double elapsed = braid_now_seconds() - t0;
    if (rc) fprintf(stderr, "braid sim: %s\n", err.msg);
    else {
        fprintf(stderr, "[sim] %d requests, policy %s, %d-token cache: hit rate %.1f%%, %llu blocks evicted, modeled latency %.2f s, "
                        "mean TTFT %.1f ms%s (replayed in %.3f s)\n",
                r.requests, cfg.policy, cfg.kv_tokens, 100 * r.hit_rate, (unsigned long long)r.evicted_blocks, r.modeled_latency_s,
                1e3 * r.mean_ttft_s, r.too_large ? ", some requests larger than the cache" : "", elapsed);
        if (json)
            printf("{\"policy\":\"%s\",\"kv_tokens\":%d,\"requests\":%d,\"prompt_tokens\":%llu,\"cached_tokens\":%llu,"
                   "\"hit_rate\":%.6f,\"evictions\":%llu,\"modeled_latency_s\":%.6f,\"mean_ttft_s\":%.6f,\"too_large\":%d}\n",
                   cfg.policy, cfg.kv_tokens, r.requests, (unsigned long long)r.prompt_tokens, (unsigned long long)r.cached_tokens,
                   r.hit_rate, (unsigned long long)r.evicted_blocks, r.modeled_latency_s, r.mean_ttft_s, r.too_large);
    }
    trace_free(&trace);
    return rc ? 1 : 0;
}
