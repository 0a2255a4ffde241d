/* `braid batch` chat lines through the API's parser and renderer; the contract is in batch_chat.h. */
#include "cli/batch_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/api/chat_render.h"
#include "coord/api/tool_parse.h"
#include "coord/api/api_request.h"

/* The chat fields of a batch line, as a chat request body. */
static char *chat_body(const json_t *line) {
    static const char *const keys[] = {"messages", "tools", "tool_choice", "parallel_tool_calls"};
    json_t *body = json_object();
    for (size_t i = 0; body && i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(line, keys[i]);
        if (v) json_object_set(body, keys[i], v);
    }
    /* response_format beside tools shapes the tools' grammar (generic mode's answer); alone, the
     * batch line's own reader handles it. */
    json_t *format = json_object_get(line, "response_format");
    if (body && format && json_object_get(line, "tools")) json_object_set(body, "response_format", format);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return text;
}

int batch_chat_load(const BraidModel *m, const json_t *line, TokenList *ids, char **grammar_spec, BatchChatMode *mode, char *error,
                    size_t cap) {
    char *body = chat_body(line);
    if (!body) return snprintf(error, cap, "out of memory"), -1;
    ApiRequest a;
    ApiError e;
    int rc = api_request_parse(body, strlen(body), API_CHAT, NULL, &a, &e);
    free(body);
    if (rc) return snprintf(error, cap, "%s", e.message), -1;
    ToolSyntax syntax = api_chat_tool_syntax(&m->chat);
    char *spec = NULL, *text = api_chat_render(&m->chat, syntax, &a, a.n_messages, &e);
    if (text && tool_format_grammar(syntax, &a, &spec, &e)) {
        free(text);
        text = NULL;
    }
    BraidError err = {0};
    if (text && tokenizer_encode(&m->tokenizer, text, strlen(text), true, m->tokenizer.add_bos, ids, &err)) {
        snprintf(e.message, sizeof e.message, "%.300s", err.msg);
        free(text);
        text = NULL;
    }
    if (text && a.tools) {
        *mode = (BatchChatMode){.parse_tools = a.tool_choice != API_TOOL_CHOICE_NONE || syntax == TOOL_SYNTAX_GENERIC, .syntax = syntax,
                                .max_calls = a.parallel_tool_calls ? TOOL_MAX_PARALLEL_CALLS : 1};
        if (spec) {
            free(*grammar_spec);
            *grammar_spec = spec;
            spec = NULL;
        }
    }
    free(spec);
    api_request_free(&a);
    if (!text) return snprintf(error, cap, "%s", e.message), -1;
    free(text);
    return 0;
}

void batch_chat_finish(const BatchChatMode *mode, json_t *out, const char *text, size_t len, uint64_t id_seed) {
    if (!mode->parse_tools) return;
    ToolParse p;
    if (tool_parse(mode->syntax, text, len, mode->max_calls, id_seed, &p)) return;
    json_object_set_new(out, "text", p.content ? json_stringn(p.content, p.content_len) : json_null());
    if (p.calls) {
        json_object_set(out, "tool_calls", p.calls);
        const char *finish = json_string_value(json_object_get(out, "finish_reason"));
        if (finish && strcmp(finish, "error") != 0) json_object_set_new(out, "finish_reason", json_string("tool_calls"));
    }
    tool_parse_free(&p);
}
