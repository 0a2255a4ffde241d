/*
 * forkkv_cost.h — the cost model of --lora-cache auto: should an adapted request run forked (the
 * shared base cache plus its rank-r residual; ForkKV) or on a separate cache of its own adapter?
 *
 * Sharing costs attention: every query of a forked sequence attends through ResidualAttention,
 * rho times plain attention on the same shapes (rho measured at start-up on the model's attention
 * shape, decode and prefill apart): its decode steps over the whole context, and the prompt tokens
 * no namespace holds (computed in either mode). Sharing saves memory: a separate copy duplicates
 * the context another namespace holds, and where memory is short the copies push each other out
 * and are recomputed. The price of that is measured on the live stream as the regret of separate
 * copies: the share of the prompt blocks of requests that ran separate which their namespace had
 * cached and evicted before they came. So, per request, in steady state:
 *   penalty = layers × [(rho_d − 1)·a_d·max_tokens·(n + max_tokens/2) + (rho_p − 1)·a_p·new·(n − new/2)]
 *   (new = n − min(base, residual): the prompt tokens a fork computes)
 *   saving  = c_tok · regret · max(0, saved)
 *   saved   = (n − own) − [(n − base) + n·rank/kv_dim] + copies·(1 − rank/kv_dim)
 * the memory (tokens) forking saves: a separate copy's new tokens, less the fork's (the base part
 * the shared base lacks, and the residual), plus the other adapters' separate copies of this
 * context (copies: prompt tokens they hold, summed over their namespaces), which separate mode
 * spends on duplicates and a shared base lets them fold into residuals. n the prompt, base / own
 * the prefix the shared base / this adapter's separate copy holds, held the longest prefix any
 * namespace holds (the shared base, this adapter's residuals or copy, another adapter's copy),
 * a_d / a_p plain
 * attention seconds per (query, context slot, layer), c_tok a computed token's seconds (measured
 * on the live prefill steps). And the prompt tokens each choice computes now: a fork reuses
 * min(base, residual) (a base block without this adapter's residual is recomputed: ForkKV's fork
 * tokens), a separate request its own copy's prefix, so
 *   recompute = c_tok · (own − min(base, residual))       (negative: forking computes less now)
 * The request runs forked when saving > penalty + recompute. (Issue 36: without the recompute term
 * auto forked react-lora turns whose base was cached but whose residuals were not, recomputing
 * 50 K prompt tokens the adapter's own copies held, and lost to separate at 1–4 workflows at once,
 * 0.65–0.72x in the simulator. The term also keeps an adapter in the namespace that holds its
 * state, instead of flipping between them.) The regret is measured on separate requests only: when every request runs
 * forked it keeps its last value (sharing ends the thrashing it measured; a regret measured then
 * would flip the choice back). Pure arithmetic apart from forkkv_cost_measure; not thread-safe.
 */
#ifndef BRAID_WORKER_FORKKV_COST_H
#define BRAID_WORKER_FORKKV_COST_H

#include <stdbool.h>

typedef struct {
    int n_layers, n_heads, n_kv_heads, head_dim, rank;
    double kv_dim_over_rank;   /* a residual token is this many times smaller than a base token */
    /* Measured at start-up (forkkv_cost_measure): plain attention seconds per query, context slot
     * and layer, and ResidualAttention's ratio to it, for a decode step and a prefill chunk. */
    double plain_decode_s, rho_decode, plain_prefill_s, rho_prefill;
    /* Measured on the live steps (EWMA): seconds (forkkv_cost_clock) per computed token of a
     * prefill-heavy step. */
    double token_s;
    int token_samples;
    /* Measured on the live request stream (EWMA): the share of a separate request's prompt blocks
     * that its namespace had cached and evicted when it came. */
    double regret;
    int regret_samples;
} ForkKvCost;

/* What is known of a request before it is given a namespace (tokens). */
typedef struct {
    int n_prompt, max_tokens;
    int held;          /* the longest prefix of the prompt any namespace of the pools holds */
    int base, own;     /* the prefix the shared base holds, and this adapter's separate copy */
    int copies;        /* prompt tokens held by other adapters' separate copies, summed over them */
    /* The prefix this adapter's residuals hold (in memory now); with base, what a fork reuses. Not
     * residual_known (a zero-initialised request): the model before issue 36's recompute term
     * (new = n − held, no recompute term; braid sim --auto-cost 1-3 and its attention charge). */
    bool residual_known;
    int residual;
} ForkKvRequest;

typedef struct {
    bool shared;
    double penalty_s, saving_s; /* the terms the choice compared */
    double recompute_s;         /* what forking computes now beyond a separate run (negative: less) */
} ForkKvChoice;

/* Defaults before any measurement: ratios of the committed figures (bench/RESULTS.md), a token at
 * 3 ms, attention at 50 ns per slot and layer, no regret. */
void forkkv_cost_init(ForkKvCost *c, int n_layers, int n_heads, int n_kv_heads, int head_dim, int rank);
/* Runs plain attention and ResidualAttention on the model's shapes (1 024 slots: a decode step and
 * a 64-query chunk, five calls each on one thread, tens of ms) and records the per-slot costs (the
 * cheapest call's thread CPU time, spread over the threads a live step uses) and the ratios.
 * -1 when out of memory (the defaults stay). */
int forkkv_cost_measure(ForkKvCost *c);
/* The clock forward steps are timed by: the process's CPU seconds over the threads a step uses,
 * the units of the start-up probe (a loaded machine's descheduling counts in neither). */
double forkkv_cost_clock(void);
/* One forward step: tokens computed, of which decode (one-token sequences), and its seconds
 * (forkkv_cost_clock's). */
void forkkv_cost_observe_step(ForkKvCost *c, int n_tokens, int n_decode, double seconds);
/* A request that runs separate arrives: of its prompt blocks, how many its namespace had evicted. */
void forkkv_cost_observe_regret(ForkKvCost *c, int evicted_blocks, int prompt_blocks);
ForkKvChoice forkkv_cost_choose(const ForkKvCost *c, const ForkKvRequest *r);

#endif
