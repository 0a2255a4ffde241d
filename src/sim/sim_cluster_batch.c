/* The batching cluster replay; the contract is in sim_cluster_batch.h. */
#include "sim/sim_cluster_batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/content_hash.h"
#include "cache/evict_policy.h"
#include "predict/workflow_forecast.h"
#include "cache/kv_cache.h"
#include "coord/move_plan.h"
#include "coord/router.h"
#include "worker/import_followers.h"
#include "sim/sim_percentile.h"
#include "worker/scheduler.h"

/* closed_loop: calls of one workflow sent within this long of each other are one stage (a fan-out). */
#define SIM_STAGE_SPREAD_S 0.1

/* The router's books keep dispatch times; router_learn reads 0 as "unknown", so their clock starts here. */
#define BOOKS_CLOCK_START_S 1.0

typedef struct BatchCluster BatchCluster;

typedef struct {
    BatchCluster *cl;
    int instance;
} InstanceTap;

typedef struct {
    Scheduler sched;
    bool up, stepping;
    double step_start, step_end;
    StepPlan plan;
    InstanceTap tap;
    int served;
} BatchInstance;

/* A move's steps, each taken at a leader's loop turn (between its engine steps), as kv_moves.c: the
 * borrower parks the request and asks, the lender answers, the borrower reads, the read lands. */
typedef enum { MOVE_NONE = 0, MOVE_PARKING, MOVE_ASKED, MOVE_ANSWERED, MOVE_READING } MovePhase;

/* One trace request. sr first: the scheduler's plan entries point at it. */
typedef struct {
    SchedRequest sr;
    const TraceRequest *tr;
    uint64_t *hashes;
    int usable;             /* prompt blocks a match may cover (never the whole prompt) */
    int instance, source;   /* source: the lender of a planned move, -1 none */
    MovePhase phase;
    double arrival;
    double deadline, read_at, land_at; /* the move's timeout (from the ask; INFINITY: none); its read's start and landing */
    double asked_at;        /* when the borrower asked the lender */
    int import_wait;        /* queued behind the move of this request (its index) toward its instance; -1: not waiting */
    double import_wait_s;   /* how long it waited for that move */
    int lent_blocks;        /* the prefix the lender answered with */
    int asked_blocks;       /* a planned move: the blocks it asks for (the plan's, at most `usable`) */
    bool failed, queued, started, refused, done;
    double started_at, first_token, finish, move_s;
    /* closed_loop: unfinished requests of the workflow's previous stage; the next stage's requests
     * (next_stage[0 .. n_next_stage) in the cluster's stage order); held: sent only when released (its
     * previous stage done, or for a first stage, a client free); stage_offset: its send after its stage's first's */
    int waiting_for, next_stage, n_next_stage;
    bool held;
    double stage_offset;
    int workflow;           /* closed_loop: its index in BatchCluster.workflows (-1: none) */
    int moved_blocks;       /* landed */
    RouteCharge charge;
} BatchReq;

/* closed_loop: one workflow as braid-bench run's client drives it: claimed by a free client, its stages
 * one after the other, ended (POST .../end: router_workflow_ended) when its last call has answered. */
typedef struct {
    const char *name;
    int first, n;           /* its requests' positions in stage_order: first .. first + n */
    int first_index;        /* its first request's index in the trace (the order the client claimed it) */
    int first_stage_n;      /* requests in its first stage */
    int unfinished;         /* requests not finished yet */
} SimWorkflow;

struct BatchCluster {
    const SimClusterConfig *cfg;
    SimWorkflow *workflows; /* closed_loop: in the order the client claimed them (their first calls' trace order) */
    int n_workflows, next_workflow, clients;
    int next_end;           /* open loop: the trace's next workflow end */
    const Trace *trace;
    MoveCostModel moves;    /* serve's --kv-moves model (move_plan.h) at the router's start rates */
    bool *can_move;
    uint64_t *block_bytes;
    BatchInstance *inst;
    BatchReq *reqs;
    int n_reqs;
    int *moving;            /* indices of requests with a move in progress */
    int *import_waiting, n_import_waiting; /* indices of requests held until a move toward their instance ends */
    int *stage_order;       /* closed_loop: request indices by workflow, then trace order (next_stage points here) */
    int *released, n_released; /* closed_loop: held requests whose previous stage just finished */
    int n_moving;
    Router router;
    WorkflowForecast forecast; /* the coordinator's forecaster, when the policy takes predictions */
    bool forecasting;
    int bs;
    double t0, decode_seq_s;
    int32_t *table;         /* scratch block table for landing a move */
};

static void on_event(void *ctx, const CacheEvent *ev) {
    InstanceTap *tap = ctx;
    Router *r = &tap->cl->router;
    if (ev->kind == CACHE_EVENT_STORED && ev->tier == CACHE_TIER_DEVICE) router_stored(r, tap->instance, ev->hashes, ev->n_blocks);
    else if (ev->kind == CACHE_EVENT_REMOVED && ev->tiers_after == 0) router_evicted(r, tap->instance, ev->hashes, ev->n_blocks);
    else if (ev->kind == CACHE_EVENT_CLEARED) router_cleared(r, tap->instance);
}

static char *dup_or_null(const char *s) { return s && *s ? strdup(s) : NULL; }

