/*
 * Fuzz target for predictor files (agent_predictor_load, src/predict/agent_predictor.c: Markov-1/2
 * counts and the graph model, with their checksum): the input is loaded as a predictor file. An
 * accepted file must give a predictor whose agents have names and indexes that agree, that
 * forecasts (every probability finite in [0, 1]) after each agent and after none, and that saves
 * and loads back with the same agents; a refused one must say why. Each input is loaded twice:
 * as it is, and with its trailing checksum recomputed (FNV-1a-64 of the bytes before it, the
 * format's rule), so mutations get past the checksum into the parser. Any broken promise calls
 * abort(). Replayed over corpus_predictor/ (files `braid train-predictor` wrote) plus mutations in
 * every CI run.
 */
#include "fuzz_input_file.h"

#include <math.h>
#include <string.h>

#include "predict/agent_predictor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise: say which, then abort (the fuzzer keeps the input). */
static void require(int ok, const char *promise, const char *detail) {
    if (ok) return;
    fprintf(stderr, "fuzz_predictor: broken promise: %s (%s)\n", promise, detail ? detail : "");
    abort();
}

static void check_prediction(const AgentPredictor *p, const AgentPrediction *pred) {
    char detail[96];
    for (int i = 0; i < pred->k * pred->n_agents; i++) {
        snprintf(detail, sizeof detail, "kind %d, alpha %g, prob %g", (int)agent_predictor_kind(p), agent_predictor_alpha(p), pred->prob[i]);
        require(pred->prob[i] >= 0.0f && pred->prob[i] <= 1.001f, "a forecast probability in [0, 1]", detail);
    }
    for (int s = 0; s < pred->k; s++)
        require(pred->p_end[s] >= 0.0f && pred->p_end[s] <= 1.001f, "an end probability in [0, 1]", NULL);
}

static void check_predictor(const AgentPredictor *p) {
    int n = agent_predictor_n_agents(p);
    require(n >= 0 && n <= AGENT_PREDICTOR_MAX_AGENTS, "an agent count within the limit", NULL);
    AgentPrediction pred = {0};
    BraidError err;
    if (agent_predictor_predict(p, NULL, 0, 2, &pred, &err) == 0) check_prediction(p, &pred);
    for (int i = 0; i < n && i < 8; i++) {
        const char *name = agent_predictor_agent_name(p, i);
        require(name && agent_predictor_agent_index(p, name) == i, "agent names and indexes agree", name);
        const char *history[2] = {name, agent_predictor_agent_name(p, (i + 1) % n)};
        if (agent_predictor_predict(p, history, 2, 3, &pred, &err) == 0) check_prediction(p, &pred);
    }
    agent_prediction_free(&pred);
}

/* What a loaded predictor saves must load again, with the same agents. Saving writes a temporary
 * file beside the target and renames it, so this one is a real file (the checksum makes accepted
 * mutations rare, so the disk is seldom touched). */
static void check_round_trip(const AgentPredictor *p) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/braid-fuzz-predictor-%d.bin", (int)getpid());
    BraidError err;
    AgentPredictor *again = NULL;
    err.msg[0] = '\0';
    require(agent_predictor_save(p, path, &err) == 0 && agent_predictor_load(&again, path, &err) == 0,
            "a loaded predictor saves and loads again", err.msg);
    require(agent_predictor_n_agents(again) == agent_predictor_n_agents(p) && agent_predictor_kind(again) == agent_predictor_kind(p),
            "the reloaded predictor has the same agents and kind", NULL);
    agent_predictor_free(again);
    unlink(path);
}

static void load_and_check(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_input_file(data, size, path, sizeof path);
    AgentPredictor *p = NULL;
    BraidError err;
    err.msg[0] = '\0';
    if (agent_predictor_load(&p, path, &err) == 0) {
        check_predictor(p);
        check_round_trip(p);
        agent_predictor_free(p);
    } else {
        require(err.msg[0] != '\0' && !p, "a refused file says why and leaves no predictor", NULL);
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_and_check(data, size);
    if (size < 8) return 0;
    uint8_t *fixed = malloc(size);
    if (!fixed) return 0;
    memcpy(fixed, data, size);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size - 8; i++) h = (h ^ fixed[i]) * 1099511628211ull;
    for (int i = 0; i < 8; i++) fixed[size - 8 + i] = (uint8_t)(h >> (8 * i)); /* little-endian */
    load_and_check(fixed, size);
    free(fixed);
    return 0;
}
