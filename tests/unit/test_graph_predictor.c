/*
 * src/predict graph_model + graph_train: PBKV's learned next-agent predictor.
 * - Gradients: the analytic gradient of every parameter (embeddings and GraphSAGE layers included)
 *   against central finite differences on a small model.
 * - Learning: on workflows whose retry branch is decided by a signal only the hidden state
 *   carries, the graph predictor with hidden states reaches near-perfect step-1 accuracy where
 *   Markov-2 is stuck at a coin flip; trained without hidden states it matches Markov-2.
 * - Forecast shape: unconditional rows plus the END mass sum to 1 at every step; agents interned
 *   after training get 0; a history of unknown agents still forecasts.
 * - Files: save/load keeps every forecast bit for bit; a flipped byte in the graph section is refused.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "predict/agent_predictor.h"
#include "predict/graph_model.h"
#include "predict/graph_train.h"

static double uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static double gauss(uint64_t *s) {
    double u = uniform(s), v = uniform(s);
    return sqrt(-2.0 * log(u > 1e-12 ? u : 1e-12)) * cos(6.283185307179586 * v);
}

/* ---------------------------------------------------------------- gradients */

static void test_gradient_matches_finite_differences(void **state) {
    (void)state;
    GraphModelShape shape = {.n_agents = 3, .dim = 4, .text_dim = 5, .text_out = 3, .mlp = 6, .k = 2, .max_history = 3};
    GraphModel *m;
    BraidError err;
    assert_int_equal(graph_model_create(&m, &shape, 7, &err), 0);
    double counts[16] = {0, 2, 1, 0, 1, 0, 3, 0, 2, 1, 0, 0, 0, 0, 0, 0};
    assert_int_equal(graph_model_set_adjacency(m, counts, &err), 0);
    uint64_t rng = 5;
    int32_t hist[6][5];
    float text[6][5];
    GraphSample samples[6];
    for (int i = 0; i < 6; i++) {
        for (int j = 0; j < 5; j++) hist[i][j] = (int32_t)(uniform(&rng) * 4); /* 3 = UNKNOWN sometimes */
        for (int j = 0; j < 5; j++) text[i][j] = (float)gauss(&rng);
        samples[i] = (GraphSample){.history = hist[i], .n = 1 + i % 5, .text = i % 3 ? text[i] : NULL};
        samples[i].labels[0] = i % 4;               /* 3 = END */
        samples[i].labels[1] = i % 2 ? -1 : (i + 1) % 4;
    }
    size_t np = graph_model_n_params(m);
    float *grad = malloc(np * sizeof *grad), *params = graph_model_params(m);
    double loss;
    assert_int_equal(graph_model_gradient(m, samples, 6, grad, &loss, &err), 0);
    assert_true(loss > 0);
    float *scratch = malloc(np * sizeof *scratch);
    int checked = 0, bad = 0;
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        float keep = params[i];
        const float h = 2e-3f;
        double lp, lm;
        params[i] = keep + h;
        assert_int_equal(graph_model_gradient(m, samples, 6, scratch, &lp, &err), 0);
        params[i] = keep - h;
        assert_int_equal(graph_model_gradient(m, samples, 6, scratch, &lm, &err), 0);
        params[i] = keep;
        double num = (lp - lm) / (2 * h), ana = grad[i];
        double diff = fabs(num - ana), scale = fabs(num) + fabs(ana) + 1e-3;
        if (diff / scale > worst) worst = diff / scale;
        if (diff > 2e-3 && diff / scale > 0.05) bad++; /* a ReLU kink inside the step may flip one */
        checked++;
    }
    fprintf(stderr, "gradient check: %d parameters, %d off, worst relative difference %.3g\n", checked, bad, worst);
    assert_true(bad <= checked / 100 + 1);
    free(scratch);
    free(grad);
    graph_model_free(m);
}

/* ---------------------------------------------------------------- learning */

#define TEXT_DIM 8
#define MAX_CALLS 16

/* planner -> coder -> tester -> (tests failed: coder again, at most 4 times | passed: reviewer)
 * -> END. Whether the tests failed is a coin flip carried only by the tester call's hidden state
 * (dimension 0 shifted by +-1.5, the rest noise). */
typedef struct {
    const char *agents[MAX_CALLS];
    float text[MAX_CALLS][TEXT_DIM];
    const float *texts[MAX_CALLS];
    int n;
} Workflow;

