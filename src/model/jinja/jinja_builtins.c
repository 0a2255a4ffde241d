/* Filters, tests, methods of str/dict/loop, and the global functions (range, namespace, dict,
 * raise_exception, strftime_now), with Python's semantics where templates can observe them. */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/jinja/jinja_internal.h"
#include "model/unicode.h"

/* ---- argument helpers ---- */

static const JValue *arg(const JArgs *a, int pos, const char *name) {
    if (pos >= 0 && pos < a->n_pos) return &a->pos[pos];
    for (int k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kw_names[k], name)) return &a->kw[k];
    return NULL;
}

static bool given(const JValue *v) { return v && v->kind != JV_UNDEF && v->kind != JV_NONE; }

static int need_str(JRender *r, const JArgs *a, const JValue *v, const char *what, JValue *out) {
    if (v && v->kind == JV_STR) {
        *out = *v;
        return 0;
    }
    return jr_fail(r, JINJA_ERR_RENDER, a->line, "%s must be a string, not %s", what, v ? jv_type_name(v) : "missing");
}

static int str_of(JRender *r, const JValue *v, JValue *out) { return jv_to_string(r, v, out); }

/* The buffer's text as the render's string (the empty string when it holds none); b is freed. */
static int new_str(JRender *r, JBuf *b, JValue *out, int line) {
    *out = jv_str_from_buf(r, b);
    return out->kind == JV_STR ? 0 : jr_nomem(r, line);
}

/* Python's str.isspace() code points. */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_chars(uint32_t c, const JValue *chars) {
    const char *p = chars->u.s.p;
    size_t n = chars->u.s.n;
    for (size_t i = 0; i < n; i = ju8_next(p, n, i))
        if (ju8_decode(p, n, i) == c) return true;
    return false;
}

static JValue strip(const JValue *s, const JValue *chars, bool left, bool right) {
    const char *p = s->u.s.p;
    size_t b = 0, e = s->u.s.n;
    if (left)
        while (b < e) {
            uint32_t c = ju8_decode(p, e, b);
            if (chars ? !in_chars(c, chars) : !py_space(c)) break;
            b = ju8_next(p, e, b);
        }
    if (right)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            if (ju8_next(p, e, st) != e) st = e - 1; /* invalid sequence: one byte */
            uint32_t c = ju8_decode(p, e, st);
            if (chars ? !in_chars(c, chars) : !py_space(c)) break;
            e = st;
        }
    return jv_str(p + b, e - b);
}

/* Simple (one to one) case mappings for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic, which
 * is what chat templates meet; Python's full Unicode tables (and special cases beyond ß) are not
 * reproduced. */
static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c == 0xB5) return 0x39C;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x131) return 'I';
        if (c == 0x17F) return 'S';
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
        if (c == 0x130 || c == 0x138 || c == 0x149) return c;
        return (c % 2 == 1) ? c - 1 : c;
    }
    if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x130) return 'i';
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
        if (c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17F) return c;
        return (c % 2 == 0) ? c + 1 : c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

static bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF; }

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE_FILTER, CASE_TITLE_METHOD };

static bool title_separator(uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || (c >= 0x09 && c <= 0x0D) || c == ' ' || (c >= 0x1C && c <= 0x1F) ||
           c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int change_case(JRender *r, const JValue *in, int mode, int line, JValue *out) {
    JValue s;
    if (str_of(r, in, &s)) return -1;
    char *o = jarena_alloc(&r->arena, s.u.s.n * 2 + 1); /* ß -> SS doubles at most */
    if (!o) return jr_nomem(r, line);
    size_t k = 0;
    bool word_start = true, first = true;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    for (size_t i = 0; i < n;) {
        size_t next = ju8_next(p, n, i);
        uint32_t c = ju8_decode(p, n, i);
        bool invalid = next - i == 1 && (unsigned char)p[i] >= 0x80;
        bool up;
        switch (mode) {
        case CASE_UPPER: up = true; break;
        case CASE_LOWER: up = false; break;
        case CASE_CAPITALIZE: up = first; break;
        case CASE_TITLE_FILTER: up = word_start; word_start = title_separator(c); break;
        default: up = word_start; word_start = !cp_cased(c); break; /* str.title() */
        }
        first = false;
        if (invalid) o[k++] = p[i];
        else if (up && c == 0xDF) { o[k++] = 'S'; o[k++] = 'S'; }
        else k += (size_t)utf8_encode(up ? cp_upper(c) : cp_lower(c), o + k);
        i = next;
    }
    o[k] = '\0';
    *out = jv_str(o, k);
    return 0;
}

static int replace_str(JRender *r, const JValue *s, const JValue *old, const JValue *neu, int64_t count, int line, JValue *out) {
    JBuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t done = 0;
    if (old->u.s.n == 0) { /* Python inserts between every character */
        while (count < 0 || done < count) {
            if (jbuf_put(r, &b, neu->u.s.p, neu->u.s.n)) goto fail;
            done++;
            if (i >= n) break;
            size_t next = ju8_next(p, n, i);
            if (jbuf_put(r, &b, p + i, next - i)) goto fail;
            i = next;
        }
        if (jbuf_put(r, &b, p + i, n - i)) goto fail;
        return new_str(r, &b, out, line);
    }
    while (i <= n && (count < 0 || done < count)) {
        const char *hit = memmem(p + i, n - i, old->u.s.p, old->u.s.n);
        if (!hit) break;
        size_t at = (size_t)(hit - p);
        if (jbuf_put(r, &b, p + i, at - i) || jbuf_put(r, &b, neu->u.s.p, neu->u.s.n)) goto fail;
        i = at + old->u.s.n;
        done++;
    }
    if (jbuf_put(r, &b, p + i, n - i)) goto fail;
    return new_str(r, &b, out, line);
fail:
    free(b.p);
    return -1;
}

static int split_str(JRender *r, const JValue *s, const JValue *sep, int64_t maxsplit, int line, JValue *out) {
    JList *l = jlist_new(r, 0);
    if (!l) return jr_nomem(r, line);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    if (!given(sep)) {
        for (;;) {
            while (i < n && py_space(ju8_decode(p, n, i))) i = ju8_next(p, n, i);
            if (i >= n) break;
            size_t st = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                JValue rest = strip(&(JValue){.kind = JV_STR, .u.s = {p + st, n - st}}, NULL, false, true);
                if (jlist_push(r, l, rest)) return -1;
                break;
            }
            while (i < n && !py_space(ju8_decode(p, n, i))) i = ju8_next(p, n, i);
            if (jlist_push(r, l, jv_str(p + st, i - st))) return -1;
        }
    } else {
        if (sep->kind != JV_STR) return jr_fail(r, JINJA_ERR_RENDER, line, "split(): separator must be a string");
        if (sep->u.s.n == 0) return jr_fail(r, JINJA_ERR_RENDER, line, "split(): empty separator");
        for (;;) {
            const char *hit = (maxsplit < 0 || (int64_t)l->n < maxsplit) ? memmem(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
            if (!hit) {
                if (jlist_push(r, l, jv_str(p + i, n - i))) return -1;
                break;
            }
            if (jlist_push(r, l, jv_str(p + i, (size_t)(hit - (p + i))))) return -1;
            i = (size_t)(hit - p) + sep->u.s.n;
        }
    }
    *out = jv_list(l, 0);
    return 0;
}

static int get_int_arg(JRender *r, const JArgs *a, const JValue *v, int64_t dflt, int64_t *out) {
    if (!given(v)) {
        *out = dflt;
        return 0;
    }
    if (v->kind == JV_INT) *out = v->u.i;
    else if (v->kind == JV_BOOL) *out = v->u.b;
    else return jr_fail(r, JINJA_ERR_RENDER, a->line, "expected an integer argument, got %s", jv_type_name(v));
    return 0;
}

/* ---- filters ---- */

static int f_tojson(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *ensure = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *seps = arg(a, 2, "separators"),
                 *sort = arg(a, 3, "sort_keys");
    char spaces[65];
    const char *indent = NULL;
    if (given(ind)) {
        if (ind->kind == JV_STR) {
            char *t = jarena_strndup(&r->arena, ind->u.s.p, ind->u.s.n);
            if (!t) return jr_nomem(r, a->line);
            indent = t;
        } else if (ind->kind == JV_INT) {
            int64_t k = ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : ind->u.i;
            memset(spaces, ' ', (size_t)k);
            spaces[k] = '\0';
            indent = spaces;
        } else {
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "tojson: indent must be an int or a string");
        }
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (given(seps)) {
        if (seps->kind != JV_LIST || seps->u.list->n != 2 || seps->u.list->items[0].kind != JV_STR || seps->u.list->items[1].kind != JV_STR)
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "tojson: separators must be a pair of strings");
        item_sep = jarena_strndup(&r->arena, seps->u.list->items[0].u.s.p, seps->u.list->items[0].u.s.n);
        key_sep = jarena_strndup(&r->arena, seps->u.list->items[1].u.s.p, seps->u.list->items[1].u.s.n);
        if (!item_sep || !key_sep) return jr_nomem(r, a->line);
    }
    JBuf b = {0};
    if (jv_tojson(r, &b, self, indent, item_sep, key_sep, sort && jv_truthy(sort), ensure && jv_truthy(ensure), 0, 0)) {
        free(b.p);
        return -1;
    }
    return new_str(r, &b, out, a->line);
}

