/*
 * workflow_tracker.h — what each workflow has done so far, for the next-agent predictor
 * (agent_predictor.h) and lifecycle-aware cache policies: per workflow name, the agents it called
 * (the last WORKFLOW_TRACKER_HISTORY, oldest first; every call is counted), its call count, when
 * it was first and last seen, and whether it is active or retired.
 *
 * Lifecycle: a workflow becomes active on its first call. It is retired by an explicit end
 * (workflow_tracker_end) or, in workflow_tracker_expire, when idle longer than the timeout. Idle
 * means no request of it in flight: a caller that serves the calls (the coordinator) holds the
 * workflow while each request is queued or running (workflow_tracker_hold / _release), and the idle
 * clock runs from the later of the last call and the last release. Without that, a loaded server
 * whose requests wait longer than the timeout retired workflows mid-request, and a lifecycle-aware
 * cache policy (pbkv) then evicted their history first (bench/RESULTS.md, issue 35). A call
 * to a workflow that was ended explicitly starts a new run of that name (history and count reset);
 * a call to one retired for being idle resumes it (it was only slow), history kept.
 *
 * Memory is bounded: at most max_workflows entries, each with a fixed-size history. When a new
 * workflow arrives and the tracker is full, it forgets a retired workflow first (the one retired
 * longest ago), else the least recently called active one. Agent names are interned once (at most
 * WORKFLOW_TRACKER_MAX_AGENTS distinct names); workflow names are copied per entry. All operations
 * are O(1) on average (a hash map by name and two intrusive lists), except expire, which is
 * O(number retired).
 *
 * Times are seconds on any clock the caller likes, non-decreasing across calls (the idle order is
 * the call order).
 *
 * Who calls it: the coordinator (one call per request it routes, an end when a client marks a
 * workflow finished), the trace simulator, and `braid train-predictor`. Not thread-safe: one
 * caller at a time. The tracker owns all its memory; workflow_tracker_free releases it.
 */
#ifndef BRAID_PREDICT_WORKFLOW_TRACKER_H
#define BRAID_PREDICT_WORKFLOW_TRACKER_H

#include <stdint.h>

#include "common/error.h"

#define WORKFLOW_TRACKER_HISTORY 8
#define WORKFLOW_TRACKER_MAX_AGENTS 65536
#define WORKFLOW_TRACKER_MAX_NAME 4096

typedef struct WorkflowTracker WorkflowTracker;

typedef struct {
    int active;            /* 1 active, 0 retired */
    int ended;             /* retired by an explicit end (0 when retired for idleness, or active) */
    uint64_t calls;        /* calls in this run */
    double first_seen, last_seen, retired_at;
    int n_history;         /* agents held: min(calls, WORKFLOW_TRACKER_HISTORY) */
} WorkflowInfo;

/* max_workflows >= 1; idle_timeout_s <= 0 turns idle expiry off. */
int workflow_tracker_create(WorkflowTracker **t, int max_workflows, double idle_timeout_s, BraidError *err);
void workflow_tracker_free(WorkflowTracker *t);

/* Records that workflow called agent at time now. Returns 0, or -1 with err set for a NULL or
 * too long name (longer than WORKFLOW_TRACKER_MAX_NAME), too many distinct agent names, or out of
 * memory (the tracker is unchanged then). */
int workflow_tracker_call(WorkflowTracker *t, const char *workflow, const char *agent, double now, BraidError *err);

/* The workflow's last agents, oldest first, in *agents[0..*n-1] (pointers valid until the next
 * call into the tracker). Returns 1 when the workflow is tracked (active or retired), else 0 with
 * *agents = NULL and *n = 0. */
int workflow_tracker_history(WorkflowTracker *t, const char *workflow, const char *const **agents, int *n);
/* Fills *info; returns 1 when tracked, else 0. */
int workflow_tracker_info(const WorkflowTracker *t, const char *workflow, WorkflowInfo *info);

/* Retires the workflow (an explicit end); unknown or already ended workflows are ignored. */
void workflow_tracker_end(WorkflowTracker *t, const char *workflow, double now);

/* Retires every active workflow idle for longer than the timeout (no hold, and now minus the later
 * of its last call and its last release > timeout),
 * calling retired(ctx, name) for each (may be NULL; the name is valid during the callback, which
 * must not call into the tracker). Returns how many were retired. */
int workflow_tracker_expire(WorkflowTracker *t, double now, void (*retired)(void *ctx, const char *workflow), void *ctx);

/* A request of the workflow is in flight (queued or running): it does not expire until as many
 * releases came. Returns 1 when the workflow is tracked (call workflow_tracker_call first), else 0
 * and nothing is held. */
int workflow_tracker_hold(WorkflowTracker *t, const char *workflow);
/* One held request of the workflow finished (or failed) at time now: one hold fewer, and its idle
 * clock restarts at now. Unknown workflows (forgotten while held) are ignored. */
void workflow_tracker_release(WorkflowTracker *t, const char *workflow, double now);

/* Workflows tracked (active + retired), and active ones. */
int workflow_tracker_count(const WorkflowTracker *t);
int workflow_tracker_active(const WorkflowTracker *t);

#endif
