/*
 * sched_forkkv.h — the scheduler's part of ForkKV (--lora-cache shared; paper 002 § 5.2).
 *
 * With a shared base cache, the scheduler's KvCache is the base tree (keyed by tenant only: every
 * adapter and the base model read the same base blocks) and Scheduler.residual the residual tree
 * (cache/residual_cache.h). A request of an adapter ("forked") holds both: at admission its base
 * prefix (b tokens, the ordinary match) and its own residual prefix (r tokens) are held, and
 * prefill starts at min(b, r); the forward writes base K/V only from b on (below, the blocks are
 * shared and only read) and residuals only from r on (SchedRequest.base_write_from, res.matched_tokens).
 * Every block-table growth takes blocks in both pools; a short residual pool is pressure like a
 * short base pool (the scheduler waits or preempts). Computed full blocks enter both trees; release
 * drops both holds. Requests of the base model use the base tree only. The segment reuse and
 * directive copies (plan_copies) are not combined with a residual: forked requests skip them.
 * Counters: residual hit tokens, fork tokens (base cached, residual computed) and partial-hit tokens
 * (residual cached, base recomputed), at first admission.
 */
#ifndef BRAID_WORKER_SCHED_FORKKV_H
#define BRAID_WORKER_SCHED_FORKKV_H

#include <stdbool.h>

#include "worker/scheduler.h"

/* True when r runs with a residual (shared mode and an adapter). */
bool sched_forked(const Scheduler *s, const SchedRequest *r);
/* At sched_add: interns r's residual identity; refuses (message in r->error, -1) a request whose
 * blocks could never fit in the residual pool. */
int sched_forkkv_add(Scheduler *s, SchedRequest *r);
/* At admission, after the base prefix is held (r->n_computed = b): holds the residual prefix and
 * moves n_computed to min(b, r). -1 only when out of memory. */
int sched_forkkv_admit(Scheduler *s, SchedRequest *r, BraidError *err);
/* Grows r's residual table to `tokens` slots: 0, 1 when the residual pool is short, -1 on OOM. */
int sched_forkkv_ensure(Scheduler *s, SchedRequest *r, int tokens, BraidError *err);
/* r's first n_full residual blocks enter the residual tree (relock: r's lock moves there). */
void sched_forkkv_commit(Scheduler *s, SchedRequest *r, int n_full, bool relock);
void sched_forkkv_release(Scheduler *s, SchedRequest *r);
/* Counts r's first admission (residual hits, forks, partial hits). */
void sched_forkkv_count_first(Scheduler *s, const SchedRequest *r, int base_tokens);

#endif
