/* Tokens to AST: Jinja's statement and expression grammar (precedence as jinja2/parser.py), with
 * filters and tests resolved at compile time so an unsupported one is a load-time error. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja/jinja_internal.h"

typedef struct {
    JinjaTemplate *t;
    const JTokens *toks;
    size_t i;
    JinjaError *err;
    int depth, loop_depth;
} Parser;

static int pfail(Parser *p, JinjaStatus st, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int pfail(Parser *p, JinjaStatus st, int line, const char *fmt, ...) {
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    p->err->status = st;
    p->err->line = line;
    snprintf(p->err->msg, sizeof p->err->msg, "line %d: %s", line, detail);
    return -1;
}

static const JToken *peek(Parser *p) { return &p->toks->v[p->i]; }
static const JToken *peek2(Parser *p) { return p->i + 1 < p->toks->n ? &p->toks->v[p->i + 1] : &p->toks->v[p->i]; }
static const JToken *next(Parser *p) {
    const JToken *t = &p->toks->v[p->i];
    if (t->kind != JT_EOF) p->i++;
    return t;
}
static bool is_op(const JToken *t, JOp op) { return t->kind == JT_OP && t->op == op; }
static bool is_name(const JToken *t, const char *name) { return t->kind == JT_NAME && strcmp(t->text, name) == 0; }
static bool accept_op(Parser *p, JOp op) {
    if (!is_op(peek(p), op)) return false;
    p->i++;
    return true;
}
static bool accept_name(Parser *p, const char *name) {
    if (!is_name(peek(p), name)) return false;
    p->i++;
    return true;
}

static const char *describe(const JToken *t, char *buf, size_t cap) {
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_NAME: snprintf(buf, cap, "'%.60s'", t->text); return buf;
    case JT_STRING: return "a string";
    case JT_INT: case JT_FLOAT: return "a number";
    case JT_OP: {
        static const char *const names[] = {"?", "+", "-", "*", "/", "//", "%", "**", "~", "[", "]", "(", ")", "{", "}",
                                            "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
        snprintf(buf, cap, "'%s'", (size_t)t->op < sizeof names / sizeof names[0] ? names[t->op] : "?");
        return buf;
    }
    }
    return "?";
}

static int expect_op(Parser *p, JOp op, const char *what) {
    if (accept_op(p, op)) return 0;
    char b[80];
    return pfail(p, JINJA_ERR_SYNTAX, peek(p)->line, "expected %s, got %s", what, describe(peek(p), b, sizeof b));
}
static int expect_kind(Parser *p, JTokKind k, const char *what) {
    if (peek(p)->kind == k) {
        next(p);
        return 0;
    }
    char b[80];
    return pfail(p, JINJA_ERR_SYNTAX, peek(p)->line, "expected %s, got %s", what, describe(peek(p), b, sizeof b));
}

static JNode *node(Parser *p, JNodeKind kind, int line) {
    JNode *n = jarena_alloc(&p->t->arena, sizeof *n);
    if (!n) {
        pfail(p, JINJA_ERR_NOMEM, line, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    return n;
}

static int list_push(Parser *p, JNodeList *l, JNode *n) {
    if ((l->n & (l->n - 1)) == 0) { /* grow at powers of two */
        size_t cap = l->n ? (size_t)l->n * 2 : 1;
        JNode **v = jarena_alloc(&p->t->arena, cap * sizeof *v);
        if (!v) return pfail(p, JINJA_ERR_NOMEM, n ? n->line : 0, "out of memory");
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
    }
    l->v[l->n++] = n;
    return 0;
}

static int names_push(Parser *p, const char ***names, int *n, const char *name) {
    if ((*n & (*n - 1)) == 0) {
        size_t cap = *n ? (size_t)*n * 2 : 1;
        const char **v = jarena_alloc(&p->t->arena, cap * sizeof *v);
        if (!v) return pfail(p, JINJA_ERR_NOMEM, 0, "out of memory");
        if (*n) memcpy(v, *names, (size_t)*n * sizeof *v);
        *names = v;
    }
    (*names)[(*n)++] = name;
    return 0;
}

static JNode *parse_expression(Parser *p);
static JNode *parse_or(Parser *p);
static JNode *parse_unary(Parser *p, bool with_filter);

