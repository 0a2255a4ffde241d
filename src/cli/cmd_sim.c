/* braid sim — replays a trace through the cache code with a cost model; no model is loaded. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cache/evict_policy.h"
#include "common/timeutil.h"
#include "model/gguf.h"
#include "model/token_canon.h"
#include "model/tokenizer.h"
#include "cli/sim_cluster_report.h"
#include "cli/sim_tenants_report.h"
#include "sim/simulator.h"
#include "sim/trace.h"

static const char sim_usage[] =
    "usage: braid sim --trace PATH --kv-tokens N [--host-kv-tokens H] [--policy NAME] [--block-size B]\n"
    "                 [--prefill-ms-per-token X] [--decode-ms-per-token Y] [--host-gbs G]\n"
    "                 [--host-latency-us L] [--kv-bytes-per-token K] [--predictor FILE | --markov 1|2]\n"
    "                 [--predictor-learn] [--forecast-run-cap] [--horizon K | --pbkv-k K] [--pbkv-gamma G]\n"
    "                 [--pbkv-future on|off] [--prediction-noise L]\n"
    "                 [--cache-outputs] [--prefetch [--prefetch-blocks N] [--prefetch-mode conservative|aggressive] [--prefetch-rho R]]\n"
    "                 [--timeline FILE] [--hidden FILE] [--segment-reuse off|exact|approx [--approx-window W] [--model GGUF]]\n"
    "                 [--segment-lsh on|anywhere|off [--segment-tau-seg T] [--segment-tau-ctx T]]\n"
    "                 [--directives on|off] [--pin-budget TOKENS]\n"
    "                 [--lora-cache separate|shared|auto [--residual-tokens N] [--lora-rank R] [--kv-dim D]\n"
    "                  [--residual-attention none|cpu|RHO_D:RHO_P] [--residual-pool fixed|unified]]\n"
    "                 [--instances N [--router cost|cache|balanced|round-robin] [--moves on|off] [--link-gbps G]\n"
    "                  [--link-latency-us L] [--route-slack S] [--max-batch-tokens T] [--max-running R] [--step-ms S]\n"
    "                  [--move-timeout S] [--cluster-replay batch|fifo] [--router-prefill-tps R] [--router-link-gbps G]\n"
    "                  [--closed-loop] [--admit-output off|auto|N] [--model-layers L]\n"
    "                  [--router-lender-parts P]]\n"
    "                 [--tenants [--max-batch-tokens T] [--max-running R] [--fair-step-tokens F] [--step-ms S]] [--json]\n"
    "  Replays the trace (docs/TRACE_FORMAT.md) through Braid's KV cache object (the one the server\n"
    "  runs) in arrival order, one request at a time, with a device cache of N tokens.\n"
    "  --host-kv-tokens: a host-memory tier of H tokens below the device cache: evicted blocks are\n"
    "            demoted there and loaded back on a hit (default 0: off)\n"
    "  --policy: a registered eviction policy (braid batch --list-policies; default lru), or belady,\n"
    "            which evicts the block used farthest in the future: the offline bound for any policy\n"
    "  --predictor FILE: a next-agent predictor trained by braid train-predictor, for the policies that\n"
    "            take predictions (pbkv, kvflow); without it a Markov predictor (--markov 1|2, default 1)\n"
    "            learns online from the trace as it replays. --predictor-learn keeps a trained one learning.\n"
    "  --forecast-run-cap: forecast another agent once an agent's run of calls is as long as its previous\n"
    "            run in the workflow (rounds that never grow, as factcheck's retrieval; default off)\n"
    "  --horizon, --pbkv-k: prediction steps K, PBKV's lookahead (default 4; 1 to 64)\n"
    "  --pbkv-gamma: PBKV's lookahead discount gamma in (0, 1]: step s of a forecast weighs gamma^(s-1)\n"
    "            (default 0.7, the paper's); only with --policy pbkv\n"
    "  --pbkv-future on|off: PBKV's one read for the workflows still to come on a prompt at least half of\n"
    "            the active workflows read (an agent's head; default on); off: Eq. 2 alone; only with --policy pbkv\n"
    "  --prediction-noise: the PBKV paper's App. E noise injection, L in [0, 1]: every forecast step reaches\n"
    "            the policy as (1 - L) P + L U, U uniform over the agents (default 0; 1 = no information)\n"
    "  --hidden FILE: the requests' prefill hidden states (braid batch --hidden-out), for a graph predictor\n"
    "            trained with them (traces from braid serve carry them inline)\n"
    "  --prefetch: PBKV's conservative prefetch: between two requests (the idle time before the next\n"
    "            arrival; the replay has no decode steps) load the host-tier blocks the policy expects the\n"
    "            next calls to use into free device blocks, never evicting for them (pbkv; needs a host tier).\n"
    "            Their copies are on no request's TTFT; reported as prefetched / used / wasted blocks.\n"
    "            --prefetch-blocks N: at most N blocks per gap (the live S_bw per step; default: no cap)\n"
    "            --prefetch-mode aggressive: the paper's App. E variant: beyond free blocks and retired cache,\n"
    "            each gap may also evict active cache, lowest lookahead score first, up to R x the device\n"
    "            (--prefetch-rho R in (0, 1], default 0.2, the paper's best; R alone selects aggressive),\n"
    "            and prefetched blocks keep their score. Default conservative.\n"
    "  --cache-outputs: also cache each request's generated blocks (unique to it), as the live engine\n"
    "            does; by default only prompt blocks are cached\n"
    "  --timeline FILE: write one JSON line per request in trace order (after a header line with the\n"
    "            policy and sizes): arrival time t, id, workflow, agent, prompt_tokens, cached_tokens,\n"
    "            host_cached_tokens, modeled ttft_s and latency_s. braid-bench plot draws such files\n"
    "            (hit rate over time, one line per file)\n"
    "  --segment-reuse: reuse chunks of cached prompts at other offsets, as braid serve does (exact: same\n"
    "            left context only; approx: also chunks whose last --approx-window tokens (default 64) match).\n"
    "            Needs a trace with token ids (braid-bench gen / braid batch --trace-tokens) and the model's\n"
    "            tokenizer for the chunker's anchors (--model, default $BRAID_MODEL or the default model); a\n"
    "            reused token costs no prefill in the model. Not with belady.\n"
    "  --approx-prefix on|off: approx mode: take approximate K/V earlier requests committed through the\n"
    "            prefix cache (on, default) or stop the prefix match at the first approximate block (off),\n"
    "            as braid serve --approx-prefix\n"
    "  --directives on|off: a trace whose lines carry \"directives\" (pin, unpin, decay, evict, share, splice;\n"
    "            docs/TRACE_FORMAT.md) replays on token ids and applies them as braid serve does (on, the\n"
    "            default); off replays the same trace without them. Tokens a splice or a shared prefix copies\n"
    "            count as hits. --pin-budget: pinned tokens per tenant (default a quarter of --kv-tokens)\n"
    "  --segment-lsh on|anywhere|off: with --segment-reuse approx, also near-duplicate chunks found by\n"
    "            MinHash/LSH over canonical token text (default off); only their equal tokens are reused; on:\n"
    "            only past a request's first approximate span, anywhere: also before it. --segment-tau-seg\n"
    "            / --segment-tau-ctx: least estimated Jaccard of the chunk / of its 64-token left context (0.5)\n"
    "  --lora-cache: how requests with a LoRA adapter cache K/V (ForkKV, paper 002 § 5). separate (default):\n"
    "            the cache is keyed by (tenant, adapter), so adapters never share blocks. shared: the cache holds\n"
    "            base K/V keyed by tenant alone, shared by every adapter, and each adapted request also keeps\n"
    "            its residual (x·A, rank R) in a residual pool of --residual-tokens N tokens (default 2x\n"
    "            --kv-tokens) with its own LRU. A request computes from min(base hit, residual hit) and writes\n"
    "            each part past its own hit; reports base / residual hits, fork tokens (base hit, residual\n"
    "            computed), partial tokens (residual hit, base recomputed) and peak memory of both pools.\n"
    "            Needs token ids in the trace (--trace-tokens); not with --segment-reuse. auto: shared's pools, and\n"
    "            each adapted request forks or keeps a separate copy by the server's --lora-cache auto cost model\n"
    "            (attention penalty vs regret-priced memory saving; not with belady)\n"
    "  --auto-cost: 4 (default: the server's model, with what each choice recomputes now), 2 (the corrected saving alone),\n"
    "            1 (issue 36's first) or 3 (1, other adapters' copies in held); 5: 4's terms decided per context (one choice\n"
    "            for every adapter reading a shared prefix, kept with hysteresis), 6: 5 per (context, adapter)\n"
    "  --residual-pool: fixed (default: a pool of --residual-tokens of its own) or unified (residuals live in\n"
    "                  base blocks borrowed from --kv-tokens, one LRU order, never outliving their base)\n"
    "  --residual-attention: ResidualAttention's extra time on every forked request's modeled latency: none\n"
    "            (default), cpu (the committed CPU probe: 3.14x decode, 1.58x prefill over 72.2 / 50.6 ns a slot\n"
    "            and layer, 30 layers) or RHO_D:RHO_P (those plain costs, these ratios)\n"
    "  --lora-rank, --kv-dim: size a residual token at --kv-bytes-per-token x R / D bytes (defaults 16 and\n"
    "            192, SmolLM2-135M's 3 KV heads x 64: 1920 of 23040 bytes, a per-agent memory ratio of 12)\n"
    "  --block-size: cache block size, a multiple of the trace's (default: the trace's)\n"
    "  --prefill-ms-per-token, --decode-ms-per-token: the cost model (defaults: the 2-core CPU's\n"
    "            2.5 and 10 ms)\n"
    "  --host-gbs, --host-latency-us, --kv-bytes-per-token: the cost of copying blocks between the\n"
    "            tiers, added to the TTFT of the request that moves them (defaults: 14 GB/s and 1 us,\n"
    "            the CPU backend's block loads measured by bench_cache_ops on the 2-core dev machine,\n"
    "            and 23040 bytes: SmolLM2-135M in fp16)\n"
    "  --instances N: a cluster of N instances, each with a --kv-tokens cache (LRU; batch: any --policy, a policy\n"
    "            that takes predictions getting each call's forecast at dispatch from --predictor as serve's\n"
    "            coordinator sends it, and a --host-kv-tokens\n"
    "            host tier, counted in the router's view of its capacity as the coordinator does), the\n"
    "            live router (--router cost, the default: the smallest estimated time to first token =\n"
    "            queue ahead + prefill of what the instance lacks + moving in what another holds; the\n"
    "            baselines: cache, longest cached prefix within --route-slack S requests of the least\n"
    "            loaded, default 8; balanced: the least loaded, ties to the one caching the most; or\n"
    "            round-robin) fed by the caches' events, and KV block moves between\n"
    "            instances (--moves on, the default) over a link of --link-gbps G\n"
    "            (default 10) and --link-latency-us L a move (default 20: RDMA between nodes) when moving is\n"
    "            cheaper than recomputing. Each instance runs the live scheduler step by step (--cluster-replay\n"
    "            batch, the default): continuous batching, chunked prefill in steps of --max-batch-tokens T (default\n"
    "            512), at most --max-running R sequences (default 64); a step costs --step-ms S (default 8) + the\n"
    "            prefill cost x its prompt tokens + (the decode cost - S) x its decoding sequences, and its blocks\n"
    "            reach the cache and the router when it ends. --cluster-replay fifo: one request at a time (the\n"
    "            replay before batching, for comparison). A busy lender answers a move between two layers of its step\n"
    "            (batch: at the next of --model-layers L equal parts of the step, default 30, SmolLM2-135M's; 1: between\n"
    "            steps; the router prices the lender so, or by --router-lender-parts P parts of a step, as a coordinator\n"
    "            that priced it otherwise), between its engine steps in fifo (the rest of its prefill, at\n"
    "            most T tokens). A request routed to an instance while a move toward it has not landed, sharing more\n"
    "            blocks with that move's request than the instance holds, waits for the move's end (batch), as serve's\n"
    "            leader holds it. A move that takes --move-timeout S (default 5;\n"
    "            0: never) fails and its blocks are computed, as serve's do. --router-prefill-tps R, --router-link-gbps G:\n"
    "            the cost router's starting rates, as serve's --move-prefill-tps / --move-gbps (default: the replay's\n"
    "            own; the batch replay's router learns from the replay's TTFTs as the live one does). --closed-loop (batch):\n"
    "            the trace's workflows are sent as braid-bench run's client sent them: as many at once as it ran\n"
    "            (the workflows started before the first one ended), the next when one has ended, each stage when the\n"
    "            one before it answered in the replay; for traces recorded live (braid-bench run)\n"
    "            --route-log PATH (batch): one JSON line per request as it finishes (instance, lender, cached and moved\n"
    "            tokens, TTFT), to set the replay's placements beside a live run's events\n"
    "            --admit-output off|auto|N (batch): each instance's scheduler admits as serve --admit-output does: a\n"
    "            request only when the pool keeps room for the expected rest of every running request's output and its\n"
    "            own (min(max_tokens, E) each; auto: E = the mean output finished so far; N: E = N; off, the default:\n"
    "            on the prompt alone). The replay's max_tokens is the trace's output length\n"
    "            Reports prompt tokens by origin (local cache, moved in, computed), moves, modeled latency\n"
    "            (mean, p50, p99), TTFT (mean, p99) and wait, and the busiest instance's share. Not with --policy other than lru,\n"
    "            --segment-reuse, --lora-cache shared or --prefetch\n"
    "  --tenants: how tenants share one instance: the trace's requests arrive at their times and run\n"
    "            through the live scheduler with continuous batching (chunked prefill in steps of --max-batch-tokens\n"
    "            T, default 512; at most --max-running R, default 64), three ways: each tenant alone, all first come\n"
    "            first served, and all with weighted fair sharing (braid serve --fair-share on, with\n"
    "            --fair-step-tokens F, default 64; a line's \"weight\" is its tenant's weight). A step costs\n"
    "            --step-ms S (default 8) + --prefill-ms-per-token x its prompt tokens + --decode-ms-per-token x its\n"
    "            decoding sequences (defaults here 2.5 and 0.7: the 2-core CPU). Reports each tenant's median\n"
    "            latency per arm and its slowdown against alone, and completion tokens per modeled second of\n"
    "            both shared arms. Not with --instances\n"
    "  Reports hit rate, evictions, modeled latency per workflow (critical path of its stages) and\n"
    "  mean modeled TTFT per agent. --json prints one JSON object as the last line.\n";

/* Bytes of a number of blocks of one pool. */
static double pool_bytes(const SimMemoryPeaks *p, int blocks, bool residual) {
    return (double)blocks * p->block_size * (residual ? p->residual_bytes_per_token : p->base_bytes_per_token);
}

