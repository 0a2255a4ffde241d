/* A chat request's prompt through the model's template; the contract is in chat_render.h. */
#include "coord/api/chat_render.h"

#include <stdlib.h>
#include <string.h>

#include "coord/api/api_tools.h"

ToolSyntax api_chat_tool_syntax(const ChatTemplate *t) { return tool_syntax_detect(chat_template_source(t)); }

/* obj as compact JSON text in a JSON string (takes obj over); NULL when out of memory. */
static json_t *json_text_of(json_t *obj) {
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    json_t *s = text ? json_string(text) : NULL;
    free(text);
    return s;
}

/* Generic mode: an assistant turn's calls as the JSON object the model is asked to write. */
static json_t *generic_calls_text(const ApiMessage *m) {
    json_t *list = json_array();
    for (size_t i = 0; list && i < json_array_size(m->tool_calls); i++) {
        const json_t *fn = json_object_get(json_array_get(m->tool_calls, i), "function");
        json_array_append_new(list, json_pack("{s:O, s:O}", "name", json_object_get(fn, "name"), "arguments", json_object_get(fn, "arguments")));
    }
    return json_text_of(list ? json_pack("{s:o}", "tool_calls", list) : NULL);
}

static json_t *generic_tool_result(const ApiMessage *m) {
    return json_text_of(json_pack("{s:{s:s, s:s}}", "tool_response", "name", m->name ? m->name : "", "content", m->content));
}

static json_t *message_json(const ApiMessage *m, ToolSyntax syntax) {
    const char *role = strcmp(m->role, "developer") == 0 ? "system" : m->role;
    if (syntax == TOOL_SYNTAX_GENERIC && strcmp(role, "tool") == 0) return json_pack("{s:s, s:o}", "role", "user", "content", generic_tool_result(m));
    if (syntax == TOOL_SYNTAX_GENERIC && m->tool_calls) return json_pack("{s:s, s:o}", "role", role, "content", generic_calls_text(m));
    json_t *o = json_pack("{s:s, s:o}", "role", role, "content", m->content_null ? json_null() : json_string(m->content));
    if (o && m->tool_calls) json_object_set(o, "tool_calls", m->tool_calls);
    if (o && m->tool_call_id) json_object_set_new(o, "tool_call_id", json_string(m->tool_call_id));
    if (o && m->name) json_object_set_new(o, "name", json_string(m->name));
    return o;
}

/* Generic mode: the tools described at the end of the system turn (one is added when there is none). */
static int add_generic_instructions(json_t *msgs, const ApiRequest *a) {
    char *text = tool_format_generic_instructions(a);
    if (!text) return -1;
    json_t *first = json_array_get(msgs, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    int rc;
    if (role && strcmp(role, "system") == 0) {
        const char *old = json_string_value(json_object_get(first, "content"));
        size_t n = (old ? strlen(old) : 0) + strlen(text) + 3;
        char *joined = malloc(n);
        if (joined) {
            strcpy(joined, old ? old : "");
            if (old && old[0]) strcat(joined, "\n\n");
            strcat(joined, text);
        }
        rc = joined ? json_object_set_new(first, "content", json_string(joined)) : -1;
        free(joined);
    } else {
        rc = json_array_insert_new(msgs, 0, json_pack("{s:s, s:s}", "role", "system", "content", text));
    }
    free(text);
    return rc;
}

char *api_chat_render(const ChatTemplate *t, ToolSyntax syntax, const ApiRequest *a, int n_messages, ApiError *e) {
    json_t *msgs = json_array();
    int rc = msgs ? 0 : -1;
    for (int i = 0; rc == 0 && i < n_messages; i++) rc = json_array_append_new(msgs, message_json(&a->messages[i], syntax));
    bool tools = api_tools_offered(a);
    if (rc == 0 && tools && syntax == TOOL_SYNTAX_GENERIC) rc = add_generic_instructions(msgs, a);
    if (rc) {
        json_decref(msgs);
        api_error_set(e, 503, NULL, NULL, "the server is out of memory; retry shortly");
        return NULL;
    }
    BraidError err;
    char *text = chat_template_render_json(t, msgs, tools && syntax != TOOL_SYNTAX_GENERIC ? a->tools : NULL, true, &err);
    json_decref(msgs);
    if (!text) api_error_set(e, 400, "messages", NULL, "cannot apply the chat template: %s", err.msg);
    return text;
}
