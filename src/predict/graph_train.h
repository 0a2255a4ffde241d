/*
 * graph_train.h — trains PBKV's graph predictor (graph_model.h) from workflow runs and attaches it
 * to an AgentPredictor, which then forecasts with it (PREDICTOR_GRAPH).
 *
 * The predictor must already hold the runs' Markov-2 counts (agent_predictor_observe_workflow on
 * each run): its vocabulary is the graph model's agents, its counts answer first calls. From the
 * runs this builds the transition graph A (agent -> next agent, START and END left out), the
 * hidden states' per-dimension mean and deviation, and one sample per call: the calls so far, the
 * call's hidden state, and the next K outcomes as labels (END after an ended run's last call,
 * unscored past it or past an unfinished run's last call) — the paper's training set (App. B).
 * Only what a server sees goes in: agent names, their order, ends, and hidden states.
 */
#ifndef BRAID_PREDICT_GRAPH_TRAIN_H
#define BRAID_PREDICT_GRAPH_TRAIN_H

#include "common/error.h"
#include "predict/agent_predictor.h"
#include "predict/graph_model.h"

/* One workflow run: its calls' agents in order, each call's hidden state (texts NULL, or n entries
 * each NULL or text_dim floats), and whether it ended. */
typedef struct {
    const char *const *agents;
    const float *const *texts;
    int n;
    int ended;
} PredictorRun;

typedef struct {
    int k;                 /* head steps (default 4) */
    int text_dim;          /* hidden-state width; 0 = train without the semantic stream */
    GraphModelShape shape; /* widths (0 = defaults; n_agents, text_dim and k are set here) */
    GraphTrainConfig train; /* its valid / n_valid are set here from the held-out runs */
    /* Every hold_out-th run (0 = default 5; 1 = none) is held out for early stopping when there
     * are at least 10 runs: the model kept is the epoch with the lowest held-out loss. */
    int hold_out;
} GraphTrainOptions;

/* Trains and attaches (p becomes PREDICTOR_GRAPH). Errors: p is Markov-1, an agent of a run is
 * unknown to p, no call to learn from, out of memory; p is unchanged then. */
int agent_predictor_train_graph(AgentPredictor *p, const PredictorRun *runs, int n_runs, GraphTrainOptions *opt, BraidError *err);

#endif
