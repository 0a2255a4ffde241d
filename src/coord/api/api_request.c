/*
 * api_request.c — OpenAI request bodies to ApiRequest; the contract is in api_request.h.
 *
 * Shape: one small reader per field or group of fields, each returning 0, or -1 with the error set.
 * Readers fill the request as they go and never unwind: when one fails, api_request_parse frees
 * whatever was filled. Every error message starts with the field's name (as does param), so a
 * client sees at once which part of its body to fix.
 */
#include "coord/api/api_json.h"
#include "coord/api/api_request.h"
#include "coord/api/api_directives.h"
#include "coord/api/api_tools.h"

#include "cache/kv_cache.h"
#include "common/mix64.h"
#include "coord/api/api_fields.h"

#include <assert.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* How much of a client-supplied string an error message quotes; enough to recognise it. */
#define QUOTE_BYTES 64

static const char *const known_roles[] = {"system", "developer", "user", "assistant", "tool"};

/* ---- UTF-8 ---- */

/* Length of the well-formed UTF-8 sequence at s (avail bytes readable), or 0 when the bytes there
 * are not one: a stray continuation byte, an overlong form, a surrogate, or past U+10FFFF. */
static size_t utf8_sequence_length(const unsigned char *s, size_t avail) {
    unsigned char lead = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) {
        len = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        len = 3;
        if (lead == 0xE0) lo = 0xA0; /* overlong below U+0800 */
        if (lead == 0xED) hi = 0x9F; /* surrogates */
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        len = 4;
        if (lead == 0xF0) lo = 0x90; /* overlong below U+10000 */
        if (lead == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (avail < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

static bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = utf8_sequence_length((const unsigned char *)s + i, n - i);
        if (k == 0) return false;
        i += k;
    }
    return true;
}

/* Copies the NUL-terminated src (an array of size bytes) into dst (also size bytes), replacing every
 * byte that does not start a well-formed sequence with '?'; the output is never longer. */
static void copy_as_utf8(char *dst, const char *src, size_t size) {
    size_t n = strnlen(src, size - 1), out = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_sequence_length((const unsigned char *)src + i, n - i);
        if (k == 0) {
            dst[out++] = '?';
            i++;
            continue;
        }
        memcpy(dst + out, src + i, k);
        out += k;
        i += k;
    }
    dst[out] = '\0';
}

/* How many bytes of the valid UTF-8 string s an error message quotes: at most QUOTE_BYTES, cut at a
 * character boundary so the message stays valid UTF-8. For use as "%.*s". */
static int quote_len(const char *s) {
    size_t n = strnlen(s, QUOTE_BYTES + 1);
    if (n <= QUOTE_BYTES) return (int)n;
    n = QUOTE_BYTES;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* s[n] would be cut off mid-character */
    return (int)n;
}

/* ---- errors ---- */

