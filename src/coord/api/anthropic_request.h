/*
 * anthropic_request.h — parses and validates the body of an Anthropic Messages API request
 * (POST /v1/messages, POST /v1/messages/count_tokens) into the same ApiRequest the OpenAI chat
 * path uses, so templating, tool calls (api_tools.h, tool_format.h, tool_parse.h), cache_control
 * pins (http_directives.h) and sampling run through one machinery.
 *
 * Translation (one Anthropic body → one OpenAI-shaped chat body → api_request_parse):
 *   system (a string or text blocks)        → a leading system message (blocks joined by "\n\n")
 *   user text blocks                        → a user message (consecutive blocks joined by "\n\n")
 *   user tool_result blocks                 → one tool message each (tool_call_id = tool_use_id,
 *                                             name = the tool_use's name; is_error prefixes "Error: ")
 *   assistant text + tool_use blocks        → one assistant message with content and tool_calls
 *   tools [{name, description, input_schema}] → OpenAI function tools
 *   tool_choice {auto|any|tool|none}        → "auto" | "required" | a named function | "none";
 *                                             disable_parallel_tool_use → parallel_tool_calls false
 *   max_tokens (required for /v1/messages), stop_sequences (≤ API_MAX_STOPS), temperature [0, 1],
 *   top_p (0, 1], top_k ≥ 0, stream, metadata.user_id (→ user). Braid's own labels (workflow_id,
 *   agent, tenant, adapter) and cache_id pass through as in the OpenAI body.
 * cache_control {"type": "ephemeral", "ttl": "5m" | "1h"} may sit on tools, system blocks and
 * message blocks, or at the top level (automatic caching: a breakpoint on the last block): at most ANTHROPIC_MAX_BREAKPOINTS in all, and in request order (tools, system,
 * messages) no 1h breakpoint after a 5m one, as Anthropic requires. Each becomes a cache_control
 * pin on the message that holds its block (a tools breakpoint: on the system message, else on the
 * first message, where the tools are rendered): the pin runs through the end of that message, so a
 * breakpoint on a block that is not its message's last one pins the rest of the message too.
 * Everything a client can get wrong is a 400 whose message names the field: unknown top-level
 * fields, an unknown block type (image, document, thinking ...), a tool_use outside an assistant
 * turn or a tool_result outside a user turn, a final assistant turn (prefill is not supported),
 * server tools, a malformed cache_control. Errors the OpenAI parser finds afterwards in the
 * translated body (a tool schema it cannot compile, a tool_result answering no tool_use) keep its
 * message. Anthropic's error shape is anthropic_response.h's job.
 *
 * Thread-safety: pure; any thread. Memory: *out as api_request_parse leaves it (api_request_free).
 */
#ifndef BRAID_COORD_ANTHROPIC_REQUEST_H
#define BRAID_COORD_ANTHROPIC_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

#include "coord/api/api_request.h"

#define ANTHROPIC_MAX_BREAKPOINTS 4 /* cache_control blocks in one request, as Anthropic allows */

typedef enum { ANTHROPIC_MESSAGES = 0, ANTHROPIC_COUNT_TOKENS = 1 } AnthropicEndpoint;

/* Parses body (len bytes) for the endpoint into *out (an API_CHAT request). translated: when not
 * NULL, gets the OpenAI-shaped chat body it was parsed from (malloc'd JSON text, the caller frees;
 * what explicit_caches_apply combines with a cache's messages). 0, or -1 with err set (status 400,
 * or 503 when out of memory), *out zeroed and *translated NULL. */
int anthropic_request_parse(const char *body, size_t len, AnthropicEndpoint endpoint, ApiRequest *out, char **translated, ApiError *err);

/* The OpenAI-shaped chat body the Anthropic body translates to (a new reference), or NULL with err
 * set. Exposed for the unit tests; anthropic_request_parse is this plus api_request_parse. */
json_t *anthropic_request_translate(const json_t *body, AnthropicEndpoint endpoint, ApiError *err);

#endif
