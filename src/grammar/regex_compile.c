/*
 * regex_compile.c — a JSON Schema "pattern" (regex subset, grammar.h) compiled into grammar
 * states: parsed to a small tree, then emitted Thompson-style into the caller's rule.
 * Characters a JSON string would have to escape ('"', '\\', below 0x20) are never produced.
 */
#include "grammar/grammar_regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_MAX_NODES 4096
#define RX_MAX_REPEAT 1000

typedef enum { RX_EMPTY, RX_SET, RX_SEQ, RX_CAT, RX_ALT, RX_REP } RxKind;

typedef struct {
    RxKind kind;
    uint32_t set[4];   /* RX_SET: ASCII members */
    bool multibyte;    /* RX_SET: also any non-ASCII character */
    uint8_t seq[4];    /* RX_SEQ: one UTF-8 character's bytes */
    int seq_len;
    int a, b;          /* children (CAT, ALT: a b; REP: a) */
    int min, max;      /* REP; max -1 = unbounded */
} RxNode;

typedef struct {
    const char *p, *end;
    RxNode nodes[RX_MAX_NODES];
    int n;
    char *why;
    size_t why_len;
    bool failed;
} RxParser;

static int rx_fail(RxParser *r, const char *fmt, const char *detail) {
    if (!r->failed) {
        r->failed = true;
        char msg[160];
        snprintf(msg, sizeof msg, fmt, detail);
        snprintf(r->why, r->why_len, "pattern: %s", msg);
    }
    return -1;
}

static int rx_node(RxParser *r, RxKind kind) {
    if (r->failed) return -1;
    if (r->n >= RX_MAX_NODES) return rx_fail(r, "%s", "too complex");
    memset(&r->nodes[r->n], 0, sizeof r->nodes[r->n]);
    r->nodes[r->n].kind = kind;
    return r->n++;
}

static void set_add(uint32_t *set, int lo, int hi) {
    for (int c = lo; c <= hi; c++) set[c >> 5] |= 1u << (c & 31);
}

static int rx_set_node(RxParser *r, const uint32_t *set, bool multibyte) {
    int n = rx_node(r, RX_SET);
    if (n < 0) return -1;
    memcpy(r->nodes[n].set, set, sizeof r->nodes[n].set);
    r->nodes[n].multibyte = multibyte;
    return n;
}

static int rx_pair(RxParser *r, RxKind kind, int a, int b) {
    if (a < 0 || b < 0) return -1;
    int n = rx_node(r, kind);
    if (n < 0) return -1;
    r->nodes[n].a = a;
    r->nodes[n].b = b;
    return n;
}

/* A class escape (\d \w \s and negations) into set; returns 1 when negated, 0 when not, -1 when
 * c is no class escape. */
static int class_escape(char c, uint32_t *set) {
    switch (c) {
    case 'd': case 'D': set_add(set, '0', '9'); break;
    case 'w': case 'W': set_add(set, '0', '9'); set_add(set, 'A', 'Z'); set_add(set, 'a', 'z'); set_add(set, '_', '_'); break;
    case 's': case 'S': set_add(set, ' ', ' '); set_add(set, '\t', '\r'); break;
    default: return -1;
    }
    return c >= 'A' && c <= 'Z';
}

/* A single-character escape's byte, or -1. */
static int char_escape(char c) {
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    default: break;
    }
    if ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E)) return c;
    return -1;
}

static void set_invert(uint32_t *set) {
    for (int i = 0; i < 4; i++) set[i] = ~set[i];
}

static int parse_class(RxParser *r) {
    uint32_t set[4] = {0};
    bool negate = false;
    r->p++; /* '[' */
    if (r->p < r->end && *r->p == '^') {
        negate = true;
        r->p++;
    }
    bool first = true;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        int lo;
        unsigned char c = (unsigned char)*r->p;
        if (c >= 0x80) return rx_fail(r, "%s", "non-ASCII characters in a character class are not supported");
        if (c == '\\') {
            if (r->p + 1 >= r->end) return rx_fail(r, "%s", "a trailing backslash");
            char e = r->p[1];
            uint32_t cls[4] = {0};
            int neg = class_escape(e, cls);
            if (neg == 1) return rx_fail(r, "\\%s inside a character class is not supported", (char[]){e, 0});
            if (neg == 0) {
                for (int i = 0; i < 4; i++) set[i] |= cls[i];
                r->p += 2;
                continue;
            }
            if ((lo = char_escape(e)) < 0) return rx_fail(r, "escape \\%s is not supported", (char[]){e, 0});
            r->p += 2;
        } else {
            lo = c;
            r->p++;
        }
        int hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            unsigned char h = (unsigned char)r->p[1];
            if (h >= 0x80) return rx_fail(r, "%s", "non-ASCII characters in a character class are not supported");
            if (h == '\\') {
                if (r->p + 2 >= r->end || (hi = char_escape(r->p[2])) < 0) return rx_fail(r, "%s", "a bad range in a character class");
                r->p += 3;
            } else {
                hi = h;
                r->p += 2;
            }
            if (hi < lo) return rx_fail(r, "%s", "a reversed range in a character class");
        }
        set_add(set, lo, hi);
    }
    if (r->p >= r->end) return rx_fail(r, "%s", "an unterminated character class");
    r->p++; /* ']' */
    if (negate) set_invert(set);
    return rx_set_node(r, set, negate);
}

