/*
 * workflow_tracker.c — per-workflow call history with bounded memory (contract in
 * workflow_tracker.h).
 *
 * Entries live in a fixed array of max_workflows slots. A StrMap maps names to slot indices; it
 * cannot delete, so a forgotten name's value becomes -1 and the map is rebuilt from the live
 * entries once the dead keys outnumber max_workflows (amortized O(1), and the map stays within
 * 2 x max_workflows keys). Active entries sit on a list in idle_since order (head = idle longest:
 * the last call, the last release of a hold, or the last expiry pass that found it held), retired
 * ones on a list in retirement order (head = retired longest ago); free slots on a stack.
 */
#include "predict/workflow_tracker.h"

#include <stdlib.h>
#include <string.h>

#include "common/strmap.h"

enum { LIST_ACTIVE = 0, LIST_RETIRED = 1 };

typedef struct {
    char *name;       /* NULL = free slot */
    int32_t ring[WORKFLOW_TRACKER_HISTORY]; /* agent ids; ring[(calls - 1) % H] is the latest */
    uint64_t calls;
    double first_seen, last_seen, retired_at;
    double idle_since; /* the idle clock's start: the last call or release (or expiry pass, when held) */
    int held;          /* requests in flight (workflow_tracker_hold minus releases): never idle while > 0 */
    int active, ended;
    int prev, next;   /* the list it is on (-1 = none) */
} Entry;

typedef struct {
    int head, tail;
    int n;
} List;

struct WorkflowTracker {
    int max_workflows;
    double idle_timeout_s;
    Entry *e;          /* (max_workflows) */
    int *free_stack;   /* (max_workflows) */
    int n_free;
    List lists[2];
    StrMap *by_name;   /* name -> slot, or -1 for a forgotten name */
    size_t dead_keys;
    StrMap *agent_ids; /* agent name -> id */
    char **agents;
    int n_agents, cap_agents;
    const char *hist[WORKFLOW_TRACKER_HISTORY]; /* workflow_tracker_history's answer */
};

static void list_remove(WorkflowTracker *t, int which, int i) {
    List *l = &t->lists[which];
    Entry *x = &t->e[i];
    if (x->prev >= 0) t->e[x->prev].next = x->next;
    else l->head = x->next;
    if (x->next >= 0) t->e[x->next].prev = x->prev;
    else l->tail = x->prev;
    x->prev = x->next = -1;
    l->n--;
}

static void list_append(WorkflowTracker *t, int which, int i) {
    List *l = &t->lists[which];
    Entry *x = &t->e[i];
    x->prev = l->tail;
    x->next = -1;
    if (l->tail >= 0) t->e[l->tail].next = i;
    else l->head = i;
    l->tail = i;
    l->n++;
}

int workflow_tracker_create(WorkflowTracker **out, int max_workflows, double idle_timeout_s, BraidError *err) {
    *out = NULL;
    if (max_workflows < 1) return braid_error_set(err, "workflow tracker: max_workflows must be >= 1, got %d", max_workflows);
    WorkflowTracker *t = calloc(1, sizeof *t);
    if (!t) return braid_error_set(err, "workflow tracker: out of memory");
    t->max_workflows = max_workflows;
    t->idle_timeout_s = idle_timeout_s;
    t->e = calloc((size_t)max_workflows, sizeof *t->e);
    t->free_stack = malloc((size_t)max_workflows * sizeof *t->free_stack);
    t->by_name = strmap_create((size_t)(max_workflows < 1024 ? max_workflows : 1024));
    t->agent_ids = strmap_create(64);
    if (!t->e || !t->free_stack || !t->by_name || !t->agent_ids) {
        workflow_tracker_free(t);
        return braid_error_set(err, "workflow tracker: out of memory for %d workflows", max_workflows);
    }
    for (int i = 0; i < max_workflows; i++) {
        t->free_stack[i] = max_workflows - 1 - i; /* slot 0 first */
        t->e[i].prev = t->e[i].next = -1;
    }
    t->n_free = max_workflows;
    for (int l = 0; l < 2; l++) t->lists[l] = (List){-1, -1, 0};
    *out = t;
    return 0;
}

void workflow_tracker_free(WorkflowTracker *t) {
    if (!t) return;
    if (t->e)
        for (int i = 0; i < t->max_workflows; i++) free(t->e[i].name);
    free(t->e);
    free(t->free_stack);
    strmap_destroy(t->by_name);
    strmap_destroy(t->agent_ids);
    for (int i = 0; i < t->n_agents; i++) free(t->agents[i]);
    free(t->agents);
    free(t);
}