static const char *error_type_for(int status) {
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

int api_error_set(ApiError *err, int status, const char *param, const char *code, const char *fmt, ...) {
    err->status = status;
    snprintf(err->type, sizeof err->type, "%s", error_type_for(status));
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    snprintf(err->code, sizeof err->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int out_of_memory(ApiError *err) {
    return api_error_set(err, 503, NULL, NULL, "the server is out of memory; retry shortly");
}

/* Adds key: text to obj, as valid UTF-8; an empty text becomes null when empty_is_null (OpenAI
 * sends "param": null and "code": null rather than empty strings). */
static int put_text(json_t *obj, const char *key, const char *text, size_t size, bool empty_is_null) {
    char clean[sizeof ((ApiError *)0)->message];
    copy_as_utf8(clean, text, size < sizeof clean ? size : sizeof clean);
    json_t *value = empty_is_null && clean[0] == '\0' ? json_null() : json_string(clean);
    return json_object_set_new(obj, key, value); /* a NULL value (no memory) fails here */
}

char *api_error_json(const ApiError *err) {
    json_t *body = json_object(), *inner = json_object();
    char *text = NULL;
    if (body && inner && put_text(inner, "message", err->message, sizeof err->message, false) == 0 &&
        put_text(inner, "type", err->type, sizeof err->type, false) == 0 &&
        put_text(inner, "param", err->param, sizeof err->param, true) == 0 &&
        put_text(inner, "code", err->code, sizeof err->code, true) == 0 && json_object_set(body, "error", inner) == 0)
        text = json_dumps(body, JSON_COMPACT);
    json_decref(inner);
    json_decref(body);
    return text;
}

/* ---- reading JSON values ---- */

/* Describes a JSON value for an error message: numbers and booleans by value, the rest by type.
 * buf (cap bytes) holds the text when it has to be formatted. */
static const char *describe(const json_t *v, char *buf, size_t cap) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_INTEGER:
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case JSON_REAL: {
        snprintf(buf, cap, "%.10g", json_real_value(v));
        size_t n = strlen(buf);
        /* 1.0 prints as "1"; show it is a real, or "got 1" beside "must be an integer" reads as a bug. */
        if (strspn(buf, "-0123456789") == n && n + 3 <= cap) memcpy(buf + n, ".0", 3);
        return buf;
    }
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "a value of unknown type";
}

/* "<param> must be <expected>, got <what v is>" as a 400. v may be NULL (the field is missing). */
static int type_error(ApiError *err, const char *param, const char *expected, const json_t *v) {
    char got[48];
    return api_error_set(err, 400, param, NULL, "%s must be %s, got %s", param, expected, describe(v, got, sizeof got));
}

/* A malloc'd copy of a JSON string (copied by length; the parser refuses embedded NULs anyway). */
static char *copy_string(const json_t *s) {
    size_t n = json_string_length(s);
    char *copy = malloc(n + 1);
    if (!copy) return NULL;
    memcpy(copy, json_string_value(s), n);
    copy[n] = '\0';
    return copy;
}

static int read_bool(const json_t *obj, const char *key, const char *param, bool *out, ApiError *err) {
    const json_t *v = api_json_present(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return type_error(err, param, "a boolean (true or false)", v);
    *out = json_is_true(v);
    return 0;
}

/* A number in [lo, hi], or (lo, hi] when lo_open; absent leaves *out at its default. */
static int read_ranged_number(const json_t *obj, const char *key, double lo, bool lo_open, double hi, double *out,
                              ApiError *err) {
    const json_t *v = api_json_present(obj, key);
    if (!v) return 0;
    if (!json_is_number(v)) return type_error(err, key, "a number", v);
    double x = json_number_value(v);
    bool in_range = (lo_open ? x > lo : x >= lo) && x <= hi; /* written so a NaN fails too */
    if (!in_range) {
        char got[48];
        return api_error_set(err, 400, key, NULL, "%s must be in %s%g, %g], got %s", key, lo_open ? "(" : "[", lo, hi,
                             describe(v, got, sizeof got));
    }
    *out = x;
    return 0;
}

/* ---- model ---- */

static int read_model(const json_t *body, const char *served, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "model");
    if (!v) return 0;
    if (!json_is_string(v)) return type_error(err, "model", "a string", v);
    const char *name = json_string_value(v);
    if (served && strcmp(name, served) != 0)
        return api_error_set(err, 404, "model", "model_not_found", "The model '%.*s' does not exist; this server serves '%s'",
                             quote_len(name), name, served);
    return (r->model = copy_string(v)) ? 0 : out_of_memory(err);
}

/* ---- chat messages ---- */

static bool is_known_role(const char *role) {
    for (size_t i = 0; i < sizeof known_roles / sizeof known_roles[0]; i++)
        if (strcmp(role, known_roles[i]) == 0) return true;
    return false;
}

static int read_role(const json_t *msg, const char *path, char **out, ApiError *err) {
    char param[64];
    snprintf(param, sizeof param, "%s.role", path);
    const json_t *v = api_json_present(msg, "role");
    if (!v || !json_is_string(v)) return type_error(err, param, "a string", v);
    const char *role = json_string_value(v);
    if (!is_known_role(role))
        return api_error_set(err, 400, param, NULL, "%s must be one of system, developer, user, assistant, tool; got '%.*s'", param,
                             quote_len(role), role);
    return (*out = copy_string(v)) ? 0 : out_of_memory(err);
}

/* One element of a content array: {"type": "text", "text": "..."}. path names the element. */
static int check_text_part(const json_t *part, const char *path, ApiError *err) {
    if (!json_is_object(part)) return type_error(err, path, "an object like {\"type\": \"text\", \"text\": \"...\"}", part);
    char param[96];
    const json_t *type = api_json_present(part, "type");
    if (!type || !json_is_string(type)) {
        snprintf(param, sizeof param, "%s.type", path);
        return type_error(err, param, "a string", type);
    }
    const char *name = json_string_value(type);
    if (strcmp(name, "text") != 0)
        return api_error_set(err, 400, path, NULL, "%s has type '%.*s'; only text content parts are supported", path, quote_len(name),
                             name);
    const json_t *text = api_json_present(part, "text");
    if (!text || !json_is_string(text)) {
        snprintf(param, sizeof param, "%s.text", path);
        return type_error(err, param, "a string", text);
    }
    return 0;
}

/* Content given as parts: the text parts joined without separators, as OpenAI reads them. */
static int join_text_parts(const json_t *parts, const char *path, char **out, ApiError *err) {
    size_t n = json_array_size(parts), total = 0;
    for (size_t p = 0; p < n; p++) {
        char where[80]; /* sized so gcc can prove "<where>.text" fits check_text_part's buffer */
        snprintf(where, sizeof where, "%s[%zu]", path, p);
        if (check_text_part(json_array_get(parts, p), where, err)) return -1;
        total += json_string_length(json_object_get(json_array_get(parts, p), "text"));
    }
    char *text = malloc(total + 1);
    if (!text) return out_of_memory(err);
    size_t at = 0;
    for (size_t p = 0; p < n; p++) {
        const json_t *part_text = json_object_get(json_array_get(parts, p), "text");
        memcpy(text + at, json_string_value(part_text), json_string_length(part_text));
        at += json_string_length(part_text);
    }
    text[at] = '\0';
    *out = text;
    return 0;
}

/* cache_control on any of a message's parts applies to the message (the pin ends after it). */
static int read_parts_cache_control(const json_t *parts, const char *path, double *ttl_s, ApiError *err) {
    for (size_t p = 0; p < json_array_size(parts); p++) {
        const json_t *cc = json_object_get(json_array_get(parts, p), "cache_control");
        if (!cc || json_is_null(cc)) continue;
        char param[160];
        double ttl;
        snprintf(param, sizeof param, "%s[%zu].cache_control", path, p);
        if (api_cache_control_parse(cc, param, &ttl, err)) return -1;
        if (ttl > *ttl_s) *ttl_s = ttl;
    }
    return 0;
}

static int read_content(const json_t *msg, const char *path, const char *role, char **out, bool *is_null, ApiError *err) {
    char param[48];
    snprintf(param, sizeof param, "%s.content", path);
    const json_t *v = api_json_present(msg, "content");
    if (!v) {
        /* An assistant turn that only made tool calls carries no text; every other turn must. */
        if (strcmp(role, "assistant") != 0)
            return api_error_set(err, 400, param, NULL, "%s is required for role %s (only assistant messages may omit it)", param, role);
        *is_null = true;
        *out = strdup("");
        return *out ? 0 : out_of_memory(err);
    }
    if (json_is_string(v)) return (*out = copy_string(v)) ? 0 : out_of_memory(err);
    if (json_is_array(v)) return join_text_parts(v, param, out, err);
    return type_error(err, param, "a string, null or an array of text parts", v);
}

/* A message holds role, content, cache_control and the tool fields (api_tools.h); the chat template
 * renders nothing else, so any other field would be silently dropped: it is refused instead, by
 * name. Null reads as absent, as everywhere in the body (clients echo back "refusal": null). */
static int check_message_fields(const json_t *msg, const char *path, ApiError *err) {
    static const char *const fields[] = {"role", "content", "cache_control", "tool_calls", "tool_call_id", "name"};
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)msg, key, value) {
        bool known = json_is_null(value);
        for (size_t i = 0; i < sizeof fields / sizeof fields[0] && !known; i++) known = strcmp(key, fields[i]) == 0;
        if (known) continue;
        char param[96];
        snprintf(param, sizeof param, "%s.%.*s", path, quote_len(key), key);
        return api_error_set(err, 400, param, NULL,
                             "%s is not supported: a message holds role, content, name, tool_calls, tool_call_id and cache_control",
                             param);
    }
    return 0;
}

