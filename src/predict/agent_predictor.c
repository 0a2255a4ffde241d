/*
 * agent_predictor.c — Markov-1/2 next-agent predictor with END (contract in agent_predictor.h).
 *
 * Contexts are small integers: 0 = START (nothing called yet, or nothing before the first call),
 * agent i = i + 1, and CTX_UNKNOWN for a name never seen (it has no rows). A Markov-2 context is
 * the pair (previous, last): (START, START) before the first call, (START, a) after one call.
 * Outcomes are agent ids, or OUT_END. Rows keep their observed outcomes as a short list of
 * (outcome, count) pairs; the smoothing is applied when a row is read, so adding an agent never
 * rewrites rows.
 *
 * File format, version 2 (all integers little-endian; version 1 files, without the graph line, load):
 *   "BRAIDPRD"                      8 bytes magic
 *   u32 version (1|2), u32 kind (1|2|3), u64 alpha (IEEE-754 double bits)
 *   u32 n_agents, then per agent: u32 length, length bytes (no NUL), in agent-id order
 *   row: the global outcome counts
 *   u32 n, then n x (u32 context, row): the Markov-1 rows
 *   u32 n, then n x (u32 previous context, u32 last context, row): the Markov-2 rows
 *   version 2 only: u64 length, then the graph model's section (graph_model.h; length 0 = none,
 *   present exactly when kind = 3, whose counts are Markov-2)
 *   u64 FNV-1a-64 of every byte before it
 *   where row = u32 n_entries, then n_entries x (i32 outcome (-1 = END), u32 count > 0).
 */
#include "predict/agent_predictor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strmap.h"
#include "predict/graph_model.h"

#define OUT_END (-1)
#define CTX_START 0
#define CTX_UNKNOWN (-1)
#define MAX_K 64
#define MAX_PAIR_STATES 1024   /* per step; mass beyond it keeps only its last agent */
#define PAIR_SLOTS 2048        /* hash slots for the pair states (power of two, 2 x the cap) */
/* Markov-2 forecasts: a piece of mass smaller than this continues with its last agent only
 * (Markov-1), which keeps the pair states to the likely paths (the cost would otherwise grow as the
 * observed bigrams times their outcomes: A^3 per step on noisy data). */
#define PRUNE_MASS 1e-3
#define MAX_FILE_BYTES (1ull << 31)

static const char FILE_MAGIC[8] = {'B', 'R', 'A', 'I', 'D', 'P', 'R', 'D'};

typedef struct {
    int32_t out;
    uint32_t cnt;
} RowEntry;

typedef struct {
    RowEntry *e;
    int n, cap;
    uint64_t total;
} CountRow;

typedef struct {
    uint64_t key; /* UINT64_MAX = empty */
    int32_t row;
} PairSlot;

struct AgentPredictor {
    PredictorKind kind;
    double alpha;
    /* vocabulary */
    StrMap *ids;
    char **names;
    int n_agents, cap_names;
    /* counts */
    CountRow global;
    CountRow *m1; /* (cap_m1): by context; 0 = START */
    int cap_m1;
    CountRow *m2; /* (n_m2) */
    int n_m2, cap_m2;
    PairSlot *m2_slots; /* (m2_slot_cap), open addressing */
    int m2_slot_cap;
    /* PREDICTOR_GRAPH: the learned model over the first graph->n_agents agents (the vocabulary it
     * was trained on; agents interned later are UNKNOWN to it). The counts above stay: the first
     * call of a workflow, before any history exists, is forecast from them. */
    GraphModel *graph;
};

/* ---------------------------------------------------------------- vocabulary and counts */

static int agent_id(const AgentPredictor *p, const char *name) {
    int32_t v;
    return strmap_get(p->ids, name, strlen(name), &v) ? v : -1;
}

static int ctx_of(const AgentPredictor *p, const char *name) {
    int id = agent_id(p, name);
    return id < 0 ? CTX_UNKNOWN : id + 1;
}

/* Grows the per-context Markov-1 array to hold context ids 0..need-1 (zeroed rows). */
static int ensure_m1(AgentPredictor *p, int need) {
    if (need <= p->cap_m1) return 0;
    int cap = p->cap_m1 ? p->cap_m1 : 16;
    while (cap < need) cap *= 2;
    CountRow *m1 = realloc(p->m1, (size_t)cap * sizeof *m1);
    if (!m1) return -1;
    memset(m1 + p->cap_m1, 0, (size_t)(cap - p->cap_m1) * sizeof *m1);
    p->m1 = m1;
    p->cap_m1 = cap;
    return 0;
}

/* The id of name, interning it when new. -1 when out of memory or too many agents. */
static int intern(AgentPredictor *p, const char *name, BraidError *err) {
    size_t len = strlen(name);
    int32_t v;
    if (strmap_get(p->ids, name, len, &v)) return v;
    if (p->n_agents >= AGENT_PREDICTOR_MAX_AGENTS)
        return braid_error_set(err, "agent predictor: more than %d distinct agents", AGENT_PREDICTOR_MAX_AGENTS);
    if (ensure_m1(p, p->n_agents + 2)) return braid_error_set(err, "agent predictor: out of memory");
    if (p->n_agents == p->cap_names) {
        int cap = p->cap_names ? p->cap_names * 2 : 16;
        char **names = realloc(p->names, (size_t)cap * sizeof *names);
        if (!names) return braid_error_set(err, "agent predictor: out of memory");
        p->names = names;
        p->cap_names = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy) return braid_error_set(err, "agent predictor: out of memory");
    memcpy(copy, name, len + 1);
    if (strmap_put(p->ids, name, len, p->n_agents)) {
        free(copy);
        return braid_error_set(err, "agent predictor: out of memory");
    }
    p->names[p->n_agents] = copy;
    return p->n_agents++;
}