static int f_trim(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JValue s;
    const JValue *chars = arg(a, 0, "chars");
    if (str_of(r, self, &s)) return -1;
    *out = strip(&s, given(chars) && chars->kind == JV_STR ? chars : NULL, true, true);
    return 0;
}

static int length_of(JRender *r, const JValue *v, int line, int64_t *n) {
    switch (v->kind) {
    case JV_UNDEF: *n = 0; return 0;
    case JV_STR: *n = (int64_t)ju8_count(v->u.s.p, v->u.s.n); return 0;
    case JV_LIST: *n = (int64_t)v->u.list->n; return 0;
    case JV_DICT: *n = (int64_t)v->u.dict->n; return 0;
    default: return jr_fail(r, JINJA_ERR_RENDER, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static int f_length(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    int64_t n = 0;
    if (length_of(r, self, a->line, &n)) return -1;
    *out = jv_int(n);
    return 0;
}

static int dict_items(JRender *r, const JValue *self, int line, JValue *out) {
    const JDict *d = self->u.dict;
    JList *l = jlist_new(r, d->n);
    if (!l) return jr_nomem(r, line);
    for (size_t i = 0; i < d->n; i++) {
        JList *pair = jlist_new(r, 2);
        if (!pair) return jr_nomem(r, line);
        pair->items[0] = d->keys[i];
        pair->items[1] = d->vals[i];
        pair->n = 2;
        l->items[l->n++] = jv_list(pair, JF_TUPLE);
    }
    *out = jv_list(l, 0);
    return 0;
}

static int f_items(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (self->kind == JV_UNDEF) {
        JList *l = jlist_new(r, 0);
        if (!l) return jr_nomem(r, a->line);
        *out = jv_list(l, 0);
        return 0;
    }
    if (self->kind != JV_DICT) return jr_fail(r, JINJA_ERR_RENDER, a->line, "items: can only get item pairs from a mapping, not %s", jv_type_name(self));
    return dict_items(r, self, a->line, out);
}

static int f_first_last(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool last) {
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    *out = items->n ? items->items[last ? items->n - 1 : 0] : jv_undef(last ? "last" : "first");
    return 0;
}
static int f_first(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return f_first_last(r, self, a, out, false); }
static int f_last(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return f_first_last(r, self, a, out, true); }

static int attr_path(JRender *r, const JValue *item, const JValue *attr, int line, JValue *out) {
    if (attr->kind == JV_INT) return jinja_get_item(r, item, attr, line, out);
    if (attr->kind != JV_STR) return jr_fail(r, JINJA_ERR_RENDER, line, "attribute must be a string");
    *out = *item;
    const char *p = attr->u.s.p, *end = p + attr->u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        char *part = jarena_strndup(&r->arena, p, (size_t)(dot - p));
        if (!part) return jr_nomem(r, line);
        JValue next, key = jv_str(part, (size_t)(dot - p));
        bool digits = dot > p;
        for (const char *q = p; q < dot && digits; q++) digits = *q >= '0' && *q <= '9';
        if (digits) key = jv_int(atoll(part));
        if (out->kind == JV_DICT && !(out->flags & JF_NAMESPACE)) {
            if (jinja_get_item(r, out, &key, line, &next)) return -1;
        } else if (digits) {
            if (jinja_get_item(r, out, &key, line, &next)) return -1;
        } else if (jinja_get_attr(r, out, part, line, &next)) {
            return -1;
        }
        *out = next;
        p = dot + 1;
    }
    return 0;
}

static int f_join(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    JValue sepv = jv_str("", 0);
    if (given(sep) && str_of(r, sep, &sepv)) return -1;
    JBuf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        JValue v = items->items[i];
        if ((i && jbuf_put(r, &b, sepv.u.s.p, sepv.u.s.n)) || (given(attr) && attr_path(r, &items->items[i], attr, a->line, &v)) ||
            jv_append_str(r, &b, &v, 0)) {
            free(b.p);
            return -1;
        }
    }
    return new_str(r, &b, out, a->line);
}

static int f_default(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *dv = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
    if (self->kind == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(self))) *out = dv ? *dv : jv_str("", 0);
    else *out = *self;
    return 0;
}

static int f_upper(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return change_case(r, self, CASE_UPPER, a->line, out); }
static int f_lower(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return change_case(r, self, CASE_LOWER, a->line, out); }
static int f_capitalize(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return change_case(r, self, CASE_CAPITALIZE, a->line, out); }
static int f_title(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return change_case(r, self, CASE_TITLE_FILTER, a->line, out); }

static int f_replace(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JValue s = jv_str("", 0), old = s, neu = s;
    int64_t count = -1;
    if (str_of(r, self, &s) || need_str(r, a, arg(a, 0, "old"), "replace: old", &old) || need_str(r, a, arg(a, 1, "new"), "replace: new", &neu) ||
        get_int_arg(r, a, arg(a, 2, "count"), -1, &count))
        return -1;
    return replace_str(r, &s, &old, &neu, count, a->line, out);
}

static int f_string(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return str_of(r, self, out); }

static bool parse_py_int(const char *p, size_t n, int64_t *out) {
    char buf[64];
    size_t k = 0, i = 0;
    while (i < n && py_space((unsigned char)p[i])) i++;
    while (n > i && py_space((unsigned char)p[n - 1])) n--;
    if (i < n && (p[i] == '+' || p[i] == '-')) buf[k++] = p[i++];
    if (i >= n) return false;
    for (; i < n; i++) {
        if (p[i] == '_' && i + 1 < n && p[i + 1] != '_' && k > 0 && buf[k - 1] >= '0') continue;
        if (p[i] < '0' || p[i] > '9' || k >= sizeof buf - 1) return false;
        buf[k++] = p[i];
    }
    buf[k] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (*end || errno) return false;
    *out = v;
    return true;
}

static bool parse_py_float(const char *p, size_t n, double *out) {
    char buf[128];
    size_t i = 0;
    while (i < n && py_space((unsigned char)p[i])) i++;
    while (n > i && py_space((unsigned char)p[n - 1])) n--;
    if (n - i == 0 || n - i >= sizeof buf) return false;
    memcpy(buf, p + i, n - i);
    buf[n - i] = '\0';
    if (strchr(buf, 'x') || strchr(buf, 'X')) return false; /* strtod reads hex floats; Python does not */
    char *end;
    double v = strtod(buf, &end);
    if (*end) return false;
    *out = v;
    return true;
}

