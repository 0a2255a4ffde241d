/* Anthropic Messages response bodies and events; the contract is in anthropic_response.h. */
#include "coord/api/anthropic_response.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PINS 16 /* cache_control pins one request carries (4), with room to spare */

/* ---- usage ---- */

typedef struct {
    int tokens;
    bool long_lived; /* ttl of an hour or more: Anthropic's "1h" */
} PinSpan;

/* The request's cache_control pins that took effect (index < 0: cache_control, not a directive). */
static int read_pins(const char *outcomes, PinSpan *pins) {
    json_t *list = outcomes && outcomes[0] ? json_loads(outcomes, 0, NULL) : NULL;
    int n = 0;
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        const char *op = json_string_value(json_object_get(item, "op")), *outcome = json_string_value(json_object_get(item, "outcome"));
        json_int_t index = json_integer_value(json_object_get(item, "index")), tokens = json_integer_value(json_object_get(item, "tokens"));
        bool took = outcome && (strcmp(outcome, "accepted") == 0 || strcmp(outcome, "clipped") == 0);
        if (n == MAX_PINS || index >= 0 || !op || strcmp(op, "pin") != 0 || !took || tokens <= 0) continue;
        pins[n++] = (PinSpan){.tokens = (int)tokens, .long_lived = json_number_value(json_object_get(item, "ttl_s")) >= 3600};
    }
    json_decref(list);
    return n;
}

static int by_end(const void *a, const void *b) {
    const PinSpan *x = a, *y = b;
    if (x->tokens != y->tokens) return x->tokens < y->tokens ? -1 : 1;
    return (int)y->long_lived - (int)x->long_lived; /* at the same end the longer-lived pin counts */
}

AnthropicUsage anthropic_usage_from(const ApiUsage *u) {
    AnthropicUsage a = {.output_tokens = u->completion_tokens};
    int prompt = u->prompt_tokens > 0 ? u->prompt_tokens : 0, cached = u->cached_tokens;
    if (cached < 0) cached = 0;
    if (cached > prompt) cached = prompt;
    a.cache_read_input_tokens = cached;
    PinSpan pins[MAX_PINS];
    int n = read_pins(u->directive_outcomes, pins);
    qsort(pins, (size_t)n, sizeof *pins, by_end);
    /* Tokens past the cached prefix that a pin now holds were computed here and written to the
     * cache: each counts once, under the first pin that covers it. */
    int covered = cached;
    for (int i = 0; i < n; i++) {
        int end = pins[i].tokens < prompt ? pins[i].tokens : prompt;
        if (end <= covered) continue;
        if (pins[i].long_lived) a.ephemeral_1h_input_tokens += end - covered;
        else a.ephemeral_5m_input_tokens += end - covered;
        covered = end;
    }
    a.cache_creation_input_tokens = a.ephemeral_5m_input_tokens + a.ephemeral_1h_input_tokens;
    a.input_tokens = prompt - cached - a.cache_creation_input_tokens;
    return a;
}

json_t *anthropic_usage_json(const AnthropicUsage *u) {
    return json_pack("{s:i, s:i, s:i, s:{s:i, s:i}, s:i}", "input_tokens", u->input_tokens, "cache_creation_input_tokens",
                     u->cache_creation_input_tokens, "cache_read_input_tokens", u->cache_read_input_tokens, "cache_creation",
                     "ephemeral_5m_input_tokens", u->ephemeral_5m_input_tokens, "ephemeral_1h_input_tokens", u->ephemeral_1h_input_tokens,
                     "output_tokens", u->output_tokens);
}

/* ---- the message ---- */

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* A call's arguments (JSON text) as an object; {} when they do not parse to one. */
static json_t *call_input(const json_t *call) {
    const char *args = json_string_value(json_object_get(json_object_get(call, "function"), "arguments"));
    json_t *input = args ? json_loads(args, 0, NULL) : NULL;
    if (json_is_object(input)) return input;
    json_decref(input);
    return json_object();
}

json_t *anthropic_tool_use_block(const json_t *call) {
    const json_t *id = json_object_get(call, "id"), *name = json_object_get(json_object_get(call, "function"), "name");
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", json_string_value(id) ? json_string_value(id) : "",
                     "name", json_string_value(name) ? json_string_value(name) : "", "input", call_input(call));
}