static int read_message(const json_t *msg, size_t index, ApiMessage *out, ApiError *err) {
    char path[32];
    snprintf(path, sizeof path, "messages[%zu]", index);
    if (!json_is_object(msg)) return type_error(err, path, "an object with role and content", msg);
    if (read_role(msg, path, &out->role, err)) return -1;
    if (read_content(msg, path, out->role, &out->content, &out->content_null, err)) return -1;
    if (api_message_read_tools(msg, path, out, err)) return -1;
    const json_t *cc = api_json_present(msg, "cache_control"), *content = api_json_present(msg, "content");
    char param[64];
    snprintf(param, sizeof param, "%s.cache_control", path);
    if (cc && api_cache_control_parse(cc, param, &out->cache_ttl_s, err)) return -1;
    snprintf(param, sizeof param, "%s.content", path);
    if (json_is_array(content) && read_parts_cache_control(content, param, &out->cache_ttl_s, err)) return -1;
    return check_message_fields(msg, path, err);
}

static int read_messages(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "messages");
    if (!v) return api_error_set(err, 400, "messages", NULL, "messages is required for a chat completion");
    if (!json_is_array(v)) return type_error(err, "messages", "an array of message objects", v);
    size_t n = json_array_size(v);
    if (n == 0) return api_error_set(err, 400, "messages", NULL, "messages must hold at least one message, got an empty array");
    if (n > API_MAX_MESSAGES)
        return api_error_set(err, 400, "messages", NULL, "messages holds %zu entries; at most %d are supported", n, API_MAX_MESSAGES);
    if (!(r->messages = calloc(n, sizeof *r->messages))) return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        r->n_messages++; /* counted before it is filled, so a failure half-way still frees its role */
        if (read_message(json_array_get(v, i), i, &r->messages[i], err)) return -1;
    }
    return api_tools_check_conversation(r, err);
}

