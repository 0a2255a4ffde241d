/*
 * schema_compile.c — a grammar spec (grammar.h) compiled into rules: JSON Schema subset to a
 * recursive transition network, with the spec's prefix / suffix / repetition around it.
 *
 * Every sub-schema becomes a rule (memoized by its JSON node, so $ref cycles and shared
 * definitions compile once); strings are calls of a string rule (one shared rule for plain
 * strings, so its mask cache is shared too); numbers, literals and whitespace are inlined.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_nfa.h"
#include "grammar/grammar_regex.h"

#define SCHEMA_MAX_NESTING 64
#define INT_DIGITS 20
#define FRACTION_DIGITS 20
#define EXPONENT_DIGITS 3

typedef struct {
    const json_t *schema;
    int rule;
    int alternatives; /* the value's alternatives at its first byte (1 while still compiling: a cycle) */
} MemoEntry;

typedef struct {
    GrammarBuilder b;
    const json_t *root;
    char *why;
    size_t why_len;
    bool failed;
    MemoEntry *memo;
    int n_memo, cap_memo;
    int r_string, r_any_value, r_any_object, r_any_array;
    int nesting;
    int32_t plain_first, plain_n;
    int rule_alternatives; /* set by schema_rule: the alternatives of the rule it returned */
} Ctx;

typedef char Path[256];

