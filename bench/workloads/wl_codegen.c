/*
 * codegen — SWE-bench + AutoGen-style retry loops:
 *   Planner (read_file) → Planner → Coder → Tester (run_tests) → Tester →
 *     (all tests pass: END | else Analyzer → Coder → Tester (run_tests) → Tester → …)
 * Prompts are laid out as an AutoGen group chat: each agent's system message (its head), then the
 * shared conversation — every agent's messages and every tool result, in order. A tool-using turn
 * is two requests, as AutoGen runs it: the agent's tool call, the executor's result posted to the
 * chat, then the same agent again with that result (Planner: read_file on the code the issue is
 * about; Tester: run_tests, then its summary). Requests of one turn after the first carry no new
 * instruction, so each starts with its predecessor's whole prompt.
 * Hidden state: how many bugs the current patch still has. The task states its difficulty (which
 * sets the initial bug count; 15% of labels are wrong), and the test report the workload appends
 * after the Tester's tool call says how many tests failed (roughly twice the remaining bugs; a
 * passing patch fails one flaky test 6% of the time). Noise-free (WorkloadParams.noise_free): every
 * label true and no flaky test, the draws still made so the rest of the workflow stays the same. Each Coder attempt fixes each bug with
 * probability 0.55 and adds a regression with probability 0.1. At most MAX_ATTEMPTS Coder attempts,
 * so at most 2 + 4 * MAX_ATTEMPTS - 1 = 25 requests.
 */
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { PLANNER, CODER, TESTER, ANALYZER, N_AGENTS };
enum { MAX_ATTEMPTS = 6 };

/* The requests of a workflow, in the order the chat runs them; each belongs to one agent. */
typedef enum { STEP_PLAN_READ, STEP_PLAN, STEP_CODE, STEP_TEST_RUN, STEP_TEST_SUMMARY, STEP_ANALYZE, STEP_END } Step;
static const int step_agent[] = {PLANNER, PLANNER, CODER, TESTER, TESTER, ANALYZER};

static const char *const planner_tools[] = {"search_repo", "read_file", "list_directory", NULL};
static const char *const coder_tools[] = {"read_file", "write_file", "apply_patch", "run_shell", NULL};
static const char *const tester_tools[] = {"run_tests", "read_file", "run_shell", NULL};
static const char *const analyzer_tools[] = {"read_file", "search_repo", "read_logs", NULL};

static const AgentSpec agent_specs[N_AGENTS] = {
    {"planner", NULL, "You read the issue and the repository and write a short, ordered plan for the fix.", 380, planner_tools,
     110},
    {"coder", NULL, "You implement the plan as a patch to the repository, written as a unified diff.", 420, coder_tools, 110},
    {"tester", NULL, "You write tests for the patch, run the test suite and report what passed and what failed.", 380,
     tester_tools, 110},
    {"analyzer", NULL, "You read failing test output and explain the root cause and what the next patch must change.", 380,
     analyzer_tools, 110},
};

/* Mean output length and max_tokens per step at scale 1: a tool call is short, a plan, a patch, the
 * tests written, a summary and an analysis longer. */
static const int output_mean[] = {60, 220, 380, 180, 100, 220};
static const int output_max[] = {192, 512, 768, 384, 256, 512};

static const char *const difficulty_names[] = {"easy", "medium", "hard"};

typedef struct {
    AgentProfile profiles[N_AGENTS];
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    Step next;      /* the next request; STEP_END once the workflow is over */
    int bugs;       /* hidden: bugs in the current patch */
    int failed;     /* tests the last run_tests reported failing */
    int tests;      /* size of the test suite */
    int attempts;   /* Coder calls so far */
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profiles_free(s->profiles, N_AGENTS);
    free(s);
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profiles_build(s->profiles, agent_specs, N_AGENTS, "codegen",
                             "a software engineering team that resolves GitHub issues", p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    return s;
}

/* The issue: repository, title, stated difficulty, description and the code it is about. */
static void write_task(StrBuf *b, Flow *f, int stated_difficulty) {
    strbuf_append(b, "Repository: ");
    text_gen_identifier(b, &f->rng);
    strbuf_append_char(b, '/');
    text_gen_identifier(b, &f->rng);
    strbuf_appendf(b, "\nIssue #%d: ", wl_rng_range(&f->rng, 100, 99999));
    text_gen_title(b, &f->rng, wl_rng_range(&f->rng, 3, 6));
    strbuf_appendf(b, "\nDifficulty: %s\n\n", difficulty_names[stated_difficulty]);
    text_gen(b, &f->rng, TEXT_PROSE, wl_scaled(f->p, 250));
    strbuf_append(b, "Relevant code:\n");
    text_gen(b, &f->rng, TEXT_CODE, wl_scaled(f->p, 160));
}

static void flow_free(void *flow) {
    Flow *f = flow;
    if (!f) return;
    history_free(&f->history);
    free(f);
}

static void *flow_create(const void *shared, const WorkloadParams *p, int index, BraidError *err) {
    (void)shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    static const double difficulty_weights[] = {0.35, 0.40, 0.25};
    int difficulty = wl_rng_weighted(&f->rng, difficulty_weights, 3);
    int stated = wl_rng_chance(&f->rng, 0.15) ? (difficulty + wl_rng_range(&f->rng, 1, 2)) % 3 : difficulty;
    if (p->noise_free) stated = difficulty;
    f->bugs = difficulty == 0 ? 1 : difficulty == 1 ? wl_rng_range(&f->rng, 1, 3) : wl_rng_range(&f->rng, 3, 6);
    f->tests = wl_rng_range(&f->rng, 8, 24);
    f->next = STEP_PLAN_READ;
    StrBuf task = {0};
    write_task(&task, f, stated);
    int rc =
        strbuf_failed(&task) ? braid_error_set(err, "out of memory") : history_add(&f->history, "Issue", task.data, 0, 1, err);
    /* The chat's opening request to the Planner; its two requests follow it. */
    if (rc == 0)
        rc = history_add(&f->history, "Instruction",
                         "Planner: find the code the issue is about with search_repo and read_file, then write a numbered plan "
                         "for the fix: the files to change, the change in each, and how to test it.",
                         0, 0, err);
    strbuf_free(&task);
    if (rc) {
        flow_free(f);
        return NULL;
    }
    return f;
}

static const char *instruction_for(const Flow *f) {
    if (f->next == STEP_CODE)
        return f->attempts == 0 ? "Implement the plan. Output the complete patch as a unified diff."
                                : "Revise the patch so that the failing tests pass, following the analysis above. Output the "
                                  "complete patch as a unified diff.";
    return "Explain why the tests above failed and what the next patch must change.";
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->next == STEP_END) return 0;
    const AgentProfile *agent = &s->profiles[step_agent[f->next]];
    int mean = output_mean[f->next], max = output_max[f->next];
    /* Single-request turns end in the manager's instruction; multi-request turns were opened by an
     * instruction in the chat and continue it. */
    if (f->next == STEP_CODE || f->next == STEP_ANALYZE)
        return wl_agent_stage(agent, &f->history, instruction_for(f), f->p, &f->rng, mean, max, &calls[0], err);
    return wl_agent_turn(agent, NULL, &f->history, NULL, f->p, &f->rng, mean, max, &calls[0], err);
}

