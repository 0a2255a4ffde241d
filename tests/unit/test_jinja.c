/* The Jinja engine's pieces: lexing and parsing errors that name the construct and the line,
 * whitespace control with trim_blocks/lstrip_blocks, expressions and filters, and the bounds that
 * keep a hostile template from hanging or exhausting the stack or memory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja/jinja.h"

/* Renders src with vars (JSON text or NULL) and the given limits (NULL = defaults). */
static char *render_with(const char *src, const char *vars_json, const JinjaLimits *lim, JinjaError *err) {
    JinjaTemplate *t;
    if (jinja_compile(src, strlen(src), &t, err)) return NULL;
    json_error_t je;
    json_t *vars = vars_json ? json_loads(vars_json, 0, &je) : NULL;
    if (vars_json && !vars) fail_msg("bad test JSON: %s", je.text);
    char *out = jinja_render(t, vars, lim, NULL, err);
    json_decref(vars);
    jinja_free(t);
    return out;
}

static void expect(const char *src, const char *vars, const char *want) {
    JinjaError err;
    char *out = render_with(src, vars, NULL, &err);
    if (!out) fail_msg("%s: %s", src, err.msg);
    if (strcmp(out, want)) fail_msg("template %s\n  want [%s]\n  got  [%s]", src, want, out);
    free(out);
}

static void expect_compile_error(const char *src, JinjaStatus status, int line, const char *needle) {
    JinjaTemplate *t;
    JinjaError err;
    assert_int_equal(jinja_compile(src, strlen(src), &t, &err), -1);
    if (err.status != status || err.line != line || !strstr(err.msg, needle))
        fail_msg("template %s: got status %d line %d '%s', want status %d line %d containing '%s'", src, err.status, err.line, err.msg,
                 status, line, needle);
}

static void expect_render_error(const char *src, const char *vars, JinjaStatus status, const char *needle) {
    JinjaError err;
    char *out = render_with(src, vars, NULL, &err);
    if (out) fail_msg("template %s rendered [%s], want an error", src, out);
    if (err.status != status || !strstr(err.msg, needle))
        fail_msg("template %s: got status %d '%s', want status %d containing '%s'", src, err.status, err.msg, status, needle);
}

static void test_syntax_errors_name_construct_and_line(void **state) {
    (void)state;
    expect_compile_error("a\nb\n{% if x %}\nno end", JINJA_ERR_SYNTAX, 3, "endif");
    expect_compile_error("{% for x in y %}\n{% endif %}", JINJA_ERR_SYNTAX, 2, "endif");
    expect_compile_error("\n\n{{ x | bogus }}", JINJA_ERR_UNSUPPORTED, 3, "filter 'bogus'");
    expect_compile_error("{{ x is bogus }}", JINJA_ERR_UNSUPPORTED, 1, "test 'bogus'");
    expect_compile_error("{{ x.frobnicate() }}", JINJA_ERR_UNSUPPORTED, 1, "method 'frobnicate()'");
    expect_compile_error("{{ undefined_function(1) }}", JINJA_ERR_UNSUPPORTED, 1, "unknown function 'undefined_function()'");
    expect_compile_error("x\n{% include 'other.jinja' %}", JINJA_ERR_UNSUPPORTED, 2, "tag 'include'");
    expect_compile_error("{% frobnicate %}", JINJA_ERR_SYNTAX, 1, "unknown tag 'frobnicate'");
    expect_compile_error("{{ 'unterminated }}", JINJA_ERR_SYNTAX, 1, "unterminated string");
    expect_compile_error("ok\n{{ x ", JINJA_ERR_SYNTAX, 2, "'}}'");
    expect_compile_error("{# never closed", JINJA_ERR_SYNTAX, 1, "comment");
    expect_compile_error("{{ (1 + 2 }}", JINJA_ERR_SYNTAX, 1, "unexpected '}'");
    expect_compile_error("{{ 1 + }}", JINJA_ERR_SYNTAX, 1, "unexpected");
    expect_compile_error("{% break %}", JINJA_ERR_SYNTAX, 1, "outside of a loop");
    expect_compile_error("{{ a ]}}", JINJA_ERR_SYNTAX, 1, "unexpected ']'");
    expect_compile_error("{% set %}", JINJA_ERR_SYNTAX, 1, "variable name");
    expect_compile_error("x\n{% raw %}never closed", JINJA_ERR_SYNTAX, 2, "endraw");
    expect_compile_error("{{ x @ y }}", JINJA_ERR_SYNTAX, 1, "unexpected character '@'");
}

