/*
 * bench_predictor — what the next-agent predictors (src/predict/agent_predictor.h) cost: Markov-1,
 * Markov-2, and the graph predictor (graph_model.h) without and with a 576-value hidden state (the
 * default model's width; random values: only the cost is measured, its training is cut to 2 epochs):
 * a K-step forecast for a batch of workflows (PBKV's predictor: 1.56 ms per 1,024 on a GPU) and
 * one observed transition. The predictor is trained on synthetic workflows from a random
 * second-order chain over A agents (mostly a fixed successor of the last two agents, some noise,
 * END with probability 1/12 per step), then predicts after random prefixes of fresh workflows.
 *   bench_predictor [--batch 1024] [--k 4] [--train 2000] [--repeats 5] [--agents 5,16,64]
 * Prints one JSON line per (kind, agents) on stdout: microseconds per workflow forecast (best of
 * --repeats passes over the batch), the batch in milliseconds, and microseconds per observe.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "predict/agent_predictor.h"
#include "predict/graph_train.h"

#define TEXT_DIM 576
enum { KIND_GRAPH_TEXT = 4 };

#define MAX_LEN 40
#define MAX_CONFIGS 8

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* One workflow of the synthetic chain: agent ids into out (returns the length; ends with END). */
static int gen_workflow(int n_agents, uint64_t *rng, int *out) {
    int n = 0, prev = n_agents, cur = n_agents; /* n_agents = START */
    while (n < MAX_LEN) {
        if (n > 0 && rng_unit(rng) < 1.0 / 12) break;
        double u = rng_unit(rng);
        int next;
        if (u < 0.75) next = (int)(((unsigned)prev * 31u + (unsigned)cur * 17u + 7u) % (unsigned)n_agents);
        else if (u < 0.9) next = (cur * 5 + 3) % n_agents;
        else next = (int)(rng_next(rng) % (uint64_t)n_agents);
        out[n++] = next;
        prev = cur;
        cur = next;
    }
    return n;
}

/* Attaches a graph model trained briefly on fresh workflows (the cost of a forecast does not
 * depend on how well it was trained). */
