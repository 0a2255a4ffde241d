/*
 * chat_render.h — a chat request's prompt text: its messages (and tools) through the model's own
 * chat template.
 *
 * The template gets OpenAI-shaped messages, normalized: `developer` is rendered as `system`; an
 * assistant turn's tool_calls carry their arguments as objects (api_tools.h); tool turns carry
 * tool_call_id and the function's name. Templates with a tool syntax of their own (tool_format.h)
 * get the request's `tools` (whenever it offers any, tool_choice "none" included, so a conversation
 * keeps its prompt prefix and cache from turn to turn) and render calls and results themselves. In
 * generic mode (a template without one) Braid writes the tools into the system turn, an assistant
 * turn's calls as the JSON object the model is asked to produce, and a tool result as a user turn
 * holding {"tool_response": {"name", "content"}}, so any template renders a tool conversation.
 * Rendering ends with the assistant's turn opener (add_generation_prompt).
 *
 * Called on the HTTP thread (http_choices.c, http_directives.c). Pure over its inputs; the text is
 * malloc'd and owned by the caller.
 */
#ifndef BRAID_COORD_CHAT_RENDER_H
#define BRAID_COORD_CHAT_RENDER_H

#include "coord/api/tool_format.h"
#include "coord/api/api_request.h"
#include "model/chat_template.h"

/* The prompt for the first n_messages of a's messages, or NULL with e set (400 naming messages when
 * the template fails or raises, 503 when out of memory). */
char *api_chat_render(const ChatTemplate *t, ToolSyntax syntax, const ApiRequest *a, int n_messages, ApiError *e);

/* The tool syntax of the served model's template. */
ToolSyntax api_chat_tool_syntax(const ChatTemplate *t);

#endif
