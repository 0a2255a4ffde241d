/*
 * braid-bench gen: a discrete-event dry run of a workload. Workflows wait in a queue keyed by the
 * time their previous stage finished; the earliest one runs its next stage (tokenize, time model,
 * synthetic outputs, deliver). Trace lines wait in a second queue keyed by arrival time and are
 * written once no later event can produce an earlier line, so the file comes out sorted while
 * memory stays bounded by the lines in flight.
 */
#include "gen.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_args.h"
#include "cli/cli_common.h"
#include "common/grow.h"
#include "common/timeutil.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "sim/simulator.h"
#include "strbuf.h"
#include "text_gen.h"
#include "sim/trace_writer.h"
#include "workload.h"
#include "wl_rng.h"

static const char gen_usage[] =
    "usage: braid-bench gen --workload NAME --out PATH [options]\n"
    "  Runs a workload dry, without a server, and writes its request trace (docs/TRACE_FORMAT.md) for\n"
    "  `braid sim`. Each call gets a synthetic output of the length the workload expects (seeded\n"
    "  words), which the workload appends to the workflow's history as it would a real one. Every\n"
    "  prompt is tokenized with the model's real tokenizer as the server's /v1/completions does for a\n"
    "  plain prompt; only the tokenizer is read from the GGUF file, no weights.\n"
    "  --workload NAME           the workload (see below)\n"
    "  --out PATH                the trace file to write (JSONL)\n"
    "  --workflows N             workflows to run (default 8)\n"
    "  --concurrency C           at most C workflows active at once; when one ends the next starts\n"
    "                            (default 4)\n"
    "  --seed S                  workload seed (default 1)\n"
    "  --model PATH              GGUF file whose tokenizer to use (default: $BRAID_MODEL or\n"
    "                            " BRAID_DEFAULT_MODEL ")\n"
    "  --block-size B            tokens per hashed block in the trace (default 16)\n"
    "  --context-tokens N        react-lora / mapreduce-lora: shared context size (default 4096)\n"
    "  --fanout N                mapreduce-lora: map agents per workflow (default 4, at most 64)\n"
    "  --scale X                 multiplies every prompt-part and output size, --context-tokens\n"
    "                            included (default 1; small values for quick tests)\n"    "  --noise on|off            codegen / factcheck: off generates the same workflows without their\n"
    "                            noise (wrong difficulty labels, flaky tests, double-checks, give-ups),\n"
    "                            so each branch follows the state the prompts state (default on)\n"
    "  --prefill-ms-per-token X  time model: prefill cost per prompt token (default 2.5, as braid sim)\n"
    "  --decode-ms-per-token Y   time model: decode cost per output token (default 10, as braid sim)\n"
    "  --batch-out PATH          also write every call as a `braid batch` input line (same id, the prompt\n"
    "                            text, max_tokens 1, its labels), in arrival order: `braid batch\n"
    "                            --hidden-out` over it records the prefill hidden states that\n"
    "                            `braid train-predictor --hidden` and `braid sim --hidden` read\n"
    "  --trace-tokens            also write each prompt's token ids in the trace (\"tokens\"), which\n"
    "                            `braid sim --segment-reuse` needs\n"
    "  --help                    this text\n"
    "Time model: a call arrives when its workflow's previous stage finished plus the call's tool\n"
    "delay; it takes prefill x prompt tokens + decode x output tokens; a stage ends when its slowest\n"
    "call does, and the workflow then ends or sends its next stage. Nothing else is modeled: no\n"
    "queueing or batching between workflows and no KV cache (a cache hit would shorten a call), so\n"
    "the arrival times are those of an unloaded server without a cache; replay the trace with\n"
    "`braid sim` for cache behavior. A workflow_end line marks each workflow's end.\n"
    "Progress goes to stderr on long runs, then a one-line summary.\n"
    "Workloads:\n";

typedef struct {
    const char *workload, *out_path, *model_flag, *batch_path;
    WorkloadParams params;
    long concurrency, block_size;
    double prefill_s_per_token, decode_s_per_token;
    bool trace_tokens;
} GenArgs;

/* ---- arguments ---- */

