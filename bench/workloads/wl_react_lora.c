/*
 * react-lora — ForkKV's sequential ReAct pattern with one LoRA adapter per agent:
 *   Planner → Actor (→ tool, 0.1 s, 100-token reply) → Actor … → Answerer → END
 * Every prompt opens with the same large static context (context_tokens), then the agent's own
 * short head, then the workflow's growing thought/observation history. Outputs are limited to 256
 * tokens. Hidden state: how many facts the question needs (1–4, stated in the question) and how
 * many the lookups have found (each lookup finds one with probability 0.65; every observation
 * states the running count). Noise: the Actor answers early 8% of the time. At most MAX_ACTS
 * Actor steps.
 */
#include <stdlib.h>

#include "lora_context.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { PLANNER, ACTOR, ANSWERER, N_AGENTS };
enum { MAX_ACTS = 6 };

static const char *const actor_tools[] = {"lookup_section", "search_document", NULL};

static const AgentSpec agent_specs[N_AGENTS] = {
    {"planner", "lora-planner", "You plan which parts of the reference document answer the question.", 120, NULL, 0},
    {"actor", "lora-actor", "You reason one step at a time and call one tool per step: Thought, then Action.", 120, actor_tools,
     80},
    {"answerer", "lora-answerer", "You write the final answer from the observations gathered.", 120, NULL, 0},
};

static const int output_mean[N_AGENTS] = {150, 110, 180};

static const char *const instructions[N_AGENTS] = {
    "Plan the lookups needed to answer the question.",
    "Write your next Thought and one Action (a tool call).",
    "Write the final answer with the sections it relies on.",
};

typedef struct {
    AgentProfile profiles[N_AGENTS];
    char *context;
    int context_tokens; /* estimated */
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    int next_agent; /* -1 once over */
    double delay_s; /* before the next call: the tool's latency when a tool just ran */
    int needed;     /* hidden: facts the question needs */
    int found;      /* hidden: facts found so far */
    int acts;
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profiles_free(s->profiles, N_AGENTS);
    free(s->context);
    free(s);
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    s->context = lora_context_build(p, &s->context_tokens, err);
    if (s->context && agent_profiles_build(s->profiles, agent_specs, N_AGENTS, "react-lora",
                             "a ReAct team reading a shared reference document", p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    if (!s->context) {
        shared_free(s);
        return NULL;
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
    (void)shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    f->needed = wl_rng_range(&f->rng, 1, 4);
    StrBuf q = {0};
    strbuf_append(&q, "Question: ");
    text_gen_question(&q, &f->rng);
    strbuf_appendf(&q, "\nAnswering it needs facts from %d section%s of the document.", f->needed, f->needed > 1 ? "s" : "");
    int rc = strbuf_failed(&q) ? braid_error_set(err, "out of memory") : history_add(&f->history, "Question", q.data, 0, 1, err);
    strbuf_free(&q);
    if (rc) {
        flow_free(f);
        return NULL;
    }
    f->next_agent = PLANNER;
    return f;
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->next_agent < 0) return 0;
    const AgentProfile *agent = &s->profiles[f->next_agent];
    StrBuf tail = {0};
    wl_append_instruction(&tail, agent->spec->name, instructions[f->next_agent]);
    if (strbuf_failed(&tail)) return braid_error_set(err, "out of memory");
    const char *head[] = {s->context, agent->head};
    char *prompt = wl_prompt_build(head, 2, &f->history, tail.data, lora_prompt_cap(f->p, s->context_tokens), err);
    strbuf_free(&tail);
    if (!prompt) return -1;
    int max_tokens = wl_scaled_output(f->p, LORA_MAX_OUTPUT_TOKENS);
    int expected = wl_draw_output_tokens(&f->rng, wl_scaled(f->p, output_mean[f->next_agent]), max_tokens);
    wl_call_fill(&calls[0], agent->spec->name, NULL, agent->spec->adapter, prompt, max_tokens, f->delay_s, expected);
    return 1;
}

/* The lookup tool's observation after an Actor step, then the next agent. */
static int observe(Flow *f, BraidError *err) {
    f->acts++;
    if (f->found < f->needed) f->found += wl_rng_chance(&f->rng, 0.65);
    StrBuf b = {0};
    lora_tool_reply(&b, &f->rng, f->p);
    strbuf_appendf(&b, "Facts found so far: %d of %d.", f->found, f->needed);
    int rc = strbuf_failed(&b) ? braid_error_set(err, "out of memory")
                               : history_add(&f->history, "Observation from lookup_section", b.data, 0, 0, err);
    strbuf_free(&b);
    if (rc) return -1;
    int answer = f->found >= f->needed || f->acts >= MAX_ACTS || wl_rng_chance(&f->rng, 0.08);
    f->next_agent = answer ? ANSWERER : ACTOR;
    f->delay_s = LORA_TOOL_DELAY_S;
    return 0;
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("react-lora", 1, n, err)) return -1;
    int agent = f->next_agent;
    if (wl_add_output(&f->history, &s->profiles[agent], wl_output(outputs, 0), f->p, LORA_MAX_OUTPUT_TOKENS, err)) return -1;
    f->delay_s = 0;
    switch (agent) {
    case PLANNER: f->next_agent = ACTOR; return 0;
    case ACTOR: return observe(f, err);
    default: f->next_agent = -1; return 0;
    }
}

const WorkloadKind wl_kind_react_lora = {
    .name = "react-lora",
    .summary = "ReAct loop on a large shared context, a LoRA adapter per agent, 0.1 s tools (ForkKV)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
