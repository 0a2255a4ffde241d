/*
 * grammar_nfa.c — building a grammar's rules (states and edges) and finishing it: epsilon moves
 * removed, edges laid out per state.
 */
#include "grammar/grammar_nfa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

static void builder_fail(GrammarBuilder *b, const char *why) {
    if (b->failed) return;
    b->failed = true;
    snprintf(b->why, sizeof b->why, "%s", why);
}

void grammar_builder_init(GrammarBuilder *b) { memset(b, 0, sizeof *b); }

void grammar_builder_free(GrammarBuilder *b) {
    free(b->bounded);
    free(b->edges);
    free(b->state_rule);
    free(b->state_final);
    free(b->rule_start);
    memset(b, 0, sizeof *b);
}

int grammar_state_new(GrammarBuilder *b, int rule) {
    if (b->failed) return -1;
    if (b->n_states >= GRAMMAR_MAX_STATES) {
        builder_fail(b, "the schema compiles to too large a grammar (more than 200000 states)");
        return -1;
    }
    int cap = b->cap_states;
    if (braid_grow((void **)&b->state_rule, &cap, b->n_states + 1, sizeof *b->state_rule)) {
        builder_fail(b, "out of memory");
        return -1;
    }
    cap = b->cap_states;
    if (braid_grow((void **)&b->state_final, &cap, b->n_states + 1, sizeof *b->state_final)) {
        builder_fail(b, "out of memory");
        return -1;
    }
    b->cap_states = cap;
    b->state_rule[b->n_states] = rule;
    b->state_final[b->n_states] = 0;
    return b->n_states++;
}

int grammar_rule_new(GrammarBuilder *b) {
    if (b->failed) return -1;
    if (b->n_rules >= GRAMMAR_MAX_RULES) {
        builder_fail(b, "the schema compiles to too many rules (more than 20000)");
        return -1;
    }
    if (braid_grow((void **)&b->rule_start, &b->cap_rules, b->n_rules + 1, sizeof *b->rule_start)) {
        builder_fail(b, "out of memory");
        return -1;
    }
    int rule = b->n_rules++;
    b->rule_start[rule] = grammar_state_new(b, rule);
    return b->failed ? -1 : rule;
}

static void add_edge(GrammarBuilder *b, GrammarEdgeIn e) {
    if (b->failed) return;
    if (e.from < 0 || e.to < 0) {
        builder_fail(b, "internal: edge from a failed state");
        return;
    }
    if (b->n_edges >= GRAMMAR_MAX_EDGES) {
        builder_fail(b, "the schema compiles to too large a grammar (more than 2000000 edges)");
        return;
    }
    if (braid_grow((void **)&b->edges, &b->cap_edges, b->n_edges + 1, sizeof *b->edges)) {
        builder_fail(b, "out of memory");
        return;
    }
    b->edges[b->n_edges++] = e;
}

void grammar_edge_byte(GrammarBuilder *b, int from, uint8_t lo, uint8_t hi, int to) {
    add_edge(b, (GrammarEdgeIn){.from = from, .to = to, .kind = GEDGE_BYTE, .lo = lo, .hi = hi});
}

void grammar_edge_eps(GrammarBuilder *b, int from, int to) {
    add_edge(b, (GrammarEdgeIn){.from = from, .to = to, .kind = GEDGE_EPS});
}

void grammar_edge_call(GrammarBuilder *b, int from, int rule, int to) {
    if (rule < 0) {
        builder_fail(b, "internal: call of a failed rule");
        return;
    }
    add_edge(b, (GrammarEdgeIn){.from = from, .to = to, .rule = rule, .kind = GEDGE_CALL});
}

void grammar_state_final(GrammarBuilder *b, int state) {
    if (!b->failed && state >= 0) b->state_final[state] = 1;
}

void grammar_state_bounded(GrammarBuilder *b, int state, int pos, int min, int max) {
    if (b->failed || state < 0) return;
    if (braid_grow((void **)&b->bounded, &b->cap_bounded, b->n_bounded + 1, sizeof *b->bounded)) {
        builder_fail(b, "out of memory");
        return;
    }
    b->bounded[b->n_bounded++] = (GrammarBoundedPos){state, pos, min, max};
}

int grammar_frag_literal(GrammarBuilder *b, int rule, int from, const char *text, size_t len) {
    int at = from;
    for (size_t i = 0; i < len && at >= 0; i++) {
        int next = grammar_state_new(b, rule);
        grammar_edge_byte(b, at, (uint8_t)text[i], (uint8_t)text[i], next);
        at = next;
    }
    return b->failed ? -1 : at;
}

int grammar_frag_call(GrammarBuilder *b, int rule, int from, int callee) {
    int next = grammar_state_new(b, rule);
    grammar_edge_call(b, from, callee, next);
    return b->failed ? -1 : next;
}

