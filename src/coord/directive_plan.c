/* Resolving directives to token positions; the contract is in directive_plan.h. */
#define _GNU_SOURCE /* memmem */
#include "coord/directive_plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int start, end;    /* in C */
    TokenList rep;
    int index;
} Edit;

/* C's bytes: the tokens' pieces, and where each token starts (offs[n] = the total). */
typedef struct {
    char *text;
    size_t *offs;
    size_t len;
} PromptText;

static void prompt_text_free(PromptText *t) {
    free(t->text);
    free(t->offs);
}

static int prompt_text(const Tokenizer *tok, const TokenList *c, PromptText *t) {
    size_t cap = 256;
    memset(t, 0, sizeof *t);
    if (!(t->text = malloc(cap)) || !(t->offs = malloc(((size_t)c->n + 1) * sizeof *t->offs))) return -1;
    for (int i = 0; i < c->n; i++) {
        t->offs[i] = t->len;
        char piece[256];
        size_t n = tokenizer_token_bytes(tok, c->ids[i], piece, sizeof piece);
        if (n > sizeof piece) n = sizeof piece;
        if (t->len + n + 1 > cap) {
            while (t->len + n + 1 > cap) cap *= 2;
            char *grown = realloc(t->text, cap);
            if (!grown) return -1;
            t->text = grown;
        }
        memcpy(t->text + t->len, piece, n);
        t->len += n;
    }
    t->offs[c->n] = t->len;
    t->text[t->len] = '\0';
    return 0;
}

static int oom(ApiError *e) { return api_error_set(e, 503, NULL, NULL, "the server is out of memory"); }

