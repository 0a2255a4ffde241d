#include "coord/coordinator.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/grow.h"
#include "common/json_text.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "model/lora_adapter.h"
#include "sim/trace_writer.h"
#include "transport/control_msg.h"
#include "transport/move_msg.h"

static int leader_rank(const Coordinator *c, int instance) { return 1 + instance * c->cfg.tp; }

static int instance_of_rank(const Coordinator *c, int rank) {
    int i = (rank - 1) / c->cfg.tp;
    return rank >= 1 && (rank - 1) % c->cfg.tp == 0 && i < c->cfg.n_instances ? i : -1;
}

/* --join-slots: the slots without a rank in this job start dead, awaiting a leader that joins from
 * its own MPI job; the accept thread starts. The thread stays inside MPI until the process ends,
 * so this job ends without MPI_Finalize (lost_ranks tells the workers so at SHUTDOWN too). */
static int await_joins(Coordinator *c, BraidError *err) {
    const char *why = "awaiting a joining instance (--join-slots)";
    for (int i = c->cfg.join_first; i < c->cfg.n_instances; i++) {
        instance_health_declare_dead(&c->health, i, why);
        c->status[i].state = INSTANCE_DEAD;
        snprintf(c->status[i].reason, sizeof c->status[i].reason, "%s", why);
        c->dead_instances++;
        router_instance_down(&c->router, i);
        metrics_instance_down(c->metrics, i);
    }
    c->lost_ranks = true;
    if (!(c->joins = join_acceptor_start(c->cfg.join_service, err))) return braid_error_wrap(err, "coordinator: --join-slots");
    return 0;
}

int coordinator_init(Coordinator *c, const CoordinatorConfig *cfg, MPI_Comm world, Metrics *metrics, BraidError *err) {
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->world = world;
    c->metrics = metrics;
    c->next_id = 1;
    c->warming = cfg->warm_start;
    c->t_start = c->last_expiry = braid_now_seconds();
    c->cfg.forecast.predictor = NULL; /* c->forecast owns it from here */
    if (workflow_forecast_init(&c->forecast, &cfg->forecast, err)) return braid_error_wrap(err, "coordinator: workflow forecasts");
    c->have_forecast = true;
    c->status = calloc((size_t)(cfg->n_instances > 0 ? cfg->n_instances : 1), sizeof *c->status);
    if (!c->status || router_init(&c->router, cfg->n_instances, cfg->load_slack)) {
        free(c->status);
        workflow_forecast_free(&c->forecast);
        return braid_error_set(err, "coordinator: out of memory");
    }
    if (instance_health_init(&c->health, cfg->n_instances, cfg->tp, cfg->ranks, cfg->instance_timeout_s, braid_now_seconds())) {
        router_free(&c->router);
        free(c->status);
        workflow_forecast_free(&c->forecast);
        return braid_error_set(err, "coordinator: out of memory");
    }
    c->reviving = calloc((size_t)(cfg->n_instances > 0 ? cfg->n_instances : 1), sizeof *c->reviving);
    c->ever_ready = calloc((size_t)(cfg->n_instances > 0 ? cfg->n_instances : 1), sizeof *c->ever_ready);
    c->can_move = calloc((size_t)(cfg->n_instances > 0 ? cfg->n_instances : 1), sizeof *c->can_move);
    c->block_bytes = calloc((size_t)(cfg->n_instances > 0 ? cfg->n_instances : 1), sizeof *c->block_bytes);
    /* Joined leaders (--join-slots) are reached like spawned ones, through InstanceRestarts' endpoints. */
    static const char *const no_respawn_args[] = {NULL};
    c->restarts_on = (cfg->max_restarts > 0 && cfg->respawn_args) || cfg->join_service;
    c->router.mode = cfg->router_mode;
    /* The cost router's priors are the move cost model's settings; it learns from there. */
    c->router.cost = route_cost_model_init(cfg->moves.enabled, cfg->moves.prefill_tokens_per_s, cfg->moves.link_bytes_per_s, cfg->moves.latency_s);
    c->router.cost.min_move_blocks = cfg->moves.min_blocks;
    c->router.cost.lender_step_tokens = cfg->moves.lender_step_tokens;
    c->router.cost.lender_step_parts = ROUTE_COST_LIVE_LENDER_STEP_PARTS; /* until a READY says the model's layers */
    c->router.cost.move_timeout_s = cfg->moves.timeout_s;
    if (!c->reviving || !c->ever_ready || !c->can_move || !c->block_bytes ||
        (c->restarts_on && instance_restarts_init(&c->restarts, cfg->n_instances, cfg->max_restarts,
                                                  cfg->respawn_args ? cfg->respawn_args : no_respawn_args, err))) {
        free(c->reviving), free(c->ever_ready), free(c->can_move), free(c->block_bytes);
        instance_health_free(&c->health);
        router_free(&c->router);
        free(c->status);
        workflow_forecast_free(&c->forecast);
        return c->restarts_on ? -1 : braid_error_set(err, "coordinator: out of memory");
    }
    if (request_watchdog_init(&c->watchdog, cfg->n_instances, cfg->request_watchdog_s)) {
        if (c->restarts_on) instance_restarts_free(&c->restarts);
        free(c->reviving), free(c->ever_ready), free(c->can_move), free(c->block_bytes);
        instance_health_free(&c->health);
        router_free(&c->router);
        free(c->status);
        workflow_forecast_free(&c->forecast);
        return braid_error_set(err, "coordinator: out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->lora_op.done, NULL);
    ctrl_init(&c->ctrl, world);
    if (cfg->join_service && await_joins(c, err)) {
        coordinator_free(c);
        return -1;
    }
    return 0;
}

/* Where instance i's leader is reached: a spawned leader's own endpoint (rank 0 of the remote
 * group), else the world's, at its rank. */
static CtrlEndpoint *leader_endpoint(Coordinator *c, int instance, int *dest) {
    if (c->restarts_on && c->restarts.joined[instance]) {
        *dest = 0;
        return &c->restarts.ep[instance];
    }
    *dest = leader_rank(c, instance);
    return &c->ctrl;
}

static int send_to_instance(Coordinator *c, int instance, int type, WireBuf *b, BraidError *err) {
    int dest;
    CtrlEndpoint *ep = leader_endpoint(c, instance, &dest);
    return ctrl_send(ep, dest, type, b, err);
}

void coordinator_free(Coordinator *c) {
    for (int i = 0; i < c->n_queue; i++) {
        coord_request_release(c->queue[i].req);
        free(c->queue[i].workflow);
        free(c->queue[i].tenant);
    }
    free(c->queue);
    for (int i = 0; i < c->n_table; i++) coord_request_release(c->table[i]);
    free(c->table);
    router_free(&c->router);
    cache_key_affinity_free(&c->cache_keys);
    instance_health_free(&c->health);
    request_watchdog_free(&c->watchdog);
    join_acceptor_stop(c->joins);
    if (c->restarts_on) instance_restarts_free(&c->restarts);
    free(c->reviving);
    free(c->ever_ready);
    free(c->can_move);
    free(c->block_bytes);
    free(c->replay_pending);
    free(c->replay_blocks);
    lora_roster_free(&c->lora_roster);
    free(c->status);
    if (c->have_forecast) workflow_forecast_free(&c->forecast);
    ctrl_free(&c->ctrl);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->lora_op.done);
}

/* ---- any thread ---- */

static int enqueue_locked(Coordinator *c, CoordCommand cmd) {
    if (braid_grow((void **)&c->queue, &c->cap_queue, c->n_queue + 1, sizeof *c->queue)) return -1;
    c->queue[c->n_queue++] = cmd;
    pthread_cond_signal(&c->wake);
    return 0;
}

/* Until every instance has either come up or died. */
static bool loading_locked(const Coordinator *c) { return c->ready_instances + c->dead_instances < c->cfg.n_instances; }

char *coordinator_workflow_key(const char *tenant, const char *workflow) {
    if (!workflow) return NULL;
    if (!tenant || !tenant[0]) return strdup(workflow);
    size_t n = strlen(tenant) + strlen(workflow) + 32;
    char *key = malloc(n);
    if (key) snprintf(key, n, "%zu:%s/%s", strlen(tenant), tenant, workflow);
    return key;
}

SubmitResult coordinator_submit(Coordinator *c, CoordRequest *req) {
    /* Routing, forecasts and the instances see the workflow in its tenant's namespace. */
    if (req->workflow && !req->workflow_key && !(req->workflow_key = coordinator_workflow_key(req->tenant, req->workflow))) {
        metrics_count_rejected(c->metrics);
        return SUBMIT_BUSY;
    }
    pthread_mutex_lock(&c->mu);
    SubmitResult rc = SUBMIT_OK;
    if (c->draining || c->failed || loading_locked(c) || c->dead_instances == c->cfg.n_instances) rc = SUBMIT_UNAVAILABLE;
    else if (c->inflight >= c->cfg.max_pending) rc = SUBMIT_BUSY;
    if (rc == SUBMIT_OK) {
        req->id = c->next_id++;
        req->t_submit = braid_now_seconds();
        coord_request_retain(req);
        if (enqueue_locked(c, (CoordCommand){.kind = CMD_SUBMIT, .req = req})) {
            coord_request_release(req);
            rc = SUBMIT_BUSY;
        } else {
            c->inflight++;
        }
    }
    if (rc == SUBMIT_OK) metrics_set_inflight(c->metrics, c->inflight);
    pthread_mutex_unlock(&c->mu);
    if (rc == SUBMIT_BUSY) metrics_count_rejected(c->metrics);
    return rc;
}

void coordinator_cancel(Coordinator *c, uint64_t req_id) {
    pthread_mutex_lock(&c->mu);
    if (enqueue_locked(c, (CoordCommand){.kind = CMD_CANCEL, .req_id = req_id}))
        LOG_WARN("coord", "req %llu: out of memory queueing its cancel", (unsigned long long)req_id);
    pthread_mutex_unlock(&c->mu);
}

int coordinator_workflow_end(Coordinator *c, const char *tenant, const char *workflow) {
    char *copy = strdup(workflow), *owner = tenant && tenant[0] ? strdup(tenant) : NULL;
    bool ok = copy && (owner || !tenant || !tenant[0]);
    pthread_mutex_lock(&c->mu);
    int rc = ok ? enqueue_locked(c, (CoordCommand){.kind = CMD_WORKFLOW_END, .workflow = copy, .tenant = owner}) : -1;
    pthread_mutex_unlock(&c->mu);
    if (rc) free(copy), free(owner);
    return rc;
}

void coordinator_on_drain(Coordinator *c, void (*fn)(void *ctx), void *ctx) {
    c->on_drain = fn;
    c->on_drain_ctx = ctx;
}

void coordinator_watchdog_status(Coordinator *c, double *timeout_s, uint64_t *failed, uint64_t *last_id) {
    pthread_mutex_lock(&c->mu);
    *timeout_s = c->cfg.request_watchdog_s > 0 ? c->cfg.request_watchdog_s : 0;
    *failed = c->watchdog_failed;
    *last_id = c->watchdog_last_id;
    pthread_mutex_unlock(&c->mu);
}

const char *coordinator_state(Coordinator *c) {
    pthread_mutex_lock(&c->mu);
    const char *s = c->failed || c->dead_instances == c->cfg.n_instances ? "failed"
                    : c->draining                                       ? "draining"
                    : loading_locked(c)                                 ? "loading"
                    : c->warming                                        ? "warming"
                    : c->dead_instances > 0                             ? "degraded"
                                                                        : "ready";
    pthread_mutex_unlock(&c->mu);
    return s;
}

int coordinator_instances(Coordinator *c, InstanceStatus *out, int cap) {
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->cfg.n_instances && i < cap; i++) out[i] = c->status[i];
    int alive = c->cfg.n_instances - c->dead_instances;
    pthread_mutex_unlock(&c->mu);
    return alive;
}