static int fail(Ctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(Ctx *c, const char *path, const char *fmt, ...) {
    if (!c->failed) {
        c->failed = true;
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(c->why, c->why_len, "%s: %s", path, msg);
    }
    return -1;
}

/* The builder's failure (a size limit) reported at path. */
static int check_builder(Ctx *c, const char *path, int state) {
    if (c->b.failed) return fail(c, path, "%s", c->b.why);
    return c->failed ? -1 : state;
}

static void path_key(Path out, const char *path, const char *key) {
    int n = snprintf(out, sizeof(Path), "%s.%s", path, key);
    if (n >= (int)sizeof(Path)) strcpy(out + sizeof(Path) - 4, "...");
}

static void path_index(Path out, const char *path, const char *key, size_t i) {
    int n = snprintf(out, sizeof(Path), "%s.%s[%zu]", path, key, i);
    if (n >= (int)sizeof(Path)) strcpy(out + sizeof(Path) - 4, "...");
}

/* ---- small fragments ---- */

static int lit(Ctx *c, int rule, int from, const char *s) {
    return from < 0 ? -1 : grammar_frag_literal(&c->b, rule, from, s, strlen(s));
}

static int new_state(Ctx *c, int rule) { return grammar_state_new(&c->b, rule); }

static void eps(Ctx *c, int from, int to) {
    if (from >= 0 && to >= 0) grammar_edge_eps(&c->b, from, to);
}

static void byte_edge(Ctx *c, int from, char lo, char hi, int to) {
    if (from >= 0 && to >= 0) grammar_edge_byte(&c->b, from, (uint8_t)lo, (uint8_t)hi, to);
}

/* Whitespace between JSON tokens: none, one space, or a newline and up to GRAMMAR_MAX_INDENT spaces. */
static int ws(Ctx *c, int rule, int from) {
    if (from < 0) return -1;
    int end = new_state(c, rule), nl = new_state(c, rule);
    eps(c, from, end);
    byte_edge(c, from, ' ', ' ', end);
    byte_edge(c, from, '\n', '\n', nl);
    eps(c, nl, end);
    for (int i = 0, at = nl; i < GRAMMAR_MAX_INDENT; i++) {
        int next = new_state(c, rule);
        byte_edge(c, at, ' ', ' ', next);
        eps(c, next, end);
        at = next;
    }
    return c->b.failed ? -1 : end;
}

/* Runs of digits: at least min, at most max, ending at a fresh state. */
static int digits(Ctx *c, int rule, int from, int min, int max) {
    int end = new_state(c, rule), at = from;
    for (int i = 0; i < max && at >= 0; i++) {
        if (i >= min) eps(c, at, end);
        int next = new_state(c, rule);
        byte_edge(c, at, '0', '9', next);
        at = next;
    }
    eps(c, at, end);
    return c->b.failed ? -1 : end;
}

static int integer(Ctx *c, int rule, int from) {
    if (from < 0) return -1;
    int sign = new_state(c, rule), end = new_state(c, rule), lead = new_state(c, rule);
    eps(c, from, sign);
    byte_edge(c, from, '-', '-', sign);
    byte_edge(c, sign, '0', '0', end);
    byte_edge(c, sign, '1', '9', lead);
    eps(c, digits(c, rule, lead, 0, INT_DIGITS - 1), end);
    return c->b.failed ? -1 : end;
}

static int number(Ctx *c, int rule, int from) {
    int i = integer(c, rule, from);
    if (i < 0) return -1;
    int frac_end = new_state(c, rule), dot = new_state(c, rule);
    eps(c, i, frac_end);
    byte_edge(c, i, '.', '.', dot);
    eps(c, digits(c, rule, dot, 1, FRACTION_DIGITS), frac_end);
    int exp_end = new_state(c, rule), e = new_state(c, rule), sign = new_state(c, rule);
    eps(c, frac_end, exp_end);
    byte_edge(c, frac_end, 'e', 'e', e);
    byte_edge(c, frac_end, 'E', 'E', e);
    eps(c, e, sign);
    byte_edge(c, e, '+', '+', sign);
    byte_edge(c, e, '-', '-', sign);
    eps(c, digits(c, rule, sign, 1, EXPONENT_DIGITS), exp_end);
    return c->b.failed ? -1 : exp_end;
}

/* A JSON value's compact serialization as a literal. */
static int json_literal(Ctx *c, int rule, int from, const json_t *value, const char *path) {
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return fail(c, path, "cannot serialize the value");
    int end = lit(c, rule, from, text);
    free(text);
    return end;
}

static int call(Ctx *c, int rule, int from, int callee) {
    if (from < 0 || callee < 0) return -1;
    return grammar_frag_call(&c->b, rule, from, callee);
}

/* ---- shared rules for unconstrained values ---- */

static int string_rule_plain(Ctx *c) {
    if (c->r_string >= 0) return c->r_string;
    c->r_string = grammar_build_plain_string(&c->b, &c->plain_first, &c->plain_n);
    return c->r_string;
}

static int any_value_rule(Ctx *c);

static int any_container_rule(Ctx *c, bool object) {
    int *slot = object ? &c->r_any_object : &c->r_any_array;
    if (*slot >= 0) return *slot;
    int r = *slot = grammar_rule_new(&c->b);
    if (r < 0) return -1;
    int value = any_value_rule(c), key = object ? string_rule_plain(c) : -1;
    int open = ws(c, r, lit(c, r, c->b.rule_start[r], object ? "{" : "[")), end = new_state(c, r), more = new_state(c, r);
    byte_edge(c, open, object ? '}' : ']', object ? '}' : ']', end);
    /* more: after an element; ", element" loops back to it */
    int items[2] = {open, ws(c, r, lit(c, r, more, ","))};
    for (int i = 0; i < 2; i++) {
        int at = items[i];
        if (object) at = ws(c, r, lit(c, r, call(c, r, at, key), ":"));
        eps(c, call(c, r, at, value), more);
    }
    byte_edge(c, ws(c, r, more), object ? '}' : ']', object ? '}' : ']', end);
    grammar_state_final(&c->b, end);
    return c->b.failed ? -1 : r;
}

static int any_value_rule(Ctx *c) {
    if (c->r_any_value >= 0) return c->r_any_value;
    int r = c->r_any_value = grammar_rule_new(&c->b);
    if (r < 0) return -1;
    int s = c->b.rule_start[r], end = new_state(c, r);
    eps(c, call(c, r, s, any_container_rule(c, true)), end);
    eps(c, call(c, r, s, any_container_rule(c, false)), end);
    eps(c, call(c, r, s, string_rule_plain(c)), end);
    eps(c, number(c, r, s), end);
    eps(c, lit(c, r, s, "true"), end);
    eps(c, lit(c, r, s, "false"), end);
    eps(c, lit(c, r, s, "null"), end);
    grammar_state_final(&c->b, end);
    return c->b.failed ? -1 : r;
}

/* ---- keywords ---- */

static const char *const ANNOTATIONS[] = {"description", "title", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "strict", "$defs", "definitions",
                                          "discriminator", NULL};
static const char *const CONSTRAINTS[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                          "items", "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf",
                                          "$ref", "minLength", "maxLength", "pattern", "format", NULL};

static bool in_list(const char *const *list, const char *key) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], key) == 0) return true;
    return false;
}

