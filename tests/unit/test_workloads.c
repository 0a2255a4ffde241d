/*
 * Workload generators (bench/workloads): the interface contract (names, parameter checks, a
 * pending stage asked twice, delivery checks), determinism (same seed → same prompts whatever the
 * interleaving; another seed → other prompts), every workflow ends within its stage bound, the
 * shared system prompt is a common prefix across workflows, branching follows the state the
 * prompts reveal (codegen difficulty, factcheck hops), map-reduce width, prompt-size caps at
 * scale 1, edit-replay's one-word edit, cross-tenant labels, shifted template segments, and the
 * text helpers (filler sizes, truncation).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "history.h"
#include "text_gen.h"
#include "token_estimate.h"
#include "tool_schemas.h"
#include "workload.h"
#include "wl_rng.h"

#define MAX_STAGES 64

/* The most stages a workflow of each workload may take (see each workload's header comment). */
static const struct {
    const char *name;
    int max_stages;
} bounds[] = {{"codegen", 25},       {"factcheck", 20},  {"pipeline", 10},     {"react-lora", 8},
              {"mapreduce-lora", 2}, {"edit-replay", 8}, {"cross-tenant", 3}, {"templates", 8}};
#define N_WORKLOADS ((int)(sizeof bounds / sizeof bounds[0]))

static Workload *create(const char *name, int n, uint64_t seed, double scale) {
    WorkloadParams p = {.n_workflows = n, .seed = seed, .scale = scale};
    BraidError err;
    Workload *w = workload_create(name, &p, &err);
    if (!w) fail_msg("%s: %s", name, err.msg);
    return w;
}