static void print_usage(FILE *f) {
    fputs(gen_usage, f);
    for (const char *const *n = workload_names(); *n; n++) fprintf(f, "  %-15s %s\n", *n, workload_summary(*n));
}

enum {
    O_WORKLOAD = 256,
    O_OUT,
    O_WORKFLOWS,
    O_CONC,
    O_SEED,
    O_MODEL,
    O_BLOCK,
    O_CONTEXT,
    O_FANOUT,
    O_SCALE,
    O_PREFILL,
    O_DECODE,
    O_BATCH_OUT,
    O_TRACE_TOKENS,
    O_NOISE
};

/* The options with a value to check (numbers, --noise). Returns 0, or -1 after printing what is wrong. */
static int parse_number(int opt, const char *arg, GenArgs *a) {
    long v;
    double d;
    switch (opt) {
    case O_WORKFLOWS:
        if (bench_parse_int("gen", "--workflows", arg, 1, 10000000, &v)) return -1;
        a->params.n_workflows = (int)v;
        return 0;
    case O_CONC: return bench_parse_int("gen", "--concurrency", arg, 1, 1000000, &a->concurrency);
    case O_SEED:
        if (bench_parse_int("gen", "--seed", arg, 0, INT64_MAX, &v)) return -1;
        a->params.seed = (uint64_t)v;
        return 0;
    case O_BLOCK: return bench_parse_int("gen", "--block-size", arg, 1, 1024, &a->block_size);
    case O_CONTEXT:
        if (bench_parse_int("gen", "--context-tokens", arg, 1, 1 << 20, &v)) return -1;
        a->params.context_tokens = (int)v;
        return 0;
    case O_FANOUT:
        if (bench_parse_int("gen", "--fanout", arg, 1, WORKLOAD_MAX_FANOUT, &v)) return -1;
        a->params.fanout = (int)v;
        return 0;
    case O_SCALE:
        if (bench_parse_float("gen", "--scale", arg, 1e-3, 1e3, &d)) return -1;
        a->params.scale = d;
        return 0;
    case O_PREFILL:
        if (bench_parse_float("gen", "--prefill-ms-per-token", arg, 0, 1e6, &d)) return -1;
        a->prefill_s_per_token = d / 1e3;
        return 0;
    case O_DECODE:
        if (bench_parse_float("gen", "--decode-ms-per-token", arg, 0, 1e6, &d)) return -1;
        a->decode_s_per_token = d / 1e3;
        return 0;
    case O_NOISE: {
        int on;
        if (bench_parse_on_off("gen", "--noise", arg, &on)) return -1;
        a->params.noise_free = !on;
        return 0;
    }
    }
    return -1;
}

/* Returns 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, GenArgs *a) {
    static const struct option opts[] = {{"workload", required_argument, 0, O_WORKLOAD},
                                         {"out", required_argument, 0, O_OUT},
                                         {"workflows", required_argument, 0, O_WORKFLOWS},
                                         {"concurrency", required_argument, 0, O_CONC},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"model", required_argument, 0, O_MODEL},
                                         {"block-size", required_argument, 0, O_BLOCK},
                                         {"context-tokens", required_argument, 0, O_CONTEXT},
                                         {"fanout", required_argument, 0, O_FANOUT},
                                         {"scale", required_argument, 0, O_SCALE},
                                         {"prefill-ms-per-token", required_argument, 0, O_PREFILL},
                                         {"decode-ms-per-token", required_argument, 0, O_DECODE},
                                         {"batch-out", required_argument, 0, O_BATCH_OUT},
                                         {"trace-tokens", no_argument, 0, O_TRACE_TOKENS},
                                         {"noise", required_argument, 0, O_NOISE},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    SimConfig sim = sim_config_default(); /* the same cost model braid sim assumes */
    *a = (GenArgs){.params = {.n_workflows = 8, .seed = 1},
                   .concurrency = 4,
                   .block_size = 16,
                   .prefill_s_per_token = sim.prefill_s_per_token,
                   .decode_s_per_token = sim.decode_s_per_token};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            print_usage(stdout);
            return 1;
        }
        if (c == O_WORKLOAD)
            a->workload = optarg;
        else if (c == O_OUT)
            a->out_path = optarg;
        else if (c == O_MODEL)
            a->model_flag = optarg;
        else if (c == O_BATCH_OUT)
            a->batch_path = optarg;
        else if (c == O_TRACE_TOKENS)
            a->trace_tokens = true;
        else if (c == '?' || parse_number(c, optarg, a)) {
            fputs("Run 'braid-bench gen --help' for the options.\n", stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "braid-bench gen: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->workload || !a->out_path) {
        fprintf(stderr, "braid-bench gen: --workload and --out are required\n\n");
        print_usage(stderr);
        return 2;
    }
    if (!workload_summary(a->workload)) {
        fprintf(stderr, "braid-bench gen: unknown workload '%s'\n\n", a->workload);
        print_usage(stderr);
        return 2;
    }
    return 0;
}

