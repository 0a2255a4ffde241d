/*
 * sched_directives.h — the scheduler's side of a request's cache directives (cache_directive.h):
 * when each acts and what it reports.
 *   admission (before the prefix match): a forget splice drops the context's cache from its first
 *     edit on (once); an amortized splice's runs are planned with the other copies (scheduler.c);
 *   after the first admission: an amortized splice decays the context past its first edit, which
 *     the spliced sequence now supersedes (its blocks go first under pressure);
 *   at the finish: the hints act on the finished sequence's cached blocks (PIN within the
 *     scheduler's per-tenant budget), and directive_outcomes gets a JSON array with one object per
 *     directive: {"index", "op", "outcome": "accepted"|"clipped"|"deferred"|"rejected", ...counts,
 *     "reason" when not accepted}.
 * Called by scheduler.c only; not thread-safe (the scheduler's thread).
 */
#ifndef BRAID_WORKER_SCHED_DIRECTIVES_H
#define BRAID_WORKER_SCHED_DIRECTIVES_H

#include <stdbool.h>

#include "worker/scheduler.h"

int sched_directives_admit(Scheduler *s, SchedRequest *r, BraidError *err);
void sched_directives_placed(Scheduler *s, SchedRequest *r);
/* completed: the request ended normally (stop / length); otherwise the hints are not applied. */
void sched_directives_finish(Scheduler *s, SchedRequest *r, bool completed);

#endif
