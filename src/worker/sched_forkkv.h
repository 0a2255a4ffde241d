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
 *
 * --lora-cache auto: the same pools, but each adapted request is given either the fork above or a
 * separate cache: the base pool's namespace (tenant, adapter), its full adapted K/V there, plain
 * attention, no residual (SchedRequest.kv_separate; sched_forked is then false). Chosen at
 * sched_add and again at each admission attempt until the first succeeds (requests that arrive
 * together are admitted over time, by when more is measured); fixed from then on. The choice is
 * forkkv_cost.h's cost model; its measured inputs come from here: the presence of the prompt's
 * blocks in either tree and the regret of separate copies, by chained content hash
 * (cache/block_presence.h, fed by both trees' events: a peek that moves nothing in the caches), and
 * the seconds of each forward step (sched_forkkv_observe_step, from the engine). A request that
 * asks for approximate segment reuse or an amortized splice runs separate (those copies skip
 * forked requests, above). Nor does a request an idle pool could not hold forked (its base blocks
 * plus the carriers its residuals borrow from the unified pool; sched_add checked the base blocks
 * alone): it would wait at the head of the queue for room that never frees. Every adapted
 * request interns its residual identity and must fit the residual pool (sched_forkkv_add), since
 * it may fork at admission.
 */
#ifndef BRAID_WORKER_SCHED_FORKKV_H
#define BRAID_WORKER_SCHED_FORKKV_H

#include <stdbool.h>

#include "worker/forkkv_cost.h"
#include "worker/scheduler.h"

/* True when r runs with a residual (shared or auto mode, an adapter, and auto did not choose a
 * separate cache). */
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
/* Counts r's first admission (residual hits, forks, partial hits; auto: a separate request's regret). */
void sched_forkkv_count_first(Scheduler *s, const SchedRequest *r, int base_tokens);

/* --lora-cache auto: the cost model's state (measures the attention kernels on the model's shape,
 * tens of ms) and the trees' block presence. -1 with err when out of memory. */
int sched_forkkv_auto_init(Scheduler *s, const SchedConfig *cfg, BraidError *err);
void sched_forkkv_auto_free(Scheduler *s);
/* At sched_add, before r's identity is interned: sets r->kv_separate (auto mode, adapted r). */
void sched_forkkv_choose(Scheduler *s, SchedRequest *r);
/* At each admission attempt before the first succeeds (nothing held): decides again with what the
 * caches and the cost model know now (requests that arrive together are admitted over time) and
 * moves r's identity to the chosen namespace; the choice then holds for r's life. True when the
 * namespace moved (the caller re-marks r's waiting prefix under the new identity). */
bool sched_forkkv_rechoose(Scheduler *s, SchedRequest *r);
/* Every event of the base tree (residual false) or of the residual tree. */
void sched_forkkv_on_event(Scheduler *s, const CacheEvent *ev, bool residual);
/* One forward step: its tokens, of them those of one-token (decode) sequences, its seconds. */
void sched_forkkv_observe_step(Scheduler *s, int n_tokens, int n_decode, double seconds);
/* The cost model auto mode decides by (its measurements; tests may set them); NULL when not auto. */
ForkKvCost *sched_forkkv_cost(Scheduler *s);

#endif
