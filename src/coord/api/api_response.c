#include "coord/api/api_response.h"

#include <jansson.h>
#include <stdlib.h>

static json_t *usage_json(const ApiUsage *u) {
    int host = u->cached_tokens_host < 0 ? 0 : u->cached_tokens_host > u->cached_tokens ? u->cached_tokens : u->cached_tokens_host;
    int remote = u->cached_tokens_remote < 0 ? 0 : u->cached_tokens_remote > u->cached_tokens ? u->cached_tokens : u->cached_tokens_remote;
    return json_pack("{s:i, s:i, s:i, s:{s:i, s:i, s:i, s:i, s:i}}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", u->cached_tokens, "cached_tokens_device", u->cached_tokens - host, "cached_tokens_host", host,
                     "cached_tokens_remote", remote, "segment_reused_tokens", u->segment_reused_tokens);
}

/* The instance's outcome list under "directive_outcomes"; a cache_control pin (index -(k + 1))
 * names its message instead of a directive. */
static void attach_outcomes(json_t *o, const ApiUsage *u) {
    if (!u->directive_outcomes || !u->directive_outcomes[0]) return;
    json_t *list = json_loads(u->directive_outcomes, 0, NULL);
    if (!json_is_array(list)) {
        json_decref(list);
        return;
    }
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        json_int_t index = json_integer_value(json_object_get(item, "index"));
        if (index >= 0) continue;
        if (index == API_RETENTION_OUTCOME_INDEX) { /* prompt_cache_retention's pin (cache_retention.h) */
            json_object_del(item, "index");
            json_object_set_new(item, "source", json_string("prompt_cache_retention"));
            continue;
        }
        json_object_del(item, "index");
        json_object_set_new(item, "source", json_string("cache_control"));
        json_object_set_new(item, "message", json_integer(-index - 1));
    }
    json_object_set_new(o, "directive_outcomes", list);
}

static json_t *head_json(const ApiResponseHead *h, bool chunk) {
    const char *object = h->kind == API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", h->id, "object", object, "created", (json_int_t)h->created, "model", h->model);
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* A whole answer's message: content (null when the answer is only tool calls) and tool_calls. */
static json_t *message_json(const ApiChoice *c) {
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", c->text ? json_stringn(c->text, c->len) : json_null());
    if (m && c->tool_calls && json_array_size(c->tool_calls) > 0) json_object_set(m, "tool_calls", (json_t *)c->tool_calls);
    return m;
}

/* A chunk's tool-call deltas: each call whole, with its index, as the official clients reassemble them. */
static json_t *tool_call_deltas(const json_t *calls) {
    json_t *list = json_array();
    for (size_t i = 0; list && i < json_array_size(calls); i++) {
        json_t *call = json_deep_copy(json_array_get(calls, i));
        if (call) json_object_set_new(call, "index", json_integer((json_int_t)i));
        json_array_append_new(list, call);
    }
    return list;
}

static json_t *finish_json(const char *finish_reason) { return finish_reason ? json_string(finish_reason) : json_null(); }

static json_t *logprobs_json(json_t *logprobs) { return logprobs ? logprobs : json_null(); }

char *api_response_full(const ApiResponseHead *h, const ApiChoice *choices, int n, const ApiUsage *u) {
    json_t *o = head_json(h, false), *list = json_array();
    for (int i = 0; i < n; i++) {
        const ApiChoice *c = &choices[i];
        json_t *choice = json_object();
        if (h->kind == API_CHAT) json_object_set_new(choice, "message", message_json(c));
        json_object_set_new(choice, "index", json_integer(c->index));
        if (h->kind == API_COMPLETION) json_object_set_new(choice, "text", json_stringn(c->text, c->len));
        json_object_set_new(choice, "logprobs", logprobs_json(c->logprobs));
        json_object_set_new(choice, "finish_reason", finish_json(c->finish_reason));
        json_array_append_new(list, choice);
    }
    json_object_set_new(o, "choices", list);
    json_object_set_new(o, "usage", usage_json(u));
    attach_outcomes(o, u);
    return dump(o);
}

char *api_response_chunk(const ApiResponseHead *h, bool with_role, const ApiChoice *c) {
    json_t *o = head_json(h, true), *choice = json_object();
    json_object_set_new(choice, "index", json_integer(c->index));
    if (h->kind == API_CHAT) {
        json_t *delta = json_object();
        if (with_role) json_object_set_new(delta, "role", json_string("assistant"));
        if (c->text && (c->len || (!c->finish_reason && !c->tool_calls))) json_object_set_new(delta, "content", json_stringn(c->text, c->len));
        if (c->tool_calls) json_object_set_new(delta, "tool_calls", tool_call_deltas(c->tool_calls));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", json_stringn(c->text, c->len));
    }
    json_object_set_new(choice, "logprobs", logprobs_json(c->logprobs));
    json_object_set_new(choice, "finish_reason", finish_json(c->finish_reason));
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return dump(o);
}

char *api_response_usage_chunk(const ApiResponseHead *h, const ApiUsage *u) {
    json_t *o = head_json(h, true);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage_json(u));
    attach_outcomes(o, u);
    return dump(o);
}