/* ---- completion prompt ---- */

/* A list of token ids: non-negative integers that fit an int32 (the vocabulary check is the caller's). */
static int read_prompt_ids(const json_t *v, const char *param, ApiPrompt *out, ApiError *err) {
    size_t n = json_array_size(v);
    if (n == 0) return api_error_set(err, 400, "prompt", NULL, "%s is an empty list of token ids", param);
    if (!(out->ids = malloc(n * sizeof *out->ids))) return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *id = json_array_get(v, i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX) {
            char got[48];
            return api_error_set(err, 400, "prompt", NULL, "%s[%zu] must be a token id (an integer >= 0), got %s", param, i,
                                 describe(id, got, sizeof got));
        }
        out->ids[out->n_ids++] = (int32_t)json_integer_value(id);
    }
    return 0;
}

/* One prompt: a string or a list of token ids. */
static int read_one_prompt(const json_t *v, const char *param, ApiPrompt *out, ApiError *err) {
    if (json_is_string(v)) return (out->text = copy_string(v)) ? 0 : out_of_memory(err);
    if (json_is_array(v)) return read_prompt_ids(v, param, out, err);
    char got[48];
    return api_error_set(err, 400, "prompt", NULL, "%s must be a string or a list of token ids, got %s", param,
                         describe(v, got, sizeof got));
}

/* OpenAI's four shapes: "text", ["text", ...], [id, ...], [[id, ...], ...]. A list whose first
 * element is an integer is one token-id prompt; otherwise each element is a prompt. */
static int read_prompt(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "prompt");
    if (!v) return api_error_set(err, 400, "prompt", NULL, "prompt is required for a completion");
    bool single = !json_is_array(v) || json_is_integer(json_array_get(v, 0));
    size_t n = single ? 1 : json_array_size(v);
    if (n == 0) return api_error_set(err, 400, "prompt", NULL, "prompt is an empty list; send at least one prompt");
    if (n > API_MAX_PROMPTS)
        return api_error_set(err, 400, "prompt", NULL, "prompt holds %zu prompts; at most %d are supported", n, API_MAX_PROMPTS);
    if (!(r->prompts = calloc(n, sizeof *r->prompts))) return out_of_memory(err);
    for (size_t i = 0; i < n; i++) {
        char param[32];
        if (single) snprintf(param, sizeof param, "prompt");
        else snprintf(param, sizeof param, "prompt[%zu]", i);
        r->n_prompts++; /* counted before it is filled, so a failure half-way still frees it */
        if (read_one_prompt(single ? v : json_array_get(v, i), param, &r->prompts[i], err)) return -1;
    }
    return 0;
}

