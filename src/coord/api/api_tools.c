/* Tools, tool_choice, response_format and the tool parts of messages; the contract is in api_tools.h. */
#include "coord/api/api_json.h"
#include "coord/api/api_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

/* How much of a client-supplied name an error quotes. */
#define QUOTE 64



static int type_error(ApiError *err, const char *param, const char *expected, const json_t *v) {
    return api_error_set(err, 400, param, NULL, "%s must be %s, got %s", param, expected, api_json_type_name(v));
}

static int out_of_memory(ApiError *err) { return api_error_set(err, 503, NULL, NULL, "the server is out of memory; retry shortly"); }

/* Refuses any non-null member of obj not in allowed (NULL-terminated): nothing is silently dropped. */
static int check_members(const json_t *obj, const char *path, const char *const *allowed, ApiError *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (json_is_null(v)) continue;
        bool known = false;
        for (int i = 0; allowed[i] && !known; i++) known = strcmp(key, allowed[i]) == 0;
        if (known) continue;
        char param[160];
        snprintf(param, sizeof param, "%s.%.*s", path, QUOTE, key);
        return api_error_set(err, 400, param, NULL, "%s is not a field Braid knows here; remove it", param);
    }
    return 0;
}

/* OpenAI's rule for function names: 1..64 of a-z, A-Z, 0-9, '_' and '-'. */
static bool valid_function_name(const char *s, size_t n) {
    if (n == 0 || n > API_MAX_FUNCTION_NAME) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
    }
    return true;
}

static int read_function_name(const json_t *fn, const char *path, const char **name, ApiError *err) {
    char param[160];
    snprintf(param, sizeof param, "%s.name", path);
    const json_t *v = api_json_present(fn, "name");
    if (!v || !json_is_string(v)) return type_error(err, param, "a string", v);
    if (!valid_function_name(json_string_value(v), json_string_length(v)))
        return api_error_set(err, 400, param, NULL, "%s must be 1 to %d characters of a-z, A-Z, 0-9, '_' or '-'", param,
                             API_MAX_FUNCTION_NAME);
    *name = json_string_value(v);
    return 0;
}

/* ---- tools ---- */

