/*
 * anthropic_request.c — Anthropic Messages bodies to ApiRequest; the contract is in
 * anthropic_request.h.
 *
 * Shape: the body is checked field by field against Anthropic's schema and translated into an
 * OpenAI chat body as it goes (one reader per part: system, messages, tools, tool_choice, the
 * scalars); the result goes through api_request_parse, so both dialects end in one ApiRequest and
 * one set of deeper checks. cache_control breakpoints are counted and ordered in request order
 * (tools, system, messages) while reading, and land as message-level cache_control on the
 * translated message that holds their block.
 */
#include "coord/api/api_json.h"
#include "coord/api/anthropic_request.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How much of a client-supplied name an error message quotes. */
#define QUOTE 48

/* What reading the body has gathered so far. */
typedef struct {
    json_t *msgs;           /* the translated OpenAI messages */
    json_t *tool_names;     /* tool_use id -> tool name, for the tool messages that answer them */
    int n_breakpoints;
    bool seen_5m;           /* a 5m breakpoint came earlier (a 1h one may not follow) */
    const char *tools_ttl;  /* the longest TTL on a tool's cache_control, NULL when none */
    ApiError *err;
} Translation;

static int out_of_memory(ApiError *err) { return api_error_set(err, 503, NULL, NULL, "the server is out of memory; retry shortly"); }



static int expected(ApiError *err, const char *param, const char *what, const json_t *got) {
    return api_error_set(err, 400, param, NULL, "%s: expected %s, got %s", param, what, api_json_type_name(got));
}

/* Every key of obj must be one of allowed (NULL-terminated); the first other one is a 400. A null
 * value reads as absent, as everywhere in the body (SDKs echo response blocks back with nulls). */
static int only_keys(const json_t *obj, const char *path, const char *const *allowed, ApiError *err) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        bool ok = json_is_null(value);
        for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(*a, key) == 0;
        if (!ok)
            return api_error_set(err, 400, path, NULL, "%s%s%.*s: Extra inputs are not permitted", path, path[0] ? "." : "", QUOTE, key);
    }
    return 0;
}

/* Sets obj[key] (a new reference taken over); NULL value or a failed set is out of memory. */
static int put(json_t *obj, const char *key, json_t *value, ApiError *err) {
    return value && json_object_set_new(obj, key, value) == 0 ? 0 : out_of_memory(err);
}

/* ---- cache_control ---- */

/* A cache_control value cc (NULL: none) named param: NULL in *ttl when absent, else "5m" or "1h"
 * after the count and order checks. */
static int check_cache_control(const json_t *cc, const char *param, Translation *t, const char **ttl) {
    *ttl = NULL;
    if (!cc) return 0;
    static const char *const keys[] = {"type", "ttl", NULL};
    const json_t *type = json_object_get(cc, "type");
    if (!json_is_object(cc) || !json_is_string(type) || strcmp(json_string_value(type), "ephemeral") != 0)
        return api_error_set(t->err, 400, param, NULL, "%s: expected {\"type\": \"ephemeral\"} with an optional \"ttl\" of \"5m\" or \"1h\"",
                             param);
    if (only_keys(cc, param, keys, t->err)) return -1;
    const json_t *v = api_json_present(cc, "ttl");
    if (v && !(json_is_string(v) && (strcmp(json_string_value(v), "5m") == 0 || strcmp(json_string_value(v), "1h") == 0)))
        return api_error_set(t->err, 400, param, NULL, "%s.ttl: expected \"5m\" or \"1h\"", param);
    *ttl = v && strcmp(json_string_value(v), "1h") == 0 ? "1h" : "5m";
    if (++t->n_breakpoints > ANTHROPIC_MAX_BREAKPOINTS)
        return api_error_set(t->err, 400, param, NULL, "A maximum of %d blocks with cache_control may be provided; %s is number %d",
                             ANTHROPIC_MAX_BREAKPOINTS, param, t->n_breakpoints);
    if (strcmp(*ttl, "1h") == 0 && t->seen_5m)
        return api_error_set(t->err, 400, param, NULL,
                             "%s: a ttl=\"1h\" cache_control may not come after a ttl=\"5m\" one (in the order tools, system, "
                             "messages, longer TTLs must come first)",
                             param);
    if (strcmp(*ttl, "5m") == 0) t->seen_5m = true;
    return 0;
}

