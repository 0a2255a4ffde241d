/*
 * jinja_internal.h — the engine's shared pieces: arena, values, tokens, AST, render context.
 * Private to the engine's .c files in src/model/jinja; the contract for callers is jinja.h.
 */
#ifndef BRAID_MODEL_JINJA_INTERNAL_H
#define BRAID_MODEL_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/jinja/jinja.h"

#define JINJA_MAX_PARSE_DEPTH 200 /* nested expressions / blocks the parser accepts */
#define JINJA_MAX_VALUE_DEPTH 200 /* nesting of values for tojson, repr, equality, JSON input */

/* ---- arena: bump allocation in chunks, freed all at once; cap 0 = unbounded ---- */
typedef struct JArenaChunk JArenaChunk;
typedef struct {
    JArenaChunk *head;
    size_t used, cap;
    bool hit_cap; /* an allocation was refused because of cap */
} JArena;
void *jarena_alloc(JArena *a, size_t n); /* zeroed, 16-byte aligned; NULL past the cap or OOM */
char *jarena_strndup(JArena *a, const char *s, size_t n);
void jarena_free(JArena *a);

/* ---- values ---- */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC, JV_LOOP } JKind;
enum { JF_TUPLE = 1, JF_NAMESPACE = 2, JF_SAFE = 4 };

typedef struct JList JList;
typedef struct JDict JDict;
typedef struct JFunc JFunc;
typedef struct JLoop JLoop;
typedef struct JValue {
    uint8_t kind, flags;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        JList *list;
        JDict *dict;
        const JFunc *fn;
        JLoop *loop;
        const char *undef_name; /* for "'x' is undefined" */
    } u;
} JValue;

struct JList {
    JValue *items;
    size_t n, cap;
};
struct JDict {
    JValue *keys, *vals;
    size_t n, cap;
};
struct JLoop {
    JList *items;
    size_t index0;
    int depth0;
};

typedef struct JRender JRender;
typedef struct {
    const JValue *pos;
    int n_pos;
    const char *const *kw_names;
    const JValue *kw;
    int n_kw;
    int line;
} JArgs;
typedef int (*JBuiltinFn)(JRender *r, const JValue *self, const JArgs *args, JValue *out);
struct JNode;
struct JFunc {
    const char *name;
    JBuiltinFn fn;            /* builtin (self is the bound object, when any) */
    JValue self;
    const struct JNode *macro; /* a template macro */
};

static inline JValue jv_undef(const char *name) { JValue v = {.kind = JV_UNDEF}; v.u.undef_name = name; return v; }
static inline JValue jv_none(void) { return (JValue){.kind = JV_NONE}; }
static inline JValue jv_bool(bool b) { JValue v = {.kind = JV_BOOL}; v.u.b = b; return v; }
static inline JValue jv_int(int64_t i) { JValue v = {.kind = JV_INT}; v.u.i = i; return v; }
static inline JValue jv_float(double f) { JValue v = {.kind = JV_FLOAT}; v.u.f = f; return v; }
static inline JValue jv_str(const char *p, size_t n) { JValue v = {.kind = JV_STR}; v.u.s.p = p; v.u.s.n = n; return v; }

/* ---- tokens ---- */
typedef enum {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END, JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP
} JTokKind;
typedef enum {
    JOP_NONE, JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_TILDE, JOP_LBRACKET, JOP_RBRACKET,
    JOP_LPAREN, JOP_RPAREN, JOP_LBRACE, JOP_RBRACE, JOP_EQ, JOP_NE, JOP_GT, JOP_GE, JOP_LT, JOP_LE, JOP_ASSIGN, JOP_DOT,
    JOP_COLON, JOP_PIPE, JOP_COMMA, JOP_SEMICOLON,
    /* comparison kinds beyond the operator tokens */
    JOP_IN, JOP_NOT_IN
} JOp;
typedef struct {
    JTokKind kind;
    JOp op;
    int line;
    const char *text; /* names and data: into the arena; strings: unescaped */
    size_t len;
    int64_t i;
    double f;
} JToken;
typedef struct {
    JToken *v;
    size_t n, cap;
} JTokens;

/* Splits normalized source into tokens (data, tag delimiters, expression tokens). */
int jinja_lex(JArena *a, const char *src, size_t len, JTokens *out, JinjaError *err);

/* ---- AST ---- */
typedef enum {
    /* statements */
    JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SET_ATTR, JN_SET_BLOCK, JN_MACRO, JN_BREAK, JN_CONTINUE, JN_SCOPE,
    JN_FILTER_BLOCK,
    /* expressions */
    JN_LITERAL, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_NEG, JN_POS, JN_NOT, JN_BINOP,
    JN_AND, JN_OR, JN_COMPARE, JN_CONCAT, JN_COND, JN_LIST, JN_TUPLE, JN_DICT
} JNodeKind;

