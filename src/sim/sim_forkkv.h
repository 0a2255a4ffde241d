/*
 * sim_forkkv.h — the replay's side of ForkKV's shared base cache (braid sim --lora-cache shared;
 * paper 002 § 5.1–5.2): what the simulator adds around its one KvCache to model the DualRadixTree
 * as the live engine runs it.
 *
 *   separate (default): the base tree is keyed by (tenant, adapter); adapters never share blocks.
 *   shared: the base tree is keyed by tenant alone for every request; a request with an adapter
 *           also holds a residual part in a ResidualCache (src/cache/residual_cache.h: its own
 *           pool, its own LRU, so the two pools evict independently).
 *   auto:   shared's two pools, and each adapted request runs either forked (as shared) or on a
 *           separate cache of its adapter (the base pool, keyed by (tenant, adapter)), chosen by the
 *           live engine's cost model (worker/forkkv_cost.h) with its inputs as the replay knows
 *           them (SimAuto below).
 *
 * ResidualAttention's time (SimForkAttention): a forked request attends through ResidualAttention,
 * rho times plain attention, in its decode steps over the whole context and for its computed prompt
 * tokens; the replay adds that penalty (forkkv_cost_choose's penalty term) to the request's modeled
 * latency. Off by default (the sim's flat per-token costs alone, as before).
 *
 * The trace's block hashes are seeded by tenant and adapter, so in shared mode they cannot key the
 * base tree: SimBaseKeys recomputes each request's chained block hashes from its token ids in the
 * tenant-only namespace (shared mode needs traces with "tokens"). SimResidualPool is the residual
 * cache with the one hold of the request being served (the replay serves one at a time).
 * SimMemoryPeaks samples both pools' occupancy for the memory figures: a base block stores K+V of
 * every layer (kv_bytes_per_token a token), a residual block x·A_k and x·A_v of every layer
 * (kv_bytes_per_token x rank / kv_dim a token).
 *
 * Not thread-safe; everything here belongs to one sim_run. Returned memory is owned by the
 * structures and released by their _free functions.
 */
#ifndef BRAID_SIM_SIM_FORKKV_H
#define BRAID_SIM_SIM_FORKKV_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/block_presence.h"
#include "cache/kv_cache.h"
#include "cache/residual_cache.h"
#include "common/error.h"
#include "sim/trace.h"
#include "worker/forkkv_context_choice.h"
#include "worker/forkkv_cost.h"

typedef enum { SIM_LORA_SEPARATE = 0, SIM_LORA_SHARED = 1, SIM_LORA_AUTO = 2 } SimLoraCache;

/* "separate", "shared" or "auto" to the mode; -1 when unknown. */
int sim_lora_cache_parse(const char *name);
const char *sim_lora_cache_name(SimLoraCache mode);

/* Bytes a residual token takes: n_layers x 2 x rank halves, the base's K+V bytes x rank / kv_dim. */
double sim_residual_bytes_per_token(double kv_bytes_per_token, int kv_dim, int rank);

/* Distinct non-empty adapter names of the trace's requests; -1 when out of memory. */
int sim_trace_adapters(const Trace *t);

/* The base tree's key of every request: its chained full-block hashes. */
typedef struct {
    const uint64_t **of;   /* (n requests) of[i]: request i's hashes (t->reqs[i].n_blocks of them) */
    uint64_t *recomputed;  /* shared mode: the tenant-only hashes of every request, back to back */
} SimBaseKeys;

/* Separate mode: the trace's own hashes. Shared and auto mode: every request's hashes recomputed
 * from its token ids in the namespace of its tenant alone (an error names the first request without
 * ids); auto's separate requests key by the trace's own hashes (t->reqs[i].blocks). */
int sim_base_keys_build(const Trace *t, SimLoraCache mode, SimBaseKeys *keys, BraidError *err);
void sim_base_keys_free(SimBaseKeys *keys);