/* FNV-1a over everything a call carries, to compare runs cheaply. */
static uint64_t hash_call(uint64_t h, const AgentCall *c) {
    const char *parts[] = {c->workflow, c->agent, c->tenant, c->adapter, c->prompt};
    for (int i = 0; i < 5; i++)
        for (const char *s = parts[i]; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return (h ^ (uint64_t)c->max_tokens ^ ((uint64_t)c->expected_output_tokens << 20)) * 0x100000001b3ULL;
}

/* Synthetic output for call k of a stage: seeded by workflow and stage, so it never depends on
 * the interleaving. long_outputs: as long as max_tokens allows (the worst case for prompt sizes). */
static char *make_output(const AgentCall *c, int wf, int stage, int k, int long_outputs) {
    WlRng r = wl_rng_stream(1234, (uint64_t)wf * 1000 + (uint64_t)stage * 10 + (uint64_t)k);
    StrBuf b = {0};
    text_gen(&b, &r, TEXT_PROSE, long_outputs ? c->max_tokens : c->expected_output_tokens);
    char *s = strbuf_take(&b);
    assert_non_null(s);
    return s;
}

typedef struct {
    int stages;
    int widths[MAX_STAGES];
    char agents[MAX_STAGES][32];
    uint64_t hash;
    int max_prompt_tokens;
} FlowLog;

/* Advances workflow wf by one stage; returns 0 when it had ended. */
static int step(Workload *w, int wf, FlowLog *log, int long_outputs) {
    AgentCall calls[WORKLOAD_MAX_FANOUT];
    BraidError err;
    int n = workload_next_stage(w, wf, calls, WORKLOAD_MAX_FANOUT, &err);
    if (n < 0) fail_msg("workflow %d: %s", wf, err.msg);
    if (n == 0) return 0;
    assert_true(log->stages < MAX_STAGES);
    log->widths[log->stages] = n;
    snprintf(log->agents[log->stages], sizeof log->agents[0], "%s", calls[0].agent);
    char *outputs[WORKLOAD_MAX_FANOUT];
    for (int k = 0; k < n; k++) {
        log->hash = hash_call(log->hash, &calls[k]);
        int tokens = token_estimate_str(calls[k].prompt);
        if (tokens > log->max_prompt_tokens) log->max_prompt_tokens = tokens;
        outputs[k] = make_output(&calls[k], wf, log->stages, k, long_outputs);
    }
    if (workload_deliver(w, wf, (const char *const *)outputs, n, &err)) fail_msg("workflow %d: %s", wf, err.msg);
    for (int k = 0; k < n; k++) free(outputs[k]);
    log->stages++;
    return 1;
}

static void run_to_end(Workload *w, int wf, FlowLog *log, int long_outputs) {
    while (step(w, wf, log, long_outputs)) {
    }
}

/* ---- the interface ---- */

static void test_names_and_parameter_checks(void **state) {
    (void)state;
    const char *const *names = workload_names();
    int n = 0;
    for (; names[n]; n++) {
        assert_non_null(workload_summary(names[n]));
        Workload *w = create(names[n], 2, 1, 0.05);
        assert_int_equal(workload_count(w), 2);
        workload_free(w);
    }
    assert_int_equal(n, N_WORKLOADS);
    BraidError err;
    WorkloadParams p = {.n_workflows = 1};
    assert_null(workload_create("no-such-workload", &p, &err));
    assert_non_null(strstr(err.msg, "no-such-workload"));
    WorkloadParams bad[] = {{.n_workflows = 0},
                            {.n_workflows = 1, .fanout = WORKLOAD_MAX_FANOUT + 1},
                            {.n_workflows = 1, .scale = -1},
                            {.n_workflows = 1, .context_tokens = -5}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_null(workload_create("mapreduce-lora", &bad[i], &err));
        assert_non_null(strstr(err.msg, "mapreduce-lora"));
    }
    assert_null(workload_create("codegen", NULL, &err));
}

static void test_stage_protocol(void **state) {
    (void)state;
    Workload *w = create("codegen", 2, 7, 0.05);
    AgentCall a[WORKLOAD_MAX_FANOUT], b[WORKLOAD_MAX_FANOUT];
    BraidError err;
    const char *out[] = {"done"};
    assert_int_equal(workload_deliver(w, 0, out, 1, &err), -1); /* nothing pending yet */
    assert_int_equal(workload_next_stage(w, 0, a, WORKLOAD_MAX_FANOUT, &err), 1);
    assert_int_equal(workload_next_stage(w, 0, b, WORKLOAD_MAX_FANOUT, &err), 1); /* asked again: the same stage */
    assert_string_equal(a[0].prompt, b[0].prompt);
    assert_string_equal(a[0].workflow, "w0");
    assert_int_equal(workload_deliver(w, 0, out, 2, &err), -1); /* wrong count */
    assert_int_equal(workload_deliver(w, 0, NULL, 1, &err), 0); /* NULL outputs read as empty */
    assert_int_equal(workload_next_stage(w, 2, a, WORKLOAD_MAX_FANOUT, &err), -1);
    assert_non_null(strstr(err.msg, "out of range"));
    workload_free(w);

    WorkloadParams p = {.n_workflows = 1, .fanout = 6, .scale = 0.05};
    w = workload_create("mapreduce-lora", &p, &err);
    assert_non_null(w);
    assert_int_equal(workload_next_stage(w, 0, a, 4, &err), -1); /* wider than the caller takes */
    assert_non_null(strstr(err.msg, "6 calls"));
    workload_free(w); /* with a stage pending */
}

/* ---- determinism ---- */

static void run_all(const char *name, uint64_t seed, int n, int interleave, uint64_t *hashes) {
    Workload *w = create(name, n, seed, 0.1);
    FlowLog logs[8] = {0};
    if (interleave) { /* round-robin, newest first */
        for (int live = n; live > 0;) {
            live = 0;
            for (int i = n - 1; i >= 0; i--) live += step(w, i, &logs[i], 0);
        }
    } else {
        for (int i = 0; i < n; i++) run_to_end(w, i, &logs[i], 0);
    }
    for (int i = 0; i < n; i++) hashes[i] = logs[i].hash;
    workload_free(w);
}

static void test_determinism(void **state) {
    (void)state;
    for (int k = 0; k < N_WORKLOADS; k++) {
        uint64_t a[4], b[4], c[4];
        run_all(bounds[k].name, 42, 4, 0, a);
        run_all(bounds[k].name, 42, 4, 1, b);
        run_all(bounds[k].name, 43, 4, 0, c);
        for (int i = 0; i < 4; i++) {
            if (a[i] != b[i]) fail_msg("%s: workflow %d depends on the interleaving", bounds[k].name, i);
            if (a[i] == c[i]) fail_msg("%s: workflow %d is the same under another seed", bounds[k].name, i);
        }
    }
}

/* ---- termination and sizes ---- */

static void test_every_workflow_ends_within_its_bound(void **state) {
    (void)state;
    for (int k = 0; k < N_WORKLOADS; k++) {
        Workload *w = create(bounds[k].name, 60, 5, 0.05);
        int longest = 0;
        for (int i = 0; i < 60; i++) {
            FlowLog log = {0};
            run_to_end(w, i, &log, 0);
            assert_true(log.stages >= 1);
            if (log.stages > bounds[k].max_stages) fail_msg("%s: workflow %d took %d stages", bounds[k].name, i, log.stages);
            if (log.stages > longest) longest = log.stages;
        }
        fprintf(stderr, "%-15s longest workflow: %d stages (bound %d)\n", bounds[k].name, longest, bounds[k].max_stages);
        workload_free(w);
    }
}

/* At scale 1 with the longest outputs the calls allow, every prompt stays under the cap: ~6000
 * real tokens for the default model's 8192-token context (token_estimate is within ~10%). */
static void test_prompts_stay_under_the_cap(void **state) {
    (void)state;
    for (int k = 0; k < N_WORKLOADS; k++) {
        Workload *w = create(bounds[k].name, 10, 9, 1.0);
        int largest = 0;
        for (int i = 0; i < 10; i++) {
            FlowLog log = {0};
            run_to_end(w, i, &log, 1);
            if (log.max_prompt_tokens > largest) largest = log.max_prompt_tokens;
        }
        fprintf(stderr, "%-15s largest prompt at scale 1: %d estimated tokens\n", bounds[k].name, largest);
        assert_true(largest <= 5700);
        workload_free(w);
    }
}

/* ---- shared prefixes ---- */

static size_t common_prefix(const char *a, const char *b) {
    size_t n = 0;
    while (a[n] && a[n] == b[n]) n++;
    return n;
}

/* The first call of each workflow: same agent across workflows → same system prompt in front. */
static void test_system_prompt_is_a_shared_prefix(void **state) {
    (void)state;
    for (int k = 0; k < N_WORKLOADS; k++) {
        Workload *w = create(bounds[k].name, 6, 3, 1.0);
        char *first = NULL;
        char agent[32] = "";
        for (int i = 0; i < 6; i++) {
            AgentCall calls[WORKLOAD_MAX_FANOUT];
            BraidError err;
            assert_true(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err) > 0);
            if (!first) {
                first = strdup(calls[0].prompt);
                snprintf(agent, sizeof agent, "%s", calls[0].agent);
                continue;
            }
            assert_string_equal(calls[0].agent, agent);
            size_t shared = common_prefix(first, calls[0].prompt);
            if (shared < 1000) fail_msg("%s: workflows 0 and %d share only %zu leading chars", bounds[k].name, i, shared);
            assert_true(shared < strlen(calls[0].prompt)); /* the private part differs */
        }
        free(first);
        workload_free(w);
    }
}

