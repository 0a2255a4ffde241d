/*
 * pipeline — FinanceBench + CrewAI-style static crew: five tasks run in sequence by five agents,
 * every task the same tool calls in every workflow, so the request sequence is fixed (the static
 * agent graph KVFlow assumes; 10 requests):
 *   Researcher (sec_search) → Researcher (fetch_filing) → Researcher → Analyst (table_lookup) →
 *   Analyst → Risk (peer_comparison) → Risk → Writer → Reviewer (table_lookup) → Reviewer → END
 * Prompts follow CrewAI's layout: the agent's system prompt (role, goal, tools: its head), then the
 * task — "Current Task:" with the task's fixed description, into which the crew's inputs are
 * interpolated (kickoff(inputs=...)): the FinanceBench document the question is about, an excerpt
 * of one of a shared set of annual reports (Zipf popularity), then the fixed expected output —
 * then "This is the context you're working with:" (the question and the final answers of the
 * upstream tasks: CrewAI passes task outputs downstream, not the agents' scratchpads), then the
 * agent executor's ReAct scratchpad: each tool call and its observation appended, the next request
 * of the same task starting with the previous one's whole prompt. So each agent's head and task
 * text are shared by every workflow, head + task + document by every workflow on the same filing
 * (popular documents are popular cache), and the rest is the workflow's own. No branching: the
 * hidden state is only which filing and question.
 */
#include <stdio.h>
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { RESEARCHER, ANALYST, RISK, WRITER, REVIEWER, N_AGENTS };
enum { FILINGS = 40 }; /* FinanceBench covers the filings of 40 companies */

static const char *const researcher_tools[] = {"fetch_filing", "sec_search", NULL};
static const char *const analyst_tools[] = {"calculator", "table_lookup", NULL};
static const char *const risk_tools[] = {"calculator", "peer_comparison", NULL};
static const char *const writer_tools[] = {"format_report", NULL};
static const char *const reviewer_tools[] = {"table_lookup", "format_report", NULL};

static const AgentSpec agent_specs[N_AGENTS] = {
    {"researcher", NULL, "You find the filing that answers the question and fetch the relevant excerpt.", 340, researcher_tools,
     110},
    {"analyst", NULL, "You compute the figures the question asks for from the filing, showing each step.", 380, analyst_tools,
     110},
    {"risk", NULL, "You assess the risks and caveats behind the analyst's figures.", 340, risk_tools, 110},
    {"writer", NULL, "You write the final answer for the client: the figure, how it was derived, and the caveats.", 360,
     writer_tools, 110},
    {"reviewer", NULL, "You review the written answer against the filing and correct any error.", 340, reviewer_tools, 110},
};

/* The static request sequence: agent, the tool it calls (NULL: the task's final answer), the tool
 * result's size (scale-1 tokens; fetch_filing returns another section of the filing, e.g. its
 * notes), output mean / max. */
typedef struct {
    int agent;
    const char *tool;
    int tool_tokens;
    int output_mean, output_max;
} PipelineStep;

enum { N_STEPS = 10 };
static const PipelineStep steps[N_STEPS] = {
    {RESEARCHER, "sec_search", 120, 60, 192}, {RESEARCHER, "fetch_filing", 500, 60, 192}, {RESEARCHER, NULL, 0, 450, 1024},
    {ANALYST, "table_lookup", 160, 60, 192},  {ANALYST, NULL, 0, 300, 640},            {RISK, "peer_comparison", 200, 60, 192},
    {RISK, NULL, 0, 220, 512},                {WRITER, NULL, 0, 380, 768},             {REVIEWER, "table_lookup", 160, 60, 192},
    {REVIEWER, NULL, 0, 160, 384},
};

/* Each agent's task: what CrewAI puts under "Current Task:" (before the interpolated document) and
 * the expected output (after it). */
static const char *const task_texts[N_AGENTS][2] = {
    {"Find the annual report that answers the client's question, fetch the sections it needs with fetch_filing and "
     "return the passages and figures the analysts will need.",
     "The filing's name and fiscal year, and the complete relevant passages with their figures."},
    {"Compute the figure the question asks for from the researcher's passages, checking every input against the "
     "filing's tables.",
     "The figure, each step of the computation, and the inputs with where they come from."},
    {"Assess what could make the analyst's figure misleading: one-off items, accounting changes, and how peers compare.",
     "A list of risks and caveats, each with its effect on the figure."},
    {"Write the answer for the client from the analysis and the risks.",
     "Three short paragraphs: the figure, how it was derived, and the caveats."},
    {"Review the written answer against the filing and correct any error.", "The corrected final answer."},
};

static const char *const metrics[] = {"operating margin", "free cash flow",      "net income growth", "debt to equity ratio",
                                      "gross margin",     "capital expenditure", "return on assets",  "revenue growth"};

typedef struct {
    AgentProfile profiles[N_AGENTS];
    char *tasks[N_AGENTS][2]; /* each task's text before and after the document: fixed, shared by every workflow */
    char *filings[FILINGS];
    char company[FILINGS][64];
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History context; /* the question and the upstream tasks' final answers */
    StrBuf scratch;  /* the current task's ReAct scratchpad: tool calls and observations */
    int step;        /* index into steps; N_STEPS once over */
    int filing;
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profiles_free(s->profiles, N_AGENTS);
    for (int i = 0; i < N_AGENTS; i++) {
        free(s->tasks[i][0]);
        free(s->tasks[i][1]);
    }
    for (int i = 0; i < FILINGS; i++) free(s->filings[i]);
    free(s);
}