/* Continuation bytes: n of them from `from` to `to`. */
static void continuation(GrammarBuilder *b, int rule, int from, int n, int to) {
    int at = from;
    for (int i = 0; i < n; i++) {
        int next = i == n - 1 ? to : grammar_state_new(b, rule);
        grammar_edge_byte(b, at, 0x80, 0xBF, next);
        at = next;
    }
}

int grammar_frag_multibyte_char(GrammarBuilder *b, int rule, int from, int to) {
    int end = to >= 0 ? to : grammar_state_new(b, rule), c1 = grammar_state_new(b, rule), c2 = grammar_state_new(b, rule),
        c3 = grammar_state_new(b, rule);
    grammar_edge_byte(b, from, 0xC2, 0xDF, c1);
    grammar_edge_byte(b, from, 0xE0, 0xEF, c2);
    grammar_edge_byte(b, from, 0xF0, 0xF4, c3);
    continuation(b, rule, c3, 1, c2);
    continuation(b, rule, c2, 1, c1);
    continuation(b, rule, c1, 1, end);
    return b->failed ? -1 : end;
}

int grammar_frag_plain_char(GrammarBuilder *b, int rule, int from, int to) {
    int end = grammar_frag_multibyte_char(b, rule, from, to);
    if (end < 0) return -1;
    grammar_edge_byte(b, from, 0x20, 0x21, end);
    grammar_edge_byte(b, from, 0x23, 0x5B, end);
    grammar_edge_byte(b, from, 0x5D, 0x7F, end);
    return b->failed ? -1 : end;
}

int grammar_frag_json_char(GrammarBuilder *b, int rule, int from, int to) {
    int end = grammar_frag_plain_char(b, rule, from, to);
    if (end < 0) return -1;
    int esc = grammar_state_new(b, rule), u = grammar_state_new(b, rule);
    grammar_edge_byte(b, from, '\\', '\\', esc);
    static const char simple[] = "\"\\/bfnrt";
    for (const char *c = simple; *c; c++) grammar_edge_byte(b, esc, (uint8_t)*c, (uint8_t)*c, end);
    grammar_edge_byte(b, esc, 'u', 'u', u);
    int at = u;
    for (int i = 0; i < 4; i++) {
        int next = i == 3 ? end : grammar_state_new(b, rule);
        grammar_edge_byte(b, at, '0', '9', next);
        grammar_edge_byte(b, at, 'a', 'f', next);
        grammar_edge_byte(b, at, 'A', 'F', next);
        at = next;
    }
    return b->failed ? -1 : end;
}

int grammar_build_plain_string(GrammarBuilder *b, int32_t *first, int32_t *n) {
    int r = grammar_rule_new(b);
    if (r < 0) return -1;
    *first = b->rule_start[r];
    int open = grammar_frag_literal(b, r, b->rule_start[r], "\"", 1);
    grammar_frag_json_char(b, r, open, open);
    grammar_state_final(b, grammar_frag_literal(b, r, open, "\"", 1));
    *n = b->n_states - *first;
    return b->failed ? -1 : r;
}

/* ---- finishing ---- */

static int cmp_edge_from(const void *a, const void *b) {
    const GrammarEdgeIn *x = a, *y = b;
    if (x->from != y->from) return x->from < y->from ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    if (x->to != y->to) return x->to < y->to ? -1 : 1;
    return x->rule < y->rule ? -1 : x->rule > y->rule;
}

void grammar_free(struct Grammar *g) {
    if (!g) return;
    free(g->states);
    free(g->byte_edges);
    free(g->call_edges);
    free(g->rule_start);
    free(g->trigger);
    free(g->bounded);
    free(g);
}

/* Colors: 0 unseen, 1 on the path, 2 done. True when a rule reaches a call of one on the path
 * before reading a byte (calls from its start state). */
static bool left_cycle(const struct Grammar *g, int rule, uint8_t *color) {
    color[rule] = 1;
    const GrammarState *st = &g->states[g->rule_start[rule]];
    for (int c = 0; c < st->n_call; c++) {
        int callee = g->call_edges[st->call_begin + c].rule;
        if (color[callee] == 1 || (color[callee] == 0 && left_cycle(g, callee, color))) return true;
    }
    color[rule] = 2;
    return false;
}

