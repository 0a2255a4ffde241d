/*
 * templates — template-heavy tool use for cross-query KV reuse: the same tool schemas, preambles
 * and reasoning scaffold recur in every request, but at shifted positions.
 *   Router → Caller (one per needed tool call, → tool result) … → Responder → END
 * Prompt = the agent's preamble (a shared prefix) + the workflow's session header (private,
 * 20–160 tokens, so everything after it moves) + tool schemas from a shared library of LIBRARY
 * tools (the Router sees 5–9 candidates drawn by Zipf popularity in a per-workflow order; each
 * Caller sees the one tool it calls) + history + (Callers) the shared scaffold + instruction.
 * Hidden state: how many tool calls the request needs (1–3, stated in the request) and tool
 * failures: a call fails with a timeout 10% of the time and is retried once.
 */
#include <stdio.h>
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "tool_schemas.h"
#include "workload_kind.h"

enum { ROUTER, CALLER, RESPONDER, N_AGENTS };
enum { MAX_CALLS = 3, MIN_CANDIDATES = 5, MAX_CANDIDATES = 9, SCHEMA_TOKENS = 150, SCAFFOLD_TOKENS = 120 };

static const char *const library[] = {
    "get_weather",   "search_flights", "book_hotel",      "convert_currency", "lookup_invoice",    "create_ticket",
    "send_email",    "query_database", "translate_text",  "get_stock_quote",  "schedule_meeting",  "search_web",
    "read_calendar", "update_crm",     "fetch_order",     "refund_payment",   "geocode_address",   "summarize_pdf",
    "list_files",    "run_sql_report", "check_inventory", "track_shipment",   "get_exchange_rate", "post_message",
};
#define LIBRARY ((int)(sizeof library / sizeof library[0]))

static const AgentSpec agent_specs[N_AGENTS] = {
    {"router", NULL, "You read the user's request and choose which of the available tools to call, in order.", 420, NULL, 0},
    {"caller", NULL, "You call one tool with exactly the arguments the request needs, as a JSON object.", 380, NULL, 0},
    {"responder", NULL, "You answer the user from the tool results, briefly and precisely.", 400, NULL, 0},
};
static const int output_mean[N_AGENTS] = {90, 70, 200};
static const int output_max[N_AGENTS] = {256, 192, 512};

typedef struct {
    AgentProfile profiles[N_AGENTS];
    char *schemas[LIBRARY];
    char *scaffold; /* the chain-of-thought scaffold every Caller prompt repeats */
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    char *session;                  /* private header */
    int candidates[MAX_CANDIDATES]; /* library indices, in this workflow's order */
    int n_candidates;
    int needed, done, retried; /* tool calls needed, made successfully; retry used on this call */
    int next_agent;            /* -1 once over */
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profiles_free(s->profiles, N_AGENTS);
    for (int i = 0; i < LIBRARY; i++) free(s->schemas[i]);
    free(s->scaffold);
    free(s);
}