/* The first constraint keyword of schema other than those in `allowed`, or NULL. */
static const char *other_constraint(const json_t *schema, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)schema, key, v) {
        (void)v;
        if (in_list(CONSTRAINTS, key) && !in_list(allowed, key)) return key;
    }
    return NULL;
}

/* A non-negative integer keyword (absent: dflt), at most GRAMMAR_MAX_STRING_UNROLL. */
static int count_keyword(Ctx *c, const json_t *schema, const char *key, int dflt, const char *path, int *out) {
    const json_t *v = json_object_get(schema, key);
    *out = dflt;
    if (!v) return 0;
    if (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v)) {
        long long x = (long long)json_real_value(v);
        if (x >= 0 && x <= GRAMMAR_MAX_STRING_UNROLL) {
            *out = (int)x;
            return 0;
        }
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fail(c, path, "keyword '%s' must be a non-negative integer", key);
    if (json_integer_value(v) > GRAMMAR_MAX_STRING_UNROLL)
        return fail(c, path, "keyword '%s' above %d is not supported", key, GRAMMAR_MAX_STRING_UNROLL);
    *out = (int)json_integer_value(v);
    return 0;
}

static int schema_rule(Ctx *c, const json_t *schema, const char *path);

/* ---- strings ---- */

static const char *format_pattern(const char *format) {
#define TIME_RE "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define DATE_RE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
#define OCTET_RE "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    if (strcmp(format, "date") == 0) return "^" DATE_RE "$";
    if (strcmp(format, "time") == 0) return "^" TIME_RE "$";
    if (strcmp(format, "date-time") == 0) return "^" DATE_RE "[Tt]" TIME_RE "$";
    if (strcmp(format, "uuid") == 0) return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    if (strcmp(format, "ipv4") == 0) return "^(" OCTET_RE "\\.){3}" OCTET_RE "$";
    return NULL;
#undef TIME_RE
#undef DATE_RE
#undef OCTET_RE
}

static int string_value(Ctx *c, int rule, int from, const json_t *schema, const char *path) {
    int min_len, max_len;
    if (count_keyword(c, schema, "minLength", 0, path, &min_len) || count_keyword(c, schema, "maxLength", -1, path, &max_len))
        return -1;
    const json_t *pat = json_object_get(schema, "pattern"), *fmt = json_object_get(schema, "format");
    if (pat && !json_is_string(pat)) return fail(c, path, "keyword 'pattern' must be a string");
    if (fmt && !json_is_string(fmt)) return fail(c, path, "keyword 'format' must be a string");
    const char *pattern = pat ? json_string_value(pat) : fmt ? format_pattern(json_string_value(fmt)) : NULL;
    if (max_len >= 0 && max_len < min_len) return fail(c, path, "maxLength %d is below minLength %d", max_len, min_len);
    if (!pattern && min_len == 0 && max_len < 0) return call(c, rule, from, string_rule_plain(c));
    if (pattern && (json_object_get(schema, "minLength") || json_object_get(schema, "maxLength")))
        return fail(c, path, "keyword '%s' together with '%s' is not supported", json_object_get(schema, "minLength") ? "minLength" : "maxLength",
                    pat ? "pattern" : "format");
    int r = grammar_rule_new(&c->b);
    if (r < 0) return check_builder(c, path, -1);
    int at = lit(c, r, c->b.rule_start[r], "\"");
    if (pattern) {
        char why[200];
        at = grammar_regex_emit(&c->b, r, at, pattern, why, sizeof why);
        if (at < 0) return c->b.failed ? check_builder(c, path, -1) : fail(c, path, "%s", why);
    } else {
        int max_or_inf = max_len < 0 ? INT32_MAX : max_len;
        for (int i = 0; i < min_len && at >= 0; i++) {
            grammar_state_bounded(&c->b, at, i, min_len, max_or_inf);
            at = grammar_frag_json_char(&c->b, r, at, -1);
        }
        grammar_state_bounded(&c->b, at, min_len, min_len, max_or_inf);
        if (max_len < 0) {
            grammar_frag_json_char(&c->b, r, at, at);
        } else {
            int end = new_state(c, r);
            eps(c, at, end);
            for (int i = min_len; i < max_len && at >= 0; i++) {
                at = grammar_frag_json_char(&c->b, r, at, -1);
                grammar_state_bounded(&c->b, at, i + 1, min_len, max_len);
                eps(c, at, end);
            }
            at = end;
        }
    }
    grammar_state_final(&c->b, lit(c, r, at, "\""));
    if (check_builder(c, path, 0) < 0) return -1;
    return call(c, rule, from, r);
}