static json_t *content_blocks(const AnthropicAnswer *a) {
    json_t *blocks = json_array();
    size_t n_calls = json_array_size(a->tool_calls);
    bool text = a->text && a->len > 0;
    if (blocks && (text || n_calls == 0) &&
        json_array_append_new(blocks, json_pack("{s:s, s:s%}", "type", "text", "text", a->text ? a->text : "", text ? a->len : 0)))
        json_decref(blocks), blocks = NULL;
    for (size_t i = 0; blocks && i < n_calls; i++)
        if (json_array_append_new(blocks, anthropic_tool_use_block(json_array_get(a->tool_calls, i)))) json_decref(blocks), blocks = NULL;
    return blocks;
}

static json_t *nullable_string(const char *s) { return s ? json_string(s) : json_null(); }

char *anthropic_message_json(const AnthropicAnswer *a, const AnthropicUsage *u) {
    return dump(json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", a->id, "type", "message", "role", "assistant", "model", a->model,
                          "content", content_blocks(a), "stop_reason", a->stop_reason, "stop_sequence", nullable_string(a->stop_sequence),
                          "usage", anthropic_usage_json(u)));
}

char *anthropic_count_json(int input_tokens) { return dump(json_pack("{s:i}", "input_tokens", input_tokens)); }

/* ---- streaming events ---- */

/* "event: <type>\ndata: <json>\n\n" of o (taken over); type is o's own "type". */
static char *event(json_t *o) {
    char *data = dump(json_incref(o)), *out = NULL;
    const char *type = json_string_value(json_object_get(o, "type"));
    if (data && type) {
        size_t n = strlen(data) + strlen(type) + 20;
        if ((out = malloc(n))) snprintf(out, n, "event: %s\ndata: %s\n\n", type, data);
    }
    free(data);
    json_decref(o);
    return out;
}

char *anthropic_event_message_start(const char *id, const char *model, int prompt_tokens) {
    json_t *usage = json_pack("{s:i, s:n, s:n, s:i}", "input_tokens", prompt_tokens, "cache_creation_input_tokens",
                              "cache_read_input_tokens", "output_tokens", 0);
    return event(json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}", "type", "message_start", "message", "id", id, "type",
                           "message", "role", "assistant", "model", model, "content", "stop_reason", "stop_sequence", "usage", usage));
}

char *anthropic_event_ping(void) { return event(json_pack("{s:s}", "type", "ping")); }

char *anthropic_event_text_start(int index) {
    return event(json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", index, "content_block", "type", "text", "text", ""));
}

char *anthropic_event_text_delta(int index, const char *text, size_t len) {
    return event(json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta", "index", index, "delta", "type", "text_delta", "text",
                           text, len));
}

char *anthropic_event_tool_start(int index, const json_t *call) {
    json_t *block = anthropic_tool_use_block(call);
    if (block) json_object_set_new(block, "input", json_object());
    return event(json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", index, "content_block", block));
}

char *anthropic_event_input_json_delta(int index, const json_t *call) {
    char *input = dump(call_input(call));
    json_t *o = input ? json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", index, "delta", "type",
                                  "input_json_delta", "partial_json", input)
                      : NULL;
    free(input);
    return event(o);
}

char *anthropic_event_block_stop(int index) { return event(json_pack("{s:s, s:i}", "type", "content_block_stop", "index", index)); }

char *anthropic_event_message_delta(const char *stop_reason, const char *stop_sequence, const AnthropicUsage *u) {
    return event(json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason", stop_reason, "stop_sequence",
                           nullable_string(stop_sequence), "usage", anthropic_usage_json(u)));
}

char *anthropic_event_message_stop(void) { return event(json_pack("{s:s}", "type", "message_stop")); }

/* ---- errors ---- */

const char *anthropic_error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    }
    return status >= 500 ? "api_error" : "invalid_request_error";
}

static json_t *error_object(const ApiError *e) {
    /* The message is made valid UTF-8 the way the OpenAI renderer does it: reuse its output. */
    char *oai = api_error_json(e);
    json_t *parsed = oai ? json_loads(oai, 0, NULL) : NULL;
    free(oai);
    const json_t *message = json_object_get(json_object_get(parsed, "error"), "message");
    const char *text = json_string_value(message);
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", anthropic_error_type(e->status), "message",
                          text ? text : "");
    json_decref(parsed);
    return o;
}

char *anthropic_error_json(const ApiError *e) { return dump(error_object(e)); }

char *anthropic_event_error(const ApiError *e) { return event(error_object(e)); }