/* Adds `by` to the count of outcome out in row (saturating at UINT32_MAX). */
static int row_add(CountRow *row, int32_t out, uint32_t by) {
    for (int i = 0; i < row->n; i++)
        if (row->e[i].out == out) {
            uint32_t room = UINT32_MAX - row->e[i].cnt;
            if (by > room) by = room;
            row->e[i].cnt += by;
            row->total += by;
            return 0;
        }
    if (row->n == row->cap) {
        int cap = row->cap ? row->cap * 2 : 4;
        RowEntry *e = realloc(row->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        row->e = e;
        row->cap = cap;
    }
    row->e[row->n++] = (RowEntry){out, by};
    row->total += by;
    return 0;
}

static uint64_t pair_key(int x, int y) { return ((uint64_t)(uint32_t)x << 32) | (uint32_t)y; }

static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static const CountRow *m2_find(const AgentPredictor *p, int x, int y) {
    if (!p->m2_slot_cap) return NULL;
    uint64_t key = pair_key(x, y);
    unsigned mask = (unsigned)p->m2_slot_cap - 1;
    for (unsigned i = (unsigned)mix64(key) & mask;; i = (i + 1) & mask) {
        const PairSlot *s = &p->m2_slots[i];
        if (s->key == UINT64_MAX) return NULL;
        if (s->key == key) return &p->m2[s->row];
    }
}

static int m2_rehash(AgentPredictor *p, int cap) {
    PairSlot *slots = malloc((size_t)cap * sizeof *slots);
    if (!slots) return -1;
    for (int i = 0; i < cap; i++) slots[i].key = UINT64_MAX;
    unsigned mask = (unsigned)cap - 1;
    for (int i = 0; i < p->m2_slot_cap; i++) {
        if (p->m2_slots[i].key == UINT64_MAX) continue;
        unsigned j = (unsigned)mix64(p->m2_slots[i].key) & mask;
        while (slots[j].key != UINT64_MAX) j = (j + 1) & mask;
        slots[j] = p->m2_slots[i];
    }
    free(p->m2_slots);
    p->m2_slots = slots;
    p->m2_slot_cap = cap;
    return 0;
}

/* The Markov-2 row of (x, y), created empty when new; NULL when out of memory. *created says
 * whether it is new (for the file loader's duplicate check). */
static CountRow *m2_get(AgentPredictor *p, int x, int y, int *created) {
    if ((p->n_m2 + 1) * 2 > p->m2_slot_cap && m2_rehash(p, p->m2_slot_cap ? p->m2_slot_cap * 2 : 64)) return NULL;
    uint64_t key = pair_key(x, y);
    unsigned mask = (unsigned)p->m2_slot_cap - 1, i = (unsigned)mix64(key) & mask;
    for (;; i = (i + 1) & mask) {
        if (p->m2_slots[i].key == key) {
            if (created) *created = 0;
            return &p->m2[p->m2_slots[i].row];
        }
        if (p->m2_slots[i].key == UINT64_MAX) break;
    }
    if (p->n_m2 == p->cap_m2) {
        int cap = p->cap_m2 ? p->cap_m2 * 2 : 32;
        CountRow *rows = realloc(p->m2, (size_t)cap * sizeof *rows);
        if (!rows) return NULL;
        p->m2 = rows;
        p->cap_m2 = cap;
    }
    p->m2[p->n_m2] = (CountRow){0};
    p->m2_slots[i] = (PairSlot){key, p->n_m2};
    if (created) *created = 1;
    return &p->m2[p->n_m2++];
}

/* ---------------------------------------------------------------- lifecycle */

int agent_predictor_create(AgentPredictor **out, PredictorKind kind, BraidError *err) {
    *out = NULL;
    if (kind != PREDICTOR_MARKOV1 && kind != PREDICTOR_MARKOV2)
        return braid_error_set(err, "agent predictor: unknown kind %d (1 = Markov-1, 2 = Markov-2)", (int)kind);
    AgentPredictor *p = calloc(1, sizeof *p);
    if (!p || !(p->ids = strmap_create(64)) || ensure_m1(p, 16)) {
        agent_predictor_free(p);
        return braid_error_set(err, "agent predictor: out of memory");
    }
    p->kind = kind;
    p->alpha = AGENT_PREDICTOR_DEFAULT_ALPHA;
    *out = p;
    return 0;
}

void agent_predictor_free(AgentPredictor *p) {
    if (!p) return;
    for (int i = 0; i < p->n_agents; i++) free(p->names[i]);
    free(p->names);
    strmap_destroy(p->ids);
    free(p->global.e);
    for (int i = 0; i < p->cap_m1; i++) free(p->m1[i].e);
    free(p->m1);
    for (int i = 0; i < p->n_m2; i++) free(p->m2[i].e);
    free(p->m2);
    free(p->m2_slots);
    graph_model_free(p->graph);
    free(p);
}

int agent_predictor_attach_graph(AgentPredictor *p, GraphModel *graph, BraidError *err) {
    int v = graph_model_shape(graph)->n_agents;
    if (v > p->n_agents)
        return braid_error_set(err, "agent predictor: the graph model knows %d agents, the predictor only %d", v, p->n_agents);
    if (p->kind == PREDICTOR_MARKOV1)
        return braid_error_set(err, "agent predictor: a graph model needs Markov-2 counts beside it (for first calls), not Markov-1");
    graph_model_free(p->graph);
    p->graph = graph;
    p->kind = PREDICTOR_GRAPH;
    return 0;
}

const GraphModel *agent_predictor_graph(const AgentPredictor *p) { return p->graph; }

int agent_predictor_text_dim(const AgentPredictor *p) { return p->graph ? graph_model_shape(p->graph)->text_dim : 0; }

PredictorKind agent_predictor_kind(const AgentPredictor *p) { return p->kind; }
int agent_predictor_n_agents(const AgentPredictor *p) { return p->n_agents; }
uint64_t agent_predictor_n_transitions(const AgentPredictor *p) { return p->global.total; }
int agent_predictor_agent_index(const AgentPredictor *p, const char *name) { return agent_id(p, name); }

const char *agent_predictor_agent_name(const AgentPredictor *p, int i) {
    return i >= 0 && i < p->n_agents ? p->names[i] : NULL;
}
double agent_predictor_alpha(const AgentPredictor *p) { return p->alpha; }

int agent_predictor_set_alpha(AgentPredictor *p, double alpha, BraidError *err) {
    if (!(alpha > 0) || !isfinite(alpha)) return braid_error_set(err, "agent predictor: alpha must be a positive finite number, got %g", alpha);
    p->alpha = alpha;
    return 0;
}

/* ---------------------------------------------------------------- learning */

static int check_name(const char *name, const char *what, BraidError *err) {
    if (!name) return braid_error_set(err, "agent predictor: %s is NULL", what);
    if (strnlen(name, AGENT_PREDICTOR_MAX_NAME + 1) > AGENT_PREDICTOR_MAX_NAME)
        return braid_error_set(err, "agent predictor: %s is longer than %d bytes", what, AGENT_PREDICTOR_MAX_NAME);
    return 0;
}

int agent_predictor_observe(AgentPredictor *p, const char *const *history, int n_history, const char *next, BraidError *err) {
    if (n_history < 0 || (n_history > 0 && !history))
        return braid_error_set(err, "agent predictor: observe: bad history (%d agents)", n_history);
    const char *prev_name = n_history >= 2 ? history[n_history - 2] : NULL;
    const char *last_name = n_history >= 1 ? history[n_history - 1] : NULL;
    if ((n_history >= 2 && check_name(prev_name, "the previous agent's name", err)) ||
        (n_history >= 1 && check_name(last_name, "the last agent's name", err)) || (next && check_name(next, "the next agent's name", err)))
        return -1;
    int x = CTX_START, y = CTX_START, out = OUT_END, id;
    if (p->kind != PREDICTOR_MARKOV1 && prev_name) {
        if ((id = intern(p, prev_name, err)) < 0) return -1;
        x = id + 1;
    }
    if (last_name) {
        if ((id = intern(p, last_name, err)) < 0) return -1;
        y = id + 1;
    }
    if (next) {
        if ((out = intern(p, next, err)) < 0) return -1;
    }
    /* Reserve every row first so a failure leaves the counts consistent. */
    CountRow *r2 = NULL;
    if (p->kind != PREDICTOR_MARKOV1 && !(r2 = m2_get(p, x, y, NULL))) return braid_error_set(err, "agent predictor: out of memory");
    if (row_add(&p->m1[y], out, 0) || row_add(&p->global, out, 0) || (r2 && row_add(r2, out, 0)))
        return braid_error_set(err, "agent predictor: out of memory");
    row_add(&p->m1[y], out, 1);
    row_add(&p->global, out, 1);
    if (r2) row_add(r2, out, 1);
    return 0;
}

int agent_predictor_observe_workflow(AgentPredictor *p, const char *const *agents, int n, int ended, BraidError *err) {
    if (n < 0 || (n > 0 && !agents)) return braid_error_set(err, "agent predictor: observe: bad workflow (%d agents)", n);
    for (int t = 0; t < n; t++)
        if (agent_predictor_observe(p, agents, t, agents[t], err)) return -1;
    if (ended && agent_predictor_observe(p, agents, n, NULL, err)) return -1;
    return 0;
}

/* ---------------------------------------------------------------- forecasting */

typedef struct {
    int x, y; /* contexts: previous, last (x unused by Markov-1) */
    double q;
} PairState;

typedef struct {
    int cap_agents;
    double *acc, *res, *nres; /* (cap_agents) */
    PairState *cur, *nxt;     /* (MAX_PAIR_STATES) */
    int n_cur, n_nxt;
    uint32_t *slot_gen;       /* (PAIR_SLOTS) */
    int32_t *slot_idx;        /* (PAIR_SLOTS) */
    uint32_t gen;
    float *graph_buf;         /* graph model: its scratch, then the K x (V+1) step rows */
    size_t cap_graph;
    int32_t *hist;            /* graph model: the history as agent indices */
    int cap_hist;
} Scratch;

static void scratch_free(Scratch *s) {
    if (!s) return;
    free(s->acc);
    free(s->res);
    free(s->nres);
    free(s->cur);
    free(s->nxt);
    free(s->slot_gen);
    free(s->slot_idx);
    free(s->graph_buf);
    free(s->hist);
    free(s);
}

static Scratch *scratch_get(AgentPrediction *out, int n_agents) {
    Scratch *s = out->scratch;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        s->cur = malloc(MAX_PAIR_STATES * sizeof *s->cur);
        s->nxt = malloc(MAX_PAIR_STATES * sizeof *s->nxt);
        s->slot_gen = calloc(PAIR_SLOTS, sizeof *s->slot_gen);
        s->slot_idx = malloc(PAIR_SLOTS * sizeof *s->slot_idx);
        if (!s->cur || !s->nxt || !s->slot_gen || !s->slot_idx) {
            scratch_free(s);
            return NULL;
        }
        out->scratch = s;
    }
    if (n_agents > s->cap_agents) {
        int cap = s->cap_agents ? s->cap_agents : 16;
        while (cap < n_agents) cap *= 2;
        double *a = realloc(s->acc, (size_t)cap * sizeof *a);
        if (a) s->acc = a;
        double *r = realloc(s->res, (size_t)cap * sizeof *r);
        if (r) s->res = r;
        double *nr = realloc(s->nres, (size_t)cap * sizeof *nr);
        if (nr) s->nres = nr;
        if (!a || !r || !nr) return NULL;
        s->cap_agents = cap;
        out->cap_scratch = cap;
    }
    return s;
}

