/* braid train-predictor — learns the Markov next-agent predictor (src/predict) from request traces. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "common/strmap.h"
#include "predict/agent_predictor.h"
#include "sim/trace.h"

#define MAX_TRACES 256
#define MAX_REPORT_K 64

static const char train_usage[] =
    "usage: braid train-predictor --traces A.jsonl [B.jsonl ...] --out PATH [--kind markov1|markov2] [--k K]\n"
    "                             [--eval C.jsonl [D.jsonl ...]] [--alpha A] [--json]\n"
    "  Learns which agent a workflow calls next from request traces (docs/TRACE_FORMAT.md) and saves the\n"
    "  predictor (src/predict/agent_predictor.h) to PATH. Each trace's requests are replayed in arrival\n"
    "  order per workflow: the workflow's agents so far, then the agent it called; a workflow_end line\n"
    "  is the transition to END. Only what a server sees is used: workflow id, agent name, order and\n"
    "  time. Requests without a workflow id are skipped; a workflow called again after its end line\n"
    "  starts a new run; one with no end line contributes no END.\n"
    "  --traces   training traces (one or more)\n"
    "  --out      the predictor file to write (versioned binary)\n"
    "  --kind     markov1 or markov2 (default markov2; both back off to lower orders)\n"
    "  --k        horizon of the accuracy report (default 4)\n"
    "  --eval     held-out traces to report accuracy on (not trained on)\n"
    "  --alpha    add-alpha smoothing pseudo-count per outcome (default 0.01)\n"
    "  --json     also print one JSON object with the figures on stdout\n"
    "  Prints on stderr the transitions, agents and the next-agent accuracy at steps s = 1..K: after\n"
    "  each call of each workflow, the top-1 outcome of the step-s forecast (given the workflow still\n"
    "  runs) against the workflow's actual s-th next call, END counted; steps past a workflow's end\n"
    "  are not scored. Exit status: 0 ok, 1 runtime failure, 2 usage error.\n";

/* One run of a workflow: its agents in arrival order (strings owned by the trace). */
typedef struct {
    const char **agents;
    int n, cap, ended;
} Run;

typedef struct {
    Run *runs;
    int n, cap;
    int requests, skipped, ended, stray_ends;
} RunSet;

static void runs_free(RunSet *rs) {
    for (int i = 0; i < rs->n; i++) free(rs->runs[i].agents);
    free(rs->runs);
    *rs = (RunSet){0};
}

/* Splits a trace into workflow runs, replaying requests and workflow ends in time order (at equal
 * times requests first). Returns 0, or -1 when out of memory. */
static int build_runs(const Trace *tr, RunSet *rs) {
    StrMap *current = strmap_create(256); /* workflow -> run index, -1 after its end */
    if (!current) return -1;
    int i = 0, j = 0, rc = 0;
    while (!rc && (i < tr->n || j < tr->n_ends)) {
        if (j < tr->n_ends && (i == tr->n || tr->ends[j].t < tr->reqs[i].t)) {
            const char *w = tr->ends[j++].workflow;
            int32_t r;
            if (strmap_get(current, w, strlen(w), &r) && r >= 0) {
                rs->runs[r].ended = 1;
                rs->ended++;
                if (strmap_put(current, w, strlen(w), -1)) rc = -1;
            } else
                rs->stray_ends++;
            continue;
        }
        const TraceRequest *q = &tr->reqs[i++];
        if (!q->workflow[0]) {
            rs->skipped++;
            continue;
        }
        int32_t r;
        if (!strmap_get(current, q->workflow, strlen(q->workflow), &r) || r < 0) {
            if (rs->n == rs->cap) {
                int cap = rs->cap ? rs->cap * 2 : 64;
                Run *runs = realloc(rs->runs, (size_t)cap * sizeof *runs);
                if (!runs) {
                    rc = -1;
                    break;
                }
                rs->runs = runs;
                rs->cap = cap;
            }
            r = rs->n++;
            rs->runs[r] = (Run){0};
            if (strmap_put(current, q->workflow, strlen(q->workflow), r)) {
                rc = -1;
                break;
            }
        }
        Run *run = &rs->runs[r];
        if (run->n == run->cap) {
            int cap = run->cap ? run->cap * 2 : 8;
            const char **a = realloc(run->agents, (size_t)cap * sizeof *a);
            if (!a) {
                rc = -1;
                break;
            }
            run->agents = a;
            run->cap = cap;
        }
        run->agents[run->n++] = q->agent;
        rs->requests++;
    }
    strmap_destroy(current);
    return rc;
}