static int f_int(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *dflt = arg(a, 0, "default");
    JValue d = dflt ? *dflt : jv_int(0);
    int64_t i;
    double f;
    switch (self->kind) {
    case JV_INT: *out = *self; return 0;
    case JV_BOOL: *out = jv_int(self->u.b); return 0;
    case JV_FLOAT:
        if (!isfinite(self->u.f) || fabs(self->u.f) >= 9.2e18) *out = d;
        else *out = jv_int((int64_t)self->u.f);
        return 0;
    case JV_STR:
        if (parse_py_int(self->u.s.p, self->u.s.n, &i)) *out = jv_int(i);
        else if (parse_py_float(self->u.s.p, self->u.s.n, &f) && isfinite(f) && fabs(f) < 9.2e18) *out = jv_int((int64_t)f);
        else *out = d;
        return 0;
    default: *out = d; return 0;
    }
}

static int f_float(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *dflt = arg(a, 0, "default");
    JValue d = dflt ? *dflt : jv_float(0.0);
    double f;
    switch (self->kind) {
    case JV_INT: *out = jv_float((double)self->u.i); return 0;
    case JV_BOOL: *out = jv_float(self->u.b); return 0;
    case JV_FLOAT: *out = *self; return 0;
    case JV_STR: *out = parse_py_float(self->u.s.p, self->u.s.n, &f) ? jv_float(f) : d; return 0;
    default: *out = d; return 0;
    }
}

static int f_list(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    JList *l = jlist_new(r, items->n);
    if (!l) return jr_nomem(r, a->line);
    for (size_t i = 0; i < items->n; i++) l->items[l->n++] = items->items[i];
    *out = jv_list(l, 0);
    return 0;
}

/* Arguments from `from` onwards, for a filter or test named by a string argument. */
static JArgs rest_args(const JArgs *a, int from) {
    JArgs b = *a;
    b.n_pos = a->n_pos > from ? a->n_pos - from : 0;
    b.pos = a->n_pos > from ? a->pos + from : NULL;
    return b;
}

static int name_arg(JRender *r, const JArgs *a, const JValue *v, char **name) {
    if (!v || v->kind != JV_STR) return jr_fail(r, JINJA_ERR_RENDER, a->line, "expected a filter or test name");
    if (!(*name = jarena_strndup(&r->arena, v->u.s.p, v->u.s.n))) return jr_nomem(r, a->line);
    return 0;
}

static int f_map(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    JList *l = jlist_new(r, items->n);
    if (!l) return jr_nomem(r, a->line);
    const JValue *attr = arg(a, -1, "attribute");
    if (attr) {
        const JValue *dflt = arg(a, -1, "default");
        for (size_t i = 0; i < items->n; i++) {
            JValue v;
            if (attr_path(r, &items->items[i], attr, a->line, &v)) return -1;
            if (v.kind == JV_UNDEF && dflt) v = *dflt;
            l->items[l->n++] = v;
        }
    } else {
        char *name;
        if (name_arg(r, a, arg(a, 0, NULL), &name)) return -1;
        JBuiltinFn fn = jinja_find_filter(name);
        if (!fn) return jr_fail(r, JINJA_ERR_UNSUPPORTED, a->line, "unsupported filter '%s' (in map)", name);
        JArgs rest = rest_args(a, 1);
        for (size_t i = 0; i < items->n; i++)
            if (fn(r, &items->items[i], &rest, &l->items[l->n++])) return -1;
    }
    *out = jv_list(l, 0);
    return 0;
}

static int select_common(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool by_attr, bool keep) {
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    int first = by_attr ? 1 : 0;
    const JValue *attr = by_attr ? arg(a, 0, NULL) : NULL;
    if (by_attr && !attr) return jr_fail(r, JINJA_ERR_RENDER, a->line, "selectattr/rejectattr need an attribute name");
    JBuiltinFn test = NULL;
    if (a->n_pos > first) {
        char *name;
        if (name_arg(r, a, &a->pos[first], &name)) return -1;
        if (!(test = jinja_find_test(name))) return jr_fail(r, JINJA_ERR_UNSUPPORTED, a->line, "unsupported test '%s'", name);
    }
    JArgs rest = rest_args(a, first + 1);
    rest.n_kw = 0;
    JList *l = jlist_new(r, 0);
    if (!l) return jr_nomem(r, a->line);
    for (size_t i = 0; i < items->n; i++) {
        JValue v = items->items[i], res;
        if (attr && attr_path(r, &items->items[i], attr, a->line, &v)) return -1;
        if (test) {
            if (test(r, &v, &rest, &res)) return -1;
        } else {
            res = v;
        }
        if (jv_truthy(&res) == keep && jlist_push(r, l, items->items[i])) return -1;
    }
    *out = jv_list(l, 0);
    return 0;
}
static int f_select(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return select_common(r, self, a, out, false, true); }
static int f_reject(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return select_common(r, self, a, out, false, false); }
static int f_selectattr(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return select_common(r, self, a, out, true, true); }
static int f_rejectattr(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return select_common(r, self, a, out, true, false); }

static int fold_case(JRender *r, const JValue *v, bool case_sensitive, int line, JValue *out) {
    if (case_sensitive || v->kind != JV_STR) {
        *out = *v;
        return 0;
    }
    return change_case(r, v, CASE_LOWER, line, out);
}

static int f_unique(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    JList *l = jlist_new(r, 0), *seen = jlist_new(r, 0);
    if (!l || !seen) return jr_nomem(r, a->line);
    for (size_t i = 0; i < items->n; i++) {
        JValue key = items->items[i];
        if (given(attr) && attr_path(r, &items->items[i], attr, a->line, &key)) return -1;
        if (fold_case(r, &key, cs && jv_truthy(cs), a->line, &key)) return -1;
        bool dup = false;
        for (size_t k = 0; k < seen->n && !dup; k++) dup = jv_equal(&seen->items[k], &key, 0);
        if (!dup && (jlist_push(r, seen, key) || jlist_push(r, l, items->items[i]))) return -1;
    }
    *out = jv_list(l, 0);
    return 0;
}

static int f_safe(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (str_of(r, self, out)) return -1;
    out->flags |= JF_SAFE;
    return 0;
}

static int f_escape(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (self->kind == JV_STR && (self->flags & JF_SAFE)) {
        *out = *self;
        return 0;
    }
    JValue s;
    if (str_of(r, self, &s)) return -1;
    JBuf b = {0};
    size_t run = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        const char *e = NULL;
        switch (s.u.s.p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        default: break;
        }
        if (e && (jbuf_put(r, &b, s.u.s.p + run, i - run) || jbuf_puts(r, &b, e))) goto fail;
        if (e) run = i + 1;
    }
    if (jbuf_put(r, &b, s.u.s.p + run, s.u.s.n - run)) goto fail;
    if (new_str(r, &b, out, a->line)) return -1;
    out->flags |= JF_SAFE;
    return 0;
fail:
    free(b.p);
    return -1;
}

static int f_abs(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (self->kind == JV_INT && self->u.i != INT64_MIN) *out = jv_int(self->u.i < 0 ? -self->u.i : self->u.i);
    else if (self->kind == JV_BOOL) *out = jv_int(self->u.b);
    else if (self->kind == JV_FLOAT) *out = jv_float(fabs(self->u.f));
    else return jr_fail(r, JINJA_ERR_RENDER, a->line, "bad operand type for abs(): '%s'", jv_type_name(self));
    return 0;
}

