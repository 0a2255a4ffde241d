#include "worker/sched_forkkv.h"

#include <stdio.h>

#include "common/log.h"

bool sched_forked(const Scheduler *s, const SchedRequest *r) { return s->forkkv && r->lora_id > 0; }

int sched_forkkv_add(Scheduler *s, SchedRequest *r) {
    if (!sched_forked(s, r)) return 0;
    BraidError err;
    if (residual_cache_identity(&s->residual, &r->res, r->tenant, r->adapter, &err)) {
        snprintf(r->error, sizeof r->error, "%s", err.msg);
        return -1;
    }
    int need = (r->n_prompt + r->max_tokens + s->block_size - 1) / s->block_size, total = residual_cache_total(&s->residual);
    if (need > total) {
        snprintf(r->error, sizeof r->error,
                 "request needs %d residual blocks (%d prompt + %d max_tokens tokens) but the ForkKV residual pool holds only "
                 "%d; lower max_tokens or start with more --residual-blocks",
                 need, r->n_prompt, r->max_tokens, total);
        return -1;
    }
    return 0;
}

int sched_forkkv_admit(Scheduler *s, SchedRequest *r, BraidError *err) {
    r->base_write_from = r->n_computed;
    r->res.matched_tokens = 0;
    if (!sched_forked(s, r)) return 0;
    if (s->cache_enabled && residual_cache_admit(&s->residual, &r->res, r->tokens, r->n_tokens, err)) return -1;
    if (r->res.matched_tokens < r->n_computed) r->n_computed = r->res.matched_tokens;
    return 0;
}

int sched_forkkv_ensure(Scheduler *s, SchedRequest *r, int tokens, BraidError *err) {
    if (!sched_forked(s, r)) return 0;
    return residual_cache_grow(&s->residual, &r->res, tokens, err);
}

void sched_forkkv_commit(Scheduler *s, SchedRequest *r, int n_full, bool relock) {
    if (!sched_forked(s, r) || n_full <= 0) return;
    BraidError err;
    if (residual_cache_commit(&s->residual, &r->res, r->tokens, n_full, relock, &err))
        LOG_WARN("sched", "req %s: residual cache insert failed: %s", r->id, err.msg);
}

void sched_forkkv_release(Scheduler *s, SchedRequest *r) {
    if (sched_forked(s, r)) residual_cache_release(&s->residual, &r->res);
}

void sched_forkkv_count_first(Scheduler *s, const SchedRequest *r, int base_tokens) {
    if (!sched_forked(s, r)) return;
    int res_tokens = r->res.matched_tokens;
    s->counters.forkkv_requests++;
    s->counters.residual_hit_tokens += (uint64_t)res_tokens;
    s->counters.fork_tokens += (uint64_t)(base_tokens > res_tokens ? base_tokens - res_tokens : 0);
    s->counters.partial_hit_tokens += (uint64_t)(res_tokens > base_tokens ? res_tokens - base_tokens : 0);
}