/* The request as the scheduler takes it: prompt ids from the trace's tokens or block hashes. */
static int make_request(BatchReq *q, const TraceRequest *t, int bs) {
    SchedRequest *r = &q->sr;
    int n = t->prompt_tokens > 0 ? t->prompt_tokens : 1, out = t->output_tokens > 0 ? t->output_tokens : 1;
    r->cap_tokens = n + out + 1;
    r->id = strdup(t->id);
    r->tenant = strdup(t->tenant);
    r->adapter = dup_or_null(t->adapter);
    r->workflow = dup_or_null(t->workflow);
    r->agent = dup_or_null(t->agent);
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    q->hashes = malloc(((size_t)t->n_blocks + 1) * sizeof *q->hashes);
    if (!r->id || !r->tenant || !r->tokens || !q->hashes) return -1;
    for (int i = 0; i < n; i++) r->tokens[i] = trace_prompt_token(t, i, bs);
    r->n_tokens = r->n_prompt = n;
    r->max_tokens = out;
    int full = n / bs < t->n_blocks ? n / bs : t->n_blocks;
    content_hash_blocks(content_hash_namespace(t->tenant, t->adapter), r->tokens, full, bs, q->hashes, NULL);
    q->usable = n > 0 ? (n - 1) / bs : 0;
    if (q->usable > full) q->usable = full;
    q->tr = t;
    q->source = -1;
    q->import_wait = -1;
    return 0;
}

typedef struct {
    const char *workflow;
    int index;
} WorkflowKey;

