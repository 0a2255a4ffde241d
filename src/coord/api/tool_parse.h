/*
 * tool_parse.h — a model's answer split into content and OpenAI tool calls, whole or as it streams.
 *
 * One parser per syntax (tool_format.h): hermes finds `<tool_call>…</tool_call>` blocks (or, as
 * Qwen2.5-Coder writes them, a reply that is only bare `{"name", "arguments"}` objects), mistral the
 * JSON list after `[TOOL_CALLS]`, llama3 a reply that is one or more `{"name", "parameters"}` objects
 * (after an optional <|python_tag|>), generic the one JSON object `{"tool_calls": […]}` or
 * `{"response": …}`. A block that does not parse as a call stays in the content, so nothing the model
 * wrote is lost. Calls get ids (`call_…`; nine alphanumerics for mistral, whose templates check that)
 * derived from id_seed, and `arguments` as a compact JSON string, as OpenAI sends them. With calls,
 * content is the text outside them with trailing whitespace cut, or NULL when only whitespace.
 *
 * Streaming: tool_parse_streamable says how many leading bytes of the text so far can go to the
 * client as content already: never a byte that could belong to a call. The parse of the whole text
 * at the end has content beginning with whatever was streamed, so the rest is its suffix.
 *
 * Pure; any thread. A ToolParse owns its content and calls (tool_parse_free).
 */
#ifndef BRAID_COORD_TOOL_PARSE_H
#define BRAID_COORD_TOOL_PARSE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "coord/api/tool_format.h"

typedef struct {
    char *content;      /* malloc'd, NUL-terminated; NULL when the answer is only tool calls */
    size_t content_len;
    json_t *calls;      /* [{id, type: "function", function: {name, arguments (string)}}], NULL when none */
} ToolParse;

/* Parses text[0, len). max_calls bounds the calls kept (the first ones). Returns 0, or -1 when out
 * of memory. */
int tool_parse(ToolSyntax s, const char *text, size_t len, int max_calls, uint64_t id_seed, ToolParse *out);
void tool_parse_free(ToolParse *p);

/* How many leading bytes of the text generated so far are content that no later token can turn
 * into part of a tool call. */
size_t tool_parse_streamable(ToolSyntax s, const char *text, size_t len);

#endif
