#include "predict/workflow_forecast.h"

#include <string.h>

int workflow_forecast_init(WorkflowForecast *f, const WorkflowForecastConfig *cfg, BraidError *err) {
    memset(f, 0, sizeof *f);
    f->horizon = cfg->horizon > 0 ? cfg->horizon : WORKFLOW_FORECAST_DEFAULT_HORIZON;
    f->learn = cfg->predictor ? cfg->learn : true;
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
    memset(f, 0, sizeof *f);
}

/* Scores the previous forecast's step 1 against the call that just came (online accuracy). */
static void score_step1(WorkflowForecast *f, const char *agent, int n_before) {
    if (n_before == 0 || f->forecast.k == 0) return;
    int top = agent_prediction_top1(&f->forecast, 1);
    f->predicted_calls++;
    if (top >= 0 && strcmp(f->forecast.agents[top], agent) == 0) f->correct_next++;
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