static int span_error(ApiError *e, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int span_error(ApiError *e, int i, const char *fmt, ...) {
    char param[40], msg[200];
    snprintf(param, sizeof param, "directives[%d].span", i);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_error_set(e, 400, param, NULL, "%s: %s; no directive was applied", param, msg);
}

/* The token span [s, e) of directive i in C, and for a match the bytes the widening took in
 * before and after the matched text. */
static int resolve_span(const ApiDirective *d, int i, const TokenList *c, const PromptText *t, int *s, int *e, size_t *pre_from,
                        size_t *post_to, size_t *bstart, size_t *bend, ApiError *err) {
    if (!d->has_span && !d->match) return *s = 0, *e = c->n, 0;
    if (d->has_span) {
        if (d->end > c->n) return span_error(err, i, "[%d, %d) is outside the prompt (%d tokens)", d->start, d->end, c->n);
        *s = d->start, *e = d->end;
        *pre_from = *bstart = t->offs[*s];
        *post_to = *bend = t->offs[*e];
        return 0;
    }
    size_t mlen = strlen(d->match);
    const char *at = t->text - 1;
    for (int k = 0; k < d->occurrence; k++) {
        at = memmem(at + 1, t->len - (size_t)(at + 1 - t->text), d->match, mlen);
        if (!at) return span_error(err, i, "the text to match occurs %d times in the prompt, not %d", k, d->occurrence);
    }
    *bstart = (size_t)(at - t->text);
    *bend = *bstart + mlen;
    int lo = 0;
    while (lo + 1 <= c->n && t->offs[lo + 1] <= *bstart) lo++;
    int hi = lo;
    while (hi < c->n && t->offs[hi] < *bend) hi++;
    *s = lo, *e = hi;
    *pre_from = t->offs[lo];
    *post_to = t->offs[hi];
    return 0;
}

static int cmp_edit(const void *a, const void *b) { return ((const Edit *)a)->start - ((const Edit *)b)->start; }

/* Replacement tokens: the widened bytes before the match, the replacement, the bytes after it. */
static int tokenize_replacement(const Tokenizer *tok, bool parse_special, const PromptText *t, size_t pre_from, size_t bstart,
                                const char *rep, size_t bend, size_t post_to, TokenList *out) {
    size_t n_rep = strlen(rep), n = (bstart - pre_from) + n_rep + (post_to - bend);
    char *buf = malloc(n + 1);
    if (!buf) return -1;
    memcpy(buf, t->text + pre_from, bstart - pre_from);
    memcpy(buf + (bstart - pre_from), rep, n_rep);
    memcpy(buf + (bstart - pre_from) + n_rep, t->text + bend, post_to - bend);
    BraidError err;
    int rc = n ? tokenizer_encode(tok, buf, n, parse_special, false, out, &err) : 0;
    free(buf);
    return rc;
}

/* C position p moved to P (p outside every edit, or at an edit's end). */
static int map_position(const Edit *edits, int n, int p) {
    int shift = 0;
    for (int k = 0; k < n && edits[k].end <= p; k++) shift += edits[k].rep.n - (edits[k].end - edits[k].start);
    return p + shift;
}

static int build_runs(const TokenList *c, const Edit *edits, int n_edits, TokenList *p, CacheDirectives *out) {
    if (!(out->runs = calloc((size_t)n_edits + 1, sizeof *out->runs))) return -1;
    int pos = 0, index = -1;
    for (int k = 0; k <= n_edits; k++) {
        int end = k < n_edits ? edits[k].start : c->n;
        out->runs[out->n_runs++] = (CacheSpliceRun){.dst = p->n, .src = pos, .len = end - pos, .index = index};
        for (int j = pos; j < end; j++)
            if (token_list_push(p, c->ids[j])) return -1;
        if (k == n_edits) break;
        for (int j = 0; j < edits[k].rep.n; j++)
            if (token_list_push(p, edits[k].rep.ids[j])) return -1;
        pos = edits[k].end;
        index = edits[k].index;
    }
    return 0;
}

static int add_hint(CacheDirectives *out, const ApiDirective *d, int index, int start, int end, double ttl_s) {
    CacheHint *h = &out->hints[out->n_hints++];
    *h = (CacheHint){.op = (uint8_t)d->op, .index = index, .start = start, .end = end, .ttl_s = (float)ttl_s, .share_all = d->share_all};
    if (d->n_with == 0) return 0;
    if (!(h->with = calloc((size_t)d->n_with, sizeof *h->with))) return -1;
    for (; h->n_with < d->n_with; h->n_with++)
        if (!(h->with[h->n_with] = strdup(d->with[h->n_with]))) return -1;
    return 0;
}

typedef struct {
    int s, e;
} Span;

/* Everything is checked before anything is built, so an error leaves no trace. */
static int plan(const Tokenizer *tok, bool parse_special, TokenList *c, const ApiDirective *d, int n, const DirectivePin *pins, int n_pins,
                CacheDirectives *out, Edit *edits, Span *spans, const PromptText *t, ApiError *e) {
    int n_edits = 0;
    for (int i = 0; i < n; i++) {
        size_t pre_from = 0, post_to = 0, bstart = 0, bend = 0;
        if (resolve_span(&d[i], i, c, t, &spans[i].s, &spans[i].e, &pre_from, &post_to, &bstart, &bend, e)) return -1;
        if (d[i].op != API_DIRECTIVE_SPLICE) continue;
        Edit *ed = &edits[n_edits++];
        *ed = (Edit){.start = spans[i].s, .end = spans[i].e, .index = i};
        if (tokenize_replacement(tok, parse_special, t, pre_from, bstart, d[i].replacement, bend, post_to, &ed->rep)) return oom(e);
        if (n_edits > 1 && d[i].mode != d[edits[0].index].mode)
            return span_error(e, i, "all splices of a request must use one mode (directives[%d] uses the other)", edits[0].index);
    }
    qsort(edits, (size_t)n_edits, sizeof *edits, cmp_edit);
    for (int k = 1; k < n_edits; k++)
        if (edits[k].start < edits[k - 1].end)
            return span_error(e, edits[k].index, "it overlaps directives[%d]", edits[k - 1].index);
    for (int i = 0; i < n; i++) {
        if (d[i].op == API_DIRECTIVE_SPLICE || (!d[i].has_span && !d[i].match)) continue;
        for (int k = 0; k < n_edits; k++)
            if (spans[i].s < edits[k].end && spans[i].e > edits[k].start)
                return span_error(e, i, "it cuts into the span of splice directives[%d]", edits[k].index);
    }
    /* Checked: build P, the runs and the hints. */
    TokenList p = {0};
    if (n_edits > 0) {
        out->splice_mode = (uint8_t)d[edits[0].index].mode;
        out->first_edit = edits[0].start;
        if (!(out->context = malloc((size_t)c->n * sizeof *out->context)) || build_runs(c, edits, n_edits, &p, out)) return free(p.ids), oom(e);
        memcpy(out->context, c->ids, (size_t)c->n * sizeof *c->ids);
        out->n_context = c->n;
    }
    int n_hints = n - n_edits + n_pins, n_p = n_edits ? p.n : c->n;
    if (n_hints > 0 && !(out->hints = calloc((size_t)n_hints, sizeof *out->hints))) return free(p.ids), oom(e);
    for (int i = 0; i < n; i++) {
        if (d[i].op == API_DIRECTIVE_SPLICE) continue;
        bool whole = !d[i].has_span && !d[i].match;
        int s = whole ? 0 : map_position(edits, n_edits, spans[i].s), en = whole ? n_p : map_position(edits, n_edits, spans[i].e);
        if (add_hint(out, &d[i], i, s, en, d[i].ttl_s)) return free(p.ids), oom(e);
    }
    size_t bos_bytes = tok->add_bos && c->n > 0 && c->ids[0] == tok->bos_id ? t->offs[1] : 0;
    for (int k = 0; k < n_pins; k++) {
        static const ApiDirective pin = {.op = CACHE_HINT_PIN};
        int end = 0;
        while (end < c->n && t->offs[end + 1] <= pins[k].end_byte + bos_bytes) end++;
        for (int j = 0; j < n_edits; j++)
            if (end > edits[j].start && end < edits[j].end) end = edits[j].end; /* a pin ending inside an edit ends after it */
        if (add_hint(out, &pin, -(pins[k].message + 1), 0, map_position(edits, n_edits, end), pins[k].ttl_s)) return free(p.ids), oom(e);
    }
    if (n_edits > 0) {
        free(c->ids);
        *c = p;
    }
    return 0;
}

int directive_plan(const Tokenizer *tok, bool parse_special, TokenList *prompt, const ApiDirective *d, int n, const DirectivePin *pins,
                   int n_pins, CacheDirectives *out, ApiError *e) {
    memset(out, 0, sizeof *out);
    if (n == 0 && n_pins == 0) return 0;
    PromptText t = {0};
    Edit *edits = calloc((size_t)n + 1, sizeof *edits);
    Span *spans = calloc((size_t)n + 1, sizeof *spans);
    int rc = !edits || !spans || prompt_text(tok, prompt, &t) ? oom(e) : plan(tok, parse_special, prompt, d, n, pins, n_pins, out, edits, spans, &t, e);
    prompt_text_free(&t);
    for (int k = 0; edits && k < n; k++) free(edits[k].rep.ids);
    free(edits);
    free(spans);
    if (rc) cache_directives_free(out);
    return rc;
}
