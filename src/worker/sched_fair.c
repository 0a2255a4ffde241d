/* Weighted fair sharing between tenants; the contract is in sched_fair.h. */
#include "worker/sched_fair.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "worker/scheduler.h"

void sched_fair_free(SchedFair *f) {
    for (int i = 0; i < f->n; i++) free(f->t[i].tenant);
    free(f->t);
    free(f->order);
    memset(f, 0, sizeof *f);
}

static const char *name_of(const SchedRequest *r) { return r->tenant ? r->tenant : ""; }
static double weight_of(const SchedRequest *r) { return r->tenant_weight > 0 ? r->tenant_weight : 1.0; }

/* The tenant's entry (created with the request's weight; the latest weight wins), or NULL when out of memory. */
static SchedFairTenant *tenant_of(SchedFair *f, const char *name, double weight, double now) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].tenant, name) == 0) {
            if (weight > 0) f->t[i].weight = weight;
            return &f->t[i];
        }
    char *copy = strdup(name);
    if (!copy || braid_grow((void **)&f->t, &f->cap, f->n + 1, sizeof *f->t)) {
        free(copy);
        return NULL;
    }
    f->t[f->n] = (SchedFairTenant){.tenant = copy, .weight = weight > 0 ? weight : 1.0, .at = now, .cap_left = -1};
    return &f->t[f->n++];
}

static double decayed(const SchedFairTenant *t, double now) {
    double dt = now - t->at;
    return dt > 0 ? t->served * exp2(-dt / SCHED_FAIR_HALF_LIFE_S) : t->served;
}

static double share(SchedFair *f, const SchedRequest *r, double now) {
    SchedFairTenant *t = tenant_of(f, name_of(r), weight_of(r), now);
    return t ? decayed(t, now) / t->weight : 0;
}

double sched_fair_share_of(SchedFair *f, const char *tenant, double now) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].tenant, tenant ? tenant : "") == 0) return decayed(&f->t[i], now) / f->t[i].weight;
    return 0;
}

static SchedFairTenant *find(SchedFair *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].tenant, name) == 0) return &f->t[i];
    return NULL;
}

int sched_fair_allowance(SchedFair *f, const SchedRequest *r, int want) {
    if (!f->in_step) return want;
    int allowed = want < f->step_left ? want : f->step_left;
    const SchedFairTenant *t = find(f, name_of(r));
    if (t && t->cap_left >= 0 && t->cap_left < allowed) allowed = t->cap_left;
    return allowed > 0 ? allowed : 0;
}

int sched_fair_pick(SchedFair *f, SchedRequest *const *waiting, int n, double now) {
    int best = -1;
    double best_share = 0;
    for (int i = 0; i < n; i++) {
        if (sched_fair_allowance(f, waiting[i], 1) <= 0) continue; /* its tenant's part of the step is used */
        double s = share(f, waiting[i], now);
        if (best < 0 || s < best_share) best = i, best_share = s;
    }
    return best;
}

/* Forgets tenants whose service has decayed to nothing once the table is large (clients without API
 * keys name tenants freely; the table must not grow with every name ever seen). */
static void prune(SchedFair *f, double now) {
    if (f->n <= SCHED_FAIR_KEEP_TENANTS) return;
    for (int i = 0; i < f->n;) {
        if (decayed(&f->t[i], now) < 0.5) {
            free(f->t[i].tenant);
            f->t[i] = f->t[--f->n];
        } else {
            i++;
        }
    }
}

/* Prefill tokens r still needs (its whole prompt when waiting: a cache hit may make it less). */
static int prefill_demand(const SchedRequest *r) {
    int left = r->n_tokens - r->n_computed;
    return r->state == REQ_RUNNING && left <= 1 ? 0 : left;
}

/* Weighted max-min split of the step's prefill tokens over the active tenants' demands: each gets
 * its weighted part, and what a tenant needs less than that goes to the others (water-filling),
 * so the capped pass already leaves nothing idle that a tenant could use. The parts add up to the
 * step (no minimum that would let the tenant planned first take another's part), at least 1 each. */
