/* braid train-predictor — learns the Markov next-agent predictor (src/predict) from request traces. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"
#include "common/strmap.h"
#include "predict/agent_predictor.h"
#include "predict/graph_model.h"
#include "predict/graph_train.h"
#include "sim/trace.h"

#define MAX_TRACES 256
#define MAX_REPORT_K 64

static const char train_usage[] =
    "usage: braid train-predictor --traces A.jsonl [B.jsonl ...] --out PATH [--kind markov1|markov2|graph] [--k K]\n"
    "                             [--eval C.jsonl [D.jsonl ...]] [--alpha A] [--json]\n"
    "                             [--hidden HA.jsonl [HB.jsonl ...]] [--eval-hidden HC.jsonl ...] [--epochs N] [--seed S]\n"
    "  Learns which agent a workflow calls next from request traces (docs/TRACE_FORMAT.md) and saves the\n"
    "  predictor (src/predict/agent_predictor.h) to PATH. Each trace's requests are replayed in arrival\n"
    "  order per workflow: the workflow's agents so far, then the agent it called; a workflow_end line\n"
    "  is the transition to END. Only what a server sees is used: workflow id, agent name, order and\n"
    "  time. Requests without a workflow id are skipped; a workflow called again after its end line\n"
    "  starts a new run; one with no end line contributes no END.\n"
    "  --traces   training traces (one or more)\n"
    "  --out      the predictor file to write (versioned binary)\n"
    "  --kind     markov1, markov2 (default; both back off to lower orders) or graph: PBKV's learned\n"
    "             predictor (GraphSAGE over the agent transition graph, attention over the workflow's\n"
    "             calls, the prefill's hidden state when the traces have them, one head for K steps),\n"
    "             trained here in C with Adam; it keeps Markov-2 counts for first calls\n"
    "  --hidden   hidden-state files (braid batch --hidden-out), one per --traces file in the same\n"
    "             order; traces written by braid serve carry them inline. With hidden states the graph\n"
    "             predictor reads each call's state; without, it learns from agent order alone\n"
    "  --eval-hidden  the same for the --eval traces\n"
    "  --epochs   graph training epochs (default 40); --seed its seed (default 1)\n"
    "  --k        horizon of the accuracy report, and the graph head's steps (default 4, at most 16\n"
    "             for graph)\n"
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
    const float **texts; /* hidden state of each call, or NULL entries */
    int n, cap, ended;
} Run;

typedef struct {
    Run *runs;
    int n, cap;
    int requests, skipped, ended, stray_ends;
} RunSet;

static void runs_free(RunSet *rs) {
    for (int i = 0; i < rs->n; i++) free(rs->runs[i].agents), free(rs->runs[i].texts);
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
            if (a) run->agents = a;
            const float **x = realloc(run->texts, (size_t)cap * sizeof *x);
            if (x) run->texts = x;
            if (!a || !x) {
                rc = -1;
                break;
            }
            run->cap = cap;
        }
        run->texts[run->n] = q->hidden;
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
        if (agent_predictor_score_workflow_text(p, rs->runs[i].agents, rs->runs[i].texts, rs->runs[i].n, rs->runs[i].ended, k, acc->hits,
                                                acc->total, pred, err))
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
static int load_runs(char **paths, char **hidden, int n, Trace *traces, RunSet *runs) {
    for (int i = 0; i < n; i++) {
        BraidError err;
        int matched = 0;
        if (trace_load(paths[i], &traces[i], &err) || (hidden && trace_attach_hidden(&traces[i], hidden[i], &matched, &err))) {
            fprintf(stderr, "braid train-predictor: %s\n", err.msg);
            for (int j = 0; j <= i; j++) trace_free(&traces[j]); /* a failed load left its trace empty */
            return -1;
        }
        if (hidden)
            fprintf(stderr, "[train-predictor] %s: hidden states for %d of %d requests (%d values each)\n", paths[i], matched, traces[i].n,
                    trace_hidden_dim(&traces[i]));
        if (build_runs(&traces[i], &runs[i])) {
            fprintf(stderr, "braid train-predictor: %s: out of memory\n", paths[i]);
            for (int j = 0; j <= i; j++) trace_free(&traces[j]);
            return -1;
        }
    }
    return 0;
}

static const char *kind_name(const AgentPredictor *p) {
    PredictorKind k = agent_predictor_kind(p);
    return k == PREDICTOR_GRAPH ? "graph" : k == PREDICTOR_MARKOV1 ? "markov1" : "markov2";
}

static void report_epoch(void *ctx, int epoch, int epochs, double loss, double valid_loss) {
    (void)ctx;
    if (epoch != 1 && epoch != epochs && epoch % 10 != 0) return;
    if (valid_loss == valid_loss)
        fprintf(stderr, "[train-predictor] graph epoch %d/%d: mean cross-entropy %.4f, held-out runs %.4f\n", epoch, epochs, loss,
                valid_loss);
    else
        fprintf(stderr, "[train-predictor] graph epoch %d/%d: mean cross-entropy %.4f\n", epoch, epochs, loss);
}