/* react-lora: the static context is the common prefix of every agent, whatever its adapter. */
static void test_lora_context_is_shared_across_adapters(void **state) {
    (void)state;
    WorkloadParams p = {.n_workflows = 2, .seed = 1, .context_tokens = 2000};
    BraidError err;
    Workload *w = workload_create("react-lora", &p, &err);
    assert_non_null(w);
    AgentCall calls[WORKLOAD_MAX_FANOUT];
    assert_int_equal(workload_next_stage(w, 0, calls, WORKLOAD_MAX_FANOUT, &err), 1);
    assert_string_equal(calls[0].adapter, "lora-planner");
    char *planner = strdup(calls[0].prompt);
    const char *out[] = {"plan"};
    assert_int_equal(workload_deliver(w, 0, out, 1, &err), 0);
    assert_int_equal(workload_next_stage(w, 1, calls, WORKLOAD_MAX_FANOUT, &err), 1); /* another workflow's planner */
    size_t across_workflows = common_prefix(planner, calls[0].prompt);
    assert_int_equal(workload_deliver(w, 1, out, 1, &err), 0);
    assert_int_equal(workload_next_stage(w, 0, calls, WORKLOAD_MAX_FANOUT, &err), 1);
    assert_string_equal(calls[0].adapter, "lora-actor");
    assert_true(calls[0].max_tokens == 256);
    size_t across_agents = common_prefix(planner, calls[0].prompt);
    int context_tokens = token_estimate(planner, across_agents);
    fprintf(stderr, "react-lora: planner and actor share %d estimated tokens\n", context_tokens);
    assert_true(context_tokens >= 1900 && context_tokens <= 2300);
    assert_true(across_workflows > across_agents);
    /* after the actor's step comes a tool reply: the next call waits the tool's 0.1 s */
    assert_int_equal(workload_deliver(w, 0, out, 1, &err), 0);
    assert_int_equal(workload_next_stage(w, 0, calls, WORKLOAD_MAX_FANOUT, &err), 1);
    assert_true(calls[0].delay_s > 0.09 && calls[0].delay_s < 0.11);
    assert_non_null(strstr(calls[0].prompt, "Facts found so far:"));
    free(planner);
    workload_free(w);
}

