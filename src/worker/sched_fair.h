/*
 * sched_fair.h — weighted fair sharing of one instance between tenants (issue 37): which waiting
 * request is admitted next, and how a step's prefill tokens are split, instead of first come,
 * first served across tenants.
 *
 * Each tenant (the request's cache namespace; "" for none) has a weight (the key file's weight=,
 * sent with each request; default 1) and a service count: the tokens the scheduler planned for its
 * requests (prefill chunks and decodes), decaying with a half-life of SCHED_FAIR_HALF_LIFE_S so
 * that only recent service counts. A tenant's share is service / weight. A tenant is active in a
 * step when it has a request on the instance (running or waiting).
 *  - Admission: the waiting request of the least-share tenant that may still prefill in this step
 *    is admitted next (first come, first served within a tenant; the earliest on ties).
 *  - The step's prefill tokens: with one active tenant, the whole budget (as first come, first
 *    served). With several, at most the shared step size (SchedConfig.fair_step_tokens): every
 *    step's cost is what each active tenant's decodes wait for, so no tenant's long prompts may
 *    make the steps of another's short request long. That amount is split in two passes:
 *      1. capped: running prefills in order of least share, then admissions, each tenant within
 *         its weighted part of the step (at least one block);
 *      2. work-conserving (sched_fair_release_caps): what pass 1 left (a tenant needed less than
 *         its part) goes to whoever still has prefill, in the same order.
 *    So a tenant with nothing to prefill takes nothing from the others, and a newcomer's prompt
 *    starts in the step after it arrives instead of behind another tenant's whole prefill.
 *    A tenant that had work in the last SCHED_FAIR_LINGER_STEPS steps still counts for the shared
 *    step size (not for the parts), so its next request does not wait behind a whole-budget step.
 * Pure over caller-given times; owned by the scheduler (scheduler.h) and driven by it in every
 * step; not thread-safe. Outside a step (before the first sched_fair_begin_step) nothing is capped.
 */
#ifndef BRAID_WORKER_SCHED_FAIR_H
#define BRAID_WORKER_SCHED_FAIR_H

#include <stdbool.h>

#define SCHED_FAIR_HALF_LIFE_S 10.0
#define SCHED_FAIR_KEEP_TENANTS 64 /* past this many, tenants with no recent service are forgotten */
/* Prefill tokens in a step while several tenants have work (SchedConfig.fair_step_tokens = 0).
 * On the CPU backend a step of ~64 tokens already runs the matmuls at their per-token ceiling
 * (bench/RESULTS.md, decode parts), so smaller chunks cost little throughput while they keep a
 * co-tenant's decode step near its own cost; on a GPU set it higher (--fair-step-tokens). */
#define SCHED_FAIR_DEFAULT_STEP_TOKENS 64
/* A tenant whose work ended less than this many steps ago still counts for the shared step size:
 * a tenant's next request usually follows its last one within a client round trip, and must not
 * find a whole-budget step of another tenant's in its way. */
#define SCHED_FAIR_LINGER_STEPS 256

struct SchedRequest;

typedef struct {
    char *tenant;   /* owned; "" for none */
    double weight;
    double served;  /* decayed tokens, as of `at` */
    double at;
    int cap_left;   /* prefill tokens left to it in this step's capped pass; -1: no cap */
    bool active;    /* has work in this step */
    unsigned long long last_step; /* the last step it had work in (0: none yet) */
} SchedFairTenant;

typedef struct {
    SchedFairTenant *t;
    int n, cap;
    int *order;     /* scratch: running indices in share order */
    int cap_order;
    bool in_step;   /* begin_step has run: step_left and the caps apply */
    int step_left;  /* prefill tokens the step may still take (all tenants together) */
    unsigned long long step; /* steps begun */
} SchedFair;

void sched_fair_free(SchedFair *f);

/* Index into waiting[0..n) of the request to admit next: the earliest request of the least-share
 * tenant that may still prefill in this step; -1 when none may (or n <= 0). */
int sched_fair_pick(SchedFair *f, struct SchedRequest *const *waiting, int n, double now);
/* Starts a step: marks the tenants with work, sets the step's prefill tokens (budget: what the
 * step has left after its decodes; with several active tenants at most step_tokens, <= 0 meaning
 * SCHED_FAIR_DEFAULT_STEP_TOKENS) and each active tenant's weighted part of them. */
void sched_fair_begin_step(SchedFair *f, struct SchedRequest *const *running, int n_running, struct SchedRequest *const *waiting,
                           int n_waiting, int budget, int step_tokens, double now);
/* Ends the capped pass: what is left of the step goes to any tenant. Returns whether any is left. */
bool sched_fair_release_caps(SchedFair *f);
/* Running indices 0..n-1 in order of least share (a scratch array the scheduler must not keep);
 * NULL when out of memory (then the scheduler's own order is used). */
const int *sched_fair_order(SchedFair *f, struct SchedRequest *const *running, int n, double now);
/* Prefill tokens r's tenant may still take in this step, at most want. */
int sched_fair_allowance(SchedFair *f, const struct SchedRequest *r, int want);
/* r was planned `tokens` tokens in this step (prefill: prefill = true, counted against the step). */
void sched_fair_charge(SchedFair *f, const struct SchedRequest *r, int tokens, bool prefill, double now);
/* The tenant's current share (service / weight), for tests. */
double sched_fair_share_of(SchedFair *f, const char *tenant, double now);

#endif
