/* Turn list with truncation on the way in and a budgeted sliding window on the way out. */
#include "history.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "token_estimate.h"

static const char truncated_marker[] = " [... output truncated]";
static const char omitted_marker[] = "### (earlier steps omitted)\n\n";

/* The longest prefix of text (in bytes) whose estimate stays within max_tokens: estimates grow with
 * length, so a binary search finds it. */
static size_t prefix_within(const char *text, size_t len, int max_tokens) {
    size_t lo = 0, hi = len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (token_estimate(text, mid) <= max_tokens)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void history_append_truncated(StrBuf *out, const char *text, int max_tokens) {
    size_t len = strlen(text);
    if (max_tokens <= 0 || token_estimate(text, len) <= max_tokens) {
        strbuf_append_n(out, text, len);
        return;
    }
    int room = max_tokens - token_estimate_str(truncated_marker);
    size_t cut = prefix_within(text, len, room > 0 ? room : 0);
    size_t word_end = cut;
    while (word_end > 0 && text[word_end - 1] != ' ' && text[word_end - 1] != '\n') word_end--;
    if (word_end > cut / 2) cut = word_end; /* end on a whole word unless that loses too much */
    while (cut > 0 && (text[cut - 1] == ' ' || text[cut - 1] == '\n')) cut--;
    strbuf_append_n(out, text, cut);
    strbuf_append(out, truncated_marker);
}

/* "### label\ntext\n\n" */
static void render_turn(StrBuf *out, const HistoryTurn *t) { strbuf_appendf(out, "### %s\n%s\n\n", t->label, t->text); }

int history_add(History *h, const char *label, const char *text, int max_tokens, int pinned, BraidError *err) {
    if (braid_grow((void **)&h->turns, &h->cap, h->n + 1, sizeof *h->turns))
        return braid_error_set(err, "workload history: out of memory adding turn %d", h->n);
    StrBuf body = {0};
    history_append_truncated(&body, text, max_tokens);
    /* trailing blank lines would only pile up between turns */
    size_t end = body.len;
    while (end > 0 && (body.data[end - 1] == '\n' || body.data[end - 1] == ' ')) end--;
    strbuf_truncate(&body, end);
    HistoryTurn t = {.label = strdup(label), .text = strbuf_take(&body), .pinned = pinned};
    if (!t.label || !t.text) {
        free(t.label);
        free(t.text);
        return braid_error_set(err, "workload history: out of memory adding turn %d", h->n);
    }
    StrBuf probe = {0};
    render_turn(&probe, &t);
    t.tokens = token_estimate(strbuf_str(&probe), probe.len);
    strbuf_free(&probe);
    h->turns[h->n++] = t;
    return 0;
}

/* The first unpinned turn to render: the earliest chunk start whose turns to the end fit in room.
 * Chunk starts are where the unpinned turns' running token count crosses a multiple of room /
 * HISTORY_CHUNKS, so they depend only on the turns before them: as the history grows the window
 * jumps ahead a chunk at a time and stays put in between, and every call in between renders the
 * same bytes up to the newest turns (a framework that trims its history in steps keeps its prompt
 * prefix, and the prefix cache, until the next trim; sliding turn by turn would change it at every
 * call). When not even the newest chunk fits, the newest turns that fit. */
enum { HISTORY_CHUNKS = 4 };

static int first_kept_turn(const History *h, int room) {
    int total = 0;
    for (int i = 0; i < h->n; i++)
        if (!h->turns[i].pinned) total += h->turns[i].tokens;
    int chunk = room / HISTORY_CHUNKS > 1 ? room / HISTORY_CHUNKS : 1, before = 0, last_chunk = -1;
    for (int i = 0; i < h->n; i++) {
        if (h->turns[i].pinned) continue;
        int c = before / chunk;
        if (c != last_chunk) { /* a chunk starts here */
            last_chunk = c;
            if (total - before <= room) return i;
        }
        before += h->turns[i].tokens;
    }
    /* Walk back from the newest turn while the unpinned ones still fit beside the pinned ones. */
    int first_kept = h->n;
    for (int i = h->n - 1; i >= 0; i--) {
        if (h->turns[i].pinned) continue;
        if (h->turns[i].tokens > room) break;
        room -= h->turns[i].tokens;
        first_kept = i;
    }
    return first_kept;
}

void history_render(const History *h, StrBuf *out, int budget_tokens) {
    int pinned = 0, unpinned = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->turns[i].pinned) pinned += h->turns[i].tokens;
        else unpinned += h->turns[i].tokens;
    }
    int room = budget_tokens - pinned, first_kept = 0;
    if (unpinned > room) first_kept = first_kept_turn(h, room - token_estimate_str(omitted_marker));
    int marked = 0;
    for (int i = 0; i < h->n; i++) {
        const HistoryTurn *t = &h->turns[i];
        if (t->pinned || i >= first_kept) {
            render_turn(out, t);
        } else if (!marked) {
            strbuf_append(out, omitted_marker);
            marked = 1;
        }
    }
}

void history_free(History *h) {
    for (int i = 0; i < h->n; i++) {
        free(h->turns[i].label);
        free(h->turns[i].text);
    }
    free(h->turns);
    *h = (History){0};
}
