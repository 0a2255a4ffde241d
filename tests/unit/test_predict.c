/*
 * src/predict: the Markov next-agent predictor and the workflow tracker.
 * Predictor: hand-built transitions with known answers (a deterministic chain, a 50/50 branch,
 * contexts only Markov-2 tells apart), rows + END mass summing to 1, back-off for unseen contexts
 * and names, the empty predictor, save/load round trips and refusal of bad, truncated,
 * bit-flipped and wrong-version files, and training on workflows drawn from a known noisy chain
 * against that chain's own Bayes accuracy. Tracker: history order and window, bounded memory
 * (retired forgotten first, then the least recently called), idle expiry, explicit ends, a
 * 100,000-workflow churn. The workflow forecast's run cap (a run no longer than the previous one).
 * `braid train-predictor` end to end on a small trace file.
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

#include "cli/commands.h"
#include "predict/agent_predictor.h"
#include "predict/workflow_forecast.h"
#include "predict/workflow_tracker.h"

/* ---------------------------------------------------------------- helpers */

static AgentPredictor *make(PredictorKind kind) {
    AgentPredictor *p;
    BraidError err;
    if (agent_predictor_create(&p, kind, &err)) fail_msg("%s", err.msg);
    return p;
}

/* Observes one workflow given as a string of one-letter agents ("ABC"), ended or not. */
static void observe_letters(AgentPredictor *p, const char *letters, int ended, int times) {
    static char names[26][2];
    const char *seq[64];
    int n = (int)strlen(letters);
    for (int i = 0; i < n; i++) {
        names[letters[i] - 'A'][0] = letters[i];
        seq[i] = names[letters[i] - 'A'];
    }
    BraidError err;
    for (int t = 0; t < times; t++)
        if (agent_predictor_observe_workflow(p, seq, n, ended, &err)) fail_msg("%s", err.msg);
}

/* Predicts after the one-letter history; returns the prediction (caller frees). */
static AgentPrediction predict_letters(const AgentPredictor *p, const char *letters, int k) {
    static char names[26][2];
    const char *seq[64];
    int n = (int)strlen(letters);
    for (int i = 0; i < n; i++) {
        names[letters[i] - 'A'][0] = letters[i];
        seq[i] = names[letters[i] - 'A'];
    }
    AgentPrediction pred = {0};
    BraidError err;
    if (agent_predictor_predict(p, seq, n, k, &pred, &err)) fail_msg("%s", err.msg);
    return pred;
}

static float prob_of(const AgentPrediction *pr, int s, const char *agent) {
    for (int i = 0; i < pr->n_agents; i++)
        if (strcmp(pr->agents[i], agent) == 0) return pr->prob[(size_t)(s - 1) * pr->n_agents + i];
    fail_msg("agent %s not in the prediction", agent);
    return -1;
}

static const char *top1_name(const AgentPrediction *pr, int s) {
    int i = agent_prediction_top1(pr, s);
    return i >= 0 ? pr->agents[i] : i == -1 ? "END" : "?";
}

static void assert_rows_sum_to_one(const AgentPrediction *pr) {
    float prev_end = 0;
    for (int s = 1; s <= pr->k; s++) {
        double sum = pr->p_end[s - 1];
        for (int i = 0; i < pr->n_agents; i++) {
            float v = pr->prob[(size_t)(s - 1) * pr->n_agents + i];
            assert_true(v >= 0 && v <= 1);
            sum += v;
        }
        if (fabs(sum - 1) > 1e-5) fail_msg("step %d: row + END mass = %.7f", s, sum);
        assert_true(pr->p_end[s - 1] >= prev_end - 1e-7f);
        prev_end = pr->p_end[s - 1];
    }
}