static int read_one_tool(const json_t *tool, size_t i, ApiError *err) {
    static const char *const tool_fields[] = {"type", "function", NULL};
    static const char *const fn_fields[] = {"name", "description", "parameters", "strict", NULL};
    char path[48], param[96];
    snprintf(path, sizeof path, "tools[%zu]", i);
    if (!json_is_object(tool)) return type_error(err, path, "an object like {\"type\": \"function\", \"function\": {...}}", tool);
    const json_t *type = api_json_present(tool, "type");
    snprintf(param, sizeof param, "%s.type", path);
    if (!type || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
        return api_error_set(err, 400, param, NULL, "%s must be \"function\" (the only tool type Braid serves)", param);
    if (check_members(tool, path, tool_fields, err)) return -1;
    const json_t *fn = api_json_present(tool, "function");
    snprintf(param, sizeof param, "%s.function", path);
    if (!fn || !json_is_object(fn)) return type_error(err, param, "an object with name, description and parameters", fn);
    if (check_members(fn, param, fn_fields, err)) return -1;
    const char *name;
    if (read_function_name(fn, param, &name, err)) return -1;
    const json_t *desc = api_json_present(fn, "description"), *params = api_json_present(fn, "parameters"), *strict = api_json_present(fn, "strict");
    char field[128];
    snprintf(field, sizeof field, "%s.description", param);
    if (desc && !json_is_string(desc)) return type_error(err, field, "a string", desc);
    snprintf(field, sizeof field, "%s.parameters", param);
    if (params && !json_is_object(params)) return type_error(err, field, "a JSON Schema object", params);
    snprintf(field, sizeof field, "%s.strict", param);
    if (strict && !json_is_boolean(strict)) return type_error(err, field, "a boolean", strict);
    return 0;
}

/* The name of tools[i] (validated). */
static const char *tool_name(const json_t *tools, size_t i) {
    return json_string_value(json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
}

static int read_tools(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "tools");
    if (!v) return 0;
    if (!json_is_array(v)) return type_error(err, "tools", "an array of tool objects", v);
    size_t n = json_array_size(v);
    if (n > API_MAX_TOOLS) return api_error_set(err, 400, "tools", NULL, "tools holds %zu tools; at most %d are supported", n, API_MAX_TOOLS);
    for (size_t i = 0; i < n; i++) {
        if (read_one_tool(json_array_get(v, i), i, err)) return -1;
        for (size_t j = 0; j < i; j++)
            if (strcmp(tool_name(v, i), tool_name(v, j)) == 0)
                return api_error_set(err, 400, "tools", NULL, "tools[%zu] and tools[%zu] are both named '%s'; names must be unique", j, i,
                                     tool_name(v, i));
    }
    if (n == 0) return 0; /* an empty list offers nothing: as if absent */
    return (r->tools = json_deep_copy(v)) ? 0 : out_of_memory(err);
}

static bool has_tool(const ApiRequest *r, const char *name) {
    for (size_t i = 0; r->tools && i < json_array_size(r->tools); i++)
        if (strcmp(tool_name(r->tools, i), name) == 0) return true;
    return false;
}

static int read_named_choice(const json_t *v, ApiRequest *r, ApiError *err) {
    const json_t *type = api_json_present(v, "type"), *fn = api_json_present(v, "function");
    if (!type || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0 || !fn || !json_is_object(fn))
        return api_error_set(err, 400, "tool_choice", NULL,
                             "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    const char *name;
    if (read_function_name(fn, "tool_choice.function", &name, err)) return -1;
    if (!has_tool(r, name))
        return api_error_set(err, 400, "tool_choice", NULL, "tool_choice names function '%.*s', which is not in tools", QUOTE, name);
    r->tool_choice = API_TOOL_CHOICE_NAMED;
    return (r->tool_choice_name = strdup(name)) ? 0 : out_of_memory(err);
}

static int read_tool_choice(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "tool_choice");
    r->tool_choice = r->tools ? API_TOOL_CHOICE_AUTO : API_TOOL_CHOICE_NONE;
    if (!v) return 0;
    if (json_is_object(v)) {
        if (!r->tools) return api_error_set(err, 400, "tool_choice", NULL, "tool_choice names a function but the request has no tools");
        return read_named_choice(v, r, err);
    }
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(s, "none") == 0) r->tool_choice = API_TOOL_CHOICE_NONE;
    else if (strcmp(s, "auto") == 0) r->tool_choice = r->tools ? API_TOOL_CHOICE_AUTO : API_TOOL_CHOICE_NONE;
    else if (strcmp(s, "required") == 0) {
        if (!r->tools) return api_error_set(err, 400, "tool_choice", NULL, "tool_choice \"required\" needs tools in the request");
        r->tool_choice = API_TOOL_CHOICE_REQUIRED;
    } else
        return api_error_set(err, 400, "tool_choice", NULL,
                             "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    return 0;
}

/* ---- response_format ---- */

/* Checks a schema the way the grammar compiler will see it, naming the keyword it cannot honour. */
static int check_schema(const json_t *schema, const char *param, ApiError *err) {
    json_t *spec = json_pack("{s:O}", "schema", schema);
    char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!text) return out_of_memory(err);
    char why[256];
    int rc = grammar_spec_check(text, strlen(text), why, sizeof why);
    free(text);
    if (rc) return api_error_set(err, 400, param, NULL, "%s cannot be honoured: %s", param, why);
    return 0;
}

static int read_json_schema_format(const json_t *format, ApiRequest *r, ApiError *err) {
    static const char *const fields[] = {"name", "schema", "strict", "description", NULL};
    const json_t *js = api_json_present(format, "json_schema");
    if (!js || !json_is_object(js)) return type_error(err, "response_format.json_schema", "an object with name and schema", js);
    if (check_members(js, "response_format.json_schema", fields, err)) return -1;
    const json_t *name = api_json_present(js, "name"), *schema = api_json_present(js, "schema"), *strict = api_json_present(js, "strict");
    if (!name || !json_is_string(name) || !valid_function_name(json_string_value(name), json_string_length(name)))
        return api_error_set(err, 400, "response_format.json_schema.name", NULL,
                             "response_format.json_schema.name must be 1 to 64 characters of a-z, A-Z, 0-9, '_' or '-'");
    if (strict && !json_is_boolean(strict)) return type_error(err, "response_format.json_schema.strict", "a boolean", strict);
    if (!schema || !json_is_object(schema)) return type_error(err, "response_format.json_schema.schema", "a JSON Schema object", schema);
    if (check_schema(schema, "response_format.json_schema.schema", err)) return -1;
    r->response_format = API_FORMAT_JSON_SCHEMA;
    return (r->response_schema = json_deep_copy(schema)) ? 0 : out_of_memory(err);
}

