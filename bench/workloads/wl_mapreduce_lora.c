/*
 * mapreduce-lora — ForkKV's parallel MapReduce pattern with one LoRA adapter per agent:
 *   stage 1: fanout mappers ("mapper-0" … with adapters "lora-mapper-0" …) in ONE stage, each
 *            after a 0.1 s tool call whose 100-token reply (its part of the task) ends its prompt
 *   stage 2: the Reducer ("lora-reducer") reads every mapper's output → END
 * Every prompt opens with the same large static context (context_tokens): the fork point. Outputs
 * are limited to 256 tokens. A static pattern: no hidden state drives it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "lora_context.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { MAPPER_OUTPUT_MEAN = 160, REDUCER_OUTPUT_MEAN = 220 };

static const char *const aspects[] = {"people", "places", "dates", "causes", "outcomes", "numbers", "disputes", "sources"};
#define N_ASPECTS ((int)(sizeof aspects / sizeof aspects[0]))

typedef struct {
    char name[32], adapter[32], role[160];
    AgentSpec spec;
    AgentProfile profile;
} AgentSlot;

typedef struct {
    AgentSlot mappers[WORKLOAD_MAX_FANOUT], reducer;
    int fanout;
    char *context;
    int context_tokens; /* estimated */
} Shared;

typedef enum { STAGE_MAP, STAGE_REDUCE, STAGE_DONE } Stage;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    Stage stage;
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    for (int i = 0; i < s->fanout; i++) agent_profile_free(&s->mappers[i].profile);
    agent_profile_free(&s->reducer.profile);
    free(s->context);
    free(s);
}

static int build_agent(AgentSlot *a, const WorkloadParams *p, BraidError *err) {
    a->spec = (AgentSpec){.name = a->name, .adapter = a->adapter, .role = a->role, .guideline_tokens = 120};
    return agent_profile_build(&a->profile, "mapreduce-lora", "a map-reduce team reading a shared reference document", &a->spec,
                               p->scale, err);
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    s->context = lora_context_build(p, &s->context_tokens, err);
    if (!s->context) {
        shared_free(s);
        return NULL;
    }
    for (int i = 0; i < p->fanout; i++) {
        AgentSlot *m = &s->mappers[i];
        snprintf(m->name, sizeof m->name, "mapper-%d", i);
        snprintf(m->adapter, sizeof m->adapter, "lora-mapper-%d", i);
        snprintf(m->role, sizeof m->role,
                 "You extract from the document everything about the %s that part %d of the task asks for.",
                 aspects[i % N_ASPECTS], i + 1);
        s->fanout = i + 1; /* from here on shared_free releases this profile */
        if (build_agent(m, p, err)) {
            shared_free(s);
            return NULL;
        }
    }
    snprintf(s->reducer.name, sizeof s->reducer.name, "reducer");
    snprintf(s->reducer.adapter, sizeof s->reducer.adapter, "lora-reducer");
    snprintf(s->reducer.role, sizeof s->reducer.role, "You merge the mappers' findings into one consistent answer.");
    if (build_agent(&s->reducer, p, err)) {
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
    StrBuf t = {0};
    strbuf_append(&t, "Task: ");
    text_gen_question(&t, &f->rng);
    strbuf_append_char(&t, ' ');
    text_gen_sentence(&t, &f->rng);
    int rc = strbuf_failed(&t) ? braid_error_set(err, "out of memory") : history_add(&f->history, "Task", t.data, 0, 1, err);
    strbuf_free(&t);
    if (rc) {
        flow_free(f);
        return NULL;
    }
    return f;
}

/* One call: shared context, the agent's head, the history, then `tail`. */
static int fill_call(const Shared *s, Flow *f, const AgentSlot *a, const char *tail, double delay_s, int output_mean,
                     AgentCall *call, BraidError *err) {
    const char *head[] = {s->context, a->profile.head};
    char *prompt = wl_prompt_build(head, 2, &f->history, tail, lora_prompt_cap(f->p, s->context_tokens), err);
    if (!prompt) return -1;
    int max_tokens = wl_scaled_output(f->p, LORA_MAX_OUTPUT_TOKENS);
    int expected = wl_draw_output_tokens(&f->rng, wl_scaled(f->p, output_mean), max_tokens);
    wl_call_fill(call, a->name, NULL, a->adapter, prompt, max_tokens, delay_s, expected);
    return 0;
}

/* Mapper i's private tail: its tool reply (its part of the task), then its instruction. */
static int map_stage(const Shared *s, Flow *f, AgentCall *calls, BraidError *err) {
    for (int i = 0; i < s->fanout; i++) {
        StrBuf tail = {0};
        strbuf_appendf(&tail, "### Tool: read_part (part %d of %d)\n", i + 1, s->fanout);
        lora_tool_reply(&tail, &f->rng, f->p);
        strbuf_append(&tail, "\n");
        wl_append_instruction(&tail, s->mappers[i].name, "Extract the facts for your part of the task, with section numbers.");
        int rc = strbuf_failed(&tail)
                     ? braid_error_set(err, "out of memory")
                     : fill_call(s, f, &s->mappers[i], tail.data, LORA_TOOL_DELAY_S, MAPPER_OUTPUT_MEAN, &calls[i], err);
        strbuf_free(&tail);
        if (rc) {
            wl_calls_release(calls, i);
            return -1;
        }
    }
    return s->fanout;
}

static int reduce_stage(const Shared *s, Flow *f, AgentCall *calls, BraidError *err) {
    StrBuf tail = {0};
    wl_append_instruction(&tail, s->reducer.name, "Merge the mappers' findings above into one answer to the task.");
    int rc = strbuf_failed(&tail) ? braid_error_set(err, "out of memory")
                                  : fill_call(s, f, &s->reducer, tail.data, 0.0, REDUCER_OUTPUT_MEAN, &calls[0], err);
    strbuf_free(&tail);
    return rc ? -1 : 1;
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    switch (f->stage) {
    case STAGE_MAP: return map_stage(s, f, calls, err);
    case STAGE_REDUCE: return reduce_stage(s, f, calls, err);
    default: return 0;
    }
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->stage == STAGE_MAP) {
        if (wl_check_outputs("mapreduce-lora", s->fanout, n, err)) return -1;
        for (int i = 0; i < n; i++)
            if (wl_add_output(&f->history, &s->mappers[i].profile, wl_output(outputs, i), f->p, LORA_MAX_OUTPUT_TOKENS, err))
                return -1;
        f->stage = STAGE_REDUCE;
        return 0;
    }
    if (wl_check_outputs("mapreduce-lora", 1, n, err)) return -1;
    f->stage = STAGE_DONE;
    return 0;
}

const WorkloadKind wl_kind_mapreduce_lora = {
    .name = "mapreduce-lora",
    .summary = "fanout LoRA mappers on one shared context in one stage, then a reducer (ForkKV)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
