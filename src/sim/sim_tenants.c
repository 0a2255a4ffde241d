/* Tenants sharing one instance, replayed through the live scheduler; the contract is in sim_tenants.h. */
#include "sim/sim_tenants.h"

#include <stdlib.h>
#include <string.h>

#include "cache/evict_policy.h"
#include "worker/scheduler.h"

SimTenantsConfig sim_tenants_config_default(void) {
    return (SimTenantsConfig){.kv_tokens = 1 << 16, .max_batch_tokens = 512, .max_running = 64, .step_s = 0.008,
                              .fair_step_tokens = SCHED_FAIR_DEFAULT_STEP_TOKENS,
                              .prefill_s_per_token = 0.0025, .decode_s_per_token = 0.0007};
}

/* The replay's scheduler clock: modeled time is the replay's, so the scheduler sees none pass
 * (its service counts do not decay; sim_tenants.h). */
static double still_clock(void) { return 0.0; }


/* Prompt token ids: the trace's, or derived from its block hashes (equal prefixes, equal ids)
 * with a tail unique to the request. */
static int fill_prompt(SchedRequest *r, const TraceRequest *t, int block_size) {
    int n = t->prompt_tokens > 0 ? t->prompt_tokens : 1, out = t->output_tokens > 0 ? t->output_tokens : 1;
    r->cap_tokens = n + out + 1;
    if (!(r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens))) return -1;
    for (int i = 0; i < n; i++) r->tokens[i] = trace_prompt_token(t, i, block_size);
    r->n_tokens = r->n_prompt = n;
    r->max_tokens = out;
    return 0;
}

static int make_request(SchedRequest *r, const TraceRequest *t, int block_size) {
    memset(r, 0, sizeof *r);
    r->id = strdup(t->id);
    r->tenant = strdup(t->tenant);
    r->tenant_weight = t->weight > 0 ? (float)t->weight : 1.0f;
    if (t->adapter[0]) r->adapter = strdup(t->adapter);
    return !r->id || !r->tenant || (t->adapter[0] && !r->adapter) ? -1 : fill_prompt(r, t, block_size);
}

typedef struct {
    double arrival, first_token, finish;
    bool added, refused;
} Timing;

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, by_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

/* Per-tenant figures from the requests' timings. */
static int tenant_stats(const Trace *trace, const int *idx, const Timing *tm, const SchedRequest *reqs, int m, SimTenantsResult *out) {
    double *lat = malloc((size_t)(m > 0 ? m : 1) * sizeof *lat), *ttft = malloc((size_t)(m > 0 ? m : 1) * sizeof *ttft);
    if (!lat || !ttft || !(out->tenants = calloc((size_t)(m > 0 ? m : 1), sizeof *out->tenants))) {
        free(lat), free(ttft);
        return -1;
    }
    for (int k = 0; k < m; k++) {
        const char *name = trace->reqs[idx[k]].tenant;
        if (sim_tenants_find(out, name)) continue;
        SimTenantStats *st = &out->tenants[out->n_tenants++];
        if (!(st->tenant = strdup(name))) break;
        int n = 0;
        for (int j = k; j < m; j++) {
            if (strcmp(trace->reqs[idx[j]].tenant, name) || tm[j].refused) continue;
            lat[n] = tm[j].finish - tm[j].arrival;
            ttft[n] = tm[j].first_token - tm[j].arrival;
            st->completion_tokens += (uint64_t)(reqs[j].n_tokens - reqs[j].n_prompt);
            n++;
        }
        st->requests = n;
        st->median_ttft_s = quantile(ttft, n, 0.5);
        st->median_latency_s = quantile(lat, n, 0.5);
        st->p99_latency_s = quantile(lat, n, 0.99);
    }
    free(lat), free(ttft);
    return 0;
}