/* A block's cache_control (path names the block). */
static int read_cache_control(const json_t *block, const char *path, Translation *t, const char **ttl) {
    char param[128];
    snprintf(param, sizeof param, "%s.cache_control", path);
    return check_cache_control(api_json_present(block, "cache_control"), param, t, ttl);
}

static const char *longer_ttl(const char *a, const char *b) {
    if (!a) return b;
    if (!b) return a;
    return strcmp(a, "1h") == 0 || strcmp(b, "1h") == 0 ? "1h" : "5m";
}

/* Puts cache_control with ttl on a translated message (keeping a longer one already there). */
static int mark(json_t *msg, const char *ttl, ApiError *err) {
    if (!ttl) return 0;
    const json_t *old = json_object_get(json_object_get(msg, "cache_control"), "ttl");
    ttl = longer_ttl(ttl, json_string_value(old));
    return put(msg, "cache_control", json_pack("{s:s, s:s}", "type", "ephemeral", "ttl", ttl), err);
}

/* ---- text ---- */

typedef struct {
    char *text;
    size_t len, cap;
    bool any;
} TextJoin;

/* Appends s (n bytes) to j, after "\n\n" when j already holds a block. */
static int join_append(TextJoin *j, const char *s, size_t n, ApiError *err) {
    size_t need = j->len + n + 3;
    if (need > j->cap) {
        size_t cap = need * 2;
        char *grown = realloc(j->text, cap);
        if (!grown) return out_of_memory(err);
        j->text = grown;
        j->cap = cap;
    }
    if (j->any) memcpy(j->text + j->len, "\n\n", 2), j->len += 2;
    memcpy(j->text + j->len, s, n);
    j->len += n;
    j->text[j->len] = '\0';
    j->any = true;
    return 0;
}

static json_t *join_string(const TextJoin *j) { return json_stringn(j->text ? j->text : "", j->len); }

/* A text block {type: "text", text, cache_control?, citations?}: its text appended to j. */
static int read_text_block(const json_t *block, const char *path, TextJoin *j, ApiError *err) {
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    if (only_keys(block, path, keys, err)) return -1;
    const json_t *text = json_object_get(block, "text");
    char param[128];
    snprintf(param, sizeof param, "%s.text", path);
    if (!json_is_string(text)) return expected(err, param, "a string", text);
    if (api_json_present(block, "citations")) return api_error_set(err, 400, path, NULL, "%s.citations: citations are not supported", path);
    return join_append(j, json_string_value(text), json_string_length(text), err);
}

/* The block's type, or NULL with err set. */
static const char *block_type(const json_t *block, const char *path, ApiError *err) {
    if (!json_is_object(block)) return expected(err, path, "a content block object", block), NULL;
    const json_t *type = json_object_get(block, "type");
    char param[128];
    snprintf(param, sizeof param, "%s.type", path);
    if (!json_is_string(type)) return expected(err, param, "a string", type), NULL;
    return json_string_value(type);
}

static int unsupported_block(const char *path, const char *type, const char *role, ApiError *err) {
    if (strcmp(type, "tool_use") == 0 || strcmp(type, "tool_result") == 0 || strcmp(type, "text") == 0)
        return api_error_set(err, 400, path, NULL, "%s: a %s block may not appear in %s", path, type, role);
    return api_error_set(err, 400, path, NULL, "%s: content blocks of type '%.*s' are not supported (text, tool_use and tool_result are)",
                         path, QUOTE, type);
}

/* ---- system ---- */

static int read_system(const json_t *body, Translation *t) {
    const json_t *v = api_json_present(body, "system");
    if (!v) return 0;
    TextJoin j = {0};
    const char *ttl = NULL;
    if (json_is_string(v)) {
        if (join_append(&j, json_string_value(v), json_string_length(v), t->err)) return -1;
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            char path[48];
            snprintf(path, sizeof path, "system[%zu]", i);
            const json_t *block = json_array_get(v, i);
            const char *type = block_type(block, path, t->err), *block_ttl;
            if (!type || (strcmp(type, "text") != 0 && unsupported_block(path, type, "the system prompt", t->err)) ||
                read_cache_control(block, path, t, &block_ttl) || read_text_block(block, path, &j, t->err)) {
                free(j.text);
                return -1;
            }
            ttl = longer_ttl(ttl, block_ttl);
        }
    } else {
        return expected(t->err, "system", "a string or an array of text blocks", v);
    }
    json_t *msg = json_pack("{s:s, s:o}", "role", "system", "content", join_string(&j));
    free(j.text);
    if (!msg || json_array_append_new(t->msgs, msg)) return out_of_memory(t->err);
    return mark(msg, ttl, t->err);
}

