/* Dispatch by name, parameter defaults, and each workflow's lifecycle: created on its first stage,
 * one pending stage at a time (asked again, the same stage comes back), freed when it ends. */
#include "workload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workload_kind.h"

enum { DEFAULT_CONTEXT_TOKENS = 4096, DEFAULT_FANOUT = 4, MAX_CONTEXT_TOKENS = 1 << 20, MAX_WORKFLOWS = 10000000 };

typedef struct {
    void *state; /* the kind's per-workflow state; NULL before the first stage and after the end */
    int ended;
    int pending;      /* calls of the stage returned and not yet delivered */
    AgentCall *stage; /* (WORKLOAD_MAX_FANOUT) while the workflow runs */
} WorkflowSlot;

struct Workload {
    const WorkloadKind *kind;
    WorkloadParams params;
    void *shared;
    WorkflowSlot *slots; /* (n_workflows) */
};

static const WorkloadKind *const kinds[] = {&wl_kind_codegen,      &wl_kind_factcheck,      &wl_kind_pipeline,
                                            &wl_kind_react_lora,   &wl_kind_mapreduce_lora, &wl_kind_edit_replay,
                                            &wl_kind_cross_tenant, &wl_kind_templates};
#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

const char *const *workload_names(void) {
    static const char *const names[] = {"codegen",     "factcheck",    "pipeline",  "react-lora", "mapreduce-lora",
                                        "edit-replay", "cross-tenant", "templates", NULL};
    return names;
}

static const WorkloadKind *find_kind(const char *name) {
    for (int i = 0; name && i < N_KINDS; i++)
        if (strcmp(kinds[i]->name, name) == 0) return kinds[i];
    return NULL;
}

const char *workload_summary(const char *name) {
    const WorkloadKind *k = find_kind(name);
    return k ? k->summary : NULL;
}

/* Fills zero fields with defaults and range-checks the rest. */
static int normalize_params(const char *name, const WorkloadParams *in, WorkloadParams *out, BraidError *err) {
    if (!in) return braid_error_set(err, "workload %s: no parameters given", name);
    *out = *in;
    if (out->n_workflows < 1 || out->n_workflows > MAX_WORKFLOWS)
        return braid_error_set(err, "workload %s: n_workflows must be in [1, %d], got %d", name, MAX_WORKFLOWS, out->n_workflows);
    if (out->context_tokens == 0) out->context_tokens = DEFAULT_CONTEXT_TOKENS;
    if (out->context_tokens < 1 || out->context_tokens > MAX_CONTEXT_TOKENS)
        return braid_error_set(err, "workload %s: context_tokens must be in [1, %d], got %d", name, MAX_CONTEXT_TOKENS,
                               out->context_tokens);
    if (out->fanout == 0) out->fanout = DEFAULT_FANOUT;
    if (out->fanout < 1 || out->fanout > WORKLOAD_MAX_FANOUT)
        return braid_error_set(err, "workload %s: fanout must be in [1, %d], got %d", name, WORKLOAD_MAX_FANOUT, out->fanout);
    if (out->scale == 0) out->scale = 1.0;
    if (!(out->scale >= 0.001 && out->scale <= 1000))
        return braid_error_set(err, "workload %s: scale must be in [0.001, 1000], got %g", name, out->scale);
    if (out->noise_free != 0 && out->noise_free != 1)
        return braid_error_set(err, "workload %s: noise_free must be 0 or 1, got %d", name, out->noise_free);
    return 0;
}

Workload *workload_create(const char *name, const WorkloadParams *params, BraidError *err) {
    const WorkloadKind *kind = find_kind(name);
    if (!kind) {
        braid_error_set(err,
                        "unknown workload '%s' (known: codegen, factcheck, pipeline, react-lora, mapreduce-lora, "
                        "edit-replay, cross-tenant, templates)",
                        name ? name : "(null)");
        return NULL;
    }
    Workload *w = calloc(1, sizeof *w);
    if (!w) {
        braid_error_set(err, "workload %s: out of memory", name);
        return NULL;
    }
    w->kind = kind;
    if (normalize_params(name, params, &w->params, err)) {
        free(w);
        return NULL;
    }
    w->slots = calloc((size_t)w->params.n_workflows, sizeof *w->slots);
    if (!w->slots) {
        braid_error_set(err, "workload %s: out of memory for %d workflows", name, w->params.n_workflows);
        free(w);
        return NULL;
    }
    w->shared = kind->shared_create(&w->params, err);
    if (!w->shared) {
        braid_error_wrap(err, "workload %s", name);
        free(w->slots);
        free(w);
        return NULL;
    }
    return w;
}

