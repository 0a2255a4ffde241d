/*
 * api_tools.h — the tool-calling and structured-output parts of an OpenAI chat request.
 *
 * Owns the validation of `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`, and of
 * the tool parts of messages: an assistant turn's `tool_calls` (normalized for chat templates, with
 * each call's `arguments` string parsed into a JSON object, as HF templates and vLLM expect), a tool
 * turn's `tool_call_id`, and `name`. Everything a client can get wrong is a 400 naming the field:
 * a tool without a valid function name, duplicate names, parameters that are not a schema object, a
 * tool_choice naming a function the request does not list, a tool message answering no earlier call,
 * arguments that are not a JSON object, a response_format schema with a keyword the grammar compiler
 * cannot honour (grammar.h names it).
 *
 * Called by api_request.c while it parses a chat body, on the HTTP thread. No shared state.
 * Memory: JSON references and strings land in the ApiRequest / ApiMessage, which own them
 * (api_request_free releases them).
 */
#ifndef BRAID_COORD_API_TOOLS_H
#define BRAID_COORD_API_TOOLS_H

#include <jansson.h>
#include <stdbool.h>

#include "coord/api/api_request.h"

#define API_MAX_TOOLS 128          /* tools in one request */
#define API_MAX_TOOL_CALLS 64      /* calls in one assistant message */
#define API_MAX_FUNCTION_NAME 64   /* OpenAI's limit on a function name */

/* Reads tools, tool_choice, parallel_tool_calls and response_format from a chat body into r. */
int api_tools_read(const json_t *body, ApiRequest *r, ApiError *err);

/* Reads tool_calls (assistant), tool_call_id (tool) and name (any role) of one message; path is
 * "messages[i]". m->role is already read. */
int api_message_read_tools(const json_t *msg, const char *path, ApiMessage *m, ApiError *err);

/* Whole-conversation checks once every message is read: each tool message answers a call an earlier
 * assistant message made (by id), and a tool message follows the calls it answers. */
int api_tools_check_conversation(const ApiRequest *r, ApiError *err);

/* Whether the request offers tools. Offered tools are rendered into the prompt whatever tool_choice
 * says, so an agent's prompt keeps its prefix (and its cache) from turn to turn; tool_choice "none"
 * only forbids calls. */
bool api_tools_offered(const ApiRequest *r);

/* Frees the tool parts of a message (api_request_free calls it). */
void api_message_free_tools(ApiMessage *m);

#endif
