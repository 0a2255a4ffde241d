/*
 * pipeline — FinanceBench + CrewAI-style static pipeline, the same five sequential stages for
 * every workflow (the call graph a KVFlow-style policy assumes):
 *   Researcher → Analyst → Risk → Writer → Reviewer → END
 * After the Researcher call the workload appends the fetch_filing tool output: a long excerpt of
 * one company's annual report from a shared set of filings (Zipf popularity, so popular filings
 * recur across workflows). No branching: the hidden state is only which filing and question.
 */
#include <stdio.h>
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { RESEARCHER, ANALYST, RISK, WRITER, REVIEWER, N_AGENTS };
enum { FILINGS = 12 };

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

static const int output_mean[N_AGENTS] = {60, 300, 220, 380, 160};
static const int output_max[N_AGENTS] = {192, 640, 512, 768, 384};

static const char *const instructions[N_AGENTS] = {
    "Name the filing and the sections needed, then call fetch_filing.",
    "Compute the requested figure from the filing excerpt above. Show each step.",
    "List the risks and caveats that affect the analyst's figure.",
    "Write the answer for the client in three short paragraphs.",
    "Review the answer above against the filing and output the corrected final answer.",
};

static const char *const metrics[] = {"operating margin", "free cash flow",      "net income growth", "debt to equity ratio",
                                      "gross margin",     "capital expenditure", "return on assets",  "revenue growth"};

typedef struct {
    AgentProfile profiles[N_AGENTS];
    char *filings[FILINGS];
    char company[FILINGS][64];
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    int next_agent; /* -1 once over */
    int filing;
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profiles_free(s->profiles, N_AGENTS);
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

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profiles_build(s->profiles, agent_specs, N_AGENTS, "pipeline",
                             "a financial research crew that answers questions about annual reports", p->scale, err)) {
        shared_free(s);
        return NULL;
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
    history_free(&f->history);
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
    int rc = strbuf_failed(&q) ? braid_error_set(err, "out of memory") : history_add(&f->history, "Question", q.data, 0, 1, err);
    strbuf_free(&q);
    if (rc) {
        flow_free(f);
        return NULL;
    }
    f->next_agent = RESEARCHER;
    return f;
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->next_agent < 0) return 0;
    return wl_agent_stage(&s->profiles[f->next_agent], &f->history, instructions[f->next_agent], f->p, &f->rng,
                          output_mean[f->next_agent], output_max[f->next_agent], &calls[0], err);
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("pipeline", 1, n, err)) return -1;
    int agent = f->next_agent;
    if (wl_add_output(&f->history, &s->profiles[agent], wl_output(outputs, 0), f->p, output_max[agent], err)) return -1;
    if (agent == RESEARCHER && history_add(&f->history, "Tool: fetch_filing", s->filings[f->filing], 0, 0, err)) return -1;
    f->next_agent = agent + 1 < N_AGENTS ? agent + 1 : -1;
    return 0;
}

const WorkloadKind wl_kind_pipeline = {
    .name = "pipeline",
    .summary = "static Researcher -> Analyst -> Risk -> Writer -> Reviewer (FinanceBench + CrewAI)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