/* What the adapters wrote into their own trees (separate: full K/V; shared: residuals), in bytes. */
static double adapter_bytes(const SimConfig *cfg, const SimResult *r) {
    return (double)r->adapter_blocks_inserted * r->peaks.block_size *
           (cfg->lora_cache == SIM_LORA_SHARED ? r->peaks.residual_bytes_per_token : r->peaks.base_bytes_per_token);
}

static void print_forkkv_text(const SimConfig *cfg, const SimResult *r) {
    const SimMemoryPeaks *p = &r->peaks;
    fprintf(stderr, "[sim] lora-cache shared (rank %d, KV width %d: %.0f + %.0f bytes a token): base pool %d tokens, residual pool %d "
                    "tokens; %llu computed of %llu prompt tokens; base hits %llu, residual hits %llu, fork %llu, partial %llu tokens; "
                    "%llu residual blocks evicted; peak base %d blocks (%.1f MB), residual %d blocks (%.1f MB), both %.1f MB; "
                    "%d adapters wrote %.1f MB of residuals; per-agent memory ratio kv_dim / rank = %.2f\n",
            cfg->lora_rank, cfg->kv_dim, p->base_bytes_per_token, p->residual_bytes_per_token, cfg->kv_tokens,
            sim_config_residual_tokens(cfg), (unsigned long long)r->computed_tokens, (unsigned long long)r->prompt_tokens,
            (unsigned long long)r->base_hit_tokens, (unsigned long long)r->residual_hit_tokens, (unsigned long long)r->fork_tokens,
            (unsigned long long)r->partial_tokens, (unsigned long long)r->residual_evicted_blocks, p->base_blocks,
            pool_bytes(p, p->base_blocks, false) / 1e6, p->residual_blocks, pool_bytes(p, p->residual_blocks, true) / 1e6,
            p->kv_bytes / 1e6, r->adapters, adapter_bytes(cfg, r) / 1e6, (double)cfg->kv_dim / cfg->lora_rank);
}

