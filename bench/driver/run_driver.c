/* Workflows against a live server, C at a time; the contract is in run_driver.h. */
#include "run_driver.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/timeutil.h"
#include "http_client.h"
#include "progress.h"
#include "sleep_util.h"
#include "text_copy.h"

#define PROGRESS_TICK_S 0.25

/* State shared by the slot threads and the calling thread; everything below mu is guarded by it. */
typedef struct {
    const RunDriverConfig *cfg;
    double t_start;
    pthread_mutex_t mu;
    pthread_cond_t changed;      /* a workflow finished, a slot exited, or the workflow-end probe settled */
    Workload *workload;
    bool ends_probing;           /* one workflow end is in flight while the server's support is unknown */
    bool ends_known_supported;   /* a workflow end has been accepted: no more need to probe one at a time */
    int next_workflow, n_workflows, active_slots, next_seq;
    bool failed;
    BraidError fail_err;
    RunOutcome *out;
} Shared;

/* One active-workflow slot: its thread and one connection per call of the widest stage so far. */
typedef struct {
    Shared *sh;
    pthread_t thread;
    HttpClient *clients[WORKLOAD_MAX_FANOUT];
} Slot;

/* One agent call of a stage, run on its own thread. */
typedef struct {
    Shared *sh;
    HttpClient *client;      /* NULL when it could not be created: the call fails */
    AgentCall call;          /* call.prompt is an owned copy */
    char *output;            /* the generated text, owned; "" after a failure */
    bool failed;
} CallTask;

/* ---- bookkeeping under the lock ---- */

/* The first problem of each kind is kept to show the user; the rest are counted. */
static void note_problem(Shared *sh, int *counter, const char *message) {
    pthread_mutex_lock(&sh->mu);
    (*counter)++;
    if (!sh->out->first_note[0]) text_copy(sh->out->first_note, sizeof sh->out->first_note, message);
    pthread_mutex_unlock(&sh->mu);
}

static void fail_run(Shared *sh, const BraidError *err) {
    pthread_mutex_lock(&sh->mu);
    if (!sh->failed) sh->fail_err = *err;
    sh->failed = true;
    pthread_mutex_unlock(&sh->mu);
}

static int claim_workflow(Shared *sh) {
    pthread_mutex_lock(&sh->mu);
    int i = !sh->failed && sh->next_workflow < sh->n_workflows ? sh->next_workflow++ : -1;
    pthread_mutex_unlock(&sh->mu);
    return i;
}

static int take_seq(Shared *sh) {
    pthread_mutex_lock(&sh->mu);
    int seq = sh->next_seq++;
    pthread_mutex_unlock(&sh->mu);
    return seq;
}

static double since_start(const Shared *sh, double t) { return t - sh->t_start; }

/* ---- one call ---- */

/* A call's body; fixed_output asks for exactly the call's expected output length (ignore_eos). */
static json_t *completion_body(const AgentCall *c, int max_tokens_cap, bool fixed_output) {
    int max_tokens = c->max_tokens;
    if (fixed_output && c->expected_output_tokens > 0 && c->expected_output_tokens < max_tokens) max_tokens = c->expected_output_tokens;
    if (max_tokens_cap > 0 && max_tokens > max_tokens_cap) max_tokens = max_tokens_cap;
    json_t *body = json_pack("{s:s, s:i, s:f}", "prompt", c->prompt, "max_tokens", max_tokens, "temperature", 0.0);
    if (body && fixed_output && json_object_set_new(body, "ignore_eos", json_true())) {
        json_decref(body);
        return NULL;
    }
    const char *keys[] = {"workflow_id", "agent", "tenant", "adapter"}, *values[] = {c->workflow, c->agent, c->tenant, c->adapter};
    for (int i = 0; body && i < 4; i++)
        if (values[i][0] && json_object_set_new(body, keys[i], json_string(values[i]))) {
            json_decref(body);
            return NULL;
        }
    return body;
}