static bool enter(Parser *p, int line) {
    if (++p->depth > JINJA_MAX_PARSE_DEPTH) {
        pfail(p, JINJA_ERR_LIMIT, line, "expression or blocks nested deeper than %d", JINJA_MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}

/* (args) after the '(' : positional then keyword arguments into n->list / n->names + n->list2. */
static int parse_call_args(Parser *p, JNode *n) {
    while (!accept_op(p, JOP_RPAREN)) {
        if (n->list.n + n->list2.n > 0 && expect_op(p, JOP_COMMA, "',' or ')'")) return -1;
        if (accept_op(p, JOP_RPAREN)) break; /* trailing comma */
        const JToken *t = peek(p);
        if (is_op(t, JOP_MUL) || is_op(t, JOP_POW)) return pfail(p, JINJA_ERR_UNSUPPORTED, t->line, "*args / **kwargs in calls are not supported");
        if (t->kind == JT_NAME && is_op(peek2(p), JOP_ASSIGN)) {
            next(p);
            next(p);
            JNode *v = parse_expression(p);
            if (!v || names_push(p, &n->names, &n->n_names, t->text) || list_push(p, &n->list2, v)) return -1;
        } else {
            if (n->list2.n) return pfail(p, JINJA_ERR_SYNTAX, t->line, "positional argument after a keyword argument");
            JNode *v = parse_expression(p);
            if (!v || list_push(p, &n->list, v)) return -1;
        }
    }
    return 0;
}

static const char *dotted_name(Parser *p) {
    const JToken *t = peek(p);
    if (t->kind != JT_NAME) {
        char b[80];
        pfail(p, JINJA_ERR_SYNTAX, t->line, "expected a name, got %s", describe(t, b, sizeof b));
        return NULL;
    }
    next(p);
    const char *name = t->text;
    while (is_op(peek(p), JOP_DOT) && peek2(p)->kind == JT_NAME) {
        next(p);
        const JToken *part = next(p);
        size_t a = strlen(name), b = strlen(part->text);
        char *joined = jarena_alloc(&p->t->arena, a + b + 2);
        if (!joined) {
            pfail(p, JINJA_ERR_NOMEM, t->line, "out of memory");
            return NULL;
        }
        memcpy(joined, name, a);
        joined[a] = '.';
        memcpy(joined + a + 1, part->text, b + 1);
        name = joined;
    }
    return name;
}

static JNode *parse_primary(Parser *p) {
    const JToken *t = peek(p);
    if (!enter(p, t->line)) return NULL;
    JNode *n = NULL;
    if (t->kind == JT_NAME) {
        next(p);
        if (!strcmp(t->text, "true") || !strcmp(t->text, "True") || !strcmp(t->text, "false") || !strcmp(t->text, "False")) {
            if ((n = node(p, JN_LITERAL, t->line))) n->lit = jv_bool(t->text[0] == 't' || t->text[0] == 'T');
        } else if (!strcmp(t->text, "none") || !strcmp(t->text, "None")) {
            if ((n = node(p, JN_LITERAL, t->line))) n->lit = jv_none();
        } else if ((n = node(p, JN_NAME, t->line))) {
            n->name = t->text;
        }
    } else if (t->kind == JT_STRING) {
        next(p);
        const char *s = t->text;
        size_t len = t->len;
        while (peek(p)->kind == JT_STRING) { /* adjacent literals concatenate */
            const JToken *u = next(p);
            char *joined = jarena_alloc(&p->t->arena, len + u->len + 1);
            if (!joined) {
                pfail(p, JINJA_ERR_NOMEM, t->line, "out of memory");
                return NULL;
            }
            memcpy(joined, s, len);
            memcpy(joined + len, u->text, u->len);
            s = joined;
            len += u->len;
        }
        if ((n = node(p, JN_LITERAL, t->line))) n->lit = jv_str(s, len);
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        next(p);
        if ((n = node(p, JN_LITERAL, t->line))) n->lit = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (is_op(t, JOP_LPAREN)) {
        next(p);
        if (accept_op(p, JOP_RPAREN)) {
            n = node(p, JN_TUPLE, t->line);
        } else {
            JNode *e = parse_expression(p);
            if (!e) return NULL;
            if (is_op(peek(p), JOP_COMMA)) {
                if (!(n = node(p, JN_TUPLE, t->line)) || list_push(p, &n->list, e)) return NULL;
                while (accept_op(p, JOP_COMMA) && !is_op(peek(p), JOP_RPAREN)) {
                    JNode *x = parse_expression(p);
                    if (!x || list_push(p, &n->list, x)) return NULL;
                }
            } else {
                n = e;
            }
            if (expect_op(p, JOP_RPAREN, "')'")) return NULL;
        }
    } else if (is_op(t, JOP_LBRACKET)) {
        next(p);
        if (!(n = node(p, JN_LIST, t->line))) return NULL;
        while (!accept_op(p, JOP_RBRACKET)) {
            if (n->list.n && expect_op(p, JOP_COMMA, "',' or ']'")) return NULL;
            if (accept_op(p, JOP_RBRACKET)) break;
            JNode *x = parse_expression(p);
            if (!x || list_push(p, &n->list, x)) return NULL;
        }
    } else if (is_op(t, JOP_LBRACE)) {
        next(p);
        if (!(n = node(p, JN_DICT, t->line))) return NULL;
        while (!accept_op(p, JOP_RBRACE)) {
            if (n->list.n && expect_op(p, JOP_COMMA, "',' or '}'")) return NULL;
            if (accept_op(p, JOP_RBRACE)) break;
            JNode *k = parse_expression(p);
            if (!k || expect_op(p, JOP_COLON, "':' in a dict literal")) return NULL;
            JNode *v = parse_expression(p);
            if (!v || list_push(p, &n->list, k) || list_push(p, &n->list2, v)) return NULL;
        }
    } else {
        char b[80];
        pfail(p, JINJA_ERR_SYNTAX, t->line, "unexpected %s in an expression", describe(t, b, sizeof b));
        return NULL;
    }
    p->depth--;
    return n;
}

static JNode *parse_subscript(Parser *p, JNode *obj, int line) {
    JNode *parts[3] = {NULL, NULL, NULL};
    bool is_slice = false;
    if (!is_op(peek(p), JOP_COLON)) {
        if (!(parts[0] = parse_expression(p))) return NULL;
    }
    if (accept_op(p, JOP_COLON)) {
        is_slice = true;
        if (!is_op(peek(p), JOP_COLON) && !is_op(peek(p), JOP_RBRACKET) && !(parts[1] = parse_expression(p))) return NULL;
        if (accept_op(p, JOP_COLON) && !is_op(peek(p), JOP_RBRACKET) && !(parts[2] = parse_expression(p))) return NULL;
    }
    if (expect_op(p, JOP_RBRACKET, "']'")) return NULL;
    JNode *n = node(p, is_slice ? JN_SLICE : JN_ITEM, line);
    if (!n) return NULL;
    n->obj = obj;
    n->a = parts[0];
    n->b = parts[1];
    n->c = parts[2];
    return n;
}

/* Left-deep chains (a.b.c, x|f|g, a + b + c, ...) nest the AST as deeply as they are long, so each
 * link counts against the parse depth like a nesting level: the tree stays shallow enough for the
 * recursive passes over it. */
static bool chain_link(Parser *p, int *links, int line) {
    (*links)++;
    return enter(p, line);
}

static JNode *parse_postfix(Parser *p, JNode *n) {
    int links = 0;
    JNode *res = NULL;
    for (;;) {
        const JToken *t = peek(p);
        if ((is_op(t, JOP_DOT) || is_op(t, JOP_LBRACKET) || is_op(t, JOP_LPAREN)) && !chain_link(p, &links, t->line)) return NULL;
        if (is_op(t, JOP_DOT)) {
            next(p);
            const JToken *a = next(p);
            JNode *m;
            if (a->kind == JT_NAME) {
                if (!(m = node(p, JN_ATTR, a->line))) return NULL;
                m->name = a->text;
            } else if (a->kind == JT_INT) {
                if (!(m = node(p, JN_ITEM, a->line)) || !(m->a = node(p, JN_LITERAL, a->line))) return NULL;
                m->a->lit = jv_int(a->i);
            } else {
                char b[80];
                pfail(p, JINJA_ERR_SYNTAX, a->line, "expected an attribute name after '.', got %s", describe(a, b, sizeof b));
                return NULL;
            }
            m->obj = n;
            n = m;
        } else if (is_op(t, JOP_LBRACKET)) {
            next(p);
            if (!(n = parse_subscript(p, n, t->line))) return NULL;
        } else if (is_op(t, JOP_LPAREN)) {
            next(p);
            JNode *c = node(p, JN_CALL, t->line);
            if (!c) return NULL;
            c->obj = n;
            if (parse_call_args(p, c)) return NULL;
            if (n->kind == JN_ATTR && !jinja_is_method_name(n->name)) {
                pfail(p, JINJA_ERR_UNSUPPORTED, t->line, "unsupported method '%s()'", n->name);
                return NULL;
            }
            n = c;
        } else {
            res = n;
            break;
        }
    }
    p->depth -= links;
    return res;
}

static JNode *parse_filter_expr(Parser *p, JNode *n) {
    int links = 0;
    for (;;) {
        const JToken *t = peek(p);
        if ((is_op(t, JOP_PIPE) || is_name(t, "is") || is_op(t, JOP_LPAREN)) && !chain_link(p, &links, t->line)) return NULL;
        if (is_op(t, JOP_PIPE)) {
            next(p);
            const char *name = dotted_name(p);
            if (!name) return NULL;
            JNode *f = node(p, JN_FILTER, t->line);
            if (!f) return NULL;
            f->name = name;
            f->obj = n;
            if (!(f->impl = jinja_find_filter(name))) {
                pfail(p, JINJA_ERR_UNSUPPORTED, t->line, "unsupported filter '%s'", name);
                return NULL;
            }
            if (accept_op(p, JOP_LPAREN) && parse_call_args(p, f)) return NULL;
            n = f;
        } else if (is_name(t, "is")) {
            next(p);
            bool neg = accept_name(p, "not");
            const char *name = dotted_name(p);
            if (!name) return NULL;
            JNode *f = node(p, JN_TEST, t->line);
            if (!f) return NULL;
            f->name = name;
            f->obj = n;
            f->negate = neg;
            if (!(f->impl = jinja_find_test(name))) {
                pfail(p, JINJA_ERR_UNSUPPORTED, t->line, "unsupported test '%s'", name);
                return NULL;
            }
            const JToken *a = peek(p);
            if (is_op(a, JOP_LPAREN)) {
                next(p);
                if (parse_call_args(p, f)) return NULL;
            } else if ((a->kind == JT_NAME || a->kind == JT_STRING || a->kind == JT_INT || a->kind == JT_FLOAT ||
                        is_op(a, JOP_LBRACKET) || is_op(a, JOP_LBRACE)) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") && !is_name(a, "if") &&
                       !is_name(a, "is") && !is_name(a, "in") && !is_name(a, "not")) {
                JNode *arg = parse_primary(p);
                if (!arg || !(arg = parse_postfix(p, arg)) || list_push(p, &f->list, arg)) return NULL;
            }
            n = f;
        } else if (is_op(t, JOP_LPAREN)) {
            next(p);
            JNode *c = node(p, JN_CALL, t->line);
            if (!c) return NULL;
            c->obj = n;
            if (parse_call_args(p, c)) return NULL;
            n = c;
        } else {
            p->depth -= links;
            return n;
        }
    }
}

static JNode *parse_unary(Parser *p, bool with_filter) {
    const JToken *t = peek(p);
    if (!enter(p, t->line)) return NULL;
    JNode *n;
    if (is_op(t, JOP_SUB) || is_op(t, JOP_ADD)) {
        next(p);
        if (!(n = node(p, is_op(t, JOP_SUB) ? JN_NEG : JN_POS, t->line)) || !(n->a = parse_unary(p, false))) return NULL;
    } else if (!(n = parse_primary(p))) {
        return NULL;
    }
    if (!(n = parse_postfix(p, n))) return NULL;
    if (with_filter && !(n = parse_filter_expr(p, n))) return NULL;
    p->depth--;
    return n;
}

static JNode *binop(Parser *p, JOp op, JNode *a, JNode *b, int line) {
    if (!a || !b) return NULL;
    JNode *n = node(p, JN_BINOP, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static JNode *parse_pow(Parser *p) {
    JNode *n = parse_unary(p, true);
    int links = 0;
    while (n && is_op(peek(p), JOP_POW)) {
        int line = next(p)->line;
        if (!chain_link(p, &links, line)) return NULL;
        n = binop(p, JOP_POW, n, parse_unary(p, true), line);
    }
    p->depth -= links;
    return n;
}

static bool op_among(JOp op, const JOp *ops, size_t n_ops) {
    for (size_t i = 0; i < n_ops; i++)
        if (ops[i] == op) return true;
    return false;
}

/* A left-associative chain of the binary operators in `ops` (`a * b / c`) over operands parsed by
 * `operand`; each link counts against the nesting depth until the chain is done. */
static JNode *parse_op_chain(Parser *p, const JOp *ops, size_t n_ops, JNode *(*operand)(Parser *)) {
    JNode *n = operand(p);
    int links = 0;
    for (;;) {
        const JToken *t = peek(p);
        if (!n || t->kind != JT_OP || !op_among(t->op, ops, n_ops)) break;
        next(p);
        if (!chain_link(p, &links, t->line)) return NULL;
        n = binop(p, t->op, n, operand(p), t->line);
    }
    p->depth -= links;
    return n;
}

static JNode *parse_math2(Parser *p) {
    static const JOp ops[] = {JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD};
    return parse_op_chain(p, ops, sizeof ops / sizeof ops[0], parse_pow);
}

static JNode *parse_concat(Parser *p) {
    JNode *n = parse_math2(p);
    if (!n || !is_op(peek(p), JOP_TILDE)) return n;
    JNode *c = node(p, JN_CONCAT, n->line);
    if (!c || list_push(p, &c->list, n)) return NULL;
    while (accept_op(p, JOP_TILDE)) {
        JNode *x = parse_math2(p);
        if (!x || list_push(p, &c->list, x)) return NULL;
    }
    return c;
}

static JNode *parse_math1(Parser *p) {
    static const JOp ops[] = {JOP_ADD, JOP_SUB};
    return parse_op_chain(p, ops, sizeof ops / sizeof ops[0], parse_concat);
}

static JNode *parse_compare(Parser *p) {
    JNode *first = parse_math1(p);
    if (!first) return NULL;
    JNode *c = NULL;
    JOp ops_buf[64];
    int n_ops = 0;
    for (;;) {
        const JToken *t = peek(p);
        JOp op;
        if (t->kind == JT_OP && (t->op == JOP_EQ || t->op == JOP_NE || t->op == JOP_LT || t->op == JOP_LE || t->op == JOP_GT ||
                                 t->op == JOP_GE)) {
            op = t->op;
            next(p);
        } else if (is_name(t, "in")) {
            op = JOP_IN;
            next(p);
        } else if (is_name(t, "not") && is_name(peek2(p), "in")) {
            op = JOP_NOT_IN;
            next(p);
            next(p);
        } else {
            break;
        }
        if (n_ops == 64) {
            pfail(p, JINJA_ERR_LIMIT, t->line, "more than 64 chained comparisons");
            return NULL;
        }
        if (!c) {
            if (!(c = node(p, JN_COMPARE, first->line))) return NULL;
            c->a = first;
        }
        JNode *x = parse_math1(p);
        if (!x || list_push(p, &c->list, x)) return NULL;
        ops_buf[n_ops++] = op;
    }
    if (!c) return first;
    if (!(c->ops = jarena_alloc(&p->t->arena, (size_t)n_ops * sizeof *c->ops))) {
        pfail(p, JINJA_ERR_NOMEM, first->line, "out of memory");
        return NULL;
    }
    memcpy(c->ops, ops_buf, (size_t)n_ops * sizeof *c->ops);
    return c;
}

static JNode *parse_not(Parser *p) {
    const JToken *t = peek(p);
    if (is_name(t, "not")) {
        next(p);
        if (!enter(p, t->line)) return NULL;
        JNode *n = node(p, JN_NOT, t->line);
        if (!n || !(n->a = parse_not(p))) return NULL;
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

/* A left-associative chain of one boolean operator (`a and b and c`) over operands parsed by
 * `operand`; each link counts against the nesting depth until the chain is done. */
static JNode *parse_bool_chain(Parser *p, const char *word, JNodeKind kind, JNode *(*operand)(Parser *)) {
    JNode *n = operand(p);
    int links = 0;
    while (n && is_name(peek(p), word)) {
        int line = next(p)->line;
        if (!chain_link(p, &links, line)) return NULL;
        JNode *m = node(p, kind, line);
        if (!m) return NULL;
        m->a = n;
        if (!(m->b = operand(p))) return NULL;
        n = m;
    }
    p->depth -= links;
    return n;
}

static JNode *parse_and(Parser *p) { return parse_bool_chain(p, "and", JN_AND, parse_not); }

static JNode *parse_or(Parser *p) { return parse_bool_chain(p, "or", JN_OR, parse_and); }

static JNode *parse_expression(Parser *p) {
    if (!enter(p, peek(p)->line)) return NULL;
    JNode *n = parse_or(p);
    int links = 0;
    while (n && is_name(peek(p), "if")) {
        int line = next(p)->line;
        if (!chain_link(p, &links, line)) return NULL;
        JNode *c = node(p, JN_COND, line);
        if (!c) return NULL;
        c->b = n; /* value when true */
        if (!(c->a = parse_or(p))) return NULL;
        if (accept_name(p, "else") && !(c->c = parse_expression(p))) return NULL;
        n = c;
    }
    p->depth -= 1 + links;
    return n;
}

/* An expression, or a bare tuple `a, b` where Jinja allows one ({{ }}, set). */
static JNode *parse_tuple_expr(Parser *p) {
    JNode *n = parse_expression(p);
    if (!n || !is_op(peek(p), JOP_COMMA)) return n;
    JNode *t = node(p, JN_TUPLE, n->line);
    if (!t || list_push(p, &t->list, n)) return NULL;
    while (accept_op(p, JOP_COMMA)) {
        JTokKind k = peek(p)->kind;
        if (k == JT_VAR_END || k == JT_BLOCK_END) break;
        JNode *x = parse_expression(p);
        if (!x || list_push(p, &t->list, x)) return NULL;
    }
    return t;
}

/* ---- statements ---- */

static int parse_body(Parser *p, JNodeList *out, const char *const *ends, const char **found, const char *opener, int open_line);

static int end_tag(Parser *p) { return expect_kind(p, JT_BLOCK_END, "'%}'"); }

static JNode *parse_if(Parser *p, int line) {
    JNode *n = node(p, JN_IF, line);
    if (!n || !(n->a = parse_expression(p)) || end_tag(p)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *found;
    if (parse_body(p, &n->list, ends, &found, "if", line)) return NULL;
    if (!strcmp(found, "elif")) {
        if (!enter(p, line)) return NULL;
        JNode *e = parse_if(p, peek(p)->line);
        p->depth--;
        if (!e || list_push(p, &n->list2, e)) return NULL;
        return n;
    }
    if (!strcmp(found, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        if (end_tag(p) || parse_body(p, &n->list2, ends2, &found, "if", line)) return NULL;
    }
    return end_tag(p) ? NULL : n;
}

static int parse_targets(Parser *p, JNode *n) {
    bool paren = accept_op(p, JOP_LPAREN);
    do {
        const JToken *t = peek(p);
        if (t->kind != JT_NAME) {
            char b[80];
            return pfail(p, JINJA_ERR_SYNTAX, t->line, "expected a loop variable name, got %s", describe(t, b, sizeof b));
        }
        next(p);
        if (names_push(p, &n->names, &n->n_names, t->text)) return -1;
    } while (accept_op(p, JOP_COMMA) && peek(p)->kind == JT_NAME);
    if (paren && expect_op(p, JOP_RPAREN, "')'")) return -1;
    return 0;
}

static JNode *parse_for(Parser *p, int line) {
    JNode *n = node(p, JN_FOR, line);
    if (!n || parse_targets(p, n)) return NULL;
    if (!accept_name(p, "in")) {
        char b[80];
        pfail(p, JINJA_ERR_SYNTAX, peek(p)->line, "expected 'in' in a for loop, got %s", describe(peek(p), b, sizeof b));
        return NULL;
    }
    if (!(n->b = parse_or(p))) return NULL;
    if (is_op(peek(p), JOP_COMMA)) {
        JNode *t = node(p, JN_TUPLE, line);
        if (!t || list_push(p, &t->list, n->b)) return NULL;
        while (accept_op(p, JOP_COMMA) && !is_name(peek(p), "if") && peek(p)->kind != JT_BLOCK_END) {
            JNode *x = parse_or(p);
            if (!x || list_push(p, &t->list, x)) return NULL;
        }
        n->b = t;
    }
    if (accept_name(p, "if") && !(n->c = parse_expression(p))) return NULL;
    if (is_name(peek(p), "recursive")) {
        pfail(p, JINJA_ERR_UNSUPPORTED, peek(p)->line, "recursive for loops are not supported");
        return NULL;
    }
    if (end_tag(p)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *found;
    p->loop_depth++;
    if (parse_body(p, &n->list, ends, &found, "for", line)) return NULL;
    p->loop_depth--;
    if (!strcmp(found, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        if (end_tag(p) || parse_body(p, &n->list2, ends2, &found, "for", line)) return NULL;
    }
    return end_tag(p) ? NULL : n;
}

static JNode *parse_set(Parser *p, int line) {
    const JToken *t = peek(p);
    if (t->kind != JT_NAME) {
        char b[80];
        pfail(p, JINJA_ERR_SYNTAX, t->line, "expected a variable name after 'set', got %s", describe(t, b, sizeof b));
        return NULL;
    }
    JNode *n;
    if (is_op(peek2(p), JOP_DOT)) {
        next(p);
        next(p);
        const JToken *attr = next(p);
        if (attr->kind != JT_NAME) {
            pfail(p, JINJA_ERR_SYNTAX, attr->line, "expected an attribute name in 'set %s.'", t->text);
            return NULL;
        }
        if (!(n = node(p, JN_SET_ATTR, line)) || !(n->obj = node(p, JN_NAME, line))) return NULL;
        n->obj->name = t->text;
        n->name = attr->text;
    } else {
        if (!(n = node(p, JN_SET, line)) || parse_targets(p, n)) return NULL;
    }
    if (accept_op(p, JOP_ASSIGN)) {
        if (!(n->a = parse_tuple_expr(p)) || end_tag(p)) return NULL;
        return n;
    }
    if (n->kind != JN_SET || n->n_names != 1) {
        pfail(p, JINJA_ERR_SYNTAX, peek(p)->line, "expected '=' in 'set'");
        return NULL;
    }
    if (is_op(peek(p), JOP_PIPE)) {
        pfail(p, JINJA_ERR_UNSUPPORTED, peek(p)->line, "filtered block 'set' is not supported");
        return NULL;
    }
    if (end_tag(p)) return NULL;
    n->kind = JN_SET_BLOCK;
    static const char *const ends[] = {"endset", NULL};
    const char *found;
    if (parse_body(p, &n->list, ends, &found, "set", line)) return NULL;
    return end_tag(p) ? NULL : n;
}

static JNode *parse_macro(Parser *p, int line) {
    const JToken *t = next(p);
    if (t->kind != JT_NAME) {
        pfail(p, JINJA_ERR_SYNTAX, t->line, "expected a macro name");
        return NULL;
    }
    JNode *n = node(p, JN_MACRO, line);
    if (!n) return NULL;
    n->name = t->text;
    if (expect_op(p, JOP_LPAREN, "'(' after the macro name")) return NULL;
    while (!accept_op(p, JOP_RPAREN)) {
        if (n->n_names && expect_op(p, JOP_COMMA, "',' or ')'")) return NULL;
        const JToken *a = next(p);
        if (a->kind != JT_NAME) {
            pfail(p, JINJA_ERR_SYNTAX, a->line, "expected a parameter name in macro '%s'", n->name);
            return NULL;
        }
        JNode *def = NULL;
        if (accept_op(p, JOP_ASSIGN) && !(def = parse_expression(p))) return NULL;
        if (names_push(p, &n->names, &n->n_names, a->text) || list_push(p, &n->list2, def)) return NULL;
    }
    if (end_tag(p)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *found;
    int saved = p->loop_depth;
    p->loop_depth = 0;
    if (parse_body(p, &n->list, ends, &found, "macro", line)) return NULL;
    p->loop_depth = saved;
    if (is_name(peek(p), n->name)) next(p); /* {% endmacro name %} */
    return end_tag(p) ? NULL : n;
}

static JNode *parse_statement(Parser *p) {
    const JToken *t = next(p);
    if (t->kind != JT_NAME) {
        char b[80];
        pfail(p, JINJA_ERR_SYNTAX, t->line, "expected a tag name after '{%%', got %s", describe(t, b, sizeof b));
        return NULL;
    }
    if (!enter(p, t->line)) return NULL;
    JNode *n = NULL;
    const char *w = t->text;
    if (!strcmp(w, "if")) n = parse_if(p, t->line);
    else if (!strcmp(w, "for")) n = parse_for(p, t->line);
    else if (!strcmp(w, "set")) n = parse_set(p, t->line);
    else if (!strcmp(w, "macro")) n = parse_macro(p, t->line);
    else if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        if (p->loop_depth == 0) {
            pfail(p, JINJA_ERR_SYNTAX, t->line, "'%s' outside of a loop", w);
            return NULL;
        }
        if (!(n = node(p, w[0] == 'b' ? JN_BREAK : JN_CONTINUE, t->line)) || end_tag(p)) return NULL;
    } else if (!strcmp(w, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        const char *found;
        if (!(n = node(p, JN_SCOPE, t->line)) || end_tag(p) || parse_body(p, &n->list, ends, &found, "generation", t->line) ||
            end_tag(p))
            return NULL;
    } else if (!strcmp(w, "filter")) {
        n = node(p, JN_FILTER_BLOCK, t->line);
        if (!n) return NULL;
        const char *name = dotted_name(p);
        if (!name) return NULL;
        n->name = name;
        if (!(n->impl = jinja_find_filter(name))) {
            pfail(p, JINJA_ERR_UNSUPPORTED, t->line, "unsupported filter '%s'", name);
            return NULL;
        }
        if (accept_op(p, JOP_LPAREN) && parse_call_args(p, n)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        const char *found;
        JNodeList body = {0};
        if (end_tag(p) || parse_body(p, &body, ends, &found, "filter", t->line) || end_tag(p)) return NULL;
        n->obj = node(p, JN_SCOPE, t->line);
        if (!n->obj) return NULL;
        n->obj->list = body;
    } else {
        static const char *const known[] = {"include", "import", "from", "extends", "block", "call", "with", "do",
                                            "autoescape", "print", NULL};
        for (int k = 0; known[k]; k++)
            if (!strcmp(w, known[k])) {
                pfail(p, JINJA_ERR_UNSUPPORTED, t->line, "unsupported tag '%s'", w);
                return NULL;
            }
        pfail(p, JINJA_ERR_SYNTAX, t->line, "unknown tag '%s'", w);
        return NULL;
    }
    if (n) p->depth--;
    return n;
}

static int parse_body(Parser *p, JNodeList *out, const char *const *ends, const char **found, const char *opener, int open_line) {
    for (;;) {
        const JToken *t = peek(p);
        if (t->kind == JT_EOF) {
            if (!ends) return 0;
            int last = 0;
            while (ends[last + 1]) last++;
            return pfail(p, JINJA_ERR_SYNTAX, open_line, "'%s' opened on line %d is never closed (expected '{%% %s %%}')", opener,
                         open_line, ends[last]);
        }
        JNode *n = NULL;
        if (t->kind == JT_DATA) {
            next(p);
            if (!(n = node(p, JN_TEXT, t->line))) return -1;
            n->lit = jv_str(t->text, t->len);
        } else if (t->kind == JT_VAR_BEGIN) {
            next(p);
            if (!(n = node(p, JN_OUTPUT, t->line)) || !(n->a = parse_tuple_expr(p)) || expect_kind(p, JT_VAR_END, "'}}'")) return -1;
        } else if (t->kind == JT_BLOCK_BEGIN) {
            const JToken *w = peek2(p);
            if (w->kind == JT_NAME && ends)
                for (int k = 0; ends[k]; k++)
                    if (!strcmp(w->text, ends[k])) {
                        next(p);
                        next(p);
                        *found = ends[k];
                        return 0;
                    }
            if (w->kind == JT_NAME && (!strncmp(w->text, "end", 3) || !strcmp(w->text, "elif") || !strcmp(w->text, "else")))
                return pfail(p, JINJA_ERR_SYNTAX, w->line, "unexpected '%s'%s", w->text,
                             ends ? "" : " (no block is open)");
            next(p);
            if (!(n = parse_statement(p))) return -1;
        } else {
            char b[80];
            return pfail(p, JINJA_ERR_SYNTAX, t->line, "unexpected %s", describe(t, b, sizeof b));
        }
        if (list_push(p, out, n)) return -1;
    }
}

/* ---- static checks after parsing ---- */

typedef struct {
    const char **names;
    int n;
} NameSet;

static void visit_defined(Parser *p, const JNode *n, NameSet *s) {
    if (!n) return;
    if (n->kind == JN_MACRO && n->name) names_push(p, &s->names, &s->n, n->name);
    if (n->kind == JN_SET || n->kind == JN_SET_BLOCK || n->kind == JN_FOR || n->kind == JN_MACRO)
        for (int k = 0; k < n->n_names; k++) names_push(p, &s->names, &s->n, n->names[k]);
    visit_defined(p, n->a, s);
    visit_defined(p, n->b, s);
    visit_defined(p, n->c, s);
    visit_defined(p, n->obj, s);
    for (int k = 0; k < n->list.n; k++) visit_defined(p, n->list.v[k], s);
    for (int k = 0; k < n->list2.n; k++) visit_defined(p, n->list2.v[k], s);
}

static int check_calls(Parser *p, const JNode *n, const NameSet *s) {
    if (!n) return 0;
    if (n->kind == JN_CALL && n->obj->kind == JN_NAME && !jinja_is_global_function(n->obj->name)) {
        bool found = false;
        for (int k = 0; k < s->n && !found; k++) found = !strcmp(s->names[k], n->obj->name);
        if (!found) return pfail(p, JINJA_ERR_UNSUPPORTED, n->line, "unknown function '%s()'", n->obj->name);
    }
    if (check_calls(p, n->a, s) || check_calls(p, n->b, s) || check_calls(p, n->c, s) || check_calls(p, n->obj, s)) return -1;
    for (int k = 0; k < n->list.n; k++)
        if (check_calls(p, n->list.v[k], s)) return -1;
    for (int k = 0; k < n->list2.n; k++)
        if (check_calls(p, n->list2.v[k], s)) return -1;
    return 0;
}

int jinja_parse(JinjaTemplate *t, const JTokens *toks, JinjaError *err) {
    Parser p = {.t = t, .toks = toks, .err = err};
    if (parse_body(&p, &t->body, NULL, NULL, NULL, 0)) return -1;
    NameSet defined = {0};
    for (int k = 0; k < t->body.n; k++) visit_defined(&p, t->body.v[k], &defined);
    for (int k = 0; k < t->body.n; k++)
        if (check_calls(&p, t->body.v[k], &defined)) return -1;
    return 0;
}

static bool reads(const JNode *n, const char *name) {
    if (!n) return false;
    if (n->kind == JN_NAME && !strcmp(n->name, name)) return true;
    if (reads(n->a, name) || reads(n->b, name) || reads(n->c, name) || reads(n->obj, name)) return true;
    for (int k = 0; k < n->list.n; k++)
        if (reads(n->list.v[k], name)) return true;
    for (int k = 0; k < n->list2.n; k++)
        if (reads(n->list2.v[k], name)) return true;
    return false;
}

bool jinja_reads_variable(const JinjaTemplate *t, const char *name) {
    for (int k = 0; k < t->body.n; k++)
        if (reads(t->body.v[k], name)) return true;
    return false;
}