static char *build_filing(const WorkloadParams *p, int i, char *company, size_t company_size) {
    char name[32];
    snprintf(name, sizeof name, "filing%d", i);
    WlRng r = wl_rng_named2("pipeline-filings", name);
    StrBuf title = {0}, b = {0};
    text_gen_title(&title, &r, 2);
    snprintf(company, company_size, "%s Corp", strbuf_str(&title));
    strbuf_free(&title);
    strbuf_appendf(&b, "%s, Form 10-K, fiscal year %d.\nItem 7. Management's Discussion and Analysis\n\n", company,
                   wl_rng_range(&r, 2019, 2023));
    text_gen(&b, &r, TEXT_FINANCE, wl_scaled(p, 1300));
    return strbuf_take(&b);
}

/* CrewAI's task prompt around the interpolated document: the description, then (after the
 * document) the expected output, the closing rule and the context header. */
static int build_task(int agent, char **before, char **after) {
    StrBuf a = {0}, b = {0};
    strbuf_appendf(&a, "Current Task: %s\n\nThe document:\n", task_texts[agent][0]);
    strbuf_appendf(&b,
                   "\n\nThis is the expected criteria for your final answer: %s\nyou MUST return the actual complete content as "
                   "the final answer, not a summary.\n\nThis is the context you're working with:\n",
                   task_texts[agent][1]);
    *before = strbuf_take(&a);
    *after = strbuf_take(&b);
    return *before && *after ? 0 : -1;
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profiles_build(s->profiles, agent_specs, N_AGENTS, "pipeline",
                             "a financial research crew that answers questions about annual reports", p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    for (int i = 0; i < N_AGENTS; i++) {
        if (build_task(i, &s->tasks[i][0], &s->tasks[i][1])) {
            braid_error_set(err, "out of memory building the tasks");
            shared_free(s);
            return NULL;
        }
    }
    for (int i = 0; i < FILINGS; i++) {
        if (!(s->filings[i] = build_filing(p, i, s->company[i], sizeof s->company[i]))) {
            braid_error_set(err, "out of memory building the filings");
            shared_free(s);
            return NULL;
        }
    }
    return s;
}

static void flow_free(void *flow) {
    Flow *f = flow;
    if (!f) return;
    history_free(&f->context);
    strbuf_free(&f->scratch);
    free(f);
}

static void *flow_create(const void *shared, const WorkloadParams *p, int index, BraidError *err) {
    const Shared *s = shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    f->filing = wl_rng_zipf(&f->rng, FILINGS, 1.0);
    StrBuf q = {0};
    strbuf_appendf(&q, "Question: What was %s's %s in the latest fiscal year, and what drove the change?\nClient notes: ",
                   s->company[f->filing], metrics[wl_rng_range(&f->rng, 0, (int)(sizeof metrics / sizeof metrics[0]) - 1)]);
    text_gen(&q, &f->rng, TEXT_PROSE, wl_scaled(p, 120));
    int rc = strbuf_failed(&q) ? braid_error_set(err, "out of memory") : history_add(&f->context, "Question", q.data, 0, 1, err);
    strbuf_free(&q);
    if (rc) {
        flow_free(f);
        return NULL;
    }
    return f;
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->step >= N_STEPS) return 0;
    const PipelineStep *st = &steps[f->step];
    const char *const *task = (const char *const *)s->tasks[st->agent];
    StrBuf head = {0}, tail = {0};
    strbuf_appendf(&head, "%s%s%s", task[0], s->filings[f->filing], task[1]);
    strbuf_appendf(&tail, "Begin! This is VERY important to you, use the tools available and give your best Final Answer, "
                          "your job depends on it!\n\n%s",
                   strbuf_str(&f->scratch));
    int rc = strbuf_failed(&head) || strbuf_failed(&tail)
                 ? braid_error_set(err, "out of memory")
                 : wl_agent_turn(&s->profiles[st->agent], head.data, &f->context, tail.data, f->p, &f->rng, st->output_mean,
                                 st->output_max, &calls[0], err);
    strbuf_free(&head);
    strbuf_free(&tail);
    return rc;
}

/* The observation of a tool call: filing-style text of the tool's size, the workflow's own. */
static void append_observation(Flow *f, const PipelineStep *st) {
    strbuf_appendf(&f->scratch, "### Tool: %s\n", st->tool);
    text_gen(&f->scratch, &f->rng, TEXT_FINANCE, wl_scaled(f->p, st->tool_tokens));
    strbuf_append(&f->scratch, "\n\n");
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("pipeline", 1, n, err)) return -1;
    const PipelineStep *st = &steps[f->step];
    const AgentProfile *agent = &s->profiles[st->agent];
    int rc = 0;
    if (st->tool) { /* the scratchpad grows by the tool call and its observation */
        strbuf_appendf(&f->scratch, "### %s\n", wl_label(agent->spec->name).text);
        history_append_truncated(&f->scratch, wl_output(outputs, 0), wl_scaled_output(f->p, st->output_max));
        strbuf_append(&f->scratch, "\n\n");
        append_observation(f, st);
        if (strbuf_failed(&f->scratch)) rc = braid_error_set(err, "out of memory");
    } else { /* the final answer goes downstream as context; the scratchpad is the task's own */
        rc = wl_add_output(&f->context, agent, wl_output(outputs, 0), f->p, st->output_max, err);
        strbuf_truncate(&f->scratch, 0);
    }
    f->step++;
    return rc;
}

const WorkloadKind wl_kind_pipeline = {
    .name = "pipeline",
    .summary = "static CrewAI crew: Researcher -> Analyst -> Risk -> Writer -> Reviewer, fixed tool calls (FinanceBench + CrewAI)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