/* Writes the request's trace line and checks its token count against the server's usage. */
static void trace_request(Shared *sh, const CallTask *t, const HttpResult *res, int seq) {
    char id[32];
    snprintf(id, sizeof id, "r%d", seq);
    PromptTraceRequest req = {.seq = seq, .t = since_start(sh, res->t_send), .id = id, .workflow = t->call.workflow,
                              .agent = t->call.agent, .tenant = t->call.tenant, .adapter = t->call.adapter,
                              .prompt = t->call.prompt, .output_tokens = res->completion_tokens};
    int traced_tokens = 0;
    BraidError err;
    if (prompt_trace_request(sh->cfg->trace, &req, &traced_tokens, &err)) {
        note_problem(sh, &sh->out->trace_errors, err.msg);
    } else if (traced_tokens != res->prompt_tokens) {
        char detail[160];
        snprintf(detail, sizeof detail, "request %s: the trace tokenized %d prompt tokens, the server counted %d", id, traced_tokens,
                 res->prompt_tokens);
        note_problem(sh, &sh->out->token_mismatches, detail);
    }
}

static RequestRecord request_record(const Shared *sh, const CallTask *t, const HttpResult *res) {
    RequestRecord r = {.t_send_s = since_start(sh, res->t_send), .latency_ms = (res->t_end - res->t_send) * 1e3,
                       .status = res->status, .retries = res->retries};
    snprintf(r.workflow, sizeof r.workflow, "%s", t->call.workflow);
    snprintf(r.agent, sizeof r.agent, "%s", t->call.agent);
    text_copy(r.error, sizeof r.error, res->error);
    r.prompt_tokens = res->prompt_tokens > 0 ? res->prompt_tokens : 0;
    r.cached_tokens = res->cached_tokens > 0 ? res->cached_tokens : 0;
    r.completion_tokens = res->completion_tokens > 0 ? res->completion_tokens : 0;
    r.has_ttft = !res->error[0] && res->t_first_text > 0;
    r.ttft_ms = r.has_ttft ? (res->t_first_text - res->t_send) * 1e3 : 0;
    r.connection_retries = res->connection_retries;
    if (bench_sample_from_result(res, &r.timing)) r.timing.n_itls = 0; /* out of memory: no ITL samples */
    return r;
}

static void record_request(Shared *sh, const CallTask *t, const HttpResult *res) {
    RequestRecord rec = request_record(sh, t, res);
    pthread_mutex_lock(&sh->mu);
    int rc = run_records_add_request(&sh->out->records, &rec);
    pthread_mutex_unlock(&sh->mu);
    if (rc) {
        BraidError err;
        braid_error_set(&err, "out of memory recording a request of workflow %s", t->call.workflow);
        fail_run(sh, &err);
    }
}

static void *call_thread(void *arg) {
    CallTask *t = arg;
    Shared *sh = t->sh;
    sleep_seconds(t->call.delay_s);
    HttpResult res = {0};
    json_t *body = t->client ? completion_body(&t->call, sh->cfg->max_tokens_cap, sh->cfg->fixed_output) : NULL;
    int seq = take_seq(sh);
    if (body) {
        t->failed = http_client_complete(t->client, "/v1/completions", body, &res) != 0;
    } else {
        res = (HttpResult){.prompt_tokens = -1, .completion_tokens = -1, .cached_tokens = -1};
        res.t_send = res.t_end = braid_now_seconds();
        snprintf(res.error, sizeof res.error, "%s", t->client ? "out of memory building the request" : "no HTTP client");
        t->failed = true;
    }
    json_decref(body);
    if (!t->failed && sh->cfg->trace) trace_request(sh, t, &res, seq);
    record_request(sh, t, &res);
    t->output = res.text ? res.text : strdup("");
    res.text = NULL;
    http_result_free(&res);
    return NULL;
}

/* ---- one stage ---- */

/* The next stage's calls, copied out of the workload (its prompts live only until its next call).
 * Returns how many, 0 when the workflow has ended, -1 when the workload failed. */
static int next_stage(Shared *sh, int wf, CallTask *tasks) {
    AgentCall calls[WORKLOAD_MAX_FANOUT];
    BraidError err;
    pthread_mutex_lock(&sh->mu);
    int n = workload_next_stage(sh->workload, wf, calls, WORKLOAD_MAX_FANOUT, &err);
    for (int j = 0; j < n; j++) {
        tasks[j] = (CallTask){.sh = sh, .call = calls[j]};
        tasks[j].call.prompt = strdup(calls[j].prompt ? calls[j].prompt : "");
        if (!tasks[j].call.prompt) n = braid_error_set(&err, "out of memory copying a prompt of workflow %s", calls[j].workflow);
    }
    pthread_mutex_unlock(&sh->mu);
    if (n < 0) {
        braid_error_wrap(&err, "workflow %d", wf);
        fail_run(sh, &err);
    }
    return n;
}