struct Grammar *grammar_builder_finish(GrammarBuilder *b, int root, char *why, size_t why_len) {
    struct Grammar *g = NULL;
    int32_t *begin = NULL, *stack = NULL, *stamp = NULL;
    GrammarEdgeIn *out = NULL;
    int n_out = 0, cap_out = 0;
    if (b->failed) {
        snprintf(why, why_len, "%s", b->why);
        goto done;
    }
    int n = b->n_states;
    qsort(b->edges, (size_t)b->n_edges, sizeof *b->edges, cmp_edge_from);
    begin = calloc((size_t)n + 1, sizeof *begin);
    stack = malloc((size_t)n * sizeof *stack);
    stamp = malloc((size_t)n * sizeof *stamp);
    g = calloc(1, sizeof *g);
    if (!begin || !stack || !stamp || !g) goto oom;
    for (int i = 0; i < b->n_edges; i++) begin[b->edges[i].from + 1]++;
    for (int i = 0; i < n; i++) begin[i + 1] += begin[i];
    for (int i = 0; i < n; i++) stamp[i] = -1;
    g->states = calloc((size_t)n, sizeof *g->states);
    if (!g->states) goto oom;
    g->n_states = n;
    /* Each state takes the byte edges, calls and finality of its epsilon closure. */
    for (int s = 0; s < n; s++) {
        int top = 0, first_out = n_out;
        stack[top++] = s;
        stamp[s] = s;
        bool final = false;
        while (top > 0) {
            int t = stack[--top];
            final |= b->state_final[t] != 0;
            for (int e = begin[t]; e < begin[t + 1]; e++) {
                const GrammarEdgeIn *in = &b->edges[e];
                if (in->kind == GEDGE_EPS) {
                    if (stamp[in->to] != s) {
                        stamp[in->to] = s;
                        stack[top++] = in->to;
                    }
                    continue;
                }
                if (n_out >= GRAMMAR_MAX_EDGES) {
                    snprintf(why, why_len, "the schema compiles to too large a grammar (more than %d edges)", GRAMMAR_MAX_EDGES);
                    goto fail;
                }
                if (braid_grow((void **)&out, &cap_out, n_out + 1, sizeof *out)) goto oom;
                out[n_out] = *in;
                out[n_out++].from = s;
            }
        }
        /* Sort and drop duplicates of this state's edges. */
        qsort(out + first_out, (size_t)(n_out - first_out), sizeof *out, cmp_edge_from);
        int w = first_out;
        for (int r = first_out; r < n_out; r++)
            if (w == first_out || cmp_edge_from(&out[w - 1], &out[r]) != 0) out[w++] = out[r];
        n_out = w;
        GrammarState *st = &g->states[s];
        st->rule = b->state_rule[s];
        st->final = final;
    }
    int n_byte = 0, n_call = 0;
    for (int i = 0; i < n_out; i++) *(out[i].kind == GEDGE_BYTE ? &n_byte : &n_call) += 1;
    g->byte_edges = malloc((size_t)(n_byte ? n_byte : 1) * sizeof *g->byte_edges);
    g->call_edges = malloc((size_t)(n_call ? n_call : 1) * sizeof *g->call_edges);
    g->rule_start = malloc((size_t)(b->n_rules ? b->n_rules : 1) * sizeof *g->rule_start);
    if (!g->byte_edges || !g->call_edges || !g->rule_start) goto oom;
    int nb = 0, nc = 0;
    for (int i = 0; i < n_out;) {
        int s = out[i].from;
        GrammarState *st = &g->states[s];
        st->byte_begin = nb;
        st->call_begin = nc;
        for (; i < n_out && out[i].from == s; i++) {
            if (out[i].kind == GEDGE_BYTE) {
                g->byte_edges[nb++] = (GrammarByteEdge){out[i].lo, out[i].hi, out[i].to};
                for (int c = out[i].lo; c <= out[i].hi; c++) st->first[c >> 5] |= 1u << (c & 31);
            } else {
                g->call_edges[nc++] = (GrammarCallEdge){out[i].rule, out[i].to};
            }
        }
        st->n_byte = nb - st->byte_begin;
        st->n_call = nc - st->call_begin;
    }
    memcpy(g->rule_start, b->rule_start, (size_t)b->n_rules * sizeof *g->rule_start);
    g->n_rules = b->n_rules;
    g->root = root;
    if (b->n_bounded > 0) {
        if (!(g->bounded = malloc((size_t)n * sizeof *g->bounded))) goto oom;
        for (int i = 0; i < n; i++) g->bounded[i].pos = -1;
        for (int i = 0; i < b->n_bounded; i++) g->bounded[b->bounded[i].state] = b->bounded[i];
    }
    uint8_t *color = calloc((size_t)g->n_rules, 1);
    if (!color) goto oom;
    bool cycle = false;
    for (int r = 0; r < g->n_rules && !cycle; r++)
        if (color[r] == 0) cycle = left_cycle(g, r, color);
    free(color);
    if (cycle) {
        snprintf(why, why_len, "the schema is left-recursive (a $ref / anyOf cycle that reads no text)");
        goto fail;
    }
    goto done;
oom:
    snprintf(why, why_len, "out of memory compiling the grammar");
fail:
    grammar_free(g);
    g = NULL;
done:
    free(begin);
    free(stack);
    free(stamp);
    free(out);
    grammar_builder_free(b);
    return g;
}