static void make_workflow(uint64_t *rng, Workflow *w) {
    static const char *P = "planner", *C = "coder", *T = "tester", *R = "reviewer";
    w->n = 0;
    w->agents[w->n++] = P;
    for (int retry = 0;; retry++) {
        w->agents[w->n++] = C;
        int failed = retry < 4 && uniform(rng) < 0.5;
        w->agents[w->n++] = T;
        for (int i = 0; i < TEXT_DIM; i++) w->text[w->n - 1][i] = (float)(0.5 * gauss(rng));
        w->text[w->n - 1][0] += failed ? 1.5f : -1.5f;
        if (!failed) break;
    }
    w->agents[w->n++] = R;
    for (int c = 0; c < w->n; c++) {
        if (strcmp(w->agents[c], T) != 0)
            for (int i = 0; i < TEXT_DIM; i++) w->text[c][i] = (float)(0.5 * gauss(rng));
        w->texts[c] = w->text[c];
    }
}

static AgentPredictor *train(Workflow *ws, int n, int text_dim) {
    AgentPredictor *p;
    BraidError err;
    assert_int_equal(agent_predictor_create(&p, PREDICTOR_MARKOV2, &err), 0);
    PredictorRun *runs = calloc((size_t)n, sizeof *runs);
    for (int i = 0; i < n; i++) {
        assert_int_equal(agent_predictor_observe_workflow(p, ws[i].agents, ws[i].n, 1, &err), 0);
        runs[i] = (PredictorRun){.agents = ws[i].agents, .texts = ws[i].texts, .n = ws[i].n, .ended = 1};
    }
    if (text_dim >= 0) {
        GraphTrainOptions opt = {.k = 4, .text_dim = text_dim, .train = {.epochs = 30, .seed = 3}};
        if (agent_predictor_train_graph(p, runs, n, &opt, &err)) fail_msg("%s", err.msg);
        assert_int_equal(agent_predictor_kind(p), PREDICTOR_GRAPH);
    }
    free(runs);
    return p;
}

static double step1_accuracy(const AgentPredictor *p, Workflow *ws, int n) {
    uint64_t hits[4] = {0}, total[4] = {0};
    AgentPrediction pr = {0};
    BraidError err;
    for (int i = 0; i < n; i++)
        assert_int_equal(agent_predictor_score_workflow_text(p, ws[i].agents, ws[i].texts, ws[i].n, 1, 4, hits, total, &pr, &err), 0);
    agent_prediction_free(&pr);
    return (double)hits[0] / (double)total[0];
}

static void test_hidden_state_resolves_the_branch(void **state) {
    (void)state;
    uint64_t rng = 42;
    enum { N_TRAIN = 500, N_TEST = 200 };
    Workflow *train_ws = malloc(N_TRAIN * sizeof *train_ws), *test_ws = malloc(N_TEST * sizeof *test_ws);
    for (int i = 0; i < N_TRAIN; i++) make_workflow(&rng, &train_ws[i]);
    for (int i = 0; i < N_TEST; i++) make_workflow(&rng, &test_ws[i]);
    AgentPredictor *markov = train(train_ws, N_TRAIN, -1), *graph_text = train(train_ws, N_TRAIN, TEXT_DIM),
                   *graph_plain = train(train_ws, N_TRAIN, 0);
    double a_markov = step1_accuracy(markov, test_ws, N_TEST), a_text = step1_accuracy(graph_text, test_ws, N_TEST),
           a_plain = step1_accuracy(graph_plain, test_ws, N_TEST);
    fprintf(stderr, "step-1 accuracy: Markov-2 %.3f, graph %.3f, graph with hidden states %.3f\n", a_markov, a_plain, a_text);
    assert_true(a_text >= 0.95);
    assert_true(a_text > a_markov + 0.08);
    assert_true(fabs(a_plain - a_markov) < 0.04);
    assert_int_equal(agent_predictor_text_dim(graph_text), TEXT_DIM);
    assert_int_equal(agent_predictor_text_dim(graph_plain), 0);
    agent_predictor_free(markov);
    agent_predictor_free(graph_text);
    agent_predictor_free(graph_plain);
    free(train_ws);
    free(test_ws);
}

/* ---------------------------------------------------------------- forecast shape and files */

static AgentPredictor *small_graph(void) {
    uint64_t rng = 9;
    Workflow ws[60];
    for (int i = 0; i < 60; i++) make_workflow(&rng, &ws[i]);
    return train(ws, 60, TEXT_DIM);
}

static void assert_rows_sum_to_one(const AgentPrediction *pr) {
    for (int s = 0; s < pr->k; s++) {
        double sum = pr->p_end[s];
        for (int i = 0; i < pr->n_agents; i++) {
            assert_true(pr->prob[(size_t)s * pr->n_agents + i] >= 0);
            sum += pr->prob[(size_t)s * pr->n_agents + i];
        }
        assert_true(fabs(sum - 1.0) < 1e-4);
        if (s) assert_true(pr->p_end[s] >= pr->p_end[s - 1] - 1e-6);
    }
}