static int deliver(Shared *sh, int wf, CallTask *tasks, int n) {
    const char *outputs[WORKLOAD_MAX_FANOUT];
    for (int j = 0; j < n; j++) outputs[j] = tasks[j].output ? tasks[j].output : "";
    BraidError err;
    pthread_mutex_lock(&sh->mu);
    int rc = workload_deliver(sh->workload, wf, outputs, n, &err);
    pthread_mutex_unlock(&sh->mu);
    if (rc) {
        braid_error_wrap(&err, "workflow %d", wf);
        fail_run(sh, &err);
    }
    return rc;
}

static HttpClient *slot_client(Slot *slot, int j) {
    if (!slot->clients[j]) {
        BraidError err;
        slot->clients[j] = http_client_create(slot->sh->cfg->url, slot->sh->cfg->max_retries, &err);
    }
    return slot->clients[j];
}

/* Runs the stage's calls concurrently (the first on this thread) and waits for all of them. */
static void run_stage(Slot *slot, CallTask *tasks, int n) {
    pthread_t threads[WORKLOAD_MAX_FANOUT];
    bool spawned[WORKLOAD_MAX_FANOUT] = {false};
    for (int j = 0; j < n; j++) tasks[j].client = slot_client(slot, j);
    for (int j = 1; j < n; j++) spawned[j] = pthread_create(&threads[j], NULL, call_thread, &tasks[j]) == 0;
    call_thread(&tasks[0]);
    for (int j = 1; j < n; j++) {
        if (spawned[j]) pthread_join(threads[j], NULL);
        else call_thread(&tasks[j]); /* no thread to be had: run it here, late rather than never */
    }
}

static void free_tasks(CallTask *tasks, int n) {
    for (int j = 0; j < n; j++) {
        free((char *)tasks[j].call.prompt);
        free(tasks[j].output);
    }
}

/* ---- one workflow ---- */

/* Whether to announce this workflow's end: until a server answers 404 or 405, which says it has no such
 * endpoint (workflow ends are Braid's extension, optional for any other server). Until one end has
 * been answered, ends go one at a time, so that a server without the endpoint gets exactly one POST
 * however many workflows finish together; a caller that gets true must call settle_workflow_end. */
static bool claim_workflow_end(Shared *sh) {
    pthread_mutex_lock(&sh->mu);
    while (sh->ends_probing && !sh->out->workflow_end_unsupported) pthread_cond_wait(&sh->changed, &sh->mu);
    bool send = !sh->out->workflow_end_unsupported;
    if (send && !sh->ends_known_supported) sh->ends_probing = true;
    pthread_mutex_unlock(&sh->mu);
    return send;
}

/* Records how the server answered a claimed workflow end (HTTP status, 0 when nothing came back). */
static void settle_workflow_end(Shared *sh, int status, bool accepted) {
    bool unsupported = status == 404 || status == 405;
    pthread_mutex_lock(&sh->mu);
    bool first = unsupported && !sh->out->workflow_end_unsupported;
    if (unsupported) sh->out->workflow_end_unsupported = true;
    if (accepted) sh->ends_known_supported = true;
    sh->ends_probing = false;
    pthread_cond_broadcast(&sh->changed);
    pthread_mutex_unlock(&sh->mu);
    if (first)
        fprintf(stderr, "\n[run] warning: the server answered %d to POST /v1/workflows/{id}/end: it does not take workflow ends; "
                        "no more will be sent\n", status);
}

static void end_workflow(Slot *slot, const char *workflow) {
    Shared *sh = slot->sh;
    BraidError err;
    HttpClient *client = slot_client(slot, 0);
    if (claim_workflow_end(sh)) {
        int status = 0;
        bool accepted = false;
        if (!client) note_problem(sh, &sh->out->workflow_end_errors, "no HTTP client to end a workflow");
        else if (http_client_end_workflow(client, workflow, &status, &err) == 0) accepted = true;
        else if (status != 404 && status != 405) note_problem(sh, &sh->out->workflow_end_errors, err.msg);
        settle_workflow_end(sh, status, accepted);
    }
    if (sh->cfg->trace && prompt_trace_workflow_end(sh->cfg->trace, since_start(sh, braid_now_seconds()), workflow, &err))
        note_problem(sh, &sh->out->trace_errors, err.msg);
}

