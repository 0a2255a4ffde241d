/* Tool calls: parsing a model's answer per syntax (hermes, mistral, llama3, generic), the streaming
 * rule (what streams early is always a prefix of the parsed content), syntax detection from the
 * template's text, and the grammar each request's tools and response_format make. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/tool_format.h"
#include "coord/api/tool_parse.h"
#include "coord/api/api_request.h"
#include "grammar/grammar.h"

static ToolParse parse(ToolSyntax s, const char *text, int max_calls) {
    ToolParse p;
    assert_int_equal(tool_parse(s, text, strlen(text), max_calls, 42, &p), 0);
    return p;
}

static const char *call_name(const ToolParse *p, size_t i) {
    return json_string_value(json_object_get(json_object_get(json_array_get(p->calls, i), "function"), "name"));
}

static const char *call_args(const ToolParse *p, size_t i) {
    return json_string_value(json_object_get(json_object_get(json_array_get(p->calls, i), "function"), "arguments"));
}

static const char *call_id(const ToolParse *p, size_t i) { return json_string_value(json_object_get(json_array_get(p->calls, i), "id")); }

static void test_hermes(void **state) {
    (void)state;
    ToolParse p = parse(TOOL_SYNTAX_HERMES,
                        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
                        8);
    assert_string_equal(p.content, "Let me check.");
    assert_int_equal(json_array_size(p.calls), 2);
    assert_string_equal(call_name(&p, 0), "get_weather");
    assert_string_equal(call_args(&p, 0), "{\"city\":\"Paris\"}");
    assert_string_equal(call_name(&p, 1), "get_time");
    assert_string_equal(call_args(&p, 1), "{}");
    assert_int_equal(strncmp(call_id(&p, 0), "call_", 5), 0);
    assert_int_equal(strlen(call_id(&p, 0)), 29);
    assert_string_not_equal(call_id(&p, 0), call_id(&p, 1));
    assert_string_equal(json_string_value(json_object_get(json_array_get(p.calls, 0), "type")), "function");
    tool_parse_free(&p);

    /* parallel_tool_calls false keeps the first call */
    p = parse(TOOL_SYNTAX_HERMES, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>", 1);
    assert_null(p.content);
    assert_int_equal(json_array_size(p.calls), 1);
    assert_string_equal(call_name(&p, 0), "a");
    tool_parse_free(&p);

    /* a block that is not a call stays text; no call: the answer is the text exactly */
    const char *broken = "Sure <tool_call>{\"name\": oops}</tool_call> ";
    p = parse(TOOL_SYNTAX_HERMES, broken, 8);
    assert_null(p.calls);
    assert_string_equal(p.content, broken);
    tool_parse_free(&p);

    /* Qwen2.5-Coder's habit: the call's JSON without the tags, possibly in a fence */
    p = parse(TOOL_SYNTAX_HERMES, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", 8);
    assert_null(p.content);
    assert_string_equal(call_args(&p, 0), "{\"city\":\"Paris\"}");
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_HERMES, "```json\n{\"name\": \"f\", \"arguments\": {}}\n```", 8);
    assert_int_equal(json_array_size(p.calls), 1);
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_HERMES, "{\"answer\": 42}", 8); /* JSON that is not a call stays text */
    assert_null(p.calls);
    tool_parse_free(&p);

    /* an unclosed block cut by max_tokens still yields its whole call */
    p = parse(TOOL_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}", 8);
    assert_int_equal(json_array_size(p.calls), 1);
    assert_string_equal(call_args(&p, 0), "{\"x\":[1,2]}");
    tool_parse_free(&p);
}