/* The read_file result the executor posts after the Planner's tool call: the module the issue is
 * about, private to the workflow (SWE-bench tasks each point at their own code). */
static int add_source_file(Flow *f, BraidError *err) {
    StrBuf b = {0};
    strbuf_append(&b, "File: src/");
    text_gen_identifier(&b, &f->rng);
    strbuf_append(&b, "/");
    text_gen_identifier(&b, &f->rng);
    strbuf_append(&b, ".py\n");
    text_gen(&b, &f->rng, TEXT_CODE, wl_scaled(f->p, 600));
    int rc = strbuf_failed(&b) ? braid_error_set(err, "out of memory")
                               : history_add(&f->history, "Tool: read_file", b.data, 0, 0, err);
    strbuf_free(&b);
    return rc;
}

/* The patch attempt changes the hidden bug count: fixes, and now and then a regression. */
static void apply_attempt(Flow *f) {
    int left = 0;
    for (int i = 0; i < f->bugs; i++) left += !wl_rng_chance(&f->rng, 0.55);
    if (wl_rng_chance(&f->rng, 0.10)) left++;
    f->bugs = left;
    f->attempts++;
}

/* How many tests fail for the current patch: about two per bug, a rare flaky failure when clean. */
static int failing_tests(Flow *f) {
    if (f->bugs == 0) return wl_rng_chance(&f->rng, 0.06) && !f->p->noise_free ? 1 : 0;
    int failed = f->bugs + wl_rng_range(&f->rng, 0, f->bugs) + wl_rng_range(&f->rng, 0, 1);
    return failed > f->tests ? f->tests : failed;
}

/* The run_tests tool output the workload appends after a Tester call. */
static int add_test_report(Flow *f, BraidError *err) {
    int failed = failing_tests(f);
    StrBuf b = {0};
    strbuf_appendf(&b, "collected %d items (attempt %d)\n", f->tests, f->attempts);
    for (int i = 0; i < failed && i < 8; i++) {
        strbuf_append(&b, "FAILED tests/test_");
        text_gen_identifier(&b, &f->rng);
        strbuf_append(&b, ".py::test_");
        text_gen_identifier(&b, &f->rng);
        strbuf_append(&b, " - AssertionError: ");
        text_gen_sentence(&b, &f->rng);
        strbuf_append_char(&b, '\n');
    }
    if (failed > 8) strbuf_appendf(&b, "... and %d more failures\n", failed - 8);
    if (failed == 0)
        strbuf_appendf(&b, "Result: 0 of %d tests failed; all tests passed.", f->tests);
    else
        strbuf_appendf(&b, "Result: %d of %d tests failed.", failed, f->tests);
    int rc = strbuf_failed(&b) ? braid_error_set(err, "out of memory")
                               : history_add(&f->history, "Tool: run_tests", b.data, 0, 0, err);
    strbuf_free(&b);
    f->failed = failed;
    return rc;
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("codegen", 1, n, err)) return -1;
    Step step = f->next;
    if (wl_add_output(&f->history, &s->profiles[step_agent[step]], wl_output(outputs, 0), f->p, output_max[step], err)) return -1;
    switch (step) {
    case STEP_PLAN_READ: f->next = STEP_PLAN; return add_source_file(f, err);
    case STEP_PLAN: f->next = STEP_CODE; return 0;
    case STEP_CODE:
        apply_attempt(f);
        f->next = STEP_TEST_RUN;
        return history_add(&f->history, "Instruction",
                           "Tester: write tests for the latest patch, run the test suite with run_tests and summarize the "
                           "results.",
                           0, 0, err);
    case STEP_TEST_RUN: f->next = STEP_TEST_SUMMARY; return add_test_report(f, err);
    case STEP_TEST_SUMMARY:
        f->next = f->failed == 0 || f->attempts >= MAX_ATTEMPTS ? STEP_END : STEP_ANALYZE;
        return 0;
    default: f->next = STEP_CODE; return 0;
    }
}

const WorkloadKind wl_kind_codegen = {
    .name = "codegen",
    .summary = "Planner -> Coder -> Tester, retried via Analyzer until the tests pass (SWE-bench + AutoGen)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