/* ---- messages ---- */

/* A tool_result's content: a string or text blocks (joined); is_error prefixes "Error: ". */
static int tool_result_text(const json_t *block, const char *path, TextJoin *j, ApiError *err) {
    const json_t *content = api_json_present(block, "content"), *is_error = api_json_present(block, "is_error");
    char param[128];
    snprintf(param, sizeof param, "%s.is_error", path);
    if (is_error && !json_is_boolean(is_error)) return expected(err, param, "a boolean", is_error);
    TextJoin body = {0};
    int rc = 0;
    if (json_is_string(content)) {
        rc = join_append(&body, json_string_value(content), json_string_length(content), err);
    } else if (json_is_array(content)) {
        for (size_t i = 0; rc == 0 && i < json_array_size(content); i++) {
            char inner[160];
            snprintf(inner, sizeof inner, "%s.content[%zu]", path, i);
            const json_t *b = json_array_get(content, i);
            const char *type = block_type(b, inner, err);
            if (!type) rc = -1;
            else if (strcmp(type, "text") != 0)
                rc = api_error_set(err, 400, inner, NULL, "%s: a tool_result holds text blocks only, got '%.*s'", inner, QUOTE, type);
            else rc = read_text_block(b, inner, &body, err);
        }
    } else if (content) {
        snprintf(param, sizeof param, "%s.content", path);
        rc = expected(err, param, "a string or an array of text blocks", content);
    }
    if (rc == 0 && json_is_true(is_error)) rc = join_append(j, "Error: ", 7, err), j->any = false;
    if (rc == 0) {
        j->any = false; /* no separator between the prefix and the body */
        rc = join_append(j, body.text ? body.text : "", body.len, err);
    }
    free(body.text);
    return rc;
}

/* A user turn's tool_result block: one tool message. */
static int read_tool_result(const json_t *block, const char *path, Translation *t) {
    static const char *const keys[] = {"type", "tool_use_id", "content", "is_error", "cache_control", NULL};
    if (only_keys(block, path, keys, t->err)) return -1;
    const json_t *id = json_object_get(block, "tool_use_id");
    char param[128];
    snprintf(param, sizeof param, "%s.tool_use_id", path);
    if (!json_is_string(id) || json_string_length(id) == 0) return expected(t->err, param, "a non-empty string", id);
    const json_t *name = json_object_get(t->tool_names, json_string_value(id));
    if (!name)
        return api_error_set(t->err, 400, param, NULL, "%s: '%.*s' answers no tool_use block of an earlier assistant message", param, QUOTE,
                             json_string_value(id));
    const char *ttl;
    TextJoin j = {0};
    if (read_cache_control(block, path, t, &ttl) || tool_result_text(block, path, &j, t->err)) return free(j.text), -1;
    json_t *msg = json_pack("{s:s, s:O, s:O, s:o}", "role", "tool", "tool_call_id", id, "name", name, "content", join_string(&j));
    free(j.text);
    if (!msg || json_array_append_new(t->msgs, msg)) return out_of_memory(t->err);
    return mark(msg, ttl, t->err);
}

/* Ends the user text gathered so far as one user message. */
static int flush_user_text(Translation *t, TextJoin *j, const char **ttl) {
    if (!j->any) return 0;
    json_t *msg = json_pack("{s:s, s:o}", "role", "user", "content", join_string(j));
    j->len = 0;
    j->any = false;
    if (!msg || json_array_append_new(t->msgs, msg)) return out_of_memory(t->err);
    int rc = mark(msg, *ttl, t->err);
    *ttl = NULL;
    return rc;
}