/* The row that predicts after context (x, y), backing off Markov-2 -> Markov-1 -> global. */
static const CountRow *lookup_row(const AgentPredictor *p, int x, int y) {
    if (y == CTX_UNKNOWN) return &p->global;
    if (p->kind != PREDICTOR_MARKOV1 && x != CTX_UNKNOWN) {
        const CountRow *r = m2_find(p, x, y);
        if (r && r->total) return r;
    }
    if (p->m1[y].total) return &p->m1[y];
    return &p->global;
}

/* Adds mass q to the next step's state (x, y); past the state cap it keeps only its last agent. */
static void add_state(Scratch *s, int x, int y, double q) {
    uint64_t key = pair_key(x, y);
    unsigned i = (unsigned)mix64(key) & (PAIR_SLOTS - 1);
    for (;; i = (i + 1) & (PAIR_SLOTS - 1)) {
        if (s->slot_gen[i] != s->gen) break;
        PairState *st = &s->nxt[s->slot_idx[i]];
        if (st->x == x && st->y == y) {
            st->q += q;
            return;
        }
    }
    if (s->n_nxt == MAX_PAIR_STATES) {
        s->nres[y - 1] += q;
        return;
    }
    s->slot_gen[i] = s->gen;
    s->slot_idx[i] = s->n_nxt;
    s->nxt[s->n_nxt++] = (PairState){x, y, q};
}

