#include "coord/router_cost.h"

#include <math.h>

RouteCostModel route_cost_model_init(bool moves, double prefill_tokens_per_s, double link_bytes_per_s, double move_latency_s) {
    return (RouteCostModel){.s_per_token = 1.0 / (prefill_tokens_per_s > 0 ? prefill_tokens_per_s : 1.0),
                            .link_bytes_per_s = link_bytes_per_s > 0 ? link_bytes_per_s : 1.0,
                            .move_latency_s = move_latency_s > 0 ? move_latency_s : 0,
                            .running_tokens = ROUTE_COST_DEFAULT_RUNNING_TOKENS, .min_move_blocks = 1, .moves = moves};
}

int route_cost_lender_step_parts(int n_layers) { return n_layers > 0 ? n_layers : ROUTE_COST_LIVE_LENDER_STEP_PARTS; }

double route_cost_lender_wait_s(const RouteCostModel *m, double lender_queue_s) {
    if (!(lender_queue_s > 0) || !(m->lender_step_tokens > 0)) return 0;
    double step_s = m->lender_step_tokens * m->s_per_token;
    if (m->lender_step_parts > 1) step_s /= m->lender_step_parts; /* it answers between layers, not steps */
    return lender_queue_s < step_s ? lender_queue_s : step_s;
}

RouteCostEstimate route_cost_estimate(const RouteCostModel *m, const RouteCostInput *in) {
    RouteCostEstimate e = {.queue_s = in->queue_s > 0 ? in->queue_s : 0};
    int bs = in->block_size > 0 ? in->block_size : 1;
    int local_tokens = in->local_blocks * bs;
    if (local_tokens > in->prompt_tokens) local_tokens = in->prompt_tokens;
    e.computed_tokens = in->prompt_tokens - local_tokens;
    int gain = in->source_blocks - in->local_blocks;
    int min_gain = m->min_move_blocks > 0 ? m->min_move_blocks : 1;
    if (m->moves && in->can_move && gain >= min_gain) {
        int gain_tokens = gain * bs;
        if (gain_tokens > e.computed_tokens) gain_tokens = e.computed_tokens;
        double rate = in->link_bytes_per_s > 0 ? in->link_bytes_per_s : m->link_bytes_per_s;
        double move_s = route_cost_lender_wait_s(m, in->lender_queue_s) + gain_tokens * in->bytes_per_token / rate + m->move_latency_s;
        e.recompute_s = gain_tokens * m->s_per_token;
        bool in_time = !(m->move_timeout_s > 0) || move_s < m->move_timeout_s;
        if (gain_tokens > 0 && in_time && move_s < e.recompute_s) {
            e.move_s = move_s;
            e.moved_blocks = gain;
            e.computed_tokens -= gain_tokens;
        }
    }
    e.compute_s = e.computed_tokens * m->s_per_token;
    long new_blocks = (in->prompt_tokens - local_tokens) / bs;
    if (in->free_blocks >= 0 && new_blocks > in->free_blocks) e.evicted_s = (double)(new_blocks - in->free_blocks) * bs * m->s_per_token;
    e.ttft_s = e.queue_s + e.move_s + e.compute_s;
    return e;
}

double route_cost_work_s(const RouteCostEstimate *e) { return e->compute_s + e->evicted_s; }

double route_cost_score(const RouteCostEstimate *e, double delayed_requests) {
    return e->ttft_s + (delayed_requests > 0 ? delayed_requests * route_cost_work_s(e) : 0);
}

/* An exponentially weighted average in the log domain (rates spread over orders of magnitude),
 * with weight w for the sample (0.5 for the first one). */
static double follow_w(double current, double sample, long samples, double w) {
    if (!(sample > 0) || !isfinite(sample)) return current;
    if (samples == 0) w = 0.5;
    return exp((1 - w) * log(current) + w * log(sample));
}

static double follow(double current, double sample, long samples) { return follow_w(current, sample, samples, ROUTE_COST_LEARN_WEIGHT); }

void route_cost_learn(RouteCostModel *m, double ttft_s, double ahead_tokens, int computed_tokens, double moved_bytes) {
    if (!(ttft_s > 0) || !isfinite(ttft_s)) return;
    if (ahead_tokens < 0) ahead_tokens = 0;
    if (moved_bytes <= 0) {
        double tokens = ahead_tokens + (computed_tokens > 0 ? computed_tokens : 0);
        if (tokens < ROUTE_COST_MIN_SAMPLE_TOKENS) return; /* a few tokens: the TTFT is mostly fixed overhead, not prefill */
        m->s_per_token = follow(m->s_per_token, ttft_s / tokens, m->prefill_samples++);
        return;
    }
    double move_s = ttft_s - (ahead_tokens + (computed_tokens > 0 ? computed_tokens : 0)) * m->s_per_token - m->move_latency_s;
    if (move_s > ttft_s) move_s = ttft_s;
    if (move_s < ROUTE_COST_MOVE_FLOOR * ttft_s) move_s = ROUTE_COST_MOVE_FLOOR * ttft_s;
    /* The residual holds whatever the model missed besides the move, so a sample is a lower bound on
     * the rate: followed at once upward, slowly downward. */
    double sample = moved_bytes / move_s;
    double w = sample > m->link_bytes_per_s ? 0.5 : ROUTE_COST_LEARN_WEIGHT / 4;
    m->link_bytes_per_s = follow_w(m->link_bytes_per_s, sample, 1, w);
    m->link_samples++;
}

void route_link_learn(RouteLinkRate *l, double bytes, double seconds, int link) {
    if (!(bytes > 0) || !(seconds > 0) || !isfinite(bytes) || !isfinite(seconds)) return;
    double sample = bytes / seconds;
    if (l->samples > 0 && l->link != link) l->samples = 0; /* another link: start afresh */
    l->bytes_per_s = l->samples == 0 ? sample : follow_w(l->bytes_per_s, sample, l->samples, ROUTE_LINK_WEIGHT);
    l->link = link;
    l->samples++;
}