static int find(const WorkflowTracker *t, const char *name) {
    int32_t v;
    if (!name || !strmap_get(t->by_name, name, strlen(name), &v) || v < 0) return -1;
    /* The entry must still hold this name (a forgotten name whose -1 could not be stored). */
    return t->e[v].name && strcmp(t->e[v].name, name) == 0 ? v : -1;
}

/* Rebuilds the name map from the live entries (dropping forgotten keys). */
static int rebuild_map(WorkflowTracker *t) {
    StrMap *m = strmap_create((size_t)(t->max_workflows - t->n_free) + 16);
    if (!m) return -1;
    for (int i = 0; i < t->max_workflows; i++)
        if (t->e[i].name && strmap_put(m, t->e[i].name, strlen(t->e[i].name), i)) {
            strmap_destroy(m);
            return -1;
        }
    strmap_destroy(t->by_name);
    t->by_name = m;
    t->dead_keys = 0;
    return 0;
}

/* Forgets entry i (its name maps to -1 from now on). */
static void forget(WorkflowTracker *t, int i) {
    Entry *x = &t->e[i];
    list_remove(t, x->active ? LIST_ACTIVE : LIST_RETIRED, i);
    /* Overwriting an existing key never allocates, so this cannot fail. */
    strmap_put(t->by_name, x->name, strlen(x->name), -1);
    t->dead_keys++;
    free(x->name);
    x->name = NULL;
    t->free_stack[t->n_free++] = i;
}

