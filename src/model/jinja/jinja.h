/*
 * jinja.h — a Jinja2 template engine for chat templates (the subset Hugging Face chat templates use).
 *
 * Owns: compiled templates (JinjaTemplate) and everything a render allocates (one arena per render,
 * freed before jinja_render returns). The environment is the one transformers' apply_chat_template
 * uses: trim_blocks and lstrip_blocks on, loopcontrols (break/continue) on, the {% generation %}
 * tag accepted, one trailing newline of the source dropped, autoescape off, an immutable sandbox
 * (lists and dicts cannot be mutated; only namespace() attributes can be assigned), and tojson is
 * Python's json.dumps(x, ensure_ascii=False) with indent/separators/sort_keys options.
 * Globals: range, namespace, dict, raise_exception(msg), strftime_now(fmt); everything else comes
 * from the caller's variables (a jansson object).
 * Supported: {{ }}, {% %}, {# #}, -/+ whitespace control, raw, if/elif/else, for (loop.*, else,
 * `if` filter, tuple targets, break/continue), set (also block set and namespace attributes),
 * macro with defaults, filter blocks, Python operators and literals, 'fmt' % args, slicing, the
 * filters, tests and str/dict methods listed in jinja_builtins.c. Not supported (a compile error
 * naming it): include/import/extends/block/call/with/do, recursive loops. Known differences:
 * integers are 64-bit (overflow is a render error, not a Python big int); upper/lower/title map
 * ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic only.
 *
 * Callers: src/model/chat_template.c (and tests, fuzz target, bench).
 * Errors: compile errors (syntax, unknown tag, unsupported filter/test/method where visible) name
 * the construct and line; render errors name the construct and line; raise_exception() gives
 * JINJA_ERR_RAISED with the template's message as msg. A render is bounded by JinjaLimits (output
 * bytes, loop iterations, macro call depth, memory), so a hostile template or input cannot hang or
 * exhaust memory; parsing bounds nesting depth so it cannot overflow the stack.
 * Thread-safety: a compiled template is immutable; any number of threads may render it at once.
 * Memory: jinja_render returns a malloc'd NUL-terminated string owned by the caller.
 */
#ifndef BRAID_MODEL_JINJA_JINJA_H
#define BRAID_MODEL_JINJA_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct JinjaTemplate JinjaTemplate;

typedef enum {
    JINJA_OK = 0,
    JINJA_ERR_SYNTAX,      /* the template cannot be parsed */
    JINJA_ERR_UNSUPPORTED, /* a tag, filter, test, method or function this engine does not implement */
    JINJA_ERR_RENDER,      /* a runtime error: undefined value used, type error, bad call */
    JINJA_ERR_RAISED,      /* the template called raise_exception(msg); msg is the template's message */
    JINJA_ERR_LIMIT,       /* a JinjaLimits bound was reached */
    JINJA_ERR_NOMEM,
} JinjaStatus;

typedef struct {
    JinjaStatus status;
    int line; /* 1-based line in the template, 0 when not known */
    char msg[480];
} JinjaError;

typedef struct {
    size_t max_output_bytes;  /* bytes of rendered text (each captured block included) */
    long max_loop_iterations; /* for-loop iterations, all loops of one render together */
    int max_call_depth;       /* nested macro calls */
    size_t max_memory_bytes;  /* values a render may allocate */
    int64_t now_unix;         /* strftime_now's clock (local time); 0 = the real clock */
} JinjaLimits;

/* 16 MiB output, 1M loop iterations, 64 nested macro calls, 256 MiB of values, real clock. */
JinjaLimits jinja_default_limits(void);

/* Compiles src[0..len). Returns 0 and *out, or -1 with err (status, line, message naming the
 * construct). */
int jinja_compile(const char *src, size_t len, JinjaTemplate **out, JinjaError *err);
void jinja_free(JinjaTemplate *t);

/* True when the template reads the variable `name` anywhere (statically). */
bool jinja_reads_variable(const JinjaTemplate *t, const char *name);

/* Renders with the members of vars (a JSON object, may be NULL) as variables. limits NULL =
 * defaults. Returns the malloc'd text (and its length in *out_len when non-NULL), or NULL with err. */
char *jinja_render(const JinjaTemplate *t, const json_t *vars, const JinjaLimits *limits, size_t *out_len, JinjaError *err);

#endif