static int by_workflow_then_index(const void *a, const void *b) {
    const WorkflowKey *x = a, *y = b;
    int c = strcmp(x->workflow, y->workflow);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

static int by_first_request(const void *a, const void *b) {
    const SimWorkflow *x = a, *y = b;
    return (x->first_index > y->first_index) - (x->first_index < y->first_index);
}

/* When workflow w ended live: its trace end line, else its last call's send. */
static double workflow_end_time(const Trace *t, const char *name, double last_send) {
    for (int e = 0; e < t->n_ends; e++)
        if (strcmp(t->ends[e].workflow, name) == 0) return t->ends[e].t;
    return last_send;
}

/* The client's concurrency: the workflows it had started before the first one ended (it starts the next
 * only when one ends). */
static int infer_clients(const BatchCluster *cl, const Trace *t) {
    double first_end = INFINITY;
    for (int w = 0; w < cl->n_workflows; w++) {
        const SimWorkflow *f = &cl->workflows[w];
        double last = t->reqs[cl->stage_order[f->first + f->n - 1]].t;
        double end = workflow_end_time(t, f->name, last);
        if (end < first_end) first_end = end;
    }
    int started = 0;
    for (int w = 0; w < cl->n_workflows; w++) started += t->reqs[cl->workflows[w].first_index].t < first_end;
    return started > 0 ? started : 1;
}

/* closed_loop: a workflow's requests in stages (a stage: calls sent within SIM_STAGE_SPREAD_S of its
 * first, a fan-out); each waits for every request of the stage before it; the workflows in the order the
 * client claimed them. */
static int build_stages(BatchCluster *cl, const Trace *t) {
    int n = cl->n_reqs;
    if (!(cl->stage_order = malloc((size_t)(n > 0 ? n : 1) * sizeof *cl->stage_order)) ||
        !(cl->released = malloc((size_t)(n > 0 ? n : 1) * sizeof *cl->released)) ||
        !(cl->workflows = calloc((size_t)(n > 0 ? n : 1), sizeof *cl->workflows)))
        return -1;
    WorkflowKey *keys = malloc((size_t)(n > 0 ? n : 1) * sizeof *keys);
    if (!keys) return -1;
    for (int k = 0; k < n; k++) keys[k] = (WorkflowKey){.workflow = t->reqs[k].workflow, .index = k};
    qsort(keys, (size_t)n, sizeof *keys, by_workflow_then_index);
    for (int k = 0; k < n; k++) cl->stage_order[k] = keys[k].index;
    free(keys);
    int prev_first = -1, prev_n = 0, cur_first = 0;
    SimWorkflow *wf = NULL;
    for (int k = 0; k < n; k++) {
        const TraceRequest *r = &t->reqs[cl->stage_order[k]];
        BatchReq *q = &cl->reqs[cl->stage_order[k]];
        q->workflow = -1;
        bool new_workflow = k == 0 || strcmp(r->workflow, t->reqs[cl->stage_order[k - 1]].workflow) != 0;
        if (new_workflow) {
            prev_first = -1, prev_n = 0, cur_first = k;
            wf = NULL;
            if (r->workflow[0]) {
                wf = &cl->workflows[cl->n_workflows++];
                *wf = (SimWorkflow){.name = r->workflow, .first = k, .first_index = cl->stage_order[k]};
            }
        } else if (r->t - t->reqs[cl->stage_order[cur_first]].t > SIM_STAGE_SPREAD_S) {
            prev_first = cur_first, prev_n = k - cur_first, cur_first = k;
        }
        if (!wf) continue; /* no workflow: sent at its trace time */
        q->workflow = (int)(wf - cl->workflows);
        q->held = true;
        q->arrival = INFINITY;
        q->stage_offset = r->t - t->reqs[cl->stage_order[cur_first]].t;
        wf->n++;
        wf->unfinished++;
        if (prev_first < 0) {
            wf->first_stage_n++;
            continue;
        }
        q->waiting_for = prev_n;
        for (int p = prev_first; p < prev_first + prev_n; p++) {
            BatchReq *b = &cl->reqs[cl->stage_order[p]];
            if (b->n_next_stage == 0) b->next_stage = k;
            b->n_next_stage++;
        }
    }
    qsort(cl->workflows, (size_t)cl->n_workflows, sizeof *cl->workflows, by_first_request);
    for (int w = 0; w < cl->n_workflows; w++) /* their requests' index after the sort */
        for (int k = 0; k < cl->workflows[w].n; k++) cl->reqs[cl->stage_order[cl->workflows[w].first + k]].workflow = w;
    cl->clients = cl->cfg->closed_loop_clients > 0 ? cl->cfg->closed_loop_clients : infer_clients(cl, t);
    return 0;
}

static int check_config(const SimClusterConfig *cfg, BraidError *err) {
    if (cfg->lender_step_tokens < 1) return braid_error_set(err, "sim cluster: batching needs --max-batch-tokens >= 1");
    if (cfg->max_running < 1) return braid_error_set(err, "sim cluster: batching needs --max-running >= 1");
    if (cfg->step_s < 0 || cfg->decode_s_per_token < 0) return braid_error_set(err, "sim cluster: step and decode costs must be >= 0");
    return 0;
}

static int cluster_init(BatchCluster *cl, const Trace *t, const SimClusterConfig *cfg, int router_mode, BraidError *err) {
    memset(cl, 0, sizeof *cl);
    cl->cfg = cfg;
    cl->trace = t;
    cl->bs = t->block_size > 0 ? t->block_size : 16;
    cl->t0 = t->n > 0 ? t->reqs[0].t : 0;
    cl->decode_seq_s = cfg->decode_s_per_token > cfg->step_s ? cfg->decode_s_per_token - cfg->step_s : 0;
    int max_blocks = 1;
    for (int k = 0; k < t->n; k++)
        if (t->reqs[k].prompt_tokens / cl->bs + 1 > max_blocks) max_blocks = t->reqs[k].prompt_tokens / cl->bs + 1;
    if (sim_cluster_router_init(&cl->router, cfg, router_mode, cl->bs, err)) return -1;
    /* This replay's busy lender answers between two layers of its step, as live: the router prices it so. */
    int parts = cfg->router_lender_parts > 0 ? cfg->router_lender_parts : cfg->n_layers;
    cl->router.cost.lender_step_parts = parts > 1 ? parts : 1;
    cl->inst = calloc((size_t)cfg->n_instances, sizeof *cl->inst);
    cl->reqs = calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *cl->reqs);
    cl->moving = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *cl->moving);
    cl->import_waiting = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *cl->import_waiting);
    cl->table = malloc(((size_t)max_blocks + 1) * sizeof *cl->table);
    cl->can_move = calloc((size_t)cfg->n_instances, sizeof *cl->can_move);
    cl->block_bytes = calloc((size_t)cfg->n_instances, sizeof *cl->block_bytes);
    if (!cl->inst || !cl->reqs || !cl->moving || !cl->import_waiting || !cl->table || !cl->can_move || !cl->block_bytes) return braid_error_set(err, "sim cluster: out of memory");
    /* The coordinator's move plan (move_plan.h) as serve sets it up: its rates are the router's start ones. */
    cl->moves = (MoveCostModel){.enabled = cfg->moves, .latency_s = cfg->link_latency_s, .min_blocks = MOVE_DEFAULT_MIN_BLOCKS,
                                .link_bytes_per_s = cfg->router_link_bytes_per_s > 0 ? cfg->router_link_bytes_per_s : cfg->link_bytes_per_s,
                                .prefill_tokens_per_s = cfg->router_prefill_tps > 0 ? cfg->router_prefill_tps : 1.0 / cfg->prefill_s_per_token,
                                .lender_step_tokens = cfg->lender_step_tokens, .timeout_s = cfg->move_timeout_s};
    for (int i = 0; i < cfg->n_instances; i++) {
        cl->can_move[i] = true;
        cl->block_bytes[i] = (uint64_t)(cfg->kv_bytes_per_token * cl->bs + 0.5);
    }
    for (int k = 0; k < t->n; k++) {
        cl->n_reqs = k + 1; /* freed by cluster_free, also when half made */
        if (make_request(&cl->reqs[k], &t->reqs[k], cl->bs)) return braid_error_set(err, "sim cluster: out of memory");
        cl->reqs[k].arrival = t->reqs[k].t;
    }
    if (cfg->closed_loop && build_stages(cl, t)) return braid_error_set(err, "sim cluster: out of memory");
    SchedConfig sc = {.device_blocks = cfg->kv_tokens / cl->bs + 1, .host_blocks = cfg->host_kv_tokens > 0 ? cfg->host_kv_tokens / cl->bs + 1 : 0,
                      .block_size = cl->bs, .max_batch_tokens = cfg->lender_step_tokens,
                      .max_running = cfg->max_running, .cache_enabled = true, .policy = cfg->policy ? cfg->policy : &evict_policy_lru,
                      .policy_options = cfg->policy_options, .admit_output = cfg->admit_output};
    if (sc.policy->on_prediction) {
        WorkflowForecastConfig fc = {.kind = cfg->predictor_kind == 2 ? PREDICTOR_MARKOV2 : PREDICTOR_MARKOV1, .learn = cfg->predictor_learn,
                                     .horizon = cfg->horizon > 0 ? cfg->horizon : WORKFLOW_FORECAST_DEFAULT_HORIZON,
                                     .run_cap = cfg->forecast_run_cap};
        if (cfg->predictor_path && agent_predictor_load(&fc.predictor, cfg->predictor_path, err)) return -1;
        if (workflow_forecast_init(&cl->forecast, &fc, err)) return -1;
        cl->forecasting = true;
    }
    for (int i = 0; i < cfg->n_instances; i++) {
        BatchInstance *in = &cl->inst[i];
        if (sched_init(&in->sched, &sc, err)) return -1;
        in->up = true;
        in->tap = (InstanceTap){.cl = cl, .instance = i};
        in->sched.observer = (SchedObserver){.ctx = &in->tap, .on_cache_event = on_event};
    }
    return 0;
}