typedef struct {
    ResidualCache cache;
    ResidualHold hold;         /* the request being served */
    int block_size;            /* tokens a block */
    int tree_tokens_per_block; /* the keys' units: the replay's tokens per block */
} SimResidualPool;

/* A pool of residual_tokens / block_size blocks (plus the null block). */
int sim_residual_init(SimResidualPool *p, int residual_tokens, int block_size, int tree_tokens_per_block, BraidError *err);
/* --residual-pool unified: p (initialised with at least base's blocks x per_carrier blocks) keeps
 * its residuals in base blocks it borrows (residual_cache_unify). */
int sim_residual_unify(SimResidualPool *p, KvCache *base, int per_carrier, BraidError *err);
void sim_residual_free(SimResidualPool *p);
/* Admits request r: holds its longest cached residual prefix among the first max_blocks blocks of
 * tokens (the replay's keys). Returns the blocks held, or -1 (out of memory). */
int sim_residual_admit(SimResidualPool *p, const TraceRequest *r, const int32_t *tokens, int max_blocks, BraidError *err);
/* Grows the hold to n_blocks blocks (evicting residuals nobody holds). 0, 1 when the pool cannot
 * supply them (nothing taken), -1 when out of memory. */
int sim_residual_reserve(SimResidualPool *p, int n_blocks, BraidError *err);
/* The hold's first n_full blocks (tokens: the replay's keys) enter the residual tree. */
int sim_residual_commit(SimResidualPool *p, const int32_t *tokens, int n_full, BraidError *err);
/* The request is done: its hold and identity go. */
void sim_residual_finish(SimResidualPool *p);
const KvCacheCounters *sim_residual_counters(const SimResidualPool *p);

typedef struct {
    int block_size;                              /* tokens a block, both pools */
    double base_bytes_per_token, residual_bytes_per_token;
    int base_blocks, base_in_use_blocks;         /* peaks of (in use + cached) and of in use, device tier */
    int residual_blocks, residual_in_use_blocks; /* the same for the residual pool (0 without one) */
    double kv_bytes;                             /* peak of both pools' bytes at one sample */
} SimMemoryPeaks;

/* Folds the pools' occupancy now into the peaks (residual NULL: base only). A unified pool's
 * carriers count as residual memory, not as base blocks (their bytes are the base's). */
void sim_memory_sample(SimMemoryPeaks *peaks, const KvCache *base, const SimResidualPool *residual);

/* kv_cache_check on both pools; with idle, also that no block is in use (no request running). */
int sim_pools_check(const KvCache *base, const SimResidualPool *residual, bool idle, BraidError *err);

/* ResidualAttention's extra time for forked requests (n_layers 0: not charged). */
typedef struct {
    int n_layers;
    double rho_decode, rho_prefill;           /* ResidualAttention / plain attention on the same shapes */
    double plain_decode_s, plain_prefill_s;   /* plain attention, seconds per (query, context slot, layer) */
} SimForkAttention;

/* "none" (not charged), "cpu" (SmolLM2-135M's 30 layers and the committed CPU probe: 72.2 ns and
 * 50.6 ns a slot and layer, 3.14x decode, 1.58x prefill; bench/RESULTS.md issue 36), or
 * "RHO_D:RHO_P" (the cpu figures' layers and plain costs with these ratios). -1 when malformed. */
int sim_fork_attention_parse(const char *spec, SimForkAttention *out);
/* The extra seconds of a forked request of n_prompt tokens, computed of them freshly, output decoded. */
double sim_fork_attention_s(const SimForkAttention *a, int n_prompt, int computed, int output);

