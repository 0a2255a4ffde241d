#include "coord/api_request.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MESSAGES 4096
#define MAX_STOPS 4
#define MAX_LABEL 256

int api_error_set(ApiError *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s",
             status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static json_t *string_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }

char *api_error_json(const ApiError *e) {
    json_t *inner = json_object();
    /* The message may quote client bytes cut mid-character; json_string would refuse those. */
    json_t *msg = json_string(e->message);
    json_object_set_new(inner, "message", msg ? msg : json_string("invalid request (the message could not be encoded)"));
    json_object_set_new(inner, "type", json_string(e->type));
    json_object_set_new(inner, "param", string_or_null(e->param));
    json_object_set_new(inner, "code", string_or_null(e->code));
    json_t *o = json_pack("{s:o}", "error", inner);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

void api_request_free(ApiRequest *r) {
    for (int i = 0; i < r->n_messages; i++) free(r->messages[i].role), free(r->messages[i].content);
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->model);
    free(r->prompt);
    free(r->workflow_id);
    free(r->agent);
    free(r->tenant);
    free(r->adapter);
    memset(r, 0, sizeof *r);
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A field that is absent or null reads as absent. */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int wrong_type(ApiError *e, const char *key, const char *want, const json_t *v) {
    return api_error_set(e, 400, key, NULL, "%s must be %s, got %s", key, want, json_kind(v));
}

static int get_number(json_t *obj, const char *key, double lo, double hi, bool lo_open, double *out, ApiError *e) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_number(v)) return wrong_type(e, key, "a number", v);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return api_error_set(e, 400, key, NULL, "%s must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *obj, const char *key, bool *out, ApiError *e) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return wrong_type(e, key, "true or false", v);
    *out = json_is_true(v);
    return 0;
}

/* A Braid label (workflow_id, agent, tenant, adapter): 1..256 bytes, no control characters. */
static int check_label(const char *key, const char *s, size_t n, ApiError *e) {
    if (n == 0 || n > MAX_LABEL) return api_error_set(e, 400, key, NULL, "%s must be 1 to %d bytes, got %zu", key, MAX_LABEL, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return api_error_set(e, 400, key, NULL, "%s contains a control character", key);
    return 0;
}

static int get_label(json_t *obj, const char *key, char **out, ApiError *e) {
    json_t *v = field(obj, key);
    if (!v) return 0;
    if (!json_is_string(v)) return wrong_type(e, key, "a string", v);
    if (check_label(key, json_string_value(v), json_string_length(v), e)) return -1;
    if (!(*out = strdup(json_string_value(v)))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return 0;
}

static int get_max_tokens(json_t *obj, ApiRequest *r, ApiError *e) {
    static const char *const keys[] = {"max_tokens", "max_completion_tokens"};
    r->max_tokens = -1;
    for (int k = 0; k < 2; k++) {
        json_t *v = field(obj, keys[k]);
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 24) {
            if (json_is_integer(v))
                return api_error_set(e, 400, keys[k], NULL, "%s must be a positive integer, got %lld", keys[k], (long long)json_integer_value(v));
            return wrong_type(e, keys[k], "a positive integer", v);
        }
        int n = (int)json_integer_value(v);
        if (r->max_tokens >= 0 && r->max_tokens != n)
            return api_error_set(e, 400, keys[k], NULL, "max_tokens (%d) and max_completion_tokens (%d) disagree", r->max_tokens, n);
        r->max_tokens = n;
    }
    return 0;
}

static int get_stop(json_t *obj, ApiRequest *r, ApiError *e) {
    json_t *v = field(obj, "stop");
    if (!v) return 0;
    if (!json_is_string(v) && !json_is_array(v)) return wrong_type(e, "stop", "a string or an array of strings", v);
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > MAX_STOPS) return api_error_set(e, 400, "stop", NULL, "stop holds at most %d strings, got %zu", MAX_STOPS, n);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s)) return api_error_set(e, 400, "stop", NULL, "stop[%zu] must be a string, got %s", i, json_kind(s));
        if (json_string_length(s) == 0) continue; /* an empty stop string would end every completion at once */
        if (!(r->stop[r->n_stop++] = strdup(json_string_value(s)))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    }
    return 0;
}