static void cluster_free(BatchCluster *cl) {
    for (int k = 0; cl->reqs && k < cl->n_reqs; k++) {
        BatchReq *q = &cl->reqs[k];
        if (q->queued && !q->done && cl->inst[q->instance].up) sched_cancel(&cl->inst[q->instance].sched, &q->sr); /* after an error */
        sched_request_free(&q->sr);
        free(q->hashes);
    }
    for (int i = 0; cl->inst && i < cl->cfg->n_instances; i++) {
        if (cl->inst[i].up) sched_free(&cl->inst[i].sched);
        plan_free(&cl->inst[i].plan);
    }
    free(cl->inst);
    free(cl->reqs);
    free(cl->moving);
    free(cl->import_waiting);
    free(cl->stage_order);
    free(cl->released);
    free(cl->workflows);
    free(cl->can_move);
    free(cl->block_bytes);
    free(cl->table);
    router_free(&cl->router);
    if (cl->forecasting) workflow_forecast_free(&cl->forecast);
}

/* closed_loop: q is sent at now + its offset in its stage (its arrival; the replay routes it then). */
static void release(BatchCluster *cl, BatchReq *q, double now) {
    q->arrival = now + q->stage_offset;
    cl->released[cl->n_released++] = (int)(q - cl->reqs);
}

/* closed_loop: the client claims the next workflow (if any) at now and sends its first stage. */
static void claim_workflow(BatchCluster *cl, double now) {
    if (cl->next_workflow >= cl->n_workflows) return;
    const SimWorkflow *w = &cl->workflows[cl->next_workflow++];
    for (int k = 0; k < w->first_stage_n; k++) release(cl, &cl->reqs[cl->stage_order[w->first + k]], now);
}

/* closed_loop: q finished (or was refused) at now; the next stage of its workflow goes when the whole of
 * q's stage is done, and when the workflow's last call is done the client ends it (the coordinator forgets
 * its affinity, as router_workflow_ended live) and claims the next workflow. */
/* The client ended the workflow: the coordinator forgets its affinity and its forecasts, and every
 * instance's cache hears it (the policy's retired cache). */
static void workflow_ended(BatchCluster *cl, const char *name, double now) {
    router_workflow_ended(&cl->router, name);
    if (cl->forecasting) workflow_forecast_end(&cl->forecast, name, now);
    for (int i = 0; i < cl->cfg->n_instances; i++)
        if (cl->inst[i].up) sched_workflow_end(&cl->inst[i].sched, name);
}

static void stage_done(BatchCluster *cl, BatchReq *q, double now) {
    if (!cl->cfg->closed_loop || q->workflow < 0) return;
    for (int k = 0; k < q->n_next_stage; k++) {
        BatchReq *d = &cl->reqs[cl->stage_order[q->next_stage + k]];
        if (--d->waiting_for == 0) release(cl, d, now);
    }
    SimWorkflow *w = &cl->workflows[q->workflow];
    if (--w->unfinished > 0) return;
    workflow_ended(cl, w->name, now);
    claim_workflow(cl, now);
}

/* The coordinator's forecast for a workflow call ("what comes after it") reaches every instance when
 * the call is dispatched, before the call queues (coordinator.c send_forecast). A call the forecaster
 * cannot take only costs its forecast, as live. */
static void send_forecast(BatchCluster *cl, const TraceRequest *t, double now) {
    if (!cl->forecasting || !t->workflow[0] || !t->agent[0]) return;
    const AgentPrediction *p;
    BraidError err;
    const float *text = t->hidden && t->hidden_dim == workflow_forecast_text_dim(&cl->forecast) ? t->hidden : NULL;
    if (workflow_forecast_call_text(&cl->forecast, t->workflow, t->agent, text, now, &p, &err) || p->k == 0) return;
    for (int i = 0; i < cl->cfg->n_instances; i++)
        if (cl->inst[i].up) sched_predict(&cl->inst[i].sched, t->workflow, t->agent, p->k, p->n_agents, (const char *const *)p->agents, p->prob, &err);
}

/* Hands the request to its instance's scheduler (it runs from the next step that starts). */
static void enqueue(BatchCluster *cl, BatchReq *q, double now) {
    q->queued = true;
    if (sched_add(&cl->inst[q->instance].sched, &q->sr)) { /* it can never fit in the instance's pool */
        q->refused = q->done = true;
        stage_done(cl, q, now);
        router_prefill_done(&cl->router, &q->charge);
        router_finished(&cl->router, q->instance);
    }
}

/* A move's blocks land on the borrower: what the lender lent past the borrower's own prefix now is
 * committed to its cache (as kv_moves.c's land()). Returns the blocks that came over. */
