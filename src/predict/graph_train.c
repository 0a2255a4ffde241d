#include "predict/graph_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The agents' indices, run after run, and the samples pointing into them. */
typedef struct {
    int32_t *ids;
    GraphSample *samples;
    int n_samples;
    double *counts;   /* (V+1)^2 transition counts */
    float *mean, *std;
} TrainSet;

static void train_set_free(TrainSet *t) {
    free(t->ids);
    free(t->samples);
    free(t->counts);
    free(t->mean);
    free(t->std);
}

/* Resolves every run's names to the predictor's agent indices once. */
static int build_ids(const AgentPredictor *p, const PredictorRun *runs, int n_runs, TrainSet *t, BraidError *err) {
    size_t total = 0;
    for (int r = 0; r < n_runs; r++) total += (size_t)(runs[r].n > 0 ? runs[r].n : 0);
    if (total == 0) return braid_error_set(err, "graph predictor: no calls to learn from");
    t->ids = malloc(total * sizeof *t->ids);
    t->samples = calloc(total, sizeof *t->samples);
    if (!t->ids || !t->samples) return braid_error_set(err, "graph predictor: out of memory for %zu calls", total);
    size_t at = 0;
    for (int r = 0; r < n_runs; r++)
        for (int i = 0; i < runs[r].n; i++) {
            int id = runs[r].agents[i] ? agent_predictor_agent_index(p, runs[r].agents[i]) : -1;
            if (id < 0)
                return braid_error_set(err, "graph predictor: run %d call %d: agent '%s' was not observed by the predictor", r, i,
                                       runs[r].agents[i] ? runs[r].agents[i] : "(null)");
            t->ids[at++] = id;
        }
    return 0;
}

static void build_samples(const PredictorRun *runs, int n_runs, int V, int k, TrainSet *t) {
    size_t base = 0;
    for (int r = 0; r < n_runs; r++) {
        const PredictorRun *run = &runs[r];
        const int32_t *ids = t->ids + base;
        for (int c = 1; c <= run->n; c++) {
            GraphSample *s = &t->samples[t->n_samples++];
            s->history = ids;
            s->n = c;
            s->text = run->texts ? run->texts[c - 1] : NULL;
            for (int st = 0; st < k; st++) {
                int pos = c + st + 1; /* 1-based call predicted by step st + 1 */
                s->labels[st] = pos <= run->n ? ids[pos - 1] : (pos == run->n + 1 && run->ended ? V : -1);
            }
            if (c >= 2) t->counts[(size_t)ids[c - 2] * (V + 1) + ids[c - 1]] += 1.0;
        }
        base += (size_t)(run->n > 0 ? run->n : 0);
    }
}

/* Mean and deviation of every hidden-state dimension over the calls that have one. */
static int text_stats(const PredictorRun *runs, int n_runs, int D, TrainSet *t, BraidError *err) {
    double *sum = calloc((size_t)D, sizeof *sum), *sq = calloc((size_t)D, sizeof *sq);
    t->mean = malloc((size_t)D * sizeof *t->mean);
    t->std = malloc((size_t)D * sizeof *t->std);
    if (!sum || !sq || !t->mean || !t->std) {
        free(sum);
        free(sq);
        return braid_error_set(err, "graph predictor: out of memory");
    }
    long n = 0;
    for (int r = 0; r < n_runs; r++)
        for (int c = 0; runs[r].texts && c < runs[r].n; c++) {
            const float *x = runs[r].texts[c];
            if (!x) continue;
            n++;
            for (int i = 0; i < D; i++) sum[i] += x[i], sq[i] += (double)x[i] * x[i];
        }
    for (int i = 0; i < D; i++) {
        double m = n ? sum[i] / n : 0, var = n ? sq[i] / n - m * m : 1;
        t->mean[i] = (float)m;
        t->std[i] = (float)sqrt(var > 0 ? var : 0);
    }
    free(sum);
    free(sq);
    if (n == 0) return braid_error_set(err, "graph predictor: hidden states of width %d asked for, but no call has one", D);
    return 0;
}

/* Moves the samples of every hold_out-th run behind the others: [0, *n_train) train, the rest
 * validate. Samples of one run stay together, so validation measures unseen workflows. */
static void split_runs(const PredictorRun *runs, int n_runs, int hold_out, TrainSet *t, int *n_train) {
    *n_train = t->n_samples;
    if (hold_out <= 1 || n_runs < 10) return;
    GraphSample *sorted = malloc((size_t)t->n_samples * sizeof *sorted);
    if (!sorted) return; /* no split: train on everything, without early stopping */
    int out = 0;
    for (int held_pass = 0; held_pass < 2; held_pass++) { /* training runs first, then the held-out ones */
        if (held_pass) *n_train = out;
        for (int r = 0, at = 0; r < n_runs; r++) {
            int n = runs[r].n > 0 ? runs[r].n : 0, held = r % hold_out == hold_out - 1;
            if (held == held_pass) memcpy(sorted + out, t->samples + at, (size_t)n * sizeof *sorted), out += n;
            at += n;
        }
    }
    memcpy(t->samples, sorted, (size_t)t->n_samples * sizeof *sorted);
    free(sorted);
}

int agent_predictor_train_graph(AgentPredictor *p, const PredictorRun *runs, int n_runs, GraphTrainOptions *opt, BraidError *err) {
    if (agent_predictor_kind(p) == PREDICTOR_MARKOV1)
        return braid_error_set(err, "graph predictor: needs a Markov-2 predictor's counts beside it, not Markov-1");
    int V = agent_predictor_n_agents(p), k = opt->k > 0 ? opt->k : 4;
    if (V < 1) return braid_error_set(err, "graph predictor: the predictor has observed no agent");
    TrainSet t = {0};
    GraphModel *g = NULL;
    int rc = build_ids(p, runs, n_runs, &t, err);
    if (!rc && !(t.counts = calloc((size_t)(V + 1) * (V + 1), sizeof *t.counts)))
        rc = braid_error_set(err, "graph predictor: out of memory for %d agents", V);
    if (!rc) build_samples(runs, n_runs, V, k, &t);
    if (!rc && opt->text_dim > 0) rc = text_stats(runs, n_runs, opt->text_dim, &t, err);
    GraphModelShape shape = opt->shape;
    shape.n_agents = V;
    shape.text_dim = opt->text_dim > 0 ? opt->text_dim : 0;
    shape.k = k;
    if (!rc) rc = graph_model_create(&g, &shape, opt->train.seed, err);
    if (!rc) rc = graph_model_set_adjacency(g, t.counts, err);
    if (!rc && shape.text_dim) rc = graph_model_set_text_norm(g, t.mean, t.std, err);
    if (!rc && shape.text_dim == 0)
        for (int i = 0; i < t.n_samples; i++) t.samples[i].text = NULL;
    int n_train = t.n_samples;
    if (!rc) split_runs(runs, n_runs, opt->hold_out ? opt->hold_out : 5, &t, &n_train);
    opt->train.valid = n_train < t.n_samples ? t.samples + n_train : NULL;
    opt->train.n_valid = t.n_samples - n_train;
    if (!rc) rc = graph_model_train(g, t.samples, n_train, &opt->train, err);
    opt->train.valid = NULL; /* it pointed into this call's samples */
    if (!rc) rc = agent_predictor_attach_graph(p, g, err);
    if (rc) graph_model_free(g);
    train_set_free(&t);
    return rc;
}