typedef struct JNode JNode;
typedef struct {
    JNode **v;
    int n;
} JNodeList;
struct JNode {
    JNodeKind kind;
    int line;
    JOp op;
    bool negate;             /* JN_TEST: `is not` */
    const char *name;        /* variable, attribute, filter, test, macro, set target */
    JValue lit;              /* JN_LITERAL */
    JNode *a, *b, *c;        /* operands; if: cond; for: iter (b), filter (c); slice: start/stop (a/b) step (c) */
    JNode *obj;              /* attr/item/slice/call/filter/test: the object; set-attr: namespace expr */
    JNodeList list;          /* body, items, positional args, compare operands, dict keys */
    JNodeList list2;         /* else body, kwarg values, dict values, macro defaults */
    const char **names;      /* for/set targets, kwarg names, macro parameters */
    int n_names;
    JOp *ops;                /* JN_COMPARE: one per operand in list */
    JBuiltinFn impl;         /* JN_FILTER / JN_TEST: resolved at compile time */
};

struct JinjaTemplate {
    JArena arena; /* tokens, AST, literals */
    JNodeList body;
};

/* Parses tokens into t->body. */
int jinja_parse(JinjaTemplate *t, const JTokens *toks, JinjaError *err);

/* ---- builtins (jinja_builtins.c) ---- */
JBuiltinFn jinja_find_filter(const char *name);
JBuiltinFn jinja_find_test(const char *name);
bool jinja_is_method_name(const char *name);   /* a method of str, dict or loop this engine implements */
bool jinja_is_global_function(const char *name);
/* The bound method obj.name, or false when obj has none by that name. */
bool jinja_bind_method(JRender *r, const JValue *obj, const char *name, JValue *out);
bool jinja_global(const char *name, JValue *out);
/* 'fmt' % args (Python's printf-style formatting). */
int jinja_percent_format(JRender *r, const JValue *fmt, const JValue *args, int line, JValue *out);

/* ---- render context (jinja_eval.c) ---- */
typedef struct {
    char *p;
    size_t n, cap;
} JBuf;
typedef struct JFrame JFrame;
struct JRender {
    JArena arena;
    JinjaLimits lim;
    JinjaError *err;
    long iterations;
    int call_depth, eval_depth;
    JBuf *out;
    JFrame *top;
};

int jr_fail(JRender *r, JinjaStatus st, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int jr_nomem(JRender *r, int line);
int jinja_get_attr(JRender *r, const JValue *obj, const char *name, int line, JValue *out);
int jinja_get_item(JRender *r, const JValue *obj, const JValue *key, int line, JValue *out);
int jinja_call_value(JRender *r, const JValue *fn, const JArgs *args, JValue *out);

/* ---- values (jinja_value.c) ---- */
bool jv_truthy(const JValue *v);
const char *jv_type_name(const JValue *v); /* Python's name: 'str', 'int', 'dict', 'NoneType' ... */
bool jv_equal(const JValue *a, const JValue *b, int depth);
JList *jlist_new(JRender *r, size_t cap);
int jlist_push(JRender *r, JList *l, JValue v);
JDict *jdict_new(JRender *r, size_t cap);
int jdict_set(JRender *r, JDict *d, JValue key, JValue val);
const JValue *jdict_get(const JDict *d, const JValue *key);
const JValue *jdict_get_str(const JDict *d, const char *key, size_t n);
JValue jv_list(JList *l, uint8_t flags);
JValue jv_dict(JDict *d, uint8_t flags);
/* str(v) as Python (and Jinja's output) spells it: undefined '', None 'None', True, 1.5, [..] repr. */
int jv_to_string(JRender *r, const JValue *v, JValue *out);
int jv_append_str(JRender *r, JBuf *b, const JValue *v, int depth); /* str(v) appended to b */
int jv_append_repr(JRender *r, JBuf *b, const JValue *v, int depth);
int jv_tojson(JRender *r, JBuf *b, const JValue *v, const char *indent, const char *item_sep, const char *key_sep,
              bool sort_keys, bool ensure_ascii, int depth, int level);
void jv_format_float(double f, char *out, size_t cap); /* Python repr(float) */
int jv_from_json(JRender *r, const json_t *j, JValue *out, int depth);
/* Iteration: a list of items (dict -> keys, str -> characters, undefined -> empty). */
int jv_iterate(JRender *r, const JValue *v, JList **out, int line);
int jbuf_put(JRender *r, JBuf *b, const char *p, size_t n);
int jbuf_puts(JRender *r, JBuf *b, const char *s);
JValue jv_str_from_buf(JRender *r, JBuf *b); /* copies into the arena; frees b */

/* UTF-8 helpers */
size_t ju8_count(const char *p, size_t n);
size_t ju8_next(const char *p, size_t n, size_t i); /* byte index after the code point at i */
uint32_t ju8_decode(const char *p, size_t n, size_t i);

#endif
