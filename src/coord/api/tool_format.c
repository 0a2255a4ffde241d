/* Tool-call syntaxes and output grammars; the contract is in tool_format.h. */
#include "coord/api/tool_format.h"

#include <stdlib.h>
#include <string.h>

#include "coord/api/api_tools.h"
#include "grammar/grammar.h"

ToolSyntax tool_syntax_detect(const char *src) {
    if (!src) return TOOL_SYNTAX_GENERIC;
    if (strstr(src, "<tool_call>")) return TOOL_SYNTAX_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return TOOL_SYNTAX_MISTRAL;
    /* Llama 3.1+ templates print <|python_tag|> for built-in tools, and list custom tools as JSON
     * with "parameters"; a Llama-3 template that never mentions tools has no syntax to follow. */
    if (strstr(src, "<|python_tag|>") || (strstr(src, "<|start_header_id|>") && strstr(src, "tools"))) return TOOL_SYNTAX_LLAMA3;
    return TOOL_SYNTAX_GENERIC;
}

const char *tool_syntax_name(ToolSyntax s) {
    switch (s) {
    case TOOL_SYNTAX_HERMES: return "hermes";
    case TOOL_SYNTAX_LLAMA3: return "llama3";
    case TOOL_SYNTAX_MISTRAL: return "mistral";
    default: return "generic";
    }
}

/* ---- schemas ---- */

static const json_t *tool_function(const ApiRequest *a, size_t i) { return json_object_get(json_array_get(a->tools, i), "function"); }

/* One call of one tool: {"name": <const>, <args_key>: <its parameters>}. A tool without parameters
 * takes an empty object. */
static json_t *call_schema(const json_t *fn, const char *args_key) {
    const json_t *params = json_object_get(fn, "parameters");
    json_t *args = params && !json_is_null(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    return json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s]}", "type", "object", "properties", "name", "const", json_object_get(fn, "name"),
                     args_key, args, "required", "name", args_key);
}

/* A call of any tool the request allows (only the named one under a named tool_choice). */
static json_t *calls_schema(const ApiRequest *a, const char *args_key) {
    json_t *alternatives = json_array();
    for (size_t i = 0; alternatives && i < json_array_size(a->tools); i++) {
        const json_t *fn = tool_function(a, i);
        if (a->tool_choice == API_TOOL_CHOICE_NAMED && strcmp(json_string_value(json_object_get(fn, "name")), a->tool_choice_name) != 0)
            continue;
        json_array_append_new(alternatives, call_schema(fn, args_key));
    }
    if (json_array_size(alternatives) == 1) {
        json_t *only = json_incref(json_array_get(alternatives, 0));
        json_decref(alternatives);
        return only;
    }
    return alternatives ? json_pack("{s:o}", "anyOf", alternatives) : NULL;
}

static int max_calls(const ApiRequest *a) { return a->parallel_tool_calls ? TOOL_MAX_PARALLEL_CALLS : 1; }

/* What a direct answer holds: the response_format's value, or text. */
static json_t *response_value_schema(const ApiRequest *a) {
    if (a->response_format == API_FORMAT_JSON_SCHEMA) return json_deep_copy(a->response_schema);
    return json_pack("{s:s}", "type", a->response_format == API_FORMAT_JSON_OBJECT ? "object" : "string");
}

/* Generic mode: {"tool_calls": [...]} under required / named, {"response": ...} under none, either
 * under auto. */
static json_t *generic_spec(const ApiRequest *a) {
    json_t *answer = json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "response", response_value_schema(a), "required",
                               "response", "additionalProperties", 0);
    if (a->tool_choice == API_TOOL_CHOICE_NONE) return answer ? json_pack("{s:o}", "schema", answer) : NULL;
    json_t *calls = json_pack("{s:s, s:{s:{s:s, s:o, s:i, s:i}}, s:[s], s:b}", "type", "object", "properties", "tool_calls", "type", "array",
                              "items", calls_schema(a, "arguments"), "minItems", 1, "maxItems", max_calls(a), "required", "tool_calls",
                              "additionalProperties", 0);
    if (a->tool_choice != API_TOOL_CHOICE_AUTO) {
        json_decref(answer);
        return calls ? json_pack("{s:o}", "schema", calls) : NULL;
    }
    return calls && answer ? json_pack("{s:{s:[o, o]}}", "schema", "anyOf", calls, answer) : NULL;
}