/* ---- a time-ordered queue (binary min-heap on time, then insertion order) ---- */

typedef struct PendingLine PendingLine;

typedef struct {
    double t;
    long order; /* insertion order: ties in t keep it, so the output is deterministic */
    int workflow;
    PendingLine *line;
} QueueItem;

typedef struct {
    QueueItem *items;
    int n, cap;
    long next_order;
} TimeQueue;

static int item_before(const QueueItem *a, const QueueItem *b) { return a->t < b->t || (a->t == b->t && a->order < b->order); }

static void swap_items(QueueItem *a, QueueItem *b) {
    QueueItem t = *a;
    *a = *b;
    *b = t;
}

static int queue_push(TimeQueue *q, double t, int workflow, PendingLine *line) {
    if (braid_grow((void **)&q->items, &q->cap, q->n + 1, sizeof *q->items)) return -1;
    int i = q->n++;
    q->items[i] = (QueueItem){.t = t, .order = q->next_order++, .workflow = workflow, .line = line};
    while (i > 0 && item_before(&q->items[i], &q->items[(i - 1) / 2])) {
        swap_items(&q->items[i], &q->items[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    return 0;
}

static QueueItem queue_pop(TimeQueue *q) {
    QueueItem top = q->items[0];
    q->items[0] = q->items[--q->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->n && item_before(&q->items[l], &q->items[m])) m = l;
        if (r < q->n && item_before(&q->items[r], &q->items[m])) m = r;
        if (m == i) break;
        swap_items(&q->items[i], &q->items[m]);
        i = m;
    }
    return top;
}

/* ---- trace lines waiting for their turn ---- */

struct PendingLine {
    int is_end; /* a workflow_end line; else a request */
    char id[96], workflow[64], agent[32], tenant[32], adapter[32];
    int32_t *tokens;
    int n_tokens, output_tokens;
    char *prompt; /* the text, kept only for --batch-out */
};

static void pending_free(PendingLine *l) {
    if (!l) return;
    free(l->prompt);
    free(l->tokens);
    free(l);
}

typedef struct {
    FILE *out, *batch;
    const char *out_path, *batch_path;
    int block_size;
    bool with_tokens;
    TimeQueue lines;
    int seq; /* request lines written */
} TraceOut;

/* The call as a `braid batch` input line: one token out is enough to run its prefill. */
static int write_batch_line(FILE *f, const PendingLine *l) {
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:s, s:s}", "id", l->id, "prompt", l->prompt ? l->prompt : "", "max_tokens", 1,
                          "workflow_id", l->workflow, "agent", l->agent, "tenant", l->tenant, "adapter", l->adapter);
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    int rc = line && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
    free(line);
    json_decref(o);
    return rc;
}

static int write_line(TraceOut *o, double t, const PendingLine *l, BraidError *err) {
    int rc;
    if (l->is_end) {
        rc = trace_write_workflow_end(o->out, t, l->workflow);
    } else {
        TraceRecord rec = {.seq = o->seq++,
                           .t = t,
                           .id = l->id,
                           .workflow = l->workflow,
                           .agent = l->agent,
                           .tenant = l->tenant,
                           .adapter = l->adapter,
                           .prompt = l->tokens,
                           .prompt_tokens = l->n_tokens,
                           .output_tokens = l->output_tokens,
                           .block_size = o->block_size,
                           .with_tokens = o->with_tokens};
        rc = trace_write_request(o->out, &rec);
        if (rc == 0 && o->batch && write_batch_line(o->batch, l))
            return braid_error_set(err, "cannot write %s (disk full?)", o->batch_path);
    }
    return rc ? braid_error_set(err, "cannot write %s (disk full?)", o->out_path) : 0;
}