static void next_generation(Scratch *s) {
    if (++s->gen == 0) { /* wrapped: every stale stamp could match again */
        memset(s->slot_gen, 0, PAIR_SLOTS * sizeof *s->slot_gen);
        s->gen = 1;
    }
}

/* Spreads mass q leaving context (x, y) over the next outcomes: into acc / *end, and into the next
 * step's states: a (y, outcome) pair for Markov-2 when the piece is at least PRUNE_MASS, else the
 * outcome's Markov-1 mass. Returns the smoothing mass per outcome (added uniformly by the caller). */
static double spread(const AgentPredictor *p, Scratch *s, const CountRow *row, int y, double q, double *end, double a1) {
    double inv = q / ((double)row->total + a1);
    const int m2 = p->kind != PREDICTOR_MARKOV1;
    const RowEntry *e = row->e;
    double *acc = s->acc, *nres = s->nres;
    for (int i = 0; i < row->n; i++) {
        double m = e[i].cnt * inv;
        int out = e[i].out;
        if (out == OUT_END) {
            *end += m;
            continue;
        }
        acc[out] += m;
        if (m2 && m >= PRUNE_MASS) add_state(s, y, out + 1, m);
        else nres[out] += m;
    }
    return p->alpha * inv;
}

/* Sizes out's arrays for k steps over the predictor's A agents and names them; returns its scratch. */
static Scratch *prepare_output(const AgentPredictor *p, int k, AgentPrediction *out, BraidError *err) {
    const int A = p->n_agents;
    if ((size_t)k * (size_t)A > (size_t)out->cap_prob || !out->p_end) {
        size_t need = (size_t)k * (size_t)A;
        if (need < MAX_K) need = MAX_K; /* p_end and small vocabularies share one growth step */
        float *prob = realloc(out->prob, need * sizeof *prob);
        if (!prob) return braid_error_set(err, "agent predictor: out of memory"), NULL;
        out->prob = prob;
        out->cap_prob = (int)need;
        if (!out->p_end && !(out->p_end = malloc(MAX_K * sizeof *out->p_end)))
            return braid_error_set(err, "agent predictor: out of memory"), NULL;
    }
    if (A > out->cap_agents) {
        char **names = realloc(out->agents, (size_t)A * sizeof *names);
        if (!names) return braid_error_set(err, "agent predictor: out of memory"), NULL;
        out->agents = names;
        out->cap_agents = A;
    }
    Scratch *s = scratch_get(out, A > 0 ? A : 1);
    if (!s) return braid_error_set(err, "agent predictor: out of memory"), NULL;
    if (A) memcpy(out->agents, p->names, (size_t)A * sizeof *out->agents);
    return s;
}

/* The graph model's forecast: its step rows are conditional on the workflow still running, so the
 * unconditional row s is the survival to s times them, and END accumulates. Steps past the model's
 * K repeat its last row (the head was trained for K steps only). Agents the model does not know
 * (interned after training) get 0. */