static int land_move(BatchCluster *cl, BatchReq *q, BraidError *err) {
    KvCache *c = &cl->inst[q->instance].sched.cache;
    const TraceRequest *t = q->tr;
    CacheIdentity id;
    if (kv_cache_identity(c, t->tenant, t->adapter, t->workflow, t->agent, &id, err)) return -1;
    KvCacheMatch m;
    if (kv_cache_match(c, &id, q->sr.tokens, q->lent_blocks * cl->bs + 1, &m, err)) return -1;
    int got = kv_cache_acquire(c, &m, cl->table, err);
    if (got < 0) return -1;
    int moved = 0;
    RadixNode *lock = m.node;
    if (got < q->lent_blocks && kv_cache_reserve(c, q->lent_blocks - got, cl->table + got) == 0) {
        if (kv_cache_commit(c, &id, q->sr.tokens, q->lent_blocks, cl->table, &lock, false, err)) return -1;
        moved = q->lent_blocks - got;
    }
    kv_cache_release(c, lock, cl->table, got + moved);
    kv_cache_identity_release(c, &id);
    return moved;
}

/* The borrower's loop turn: time passes in its steps, so a move advances only while it is between two. */
static bool between_steps(const BatchCluster *cl, int instance) { return !cl->inst[instance].stepping; }

/* When the lender looks at q's ask: at once between its steps; in a step, at the first of its layer boundaries
 * (the step split in n_layers equal parts: the live leader's step pulse) at or after the ask, at the latest
 * when the step ends (n_layers <= 1: then). */
static double lender_turn(const BatchCluster *cl, const BatchReq *q) {
    const BatchInstance *in = &cl->inst[q->source];
    if (!in->stepping) return q->asked_at;
    int layers = cl->cfg->n_layers;
    double layer_s = (in->step_end - in->step_start) / (layers > 1 ? layers : 1);
    if (layers <= 1 || !(layer_s > 0)) return in->step_end;
    double from = q->asked_at > in->step_start ? q->asked_at : in->step_start;
    double t = in->step_start + ceil((from - in->step_start) / layer_s) * layer_s;
    return t < in->step_end ? t : in->step_end;
}

/* The lender answers with the prefix it holds now; NONE when it lends nothing the borrower lacks. */
static void move_answer(BatchCluster *cl, BatchReq *q) {
    int have = block_index_prefix(&cl->router.index[q->source], q->hashes, q->usable);
    int local = block_index_prefix(&cl->router.index[q->instance], q->hashes, q->usable);
    q->lent_blocks = have > local ? have : 0;
}

static void release_import_waiters(BatchCluster *cl, int mover, double now);

/* The move ends (landed, failed or lent nothing) and the request is queued on its instance. */
static int move_end(BatchCluster *cl, BatchReq *q, bool landed, double now, SimClusterResult *res, BraidError *err) {
    q->phase = MOVE_NONE;
    q->move_s = now - q->arrival;
    if (landed) {
        int moved = land_move(cl, q, err);
        if (moved < 0) return -1;
        q->moved_blocks = moved;
        if (moved > 0) {
            res->moves++;
            res->moved_blocks += (uint64_t)moved;
            res->moved_bytes += moved * cl->bs * cl->cfg->kv_bytes_per_token;
        }
    } else if (q->failed) {
        res->move_failures++;
    }
    enqueue(cl, q, now);
    release_import_waiters(cl, (int)(q - cl->reqs), now);
    return 0;
}

/* One step of q's move at now, if its leader is between steps; returns 1 when it advanced. */
static int move_advance(BatchCluster *cl, BatchReq *q, double now, SimClusterResult *res, BraidError *err) {
    const SimClusterConfig *cfg = cl->cfg;
    bool borrower_free = between_steps(cl, q->instance);
    if (q->phase == MOVE_PARKING) { /* the borrower takes the request and asks the lender */
        if (!borrower_free) return 0;
        q->deadline = cfg->move_timeout_s > 0 ? now + cfg->move_timeout_s : INFINITY;
        q->asked_at = now;
        q->phase = MOVE_ASKED;
        return 1;
    }
    if (q->phase == MOVE_READING && borrower_free && now >= q->land_at && q->land_at < q->deadline)
        return move_end(cl, q, true, now, res, err) ? -1 : 1;
    if (borrower_free && now >= q->deadline) { /* kv_moves_poll: no answer or no landing in time */
        q->failed = true;
        return move_end(cl, q, false, now, res, err) ? -1 : 1;
    }
    if (q->phase == MOVE_ASKED && (between_steps(cl, q->source) || now >= lender_turn(cl, q))) { /* the lender's turn */
        move_answer(cl, q);
        if (q->lent_blocks == 0) return move_end(cl, q, false, now, res, err) ? -1 : 1;
        q->phase = MOVE_ANSWERED;
        return 1;
    }
    if (q->phase == MOVE_ANSWERED && borrower_free) { /* the borrower reads what it lacks */
        int local = block_index_prefix(&cl->router.index[q->instance], q->hashes, q->usable);
        int lack = q->lent_blocks > local ? q->lent_blocks - local : 0;
        q->read_at = now;
        q->land_at = now + lack * cl->bs * cfg->kv_bytes_per_token / cfg->link_bytes_per_s + cfg->link_latency_s;
        q->phase = MOVE_READING;
        return 1;
    }
    return 0;
}