static int f_round(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    int64_t prec = 0;
    const JValue *method = arg(a, 1, "method");
    if (get_int_arg(r, a, arg(a, 0, "precision"), 0, &prec)) return -1;
    if (prec < -15 || prec > 15) return jr_fail(r, JINJA_ERR_RENDER, a->line, "round: precision out of range");
    if (self->kind != JV_INT && self->kind != JV_FLOAT && self->kind != JV_BOOL)
        return jr_fail(r, JINJA_ERR_RENDER, a->line, "round: expected a number, not %s", jv_type_name(self));
    double x = self->kind == JV_FLOAT ? self->u.f : self->kind == JV_INT ? (double)self->u.i : self->u.b;
    char m = given(method) && method->kind == JV_STR && method->u.s.n ? method->u.s.p[0] : 'c';
    if (m == 'f' || (m == 'c' && given(method) && method->u.s.n > 1 && method->u.s.p[1] == 'e')) {
        double scale = pow(10, (double)prec);
        *out = jv_float((m == 'f' ? floor(x * scale) : ceil(x * scale)) / scale);
        return 0;
    }
    if (self->kind != JV_FLOAT) {
        *out = self->kind == JV_BOOL ? jv_int(self->u.b) : *self;
        return 0;
    }
    if (!isfinite(x) || prec < 0) {
        double scale = pow(10, (double)-prec);
        *out = jv_float(isfinite(x) ? nearbyint(x / scale) * scale : x);
        return 0;
    }
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, x); /* correctly rounded, half to even: Python's round() */
    *out = jv_float(strtod(buf, NULL));
    return 0;
}

static int f_reverse(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (self->kind == JV_STR) {
        JValue none = jv_none(), step = jv_int(-1);
        JValue key;
        (void)key;
        JList *items;
        if (jv_iterate(r, self, &items, a->line)) return -1;
        JBuf b = {0};
        for (size_t i = items->n; i-- > 0;)
            if (jbuf_put(r, &b, items->items[i].u.s.p, items->items[i].u.s.n)) {
                free(b.p);
                return -1;
            }
        (void)none;
        (void)step;
        return new_str(r, &b, out, a->line);
    }
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    JList *l = jlist_new(r, items->n);
    if (!l) return jr_nomem(r, a->line);
    for (size_t i = items->n; i-- > 0;) l->items[l->n++] = items->items[i];
    *out = jv_list(l, 0);
    return 0;
}

static int f_sum(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    bool is_float = start && start->kind == JV_FLOAT;
    int64_t si = start && start->kind == JV_INT ? start->u.i : 0;
    double sf = start && start->kind == JV_FLOAT ? start->u.f : (double)si;
    for (size_t i = 0; i < items->n; i++) {
        JValue v = items->items[i];
        if (given(attr) && attr_path(r, &items->items[i], attr, a->line, &v)) return -1;
        if (v.kind == JV_FLOAT) {
            if (!is_float) sf = (double)si;
            is_float = true;
            sf += v.u.f;
        } else if (v.kind == JV_INT || v.kind == JV_BOOL) {
            int64_t x = v.kind == JV_INT ? v.u.i : v.u.b;
            if (is_float) sf += (double)x;
            else if (__builtin_add_overflow(si, x, &si)) return jr_fail(r, JINJA_ERR_RENDER, a->line, "sum: integer overflow");
        } else {
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "sum: unsupported operand type '%s'", jv_type_name(&v));
        }
    }
    *out = is_float ? jv_float(sf) : jv_int(si);
    return 0;
}

static int minmax(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool want_max) {
    const JValue *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    if (items->n == 0) {
        *out = jv_undef(want_max ? "max" : "min");
        return 0;
    }
    size_t best = 0;
    JValue best_key;
    for (size_t i = 0; i < items->n; i++) {
        JValue key = items->items[i];
        if (given(attr) && attr_path(r, &items->items[i], attr, a->line, &key)) return -1;
        if (fold_case(r, &key, cs && jv_truthy(cs), a->line, &key)) return -1;
        if (i == 0) {
            best_key = key;
            continue;
        }
        bool better;
        if ((key.kind == JV_STR) != (best_key.kind == JV_STR))
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "max/min: cannot compare %s and %s", jv_type_name(&key), jv_type_name(&best_key));
        if (key.kind == JV_STR) {
            size_t n = key.u.s.n < best_key.u.s.n ? key.u.s.n : best_key.u.s.n;
            int c = memcmp(key.u.s.p, best_key.u.s.p, n);
            if (!c) c = (key.u.s.n > best_key.u.s.n) - (key.u.s.n < best_key.u.s.n);
            better = want_max ? c > 0 : c < 0;
        } else {
            double x = key.kind == JV_FLOAT ? key.u.f : key.kind == JV_INT ? (double)key.u.i : key.u.b;
            double y = best_key.kind == JV_FLOAT ? best_key.u.f : best_key.kind == JV_INT ? (double)best_key.u.i : best_key.u.b;
            better = want_max ? x > y : x < y;
        }
        if (better) {
            best = i;
            best_key = key;
        }
    }
    *out = items->items[best];
    return 0;
}
static int f_max(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return minmax(r, self, a, out, true); }
static int f_min(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return minmax(r, self, a, out, false); }

static int f_indent(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *width = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    JValue s, pad = jv_str("    ", 4);
    if (str_of(r, self, &s)) return -1;
    if (given(width)) {
        if (width->kind == JV_STR) pad = *width;
        else {
            int64_t w = 4;
            if (get_int_arg(r, a, width, 4, &w)) return -1;
            if (w < 0) w = 0;
            if (w > 256) w = 256;
            char *p = jarena_alloc(&r->arena, (size_t)w + 1);
            if (!p) return jr_nomem(r, a->line);
            memset(p, ' ', (size_t)w);
            pad = jv_str(p, (size_t)w);
        }
    }
    JBuf b = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    bool first_line = true;
    while (i <= n) {
        const char *nl = memchr(p + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - p) : n;
        bool empty = end == i;
        bool do_pad = first_line ? (first && jv_truthy(first)) : (!empty || (blank && jv_truthy(blank)));
        if ((do_pad && jbuf_put(r, &b, pad.u.s.p, pad.u.s.n)) || jbuf_put(r, &b, p + i, end - i) || (nl && jbuf_put(r, &b, "\n", 1))) {
            free(b.p);
            return -1;
        }
        first_line = false;
        if (!nl) break;
        i = end + 1;
    }
    return new_str(r, &b, out, a->line);
}

static int f_dictsort(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (self->kind != JV_DICT) return jr_fail(r, JINJA_ERR_RENDER, a->line, "dictsort: expected a mapping, not %s", jv_type_name(self));
    const JValue *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
    JValue pairs;
    if (dict_items(r, self, a->line, &pairs)) return -1;
    int which = given(by) && by->kind == JV_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5) ? 1 : 0;
    JList *l = pairs.u.list;
    JValue *keys = jarena_alloc(&r->arena, (l->n + 1) * sizeof *keys);
    if (!keys) return jr_nomem(r, a->line);
    for (size_t i = 0; i < l->n; i++)
        if (fold_case(r, &l->items[i].u.list->items[which], cs && jv_truthy(cs), a->line, &keys[i])) return -1;
    bool descending = rev && jv_truthy(rev);
    for (size_t i = 1; i < l->n; i++)
        for (size_t j = i; j > 0; j--) {
            JValue *x = &keys[j - 1], *y = &keys[j];
            int c;
            if (x->kind == JV_STR && y->kind == JV_STR) {
                size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
                c = memcmp(x->u.s.p, y->u.s.p, n);
                if (!c) c = (x->u.s.n > y->u.s.n) - (x->u.s.n < y->u.s.n);
            } else if ((x->kind == JV_INT || x->kind == JV_FLOAT) && (y->kind == JV_INT || y->kind == JV_FLOAT)) {
                double dx = x->kind == JV_INT ? (double)x->u.i : x->u.f, dy = y->kind == JV_INT ? (double)y->u.i : y->u.f;
                c = (dx > dy) - (dx < dy);
            } else {
                return jr_fail(r, JINJA_ERR_RENDER, a->line, "dictsort: cannot compare %s and %s", jv_type_name(x), jv_type_name(y));
            }
            if (descending ? c >= 0 : c <= 0) break;
            JValue t = *x;
            *x = *y;
            *y = t;
            JValue p = l->items[j - 1];
            l->items[j - 1] = l->items[j];
            l->items[j] = p;
        }
    *out = pairs;
    return 0;
}