static int predict_graph(const AgentPredictor *p, Scratch *s, const char *const *history, int n_history, const float *text, int k,
                         AgentPrediction *out, BraidError *err) {
    const GraphModelShape *g = graph_model_shape(p->graph);
    const int A = p->n_agents, V = g->n_agents, P = V + 1;
    size_t need = graph_model_scratch_floats(p->graph) + (size_t)g->k * P;
    if (need > s->cap_graph) {
        float *b = realloc(s->graph_buf, need * sizeof *b);
        if (!b) return braid_error_set(err, "agent predictor: out of memory");
        s->graph_buf = b;
        s->cap_graph = need;
    }
    if (n_history > s->cap_hist) {
        int32_t *h = realloc(s->hist, (size_t)n_history * sizeof *h);
        if (!h) return braid_error_set(err, "agent predictor: out of memory");
        s->hist = h;
        s->cap_hist = n_history;
    }
    /* Only the calls the model attends over need names resolved. */
    int first = n_history - 1 - g->max_history;
    if (first < 0) first = 0;
    for (int i = first; i < n_history; i++) {
        if (!history[i]) return braid_error_set(err, "agent predictor: predict: history[%d] is NULL", i);
        int id = agent_id(p, history[i]);
        s->hist[i] = id >= 0 && id < V ? id : V;
    }
    float *cond = s->graph_buf + graph_model_scratch_floats(p->graph);
    if (graph_model_predict(p->graph, s->hist + first, n_history - first, text, cond, s->graph_buf))
        return braid_error_set(err, "agent predictor: graph forecast failed");
    /* Every weight loaded is finite, but extreme ones (a corrupt file whose checksum still matches)
     * can overflow the forward pass: such a forecast is an error, never NaN probabilities. */
    for (size_t i = 0; i < (size_t)g->k * P; i++)
        if (!(cond[i] >= 0.0f && cond[i] <= 1.001f))
            return braid_error_set(err, "agent predictor: the graph model's forecast is not a probability (%g): its weights overflow", cond[i]);
    double alive = 1.0, ended = 0.0;
    for (int step = 0; step < k; step++) {
        const float *c = cond + (size_t)(step < g->k ? step : g->k - 1) * P;
        float *row = out->prob + (size_t)step * A;
        for (int i = 0; i < A; i++) row[i] = i < V ? (float)(alive * c[i]) : 0.0f;
        ended += alive * c[V];
        alive *= 1.0 - c[V];
        out->p_end[step] = (float)(ended > 1 ? 1 : ended);
    }
    out->k = k;
    out->n_agents = A;
    return 0;
}

int agent_predictor_predict(const AgentPredictor *p, const char *const *history, int n_history, int k, AgentPrediction *out,
                            BraidError *err) {
    return agent_predictor_predict_text(p, history, n_history, NULL, k, out, err);
}

int agent_predictor_predict_text(const AgentPredictor *p, const char *const *history, int n_history, const float *text, int k,
                                 AgentPrediction *out, BraidError *err) {
    if (k < 1 || k > MAX_K) return braid_error_set(err, "agent predictor: predict: k = %d, must be 1..%d", k, MAX_K);
    if (n_history < 0 || (n_history > 0 && !history))
        return braid_error_set(err, "agent predictor: predict: bad history (%d agents)", n_history);
    for (int i = n_history >= 2 ? n_history - 2 : 0; i < n_history; i++)
        if (!history[i]) return braid_error_set(err, "agent predictor: predict: history[%d] is NULL", i);
    out->k = 0;
    out->n_agents = 0;
    if (p->global.total == 0) return 0; /* no data: an empty forecast */
    const int A = p->n_agents;
    Scratch *s = prepare_output(p, k, out, err);
    if (!s) return -1;
    if (p->graph && n_history > 0) return predict_graph(p, s, history, n_history, text, k, out, err);

    const int m2 = p->kind != PREDICTOR_MARKOV1;
    const double a1 = p->alpha * (A + 1); /* smoothing mass added to every row's total */
    /* The starting state: the contexts of the last two calls. */
    int x = CTX_START, y = CTX_START;
    if (n_history >= 1) y = ctx_of(p, history[n_history - 1]);
    if (m2 && n_history >= 2) x = ctx_of(p, history[n_history - 2]);
    if (!m2) x = 0;
    s->n_cur = 1;
    s->cur[0] = (PairState){x, y, 1.0};
    for (int i = 0; i < A; i++) s->res[i] = 0;
    int have_res = 0;
    double ended = 0;
    for (int step = 0; step < k; step++) {
        next_generation(s);
        s->n_nxt = 0;
        for (int i = 0; i < A; i++) s->acc[i] = s->nres[i] = 0;
        double end = 0, uniform = 0;
        for (int j = 0; j < s->n_cur; j++) {
            const PairState *st = &s->cur[j];
            if (st->q <= 0) continue;
            uniform += spread(p, s, lookup_row(p, st->x, st->y), st->y, st->q, &end, a1);
        }
        if (have_res)
            for (int i = 0; i < A; i++)
                if (s->res[i] > 0) uniform += spread(p, s, lookup_row(p, CTX_UNKNOWN, i + 1), i + 1, s->res[i], &end, a1);
        /* The smoothing mass: alpha / (total + alpha (A + 1)) per outcome of every row used, summed;
         * its previous agent is not tracked, so it continues as Markov-1 mass. */
        end += uniform;
        have_res = 0;
        for (int i = 0; i < A; i++) {
            s->acc[i] += uniform;
            s->nres[i] += uniform;
            if (s->nres[i] > 0) have_res = 1;
        }
        ended += end;
        float *row = out->prob + (size_t)step * A;
        for (int i = 0; i < A; i++) row[i] = (float)s->acc[i];
        out->p_end[step] = (float)(ended > 1 ? 1 : ended);
        /* swap */
        PairState *t = s->cur;
        s->cur = s->nxt;
        s->nxt = t;
        s->n_cur = s->n_nxt;
        double *r = s->res;
        s->res = s->nres;
        s->nres = r;
    }
    out->k = k;
    out->n_agents = A;
    return 0;
}

void agent_prediction_free(AgentPrediction *pred) {
    if (!pred) return;
    free(pred->agents);
    free(pred->prob);
    free(pred->p_end);
    scratch_free(pred->scratch);
    *pred = (AgentPrediction){0};
}

int agent_prediction_top1(const AgentPrediction *pred, int s) {
    if (s < 1 || s > pred->k) return -2;
    const float *row = pred->prob + (size_t)(s - 1) * pred->n_agents;
    int best = -1;
    float best_p = pred->p_end[s - 1] - (s > 1 ? pred->p_end[s - 2] : 0.0f);
    for (int i = pred->n_agents - 1; i >= 0; i--)
        if (row[i] >= best_p) {
            best_p = row[i];
            best = i;
        }
    return best;
}