/* ---- branching follows the revealed state ---- */

static void test_codegen_hard_tasks_retry_more(void **state) {
    (void)state;
    enum { N = 600 };
    Workload *w = create("codegen", N, 11, 0.03);
    double stages[3] = {0};
    int count[3] = {0}, first_try_pass[3] = {0}, reports = 0;
    static const char *const labels[] = {"Difficulty: easy", "Difficulty: medium", "Difficulty: hard"};
    for (int i = 0; i < N; i++) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 1);
        int d = -1;
        for (int k = 0; k < 3; k++)
            if (strstr(calls[0].prompt, labels[k])) d = k;
        assert_true(d >= 0);
        FlowLog log = {0};
        run_to_end(w, i, &log, 0);
        stages[d] += log.stages;
        count[d]++;
        first_try_pass[d] += log.stages == 5; /* planner x2, coder, tester x2 */
        for (int s = 0; s < log.stages; s++) reports += strcmp(log.agents[s], "analyzer") == 0;
    }
    for (int k = 0; k < 3; k++) {
        assert_true(count[k] > 50);
        stages[k] /= count[k];
    }
    fprintf(stderr, "codegen mean stages: easy %.2f, medium %.2f, hard %.2f; first-try passes %d/%d easy, %d/%d hard\n",
            stages[0], stages[1], stages[2], first_try_pass[0], count[0], first_try_pass[2], count[2]);
    assert_true(stages[2] > stages[0] + 2.0);
    assert_true(stages[1] > stages[0]);
    /* informative but not perfect: some easy tasks retry, some hard ones pass at once */
    assert_true(first_try_pass[0] < count[0]);
    assert_true(first_try_pass[2] > 0);
    assert_true(reports > 0);
    workload_free(w);
}

/* After a Tester call, the next prompt carries the test report the branch followed. */
static void test_codegen_report_reveals_the_branch(void **state) {
    (void)state;
    Workload *w = create("codegen", 40, 12, 0.03); /* the cap's floor keeps the reports */
    int analyzers = 0;
    for (int i = 0; i < 40; i++) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        const char *out[] = {"ok"};
        for (;;) {
            int n = workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err);
            assert_true(n >= 0);
            if (n == 0) break;
            if (strcmp(calls[0].agent, "analyzer") == 0) {
                const char *report = strstr(calls[0].prompt, "Result: ");
                assert_non_null(report);
                while (strstr(report + 1, "Result: ")) report = strstr(report + 1, "Result: ");
                assert_non_null(strstr(report, "tests failed."));
                assert_null(strstr(report, "Result: 0 of")); /* a clean run ends the workflow */
                analyzers++;
            }
            assert_int_equal(workload_deliver(w, i, out, 1, &err), 0);
        }
    }
    assert_true(analyzers > 0);
    workload_free(w);
}

static void test_factcheck_more_facts_more_rounds(void **state) {
    (void)state;
    enum { N = 400 };
    Workload *w = create("factcheck", N, 13, 0.03);
    double stages[5] = {0};
    int count[5] = {0};
    for (int i = 0; i < N; i++) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 1);
        const char *s = strstr(calls[0].prompt, "The claim links ");
        assert_non_null(s);
        int facts = atoi(s + strlen("The claim links "));
        assert_true(facts >= 2 && facts <= 4);
        FlowLog log = {0};
        run_to_end(w, i, &log, 0);
        stages[facts] += log.stages;
        count[facts]++;
    }
    for (int f = 2; f <= 4; f++) stages[f] /= count[f];
    fprintf(stderr, "factcheck mean stages: 2 facts %.2f, 3 facts %.2f, 4 facts %.2f\n", stages[2], stages[3], stages[4]);
    assert_true(stages[4] > stages[2] + 1.0);
    workload_free(w);
}