/* content: a string, null (assistant turns with tool calls), or text parts to concatenate. */
static int message_content(json_t *content, const char *role, size_t i, char **out, ApiError *e) {
    if (!content) {
        if (strcmp(role, "assistant")) return api_error_set(e, 400, "messages", NULL, "messages[%zu].content is required for role %s", i, role);
        *out = strdup("");
    } else if (json_is_string(content)) {
        *out = strdup(json_string_value(content));
    } else if (json_is_array(content)) {
        size_t total = 1, n = json_array_size(content);
        for (size_t p = 0; p < n; p++) {
            json_t *part = json_array_get(content, p), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
            if (!json_is_object(part) || !json_is_string(type))
                return api_error_set(e, 400, "messages", NULL, "messages[%zu].content[%zu] must be an object with a \"type\"", i, p);
            if (strcmp(json_string_value(type), "text"))
                return api_error_set(e, 400, "messages", NULL, "messages[%zu].content[%zu] has type '%.40s'; only text parts are supported", i, p,
                                     json_string_value(type));
            if (!json_is_string(text)) return api_error_set(e, 400, "messages", NULL, "messages[%zu].content[%zu].text must be a string", i, p);
            total += json_string_length(text);
        }
        if ((*out = malloc(total))) {
            size_t off = 0;
            for (size_t p = 0; p < n; p++) {
                json_t *text = json_object_get(json_array_get(content, p), "text");
                memcpy(*out + off, json_string_value(text), json_string_length(text));
                off += json_string_length(text);
            }
            (*out)[off] = '\0';
        }
    } else {
        return api_error_set(e, 400, "messages", NULL, "messages[%zu].content must be a string or an array of text parts, got %s", i,
                             json_kind(content));
    }
    return *out ? 0 : api_error_set(e, 503, NULL, NULL, "the server is out of memory");
}

static int get_messages(json_t *obj, ApiRequest *r, ApiError *e) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    json_t *v = field(obj, "messages");
    if (!v) return api_error_set(e, 400, "messages", NULL, "messages is required");
    if (!json_is_array(v)) return wrong_type(e, "messages", "an array", v);
    size_t n = json_array_size(v);
    if (n == 0 || n > MAX_MESSAGES) return api_error_set(e, 400, "messages", NULL, "messages must hold 1 to %d entries, got %zu", MAX_MESSAGES, n);
    if (!(r->messages = calloc(n, sizeof *r->messages))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i), *role = json_object_get(m, "role");
        if (!json_is_object(m)) return api_error_set(e, 400, "messages", NULL, "messages[%zu] must be an object, got %s", i, json_kind(m));
        if (!json_is_string(role)) return api_error_set(e, 400, "messages", NULL, "messages[%zu].role must be a string", i);
        bool known = false;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known |= strcmp(json_string_value(role), roles[k]) == 0;
        if (!known)
            return api_error_set(e, 400, "messages", NULL, "messages[%zu].role '%.40s' is not one of system, developer, user, assistant, tool", i,
                                 json_string_value(role));
        r->n_messages++;
        if (!(r->messages[i].role = strdup(json_string_value(role)))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
        if (message_content(field(m, "content"), r->messages[i].role, i, &r->messages[i].content, e)) return -1;
    }
    return 0;
}

static int get_prompt(json_t *obj, ApiRequest *r, ApiError *e) {
    json_t *v = field(obj, "prompt");
    if (!v) return api_error_set(e, 400, "prompt", NULL, "prompt is required");
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0))) v = json_array_get(v, 0);
    if (!json_is_string(v)) return api_error_set(e, 400, "prompt", NULL, "prompt must be a string (or an array of one string); got %s", json_kind(v));
    if (!(r->prompt = strdup(json_string_value(v)))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return 0;
}