/* Auto mode's chooser: the live cost model with the replay's inputs. token_s is the sim's prefill
 * seconds a token; the attention terms are SimForkAttention's (none: sharing costs nothing, so an
 * adapter forks as soon as any regret is measured). held = the longest prefix of the prompt that
 * any namespace of the pools holds or held until evicted (a set of every block hash committed, in
 * either namespace: the trace's seeded hashes and the tenant-only ones never collide); regret is
 * measured on separate requests as live: the share of their prompt blocks their namespace had
 * committed before and no longer matched. Other adapters' separate copies count too (the server's
 * decide does the same): held takes the longest prefix any adapter's namespace of the tenant holds,
 * and copies (forkkv_cost.h) sums them, the prompt rehashed from its token ids in each namespace of
 * an adapter the trace names for the tenant. */
typedef struct {
    ForkKvCost cost;
    uint64_t *seen;            /* open-addressed set of committed block hashes (0 = empty slot) */
    size_t cap, n_seen;
    int forked_requests, separate_requests; /* adapted requests by the choice they got */
    int cost_version;          /* 4 (default): the server's inputs (base and residual in memory now) and the recompute
                                * term; 2: the corrected saving with base = ever held and no recompute term (the
                                * early-morning model); 1: issue 36's first (held alone, as saved); 3: 1 with other
                                * adapters' copies in held; 5: 4's inputs decided per context (forkkv_context_choice.h:
                                * one choice for every adapter of a shared prefix, with hysteresis); 6: 5 per
                                * (context, adapter) pair */
    ForkCtxTable contexts;     /* cost_version 5 / 6 (set up at the first choice) */
    bool contexts_ready;
    const Trace *trace;        /* token ids and the adapters' names (sim_auto_init's) */
    const char **adapters;     /* distinct adapter names of the trace */
    const char **adapter_tenants; /* the tenant each adapter name was first seen with */
    int n_adapters;
    uint64_t *scratch;         /* a prompt's hashes in one namespace */
    int cap_scratch;
    /* The base pool's blocks now, by chained hash (sim_auto_on_event: the server's presence set),
     * for what is in memory: this adapter's copy (own) and other adapters' copies (copies). */
    BlockPresence presence;
    /* The residual tree's blocks now (sim_auto_on_residual_event): what a fork of the adapter reuses. */
    BlockPresence residual_presence;
    bool presence_oom;         /* an event could not be followed (out of memory): copies may err */
    int bs, tpb;               /* the replay's tokens a block and tree tokens a block (set by sim_run) */
    int pool_tokens;           /* the base pool's tokens (set by sim_run; versions 5 / 6 test the fork's fit) */
    uint64_t *cache_h;         /* scratch: a namespace's hashes as the base cache computes them */
    int32_t *tree_tokens;      /* scratch: the replay's tree tokens of one request */
    int cap_cache_h;
} SimAuto;

int sim_auto_init(SimAuto *a, const SimForkAttention *attn, double token_s, int kv_dim, int rank, const Trace *t, BraidError *err);
void sim_auto_free(SimAuto *a);
/* The base cache's observer in auto mode (ctx: the SimAuto): follows its blocks' presence. */
void sim_auto_on_event(void *ctx, const CacheEvent *ev);
/* The residual tree's observer in auto mode (residual_cache_set_observer; ctx: the SimAuto). */
void sim_auto_on_residual_event(void *ctx, const CacheEvent *ev);
/* The blocks of a request's prompt that were ever committed: the longest prefix of hashes in the set. */
int sim_auto_held_blocks(const SimAuto *a, const uint64_t *hashes, int n_blocks);
/* Fork (true) or separate for a request: tenant_keys / own_keys its two namespaces' hashes. */
bool sim_auto_choose(SimAuto *a, const TraceRequest *r, const uint64_t *tenant_keys, const uint64_t *own_keys, int bs);
/* A separate request was served with hit_blocks of its own namespace matched: its regret sample. */
void sim_auto_observe_separate(SimAuto *a, const uint64_t *own_keys, int n_blocks, int hit_blocks);
/* The hashes a served request committed (its namespace's keys). -1 when out of memory. */
int sim_auto_remember(SimAuto *a, const uint64_t *keys, int n_blocks);

#endif