/* Ordering for sort/dictsort-like filters: numbers with numbers, strings with strings (bytes, which
 * is code point order for UTF-8); -2 when the two cannot be compared. */
static int order(const JValue *x, const JValue *y) {
    bool xn = x->kind == JV_INT || x->kind == JV_FLOAT || x->kind == JV_BOOL, yn = y->kind == JV_INT || y->kind == JV_FLOAT || y->kind == JV_BOOL;
    if (xn && yn) {
        double a = x->kind == JV_FLOAT ? x->u.f : x->kind == JV_INT ? (double)x->u.i : x->u.b;
        double b = y->kind == JV_FLOAT ? y->u.f : y->kind == JV_INT ? (double)y->u.i : y->u.b;
        if (x->kind == JV_INT && y->kind == JV_INT) return (x->u.i > y->u.i) - (x->u.i < y->u.i);
        return (a > b) - (a < b);
    }
    if (x->kind == JV_STR && y->kind == JV_STR) {
        size_t n = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
        int c = memcmp(x->u.s.p, y->u.s.p, n);
        if (!c) c = (x->u.s.n > y->u.s.n) - (x->u.s.n < y->u.s.n);
        return (c > 0) - (c < 0);
    }
    return -2;
}

static int f_sort(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
    JList *items;
    if (jv_iterate(r, self, &items, a->line)) return -1;
    JList *l = jlist_new(r, items->n);
    JValue *keys = jarena_alloc(&r->arena, (items->n + 1) * sizeof *keys);
    if (!l || !keys) return jr_nomem(r, a->line);
    for (size_t i = 0; i < items->n; i++) {
        l->items[l->n++] = items->items[i];
        keys[i] = items->items[i];
        if (given(attr) && attr_path(r, &items->items[i], attr, a->line, &keys[i])) return -1;
        if (fold_case(r, &keys[i], cs && jv_truthy(cs), a->line, &keys[i])) return -1;
    }
    bool descending = rev && jv_truthy(rev);
    for (size_t i = 1; i < l->n; i++) /* insertion sort: stable, like Python's */
        for (size_t j = i; j > 0; j--) {
            int c = order(&keys[j - 1], &keys[j]);
            if (c == -2)
                return jr_fail(r, JINJA_ERR_RENDER, a->line, "sort: '<' not supported between instances of '%s' and '%s'",
                               jv_type_name(&keys[j]), jv_type_name(&keys[j - 1]));
            if (descending ? c >= 0 : c <= 0) break;
            JValue t = keys[j - 1];
            keys[j - 1] = keys[j];
            keys[j] = t;
            t = l->items[j - 1];
            l->items[j - 1] = l->items[j];
            l->items[j] = t;
        }
    *out = jv_list(l, 0);
    return 0;
}

static int f_batch_unsupported(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    return jr_fail(r, JINJA_ERR_UNSUPPORTED, a->line, "unsupported filter");
}

static const struct {
    const char *name;
    JBuiltinFn fn;
} filters[] = {
    {"tojson", f_tojson}, {"trim", f_trim}, {"length", f_length}, {"count", f_length}, {"items", f_items},
    {"first", f_first}, {"last", f_last}, {"join", f_join}, {"default", f_default}, {"d", f_default},
    {"upper", f_upper}, {"lower", f_lower}, {"capitalize", f_capitalize}, {"title", f_title}, {"replace", f_replace},
    {"string", f_string}, {"int", f_int}, {"float", f_float}, {"list", f_list}, {"map", f_map}, {"select", f_select},
    {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"unique", f_unique},
    {"safe", f_safe}, {"e", f_escape}, {"escape", f_escape}, {"abs", f_abs}, {"round", f_round}, {"reverse", f_reverse},
    {"sum", f_sum}, {"max", f_max}, {"min", f_min}, {"indent", f_indent}, {"dictsort", f_dictsort}, {"sort", f_sort},
};

JBuiltinFn jinja_find_filter(const char *name) {
    (void)f_batch_unsupported;
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name)) return filters[i].fn;
    return NULL;
}

/* ---- tests ---- */

#define TEST(fname, expr)                                                                 \
    static int fname(JRender *r, const JValue *v, const JArgs *a, JValue *out) {          \
        (void)r;                                                                          \
        (void)a;                                                                          \
        *out = jv_bool(expr);                                                             \
        return 0;                                                                         \
    }
TEST(t_defined, v->kind != JV_UNDEF)
TEST(t_undefined, v->kind == JV_UNDEF)
TEST(t_none, v->kind == JV_NONE)
TEST(t_string, v->kind == JV_STR)
TEST(t_mapping, v->kind == JV_DICT && !(v->flags & JF_NAMESPACE))
TEST(t_iterable, v->kind == JV_UNDEF || v->kind == JV_STR || v->kind == JV_LIST || (v->kind == JV_DICT && !(v->flags & JF_NAMESPACE)))
TEST(t_sequence, v->kind == JV_UNDEF || v->kind == JV_STR || v->kind == JV_LIST || (v->kind == JV_DICT && !(v->flags & JF_NAMESPACE)))
TEST(t_number, v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL)
TEST(t_integer, v->kind == JV_INT)
TEST(t_float, v->kind == JV_FLOAT)
TEST(t_boolean, v->kind == JV_BOOL)
TEST(t_true, v->kind == JV_BOOL && v->u.b)
TEST(t_false, v->kind == JV_BOOL && !v->u.b)
TEST(t_callable, v->kind == JV_FUNC)
TEST(t_escaped, v->kind == JV_STR && (v->flags & JF_SAFE))

static int t_parity(JRender *r, const JValue *v, const JArgs *a, JValue *out, int want) {
    if (v->kind != JV_INT && v->kind != JV_BOOL) return jr_fail(r, JINJA_ERR_RENDER, a->line, "odd/even: expected an integer, not %s", jv_type_name(v));
    int64_t i = v->kind == JV_INT ? v->u.i : v->u.b;
    *out = jv_bool((i % 2 != 0) == want);
    return 0;
}
static int t_odd(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_parity(r, v, a, out, 1); }
static int t_even(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_parity(r, v, a, out, 0); }

static int t_divisibleby(JRender *r, const JValue *v, const JArgs *a, JValue *out) {
    int64_t d = 0;
    if (get_int_arg(r, a, arg(a, 0, "num"), 0, &d)) return -1;
    if (d == 0) return jr_fail(r, JINJA_ERR_RENDER, a->line, "divisibleby: division by zero");
    if (v->kind != JV_INT) return jr_fail(r, JINJA_ERR_RENDER, a->line, "divisibleby: expected an integer");
    *out = jv_bool(d == -1 || v->u.i % d == 0);
    return 0;
}

static int t_cmp(JRender *r, const JValue *v, const JArgs *a, JValue *out, int kind) {
    const JValue *other = arg(a, 0, "other");
    if (!other) return jr_fail(r, JINJA_ERR_RENDER, a->line, "comparison test needs an argument");
    if (kind == 0 || kind == 1) {
        *out = jv_bool(jv_equal(v, other, 0) == (kind == 0));
        return 0;
    }
    double x, y;
    if (v->kind == JV_STR && other->kind == JV_STR) {
        size_t n = v->u.s.n < other->u.s.n ? v->u.s.n : other->u.s.n;
        int c = memcmp(v->u.s.p, other->u.s.p, n);
        if (!c) c = (v->u.s.n > other->u.s.n) - (v->u.s.n < other->u.s.n);
        x = c;
        y = 0;
    } else if ((v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL) && (other->kind == JV_INT || other->kind == JV_FLOAT || other->kind == JV_BOOL)) {
        x = v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b;
        y = other->kind == JV_FLOAT ? other->u.f : other->kind == JV_INT ? (double)other->u.i : other->u.b;
    } else {
        return jr_fail(r, JINJA_ERR_RENDER, a->line, "cannot compare %s and %s", jv_type_name(v), jv_type_name(other));
    }
    *out = jv_bool(kind == 2 ? x < y : kind == 3 ? x <= y : kind == 4 ? x > y : x >= y);
    return 0;
}
static int t_eq(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_cmp(r, v, a, out, 0); }
static int t_ne(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_cmp(r, v, a, out, 1); }
static int t_lt(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_cmp(r, v, a, out, 2); }
static int t_le(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_cmp(r, v, a, out, 3); }
static int t_gt(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_cmp(r, v, a, out, 4); }
static int t_ge(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_cmp(r, v, a, out, 5); }

