#include "coord/move_plan.h"

MoveCostModel move_cost_model_default(void) {
    return (MoveCostModel){.enabled = true, .link_bytes_per_s = MOVE_DEFAULT_LINK_GBPS * 1e9, .latency_s = MOVE_DEFAULT_LATENCY_S,
                           .prefill_tokens_per_s = MOVE_DEFAULT_PREFILL_TPS, .min_blocks = MOVE_DEFAULT_MIN_BLOCKS};
}

MovePlan move_plan(const MoveCostModel *m, const RouteDecision *d, const bool *can_move, const uint64_t *block_bytes, int block_size) {
    MovePlan p = {.source = -1};
    if (!m->enabled || d->instance < 0 || d->source < 0 || !can_move[d->instance] || !can_move[d->source]) return p;
    int gain = d->source_blocks - d->matched_blocks;
    if (gain < (m->min_blocks > 0 ? m->min_blocks : 1) || block_size <= 0) return p;
    if (route_decision_priced(d)) { /* the cost router already weighed this move with its learned rates: follow it */
        p.move_s = d->est_move_s;
        p.recompute_s = d->est_recompute_s;
        if (d->move) p.source = d->source, p.blocks = d->source_blocks;
        return p;
    }
    p.move_s = (double)gain * (double)block_bytes[d->source] / (m->link_bytes_per_s > 0 ? m->link_bytes_per_s : 1.0) + m->latency_s;
    p.recompute_s = (double)gain * block_size / (m->prefill_tokens_per_s > 0 ? m->prefill_tokens_per_s : 1.0);
    if (p.move_s >= p.recompute_s) return p;
    p.source = d->source;
    p.blocks = d->source_blocks;
    return p;
}