typedef struct {
    uint64_t hits[MAX_REPORT_K], total[MAX_REPORT_K];
} Accuracy;

static int score_runs(const AgentPredictor *p, const RunSet *rs, int k, Accuracy *acc, AgentPrediction *pred, BraidError *err) {
    for (int i = 0; i < rs->n; i++)
        if (agent_predictor_score_workflow(p, rs->runs[i].agents, rs->runs[i].n, rs->runs[i].ended, k, acc->hits, acc->total, pred, err))
            return -1;
    return 0;
}

static void print_accuracy(const char *what, const Accuracy *a, int k) {
    fprintf(stderr, "[train-predictor] %s accuracy (top-1, END counted):", what);
    for (int s = 0; s < k; s++)
        fprintf(stderr, "  s=%d %.3f (%llu)", s + 1, a->total[s] ? (double)a->hits[s] / (double)a->total[s] : 0.0,
                (unsigned long long)a->total[s]);
    fprintf(stderr, "\n");
}

static json_t *accuracy_json(const Accuracy *a, int k) {
    json_t *arr = json_array();
    for (int s = 0; s < k; s++)
        json_array_append_new(arr, a->total[s] ? json_real((double)a->hits[s] / (double)a->total[s]) : json_null());
    return arr;
}

/* Loads each trace and adds its runs (the traces stay loaded: the runs point into them). */
static int load_runs(char **paths, int n, Trace *traces, RunSet *runs) {
    for (int i = 0; i < n; i++) {
        BraidError err;
        if (trace_load(paths[i], &traces[i], &err)) {
            fprintf(stderr, "braid train-predictor: %s\n", err.msg);
            for (int j = 0; j < i; j++) trace_free(&traces[j]);
            return -1;
        }
        if (build_runs(&traces[i], &runs[i])) {
            fprintf(stderr, "braid train-predictor: %s: out of memory\n", paths[i]);
            for (int j = 0; j <= i; j++) trace_free(&traces[j]);
            return -1;
        }
    }
    return 0;
}

/* Collects the values after a list flag (up to the next "--" argument) into list. */
static int take_list(int argc, char **argv, int *i, char **list, int *n, const char *flag) {
    int start = *n;
    while (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) {
        if (*n == MAX_TRACES) {
            fprintf(stderr, "braid train-predictor: at most %d traces per %s\n", MAX_TRACES, flag);
            return -1;
        }
        list[(*n)++] = argv[++*i];
    }
    if (*n == start) {
        fprintf(stderr, "braid train-predictor: %s needs at least one trace file\n%s", flag, train_usage);
        return -1;
    }
    return 0;
}