/* ---- objects ---- */

/* "key": value */
static int pair(Ctx *c, int rule, int from, const char *key, int value_rule, const char *path) {
    json_t *k = json_string(key);
    if (!k) return fail(c, path, "property name is not valid UTF-8");
    int at = json_literal(c, rule, from, k, path);
    json_decref(k);
    return call(c, rule, ws(c, rule, lit(c, rule, at, ":")), value_rule);
}

static int object_value(Ctx *c, int rule, int from, const json_t *schema, const char *path) {
    const json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required"),
                 *addl = json_object_get(schema, "additionalProperties");
    Path sub;
    if (props && !json_is_object(props)) return fail(c, path, "keyword 'properties' must be an object");
    if (req && !json_is_array(req)) return fail(c, path, "keyword 'required' must be an array of strings");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(c, path, "keyword 'additionalProperties' must be a boolean or a schema");
    for (size_t i = 0; req && i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i))) return fail(c, path, "keyword 'required' must be an array of strings");
    /* Default: only the listed properties when there are any, anything otherwise. */
    bool extra = addl ? !json_is_false(addl) : !props;
    const json_t *extra_schema = addl && json_is_object(addl) ? addl : json_true();
    int extra_rule = -1;
    if (extra) {
        path_key(sub, path, "additionalProperties");
        if ((extra_rule = schema_rule(c, extra_schema, sub)) < 0) return -1;
    }
    int a0 = ws(c, rule, lit(c, rule, from, "{")), a1 = -1;
    /* Listed properties in order, then required names that are not listed. */
    size_t n_props = props ? json_object_size(props) : 0, n_req = req ? json_array_size(req) : 0;
    const char *key;
    json_t *value;
    void *iter = props ? json_object_iter((json_t *)props) : NULL;
    for (size_t step = 0; step < n_props + n_req && !c->failed; step++) {
        const char *name;
        int value_rule;
        bool required = false;
        if (step < n_props) {
            name = key = json_object_iter_key(iter);
            value = json_object_iter_value(iter);
            iter = json_object_iter_next((json_t *)props, iter);
            for (size_t i = 0; i < n_req; i++) required |= strcmp(json_string_value(json_array_get(req, i)), name) == 0;
            Path p2;
            path_key(p2, path, "properties");
            path_key(sub, p2, name);
            value_rule = schema_rule(c, value, sub);
        } else {
            name = json_string_value(json_array_get(req, step - n_props));
            if (props && json_object_get(props, name)) continue;
            bool dup = false;
            for (size_t i = 0; i < step - n_props; i++) dup |= strcmp(json_string_value(json_array_get(req, i)), name) == 0;
            if (dup) continue;
            if (!extra)
                return fail(c, path, "required property '%.100s' is not in 'properties' and additionalProperties is false", name);
            required = true;
            value_rule = extra_rule;
        }
        if (value_rule < 0) return -1;
        int n1 = new_state(c, rule);
        if (a0 >= 0) eps(c, pair(c, rule, a0, name, value_rule, path), n1);
        if (a1 >= 0) eps(c, pair(c, rule, ws(c, rule, lit(c, rule, a1, ",")), name, value_rule, path), n1);
        if (!required && a1 >= 0) eps(c, a1, n1);
        if (required) a0 = -1;
        a1 = n1;
    }
    if (c->failed) return -1;
    if (extra) {
        int key_rule = string_rule_plain(c), n1 = new_state(c, rule);
        if (a0 >= 0) eps(c, call(c, rule, ws(c, rule, lit(c, rule, call(c, rule, a0, key_rule), ":")), extra_rule), n1);
        if (a1 >= 0) eps(c, a1, n1);
        int again = call(c, rule, ws(c, rule, lit(c, rule, n1, ",")), key_rule);
        eps(c, call(c, rule, ws(c, rule, lit(c, rule, again, ":")), extra_rule), n1);
        a1 = n1;
    }
    int end = new_state(c, rule);
    if (a0 >= 0) byte_edge(c, a0, '}', '}', end);
    if (a1 >= 0) byte_edge(c, ws(c, rule, a1), '}', '}', end);
    return check_builder(c, path, end);
}

/* ---- arrays ---- */