/* What m's import would bring q (worker/import_followers.h's gain): the whole blocks at the head of both prompts
 * that hold the same tokens (the same hashes: the same tenant and adapter too), at most the blocks m's move asked
 * for and q's usable prefix. */
static int import_gain(const BatchReq *q, const BatchReq *m) {
    int n = q->usable < m->asked_blocks ? q->usable : m->asked_blocks, k = 0;
    while (k < n && q->hashes[k] == m->hashes[k]) k++;
    return k;
}

/* The import q waits for, as the live leader holds a request without a move of its own (instance_leader.c
 * follow_import): among the moves toward q's instance not ended yet, the one that brings q the most blocks (ties:
 * the first parked), when that is more than the instance's cache holds of q's prompt now. -1: none, q is queued. */
static int import_to_wait_for(const BatchCluster *cl, const BatchReq *q) {
    int local = block_index_prefix(&cl->router.index[q->instance], q->hashes, q->usable), best = -1, best_gain = local;
    for (int k = 0; k < cl->n_moving; k++) {
        const BatchReq *m = &cl->reqs[cl->moving[k]];
        if (m->instance != q->instance || m->phase == MOVE_NONE) continue;
        int gain = import_gain(q, m);
        const BatchReq *b = best >= 0 ? &cl->reqs[best] : NULL;
        bool earlier = b && (m->arrival < b->arrival || (m->arrival == b->arrival && m < b));
        if (gain > best_gain || (b && gain == best_gain && earlier)) best = cl->moving[k], best_gain = gain;
    }
    /* As the leader: on a busy instance only a saving of half a step's tokens pays for about a step's wait. */
    const BatchInstance *in = &cl->inst[q->instance];
    if (best >= 0 && !import_followers_worth_waiting(best_gain, local, cl->bs, cl->cfg->lender_step_tokens, sched_idle(&in->sched)))
        return -1;
    return best;
}

/* The move of request `mover` ended at now: the requests held for it are queued, after it. */
static void release_import_waiters(BatchCluster *cl, int mover, double now) {
    int kept = 0;
    for (int k = 0; k < cl->n_import_waiting; k++) { /* in the order they came */
        BatchReq *w = &cl->reqs[cl->import_waiting[k]];
        if (w->import_wait != mover) {
            cl->import_waiting[kept++] = cl->import_waiting[k];
            continue;
        }
        w->import_wait_s = now - w->arrival;
        enqueue(cl, w, now);
    }
    cl->n_import_waiting = kept;
}

/* A request arrives: routed (and charged) as the coordinator does; a planned move parks it. */
static void arrive(BatchCluster *cl, BatchReq *q, double now, SimClusterResult *res) {
    const TraceRequest *t = q->tr;
    RouteDecision d = router_pick_prompt(&cl->router, q->hashes, q->usable, t->prompt_tokens, t->workflow);
    /* The coordinator's dispatch (coordinator.c dispatch_submit): charged, then assigned, then the move planned. */
    q->instance = d.instance;
    q->charge = router_charge(&cl->router, &d, t->prompt_tokens, now - cl->t0 + BOOKS_CLOCK_START_S);
    router_assigned(&cl->router, d.instance, t->workflow);
    MovePlan plan = move_plan(&cl->moves, &d, cl->can_move, cl->block_bytes, cl->bs);
    int src = plan.source;
    q->source = src;
    q->asked_blocks = plan.blocks < q->usable ? plan.blocks : q->usable;
    cl->inst[d.instance].served++;
    send_forecast(cl, t, now);
    if (src < 0 || src == d.instance) {
        q->import_wait = import_to_wait_for(cl, q);
        if (q->import_wait >= 0) cl->import_waiting[cl->n_import_waiting++] = (int)(q - cl->reqs), res->import_waits++;
        else enqueue(cl, q, now);
        return;
    }
    cl->moving[cl->n_moving++] = (int)(q - cl->reqs);
    q->phase = MOVE_PARKING;
    q->deadline = q->land_at = INFINITY;
}

/* Every move a leader between steps can advance at now, until none can (an idle lender answers at once). */
static int run_moves(BatchCluster *cl, double now, SimClusterResult *res, BraidError *err) {
    for (bool again = true; again;) {
        again = false;
        for (int k = 0; k < cl->n_moving; k++) {
            BatchReq *q = &cl->reqs[cl->moving[k]];
            int got = move_advance(cl, q, now, res, err);
            if (got < 0) return -1;
            if (got == 0) continue;
            if (q->phase == MOVE_NONE) cl->moving[k--] = cl->moving[--cl->n_moving];
            again = true;
        }
    }
    return 0;
}

/* The request's line in cfg->route_log (when asked for): where the replay placed it and what it found. */
static void log_finished(const BatchCluster *cl, const BatchReq *q) {
    FILE *f = cl->cfg->route_log;
    if (!f) return;
    fprintf(f, "{\"id\":\"%s\",\"workflow\":\"%s\",\"t\":%.6f,\"instance\":%d,\"source\":%d,\"prompt_tokens\":%d,\"cached_tokens\":%d,"
               "\"moved_tokens\":%d,\"move_failed\":%s,\"ttft_s\":%.6f,\"finish\":%.6f,\"import_wait\":\"%s\",\"import_wait_s\":%.6f}\n",
            q->tr->id, q->tr->workflow, q->arrival - cl->t0, q->instance, q->source, q->tr->prompt_tokens,
            q->sr.cached_tokens > 0 ? q->sr.cached_tokens : 0, q->moved_blocks * cl->bs, q->failed ? "true" : "false",
            q->first_token - q->arrival, q->finish - cl->t0, q->import_wait >= 0 ? cl->reqs[q->import_wait].tr->id : "",
            q->import_wait_s);
}

