/*
 * scheduler.h — continuous batching for one instance (runs on the instance leader).
 *
 * Owns: the waiting queue, the running set, the block pool accounting and the radix prefix cache.
 * Each step, sched_plan() builds a StepPlan under a token budget: decodes of running requests
 * first (one token each, growing their block tables), then chunks of unfinished prefills, then
 * admission from the front of the waiting queue (longest cached prefix matched, locked and held,
 * blocks for the rest of the prompt reserved, evicting from the tree when short). When a decode
 * cannot get a block even after eviction, the running request with the least work done is
 * preempted: its full blocks go into the tree first (so its recompute is a cache hit), everything
 * is released, and it returns to the front of the queue with its generated tokens kept.
 * A waiting request whose head shares full prompt blocks with a running request that has yet to
 * commit them (admitted earlier in the same step, or prefilling in chunks) waits until they are
 * committed, then is admitted as a cache hit, rather than computing the head a second time in the
 * same step (issue 33; never while the step would be empty, never behind a request not running).
 * With output-aware admission on (SchedConfig.admit_output, sched_admit.h), the head is admitted
 * only when the pool keeps room for the expected rest of every running request's output and its own.
 * A request that can never fit (prompt + max_tokens beyond the whole pool) is finished with an
 * error at sched_add; nothing else is ever dropped.
 * Segment reuse (when the request's mode is not OFF): after the prefix match, admission asks the
 * cache for chunks of the rest of the prompt held elsewhere (kv_cache_find_segments), reserves the
 * blocks, and lands them with COPY_SLOTS operations in the step's list; prefill then computes the
 * gaps between them — one plan entry per gap, as many gaps in a step as its token budget holds. A request's
 * blocks from its first approximate token on enter the tree marked approximate: requests in
 * approx mode match through them; those an amortized splice (or a turn over its blocks) made are
 * stamped with the request's conversation (conversation_id, else workflow), whose later turns
 * match them too (CacheIdentity.approx_scope); no other request is ever served them.
 * Prefetch (PBKV §4.3, when configured and the policy has prefetch_value): on a pure-decode step
 * (every entry a one-token decode and nothing waiting that could be admitted) the cache loads
 * host-tier nodes the policy expects the next calls to use, at most prefetch_max_blocks, into free
 * device blocks beyond those the running requests still need to finish, or retired cache
 * (kv_cache_prefetch); the LOADs join the step's operations.
 * The executor (engine.c) runs the plan, then calls sched_commit() and, per sampled token,
 * sched_append_token() / sched_finish().
 * Not thread-safe.
 */
#ifndef BRAID_WORKER_SCHEDULER_H
#define BRAID_WORKER_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/cache_ops.h"
#include "cache/cache_directive.h"
#include "cache/kv_cache.h"
#include "cache/residual_cache.h"
#include "common/error.h"
#include "worker/sampler.h"
#include "worker/sched_admit.h"
#include "worker/sched_fair.h"
#include "worker/sched_span_guard.h"

typedef enum { REQ_WAITING = 0, REQ_RUNNING, REQ_FINISHED } RequestState;