static int read_user_blocks(const json_t *content, const char *path, Translation *t) {
    TextJoin j = {0};
    const char *ttl = NULL;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(content); i++) {
        char where[64];
        snprintf(where, sizeof where, "%s.content[%zu]", path, i);
        const json_t *block = json_array_get(content, i);
        const char *type = block_type(block, where, t->err), *block_ttl = NULL;
        if (!type) rc = -1;
        else if (strcmp(type, "text") == 0) {
            rc = read_cache_control(block, where, t, &block_ttl);
            if (rc == 0) rc = read_text_block(block, where, &j, t->err);
            ttl = longer_ttl(ttl, block_ttl);
        } else if (strcmp(type, "tool_result") == 0) {
            rc = flush_user_text(t, &j, &ttl);
            if (rc == 0) rc = read_tool_result(block, where, t);
        } else {
            rc = unsupported_block(where, type, "a user message", t->err);
        }
    }
    if (rc == 0) rc = flush_user_text(t, &j, &ttl);
    free(j.text);
    return rc;
}

/* An assistant turn's tool_use block: one OpenAI tool call appended to calls. */
static int read_tool_use(const json_t *block, const char *path, json_t *calls, Translation *t) {
    static const char *const keys[] = {"type", "id", "name", "input", "cache_control", NULL};
    if (only_keys(block, path, keys, t->err)) return -1;
    const json_t *id = json_object_get(block, "id"), *name = json_object_get(block, "name"), *input = json_object_get(block, "input");
    char param[128];
    snprintf(param, sizeof param, "%s.id", path);
    if (!json_is_string(id) || json_string_length(id) == 0) return expected(t->err, param, "a non-empty string", id);
    snprintf(param, sizeof param, "%s.name", path);
    if (!json_is_string(name) || json_string_length(name) == 0) return expected(t->err, param, "a non-empty string", name);
    snprintf(param, sizeof param, "%s.input", path);
    if (!json_is_object(input)) return expected(t->err, param, "an object", input);
    char *args = json_dumps(input, JSON_COMPACT);
    json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name, "arguments", args) : NULL;
    free(args);
    if (!call || json_array_append_new(calls, call) || json_object_set(t->tool_names, json_string_value(id), (json_t *)name))
        return out_of_memory(t->err);
    return 0;
}

static int read_assistant_blocks(const json_t *content, const char *path, Translation *t) {
    TextJoin j = {0};
    json_t *calls = json_array();
    const char *ttl = NULL;
    int rc = calls ? 0 : out_of_memory(t->err);
    for (size_t i = 0; rc == 0 && i < json_array_size(content); i++) {
        char where[64];
        snprintf(where, sizeof where, "%s.content[%zu]", path, i);
        const json_t *block = json_array_get(content, i);
        const char *type = block_type(block, where, t->err), *block_ttl = NULL;
        if (!type) rc = -1;
        else if (strcmp(type, "text") == 0) rc = read_text_block(block, where, &j, t->err);
        else if (strcmp(type, "tool_use") == 0) rc = read_tool_use(block, where, calls, t);
        else rc = unsupported_block(where, type, "an assistant message", t->err);
        if (rc == 0) rc = read_cache_control(block, where, t, &block_ttl);
        ttl = longer_ttl(ttl, block_ttl);
    }
    json_t *msg = rc == 0 ? json_pack("{s:s}", "role", "assistant") : NULL;
    if (rc == 0 && !msg) rc = out_of_memory(t->err);
    if (rc == 0 && (j.any || json_array_size(calls) == 0)) rc = put(msg, "content", join_string(&j), t->err);
    if (rc == 0 && json_array_size(calls) > 0) rc = put(msg, "tool_calls", json_incref(calls), t->err);
    if (rc == 0) rc = json_array_append(t->msgs, msg) ? out_of_memory(t->err) : mark(msg, ttl, t->err);
    json_decref(msg);
    json_decref(calls);
    free(j.text);
    return rc;
}

static int read_message(const json_t *m, size_t index, bool last, Translation *t) {
    char path[32];
    snprintf(path, sizeof path, "messages[%zu]", index);
    if (!json_is_object(m)) return expected(t->err, path, "an object with role and content", m);
    static const char *const keys[] = {"role", "content", NULL};
    if (only_keys(m, path, keys, t->err)) return -1;
    const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    char param[48];
    snprintf(param, sizeof param, "%s.role", path);
    bool user = json_is_string(role) && strcmp(json_string_value(role), "user") == 0;
    bool assistant = json_is_string(role) && strcmp(json_string_value(role), "assistant") == 0;
    if (!user && !assistant) return api_error_set(t->err, 400, param, NULL, "%s: expected \"user\" or \"assistant\"", param);
    if (assistant && last)
        return api_error_set(t->err, 400, path, NULL,
                             "%s: the last message is an assistant turn; continuing a prefilled assistant turn is not supported, "
                             "end with a user turn",
                             path);
    snprintf(param, sizeof param, "%s.content", path);
    if (json_is_string(content)) {
        json_t *msg = json_pack("{s:s, s:O}", "role", user ? "user" : "assistant", "content", content);
        return msg && json_array_append_new(t->msgs, msg) == 0 ? 0 : out_of_memory(t->err);
    }
    if (!json_is_array(content)) return expected(t->err, param, "a string or an array of content blocks", content);
    if (json_array_size(content) == 0) return api_error_set(t->err, 400, param, NULL, "%s: at least one content block is required", param);
    return user ? read_user_blocks(content, path, t) : read_assistant_blocks(content, path, t);
}