static void split_step(SchedFair *f, const int *demand) {
    int left = f->step_left;
    for (;;) {
        double weight = 0;
        for (int i = 0; i < f->n; i++)
            if (f->t[i].active && f->t[i].cap_left < 0) weight += f->t[i].weight;
        if (weight <= 0) break;
        bool settled = false; /* a tenant whose demand fits its part: give it that and split again */
        for (int i = 0; i < f->n; i++) {
            SchedFairTenant *t = &f->t[i];
            if (!t->active || t->cap_left >= 0 || demand[i] > left * t->weight / weight) continue;
            t->cap_left = demand[i];
            left -= demand[i];
            settled = true;
        }
        if (settled) continue;
        for (int i = 0; i < f->n; i++) {
            SchedFairTenant *t = &f->t[i];
            if (!t->active || t->cap_left >= 0) continue;
            int part = (int)(left * t->weight / weight);
            t->cap_left = part > 0 ? part : 1; /* a tiny weight still progresses */
        }
        break;
    }
}

void sched_fair_begin_step(SchedFair *f, SchedRequest *const *running, int n_running, SchedRequest *const *waiting, int n_waiting,
                           int budget, int step_tokens, double now) {
    prune(f, now);
    for (int i = 0; i < f->n; i++) f->t[i].active = false, f->t[i].cap_left = -1;
    f->in_step = true;
    f->step++;
    f->step_left = budget > 0 ? budget : 0;
    int active = 0, sharing = 0;
    for (int k = 0; k < n_running + n_waiting; k++) {
        const SchedRequest *r = k < n_running ? running[k] : waiting[k - n_running];
        SchedFairTenant *t = tenant_of(f, name_of(r), weight_of(r), now);
        if (!t || t->active) continue;
        t->active = true;
        t->last_step = f->step;
        active++;
    }
    for (int i = 0; i < f->n; i++) sharing += f->step - f->t[i].last_step <= SCHED_FAIR_LINGER_STEPS && f->t[i].last_step > 0;
    if (sharing < 2) return; /* one tenant: the whole budget is its */
    if (step_tokens <= 0) step_tokens = SCHED_FAIR_DEFAULT_STEP_TOKENS;
    if (f->step_left > step_tokens) f->step_left = step_tokens;
    if (active < 2) return; /* the other tenant lingers (sched_fair.h): a short step, no parts */
    int *demand = calloc((size_t)f->n, sizeof *demand);
    if (!demand) return; /* out of memory: no caps this step, the step's total still holds */
    for (int k = 0; k < n_running + n_waiting; k++) {
        const SchedRequest *r = k < n_running ? running[k] : waiting[k - n_running];
        SchedFairTenant *t = find(f, name_of(r));
        if (t) demand[t - f->t] += prefill_demand(r);
    }
    split_step(f, demand);
    free(demand);
}

bool sched_fair_release_caps(SchedFair *f) {
    for (int i = 0; i < f->n; i++) f->t[i].cap_left = -1;
    return f->in_step && f->step_left > 0;
}

typedef struct {
    int index;
    double share;
} Ranked;

static int by_share(const void *a, const void *b) {
    const Ranked *x = a, *y = b;
    if (x->share != y->share) return x->share < y->share ? -1 : 1;
    return x->index - y->index;
}

const int *sched_fair_order(SchedFair *f, SchedRequest *const *running, int n, double now) {
    if (n <= 0) return NULL;
    Ranked *ranked = malloc((size_t)n * sizeof *ranked);
    if (!ranked || braid_grow((void **)&f->order, &f->cap_order, n, sizeof *f->order)) {
        free(ranked);
        return NULL;
    }
    for (int i = 0; i < n; i++) ranked[i] = (Ranked){.index = i, .share = share(f, running[i], now)};
    qsort(ranked, (size_t)n, sizeof *ranked, by_share);
    for (int i = 0; i < n; i++) f->order[i] = ranked[i].index;
    free(ranked);
    return f->order;
}

void sched_fair_charge(SchedFair *f, const SchedRequest *r, int tokens, bool prefill, double now) {
    SchedFairTenant *t = tenant_of(f, name_of(r), weight_of(r), now);
    if (!t || tokens <= 0) return;
    t->served = decayed(t, now) + tokens;
    t->at = now;
    if (!prefill || !f->in_step) return;
    if (t->cap_left >= 0) t->cap_left = t->cap_left > tokens ? t->cap_left - tokens : 0;
    f->step_left = f->step_left > tokens ? f->step_left - tokens : 0;
}
