/*
 * engine.h — one serving instance in one process: scheduler + executor over a shared paged KV pool.
 *
 * engine_step() asks the scheduler for a step plan, carries out the plan's cache operations (block
 * copies, host-tier stores and loads) on the backend, turns the plan into a ForwardBatch (token ids,
 * positions, slots through each sequence's block table), runs the forward pass, samples the next
 * token of every sequence whose last token was computed, and applies stop rules (end-of-turn
 * tokens, max_tokens, context length). A request with a grammar spec (SchedRequest.grammar_spec)
 * samples under its token mask: computed on the host before the forward, applied by the backend
 * to the greedy argmax (CPU host / CUDA device) or to a masked copy of the logits for sampled
 * requests; the matcher then takes the token, and the request stops ("stop") as soon as the
 * grammar is complete and nothing but end-of-generation could follow. `braid batch` drives it offline; the cluster's instance
 * leader will drive the same loop from MPI messages.
 * Owns: the scheduler and the backend (KV memory, forward scratch) on the configured device. Borrows the model and the requests.
 * Not thread-safe.
 */
#ifndef BRAID_WORKER_ENGINE_H
#define BRAID_WORKER_ENGINE_H

#include "model/model.h"
#include "worker/backend.h"
#include "worker/prefetch_budget.h"
#include "worker/scheduler.h"

typedef struct {
    int n_blocks, block_size, max_batch_tokens, max_running;
    int host_blocks;     /* host KV tier blocks including the null block; 0 = no host tier */
    bool cache_enabled;
    const EvictPolicy *policy;
    EvictPolicyOptions policy_options; /* --pbkv-gamma; zero: the policy's defaults */
    bool prefetch;       /* host-tier prefetch on pure-decode steps, when the policy has prefetch_value */
    int prefetch_max_blocks; /* S_bw (--prefetch-blocks); 0 = auto: measured bandwidth x decode step time
                                (worker/prefetch_budget.h), SCHED_PREFETCH_MAX_BLOCKS_PER_STEP until measured */
    bool sync_copies;    /* CPU: the prefetch's copies inline before the forward, not on the copy thread */
    BackendKind device;  /* BACKEND_CPU (the zero value) or BACKEND_CUDA */
    bool cuda_graphs_off; /* CUDA: launch decode steps directly instead of replaying graphs */
    /* CPU: fp32 activations in every matmul. The zero value serves with int8 activations and
     * integer dot products (kernels/cpu/matmul.h), several times the batched decode throughput;
     * the single-sequence runner (braid generate, golden tests) always uses fp32. */
    bool cpu_matmul_fp32;
    /* Tensor parallelism (the cluster's instance leader): run on this rank's weight shard and
     * all-reduce through tp; before each forward, before_forward hands the batch and the step's
     * cache operations (already applied on this rank) to the peers, which apply them too. */
    const ModelWeights *shard;
    struct TpCollective *tp;
    int (*before_forward)(void *ctx, const ForwardBatch *batch, const CacheOpList *ops, BraidError *err);
    void *before_forward_ctx;
    /* Optional: called between a forward's layers on the stepping thread (BackendConfig.step_pulse). */
    void (*step_pulse)(void *ctx);
    void *step_pulse_ctx;
    /* Segment reuse (kv_cache.h): the most a request may use (OFF keeps no segment index;
     * APPROX permits requests to ask for it) and approximate mode's left-context window. */
    SegmentReuseMode segment_reuse;
    int approx_window;
    /* Guards on approximate spans (sched_span_guard.h: depth-aware head W(L-1) = deep_window, online
     * probe of probe_tokens keys against min_cos); the zero value is off (the CLI's defaults are on). */
    SpanGuardConfig span_guard;
    /* Near-duplicate segments (KvCacheConfig.segment_lsh; approx-mode requests only) and their
     * thresholds (0 = defaults); the engine maps the vocabulary to canonical classes (token_canon.h). */
    bool segment_lsh, segment_lsh_anywhere;
    double segment_tau_seg, segment_tau_ctx;
    /* Pinned device blocks one tenant may hold (cache directives' PIN); 0 = a quarter of the pool. */
    int pin_budget_blocks;
    /* LoRA adapters (borrowed, outlive the engine; NULL = none): a request's adapter name picks
     * one; a name not in the set is refused. The adapter also namespaces the prefix cache, so
     * requests of different adapters never share KV blocks. */
    const LoraSet *lora;
    /* ForkKV (--lora-cache shared; worker/sched_forkkv.h): adapters share one base cache and keep
     * rank-r residuals in a pool of residual_blocks blocks (incl. the null block); off = separate
     * caches per adapter (the namespace above). Needs adapters; CPU and CUDA backends. */
    bool lora_shared;
    int residual_blocks;
    /* --lora-cache auto (with lora_shared): each adapted request forks or takes a separate cache
     * by a measured cost model (worker/forkkv_cost.h; sched_forkkv.h). */
    bool lora_auto;
    /* Weighted fair sharing between tenants in admission and the prefill budget (sched_fair.h);
     * false: first come, first served. */
    bool fair_share;
    int fair_step_tokens; /* prefill tokens in a step while several tenants have work (0 = the default) */
    int admit_output;     /* --admit-output: output-aware admission (sched_admit.h; 0 = off) */
} EngineConfig;

