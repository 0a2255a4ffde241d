/*
 * sched_fair.h — weighted fair sharing of one instance between tenants (issue 37): which waiting
 * request is admitted next and how a step's prefill token budget is split, instead of first come,
 * first served across tenants.
 *
 * Each tenant (the request's cache namespace; "" for none) has a weight (the key file's weight=,
 * sent with each request; default 1) and a service count: the tokens the scheduler planned for its
 * requests (prefill chunks and decodes), decaying with a half-life of SCHED_FAIR_HALF_LIFE_S so
 * that only recent service counts. A tenant's share is service / weight.
 *  - Admission: the waiting request of the tenant with the least share is admitted next (first
 *    come, first served within a tenant; the earliest on ties).
 *  - Prefill: running requests get their prefill chunks in order of least share, and while more
 *    than one tenant has work on the instance (running or waiting) each tenant's prefill tokens in
 *    a step are capped at its weighted part of the step's budget (at least one block), so one
 *    tenant's long prompts cannot fill every step another tenant's decodes and short prompts run in.
 *    With one tenant the budget is the scheduler's alone (first come, first served, as before).
 * Pure over caller-given times; owned by the scheduler (scheduler.h); not thread-safe.
 */
#ifndef BRAID_WORKER_SCHED_FAIR_H
#define BRAID_WORKER_SCHED_FAIR_H

#include <stdbool.h>

#define SCHED_FAIR_HALF_LIFE_S 10.0
#define SCHED_FAIR_KEEP_TENANTS 64 /* past this many, tenants with no recent service are forgotten */

struct SchedRequest;

typedef struct {
    char *tenant;   /* owned; "" for none */
    double weight;
    double served;  /* decayed tokens, as of `at` */
    double at;
    int cap_left;   /* prefill tokens left to it in this step; -1: no cap */
    bool active;    /* has work in this step */
} SchedFairTenant;

typedef struct {
    SchedFairTenant *t;
    int n, cap;
    int *order;     /* scratch: running indices in share order */
    int cap_order;
} SchedFair;

void sched_fair_free(SchedFair *f);

/* Index into waiting[0..n) of the request to admit next (0 when n <= 1 or out of memory). */
int sched_fair_pick(SchedFair *f, struct SchedRequest *const *waiting, int n, double now);
/* Starts a step: marks the tenants with work and sets their prefill caps from budget. */
void sched_fair_begin_step(SchedFair *f, struct SchedRequest *const *running, int n_running, struct SchedRequest *const *waiting,
                           int n_waiting, int budget, int block_size, double now);
/* Running indices 0..n-1 in order of least share (a scratch array the scheduler must not keep);
 * NULL when out of memory (then the scheduler's own order is used). */
const int *sched_fair_order(SchedFair *f, struct SchedRequest *const *running, int n, double now);
/* Prefill tokens r's tenant may still take in this step, at most want. */
int sched_fair_allowance(SchedFair *f, const struct SchedRequest *r, int want);
/* r was planned `tokens` tokens in this step (prefill: prefill = true, counted against its cap). */
void sched_fair_charge(SchedFair *f, const struct SchedRequest *r, int tokens, bool prefill, double now);
/* The tenant's current share (service / weight), for tests. */
double sched_fair_share_of(SchedFair *f, const char *tenant, double now);

#endif