static int read_response_format(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "response_format");
    if (!v) return 0;
    if (!json_is_object(v)) return type_error(err, "response_format", "an object like {\"type\": \"json_object\"}", v);
    const json_t *type = api_json_present(v, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : "";
    if (strcmp(t, "text") == 0 || strcmp(t, "json_object") == 0) {
        static const char *const fields[] = {"type", NULL};
        if (check_members(v, "response_format", fields, err)) return -1;
        r->response_format = t[0] == 't' ? API_FORMAT_TEXT : API_FORMAT_JSON_OBJECT;
        return 0;
    }
    if (strcmp(t, "json_schema") == 0) {
        static const char *const fields[] = {"type", "json_schema", NULL};
        return check_members(v, "response_format", fields, err) || read_json_schema_format(v, r, err) ? -1 : 0;
    }
    return api_error_set(err, 400, "response_format.type", NULL, "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
}

int api_tools_read(const json_t *body, ApiRequest *r, ApiError *err) {
    r->parallel_tool_calls = true;
    const json_t *parallel = api_json_present(body, "parallel_tool_calls");
    if (parallel && !json_is_boolean(parallel)) return type_error(err, "parallel_tool_calls", "a boolean", parallel);
    if (parallel) r->parallel_tool_calls = json_is_true(parallel);
    if (read_tools(body, r, err) || read_tool_choice(body, r, err)) return -1;
    return read_response_format(body, r, err);
}

bool api_tools_offered(const ApiRequest *r) { return r->tools != NULL; }

/* ---- the tool parts of messages ---- */

/* A call's arguments: OpenAI sends a string holding a JSON object ("" for none); a client that sends
 * the object itself is taken at its word. */
static json_t *parse_arguments(const json_t *v, const char *param, ApiError *err) {
    if (json_is_object(v)) return json_deep_copy(v);
    if (!json_is_string(v)) {
        type_error(err, param, "a string holding a JSON object", v);
        return NULL;
    }
    if (json_string_length(v) == 0) return json_object();
    json_t *args = json_loadb(json_string_value(v), json_string_length(v), JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(args)) {
        json_decref(args);
        api_error_set(err, 400, param, NULL, "%s must be a JSON object encoded as a string", param);
        return NULL;
    }
    return args;
}

/* One call of an assistant message, normalized: {id, type: "function", function: {name, arguments}}. */
static json_t *read_call(const json_t *call, const char *path, ApiError *err) {
    static const char *const fields[] = {"id", "type", "function", "index", NULL};
    static const char *const fn_fields[] = {"name", "arguments", NULL};
    char param[192];
    if (!json_is_object(call)) {
        type_error(err, path, "an object with id, type and function", call);
        return NULL;
    }
    if (check_members(call, path, fields, err)) return NULL;
    const json_t *id = api_json_present(call, "id"), *type = api_json_present(call, "type"), *fn = api_json_present(call, "function");
    snprintf(param, sizeof param, "%s.id", path);
    if (!id || !json_is_string(id) || json_string_length(id) == 0 || json_string_length(id) > API_MAX_LABEL_BYTES) {
        api_error_set(err, 400, param, NULL, "%s must be a non-empty string of at most %d bytes", param, API_MAX_LABEL_BYTES);
        return NULL;
    }
    snprintf(param, sizeof param, "%s.type", path);
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)) {
        api_error_set(err, 400, param, NULL, "%s must be \"function\"", param);
        return NULL;
    }
    snprintf(param, sizeof param, "%s.function", path);
    if (!fn || !json_is_object(fn)) {
        type_error(err, param, "an object with name and arguments", fn);
        return NULL;
    }
    const char *name;
    if (check_members(fn, param, fn_fields, err) || read_function_name(fn, param, &name, err)) return NULL;
    char args_param[224];
    snprintf(args_param, sizeof args_param, "%s.arguments", param);
    const json_t *raw = api_json_present(fn, "arguments");
    json_t *args = raw ? parse_arguments(raw, args_param, err) : json_object();
    if (!args) return NULL;
    json_t *out = json_pack("{s:O, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name", name, "arguments", args);
    if (!out) out_of_memory(err);
    return out;
}