static void drive_workflow(Slot *slot, int wf) {
    Shared *sh = slot->sh;
    WorkflowRecord rec = {.t_start_s = since_start(sh, braid_now_seconds())};
    CallTask tasks[WORKLOAD_MAX_FANOUT];
    int n;
    while ((n = next_stage(sh, wf, tasks)) > 0) {
        if (!rec.workflow[0]) snprintf(rec.workflow, sizeof rec.workflow, "%s", tasks[0].call.workflow);
        run_stage(slot, tasks, n);
        for (int j = 0; j < n; j++) rec.errors += tasks[j].failed;
        rec.requests += n;
        int rc = deliver(sh, wf, tasks, n);
        free_tasks(tasks, n);
        if (rc) break;
    }
    rec.t_end_s = since_start(sh, braid_now_seconds());
    if (rec.workflow[0]) end_workflow(slot, rec.workflow);
    else snprintf(rec.workflow, sizeof rec.workflow, "#%d", wf); /* a workflow without calls has no id to end */
    pthread_mutex_lock(&sh->mu);
    int rc = run_records_add_workflow(&sh->out->records, &rec);
    pthread_cond_broadcast(&sh->changed);
    pthread_mutex_unlock(&sh->mu);
    if (rc) {
        BraidError err;
        braid_error_set(&err, "out of memory recording workflow %s", rec.workflow);
        fail_run(sh, &err);
    }
}

static void *slot_thread(void *arg) {
    Slot *slot = arg;
    Shared *sh = slot->sh;
    for (int wf; (wf = claim_workflow(sh)) >= 0;) drive_workflow(slot, wf);
    for (int j = 0; j < WORKLOAD_MAX_FANOUT; j++) http_client_free(slot->clients[j]);
    pthread_mutex_lock(&sh->mu);
    sh->active_slots--;
    pthread_cond_broadcast(&sh->changed);
    pthread_mutex_unlock(&sh->mu);
    return NULL;
}

/* ---- the run ---- */

static ProgressSnapshot snapshot(const Shared *sh) {
    const RunRecords *r = &sh->out->records;
    return (ProgressSnapshot){.workflows_done = r->n_workflows, .requests = r->n_requests, .errors = r->errors,
                              .prompt_tokens = r->prompt_tokens, .cached_tokens = r->cached_tokens,
                              .elapsed_s = since_start(sh, braid_now_seconds())};
}

/* Shows progress until every slot has exited. Called with sh->mu held. */
static void watch_progress(Shared *sh) {
    Progress p;
    progress_init(&p, stderr, sh->n_workflows);
    while (sh->active_slots > 0) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += (long)(PROGRESS_TICK_S * 1e9);
        if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
        int rc = pthread_cond_timedwait(&sh->changed, &sh->mu, &deadline);
        if (rc != 0 && rc != ETIMEDOUT) break;
        ProgressSnapshot s = snapshot(sh);
        progress_show(&p, &s);
    }
    ProgressSnapshot s = snapshot(sh);
    progress_finish(&p, &s);
}

int run_driver_execute(const RunDriverConfig *cfg, RunOutcome *out, BraidError *err) {
    *out = (RunOutcome){0};
    Shared sh = {.cfg = cfg, .workload = cfg->workload, .n_workflows = workload_count(cfg->workload), .out = out};
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.changed, NULL);
    int n_slots = cfg->concurrency < sh.n_workflows ? cfg->concurrency : sh.n_workflows;
    Slot *slots = calloc((size_t)(n_slots > 0 ? n_slots : 1), sizeof *slots);
    int started = 0;
    sh.t_start = braid_now_seconds();
    pthread_mutex_lock(&sh.mu);
    for (; slots && started < n_slots; started++) {
        slots[started].sh = &sh;
        if (pthread_create(&slots[started].thread, NULL, slot_thread, &slots[started]) != 0) break;
        sh.active_slots++;
    }
    watch_progress(&sh);
    pthread_mutex_unlock(&sh.mu);
    for (int i = 0; i < started; i++) pthread_join(slots[i].thread, NULL);
    out->wall_s = since_start(&sh, braid_now_seconds());
    free(slots);
    int rc = 0;
    if (sh.failed) rc = braid_error_set(err, "%s", sh.fail_err.msg);
    else if (started < n_slots) rc = braid_error_set(err, "could start only %d of %d workflow threads", started, n_slots);
    pthread_cond_destroy(&sh.changed);
    pthread_mutex_destroy(&sh.mu);
    return rc;
}