static int t_in(JRender *r, const JValue *v, const JArgs *a, JValue *out) {
    const JValue *seq = arg(a, 0, "seq");
    if (!seq) return jr_fail(r, JINJA_ERR_RENDER, a->line, "'in' test needs a sequence");
    bool res = false;
    if (seq->kind == JV_STR) {
        if (v->kind != JV_STR) return jr_fail(r, JINJA_ERR_RENDER, a->line, "'in <string>' requires string as left operand");
        res = v->u.s.n == 0 || memmem(seq->u.s.p, seq->u.s.n, v->u.s.p, v->u.s.n);
    } else if (seq->kind == JV_LIST) {
        for (size_t i = 0; i < seq->u.list->n && !res; i++) res = jv_equal(&seq->u.list->items[i], v, 0);
    } else if (seq->kind == JV_DICT) {
        res = jdict_get(seq->u.dict, v) != NULL;
    } else if (seq->kind != JV_UNDEF) {
        return jr_fail(r, JINJA_ERR_RENDER, a->line, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
    *out = jv_bool(res);
    return 0;
}

static int t_sameas(JRender *r, const JValue *v, const JArgs *a, JValue *out) {
    const JValue *o = arg(a, 0, "other");
    if (!o) return jr_fail(r, JINJA_ERR_RENDER, a->line, "sameas needs an argument");
    bool same = v->kind == o->kind;
    if (same) switch (v->kind) {
        case JV_BOOL: same = v->u.b == o->u.b; break;
        case JV_INT: same = v->u.i == o->u.i; break;
        case JV_STR: same = v->u.s.p == o->u.s.p && v->u.s.n == o->u.s.n; break;
        case JV_LIST: same = v->u.list == o->u.list; break;
        case JV_DICT: same = v->u.dict == o->u.dict; break;
        case JV_FUNC: same = v->u.fn == o->u.fn; break;
        case JV_FLOAT: same = false; break;
        default: break;
        }
    *out = jv_bool(same);
    return 0;
}

static int t_case(JRender *r, const JValue *v, const JArgs *a, JValue *out, bool upper) {
    bool cased = false, ok = v->kind == JV_STR;
    for (size_t i = 0; ok && i < v->u.s.n; i = ju8_next(v->u.s.p, v->u.s.n, i)) {
        uint32_t c = ju8_decode(v->u.s.p, v->u.s.n, i);
        if (cp_cased(c)) {
            cased = true;
            if (upper ? cp_upper(c) != c : cp_lower(c) != c) ok = false;
        }
    }
    *out = jv_bool(ok && cased);
    return 0;
}
static int t_lower(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_case(r, v, a, out, false); }
static int t_upper(JRender *r, const JValue *v, const JArgs *a, JValue *out) { return t_case(r, v, a, out, true); }

static const struct {
    const char *name;
    JBuiltinFn fn;
} tests[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string}, {"mapping", t_mapping},
    {"iterable", t_iterable}, {"sequence", t_sequence}, {"number", t_number}, {"integer", t_integer}, {"float", t_float},
    {"boolean", t_boolean}, {"true", t_true}, {"false", t_false}, {"callable", t_callable}, {"escaped", t_escaped},
    {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq},
    {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt}, {"le", t_le}, {"gt", t_gt}, {"greaterthan", t_gt},
    {"ge", t_ge}, {"in", t_in}, {"sameas", t_sameas}, {"lower", t_lower}, {"upper", t_upper},
};

JBuiltinFn jinja_find_test(const char *name) {
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (!strcmp(tests[i].name, name)) return tests[i].fn;
    return NULL;
}

/* ---- methods ---- */

static int m_strip(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool left, bool right) {
    const JValue *chars = arg(a, 0, "chars");
    if (given(chars) && chars->kind != JV_STR) return jr_fail(r, JINJA_ERR_RENDER, a->line, "strip arg must be None or str");
    *out = strip(self, given(chars) ? chars : NULL, left, right);
    return 0;
}
static int m_strip_both(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_strip(r, s, a, o, true, true); }
static int m_lstrip(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_strip(r, s, a, o, true, false); }
static int m_rstrip(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_strip(r, s, a, o, false, true); }

static int m_split(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    int64_t maxsplit = -1;
    if (get_int_arg(r, a, arg(a, 1, "maxsplit"), -1, &maxsplit)) return -1;
    return split_str(r, self, arg(a, 0, "sep"), maxsplit, a->line, out);
}

static int affix(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool suffix) {
    const JValue *x = arg(a, 0, NULL);
    if (!x) return jr_fail(r, JINJA_ERR_RENDER, a->line, "%s needs an argument", suffix ? "endswith" : "startswith");
    const JValue *opts = x;
    size_t n = 1;
    if (x->kind == JV_LIST) {
        opts = x->u.list->items;
        n = x->u.list->n;
    }
    for (size_t i = 0; i < n; i++) {
        if (opts[i].kind != JV_STR) return jr_fail(r, JINJA_ERR_RENDER, a->line, "%s: arguments must be str", suffix ? "endswith" : "startswith");
        size_t k = opts[i].u.s.n;
        if (k <= self->u.s.n && !memcmp(self->u.s.p + (suffix ? self->u.s.n - k : 0), opts[i].u.s.p, k)) {
            *out = jv_bool(true);
            return 0;
        }
    }
    *out = jv_bool(false);
    return 0;
}
static int m_startswith(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return affix(r, s, a, o, false); }
static int m_endswith(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return affix(r, s, a, o, true); }
static int m_upper(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return change_case(r, s, CASE_UPPER, a->line, o); }
static int m_lower(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return change_case(r, s, CASE_LOWER, a->line, o); }
static int m_title(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return change_case(r, s, CASE_TITLE_METHOD, a->line, o); }
static int m_capitalize(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return change_case(r, s, CASE_CAPITALIZE, a->line, o); }

static int m_replace(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JValue old = jv_str("", 0), neu = old;
    int64_t count = -1;
    if (need_str(r, a, arg(a, 0, NULL), "replace: old", &old) || need_str(r, a, arg(a, 1, NULL), "replace: new", &neu) ||
        get_int_arg(r, a, arg(a, 2, "count"), -1, &count))
        return -1;
    return replace_str(r, self, &old, &neu, count, a->line, out);
}

static int m_find_count(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool count) {
    JValue sub = jv_str("", 0);
    if (need_str(r, a, arg(a, 0, NULL), count ? "count: sub" : "find: sub", &sub)) return -1;
    const char *p = self->u.s.p;
    size_t n = self->u.s.n;
    if (!count) {
        const char *hit = sub.u.s.n ? memmem(p, n, sub.u.s.p, sub.u.s.n) : p;
        *out = jv_int(hit ? (int64_t)ju8_count(p, (size_t)(hit - p)) : -1);
        return 0;
    }
    if (sub.u.s.n == 0) {
        *out = jv_int((int64_t)ju8_count(p, n) + 1);
        return 0;
    }
    int64_t c = 0;
    for (const char *h = p; (h = memmem(h, n - (size_t)(h - p), sub.u.s.p, sub.u.s.n)); h += sub.u.s.n) c++;
    *out = jv_int(c);
    return 0;
}
static int m_find(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_find_count(r, s, a, o, false); }
static int m_count(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_find_count(r, s, a, o, true); }

static int m_join(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *seq = arg(a, 0, NULL);
    JList *items;
    if (!seq) return jr_fail(r, JINJA_ERR_RENDER, a->line, "join() takes exactly one argument");
    if (jv_iterate(r, seq, &items, a->line)) return -1;
    JBuf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        if (items->items[i].kind != JV_STR) {
            free(b.p);
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "sequence item %zu: expected str instance, %s found", i, jv_type_name(&items->items[i]));
        }
        if ((i && jbuf_put(r, &b, self->u.s.p, self->u.s.n)) || jbuf_put(r, &b, items->items[i].u.s.p, items->items[i].u.s.n)) {
            free(b.p);
            return -1;
        }
    }
    return new_str(r, &b, out, a->line);
}