static void test_forecast_shape(void **state) {
    (void)state;
    AgentPredictor *p = small_graph();
    BraidError err;
    AgentPrediction pr = {0};
    const char *h[] = {"planner", "coder", "tester"};
    float x[TEXT_DIM] = {2.0f};
    assert_int_equal(agent_predictor_predict_text(p, h, 3, x, 6, &pr, &err), 0); /* 6 > the head's 4 */
    assert_int_equal(pr.k, 6);
    assert_rows_sum_to_one(&pr);
    assert_int_equal(agent_predictor_predict(p, h, 0, 4, &pr, &err), 0); /* first call: the counts answer */
    assert_rows_sum_to_one(&pr);
    /* An agent interned after training is unknown to the model: 0 for it, still a forecast. */
    assert_int_equal(agent_predictor_observe(p, h, 3, "auditor", &err), 0);
    const char *odd[] = {"auditor", "auditor"};
    assert_int_equal(agent_predictor_predict(p, odd, 2, 4, &pr, &err), 0);
    assert_int_equal(pr.n_agents, 5);
    assert_rows_sum_to_one(&pr);
    for (int s = 0; s < pr.k; s++) assert_true(pr.prob[(size_t)s * pr.n_agents + 4] == 0.0f);
    agent_prediction_free(&pr);
    agent_predictor_free(p);
}

static void test_save_load(void **state) {
    (void)state;
    AgentPredictor *p = small_graph(), *q;
    BraidError err;
    char path[] = "/tmp/braid_graph_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(agent_predictor_save(p, path, &err), 0);
    assert_int_equal(agent_predictor_load(&q, path, &err), 0);
    assert_int_equal(agent_predictor_kind(q), PREDICTOR_GRAPH);
    AgentPrediction a = {0}, b = {0};
    const char *h[] = {"planner", "coder", "tester", "coder", "tester"};
    float x[TEXT_DIM] = {-1.0f, 0.3f};
    for (int n = 1; n <= 5; n++) {
        assert_int_equal(agent_predictor_predict_text(p, h, n, n % 2 ? x : NULL, 4, &a, &err), 0);
        assert_int_equal(agent_predictor_predict_text(q, h, n, n % 2 ? x : NULL, 4, &b, &err), 0);
        assert_memory_equal(a.prob, b.prob, (size_t)a.k * a.n_agents * sizeof(float));
        assert_memory_equal(a.p_end, b.p_end, (size_t)a.k * sizeof(float));
    }
    agent_predictor_free(q);
    /* A flipped byte deep in the graph section: the checksum refuses the file. */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, -200, SEEK_END);
    int c = fgetc(f);
    fseek(f, -200, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
    assert_int_not_equal(agent_predictor_load(&q, path, &err), 0);
    assert_non_null(strstr(err.msg, "checksum"));
    unlink(path);
    agent_prediction_free(&a);
    agent_prediction_free(&b);
    agent_predictor_free(p);
}

static uint64_t fnv1a64(const unsigned char *d, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 1099511628211ull;
    return h;
}

/* A Markov file of format version 1 (no graph section) still loads and predicts the same. */
static void test_version1_file_loads(void **state) {
    (void)state;
    uint64_t rng = 3;
    Workflow ws[20];
    for (int i = 0; i < 20; i++) make_workflow(&rng, &ws[i]);
    AgentPredictor *p = train(ws, 20, -1), *q;
    BraidError err;
    char path[] = "/tmp/braid_graph_v1_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(agent_predictor_save(p, path, &err), 0);
    FILE *f = fopen(path, "rb");
    unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n > 24 && n < sizeof buf);
    /* v2 ends with u64 graph length (0) and the checksum; v1 has neither the length nor version 2. */
    n -= 16;
    buf[8] = 1;
    uint64_t sum = fnv1a64(buf, n);
    for (int i = 0; i < 8; i++) buf[n + i] = (unsigned char)(sum >> (8 * i));
    f = fopen(path, "wb");
    assert_true(fwrite(buf, 1, n + 8, f) == n + 8);
    fclose(f);
    if (agent_predictor_load(&q, path, &err)) fail_msg("%s", err.msg);
    AgentPrediction a = {0}, b = {0};
    const char *h[] = {"planner", "coder"};
    assert_int_equal(agent_predictor_predict(p, h, 2, 4, &a, &err), 0);
    assert_int_equal(agent_predictor_predict(q, h, 2, 4, &b, &err), 0);
    assert_memory_equal(a.prob, b.prob, (size_t)a.k * a.n_agents * sizeof(float));
    agent_prediction_free(&a);
    agent_prediction_free(&b);
    agent_predictor_free(p);
    agent_predictor_free(q);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_matches_finite_differences),
        cmocka_unit_test(test_hidden_state_resolves_the_branch),
        cmocka_unit_test(test_forecast_shape),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_version1_file_loads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
