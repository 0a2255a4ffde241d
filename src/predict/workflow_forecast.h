/*
 * workflow_forecast.h — the workflow tracker and the next-agent predictor together, as a server
 * (the coordinator) or the trace simulator uses them: every call of an agent in a workflow is
 * recorded, learned from (online, unless the predictor was trained and is kept frozen) and
 * answered with the workflow's K-step forecast; an end is learned as END and retires the workflow.
 * The forecast is what the cache's policies take (kv_cache_predict).
 * Run cap: when the workflow's last agent has now been called as many times in a row as in its
 * previous run of calls (a retrieval round as long as the round before it), the forecast is redone
 * given that the next call is another agent: step 1 without that agent, steps 2..K mixed from the
 * predictor's forecasts after each other next call. A round searches once per open fact and facts
 * only close, so a round never outlasts the previous one; the agent-order predictor cannot count
 * that far back (factcheck +0.3 / +1.2 points of pbkv hit rate at 80 000 / 160 000 tokens, codegen
 * and pipeline unchanged: bench/RESULTS.md, issue 35 part 8). Off unless run_cap: it assumes rounds
 * that never grow, which holds for factcheck's retrieval and not for every agent loop (a ReAct agent
 * whose tool rounds lengthen would be forecast to hand over too early), so it is a simulator option.
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
    bool run_cap;           /* see "Run cap" above */
    AgentPrediction branch; /* scratch: the forecast after one hypothetical next call */
    uint64_t run_capped;    /* forecasts redone because a run reached its previous length */
} WorkflowForecast;

typedef struct {
    AgentPredictor *predictor; /* taken over; NULL = a new Markov-`kind` predictor learning online */
    PredictorKind kind;        /* when predictor is NULL (default Markov-1) */
    bool learn;                /* with a given predictor: keep learning online too */
    int horizon;               /* 0 = WORKFLOW_FORECAST_DEFAULT_HORIZON */
    int max_workflows;         /* default 65536 */
    double idle_timeout_s;     /* <= 0: workflows retire only by an explicit end */
    bool run_cap;              /* apply the run cap (off by default: braid sim --forecast-run-cap) */
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
