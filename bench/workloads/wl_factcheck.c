/*
 * factcheck — HoVer + LangChain-style iterative refinement:
 *   Decomposer → Retriever × k → Verifier → (supported: END | else Refiner → Retriever × k → Verifier → …)
 * The Retriever is a LangChain agent loop (ReAct): each of its requests issues one wiki_search for
 * one fact not yet supported, the search result is appended as the observation, and the next
 * request continues the same scratchpad (no new instruction: it starts with the previous request's
 * whole prompt). A round searches once per fact unsupported when it starts (at most
 * MAX_SEARCHES), as multi-hop retrieval does one hop per fact. Every prompt is the agent's head,
 * then the shared history (the claim, each agent's messages, every observation), as a LangGraph
 * multi-agent graph passes its message state.
 * Each search result: two distinct passages (HoVer's evidence is Wikipedia introductions) from a
 * shared corpus of articles (Zipf popularity, so popular passages recur across workflows at
 * shifted positions) and an evidence line "Evidence coverage: 2 of 3 facts supported".
 * Hidden state: how many facts the claim links (2–4, stated in the claim) and how many are
 * supported so far; each search supports the fact it looks for with probability 0.5.
 * Noise: a fully supported claim is double-checked (another round) 7% of the time; an unsupported
 * one is given up ("not enough info") 7% of the time; neither when WorkloadParams.noise_free (the
 * draws still made, so the rest of the workflow stays the same). At most MAX_ROUNDS retrieval rounds, so at
 * most 1 + MAX_ROUNDS * (MAX_SEARCHES + 1) + MAX_ROUNDS - 1 = 20 requests.
 */
#include <stdio.h>
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { DECOMPOSER, RETRIEVER, VERIFIER, REFINER, N_AGENTS };
enum { MAX_ROUNDS = 4, MAX_SEARCHES = 3, CORPUS_DOCS = 48, DOCS_PER_SEARCH = 2 };

static const char *const decomposer_tools[] = {"lookup_entity", NULL};
static const char *const retriever_tools[] = {"wiki_search", "fetch_page", NULL};
static const char *const verifier_tools[] = {"lookup_entity", "compare_dates", NULL};
static const char *const refiner_tools[] = {"wiki_search", NULL};

static const AgentSpec agent_specs[N_AGENTS] = {
    {"decomposer", NULL, "You split a claim into the separate facts that must each be checked.", 360, decomposer_tools, 110},
    {"retriever", NULL, "You write search queries that find evidence for the facts not yet supported.", 320, retriever_tools,
     110},
    {"verifier", NULL,
     "You check each fact against the retrieved passages and give a verdict: SUPPORTED, REFUTED or NOT ENOUGH INFO.", 380,
     verifier_tools, 110},
    {"refiner", NULL, "You rewrite the open sub-claims into sharper questions for the next search round.", 320, refiner_tools,
     110},
};

static const int output_mean[N_AGENTS] = {160, 60, 170, 120}; /* a Retriever request is one search call */
static const int output_max[N_AGENTS] = {384, 256, 384, 256};

typedef struct {
    AgentProfile profiles[N_AGENTS];
    char *docs[CORPUS_DOCS]; /* "[title]\nbody" — the shared corpus */
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    int next_agent; /* -1 once over */
    int facts;      /* hidden: facts the claim links (stated in the claim) */
    int supported;  /* hidden: facts supported so far (stated after each search) */
    int rounds;     /* retrieval rounds so far */
    int searches;   /* searches left in the current round */
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profiles_free(s->profiles, N_AGENTS);
    for (int i = 0; i < CORPUS_DOCS; i++) free(s->docs[i]);
    free(s);
}

