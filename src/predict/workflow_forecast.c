#include "predict/workflow_forecast.h"

#include <string.h>

int workflow_forecast_init(WorkflowForecast *f, const WorkflowForecastConfig *cfg, BraidError *err) {
    memset(f, 0, sizeof *f);
    f->horizon = cfg->horizon > 0 ? cfg->horizon : WORKFLOW_FORECAST_DEFAULT_HORIZON;
    f->learn = cfg->predictor ? cfg->learn : true;
    f->run_cap = cfg->run_cap;
    f->predictor = cfg->predictor;
    if (!f->predictor && agent_predictor_create(&f->predictor, cfg->kind ? cfg->kind : PREDICTOR_MARKOV1, err)) return -1;
    if (workflow_tracker_create(&f->tracker, cfg->max_workflows > 0 ? cfg->max_workflows : 65536, cfg->idle_timeout_s, err)) {
        agent_predictor_free(f->predictor);
        f->predictor = NULL;
        return -1;
    }
    return 0;
}

void workflow_forecast_free(WorkflowForecast *f) {
    workflow_tracker_free(f->tracker);
    agent_predictor_free(f->predictor);
    agent_prediction_free(&f->forecast);
    agent_prediction_free(&f->branch);
    memset(f, 0, sizeof *f);
}

/* Scores the previous forecast's step 1 against the call that just came (online accuracy). */
static void score_step1(WorkflowForecast *f, const char *agent, int n_before) {
    if (n_before == 0 || f->forecast.k == 0) return;
    int top = agent_prediction_top1(&f->forecast, 1);
    f->predicted_calls++;
    if (top >= 0 && strcmp(f->forecast.agents[top], agent) == 0) f->correct_next++;
}

/* Has the run of the last agent (its calls at the end of history, oldest first) reached the length
 * of that agent's previous run? false when there is none, or when its start fell out of the
 * history (whole: history holds every call of the workflow). */
static bool run_at_cap(const char *const *history, int n, bool whole) {
    if (n < 2) return false;
    const char *a = history[n - 1];
    int i = n - 1, run = 0, prev = 0;
    while (i >= 0 && strcmp(history[i], a) == 0) i--, run++;
    while (i >= 0 && strcmp(history[i], a) != 0) i--; /* the calls between the two runs */
    if (i < 0) return false;
    while (i >= 0 && strcmp(history[i], a) == 0) i--, prev++;
    if (i < 0 && !whole) return false;
    return run >= prev;
}

/* The forecast in f->forecast redone given that the next call is not history[n-1]'s agent: step 1
 * without it (renormalized, END included), steps 2..K the mixture of the predictor's forecasts
 * after each other next call, weighted by its new step-1 probability (branches under
 * RUN_CAP_MIN_MASS are left out and the others scaled up to their mass). */
#define RUN_CAP_MIN_MASS 1e-3f
#define RUN_CAP_MAX_AGENTS 64
static int cap_forecast(WorkflowForecast *f, const char *const *history, int n, BraidError *err) {
    AgentPrediction *p = &f->forecast;
    const int A = p->n_agents, K = p->k;
    if (K < 1 || A > RUN_CAP_MAX_AGENTS) return 0;
    int self = -1;
    for (int i = 0; i < A; i++)
        if (strcmp(p->agents[i], history[n - 1]) == 0) self = i;
    float keep = self >= 0 ? 1.0f - p->prob[self] : 0.0f;
    if (self < 0 || keep <= 1e-6f) return 0; /* nothing else predicted: keep the model's answer */
    float step1[RUN_CAP_MAX_AGENTS], end1 = p->p_end[0] / keep;
    for (int i = 0; i < A; i++) step1[i] = i == self ? 0.0f : p->prob[i] / keep;
    const char *hyp[WORKFLOW_TRACKER_HISTORY + 1];
    int m = n < WORKFLOW_TRACKER_HISTORY ? n : WORKFLOW_TRACKER_HISTORY;
    memcpy(hyp, history + n - m, (size_t)m * sizeof *hyp);
    for (int s = 1; s < K; s++) {
        memset(p->prob + (size_t)s * A, 0, (size_t)A * sizeof *p->prob);
        p->p_end[s] = end1; /* END absorbs */
    }
    /* the branches taken share the running mass 1 - end1 in proportion, so every row still sums to 1 */
    float taken = 0;
    for (int b = 0; b < A; b++)
        if (step1[b] >= RUN_CAP_MIN_MASS) taken += step1[b];
    for (int b = 0; b < A && K > 1 && taken > 0; b++) {
        if (step1[b] < RUN_CAP_MIN_MASS) continue;
        float w = step1[b] * (1.0f - end1) / taken;
        hyp[m] = p->agents[b];
        if (agent_predictor_predict(f->predictor, hyp, m + 1, K - 1, &f->branch, err)) return -1;
        if (f->branch.n_agents != A || f->branch.k != K - 1)
            return braid_error_set(err, "workflow forecast: run cap: a branch forecast of %d agents x %d steps, expected %d x %d",
                                   f->branch.n_agents, f->branch.k, A, K - 1);
        for (int s = 1; s < K; s++) {
            for (int i = 0; i < A; i++) p->prob[(size_t)s * A + i] += w * f->branch.prob[(size_t)(s - 1) * A + i];
            p->p_end[s] += w * f->branch.p_end[s - 1];
        }
    }
    memcpy(p->prob, step1, (size_t)A * sizeof *step1);
    p->p_end[0] = end1;
    f->run_capped++;
    return 0;
}