/* ---- structure of the other workloads ---- */

static void test_mapreduce_stage_width_is_the_fanout(void **state) {
    (void)state;
    const int fanouts[] = {1, 4, 7};
    for (int f = 0; f < 3; f++) {
        WorkloadParams p = {.n_workflows = 3, .seed = 2, .fanout = fanouts[f], .scale = 0.05};
        BraidError err;
        Workload *w = workload_create("mapreduce-lora", &p, &err);
        assert_non_null(w);
        for (int i = 0; i < 3; i++) {
            FlowLog log = {0};
            AgentCall calls[WORKLOAD_MAX_FANOUT];
            assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), fanouts[f]);
            for (int k = 0; k < fanouts[f]; k++) {
                char adapter[32];
                snprintf(adapter, sizeof adapter, "lora-mapper-%d", k);
                assert_string_equal(calls[k].adapter, adapter);
                assert_true(calls[k].delay_s > 0.09 && calls[k].delay_s < 0.11);
            }
            run_to_end(w, i, &log, 0);
            assert_int_equal(log.stages, 2);
            assert_int_equal(log.widths[0], fanouts[f]);
            assert_int_equal(log.widths[1], 1);
            assert_string_equal(log.agents[1], "reducer");
        }
        workload_free(w);
    }
}

static void test_pipeline_is_static(void **state) {
    (void)state;
    static const char *const order[] = {"researcher", "researcher", "researcher", "analyst", "analyst",
                                        "risk",       "risk",       "writer",     "reviewer", "reviewer"};
    Workload *w = create("pipeline", 20, 4, 0.05);
    for (int i = 0; i < 20; i++) {
        FlowLog log = {0};
        run_to_end(w, i, &log, 0);
        assert_int_equal(log.stages, 10);
        for (int s = 0; s < 10; s++) assert_string_equal(log.agents[s], order[s]);
    }
    workload_free(w);
}

/* The requests of one agent's turn (AutoGen tool use, a LangChain or CrewAI agent loop) continue
 * each other: the next request starts with the previous request's whole prompt, then its output.
 * Checked on every consecutive pair of requests by the same agent that the workloads chain, except
 * where the prompt cap's sliding window dropped older turns (which breaks the prefix, as it does in
 * a framework that trims its history). */
static void test_agent_loops_continue_the_previous_prompt(void **state) {
    (void)state;
    static const struct {
        const char *workload, *agent;
        int min_pairs;
    } loops[] = {{"codegen", "planner", 1}, {"codegen", "tester", 1}, {"factcheck", "retriever", 1}, {"pipeline", "researcher", 2},
                 {"pipeline", "analyst", 1}, {"pipeline", "reviewer", 1}};
    for (size_t k = 0; k < sizeof loops / sizeof loops[0]; k++) {
        Workload *w = create(loops[k].workload, 4, 5, 0.5);
        for (int i = 0; i < 4; i++) {
            char *prev = NULL, *prev_out = NULL;
            int pairs = 0;
            for (int stage = 0;; stage++) {
                AgentCall calls[WORKLOAD_MAX_FANOUT];
                BraidError err;
                int n = workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err);
                assert_true(n >= 0);
                if (n == 0) break;
                int same = strcmp(calls[0].agent, loops[k].agent) == 0;
                int windowed = strstr(calls[0].prompt, "(earlier steps omitted)") != NULL;
                if (same && prev && !windowed) { /* the previous call was this agent's too */
                    size_t lp = strlen(prev);
                    if (strncmp(calls[0].prompt, prev, lp) != 0 || strncmp(calls[0].prompt + lp, prev_out, strlen(prev_out)) != 0)
                        fail_msg("%s: %s request %d does not continue the previous one", loops[k].workload, loops[k].agent, stage);
                    pairs++;
                }
                free(prev);
                free(prev_out);
                prev = same ? strdup(calls[0].prompt) : NULL;
                char *out = make_output(&calls[0], i, stage, 0, 0);
                prev_out = same ? strdup(out) : NULL;
                const char *outs[] = {out};
                assert_int_equal(workload_deliver(w, i, outs, 1, &err), 0);
                free(out);
            }
            free(prev);
            free(prev_out);
            if (pairs < loops[k].min_pairs) fail_msg("%s: only %d chained %s requests", loops[k].workload, pairs, loops[k].agent);
        }
        workload_free(w);
    }
}