/* Instance i's step ends at now: committed, first and last tokens timed. */
static void end_step(BatchCluster *cl, int i, double now, BraidError *err, int *rc) {
    BatchInstance *in = &cl->inst[i];
    in->stepping = false;
    sched_commit(&in->sched, &in->plan);
    for (int e = 0; e < in->plan.n && *rc == 0; e++) {
        SchedRequest *r = in->plan.entries[e].req;
        if (!in->plan.entries[e].sample) continue;
        if (sched_append_token(r, (int32_t)(7 + r->n_tokens % 1000))) {
            *rc = braid_error_set(err, "sim cluster: out of memory");
            return;
        }
        BatchReq *q = (BatchReq *)r;
        if (r->n_tokens == r->n_prompt + 1) {
            q->first_token = now;
            router_prefill_done(&cl->router, &q->charge);
        }
        if (r->n_tokens - r->n_prompt >= r->max_tokens) {
            int computed = r->n_prompt - (r->cached_tokens > 0 ? r->cached_tokens : 0);
            sched_finish(&in->sched, r, "length");
            q->finish = now;
            q->done = true;
            /* The coordinator's on_finish: the rates learned (the move's too), then the load released. */
            router_learn(&cl->router, &q->charge, q->first_token - q->arrival, computed, q->moved_blocks * cl->bs);
            if (q->moved_blocks > 0) router_learn_move(&cl->router, q->source, i, q->moved_blocks * cl->bs, q->land_at - q->read_at, 0);
            router_finished(&cl->router, i);
            log_finished(cl, q);
            stage_done(cl, q, now);
        }
    }
}

/* Idle instances with work start a step at now. */
static int start_steps(BatchCluster *cl, double now, SimClusterResult *res, BraidError *err) {
    for (int i = 0; i < cl->cfg->n_instances; i++) {
        BatchInstance *in = &cl->inst[i];
        if (in->stepping || sched_idle(&in->sched)) continue;
        int n = sched_plan(&in->sched, &in->plan, err);
        if (n < 0) return -1;
        if (n == 0) return braid_error_set(err, "sim cluster: instance %d's scheduler planned nothing with requests waiting", i);
        int prefill = 0, decodes = 0;
        for (int e = 0; e < in->plan.n; e++) {
            const PlanEntry *pe = &in->plan.entries[e];
            BatchReq *q = (BatchReq *)pe->req;
            if (!q->started) q->started = true, q->started_at = now;
            if (pe->start < pe->req->n_prompt) prefill += pe->count;
            else decodes++;
        }
        cache_ops_clear(&in->plan.ops); /* no data to copy in the replay */
        res->steps++;
        if (prefill + decodes > res->max_step_tokens) res->max_step_tokens = prefill + decodes;
        in->stepping = true;
        in->step_start = now;
        in->step_end = now + cl->cfg->step_s + cl->cfg->prefill_s_per_token * prefill + cl->decode_seq_s * decodes;
    }
    return 0;
}

/* Past the requests the client model sends (closed_loop): the next one sent at its trace time. */
static int skip_held(const BatchCluster *cl, int next) {
    while (next < cl->n_reqs && cl->reqs[next].held) next++;
    return next;
}

/* The earliest event after the ones handled: an arrival (at its trace time or released by the client
 * model), a workflow's end (open loop: the trace's), a step's end, or a move's next event. */
static double next_event(const BatchCluster *cl, int next) {
    double te = next < cl->n_reqs ? cl->reqs[next].arrival : INFINITY;
    for (int k = 0; k < cl->n_released; k++)
        if (cl->reqs[cl->released[k]].arrival < te) te = cl->reqs[cl->released[k]].arrival;
    if (!cl->cfg->closed_loop && cl->next_end < cl->trace->n_ends && cl->trace->ends[cl->next_end].t < te) te = cl->trace->ends[cl->next_end].t;
    for (int i = 0; i < cl->cfg->n_instances; i++)
        if (cl->inst[i].stepping && cl->inst[i].step_end < te) te = cl->inst[i].step_end;
    for (int k = 0; k < cl->n_moving; k++) { /* a borrower mid-step sees its landing or timeout at its step's end */
        const BatchReq *q = &cl->reqs[cl->moving[k]];
        if (q->phase == MOVE_ASKED && !between_steps(cl, q->source) && lender_turn(cl, q) < te) te = lender_turn(cl, q);
        if (!between_steps(cl, q->instance)) continue;
        if (q->phase == MOVE_READING && q->land_at < te) te = q->land_at;
        if (q->deadline < te) te = q->deadline;
    }
    return te;
}

static bool all_done(const BatchCluster *cl, int next) {
    if (next < cl->n_reqs || cl->n_released > 0 || cl->n_moving > 0 || cl->n_import_waiting > 0) return false;
    for (int i = 0; i < cl->cfg->n_instances; i++)
        if (cl->inst[i].stepping || !sched_idle(&cl->inst[i].sched)) return false;
    return true;
}

/* closed_loop: the released requests whose send time has come, earliest first (ties: trace order, the
 * order the client claimed their workflows), routed as they reach the coordinator. */
