/* Compile entry points and the evaluator: scopes, statements, expressions, macro calls, limits. */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja/jinja_internal.h"

#define JINJA_MAX_EVAL_DEPTH 1000 /* nested evaluations (expressions, blocks, macro calls) of one render */

enum { EXEC_OK = 0, EXEC_BREAK = 1, EXEC_CONTINUE = 2 };

struct JFrame {
    JFrame *parent;
    const char **names;
    JValue *vals;
    size_t n, cap;
};

JinjaLimits jinja_default_limits(void) {
    return (JinjaLimits){.max_output_bytes = 16u << 20, .max_loop_iterations = 1000000, .max_call_depth = 64,
                         .max_memory_bytes = 256u << 20, .now_unix = 0};
}

int jr_fail(JRender *r, JinjaStatus st, int line, const char *fmt, ...) {
    if (r->err->status != JINJA_OK) return -1; /* the first error is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err->msg, sizeof r->err->msg, fmt, ap);
    va_end(ap);
    r->err->status = st;
    r->err->line = line;
    return -1;
}

int jr_nomem(JRender *r, int line) {
    if (r->arena.hit_cap)
        return jr_fail(r, JINJA_ERR_LIMIT, line, "the render needs more than %zu bytes of memory", r->arena.cap);
    return jr_fail(r, JINJA_ERR_NOMEM, line, "out of memory");
}

/* ---- scopes ---- */

static JFrame *frame_new(JRender *r, JFrame *parent) {
    JFrame *f = jarena_alloc(&r->arena, sizeof *f);
    if (!f) {
        jr_nomem(r, 0);
        return NULL;
    }
    f->parent = parent;
    return f;
}

static int frame_set(JRender *r, JFrame *f, const char *name, JValue v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **names = jarena_alloc(&r->arena, cap * sizeof *names);
        JValue *vals = jarena_alloc(&r->arena, cap * sizeof *vals);
        if (!names || !vals) return jr_nomem(r, 0);
        if (f->n) {
            memcpy(names, f->names, f->n * sizeof *names);
            memcpy(vals, f->vals, f->n * sizeof *vals);
        }
        f->names = names;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return 0;
}

static bool frame_lookup(const JFrame *f, const char *name, JValue *out) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->names[i][0] == name[0] && !strcmp(f->names[i], name)) {
                *out = f->vals[i];
                return true;
            }
    return false;
}

/* ---- helpers ---- */

static int undefined_error(JRender *r, const JValue *v, int line) {
    if (v->u.undef_name) return jr_fail(r, JINJA_ERR_RENDER, line, "'%s' is undefined", v->u.undef_name);
    return jr_fail(r, JINJA_ERR_RENDER, line, "an undefined value was used");
}

static int eval(JRender *r, JFrame *f, const JNode *n, JValue *out);
static int exec(JRender *r, JFrame *f, const JNodeList *body);

static int capture(JRender *r, JFrame *f, const JNodeList *body, JValue *out) {
    JBuf buf = {0}, *saved = r->out;
    r->out = &buf;
    int rc = exec(r, f, body);
    r->out = saved;
    if (rc < 0) {
        free(buf.p);
        return -1;
    }
    *out = jv_str_from_buf(r, &buf);
    if (out->kind != JV_STR) return jr_nomem(r, 0);
    out->flags |= JF_SAFE;
    return 0;
}

