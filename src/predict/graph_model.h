/*
 * graph_model.h — PBKV's learned next-agent model (paper § 4.1, App. B): a GraphSAGE encoder over
 * the agents' transition graph, attention over the workflow's earlier calls, an optional semantic
 * stream from the served model's prefill (the post-norm hidden state of the last prompt token),
 * and one MLP head that emits next-agent distributions for steps 1..K at once.
 *
 * Numbers only: agents are indices. Outputs 0..V-1 are agents and V is END; as an input, index V
 * is UNKNOWN (an agent the model was not trained on). The owner (agent_predictor.c) maps names.
 *
 *   H0 = E                                            (V+1, d)   learnable embeddings
 *   Hl = ReLU([H(l-1) | A H(l-1)] Wl^T + bl), l = 1,2           A: row-normalized transitions
 *   h_cur  = H2[v_t]
 *   h_path = sum_i softmax_i((Wq h_cur) . H2[v_i] / sqrt d) H2[v_i]   over the earlier calls i < t
 *   h_txt  = ReLU(Wt ((x - mean) * inv_std) + bt)                    (absent when text_dim = 0)
 *   h_prev = H2[v_(t-1)] (0 for a first call), len = one-hot bucket of t (1, 2, 3-4, 5-8, 9-12,
 *            13-16, 17-24, 25+): two inputs beyond the paper's (graph_model.c says why)
 *   m      = ReLU(Wm1 [h_cur | h_prev | h_path | len | h_txt] + bm1)
 *   logits = Wm2 m + bm2 -> K rows of V+1; row s is P(step s | the workflow still runs before s)
 *
 * Training (graph_model_train): cross-entropy over the labelled steps of each sample (steps after
 * a workflow's END are masked, -1), minibatch Adam, dropout on m, and "text dropout" (the whole x
 * zeroed for a fraction of samples) so the model also answers well before the hidden state of a
 * call exists (a server forecasts at arrival, then again after the prefill). Gradients flow into
 * every parameter, the GraphSAGE layers and embeddings included; test_predict checks them against
 * finite differences. Deterministic for a given seed and data.
 *
 * Inference (graph_model_predict) uses H2 and Wq·H2 precomputed by graph_model_freeze (training
 * and decoding freeze automatically), so one forecast costs O(L d + d (2d + dt) + H K V) with no
 * graph work. predict only reads the model: any number of threads may predict at once, each with
 * its own scratch (graph_model_scratch_floats).
 *
 * Encoding: graph_model_encode/decode turn the model into a little-endian byte blob (shape, A,
 * text normalization, parameters) that agent_predictor.c embeds in its versioned, checksummed file;
 * decode checks every size and value (finite numbers, A rows summing to 1 or 0).
 */
#ifndef BRAID_PREDICT_GRAPH_MODEL_H
#define BRAID_PREDICT_GRAPH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define GRAPH_MODEL_MAX_K 16
#define GRAPH_MODEL_MAX_AGENTS 4096
#define GRAPH_MODEL_MAX_TEXT_DIM 65536

typedef struct {
    int n_agents;    /* V: output classes are V agents + END; inputs V agents + UNKNOWN */
    int dim;         /* d: agent embedding width (default 32) */
    int text_dim;    /* D: hidden-state width of the served model; 0 = no semantic stream */
    int text_out;    /* dt: width of h_txt (default 32; ignored when text_dim = 0) */
    int mlp;         /* width of the head's hidden layer (default 128) */
    int k;           /* steps the head predicts (1..GRAPH_MODEL_MAX_K) */
    int max_history; /* earlier calls attended over, the most recent ones (default 16) */
} GraphModelShape;

typedef struct GraphModel GraphModel;

/* One training example: a workflow's calls so far (agent indices, V = UNKNOWN; n >= 1, the last is
 * the current call), the current call's hidden state (text_dim floats, or NULL = not known), and
 * the next K outcomes (an agent index, V = END, or -1 = not scored). */
typedef struct {
    const int32_t *history;
    int n;
    const float *text;
    int32_t labels[GRAPH_MODEL_MAX_K];
} GraphSample;

typedef struct {
    int epochs;          /* default 40 */
    int batch;           /* default 64 */
    float lr;            /* Adam step size (default 3e-3) */
    float weight_decay;  /* L2 on weights, not biases (default 1e-4) */
    float dropout;       /* on the head's hidden layer (default 0.1) */
    float text_dropout;  /* fraction of samples trained without their hidden state (default 0.25) */
    uint64_t seed;
    /* Held-out samples (optional): after every epoch their loss is measured and the parameters of
     * the best epoch are the ones kept (early stopping; hidden states let a model memorize its
     * training calls, so the training loss alone says nothing). */
    const GraphSample *valid;
    int n_valid;
    void (*progress)(void *ctx, int epoch, int epochs, double mean_loss, double valid_loss);
    void *progress_ctx;
    int best_epoch;      /* out: the epoch whose parameters were kept (the last one without valid) */
} GraphTrainConfig;

/* Fills unset (zero) fields of a shape with the defaults above (n_agents, text_dim and k are the
 * caller's). */
void graph_model_shape_defaults(GraphModelShape *s);
/* A model with small random weights (seeded), A = 0, text normalization = identity. Errors: a
 * shape out of range, out of memory. */
int graph_model_create(GraphModel **out, const GraphModelShape *shape, uint64_t seed, BraidError *err);
void graph_model_free(GraphModel *m);
const GraphModelShape *graph_model_shape(const GraphModel *m);
size_t graph_model_n_params(const GraphModel *m);

/* The transition graph: adj is (V+1) x (V+1), row i = where agent i goes next (row V, UNKNOWN,
 * and END are not part of it: pass zeros). Each row is normalized here to sum to 1 (or stays 0). */
int graph_model_set_adjacency(GraphModel *m, const double *counts, BraidError *err);
/* Per-dimension mean and standard deviation of the hidden states the model will see (a standard
 * deviation below 1e-6 counts as 1). */
int graph_model_set_text_norm(GraphModel *m, const float *mean, const float *std, BraidError *err);

int graph_model_train(GraphModel *m, const GraphSample *samples, int n, GraphTrainConfig *cfg, BraidError *err);
/* Mean cross-entropy per scored step over samples (text used when present), for reports. */
double graph_model_loss(GraphModel *m, const GraphSample *samples, int n);

/* Floats of scratch graph_model_predict needs. */
size_t graph_model_scratch_floats(const GraphModel *m);
/* cond (k rows of V+1): row s-1 is P(step s = agent i, or END at i = V | still running before s).
 * history as in GraphSample (indices > V are clamped to UNKNOWN; n < 1 is an error); text NULL =
 * not known. */
int graph_model_predict(const GraphModel *m, const int32_t *history, int n, const float *text, float *cond, float *scratch);

/* Precomputes what inference needs from the weights; call after changing them by hand. */
void graph_model_freeze(GraphModel *m);

/* The blob is malloc'd (free it). */
int graph_model_encode(const GraphModel *m, uint8_t **blob, size_t *len, BraidError *err);
int graph_model_decode(const uint8_t *blob, size_t len, GraphModel **out, BraidError *err);

/* For the gradient test: the parameters as one flat array, and the gradient of the mean loss over
 * samples (no dropout, text always used) into grad (graph_model_n_params floats). */
float *graph_model_params(GraphModel *m);
int graph_model_gradient(GraphModel *m, const GraphSample *samples, int n, float *grad, double *loss, BraidError *err);

#endif