static int array_value(Ctx *c, int rule, int from, const json_t *schema, const char *path) {
    const json_t *prefix = json_object_get(schema, "prefixItems"), *items = json_object_get(schema, "items");
    if (prefix && !json_is_array(prefix)) return fail(c, path, "keyword 'prefixItems' must be an array of schemas");
    if (items && json_is_array(items)) return fail(c, path, "keyword 'items' as an array (draft 4 tuples) is not supported; use 'prefixItems'");
    int min, max;
    if (count_keyword(c, schema, "minItems", 0, path, &min) || count_keyword(c, schema, "maxItems", -1, path, &max)) return -1;
    int k = prefix ? (int)json_array_size(prefix) : 0;
    if (items && json_is_false(items)) max = max < 0 || max > k ? k : max;
    if (max >= 0 && max < min) return fail(c, path, "maxItems %d is below minItems %d (or items is false)", max, min);
    if (k > GRAMMAR_MAX_STRING_UNROLL) return fail(c, path, "more than %d prefixItems", GRAMMAR_MAX_STRING_UNROLL);
    const json_t *rest = items && !json_is_false(items) ? items : json_true();
    Path sub;
    int rest_rule = -1;
    if (max < 0 || max > k) {
        path_key(sub, path, "items");
        if ((rest_rule = schema_rule(c, rest, sub)) < 0) return -1;
    }
    int at = ws(c, rule, lit(c, rule, from, "[")), end = new_state(c, rule);
    if (min == 0) byte_edge(c, at, ']', ']', end);
    int unroll = max >= 0 ? max : (k > min ? k : min) > 1 ? (k > min ? k : min) : 1;
    for (int j = 0; j < unroll && at >= 0; j++) {
        int item_rule = rest_rule;
        if (j < k) {
            path_index(sub, path, "prefixItems", (size_t)j);
            if ((item_rule = schema_rule(c, json_array_get(prefix, (size_t)j), sub)) < 0) return -1;
        }
        at = call(c, rule, j == 0 ? at : ws(c, rule, lit(c, rule, at, ",")), item_rule);
        if (j + 1 >= min) byte_edge(c, ws(c, rule, at), ']', ']', end);
    }
    if (max < 0 && at >= 0) eps(c, call(c, rule, ws(c, rule, lit(c, rule, at, ",")), rest_rule), at);
    return check_builder(c, path, end);
}

/* ---- schemas ---- */

static const json_t *resolve_ref(Ctx *c, const char *ref, const char *path) {
    if (ref[0] != '#') {
        fail(c, path, "$ref '%.100s' is not supported (only local references: '#', '#/$defs/...', '#/definitions/...')", ref);
        return NULL;
    }
    const json_t *at = c->root;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') break;
        p++;
        char token[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof token) token[n++] = ch;
        }
        token[n] = 0;
        at = json_is_object(at) ? json_object_get(at, token) : json_is_array(at) ? json_array_get(at, (size_t)atol(token)) : NULL;
        if (!at) break;
    }
    if (!at || *p) fail(c, path, "$ref '%.100s' does not resolve", ref);
    return *p ? NULL : at;
}

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_OBJ = 32, T_ARR = 64 };

static int type_bits(Ctx *c, const json_t *schema, const char *path) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "object", "array"};
    const json_t *t = json_object_get(schema, "type");
    if (!t) {
        int bits = 0;
        if (json_object_get(schema, "properties") || json_object_get(schema, "additionalProperties") || json_object_get(schema, "required"))
            bits |= T_OBJ;
        if (json_object_get(schema, "items") || json_object_get(schema, "prefixItems") || json_object_get(schema, "minItems") ||
            json_object_get(schema, "maxItems"))
            bits |= T_ARR;
        if (json_object_get(schema, "minLength") || json_object_get(schema, "maxLength") || json_object_get(schema, "pattern") ||
            (json_object_get(schema, "format") && json_is_string(json_object_get(schema, "format")) &&
             format_pattern(json_string_value(json_object_get(schema, "format")))))
            bits |= T_STR;
        return bits; /* 0: any value */
    }
    int bits = 0;
    size_t n = json_is_array(t) ? json_array_size(t) : 1;
    if (json_is_array(t) && n == 0) return fail(c, path, "keyword 'type' is an empty list");
    for (size_t i = 0; i < n; i++) {
        const json_t *one = json_is_array(t) ? json_array_get(t, i) : t;
        int found = -1;
        for (int k = 0; json_is_string(one) && k < 7; k++)
            if (strcmp(json_string_value(one), names[k]) == 0) found = k;
        if (found < 0) return fail(c, path, "keyword 'type' has an unknown type %s", json_is_string(one) ? json_string_value(one) : "(not a string)");
        bits |= 1 << found;
    }
    if (bits & T_NUM) bits &= ~T_INT; /* integers are numbers */
    return bits;
}