typedef struct SchedRequest {
    char *id;
    int32_t *tokens;     /* prompt, then generated tokens */
    int n_tokens, cap_tokens;
    int n_prompt, max_tokens;
    /* Identity (owned strings, NULL = none): the cache namespace is (tenant, adapter); workflow
     * and agent reach the eviction policy. Interned into `identity` by sched_add. */
    char *tenant, *adapter, *workflow, *agent;
    float tenant_weight; /* the tenant's weight in fair sharing (sched_fair.h); <= 0 reads as 1 */
    CacheIdentity identity;
    int lora_id;         /* LoRA adapter the request runs (model/lora_adapter.h; 0 = base), from adapter by engine_submit */
    SamplingParams sampling;
    bool ignore_eos;     /* keep generating past end-of-turn tokens (benchmarks; not once a grammar is complete) */
    Sampler sampler;
    /* Structured output (grammar/grammar.h): the grammar spec text (owned; NULL or "" = none) and,
     * from engine_submit on, the matcher that follows the generated tokens (owned; its state
     * survives preemption, which keeps generated tokens). */
    char *grammar_spec;
    struct GrammarMatcher *grammar;
    /* want_logprobs: the engine records each generated token's log-probability and logprobs_top
     * alternatives in logprobs[generated index] (owned, grown as tokens come). */
    bool want_logprobs;
    int logprobs_top;
    TokenLogprob *logprobs;
    int cap_logprobs;
    RequestState state;
    RadixNode *locked;   /* matched prefix node, locked while running */
    /* sched_add counted this request's wait on its cached prefix (kv_cache_note_waiting); taken
     * back when it leaves the queue (admitted, cancelled or finished). */
    bool waiting_noted;
    int32_t *blocks;     /* the sequence's block table */
    int n_blocks, cap_blocks;
    int n_computed;      /* tokens whose K/V are in the blocks */
    int cached_tokens;   /* prompt tokens served from the cache at first admission (-1 before) */
    int cached_tokens_host; /* of those, the ones loaded back from the host tier */
    /* Segment reuse (kv_cache.h SegmentReuseMode): the request's mode, the spans found at its last
     * admission (their K/V land by COPY_SLOTS before the first forward; prefill skips them) and the
     * next span not yet skipped, and the prompt tokens reused at first admission (-1 before). */
    uint8_t segment_mode;
    KvSegmentPlan segments;
    int next_span;
    SpanGuard guard; /* approximate spans' depth-aware heads and probe (sched_span_guard.h) */
    int reused_tokens;
    /* The first token whose K/V are approximate (a matched node marked approximate, or the first
     * approximate span), -1 when none: its blocks from there on enter the tree marked so. */
    int approx_from;
    /* Cache directives (cache_directive.h; owned): a splice runs at admission (amortize: its runs
     * join the reused spans; forget: the context's cache from the first edit on is dropped first),
     * hints act when the request finishes. directive_outcomes: after the finish, a JSON array of
     * what each did (sched_directives.c), NULL when the request had none. splice_reused: per run,
     * the tokens copied at first admission. */
    CacheDirectives directives;
    int *splice_reused;
    int splice_from;        /* where the first admission's copies started (past its cached prefix) */
    int splice_forgot_blocks;
    int shared_tokens;      /* of reused_tokens, those copied from another tenant's shared prefix (at first admission) */
    int shared_planned;     /* the same at the last admission (scheduler scratch) */
    bool splice_done;
    char *directive_outcomes;
    /* ForkKV (worker/sched_forkkv.h): the request's residual hold, and the first token whose base
     * K/V it writes (below, the base blocks were cached and are shared: only read). */
    ResidualHold res;
    int base_write_from;
    bool kv_separate;    /* --lora-cache auto chose a separate cache for this adapted request (sched_forkkv.h) */
    int preemptions;
    double t_first_token, t_finish;
    /* The post-norm hidden state of the last prompt token (model dim floats), kept when the
     * request asks for it (want_hidden: the workflow predictor reads it, PBKV § 4.1); filled by
     * the engine when the prompt's prefill completes, NULL before. Owned; freed with the request. */
    bool want_hidden;
    float *hidden;
    /* The logits (vocab floats) that picked the first generated token, kept when asked (drift
     * studies of segment reuse compare them with a full prefill's); NULL before. Owned. */
    bool want_first_logits;
    float *first_logits;
    const char *finish_reason; /* "stop", "length", "error" */
    char error[sizeof(BraidError)];
} SchedRequest;

typedef struct {
    SchedRequest *req;
    int start, count; /* compute tokens[start, start + count) */
    bool sample;      /* the last token's logits pick the next token */
} PlanEntry;

typedef struct {
    PlanEntry *entries;
    int n, cap;
    int n_tokens;
    /* Block operations (cache/cache_ops.h) every rank applies, in order, before this step's
     * forward: demotions to the host tier, load-backs, copies. */
    CacheOpList ops;
    /* ops[0, n_sync_ops) must complete before the forward; the rest are the prefetch's, on blocks
     * this step's forward neither reads nor writes, so they may run beside it
     * (backend_apply_cache_ops_overlapped). */
    int n_sync_ops;
    bool pure_decode; /* every entry is a one-token decode and nothing waiting could be admitted */
} StepPlan;