static void test_whitespace_control(void **state) {
    (void)state;
    expect("a\n{% if true %}\nb\n{% endif %}\nc", NULL, "a\nb\nc");    /* trim_blocks */
    expect("a\n    {% if true %}\n    b\n    {% endif %}\nc", NULL, "a\n    b\nc"); /* lstrip_blocks */
    expect("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    expect("a  {{- 'x' -}}  b", NULL, "axb");
    expect("  {{ 'v' }}\n", NULL, "  v"); /* variables keep their indent; one trailing newline dropped */
    expect("x\n  {%+ if true %}y{% endif +%}\nz", NULL, "x\n  y\nz");
    expect("a {# c #} b\n  {# own line #}\nc", NULL, "a  b\nc");
    expect("line\r\nnext\r\n", NULL, "line\nnext");
    expect("  {% raw %}{{ not parsed }}{% endraw %}\n{%- raw -%}  {% if %}  {%- endraw %}!", NULL, "{{ not parsed }}{% if %}!");
}

static void test_expressions(void **state) {
    (void)state;
    const char *vars = "{\"n\": 3, \"s\": \"héllo\", \"l\": [1, 2, 3], \"d\": {\"b\": 1, \"a\": [true, null, 1.5]}}";
    expect("{{ n + 1 }} {{ n * 2.5 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ n / 2 }}", vars, "4 7.5 -4 2 256 1.5");
    expect("{{ s | length }} {{ s[1:3] }} {{ s[::-1] }} {{ s | upper }} {{ l[-1] }} {{ l[5] }}|", vars, "5 él olléh HÉLLO 3 |");
    expect("{{ d }} {{ d | tojson }} {{ d.a[1] is none }} {{ d.c is defined }}", vars,
           "{'b': 1, 'a': [True, None, 1.5]} {\"b\": 1, \"a\": [true, null, 1.5]} True False");
    expect("{{ d | tojson(indent=2, sort_keys=true) }}", vars, "{\n  \"a\": [\n    true,\n    null,\n    1.5\n  ],\n  \"b\": 1\n}");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", vars, "b=1;a=[True, None, 1.5];");
    expect("{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }}{{ ',' if not loop.last }}{% else %}none{% endfor %}", vars,
           "1/2:2,2/2:3");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% set ns = namespace(t=0) %}{% for x in l %}{% set ns.t = ns.t + x %}{% endfor %}{{ ns.t }}", vars, "6");
    expect("{% set x = 1 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}", vars, "1"); /* loop scope */
    expect("{% for i in l %}{% if loop.first %}{% set x = 'a' %}{% endif %}{{ x }},{% endfor %}", vars, "a,,,"); /* per iteration */
    expect("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort(reverse=true) }} {{ [{'k': 2}, {'k': 1}] | sort(attribute='k') | map(attribute='k') | list }}",
           NULL, "[1, 2, 3] ['c', 'b', 'A'] [1, 2]");
    expect("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}", NULL, "[1B][2x]");
    expect("{{ 'a' if n > 5 else 'b' }}{{ n > 1 and 'y' }}{{ 0 or 'z' }}{{ 1 < n < 5 }}", vars, "byzTrue");
    expect("{{ 'x' ~ 1 ~ none ~ undefined_thing }}", NULL, "x1None");
    expect("{{ '%s|%s' | replace('%s', 'q') }} {{ ' a b '.split() }} {{ 'a,b'.split(',') | join('+') }}", NULL, "q|q ['a', 'b'] a+b");
    expect("{{ 0.1 + 0.2 }} {{ 1e100 }} {{ 1e-7 }} {{ 2.0 }} {{ -0.0 }} {{ 12345678901234567.0 }}", NULL,
           "0.30000000000000004 1e+100 1e-07 2.0 -0.0 1.2345678901234568e+16");
    expect("{{ \"it's\" }} {{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}", NULL,
           "it's [\"it's\", 'say \"hi\"', 'both \\' \"']");
    expect("{{ '\\u00e9\\x41\\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }} {{ '😀' | tojson(ensure_ascii=true) }}", NULL,
           "\"éA\\n\" \"\\u00e9\" \"\\ud83d\\ude00\"");
    expect("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", NULL,
           "02");
    expect("{% set b %}in {{ 'block' }}{% endset %}{{ b | upper }}", NULL, "IN BLOCK");
    expect("{% filter upper %}x{{ 'y' }}{% endfilter %}", NULL, "XY");
    expect("{% generation %}gen{% endgeneration %}", NULL, "gen");
    expect("{{ strftime_now('%%fixed') }}", NULL, "%fixed");
    expect("{{ 'Hello %s' % 'x' }} {{ '%s and %5.2f|%-3d|' % ('a', 3.14159, 7) }} {{ '%d%%' % 42 }}", NULL, "Hello x a and  3.14|7  | 42%");
    expect("{{ 'ßéÿāıőж' | upper }} {{ 'ÉΣΑ' | lower }} {{ 'éa éb' | title }} {{ 'éa'.title() }} {{ 'ÉA' | capitalize }}", NULL,
           "SSÉŸĀIŐЖ éσα Éa Éb Éa Éa");
}

