/*
 * anthropic_response.h — Anthropic Messages API response bodies: the message object, the
 * streaming events (as SSE with `event:` lines), usage, and the error shape.
 *
 * Usage is computed from what the engine did (ApiUsage, as the OpenAI path reports it, and the
 * instance's outcomes of the request's cache_control pins), never from what the request asked:
 *   cache_read_input_tokens      prompt tokens served from the prefix cache (either tier);
 *   cache_creation_input_tokens  prompt tokens this request computed and a cache_control pin now
 *                                holds (the pin's accepted or clipped tokens past the cached prefix);
 *   cache_creation.ephemeral_{5m,1h}_input_tokens  the same split by the pin's TTL (a token under
 *                                two pins counts under the first, the longer-lived, one);
 *   input_tokens                 the rest of the prompt (prompt - read - creation), as Anthropic
 *                                counts it;
 *   output_tokens                generated tokens.
 * A pin the instance refused (over the tenant's pin budget, cache off) creates nothing.
 *
 * Pure formatting with jansson; any thread. Every function returning char * returns a malloc'd
 * string the caller frees (NULL when out of memory). Text must be valid UTF-8.
 */
#ifndef BRAID_COORD_ANTHROPIC_RESPONSE_H
#define BRAID_COORD_ANTHROPIC_RESPONSE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "coord/api/api_request.h"
#include "coord/api/api_response.h"

typedef struct {
    int input_tokens, cache_creation_input_tokens, cache_read_input_tokens;
    int ephemeral_5m_input_tokens, ephemeral_1h_input_tokens;
    int output_tokens;
} AnthropicUsage;

/* The Anthropic usage of a request from its engine-side usage (directive_outcomes included). */
AnthropicUsage anthropic_usage_from(const ApiUsage *u);
/* {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation": {...},
 * "output_tokens"} as a new reference (NULL when out of memory). */
json_t *anthropic_usage_json(const AnthropicUsage *u);

/* One answer: text (NULL or empty: no text block unless there are no calls either), the OpenAI
 * tool calls the answer made (borrowed; [{id, function: {name, arguments (JSON text)}}], NULL =
 * none) as tool_use blocks, stop_reason ("end_turn", "max_tokens", "stop_sequence", "tool_use")
 * and the stop sequence that matched (NULL: null). */
typedef struct {
    const char *id, *model;
    const char *text;
    size_t len;
    const json_t *tool_calls;
    const char *stop_reason, *stop_sequence;
} AnthropicAnswer;

/* A tool call's tool_use block ({type, id, name, input}); the arguments text must parse to an
 * object (tool_parse.h guarantees it), else input is {}. New reference or NULL. */
json_t *anthropic_tool_use_block(const json_t *call);
/* The whole message object. */
char *anthropic_message_json(const AnthropicAnswer *a, const AnthropicUsage *u);
/* {"input_tokens": n} for count_tokens. */
char *anthropic_count_json(int input_tokens);

/* Streaming events, each "event: <type>\ndata: <json>\n\n". message_start's usage holds the prompt's
 * token count as input_tokens and nulls for the cache fields, which the engine reports only at the
 * end; message_delta carries the final usage, every field (the official SDKs overwrite with it). */
char *anthropic_event_message_start(const char *id, const char *model, int prompt_tokens);
char *anthropic_event_ping(void);
char *anthropic_event_text_start(int index);
char *anthropic_event_text_delta(int index, const char *text, size_t len);
/* content_block_start of a tool_use block with empty input, then its input as one input_json_delta. */
char *anthropic_event_tool_start(int index, const json_t *call);
char *anthropic_event_input_json_delta(int index, const json_t *call);
char *anthropic_event_block_stop(int index);
char *anthropic_event_message_delta(const char *stop_reason, const char *stop_sequence, const AnthropicUsage *u);
char *anthropic_event_message_stop(void);
/* An error event mid-stream (the HTTP status is already sent). */
char *anthropic_event_error(const ApiError *e);

/* Anthropic's error type for an HTTP status: 400 invalid_request_error, 401 authentication_error,
 * 403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503 and
 * 529 overloaded_error, other 5xx api_error, other 4xx invalid_request_error. */
const char *anthropic_error_type(int status);
/* {"type": "error", "error": {"type": ..., "message": ...}} (the message made valid UTF-8). */
char *anthropic_error_json(const ApiError *e);

#endif