static void test_mistral_llama3_generic(void **state) {
    (void)state;
    ToolParse p = parse(TOOL_SYNTAX_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"g\", \"arguments\": {}}]", 8);
    assert_null(p.content);
    assert_int_equal(json_array_size(p.calls), 2);
    assert_int_equal(strlen(call_id(&p, 0)), 9); /* Mistral's templates check nine alphanumerics */
    tool_parse_free(&p);

    p = parse(TOOL_SYNTAX_LLAMA3, "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"braid\"}}", 8);
    assert_int_equal(json_array_size(p.calls), 1);
    assert_string_equal(call_args(&p, 0), "{\"query\":\"braid\"}");
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_LLAMA3, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}", 8);
    assert_int_equal(json_array_size(p.calls), 2);
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_LLAMA3, "The answer is {42}.", 8);
    assert_null(p.calls);
    assert_string_equal(p.content, "The answer is {42}.");
    tool_parse_free(&p);

    p = parse(TOOL_SYNTAX_GENERIC, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]}", 8);
    assert_null(p.content);
    assert_string_equal(call_args(&p, 0), "{\"city\":\"Oslo\"}");
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_GENERIC, "{\"response\": \"It is sunny.\"}", 8);
    assert_null(p.calls);
    assert_string_equal(p.content, "It is sunny.");
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_GENERIC, "{\"response\": {\"a\": 1}}", 8);
    assert_string_equal(p.content, "{\"a\":1}");
    tool_parse_free(&p);
    p = parse(TOOL_SYNTAX_GENERIC, "{\"tool_calls\": [{\"na", 8); /* cut short: kept as text */
    assert_null(p.calls);
    assert_string_equal(p.content, "{\"tool_calls\": [{\"na");
    tool_parse_free(&p);
}

/* Whatever streams before the end is a prefix of the content the whole answer parses to, and what
 * streams never shrinks as the text grows. */