/* str.format with {} / {0} / {name} fields, optional !r / !s conversion, and no format spec. */
static int m_format(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JBuf b = {0};
    const char *p = self->u.s.p;
    size_t n = self->u.s.n;
    int auto_idx = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if ((c == '{' || c == '}') && i + 1 < n && p[i + 1] == c) {
            if (jbuf_put(r, &b, &c, 1)) goto fail;
            i++;
            continue;
        }
        if (c == '}') {
            jr_fail(r, JINJA_ERR_RENDER, a->line, "format: single '}' encountered in format string");
            goto fail;
        }
        if (c != '{') {
            if (jbuf_put(r, &b, &c, 1)) goto fail;
            continue;
        }
        const char *close = memchr(p + i, '}', n - i);
        if (!close) {
            jr_fail(r, JINJA_ERR_RENDER, a->line, "format: single '{' encountered in format string");
            goto fail;
        }
        size_t fs = i + 1, fe = (size_t)(close - p), name_end = fs;
        while (name_end < fe && p[name_end] != '!' && p[name_end] != ':') name_end++;
        char conv = name_end + 1 < fe && p[name_end] == '!' ? p[name_end + 1] : 's';
        if (memchr(p + fs, ':', fe - fs)) {
            jr_fail(r, JINJA_ERR_UNSUPPORTED, a->line, "format: format specs ('{...:spec}') are not supported");
            goto fail;
        }
        const JValue *v = NULL;
        if (name_end == fs) {
            v = arg(a, auto_idx++, NULL);
        } else if (p[fs] >= '0' && p[fs] <= '9') {
            v = arg(a, atoi(p + fs), NULL);
        } else {
            for (int k = 0; k < a->n_kw; k++)
                if (strlen(a->kw_names[k]) == name_end - fs && !memcmp(a->kw_names[k], p + fs, name_end - fs)) v = &a->kw[k];
        }
        if (!v) {
            jr_fail(r, JINJA_ERR_RENDER, a->line, "format: no argument for field '%.*s'", (int)(name_end - fs), p + fs);
            goto fail;
        }
        if ((conv == 'r' ? jv_append_repr(r, &b, v, 0) : jv_append_str(r, &b, v, 0))) goto fail;
        i = fe;
    }
    return new_str(r, &b, out, a->line);
fail:
    free(b.p);
    return -1;
}

/* Python's printf-style 'fmt' % args: %s %r %d %i %f %F %e %g %x %X %o %c %% with flags, width and
 * precision; args a tuple (one value each) or a single value. */
int jinja_percent_format(JRender *r, const JValue *fmt, const JValue *args, int line, JValue *out) {
    const JValue *vals = args;
    size_t n_vals = 1, used = 0;
    if (args->kind == JV_LIST && (args->flags & JF_TUPLE)) {
        vals = args->u.list->items;
        n_vals = args->u.list->n;
    }
    JBuf b = {0};
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            if (jbuf_put(r, &b, p + i, 1)) goto fail;
            continue;
        }
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        i++;
        while (i < n && strchr("-+ 0#", p[i]) && k < 8) spec[k++] = p[i++];
        size_t digits_from = k;
        while (i < n && p[i] >= '0' && p[i] <= '9' && k < 16) spec[k++] = p[i++];
        size_t width_digits = k - digits_from;
        if (i < n && p[i] == '.') {
            spec[k++] = p[i++];
            digits_from = k;
            while (i < n && p[i] >= '0' && p[i] <= '9' && k < 24) spec[k++] = p[i++];
            if (k - digits_from > width_digits) width_digits = k - digits_from;
        }
        if (width_digits > 3) {
            jr_fail(r, JINJA_ERR_LIMIT, line, "format width or precision above 999");
            goto fail;
        }
        if (i >= n) {
            jr_fail(r, JINJA_ERR_RENDER, line, "incomplete format");
            goto fail;
        }
        char conv = p[i];
        if (conv == '%') {
            if (jbuf_put(r, &b, "%", 1)) goto fail;
            continue;
        }
        if (used >= n_vals) {
            jr_fail(r, JINJA_ERR_RENDER, line, "not enough arguments for format string");
            goto fail;
        }
        const JValue *v = &vals[used++];
        char num[512];
        if (conv == 's' || conv == 'r') {
            JBuf tmp = {0};
            if (conv == 's' ? jv_append_str(r, &tmp, v, 0) : jv_append_repr(r, &tmp, v, 0)) {
                free(tmp.p);
                goto fail;
            }
            spec[k++] = 's';
            spec[k] = '\0';
            char *dot = strchr(spec, '.');
            size_t width = (size_t)atoi(spec + 1 + strspn(spec + 1, "-+ 0#")), len = tmp.n;
            if (dot) len = len < (size_t)atoi(dot + 1) ? len : (size_t)atoi(dot + 1);
            bool left = strchr(spec, '-') != NULL;
            size_t pad = width > len ? width - len : 0;
            int rc = 0;
            for (size_t q = 0; q < pad && !left && !rc; q++) rc = jbuf_put(r, &b, " ", 1);
            if (!rc && len) rc = jbuf_put(r, &b, tmp.p, len);
            for (size_t q = 0; q < pad && left && !rc; q++) rc = jbuf_put(r, &b, " ", 1);
            free(tmp.p);
            if (rc) goto fail;
            continue;
        }
        bool is_int_conv = strchr("dixXoc", conv) != NULL, is_float_conv = strchr("fFeEgG", conv) != NULL;
        if (!is_int_conv && !is_float_conv) {
            jr_fail(r, JINJA_ERR_RENDER, line, "unsupported format character '%c'", conv);
            goto fail;
        }
        if (v->kind != JV_INT && v->kind != JV_FLOAT && v->kind != JV_BOOL) {
            jr_fail(r, JINJA_ERR_RENDER, line, "%%%c format: a real number is required, not %s", conv, jv_type_name(v));
            goto fail;
        }
        double f = v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b;
        if (is_int_conv) {
            long long iv = v->kind == JV_INT ? (long long)v->u.i : v->kind == JV_BOOL ? v->u.b : (isfinite(f) && fabs(f) < 9.2e18 ? (long long)f : 0);
            if (conv == 'i') conv = 'd';
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv;
            spec[k] = '\0';
            snprintf(num, sizeof num, spec, iv);
        } else {
            spec[k++] = conv;
            spec[k] = '\0';
            if (strchr(spec, '.') && atoi(strchr(spec, '.') + 1) > 100) {
                jr_fail(r, JINJA_ERR_RENDER, line, "format precision too large");
                goto fail;
            }
            snprintf(num, sizeof num, spec, f);
        }
        if (jbuf_puts(r, &b, num)) goto fail;
    }
    if (used < n_vals && !(args->kind == JV_DICT)) {
        jr_fail(r, JINJA_ERR_RENDER, line, "not all arguments converted during string formatting");
        goto fail;
    }
    return new_str(r, &b, out, line);
fail:
    free(b.p);
    return -1;
}