static int loop_attr(JRender *r, JLoop *lp, const char *name, JValue *out) {
    size_t n = lp->items->n, i = lp->index0;
    if (!strcmp(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = jv_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = jv_int(lp->depth0 + 1);
    else if (!strcmp(name, "depth0")) *out = jv_int(lp->depth0);
    else if (!strcmp(name, "previtem")) *out = i > 0 ? lp->items->items[i - 1] : jv_undef("previtem");
    else if (!strcmp(name, "nextitem")) *out = i + 1 < n ? lp->items->items[i + 1] : jv_undef("nextitem");
    else {
        JValue self = {.kind = JV_LOOP};
        self.u.loop = lp;
        if (!jinja_bind_method(r, &self, name, out)) *out = jv_undef(name);
    }
    return 0;
}

int jinja_get_attr(JRender *r, const JValue *obj, const char *name, int line, JValue *out) {
    switch (obj->kind) {
    case JV_UNDEF: return undefined_error(r, obj, line);
    case JV_DICT: {
        if (!(obj->flags & JF_NAMESPACE) && jinja_bind_method(r, obj, name, out)) return r->err->status ? -1 : 0;
        const JValue *v = jdict_get_str(obj->u.dict, name, strlen(name));
        *out = v ? *v : jv_undef(name);
        return 0;
    }
    case JV_LOOP: return loop_attr(r, obj->u.loop, name, out);
    default:
        if (jinja_bind_method(r, obj, name, out)) return r->err->status ? -1 : 0;
        *out = jv_undef(name);
        return 0;
    }
}

/* Python's slice.indices, then the chosen positions. */
static void slice_bounds(int64_t len, const JValue *start, const JValue *stop, int64_t step, int64_t *s, int64_t *e) {
    int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
    if (start->kind == JV_INT) {
        *s = start->u.i < 0 ? start->u.i + len : start->u.i;
        if (*s < lower) *s = lower;
        if (*s > upper) *s = upper;
    } else {
        *s = step > 0 ? lower : upper;
    }
    if (stop->kind == JV_INT) {
        *e = stop->u.i < 0 ? stop->u.i + len : stop->u.i;
        if (*e < lower) *e = lower;
        if (*e > upper) *e = upper;
    } else {
        *e = step > 0 ? upper : lower;
    }
}

static int do_slice(JRender *r, const JValue *obj, const JValue *start, const JValue *stop, const JValue *stepv, int line, JValue *out) {
    const JValue *parts[3] = {start, stop, stepv};
    for (int k = 0; k < 3; k++)
        if (parts[k]->kind != JV_INT && parts[k]->kind != JV_NONE && parts[k]->kind != JV_UNDEF)
            return jr_fail(r, JINJA_ERR_RENDER, line, "slice indices must be integers or None, not %s", jv_type_name(parts[k]));
    int64_t step = stepv->kind == JV_INT ? stepv->u.i : 1;
    if (step == 0) return jr_fail(r, JINJA_ERR_RENDER, line, "slice step cannot be zero");
    if (step == INT64_MIN) step = INT64_MIN + 1;
    if (obj->kind == JV_LIST) {
        const JList *l = obj->u.list;
        int64_t s, e;
        slice_bounds((int64_t)l->n, start, stop, step, &s, &e);
        JList *res = jlist_new(r, 0);
        if (!res) return jr_nomem(r, line);
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step) {
            if (jlist_push(r, res, l->items[i])) return -1;
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        *out = jv_list(res, obj->flags & JF_TUPLE);
        return 0;
    }
    if (obj->kind == JV_STR) {
        const char *p = obj->u.s.p;
        size_t n = obj->u.s.n, cps = ju8_count(p, n);
        size_t *off = jarena_alloc(&r->arena, (cps + 1) * sizeof *off);
        if (!off) return jr_nomem(r, line);
        size_t k = 0;
        for (size_t i = 0; i < n; i = ju8_next(p, n, i)) off[k++] = i;
        off[k] = n;
        int64_t s, e;
        slice_bounds((int64_t)cps, start, stop, step, &s, &e);
        if (step == 1) {
            *out = s < e ? jv_str(p + off[s], off[e] - off[s]) : jv_str("", 0);
            return 0;
        }
        JBuf b = {0};
        for (int64_t i = s; step > 0 ? i < e : i > e; i += step) {
            if (jbuf_put(r, &b, p + off[i], off[i + 1] - off[i])) {
                free(b.p);
                return -1;
            }
            if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
        }
        *out = jv_str_from_buf(r, &b);
        return out->kind == JV_STR ? 0 : jr_nomem(r, line);
    }
    if (obj->kind == JV_UNDEF) return undefined_error(r, obj, line);
    *out = jv_undef(NULL);
    return 0;
}

int jinja_get_item(JRender *r, const JValue *obj, const JValue *key, int line, JValue *out) {
    switch (obj->kind) {
    case JV_UNDEF: return undefined_error(r, obj, line);
    case JV_DICT: {
        const JValue *v = jdict_get(obj->u.dict, key);
        *out = v ? *v : jv_undef(key->kind == JV_STR ? jarena_strndup(&r->arena, key->u.s.p, key->u.s.n) : NULL);
        return 0;
    }
    case JV_LIST: case JV_STR: {
        if (key->kind != JV_INT && key->kind != JV_BOOL) break;
        int64_t i = key->kind == JV_INT ? key->u.i : key->u.b;
        if (obj->kind == JV_LIST) {
            int64_t n = (int64_t)obj->u.list->n;
            if (i < 0) i += n;
            *out = i >= 0 && i < n ? obj->u.list->items[i] : jv_undef(NULL);
            return 0;
        }
        JValue one = jv_int(1), stop = jv_int(i + 1 == 0 ? INT64_MAX : i + 1), none = jv_none();
        JValue start = jv_int(i);
        if (i == INT64_MAX) break;
        if (do_slice(r, obj, &start, i == -1 ? &none : &stop, &one, line, out)) return -1;
        if (out->u.s.n == 0) *out = jv_undef(NULL);
        return 0;
    }
    case JV_LOOP:
        if (key->kind == JV_STR) {
            char *name = jarena_strndup(&r->arena, key->u.s.p, key->u.s.n);
            if (!name) return jr_nomem(r, line);
            return loop_attr(r, obj->u.loop, name, out);
        }
        break;
    default: break;
    }
    *out = jv_undef(NULL);
    return 0;
}

/* ---- operators ---- */

static bool is_int_like(const JValue *v) { return v->kind == JV_INT || v->kind == JV_BOOL; }
static bool is_num(const JValue *v) { return is_int_like(v) || v->kind == JV_FLOAT; }
static int64_t int_of(const JValue *v) { return v->kind == JV_INT ? v->u.i : v->u.b; }
static double num_of(const JValue *v) { return v->kind == JV_FLOAT ? v->u.f : (double)int_of(v); }

static const char *op_text(JOp op) {
    switch (op) {
    case JOP_ADD: return "+";
    case JOP_SUB: return "-";
    case JOP_MUL: return "*";
    case JOP_DIV: return "/";
    case JOP_FLOORDIV: return "//";
    case JOP_MOD: return "%";
    case JOP_POW: return "**";
    case JOP_LT: return "<";
    case JOP_LE: return "<=";
    case JOP_GT: return ">";
    case JOP_GE: return ">=";
    default: return "?";
    }
}

static int repeat(JRender *r, const JValue *seq, int64_t times, int line, JValue *out) {
    if (times < 0) times = 0;
    if (seq->kind == JV_STR) {
        size_t n = seq->u.s.n;
        if (n && (uint64_t)times > r->lim.max_output_bytes / n)
            return jr_fail(r, JINJA_ERR_LIMIT, line, "string repetition beyond %zu bytes", r->lim.max_output_bytes);
        JBuf b = {0};
        for (int64_t i = 0; i < times; i++)
            if (jbuf_put(r, &b, seq->u.s.p, n)) {
                free(b.p);
                return -1;
            }
        *out = jv_str_from_buf(r, &b);
        return out->kind == JV_STR ? 0 : jr_nomem(r, line);
    }
    const JList *l = seq->u.list;
    if (l->n && (uint64_t)times > (uint64_t)r->lim.max_loop_iterations / l->n)
        return jr_fail(r, JINJA_ERR_LIMIT, line, "list repetition beyond %ld items", r->lim.max_loop_iterations);
    JList *res = jlist_new(r, (size_t)times * l->n);
    if (!res) return jr_nomem(r, line);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < l->n; k++) res->items[res->n++] = l->items[k];
    *out = jv_list(res, seq->flags & JF_TUPLE);
    return 0;
}

static int binop(JRender *r, JOp op, const JValue *a, const JValue *b, int line, JValue *out) {
    if (a->kind == JV_UNDEF) return undefined_error(r, a, line);
    if (b->kind == JV_UNDEF) return undefined_error(r, b, line);
    if (is_num(a) && is_num(b)) {
        bool ints = is_int_like(a) && is_int_like(b);
        int64_t x = ints ? int_of(a) : 0, y = ints ? int_of(b) : 0, z;
        double fx = num_of(a), fy = num_of(b);
        switch (op) {
        case JOP_ADD:
            if (!ints) { *out = jv_float(fx + fy); return 0; }
            if (__builtin_add_overflow(x, y, &z)) break;
            *out = jv_int(z);
            return 0;
        case JOP_SUB:
            if (!ints) { *out = jv_float(fx - fy); return 0; }
            if (__builtin_sub_overflow(x, y, &z)) break;
            *out = jv_int(z);
            return 0;
        case JOP_MUL:
            if (!ints) { *out = jv_float(fx * fy); return 0; }
            if (__builtin_mul_overflow(x, y, &z)) break;
            *out = jv_int(z);
            return 0;
        case JOP_DIV:
            if (fy == 0) return jr_fail(r, JINJA_ERR_RENDER, line, "division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints ? y == 0 : fy == 0) return jr_fail(r, JINJA_ERR_RENDER, line, "integer division or modulo by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) break;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                *out = jv_int(op == JOP_FLOORDIV ? q : m);
            } else {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = jv_float(op == JOP_FLOORDIV ? floor(fx / fy) : m);
            }
            return 0;
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return jr_fail(r, JINJA_ERR_RENDER, line, "integer overflow in **");
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) return jr_fail(r, JINJA_ERR_RENDER, line, "integer overflow in **");
                }
                *out = jv_int(acc);
                return 0;
            }
            *out = jv_float(pow(fx, fy));
            return 0;
        default: break;
        }
        return jr_fail(r, JINJA_ERR_RENDER, line, "integer overflow in '%s'", op_text(op));
    }
    if (op == JOP_ADD && a->kind == JV_STR && b->kind == JV_STR) {
        size_t n = a->u.s.n + b->u.s.n;
        if (b->u.s.n == 0 || a->u.s.n == 0) {
            *out = a->u.s.n ? *a : *b;
            out->flags = 0;
            return 0;
        }
        if (n > r->lim.max_output_bytes) return jr_fail(r, JINJA_ERR_LIMIT, line, "string longer than %zu bytes", r->lim.max_output_bytes);
        char *p = jarena_alloc(&r->arena, n + 1);
        if (!p) return jr_nomem(r, line);
        memcpy(p, a->u.s.p, a->u.s.n);
        memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
        *out = jv_str(p, n);
        return 0;
    }
    if (op == JOP_ADD && a->kind == JV_LIST && b->kind == JV_LIST && (a->flags & JF_TUPLE) == (b->flags & JF_TUPLE)) {
        JList *l = jlist_new(r, a->u.list->n + b->u.list->n);
        if (!l) return jr_nomem(r, line);
        for (size_t i = 0; i < a->u.list->n; i++) l->items[l->n++] = a->u.list->items[i];
        for (size_t i = 0; i < b->u.list->n; i++) l->items[l->n++] = b->u.list->items[i];
        *out = jv_list(l, a->flags & JF_TUPLE);
        return 0;
    }
    if (op == JOP_MUL && (a->kind == JV_STR || a->kind == JV_LIST) && is_int_like(b)) return repeat(r, a, int_of(b), line, out);
    if (op == JOP_MUL && (b->kind == JV_STR || b->kind == JV_LIST) && is_int_like(a)) return repeat(r, b, int_of(a), line, out);
    if (op == JOP_MOD && a->kind == JV_STR) return jinja_percent_format(r, a, b, line, out);
    return jr_fail(r, JINJA_ERR_RENDER, line, "unsupported operand type(s) for %s: '%s' and '%s'", op_text(op), jv_type_name(a),
                   jv_type_name(b));
}