int workload_count(const Workload *w) { return w->params.n_workflows; }

static int check_index(const Workload *w, int i, BraidError *err) {
    if (i >= 0 && i < w->params.n_workflows) return 0;
    return braid_error_set(err, "workload %s: workflow index %d out of range [0, %d)", w->kind->name, i, w->params.n_workflows);
}

static void release_slot(const Workload *w, WorkflowSlot *s) {
    if (s->stage) wl_calls_release(s->stage, s->pending);
    free(s->stage);
    if (s->state) w->kind->flow_free(s->state);
    s->stage = NULL;
    s->state = NULL;
    s->pending = 0;
}

/* Creates the workflow's state on its first stage. */
static int start_slot(Workload *w, WorkflowSlot *s, int i, BraidError *err) {
    if (s->state) return 0;
    s->stage = calloc(WORKLOAD_MAX_FANOUT, sizeof *s->stage);
    s->state = s->stage ? w->kind->flow_create(w->shared, &w->params, i, err) : NULL;
    if (s->state) return 0;
    if (!s->stage) braid_error_set(err, "out of memory");
    free(s->stage);
    s->stage = NULL;
    return braid_error_wrap(err, "workload %s: workflow %d", w->kind->name, i);
}

static int copy_stage(const Workload *w, const WorkflowSlot *s, int i, AgentCall *calls, int max_calls, BraidError *err) {
    if (s->pending > max_calls)
        return braid_error_set(err, "workload %s: workflow %d's stage has %d calls, the caller takes at most %d", w->kind->name,
                               i, s->pending, max_calls);
    memcpy(calls, s->stage, (size_t)s->pending * sizeof *calls);
    return s->pending;
}

int workload_next_stage(Workload *w, int i, AgentCall *calls, int max_calls, BraidError *err) {
    if (check_index(w, i, err)) return -1;
    WorkflowSlot *s = &w->slots[i];
    if (s->ended) return 0;
    if (s->pending) return copy_stage(w, s, i, calls, max_calls, err);
    if (start_slot(w, s, i, err)) return -1;
    int n = w->kind->flow_next(w->shared, s->state, s->stage, err);
    if (n < 0) return braid_error_wrap(err, "workload %s: workflow %d", w->kind->name, i);
    if (n == 0) {
        s->ended = 1;
        release_slot(w, s);
        return 0;
    }
    for (int c = 0; c < n; c++) snprintf(s->stage[c].workflow, sizeof s->stage[c].workflow, "w%d", i);
    s->pending = n;
    return copy_stage(w, s, i, calls, max_calls, err);
}

int workload_deliver(Workload *w, int i, const char *const *outputs, int n, BraidError *err) {
    if (check_index(w, i, err)) return -1;
    WorkflowSlot *s = &w->slots[i];
    if (!s->pending) return braid_error_set(err, "workload %s: workflow %d has no stage waiting for outputs", w->kind->name, i);
    if (n != s->pending)
        return braid_error_set(err, "workload %s: workflow %d's stage has %d calls, %d outputs delivered", w->kind->name, i,
                               s->pending, n);
    if (w->kind->flow_deliver(w->shared, s->state, outputs, n, err))
        return braid_error_wrap(err, "workload %s: workflow %d", w->kind->name, i);
    wl_calls_release(s->stage, s->pending);
    s->pending = 0;
    return 0;
}

void workload_free(Workload *w) {
    if (!w) return;
    for (int i = 0; i < w->params.n_workflows; i++) release_slot(w, &w->slots[i]);
    free(w->slots);
    w->kind->shared_free(w->shared);
    free(w);
}