static int intern_agent(WorkflowTracker *t, const char *agent, BraidError *err) {
    size_t len = strlen(agent);
    int32_t v;
    if (strmap_get(t->agent_ids, agent, len, &v)) return v;
    if (t->n_agents >= WORKFLOW_TRACKER_MAX_AGENTS)
        return braid_error_set(err, "workflow tracker: more than %d distinct agent names", WORKFLOW_TRACKER_MAX_AGENTS);
    if (t->n_agents == t->cap_agents) {
        int cap = t->cap_agents ? t->cap_agents * 2 : 16;
        char **a = realloc(t->agents, (size_t)cap * sizeof *a);
        if (!a) return braid_error_set(err, "workflow tracker: out of memory");
        t->agents = a;
        t->cap_agents = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return braid_error_set(err, "workflow tracker: out of memory");
    memcpy(copy, agent, len + 1);
    if (strmap_put(t->agent_ids, agent, len, t->n_agents)) {
        free(copy);
        return braid_error_set(err, "workflow tracker: out of memory");
    }
    t->agents[t->n_agents] = copy;
    return t->n_agents++;
}

int workflow_tracker_call(WorkflowTracker *t, const char *workflow, const char *agent, double now, BraidError *err) {
    if (!workflow || !agent) return braid_error_set(err, "workflow tracker: call: NULL %s name", workflow ? "agent" : "workflow");
    size_t wlen = strnlen(workflow, WORKFLOW_TRACKER_MAX_NAME + 1);
    if (wlen > WORKFLOW_TRACKER_MAX_NAME || strnlen(agent, WORKFLOW_TRACKER_MAX_NAME + 1) > WORKFLOW_TRACKER_MAX_NAME)
        return braid_error_set(err, "workflow tracker: call: a %s name longer than %d bytes", wlen > WORKFLOW_TRACKER_MAX_NAME ? "workflow" : "agent",
                               WORKFLOW_TRACKER_MAX_NAME);
    int agent_id = intern_agent(t, agent, err);
    if (agent_id < 0) return -1;
    int i = find(t, workflow);
    if (i < 0) {
        /* A new workflow: make room, then take a free slot. */
        char *name = malloc(wlen + 1);
        if (!name) return braid_error_set(err, "workflow tracker: out of memory");
        memcpy(name, workflow, wlen + 1);
        if (t->dead_keys >= (size_t)t->max_workflows && rebuild_map(t)) {
            free(name);
            return braid_error_set(err, "workflow tracker: out of memory");
        }
        int32_t old;
        int reused_key = strmap_get(t->by_name, workflow, wlen, &old); /* a forgotten name: its key is still there */
        int victim = -1;
        if (t->n_free) i = t->free_stack[t->n_free - 1];
        else i = victim = t->lists[LIST_RETIRED].n ? t->lists[LIST_RETIRED].head : t->lists[LIST_ACTIVE].head;
        if (strmap_put(t->by_name, workflow, wlen, i)) { /* first, so a failure changes nothing */
            free(name);
            return braid_error_set(err, "workflow tracker: out of memory");
        }
        if (victim >= 0) forget(t, victim); /* full: the retired one retired longest ago, else the LRU active one */
        t->n_free--;
        if (reused_key) t->dead_keys--;
        Entry *x = &t->e[i];
        *x = (Entry){.name = name, .first_seen = now, .active = 1, .prev = -1, .next = -1};
        list_append(t, LIST_ACTIVE, i);
    } else {
        Entry *x = &t->e[i];
        if (!x->active) {
            list_remove(t, LIST_RETIRED, i);
            if (x->ended) { /* a new run under the same name */
                x->calls = 0;
                x->first_seen = now;
            }
            x->active = 1;
            x->ended = 0;
        } else
            list_remove(t, LIST_ACTIVE, i);
        list_append(t, LIST_ACTIVE, i);
    }
    Entry *x = &t->e[i];
    x->ring[x->calls % WORKFLOW_TRACKER_HISTORY] = agent_id;
    x->calls++;
    x->last_seen = now;
    x->idle_since = now;
    return 0;
}

int workflow_tracker_hold(WorkflowTracker *t, const char *workflow) {
    int i = find(t, workflow);
    if (i < 0) return 0;
    t->e[i].held++;
    return 1;
}

void workflow_tracker_release(WorkflowTracker *t, const char *workflow, double now) {
    int i = find(t, workflow);
    if (i < 0) return; /* forgotten while held (the tracker was full): nothing to release */
    Entry *x = &t->e[i];
    if (x->held > 0) x->held--;
    if (!x->active) return;
    /* Idle from now on: to the tail of the active list (times are non-decreasing, so it stays in
     * idle_since order). */
    x->idle_since = now;
    list_remove(t, LIST_ACTIVE, i);
    list_append(t, LIST_ACTIVE, i);
}

int workflow_tracker_history(WorkflowTracker *t, const char *workflow, const char *const **agents, int *n) {
    int i = find(t, workflow);
    if (i < 0) {
        *agents = NULL;
        *n = 0;
        return 0;
    }
    const Entry *x = &t->e[i];
    int h = x->calls < WORKFLOW_TRACKER_HISTORY ? (int)x->calls : WORKFLOW_TRACKER_HISTORY;
    uint64_t first = x->calls - (uint64_t)h;
    for (int j = 0; j < h; j++) t->hist[j] = t->agents[x->ring[(first + (uint64_t)j) % WORKFLOW_TRACKER_HISTORY]];
    *agents = t->hist;
    *n = h;
    return 1;
}

int workflow_tracker_info(const WorkflowTracker *t, const char *workflow, WorkflowInfo *info) {
    int i = find(t, workflow);
    if (i < 0) return 0;
    const Entry *x = &t->e[i];
    *info = (WorkflowInfo){.active = x->active, .ended = x->ended, .calls = x->calls, .first_seen = x->first_seen,
                           .last_seen = x->last_seen, .retired_at = x->retired_at,
                           .n_history = x->calls < WORKFLOW_TRACKER_HISTORY ? (int)x->calls : WORKFLOW_TRACKER_HISTORY};
    return 1;
}

static void retire(WorkflowTracker *t, int i, double now, int ended) {
    Entry *x = &t->e[i];
    list_remove(t, LIST_ACTIVE, i);
    x->active = 0;
    x->ended = ended;
    x->retired_at = now;
    list_append(t, LIST_RETIRED, i);
}

void workflow_tracker_end(WorkflowTracker *t, const char *workflow, double now) {
    int i = find(t, workflow);
    if (i < 0) return;
    Entry *x = &t->e[i];
    if (x->active) retire(t, i, now, 1);
    else x->ended = 1; /* retired for idleness, now known to be over: a later call starts afresh */
}

int workflow_tracker_expire(WorkflowTracker *t, double now, void (*retired)(void *ctx, const char *workflow), void *ctx) {
    if (!(t->idle_timeout_s > 0)) return 0;
    int n = 0;
    while (t->lists[LIST_ACTIVE].head >= 0) {
        int i = t->lists[LIST_ACTIVE].head;
        if (!(now - t->e[i].idle_since > t->idle_timeout_s)) break;
        if (t->e[i].held > 0) {
            /* A request of it is queued or running: busy, not idle. Its clock restarts now (the
             * loop ends: now - now is not past a positive timeout). */
            t->e[i].idle_since = now;
            list_remove(t, LIST_ACTIVE, i);
            list_append(t, LIST_ACTIVE, i);
            continue;
        }
        retire(t, i, now, 0);
        if (retired) retired(ctx, t->e[i].name);
        n++;
    }
    return n;
}

int workflow_tracker_count(const WorkflowTracker *t) { return t->max_workflows - t->n_free; }
int workflow_tracker_active(const WorkflowTracker *t) { return t->lists[LIST_ACTIVE].n; }