static void temp_path(char *path) {
    strcpy(path, "/tmp/braid_predict_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

/* ---------------------------------------------------------------- predictor */

static void test_deterministic_chain(void **state) {
    (void)state;
    for (int kind = PREDICTOR_MARKOV1; kind <= PREDICTOR_MARKOV2; kind++) {
        AgentPredictor *p = make((PredictorKind)kind);
        observe_letters(p, "ABC", 1, 10);
        assert_int_equal(agent_predictor_n_agents(p), 3);
        assert_int_equal((int)agent_predictor_n_transitions(p), 40);
        AgentPrediction pr = predict_letters(p, "A", 4);
        assert_int_equal(pr.k, 4);
        assert_int_equal(pr.n_agents, 3);
        assert_rows_sum_to_one(&pr);
        assert_string_equal(top1_name(&pr, 1), "B");
        assert_string_equal(top1_name(&pr, 2), "C");
        assert_string_equal(top1_name(&pr, 3), "END");
        /* (10 + alpha) / (10 + 4 alpha) for each step of the chain */
        double step = (10 + 0.01) / (10 + 0.04);
        assert_float_equal(prob_of(&pr, 1, "B"), step, 1e-5);
        assert_true(prob_of(&pr, 2, "C") > step * step - 1e-5);
        assert_true(pr.p_end[0] < 0.01);
        assert_true(pr.p_end[2] > 0.98); /* END mass ~1 at s = 3 */
        assert_true(pr.p_end[3] > 0.99);
        /* Before the first call: the chain from START. */
        AgentPrediction start = predict_letters(p, "", 4);
        assert_string_equal(top1_name(&start, 1), "A");
        assert_string_equal(top1_name(&start, 2), "B");
        assert_string_equal(top1_name(&start, 3), "C");
        assert_string_equal(top1_name(&start, 4), "END");
        assert_rows_sum_to_one(&start);
        agent_prediction_free(&start);
        agent_prediction_free(&pr);
        agent_predictor_free(p);
    }
}

static void test_branch_fifty_fifty(void **state) {
    (void)state;
    AgentPredictor *p = make(PREDICTOR_MARKOV1);
    observe_letters(p, "AB", 1, 5);
    observe_letters(p, "AC", 1, 5);
    AgentPrediction pr = predict_letters(p, "A", 3);
    double half = (5 + 0.01) / (10 + 0.04);
    assert_float_equal(prob_of(&pr, 1, "B"), half, 1e-6);
    assert_float_equal(prob_of(&pr, 1, "C"), half, 1e-6);
    assert_true(prob_of(&pr, 1, "A") < 0.002);
    assert_true(pr.p_end[1] > 0.99); /* both branches end after one more call */
    assert_rows_sum_to_one(&pr);
    agent_prediction_free(&pr);
    agent_predictor_free(p);
}

static void test_markov2_separates_contexts(void **state) {
    (void)state;
    AgentPredictor *m1 = make(PREDICTOR_MARKOV1), *m2 = make(PREDICTOR_MARKOV2);
    AgentPredictor *both[2] = {m1, m2};
    for (int i = 0; i < 2; i++) {
        observe_letters(both[i], "ABC", 1, 10);
        observe_letters(both[i], "DBE", 1, 10);
    }
    AgentPrediction a2 = predict_letters(m2, "AB", 2), d2 = predict_letters(m2, "DB", 2);
    assert_string_equal(top1_name(&a2, 1), "C");
    assert_true(prob_of(&a2, 1, "C") > 0.99);
    assert_string_equal(top1_name(&d2, 1), "E");
    assert_true(prob_of(&d2, 1, "E") > 0.99);
    assert_string_equal(top1_name(&a2, 2), "END");
    /* Two steps ahead from one call: the pair (A, B) is carried through the propagation. */
    AgentPrediction a1step = predict_letters(m2, "A", 3);
    assert_string_equal(top1_name(&a1step, 2), "C");
    assert_true(prob_of(&a1step, 2, "C") > 0.98);
    assert_true(prob_of(&a1step, 2, "E") < 0.01);
    /* Markov-1 sees only B: C and E are a coin flip. */
    AgentPrediction a1 = predict_letters(m1, "AB", 1);
    assert_float_equal(prob_of(&a1, 1, "C"), prob_of(&a1, 1, "E"), 1e-6);
    assert_float_equal(prob_of(&a1, 1, "C"), 0.5, 0.01);
    AgentPrediction m1step = predict_letters(m1, "A", 2);
    assert_float_equal(prob_of(&m1step, 2, "C"), 0.5, 0.01);
    AgentPrediction *all[] = {&a2, &d2, &a1step, &a1, &m1step};
    for (int i = 0; i < 5; i++) {
        assert_rows_sum_to_one(all[i]);
        agent_prediction_free(all[i]);
    }
    agent_predictor_free(m1);
    agent_predictor_free(m2);
}

static void test_backoff(void **state) {
    (void)state;
    AgentPredictor *p = make(PREDICTOR_MARKOV2);
    observe_letters(p, "ABC", 1, 3);
    observe_letters(p, "D", 0, 1); /* D is known only as a next agent: no context row of its own */
    /* An unseen pair (C, A) backs off to A's Markov-1 row. */
    AgentPrediction pr = predict_letters(p, "CA", 1);
    assert_string_equal(top1_name(&pr, 1), "B");
    assert_float_equal(prob_of(&pr, 1, "B"), (3 + 0.01) / (3 + 0.05), 1e-6);
    agent_prediction_free(&pr);
    /* D has no row: the global outcome frequencies (A 3, B 3, C 3, D 1, END 3 of 13). */
    pr = predict_letters(p, "D", 1);
    double denom = 13 + 0.05;
    assert_float_equal(prob_of(&pr, 1, "A"), (3 + 0.01) / denom, 1e-6);
    assert_float_equal(prob_of(&pr, 1, "D"), (1 + 0.01) / denom, 1e-6);
    assert_float_equal(pr.p_end[0], (3 + 0.01) / denom, 1e-6);
    assert_rows_sum_to_one(&pr);
    /* A name never seen at all: the global frequencies too. */
    const char *unknown[] = {"A", "nobody"};
    BraidError err;
    AgentPrediction u = {0};
    assert_int_equal(agent_predictor_predict(p, unknown, 2, 3, &u, &err), 0);
    assert_float_equal(u.prob[0], pr.prob[0], 1e-7);
    assert_rows_sum_to_one(&u);
    agent_prediction_free(&u);
    agent_prediction_free(&pr);
    /* No data at all: an empty prediction, not an error. */
    AgentPredictor *empty = make(PREDICTOR_MARKOV1);
    AgentPrediction e = {0};
    assert_int_equal(agent_predictor_predict(empty, unknown, 2, 4, &e, &err), 0);
    assert_int_equal(e.n_agents, 0);
    assert_int_equal(e.k, 0);
    assert_int_equal(agent_prediction_top1(&e, 1), -2);
    agent_prediction_free(&e);
    /* Bad arguments are errors with messages. */
    assert_int_equal(agent_predictor_predict(p, unknown, 2, 0, &e, &err), -1);
    assert_non_null(strstr(err.msg, "k = 0"));
    assert_int_equal(agent_predictor_observe(p, NULL, 1, "A", &err), -1);
    assert_int_equal(agent_predictor_set_alpha(p, -1, &err), -1);
    agent_prediction_free(&e);
    agent_predictor_free(empty);
    agent_predictor_free(p);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- a known noisy second-order chain over N_AGENTS agents */
#define N_AGENTS 6
#define P_END 0.15   /* after each call (from the second on) */
#define P_FOLLOW 0.8 /* else: the chain's successor of (previous, last); otherwise uniform */
static const char *CHAIN_NAMES[N_AGENTS] = {"planner", "coder", "tester", "analyzer", "retriever", "writer"};

static int chain_successor(int prev, int cur) { return (prev * 3 + cur * 2 + 1) % N_AGENTS; } /* prev = N_AGENTS: START */

static int chain_workflow(uint64_t *rng, const char **out, int max) {
    int n = 0, prev = N_AGENTS, cur = 0;
    out[n++] = CHAIN_NAMES[0];
    while (n < max && !(rng_unit(rng) < P_END)) {
        int next = rng_unit(rng) < P_FOLLOW ? chain_successor(prev, cur) : (int)(rng_next(rng) % N_AGENTS);
        out[n++] = CHAIN_NAMES[next];
        prev = cur;
        cur = next;
    }
    return n;
}

static int chain_index(const char *name) {
    for (int i = 0; i < N_AGENTS; i++)
        if (strcmp(CHAIN_NAMES[i], name) == 0) return i;
    return -1;
}

static void test_rows_sum_random(void **state) {
    (void)state;
    uint64_t rng = 7;
    const char *wf[64];
    for (int kind = PREDICTOR_MARKOV1; kind <= PREDICTOR_MARKOV2; kind++) {
        AgentPredictor *p = make((PredictorKind)kind);
        BraidError err;
        for (int w = 0; w < 300; w++) {
            int n = chain_workflow(&rng, wf, 64);
            assert_int_equal(agent_predictor_observe_workflow(p, wf, n, w % 5 != 0, &err), 0);
        }
        AgentPrediction pr = {0}; /* reused across calls */
        for (int trial = 0; trial < 300; trial++) {
            int n = chain_workflow(&rng, wf, 64);
            int h = (int)(rng_next(&rng) % (uint64_t)(n + 1));
            if (trial % 7 == 0 && h > 0) wf[h - 1] = "stranger";
            int k = 1 + (int)(rng_next(&rng) % 8);
            assert_int_equal(agent_predictor_predict(p, wf, h, k, &pr, &err), 0);
            assert_int_equal(pr.k, k);
            assert_rows_sum_to_one(&pr);
        }
        agent_prediction_free(&pr);
        agent_predictor_free(p);
    }
}

/* The K-step forecast against the chain rule over one-step forecasts: P(s-th next = w | h) summed
 * over every path of agents (END absorbing), each step a k = 1 prediction after the extended
 * history. Markov-1 propagation is exact; Markov-2 continues pieces of mass under 1e-3 with the
 * last agent only, so it may differ slightly. */
static void path_sum(const AgentPredictor *p, const char **h, int n, double mass, int step, int k, double *ref, double *ref_end,
                     int A) {
    AgentPrediction one = {0};
    BraidError err;
    assert_int_equal(agent_predictor_predict(p, h, n, 1, &one, &err), 0);
    double end = one.p_end[0];
    for (int s = step; s < k; s++) ref_end[s] += mass * end;
    for (int i = 0; i < A; i++) {
        double q = mass * one.prob[i];
        ref[step * A + i] += q;
        if (step + 1 < k) {
            h[n] = agent_predictor_agent_name(p, i);
            path_sum(p, h, n + 1, q, step + 1, k, ref, ref_end, A);
        }
    }
    agent_prediction_free(&one);
}

static void test_multistep_matches_path_sum(void **state) {
    (void)state;
    uint64_t rng = 31;
    const char *wf[64];
    for (int kind = PREDICTOR_MARKOV1; kind <= PREDICTOR_MARKOV2; kind++) {
        AgentPredictor *p = make((PredictorKind)kind);
        BraidError err;
        for (int w = 0; w < 400; w++) {
            int n = chain_workflow(&rng, wf, 64);
            assert_int_equal(agent_predictor_observe_workflow(p, wf, n, 1, &err), 0);
        }
        const int k = 3, A = agent_predictor_n_agents(p);
        double worst = 0;
        AgentPrediction pr = {0};
        for (int trial = 0; trial < 20; trial++) {
            int n = chain_workflow(&rng, wf, 60), h = (int)(rng_next(&rng) % (uint64_t)(n + 1));
            double ref[3 * N_AGENTS] = {0}, ref_end[3] = {0};
            const char *hist[64];
            memcpy(hist, wf, sizeof hist);
            path_sum(p, hist, h, 1.0, 0, k, ref, ref_end, A);
            assert_int_equal(agent_predictor_predict(p, wf, h, k, &pr, &err), 0);
            for (int s = 0; s < k; s++) {
                for (int i = 0; i < A; i++) worst = fmax(worst, fabs(ref[s * A + i] - pr.prob[s * A + i]));
                worst = fmax(worst, fabs(ref_end[s] - pr.p_end[s]));
            }
        }
        fprintf(stderr, "Markov-%d: largest difference from the path sum %.2e\n", kind, worst);
        assert_true(worst < (kind == PREDICTOR_MARKOV1 ? 1e-5 : 5e-3));
        agent_prediction_free(&pr);
        agent_predictor_free(p);
    }
}

static void test_training_reaches_bayes_accuracy(void **state) {
    (void)state;
    uint64_t rng = 12345;
    const char *wf[64];
    AgentPredictor *m1 = make(PREDICTOR_MARKOV1), *m2 = make(PREDICTOR_MARKOV2);
    BraidError err;
    for (int w = 0; w < 2000; w++) {
        int n = chain_workflow(&rng, wf, 64);
        assert_int_equal(agent_predictor_observe_workflow(m1, wf, n, 1, &err), 0);
        assert_int_equal(agent_predictor_observe_workflow(m2, wf, n, 1, &err), 0);
    }
    /* Held-out workflows: the predictors' top-1 at K = 1 and the chain's own Bayes decision (its
     * successor of (previous, last), or END when that is likelier: never here, 0.15 < 0.85 x 0.8). */
    uint64_t hits1[4] = {0}, total1[4] = {0}, hits2[4] = {0}, total2[4] = {0}, bayes = 0, bayes_total = 0;
    AgentPrediction pr = {0};
    for (int w = 0; w < 500; w++) {
        int n = chain_workflow(&rng, wf, 64);
        assert_int_equal(agent_predictor_score_workflow(m1, wf, n, 1, 4, hits1, total1, &pr, &err), 0);
        assert_int_equal(agent_predictor_score_workflow(m2, wf, n, 1, 4, hits2, total2, &pr, &err), 0);
        for (int t = 1; t <= n; t++) {
            int prev = t >= 2 ? chain_index(wf[t - 2]) : N_AGENTS, cur = chain_index(wf[t - 1]);
            int guess = chain_successor(prev, cur), actual = t < n ? chain_index(wf[t]) : -1;
            bayes += guess == actual;
            bayes_total++;
        }
    }
    assert_true(total2[0] == bayes_total && total1[0] == bayes_total);
    double acc1 = (double)hits1[0] / total1[0], acc2 = (double)hits2[0] / total2[0], bayes_acc = (double)bayes / bayes_total;
    fprintf(stderr, "chain: Bayes accuracy %.3f, Markov-2 %.3f %.3f %.3f %.3f, Markov-1 %.3f\n", bayes_acc, acc2,
            (double)hits2[1] / total2[1], (double)hits2[2] / total2[2], (double)hits2[3] / total2[3], acc1);
    assert_true(acc2 >= 0.9 * bayes_acc);
    assert_true(acc1 < acc2); /* the chain depends on the previous agent too */
    /* Step 2 from a Markov-2 is better than chance (1/7) by far. */
    assert_true((double)hits2[1] / total2[1] > 0.4);
    agent_prediction_free(&pr);
    agent_predictor_free(m1);
    agent_predictor_free(m2);
}

static AgentPredictor *trained_chain(PredictorKind kind) {
    AgentPredictor *p = make(kind);
    uint64_t rng = 99;
    const char *wf[64];
    BraidError err;
    for (int w = 0; w < 200; w++) {
        int n = chain_workflow(&rng, wf, 64);
        assert_int_equal(agent_predictor_observe_workflow(p, wf, n, w % 3 != 0, &err), 0);
    }
    return p;
}

static void test_save_load_round_trip(void **state) {
    (void)state;
    char path[64];
    temp_path(path);
    for (int kind = PREDICTOR_MARKOV1; kind <= PREDICTOR_MARKOV2; kind++) {
        AgentPredictor *p = trained_chain((PredictorKind)kind), *q;
        BraidError err;
        assert_int_equal(agent_predictor_set_alpha(p, 0.25, &err), 0);
        if (agent_predictor_save(p, path, &err)) fail_msg("%s", err.msg);
        if (agent_predictor_load(&q, path, &err)) fail_msg("%s", err.msg);
        assert_int_equal(agent_predictor_kind(q), kind);
        assert_true(agent_predictor_alpha(q) == 0.25);
        assert_int_equal(agent_predictor_n_agents(q), agent_predictor_n_agents(p));
        assert_true(agent_predictor_n_transitions(q) == agent_predictor_n_transitions(p));
        for (int i = 0; i < agent_predictor_n_agents(p); i++)
            assert_string_equal(agent_predictor_agent_name(q, i), agent_predictor_agent_name(p, i));
        uint64_t rng = 5;
        const char *wf[64];
        AgentPrediction a = {0}, b = {0};
        for (int trial = 0; trial < 100; trial++) {
            int n = chain_workflow(&rng, wf, 64);
            int h = (int)(rng_next(&rng) % (uint64_t)(n + 1));
            assert_int_equal(agent_predictor_predict(p, wf, h, 5, &a, &err), 0);
            assert_int_equal(agent_predictor_predict(q, wf, h, 5, &b, &err), 0);
            assert_int_equal(a.n_agents, b.n_agents);
            assert_memory_equal(a.prob, b.prob, (size_t)a.k * a.n_agents * sizeof(float));
            assert_memory_equal(a.p_end, b.p_end, (size_t)a.k * sizeof(float));
        }
        /* A loaded predictor keeps learning like the original. */
        observe_letters(p, "AB", 1, 1);
        observe_letters(q, "AB", 1, 1);
        a = (agent_prediction_free(&a), (AgentPrediction){0});
        b = (agent_prediction_free(&b), (AgentPrediction){0});
        assert_int_equal(agent_predictor_predict(p, wf, 1, 3, &a, &err), 0);
        assert_int_equal(agent_predictor_predict(q, wf, 1, 3, &b, &err), 0);
        assert_memory_equal(a.prob, b.prob, (size_t)a.k * a.n_agents * sizeof(float));
        agent_prediction_free(&a);
        agent_prediction_free(&b);
        agent_predictor_free(p);
        agent_predictor_free(q);
    }
    /* The empty predictor round-trips too. */
    AgentPredictor *e = make(PREDICTOR_MARKOV2), *e2;
    BraidError err;
    assert_int_equal(agent_predictor_save(e, path, &err), 0);
    assert_int_equal(agent_predictor_load(&e2, path, &err), 0);
    assert_int_equal(agent_predictor_n_agents(e2), 0);
    agent_predictor_free(e);
    agent_predictor_free(e2);
    unlink(path);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    assert_true(fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}

static void write_all(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* Loading must fail with a message naming the path (and `what`, when given). */
static void expect_refused(const char *path, const char *what) {
    AgentPredictor *q = (AgentPredictor *)(uintptr_t)1;
    BraidError err = {{0}};
    assert_int_equal(agent_predictor_load(&q, path, &err), -1);
    assert_null(q);
    if (!strstr(err.msg, path)) fail_msg("message without the path: %s", err.msg);
    if (what && !strstr(err.msg, what)) fail_msg("expected '%s' in: %s", what, err.msg);
}

static void test_bad_files_refused(void **state) {
    (void)state;
    char good[64], bad[64];
    temp_path(good);
    temp_path(bad);
    AgentPredictor *p = trained_chain(PREDICTOR_MARKOV2);
    BraidError err;
    assert_int_equal(agent_predictor_save(p, good, &err), 0);
    agent_predictor_free(p);
    size_t n;
    unsigned char *b = read_all(good, &n);
    assert_true(n > 100);

    expect_refused("/nonexistent/dir/predictor.bin", "cannot open");
    write_all(bad, b, 0);
    expect_refused(bad, "truncated");
    write_all(bad, (const unsigned char *)"GGUF\3\0\0\0junkjunkjunk", 16);
    expect_refused(bad, "bad magic");
    unsigned char *v = malloc(n);
    memcpy(v, b, n);
    v[8] = 3; /* version 3: from the future */
    write_all(bad, v, n);
    expect_refused(bad, "unsupported file version 3");
    memcpy(v, b, n);
    v[12] = 7; /* kind 7 */
    write_all(bad, v, n);
    expect_refused(bad, "kind");
    /* Every truncation, and a flip of every byte: refused, never a crash. */
    for (size_t len = 0; len < n; len++) {
        write_all(bad, b, len);
        expect_refused(bad, NULL);
    }
    write_all(bad, b, n / 2);
    expect_refused(bad, "truncated");
    for (size_t i = 0; i < n; i++) {
        memcpy(v, b, n);
        v[i] ^= (unsigned char)(1u << (i % 8));
        write_all(bad, v, n);
        expect_refused(bad, NULL);
    }
    memcpy(v, b, n);
    v[n - 1] ^= 0x40; /* the checksum itself */
    write_all(bad, v, n);
    expect_refused(bad, "checksum");
    /* Trailing bytes. */
    unsigned char *longer = malloc(n + 3);
    memcpy(longer, b, n);
    memset(longer + n, 0, 3);
    write_all(bad, longer, n + 3);
    expect_refused(bad, "unexpected bytes");
    free(longer);
    free(v);
    free(b);
    unlink(good);
    unlink(bad);
}

/* ---------------------------------------------------------------- tracker */

static WorkflowTracker *make_tracker(int max, double timeout) {
    WorkflowTracker *t;
    BraidError err;
    if (workflow_tracker_create(&t, max, timeout, &err)) fail_msg("%s", err.msg);
    return t;
}

static void call(WorkflowTracker *t, const char *wf, const char *agent, double now) {
    BraidError err;
    if (workflow_tracker_call(t, wf, agent, now, &err)) fail_msg("%s", err.msg);
}

static void test_tracker_history(void **state) {
    (void)state;
    WorkflowTracker *t = make_tracker(16, 0);
    const char *const *h;
    int n;
    assert_int_equal(workflow_tracker_history(t, "w", &h, &n), 0);
    assert_int_equal(n, 0);
    call(t, "w", "planner", 1);
    call(t, "w", "coder", 2);
    call(t, "v", "other", 2.5);
    assert_int_equal(workflow_tracker_history(t, "w", &h, &n), 1);
    assert_int_equal(n, 2);
    assert_string_equal(h[0], "planner");
    assert_string_equal(h[1], "coder");
    char agent[16];
    for (int i = 0; i < 10; i++) {
        snprintf(agent, sizeof agent, "a%d", i);
        call(t, "w", agent, 3 + i);
    }
    assert_int_equal(workflow_tracker_history(t, "w", &h, &n), 1);
    assert_int_equal(n, WORKFLOW_TRACKER_HISTORY);
    for (int i = 0; i < n; i++) { /* the last 8 of 12, oldest first */
        snprintf(agent, sizeof agent, "a%d", i + 2);
        assert_string_equal(h[i], agent);
    }
    WorkflowInfo info;
    assert_int_equal(workflow_tracker_info(t, "w", &info), 1);
    assert_int_equal((int)info.calls, 12);
    assert_true(info.active && !info.ended);
    assert_float_equal(info.first_seen, 1, 0);
    assert_float_equal(info.last_seen, 12, 0);
    assert_int_equal(workflow_tracker_count(t), 2);
    /* Bad input: errors, not crashes. */
    BraidError err;
    assert_int_equal(workflow_tracker_call(t, NULL, "x", 0, &err), -1);
    char *long_name = malloc(WORKFLOW_TRACKER_MAX_NAME + 2);
    memset(long_name, 'x', WORKFLOW_TRACKER_MAX_NAME + 1);
    long_name[WORKFLOW_TRACKER_MAX_NAME + 1] = '\0';
    assert_int_equal(workflow_tracker_call(t, long_name, "x", 0, &err), -1);
    assert_non_null(strstr(err.msg, "longer than"));
    free(long_name);
    workflow_tracker_free(t);
}

static void test_tracker_end_and_bounded(void **state) {
    (void)state;
    WorkflowTracker *t = make_tracker(4, 0);
    call(t, "w1", "a", 1);
    call(t, "w2", "a", 2);
    call(t, "w3", "a", 3);
    call(t, "w4", "a", 4);
    call(t, "w1", "b", 5); /* w1 is now the most recently called */
    workflow_tracker_end(t, "w3", 6);
    workflow_tracker_end(t, "nobody", 6); /* ignored */
    WorkflowInfo info;
    assert_int_equal(workflow_tracker_info(t, "w3", &info), 1);
    assert_true(!info.active && info.ended);
    assert_float_equal(info.retired_at, 6, 0);
    assert_int_equal(workflow_tracker_active(t), 3);
    /* Full: the retired w3 goes first. */
    call(t, "w5", "a", 7);
    assert_int_equal(workflow_tracker_count(t), 4);
    assert_int_equal(workflow_tracker_info(t, "w3", &info), 0);
    /* Full again with nothing retired: the least recently called active one (w2). */
    call(t, "w6", "a", 8);
    assert_int_equal(workflow_tracker_info(t, "w2", &info), 0);
    assert_int_equal(workflow_tracker_info(t, "w1", &info), 1);
    assert_int_equal(workflow_tracker_info(t, "w4", &info), 1);
    /* An ended workflow called again starts a new run. */
    workflow_tracker_end(t, "w1", 9);
    call(t, "w1", "z", 10);
    const char *const *h;
    int n;
    assert_int_equal(workflow_tracker_history(t, "w1", &h, &n), 1);
    assert_int_equal(n, 1);
    assert_string_equal(h[0], "z");
    assert_int_equal(workflow_tracker_info(t, "w1", &info), 1);
    assert_int_equal((int)info.calls, 1);
    assert_float_equal(info.first_seen, 10, 0);
    /* A forgotten name comes back as a new workflow. */
    call(t, "w2", "again", 11);
    assert_int_equal(workflow_tracker_history(t, "w2", &h, &n), 1);
    assert_int_equal(n, 1);
    assert_int_equal(workflow_tracker_count(t), 4);
    workflow_tracker_free(t);
}

typedef struct {
    int n;
    char names[8][16];
} Retired;

static void on_retired(void *ctx, const char *wf) {
    Retired *r = ctx;
    if (r->n < 8) snprintf(r->names[r->n], sizeof r->names[0], "%s", wf);
    r->n++;
}

static void test_tracker_idle_expiry(void **state) {
    (void)state;
    WorkflowTracker *t = make_tracker(8, 10);
    call(t, "old", "a", 0);
    call(t, "mid", "a", 3);
    call(t, "new", "a", 9);
    Retired r = {0};
    assert_int_equal(workflow_tracker_expire(t, 5, on_retired, &r), 0);
    assert_int_equal(workflow_tracker_expire(t, 13.5, on_retired, &r), 2);
    assert_int_equal(r.n, 2);
    assert_string_equal(r.names[0], "old");
    assert_string_equal(r.names[1], "mid");
    assert_int_equal(workflow_tracker_expire(t, 13.5, on_retired, &r), 0); /* already retired */
    WorkflowInfo info;
    assert_int_equal(workflow_tracker_info(t, "old", &info), 1);
    assert_true(!info.active && !info.ended);
    assert_int_equal(workflow_tracker_active(t), 1);
    /* A call after an idle retirement resumes the workflow: history kept. */
    call(t, "old", "b", 20);
    const char *const *h;
    int n;
    assert_int_equal(workflow_tracker_history(t, "old", &h, &n), 1);
    assert_int_equal(n, 2);
    assert_string_equal(h[1], "b");
    assert_int_equal(workflow_tracker_expire(t, 20, NULL, NULL), 1); /* "new" (idle 11 s) */
    /* Timeout off: nothing expires. */
    WorkflowTracker *never = make_tracker(8, 0);
    call(never, "w", "a", 0);
    assert_int_equal(workflow_tracker_expire(never, 1e9, on_retired, &r), 0);
    workflow_tracker_free(never);
    workflow_tracker_free(t);
}

/* Issue 35: a workflow with a request in flight is busy, not idle. The live pbkv arm lost 5.5
 * points to the simulator because the coordinator retired workflows whose requests waited longer
 * than the idle timeout (and pbkv then evicted their history first). */
static void test_tracker_held_workflow_never_expires(void **state) {
    (void)state;
    WorkflowTracker *t = make_tracker(8, 10);
    call(t, "busy", "a", 0);
    call(t, "idle", "a", 1);
    assert_int_equal(workflow_tracker_hold(t, "busy"), 1);
    assert_int_equal(workflow_tracker_hold(t, "unknown"), 0);
    Retired r = {0};
    /* 30 s after its call, still queued or running: only the unheld one retires. */
    assert_int_equal(workflow_tracker_expire(t, 30, on_retired, &r), 1);
    assert_int_equal(r.n, 1);
    assert_string_equal(r.names[0], "idle");
    WorkflowInfo info;
    assert_int_equal(workflow_tracker_info(t, "busy", &info), 1);
    assert_true(info.active);
    /* Two requests in flight: the first to finish leaves it busy. */
    assert_int_equal(workflow_tracker_hold(t, "busy"), 1);
    workflow_tracker_release(t, "busy", 40);
    assert_int_equal(workflow_tracker_expire(t, 100, on_retired, &r), 0);
    /* The last one finishes at 120: the idle clock starts there, not at the call. */
    workflow_tracker_release(t, "busy", 120);
    assert_int_equal(workflow_tracker_expire(t, 129, on_retired, &r), 0);
    assert_int_equal(workflow_tracker_expire(t, 131, on_retired, &r), 1);
    assert_string_equal(r.names[1], "busy");
    /* Releasing more than was held, or an unknown name, changes nothing. */
    workflow_tracker_release(t, "busy", 132);
    workflow_tracker_release(t, "unknown", 132);
    assert_int_equal(workflow_tracker_info(t, "busy", &info), 1);
    assert_true(!info.active);
    workflow_tracker_free(t);
}

static void test_tracker_churn(void **state) {
    (void)state;
    /* 100,000 workflows through a 1,000-entry tracker, some ended, interleaved: memory stays
     * bounded, and the most recent ones are all still there. */
    WorkflowTracker *t = make_tracker(1000, 0);
    char name[32];
    for (int i = 0; i < 100000; i++) {
        snprintf(name, sizeof name, "wf-%d", i);
        call(t, name, i % 2 ? "coder" : "tester", i);
        if (i % 3 == 0) workflow_tracker_end(t, name, i + 0.5);
        if (i >= 10) { /* a second call to a recent one */
            snprintf(name, sizeof name, "wf-%d", i - 10);
            call(t, name, "analyzer", i + 0.25);
        }
        assert_true(workflow_tracker_count(t) <= 1000);
    }
    /* The recent active ones are all there (ended ones are the first to go when room is needed). */
    WorkflowInfo info;
    int retired = 0;
    for (int i = 100000 - 300; i < 100000; i++) {
        snprintf(name, sizeof name, "wf-%d", i);
        int tracked = workflow_tracker_info(t, name, &info);
        if (i % 3) assert_int_equal(tracked, 1);
        if (tracked && info.active) assert_int_equal((int)info.calls, i < 100000 - 10 ? 2 - (i % 3 == 0) : 1);
        retired += tracked && !info.active;
    }
    assert_true(retired <= 4);
    assert_int_equal(workflow_tracker_count(t), 1000);
    snprintf(name, sizeof name, "wf-%d", 5);
    assert_int_equal(workflow_tracker_info(t, name, &info), 0);
    workflow_tracker_free(t);
}

/* ---------------------------------------------------------------- braid train-predictor */

/* scrambled: every field a real server's predictor must not use (ids, lengths, block hashes,
 * tenant, adapter, and private labels a workload generator could leak) gets other values. */
static void write_trace_fields(const char *path, bool scrambled) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    /* Six workflows, interleaved: planner -> coder -> tester, twice with a retry via analyzer; each
     * workflow_end line half a second after the workflow's last call. */
    static const char *const flows[6][6] = {{"planner", "coder", "tester"},
                                            {"planner", "coder", "tester", "analyzer", "coder", "tester"},
                                            {"planner", "coder", "tester"},
                                            {"planner", "coder", "tester"},
                                            {"planner", "coder", "tester", "analyzer", "coder", "tester"},
                                            {"planner", "coder", "tester"}};
    static const int lens[6] = {3, 6, 3, 3, 6, 3};
    int seq = 0;
    for (int step = 0; step < 6; step++)
        for (int w = 0; w < 6; w++) {
            if (step >= lens[w]) continue;
            double t = step * 10 + w;
            if (scrambled)
                fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%.1f,\"id\":\"other-%d\",\"workflow\":\"w%d\",\"agent\":\"%s\","
                           "\"tenant\":\"t%d\",\"adapter\":\"lora%d\",\"prompt_tokens\":%d,\"output_tokens\":%d,\"block_size\":16,"
                           "\"blocks\":[\"%016x\",\"%016x\"],\"hidden_bugs\":%d,\"difficulty\":\"%s\"}\n",
                        seq, t, 7 * seq, w, flows[w][step], seq % 3, seq % 2, 40 + 3 * seq, 9 + seq, 0xabc + seq, 0xdef + seq,
                        (seq * 5) % 7, seq % 2 ? "hard" : "easy");
            else
                fprintf(f, "{\"type\":\"request\",\"seq\":%d,\"t\":%.1f,\"id\":\"r%d\",\"workflow\":\"w%d\",\"agent\":\"%s\","
                           "\"prompt_tokens\":20,\"output_tokens\":1,\"block_size\":16,\"blocks\":[\"%016x\"]}\n",
                        seq, t, seq, w, flows[w][step], seq + 1);
            seq++;
            if (step == lens[w] - 1) fprintf(f, "{\"type\":\"workflow_end\",\"t\":%.1f,\"workflow\":\"w%d\"}\n", t + 0.5, w);
        }
    /* A request without a workflow id: skipped. */
    fprintf(f, "{\"type\":\"request\",\"seq\":999,\"t\":100,\"id\":\"x\",\"prompt_tokens\":1,\"output_tokens\":1,\"block_size\":16,\"blocks\":[]}\n");
    fclose(f);
}

static void write_trace(const char *path) { write_trace_fields(path, false); }

static int run_cli(int argc, const char **argv) { return cmd_train_predictor(argc, (char **)argv); }

static size_t read_file_bytes(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* The predictor sees only what a server sees: scrambling everything else in the trace changes
 * nothing it learns (the trained files are byte for byte the same). */
/* The forecast's run cap: D, then rounds of R calls each followed by V and F, where after R the
 * model says R or V half and half. A round as long as the previous one (R V F R: 1 then 1) ends
 * there: step 1 is V, not R, and the rows still sum to 1 with END; a shorter previous round is not
 * a cap (R R V F R), nor is the first round (D R: nothing before it); no_run_cap keeps the model's
 * own step 1. */
static const AgentPrediction *forecast_letters(WorkflowForecast *f, const char *workflow, const char *letters) {
    static char names[26][2];
    const AgentPrediction *out = NULL;
    BraidError err;
    for (int i = 0; letters[i]; i++) {
        names[letters[i] - 'A'][0] = letters[i];
        if (workflow_forecast_call(f, workflow, names[letters[i] - 'A'], 1.0 + i, &out, &err)) fail_msg("%s", err.msg);
    }
    return out;
}

static void test_forecast_run_cap(void **state) {
    (void)state;
    for (int cap = 1; cap >= 0; cap--) {
        AgentPredictor *p = make(PREDICTOR_MARKOV1);
        observe_letters(p, "DRVFRV", 1, 20);
        observe_letters(p, "DRRVFRRV", 1, 20);
        observe_letters(p, "DRRVFRV", 1, 20);
        WorkflowForecast f;
        BraidError err;
        WorkflowForecastConfig cfg = {.predictor = p, .horizon = 3, .run_cap = cap};
        if (workflow_forecast_init(&f, &cfg, &err)) fail_msg("%s", err.msg);
        const AgentPrediction *pr = forecast_letters(&f, "w1", "DRVFR");
        if (cap) {
            assert_true(prob_of(pr, 1, "R") == 0.0f);
            assert_true(prob_of(pr, 1, "V") > 0.99f);
            assert_true(prob_of(pr, 2, "F") > 0.3f); /* after V: F or END */
            assert_rows_sum_to_one(pr);
        } else {
            assert_true(prob_of(pr, 1, "R") > 0.3f);
        }
        pr = forecast_letters(&f, "w2", "DRRVFR"); /* previous round 2, this one 1: not at its cap */
        assert_true(prob_of(pr, 1, "R") > 0.3f);
        pr = forecast_letters(&f, "w3", "DR"); /* the first round has no cap */
        assert_true(prob_of(pr, 1, "R") > 0.3f);
        assert_int_equal(f.run_capped, cap ? 1 : 0);
        workflow_forecast_free(&f);
    }
}

static void test_private_fields_change_nothing(void **state) {
    (void)state;
    char plain[64], scrambled[64], out_plain[64], out_scrambled[64];
    temp_path(plain);
    temp_path(scrambled);
    temp_path(out_plain);
    temp_path(out_scrambled);
    write_trace_fields(plain, false);
    write_trace_fields(scrambled, true);
    const char *a[] = {"train-predictor", "--traces", plain, "--out", out_plain, "--kind", "markov2"};
    const char *b[] = {"train-predictor", "--traces", scrambled, "--out", out_scrambled, "--kind", "markov2"};
    assert_int_equal(run_cli(7, a), 0);
    assert_int_equal(run_cli(7, b), 0);
    static unsigned char x[1 << 16], y[1 << 16];
    size_t nx = read_file_bytes(out_plain, x, sizeof x), ny = read_file_bytes(out_scrambled, y, sizeof y);
    assert_true(nx > 0);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, nx);
    unlink(plain);
    unlink(scrambled);
    unlink(out_plain);
    unlink(out_scrambled);
}

static void test_train_predictor_cli(void **state) {
    (void)state;
    char trace[64], out[64];
    temp_path(trace);
    temp_path(out);
    write_trace(trace);
    const char *ok[] = {"train-predictor", "--traces", trace, trace, "--out", out, "--kind", "markov1", "--k", "3", "--eval", trace};
    assert_int_equal(run_cli(12, ok), 0);
    AgentPredictor *p;
    BraidError err;
    if (agent_predictor_load(&p, out, &err)) fail_msg("%s", err.msg);
    assert_int_equal(agent_predictor_kind(p), PREDICTOR_MARKOV1);
    assert_int_equal(agent_predictor_n_agents(p), 4);
    /* 2 traces x (6 workflows x (calls + END)) = 2 x (4 x 4 + 2 x 7) */
    assert_int_equal((int)agent_predictor_n_transitions(p), 60);
    const char *h[] = {"planner"};
    AgentPrediction pr = {0};
    assert_int_equal(agent_predictor_predict(p, h, 1, 3, &pr, &err), 0);
    assert_string_equal(top1_name(&pr, 1), "coder");
    assert_string_equal(top1_name(&pr, 2), "tester");
    assert_string_equal(top1_name(&pr, 3), "END");
    agent_prediction_free(&pr);
    agent_predictor_free(p);

    const char *help[] = {"train-predictor", "--help"};
    assert_int_equal(run_cli(2, help), 0);
    const char *no_out[] = {"train-predictor", "--traces", trace};
    assert_int_equal(run_cli(3, no_out), 2);
    const char *no_traces[] = {"train-predictor", "--traces", "--out", out};
    assert_int_equal(run_cli(4, no_traces), 2);
    const char *bad_kind[] = {"train-predictor", "--traces", trace, "--out", out, "--kind", "markov9"};
    assert_int_equal(run_cli(7, bad_kind), 2);
    const char *bad_k[] = {"train-predictor", "--traces", trace, "--out", out, "--k", "0"};
    assert_int_equal(run_cli(7, bad_k), 2);
    const char *stray[] = {"train-predictor", "--traces", trace, "--out", out, "--bogus"};
    assert_int_equal(run_cli(6, stray), 2);
    const char *missing[] = {"train-predictor", "--traces", "/nonexistent/trace.jsonl", "--out", out};
    assert_int_equal(run_cli(5, missing), 1);
    const char *missing_eval[] = {"train-predictor", "--traces", trace, "--out", out, "--eval", "/nonexistent/e.jsonl"};
    assert_int_equal(run_cli(7, missing_eval), 1);
    const char *bad_out[] = {"train-predictor", "--traces", trace, "--out", "/nonexistent/dir/p.bin"};
    assert_int_equal(run_cli(5, bad_out), 1);
    /* A trace with no workflow ids has nothing to learn. */
    FILE *f = fopen(trace, "w");
    fprintf(f, "{\"type\":\"request\",\"seq\":0,\"t\":0,\"id\":\"x\",\"prompt_tokens\":1,\"output_tokens\":1,\"block_size\":16,\"blocks\":[]}\n");
    fclose(f);
    const char *empty[] = {"train-predictor", "--traces", trace, "--out", out};
    assert_int_equal(run_cli(5, empty), 1);
    unlink(trace);
    unlink(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_private_fields_change_nothing),
        cmocka_unit_test(test_deterministic_chain),
        cmocka_unit_test(test_branch_fifty_fifty),
        cmocka_unit_test(test_markov2_separates_contexts),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_rows_sum_random),
        cmocka_unit_test(test_multistep_matches_path_sum),
        cmocka_unit_test(test_training_reaches_bayes_accuracy),
        cmocka_unit_test(test_save_load_round_trip),
        cmocka_unit_test(test_bad_files_refused),
        cmocka_unit_test(test_tracker_history),
        cmocka_unit_test(test_tracker_end_and_bounded),
        cmocka_unit_test(test_tracker_idle_expiry),
        cmocka_unit_test(test_tracker_held_workflow_never_expires),
        cmocka_unit_test(test_tracker_churn),
        cmocka_unit_test(test_forecast_run_cap),
        cmocka_unit_test(test_train_predictor_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
