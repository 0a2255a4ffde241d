/* Values: the render arena, lists and dicts, Python's str()/repr() spellings, json.dumps, and the
 * conversion of jansson input into values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja/jinja_internal.h"

/* ---- arena ---- */

struct JArenaChunk {
    JArenaChunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define JARENA_CHUNK (64 * 1024)

void *jarena_alloc(JArena *a, size_t n) {
    if (n > ((size_t)1 << 40)) return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    JArenaChunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > JARENA_CHUNK / 4 ? n : JARENA_CHUNK;
        if (a->cap && a->used + size > a->cap) {
            a->hit_cap = true;
            return NULL;
        }
        c = malloc(sizeof *c + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        a->used += size;
        if (size == n && a->head) { /* a big block goes behind the current chunk, which keeps its free room */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *jarena_strndup(JArena *a, const char *s, size_t n) {
    char *p = jarena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void jarena_free(JArena *a) {
    for (JArenaChunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- buffers ---- */

int jbuf_put(JRender *r, JBuf *b, const char *p, size_t n) {
    if (n == 0) return 0;
    if (b->n + n > r->lim.max_output_bytes)
        return jr_fail(r, JINJA_ERR_LIMIT, 0, "rendered text exceeds %zu bytes", r->lim.max_output_bytes);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *grown = realloc(b->p, cap);
        if (!grown) return jr_nomem(r, 0);
        b->p = grown;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int jbuf_puts(JRender *r, JBuf *b, const char *s) { return jbuf_put(r, b, s, strlen(s)); }

JValue jv_str_from_buf(JRender *r, JBuf *b) {
    JValue v = jv_str("", 0);
    if (b->n) {
        char *s = jarena_strndup(&r->arena, b->p, b->n);
        if (s) v = jv_str(s, b->n);
        else v = jv_undef(NULL); /* caller checks r->err via the arena failure below */
    }
    free(b->p);
    *b = (JBuf){0};
    return v;
}

/* ---- UTF-8 ---- */

size_t ju8_next(const char *p, size_t n, size_t i) {
    unsigned char c = (unsigned char)p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    for (size_t k = 1; k < len; k++)
        if (i + k >= n || ((unsigned char)p[i + k] & 0xC0) != 0x80) return i + 1; /* invalid: one byte */
    return i + len;
}

uint32_t ju8_decode(const char *p, size_t n, size_t i) {
    const unsigned char *u = (const unsigned char *)p + i;
    size_t len = ju8_next(p, n, i) - i;
    if (len == 1) return u[0];
    if (len == 2) return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    if (len == 3) return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}

size_t ju8_count(const char *p, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; i = ju8_next(p, n, i)) count++;
    return count;
}

/* ---- lists and dicts ---- */

JList *jlist_new(JRender *r, size_t cap) {
    JList *l = jarena_alloc(&r->arena, sizeof *l);
    if (!l) return NULL;
    if (cap && !(l->items = jarena_alloc(&r->arena, cap * sizeof *l->items))) return NULL;
    l->cap = cap;
    return l;
}

int jlist_push(JRender *r, JList *l, JValue v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        JValue *items = jarena_alloc(&r->arena, cap * sizeof *items);
        if (!items) return jr_nomem(r, 0);
        if (l->n) memcpy(items, l->items, l->n * sizeof *items);
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = v;
    return 0;
}

JDict *jdict_new(JRender *r, size_t cap) {
    JDict *d = jarena_alloc(&r->arena, sizeof *d);
    if (!d) return NULL;
    if (cap && (!(d->keys = jarena_alloc(&r->arena, cap * sizeof *d->keys)) || !(d->vals = jarena_alloc(&r->arena, cap * sizeof *d->vals))))
        return NULL;
    d->cap = cap;
    return d;
}

const JValue *jdict_get(const JDict *d, const JValue *key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(&d->keys[i], key, 0)) return &d->vals[i];
    return NULL;
}

const JValue *jdict_get_str(const JDict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].kind == JV_STR && d->keys[i].u.s.n == n && memcmp(d->keys[i].u.s.p, key, n) == 0) return &d->vals[i];
    return NULL;
}

int jdict_set(JRender *r, JDict *d, JValue key, JValue val) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(&d->keys[i], &key, 0)) {
            d->vals[i] = val;
            return 0;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        JValue *keys = jarena_alloc(&r->arena, cap * sizeof *keys), *vals = jarena_alloc(&r->arena, cap * sizeof *vals);
        if (!keys || !vals) return jr_nomem(r, 0);
        if (d->n) {
            memcpy(keys, d->keys, d->n * sizeof *keys);
            memcpy(vals, d->vals, d->n * sizeof *vals);
        }
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
    return 0;
}

JValue jv_list(JList *l, uint8_t flags) { JValue v = {.kind = JV_LIST, .flags = flags}; v.u.list = l; return v; }
JValue jv_dict(JDict *d, uint8_t flags) { JValue v = {.kind = JV_DICT, .flags = flags}; v.u.dict = d; return v; }

/* ---- predicates ---- */

bool jv_truthy(const JValue *v) {
    switch (v->kind) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->u.list->n != 0;
    case JV_DICT: return (v->flags & JF_NAMESPACE) || v->u.dict->n != 0;
    default: return true;
    }
}

const char *jv_type_name(const JValue *v) {
    switch (v->kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->flags & JF_TUPLE ? "tuple" : "list";
    case JV_DICT: return v->flags & JF_NAMESPACE ? "Namespace" : "dict";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

static bool is_number(const JValue *v) { return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL; }
static double as_double(const JValue *v) { return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b; }

bool jv_equal(const JValue *a, const JValue *b, int depth) {
    if (depth > JINJA_MAX_VALUE_DEPTH) return false;
    if (is_number(a) && is_number(b)) {
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT) {
            int64_t x = a->kind == JV_INT ? a->u.i : a->u.b, y = b->kind == JV_INT ? b->u.i : b->u.b;
            return x == y;
        }
        return as_double(a) == as_double(b);
    }
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case JV_LIST:
        if ((a->flags & JF_TUPLE) != (b->flags & JF_TUPLE) || a->u.list->n != b->u.list->n) return false;
        for (size_t i = 0; i < a->u.list->n; i++)
            if (!jv_equal(&a->u.list->items[i], &b->u.list->items[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a->u.dict == b->u.dict) return true;
        if ((a->flags & JF_NAMESPACE) || (b->flags & JF_NAMESPACE) || a->u.dict->n != b->u.dict->n) return false;
        for (size_t i = 0; i < a->u.dict->n; i++) {
            const JValue *other = jdict_get(b->u.dict, &a->u.dict->keys[i]);
            if (!other || !jv_equal(&a->u.dict->vals[i], other, depth + 1)) return false;
        }
        return true;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_LOOP: return a->u.loop == b->u.loop;
    default: return false;
    }
}

/* ---- Python spellings ---- */

void jv_format_float(double f, char *out, size_t cap) {
    if (isnan(f)) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(out, cap, signbit(f) ? "-0.0" : "0.0"); return; }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) { /* the shortest digits that read back as f, like repr() */
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, exp10;
    const char *q = buf;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1; /* digits d1 d2 ... with the point after decpt digits */
    char o[64];
    int k = 0;
    if (neg) o[k++] = '-';
    if (decpt > 16 || decpt < -3) {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            for (int i = 1; i < nd; i++) o[k++] = digits[i];
        }
        k += snprintf(o + k, sizeof o - (size_t)k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        o[k++] = '0';
        o[k++] = '.';
        for (int i = 0; i < -decpt; i++) o[k++] = '0';
        for (int i = 0; i < nd; i++) o[k++] = digits[i];
    } else {
        for (int i = 0; i < decpt; i++) o[k++] = i < nd ? digits[i] : '0';
        o[k++] = '.';
        if (nd > decpt)
            for (int i = decpt; i < nd; i++) o[k++] = digits[i];
        else
            o[k++] = '0';
    }
    o[k] = '\0';
    snprintf(out, cap, "%s", o);
}

static bool unicode_printable(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7F) return false;
    if (cp >= 0x80 && cp <= 0xA0) return false;
    if (cp == 0xAD || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
        (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xD800 && cp <= 0xF8FF) ||
        (cp >= 0xFFF9 && cp <= 0xFFFB) || cp >= 0xF0000)
        return false;
    return true;
}

static int append_repr_str(JRender *r, JBuf *b, const char *s, size_t n) {
    bool has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    if (jbuf_put(r, b, &quote, 1)) return -1;
    size_t run = 0; /* start of the pending run of bytes copied as they are */
    for (size_t i = 0; i < n;) {
        size_t next = ju8_next(s, n, i);
        uint32_t cp = ju8_decode(s, n, i);
        char esc[16] = "";
        if (next - i == 1 && (unsigned char)s[i] >= 0x80) snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)s[i]);
        else if (cp == (uint32_t)quote || cp == '\\') snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (cp == '\r') snprintf(esc, sizeof esc, "\\r");
        else if (cp == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (!unicode_printable(cp)) snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
        if (esc[0]) {
            if (jbuf_put(r, b, s + run, i - run) || jbuf_puts(r, b, esc)) return -1;
            run = next;
        }
        i = next;
    }
    if (jbuf_put(r, b, s + run, n - run)) return -1;
    return jbuf_put(r, b, &quote, 1);
}

static int depth_fail(JRender *r) { return jr_fail(r, JINJA_ERR_LIMIT, 0, "value nested deeper than %d levels", JINJA_MAX_VALUE_DEPTH); }

int jv_append_repr(JRender *r, JBuf *b, const JValue *v, int depth) {
    if (depth > JINJA_MAX_VALUE_DEPTH) return depth_fail(r);
    if (v->kind == JV_STR) return append_repr_str(r, b, v->u.s.p, v->u.s.n);
    if (v->kind == JV_LIST) {
        bool tuple = v->flags & JF_TUPLE;
        if (jbuf_puts(r, b, tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < v->u.list->n; i++)
            if ((i && jbuf_puts(r, b, ", ")) || jv_append_repr(r, b, &v->u.list->items[i], depth + 1)) return -1;
        if (tuple && v->u.list->n == 1 && jbuf_puts(r, b, ",")) return -1;
        return jbuf_puts(r, b, tuple ? ")" : "]");
    }
    if (v->kind == JV_DICT) {
        bool ns = v->flags & JF_NAMESPACE;
        if (jbuf_puts(r, b, ns ? "<Namespace {" : "{")) return -1;
        for (size_t i = 0; i < v->u.dict->n; i++)
            if ((i && jbuf_puts(r, b, ", ")) || jv_append_repr(r, b, &v->u.dict->keys[i], depth + 1) || jbuf_puts(r, b, ": ") ||
                jv_append_repr(r, b, &v->u.dict->vals[i], depth + 1))
                return -1;
        return jbuf_puts(r, b, ns ? "}>" : "}");
    }
    return jv_append_str(r, b, v, depth);
}

int jv_append_str(JRender *r, JBuf *b, const JValue *v, int depth) {
    char num[64];
    switch (v->kind) {
    case JV_UNDEF: return 0;
    case JV_NONE: return jbuf_puts(r, b, "None");
    case JV_BOOL: return jbuf_puts(r, b, v->u.b ? "True" : "False");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v->u.i); return jbuf_puts(r, b, num);
    case JV_FLOAT: jv_format_float(v->u.f, num, sizeof num); return jbuf_puts(r, b, num);
    case JV_STR: return jbuf_put(r, b, v->u.s.p, v->u.s.n);
    case JV_LIST: case JV_DICT: return jv_append_repr(r, b, v, depth);
    case JV_FUNC: return jbuf_puts(r, b, "<function>");
    case JV_LOOP: return jbuf_puts(r, b, "<LoopContext>");
    }
    return 0;
}

int jv_to_string(JRender *r, const JValue *v, JValue *out) {
    if (v->kind == JV_STR) {
        *out = *v;
        return 0;
    }
    JBuf b = {0};
    if (jv_append_str(r, &b, v, 0)) {
        free(b.p);
        return -1;
    }
    *out = jv_str_from_buf(r, &b);
    return out->kind == JV_STR ? 0 : jr_nomem(r, 0);
}

/* ---- json.dumps ---- */

static int json_str_out(JRender *r, JBuf *b, const char *s, size_t n, bool ensure_ascii) {
    if (jbuf_put(r, b, "\"", 1)) return -1;
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        size_t next = ju8_next(s, n, i);
        unsigned char c = (unsigned char)s[i];
        char esc[16] = "";
        if (c == '"') strcpy(esc, "\\\"");
        else if (c == '\\') strcpy(esc, "\\\\");
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c == '\b') strcpy(esc, "\\b");
        else if (c == '\f') strcpy(esc, "\\f");
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else if (ensure_ascii && c >= 0x80) {
            uint32_t cp = ju8_decode(s, n, i);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
        }
        if (esc[0]) {
            if (jbuf_put(r, b, s + run, i - run) || jbuf_puts(r, b, esc)) return -1;
            run = next;
        }
        i = next;
    }
    if (jbuf_put(r, b, s + run, n - run)) return -1;
    return jbuf_put(r, b, "\"", 1);
}

