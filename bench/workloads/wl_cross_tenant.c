/*
 * cross-tenant — Leyline's cross-tenant Zipf workload (its § 5), a separate workload from
 * edit-replay: readers of four tenants ("t0".."t3", workflow i belongs to tenant i mod 4) ask
 * questions about shared articles. Each workflow is one reading session of 1–3 questions (the
 * count is stated in its first turn) about one article drawn with Zipf popularity (s = 1) from
 * ARTICLES shared ones. Prompt = system prompt, the article, the session so far, the question.
 * The same article under different tenants is the same text in a different cache namespace.
 * In 25% of sessions a 32-token window in the middle of the article is replaced by
 * session-specific text (Leyline's edit-window arm): shared prefix, unique edit, shared suffix.
 */
#include <stdio.h>
#include <stdlib.h>

#include "agent_profile.h"
#include "text_gen.h"
#include "workload_kind.h"

enum { TENANTS = 4, ARTICLES = 8, MAX_QUESTIONS = 3, OUTPUT_MEAN = 120, OUTPUT_MAX = 256 };
enum { ARTICLE_TOKENS = 900, EDIT_WINDOW_TOKENS = 32 };

static const AgentSpec reader_spec = {
    "reader", NULL, "You answer readers' questions about the article they are reading, quoting it where it helps.", 500, NULL, 0};

typedef struct {
    AgentProfile reader;
    /* each article in three parts: the middle window is what an edited session replaces */
    char *first_half[ARTICLES], *window[ARTICLES], *second_half[ARTICLES];
} Shared;

typedef struct {
    const WorkloadParams *p;
    WlRng rng;
    History history;
    char tenant[8];
    int article;
    char *edit_window; /* replaces the article's middle window; NULL: the article as shared */
    char *question;    /* of the pending stage */
    int questions, asked;
} Flow;

static void shared_free(void *shared) {
    Shared *s = shared;
    if (!s) return;
    agent_profile_free(&s->reader);
    for (int i = 0; i < ARTICLES; i++) {
        free(s->first_half[i]);
        free(s->window[i]);
        free(s->second_half[i]);
    }
    free(s);
}

/* Article i in three parts ("### Article: title\n" opens the first). Returns 0 or -1. */
static int build_article(const WorkloadParams *p, int i, char **first, char **window, char **second) {
    char name[32];
    snprintf(name, sizeof name, "article%d", i);
    WlRng r = wl_rng_named2("cross-tenant-articles", name);
    StrBuf a = {0}, w = {0}, b = {0};
    strbuf_append(&a, "### Article: ");
    text_gen_title(&a, &r, wl_rng_range(&r, 2, 5));
    strbuf_append(&a, "\n");
    text_gen(&a, &r, TEXT_ENCYCLOPEDIA, wl_scaled(p, ARTICLE_TOKENS / 2));
    text_gen(&w, &r, TEXT_PROSE, wl_scaled(p, EDIT_WINDOW_TOKENS));
    text_gen(&b, &r, TEXT_ENCYCLOPEDIA, wl_scaled(p, ARTICLE_TOKENS / 2));
    strbuf_append(&b, "\n");
    *first = strbuf_take(&a);
    *window = strbuf_take(&w);
    *second = strbuf_take(&b);
    return *first && *window && *second ? 0 : -1;
}

static void *shared_create(const WorkloadParams *p, BraidError *err) {
    Shared *s = wl_alloc_state(sizeof *s, err);
    if (!s) return NULL;
    if (agent_profile_build(&s->reader, "cross-tenant", "a multi-tenant reading assistant", &reader_spec, p->scale, err)) {
        shared_free(s);
        return NULL;
    }
    for (int i = 0; i < ARTICLES; i++) {
        if (build_article(p, i, &s->first_half[i], &s->window[i], &s->second_half[i])) {
            braid_error_set(err, "out of memory building the articles");
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
    free(f->edit_window);
    free(f->question);
    free(f);
}

static int start_session(Flow *f, int index, BraidError *err) {
    snprintf(f->tenant, sizeof f->tenant, "t%d", index % TENANTS);
    f->article = wl_rng_zipf(&f->rng, ARTICLES, 1.0);
    f->questions = wl_rng_range(&f->rng, 1, MAX_QUESTIONS);
    if (wl_rng_chance(&f->rng, 0.25)) {
        StrBuf w = {0};
        text_gen(&w, &f->rng, TEXT_PROSE, wl_scaled(f->p, EDIT_WINDOW_TOKENS));
        if (!(f->edit_window = strbuf_take(&w))) return braid_error_set(err, "out of memory");
    }
    char intro[128];
    snprintf(intro, sizeof intro, "Reader of tenant %s; %d question%s about this article.", f->tenant, f->questions,
             f->questions > 1 ? "s" : "");
    return history_add(&f->history, "Session", intro, 0, 1, err);
}

static void *flow_create(const void *shared, const WorkloadParams *p, int index, BraidError *err) {
    (void)shared;
    Flow *f = wl_alloc_state(sizeof *f, err);
    if (!f) return NULL;
    f->p = p;
    f->rng = wl_rng_stream(p->seed, (uint64_t)index);
    if (start_session(f, index, err)) {
        flow_free(f);
        return NULL;
    }
    return f;
}

static int flow_next(const void *shared, void *flow, AgentCall *calls, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (f->asked >= f->questions) return 0;
    StrBuf q = {0}, tail = {0};
    text_gen_question(&q, &f->rng);
    free(f->question);
    f->question = strbuf_take(&q);
    if (!f->question) return braid_error_set(err, "out of memory");
    strbuf_appendf(&tail, "### Question %d\n%s\n\n", f->asked + 1, f->question);
    wl_append_instruction(&tail, "reader", "Answer the question from the article.");
    if (strbuf_failed(&tail)) return braid_error_set(err, "out of memory");
    const char *head[] = {s->reader.head, s->first_half[f->article], f->edit_window ? f->edit_window : s->window[f->article],
                          s->second_half[f->article]};
    char *prompt = wl_prompt_build(head, 4, &f->history, tail.data, wl_prompt_cap(f->p), err);
    strbuf_free(&tail);
    if (!prompt) return -1;
    int max_tokens = wl_scaled_output(f->p, OUTPUT_MAX);
    int expected = wl_draw_output_tokens(&f->rng, wl_scaled(f->p, OUTPUT_MEAN), max_tokens);
    wl_call_fill(&calls[0], "reader", f->tenant, NULL, prompt, max_tokens, 0.0, expected);
    return 1;
}

/* The question and its answer join the session, so follow-up questions see them. */
static int flow_deliver(const void *shared, void *flow, const char *const *outputs, int n, BraidError *err) {
    const Shared *s = shared;
    Flow *f = flow;
    if (wl_check_outputs("cross-tenant", 1, n, err)) return -1;
    char label[32];
    snprintf(label, sizeof label, "Question %d", ++f->asked);
    if (history_add(&f->history, label, f->question, 0, 0, err)) return -1;
    return wl_add_output(&f->history, &s->reader, wl_output(outputs, 0), f->p, OUTPUT_MAX, err);
}

const WorkloadKind wl_kind_cross_tenant = {
    .name = "cross-tenant",
    .summary = "tenants t0..t3 ask about shared articles of Zipf popularity (Leyline)",
    .shared_create = shared_create,
    .shared_free = shared_free,
    .flow_create = flow_create,
    .flow_free = flow_free,
    .flow_next = flow_next,
    .flow_deliver = flow_deliver,
};