static int train_graph(AgentPredictor *p, char **names, int n_agents, int n_train, int text_dim) {
    PredictorRun *runs = calloc((size_t)n_train, sizeof *runs);
    const char **agents = malloc((size_t)n_train * MAX_LEN * sizeof *agents);
    const float **texts = malloc((size_t)n_train * MAX_LEN * sizeof *texts);
    float *values = malloc((size_t)TEXT_DIM * sizeof *values);
    if (!runs || !agents || !texts || !values) return fprintf(stderr, "bench_predictor: out of memory\n"), -1;
    uint64_t rng = 7 + (uint64_t)n_agents;
    for (int i = 0; i < TEXT_DIM; i++) values[i] = (float)rng_unit(&rng);
    int wf[MAX_LEN];
    for (int w = 0; w < n_train; w++) {
        int n = gen_workflow(n_agents, &rng, wf);
        for (int i = 0; i < n; i++) agents[(size_t)w * MAX_LEN + i] = names[wf[i]], texts[(size_t)w * MAX_LEN + i] = values;
        runs[w] = (PredictorRun){.agents = agents + (size_t)w * MAX_LEN, .texts = texts + (size_t)w * MAX_LEN, .n = n, .ended = 1};
    }
    BraidError err;
    GraphTrainOptions opt = {.k = 4, .text_dim = text_dim, .train = {.epochs = 2, .seed = 1}};
    int rc = agent_predictor_train_graph(p, runs, n_train, &opt, &err);
    if (rc) fprintf(stderr, "bench_predictor: %s\n", err.msg);
    free(runs);
    free(agents);
    free(texts);
    free(values);
    return rc;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"batch", required_argument, 0, 'b'}, {"k", required_argument, 0, 'k'},
                                         {"train", required_argument, 0, 't'}, {"repeats", required_argument, 0, 'r'},
                                         {"agents", required_argument, 0, 'a'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int batch = 1024, k = 4, n_train = 2000, repeats = 5, c;
    int agent_counts[MAX_CONFIGS] = {5, 16, 64}, n_configs = 3;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': batch = atoi(optarg); break;
        case 'k': k = atoi(optarg); break;
        case 't': n_train = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        case 'a': {
            n_configs = 0;
            char *copy = strdup(optarg), *save = NULL;
            for (char *tok = strtok_r(copy, ",", &save); tok && n_configs < MAX_CONFIGS; tok = strtok_r(NULL, ",", &save))
                if (atoi(tok) > 0) agent_counts[n_configs++] = atoi(tok);
            free(copy);
            break;
        }
        case 'h': printf("usage: bench_predictor [--batch N] [--k K] [--train N] [--repeats R] [--agents 5,16,64]\n"); return 0;
        default: return 2;
        }
    }
    if (batch < 1 || k < 1 || k > 64 || n_train < 1 || repeats < 1 || !n_configs) {
        fprintf(stderr, "bench_predictor: bad arguments\n");
        return 2;
    }
    BraidError err;
    for (int ci = 0; ci < n_configs; ci++) {
        int n_agents = agent_counts[ci];
        char **names = malloc((size_t)n_agents * sizeof *names);
        for (int i = 0; i < n_agents; i++) {
            names[i] = malloc(32);
            snprintf(names[i], 32, "agent_%d", i);
        }
        /* The histories the batch predicts after: a random prefix of a fresh workflow each. */
        const char **hist = malloc((size_t)batch * MAX_LEN * sizeof *hist);
        int *hist_n = malloc((size_t)batch * sizeof *hist_n);
        uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)n_agents;
        int wf[MAX_LEN];
        for (int b = 0; b < batch; b++) {
            int n = gen_workflow(n_agents, &rng, wf);
            hist_n[b] = n ? 1 + (int)(rng_next(&rng) % (uint64_t)n) : 0;
            for (int i = 0; i < hist_n[b]; i++) hist[(size_t)b * MAX_LEN + i] = names[wf[i]];
        }
        float *text = malloc((size_t)batch * TEXT_DIM * sizeof *text);
        for (size_t i = 0; i < (size_t)batch * TEXT_DIM; i++) text[i] = (float)rng_unit(&rng) - 0.5f;
        for (int kind = PREDICTOR_MARKOV1; kind <= KIND_GRAPH_TEXT; kind++) {
            AgentPredictor *p;
            if (agent_predictor_create(&p, kind == PREDICTOR_MARKOV1 ? PREDICTOR_MARKOV1 : PREDICTOR_MARKOV2, &err)) {
                fprintf(stderr, "bench_predictor: %s\n", err.msg);
                return 1;
            }
            /* Training, timing every observe. */
            uint64_t train_rng = 42 + (uint64_t)n_agents;
            const char *seq[MAX_LEN];
            long observes = 0;
            double t0 = braid_now_seconds();
            for (int w = 0; w < n_train; w++) {
                int n = gen_workflow(n_agents, &train_rng, wf);
                for (int i = 0; i < n; i++) seq[i] = names[wf[i]];
                for (int i = 0; i <= n; i++) {
                    if (agent_predictor_observe(p, seq, i, i < n ? seq[i] : NULL, &err)) {
                        fprintf(stderr, "bench_predictor: %s\n", err.msg);
                        return 1;
                    }
                    observes++;
                }
            }
            double observe_us = 1e6 * (braid_now_seconds() - t0) / (double)observes;
            if (kind >= PREDICTOR_GRAPH && train_graph(p, names, n_agents, n_train, kind == KIND_GRAPH_TEXT ? TEXT_DIM : 0)) return 1;
            /* The batch forecast: best of `repeats` passes, one reused prediction per workflow as a
             * server would keep one per active workflow slot. */
            AgentPrediction *preds = calloc((size_t)batch, sizeof *preds);
            double best = 1e30, checksum = 0;
            for (int r = 0; r < repeats + 1; r++) { /* pass 0 warms up (allocates the buffers) */
                double t1 = braid_now_seconds();
                for (int b = 0; b < batch; b++)
                    if (agent_predictor_predict_text(p, hist + (size_t)b * MAX_LEN, hist_n[b],
                                                     kind == KIND_GRAPH_TEXT ? text + (size_t)b * TEXT_DIM : NULL, k, &preds[b], &err)) {
                        fprintf(stderr, "bench_predictor: %s\n", err.msg);
                        return 1;
                    }
                double t = braid_now_seconds() - t1;
                if (r > 0 && t < best) best = t;
            }
            for (int b = 0; b < batch; b++) {
                checksum += preds[b].p_end[k - 1];
                agent_prediction_free(&preds[b]);
            }
            free(preds);
            printf("{\"bench\":\"predictor\",\"kind\":\"%s\",\"agents\":%d,\"train_workflows\":%d,\"transitions\":%llu,\"k\":%d,"
                   "\"batch\":%d,\"predict_us_per_workflow\":%.3f,\"predict_ms_per_batch\":%.4f,\"observe_us\":%.3f,"
                   "\"mean_p_end_k\":%.4f}\n",
                   kind == PREDICTOR_MARKOV1 ? "markov1" : kind == PREDICTOR_MARKOV2 ? "markov2" : kind == PREDICTOR_GRAPH ? "graph" : "graph+hidden",
                   n_agents, n_train,
                   (unsigned long long)agent_predictor_n_transitions(p), k, batch, 1e6 * best / batch, 1e3 * best, observe_us,
                   checksum / batch);
            agent_predictor_free(p);
        }
        for (int i = 0; i < n_agents; i++) free(names[i]);
        free(names);
        free(hist);
        free(hist_n);
        free(text);
    }
    return 0;
}