int agent_predictor_score_workflow(const AgentPredictor *p, const char *const *agents, int n, int ended, int k, uint64_t *hits,
                                   uint64_t *total, AgentPrediction *pred, BraidError *err) {
    return agent_predictor_score_workflow_text(p, agents, NULL, n, ended, k, hits, total, pred, err);
}

int agent_predictor_score_workflow_text(const AgentPredictor *p, const char *const *agents, const float *const *texts, int n, int ended,
                                        int k, uint64_t *hits, uint64_t *total, AgentPrediction *pred, BraidError *err) {
    if (n < 0 || (n > 0 && !agents)) return braid_error_set(err, "agent predictor: score: bad workflow (%d agents)", n);
    for (int t = 1; t <= n; t++) {
        if (agent_predictor_predict_text(p, agents, t, texts ? texts[t - 1] : NULL, k, pred, err)) return -1;
        for (int s = 1; s <= k; s++) {
            int pos = t + s, target; /* 1-based index of the call being predicted */
            if (pos <= n) {
                target = agents[pos - 1] ? agent_id(p, agents[pos - 1]) : -3;
                if (target < 0) target = -3; /* an agent the predictor never saw: always a miss */
            } else if (pos == n + 1 && ended)
                target = -1;
            else
                break;
            total[s - 1]++;
            if (pred->k && agent_prediction_top1(pred, s) == target) hits[s - 1]++;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- file format */

typedef struct {
    unsigned char *b;
    size_t n, cap;
    int oom;
} Buf;

static void put_bytes(Buf *b, const void *data, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *nb = realloc(b->b, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->b = nb;
        b->cap = cap;
    }
    memcpy(b->b + b->n, data, n);
    b->n += n;
}

static void put_u32(Buf *b, uint32_t v) {
    unsigned char c[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put_bytes(b, c, 4);
}

static void put_u64(Buf *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

/* A row's non-zero entries (a zero count is only left behind by an observe that ran out of memory). */
static void put_row(Buf *b, const CountRow *r) {
    uint32_t n = 0;
    for (int i = 0; i < r->n; i++) n += r->e[i].cnt > 0;
    put_u32(b, n);
    for (int i = 0; i < r->n; i++) {
        if (!r->e[i].cnt) continue;
        put_u32(b, (uint32_t)r->e[i].out);
        put_u32(b, r->e[i].cnt);
    }
}

static uint64_t fnv1a64(const unsigned char *d, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

int agent_predictor_save(const AgentPredictor *p, const char *path, BraidError *err) {
    Buf b = {0};
    put_bytes(&b, FILE_MAGIC, sizeof FILE_MAGIC);
    put_u32(&b, AGENT_PREDICTOR_FILE_VERSION);
    put_u32(&b, (uint32_t)p->kind);
    uint64_t alpha_bits;
    memcpy(&alpha_bits, &p->alpha, sizeof alpha_bits);
    put_u64(&b, alpha_bits);
    put_u32(&b, (uint32_t)p->n_agents);
    for (int i = 0; i < p->n_agents; i++) {
        size_t len = strlen(p->names[i]);
        put_u32(&b, (uint32_t)len);
        put_bytes(&b, p->names[i], len);
    }
    put_row(&b, &p->global);
    uint32_t n1 = 0;
    for (int c = 0; c <= p->n_agents; c++) n1 += p->m1[c].total > 0;
    put_u32(&b, n1);
    for (int c = 0; c <= p->n_agents; c++) {
        if (!p->m1[c].total) continue;
        put_u32(&b, (uint32_t)c);
        put_row(&b, &p->m1[c]);
    }
    uint32_t n2 = 0;
    for (int i = 0; i < p->n_m2; i++) n2 += p->m2[i].total > 0;
    put_u32(&b, n2);
    for (int i = 0; i < p->m2_slot_cap; i++) {
        const PairSlot *s = &p->m2_slots[i];
        if (s->key == UINT64_MAX || !p->m2[s->row].total) continue;
        put_u32(&b, (uint32_t)(s->key >> 32));
        put_u32(&b, (uint32_t)s->key);
        put_row(&b, &p->m2[s->row]);
    }
    uint8_t *blob = NULL;
    size_t blob_len = 0;
    if (p->graph && graph_model_encode(p->graph, &blob, &blob_len, err)) {
        free(b.b);
        return braid_error_wrap(err, "agent predictor: %s", path);
    }
    put_u64(&b, blob_len);
    if (blob_len) put_bytes(&b, blob, blob_len);
    free(blob);
    if (!b.oom) put_u64(&b, fnv1a64(b.b, b.n));
    if (b.oom) {
        free(b.b);
        return braid_error_set(err, "agent predictor: %s: out of memory while encoding", path);
    }
    /* Written beside the target and renamed over it, so a reader never sees half a file. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(b.b);
        return braid_error_set(err, "agent predictor: %s: out of memory", path);
    }
    snprintf(tmp, plen + 16, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int rc = 0;
    if (!f) rc = braid_error_set(err, "agent predictor: cannot write %s: %s", tmp, strerror(errno));
    else {
        size_t w = fwrite(b.b, 1, b.n, f);
        int e = errno;
        if (w != b.n) {
            rc = braid_error_set(err, "agent predictor: writing %s: %s", tmp, strerror(e));
            fclose(f);
        } else if (fclose(f) != 0)
            rc = braid_error_set(err, "agent predictor: writing %s: %s", tmp, strerror(errno));
        if (!rc && rename(tmp, path) != 0) rc = braid_error_set(err, "agent predictor: renaming %s to %s: %s", tmp, path, strerror(errno));
        if (rc) remove(tmp);
    }
    free(tmp);
    free(b.b);
    return rc;
}

typedef struct {
    const unsigned char *b;
    size_t n, pos;
    const char *path;
    BraidError *err;
} Reader;

static int need(Reader *r, size_t n, const char *what) {
    if (r->n - r->pos < n)
        return braid_error_set(r->err, "agent predictor: %s: truncated: the file ends at byte %zu while reading %s", r->path, r->n, what);
    return 0;
}

static int get_u32(Reader *r, uint32_t *v, const char *what) {
    if (need(r, 4, what)) return -1;
    const unsigned char *c = r->b + r->pos;
    *v = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
    r->pos += 4;
    return 0;
}

static int get_u64(Reader *r, uint64_t *v, const char *what) {
    uint32_t lo, hi;
    if (get_u32(r, &lo, what) || get_u32(r, &hi, what)) return -1;
    *v = (uint64_t)hi << 32 | lo;
    return 0;
}

/* Reads a row into an empty row, checking its outcomes and counts. seen: scratch of n_agents + 1
 * stamps; stamp: this row's. */
static int get_row(Reader *r, CountRow *row, int n_agents, uint32_t *seen, uint32_t stamp, const char *what) {
    uint32_t n;
    if (get_u32(r, &n, what)) return -1;
    if (n > (uint32_t)n_agents + 1)
        return braid_error_set(r->err, "agent predictor: %s: %s has %u entries, more than the %d possible outcomes", r->path, what, n,
                               n_agents + 1);
    if (need(r, (size_t)n * 8, what)) return -1;
    if (n) {
        row->e = malloc(n * sizeof *row->e);
        if (!row->e) return braid_error_set(r->err, "agent predictor: %s: out of memory", r->path);
        row->cap = (int)n;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t out = 0, cnt = 0;
        get_u32(r, &out, what); /* cannot fail: need() covered the row */
        get_u32(r, &cnt, what);
        int32_t o = (int32_t)out;
        if (o < -1 || o >= n_agents)
            return braid_error_set(r->err, "agent predictor: %s: %s: outcome %d is not an agent (0..%d) or END (-1)", r->path, what, o,
                                   n_agents - 1);
        if (cnt == 0) return braid_error_set(r->err, "agent predictor: %s: %s: zero count", r->path, what);
        if (seen[o + 1] == stamp) return braid_error_set(r->err, "agent predictor: %s: %s: outcome %d listed twice", r->path, what, o);
        seen[o + 1] = stamp;
        row->e[row->n++] = (RowEntry){o, cnt};
        row->total += cnt;
    }
    return 0;
}

/* Version 2: u64 length, then the graph model's section (length 0 = none). Kind 3 needs one. */
static int read_graph(Reader *r, AgentPredictor *p, uint32_t kind) {
    uint64_t len;
    if (get_u64(r, &len, "the graph section's length")) return -1;
    if ((len == 0) != (kind != PREDICTOR_GRAPH))
        return braid_error_set(r->err, "agent predictor: %s: kind %u with %s graph section", r->path, kind, len ? "a" : "no");
    if (len == 0) return 0;
    if (len > r->n - r->pos) return braid_error_set(r->err, "agent predictor: %s: truncated graph section", r->path);
    GraphModel *g;
    if (graph_model_decode(r->b + r->pos, (size_t)len, &g, r->err)) return braid_error_wrap(r->err, "agent predictor: %s", r->path);
    r->pos += (size_t)len;
    if (agent_predictor_attach_graph(p, g, r->err)) {
        graph_model_free(g);
        return braid_error_wrap(r->err, "%s", r->path);
    }
    return 0;
}

static int parse(Reader *r, AgentPredictor **out) {
    BraidError *err = r->err;
    const char *path = r->path;
    if (need(r, sizeof FILE_MAGIC, "the magic")) return -1;
    if (memcmp(r->b, FILE_MAGIC, sizeof FILE_MAGIC) != 0)
        return braid_error_set(err, "agent predictor: %s: not a Braid predictor file (bad magic)", path);
    r->pos = sizeof FILE_MAGIC;
    uint32_t version, kind, n_agents;
    uint64_t alpha_bits;
    if (get_u32(r, &version, "the version")) return -1;
    if (version < 1 || version > AGENT_PREDICTOR_FILE_VERSION)
        return braid_error_set(err, "agent predictor: %s: unsupported file version %u (this build reads versions 1..%d)", path, version,
                               AGENT_PREDICTOR_FILE_VERSION);
    if (get_u32(r, &kind, "the kind") || get_u64(r, &alpha_bits, "alpha") || get_u32(r, &n_agents, "the agent count")) return -1;
    if (kind != PREDICTOR_MARKOV1 && kind != PREDICTOR_MARKOV2 && !(kind == PREDICTOR_GRAPH && version >= 2))
        return braid_error_set(err, "agent predictor: %s: unknown predictor kind %u (1 = Markov-1, 2 = Markov-2, 3 = graph)", path, kind);
    double alpha;
    memcpy(&alpha, &alpha_bits, sizeof alpha);
    if (!(alpha > 0) || !isfinite(alpha)) return braid_error_set(err, "agent predictor: %s: bad alpha %g", path, alpha);
    if (n_agents > AGENT_PREDICTOR_MAX_AGENTS)
        return braid_error_set(err, "agent predictor: %s: %u agents, more than the %d allowed", path, n_agents, AGENT_PREDICTOR_MAX_AGENTS);
    AgentPredictor *p;
    if (agent_predictor_create(&p, kind == PREDICTOR_GRAPH ? PREDICTOR_MARKOV2 : (PredictorKind)kind, err))
        return braid_error_wrap(err, "%s", path);
    *out = p;
    p->alpha = alpha;
    char name[AGENT_PREDICTOR_MAX_NAME + 1];
    for (uint32_t i = 0; i < n_agents; i++) {
        uint32_t len;
        if (get_u32(r, &len, "an agent name's length")) return -1;
        if (len > AGENT_PREDICTOR_MAX_NAME)
            return braid_error_set(err, "agent predictor: %s: agent %u's name is %u bytes, more than %d", path, i, len, AGENT_PREDICTOR_MAX_NAME);
        if (need(r, len, "an agent name")) return -1;
        memcpy(name, r->b + r->pos, len);
        name[len] = '\0';
        r->pos += len;
        if (strlen(name) != len) return braid_error_set(err, "agent predictor: %s: agent %u's name contains a NUL byte", path, i);
        if (agent_id(p, name) >= 0) return braid_error_set(err, "agent predictor: %s: agent name '%s' listed twice", path, name);
        if (intern(p, name, err) < 0) return braid_error_wrap(err, "%s", path);
    }
    uint32_t *seen = calloc((size_t)n_agents + 2, sizeof *seen), stamp = 0;
    if (!seen) return braid_error_set(err, "agent predictor: %s: out of memory", path);
    int rc = -1;
    uint32_t n1, n2;
    if (get_row(r, &p->global, (int)n_agents, seen, ++stamp, "the global row")) goto done;
    if (get_u32(r, &n1, "the Markov-1 row count")) goto done;
    if (n1 > n_agents + 1) {
        braid_error_set(err, "agent predictor: %s: %u Markov-1 rows, more than the %u contexts", path, n1, n_agents + 1);
        goto done;
    }
    for (uint32_t i = 0; i < n1; i++) {
        uint32_t c;
        if (get_u32(r, &c, "a Markov-1 context")) goto done;
        if (c > n_agents) {
            braid_error_set(err, "agent predictor: %s: Markov-1 row %u: context %u out of range (0..%u)", path, i, c, n_agents);
            goto done;
        }
        if (p->m1[c].n) {
            braid_error_set(err, "agent predictor: %s: Markov-1 context %u listed twice", path, c);
            goto done;
        }
        if (get_row(r, &p->m1[c], (int)n_agents, seen, ++stamp, "a Markov-1 row")) goto done;
        if (!p->m1[c].n) {
            braid_error_set(err, "agent predictor: %s: Markov-1 row %u is empty", path, i);
            goto done;
        }
    }
    if (get_u32(r, &n2, "the Markov-2 row count")) goto done;
    if (kind == PREDICTOR_MARKOV1 && n2) {
        braid_error_set(err, "agent predictor: %s: a Markov-1 file with %u Markov-2 rows", path, n2);
        goto done;
    }
    if ((uint64_t)n2 * 12 > r->n - r->pos) {
        braid_error_set(err, "agent predictor: %s: truncated: %u Markov-2 rows cannot fit in the %zu bytes left", path, n2, r->n - r->pos);
        goto done;
    }
    for (uint32_t i = 0; i < n2; i++) {
        uint32_t x, y;
        int created;
        if (get_u32(r, &x, "a Markov-2 context") || get_u32(r, &y, "a Markov-2 context")) goto done;
        if (x > n_agents || y > n_agents || (y == CTX_START && x != CTX_START)) {
            braid_error_set(err, "agent predictor: %s: Markov-2 row %u: context (%u, %u) out of range", path, i, x, y);
            goto done;
        }
        CountRow *row = m2_get(p, (int)x, (int)y, &created);
        if (!row) {
            braid_error_set(err, "agent predictor: %s: out of memory", path);
            goto done;
        }
        if (!created) {
            braid_error_set(err, "agent predictor: %s: Markov-2 context (%u, %u) listed twice", path, x, y);
            goto done;
        }
        if (get_row(r, row, (int)n_agents, seen, ++stamp, "a Markov-2 row")) goto done;
        if (!row->n) {
            braid_error_set(err, "agent predictor: %s: Markov-2 row %u is empty", path, i);
            goto done;
        }
    }
    if (version >= 2 && read_graph(r, p, kind)) goto done;
    size_t body = r->pos;
    uint64_t sum;
    if (get_u64(r, &sum, "the checksum")) goto done;
    if (r->pos != r->n) {
        braid_error_set(err, "agent predictor: %s: %zu unexpected bytes after the checksum", path, r->n - r->pos);
        goto done;
    }
    if (sum != fnv1a64(r->b, body)) {
        braid_error_set(err, "agent predictor: %s: checksum mismatch: the file is corrupt", path);
        goto done;
    }
    rc = 0;
done:
    free(seen);
    return rc;
}

int agent_predictor_load(AgentPredictor **out, const char *path, BraidError *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return braid_error_set(err, "agent predictor: cannot open %s: %s", path, strerror(errno));
    unsigned char *data = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_FILE_BYTES) {
                fclose(f);
                free(data);
                return braid_error_set(err, "agent predictor: %s: larger than %llu bytes", path, (unsigned long long)MAX_FILE_BYTES);
            }
            cap = cap ? cap * 2 : 65536;
            unsigned char *nd = realloc(data, cap);
            if (!nd) {
                fclose(f);
                free(data);
                return braid_error_set(err, "agent predictor: %s: out of memory", path);
            }
            data = nd;
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(data);
        return braid_error_set(err, "agent predictor: reading %s failed", path);
    }
    Reader r = {data, n, 0, path, err};
    AgentPredictor *p = NULL;
    int rc = parse(&r, &p);
    free(data);
    if (rc) {
        agent_predictor_free(p);
        return -1;
    }
    *out = p;
    return 0;
}