static void test_streaming_prefix_rule(void **state) {
    (void)state;
    static const struct {
        ToolSyntax s;
        const char *text;
    } cases[] = {
        {TOOL_SYNTAX_HERMES, "  Checking the weather now.\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>\n"},
        {TOOL_SYNTAX_HERMES, "Plain answer with <tool but no call."},
        {TOOL_SYNTAX_HERMES, "<tool_call>{\"name\": \"w\", \"arguments\": {}}</tool_call> and after"},
        {TOOL_SYNTAX_HERMES, "{\"name\": \"w\", \"arguments\": {}}"},
        {TOOL_SYNTAX_MISTRAL, "Thinking... [TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}]"},
        {TOOL_SYNTAX_LLAMA3, "{\"name\": \"w\", \"parameters\": {}}"},
        {TOOL_SYNTAX_LLAMA3, "Hello there, friend."},
        {TOOL_SYNTAX_GENERIC, "{\"response\": \"hi\"}"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *t = cases[c].text;
        size_t len = strlen(t), prev = 0;
        ToolParse p = parse(cases[c].s, t, 8);
        for (size_t n = 0; n <= len; n++) {
            size_t safe = tool_parse_streamable(cases[c].s, t, n);
            assert_true(safe <= n);
            assert_true(safe >= prev);
            prev = safe;
            if (safe > 0) {
                if (!p.content || p.content_len < safe || memcmp(p.content, t, safe) != 0)
                    fail_msg("case %zu: %zu bytes streamed at length %zu are not a prefix of the parsed content", c, safe, n);
            }
        }
        tool_parse_free(&p);
    }
}

static void test_syntax_detection(void **state) {
    (void)state;
    assert_int_equal(tool_syntax_detect(NULL), TOOL_SYNTAX_GENERIC);
    assert_int_equal(tool_syntax_detect("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"), TOOL_SYNTAX_GENERIC);
    assert_int_equal(tool_syntax_detect("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"), TOOL_SYNTAX_HERMES);
    assert_int_equal(tool_syntax_detect("[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]"), TOOL_SYNTAX_MISTRAL);
    assert_int_equal(tool_syntax_detect("<|start_header_id|>{% if tools %}{{ tools }}{% endif %}<|python_tag|>"), TOOL_SYNTAX_LLAMA3);
}

/* The grammar each combination makes; every spec made must pass the compiler's check. */
static char *grammar_of(ToolSyntax s, const char *body, int expect_rc) {
    ApiRequest a;
    ApiError e;
    if (api_request_parse(body, strlen(body), API_CHAT, NULL, &a, &e)) fail_msg("body refused: %s", e.message);
    char *spec = NULL;
    int rc = tool_format_grammar(s, &a, &spec, &e);
    api_request_free(&a);
    assert_int_equal(rc, expect_rc);
    if (spec) {
        char why[256];
        assert_int_equal(grammar_spec_check(spec, strlen(spec), why, sizeof why), 0);
    }
    return spec;
}

#define MSGS "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOLS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]"

static void test_grammars(void **state) {
    (void)state;
    assert_null(grammar_of(TOOL_SYNTAX_HERMES, MSGS "}", 0));
    assert_null(grammar_of(TOOL_SYNTAX_HERMES, MSGS TOOLS ",\"tool_choice\":\"none\"}", 0));
    char *spec = grammar_of(TOOL_SYNTAX_GENERIC, MSGS ",\"response_format\":{\"type\":\"json_object\"}}", 0);
    assert_string_equal(spec, "{\"schema\":{\"type\":\"object\"}}");
    free(spec);
    spec = grammar_of(TOOL_SYNTAX_GENERIC, MSGS TOOLS "}", 0); /* generic auto: a call or a response */
    assert_non_null(strstr(spec, "\"anyOf\""));
    assert_non_null(strstr(spec, "\"response\""));
    assert_non_null(strstr(spec, "\"tool_calls\""));
    free(spec);
    spec = grammar_of(TOOL_SYNTAX_GENERIC, MSGS TOOLS ",\"tool_choice\":\"none\"}", 0); /* generic none: only a response */
    assert_non_null(strstr(spec, "\"response\""));
    assert_null(strstr(spec, "\"tool_calls\""));
    free(spec);
    spec = grammar_of(TOOL_SYNTAX_GENERIC, MSGS TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", 0);
    assert_null(strstr(spec, "\"response\""));
    assert_non_null(strstr(spec, "\"maxItems\":1"));
    free(spec);
    spec = grammar_of(TOOL_SYNTAX_HERMES, MSGS TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 0);
    assert_non_null(strstr(spec, "\"prefix\":\"<tool_call>\\n\""));
    assert_non_null(strstr(spec, "{\"const\":\"g\"}"));
    assert_null(strstr(spec, "{\"const\":\"f\"}"));
    assert_null(strstr(spec, "trigger"));
    free(spec);
    spec = grammar_of(TOOL_SYNTAX_HERMES, MSGS TOOLS "}", 0); /* hermes auto: lazy, from <tool_call> on */
    assert_non_null(strstr(spec, "\"trigger\":\"<tool_call>\""));
    free(spec);
    assert_null(grammar_of(TOOL_SYNTAX_LLAMA3, MSGS TOOLS "}", 0));
    spec = grammar_of(TOOL_SYNTAX_LLAMA3, MSGS TOOLS ",\"tool_choice\":\"required\"}", 0);
    assert_non_null(strstr(spec, "\"parameters\""));
    free(spec);
    spec = grammar_of(TOOL_SYNTAX_MISTRAL, MSGS TOOLS ",\"tool_choice\":\"required\"}", 0);
    assert_non_null(strstr(spec, "\"prefix\":\"[TOOL_CALLS]\""));
    free(spec);
    /* a JSON response_format beside free tool text cannot be constrained for a native syntax */
    assert_null(grammar_of(TOOL_SYNTAX_HERMES, MSGS TOOLS ",\"response_format\":{\"type\":\"json_object\"}}", -1));
    spec = grammar_of(TOOL_SYNTAX_GENERIC, MSGS TOOLS ",\"response_format\":{\"type\":\"json_object\"}}", 0);
    free(spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_mistral_llama3_generic),
        cmocka_unit_test(test_streaming_prefix_rule),
        cmocka_unit_test(test_syntax_detection),
        cmocka_unit_test(test_grammars),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
