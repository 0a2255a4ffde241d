/*
 * agent_predictor.h — which agent a workflow calls next: a Markov-n model (n = 1 or 2) over agent
 * transitions, learned from counts across all workflows, with an END state (the workflow ended);
 * or PBKV's graph predictor (graph_model.h, trained by graph_train.h), which keeps Markov-2 counts
 * beside it and answers every call after the first with its learned model (optionally reading the
 * call's prefill hidden state: agent_predictor_predict_text).
 *
 * What it owns: the agent vocabulary (names interned as exact strings, never forgotten) and
 * transition counts at three orders: Markov-2 contexts (the last two agents), Markov-1 contexts
 * (the last agent) and the global frequency of every outcome. A Markov-1 predictor keeps the
 * last two only. A workflow's start is a context of its own (START), so the first agent is learned
 * too.
 *
 * Who calls it: `braid train-predictor` (offline, from traces), the trace simulator (src/sim) and
 * the coordinator (src/coord), which pairs it with the workflow tracker (workflow_tracker.h) and
 * uses the K-step forecast to score KV-cache blocks (PBKV § 4.2: unconditional step
 * probabilities plus the cumulative END mass give the survival factor s(k) = 1 - p_end[k-1]).
 * It sees only what a real server sees: workflow id, agent name, and their order.
 *
 * Model. The probability of outcome o (an agent or END) after context c is add-alpha smoothed:
 *     P(o | c) = (count(c, o) + alpha) / (count(c) + alpha * (A + 1)),    A = agents known now,
 * with alpha = AGENT_PREDICTOR_DEFAULT_ALPHA (0.01) unless agent_predictor_set_alpha changes it.
 * A small alpha keeps a context seen once decisive (1.01 / 1.06 = 95% with 4 outcomes) while no
 * outcome is ever impossible. Contexts never seen back off: Markov-2 -> Markov-1 (the last agent)
 * -> the global outcome frequencies; an agent name the predictor has never seen has no context of
 * its own and goes straight to the global frequencies.
 *
 * Forecast. agent_predictor_predict propagates the chain K steps with END absorbing: prob[s][i] is
 * the unconditional probability that the workflow's s-th next call is agent i, and p_end[s] the
 * probability that it ended at or before step s, so every row's sum plus p_end[s] is 1 (up to
 * float rounding). The conditional distribution at step s given the workflow is still running
 * (what PBKV's predictor outputs) is prob[s][i] / (1 - p_end[s-1]) and, for END,
 * (p_end[s] - p_end[s-1]) / (1 - p_end[s-1]). Markov-1 propagation is exact. Markov-2 propagation
 * carries the exact (previous, last) pair for the mass that follows observed transitions in pieces
 * of at least 1e-3; the mass spread uniformly by the smoothing (the alpha terms) and smaller
 * pieces keep only their last agent and continue with Markov-1 rows. Probability is conserved
 * either way; the work per step is bounded by the likely paths instead of growing as A^3.
 *
 * Thread-safety: observe, set_alpha and load mutate; predict and save only read, so any number of
 * threads may predict concurrently (each with its own AgentPrediction) while no one observes.
 *
 * Memory: the predictor owns everything it allocates; agent_predictor_free releases it. An
 * AgentPrediction owns its arrays (released by agent_prediction_free) but its agents[i] strings
 * are the predictor's, valid until agent_predictor_free.
 *
 * File format (little-endian, version 2; docs in agent_predictor.c): magic "BRAIDPRD", version,
 * kind, alpha, agent names, then the count rows of each order, the graph model's section (empty
 * unless kind = graph), then an FNV-1a checksum of everything before it. Version 1 files load. Loading checks every read, every index and the checksum: a bad,
 * truncated or wrong-version file is an error naming the path and what is wrong.
 */
#ifndef BRAID_PREDICT_AGENT_PREDICTOR_H
#define BRAID_PREDICT_AGENT_PREDICTOR_H

#include <stdint.h>

#include "common/error.h"

#define AGENT_PREDICTOR_DEFAULT_ALPHA 0.01
#define AGENT_PREDICTOR_FILE_VERSION 2
/* Limits that loading and interning enforce (a file or a caller beyond them is refused). */
#define AGENT_PREDICTOR_MAX_AGENTS 65536
#define AGENT_PREDICTOR_MAX_NAME 4096

/* PREDICTOR_GRAPH: the learned model (graph_model.h) over the agents it was trained on, with
 * Markov-2 counts beside it for a workflow's first call (no history yet) and for online
 * observations (which never change the learned weights). Made by training (graph_train.h) or
 * loading, never by agent_predictor_create. */
typedef enum { PREDICTOR_MARKOV1 = 1, PREDICTOR_MARKOV2 = 2, PREDICTOR_GRAPH = 3 } PredictorKind;

struct GraphModel;

typedef struct AgentPredictor AgentPredictor;

/* A K-step forecast. Zero it ({0}) before its first use; a prediction may then be passed to
 * agent_predictor_predict again and again (its buffers are reused) and is released with
 * agent_prediction_free. */