/* The static crew's fixed prompt: every workflow's Analyst request starts with the same head and
 * task description up to the interpolated document; workflows on the same filing share it up to
 * the context. */
static void test_pipeline_task_block_is_shared(void **state) {
    (void)state;
    Workload *w = create("pipeline", 8, 6, 1.0);
    char *first = NULL;
    for (int i = 0; i < 8; i++) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        for (int stage = 0; stage < 4; stage++) { /* the fourth request is the Analyst's first */
            assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 1);
            if (stage == 3) break;
            const char *out[] = {"Thought: next"};
            assert_int_equal(workload_deliver(w, i, out, 1, &err), 0);
        }
        assert_string_equal(calls[0].agent, "analyst");
        const char *ctx = strstr(calls[0].prompt, "This is the context you're working with:\n");
        const char *doc = strstr(calls[0].prompt, "The document:\n");
        assert_non_null(ctx);
        assert_non_null(doc);
        assert_non_null(strstr(calls[0].prompt, "Current Task: Compute the figure"));
        if (!first) {
            first = strdup(calls[0].prompt);
            continue;
        }
        size_t shared = common_prefix(first, calls[0].prompt);
        assert_true(shared >= (size_t)(doc - calls[0].prompt));
        const char *fa = strstr(first, "Form 10-K"), *fb = strstr(calls[0].prompt, "Form 10-K");
        assert_true(fa && fb);
        if (strncmp(strstr(first, "The document:\n"), doc, (size_t)(fb - doc)) == 0) /* the same filing */
            assert_true(shared >= (size_t)(ctx - calls[0].prompt));
    }
    free(first);
    workload_free(w);
}

/* Where a and b differ: after their common prefix, before their common suffix. */
static void diff_span(const char *a, const char *b, size_t *start, size_t *a_end, size_t *b_end) {
    size_t la = strlen(a), lb = strlen(b), p = common_prefix(a, b), s = 0;
    while (s < la - p && s < lb - p && a[la - 1 - s] == b[lb - 1 - s]) s++;
    *start = p;
    *a_end = la - s;
    *b_end = lb - s;
}

static void test_edit_replay_edits_one_word(void **state) {
    (void)state;
    Workload *w = create("edit-replay", 3, 8, 0.2);
    for (int i = 0; i < 3; i++) {
        char *prompts[8];
        char agents[8][32];
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        for (int s = 0; s < 8; s++) {
            assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 1);
            prompts[s] = strdup(calls[0].prompt);
            snprintf(agents[s], sizeof agents[s], "%s", calls[0].agent);
            char reply[32];
            snprintf(reply, sizeof reply, "reply %d", s);
            const char *out[] = {reply};
            assert_int_equal(workload_deliver(w, i, out, 1, &err), 0);
        }
        assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 0);
        for (int s = 0; s < 6; s++) assert_string_equal(agents[s], "build");
        assert_string_equal(agents[6], "edit");
        assert_string_equal(agents[7], "replay");
        /* build turns grow by appending: each prompt, less its final reply marker, prefixes the next */
        for (int s = 0; s < 5; s++)
            assert_true(common_prefix(prompts[s], prompts[s + 1]) + strlen("### Assistant\n") >= strlen(prompts[s]));
        /* the replay is the last build prompt with one word swapped; the edit, an early build prompt */
        size_t start, a_end, b_end;
        diff_span(prompts[5], prompts[7], &start, &a_end, &b_end);
        assert_true(a_end > start && a_end - start < 20 && b_end - start < 20);
        assert_non_null(strstr(prompts[7], "reply 0")); /* build replies kept */
        assert_null(strstr(prompts[7], "reply 6"));     /* the edit's reply is not */
        int matched = 0;
        for (int s = 0; s < 2; s++) {
            diff_span(prompts[s], prompts[6], &start, &a_end, &b_end);
            if (a_end > start && a_end - start < 20 && b_end - start < 20) matched++;
        }
        assert_int_equal(matched, 1); /* the edited turn is turn 1 or 2 */
        for (int s = 0; s < 8; s++) free(prompts[s]);
    }
    workload_free(w);
}

