/*
 * tool_format.h — how the served model writes tool calls, and the grammar a request's output follows.
 *
 * The tool-call syntax comes from the model's own chat template (its Jinja text):
 *   hermes   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen2.5/3, Hermes, ChatML
 *            templates that print <tool_call>);
 *   llama3   `{"name": ..., "parameters": {...}}`, optionally after <|python_tag|> (Llama 3.1+);
 *   mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
 *   generic  any template without tool syntax of its own (the default SmolLM2's, for one): the tools
 *            are described in the system turn by Braid, and the model answers with one JSON object,
 *            `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": ...}`, which
 *            grammar-constrained decoding guarantees (llama.cpp's generic mode works the same way).
 * The grammar spec (grammar.h's JSON form) constrains: response_format json_object / json_schema;
 * tool_choice "required" or a named function (the call's wrapper, name and arguments schema); in
 * generic mode also "auto" (a tool call or a response) and "none" (a response). Under "auto", hermes and mistral
 * text is free until the call's opening marker, after which the call follows the grammar (a lazy
 * grammar); llama3's calls open with a bare '{' and stay free. Answers are parsed afterwards
 * (tool_parse.h).
 *
 * Pure functions over the request; any thread. Returned strings are malloc'd and owned by the caller.
 */
#ifndef BRAID_COORD_TOOL_FORMAT_H
#define BRAID_COORD_TOOL_FORMAT_H

#include <stdbool.h>

#include "coord/api/api_request.h"

typedef enum { TOOL_SYNTAX_GENERIC = 0, TOOL_SYNTAX_HERMES, TOOL_SYNTAX_LLAMA3, TOOL_SYNTAX_MISTRAL } ToolSyntax;

/* Most calls one answer may make when parallel_tool_calls is true (one when false). */
#define TOOL_MAX_PARALLEL_CALLS 8

/* The syntax a chat template's text implies (NULL: no template, generic). */
ToolSyntax tool_syntax_detect(const char *template_source);
const char *tool_syntax_name(ToolSyntax s);

/* The grammar spec the request's output must follow, as malloc'd JSON text in *spec, or NULL when
 * the output is free. Returns 0, or -1 with e set: a 400 naming the tool or field whose schema the
 * grammar compiler refuses, or a combination Braid cannot constrain. */
int tool_format_grammar(ToolSyntax s, const ApiRequest *a, char **spec, ApiError *e);

/* Generic mode: the system-turn text that describes the request's tools and the reply's shape
 * (malloc'd; NULL when out of memory). */
char *tool_format_generic_instructions(const ApiRequest *a);

#endif