/* Trains the graph model on every run of the training traces and attaches it to p. */
static int train_graph(AgentPredictor *p, const Trace *traces, const RunSet *sets, int n, int k, int epochs, uint64_t seed) {
    int dim = 0, n_runs = 0;
    for (int t = 0; t < n; t++) {
        int d = trace_hidden_dim(&traces[t]);
        if (d && dim && d != dim) {
            fprintf(stderr, "braid train-predictor: hidden states of %d values in one trace and %d in another\n", dim, d);
            return -1;
        }
        if (d) dim = d;
        n_runs += sets[t].n;
    }
    PredictorRun *runs = calloc((size_t)n_runs, sizeof *runs);
    if (!runs) {
        fprintf(stderr, "braid train-predictor: out of memory\n");
        return -1;
    }
    int at = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < sets[t].n; r++) {
            const Run *run = &sets[t].runs[r];
            runs[at++] = (PredictorRun){.agents = run->agents, .texts = run->texts, .n = run->n, .ended = run->ended};
        }
    GraphTrainOptions opt = {.k = k, .text_dim = dim, .train = {.epochs = epochs, .seed = seed, .progress = report_epoch}};
    fprintf(stderr, "[train-predictor] training the graph predictor: %d runs, K = %d, %s\n", n_runs, k,
            dim ? "with the prefill's hidden states" : "without hidden states (agent order only)");
    BraidError err;
    int rc = agent_predictor_train_graph(p, runs, n_runs, &opt, &err);
    if (!rc && opt.train.best_epoch < epochs)
        fprintf(stderr, "[train-predictor] kept epoch %d of %d: the lowest loss on the training runs held out (1 in 5)\n",
                opt.train.best_epoch, epochs);
    if (rc) fprintf(stderr, "braid train-predictor: %s\n", err.msg);
    else if (dim)
        fprintf(stderr, "[train-predictor] graph predictor: %zu parameters, hidden states of %d values\n",
                graph_model_n_params(agent_predictor_graph(p)), dim);
    else
        fprintf(stderr, "[train-predictor] graph predictor: %zu parameters\n", graph_model_n_params(agent_predictor_graph(p)));
    free(runs);
    return rc;
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
    char *train_paths[MAX_TRACES], *eval_paths[MAX_TRACES], *train_hidden[MAX_TRACES], *eval_hidden[MAX_TRACES];
    int n_train = 0, n_eval = 0, n_train_hidden = 0, n_eval_hidden = 0, k = 4, json = 0, graph = 0, epochs = 40;
    uint64_t seed = 1;
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
        } else if (!strcmp(a, "--hidden")) {
            if (take_list(argc, argv, &i, train_hidden, &n_train_hidden, "--hidden")) return 2;
        } else if (!strcmp(a, "--eval-hidden")) {
            if (take_list(argc, argv, &i, eval_hidden, &n_eval_hidden, "--eval-hidden")) return 2;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--out") || !strcmp(a, "--kind") || !strcmp(a, "--k") || !strcmp(a, "--alpha") || !strcmp(a, "--epochs") ||
                   !strcmp(a, "--seed")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "braid train-predictor: %s needs a value\n%s", a, train_usage);
                return 2;
            }
            const char *val = argv[++i];
            if (!strcmp(a, "--out")) out_path = val;
            else if (!strcmp(a, "--kind")) {
                if (!strcmp(val, "markov1")) kind = PREDICTOR_MARKOV1;
                else if (!strcmp(val, "markov2")) kind = PREDICTOR_MARKOV2;
                else if (!strcmp(val, "graph")) kind = PREDICTOR_MARKOV2, graph = 1;
                else {
                    fprintf(stderr, "braid train-predictor: unknown --kind '%s' (markov1, markov2 or graph)\n", val);
                    return 2;
                }
            } else if (!strcmp(a, "--epochs")) {
                if (cli_parse_int("--epochs", val, 1, 100000, &v)) return 2;
                epochs = (int)v;
            } else if (!strcmp(a, "--seed")) {
                if (cli_parse_int("--seed", val, 0, 1L << 62, &v)) return 2;
                seed = (uint64_t)v;
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
    if ((n_train_hidden && n_train_hidden != n_train) || (n_eval_hidden && n_eval_hidden != n_eval)) {
        fprintf(stderr, "braid train-predictor: give one hidden-state file per trace (--hidden %d for --traces %d, --eval-hidden %d for --eval %d)\n",
                n_train_hidden, n_train, n_eval_hidden, n_eval);
        return 2;
    }
    if (graph && k > GRAPH_MODEL_MAX_K) {
        fprintf(stderr, "braid train-predictor: --k %d: the graph predictor's head predicts at most %d steps\n", k, GRAPH_MODEL_MAX_K);
        return 2;
    }

    Trace train[MAX_TRACES], eval[MAX_TRACES];
    RunSet train_runs[MAX_TRACES] = {{0}}, eval_runs[MAX_TRACES] = {{0}};
    if (load_runs(train_paths, n_train_hidden ? train_hidden : NULL, n_train, train, train_runs)) {
        for (int t = 0; t < n_train; t++) runs_free(&train_runs[t]);
        return 1;
    }
    int eval_loaded = 0, rc = 1;
    AgentPredictor *p = NULL;
    AgentPrediction pred = {0};
    BraidError err;
    json_t *report = NULL;
    if (n_eval) {
        if (load_runs(eval_paths, n_eval_hidden ? eval_hidden : NULL, n_eval, eval, eval_runs)) goto done;
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
    if (graph && train_graph(p, train, train_runs, n_train, k, epochs, seed)) goto done;
    if (agent_predictor_save(p, out_path, &err)) {
        fprintf(stderr, "braid train-predictor: %s\n", err.msg);
        goto done;
    }
    fprintf(stderr,
            "[train-predictor] %d trace(s): %d requests in %d workflow runs (%d ended)%s: %llu transitions, %d agents, %s "
            "(alpha %g) -> %s\n",
            n_train, requests, workflows, ended, skipped ? ", some requests without a workflow id skipped" : "",
            (unsigned long long)agent_predictor_n_transitions(p), agent_predictor_n_agents(p),
            kind_name(p), alpha, out_path);
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
        report = json_pack("{s:s, s:s, s:f, s:I, s:i, s:i, s:i, s:o}", "out", out_path, "kind", kind_name(p),
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
