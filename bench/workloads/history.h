/*
 * history.h — one workflow's private history: the turns its agents and tools produced, in order,
 * rendered into prompts under a token budget.
 *
 * Turns longer than their limit are cut at a word boundary with a visible marker. Rendering keeps
 * the pinned turns (the task statement) and the most recent turns that fit, with one fixed marker
 * line where older turns were dropped, as agent frameworks do when they trim their history. The
 * window moves in chunks of about a quarter of the budget, so between two moves every rendering
 * starts with the same bytes (the prompt prefix survives, as it does between a framework's trims).
 * Owns copies of every text. One owner, not thread-safe.
 */
#ifndef BRAID_BENCH_WORKLOADS_HISTORY_H
#define BRAID_BENCH_WORKLOADS_HISTORY_H

#include "common/error.h"
#include "strbuf.h"

typedef struct {
    char *label; /* "Coder", "Tool: run_tests" */
    char *text;
    int tokens; /* estimated tokens of the rendered turn */
    int pinned; /* always rendered */
} HistoryTurn;

typedef struct {
    HistoryTurn *turns;
    int n, cap;
} History;

/* Appends a turn, cutting text to at most max_tokens estimated tokens (<= 0: no limit).
 * Returns 0, or -1 with err set when out of memory. */
int history_add(History *h, const char *label, const char *text, int max_tokens, int pinned, BraidError *err);
/* Appends the pinned turns and the most recent turns that fit in budget_tokens (from a chunk start
 * when that fits), in order. */
void history_render(const History *h, StrBuf *out, int budget_tokens);
void history_free(History *h);

/* Copies text cut to at most max_tokens estimated tokens at a word boundary, with a marker when
 * cut, into out. Exposed for tool outputs and tests. */
void history_append_truncated(StrBuf *out, const char *text, int max_tokens);

#endif