static void print_text(const SimConfig *cfg, const SimResult *r, double elapsed) {
    fprintf(stderr, "[sim] %d requests in %d workflows, policy %s, %d-token cache + %d-token host tier: hit rate %.1f%% "
                    "(device %llu + host %llu of %llu prompt tokens), %llu blocks evicted, %llu demoted, %llu loaded back, "
                    "%llu host evictions, mean workflow latency %.2f s, mean TTFT %.1f ms (copies %.3f s)%s (replayed in %.3f s)\n",
            r->requests, r->workflows, cfg->policy, cfg->kv_tokens, cfg->host_kv_tokens, 100 * r->hit_rate,
            (unsigned long long)r->device_cached_tokens, (unsigned long long)r->host_cached_tokens, (unsigned long long)r->prompt_tokens,
            (unsigned long long)r->evicted_blocks, (unsigned long long)r->demoted_blocks, (unsigned long long)r->loaded_blocks,
            (unsigned long long)r->host_evicted_blocks, r->mean_workflow_latency_s, 1e3 * r->mean_ttft_s, r->copy_s,
            r->too_large ? ", some requests larger than the cache" : "", elapsed);
    if (cfg->segment_reuse)
        fprintf(stderr, "[sim] segment reuse %s (window %d): %llu prompt tokens reused past the cached prefix (%.1f%% of prompt "
                        "tokens); prefill skipped in all: %.1f%%\n",
                segment_reuse_name((SegmentReuseMode)cfg->segment_reuse), cfg->approx_window,
                (unsigned long long)r->segment_reused_tokens, r->prompt_tokens ? 100.0 * r->segment_reused_tokens / r->prompt_tokens : 0.0,
                r->prompt_tokens ? 100.0 * (r->cached_tokens + r->segment_reused_tokens) / r->prompt_tokens : 0.0);
    if (cfg->segment_reuse && cfg->segment_lsh)
        fprintf(stderr, "[sim] near-duplicate segments (LSH): %llu chunks with candidates, %llu admitted, %llu rejected, %llu "
                        "tokens reused, %llu chunks refused with the index full\n",
                (unsigned long long)r->segment_lsh_candidates, (unsigned long long)r->segment_lsh_admitted,
                (unsigned long long)r->segment_lsh_rejected, (unsigned long long)r->segment_lsh_reused_tokens,
                (unsigned long long)r->segment_lsh_refused_full);
    if (cfg->lora_cache != SIM_LORA_SEPARATE) print_forkkv_text(cfg, r);
    if (r->directives.requests > 0 || cfg->ignore_directives) sim_directives_print(&r->directives, r->prompt_tokens, cfg->ignore_directives);
    if (cfg->lora_cache != SIM_LORA_SEPARATE)
        fprintf(stderr, "[sim] lora-cache %s: %d adapted requests forked, %d on a separate cache; ResidualAttention charged %.2f s\n",
                sim_lora_cache_name(cfg->lora_cache), r->forked_requests, r->separate_adapted_requests, r->fork_attention_s);
    if (cfg->prefetch)
        fprintf(stderr, "[sim] prefetch (%s): %llu blocks prefetched between requests, %llu used by a request (device hits), "
                        "%llu evicted unused (copies %.3f s of idle time), %llu active blocks displaced for it\n",
                cfg->prefetch_rho > 0 ? "aggressive" : "conservative", (unsigned long long)r->prefetched_blocks,
                (unsigned long long)r->prefetch_hit_blocks, (unsigned long long)r->prefetch_wasted_blocks, r->prefetch_copy_s,
                (unsigned long long)r->prefetch_displaced_blocks);
    if (r->predicted_calls)
        fprintf(stderr, "[sim] next-agent forecasts: %llu of %llu calls predicted right at step 1 (%.1f%%)\n",
                (unsigned long long)r->correct_next, (unsigned long long)r->predicted_calls, 100.0 * r->correct_next / r->predicted_calls);
    for (int a = 0; a < r->n_agents; a++)
        fprintf(stderr, "[sim]   agent %-16s %6d requests, mean TTFT %8.1f ms\n", r->agents[a].agent[0] ? r->agents[a].agent : "(none)",
                r->agents[a].requests, 1e3 * r->agents[a].mean_ttft_s);
}