typedef struct {
    /* Prompt tokens at first admission: cached on the device, cached on the host (loaded back),
     * computed. Their sum is the prompt tokens admitted. Cache-wide counters (demotions,
     * load-backs, evictions per tier) are in the cache: sched->cache.counters. */
    uint64_t cached_prompt_tokens_device, cached_prompt_tokens_host, computed_prompt_tokens;
    /* Of the computed ones at first admission, those whose K/V came from reused segments instead,
     * and the prefill FLOPs that saved (SchedConfig.flops_per_token per reused token). */
    uint64_t segment_reused_prompt_tokens;
    double segment_flops_saved;
    /* Directives: requests that carried any; admissions that had to unpin to go ahead. */
    uint64_t directive_requests, pin_revocations;
    uint64_t preemptions, steps;
    /* Prompt tokens the committed steps computed (every prefill chunk, recomputation after a
     * preemption included): the instance's prefill progress, which the coordinator's request
     * watchdog counts as queue movement (a queue behind a long prefill is moving, not stuck). */
    uint64_t prefilled_tokens;
    /* Pure-decode steps, and those of them that prefetched blocks (the blocks: cache counters
     * prefetched_blocks / prefetch_hit_blocks / prefetch_wasted_blocks). */
    uint64_t pure_decode_steps, prefetch_steps;
    int peak_in_use;
    /* ForkKV, at first admission: requests with a residual; prompt tokens whose residual was
     * cached; tokens whose base was cached but residual computed (forks); tokens whose residual
     * was cached but base recomputed (partial hits). */
    uint64_t forkkv_requests, residual_hit_tokens, fork_tokens, partial_hit_tokens;
    int peak_residual_in_use;
    /* Steps in which the head of the queue waited for a running request to commit the prompt blocks
     * they share (the shared-prefill rule, scheduler.c wait_for_shared_prefill; one per step held). */
    uint64_t shared_prefill_waits;
} SchedCounters;

/* A hook for whoever mirrors the cache elsewhere (the cluster's router index): every cache event
 * (kv_cache.h: blocks stored / removed per tier, with content hashes), after the scheduler's own
 * JSONL log has it. Optional. */
typedef struct {
    void *ctx;
    CacheEventFn on_cache_event;
} SchedObserver;

typedef struct {
    int device_blocks;   /* device KV pool, including the null block */
    int host_blocks;     /* host tier, including its null block; 0 = off */
    int block_size, max_batch_tokens, max_running;
    bool cache_enabled;  /* prefix caching; off = every prompt is computed */
    const EvictPolicy *policy; /* NULL = LRU */
    EvictPolicyOptions policy_options; /* to the policy's create (zero: its defaults) */
    bool prefetch;       /* prefetch from the host tier on pure-decode steps (needs policy->prefetch_value) */
    int prefetch_max_blocks; /* S_bw: blocks per step; 0 = SCHED_PREFETCH_MAX_BLOCKS_PER_STEP */
    /* Segment reuse: the index is kept when segments is true (and caching is on); the anchors,
     * window and model seed go to the cache (KvCacheConfig). flops_per_token: the forward's
     * prefill FLOPs per token (linear layers), for the saved-FLOPs counter. */
    bool segments;
    const int32_t *anchor_tokens;
    int n_anchor_tokens;
    int approx_window;
    uint64_t model_seed;
    double flops_per_token;
    /* Near-duplicate segments: to the cache as they are (KvCacheConfig.segment_lsh ..; canon borrowed). */
    bool segment_lsh, segment_lsh_anywhere;
    double segment_tau_seg, segment_tau_ctx;
    const int32_t *segment_canon;
    int n_segment_canon;
    /* Pinned device blocks a tenant may hold (Leyline PIN budget); 0 = a quarter of the pool. */
    /* Guards on approximate spans (sched_span_guard.h); the zero value is off. */
    SpanGuardConfig span_guard;
    int pin_budget_blocks;
    /* ForkKV (--lora-cache shared): the base tree is keyed by tenant only and adapted requests
     * keep residuals in a residual tree of residual_blocks blocks (incl. the null block). */
    bool lora_shared;
    int residual_blocks;
    /* --lora-cache auto (with lora_shared): each adapted request runs forked or on a separate
     * cache by a measured cost model (worker/forkkv_cost.h), which needs the model's attention
     * shape and the adapters' largest rank. */
    bool lora_auto;
    int model_layers, model_heads, model_kv_heads, model_head_dim, lora_rank;
    bool fair_share; /* weighted fair sharing between tenants (sched_fair.h); false: first come, first served */
    int fair_step_tokens; /* prefill tokens in a step while several tenants have work; 0 = SCHED_FAIR_DEFAULT_STEP_TOKENS */
    int admit_output;     /* --admit-output (sched_admit.h): SCHED_ADMIT_OUTPUT_OFF (0), _AUTO, or tokens */
} SchedConfig;

