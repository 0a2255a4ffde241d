/*
 * edit-replay — Leyline's three-phase message-edit benchmark (its App. B), one session per
 * workflow, eight stages:
 *   build  (agent "build", 6 calls): turns 1..6 issued incrementally; call k's prompt is the
 *          system prompt, turns 1..k-1 with their replies, and user turn k
 *   edit   (agent "edit", 1 call): the conversation up to the edited turn, re-issued with the
 *          topic word of that early turn (turn 1 or 2) swapped for a same-template synonym
 *          ("risotto" → "paella"); the text around it is byte-identical
 *   replay (agent "replay", 1 call): the whole edited conversation — the build phase's last
 *          prompt with that one word changed — so everything after the edit is content-identical
 *          to the build phase, only shifted by the synonym's length difference
 * The replies kept in the conversation are those of the build phase; the edit and replay calls'
 * outputs are discarded. Sessions are themed (cooking, programming, history, science) user turns
 * built from a fixed template family around the topic word. No branching.
 */
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { TURNS = 6, BUILD_STAGES = TURNS, EDIT_STAGE = TURNS, REPLAY_STAGE = TURNS + 1, STAGES = TURNS + 2 };
enum { OUTPUT_MEAN = 180, OUTPUT_MAX = 256, USER_TURN_TOKENS = 300 };

typedef struct {
    const char *theme;
    const char *pairs[4][2]; /* topic word and its same-template synonym */
} Theme;

static const Theme themes[] = {
    {"cooking", {{"risotto", "paella"}, {"sourdough", "brioche"}, {"curry", "stew"}, {"omelette", "frittata"}}},
    {"programming", {{"Python", "Rust"}, {"recursion", "iteration"}, {"threads", "coroutines"}, {"SQL", "GraphQL"}}},
    {"history",
     {{"Rome", "Carthage"}, {"Napoleon", "Wellington"}, {"the Renaissance", "the Reformation"}, {"Byzantium", "Venice"}}},
    {"science",
     {{"photosynthesis", "respiration"}, {"gravity", "magnetism"}, {"enzymes", "hormones"}, {"volcanoes", "glaciers"}}},
};
#define N_THEMES ((int)(sizeof themes / sizeof themes[0]))

/* The template family: one opening per turn, the topic slotted in between the two halves. */
static const char *const openings[TURNS][2] = {
    {"How do I get the consistency of ", " right when I'm a beginner?"},
    {"What are the most common mistakes people make with ", ", and how do I avoid them?"},
    {"Can you compare two approaches to ", " and say when each one works better?"},
    {"What tools or references would help me get better at ", "?"},
    {"How would an expert explain the hardest part of ", " to a student?"},
    {"Can you summarize what we discussed about ", " as a short checklist?"},
};

static const AgentSpec assistant_spec = {
    "assistant",
    NULL,
    "You answer the user's questions in a long, friendly multi-turn conversation, referring back to earlier turns.",
    950,
    NULL,
    0};

typedef struct {
    AgentProfile assistant;
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    const char *topic, *synonym;
    int edit_turn;        /* 0 or 1: which early turn's topic word the edit swaps */
    char *details[TURNS]; /* the user turn after its opening line (no topic word in it) */
    char *replies[TURNS]; /* build-phase replies */
    int stage;            /* next stage, STAGES once over */
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profile_free(&s->assistant);
    free(s);
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profile_build(&s->assistant, "edit-replay", "a general-purpose chat service", &assistant_spec, p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    return s;
}

static void flow_free(void *flow) {
    Flow *f = flow;
    if (!f) return;
    for (int i = 0; i < TURNS; i++) {
        free(f->details[i]);
        free(f->replies[i]);
    }
    free(f);
}

static void *flow_create(const void *shared, const WorkloadParams *p, int index, BraidError *err) {
    (void)shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    const Theme *theme = &themes[wl_rng_range(&f->rng, 0, N_THEMES - 1)];
    int pair = wl_rng_range(&f->rng, 0, 3);
    f->topic = theme->pairs[pair][0];
    f->synonym = theme->pairs[pair][1];
    f->edit_turn = wl_rng_range(&f->rng, 0, 1);
    for (int i = 0; i < TURNS; i++) {
        StrBuf b = {0};
        text_gen(&b, &f->rng, TEXT_PROSE, wl_scaled(p, USER_TURN_TOKENS));
        if (!(f->details[i] = strbuf_take(&b))) {
            braid_error_set(err, "out of memory");
            flow_free(f);
            return NULL;
        }
    }
    return f;
}

/* "### User\n<opening with word>\n<details>\n\n" */
static void append_user_turn(StrBuf *b, const Flow *f, int turn, const char *word) {
    strbuf_appendf(b, "### User\n%s%s%s\n%s\n\n", openings[turn][0], word, openings[turn][1], f->details[turn]);
}

/* The conversation through user turn `last` (replies for the turns before it), with the edit
 * applied when `edited`, ending where the assistant's reply goes. */
static char *conversation_prompt(const Shared *s, const Flow *f, int last, int edited) {
    StrBuf b = {0};
    strbuf_append(&b, s->assistant.head);
    for (int t = 0; t <= last; t++) {
        append_user_turn(&b, f, t, edited && t == f->edit_turn ? f->synonym : f->topic);
        if (t < last) strbuf_appendf(&b, "### Assistant\n%s\n\n", f->replies[t] ? f->replies[t] : "");
    }
    strbuf_append(&b, "### Assistant\n");
    return strbuf_take(&b);
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->stage >= STAGES) return 0;
    const char *agent = f->stage < BUILD_STAGES ? "build" : f->stage == EDIT_STAGE ? "edit" : "replay";
    int last = f->stage < BUILD_STAGES ? f->stage : f->stage == EDIT_STAGE ? f->edit_turn : TURNS - 1;
    char *prompt = conversation_prompt(s, f, last, f->stage >= EDIT_STAGE);
    if (!prompt) return braid_error_set(err, "out of memory building the %s prompt", agent);
    int max_tokens = wl_scaled_output(f->p, OUTPUT_MAX);
    int expected = wl_draw_output_tokens(&f->rng, wl_scaled(f->p, OUTPUT_MEAN), max_tokens);
    wl_call_fill(&calls[0], agent, NULL, NULL, prompt, max_tokens, 0.0, expected);
    return 1;
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    (void)shared;
    Flow *f = flow;
    if (wl_check_outputs("edit-replay", 1, n, err)) return -1;
    if (f->stage < BUILD_STAGES) {
        StrBuf b = {0};
        history_append_truncated(&b, wl_output(outputs, 0), wl_scaled_output(f->p, OUTPUT_MAX));
        if (!(f->replies[f->stage] = strbuf_take(&b))) return braid_error_set(err, "out of memory");
    }
    f->stage++;
    return 0;
}

const WorkloadKind wl_kind_edit_replay = {
    .name = "edit-replay",
    .summary = "6-turn conversation, re-issued with an early word edited, replayed whole (Leyline)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