/* The ForkKV fields (braid sim --lora-cache); in separate mode base_hit_tokens = cached_tokens and
 * the residual figures are 0. */
static json_t *forkkv_json(const SimConfig *cfg, const SimResult *r) {
    const SimMemoryPeaks *p = &r->peaks;
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I}", "lora_cache", sim_lora_cache_name(cfg->lora_cache),
                          "residual_tokens", sim_config_residual_tokens(cfg), "lora_rank", cfg->lora_rank, "kv_dim", cfg->kv_dim,
                          "computed_tokens", (json_int_t)r->computed_tokens, "base_hit_tokens", (json_int_t)r->base_hit_tokens,
                          "residual_hit_tokens", (json_int_t)r->residual_hit_tokens, "fork_tokens", (json_int_t)r->fork_tokens,
                          "partial_tokens", (json_int_t)r->partial_tokens, "residual_evicted_blocks",
                          (json_int_t)r->residual_evicted_blocks);
    json_t *mem = json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:i, s:I, s:f, s:f}", "peak_base_blocks", p->base_blocks,
                            "peak_base_in_use_blocks", p->base_in_use_blocks, "peak_residual_blocks", p->residual_blocks,
                            "peak_residual_in_use_blocks", p->residual_in_use_blocks, "peak_base_bytes",
                            pool_bytes(p, p->base_blocks, false), "peak_residual_bytes", pool_bytes(p, p->residual_blocks, true),
                            "peak_kv_bytes", p->kv_bytes, "base_bytes_per_token", p->base_bytes_per_token, "residual_bytes_per_token",
                            p->residual_bytes_per_token, "adapters", r->adapters, "adapter_blocks_inserted",
                            (json_int_t)r->adapter_blocks_inserted, "adapter_bytes", adapter_bytes(cfg, r), "memory_ratio_computed",
                            (double)cfg->kv_dim / cfg->lora_rank);
    if (o && mem) json_object_update(o, mem);
    json_decref(mem);
    json_t *choice = json_pack("{s:i, s:i, s:f, s:s}", "forked_requests", r->forked_requests, "separate_adapted_requests",
                               r->separate_adapted_requests, "fork_attention_s", r->fork_attention_s, "residual_pool",
                               cfg->residual_unified ? "unified" : "fixed");
    if (o && choice) json_object_update(o, choice);
    json_decref(choice);
    return o;
}

static void print_json(const SimConfig *cfg, const SimResult *r) {
    json_t *agents = json_object();
    for (int a = 0; a < r->n_agents; a++)
        json_object_set_new(agents, r->agents[a].agent, json_pack("{s:i, s:f}", "requests", r->agents[a].requests, "mean_ttft_s",
                                                                  r->agents[a].mean_ttft_s));
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:I, s:I, s:f, s:I, s:f, s:f, s:f, s:i, s:o}", "policy", cfg->policy,
                          "kv_tokens", cfg->kv_tokens, "requests", r->requests, "workflows", r->workflows, "workflow_ends",
                          r->workflow_ends, "prompt_tokens", (json_int_t)r->prompt_tokens, "cached_tokens",
                          (json_int_t)r->cached_tokens, "hit_rate", r->hit_rate, "evictions", (json_int_t)r->evicted_blocks,
                          "modeled_latency_s", r->modeled_latency_s, "mean_workflow_latency_s", r->mean_workflow_latency_s,
                          "mean_ttft_s", r->mean_ttft_s, "too_large", r->too_large, "agent_ttft_s", agents);
    json_t *tiers = json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I}", "host_kv_tokens", cfg->host_kv_tokens, "device_cached_tokens",
                              (json_int_t)r->device_cached_tokens, "host_cached_tokens", (json_int_t)r->host_cached_tokens,
                              "demoted_blocks", (json_int_t)r->demoted_blocks, "loaded_blocks", (json_int_t)r->loaded_blocks,
                              "stored_blocks", (json_int_t)r->stored_blocks, "host_evicted_blocks", (json_int_t)r->host_evicted_blocks,
                              "copy_s", r->copy_s, "predicted_calls", (json_int_t)r->predicted_calls, "correct_next",
                              (json_int_t)r->correct_next);
    if (o && tiers) json_object_update(o, tiers);
    json_decref(tiers);
    json_t *pf = json_pack("{s:b, s:I, s:I, s:I, s:f, s:f, s:I}", "prefetch", cfg->prefetch, "prefetched_blocks", (json_int_t)r->prefetched_blocks,
                           "prefetch_hit_blocks", (json_int_t)r->prefetch_hit_blocks, "prefetch_wasted_blocks",
                           (json_int_t)r->prefetch_wasted_blocks, "prefetch_copy_s", r->prefetch_copy_s, "prediction_noise",
                           cfg->prediction_noise, "uses_over_bound", (json_int_t)r->uses_over_bound);
    if (o && pf) json_object_update(o, pf);
    json_decref(pf);
    json_t *pfa = json_pack("{s:s, s:f, s:I}", "prefetch_mode", cfg->prefetch_rho > 0 ? "aggressive" : "conservative", "prefetch_rho",
                            cfg->prefetch_rho, "prefetch_displaced_blocks", (json_int_t)r->prefetch_displaced_blocks);
    if (o && pfa) json_object_update(o, pfa);
    json_decref(pfa);
    json_t *seg = json_pack("{s:s, s:i, s:I}", "segment_reuse", segment_reuse_name((SegmentReuseMode)cfg->segment_reuse), "approx_window",
                            cfg->approx_window, "segment_reused_tokens", (json_int_t)r->segment_reused_tokens);
    if (o && seg) json_object_update(o, seg);
    json_decref(seg);
    json_t *lsh = json_pack("{s:b, s:b, s:f, s:f, s:I, s:I, s:I, s:I, s:I}", "segment_lsh", cfg->segment_lsh,
                            "segment_lsh_anywhere", cfg->segment_lsh_anywhere, "segment_tau_seg",
                            cfg->segment_tau_seg, "segment_tau_ctx", cfg->segment_tau_ctx, "segment_lsh_candidates",
                            (json_int_t)r->segment_lsh_candidates, "segment_lsh_admitted", (json_int_t)r->segment_lsh_admitted,
                            "segment_lsh_rejected", (json_int_t)r->segment_lsh_rejected, "segment_lsh_reused_tokens",
                            (json_int_t)r->segment_lsh_reused_tokens, "segment_lsh_refused_full", (json_int_t)r->segment_lsh_refused_full);
    if (o && lsh) json_object_update(o, lsh);
    json_decref(lsh);
    json_t *fork = forkkv_json(cfg, r);
    if (o && fork) json_object_update(o, fork);
    json_decref(fork);
    if (o && (r->directives.requests > 0 || cfg->ignore_directives))
        json_object_set_new(o, "directives", sim_directives_json(&r->directives, cfg->ignore_directives));
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    printf("%s\n", line ? line : "{\"error\":\"out of memory\"}");
    free(line);
    json_decref(o);
}

