/*
 * workflow_forecast.h — the workflow tracker and the next-agent predictor together, as a server
 * (the coordinator) or the trace simulator uses them: every call of an agent in a workflow is
 * recorded, learned from (online, unless the predictor was trained and is kept frozen) and
 * answered with the workflow's K-step forecast; an end is learned as END and retires the workflow.
 * The forecast is what the cache's policies take (kv_cache_predict).
 * Owns the tracker and the predictor it was given. Not thread-safe.
 */
#ifndef BRAID_PREDICT_WORKFLOW_FORECAST_H
#define BRAID_PREDICT_WORKFLOW_FORECAST_H

#include <stdbool.h>

#include "common/error.h"
#include "predict/agent_predictor.h"
#include "predict/workflow_tracker.h"

/* PBKV's lookahead K when nothing sets it (braid sim / serve --horizon, --pbkv-k). */
#define WORKFLOW_FORECAST_DEFAULT_HORIZON 4

typedef struct {
    WorkflowTracker *tracker;
    AgentPredictor *predictor;
    bool learn;             /* observe transitions as they happen */
    int horizon;            /* K */
    AgentPrediction forecast; /* the last answer, reused */
    uint64_t calls, predicted_calls, correct_next; /* top-1 accuracy of step 1 as it happens */
    uint64_t refined;       /* forecasts redone with a call's hidden state */
    int last_top1_valid;
} WorkflowForecast;

typedef struct {
    AgentPredictor *predictor; /* taken over; NULL = a new Markov-`kind` predictor learning online */
    PredictorKind kind;        /* when predictor is NULL (default Markov-1) */
    bool learn;                /* with a given predictor: keep learning online too */
    int horizon;               /* 0 = WORKFLOW_FORECAST_DEFAULT_HORIZON */
    int max_workflows;         /* default 65536 */
    double idle_timeout_s;     /* <= 0: workflows retire only by an explicit end */
} WorkflowForecastConfig;

int workflow_forecast_init(WorkflowForecast *f, const WorkflowForecastConfig *cfg, BraidError *err);
void workflow_forecast_free(WorkflowForecast *f);
/* workflow called agent at time now: recorded, learned, forecast. *out points at the forecast
 * (valid until the next call); it is empty (k = 0) while the predictor knows nothing. */
int workflow_forecast_call(WorkflowForecast *f, const char *workflow, const char *agent, double now, const AgentPrediction **out,
                           BraidError *err);
/* The same with the call's hidden state (workflow_forecast_text_dim floats) when it is known at
 * arrival (the trace simulator replays recorded ones); NULL = not known. */
int workflow_forecast_call_text(WorkflowForecast *f, const char *workflow, const char *agent, const float *text, double now,
                                const AgentPrediction **out, BraidError *err);
/* Width of the hidden state the predictor reads; 0 = it reads none (refine is then pointless). */
int workflow_forecast_text_dim(const WorkflowForecast *f);
/* A server learns a call's hidden state after its prefill: the workflow's forecast again, from the
 * same history, now with text. *out is NULL (and nothing is done) for a workflow not live. */
int workflow_forecast_refine(WorkflowForecast *f, const char *workflow, const float *text, const AgentPrediction **out, BraidError *err);
/* The workflow ended: learned as END, retired. Unknown workflows are ignored. */
void workflow_forecast_end(WorkflowForecast *f, const char *workflow, double now);

#endif