static void test_render_errors(void **state) {
    (void)state;
    expect_render_error("{{ raise_exception('bad turn order') }}", NULL, JINJA_ERR_RAISED, "bad turn order");
    expect_render_error("x\n{{ missing.attr }}", NULL, JINJA_ERR_RENDER, "line 2: 'missing' is undefined");
    expect_render_error("{{ 'a' + 1 }}", NULL, JINJA_ERR_RENDER, "unsupported operand");
    expect_render_error("{{ 1 // 0 }}", NULL, JINJA_ERR_RENDER, "by zero");
    expect_render_error("{% for x in 5 %}{% endfor %}", NULL, JINJA_ERR_RENDER, "not iterable");
    expect_render_error("{{ [1] | map('nope') | list }}", NULL, JINJA_ERR_UNSUPPORTED, "nope");
    expect_render_error("{% set x = [1] %}{% set x.a = 1 %}", NULL, JINJA_ERR_RENDER, "non-namespace");
    expect_render_error("{{ 9223372036854775807 + 1 }}", NULL, JINJA_ERR_RENDER, "overflow");
    expect_render_error("{{ '%s %s' % 'one' }}", NULL, JINJA_ERR_RENDER, "not enough arguments");
    expect_render_error("{{ '%99999999d' % 1 }}", NULL, JINJA_ERR_LIMIT, "above 999");
    expect("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}", NULL, "[9223372036854775800, 9223372036854775805]");
    expect("{{ range(-9223372036854775806, -9223372036854775807, -1) | list }} {{ [1, 2, 3][9223372036854775807:] }} "
           "{{ [1, 2, 3][-9223372036854775807::-9223372036854775807] }} {{ 'abc'[::-9223372036854775807] }}", NULL,
           "[-9223372036854775806] [] [] c");
}

static void test_bounds(void **state) {
    (void)state;
    JinjaLimits lim = jinja_default_limits();
    lim.max_loop_iterations = 1000;
    JinjaError err;
    /* Loops: nested loops multiply; the total is bounded. */
    assert_null(render_with("{% for i in range(100) %}{% for j in range(100) %}x{% endfor %}{% endfor %}", NULL, &lim, &err));
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "loop iterations"));
    assert_null(render_with("{% for i in range(100000000) %}{% endfor %}", NULL, &lim, &err));
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    /* Recursion: a macro calling itself. */
    lim = jinja_default_limits();
    assert_null(render_with("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, &err));
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "nested deeper"));
    /* Output size. */
    lim.max_output_bytes = 1000;
    assert_null(render_with("{% for i in range(1000) %}xx{% endfor %}", NULL, &lim, &err));
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    assert_null(render_with("{{ 'x' * 100000000 }}", NULL, &lim, &err));
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    /* Memory: quadratic string growth through a namespace. */
    lim = jinja_default_limits();
    lim.max_memory_bytes = 4u << 20;
    assert_null(render_with("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
                            NULL, &lim, &err));
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    /* A self-referencing namespace cannot make tojson recurse forever. */
    assert_null(render_with("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns.me | tojson }}", NULL, NULL, &err));
    assert_int_not_equal(err.status, JINJA_OK);
    /* Parser depth: deep nesting is refused at compile time, not by overflowing the stack. */
    char deep[40000];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 5000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 5000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    JinjaTemplate *t;
    assert_int_equal(jinja_compile(deep, strlen(deep), &t, &err), -1);
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
    k = 0;
    for (int i = 0; i < 3000; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
    assert_int_equal(jinja_compile(deep, strlen(deep), &t, &err), -1);
    /* Left-deep chains nest the tree as deeply as they are long: bounded the same way. */
    static const char *const links[] = {" + 1", " and 1", ".a", "[0]", " | trim", " if 1 else 2", " is defined"};
    for (size_t l = 0; l < sizeof links / sizeof links[0]; l++) {
        k = (size_t)snprintf(deep, sizeof deep, "{{ x");
        for (int i = 0; i < 3000; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "%s", links[l]);
        snprintf(deep + k, sizeof deep - k, " }}");
        assert_int_equal(jinja_compile(deep, strlen(deep), &t, &err), -1);
        assert_int_equal(err.status, JINJA_ERR_LIMIT);
    }
    k = 0;
    for (int i = 0; i < 3000; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "not ");
    snprintf(deep + k, sizeof deep - k, "1");
    char wrapped[40100];
    snprintf(wrapped, sizeof wrapped, "{{ %s }}", deep);
    assert_int_equal(jinja_compile(wrapped, strlen(wrapped), &t, &err), -1);
    assert_int_equal(err.status, JINJA_ERR_LIMIT);
}

static void test_reads_variable(void **state) {
    (void)state;
    JinjaTemplate *t;
    JinjaError err;
    const char *src = "{% if tools %}{{ tools | length }}{% endif %}{{ messages[0].content }}";
    assert_int_equal(jinja_compile(src, strlen(src), &t, &err), 0);
    assert_true(jinja_reads_variable(t, "tools"));
    assert_true(jinja_reads_variable(t, "messages"));
    assert_false(jinja_reads_variable(t, "documents"));
    jinja_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syntax_errors_name_construct_and_line),
        cmocka_unit_test(test_whitespace_control),
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_reads_variable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