static int read_tool_calls(const json_t *v, const char *path, ApiMessage *m, ApiError *err) {
    char param[96];
    snprintf(param, sizeof param, "%s.tool_calls", path);
    if (strcmp(m->role, "assistant") != 0)
        return api_error_set(err, 400, param, NULL, "%s is only allowed on assistant messages", param);
    if (!json_is_array(v)) return type_error(err, param, "an array of tool calls", v);
    size_t n = json_array_size(v);
    if (n > API_MAX_TOOL_CALLS) return api_error_set(err, 400, param, NULL, "%s holds %zu calls; at most %d are supported", param, n, API_MAX_TOOL_CALLS);
    if (n == 0) return 0;
    json_t *calls = json_array();
    if (!calls) return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        char where[128];
        snprintf(where, sizeof where, "%s[%zu]", param, i);
        json_t *call = read_call(json_array_get(v, i), where, err);
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            return -1;
        }
    }
    m->tool_calls = calls;
    return 0;
}

static int read_short_string(const json_t *msg, const char *key, const char *path, char **out, ApiError *err) {
    const json_t *v = api_json_present(msg, key);
    if (!v) return 0;
    char param[96];
    snprintf(param, sizeof param, "%s.%s", path, key);
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > API_MAX_LABEL_BYTES)
        return api_error_set(err, 400, param, NULL, "%s must be a non-empty string of at most %d bytes", param, API_MAX_LABEL_BYTES);
    return (*out = strdup(json_string_value(v))) ? 0 : out_of_memory(err);
}

int api_message_read_tools(const json_t *msg, const char *path, ApiMessage *m, ApiError *err) {
    const json_t *calls = api_json_present(msg, "tool_calls");
    if (calls && read_tool_calls(calls, path, m, err)) return -1;
    if (read_short_string(msg, "name", path, &m->name, err)) return -1;
    if (read_short_string(msg, "tool_call_id", path, &m->tool_call_id, err)) return -1;
    char param[96];
    snprintf(param, sizeof param, "%s.tool_call_id", path);
    bool is_tool = strcmp(m->role, "tool") == 0;
    if (is_tool && !m->tool_call_id)
        return api_error_set(err, 400, param, NULL, "%s is required on a tool message (the id of the call it answers)", param);
    if (!is_tool && m->tool_call_id) return api_error_set(err, 400, param, NULL, "%s is only allowed on tool messages", param);
    return 0;
}

/* The call with this id in an assistant message before index `before`, searching backwards. */
static const json_t *find_call(const ApiRequest *r, int before, const char *id) {
    for (int i = before - 1; i >= 0; i--) {
        const json_t *calls = r->messages[i].tool_calls;
        for (size_t j = 0; calls && j < json_array_size(calls); j++)
            if (strcmp(json_string_value(json_object_get(json_array_get(calls, j), "id")), id) == 0) return json_array_get(calls, j);
    }
    return NULL;
}

int api_tools_check_conversation(const ApiRequest *r, ApiError *err) {
    for (int i = 0; i < r->n_messages; i++) {
        ApiMessage *m = &r->messages[i];
        if (strcmp(m->role, "tool") != 0) continue;
        const json_t *call = find_call(r, i, m->tool_call_id);
        char param[64];
        snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
        if (!call)
            return api_error_set(err, 400, param, NULL, "%s is '%.*s', which no earlier assistant message's tool_calls holds", param, QUOTE,
                                 m->tool_call_id);
        /* Templates that print the function's name with its result read `name`; fill it from the call. */
        if (!m->name) {
            const char *fn = json_string_value(json_object_get(json_object_get(call, "function"), "name"));
            if (!(m->name = strdup(fn))) return out_of_memory(err);
        }
    }
    return 0;
}

void api_message_free_tools(ApiMessage *m) {
    json_decref(m->tool_calls);
    free(m->tool_call_id);
    free(m->name);
    m->tool_calls = NULL;
    m->tool_call_id = m->name = NULL;
}