void coordinator_warming_done(Coordinator *c) {
    pthread_mutex_lock(&c->mu);
    c->warming = false;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
}

void coordinator_on_instance_restarted(Coordinator *c, void (*fn)(void *ctx, int instance), void *ctx) {
    c->on_restarted = fn;
    c->on_restarted_ctx = ctx;
}

void coordinator_pool(Coordinator *c, int *pool_tokens, int *block_size) {
    pthread_mutex_lock(&c->mu);
    *pool_tokens = c->pool_tokens;
    *block_size = c->block_size;
    pthread_mutex_unlock(&c->mu);
}

/* ---- MPI thread: the request table ---- */

static int table_find(const Coordinator *c, uint64_t id) {
    int lo = 0, hi = c->n_table - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c->table[mid]->id == id) return mid;
        if (c->table[mid]->id < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static double server_seconds(const Coordinator *c);
static void release_workflow_hold(Coordinator *c, CoordRequest *r);

static void table_remove(Coordinator *c, int at) {
    release_workflow_hold(c, c->table[at]);
    coord_request_release(c->table[at]);
    memmove(c->table + at, c->table + at + 1, (size_t)(c->n_table - at - 1) * sizeof *c->table);
    c->n_table--;
}

static void request_done(Coordinator *c) {
    pthread_mutex_lock(&c->mu);
    c->inflight--;
    metrics_set_inflight(c->metrics, c->inflight);
    pthread_mutex_unlock(&c->mu);
}

static void log_route(Coordinator *c, const CoordRequest *r, RouteDecision d) {
    if (!c->cfg.events) return;
    fprintf(c->cfg.events, "{\"t\":%.6f,\"event\":\"route\",\"req\":%llu,\"workflow\":", braid_now_seconds(),
            (unsigned long long)r->id);
    json_text_string(c->cfg.events, r->workflow);
    fprintf(c->cfg.events, ",\"instance\":%d,\"matched_blocks\":%d,\"prompt_blocks\":%d,\"reason\":\"%s\",\"loads\":[",
            d.instance, d.matched_blocks, r->n_hashes, d.reason);
    for (int i = 0; i < c->router.n_instances; i++) fprintf(c->cfg.events, i ? ",%d" : "%d", c->router.load[i]);
    fputc(']', c->cfg.events);
    if (route_decision_priced(&d)) /* the cost router's estimate, and the rates it priced with (learned) */
        fprintf(c->cfg.events, ",\"est_ttft_s\":%.6f,\"est_queue_s\":%.6f,\"est_move_s\":%.6f,\"move\":%s,\"source\":%d,"
                "\"prefill_tokens_per_s\":%.1f,\"link_gbps\":%.4f", d.est_ttft_s, d.est_queue_s, d.est_move_s, d.move ? "true" : "false",
                d.source, 1.0 / c->router.cost.s_per_token, c->router.cost.link_bytes_per_s / 1e9);
    fputs("}\n", c->cfg.events);
    fflush(c->cfg.events);
}

/* Answers the request with an error of HTTP status `status` (500 or 503). */
static void fail_request_status(Coordinator *c, CoordRequest *r, int status, const char *why) {
    r->error_status = status; /* before the finish, whose mutex publishes it to the HTTP thread */
    coord_request_finish(r, FINISH_ERROR, &(CoordUsage){.prompt_tokens = r->n_prompt}, why);
    request_done(c);
}

static void fail_request(Coordinator *c, CoordRequest *r, const char *why) { fail_request_status(c, r, 500, why); }

/* ---- MPI thread: workflow forecasts ---- */

static double server_seconds(const Coordinator *c) { return braid_now_seconds() - c->t_start; }

static void publish_workflow_metrics(Coordinator *c) {
    WorkflowMetrics w = {.workflows_active = workflow_tracker_active(c->forecast.tracker), .forecasts_sent = c->forecasts_sent,
                         .step1_correct = c->forecast.correct_next, .step1_total = c->forecast.predicted_calls};
    metrics_set_workflows(c->metrics, &w);
}

typedef struct {
    int index;
    float mass;
} AgentMass;

static int by_mass_desc(const void *a, const void *b) {
    const AgentMass *x = a, *y = b;
    if (x->mass != y->mass) return x->mass > y->mass ? -1 : 1;
    return x->index - y->index;
}

/* The forecast as PREDICT, agents ordered by their predicted calls over the horizon (most first:
 * a policy that keeps only the first few keeps the likely ones) and cut at MSG_PREDICT_MAX_AGENTS. */
static int encode_forecast(WireBuf *b, const char *workflow, const char *agent, const AgentPrediction *p) {
    int n = p->n_agents < MSG_PREDICT_MAX_AGENTS ? p->n_agents : MSG_PREDICT_MAX_AGENTS;
    AgentMass *order = malloc((size_t)(p->n_agents > 0 ? p->n_agents : 1) * sizeof *order);
    char **names = malloc((size_t)(n > 0 ? n : 1) * sizeof *names);
    float *prob = malloc((size_t)p->k * (size_t)(n > 0 ? n : 1) * sizeof *prob);
    int rc = -1;
    if (order && names && prob) {
        for (int i = 0; i < p->n_agents; i++) {
            float mass = 0;
            for (int s = 0; s < p->k; s++) mass += p->prob[(size_t)s * p->n_agents + i];
            order[i] = (AgentMass){.index = i, .mass = mass};
        }
        qsort(order, (size_t)p->n_agents, sizeof *order, by_mass_desc);
        for (int j = 0; j < n; j++) {
            names[j] = p->agents[order[j].index];
            for (int s = 0; s < p->k; s++) prob[(size_t)s * n + j] = p->prob[(size_t)s * p->n_agents + order[j].index];
        }
        msg_predict_encode(b, &(MsgPredict){.workflow = (char *)workflow, .agent = (char *)agent, .k = p->k, .n_agents = n,
                                            .agents = names, .prob = prob});
        rc = b->failed ? -1 : 0;
    }
    free(order);
    free(names);
    free(prob);
    return rc;
}

/* The request is a call of its agent in its workflow: recorded, learned, forecast; the forecast
 * goes to every leader (the workflow's blocks may sit on any instance) before the request does. A
 * call the forecaster cannot take (out of memory, too many agent names) only costs its forecast. */
static int send_forecast(Coordinator *c, const CoordRequest *r, const AgentPrediction *p, BraidError *err) {
    int rc = 0;
    if (!c->cfg.send_forecasts || p->k == 0) return 0;
    WireBuf b = {0};
    if (encode_forecast(&b, r->workflow_key, r->agent, p)) {
        LOG_WARN("coord", "req %llu: workflow %s: out of memory encoding its forecast", (unsigned long long)r->id, r->workflow);
    } else {
        for (int i = 0; i < c->cfg.n_instances && rc == 0; i++) {
            if (instance_health_is_dead(&c->health, i)) continue;
            WireBuf copy = {0};
            wire_put(&copy, b.data, b.len);
            if (copy.failed) {
                wire_buf_free(&copy);
                LOG_WARN("coord", "workflow %s: out of memory sending its forecast", r->workflow);
                break;
            }
            rc = send_to_instance(c, i, MSG_PREDICT, &copy, err);
        }
        if (rc == 0) c->forecasts_sent++;
    }
    wire_buf_free(&b);
    return rc;
}

static bool is_workflow_call(const Coordinator *c, const CoordRequest *r) {
    return c->have_forecast && r->workflow_key && r->workflow_key[0] && r->agent && r->agent[0];
}

/* A workflow with a request queued or running is busy, not idle: --workflow-idle-timeout must not
 * retire it mid-request (on a loaded server that sent WORKFLOW_END for live workflows, and pbkv
 * then evicted their history first; issue 35). Held from the forecast until the request leaves
 * the request table; its idle clock restarts then. */
static void hold_workflow(Coordinator *c, CoordRequest *r) {
    if (r->workflow_held || !is_workflow_call(c, r)) return;
    r->workflow_held = workflow_tracker_hold(c->forecast.tracker, r->workflow_key) == 1;
}

static void release_workflow_hold(Coordinator *c, CoordRequest *r) {
    if (!r->workflow_held) return;
    r->workflow_held = false;
    workflow_tracker_release(c->forecast.tracker, r->workflow_key, server_seconds(c));
}

static int forecast_call(Coordinator *c, CoordRequest *r, BraidError *err) {
    if (!is_workflow_call(c, r)) return 0;
    const AgentPrediction *p;
    BraidError ferr;
    int rc = 0;
    if (workflow_forecast_call(&c->forecast, r->workflow_key, r->agent, server_seconds(c), &p, &ferr))
        LOG_WARN("coord", "req %llu: workflow %s: no forecast: %s", (unsigned long long)r->id, r->workflow, ferr.msg);
    else
        rc = send_forecast(c, r, p, err);
    hold_workflow(c, r);
    publish_workflow_metrics(c);
    return rc;
}

/* Whether the instance should send the request's prefill hidden state: the predictor reads it,
 * or the trace records it (training data for the graph predictor). */
static bool wants_hidden(const Coordinator *c, const CoordRequest *r) {
    return (is_workflow_call(c, r) && workflow_forecast_text_dim(&c->forecast) > 0) || (c->cfg.trace && r->workflow && r->workflow[0]);
}

/* The prefill's hidden state of a call: the workflow's forecast again, now with it (PBKV § 4.1:
 * the semantic signal comes with the prefill), and kept for the trace. */
static void on_hidden(Coordinator *c, WireReader *rd) {
    MsgHidden m;
    if (msg_hidden_decode(rd, &m)) return;
    int at = table_find(c, m.req_id);
    CoordRequest *r = at >= 0 ? c->table[at] : NULL;
    if (r && c->cfg.trace && !r->hidden) {
        r->hidden = m.values;
        r->hidden_dim = m.dim;
        m.values = NULL;
    }
    int want = r && is_workflow_call(c, r) ? workflow_forecast_text_dim(&c->forecast) : 0;
    const float *text = r && r->hidden ? r->hidden : m.values;
    if (r && want > 0 && want != m.dim && !c->warned_hidden_dim) {
        c->warned_hidden_dim = true;
        LOG_WARN("coord", "the predictor reads hidden states of %d values but the model's have %d: forecasts go without them", want, m.dim);
    } else if (r && want > 0) {
        const AgentPrediction *p;
        BraidError err;
        if (workflow_forecast_refine(&c->forecast, r->workflow_key, text, &p, &err))
            LOG_WARN("coord", "req %llu: workflow %s: no forecast: %s", (unsigned long long)r->id, r->workflow, err.msg);
        else if (p && send_forecast(c, r, p, &err))
            LOG_ERROR("coord", "workflow %s: sending its forecast: %s", r->workflow, err.msg);
        publish_workflow_metrics(c);
    }
    msg_hidden_free(&m);
}

/* The leaders' policies hear that the workflow ended (explicitly, or idle past the timeout). */
static int send_workflow_end(Coordinator *c, const char *workflow, BraidError *err) {
    for (int i = 0; i < c->cfg.n_instances; i++) {
        if (instance_health_is_dead(&c->health, i)) continue;
        WireBuf b = {0};
        wire_put_str(&b, workflow);
        if (send_to_instance(c, i, MSG_WORKFLOW_END, &b, err)) return -1;
    }
    return 0;
}

static void on_workflow_expired(void *ctx, const char *workflow) {
    Coordinator *c = ctx;
    LOG_DEBUG("coord", "workflow %s: idle past --workflow-idle-timeout, retired", workflow);
    if (c->expiry_rc == 0) c->expiry_rc = send_workflow_end(c, workflow, c->expiry_err);
}

/* Once a second: workflows idle past the timeout retire (not learned as an END: a slow workflow
 * that calls again resumes with its history). Not written to --trace-out, which records what
 * clients did. */
static int expire_workflows(Coordinator *c, BraidError *err) {
    double now = braid_now_seconds();
    if (!c->have_forecast || c->cfg.forecast.idle_timeout_s <= 0 || now - c->last_expiry < 1.0) return 0;
    c->last_expiry = now;
    c->expiry_rc = 0;
    c->expiry_err = err;
    int n = workflow_tracker_expire(c->forecast.tracker, now - c->t_start, on_workflow_expired, c);
    c->expiry_err = NULL;
    if (n > 0) {
        LOG_INFO("coord", "%d workflow%s idle past %.0f s retired", n, n == 1 ? "" : "s", c->cfg.forecast.idle_timeout_s);
        publish_workflow_metrics(c);
    }
    return c->expiry_rc;
}

static int send_submit(Coordinator *c, CoordRequest *r, BraidError *err) {
    MsgSubmit m = {.req_id = r->id, .max_tokens = r->max_tokens, .temperature = r->temperature, .top_p = r->top_p,
                   .top_k = r->top_k, .seed = r->seed, .ignore_eos = r->ignore_eos, .tenant = r->tenant, .adapter = r->adapter,
                   .workflow = r->workflow_key, .agent = r->agent, .tokens = r->prompt, .n_tokens = r->n_prompt,
                   .want_hidden = wants_hidden(c, r), .segment_mode = r->segment_mode,
                   .want_logprobs = r->want_logprobs, .logprobs_top = r->logprobs_top, .directives = r->directives, .grammar = r->grammar,
                   .pull_rank = r->pull_source >= 0 ? leader_rank(c, r->pull_source) : -1, .pull_blocks = r->pull_source >= 0 ? r->pull_blocks : 0,
                   .tenant_weight = (float)auth_keys_tenant_weight(c->cfg.keys, r->tenant)};
    WireBuf b = {0};
    msg_submit_encode(&b, &m);
    return send_to_instance(c, r->instance, MSG_SUBMIT, &b, err);
}

/* Whether the chosen instance should fetch the prefix another holds (move_plan.h): noted on r. */
static void plan_move(Coordinator *c, CoordRequest *r, const RouteDecision *d) {
    MovePlan p = move_plan(&c->cfg.moves, d, c->can_move, c->block_bytes, c->block_size);
    r->pull_source = p.source;
    r->pull_blocks = p.blocks;
    if (p.source < 0) return;
    c->moves_planned++;
    if (c->cfg.events) {
        fprintf(c->cfg.events,
                "{\"t\":%.6f,\"event\":\"move_planned\",\"req\":%llu,\"from\":%d,\"to\":%d,\"blocks\":%d,\"gain_blocks\":%d,"
                "\"move_s\":%.6f,\"recompute_s\":%.6f}\n",
                braid_now_seconds(), (unsigned long long)r->id, p.source, d->instance, p.blocks, p.blocks - d->matched_blocks, p.move_s,
                p.recompute_s);
        fflush(c->cfg.events);
    }
}

static int dispatch_submit(Coordinator *c, CoordRequest *r, BraidError *err) {
    RouteDecision d = router_pick_prompt(&c->router, r->block_hashes, r->n_hashes, r->n_prompt, r->workflow_key);
    cache_key_affinity_route(&c->cache_keys, &c->router, r->cache_key, r->block_hashes, r->n_hashes, &d);
    if (r->pin_instance >= 0 && r->pin_instance < c->cfg.n_instances && !c->router.down[r->pin_instance])
        d = (RouteDecision){.instance = r->pin_instance, .matched_blocks = r->n_hashes, .reason = "pinned", .source = -1}; /* an n > 1 sibling (where its prompt's KV is) or a re-warm head */
    if (d.instance < 0) { /* every instance died after this request was accepted */
        fail_request_status(c, r, 503, "no instance is alive to serve it");
        coord_request_release(r);
        return 0;
    }
    if (braid_grow((void **)&c->table, &c->cap_table, c->n_table + 1, sizeof *c->table)) {
        fail_request(c, r, "coordinator out of memory");
        coord_request_release(r);
        return 0;
    }
    r->instance = d.instance;
    r->t_progress = braid_now_seconds();
    c->table[c->n_table++] = r; /* ids grow monotonically, so appending keeps the table sorted */
    r->route_charge = router_charge(&c->router, &d, r->n_prompt, r->t_progress);
    router_assigned(&c->router, d.instance, r->workflow_key);
    cache_key_affinity_assigned(&c->cache_keys, r->cache_key, d.instance);
    log_route(c, r, d);
    plan_move(c, r, &d);
    if (forecast_call(c, r, err)) return -1;
    return send_submit(c, r, err);
}

static int dispatch_cancel(Coordinator *c, uint64_t id, BraidError *err) {
    int at = table_find(c, id);
    if (at < 0) return 0; /* already finished */
    c->table[at]->cancel_requested = true;
    WireBuf b = {0};
    wire_put_u64(&b, id);
    return send_to_instance(c, c->table[at]->instance, MSG_CANCEL, &b, err);
}

static int dispatch_workflow_end(Coordinator *c, const char *tenant, const char *workflow, BraidError *err) {
    char *key = coordinator_workflow_key(tenant, workflow);
    if (!key) {
        LOG_WARN("coord", "workflow %s: out of memory ending it; it retires when idle", workflow);
        return 0;
    }
    router_workflow_ended(&c->router, key);
    if (c->cfg.trace && trace_write_workflow_end(c->cfg.trace, braid_now_seconds() - c->t_start, workflow))
        LOG_WARN("coord", "workflow %s: could not write its trace line", workflow);
    if (c->have_forecast) {
        workflow_forecast_end(&c->forecast, key, server_seconds(c));
        publish_workflow_metrics(c);
    }
    int rc = send_workflow_end(c, key, err);
    free(key);
    return rc;
}

/* ---- adapters at run time ---- */

/* Requests in flight that run adapter `name` (MPI thread: the table is its own). */
static int requests_of_adapter(const Coordinator *c, const char *name) {
    int n = 0;
    for (int i = 0; i < c->n_table; i++)
        if (lora_name_is(c->table[i]->adapter, name)) n++; /* requests carry the cache name (any generation) */
    return n;
}

static void lora_op_finish_locked(Coordinator *c) {
    c->lora_op.finished = true;
    pthread_cond_broadcast(&c->lora_op.done);
}

/* CMD_LORA: LORA_LOAD / LORA_UNLOAD to every live instance's leader (its TP peers take no part:
 * adapters run with --tp 1 only, which the leader checks). */
static int dispatch_lora(Coordinator *c, BraidError *err) {
    pthread_mutex_lock(&c->mu);
    CoordLoraOp *op = &c->lora_op;
    if (!op->active || op->finished) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (op->unload && (op->busy = requests_of_adapter(c, op->name)) > 0) {
        lora_op_finish_locked(c);
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    int rc = 0;
    op->expected = 0;
    /* A load is recorded before it is sent: an instance that restarts from now on gets it too. An
     * unload leaves the roster when some instance did it (coordinator_lora): refused everywhere (a
     * request in flight there), the adapter stays loaded and restarted instances still need it. */
    if (!op->unload && lora_roster_put(&c->lora_roster, op->name, op->path, op->generation))
        LOG_WARN("coord", "adapter '%s': out of memory recording it; an instance that restarts will not get it again", op->name);
    for (int i = 0; rc == 0 && i < c->cfg.n_instances; i++) {
        /* A revived instance still loading the roster gets it after those (its answers come in order). */
        if (c->status[i].state != INSTANCE_UP && !(c->replay_pending && c->replay_pending[i] > 0)) continue;
        WireBuf b = {0};
        wire_put_str(&b, op->name);
        if (!op->unload) wire_put_str(&b, op->path), wire_put_i32(&b, op->generation);
        if ((rc = send_to_instance(c, i, op->unload ? MSG_LORA_UNLOAD : MSG_LORA_LOAD, &b, err)) == 0) op->expected++;
    }
    if (op->expected == 0) {
        snprintf(op->why, sizeof op->why, "no instance is up to %s the adapter", op->unload ? "unload" : "load");
        lora_op_finish_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void instance_up(Coordinator *c, int instance, int n_blocks);

/* A revived instance's answer to one of the roster's loads; at the last it rejoins routing. */
static void on_replay_result(Coordinator *c, int instance, int ok, const char *name, const char *why) {
    if (ok != 1)
        LOG_ERROR("coord", "instance %d: adapter '%s' could not be loaded again after its restart: %s; requests naming it fail there",
                  instance, name ? name : "?", why ? why : "?");
    if (--c->replay_pending[instance] > 0) return;
    LOG_INFO("coord", "instance %d: the run-time adapters are loaded again", instance);
    instance_up(c, instance, c->replay_blocks[instance]);
}

/* A revived instance is sent every run-time adapter (LORA_LOAD each) before it rejoins routing.
 * Returns the loads sent (0: none to send, or they could not be: it rejoins at once). */
static int replay_roster(Coordinator *c, int instance, int n_blocks) {
    if (!c->replay_pending) {
        c->replay_pending = calloc((size_t)c->cfg.n_instances, sizeof *c->replay_pending);
        c->replay_blocks = calloc((size_t)c->cfg.n_instances, sizeof *c->replay_blocks);
        if (!c->replay_pending || !c->replay_blocks) {
            free(c->replay_pending), free(c->replay_blocks);
            c->replay_pending = c->replay_blocks = NULL;
            LOG_ERROR("coord", "instance %d: out of memory sending it the run-time adapters again", instance);
            return 0;
        }
    }
    int sent = 0;
    BraidError err = {{0}};
    pthread_mutex_lock(&c->mu);
    for (int k = 0; k < c->lora_roster.n; k++) {
        const LoraRosterEntry *e = &c->lora_roster.entries[k];
        WireBuf b = {0};
        wire_put_str(&b, e->name), wire_put_str(&b, e->path), wire_put_i32(&b, e->generation);
        if (send_to_instance(c, instance, MSG_LORA_LOAD, &b, &err)) {
            LOG_ERROR("coord", "instance %d: sending adapter '%s' again: %s", instance, e->name, err.msg);
            break;
        }
        sent++;
    }
    pthread_mutex_unlock(&c->mu);
    c->replay_pending[instance] = sent;
    c->replay_blocks[instance] = n_blocks;
    if (sent > 0) LOG_INFO("coord", "instance %d restarted: loading its %d run-time adapter(s) again before it takes requests", instance, sent);
    return sent;
}

/* LORA_RESULT: u8 ok, str name, str error. */
static void on_lora_result(Coordinator *c, int instance, WireReader *rd) {
    int ok = wire_get_u8(rd);
    char *name = wire_get_str(rd), *why = wire_get_str(rd);
    if (c->replay_pending && c->replay_pending[instance] > 0) { /* its answers come in order: the roster's first */
        on_replay_result(c, instance, rd->failed ? 0 : ok, name, why);
        free(name);
        free(why);
        return;
    }
    pthread_mutex_lock(&c->mu);
    CoordLoraOp *op = &c->lora_op;
    if (op->active && !op->finished && !rd->failed && name && strcmp(name, op->name) == 0) {
        op->replied++;
        if (ok != 1 && op->failed++ == 0) snprintf(op->why, sizeof op->why, "instance %d: %s", instance, why ? why : "?");
        if (op->replied >= op->expected) lora_op_finish_locked(c);
    } else {
        LOG_WARN("coord", "instance %d: stray lora_result for '%s' ignored", instance, name ? name : "?");
    }
    pthread_mutex_unlock(&c->mu);
    free(name);
    free(why);
}

int coordinator_lora(Coordinator *c, bool unload, const char *name, const char *path, int generation, double timeout_s, int *succeeded,
                     char *why, size_t cap) {
    CoordLoraOp *op = &c->lora_op;
    if (succeeded) *succeeded = 0;
    pthread_mutex_lock(&c->mu);
    if (op->active) {
        pthread_mutex_unlock(&c->mu);
        snprintf(why, cap, "another adapter load or unload is under way; retry when it is done");
        return 409;
    }
    if (c->draining || c->failed) {
        pthread_mutex_unlock(&c->mu);
        snprintf(why, cap, "the server is %s", c->failed ? "failing" : "shutting down");
        return 503;
    }
    op->active = true, op->finished = false, op->unload = unload; /* done stays: a condition is not copied */
    op->expected = op->replied = op->failed = op->busy = 0;
    op->why[0] = '\0';
    snprintf(op->name, sizeof op->name, "%s", name);
    snprintf(op->path, sizeof op->path, "%s", path ? path : "");
    op->generation = generation > 0 ? generation : 1;
    int rc = 0;
    if (enqueue_locked(c, (CoordCommand){.kind = CMD_LORA})) {
        snprintf(why, cap, "out of memory queueing the adapter %s", unload ? "unload" : "load");
        rc = 503;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += (time_t)timeout_s;
    while (rc == 0 && !op->finished)
        if (pthread_cond_timedwait(&op->done, &c->mu, &deadline) == ETIMEDOUT) break;
    if (rc == 0 && !op->finished) {
        snprintf(why, cap, "%d of %d instances answered within %.0f s", op->replied, op->expected, timeout_s);
        rc = 503;
    } else if (rc == 0 && op->busy > 0) {
        snprintf(why, cap, "adapter '%s' has %d request(s) in flight; unload it when they are done", name, op->busy);
        rc = 409;
    } else if (rc == 0 && op->failed > 0) {
        snprintf(why, cap, "%s", op->why);
        rc = 400;
    } else if (rc == 0 && op->expected == 0) {
        snprintf(why, cap, "%s", op->why);
        rc = 503;
    }
    if (succeeded) *succeeded = op->replied - op->failed;
    if (!unload && rc != 0 && op->replied - op->failed <= 0) lora_roster_take(&c->lora_roster, name); /* nobody holds it */
    if (unload && op->replied - op->failed > 0) lora_roster_take(&c->lora_roster, name);       /* somebody let it go: it is retired */
    op->active = false;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Takes the queued commands in one swap so HTTP threads wait on the mutex only for that. */
static int drain_commands(Coordinator *c, BraidError *err) {
    pthread_mutex_lock(&c->mu);
    CoordCommand *cmds = c->queue;
    int n = c->n_queue;
    c->queue = NULL;
    c->n_queue = c->cap_queue = 0;
    pthread_mutex_unlock(&c->mu);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        CoordCommand *cmd = &cmds[i];
        if (rc == 0 && cmd->kind == CMD_SUBMIT) rc = dispatch_submit(c, cmd->req, err);
        else if (rc == 0 && cmd->kind == CMD_CANCEL) rc = dispatch_cancel(c, cmd->req_id, err);
        else if (rc == 0 && cmd->kind == CMD_WORKFLOW_END) rc = dispatch_workflow_end(c, cmd->tenant, cmd->workflow, err);
        else if (rc == 0 && cmd->kind == CMD_LORA) rc = dispatch_lora(c, err);
        else if (cmd->kind == CMD_SUBMIT) fail_request(c, cmd->req, "coordinator failed"), coord_request_release(cmd->req);
        free(cmd->workflow);
        free(cmd->tenant);
    }
    free(cmds);
    return n > 0 ? (rc ? -1 : 1) : 0;
}

/* ---- MPI thread: messages from the leaders ---- */

/* The ready line (the URL) goes out once every instance has come up or died, whichever is last,
 * and a warm start has finished. */
static void announce_when_started(Coordinator *c) {
    if (c->announced || !c->cfg.ready_line) return;
    pthread_mutex_lock(&c->mu);
    bool started = c->ready_instances + c->dead_instances >= c->cfg.n_instances && !c->warming;
    pthread_mutex_unlock(&c->mu);
    if (!started) return;
    c->announced = true;
    printf("%s\n", c->cfg.ready_line);
    fflush(stdout);
}

/* A busy leader answers a move's ask between two layers of its step: the router prices that wait with the
 * model's layer count, the first READY's (every instance serves the one model; another count is reported). */
static void note_model_layers(Coordinator *c, int instance, int n_layers) {
    if (n_layers <= 0) return;
    if (c->model_layers == 0) {
        c->model_layers = n_layers;
        c->router.cost.lender_step_parts = route_cost_lender_step_parts(n_layers);
        LOG_INFO("coord", "the model has %d layers (instance %d's READY): a busy lender's answer is priced at 1/%d of its step",
                 n_layers, instance, c->router.cost.lender_step_parts);
    } else if (n_layers != c->model_layers) {
        LOG_WARN("coord", "instance %d's model has %d layers, the first READY's %d: the router keeps pricing a busy lender's wait by %d",
                 instance, n_layers, c->model_layers, c->model_layers);
    }
}

static void on_ready(Coordinator *c, int instance, WireReader *rd) {
    MsgReady m;
    if (msg_ready_decode(rd, &m)) return;
    /* One branch per outcome, each reporting itself: a failure is logged only on the failure path,
     * with a reason even when the leader sent none. */
    if (!m.ok && c->reviving[instance]) {
        /* A spawned leader that failed to set up exits; its death is seen like any other. */
        LOG_ERROR("coord", "instance %d: its restart failed to start: %s", instance, m.error && m.error[0] ? m.error : "no reason given");
    } else if (!m.ok) {
        const char *why = m.error && m.error[0] ? m.error : "no reason given (see that instance's log)";
        pthread_mutex_lock(&c->mu);
        c->failed = true;
        snprintf(c->failure, sizeof c->failure, "instance %d failed to start: %s", instance, why);
        pthread_mutex_unlock(&c->mu);
        LOG_ERROR("coord", "instance %d failed to start: %s", instance, why);
    } else {
        pthread_mutex_lock(&c->mu);
        int tokens = m.n_blocks * m.block_size;
        if (c->pool_tokens == 0 || tokens < c->pool_tokens) c->pool_tokens = tokens;
        c->block_size = m.block_size;
        /* A joined leader (--join-instance) or one respawned by --restart-instances moves through the
         * coordinator's relay (relay_move); under --restart-instances every leader does. */
        c->can_move[instance] = m.kv_moves;
        c->block_bytes[instance] = m.block_bytes;
        router_instance_kv(&c->router, instance, c->can_move[instance], m.block_bytes, m.block_size);
        note_model_layers(c, instance, m.n_layers);
        if (!c->ever_ready[instance]) c->ready_instances++;
        c->ever_ready[instance] = true;
        bool replay = c->reviving[instance] && c->lora_roster.n > 0;
        pthread_mutex_unlock(&c->mu);
        /* A revived leader has its --lora adapters only: the run-time ones first, then routing. */
        if (!replay || replay_roster(c, instance, m.n_blocks) == 0) instance_up(c, instance, m.n_blocks);
    }
    msg_ready_free(&m);
}

/* The instance takes requests: READY (and, for a revived one, its run-time adapters) done. */
static void instance_up(Coordinator *c, int instance, int n_blocks) {
    pthread_mutex_lock(&c->mu);
    bool revived = c->reviving[instance];
    if (revived) c->dead_instances--, c->reviving[instance] = false, c->status[instance].reason[0] = '\0';
    int up = c->cfg.n_instances - c->dead_instances;
    c->status[instance].state = INSTANCE_UP;
    pthread_mutex_unlock(&c->mu);
    instance_health_started(&c->health, instance, braid_now_seconds());
    LOG_INFO("coord", "instance %d %s (%d KV blocks%s); %d of %d up", instance, revived ? "restarted" : "ready", n_blocks,
             revived ? (c->on_restarted ? ", empty cache: re-warming it" : ", empty cache") : "", up, c->cfg.n_instances);
    if (revived) {
        request_watchdog_instance_reset(&c->watchdog, instance);
        router_instance_up(&c->router, instance);
        metrics_instance_restarted(c->metrics, instance);
        if (c->on_restarted) c->on_restarted(c->on_restarted_ctx, instance);
    }
    announce_when_started(c);
}

static void on_tokens(Coordinator *c, WireReader *rd) {
    MsgTokens m;
    if (msg_tokens_decode(rd, &m)) return;
    double now = braid_now_seconds();
    for (int i = 0; i < m.n; i++) {
        int at = table_find(c, m.req_ids[i]);
        const TokenLogprob *lp = m.has_logprob[i] ? &m.logprobs[i] : NULL;
        if (at >= 0) c->table[at]->t_progress = now, router_prefill_done(&c->router, &c->table[at]->route_charge);
        if (at >= 0 && coord_request_push_token(c->table[at], m.tokens[i], lp, now))
            LOG_WARN("coord", "req %llu: out of memory storing a token", (unsigned long long)m.req_ids[i]);
    }
    msg_tokens_free(&m);
}

/* A request the instance served (cancelled ones too: their prefill went through the cache). The
 * trace is written in finish order with arrival times; readers sort by time. */
static void trace_finished(Coordinator *c, const CoordRequest *r, const MsgFinish *m) {
    if (!c->cfg.trace || m->reason == FINISH_ERROR) return;
    char id[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)r->id);
    TraceRecord rec = {.seq = c->trace_seq++, .t = r->t_submit - c->t_start, .id = id, .workflow = r->workflow,
                       .agent = r->agent, .tenant = r->tenant, .adapter = r->adapter, .prompt = r->prompt,
                       .prompt_tokens = r->n_prompt, .output_tokens = m->completion_tokens, .block_size = c->block_size,
                       .hidden = r->hidden, .hidden_dim = r->hidden_dim};
    if (trace_write_request(c->cfg.trace, &rec)) LOG_WARN("coord", "req %s: could not write its trace line", id);
}

/* A whole answer teaches the cost router its rates: TTFT from dispatch, tokens computed and moved in. */
static void learn_route_cost(Coordinator *c, CoordRequest *r, const MsgFinish *m) {
    bool whole = m->reason == FINISH_STOP || m->reason == FINISH_LENGTH;
    double ttft = whole && r->t_first_token > 0 ? r->t_first_token - r->route_charge.t_dispatch : 0;
    router_learn(&c->router, &r->route_charge, ttft, m->prompt_tokens - m->cached_tokens - m->reused_tokens, m->cached_tokens_remote);
    /* The borrower's own timing of the move (reads queued to landed): the pair's measured rate. */
    if (!(m->move_s > 0)) return;
    router_learn_move(&c->router, r->pull_source, r->instance, m->cached_tokens_remote, m->move_s, m->move_link);
    const RouteLinkRate *l = router_link(&c->router, r->pull_source, r->instance);
    if (!c->cfg.events || !l) return;
    fprintf(c->cfg.events, "{\"t\":%.6f,\"event\":\"move_measured\",\"req\":%llu,\"from\":%d,\"to\":%d,\"tokens\":%d,\"seconds\":%.6f,"
            "\"link\":\"%s\",\"pair_gbps\":%.4f}\n", braid_now_seconds(), (unsigned long long)r->id, r->pull_source, r->instance,
            m->cached_tokens_remote, m->move_s, move_link_name(m->move_link), l->bytes_per_s / 1e9);
    fflush(c->cfg.events);
}

static void on_finish(Coordinator *c, int instance, WireReader *rd) {
    MsgFinish m;
    if (msg_finish_decode(rd, &m)) {
        LOG_WARN("coord", "instance %d: malformed finish message (%zu bytes) dropped; the request watchdog answers its request", instance,
                 rd->len);
        return;
    }
    request_watchdog_finished(&c->watchdog, instance, braid_now_seconds());
    int at = table_find(c, m.req_id);
    if (at >= 0 && m.reason == FINISH_ERROR)
        LOG_WARN("coord", "req %llu: instance %d answered it with an error: %s", (unsigned long long)m.req_id, instance,
                 m.error && m.error[0] ? m.error : "no reason given");
    if (at >= 0) {
        trace_finished(c, c->table[at], &m);
        CoordUsage u = {.prompt_tokens = m.prompt_tokens, .cached_tokens = m.cached_tokens, .cached_tokens_host = m.cached_tokens_host,
                        .cached_tokens_remote = m.cached_tokens_remote, .reused_tokens = m.reused_tokens, .completion_tokens = m.completion_tokens, .preemptions = m.preemptions,
                        .directive_outcomes = m.directive_outcomes};
        learn_route_cost(c, c->table[at], &m);
        router_finished(&c->router, instance);
        /* Its last request gone, the instance runs nothing: publish that now, not at its next STATS,
         * and before the answer goes out, so a client scraping right after its answer sees it. */
        if (c->router.load[instance] == 0) metrics_instance_idle(c->metrics, instance);
        coord_request_finish(c->table[at], m.reason, &u, m.error);
        table_remove(c, at);
        request_done(c);
    }
    msg_finish_free(&m);
}

static void on_stats(Coordinator *c, int instance, WireReader *rd) {
    MsgStats m;
    if (msg_stats_decode(rd, &m)) return;
    /* Queue movement: prompt tokens admitted, prefill chunks computed and tokens generated: the
     * requests ahead of a waiting one advance (issue 36: at load 40+ one prefill, or one decode of
     * the requests ahead, outlasted the watchdog and their queue was answered 500). */
    request_watchdog_stats(&c->watchdog, instance,
                           m.computed_prompt_tokens + m.cached_prompt_tokens_device + m.cached_prompt_tokens_host + m.prefilled_tokens +
                               m.generated_tokens,
                           braid_now_seconds());
    InstanceStats s = {.waiting = m.waiting, .running = m.running, .pool_used_blocks = m.pool_used_blocks,
                       .pool_total_blocks = m.pool_total_blocks, .host_used_blocks = m.host_used_blocks,
                       .host_total_blocks = m.host_total_blocks, .cached_prompt_tokens_device = m.cached_prompt_tokens_device,
                       .cached_prompt_tokens_host = m.cached_prompt_tokens_host, .computed_prompt_tokens = m.computed_prompt_tokens,
                       .demoted_blocks = m.demoted_blocks, .loaded_blocks = m.loaded_blocks,
                       .host_evicted_blocks = m.host_evicted_blocks, .device_evicted_blocks = m.device_evicted_blocks,
                       .preemptions = m.preemptions, .generated_tokens = m.generated_tokens,
                       .prefetched_blocks = m.prefetched_blocks, .prefetch_hit_blocks = m.prefetch_hit_blocks,
                       .prefetch_wasted_blocks = m.prefetch_wasted_blocks, .segment_reused_tokens = m.segment_reused_tokens,
                       .segment_candidates = m.segment_candidates, .segments_exact = m.segments_exact,
                       .segments_approx = m.segments_approx, .segments_rejected_context = m.segments_rejected_context,
                       .segments_rejected_window = m.segments_rejected_window, .segment_flops_saved = m.segment_flops_saved,
                       .directive_requests = m.directive_requests, .pins = m.pins, .pin_expired_blocks = m.pin_expired_blocks,
                       .pin_revoked_blocks = m.pin_revoked_blocks, .spliced_tokens = m.spliced_tokens,
                       .shared_hit_tokens = m.shared_hit_tokens, .directive_evicted_blocks = m.directive_evicted_blocks,
                       .pinned_blocks = m.pinned_blocks, .residual_used_blocks = m.residual_used_blocks,
                       .residual_total_blocks = m.residual_total_blocks, .residual_hit_tokens = m.residual_hit_tokens,
                       .fork_tokens = m.fork_tokens, .partial_hit_tokens = m.partial_hit_tokens,
                       .residual_evicted_blocks = m.residual_evicted_blocks, .moved_in_blocks = m.moved_in_blocks,
                       .moved_in_bytes = m.moved_in_bytes, .move_failures = m.move_failures, .move_declines = m.move_declines, .move_followers = m.move_followers, .lent_blocks = m.lent_blocks,
                       .segment_lsh_candidates = m.segment_lsh_candidates, .segment_lsh_admitted = m.segment_lsh_admitted,
                       .segment_lsh_reused_tokens = m.segment_lsh_reused_tokens,
                       .segment_probes_ok = m.segment_probes_ok, .segment_probes_rejected = m.segment_probes_rejected};
    metrics_set_instance(c->metrics, instance, &s);
    router_instance_capacity(&c->router, instance, (long)m.pool_total_blocks + m.host_total_blocks); /* what its index can hold */
}

/* One KV event as a JSONL line, in the shape and with the field names of the scheduler's own
 * --events lines (vLLM's KV events), plus the instance. */
static void log_kv_event(Coordinator *c, int instance, const MsgKvEvent *e, double now) {
    FILE *f = c->cfg.events;
    fprintf(f, "{\"t\":%.6f,\"event\":\"kv\",\"instance\":%d,\"type\":\"%s\",\"reason\":\"%s\"", now, instance,
            kv_event_type_name(e->kind), kv_reason_name(e->reason));
    if (e->kind != KV_EVENT_CLEARED) {
        fprintf(f, ",\"medium\":\"%s\",\"blocks\":%d,\"block_hashes\":[", e->tier == KV_TIER_HOST ? "host" : "device", e->n_blocks);
        for (int i = 0; i < e->n_blocks; i++) fprintf(f, "%s\"%016llx\"", i ? "," : "", (unsigned long long)e->hashes[i]);
        fprintf(f, "],\"parent_block_hash\":\"%016llx\",\"tenant\":", (unsigned long long)e->parent_hash);
        json_text_string(f, e->tenant);
        fputs(",\"adapter\":", f);
        json_text_string(f, e->adapter);
        fprintf(f, ",\"on_device\":%s,\"on_host\":%s", e->tiers_after & KV_ON_DEVICE ? "true" : "false",
                e->tiers_after & KV_ON_HOST ? "true" : "false");
    }
    fputs("}\n", f);
}

/* The router's index holds what an instance has in any tier: blocks inserted are stored there,
 * blocks gone from every tier (or a cleared cache) leave it; demotions and load-backs move a block
 * between tiers of the same instance and change nothing. Every event goes to --events. */
static void on_kv_events(Coordinator *c, int instance, WireReader *rd) {
    MsgKvEvents m;
    if (msg_kv_events_decode(rd, &m)) {
        LOG_WARN("coord", "instance %d: malformed KV events message (%zu bytes) dropped", instance, rd->len);
        return;
    }
    double now = braid_now_seconds();
    for (int i = 0; i < m.n; i++) {
        const MsgKvEvent *e = &m.events[i];
        if (e->kind == KV_EVENT_STORED && e->reason == KV_REASON_INSERT) router_stored(&c->router, instance, e->hashes, e->n_blocks);
        else if (e->kind == KV_EVENT_REMOVED && e->tiers_after == 0) router_evicted(&c->router, instance, e->hashes, e->n_blocks);
        else if (e->kind == KV_EVENT_CLEARED) router_cleared(&c->router, instance);
        if (c->cfg.events) log_kv_event(c, instance, e, now);
    }
    if (c->cfg.events && m.n) fflush(c->cfg.events);
    if (c->cfg.kv_publisher) kv_event_publisher_publish(c->cfg.kv_publisher, instance, m.events, m.n);
    RegistryMetrics reg;
    router_registry_size(&c->router, &reg.blocks, &reg.bytes, &reg.evicted);
    metrics_set_registry(c->metrics, &reg);
    msg_kv_events_free(&m);
}

/* A spawned leader names its process (MSG_REJOIN): watched from now on when it is on this host. */
static void on_rejoin(Coordinator *c, int instance, WireReader *rd) {
    uint64_t pid = wire_get_u64(rd), start_ticks = wire_get_u64(rd);
    char *host = wire_get_str(rd), here[256] = "";
    gethostname(here, sizeof here - 1);
    if (!rd->failed && host && strcmp(host, here) == 0) instance_health_respawned_process(&c->health, instance, (pid_t)pid, start_ticks);
    else LOG_WARN("coord", "instance %d: its new leader runs on %s, not here: only its silence can show its death", instance, host ? host : "?");
    LOG_INFO("coord", "instance %d: new leader pid %llu joined", instance, (unsigned long long)pid);
    free(host);
}

/* KV_RELAY (move_msg.h): a move message between two leaders that do not share a communicator (one
 * is a joined or respawned instance; under --restart-instances every move message), forwarded unchanged. One toward a dead or unknown leader is dropped: the
 * importer's --move-timeout ends its wait and it recomputes. */
static void relay_move(Coordinator *c, int instance, const uint8_t *data, size_t len) {
    MsgKvRelay m;
    int to = -1;
    if (move_msg_relay_decode(data, len, &m) || m.from_rank != leader_rank(c, instance) || (to = instance_of_rank(c, m.to_rank)) < 0) {
        LOG_WARN("coord", "malformed kv_relay from instance %d dropped", instance);
        return;
    }
    if (instance_health_is_dead(&c->health, to)) {
        LOG_DEBUG("coord", "kv_relay from instance %d to dead instance %d dropped", instance, to);
        return;
    }
    WireBuf b = {0};
    wire_put(&b, data, len);
    BraidError err;
    if (send_to_instance(c, to, MSG_KV_RELAY, &b, &err)) LOG_WARN("coord", "kv_relay from instance %d to instance %d: %s", instance, to, err.msg);
}

static void handle_instance_message(Coordinator *c, int instance, int type, const uint8_t *data, size_t len) {
    if (instance_health_is_dead(&c->health, instance)) {
        LOG_DEBUG("coord", "%s message from dead instance %d ignored", msg_type_name(type), instance);
        return;
    }
    instance_health_heard(&c->health, instance, braid_now_seconds());
    WireReader rd = wire_reader(data, len);
    switch (type) {
    case MSG_READY: on_ready(c, instance, &rd); break;
    case MSG_TOKENS: on_tokens(c, &rd); break;
    case MSG_FINISH: on_finish(c, instance, &rd); break;
    case MSG_STATS: on_stats(c, instance, &rd); break;
    case MSG_KV_EVENTS: on_kv_events(c, instance, &rd); break;
    case MSG_HIDDEN: on_hidden(c, &rd); break;
    case MSG_REJOIN: on_rejoin(c, instance, &rd); break;
    case MSG_LORA_RESULT: on_lora_result(c, instance, &rd); break;
    case MSG_KV_RELAY: relay_move(c, instance, data, len); break;
    default: LOG_WARN("coord", "unexpected %s message from instance %d ignored", msg_type_name(type), instance);
    }
}

static void handle_world_message(Coordinator *c, int source, int type, const uint8_t *data, size_t len) {
    int instance = instance_of_rank(c, source);
    if (instance < 0) {
        LOG_WARN("coord", "%s message from rank %d, which leads no instance, ignored", msg_type_name(type), source);
        return;
    }
    if (c->restarts_on && c->restarts.joined[instance]) return; /* from its dead first leader, still in flight */
    handle_instance_message(c, instance, type, data, len);
}

/* Every waiting message of one endpoint; instance -1: the world's (the instance by its rank). */
static int poll_endpoint(Coordinator *c, CtrlEndpoint *ep, int instance, BraidError *err) {
    int source, type, got, n = 0;
    uint8_t *data;
    size_t len;
    while ((got = ctrl_poll(ep, &source, &type, &data, &len, err)) == 1) {
        if (instance < 0) handle_world_message(c, source, type, data, len);
        else handle_instance_message(c, instance, type, data, len);
        free(data);
        n++;
    }
    return got < 0 ? -1 : n;
}

static int poll_messages(Coordinator *c, BraidError *err) {
    int n = poll_endpoint(c, &c->ctrl, -1, err);
    for (int i = 0; n >= 0 && c->restarts_on && i < c->cfg.n_instances; i++) {
        if (!c->restarts.joined[i] || instance_health_is_dead(&c->health, i)) continue;
        int got = poll_endpoint(c, &c->restarts.ep[i], i, err);
        n = got < 0 ? -1 : n + got;
    }
    return n;
}

/* ---- MPI thread: instances that die ---- */

/* A request whose client has seen nothing of its answer yet (no token relayed, or an answer that
 * goes out whole; no cancel sent) can start over elsewhere; the client only sees a longer wait. */
static bool can_start_over(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    bool fresh = (r->n_tokens == 0 || r->restartable) && !r->finished;
    pthread_mutex_unlock(&r->mu);
    return fresh && !r->cancel_requested;
}

/* Sends the request to a live instance again; 1 when none is left, -1 on an MPI error. */
static int route_again(Coordinator *c, CoordRequest *r, int from, BraidError *err) {
    RouteDecision d = router_pick_prompt(&c->router, r->block_hashes, r->n_hashes, r->n_prompt, r->workflow_key);
    cache_key_affinity_route(&c->cache_keys, &c->router, r->cache_key, r->block_hashes, r->n_hashes, &d);
    if (d.instance < 0) return 1;
    coord_request_restart(r);
    r->instance = d.instance;
    r->t_progress = braid_now_seconds();
    r->route_charge = router_charge(&c->router, &d, r->n_prompt, r->t_progress);
    router_assigned(&c->router, d.instance, r->workflow_key);
    cache_key_affinity_assigned(&c->cache_keys, r->cache_key, d.instance);
    log_route(c, r, d);
    plan_move(c, r, &d);
    LOG_INFO("coord", "req %llu: instance %d died before any of its answer went out; routed again to instance %d", (unsigned long long)r->id,
             from, d.instance);
    return send_submit(c, r, err);
}

/* The dead instance's requests: started over elsewhere when nothing was streamed, else answered 503. */
static int settle_requests_of(Coordinator *c, int instance, BraidError *err) {
    char why[256];
    snprintf(why, sizeof why, "instance %d failed (%s)", instance, instance_health_reason(&c->health, instance));
    int moved = 0, failed = 0;
    for (int at = 0; at < c->n_table;) {
        CoordRequest *r = c->table[at];
        if (r->instance != instance) {
            at++;
            continue;
        }
        int rc = can_start_over(r) ? route_again(c, r, instance, err) : 1;
        if (rc < 0) return -1;
        if (rc == 0) {
            moved++, at++;
            continue;
        }
        fail_request_status(c, r, 503, why);
        table_remove(c, at);
        failed++;
    }
    if (moved || failed)
        LOG_WARN("coord", "instance %d: %d request%s routed again, %d answered with an error", instance, moved, moved == 1 ? "" : "s",
                 failed);
    return 0;
}

/* With --restart-instances, the dead instance's next spawn is scheduled (after its backoff). */
static void schedule_restart(Coordinator *c, int instance) {
    double delay;
    /* A joined instance's node may be gone: it comes back by joining again, not by a spawn here. */
    if (!c->restarts_on || c->cfg.max_restarts <= 0 || (c->cfg.join_service && instance >= c->cfg.join_first)) return;
    if (instance_restarts_schedule(&c->restarts, instance, braid_now_seconds(), &delay))
        LOG_WARN("coord", "instance %d: restarting it in %.0f s (restart %d of %d)", instance, delay, c->restarts.restarts[instance] + 1,
                 c->restarts.max_restarts);
    else
        LOG_ERROR("coord", "instance %d: not restarted again: it used its %d restarts (--restart-instances)", instance, c->restarts.max_restarts);
}

/* The instance is a failure domain: it leaves routing, the block index, /health and /metrics say
 * so, and whatever is left of it on this host is killed (a TP peer of a dead rank would otherwise
 * wait in a collective forever). */
static int instance_lost(Coordinator *c, int instance, BraidError *err) {
    const char *why = instance_health_reason(&c->health, instance);
    c->lost_ranks = true;
    pthread_mutex_lock(&c->mu);
    if (!c->reviving[instance]) c->dead_instances++; /* a restart that died before READY was still counted */
    c->reviving[instance] = false;
    c->status[instance].state = INSTANCE_DEAD;
    if (c->replay_pending) c->replay_pending[instance] = 0; /* its answers will not come */
    snprintf(c->status[instance].reason, sizeof c->status[instance].reason, "%s", why);
    int alive = c->cfg.n_instances - c->dead_instances;
    pthread_mutex_unlock(&c->mu);
    LOG_ERROR("coord", "instance %d died: %s; %d of %d instances left", instance, why, alive, c->cfg.n_instances);
    if (c->cfg.events) {
        fprintf(c->cfg.events, "{\"t\":%.6f,\"event\":\"instance_down\",\"instance\":%d,\"reason\":", braid_now_seconds(), instance);
        json_text_string(c->cfg.events, why);
        fputs("}\n", c->cfg.events);
        fflush(c->cfg.events);
    }
    int fenced = instance_health_fence(&c->health, instance);
    if (fenced) LOG_WARN("coord", "instance %d: killed its %d remaining rank%s on this host", instance, fenced, fenced == 1 ? "" : "s");
    int dest;
    CtrlEndpoint *ep = leader_endpoint(c, instance, &dest);
    ctrl_forget_dest(ep, dest); /* only leaders get messages */
    router_instance_down(&c->router, instance);
    metrics_instance_down(c->metrics, instance);
    announce_when_started(c);
    schedule_restart(c, instance);
    return settle_requests_of(c, instance, err);
}

/* A restart that is due: its new leader is spawned, and the instance is starting again (still
 * counted dead, out of routing, until its READY). A spawn that fails leaves it dead. */
static void restart_due_instance(Coordinator *c) {
    int i = c->restarts_on && !c->draining ? instance_restarts_due(&c->restarts, braid_now_seconds()) : -1;
    if (i < 0) return;
    BraidError err = {{0}};
    if (instance_restarts_spawn(&c->restarts, i, &err) ||
        (instance_health_revive(&c->health, i, braid_now_seconds()) && braid_error_set(&err, "out of memory watching it"))) {
        LOG_ERROR("coord", "instance %d: restart failed: %s; it stays dead", i, err.msg);
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->reviving[i] = true;
    c->status[i].state = INSTANCE_STARTING;
    c->status[i].restarts = c->restarts.restarts[i];
    pthread_mutex_unlock(&c->mu);
    LOG_WARN("coord", "instance %d: new leader spawned (restart %d of %d); loading", i, c->restarts.restarts[i], c->restarts.max_restarts);
}

/* A leader that connected from its own MPI job (--join-slots) takes its join slot if that slot is
 * dead (never filled, or its node lost) and starts like a respawned leader; otherwise it is refused. */
static void adopt_joiner(Coordinator *c) {
    int i;
    MPI_Comm inter;
    if (!c->joins || !join_acceptor_take(c->joins, &i, &inter)) return;
    const char *refusal = c->draining                                                     ? "the server is draining"
                          : i < c->cfg.join_first || i >= c->cfg.n_instances              ? "not a join slot (--join-slots)"
                          : !instance_health_is_dead(&c->health, i) || c->reviving[i] ? "that instance is up or starting"
                          : instance_health_revive(&c->health, i, braid_now_seconds())    ? "out of memory watching it"
                                                                                           : NULL;
    BraidError err = {{0}};
    if (join_verdict(inter, refusal == NULL, &err)) LOG_WARN("coord", "instance %d: %s", i, err.msg);
    if (refusal) {
        LOG_WARN("coord", "a leader asked to join as instance %d: refused (%s)", i, refusal);
        return;
    }
    instance_restarts_adopt(&c->restarts, i, inter, c->ever_ready[i]);
    pthread_mutex_lock(&c->mu);
    c->reviving[i] = true;
    c->status[i].state = INSTANCE_STARTING;
    c->status[i].restarts = c->restarts.restarts[i];
    pthread_mutex_unlock(&c->mu);
    LOG_WARN("coord", "instance %d: a leader joined from its own MPI job; loading", i);
}

/* ---- MPI thread: the request watchdog ---- */

/* A routed request on a live instance with no token and no queue movement past the watchdog: its
 * instance lost it (or holds it stuck). It is answered 500 so the client, the in-flight gauge and a
 * drain are not left waiting; the instance is told to cancel it in case it still holds it (its
 * late FINISH then finds no request and is dropped). */
static int check_watchdog(Coordinator *c, BraidError *err) {
    double now = braid_now_seconds();
    if (!request_watchdog_due(&c->watchdog, now)) return 0;
    for (int at = 0; at < c->n_table;) {
        CoordRequest *r = c->table[at];
        if (instance_health_is_dead(&c->health, r->instance) || !request_watchdog_expired(&c->watchdog, r->instance, r->t_progress, now)) {
            at++;
            continue;
        }
        double idle = request_watchdog_idle_s(&c->watchdog, r->instance, r->t_progress, now);
        LOG_ERROR("coord", "req %llu: no token and no queue movement on instance %d for %.1f s (--request-watchdog-s %.0f); answered 500",
                  (unsigned long long)r->id, r->instance, idle, c->cfg.request_watchdog_s);
        char why[200];
        snprintf(why, sizeof why, "request %llu made no progress for %.0f s on instance %d (request watchdog); it was cancelled",
                 (unsigned long long)r->id, idle, r->instance);
        WireBuf b = {0};
        wire_put_u64(&b, r->id);
        int instance = r->instance;
        if (send_to_instance(c, instance, MSG_CANCEL, &b, err)) return -1;
        router_prefill_done(&c->router, &r->route_charge);
        router_finished(&c->router, instance);
        if (c->router.load[instance] == 0) metrics_instance_idle(c->metrics, instance);
        pthread_mutex_lock(&c->mu);
        c->watchdog_failed++;
        c->watchdog_last_id = r->id;
        pthread_mutex_unlock(&c->mu);
        metrics_count_watchdog(c->metrics);
        fail_request(c, r, why);
        table_remove(c, at);
    }
    return 0;
}

/* Leaders in MPI jobs of their own (joined or spawned) cannot see this job end: every second they
 * are told it is alive, and a joined leader that hears nothing for --coordinator-timeout exits. */
static void send_alive(Coordinator *c) {
    double now = braid_now_seconds();
    if (!c->restarts_on || now - c->last_alive_sent < 1.0) return;
    c->last_alive_sent = now;
    for (int i = 0; i < c->cfg.n_instances; i++) {
        if (!c->restarts.joined[i] || instance_health_is_dead(&c->health, i)) continue;
        WireBuf b = {0};
        BraidError err;
        if (send_to_instance(c, i, MSG_COORD_ALIVE, &b, &err)) LOG_DEBUG("coord", "instance %d: alive message: %s", i, err.msg);
    }
}

static int check_instances(Coordinator *c, BraidError *err) {
    int dead;
    while ((dead = instance_health_next_dead(&c->health, braid_now_seconds())) >= 0)
        if (instance_lost(c, dead, err)) return -1;
    restart_due_instance(c);
    adopt_joiner(c);
    send_alive(c);
    return 0;
}

/* The MPI loop failed: nothing more will come from the instances, so every request still open,
 * routed or queued, is answered now (503) rather than left waiting. */
static void fail_everything(Coordinator *c, const char *why) {
    char text[600];
    snprintf(text, sizeof text, "the coordinator failed: %s", why);
    while (c->n_table > 0) {
        fail_request_status(c, c->table[c->n_table - 1], 503, text);
        table_remove(c, c->n_table - 1);
    }
    pthread_mutex_lock(&c->mu);
    CoordCommand *cmds = c->queue;
    int n = c->n_queue;
    c->queue = NULL;
    c->n_queue = c->cap_queue = 0;
    c->failed = true; /* new requests get 503 from here on */
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) {
        if (cmds[i].kind == CMD_SUBMIT) fail_request_status(c, cmds[i].req, 503, text), coord_request_release(cmds[i].req);
        free(cmds[i].workflow);
        free(cmds[i].tenant);
    }
    free(cmds);
}

/* ---- the stop signals ---- */

typedef struct {
    Coordinator *c;
    const sigset_t *signals;
    bool exiting; /* under c->mu: coordinator_run is returning; the next signal ends the thread */
} SignalWatch;

/* Waits for SIGINT / SIGTERM and starts the drain the moment one arrives: "draining" at once (new
 * requests get 503), then the on_drain hook (the HTTP server stops accepting). Later signals are
 * logged only; the launcher turns a second one into an abort. */
static void *signal_watch_main(void *arg) {
    SignalWatch *w = arg;
    Coordinator *c = w->c;
    for (;;) {
        int sig = 0;
        if (sigwait(w->signals, &sig)) continue;
        pthread_mutex_lock(&c->mu);
        bool exiting = w->exiting, first = !c->draining;
        if (!exiting) c->draining = true;
        pthread_cond_signal(&c->wake);
        pthread_mutex_unlock(&c->mu);
        if (exiting) return NULL;
        if (!first) {
            LOG_INFO("coord", "signal %d: already draining", sig);
            continue;
        }
        LOG_INFO("coord", "signal %d: draining (new requests get 503, no new connections), then shutting down", sig);
        if (c->on_drain) c->on_drain(c->on_drain_ctx);
    }
}

/* ---- MPI thread: the loop ---- */

static bool stop_requested(const sigset_t *signals) {
    struct timespec zero = {0, 0};
    int sig = sigtimedwait(signals, NULL, &zero);
    if (sig <= 0) return false;
    LOG_INFO("coord", "signal %d: draining (new requests get 503), then shutting down", sig);
    return true;
}

/* True once draining and nothing is left in flight. */
static bool drained(Coordinator *c) {
    pthread_mutex_lock(&c->mu);
    bool done = (c->draining || c->failed) && c->inflight == 0 && c->n_queue == 0;
    pthread_mutex_unlock(&c->mu);
    return done;
}

bool coordinator_lost_ranks(const Coordinator *c) { return c->lost_ranks || instance_health_alive_count(&c->health) < c->cfg.n_instances; }

/* SHUTDOWN to every live leader, saying whether the job lost ranks. Sends to dead leaders were
 * given up when they died (instance_lost), so the flush cannot hang on them. */
static void shutdown_instances(Coordinator *c, BraidError *err) {
    bool lost_ranks = coordinator_lost_ranks(c);
    for (int i = 0; i < c->cfg.n_instances; i++) {
        if (instance_health_is_dead(&c->health, i)) continue;
        WireBuf b = {0};
        wire_put_u8(&b, lost_ranks ? 1 : 0);
        send_to_instance(c, i, MSG_SHUTDOWN, &b, err);
    }
    ctrl_flush(&c->ctrl, err);
    for (int i = 0; c->restarts_on && i < c->cfg.n_instances; i++)
        if (c->restarts.joined[i] && !instance_health_is_dead(&c->health, i)) ctrl_flush(&c->restarts.ep[i], err);
}

/* Waits for an HTTP thread's command or the end of a nap, whichever comes first. Instances' messages
 * cannot wake a condition variable, so they are polled while requests are in flight, every
 * POLL_NAP_MIN_NS after a message, the nap doubling while none comes, up to POLL_NAP_MAX_NS: tokens
 * come once per engine step (milliseconds to a hundred apart), so a fixed fine poll mostly wakes
 * for nothing, and on a machine whose cores the workers' threads fill, each wake takes a core from
 * them (measured with 8 streams: 0.5 ms polls cost the coordinator 6% of a core). A token is then
 * forwarded at most POLL_NAP_MAX_NS late; nothing waits on it. With nothing in flight it naps 20 ms
 * (a new request wakes the loop at once). */
#define POLL_NAP_MIN_NS 250000L
#define POLL_NAP_MAX_NS 2000000L
static void nap(Coordinator *c) {
    pthread_mutex_lock(&c->mu);
    if (c->n_queue == 0) {
        long nap_ns = 20000000L;
        if (c->inflight > 0) {
            nap_ns = c->poll_nap_ns < POLL_NAP_MIN_NS ? POLL_NAP_MIN_NS : c->poll_nap_ns;
            c->poll_nap_ns = nap_ns * 2 < POLL_NAP_MAX_NS ? nap_ns * 2 : POLL_NAP_MAX_NS;
        }
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += nap_ns;
        if (deadline.tv_nsec >= 1000000000) deadline.tv_sec++, deadline.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&c->wake, &c->mu, &deadline);
    }
    pthread_mutex_unlock(&c->mu);
}

int coordinator_run(Coordinator *c, const sigset_t *stop_signals, BraidError *err) {
    int rc = 0;
    SignalWatch watch = {.c = c, .signals = stop_signals};
    pthread_t watcher;
    bool watching = pthread_create(&watcher, NULL, signal_watch_main, &watch) == 0;
    if (!watching) LOG_WARN("coord", "cannot start the signal thread; stop signals are polled by the MPI loop");
    while (rc == 0 && !drained(c)) {
        if (!watching && stop_requested(stop_signals)) {
            pthread_mutex_lock(&c->mu);
            c->draining = true;
            pthread_mutex_unlock(&c->mu);
        }
        int worked = drain_commands(c, err);
        int got = worked < 0 ? -1 : poll_messages(c, err);
        announce_when_started(c); /* also after a warm start, which ends on another thread */
        if (worked < 0 || got < 0 || check_instances(c, err) || check_watchdog(c, err) || expire_workflows(c, err) ||
            ctrl_progress(&c->ctrl, err)) {
            rc = -1;
            break;
        }
        if (got > 0 || worked > 0) c->poll_nap_ns = POLL_NAP_MIN_NS; /* the MPI thread's own field: no lock */
        if (worked == 0 && got == 0) nap(c);
    }
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    if (failed && rc == 0) rc = braid_error_set(err, "%s", c->failure);
    pthread_mutex_unlock(&c->mu);
    if (rc) fail_everything(c, err->msg);
    if (watching) {
        pthread_mutex_lock(&c->mu);
        watch.exiting = true;
        pthread_mutex_unlock(&c->mu);
        /* Blocked in every thread: it stays pending for the watcher's sigwait. */
        pthread_kill(watcher, sigismember(stop_signals, SIGTERM) == 1 ? SIGTERM : SIGINT);
        pthread_join(watcher, NULL);
    }
    BraidError shutdown_err;
    shutdown_instances(c, &shutdown_err);
    return rc;
}