/* Article i of the corpus: the same text in every run (it is the dataset, not the workflow). */
static char *corpus_doc(const WorkloadParams *p, int i) {
    char name[32];
    snprintf(name, sizeof name, "doc%d", i);
    WlRng r = wl_rng_named2("factcheck-corpus", name);
    StrBuf b = {0};
    strbuf_append(&b, "[");
    text_gen_title(&b, &r, wl_rng_range(&r, 2, 4));
    strbuf_append(&b, "]\n");
    text_gen(&b, &r, TEXT_ENCYCLOPEDIA, wl_scaled(p, 170)); /* a Wikipedia introduction */
    return strbuf_take(&b);
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profiles_build(s->profiles, agent_specs, N_AGENTS, "factcheck",
                             "a fact-verification pipeline over an encyclopedia", p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    for (int i = 0; i < CORPUS_DOCS; i++) {
        if (!(s->docs[i] = corpus_doc(p, i))) {
            braid_error_set(err, "out of memory building the corpus");
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

static void write_claim(StrBuf *b, Flow *f) {
    strbuf_append(b, "Claim: ");
    text_gen_person(b, &f->rng);
    strbuf_appendf(b, ", who was born in %s, ", text_gen_word(&f->rng, WORD_PLACE));
    text_gen_sentence(b, &f->rng);
    strbuf_appendf(b, "\nThe claim links %d separate facts.\n\nBackground: ", f->facts);
    text_gen(b, &f->rng, TEXT_PROSE, wl_scaled(f->p, 80));
}

static void *flow_create(const void *shared, const WorkloadParams *p, int index, BraidError *err) {
    (void)shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    static const double hop_weights[] = {0.4, 0.35, 0.25}; /* 2-, 3-, 4-hop claims, as in HoVer */
    f->facts = 2 + wl_rng_weighted(&f->rng, hop_weights, 3);
    f->next_agent = DECOMPOSER;
    StrBuf claim = {0};
    write_claim(&claim, f);
    int rc =
        strbuf_failed(&claim) ? braid_error_set(err, "out of memory") : history_add(&f->history, "Claim", claim.data, 0, 1, err);
    strbuf_free(&claim);
    if (rc) {
        flow_free(f);
        return NULL;
    }
    return f;
}

static const char *instruction_for(int agent) {
    switch (agent) {
    case DECOMPOSER: return "List the separate facts the claim depends on, one per line.";
    case VERIFIER: return "Check every fact against the passages above and give the verdict for the claim.";
    default: return "Rewrite the facts that are still unsupported into sharper questions for the next search.";
    }
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->next_agent < 0) return 0;
    const AgentProfile *agent = &s->profiles[f->next_agent];
    int mean = output_mean[f->next_agent], max = output_max[f->next_agent];
    if (f->next_agent == RETRIEVER) /* the agent loop: the round's instruction is in the history */
        return wl_agent_turn(agent, NULL, &f->history, NULL, f->p, &f->rng, mean, max, &calls[0], err);
    return wl_agent_stage(agent, &f->history, instruction_for(f->next_agent), f->p, &f->rng, mean, max, &calls[0], err);
}

/* A retrieval round starts: one search per fact unsupported now, announced in the history. */
static int start_round(Flow *f, BraidError *err) {
    f->rounds++;
    int missing = f->facts - f->supported;
    f->searches = missing < 1 ? 1 : missing > MAX_SEARCHES ? MAX_SEARCHES : missing;
    f->next_agent = RETRIEVER;
    return history_add(&f->history, "Instruction",
                       "Retriever: search for evidence with wiki_search, one search per fact that is not yet supported, "
                       "then hand over to the Verifier.",
                       0, 0, err);
}

/* The wiki_search output: distinct popular passages, then the coverage line. */
static int add_search_results(const Shared *s, Flow *f, BraidError *err) {
    f->searches--;
    if (f->supported < f->facts) f->supported += wl_rng_chance(&f->rng, 0.5);
    int picked[DOCS_PER_SEARCH];
    StrBuf b = {0};
    for (int k = 0; k < DOCS_PER_SEARCH; k++) {
        int d, fresh;
        do { /* distinct passages within one search */
            d = wl_rng_zipf(&f->rng, CORPUS_DOCS, 0.9);
            fresh = 1;
            for (int j = 0; j < k; j++) fresh &= picked[j] != d;
        } while (!fresh);
        picked[k] = d;
        strbuf_appendf(&b, "Passage %d: %s\n", k + 1, s->docs[d]);
    }
    strbuf_appendf(&b, "Evidence coverage: %d of %d facts supported by the passages so far.", f->supported, f->facts);
    int rc = strbuf_failed(&b) ? braid_error_set(err, "out of memory")
                               : history_add(&f->history, "Tool: wiki_search", b.data, 0, 0, err);
    strbuf_free(&b);
    return rc;
}

/* After a verdict: stop when supported (mostly), give up now and then or after MAX_ROUNDS. */
static void choose_after_verdict(Flow *f) {
    int done;
    if (f->rounds >= MAX_ROUNDS)
        done = 1;
    else if (f->supported >= f->facts)
        done = !wl_rng_chance(&f->rng, 0.07) || f->p->noise_free; /* now and then double-checked */
    else
        done = wl_rng_chance(&f->rng, 0.07) && !f->p->noise_free; /* now and then given up */
    f->next_agent = done ? -1 : REFINER;
}

static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("factcheck", 1, n, err)) return -1;
    int agent = f->next_agent;
    if (wl_add_output(&f->history, &s->profiles[agent], wl_output(outputs, 0), f->p, output_max[agent], err)) return -1;
    switch (agent) {
    case DECOMPOSER:
    case REFINER: return start_round(f, err);
    case RETRIEVER:
        if (add_search_results(s, f, err)) return -1;
        if (f->searches == 0) f->next_agent = VERIFIER;
        return 0;
    default: choose_after_verdict(f); return 0;
    }
}

const WorkloadKind wl_kind_factcheck = {
    .name = "factcheck",
    .summary = "Decomposer -> Retriever -> Verifier, refined until the claim is supported (HoVer + LangChain)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