/* PBKV's S_bw (§4.3): the most blocks a pure-decode step prefetches, the copy volume one decode
 * step's time hides. A fixed cap rather than the paper's running bandwidth x step-time average:
 * 8 blocks of 16 tokens are ~2.9 MB for SmolLM2-135M (0.2 ms at the CPU backend's 14 GB/s against
 * a decode step of tens of ms) and ~17 MB for an 8B model with GQA (~0.7 ms over PCIe 4, against
 * 10-20 ms steps). The copies run in the step's operation list, before its forward. */
#define SCHED_PREFETCH_MAX_BLOCKS_PER_STEP 8

typedef struct {
    KvCache cache;          /* with ForkKV: the base tree */
    bool forkkv;
    ResidualCache residual; /* ForkKV's residual tree (when forkkv) */
    struct SchedForkAuto *fork_auto; /* --lora-cache auto's state (sched_forkkv.c); NULL otherwise */
    bool cache_enabled;
    int block_size, max_batch_tokens, max_running;
    bool prefetch;          /* configured on and the policy can value candidates */
    int prefetch_max_blocks;
    SchedRequest **waiting; /* FIFO; preempted requests go back to the front */
    int n_waiting, cap_waiting;
    SchedRequest **running;
    int n_running, cap_running;
    SchedCounters counters;
    SpanGuardConfig span_guard;
    SpanGuardCounters guard_counters;
    double flops_per_token;
    int pin_budget_blocks;
    FILE *events;           /* JSONL cache decisions, or NULL */
    SchedObserver observer;
    double (*clock)(void);
    bool fair_share;        /* weighted fair sharing between tenants (sched_fair.h); off: first come, first served */
    int fair_step_tokens;   /* SchedConfig.fair_step_tokens */
    SchedFair fair;
    SchedAdmit admit;       /* output-aware admission (sched_admit.h) */
} Scheduler;

int sched_init(Scheduler *s, const SchedConfig *cfg, BraidError *err);
void sched_free(Scheduler *s);
/* Queues a request (the scheduler does not own it). Returns -1 and finishes it with an error when
 * it could never fit in the pool. */
int sched_add(Scheduler *s, SchedRequest *req);
/* Builds the next step into plan (reused across calls). Returns the number of entries. */
int sched_plan(Scheduler *s, StepPlan *plan, BraidError *err);
/* Marks the plan's tokens as computed (after the forward pass wrote their K/V). */
void sched_commit(Scheduler *s, const StepPlan *plan);
/* Approximate-span guards (sched_span_guard.h). uncount: `tokens` of r's reused span tokens are
 * computed instead (a depth-aware head, or a rejected span's rest), the counters follow.
 * probe_result: the engine's probe of r's span r->next_span (probing) before sched_commit:
 * accepted or rejected, with the lowest per-layer mean key cosine and its layer (event
 * probe_ok / probe_rejected). */
void sched_span_guard_uncount(Scheduler *s, SchedRequest *r, int tokens, bool rejected);
void sched_span_probe_result(Scheduler *s, SchedRequest *r, bool accept, double min_cos, int layer);
/* Appends a sampled token to a running request. */
int sched_append_token(SchedRequest *req, int32_t token);
/* Ends a running request: inserts its computed full blocks into the cache, releases the rest. */
void sched_finish(Scheduler *s, SchedRequest *req, const char *reason);
/* Ends a waiting or running request early (its client went away or a stop string matched):
 * what it computed goes into the cache, its blocks are released, finish_reason = "cancelled". */
void sched_cancel(Scheduler *s, SchedRequest *req);
bool sched_idle(const Scheduler *s);
/* A workflow ended (the client said so): the eviction policy hears it. */
void sched_workflow_end(Scheduler *s, const char *workflow);
/* A workflow's K-step next-agent forecast (the coordinator's MSG_PREDICT) reaches the eviction
 * policy: kv_cache_predict. -1 only when out of memory. */
int sched_predict(Scheduler *s, const char *workflow, const char *agent, int k, int n_agents, const char *const *agents,
                  const float *prob, BraidError *err);
/* Accounting invariant and tree consistency (tests, debug builds). */
int sched_check(const Scheduler *s, BraidError *err);
void plan_free(StepPlan *plan);
/* Frees what a request owns (id, identity strings, tokens, blocks array, sampler); the request
 * must not be queued. */
void sched_request_free(SchedRequest *req);

#endif