/* Native syntaxes, a call forced (required or named). */
static json_t *native_spec(ToolSyntax s, const ApiRequest *a) {
    switch (s) {
    case TOOL_SYNTAX_HERMES:
        return json_pack("{s:s, s:o, s:s, s:i, s:i, s:s}", "prefix", "<tool_call>\n", "schema", calls_schema(a, "arguments"), "suffix",
                         "\n</tool_call>", "min_items", 1, "max_items", max_calls(a), "separator", "\n");
    case TOOL_SYNTAX_LLAMA3:
        /* Llama 3.1 makes one call per turn in its JSON form. */
        return json_pack("{s:o}", "schema", calls_schema(a, "parameters"));
    case TOOL_SYNTAX_MISTRAL:
        return json_pack("{s:s, s:{s:s, s:o, s:i, s:i}}", "prefix", "[TOOL_CALLS]", "schema", "type", "array", "items",
                         calls_schema(a, "arguments"), "minItems", 1, "maxItems", max_calls(a));
    default: return NULL;
    }
}

static json_t *format_spec(const ApiRequest *a) {
    if (a->response_format == API_FORMAT_JSON_OBJECT) return json_pack("{s:{s:s}}", "schema", "type", "object");
    if (a->response_format == API_FORMAT_JSON_SCHEMA) return json_pack("{s:O}", "schema", a->response_schema);
    return NULL;
}

/* ---- the request's grammar ---- */

static int finish_spec(json_t *spec, const char *param, char **out, ApiError *e) {
    char *text = json_dumps(spec, JSON_COMPACT);
    json_decref(spec);
    if (!text) return api_error_set(e, 503, NULL, NULL, "the server is out of memory; retry shortly");
    char why[256];
    if (grammar_spec_check(text, strlen(text), why, sizeof why)) {
        free(text);
        return api_error_set(e, 400, param, NULL, "%s cannot be constrained: %s", param, why);
    }
    *out = text;
    return 0;
}

int tool_format_grammar(ToolSyntax s, const ApiRequest *a, char **spec, ApiError *e) {
    *spec = NULL;
    /* No tools, or a native syntax that may not call: only the response_format constrains. */
    if (!api_tools_offered(a) || (s != TOOL_SYNTAX_GENERIC && a->tool_choice == API_TOOL_CHOICE_NONE)) {
        json_t *f = format_spec(a);
        return f ? finish_spec(f, "response_format", spec, e) : 0;
    }
    if (s == TOOL_SYNTAX_GENERIC) {
        json_t *g = generic_spec(a);
        return g ? finish_spec(g, "tools", spec, e) : api_error_set(e, 503, NULL, NULL, "the server is out of memory; retry shortly");
    }
    if (a->tool_choice == API_TOOL_CHOICE_AUTO && a->response_format != API_FORMAT_TEXT)
        return api_error_set(e, 400, "response_format", NULL,
                             "a JSON response_format together with tools under tool_choice \"auto\" cannot be constrained for this "
                             "model's %s tool syntax; send tool_choice \"none\" or \"required\"", tool_syntax_name(s));
    /* Under auto, text is free; a call, once its opening marker appears, follows the grammar (a lazy
     * grammar). Llama 3's calls open with a bare '{', which ordinary text may hold: left free. */
    if (a->tool_choice == API_TOOL_CHOICE_AUTO && s == TOOL_SYNTAX_LLAMA3) return 0;
    json_t *n = native_spec(s, a);
    if (n && a->tool_choice == API_TOOL_CHOICE_AUTO)
        json_object_set_new(n, "trigger", json_string(s == TOOL_SYNTAX_HERMES ? "<tool_call>" : "[TOOL_CALLS]"));
    return n ? finish_spec(n, "tools", spec, e) : api_error_set(e, 503, NULL, NULL, "the server is out of memory; retry shortly");
}

/* ---- generic mode's instructions ---- */

char *tool_format_generic_instructions(const ApiRequest *a) {
    json_t *list = json_array();
    for (size_t i = 0; list && i < json_array_size(a->tools); i++) json_array_append(list, (json_t *)tool_function(a, i));
    char *tools = list ? json_dumps(list, JSON_INDENT(2)) : NULL;
    json_decref(list);
    if (!tools) return NULL;
    /* One text whatever tool_choice says (the grammar enforces the choice), so the prompt's prefix
     * and its cache stay the same from turn to turn. */
    const char *how = "Reply with one JSON object and nothing else. To call tools: {\"tool_calls\": [{\"name\": \"<tool name>\", "
                      "\"arguments\": {<the tool's parameters>}}]}. To answer without a tool: {\"response\": <your answer>}.";
    const char *intro = "You can call these tools (name, description and a JSON Schema of the parameters):\n";
    size_t n = strlen(intro) + strlen(tools) + strlen(how) + 3;
    char *text = malloc(n);
    if (text) {
        strcpy(text, intro);
        strcat(text, tools);
        strcat(text, "\n\n");
        strcat(text, how);
    }
    free(tools);
    return text;
}