static void test_cross_tenant_labels_and_popularity(void **state) {
    (void)state;
    enum { N = 200 };
    Workload *w = create("cross-tenant", N, 6, 0.05);
    int hits[8] = {0};
    char titles[8][96] = {{0}};
    for (int i = 0; i < N; i++) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 1);
        char tenant[8];
        snprintf(tenant, sizeof tenant, "t%d", i % 4);
        assert_string_equal(calls[0].tenant, tenant);
        const char *title = strstr(calls[0].prompt, "### Article: ");
        assert_non_null(title);
        size_t len = strcspn(title, "\n");
        int slot = 0;
        while (slot < 8 && titles[slot][0] && strncmp(titles[slot], title, len) != 0) slot++;
        assert_true(slot < 8); /* at most 8 distinct articles */
        if (!titles[slot][0]) snprintf(titles[slot], sizeof titles[slot], "%.*s", (int)len, title);
        hits[slot]++;
        FlowLog log = {0};
        run_to_end(w, i, &log, 0);
        assert_true(log.stages >= 1 && log.stages <= 3);
    }
    int most = 0, least = N;
    for (int s = 0; s < 8; s++) {
        if (hits[s] > most) most = hits[s];
        if (hits[s] < least) least = hits[s];
    }
    fprintf(stderr, "cross-tenant article popularity: most %d, least %d of %d sessions\n", most, least, N);
    assert_true(most > 3 * least); /* Zipf, not uniform */
    workload_free(w);
}

/* templates: a tool schema recurs byte-identical in many prompts, at different offsets. */
static void test_templates_repeat_schemas_at_shifted_positions(void **state) {
    (void)state;
    StrBuf schema = {0};
    tool_schema_append(&schema, "get_weather", 150); /* the most popular tool, at scale 1 */
    Workload *w = create("templates", 30, 10, 1.0);
    long offsets[30];
    int found = 0, distinct = 0;
    for (int i = 0; i < 30; i++) {
        AgentCall calls[WORKLOAD_MAX_FANOUT];
        BraidError err;
        assert_int_equal(workload_next_stage(w, i, calls, WORKLOAD_MAX_FANOUT, &err), 1);
        assert_string_equal(calls[0].agent, "router");
        const char *at = strstr(calls[0].prompt, strbuf_str(&schema));
        if (!at) continue;
        long off = (long)(at - calls[0].prompt);
        int fresh = 1;
        for (int j = 0; j < found; j++) fresh &= offsets[j] != off;
        distinct += fresh;
        offsets[found++] = off;
    }
    fprintf(stderr, "templates: get_weather's schema in %d of 30 router prompts at %d distinct offsets\n", found, distinct);
    assert_true(found >= 8);
    assert_true(distinct >= found / 2);
    strbuf_free(&schema);
    workload_free(w);
}

/* ---- text helpers ---- */

static void test_text_gen_sizes_and_determinism(void **state) {
    (void)state;
    const int sizes[] = {40, 300, 2000};
    for (int style = TEXT_PROSE; style <= TEXT_LOG; style++) {
        for (int k = 0; k < 3; k++) {
            WlRng a = wl_rng_stream(1, (uint64_t)style), b = wl_rng_stream(1, (uint64_t)style);
            StrBuf x = {0}, y = {0};
            text_gen(&x, &a, (TextStyle)style, sizes[k]);
            text_gen(&y, &b, (TextStyle)style, sizes[k]);
            assert_string_equal(strbuf_str(&x), strbuf_str(&y));
            int est = token_estimate(x.data, x.len);
            if (est < sizes[k] / 3 || est > sizes[k] * 3 / 2 + 16)
                fail_msg("style %d: asked for %d tokens, got about %d", style, sizes[k], est);
            for (size_t i = 0; i < x.len; i++) assert_true(x.data[i] == '\n' || (x.data[i] >= 32 && x.data[i] < 127));
            strbuf_free(&x);
            strbuf_free(&y);
        }
    }
}