static void arrive_released(BatchCluster *cl, double now, SimClusterResult *res) {
    for (;;) {
        int best = -1;
        for (int k = 0; k < cl->n_released; k++) {
            const BatchReq *q = &cl->reqs[cl->released[k]];
            if (q->arrival > now) continue;
            const BatchReq *b = best >= 0 ? &cl->reqs[cl->released[best]] : NULL;
            if (!b || q->arrival < b->arrival || (q->arrival == b->arrival && q < b)) best = k;
        }
        if (best < 0) return;
        BatchReq *q = &cl->reqs[cl->released[best]];
        cl->released[best] = cl->released[--cl->n_released];
        arrive(cl, q, q->arrival, res);
    }
}

static int replay(BatchCluster *cl, SimClusterResult *res, BraidError *err) {
    int next = 0, rc = 0;
    for (int c = 0; cl->cfg->closed_loop && c < cl->clients; c++) claim_workflow(cl, cl->t0);
    while (rc == 0 && !all_done(cl, next = skip_held(cl, next))) {
        double now = next_event(cl, next);
        if (!isfinite(now)) return braid_error_set(err, "sim cluster: the replay stalled with requests in flight");
        for (int i = 0; i < cl->cfg->n_instances && rc == 0; i++) /* steps end before anything else at the same time */
            if (cl->inst[i].stepping && cl->inst[i].step_end <= now) end_step(cl, i, now, err, &rc);
        if (rc) break;
        /* Open loop: the client's workflow ends reach the coordinator when the trace says (before a call sent then). */
        for (; !cl->cfg->closed_loop && cl->next_end < cl->trace->n_ends && cl->trace->ends[cl->next_end].t <= now; cl->next_end++)
            workflow_ended(cl, cl->trace->ends[cl->next_end].workflow, now);
        for (; (next = skip_held(cl, next)) < cl->n_reqs && cl->reqs[next].arrival <= now; next++) arrive(cl, &cl->reqs[next], now, res);
        arrive_released(cl, now, res);
        if ((rc = run_moves(cl, now, res, err)) == 0) rc = start_steps(cl, now, res, err);
    }
    return rc;
}

/* The totals and percentiles from the requests' timings. */
static int summarize(const BatchCluster *cl, SimClusterResult *res) {
    int n = cl->n_reqs, bs = cl->bs;
    double *lat = malloc((size_t)(n > 0 ? n : 1) * sizeof *lat), *ttft = malloc((size_t)(n > 0 ? n : 1) * sizeof *ttft);
    if (!lat || !ttft) {
        free(lat), free(ttft);
        return -1;
    }
    double sum_lat = 0, sum_ttft = 0, sum_wait = 0, sum_move = 0, last = cl->t0;
    int timed = 0;
    for (int k = 0; k < n; k++) {
        const BatchReq *q = &cl->reqs[k];
        const TraceRequest *t = q->tr;
        res->requests++;
        res->prompt_tokens += (uint64_t)t->prompt_tokens;
        sum_move += q->move_s;
        if (q->refused) {
            res->too_large++;
            res->computed_tokens += (uint64_t)t->prompt_tokens;
            continue;
        }
        int cached = q->sr.cached_tokens > 0 ? q->sr.cached_tokens : 0;
        if (cached > t->prompt_tokens) cached = t->prompt_tokens;
        int remote = q->moved_blocks * bs < cached ? q->moved_blocks * bs : cached;
        res->local_tokens += (uint64_t)(cached - remote);
        res->remote_tokens += (uint64_t)remote;
        res->computed_tokens += (uint64_t)(t->prompt_tokens - cached);
        lat[timed] = q->finish - q->arrival;
        ttft[timed] = q->first_token - q->arrival;
        sum_lat += lat[timed];
        sum_ttft += ttft[timed];
        sum_wait += q->started_at - q->arrival;
        if (q->finish > last) last = q->finish;
        timed++;
    }
    if (res->requests > 0) {
        res->mean_move_s = sum_move / res->requests;
        res->span_s = last - cl->t0;
        for (int i = 0; i < cl->cfg->n_instances; i++)
            if ((double)cl->inst[i].served / res->requests > res->max_share) res->max_share = (double)cl->inst[i].served / res->requests;
    }
    for (int i = 0; i < cl->cfg->n_instances; i++)
        if (cl->inst[i].up) res->preemptions += cl->inst[i].sched.counters.preemptions;
    if (timed > 0) {
        res->mean_latency_s = sum_lat / timed;
        res->mean_ttft_s = sum_ttft / timed;
        res->mean_wait_s = sum_wait / timed;
        res->p50_latency_s = sim_percentile(lat, timed, 0.50);
        res->p99_latency_s = sim_percentile(lat, timed, 0.99);
        res->p99_ttft_s = sim_percentile(ttft, timed, 0.99);
    }
    free(lat), free(ttft);
    return 0;
}

int sim_cluster_batch_run(const Trace *t, const SimClusterConfig *cfg, int router_mode, SimClusterResult *res, BraidError *err) {
    memset(res, 0, sizeof *res);
    if (check_config(cfg, err)) return -1;
    BatchCluster cl;
    int rc = cluster_init(&cl, t, cfg, router_mode, err);
    if (rc == 0) rc = replay(&cl, res, err);
    if (rc == 0 && summarize(&cl, res)) rc = braid_error_set(err, "sim cluster: out of memory");
    cluster_free(&cl);
    return rc;
}