/* ---- generation limits and sampling ---- */

/* max_tokens or max_completion_tokens: an integer in [1, API_MAX_TOKENS_LIMIT]; *out = -1 when absent. */
static int read_token_budget(const json_t *body, const char *key, int *out, ApiError *err) {
    const json_t *v = api_json_present(body, key);
    *out = -1;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1) return type_error(err, key, "a positive integer", v);
    if (json_integer_value(v) > API_MAX_TOKENS_LIMIT)
        return api_error_set(err, 400, key, NULL, "%s must be at most %d, got %" JSON_INTEGER_FORMAT, key, API_MAX_TOKENS_LIMIT,
                             json_integer_value(v));
    *out = (int)json_integer_value(v);
    return 0;
}

/* OpenAI renamed max_tokens to max_completion_tokens; clients may send either or both. */
static int read_max_tokens(const json_t *body, ApiRequest *r, ApiError *err) {
    int legacy, current;
    if (read_token_budget(body, "max_tokens", &legacy, err) || read_token_budget(body, "max_completion_tokens", &current, err))
        return -1;
    if (legacy > 0 && current > 0 && legacy != current)
        return api_error_set(err, 400, "max_completion_tokens", NULL,
                             "max_completion_tokens (%d) and max_tokens (%d) disagree; send one of them", current, legacy);
    r->max_tokens = current > 0 ? current : legacy;
    return 0;
}

static int read_top_k(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "top_k");
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) return type_error(err, "top_k", "an integer >= 0 (0 = off)", v);
    json_int_t k = json_integer_value(v);
    /* A top_k beyond the vocabulary keeps every token, so clamping a huge one changes nothing. */
    r->top_k = k > INT_MAX ? INT_MAX : (int)k;
    return 0;
}

static int read_seed(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "seed");
    if (!v) return 0;
    if (!json_is_integer(v)) return type_error(err, "seed", "an integer", v);
    r->has_seed = true;
    r->seed = (uint64_t)json_integer_value(v); /* OpenAI accepts negative seeds; keep their bits */
    return 0;
}

/* n: choices per prompt. Each choice is its own sequence; they share the prompt's KV (http_generate.c). */
static int read_n(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "n");
    r->n = 1;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > API_MAX_N) {
        char got[48];
        return api_error_set(err, 400, "n", NULL, "n must be an integer in [1, %d], got %s", API_MAX_N, describe(v, got, sizeof got));
    }
    r->n = (int)json_integer_value(v);
    size_t choices = (size_t)r->n * (size_t)(r->n_prompts > 0 ? r->n_prompts : 1);
    if (choices > API_MAX_CHOICES)
        return api_error_set(err, 400, "n", NULL, "n = %d over %d prompts asks for %zu choices; at most %d are supported", r->n,
                             r->n_prompts, choices, API_MAX_CHOICES);
    return 0;
}

static int read_sampling(const json_t *body, ApiRequest *r, ApiError *err) {
    if (read_ranged_number(body, "temperature", 0.0, false, 2.0, &r->temperature, err)) return -1;
    if (read_ranged_number(body, "top_p", 0.0, true, 1.0, &r->top_p, err)) return -1;
    if (read_top_k(body, r, err) || read_seed(body, r, err)) return -1;
    return read_n(body, r, err);
}

/* ---- logprobs ---- */

/* A count of top alternatives in [0, API_MAX_TOP_LOGPROBS]. */
static int read_top_count(const json_t *v, const char *param, int *out, ApiError *err) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > API_MAX_TOP_LOGPROBS) {
        char got[48];
        return api_error_set(err, 400, param, NULL, "%s must be an integer in [0, %d], got %s", param, API_MAX_TOP_LOGPROBS,
                             describe(v, got, sizeof got));
    }
    *out = (int)json_integer_value(v);
    return 0;
}