/* Writes every waiting line that arrives before `t` (all of them for t = INFINITY). */
static int flush_lines_before(TraceOut *o, double t, BraidError *err) {
    while (o->lines.n > 0 && o->lines.items[0].t < t) {
        QueueItem it = queue_pop(&o->lines);
        int rc = write_line(o, it.t, it.line, err);
        pending_free(it.line);
        if (rc) return -1;
    }
    return 0;
}

static int queue_line(TraceOut *o, double t, PendingLine *l, BraidError *err) {
    if (queue_push(&o->lines, t, -1, l) == 0) return 0;
    pending_free(l);
    return braid_error_set(err, "out of memory queueing trace lines");
}

static int queue_workflow_end(TraceOut *o, double t, int workflow, BraidError *err) {
    PendingLine *l = calloc(1, sizeof *l);
    if (!l) return braid_error_set(err, "out of memory");
    l->is_end = 1;
    snprintf(l->workflow, sizeof l->workflow, "w%d", workflow);
    return queue_line(o, t, l, err);
}

/* ---- the run ---- */

typedef struct {
    const GenArgs *args;
    Workload *workload;
    const Tokenizer *tok;
    int context_length; /* the model's, 0 when the file does not say */
    TraceOut trace;
    TimeQueue ready;  /* workflows waiting for their next stage, keyed by when it may start */
    int *stages_done; /* (n_workflows) stages run so far, for ids and output seeds */
    int next_to_start, workflows_done;
    long long requests, prompt_tokens, output_tokens, over_context;
    int max_prompt_tokens;
    double last_t; /* when the last workflow ended */
} GenRun;

/* A synthetic output of about `tokens` tokens, seeded per call so it never depends on the order
 * in which workflows run. */
static char *synthetic_output(const GenRun *g, int workflow, int call, int tokens) {
    uint64_t stream = ((uint64_t)workflow << 24) ^ ((uint64_t)g->stages_done[workflow] << 8) ^ (uint64_t)call;
    WlRng r = wl_rng_stream(g->args->params.seed ^ 0x6f7574707574ULL, stream); /* "output" */
    StrBuf b = {0};
    text_gen(&b, &r, TEXT_PROSE, tokens);
    return strbuf_take(&b);
}

/* Tokenizes a call's prompt as /v1/completions does (special-token text not parsed, BOS as the model
 * asks) into a queued request line arriving at t. *prompt_tokens gets the count. */
static int queue_request(GenRun *g, int wf, const AgentCall *c, int k, double t, int output_tokens, int *prompt_tokens,
                         BraidError *err) {
    PendingLine *l = calloc(1, sizeof *l);
    if (!l) return braid_error_set(err, "out of memory");
    TokenList ids = {0};
    if (tokenizer_encode(g->tok, c->prompt, strlen(c->prompt), false, g->tok->add_bos, &ids, err)) {
        free(ids.ids);
        free(l);
        return braid_error_wrap(err, "tokenizing a prompt of workflow %s", c->workflow);
    }
    /* the call's label fields are NUL-terminated within their (equal) sizes */
    snprintf(l->id, sizeof l->id, "%.63s.%d.%d", c->workflow, g->stages_done[wf], k);
    snprintf(l->workflow, sizeof l->workflow, "%.63s", c->workflow);
    snprintf(l->agent, sizeof l->agent, "%.31s", c->agent);
    snprintf(l->tenant, sizeof l->tenant, "%.31s", c->tenant);
    snprintf(l->adapter, sizeof l->adapter, "%.31s", c->adapter);
    if (g->trace.batch && !(l->prompt = strdup(c->prompt))) {
        free(ids.ids);
        free(l);
        return braid_error_set(err, "out of memory");
    }
    l->tokens = ids.ids;
    l->n_tokens = ids.n;
    l->output_tokens = output_tokens;
    *prompt_tokens = ids.n;
    return queue_line(&g->trace, t, l, err);
}

