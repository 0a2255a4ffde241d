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

int sched_fair_pick(SchedFair *f, SchedRequest *const *waiting, int n, double now) {
    int best = 0;
    double best_share = 0;
    for (int i = 0; i < n; i++) {
        double s = share(f, waiting[i], now);
        if (i == 0 || s < best_share) best = i, best_share = s;
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

void sched_fair_begin_step(SchedFair *f, SchedRequest *const *running, int n_running, SchedRequest *const *waiting, int n_waiting,
                           int budget, int block_size, double now) {
    prune(f, now);
    for (int i = 0; i < f->n; i++) f->t[i].active = false, f->t[i].cap_left = -1;
    double total_weight = 0;
    int active = 0;
    for (int k = 0; k < n_running + n_waiting; k++) {
        const SchedRequest *r = k < n_running ? running[k] : waiting[k - n_running];
        SchedFairTenant *t = tenant_of(f, name_of(r), weight_of(r), now);
        if (!t || t->active) continue;
        t->active = true;
        total_weight += t->weight;
        active++;
    }
    if (active < 2) return; /* one tenant: the whole budget is its */
    for (int i = 0; i < f->n; i++) {
        if (!f->t[i].active) continue;
        int cap = (int)(budget * f->t[i].weight / total_weight);
        f->t[i].cap_left = cap > block_size ? cap : block_size;
    }
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

int sched_fair_allowance(SchedFair *f, const SchedRequest *r, int want) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].tenant, name_of(r)) == 0) return f->t[i].cap_left < 0 || f->t[i].cap_left >= want ? want : f->t[i].cap_left;
    return want;
}

void sched_fair_charge(SchedFair *f, const SchedRequest *r, int tokens, bool prefill, double now) {
    SchedFairTenant *t = tenant_of(f, name_of(r), weight_of(r), now);
    if (!t || tokens <= 0) return;
    t->served = decayed(t, now) + tokens;
    t->at = now;
    if (prefill && t->cap_left >= 0) t->cap_left = t->cap_left > tokens ? t->cap_left - tokens : 0;
}