/* The schema's value from state `from` of rule; returns the state after it. */
/* Alternatives one JSON value position opens at once: an enum's values, the sum over an
 * anyOf/oneOf's branches (through $ref), 1 for anything else. The matcher follows them all in
 * parallel, and past GRAMMAR_MAX_ALTERNATIVES its bounded closure gives up mid-generation (a 500
 * after the prefill, before this check): so such a schema is refused here, as a 400. */
static int check_alternatives(Ctx *c, const char *path, long long n) {
    if (n <= GRAMMAR_MAX_ALTERNATIVES) return 0;
    return fail(c, path, "%lld alternatives at one position (enum values, and anyOf/oneOf branches counted through $ref); at most %d are supported",
                n, GRAMMAR_MAX_ALTERNATIVES);
}

static int schema_value(Ctx *c, int rule, int from, const json_t *schema, const char *path, int *alternatives) {
    Path sub;
    if (json_is_true(schema)) return call(c, rule, from, any_value_rule(c));
    if (json_is_false(schema)) return fail(c, path, "schema false can never be satisfied");
    if (!json_is_object(schema)) return fail(c, path, "a schema must be an object or a boolean");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)schema, key, v) {
        (void)v;
        if (!in_list(ANNOTATIONS, key) && !in_list(CONSTRAINTS, key)) return fail(c, path, "keyword '%.100s' is not supported", key);
    }
    const json_t *ref = json_object_get(schema, "$ref");
    if (ref) {
        const char *other = other_constraint(schema, (const char *const[]){"$ref", NULL});
        if (other) return fail(c, path, "keyword '$ref' next to '%s' is not supported", other);
        if (!json_is_string(ref)) return fail(c, path, "keyword '$ref' must be a string");
        path_key(sub, path, "$ref");
        const json_t *target = resolve_ref(c, json_string_value(ref), sub);
        if (!target) return -1;
        int callee = schema_rule(c, target, sub);
        *alternatives = c->rule_alternatives;
        return call(c, rule, from, callee);
    }
    const char *alt_key = json_object_get(schema, "anyOf") ? "anyOf" : json_object_get(schema, "oneOf") ? "oneOf" : NULL;
    if (alt_key || json_object_get(schema, "allOf")) {
        const char *kw = alt_key ? alt_key : "allOf";
        const json_t *list = json_object_get(schema, kw);
        const char *other = other_constraint(schema, (const char *const[]){kw, NULL});
        if (other) return fail(c, path, "keyword '%s' next to '%s' is not supported", kw, other);
        if (!json_is_array(list) || json_array_size(list) == 0) return fail(c, path, "keyword '%s' must be a non-empty array", kw);
        if (!alt_key && json_array_size(list) != 1) return fail(c, path, "keyword 'allOf' with more than one schema is not supported");
        int end = new_state(c, rule);
        long long total = 0;
        for (size_t i = 0; i < json_array_size(list) && !c->failed; i++) {
            path_index(sub, path, kw, i);
            int callee = schema_rule(c, json_array_get(list, i), sub);
            total += c->rule_alternatives;
            eps(c, call(c, rule, from, callee), end);
        }
        if (check_alternatives(c, path, total)) return -1;
        *alternatives = (int)total;
        return check_builder(c, path, end);
    }
    const json_t *cst = json_object_get(schema, "const");
    if (cst) return json_literal(c, rule, from, cst, path);
    const json_t *en = json_object_get(schema, "enum");
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) return fail(c, path, "keyword 'enum' must be a non-empty array");
        if (check_alternatives(c, path, (long long)json_array_size(en))) return -1;
        *alternatives = (int)json_array_size(en);
        int end = new_state(c, rule);
        for (size_t i = 0; i < json_array_size(en); i++) eps(c, json_literal(c, rule, from, json_array_get(en, i), path), end);
        return check_builder(c, path, end);
    }
    int bits = type_bits(c, schema, path);
    if (bits < 0) return -1;
    if (bits == 0) return call(c, rule, from, any_value_rule(c));
    int end = new_state(c, rule);
    if (bits & T_NULL) eps(c, lit(c, rule, from, "null"), end);
    if (bits & T_BOOL) {
        eps(c, lit(c, rule, from, "true"), end);
        eps(c, lit(c, rule, from, "false"), end);
    }
    if (bits & T_INT) eps(c, integer(c, rule, from), end);
    if (bits & T_NUM) eps(c, number(c, rule, from), end);
    if (bits & T_STR) eps(c, string_value(c, rule, from, schema, path), end);
    if (bits & T_OBJ) eps(c, object_value(c, rule, from, schema, path), end);
    if (bits & T_ARR) eps(c, array_value(c, rule, from, schema, path), end);
    return check_builder(c, path, end);
}

