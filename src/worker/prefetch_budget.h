/*
 * prefetch_budget.h — PBKV's S_bw (§4.3): how many host-tier blocks one pure-decode step may
 * prefetch, from the measured host->device copy bandwidth and the measured decode step time.
 *
 * S_bw = bandwidth x step time / block bytes: the blocks one decode step's forward can hide when
 * the copies run beside it (worker/copy_thread.h on the CPU, the copy stream on CUDA). Both
 * figures are exponentially weighted moving averages of what the engine observes (copies the
 * backend timed, pure-decode forwards); until both have a sample the budget is the fixed default
 * (SCHED_PREFETCH_MAX_BLOCKS_PER_STEP). A fixed budget (--prefetch-blocks N) overrides it.
 * The result is clamped to [1, PREFETCH_BUDGET_MAX_BLOCKS]; the cache still caps what a step loads
 * by S_a (free blocks and retired cache) and by what the policy expects to be used.
 * Pure arithmetic, no clock of its own: tests feed it figures. Not thread-safe (the engine thread).
 */
#ifndef BRAID_WORKER_PREFETCH_BUDGET_H
#define BRAID_WORKER_PREFETCH_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

/* Weight of a new sample in each average: ~10 samples of memory, so one slow step (a page fault,
 * a busy neighbour) moves the budget by a tenth. */
#define PREFETCH_BUDGET_EWMA_ALPHA 0.1
/* Upper clamp: a step's prefetch list stays short even when the copies are nearly free. */
#define PREFETCH_BUDGET_MAX_BLOCKS 1024

typedef struct {
    size_t block_bytes;     /* bytes one block moves (every layer's K and V of this rank) */
    int fixed_blocks;       /* > 0: --prefetch-blocks; the measurements are kept but not used */
    int default_blocks;     /* before both averages have a sample */
    double bytes_per_second; /* EWMA of observed host->device copy rates; 0 = no sample yet */
    double step_seconds;    /* EWMA of pure-decode forward times; 0 = no sample yet */
} PrefetchBudget;

/* fixed_blocks 0 = auto (measured); default_blocks is the budget until measured. */
void prefetch_budget_init(PrefetchBudget *b, size_t block_bytes, int fixed_blocks, int default_blocks);
/* A copy of `bytes` that took `seconds` (ignored when either is not positive). */
void prefetch_budget_observe_copy(PrefetchBudget *b, double bytes, double seconds);
/* A pure-decode step's forward that took `seconds` (ignored when not positive). */
void prefetch_budget_observe_step(PrefetchBudget *b, double seconds);
/* The blocks the next pure-decode step may prefetch. */
int prefetch_budget_blocks(const PrefetchBudget *b);
/* Whether the budget comes from the measurements (auto mode and both averages sampled). */
bool prefetch_budget_measured(const PrefetchBudget *b);

#endif