static int read_messages(const json_t *body, Translation *t) {
    const json_t *v = api_json_present(body, "messages");
    if (!v) return api_error_set(t->err, 400, "messages", NULL, "messages: Field required");
    if (!json_is_array(v)) return expected(t->err, "messages", "an array of messages", v);
    size_t n = json_array_size(v);
    if (n == 0) return api_error_set(t->err, 400, "messages", NULL, "messages: at least one message is required");
    if (n > API_MAX_MESSAGES)
        return api_error_set(t->err, 400, "messages", NULL, "messages: at most %d messages are supported, got %zu", API_MAX_MESSAGES, n);
    for (size_t i = 0; i < n; i++)
        if (read_message(json_array_get(v, i), i, i + 1 == n, t)) return -1;
    return 0;
}

/* ---- tools ---- */

static int read_tool(const json_t *tool, const char *path, json_t *out, Translation *t) {
    if (!json_is_object(tool)) return expected(t->err, path, "a tool object", tool);
    const json_t *type = api_json_present(tool, "type");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "custom") == 0))
        return api_error_set(t->err, 400, path, NULL, "%s.type: only client tools (\"custom\" or no type) are supported; server tools are not",
                             path);
    static const char *const keys[] = {"type", "name", "description", "input_schema", "cache_control", NULL};
    if (only_keys(tool, path, keys, t->err)) return -1;
    const json_t *name = json_object_get(tool, "name"), *desc = api_json_present(tool, "description"), *schema = json_object_get(tool, "input_schema");
    char param[64];
    snprintf(param, sizeof param, "%s.name", path);
    if (!json_is_string(name)) return expected(t->err, param, "a string", name);
    snprintf(param, sizeof param, "%s.description", path);
    if (desc && !json_is_string(desc)) return expected(t->err, param, "a string", desc);
    snprintf(param, sizeof param, "%s.input_schema", path);
    if (!json_is_object(schema)) return expected(t->err, param, "a JSON Schema object", schema);
    const char *ttl;
    if (read_cache_control(tool, path, t, &ttl)) return -1;
    t->tools_ttl = longer_ttl(t->tools_ttl, ttl);
    json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
    if (fn && desc && json_object_set(fn, "description", (json_t *)desc)) json_decref(fn), fn = NULL;
    json_t *entry = fn ? json_pack("{s:s, s:o}", "type", "function", "function", fn) : NULL;
    return entry && json_array_append_new(out, entry) == 0 ? 0 : out_of_memory(t->err);
}

static int read_tools(const json_t *body, json_t *oai, Translation *t) {
    const json_t *v = api_json_present(body, "tools");
    if (!v) return 0;
    if (!json_is_array(v)) return expected(t->err, "tools", "an array of tools", v);
    json_t *list = json_array();
    if (put(oai, "tools", list, t->err)) return -1;
    for (size_t i = 0; i < json_array_size(v); i++) {
        char path[32];
        snprintf(path, sizeof path, "tools[%zu]", i);
        if (read_tool(json_array_get(v, i), path, list, t)) return -1;
    }
    return 0;
}