static int compare_order(JRender *r, JOp op, const JValue *a, const JValue *b, int line, bool *res) {
    int c;
    if (is_num(a) && is_num(b)) {
        if (is_int_like(a) && is_int_like(b)) c = (int_of(a) > int_of(b)) - (int_of(a) < int_of(b));
        else {
            double x = num_of(a), y = num_of(b);
            if (isnan(x) || isnan(y)) {
                *res = false;
                return 0;
            }
            c = (x > y) - (x < y);
        }
    } else if (a->kind == JV_STR && b->kind == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        c = memcmp(a->u.s.p, b->u.s.p, n);
        if (c == 0) c = (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    } else {
        if (a->kind == JV_UNDEF) return undefined_error(r, a, line);
        if (b->kind == JV_UNDEF) return undefined_error(r, b, line);
        return jr_fail(r, JINJA_ERR_RENDER, line, "'%s' not supported between instances of '%s' and '%s'", op_text(op),
                       jv_type_name(a), jv_type_name(b));
    }
    *res = op == JOP_LT ? c < 0 : op == JOP_LE ? c <= 0 : op == JOP_GT ? c > 0 : c >= 0;
    return 0;
}

static int contains(JRender *r, const JValue *container, const JValue *item, int line, bool *res) {
    switch (container->kind) {
    case JV_UNDEF: *res = false; return 0;
    case JV_STR:
        if (item->kind != JV_STR)
            return jr_fail(r, JINJA_ERR_RENDER, line, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        *res = item->u.s.n == 0 || memmem(container->u.s.p, container->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return 0;
    case JV_LIST:
        *res = false;
        for (size_t i = 0; i < container->u.list->n && !*res; i++) *res = jv_equal(&container->u.list->items[i], item, 0);
        return 0;
    case JV_DICT: *res = jdict_get(container->u.dict, item) != NULL; return 0;
    default: return jr_fail(r, JINJA_ERR_RENDER, line, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

/* ---- calls ---- */

static int eval_args(JRender *r, JFrame *f, const JNode *n, JArgs *a) {
    memset(a, 0, sizeof *a);
    a->line = n->line;
    a->n_pos = n->list.n;
    a->n_kw = n->list2.n;
    a->kw_names = n->names;
    JValue *pos = NULL, *kw = NULL;
    if (a->n_pos && !(pos = jarena_alloc(&r->arena, (size_t)a->n_pos * sizeof *pos))) return jr_nomem(r, n->line);
    if (a->n_kw && !(kw = jarena_alloc(&r->arena, (size_t)a->n_kw * sizeof *kw))) return jr_nomem(r, n->line);
    for (int i = 0; i < a->n_pos; i++)
        if (eval(r, f, n->list.v[i], &pos[i])) return -1;
    for (int i = 0; i < a->n_kw; i++)
        if (eval(r, f, n->list2.v[i], &kw[i])) return -1;
    a->pos = pos;
    a->kw = kw;
    return 0;
}

static int call_macro(JRender *r, const JNode *m, const JArgs *a, JValue *out) {
    if (a->n_pos > m->n_names)
        return jr_fail(r, JINJA_ERR_RENDER, a->line, "macro '%s' takes not more than %d argument(s)", m->name, m->n_names);
    if (r->call_depth >= r->lim.max_call_depth)
        return jr_fail(r, JINJA_ERR_LIMIT, a->line, "macro calls nested deeper than %d", r->lim.max_call_depth);
    JFrame *f = frame_new(r, r->top);
    if (!f) return -1;
    for (int k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (int i = 0; i < m->n_names && !known; i++) known = !strcmp(m->names[i], a->kw_names[k]);
        if (!known) return jr_fail(r, JINJA_ERR_RENDER, a->line, "macro '%s' takes no keyword argument '%s'", m->name, a->kw_names[k]);
    }
    for (int i = 0; i < m->n_names; i++) {
        JValue v = jv_undef(m->names[i]);
        bool given = false;
        if (i < a->n_pos) {
            v = a->pos[i];
            given = true;
        }
        for (int k = 0; k < a->n_kw; k++)
            if (!strcmp(m->names[i], a->kw_names[k])) {
                if (given) return jr_fail(r, JINJA_ERR_RENDER, a->line, "macro '%s' got multiple values for argument '%s'", m->name, m->names[i]);
                v = a->kw[k];
                given = true;
            }
        if (!given && m->list2.v[i] && eval(r, f, m->list2.v[i], &v)) return -1;
        if (frame_set(r, f, m->names[i], v)) return -1;
    }
    r->call_depth++;
    int rc = capture(r, f, &m->list, out);
    r->call_depth--;
    return rc;
}

int jinja_call_value(JRender *r, const JValue *fn, const JArgs *args, JValue *out) {
    if (fn->kind == JV_FUNC) {
        if (fn->u.fn->macro) return call_macro(r, fn->u.fn->macro, args, out);
        return fn->u.fn->fn(r, &fn->u.fn->self, args, out);
    }
    if (fn->kind == JV_UNDEF) return undefined_error(r, fn, args->line);
    return jr_fail(r, JINJA_ERR_RENDER, args->line, "'%s' object is not callable", jv_type_name(fn));
}

/* ---- expressions ---- */

static int eval_inner(JRender *r, JFrame *f, const JNode *n, JValue *out) {
    JValue a, b;
    switch (n->kind) {
    case JN_LITERAL: *out = n->lit; return 0;
    case JN_NAME:
        if (!frame_lookup(f, n->name, out) && !jinja_global(n->name, out)) *out = jv_undef(n->name);
        return 0;
    case JN_ATTR:
        if (eval(r, f, n->obj, &a)) return -1;
        return jinja_get_attr(r, &a, n->name, n->line, out);
    case JN_ITEM:
        if (eval(r, f, n->obj, &a) || eval(r, f, n->a, &b)) return -1;
        return jinja_get_item(r, &a, &b, n->line, out);
    case JN_SLICE: {
        JValue parts[3] = {jv_none(), jv_none(), jv_none()};
        if (eval(r, f, n->obj, &a)) return -1;
        if ((n->a && eval(r, f, n->a, &parts[0])) || (n->b && eval(r, f, n->b, &parts[1])) || (n->c && eval(r, f, n->c, &parts[2])))
            return -1;
        return do_slice(r, &a, &parts[0], &parts[1], &parts[2], n->line, out);
    }
    case JN_CALL: {
        JArgs args;
        if (eval(r, f, n->obj, &a) || eval_args(r, f, n, &args)) return -1;
        return jinja_call_value(r, &a, &args, out);
    }
    case JN_FILTER: {
        JArgs args;
        if (eval(r, f, n->obj, &a) || eval_args(r, f, n, &args)) return -1;
        return n->impl(r, &a, &args, out);
    }
    case JN_TEST: {
        JArgs args;
        if (eval(r, f, n->obj, &a) || eval_args(r, f, n, &args) || n->impl(r, &a, &args, out)) return -1;
        if (n->negate) *out = jv_bool(!jv_truthy(out));
        return 0;
    }
    case JN_NEG: case JN_POS:
        if (eval(r, f, n->a, &a)) return -1;
        if (a.kind == JV_UNDEF) return undefined_error(r, &a, n->line);
        if (!is_num(&a)) return jr_fail(r, JINJA_ERR_RENDER, n->line, "bad operand type for unary %s: '%s'", n->kind == JN_NEG ? "-" : "+", jv_type_name(&a));
        if (n->kind == JN_POS) *out = a.kind == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.kind == JV_FLOAT) *out = jv_float(-a.u.f);
        else if (int_of(&a) == INT64_MIN) return jr_fail(r, JINJA_ERR_RENDER, n->line, "integer overflow in unary -");
        else *out = jv_int(-int_of(&a));
        return 0;
    case JN_NOT:
        if (eval(r, f, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(&a));
        return 0;
    case JN_BINOP:
        if (eval(r, f, n->a, &a) || eval(r, f, n->b, &b)) return -1;
        return binop(r, n->op, &a, &b, n->line, out);
    case JN_AND:
        if (eval(r, f, n->a, &a)) return -1;
        if (!jv_truthy(&a)) {
            *out = a;
            return 0;
        }
        return eval(r, f, n->b, out);
    case JN_OR:
        if (eval(r, f, n->a, &a)) return -1;
        if (jv_truthy(&a)) {
            *out = a;
            return 0;
        }
        return eval(r, f, n->b, out);
    case JN_COMPARE: {
        if (eval(r, f, n->a, &a)) return -1;
        for (int k = 0; k < n->list.n; k++) {
            if (eval(r, f, n->list.v[k], &b)) return -1;
            bool res = false;
            JOp op = n->ops[k];
            if (op == JOP_EQ || op == JOP_NE) res = jv_equal(&a, &b, 0) == (op == JOP_EQ);
            else if (op == JOP_IN || op == JOP_NOT_IN) {
                if (contains(r, &b, &a, n->line, &res)) return -1;
                if (op == JOP_NOT_IN) res = !res;
            } else if (compare_order(r, op, &a, &b, n->line, &res)) {
                return -1;
            }
            if (!res) {
                *out = jv_bool(false);
                return 0;
            }
            a = b;
        }
        *out = jv_bool(true);
        return 0;
    }
    case JN_CONCAT: {
        JBuf buf = {0};
        for (int k = 0; k < n->list.n; k++) {
            if (eval(r, f, n->list.v[k], &a) || jv_append_str(r, &buf, &a, 0)) {
                free(buf.p);
                return -1;
            }
        }
        *out = jv_str_from_buf(r, &buf);
        return out->kind == JV_STR ? 0 : jr_nomem(r, n->line);
    }
    case JN_COND:
        if (eval(r, f, n->a, &a)) return -1;
        if (jv_truthy(&a)) return eval(r, f, n->b, out);
        if (n->c) return eval(r, f, n->c, out);
        *out = jv_undef(NULL);
        return 0;
    case JN_LIST: case JN_TUPLE: {
        JList *l = jlist_new(r, (size_t)n->list.n);
        if (!l) return jr_nomem(r, n->line);
        for (int k = 0; k < n->list.n; k++)
            if (eval(r, f, n->list.v[k], &l->items[l->n++])) return -1;
        *out = jv_list(l, n->kind == JN_TUPLE ? JF_TUPLE : 0);
        return 0;
    }
    case JN_DICT: {
        JDict *d = jdict_new(r, (size_t)n->list.n);
        if (!d) return jr_nomem(r, n->line);
        for (int k = 0; k < n->list.n; k++) {
            if (eval(r, f, n->list.v[k], &a) || eval(r, f, n->list2.v[k], &b)) return -1;
            if (a.kind == JV_LIST && !(a.flags & JF_TUPLE)) return jr_fail(r, JINJA_ERR_RENDER, n->line, "unhashable type: 'list'");
            if (a.kind == JV_DICT) return jr_fail(r, JINJA_ERR_RENDER, n->line, "unhashable type: 'dict'");
            if (jdict_set(r, d, a, b)) return -1;
        }
        *out = jv_dict(d, 0);
        return 0;
    }
    default: return jr_fail(r, JINJA_ERR_RENDER, n->line, "internal error: statement evaluated as an expression");
    }
}

static int eval(JRender *r, JFrame *f, const JNode *n, JValue *out) {
    if (++r->eval_depth > JINJA_MAX_EVAL_DEPTH) {
        r->eval_depth--;
        return jr_fail(r, JINJA_ERR_LIMIT, n->line, "evaluation nested deeper than %d levels", JINJA_MAX_EVAL_DEPTH);
    }
    int rc = eval_inner(r, f, n, out);
    r->eval_depth--;
    if (rc && r->err->line == 0) r->err->line = n->line;
    return rc;
}

/* ---- statements ---- */

static int bind_targets(JRender *r, JFrame *f, const JNode *n, const JValue *item) {
    if (n->n_names == 1) return frame_set(r, f, n->names[0], *item);
    if (item->kind != JV_LIST)
        return jr_fail(r, JINJA_ERR_RENDER, n->line, "cannot unpack non-sequence %s into %d names", jv_type_name(item), n->n_names);
    if ((int)item->u.list->n != n->n_names)
        return jr_fail(r, JINJA_ERR_RENDER, n->line, "%s values to unpack (expected %d, got %zu)",
                       (int)item->u.list->n > n->n_names ? "too many" : "not enough", n->n_names, item->u.list->n);
    for (int k = 0; k < n->n_names; k++)
        if (frame_set(r, f, n->names[k], item->u.list->items[k])) return -1;
    return 0;
}

static int count_iteration(JRender *r, int line) {
    if (++r->iterations > r->lim.max_loop_iterations)
        return jr_fail(r, JINJA_ERR_LIMIT, line, "more than %ld loop iterations", r->lim.max_loop_iterations);
    return 0;
}

static int exec_for(JRender *r, JFrame *f, const JNode *n) {
    JValue seq;
    JList *items;
    if (eval(r, f, n->b, &seq) || jv_iterate(r, &seq, &items, n->line)) return -1;
    JFrame *lf = frame_new(r, f);
    if (!lf) return -1;
    if (n->c) {
        JList *kept = jlist_new(r, 0);
        if (!kept) return jr_nomem(r, n->line);
        for (size_t i = 0; i < items->n; i++) {
            JValue ok;
            if (count_iteration(r, n->line) || bind_targets(r, lf, n, &items->items[i]) || eval(r, lf, n->c, &ok)) return -1;
            if (jv_truthy(&ok) && jlist_push(r, kept, items->items[i])) return -1;
        }
        items = kept;
    }
    if (items->n == 0) return n->list2.n ? exec(r, f, &n->list2) : 0;
    JLoop *lp = jarena_alloc(&r->arena, sizeof *lp);
    if (!lp) return jr_nomem(r, n->line);
    lp->items = items;
    JValue loopv = {.kind = JV_LOOP};
    loopv.u.loop = lp;
    for (size_t i = 0; i < items->n; i++) {
        lp->index0 = i;
        lf->n = 0; /* each iteration starts a fresh scope: a set inside does not reach the next one */
        if (count_iteration(r, n->line) || bind_targets(r, lf, n, &items->items[i]) || frame_set(r, lf, "loop", loopv)) return -1;
        int rc = exec(r, lf, &n->list);
        if (rc < 0) return -1;
        if (rc == EXEC_BREAK) break;
    }
    return 0;
}

static int exec_node(JRender *r, JFrame *f, const JNode *n) {
    JValue v;
    switch (n->kind) {
    case JN_TEXT: return jbuf_put(r, r->out, n->lit.u.s.p, n->lit.u.s.n);
    case JN_OUTPUT:
        if (eval(r, f, n->a, &v)) return -1;
        return jv_append_str(r, r->out, &v, 0);
    case JN_IF:
        if (eval(r, f, n->a, &v)) return -1;
        return exec(r, f, jv_truthy(&v) ? &n->list : &n->list2);
    case JN_FOR: return exec_for(r, f, n);
    case JN_SET:
        if (eval(r, f, n->a, &v)) return -1;
        return bind_targets(r, f, n, &v);
    case JN_SET_ATTR: {
        JValue ns;
        if (eval(r, f, n->obj, &ns) || eval(r, f, n->a, &v)) return -1;
        if (ns.kind != JV_DICT || !(ns.flags & JF_NAMESPACE))
            return jr_fail(r, JINJA_ERR_RENDER, n->line, "cannot assign attribute on non-namespace object '%s'", n->obj->name);
        if (n->name[0] == '_')
            return jr_fail(r, JINJA_ERR_RENDER, n->line, "chat templates cannot store underscore-prefixed attributes on a namespace ('%s')", n->name);
        return jdict_set(r, ns.u.dict, jv_str(n->name, strlen(n->name)), v);
    }
    case JN_SET_BLOCK:
        if (capture(r, f, &n->list, &v)) return -1;
        return frame_set(r, f, n->names[0], v);
    case JN_MACRO: {
        JFunc *fn = jarena_alloc(&r->arena, sizeof *fn);
        if (!fn) return jr_nomem(r, n->line);
        fn->name = n->name;
        fn->macro = n;
        JValue m = {.kind = JV_FUNC};
        m.u.fn = fn;
        return frame_set(r, f, n->name, m);
    }
    case JN_BREAK: return EXEC_BREAK;
    case JN_CONTINUE: return EXEC_CONTINUE;
    case JN_SCOPE: return exec(r, f, &n->list);
    case JN_FILTER_BLOCK: {
        JArgs args;
        JValue body;
        if (capture(r, f, &n->obj->list, &body) || eval_args(r, f, n, &args) || n->impl(r, &body, &args, &v)) return -1;
        return jv_append_str(r, r->out, &v, 0);
    }
    default: return jr_fail(r, JINJA_ERR_RENDER, n->line, "internal error: expression executed as a statement");
    }
}

static int exec(JRender *r, JFrame *f, const JNodeList *body) {
    if (++r->eval_depth > JINJA_MAX_EVAL_DEPTH) {
        r->eval_depth--;
        return jr_fail(r, JINJA_ERR_LIMIT, 0, "evaluation nested deeper than %d levels", JINJA_MAX_EVAL_DEPTH);
    }
    int rc = 0;
    for (int k = 0; k < body->n && rc == 0; k++) {
        rc = exec_node(r, f, body->v[k]);
        if (rc < 0 && r->err->line == 0) r->err->line = body->v[k]->line;
    }
    r->eval_depth--;
    return rc;
}

/* ---- entry points ---- */

int jinja_compile(const char *src, size_t len, JinjaTemplate **out, JinjaError *err) {
    memset(err, 0, sizeof *err);
    *out = NULL;
    JinjaTemplate *t = calloc(1, sizeof *t);
    if (!t) {
        err->status = JINJA_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    JTokens toks;
    if (jinja_lex(&t->arena, src, len, &toks, err) || jinja_parse(t, &toks, err)) {
        jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void jinja_free(JinjaTemplate *t) {
    if (!t) return;
    jarena_free(&t->arena);
    free(t);
}

char *jinja_render(const JinjaTemplate *t, const json_t *vars, const JinjaLimits *limits, size_t *out_len, JinjaError *err) {
    memset(err, 0, sizeof *err);
    JRender r = {.lim = limits ? *limits : jinja_default_limits(), .err = err};
    r.arena.cap = r.lim.max_memory_bytes;
    JBuf out = {0};
    r.out = &out;
    int rc = -1;
    if ((r.top = frame_new(&r, NULL))) {
        rc = 0;
        if (vars && json_is_object(vars)) {
            const char *key;
            json_t *val;
            json_object_foreach((json_t *)vars, key, val) {
                JValue v;
                if ((rc = jv_from_json(&r, val, &v, 0)) || (rc = frame_set(&r, r.top, key, v))) break;
            }
        }
        if (rc == 0) rc = exec(&r, r.top, &t->body) < 0 ? -1 : 0;
    }
    jarena_free(&r.arena);
    if (rc) {
        free(out.p);
        if (err->status == JINJA_OK) {
            err->status = JINJA_ERR_RENDER;
            snprintf(err->msg, sizeof err->msg, "render failed");
        }
        if (err->status != JINJA_ERR_RAISED && err->line > 0) {
            char prefix[32];
            size_t k = (size_t)snprintf(prefix, sizeof prefix, "line %d: ", err->line), len = strlen(err->msg);
            if (k + len >= sizeof err->msg) len = sizeof err->msg - 1 - k;
            memmove(err->msg + k, err->msg, len);
            memcpy(err->msg, prefix, k);
            err->msg[k + len] = '\0';
        }
        return NULL;
    }
    if (!out.p && !(out.p = calloc(1, 1))) {
        err->status = JINJA_ERR_NOMEM;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    if (out_len) *out_len = out.n;
    return out.p;
}