typedef struct {
    int k, n_agents;
    char **agents;      /* (n_agents): names, borrowed from the predictor (valid until agent_predictor_free) */
    float *prob;        /* (k, n_agents): prob[(s-1)*n_agents + i] = P(the s-th next call is agents[i]) */
    float *p_end;       /* (k): P(the workflow ended at or before step s) */
    /* private: buffers and scratch reused across calls */
    int cap_prob, cap_agents, cap_scratch;
    void *scratch;
} AgentPrediction;

int agent_predictor_create(AgentPredictor **p, PredictorKind kind, BraidError *err);
void agent_predictor_free(AgentPredictor *p);

PredictorKind agent_predictor_kind(const AgentPredictor *p);
/* Agents known, and transitions observed so far. */
int agent_predictor_n_agents(const AgentPredictor *p);
uint64_t agent_predictor_n_transitions(const AgentPredictor *p);
/* The index of an agent name (0 <= i < n_agents), or -1 when the predictor has never seen it. */
int agent_predictor_agent_index(const AgentPredictor *p, const char *name);
/* The name of agent i (0 <= i < n_agents), borrowed. */
const char *agent_predictor_agent_name(const AgentPredictor *p, int i);
/* The smoothing pseudo-count per outcome (> 0 and finite, else an error). It is saved with the
 * counts. */
int agent_predictor_set_alpha(AgentPredictor *p, double alpha, BraidError *err);
double agent_predictor_alpha(const AgentPredictor *p);

/* One transition: the workflow's agents so far (oldest first; only the last two matter) then the
 * agent it called next, or next == NULL when the workflow ended. Names are interned (copied).
 * Errors: NULL names, n_history < 0, a name longer than AGENT_PREDICTOR_MAX_NAME, more than
 * AGENT_PREDICTOR_MAX_AGENTS agents, out of memory (the predictor is unchanged then). */
int agent_predictor_observe(AgentPredictor *p, const char *const *history, int n_history, const char *next, BraidError *err);
/* All transitions of one workflow's calls agents[0..n-1]: from the start to agents[0], ..., and,
 * when ended, from agents[n-1] to END. */
int agent_predictor_observe_workflow(AgentPredictor *p, const char *const *agents, int n, int ended, BraidError *err);

/* The K-step forecast (1 <= k <= 64) after the workflow's calls history[0..n_history-1] (oldest
 * first; n_history 0 = a workflow that has not called yet). With no data at all the prediction is
 * empty (k = 0, n_agents = 0), which is not an error. Errors: bad arguments, out of memory. */
int agent_predictor_predict(const AgentPredictor *p, const char *const *history, int n_history, int k, AgentPrediction *out,
                            BraidError *err);
/* The same, with the current call's hidden state (agent_predictor_text_dim floats: the post-norm
 * hidden state of the last prompt token of history[n_history-1]'s prefill), or text = NULL when it
 * is not known. Only a graph predictor trained with hidden states reads it. */
int agent_predictor_predict_text(const AgentPredictor *p, const char *const *history, int n_history, const float *text, int k,
                                 AgentPrediction *out, BraidError *err);
/* Width of the hidden state the predictor reads (0 = it reads none). */
int agent_predictor_text_dim(const AgentPredictor *p);
/* Makes p a graph predictor owning graph (trained on p's first graph->n_agents agents; p must
 * keep Markov-2 counts). On error p and graph are unchanged and the caller still owns graph. */
int agent_predictor_attach_graph(AgentPredictor *p, struct GraphModel *graph, BraidError *err);
const struct GraphModel *agent_predictor_graph(const AgentPredictor *p);
void agent_prediction_free(AgentPrediction *pred);
/* The most likely outcome of step s (1-based) given that the workflow is still running then: the
 * index of an agent, or -1 for END (ties go to the lower agent index, then END). -2 when s is out
 * of range or the prediction is empty. */
int agent_prediction_top1(const AgentPrediction *pred, int s);

/* Next-agent accuracy over one finished or unfinished workflow agents[0..n-1]: after each call t
 * (1 <= t <= n) predicts k steps and compares, for each step s, the top-1 outcome with the actual
 * (t+s)-th call, or END when t+s == n+1 and ended. Steps past the known end (after END, or past
 * the last call of a workflow that did not end) are not counted. Adds to hits[s-1] and
 * total[s-1] (arrays of k). pred is a caller's scratch prediction (zeroed before first use). */
int agent_predictor_score_workflow(const AgentPredictor *p, const char *const *agents, int n, int ended, int k, uint64_t *hits,
                                   uint64_t *total, AgentPrediction *pred, BraidError *err);

/* The same with each call's hidden state (texts[t-1] for call t, entries may be NULL; texts NULL =
 * none known). */
int agent_predictor_score_workflow_text(const AgentPredictor *p, const char *const *agents, const float *const *texts, int n, int ended,
                                        int k, uint64_t *hits, uint64_t *total, AgentPrediction *pred, BraidError *err);

int agent_predictor_save(const AgentPredictor *p, const char *path, BraidError *err);
/* On success *p is a new predictor (free it with agent_predictor_free); on failure *p is NULL. */
int agent_predictor_load(AgentPredictor **p, const char *path, BraidError *err);

#endif