static int read_tool_choice(const json_t *body, json_t *oai, ApiError *err) {
    const json_t *v = api_json_present(body, "tool_choice");
    if (!v) return 0;
    const json_t *type = json_object_get(v, "type");
    if (!json_is_object(v) || !json_is_string(type))
        return expected(err, "tool_choice", "an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", v);
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    if (only_keys(v, "tool_choice", keys, err)) return -1;
    const char *kind = json_string_value(type);
    const json_t *name = api_json_present(v, "name"), *no_parallel = api_json_present(v, "disable_parallel_tool_use");
    if (no_parallel && !json_is_boolean(no_parallel)) return expected(err, "tool_choice.disable_parallel_tool_use", "a boolean", no_parallel);
    if (strcmp(kind, "tool") == 0 && !json_is_string(name)) return expected(err, "tool_choice.name", "a string", name);
    if (strcmp(kind, "tool") != 0 && name) return api_error_set(err, 400, "tool_choice.name", NULL, "tool_choice.name: only a \"tool\" choice names a tool");
    json_t *choice;
    if (strcmp(kind, "auto") == 0) choice = json_string("auto");
    else if (strcmp(kind, "any") == 0) choice = json_string("required");
    else if (strcmp(kind, "none") == 0) choice = json_string("none");
    else if (strcmp(kind, "tool") == 0) choice = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    else
        return api_error_set(err, 400, "tool_choice.type", NULL, "tool_choice.type: expected \"auto\", \"any\", \"tool\" or \"none\", got '%.*s'",
                             QUOTE, kind);
    if (put(oai, "tool_choice", choice, err)) return -1;
    if (json_is_true(no_parallel)) return put(oai, "parallel_tool_calls", json_false(), err);
    return 0;
}

/* A tools breakpoint pins through where the tools are rendered: the system turn, or the first. */
static int mark_tools(Translation *t) {
    if (!t->tools_ttl) return 0;
    return mark(json_array_get(t->msgs, 0), t->tools_ttl, t->err);
}

/* Top-level cache_control (automatic caching): a breakpoint on the request's last block, which is
 * in the last message; it comes last in breakpoint order. */
static int read_automatic_cache_control(const json_t *body, Translation *t) {
    const char *ttl;
    if (check_cache_control(api_json_present(body, "cache_control"), "cache_control", t, &ttl)) return -1;
    return mark(json_array_get(t->msgs, json_array_size(t->msgs) - 1), ttl, t->err);
}

/* ---- scalars ---- */

static int read_max_tokens(const json_t *body, json_t *oai, AnthropicEndpoint endpoint, ApiError *err) {
    const json_t *v = api_json_present(body, "max_tokens");
    if (endpoint == ANTHROPIC_COUNT_TOKENS) return 0; /* refused as an unknown field */
    if (!v) return api_error_set(err, 400, "max_tokens", NULL, "max_tokens: Field required");
    if (!json_is_integer(v) || json_integer_value(v) < 1) return expected(err, "max_tokens", "an integer >= 1", v);
    return put(oai, "max_tokens", json_incref((json_t *)v), err);
}

static int read_stop_sequences(const json_t *body, json_t *oai, ApiError *err) {
    const json_t *v = api_json_present(body, "stop_sequences");
    if (!v) return 0;
    if (!json_is_array(v)) return expected(err, "stop_sequences", "an array of strings", v);
    if (json_array_size(v) > API_MAX_STOPS)
        return api_error_set(err, 400, "stop_sequences", NULL, "stop_sequences: at most %d are supported, got %zu", API_MAX_STOPS,
                             json_array_size(v));
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        char param[40];
        snprintf(param, sizeof param, "stop_sequences[%zu]", i);
        if (!json_is_string(s)) return expected(err, param, "a string", s);
        if (json_string_length(s) == 0) return api_error_set(err, 400, param, NULL, "%s: a stop sequence must not be empty", param);
    }
    return json_array_size(v) ? put(oai, "stop", json_incref((json_t *)v), err) : 0;
}

static int read_sampling(const json_t *body, json_t *oai, ApiError *err) {
    const json_t *temp = api_json_present(body, "temperature");
    if (temp && (!json_is_number(temp) || !(json_number_value(temp) >= 0 && json_number_value(temp) <= 1)))
        return api_error_set(err, 400, "temperature", NULL, "temperature: expected a number in [0, 1]");
    static const char *const pass[] = {"temperature", "top_p", "top_k", "stream"};
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        const json_t *v = api_json_present(body, pass[i]);
        if (v && put(oai, pass[i], json_incref((json_t *)v), err)) return -1;
    }
    return 0;
}