static int schema_rule(Ctx *c, const json_t *schema, const char *path) {
    if (c->failed) return -1;
    c->rule_alternatives = 1;
    if (json_is_true(schema)) return any_value_rule(c);
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].schema == schema) {
            c->rule_alternatives = c->memo[i].alternatives;
            return c->memo[i].rule;
        }
    if (c->nesting >= SCHEMA_MAX_NESTING) return fail(c, path, "schema nested deeper than %d levels", SCHEMA_MAX_NESTING);
    int r = grammar_rule_new(&c->b);
    if (r < 0) return check_builder(c, path, -1);
    if (c->n_memo == c->cap_memo) {
        int cap = c->cap_memo ? c->cap_memo * 2 : 16;
        MemoEntry *m = realloc(c->memo, (size_t)cap * sizeof *m);
        if (!m) return fail(c, path, "out of memory");
        c->memo = m;
        c->cap_memo = cap;
    }
    int at = c->n_memo++;
    c->memo[at] = (MemoEntry){schema, r, 1};
    c->nesting++;
    int alternatives = 1;
    int end = schema_value(c, r, c->b.rule_start[r], schema, path, &alternatives);
    c->nesting--;
    c->memo[at].alternatives = alternatives; /* memo may have moved (realloc): by index */
    c->rule_alternatives = alternatives;
    grammar_state_final(&c->b, end);
    return end < 0 ? -1 : r;
}

/* ---- the spec ---- */

static const char *spec_string(Ctx *c, const json_t *spec, const char *key, size_t *len) {
    const json_t *v = json_object_get(spec, key);
    *len = 0;
    if (!v) return "";
    if (!json_is_string(v)) {
        fail(c, key, "must be a string");
        return NULL;
    }
    *len = json_string_length(v);
    return json_string_value(v);
}

static int spec_count(Ctx *c, const json_t *spec, const char *key, int dflt, int *out) {
    const json_t *v = json_object_get(spec, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > GRAMMAR_MAX_ITEMS)
        return fail(c, key, "must be an integer in [0, %d]", GRAMMAR_MAX_ITEMS);
    *out = (int)json_integer_value(v);
    return 0;
}