static void count_request(GenRun *g, const AgentCall *c, int prompt_tokens, int output_tokens) {
    g->requests++;
    g->prompt_tokens += prompt_tokens;
    g->output_tokens += output_tokens;
    if (prompt_tokens > g->max_prompt_tokens) g->max_prompt_tokens = prompt_tokens;
    if (g->context_length > 0 && prompt_tokens + c->max_tokens > g->context_length) g->over_context++;
}

/* Runs one stage of workflow wf that may start at `start`: queues its request lines, delivers
 * synthetic outputs, and sets *finish. */
static int run_stage(GenRun *g, int wf, const AgentCall *calls, int n, double start, double *finish, BraidError *err) {
    char *outputs[WORKLOAD_MAX_FANOUT] = {0};
    int rc = 0;
    *finish = start;
    for (int k = 0; k < n && rc == 0; k++) {
        const AgentCall *c = &calls[k];
        int out_tokens = c->expected_output_tokens < c->max_tokens ? c->expected_output_tokens : c->max_tokens;
        if (out_tokens < 1) out_tokens = 1;
        double arrival = start + c->delay_s;
        int prompt_tokens = 0;
        rc = queue_request(g, wf, c, k, arrival, out_tokens, &prompt_tokens, err);
        if (rc) break;
        count_request(g, c, prompt_tokens, out_tokens);
        double end = arrival + g->args->prefill_s_per_token * prompt_tokens + g->args->decode_s_per_token * out_tokens;
        if (end > *finish) *finish = end;
        if (!(outputs[k] = synthetic_output(g, wf, k, out_tokens))) rc = braid_error_set(err, "out of memory");
    }
    if (rc == 0) rc = workload_deliver(g->workload, wf, (const char *const *)outputs, n, err);
    for (int k = 0; k < n; k++) free(outputs[k]);
    g->stages_done[wf]++;
    return rc;
}

static int start_next_workflow(GenRun *g, double t, BraidError *err) {
    if (g->next_to_start >= workload_count(g->workload)) return 0;
    if (queue_push(&g->ready, t, g->next_to_start++, NULL)) return braid_error_set(err, "out of memory");
    return 0;
}

/* Pops the earliest ready workflow and advances it by one stage (or ends it). */
static int step(GenRun *g, BraidError *err) {
    QueueItem it = queue_pop(&g->ready);
    if (flush_lines_before(&g->trace, it.t, err)) return -1;
    AgentCall calls[WORKLOAD_MAX_FANOUT];
    int n = workload_next_stage(g->workload, it.workflow, calls, WORKLOAD_MAX_FANOUT, err);
    if (n < 0) return -1;
    if (n == 0) {
        g->workflows_done++;
        if (it.t > g->last_t) g->last_t = it.t;
        if (queue_workflow_end(&g->trace, it.t, it.workflow, err)) return -1;
        return start_next_workflow(g, it.t, err);
    }
    double finish;
    if (run_stage(g, it.workflow, calls, n, it.t, &finish, err)) return -1;
    if (queue_push(&g->ready, finish, it.workflow, NULL)) return braid_error_set(err, "out of memory");
    return 0;
}

/* Progress for runs that take more than a second: redrawn in place on a terminal, a line every
 * 10 s otherwise. */
static void show_progress(const GenRun *g, double started, double *last_shown, int final) {
    double now = braid_now_seconds();
    int tty = isatty(STDERR_FILENO);
    if (!final && (now - started < 1.0 || now - *last_shown < (tty ? 0.25 : 10.0))) return;
    if (final && *last_shown == 0) return; /* never shown: a short run needs no progress line */
    int total = workload_count(g->workload);
    fprintf(stderr, "%s[gen] %d/%d workflows, %lld requests, %.0f s", tty ? "\r" : "", g->workflows_done, total, g->requests,
            now - started);
    fputs(tty && !final ? "\033[K" : "\n", stderr);
    *last_shown = now;
}