int cmd_train_predictor(int argc, char **argv) {
    char *train_paths[MAX_TRACES], *eval_paths[MAX_TRACES];
    int n_train = 0, n_eval = 0, k = 4, json = 0;
    const char *out_path = NULL;
    PredictorKind kind = PREDICTOR_MARKOV2;
    double alpha = AGENT_PREDICTOR_DEFAULT_ALPHA;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(train_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--traces")) {
            if (take_list(argc, argv, &i, train_paths, &n_train, "--traces")) return 2;
        } else if (!strcmp(a, "--eval")) {
            if (take_list(argc, argv, &i, eval_paths, &n_eval, "--eval")) return 2;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--out") || !strcmp(a, "--kind") || !strcmp(a, "--k") || !strcmp(a, "--alpha")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "braid train-predictor: %s needs a value\n%s", a, train_usage);
                return 2;
            }
            const char *val = argv[++i];
            if (!strcmp(a, "--out")) out_path = val;
            else if (!strcmp(a, "--kind")) {
                if (!strcmp(val, "markov1")) kind = PREDICTOR_MARKOV1;
                else if (!strcmp(val, "markov2")) kind = PREDICTOR_MARKOV2;
                else {
                    fprintf(stderr, "braid train-predictor: unknown --kind '%s' (markov1 or markov2)\n", val);
                    return 2;
                }
            } else if (!strcmp(a, "--k")) {
                if (cli_parse_int("--k", val, 1, MAX_REPORT_K, &v)) return 2;
                k = (int)v;
            } else if (cli_parse_float("--alpha", val, 1e-9, 1e9, &alpha))
                return 2;
        } else {
            fprintf(stderr, "braid train-predictor: unexpected argument '%s'\n%s", a, train_usage);
            return 2;
        }
    }
    if (!n_train || !out_path) {
        fprintf(stderr, "braid train-predictor: --traces and --out are required\n%s", train_usage);
        return 2;
    }

    Trace train[MAX_TRACES], eval[MAX_TRACES];
    RunSet train_runs[MAX_TRACES] = {{0}}, eval_runs[MAX_TRACES] = {{0}};
    if (load_runs(train_paths, n_train, train, train_runs)) {
        for (int t = 0; t < n_train; t++) runs_free(&train_runs[t]);
        return 1;
    }
    int eval_loaded = 0, rc = 1;
    AgentPredictor *p = NULL;
    AgentPrediction pred = {0};
    BraidError err;
    json_t *report = NULL;
    if (n_eval) {
        if (load_runs(eval_paths, n_eval, eval, eval_runs)) goto done;
        eval_loaded = 1;
    }
    if (agent_predictor_create(&p, kind, &err) || agent_predictor_set_alpha(p, alpha, &err)) {
        fprintf(stderr, "braid train-predictor: %s\n", err.msg);
        goto done;
    }
    int requests = 0, workflows = 0, ended = 0, skipped = 0, stray = 0;
    for (int t = 0; t < n_train; t++) {
        const RunSet *rs = &train_runs[t];
        for (int r = 0; r < rs->n; r++)
            if (agent_predictor_observe_workflow(p, rs->runs[r].agents, rs->runs[r].n, rs->runs[r].ended, &err)) {
                fprintf(stderr, "braid train-predictor: %s: %s\n", train_paths[t], err.msg);
                goto done;
            }
        requests += rs->requests;
        workflows += rs->n;
        ended += rs->ended;
        skipped += rs->skipped;
        stray += rs->stray_ends;
    }
    if (agent_predictor_n_transitions(p) == 0) {
        fprintf(stderr, "braid train-predictor: no workflow transitions in the training traces (%d requests without a workflow id)\n",
                skipped);
        goto done;
    }
    if (agent_predictor_save(p, out_path, &err)) {
        fprintf(stderr, "braid train-predictor: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr,
            "[train-predictor] %d trace(s): %d requests in %d workflow runs (%d ended)%s: %llu transitions, %d agents, %s "
            "(alpha %g) -> %s\n",
            n_train, requests, workflows, ended, skipped ? ", some requests without a workflow id skipped" : "",
            (unsigned long long)agent_predictor_n_transitions(p), agent_predictor_n_agents(p),
            kind == PREDICTOR_MARKOV1 ? "markov1" : "markov2", alpha, out_path);
    if (skipped || stray) fprintf(stderr, "[train-predictor] skipped %d requests without a workflow id, %d end lines without a run\n", skipped, stray);
    Accuracy train_acc, eval_acc;
    memset(&train_acc, 0, sizeof train_acc);
    memset(&eval_acc, 0, sizeof eval_acc);
    for (int t = 0; t < n_train; t++)
        if (score_runs(p, &train_runs[t], k, &train_acc, &pred, &err)) {
            fprintf(stderr, "braid train-predictor: %s\n", err.msg);
            goto done;
        }
    print_accuracy("training", &train_acc, k);
    for (int t = 0; t < n_eval; t++)
        if (score_runs(p, &eval_runs[t], k, &eval_acc, &pred, &err)) {
            fprintf(stderr, "braid train-predictor: %s\n", err.msg);
            goto done;
        }
    if (n_eval) print_accuracy("held-out", &eval_acc, k);
    if (json) {
        report = json_pack("{s:s, s:s, s:f, s:I, s:i, s:i, s:i, s:o}", "out", out_path, "kind", kind == PREDICTOR_MARKOV1 ? "markov1" : "markov2",
                           "alpha", alpha, "transitions", (json_int_t)agent_predictor_n_transitions(p), "agents",
                           agent_predictor_n_agents(p), "workflows", workflows, "k", k, "train_accuracy", accuracy_json(&train_acc, k));
        if (report && n_eval) json_object_set_new(report, "eval_accuracy", accuracy_json(&eval_acc, k));
        char *line = report ? json_dumps(report, JSON_COMPACT) : NULL;
        printf("%s\n", line ? line : "{\"error\":\"out of memory\"}");
        free(line);
    }
    rc = 0;
done:
    json_decref(report);
    agent_prediction_free(&pred);
    agent_predictor_free(p);
    for (int t = 0; t < n_train; t++) {
        runs_free(&train_runs[t]);
        trace_free(&train[t]);
    }
    for (int t = 0; t < n_eval; t++) {
        runs_free(&eval_runs[t]);
        if (eval_loaded) trace_free(&eval[t]);
    }
    return rc;
}