/* Chat: logprobs (bool) and top_logprobs (0..20, only with logprobs, as OpenAI requires).
 * Completions: logprobs is the count of top alternatives itself. */
static int read_logprobs(const json_t *body, ApiRequest *r, ApiError *err) {
    r->logprobs = -1;
    const json_t *v = api_json_present(body, "logprobs");
    if (r->kind == API_COMPLETION) return v ? read_top_count(v, "logprobs", &r->logprobs, err) : 0;
    bool on = false;
    if (read_bool(body, "logprobs", "logprobs", &on, err)) return -1;
    const json_t *top = api_json_present(body, "top_logprobs");
    if (top && !on) return api_error_set(err, 400, "top_logprobs", NULL, "top_logprobs needs logprobs set to true");
    int count = 0;
    if (top && read_top_count(top, "top_logprobs", &count, err)) return -1;
    r->logprobs = on ? count : -1;
    return 0;
}

/* ---- streaming and stop strings ---- */

static int read_stream(const json_t *body, ApiRequest *r, ApiError *err) {
    if (read_bool(body, "stream", "stream", &r->stream, err)) return -1;
    const json_t *opts = api_json_present(body, "stream_options");
    if (!opts) return 0;
    if (!json_is_object(opts)) return type_error(err, "stream_options", "an object", opts);
    /* OpenAI refuses stream_options without streaming instead of ignoring them; so do we, so a
     * client expecting a usage chunk learns here why none would come. */
    if (!r->stream) return api_error_set(err, 400, "stream_options", NULL, "stream_options is only allowed when stream is true");
    return read_bool(opts, "include_usage", "stream_options.include_usage", &r->include_usage, err);
}

static int add_stop(ApiRequest *r, const json_t *s, ApiError *err) {
    /* An empty stop string would match before the first token and end every completion at once. */
    if (json_string_length(s) == 0) return 0;
    if (!(r->stop[r->n_stop] = copy_string(s))) return out_of_memory(err);
    r->n_stop++;
    return 0;
}

static int read_stop(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "stop");
    if (!v) return 0;
    if (!json_is_string(v) && !json_is_array(v)) return type_error(err, "stop", "a string or an array of strings", v);
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > API_MAX_STOPS) return api_error_set(err, 400, "stop", NULL, "stop holds at most %d strings, got %zu", API_MAX_STOPS, n);
    for (size_t i = 0; json_is_array(v) && i < n; i++) {
        if (json_is_string(json_array_get(v, i))) continue;
        char param[32];
        snprintf(param, sizeof param, "stop[%zu]", i);
        return type_error(err, param, "a string", json_array_get(v, i));
    }
    if (!(r->stop = calloc(API_MAX_STOPS, sizeof *r->stop))) return out_of_memory(err);
    for (size_t i = 0; i < n; i++)
        if (add_stop(r, json_is_array(v) ? json_array_get(v, i) : v, err)) return -1;
    return 0;
}

/* ---- Braid labels ---- */

/* A label (workflow_id, agent, tenant, adapter) from the body or a header: 1..API_MAX_LABEL_BYTES of
 * UTF-8 without control characters, since labels travel into logs, metrics and wire messages.
 * param is the field; what is how the message names the source ("agent", "header X-Braid-Agent"). */
static int check_label(const char *param, const char *what, const char *s, size_t n, ApiError *err) {
    if (n == 0 || n > API_MAX_LABEL_BYTES)
        return api_error_set(err, 400, param, NULL, "%s must be 1 to %d bytes, got %zu", what, API_MAX_LABEL_BYTES, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            return api_error_set(err, 400, param, NULL, "%s must not contain control characters (byte 0x%02x at offset %zu)", what, c, i);
    }
    if (!utf8_valid(s, n)) return api_error_set(err, 400, param, NULL, "%s is not valid UTF-8", what);
    return 0;
}

int api_request_check_label(const char *param, const char *what, const char *s, size_t n, ApiError *err) {
    return check_label(param, what, s, n, err);
}