int workflow_forecast_call(WorkflowForecast *f, const char *workflow, const char *agent, double now, const AgentPrediction **out,
                           BraidError *err) {
    return workflow_forecast_call_text(f, workflow, agent, NULL, now, out, err);
}

int workflow_forecast_call_text(WorkflowForecast *f, const char *workflow, const char *agent, const float *text, double now,
                                const AgentPrediction **out, BraidError *err) {
    const char *const *history;
    int n;
    WorkflowInfo info;
    /* A workflow that ended explicitly starts over on its next call; only a live one's history counts. */
    if (!workflow_tracker_history(f->tracker, workflow, &history, &n) ||
        (workflow_tracker_info(f->tracker, workflow, &info) && info.ended))
        n = 0;
    /* Only step 1 of the forecast made before this call is scored, so one step is enough. */
    if (n > 0 && agent_predictor_predict(f->predictor, history, n, 1, &f->forecast, err)) return -1;
    if (n > 0) score_step1(f, agent, n);
    if (f->learn && agent_predictor_observe(f->predictor, history, n, agent, err)) return -1;
    if (workflow_tracker_call(f->tracker, workflow, agent, now, err)) return -1;
    workflow_tracker_history(f->tracker, workflow, &history, &n);
    if (agent_predictor_predict_text(f->predictor, history, n, text, f->horizon, &f->forecast, err)) return -1;
    if (f->run_cap && workflow_tracker_info(f->tracker, workflow, &info) && run_at_cap(history, n, info.calls == (uint64_t)n) &&
        cap_forecast(f, history, n, err))
        return -1;
    f->calls++;
    *out = &f->forecast;
    return 0;
}

int workflow_forecast_text_dim(const WorkflowForecast *f) { return agent_predictor_text_dim(f->predictor); }

int workflow_forecast_refine(WorkflowForecast *f, const char *workflow, const float *text, const AgentPrediction **out, BraidError *err) {
    const char *const *history;
    int n;
    WorkflowInfo info;
    *out = NULL;
    if (!workflow_tracker_history(f->tracker, workflow, &history, &n) || n == 0 ||
        (workflow_tracker_info(f->tracker, workflow, &info) && !info.active))
        return 0;
    if (agent_predictor_predict_text(f->predictor, history, n, text, f->horizon, &f->forecast, err)) return -1;
    if (f->run_cap && run_at_cap(history, n, info.calls == (uint64_t)n) && cap_forecast(f, history, n, err)) return -1;
    f->refined++;
    *out = &f->forecast;
    return 0;
}

void workflow_forecast_end(WorkflowForecast *f, const char *workflow, double now) {
    const char *const *history;
    int n;
    WorkflowInfo info;
    if (!workflow_tracker_info(f->tracker, workflow, &info) || !info.active) return;
    BraidError err;
    if (f->learn && workflow_tracker_history(f->tracker, workflow, &history, &n) && n > 0)
        (void)agent_predictor_observe(f->predictor, history, n, NULL, &err); /* a lost END costs one count */
    workflow_tracker_end(f->tracker, workflow, now);
}