static int parse_alt(RxParser *r, int depth);

static int parse_atom(RxParser *r, int depth) {
    unsigned char c = (unsigned char)*r->p;
    uint32_t set[4] = {0};
    if (c == '(') {
        r->p++;
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') r->p += 2;
            else return rx_fail(r, "%s", "lookaround and named groups are not supported");
        }
        int n = parse_alt(r, depth + 1);
        if (n < 0) return -1;
        if (r->p >= r->end || *r->p != ')') return rx_fail(r, "%s", "an unbalanced '('");
        r->p++;
        return n;
    }
    if (c == '[') return parse_class(r);
    if (c == '.') {
        r->p++;
        set_add(set, 0, 127);
        return rx_set_node(r, set, true);
    }
    if (c == '^' || c == '$') return rx_fail(r, "'%s' is only supported at the start / end of the pattern", (char[]){(char)c, 0});
    if (c == ')' ) return rx_fail(r, "%s", "an unbalanced ')'");
    if (c == '*' || c == '+' || c == '?' || c == '{') return rx_fail(r, "a quantifier '%s' with nothing before it", (char[]){(char)c, 0});
    if (c == '\\') {
        if (r->p + 1 >= r->end) return rx_fail(r, "%s", "a trailing backslash");
        char e = r->p[1];
        r->p += 2;
        int neg = class_escape(e, set);
        if (neg >= 0) {
            if (neg) set_invert(set);
            return rx_set_node(r, set, neg == 1);
        }
        int b = char_escape(e);
        if (b < 0) return rx_fail(r, "escape \\%s is not supported", (char[]){e, 0});
        set_add(set, b, b);
        return rx_set_node(r, set, false);
    }
    if (c < 0x80) {
        r->p++;
        set_add(set, c, c);
        return rx_set_node(r, set, false);
    }
    /* One UTF-8 character, taken as its bytes. */
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || r->end - r->p < len) return rx_fail(r, "%s", "invalid UTF-8");
    int n = rx_node(r, RX_SEQ);
    if (n < 0) return -1;
    memcpy(r->nodes[n].seq, r->p, (size_t)len);
    r->nodes[n].seq_len = len;
    r->p += len;
    return n;
}

static int parse_number(RxParser *r, int *out) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return -1;
    long v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        v = v * 10 + (*r->p++ - '0');
        if (v > RX_MAX_REPEAT) return rx_fail(r, "%s", "a repetition count above 1000");
    }
    *out = (int)v;
    return 0;
}

static int parse_repeat(RxParser *r, int depth) {
    int a = parse_atom(r, depth);
    while (a >= 0 && r->p < r->end) {
        int min, max;
        char c = *r->p;
        if (c == '*') min = 0, max = -1, r->p++;
        else if (c == '+') min = 1, max = -1, r->p++;
        else if (c == '?') min = 0, max = 1, r->p++;
        else if (c == '{') {
            r->p++;
            if (parse_number(r, &min)) return rx_fail(r, "%s", "a bad {n,m} quantifier");
            max = min;
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                max = -1;
                if (r->p < r->end && *r->p != '}' && parse_number(r, &max)) return rx_fail(r, "%s", "a bad {n,m} quantifier");
            }
            if (r->p >= r->end || *r->p != '}' || (max >= 0 && max < min)) return rx_fail(r, "%s", "a bad {n,m} quantifier");
            r->p++;
        } else {
            break;
        }
        if (r->p < r->end && (*r->p == '?' || *r->p == '+')) return rx_fail(r, "%s", "lazy and possessive quantifiers are not supported");
        int n = rx_node(r, RX_REP);
        if (n < 0) return -1;
        r->nodes[n].a = a;
        r->nodes[n].min = min;
        r->nodes[n].max = max;
        a = n;
    }
    return a;
}

static int parse_cat(RxParser *r, int depth) {
    int t = rx_node(r, RX_EMPTY);
    while (t >= 0 && r->p < r->end && *r->p != '|' && *r->p != ')') t = rx_pair(r, RX_CAT, t, parse_repeat(r, depth));
    return t;
}