static int get_model(json_t *obj, const char *served, ApiRequest *r, ApiError *e) {
    json_t *v = field(obj, "model");
    if (!v) return 0;
    if (!json_is_string(v)) return wrong_type(e, "model", "a string", v);
    if (served && strcmp(json_string_value(v), served))
        return api_error_set(e, 404, "model", "model_not_found", "The model '%.100s' does not exist; this server serves '%s'",
                             json_string_value(v), served);
    if (!(r->model = strdup(json_string_value(v)))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return 0;
}

static int get_sampling(json_t *obj, ApiRequest *r, ApiError *e) {
    double top_k = 0;
    if (get_number(obj, "temperature", 0, 2, false, &r->temperature, e) || get_number(obj, "top_p", 0, 1, true, &r->top_p, e) ||
        get_number(obj, "top_k", 0, 1 << 24, false, &top_k, e))
        return -1;
    json_t *k = field(obj, "top_k");
    if (k && !json_is_integer(k)) return wrong_type(e, "top_k", "an integer", k);
    r->top_k = (int)top_k;
    json_t *seed = field(obj, "seed");
    if (seed && !json_is_integer(seed)) return wrong_type(e, "seed", "an integer", seed);
    if (seed) r->has_seed = true, r->seed = (uint64_t)json_integer_value(seed);
    json_t *n = field(obj, "n");
    if (n && (!json_is_integer(n) || json_integer_value(n) != 1)) return api_error_set(e, 400, "n", NULL, "only n = 1 is supported");
    return 0;
}

static int get_streaming(json_t *obj, ApiRequest *r, ApiError *e) {
    if (get_bool(obj, "stream", &r->stream, e)) return -1;
    json_t *opts = field(obj, "stream_options");
    if (!opts) return 0;
    if (!json_is_object(opts)) return wrong_type(e, "stream_options", "an object", opts);
    if (!r->stream) return api_error_set(e, 400, "stream_options", NULL, "stream_options is only allowed when stream is true");
    return get_bool(opts, "include_usage", &r->include_usage, e);
}

static int parse_fields(json_t *obj, ApiKind kind, const char *served, ApiRequest *r, ApiError *e) {
    if (get_model(obj, served, r, e)) return -1;
    if (kind == API_CHAT ? get_messages(obj, r, e) : get_prompt(obj, r, e)) return -1;
    if (get_max_tokens(obj, r, e) || get_sampling(obj, r, e) || get_streaming(obj, r, e) || get_stop(obj, r, e) ||
        get_bool(obj, "ignore_eos", &r->ignore_eos, e))
        return -1;
    return get_label(obj, "workflow_id", &r->workflow_id, e) || get_label(obj, "agent", &r->agent, e) ||
                   get_label(obj, "tenant", &r->tenant, e) || get_label(obj, "adapter", &r->adapter, e)
               ? -1
               : 0;
}

int api_request_parse(const char *body, size_t len, ApiKind kind, const char *served_model, ApiRequest *r, ApiError *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->max_tokens = -1;
    json_error_t jerr;
    json_t *obj = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj) {
        return api_error_set(e, 400, NULL, NULL, "request body is not valid JSON: %s at line %d column %d", jerr.text, jerr.line,
                             jerr.column);
    }
    int rc = json_is_object(obj) ? parse_fields(obj, kind, served_model, r, e)
                                 : api_error_set(e, 400, NULL, NULL, "request body must be a JSON object, got %s", json_kind(obj));
    json_decref(obj);
    if (rc) api_request_free(r);
    return rc;
}

static int apply_header(const char *key, const char *value, char **slot, ApiError *e) {
    if (!value || *slot) return 0;
    if (check_label(key, value, strlen(value), e)) return -1;
    if (!(*slot = strdup(value))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return 0;
}

int api_request_apply_headers(ApiRequest *r, const char *workflow, const char *agent, const char *tenant, const char *adapter,
                              ApiError *e) {
    return apply_header("X-Braid-Workflow", workflow, &r->workflow_id, e) || apply_header("X-Braid-Agent", agent, &r->agent, e) ||
                   apply_header("X-Braid-Tenant", tenant, &r->tenant, e) || apply_header("X-Braid-Adapter", adapter, &r->adapter, e)
               ? -1
               : 0;
}