Grammar *grammar_compile(const char *spec_json, size_t len, char *why, size_t why_len) {
    char scratch[8];
    if (!why || why_len == 0) {
        why = scratch;
        why_len = sizeof scratch;
    }
    if (!spec_json || len == 0) {
        snprintf(why, why_len, "grammar spec: empty");
        return NULL;
    }
    if (len > GRAMMAR_SPEC_MAX_BYTES) {
        snprintf(why, why_len, "grammar spec: %zu bytes is more than the %u accepted", len, GRAMMAR_SPEC_MAX_BYTES);
        return NULL;
    }
    json_error_t jerr;
    json_t *spec = json_loadb(spec_json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!spec) {
        snprintf(why, why_len, "grammar spec: invalid JSON at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    Ctx c = {.why = why, .why_len = why_len, .r_string = -1, .r_any_value = -1, .r_any_object = -1, .r_any_array = -1};
    grammar_builder_init(&c.b);
    Grammar *g = NULL;
    if (!json_is_object(spec)) {
        fail(&c, "grammar spec", "must be a JSON object");
        goto out;
    }
    static const char *const fields[] = {"schema", "prefix", "suffix", "min_items", "max_items", "separator", "trigger", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(spec, key, v) {
        (void)v;
        if (!in_list(fields, key)) {
            fail(&c, "grammar spec", "field '%.100s' is not supported", key);
            goto out;
        }
    }
    c.root = json_object_get(spec, "schema");
    if (!c.root) {
        fail(&c, "grammar spec", "field 'schema' is required");
        goto out;
    }
    size_t prefix_len, suffix_len, sep_len, trig_len;
    const char *prefix = spec_string(&c, spec, "prefix", &prefix_len), *suffix = spec_string(&c, spec, "suffix", &suffix_len),
               *sep = spec_string(&c, spec, "separator", &sep_len), *trigger = spec_string(&c, spec, "trigger", &trig_len);
    int min_items, max_items;
    if (c.failed || spec_count(&c, spec, "min_items", 1, &min_items) || spec_count(&c, spec, "max_items", 1, &max_items)) goto out;
    if (max_items < 1 || max_items < min_items) {
        fail(&c, "max_items", "must be at least 1 and at least min_items");
        goto out;
    }
    if (json_object_get(spec, "trigger") && trig_len == 0) {
        fail(&c, "trigger", "must not be empty");
        goto out;
    }
    int root = grammar_rule_new(&c.b);
    int value = schema_rule(&c, c.root, "schema");
    int at = root >= 0 ? c.b.rule_start[root] : -1, after_prefix = -1;
    if (min_items == 0) grammar_state_final(&c.b, at);
    for (int i = 0; i < max_items && at >= 0 && value >= 0; i++) {
        if (i > 0) at = grammar_frag_literal(&c.b, root, at, sep, sep_len);
        at = grammar_frag_literal(&c.b, root, at, prefix, prefix_len);
        if (i == 0) after_prefix = at;
        at = grammar_frag_literal(&c.b, root, grammar_frag_call(&c.b, root, at, value), suffix, suffix_len);
        if (i + 1 >= min_items) grammar_state_final(&c.b, at);
    }
    if (c.failed || check_builder(&c, "grammar spec", 0) < 0) goto out;
    g = grammar_builder_finish(&c.b, root, why, why_len);
    if (g && trig_len > 0) {
        g->trigger = malloc(trig_len);
        if (!g->trigger) {
            grammar_free(g);
            g = NULL;
            snprintf(why, why_len, "grammar spec: out of memory");
            goto out;
        }
        memcpy(g->trigger, trigger, trig_len);
        g->trigger_len = trig_len;
        g->feed_trigger = prefix_len >= trig_len && memcmp(prefix, trigger, trig_len) == 0;
        g->after_prefix_state = after_prefix;
    }
    if (g && c.r_string >= 0) {
        g->plain_first = c.plain_first;
        g->plain_n = c.plain_n;
    }
out:
    grammar_builder_free(&c.b);
    free(c.memo);
    json_decref(spec);
    return g;
}

int grammar_spec_check(const char *spec_json, size_t len, char *why, size_t why_len) {
    Grammar *g = grammar_compile(spec_json, len, why, why_len);
    if (!g) return -1;
    grammar_free(g);
    return 0;
}

char *grammar_spec_from_response_format(const char *text, size_t len, char *why, size_t why_len) {
    if (why_len) why[0] = 0;
    json_error_t jerr;
    json_t *rf = json_loadb(text, len, 0, &jerr), *spec = NULL;
    char *out = NULL;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!rf || !json_is_object(rf) || !type) {
        snprintf(why, why_len, "response_format: must be an object with a string 'type'");
    } else if (strcmp(type, "text") == 0) {
        /* unconstrained */
    } else if (strcmp(type, "json_object") == 0) {
        out = strdup("{\"schema\":{\"type\":\"object\"}}");
        if (!out) snprintf(why, why_len, "response_format: out of memory");
    } else if (strcmp(type, "json_schema") == 0) {
        json_t *js = json_object_get(rf, "json_schema");
        json_t *schema = json_object_get(js, "schema");
        if (!json_is_object(js)) snprintf(why, why_len, "response_format.json_schema: must be an object");
        else if (schema && !json_is_object(schema) && !json_is_boolean(schema))
            snprintf(why, why_len, "response_format.json_schema.schema: must be an object");
        else if (!(spec = json_pack("{sO}", "schema", schema ? schema : json_true())) || !(out = json_dumps(spec, JSON_COMPACT)))
            snprintf(why, why_len, "response_format: out of memory");
    } else {
        snprintf(why, why_len, "response_format.type: '%.60s' is not supported (text, json_object, json_schema)", type);
    }
    json_decref(spec);
    json_decref(rf);
    return out;
}