typedef struct {
    const BraidModel *model;
    EngineConfig cfg;
    Scheduler sched;
    Backend backend;
    StepPlan plan;
    PrefetchBudget prefetch_budget; /* S_bw per step (auto unless cfg.prefetch_max_blocks > 0) */
    int32_t *segment_canon;         /* cfg.segment_lsh: the vocabulary's canonical classes (the cache borrows it) */
    double seen_load_bytes, seen_load_seconds; /* the backend's LOAD totals at the last step's end */
    int32_t *tokens, *positions, *slots, *res_slots, *seq_start, *seq_ctx, *logit_rows, *seq_adapter;
    const int32_t **tables, **res_tables;
    int cap_tokens, cap_seqs;
    float *logits;       /* (cap_seqs, vocab) rows of sampled (non-greedy) requests */
    int32_t *argmax;     /* (cap_seqs) */
    uint8_t *want_logits; /* (cap_seqs) */
    uint8_t *want_hidden; /* (cap_seqs) */
    float *hidden;        /* (cap_seqs, dim) hidden states the forward copied */
    uint64_t generated_tokens;
    double probe_read_seconds; /* approximate-span probes' K/V reads (engine_probe.c), summed */
    /* Structured outputs: the model's vocabulary for grammar masks (made at the first request with
     * a grammar, shared read-only by all their matchers), each sampled row's mask
     * (cap_seqs, mask_words) and whether the row has one, and a masked copy of one logit row for
     * sampled (temperature > 0) requests. */
    struct GrammarVocab *grammar_vocab;
    struct GrammarCache *grammar_cache; /* compiled specs and their mask caches, shared by requests with the same spec */
    uint32_t *masks;
    uint8_t *want_mask;
    int cap_mask_rows, mask_words;
    float *masked_row;
    uint64_t constrained_tokens; /* tokens sampled under a grammar mask */
    double grammar_seconds;      /* host time in grammar work: masks, masked sampling, matcher steps */
} Engine;

int engine_init(Engine *e, const BraidModel *model, const EngineConfig *cfg, BraidError *err);
/* The CPU matmul arithmetic an engine with this config uses (TP peers must use the same). */
CpuMatmulMath engine_cpu_matmul(const EngineConfig *cfg);
void engine_free(Engine *e);
/* Prefill FLOPs per token of a model's linear layers (2 per multiply-add; the attention scores
 * and the output head are left out): what one reused segment token saves at least. */
double engine_prefill_flops_per_token(const ModelConfig *cfg);
/* A seed naming what makes K/V comparable (dimensions, vocabulary, RoPE): chunk hashes include it. */
uint64_t engine_model_seed(const ModelConfig *cfg);
/* Prepares and queues a request (prompt already tokenized into req->tokens / n_prompt). A request
 * that cannot run (no room in the context, an adapter not loaded, a grammar spec that does not
 * compile: its message names why) is finished with an error and -1;
 * a segment mode above the engine's is lowered to it. */
int engine_submit(Engine *e, SchedRequest *req);
/* Runs one step; returns the number of sequences in it (0 when idle), -1 on error. */
int engine_step(Engine *e, BraidError *err);

#endif