static int run_all(GenRun *g, BraidError *err) {
    int n = workload_count(g->workload);
    int first = g->args->concurrency < n ? (int)g->args->concurrency : n;
    for (int i = 0; i < first; i++)
        if (start_next_workflow(g, 0.0, err)) return -1;
    double started = braid_now_seconds(), last_shown = 0;
    while (g->ready.n > 0) {
        if (step(g, err)) return -1;
        show_progress(g, started, &last_shown, 0);
    }
    show_progress(g, started, &last_shown, 1);
    return flush_lines_before(&g->trace, INFINITY, err);
}

/* ---- set-up ---- */

/* The model's context length from the GGUF metadata ("<arch>.context_length"), 0 if absent. */
static int model_context_length(const GgufFile *file) {
    GgufString arch;
    int64_t n = 0;
    char key[96];
    if (gguf_get_string(file, "general.architecture", &arch)) return 0;
    snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.data);
    return gguf_get_int(file, key, &n) == 0 && n > 0 && n < INT32_MAX ? (int)n : 0;
}

static void print_summary(const GenRun *g) {
    fprintf(stderr,
            "[gen] %s: %d workflows, %lld requests, prompt tokens %lld (mean %.0f, max %d), output tokens %lld, "
            "modeled span %.1f s -> %s\n",
            g->args->workload, g->workflows_done, g->requests, g->prompt_tokens,
            g->requests ? (double)g->prompt_tokens / (double)g->requests : 0.0, g->max_prompt_tokens, g->output_tokens, g->last_t,
            g->args->out_path);
    if (g->over_context)
        fprintf(stderr, "[gen] warning: %lld requests need more than the model's %d-token context (prompt + max_tokens)\n",
                g->over_context, g->context_length);
}

static void gen_run_free(GenRun *g) {
    while (g->trace.lines.n > 0) pending_free(queue_pop(&g->trace.lines).line);
    free(g->trace.lines.items);
    free(g->ready.items);
    free(g->stages_done);
    workload_free(g->workload);
}

/* Creates the workload and the trace file, runs everything, closes the file. */
static int generate(const GenArgs *a, const Tokenizer *tok, int context_length, BraidError *err) {
    GenRun g = {.args = a,
                .tok = tok,
                .context_length = context_length,
                .trace = {.out_path = a->out_path, .batch_path = a->batch_path, .block_size = (int)a->block_size,
                          .with_tokens = a->trace_tokens}};
    g.workload = workload_create(a->workload, &a->params, err);
    if (!g.workload) return -1;
    g.stages_done = calloc((size_t)workload_count(g.workload), sizeof *g.stages_done);
    g.trace.out = g.stages_done ? fopen(a->out_path, "w") : NULL;
    int rc;
    if (!g.stages_done)
        rc = braid_error_set(err, "out of memory");
    else if (!g.trace.out)
        rc = braid_error_set(err, "cannot create %s: %s", a->out_path, strerror(errno));
    else if (a->batch_path && !(g.trace.batch = fopen(a->batch_path, "w")))
        rc = braid_error_set(err, "cannot create %s: %s", a->batch_path, strerror(errno));
    else
        rc = run_all(&g, err);
    if (g.trace.out && fclose(g.trace.out) && rc == 0) rc = braid_error_set(err, "cannot write %s", a->out_path);
    if (g.trace.batch && fclose(g.trace.batch) && rc == 0) rc = braid_error_set(err, "cannot write %s", a->batch_path);
    if (rc == 0) print_summary(&g);
    gen_run_free(&g);
    return rc;
}

int bench_gen_main(int argc, char **argv) {
    GenArgs a;
    int parsed = parse_args(argc, argv, &a);
    if (parsed) return parsed == 1 ? 0 : 2;
    const char *model_path = cli_model_path(a.model_flag);
    BraidError err;
    GgufFile *gguf = NULL;
    Tokenizer tok;
    if (gguf_open(model_path, &gguf, &err) || tokenizer_load(gguf, &tok, &err)) {
        fprintf(stderr, "braid-bench gen: %s\n", err.msg);
        gguf_close(gguf);
        return 1;
    }
    int rc = generate(&a, &tok, model_context_length(gguf), &err);
    if (rc) fprintf(stderr, "braid-bench gen: %s\n", err.msg);
    tokenizer_free(&tok);
    gguf_close(gguf);
    return rc ? 1 : 0;
}