static int json_newline(JRender *r, JBuf *b, const char *indent, int level) {
    if (jbuf_put(r, b, "\n", 1)) return -1;
    for (int i = 0; i < level; i++)
        if (jbuf_puts(r, b, indent)) return -1;
    return 0;
}

static int json_key(JRender *r, JBuf *b, const JValue *k, bool ensure_ascii) {
    char num[64];
    switch (k->kind) {
    case JV_STR: return json_str_out(r, b, k->u.s.p, k->u.s.n, ensure_ascii);
    case JV_INT: snprintf(num, sizeof num, "\"%lld\"", (long long)k->u.i); return jbuf_puts(r, b, num);
    case JV_BOOL: return jbuf_puts(r, b, k->u.b ? "\"true\"" : "\"false\"");
    case JV_NONE: return jbuf_puts(r, b, "\"null\"");
    case JV_FLOAT:
        jv_format_float(k->u.f, num, sizeof num);
        return jbuf_puts(r, b, "\"") || jbuf_puts(r, b, num) || jbuf_puts(r, b, "\"");
    default: return jr_fail(r, JINJA_ERR_RENDER, 0, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int key_cmp(const JValue *a, const JValue *b) {
    if (a->kind == JV_STR && b->kind == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, n);
        return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    return 0;
}

int jv_tojson(JRender *r, JBuf *b, const JValue *v, const char *indent, const char *item_sep, const char *key_sep, bool sort_keys,
              bool ensure_ascii, int depth, int level) {
    if (depth > JINJA_MAX_VALUE_DEPTH) return depth_fail(r);
    char num[64];
    switch (v->kind) {
    case JV_NONE: return jbuf_puts(r, b, "null");
    case JV_BOOL: return jbuf_puts(r, b, v->u.b ? "true" : "false");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v->u.i); return jbuf_puts(r, b, num);
    case JV_FLOAT:
        if (isnan(v->u.f)) return jbuf_puts(r, b, "NaN");
        if (isinf(v->u.f)) return jbuf_puts(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        jv_format_float(v->u.f, num, sizeof num);
        return jbuf_puts(r, b, num);
    case JV_STR: return json_str_out(r, b, v->u.s.p, v->u.s.n, ensure_ascii);
    case JV_LIST: {
        const JList *l = v->u.list;
        if (l->n == 0) return jbuf_puts(r, b, "[]");
        if (jbuf_puts(r, b, "[")) return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i && jbuf_puts(r, b, item_sep)) return -1;
            if (indent && json_newline(r, b, indent, level + 1)) return -1;
            if (jv_tojson(r, b, &l->items[i], indent, item_sep, key_sep, sort_keys, ensure_ascii, depth + 1, level + 1)) return -1;
        }
        if (indent && json_newline(r, b, indent, level)) return -1;
        return jbuf_puts(r, b, "]");
    }
    case JV_DICT: {
        if (v->flags & JF_NAMESPACE) break;
        const JDict *d = v->u.dict;
        if (d->n == 0) return jbuf_puts(r, b, "{}");
        size_t *order = jarena_alloc(&r->arena, d->n * sizeof *order);
        if (!order) return jr_nomem(r, 0);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys) /* insertion sort: stable, dicts are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && key_cmp(&d->keys[order[j - 1]], &d->keys[order[j]]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        if (jbuf_puts(r, b, "{")) return -1;
        for (size_t k = 0; k < d->n; k++) {
            size_t i = order[k];
            if (k && jbuf_puts(r, b, item_sep)) return -1;
            if (indent && json_newline(r, b, indent, level + 1)) return -1;
            if (json_key(r, b, &d->keys[i], ensure_ascii) || jbuf_puts(r, b, key_sep) ||
                jv_tojson(r, b, &d->vals[i], indent, item_sep, key_sep, sort_keys, ensure_ascii, depth + 1, level + 1))
                return -1;
        }
        if (indent && json_newline(r, b, indent, level)) return -1;
        return jbuf_puts(r, b, "}");
    }
    default: break;
    }
    return jr_fail(r, JINJA_ERR_RENDER, 0, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
}

/* ---- input ---- */

int jv_from_json(JRender *r, const json_t *j, JValue *out, int depth) {
    if (depth > JINJA_MAX_VALUE_DEPTH) return depth_fail(r);
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return 0;
    case JSON_TRUE: *out = jv_bool(true); return 0;
    case JSON_FALSE: *out = jv_bool(false); return 0;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_STRING: *out = jv_str(json_string_value(j), json_string_length(j)); return 0;
    case JSON_ARRAY: {
        JList *l = jlist_new(r, json_array_size(j));
        if (!l) return jr_nomem(r, 0);
        for (size_t i = 0; i < json_array_size(j); i++)
            if (jv_from_json(r, json_array_get(j, i), &l->items[l->n++], depth + 1)) return -1;
        *out = jv_list(l, 0);
        return 0;
    }
    case JSON_OBJECT: {
        JDict *d = jdict_new(r, json_object_size(j));
        if (!d) return jr_nomem(r, 0);
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            d->keys[d->n] = jv_str(key, strlen(key));
            if (jv_from_json(r, val, &d->vals[d->n], depth + 1)) return -1;
            d->n++;
        }
        *out = jv_dict(d, 0);
        return 0;
    }
    }
    return jr_fail(r, JINJA_ERR_RENDER, 0, "unsupported JSON value in the template's variables");
}

int jv_iterate(JRender *r, const JValue *v, JList **out, int line) {
    switch (v->kind) {
    case JV_UNDEF:
        if (!(*out = jlist_new(r, 0))) return jr_nomem(r, line);
        return 0;
    case JV_LIST: *out = v->u.list; return 0;
    case JV_DICT:
        if (v->flags & JF_NAMESPACE) break;
        if (!(*out = jlist_new(r, v->u.dict->n))) return jr_nomem(r, line);
        for (size_t i = 0; i < v->u.dict->n; i++) (*out)->items[(*out)->n++] = v->u.dict->keys[i];
        return 0;
    case JV_STR: {
        const char *s = v->u.s.p;
        size_t n = v->u.s.n;
        if (!(*out = jlist_new(r, ju8_count(s, n)))) return jr_nomem(r, line);
        for (size_t i = 0; i < n;) {
            size_t next = ju8_next(s, n, i);
            (*out)->items[(*out)->n++] = jv_str(s + i, next - i);
            i = next;
        }
        return 0;
    }
    default: break;
    }
    return jr_fail(r, JINJA_ERR_RENDER, line, "'%s' object is not iterable", jv_type_name(v));
}