/* The per-request rows of --timeline as JSONL: a header, then one line per trace request. */
static int write_timeline(const char *path, const SimConfig *cfg, const Trace *t, const SimResult *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "braid sim: cannot write --timeline %s\n", path);
        return -1;
    }
    json_t *h = json_pack("{s:s, s:s, s:i, s:i, s:b}", "type", "sim_timeline", "policy", cfg->policy, "kv_tokens", cfg->kv_tokens,
                          "host_kv_tokens", cfg->host_kv_tokens, "prefetch", cfg->prefetch);
    int rc = h && json_dumpf(h, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF ? 0 : -1;
    json_decref(h);
    for (int i = 0; rc == 0 && i < r->n_timeline; i++) {
        const SimRequestRow *row = &r->timeline[i];
        const TraceRequest *q = &t->reqs[i];
        json_t *o = json_pack("{s:s, s:f, s:s, s:s, s:s, s:i, s:i, s:i, s:f, s:f}", "type", "request", "t", row->t, "id", q->id,
                              "workflow", q->workflow, "agent", q->agent, "prompt_tokens", row->prompt_tokens, "cached_tokens",
                              row->cached_tokens, "host_cached_tokens", row->host_cached_tokens, "ttft_s", row->ttft_s, "latency_s",
                              row->latency_s);
        rc = o && json_dumpf(o, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF ? 0 : -1;
        json_decref(o);
    }
    if (fclose(f) != 0) rc = -1;
    if (rc) fprintf(stderr, "braid sim: error writing --timeline %s\n", path);
    return rc;
}

int cmd_sim(int argc, char **argv) {
    /* Long-option codes: one list, starting above every short option's character code. */
    enum { O_TRACE = 256, O_KV, O_POLICY, O_PREFILL, O_DECODE, O_JSON, O_BLOCK, O_HOST, O_GBS, O_LAT, O_BPT, O_PRED, O_MARKOV,
           O_LEARN, O_RUN_CAP, O_OUTPUTS, O_HORIZON, O_PREFETCH, O_TIMELINE, O_HIDDEN, O_SEGMENTS, O_WINDOW, O_APPROX_PREFIX, O_MODEL,
           O_NOISE, O_LORA_CACHE, O_RESIDUAL, O_RES_ATTN, O_RES_POOL, O_AUTO_COST, O_RANK, O_KV_DIM, O_INSTANCES, O_ROUTER, O_MOVES, O_LINK_GBPS,
           O_LINK_LAT, O_SLACK, O_MOVE_TIMEOUT, O_GAMMA, O_PBKV_FUTURE, O_PBKV_K, O_PREFETCH_BLOCKS, O_PREFETCH_MODE, O_PREFETCH_RHO,
           O_TENANTS, O_MBT, O_RUNNING, O_FAIR_STEP, O_STEP_MS, O_SEG_LSH, O_TAU_SEG, O_TAU_CTX, O_DIRECTIVES, O_PIN_BUDGET,
           O_CLUSTER_REPLAY, O_ROUTER_TPS, O_ROUTER_GBPS, O_CLOSED_LOOP, O_ROUTE_LOG, O_ADMIT_OUTPUT, O_MODEL_LAYERS, O_ROUTER_PARTS };
    static const struct option opts[] = {
        {"trace", required_argument, 0, O_TRACE}, {"kv-tokens", required_argument, 0, O_KV},
        {"policy", required_argument, 0, O_POLICY}, {"prefill-ms-per-token", required_argument, 0, O_PREFILL},
        {"decode-ms-per-token", required_argument, 0, O_DECODE}, {"json", no_argument, 0, O_JSON},
        {"block-size", required_argument, 0, O_BLOCK}, {"host-kv-tokens", required_argument, 0, O_HOST},
        {"host-gbs", required_argument, 0, O_GBS}, {"host-latency-us", required_argument, 0, O_LAT},
        {"kv-bytes-per-token", required_argument, 0, O_BPT}, {"predictor", required_argument, 0, O_PRED},
        {"markov", required_argument, 0, O_MARKOV}, {"predictor-learn", no_argument, 0, O_LEARN},
        {"forecast-run-cap", no_argument, 0, O_RUN_CAP},
        {"horizon", required_argument, 0, O_HORIZON}, {"cache-outputs", no_argument, 0, O_OUTPUTS},
        {"prefetch", no_argument, 0, O_PREFETCH}, {"timeline", required_argument, 0, O_TIMELINE},
        {"hidden", required_argument, 0, O_HIDDEN}, {"segment-reuse", required_argument, 0, O_SEGMENTS},
        {"approx-window", required_argument, 0, O_WINDOW}, {"model", required_argument, 0, O_MODEL},
        {"approx-prefix", required_argument, 0, O_APPROX_PREFIX},
        {"prediction-noise", required_argument, 0, O_NOISE}, {"lora-cache", required_argument, 0, O_LORA_CACHE},
        {"residual-tokens", required_argument, 0, O_RESIDUAL}, {"residual-attention", required_argument, 0, O_RES_ATTN}, {"residual-pool", required_argument, 0, O_RES_POOL}, {"auto-cost", required_argument, 0, O_AUTO_COST}, {"lora-rank", required_argument, 0, O_RANK},
        {"kv-dim", required_argument, 0, O_KV_DIM}, {"instances", required_argument, 0, O_INSTANCES},
        {"router", required_argument, 0, O_ROUTER}, {"moves", required_argument, 0, O_MOVES},
        {"link-gbps", required_argument, 0, O_LINK_GBPS}, {"link-latency-us", required_argument, 0, O_LINK_LAT},
        {"route-slack", required_argument, 0, O_SLACK}, {"move-timeout", required_argument, 0, O_MOVE_TIMEOUT},
        {"pbkv-gamma", required_argument, 0, O_GAMMA}, {"pbkv-k", required_argument, 0, O_PBKV_K},
        {"pbkv-future", required_argument, 0, O_PBKV_FUTURE},
        {"prefetch-blocks", required_argument, 0, O_PREFETCH_BLOCKS},
        {"prefetch-mode", required_argument, 0, O_PREFETCH_MODE}, {"prefetch-rho", required_argument, 0, O_PREFETCH_RHO},
        {"tenants", no_argument, 0, O_TENANTS}, {"max-batch-tokens", required_argument, 0, O_MBT},
        {"max-running", required_argument, 0, O_RUNNING}, {"fair-step-tokens", required_argument, 0, O_FAIR_STEP},
        {"step-ms", required_argument, 0, O_STEP_MS}, {"cluster-replay", required_argument, 0, O_CLUSTER_REPLAY},
        {"router-prefill-tps", required_argument, 0, O_ROUTER_TPS}, {"router-link-gbps", required_argument, 0, O_ROUTER_GBPS},
        {"closed-loop", no_argument, 0, O_CLOSED_LOOP}, {"route-log", required_argument, 0, O_ROUTE_LOG},
        {"admit-output", required_argument, 0, O_ADMIT_OUTPUT}, {"model-layers", required_argument, 0, O_MODEL_LAYERS},
        {"router-lender-parts", required_argument, 0, O_ROUTER_PARTS},
        {"segment-lsh", required_argument, 0, O_SEG_LSH}, {"segment-tau-seg", required_argument, 0, O_TAU_SEG},
        {"segment-tau-ctx", required_argument, 0, O_TAU_CTX},
        {"directives", required_argument, 0, O_DIRECTIVES}, {"pin-budget", required_argument, 0, O_PIN_BUDGET},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    SimConfig cfg = sim_config_default();
    SimClusterConfig cluster = sim_cluster_config_default();
    bool cluster_mode = false, tenants_mode = false, have_decode = false;
    SimTenantsConfig tenants = sim_tenants_config_default();
    const char *route_log_path = NULL;
    const char *trace_path = NULL, *timeline_path = NULL, *hidden_path = NULL, *model_path = NULL, *prefetch_mode = NULL;
    SegmentReuseMode segment_mode = SEGMENT_REUSE_OFF;
    cfg.approx_window = CLI_DEFAULT_APPROX_WINDOW;
    int json = 0, have_kv = 0, c, block_size = 0;
    long v;
    double d;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_TRACE: trace_path = optarg; break;
        case O_KV: if (cli_parse_int("--kv-tokens", optarg, 1, 1L << 30, &v)) return 2; cfg.kv_tokens = (int)v; have_kv = 1; break;
        case O_POLICY:
            if (strcmp(optarg, "belady") && !evict_policy_find(optarg)) {
                fprintf(stderr, "braid sim: unknown --policy '%s' (belady or one of: ", optarg);
                const EvictPolicy *const *all;
                int n = evict_policy_list(&all);
                for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", all[i]->name);
                fprintf(stderr, ")\n");
                return 2;
            }
            cfg.policy = optarg;
            break;
        case O_PREFILL: if (cli_parse_float("--prefill-ms-per-token", optarg, 0, 1e6, &d)) return 2; cfg.prefill_s_per_token = d / 1e3; break;
        case O_DECODE: if (cli_parse_float("--decode-ms-per-token", optarg, 0, 1e6, &d)) return 2; cfg.decode_s_per_token = d / 1e3, have_decode = true; break;
        case O_JSON: json = 1; break;
        case O_HOST: if (cli_parse_int("--host-kv-tokens", optarg, 0, 1L << 30, &v)) return 2; cfg.host_kv_tokens = (int)v; break;
        case O_GBS: if (cli_parse_float("--host-gbs", optarg, 1e-3, 1e6, &d)) return 2; cfg.host_bandwidth_bytes_per_s = d * 1e9; break;
        case O_LAT: if (cli_parse_float("--host-latency-us", optarg, 0, 1e9, &d)) return 2; cfg.host_latency_s = d / 1e6; break;
        case O_BPT: if (cli_parse_float("--kv-bytes-per-token", optarg, 1, 1e12, &d)) return 2; cfg.kv_bytes_per_token = d; break;
        case O_PRED: cfg.predictor_path = optarg; break;
        case O_MARKOV: if (cli_parse_int("--markov", optarg, 1, 2, &v)) return 2; cfg.predictor_kind = (int)v; break;
        case O_LEARN: cfg.predictor_learn = true; break;
        case O_RUN_CAP: cfg.forecast_run_cap = true; break;
        case O_OUTPUTS: cfg.cache_outputs = true; break;
        case O_PREFETCH: cfg.prefetch = true; break;
        case O_TIMELINE: timeline_path = optarg; cfg.timeline = true; break;
        case O_HIDDEN: hidden_path = optarg; break;
        case O_SEGMENTS: if (cli_parse_segment_reuse("sim", optarg, &segment_mode, true)) return 2; cfg.segment_reuse = (int)segment_mode; break;
        case O_WINDOW: if (cli_parse_int("--approx-window", optarg, 0, 1 << 20, &v)) return 2; cfg.approx_window = (int)v; break;
        case O_APPROX_PREFIX:
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0) {
                fprintf(stderr, "braid sim: --approx-prefix expects on or off, got '%s'\n", optarg);
                return 2;
            }
            cfg.no_approx_prefix = strcmp(optarg, "off") == 0;
            break;
        case O_MODEL: model_path = optarg; break;
        case O_HORIZON: if (cli_parse_int("--horizon", optarg, 1, 64, &v)) return 2; cfg.horizon = (int)v; break;
        case O_PBKV_K: if (cli_parse_int("--pbkv-k", optarg, 1, 64, &v)) return 2; cfg.horizon = (int)v; break;
        case O_GAMMA: if (cli_parse_pbkv_gamma("sim", optarg, &cfg.pbkv_gamma, true)) return 2; break;
        case O_PBKV_FUTURE: if (cli_parse_pbkv_future("sim", optarg, &cfg.pbkv_future, true)) return 2; break;
        case O_PREFETCH_BLOCKS:
            if (cli_parse_int("--prefetch-blocks", optarg, 1, 1 << 30, &v)) return 2;
            cfg.prefetch_max_blocks = (int)v;
            break;
        case O_NOISE: if (cli_parse_float("--prediction-noise", optarg, 0, 1, &d)) return 2; cfg.prediction_noise = d; break;
        case O_PREFETCH_MODE:
            if (strcmp(optarg, "conservative") && strcmp(optarg, "aggressive")) {
                fprintf(stderr, "braid sim: --prefetch-mode expects conservative or aggressive, got '%s'\n", optarg);
                return 2;
            }
            prefetch_mode = optarg;
            break;
        case O_PREFETCH_RHO:
            if (cli_parse_float("--prefetch-rho", optarg, 0, 1, &d)) return 2;
            if (!(d > 0)) {
                fprintf(stderr, "braid sim: --prefetch-rho must be above 0 (conservative prefetch displaces nothing)\n");
                return 2;
            }
            cfg.prefetch_rho = d;
            break;
        case O_LORA_CACHE:
            if (sim_lora_cache_parse(optarg) < 0) {
                fprintf(stderr, "braid sim: unknown --lora-cache '%s' (separate, shared or auto)\n", optarg);
                return 2;
            }
            cfg.lora_cache = (SimLoraCache)sim_lora_cache_parse(optarg);
            break;
        case O_RES_ATTN:
            if (sim_fork_attention_parse(optarg, &cfg.fork_attention)) {
                fprintf(stderr, "braid sim: --residual-attention '%s': none, cpu or RHO_D:RHO_P (ratios above 0)\n", optarg);
                return 2;
            }
            break;
        case O_AUTO_COST: if (cli_parse_int("--auto-cost", optarg, 1, 6, &v)) return 2; cfg.auto_cost = (int)v; break;
        case O_RES_POOL:
            if (strcmp(optarg, "fixed") != 0 && strcmp(optarg, "unified") != 0) {
                fprintf(stderr, "braid sim: --residual-pool '%s': fixed or unified\n", optarg);
                return 2;
            }
            cfg.residual_unified = strcmp(optarg, "unified") == 0;
            break;
        case O_RESIDUAL: if (cli_parse_int("--residual-tokens", optarg, 1, 1L << 30, &v)) return 2; cfg.residual_tokens = (int)v; break;
        case O_RANK: if (cli_parse_int("--lora-rank", optarg, 1, 1 << 16, &v)) return 2; cfg.lora_rank = (int)v; break;
        case O_KV_DIM: if (cli_parse_int("--kv-dim", optarg, 1, 1 << 20, &v)) return 2; cfg.kv_dim = (int)v; break;
        case O_DIRECTIVES:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "braid sim: --directives takes on or off, not '%s'\n", optarg);
                return 2;
            }
            cfg.ignore_directives = strcmp(optarg, "off") == 0;
            break;
        case O_PIN_BUDGET: if (cli_parse_int("--pin-budget", optarg, 1, 1L << 30, &v)) return 2; cfg.pin_budget_tokens = (int)v; break;
        case O_BLOCK: if (cli_parse_int("--block-size", optarg, 1, 1 << 16, &v)) return 2; block_size = (int)v; break;
        case O_INSTANCES:
            if (cli_parse_int("--instances", optarg, 1, 4096, &v)) return 2;
            cluster.n_instances = (int)v, cluster_mode = true;
            break;
        case O_ROUTER:
            if (sim_route_parse(optarg) < 0) {
                fprintf(stderr, "braid sim: --router expects cost, cache, balanced or round-robin, got '%s'\n", optarg);
                return 2;
            }
            cluster.route = (SimRoute)sim_route_parse(optarg);
            break;
        case O_MOVES:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "braid sim: --moves expects on or off, got '%s'\n", optarg);
                return 2;
            }
            cluster.moves = strcmp(optarg, "on") == 0;
            break;
        case O_LINK_GBPS: if (cli_parse_float("--link-gbps", optarg, 1e-6, 1e6, &d)) return 2; cluster.link_bytes_per_s = d * 1e9; break;
        case O_LINK_LAT: if (cli_parse_float("--link-latency-us", optarg, 0, 1e9, &d)) return 2; cluster.link_latency_s = d / 1e6; break;
        case O_SLACK: if (cli_parse_int("--route-slack", optarg, 0, 1 << 20, &v)) return 2; cluster.load_slack = (int)v; break;
        case O_TENANTS: tenants_mode = true; break;
        case O_MBT: if (cli_parse_int("--max-batch-tokens", optarg, 1, 1 << 20, &v)) return 2; tenants.max_batch_tokens = (int)v; cluster.lender_step_tokens = (int)v; break;
        case O_MOVE_TIMEOUT: if (cli_parse_float("--move-timeout", optarg, 0, 3600, &d)) return 2; cluster.move_timeout_s = d; break;
        case O_RUNNING: if (cli_parse_int("--max-running", optarg, 1, 1 << 16, &v)) return 2; tenants.max_running = (int)v; cluster.max_running = (int)v; break;
        case O_FAIR_STEP: if (cli_parse_int("--fair-step-tokens", optarg, 1, 1 << 20, &v)) return 2; tenants.fair_step_tokens = (int)v; break;
        case O_STEP_MS: if (cli_parse_float("--step-ms", optarg, 0, 1e6, &d)) return 2; tenants.step_s = d / 1e3; cluster.step_s = d / 1e3; break;
        case O_ROUTER_TPS: if (cli_parse_float("--router-prefill-tps", optarg, 1e-3, 1e12, &d)) return 2; cluster.router_prefill_tps = d; break;
        case O_ROUTER_GBPS: if (cli_parse_float("--router-link-gbps", optarg, 1e-6, 1e6, &d)) return 2; cluster.router_link_bytes_per_s = d * 1e9; break;
        case O_CLOSED_LOOP: cluster.closed_loop = true; break;
        case O_ROUTE_LOG: route_log_path = optarg; break;
        case O_ADMIT_OUTPUT: if (cli_parse_admit_output("sim", optarg, &cluster.admit_output, true)) return 2; break;
        case O_MODEL_LAYERS: if (cli_parse_int("--model-layers", optarg, 1, 1 << 12, &v)) return 2; cluster.n_layers = (int)v; break;
        case O_ROUTER_PARTS: if (cli_parse_int("--router-lender-parts", optarg, 1, 1 << 12, &v)) return 2; cluster.router_lender_parts = (int)v; break;
        case O_CLUSTER_REPLAY:
            if (sim_cluster_replay_parse(optarg) < 0) {
                fprintf(stderr, "braid sim: --cluster-replay must be batch or fifo (got '%s')\n", optarg);
                return 2;
            }
            cluster.replay = (SimClusterReplay)sim_cluster_replay_parse(optarg);
            break;
        case O_SEG_LSH:
            if (strcmp(optarg, "on") && strcmp(optarg, "off") && strcmp(optarg, "anywhere")) {
                fprintf(stderr, "braid sim: --segment-lsh takes on, anywhere or off, not '%s'\n", optarg);
                return 2;
            }
            cfg.segment_lsh = strcmp(optarg, "off") != 0;
            cfg.segment_lsh_anywhere = strcmp(optarg, "anywhere") == 0;
            break;
        case O_TAU_SEG: if (cli_parse_float("--segment-tau-seg", optarg, 0, 1, &d)) return 2; cfg.segment_tau_seg = d; break;
        case O_TAU_CTX: if (cli_parse_float("--segment-tau-ctx", optarg, 0, 1, &d)) return 2; cfg.segment_tau_ctx = d; break;
        case 'h': fputs(sim_usage, stdout); return 0;
        default: fputs(sim_usage, stderr); return 2;
        }
    }
    if (!trace_path || !have_kv) {
        fprintf(stderr, "braid sim: --trace and --kv-tokens are required\n%s", sim_usage);
        return 2;
    }
    if (tenants_mode && cluster_mode) {
        fprintf(stderr, "braid sim: --tenants replays one instance; not with --instances\n");
        return 2;
    }
    /* (the batch replay runs the live scheduler, so any registered policy; the fifo replay is LRU's) */
    bool cluster_policy_ok = !strcmp(cfg.policy, "lru") || (cluster.replay == SIM_REPLAY_BATCH && evict_policy_find(cfg.policy));
    if (cluster_mode && ((cfg.host_kv_tokens > 0 && cluster.replay == SIM_REPLAY_FIFO) || !cluster_policy_ok || cfg.segment_reuse ||
                         cfg.lora_cache != SIM_LORA_SEPARATE || cfg.prefetch)) {
        fprintf(stderr, "braid sim: --instances takes no --segment-reuse, --lora-cache shared or --prefetch; "
                        "--policy other than lru and --host-kv-tokens with --cluster-replay batch only, belady never\n");
        return 2;
    }
    const EvictPolicy *policy = evict_policy_find(cfg.policy);
    if (cfg.pbkv_gamma > 0 && policy != &evict_policy_pbkv) {
        fprintf(stderr, "braid sim: --pbkv-gamma applies to --policy pbkv only (the policy is %s)\n", cfg.policy);
        return 2;
    }
    if (cfg.pbkv_future != 0 && policy != &evict_policy_pbkv) {
        fprintf(stderr, "braid sim: --pbkv-future applies to --policy pbkv only (the policy is %s)\n", cfg.policy);
        return 2;
    }
    if (prefetch_mode && !strcmp(prefetch_mode, "conservative") && cfg.prefetch_rho > 0) {
        fprintf(stderr, "braid sim: --prefetch-rho is the aggressive mode's; not with --prefetch-mode conservative\n");
        return 2;
    }
    if (prefetch_mode && !strcmp(prefetch_mode, "aggressive") && cfg.prefetch_rho == 0) cfg.prefetch_rho = SIM_DEFAULT_PREFETCH_RHO;
    if ((prefetch_mode || cfg.prefetch_rho > 0) && !cfg.prefetch) {
        fprintf(stderr, "braid sim: --prefetch-mode and --prefetch-rho shape --prefetch, which is off\n");
        return 2;
    }
    if (cfg.prefetch_max_blocks > 0 && !cfg.prefetch) {
        fprintf(stderr, "braid sim: --prefetch-blocks caps --prefetch, which is off\n");
        return 2;
    }
    if (cfg.prefetch && (!policy || !policy->prefetch_value)) {
        fprintf(stderr, "braid sim: --prefetch needs a policy that values host-tier blocks (pbkv); %s does not\n", cfg.policy);
        return 2;
    }
    if (cfg.prefetch && cfg.host_kv_tokens <= 0) fprintf(stderr, "braid sim: --prefetch does nothing without --host-kv-tokens\n");
    if (cfg.lora_cache != SIM_LORA_SEPARATE && cfg.segment_reuse) {
        fprintf(stderr, "braid sim: --lora-cache shared/auto does not model --segment-reuse; use one or the other\n");
        return 2;
    }
    if (cfg.residual_tokens && cfg.lora_cache == SIM_LORA_SEPARATE)
        fprintf(stderr, "braid sim: --residual-tokens does nothing without --lora-cache shared\n");
    Trace trace;
    BraidError err;
    if (trace_load(trace_path, &trace, &err)) {
        fprintf(stderr, "braid sim: %s\n", err.msg);
        return 1;
    }
    int matched = 0;
    if (hidden_path && trace_attach_hidden(&trace, hidden_path, &matched, &err)) {
        fprintf(stderr, "braid sim: %s\n", err.msg);
        trace_free(&trace);
        return 1;
    }
    if (hidden_path) fprintf(stderr, "[sim] hidden states for %d of %d requests\n", matched, trace.n);
    if (block_size && (trace.block_size == 0 || block_size % trace.block_size)) {
        fprintf(stderr, "braid sim: --block-size %d must be a multiple of the trace's block size %d\n", block_size, trace.block_size);
        trace_free(&trace);
        return 2;
    }
    if (block_size) trace_coarsen_blocks(&trace, block_size / trace.block_size, &err);
    if ((tenants_mode || cluster_mode) && sim_trace_has_directives(&trace)) {
        fprintf(stderr, "braid sim: --%s does not model cache directives, and the trace carries them; replay it without --%s\n",
                tenants_mode ? "tenants" : "instances", tenants_mode ? "tenants" : "instances");
        trace_free(&trace);
        return 2;
    }
    GgufFile *gguf = NULL;
    Tokenizer tok = {0};
    int32_t *canon = NULL; /* --segment-lsh: the tokenizer's canonical classes */
    if (cfg.segment_reuse) {
        if (gguf_open(cli_model_path(model_path), &gguf, &err) || tokenizer_load(gguf, &tok, &err)) {
            fprintf(stderr, "braid sim: --segment-reuse reads the chunker's anchors from the tokenizer: %s\n", err.msg);
            gguf_close(gguf);
            trace_free(&trace);
            return 1;
        }
        cfg.anchor_tokens = tok.special_ids;
        cfg.n_anchor_tokens = tok.n_special;
        if (cfg.segment_lsh) {
            if (token_canon_build(&tok, &canon, &err)) {
                fprintf(stderr, "braid sim: --segment-lsh: %s\n", err.msg);
                tokenizer_free(&tok);
                gguf_close(gguf);
                trace_free(&trace);
                return 1;
            }
            cfg.segment_canon = canon;
            cfg.n_segment_canon = tok.n_vocab;
        }
    }
    if (tenants_mode) {
        tenants.kv_tokens = cfg.kv_tokens;
        tenants.prefill_s_per_token = cfg.prefill_s_per_token;
        if (have_decode) tenants.decode_s_per_token = cfg.decode_s_per_token;
        int trc = sim_tenants_report(&trace, &tenants, json);
        trace_free(&trace);
        return trc;
    }
    if (cluster_mode) {
        cluster.kv_tokens = cfg.kv_tokens;
        cluster.host_kv_tokens = cfg.host_kv_tokens;
        if (route_log_path && !(cluster.route_log = fopen(route_log_path, "w"))) {
            fprintf(stderr, "braid sim: --route-log %s: %s\n", route_log_path, strerror(errno));
            trace_free(&trace);
            return 1;
        }
        cluster.prefill_s_per_token = cfg.prefill_s_per_token;
        cluster.decode_s_per_token = cfg.decode_s_per_token;
        cluster.kv_bytes_per_token = cfg.kv_bytes_per_token;
        cluster.policy = evict_policy_find(cfg.policy);
        cluster.policy_options.gamma = cfg.pbkv_gamma;
        cluster.policy_options.future = cfg.pbkv_future;
        cluster.predictor_path = cfg.predictor_path;
        cluster.predictor_kind = cfg.predictor_kind;
        cluster.predictor_learn = cfg.predictor_learn;
        cluster.forecast_run_cap = cfg.forecast_run_cap;
        cluster.horizon = cfg.horizon;
        int crc = sim_cluster_report(&trace, &cluster, json);
        if (cluster.route_log && fclose(cluster.route_log)) {
            fprintf(stderr, "braid sim: --route-log %s: %s\n", route_log_path, strerror(errno));
            crc = 1;
        }
        trace_free(&trace);
        return crc;
    }
    SimResult r;
    double t0 = braid_now_seconds();
    int rc = sim_run(&trace, &cfg, &r, &err);
    double elapsed = braid_now_seconds() - t0;
    if (rc) fprintf(stderr, "braid sim: %s\n", err.msg);
    else {
        print_text(&cfg, &r, elapsed);
        if (json) print_json(&cfg, &r);
        if (timeline_path && write_timeline(timeline_path, &cfg, &trace, &r)) rc = -1;
    }
    sim_result_free(&r);
    trace_free(&trace);
    free(canon);
    if (gguf) {
        tokenizer_free(&tok);
        gguf_close(gguf);
    }
    return rc ? 1 : 0;
}
