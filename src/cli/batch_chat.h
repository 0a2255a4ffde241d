/*
 * batch_chat.h — a `braid batch` chat line read the way the HTTP API reads a chat request.
 *
 * A line's "messages" (with their tool parts), "tools", "tool_choice", "parallel_tool_calls" and,
 * beside tools, "response_format" go through the API's own parser (coord/api_request.h), so a
 * line is refused for exactly what a request would be (the message names the field); the prompt is
 * the model's chat template rendered as the server renders it (coord/api/chat_render.h), and the
 * tools' grammar is the server's (coord/api/tool_format.h). The answer is split into content and
 * tool calls as the server splits it (coord/api/tool_parse.h).
 *
 * Called by cmd_batch.c while it reads its input and writes its output; one thread.
 * Memory: *grammar_spec is malloc'd for the caller; BatchChatMode holds no memory.
 */
#ifndef BRAID_CLI_BATCH_CHAT_H
#define BRAID_CLI_BATCH_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coord/api/tool_format.h"
#include "model/model.h"

typedef struct {
    bool parse_tools;  /* the answer is parsed for tool calls */
    ToolSyntax syntax;
    int max_calls;
} BatchChatMode;

/* Renders and tokenizes the chat line `line`. *grammar_spec is set (malloc'd) when its tools make
 * a grammar, else left alone (a response_format without tools is cmd_batch's). Returns 0, or -1
 * with error (cap bytes) naming the field. */
int batch_chat_load(const BraidModel *m, const json_t *line, TokenList *ids, char **grammar_spec, BatchChatMode *mode, char *error,
                    size_t cap);

/* Sets the output line's "text" / "tool_calls" / "finish_reason" from the answer text when the line
 * offered tools (nothing otherwise). id_seed makes the call ids. */
void batch_chat_finish(const BatchChatMode *mode, json_t *out, const char *text, size_t len, uint64_t id_seed);

#endif