static int parse_alt(RxParser *r, int depth) {
    if (depth > 64) return rx_fail(r, "%s", "groups nested too deeply");
    int t = parse_cat(r, depth);
    while (t >= 0 && r->p < r->end && *r->p == '|') {
        r->p++;
        t = rx_pair(r, RX_ALT, t, parse_cat(r, depth));
    }
    return t;
}

static int emit(RxParser *r, GrammarBuilder *b, int rule, int node, int from) {
    if (from < 0 || r->failed) return -1;
    const RxNode *n = &r->nodes[node];
    switch (n->kind) {
    case RX_EMPTY: return from;
    case RX_SEQ: return grammar_frag_literal(b, rule, from, (const char *)n->seq, (size_t)n->seq_len);
    case RX_CAT: return emit(r, b, rule, n->b, emit(r, b, rule, n->a, from));
    case RX_ALT: {
        int end = grammar_state_new(b, rule);
        grammar_edge_eps(b, emit(r, b, rule, n->a, from), end);
        grammar_edge_eps(b, emit(r, b, rule, n->b, from), end);
        return b->failed ? -1 : end;
    }
    case RX_SET: {
        int end = grammar_state_new(b, rule);
        bool any = false;
        for (int lo = 0x20; lo < 128; lo++) {
            if (!(n->set[lo >> 5] >> (lo & 31) & 1) || lo == '"' || lo == '\\') continue;
            int hi = lo;
            while (hi + 1 < 128 && (n->set[(hi + 1) >> 5] >> ((hi + 1) & 31) & 1) && hi + 1 != '"' && hi + 1 != '\\') hi++;
            grammar_edge_byte(b, from, (uint8_t)lo, (uint8_t)hi, end);
            any = true;
            lo = hi;
        }
        if (n->multibyte) {
            grammar_frag_multibyte_char(b, rule, from, end);
            any = true;
        }
        if (!any) return rx_fail(r, "%s", "a character class with only characters a JSON string must escape");
        return b->failed ? -1 : end;
    }
    case RX_REP: {
        int at = from;
        for (int i = 0; i < n->min && at >= 0; i++) at = emit(r, b, rule, n->a, at);
        if (at < 0) return -1;
        if (n->max < 0) {
            /* Kleene star on a fresh state, so the loop never runs back into the mandatory part. */
            int loop = grammar_state_new(b, rule);
            grammar_edge_eps(b, at, loop);
            grammar_edge_eps(b, emit(r, b, rule, n->a, loop), loop);
            return b->failed ? -1 : loop;
        }
        int end = grammar_state_new(b, rule);
        grammar_edge_eps(b, at, end);
        for (int i = n->min; i < n->max && at >= 0; i++) {
            at = emit(r, b, rule, n->a, at);
            grammar_edge_eps(b, at, end);
        }
        return b->failed ? -1 : end;
    }
    }
    return -1;
}

int grammar_regex_emit(GrammarBuilder *b, int rule, int from, const char *pattern, char *why, size_t why_len) {
    RxParser *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    size_t len = strlen(pattern);
    r->p = pattern;
    r->end = pattern + len;
    r->why = why;
    r->why_len = why_len;
    bool anchored_start = len > 0 && pattern[0] == '^';
    /* A trailing '$' that is not escaped (an odd run of backslashes before it escapes it). */
    size_t slashes = 0;
    while (len >= 2 + slashes && pattern[len - 2 - slashes] == '\\') slashes++;
    bool anchored_end = len > (size_t)anchored_start && pattern[len - 1] == '$' && slashes % 2 == 0;
    if (anchored_start) r->p++;
    if (anchored_end) r->end--;
    int tree = parse_alt(r, 0);
    if (tree >= 0 && r->p != r->end) tree = rx_fail(r, "%s", "an unbalanced ')'");
    int at = from;
    uint32_t any[4] = {0};
    set_add(any, 0, 127);
    int any_node = tree >= 0 ? rx_set_node(r, any, true) : -1;
    int star = any_node >= 0 ? rx_node(r, RX_REP) : -1;
    if (star >= 0) {
        r->nodes[star].a = any_node;
        r->nodes[star].min = 0;
        r->nodes[star].max = -1;
    }
    if (star >= 0 && !anchored_start) at = emit(r, b, rule, star, at);
    if (tree >= 0) at = emit(r, b, rule, tree, at);
    if (star >= 0 && !anchored_end) at = emit(r, b, rule, star, at);
    if (tree < 0 || r->failed) at = -1;
    else if (b->failed) {
        snprintf(why, why_len, "pattern: %s", b->why);
        at = -1;
    }
    free(r);
    return at;
}
