/*
 * prefetch_budget.c — S_bw from the EWMAs of copy bandwidth and decode step time (prefetch_budget.h).
 */
#include "worker/prefetch_budget.h"

void prefetch_budget_init(PrefetchBudget *b, size_t block_bytes, int fixed_blocks, int default_blocks) {
    *b = (PrefetchBudget){.block_bytes = block_bytes, .fixed_blocks = fixed_blocks > 0 ? fixed_blocks : 0,
                          .default_blocks = default_blocks > 0 ? default_blocks : 1};
}

/* The first sample seeds the average: a start-up figure is not dragged towards zero. */
static void ewma(double *avg, double sample) {
    *avg = *avg > 0.0 ? *avg + PREFETCH_BUDGET_EWMA_ALPHA * (sample - *avg) : sample;
}

void prefetch_budget_observe_copy(PrefetchBudget *b, double bytes, double seconds) {
    if (bytes > 0.0 && seconds > 0.0) ewma(&b->bytes_per_second, bytes / seconds);
}

void prefetch_budget_observe_step(PrefetchBudget *b, double seconds) {
    if (seconds > 0.0) ewma(&b->step_seconds, seconds);
}

bool prefetch_budget_measured(const PrefetchBudget *b) {
    return b->fixed_blocks == 0 && b->bytes_per_second > 0.0 && b->step_seconds > 0.0 && b->block_bytes > 0;
}

int prefetch_budget_blocks(const PrefetchBudget *b) {
    if (b->fixed_blocks > 0) return b->fixed_blocks;
    if (!prefetch_budget_measured(b)) return b->default_blocks;
    double blocks = b->bytes_per_second * b->step_seconds / (double)b->block_bytes;
    if (blocks < 1.0) return 1;
    return blocks > PREFETCH_BUDGET_MAX_BLOCKS ? PREFETCH_BUDGET_MAX_BLOCKS : (int)blocks;
}