static int read_metadata(const json_t *body, json_t *oai, ApiError *err) {
    const json_t *v = api_json_present(body, "metadata");
    if (!v) return 0;
    if (!json_is_object(v)) return expected(err, "metadata", "an object", v);
    static const char *const keys[] = {"user_id", NULL};
    if (only_keys(v, "metadata", keys, err)) return -1;
    const json_t *user = api_json_present(v, "user_id");
    if (user && (!json_is_string(user) || json_string_length(user) > API_MAX_LABEL_BYTES))
        return api_error_set(err, 400, "metadata.user_id", NULL, "metadata.user_id: expected a string of at most %d bytes",
                             API_MAX_LABEL_BYTES);
    return user ? put(oai, "user", json_incref((json_t *)user), err) : 0;
}

/* Braid's own fields, read by the OpenAI parser as they are. */
static const char *const braid_fields[] = {"workflow_id", "agent", "tenant", "adapter", "segment_reuse", "cache_id", "conversation_id", "auto_splice"};

static int read_passthrough(const json_t *body, json_t *oai, ApiError *err) {
    const json_t *model = json_object_get(body, "model");
    if (!json_is_string(model)) return expected(err, "model", "a string", model);
    if (put(oai, "model", json_incref((json_t *)model), err)) return -1;
    for (size_t i = 0; i < sizeof braid_fields / sizeof braid_fields[0]; i++) {
        const json_t *v = json_object_get(body, braid_fields[i]);
        if (v && put(oai, braid_fields[i], json_incref((json_t *)v), err)) return -1;
    }
    return 0;
}

static int check_top_level(const json_t *body, AnthropicEndpoint endpoint, ApiError *err) {
    static const char *const messages[] = {"model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
                                           "metadata", "stream", "tools", "tool_choice", "workflow_id", "agent", "tenant", "adapter",
                                           "segment_reuse", "cache_id", "cache_control", "conversation_id", "auto_splice", NULL};
    static const char *const count[] = {"model", "messages", "system", "tools", "tool_choice", "cache_control", "workflow_id", "agent", "tenant", "adapter",
                                        "cache_id", NULL};
    return only_keys(body, "", endpoint == ANTHROPIC_MESSAGES ? messages : count, err);
}

json_t *anthropic_request_translate(const json_t *body, AnthropicEndpoint endpoint, ApiError *err) {
    if (!json_is_object(body)) return expected(err, "body", "a JSON object", body), NULL;
    json_t *oai = json_object();
    Translation t = {.msgs = json_array(), .tool_names = json_object(), .err = err};
    int rc = oai && t.msgs && t.tool_names ? 0 : out_of_memory(err);
    if (rc == 0) rc = check_top_level(body, endpoint, err);
    if (rc == 0) rc = read_passthrough(body, oai, err);
    if (rc == 0) rc = read_tools(body, oai, &t); /* first: breakpoints are ordered tools, system, messages */
    if (rc == 0) rc = read_system(body, &t);
    if (rc == 0) rc = read_messages(body, &t);
    if (rc == 0) rc = read_automatic_cache_control(body, &t);
    if (rc == 0) rc = mark_tools(&t);
    if (rc == 0) rc = put(oai, "messages", json_incref(t.msgs), err);
    if (rc == 0) rc = read_tool_choice(body, oai, err);
    if (rc == 0) rc = read_max_tokens(body, oai, endpoint, err);
    if (rc == 0) rc = read_stop_sequences(body, oai, err);
    if (rc == 0) rc = read_sampling(body, oai, err);
    if (rc == 0) rc = read_metadata(body, oai, err);
    json_decref(t.msgs);
    json_decref(t.tool_names);
    if (rc) json_decref(oai), oai = NULL;
    return oai;
}

int anthropic_request_parse(const char *body, size_t len, AnthropicEndpoint endpoint, ApiRequest *out, char **translated, ApiError *err) {
    memset(out, 0, sizeof *out);
    if (translated) *translated = NULL;
    if (!body || len == 0) return api_error_set(err, 400, NULL, NULL, "request body is empty; expected a JSON object");
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) return api_error_set(err, 400, NULL, NULL, "request body is not valid JSON: %s at line %d column %d", jerr.text, jerr.line, jerr.column);
    json_t *oai = anthropic_request_translate(root, endpoint, err);
    json_decref(root);
    if (!oai) return -1;
    char *text = json_dumps(oai, JSON_COMPACT);
    json_decref(oai);
    if (!text) return out_of_memory(err);
    int rc = api_request_parse(text, strlen(text), API_CHAT, NULL, out, err);
    if (rc == 0 && translated) *translated = text;
    else free(text);
    return rc;
}