/* Runs the steps until every request has finished (or was refused). */
static int replay(Scheduler *s, SchedRequest *reqs, Timing *tm, int m, const SimTenantsConfig *cfg, SimTenantsResult *out,
                  BraidError *err) {
    StepPlan plan = {0};
    int next = 0, done = 0, rc = 0;
    double now = m > 0 ? tm[0].arrival : 0, start = now, last = now;
    while (done < m && rc == 0) {
        for (; next < m && tm[next].arrival <= now; next++)
            if (sched_add(s, &reqs[next])) tm[next].refused = true, out->refused++, done++;
            else tm[next].added = true;
        if (sched_idle(s)) {
            if (next < m) now = tm[next].arrival;
            continue;
        }
        int n = sched_plan(s, &plan, err);
        if (n <= 0) {
            rc = n < 0 ? -1 : braid_error_set(err, "sim: the scheduler planned nothing with requests in flight");
            break;
        }
        int prefill = 0, decodes = 0;
        for (int i = 0; i < plan.n; i++) {
            if (plan.entries[i].start < plan.entries[i].req->n_prompt) prefill += plan.entries[i].count;
            else decodes++;
        }
        now += cfg->step_s + cfg->prefill_s_per_token * prefill + cfg->decode_s_per_token * decodes;
        sched_commit(s, &plan);
        out->steps++;
        for (int i = 0; i < plan.n; i++) {
            SchedRequest *r = plan.entries[i].req;
            if (!plan.entries[i].sample) continue;
            if (sched_append_token(r, (int32_t)(7 + r->n_tokens % 1000))) {
                rc = braid_error_set(err, "sim: out of memory");
                break;
            }
            Timing *t = &tm[r - reqs];
            if (r->n_tokens == r->n_prompt + 1) t->first_token = now;
            if (r->n_tokens - r->n_prompt >= r->max_tokens) {
                sched_finish(s, r, "length");
                t->finish = last = now;
                done++;
            }
        }
    }
    plan_free(&plan);
    out->makespan_s = last - start;
    return rc;
}

int sim_tenants_run(const Trace *trace, const SimTenantsConfig *cfg, SimTenantsResult *out, BraidError *err) {
    memset(out, 0, sizeof *out);
    int block_size = trace->block_size > 0 ? trace->block_size : 16, m = 0;
    int *idx = malloc((size_t)(trace->n > 0 ? trace->n : 1) * sizeof *idx);
    SchedRequest *reqs = calloc((size_t)(trace->n > 0 ? trace->n : 1), sizeof *reqs);
    Timing *tm = calloc((size_t)(trace->n > 0 ? trace->n : 1), sizeof *tm);
    if (!idx || !reqs || !tm) {
        free(idx), free(reqs), free(tm);
        return braid_error_set(err, "sim: out of memory");
    }
    int rc = 0;
    for (int i = 0; i < trace->n && rc == 0; i++) {
        if (cfg->only_tenant && strcmp(trace->reqs[i].tenant, cfg->only_tenant)) continue;
        idx[m] = i;
        tm[m].arrival = trace->reqs[i].t;
        if (make_request(&reqs[m++], &trace->reqs[i], block_size)) rc = braid_error_set(err, "sim: out of memory");
    }
    Scheduler s;
    SchedConfig sc = {.device_blocks = cfg->kv_tokens / block_size + 1, .block_size = block_size,
                      .max_batch_tokens = cfg->max_batch_tokens, .max_running = cfg->max_running, .cache_enabled = true,
                      .policy = &evict_policy_lru, .fair_share = cfg->fair_share, .fair_step_tokens = cfg->fair_step_tokens};
    if (rc == 0 && sched_init(&s, &sc, err) == 0) {
        s.clock = still_clock;
        rc = replay(&s, reqs, tm, m, cfg, out, err);
        for (int k = 0; k < m; k++)
            if (tm[k].added && reqs[k].state != REQ_FINISHED) sched_cancel(&s, &reqs[k]); /* after an error */
        if (rc == 0) {
            out->requests = m;
            for (int k = 0; k < m; k++) out->completion_tokens += (uint64_t)(reqs[k].n_tokens - reqs[k].n_prompt);
            out->tokens_per_s = out->makespan_s > 0 ? (double)out->completion_tokens / out->makespan_s : 0;
            if (tenant_stats(trace, idx, tm, reqs, m, out)) rc = braid_error_set(err, "sim: out of memory");
        }
        sched_free(&s);
    } else if (rc == 0) {
        rc = -1;
    }
    for (int k = 0; k < m; k++) sched_request_free(&reqs[k]);
    free(idx), free(reqs), free(tm);
    return rc;
}

const SimTenantStats *sim_tenants_find(const SimTenantsResult *r, const char *tenant) {
    for (int i = 0; i < r->n_tenants; i++)
        if (r->tenants[i].tenant && strcmp(r->tenants[i].tenant, tenant) == 0) return &r->tenants[i];
    return NULL;
}

void sim_tenants_result_free(SimTenantsResult *r) {
    for (int i = 0; i < r->n_tenants; i++) free(r->tenants[i].tenant);
    free(r->tenants);
    memset(r, 0, sizeof *r);
}