static void test_history_truncates_and_windows(void **state) {
    (void)state;
    WlRng r = wl_rng_named("history-test");
    StrBuf long_text = {0};
    text_gen(&long_text, &r, TEXT_PROSE, 600);
    StrBuf cut = {0};
    history_append_truncated(&cut, long_text.data, 100);
    assert_true(token_estimate(cut.data, cut.len) <= 100);
    assert_non_null(strstr(cut.data, "truncated"));

    History h = {0};
    BraidError err;
    assert_int_equal(history_add(&h, "Task", "the task that is always kept", 0, 1, &err), 0);
    for (int i = 0; i < 10; i++) {
        char label[32];
        snprintf(label, sizeof label, "Step %d", i);
        assert_int_equal(history_add(&h, label, long_text.data, 100, 0, &err), 0);
    }
    StrBuf out = {0};
    history_render(&h, &out, 450);
    assert_non_null(strstr(out.data, "always kept"));
    assert_non_null(strstr(out.data, "Step 9"));
    assert_null(strstr(out.data, "Step 0\n"));
    assert_non_null(strstr(out.data, "earlier steps omitted"));
    assert_true(token_estimate(out.data, out.len) <= 450);
    strbuf_free(&out);
    history_free(&h);
    strbuf_free(&cut);
    strbuf_free(&long_text);
}

/* The window moves in chunks: as turns are added one by one, most renderings start with the whole
 * previous rendering (the prompt prefix survives); only the chunk moves break it, and every
 * rendering stays within its budget and keeps the newest turn. */
static void test_history_window_moves_in_chunks(void **state) {
    (void)state;
    WlRng r = wl_rng_named("history-chunks");
    History h = {0};
    BraidError err;
    assert_int_equal(history_add(&h, "Task", "the task that is always kept", 0, 1, &err), 0);
    char *prev = NULL;
    int breaks = 0, trimmed = 0;
    for (int i = 0; i < 40; i++) {
        StrBuf text = {0}, out = {0};
        text_gen(&text, &r, TEXT_PROSE, 60 + (i * 37) % 90);
        char label[32];
        snprintf(label, sizeof label, "Step %d", i);
        assert_int_equal(history_add(&h, label, text.data, 0, 0, &err), 0);
        history_render(&h, &out, 1200);
        assert_true(token_estimate(out.data, out.len) <= 1200);
        assert_non_null(strstr(out.data, label));
        trimmed += strstr(out.data, "earlier steps omitted") != NULL;
        if (prev && strncmp(out.data, prev, strlen(prev)) != 0) breaks++;
        free(prev);
        prev = strbuf_take(&out);
        strbuf_free(&text);
    }
    fprintf(stderr, "history window: %d of 40 renderings trimmed, %d broke the previous prefix\n", trimmed, breaks);
    assert_true(trimmed > 20);
    assert_true(breaks > 0 && breaks <= trimmed / 2);
    free(prev);
    history_free(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_parameter_checks),
        cmocka_unit_test(test_stage_protocol),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_every_workflow_ends_within_its_bound),
        cmocka_unit_test(test_prompts_stay_under_the_cap),
        cmocka_unit_test(test_system_prompt_is_a_shared_prefix),
        cmocka_unit_test(test_lora_context_is_shared_across_adapters),
        cmocka_unit_test(test_codegen_hard_tasks_retry_more),
        cmocka_unit_test(test_codegen_report_reveals_the_branch),
        cmocka_unit_test(test_factcheck_more_facts_more_rounds),
        cmocka_unit_test(test_mapreduce_stage_width_is_the_fanout),
        cmocka_unit_test(test_pipeline_is_static),
        cmocka_unit_test(test_agent_loops_continue_the_previous_prompt),
        cmocka_unit_test(test_pipeline_task_block_is_shared),
        cmocka_unit_test(test_edit_replay_edits_one_word),
        cmocka_unit_test(test_cross_tenant_labels_and_popularity),
        cmocka_unit_test(test_templates_repeat_schemas_at_shifted_positions),
        cmocka_unit_test(test_text_gen_sizes_and_determinism),
        cmocka_unit_test(test_history_truncates_and_windows),
        cmocka_unit_test(test_history_window_moves_in_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