static int read_label(const json_t *body, const char *key, char **out, ApiError *err) {
    const json_t *v = api_json_present(body, key);
    if (!v) return 0;
    if (!json_is_string(v)) return type_error(err, key, "a string", v);
    if (check_label(key, key, json_string_value(v), json_string_length(v), err)) return -1;
    return (*out = copy_string(v)) ? 0 : out_of_memory(err);
}

static int read_labels(const json_t *body, ApiRequest *r, ApiError *err) {
    if (read_label(body, "workflow_id", &r->workflow_id, err) || read_label(body, "agent", &r->agent, err)) return -1;
    return read_label(body, "tenant", &r->tenant, err) || read_label(body, "adapter", &r->adapter, err) ? -1 : 0;
}

/* OpenAI's prompt_cache_retention: "in_memory" is what the cache does anyway; "24h" keeps the
 * prompt's blocks (pinned) for a day. */
static int read_cache_retention(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "prompt_cache_retention");
    if (!v) return 0;
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    if (strcmp(s, "in_memory") == 0) return 0;
    if (strcmp(s, "24h") == 0) return r->prompt_cache_retention_s = 24 * 3600.0, 0;
    return api_error_set(err, 400, "prompt_cache_retention", NULL, "prompt_cache_retention must be \"in_memory\" or \"24h\"");
}

/* ---- the whole body ---- */

/* The body as a JSON object, or NULL with err set. */
static json_t *load_body(const char *body, size_t len, ApiError *err) {
    if (!body || len == 0) {
        api_error_set(err, 400, NULL, NULL, "request body is empty; expected a JSON object");
        return NULL;
    }
    json_error_t jerr;
    /* JSON_DECODE_ANY: a bare 3 or "text" is valid JSON, just not an object; say exactly that. */
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root) {
        enum json_error_code code = json_error_code(&jerr);
        if (code == json_error_out_of_memory) out_of_memory(err);
        else if (code == json_error_invalid_utf8)
            api_error_set(err, 400, NULL, NULL, "request body is not valid JSON: invalid UTF-8 (%s) at line %d column %d", jerr.text,
                          jerr.line, jerr.column);
        else
            api_error_set(err, 400, NULL, NULL, "request body is not valid JSON: %s at line %d column %d", jerr.text, jerr.line,
                          jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        char got[48];
        api_error_set(err, 400, NULL, NULL, "request body must be a JSON object, got %s", describe(root, got, sizeof got));
        json_decref(root);
        return NULL;
    }
    return root;
}

/* segment_reuse: "off", "exact" or "approx" (whether the server allows it is checked later). */
static int read_segment_reuse(const json_t *body, ApiRequest *r, ApiError *err) {
    const json_t *v = api_json_present(body, "segment_reuse");
    if (!v) return 0;
    int mode = json_is_string(v) ? segment_reuse_parse(json_string_value(v)) : -1;
    if (mode < 0) return api_error_set(err, 400, "segment_reuse", NULL, "segment_reuse must be \"off\", \"exact\" or \"approx\"");
    r->segment_reuse = mode;
    return 0;
}

static int read_fields(const json_t *body, ApiKind kind, const char *served, ApiRequest *r, ApiError *err) {
    if (read_model(body, served, r, err)) return -1;
    if (kind == API_CHAT ? read_messages(body, r, err) : read_prompt(body, r, err)) return -1;
    if (read_max_tokens(body, r, err) || read_sampling(body, r, err)) return -1;
    if (read_stream(body, r, err) || read_stop(body, r, err)) return -1;
    if (read_bool(body, "ignore_eos", "ignore_eos", &r->ignore_eos, err) || read_logprobs(body, r, err)) return -1;
    if (read_segment_reuse(body, r, err) || read_labels(body, r, err)) return -1;
    if (api_directives_parse(api_json_present(body, "directives"), &r->directives, &r->n_directives, err)) return -1;
    if (read_label(body, "conversation_id", &r->conversation_id, err) || api_auto_splice_parse(api_json_present(body, "auto_splice"), &r->auto_splice, err))
        return -1;
    if (read_label(body, "prompt_cache_key", &r->prompt_cache_key, err) || read_cache_retention(body, r, err)) return -1;
    if (read_label(body, "cache_id", &r->cache_id, err)) return -1;
    if (kind == API_CHAT && api_tools_read(body, r, err)) return -1;
    return api_fields_check(body, kind, err);
}