static char *build_scaffold(const WorkloadParams *p) {
    WlRng r = wl_rng_named("templates-scaffold");
    StrBuf b = {0};
    strbuf_append(&b, "### Reasoning steps\nThink step by step before calling the tool:\n");
    for (int step = 1; step <= 4; step++) {
        strbuf_appendf(&b, "Step %d: ", step);
        text_gen(&b, &r, TEXT_PROSE, wl_scaled(p, SCAFFOLD_TOKENS / 4));
    }
    strbuf_append_char(&b, '\n');
    return strbuf_take(&b);
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profiles_build(s->profiles, agent_specs, N_AGENTS, "templates",
                             "a tool-using assistant platform", p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    int built = 1;
    for (int i = 0; i < LIBRARY; i++) {
        StrBuf b = {0};
        tool_schema_append(&b, library[i], wl_scaled(p, SCHEMA_TOKENS));
        s->schemas[i] = strbuf_take(&b);
        built &= s->schemas[i] != NULL;
    }
    s->scaffold = build_scaffold(p);
    if (!built || !s->scaffold) {
        braid_error_set(err, "out of memory building the tool library");
        shared_free(s);
        return NULL;
    }
    return s;
}

static void flow_free(void *flow) {
    Flow *f = flow;
    if (!f) return;
    history_free(&f->history);
    free(f->session);
    free(f);
}

/* Distinct candidate tools by popularity, in a per-workflow order. */
static void pick_candidates(Flow *f) {
    f->n_candidates = wl_rng_range(&f->rng, MIN_CANDIDATES, MAX_CANDIDATES);
    for (int k = 0; k < f->n_candidates; k++) {
        int t, fresh;
        do {
            t = wl_rng_zipf(&f->rng, LIBRARY, 1.0);
            fresh = 1;
            for (int j = 0; j < k; j++) fresh &= f->candidates[j] != t;
        } while (!fresh);
        f->candidates[k] = t;
    }
    wl_rng_shuffle(&f->rng, f->candidates, f->n_candidates);
}

static int write_session_and_request(Flow *f, BraidError *err) {
    StrBuf b = {0};
    strbuf_appendf(&b, "### Session %08llx\nUser: ", (unsigned long long)(wl_rng_next(&f->rng) & 0xffffffffULL));
    text_gen_person(&b, &f->rng);
    strbuf_appendf(&b, ", %s office. Notes: ", text_gen_word(&f->rng, WORD_PLACE));
    text_gen(&b, &f->rng, TEXT_PROSE, wl_scaled(f->p, wl_rng_range(&f->rng, 20, 160)));
    if (!(f->session = strbuf_take(&b))) return braid_error_set(err, "out of memory");
    StrBuf r = {0};
    text_gen_question(&r, &f->rng);
    strbuf_append_char(&r, ' ');
    text_gen_sentence(&r, &f->rng);
    strbuf_appendf(&r, "\nThis request needs %d tool call%s.", f->needed, f->needed > 1 ? "s" : "");
    int rc = strbuf_failed(&r) ? braid_error_set(err, "out of memory") : history_add(&f->history, "Request", r.data, 0, 1, err);
    strbuf_free(&r);
    return rc;
}

static void *flow_create(const void *shared, const WorkloadParams *p, int index, BraidError *err) {
    (void)shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    pick_candidates(f);
    f->needed = wl_rng_range(&f->rng, 1, MAX_CALLS);
    if (write_session_and_request(f, err)) {
        flow_free(f);
        return NULL;
    }
    f->next_agent = ROUTER;
    return f;
}

/* The schemas part: all candidates for the Router, the tool being called for a Caller. */
static int append_schemas(StrBuf *b, const Shared *s, const Flow *f) {
    if (f->next_agent == ROUTER) {
        strbuf_append(b, "### Available tools\n");
        for (int k = 0; k < f->n_candidates; k++) strbuf_append(b, s->schemas[f->candidates[k]]);
    } else if (f->next_agent == CALLER) {
        strbuf_append(b, "### Tool to call\n");
        strbuf_append(b, s->schemas[f->candidates[f->done % f->n_candidates]]);
    }
    strbuf_append_char(b, '\n');
    return strbuf_failed(b) ? -1 : 0;
}

static const char *instruction_for(int agent) {
    switch (agent) {
    case ROUTER: return "List the tools to call, in order, with one line of reasoning for each.";
    case CALLER: return "Call the tool above: output only the JSON arguments.";
    default: return "Answer the user's request from the tool results above.";
    }
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->next_agent < 0) return 0;
    const AgentProfile *agent = &s->profiles[f->next_agent];
    StrBuf schemas = {0}, tail = {0};
    if (f->next_agent == CALLER) strbuf_append(&tail, s->scaffold);
    wl_append_instruction(&tail, agent->spec->name, instruction_for(f->next_agent));
    int rc = append_schemas(&schemas, s, f) || strbuf_failed(&tail) ? braid_error_set(err, "out of memory") : 0;
    const char *head[] = {agent->head, f->session, schemas.data};
    char *prompt = rc ? NULL : wl_prompt_build(head, 3, &f->history, tail.data, wl_prompt_cap(f->p), err);
    strbuf_free(&schemas);
    strbuf_free(&tail);
    if (!prompt) return -1;
    int max_tokens = wl_scaled_output(f->p, output_max[f->next_agent]);
    int expected = wl_draw_output_tokens(&f->rng, wl_scaled(f->p, output_mean[f->next_agent]), max_tokens);
    wl_call_fill(&calls[0], agent->spec->name, NULL, NULL, prompt, max_tokens, 0.0, expected);
    return 1;
}

/* The tool's result after a Caller step; a timeout is retried once. */
static int add_tool_result(Flow *f, BraidError *err) {
    int failed = !f->retried && wl_rng_chance(&f->rng, 0.10);
    const char *tool = library[f->candidates[f->done % f->n_candidates]];
    StrBuf b = {0};
    if (failed) {
        strbuf_appendf(&b, "error: %s timed out after 30 s; retry the call.", tool);
        f->retried = 1;
    } else {
        text_gen(&b, &f->rng, TEXT_LOG, wl_scaled(f->p, wl_rng_range(&f->rng, 60, 150)));
        f->done++;
        f->retried = 0;
    }
    char label[64];
    snprintf(label, sizeof label, "Tool result: %s", tool);
    int rc = strbuf_failed(&b) ? braid_error_set(err, "out of memory") : history_add(&f->history, label, b.data, 0, 0, err);
    strbuf_free(&b);
    f->next_agent = f->done >= f->needed ? RESPONDER : CALLER;
    return rc;
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("templates", 1, n, err)) return -1;
    int agent = f->next_agent;
    if (wl_add_output(&f->history, &s->profiles[agent], wl_output(outputs, 0), f->p, output_max[agent], err)) return -1;
    switch (agent) {
    case ROUTER: f->next_agent = CALLER; return 0;
    case CALLER: return add_tool_result(f, err);
    default: f->next_agent = -1; return 0;
    }
}

const WorkloadKind wl_kind_templates = {
    .name = "templates",
    .summary = "tool schemas and preambles repeated at shifted positions (cross-query reuse)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