static int m_items(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return dict_items(r, self, a->line, out); }
static int m_keys_values(JRender *r, const JValue *self, const JArgs *a, JValue *out, bool values) {
    const JDict *d = self->u.dict;
    JList *l = jlist_new(r, d->n);
    if (!l) return jr_nomem(r, a->line);
    for (size_t i = 0; i < d->n; i++) l->items[l->n++] = values ? d->vals[i] : d->keys[i];
    *out = jv_list(l, 0);
    return 0;
}
static int m_keys(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_keys_values(r, s, a, o, false); }
static int m_values(JRender *r, const JValue *s, const JArgs *a, JValue *o) { return m_keys_values(r, s, a, o, true); }
static int m_get(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *key = arg(a, 0, NULL), *dflt = arg(a, 1, "default");
    if (!key) return jr_fail(r, JINJA_ERR_RENDER, a->line, "get() needs a key");
    const JValue *v = jdict_get(self->u.dict, key);
    *out = v ? *v : dflt ? *dflt : jv_none();
    return 0;
}

static int m_cycle(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    if (a->n_pos == 0) return jr_fail(r, JINJA_ERR_RENDER, a->line, "loop.cycle() needs at least one argument");
    *out = a->pos[self->u.loop->index0 % (size_t)a->n_pos];
    return 0;
}

typedef struct {
    JKind kind;
    const char *name;
    JBuiltinFn fn;
} Method;
static const Method methods[] = {
    {JV_STR, "strip", m_strip_both}, {JV_STR, "lstrip", m_lstrip}, {JV_STR, "rstrip", m_rstrip}, {JV_STR, "split", m_split},
    {JV_STR, "startswith", m_startswith}, {JV_STR, "endswith", m_endswith}, {JV_STR, "upper", m_upper},
    {JV_STR, "lower", m_lower}, {JV_STR, "replace", m_replace}, {JV_STR, "title", m_title},
    {JV_STR, "capitalize", m_capitalize}, {JV_STR, "format", m_format}, {JV_STR, "join", m_join}, {JV_STR, "find", m_find},
    {JV_STR, "count", m_count}, {JV_DICT, "items", m_items}, {JV_DICT, "keys", m_keys}, {JV_DICT, "values", m_values},
    {JV_DICT, "get", m_get}, {JV_LOOP, "cycle", m_cycle},
};

bool jinja_is_method_name(const char *name) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (!strcmp(methods[i].name, name)) return true;
    return false;
}

bool jinja_bind_method(JRender *r, const JValue *obj, const char *name, JValue *out) {
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].kind == obj->kind && !strcmp(methods[i].name, name)) {
            JFunc *fn = jarena_alloc(&r->arena, sizeof *fn);
            if (!fn) {
                jr_nomem(r, 0);
                *out = jv_undef(name);
                return true;
            }
            fn->name = methods[i].name;
            fn->fn = methods[i].fn;
            fn->self = *obj;
            *out = (JValue){.kind = JV_FUNC};
            out->u.fn = fn;
            return true;
        }
    return false;
}

/* ---- global functions ---- */

static int g_raise_exception(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    const JValue *msg = arg(a, 0, "message");
    JValue s = jv_str("", 0);
    if (msg && jv_to_string(r, msg, &s)) return -1;
    return jr_fail(r, JINJA_ERR_RAISED, a->line, "%.*s", (int)(s.u.s.n > 470 ? 470 : s.u.s.n), s.u.s.p);
}

static int g_strftime_now(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    JValue fmt = jv_str("", 0);
    if (need_str(r, a, arg(a, 0, "format"), "strftime_now: format", &fmt)) return -1;
    char *f = jarena_strndup(&r->arena, fmt.u.s.p, fmt.u.s.n);
    char *buf = jarena_alloc(&r->arena, 512);
    if (!f || !buf) return jr_nomem(r, a->line);
    time_t now = r->lim.now_unix ? (time_t)r->lim.now_unix : time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm)) return jr_fail(r, JINJA_ERR_RENDER, a->line, "strftime_now: cannot read the clock");
    size_t n = fmt.u.s.n ? strftime(buf, 512, f, &tm) : 0;
    if (fmt.u.s.n && n == 0 && strlen(f) > 0) buf[0] = '\0';
    *out = jv_str(buf, n);
    return 0;
}

static int g_range(JRender *r, const JValue *self, const JArgs *a, JValue *out) {
    int64_t start = 0, stop, step = 1;
    if (a->n_pos == 0 || a->n_pos > 3) return jr_fail(r, JINJA_ERR_RENDER, a->line, "range expected 1 to 3 arguments, got %d", a->n_pos);
    for (int i = 0; i < a->n_pos; i++)
        if (a->pos[i].kind != JV_INT && a->pos[i].kind != JV_BOOL)
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "range: '%s' object cannot be interpreted as an integer", jv_type_name(&a->pos[i]));
#define IV(k) (a->pos[k].kind == JV_INT ? a->pos[k].u.i : (int64_t)a->pos[k].u.b)
    if (a->n_pos == 1) stop = IV(0);
    else {
        start = IV(0);
        stop = IV(1);
        if (a->n_pos == 3) step = IV(2);
    }
#undef IV
    if (step == 0) return jr_fail(r, JINJA_ERR_RENDER, a->line, "range() arg 3 must not be zero");
    __int128 span = step > 0 ? (__int128)stop - start : (__int128)start - stop, stride = step > 0 ? (__int128)step : -(__int128)step;
    __int128 count = span <= 0 ? 0 : (span + stride - 1) / stride;
    if (count > (__int128)r->lim.max_loop_iterations)
        return jr_fail(r, JINJA_ERR_LIMIT, a->line, "range of more than %ld items (the loop iterations allowed)", r->lim.max_loop_iterations);
    JList *l = jlist_new(r, (size_t)count);
    if (!l) return jr_nomem(r, a->line);
    for (size_t i = 0; i < (size_t)count; i++) /* every value lies between start and stop: the wrap-around sum is exact */
        l->items[l->n++] = jv_int((int64_t)((uint64_t)start + (uint64_t)i * (uint64_t)step));
    *out = jv_list(l, 0);
    return 0;
}

static int build_dict(JRender *r, const JArgs *a, uint8_t flags, JValue *out) {
    JDict *d = jdict_new(r, 0);
    if (!d) return jr_nomem(r, a->line);
    if (a->n_pos > 1) return jr_fail(r, JINJA_ERR_RENDER, a->line, "expected at most 1 positional argument, got %d", a->n_pos);
    if (a->n_pos == 1) {
        if (a->pos[0].kind != JV_DICT) return jr_fail(r, JINJA_ERR_RENDER, a->line, "expected a mapping argument, not %s", jv_type_name(&a->pos[0]));
        for (size_t i = 0; i < a->pos[0].u.dict->n; i++)
            if (jdict_set(r, d, a->pos[0].u.dict->keys[i], a->pos[0].u.dict->vals[i])) return -1;
    }
    for (int k = 0; k < a->n_kw; k++) {
        if ((flags & JF_NAMESPACE) && a->kw_names[k][0] == '_')
            return jr_fail(r, JINJA_ERR_RENDER, a->line, "chat templates cannot store underscore-prefixed attributes on a namespace ('%s')", a->kw_names[k]);
        if (jdict_set(r, d, jv_str(a->kw_names[k], strlen(a->kw_names[k])), a->kw[k])) return -1;
    }
    *out = jv_dict(d, flags);
    return 0;
}
static int g_namespace(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return build_dict(r, a, JF_NAMESPACE, out); }
static int g_dict(JRender *r, const JValue *self, const JArgs *a, JValue *out) { return build_dict(r, a, 0, out); }

static const JFunc globals[] = {
    {"raise_exception", g_raise_exception, {0}, NULL}, {"strftime_now", g_strftime_now, {0}, NULL},
    {"range", g_range, {0}, NULL}, {"namespace", g_namespace, {0}, NULL}, {"dict", g_dict, {0}, NULL},
};

bool jinja_is_global_function(const char *name) {
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(globals[i].name, name)) return true;
    return false;
}

bool jinja_global(const char *name, JValue *out) {
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(globals[i].name, name)) {
            *out = (JValue){.kind = JV_FUNC};
            out->u.fn = &globals[i];
            return true;
        }
    return false;
}