int api_request_parse(const char *body, size_t len, ApiKind kind, const char *served_model, ApiRequest *out, ApiError *err) {
    assert(kind == API_CHAT || kind == API_COMPLETION);
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1;
    out->segment_reuse = -1;
    out->auto_splice = -1;
    out->temperature = 1.0;
    out->top_p = 1.0;
    out->n = 1;
    out->logprobs = -1;
    json_t *root = load_body(body, len, err);
    int rc = root ? read_fields(root, kind, served_model, out, err) : -1;
    json_decref(root);
    if (rc) api_request_free(out);
    return rc;
}

void api_request_free(ApiRequest *r) {
    if (!r) return;
    api_directives_free(r->directives, r->n_directives);
    free(r->conversation_id);
    free(r->prompt_cache_key);
    free(r->cache_id);
    for (int i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
        api_message_free_tools(&r->messages[i]);
    }
    json_decref(r->tools);
    json_decref(r->response_schema);
    free(r->tool_choice_name);
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    free(r->workflow_id);
    free(r->agent);
    free(r->tenant);
    free(r->adapter);
    free(r->adapter_cache);
    memset(r, 0, sizeof *r);
}

/* ---- the seed ---- */



uint64_t api_request_sampling_seed(const ApiRequest *r, uint64_t salt) {
    if (r->has_seed) return r->seed;
    uint64_t entropy = 0;
    /* getrandom never blocks once the pool is initialised (long before a server starts); should it
     * fail, the clocks still differ between calls and the salt differs between requests. */
    if (getrandom(&entropy, sizeof entropy, GRND_NONBLOCK) != (ssize_t)sizeof entropy) {
        struct timespec mono, wall;
        clock_gettime(CLOCK_MONOTONIC, &mono);
        clock_gettime(CLOCK_REALTIME, &wall);
        entropy = mix64_finalize((uint64_t)mono.tv_nsec ^ ((uint64_t)mono.tv_sec << 30)) ^ (uint64_t)wall.tv_nsec;
    }
    return mix64_finalize(entropy ^ mix64_finalize(salt + 0x9e3779b97f4a7c15ULL));
}

/* ---- headers ---- */

int api_request_apply_headers(ApiRequest *r, const char *workflow, const char *agent, const char *tenant, const char *adapter,
                              ApiError *err) {
    static const char *const names[4] = {"X-Braid-Workflow", "X-Braid-Agent", "X-Braid-Tenant", "X-Braid-Adapter"};
    static const char *const params[4] = {"workflow_id", "agent", "tenant", "adapter"};
    const char *values[4] = {workflow, agent, tenant, adapter};
    char **slots[4] = {&r->workflow_id, &r->agent, &r->tenant, &r->adapter};
    char *copies[4] = {NULL, NULL, NULL, NULL};
    /* Check and copy everything before touching r, so a failure leaves the request as it was. */
    for (int i = 0; i < 4; i++) {
        if (!values[i]) continue;
        char what[40];
        snprintf(what, sizeof what, "header %s", names[i]);
        int rc = check_label(params[i], what, values[i], strlen(values[i]), err);
        /* Body and header naming different values: which one the client meant is a guess, and for
         * the tenant a wrong guess puts the request in another cache namespace. */
        if (rc == 0 && *slots[i] && strcmp(*slots[i], values[i]) != 0)
            rc = api_error_set(err, 400, params[i], NULL, "%s in the body ('%.*s') and header %s ('%.*s') disagree; send one of them",
                               params[i], quote_len(*slots[i]), *slots[i], names[i], quote_len(values[i]), values[i]);
        if (rc == 0 && !*slots[i] && !(copies[i] = strdup(values[i]))) rc = out_of_memory(err);
        if (rc) {
            for (int j = 0; j < i; j++) free(copies[j]);
            return -1;
        }
    }
    for (int i = 0; i < 4; i++)
        if (copies[i]) *slots[i] = copies[i];
    return 0;
}
