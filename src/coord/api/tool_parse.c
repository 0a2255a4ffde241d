/* Tool calls out of a model's answer; the contract is in tool_parse.h. */
#include "coord/api/tool_parse.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/mix64.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_MARK "[TOOL_CALLS]"
#define PYTHON_TAG "<|python_tag|>"

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *find(const char *hay, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(hay + i, needle, n) == 0) return hay + i;
    return NULL;
}

/* ---- calls ---- */

/* An id for call i: OpenAI-like "call_" + 24 alphanumerics, or the 9 alphanumerics Mistral's
 * templates require. Derived from the seed so a request's ids are stable across its renderings. */
static void make_id(ToolSyntax s, uint64_t seed, size_t i, char *out) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t n = s == TOOL_SYNTAX_MISTRAL ? 9 : 24, at = 0;
    if (s != TOOL_SYNTAX_MISTRAL) at = (size_t)(stpcpy(out, "call_") - out);
    uint64_t x = mix64(seed ^ mix64(i + 1));
    for (size_t k = 0; k < n; k++) {
        if (k % 10 == 9) x = mix64(x + k);
        out[at++] = alphabet[x % 62];
        x /= 62;
    }
    out[at] = '\0';
}

/* Adds {name, arguments} to calls when obj is a call: a string name and an object of arguments
 * under one of the keys (a string holding an object is read too). False when obj is not a call. */
static bool add_call(json_t *calls, const json_t *obj, const char *args_key, const char *alt_key) {
    const json_t *name = json_object_get(obj, "name"), *args = json_object_get(obj, args_key);
    if (!args && alt_key) args = json_object_get(obj, alt_key);
    if (!json_is_string(name) || json_string_length(name) == 0) return false;
    json_t *parsed = NULL;
    if (json_is_string(args)) args = parsed = json_loads(json_string_value(args), 0, NULL);
    if (!args) args = parsed = json_object();
    if (!json_is_object(args)) {
        json_decref(parsed);
        return false;
    }
    char *text = json_dumps(args, JSON_COMPACT);
    json_decref(parsed);
    if (!text) return false;
    json_t *call = json_pack("{s:s, s:{s:O, s:s}}", "type", "function", "function", "name", name, "arguments", text);
    free(text);
    return call && json_array_append_new(calls, call) == 0;
}

/* Gives the calls their ids and keeps the first max_calls. */
static void finish_calls(ToolSyntax s, json_t *calls, int max_calls, uint64_t seed) {
    while ((int)json_array_size(calls) > max_calls) json_array_remove(calls, json_array_size(calls) - 1);
    for (size_t i = 0; i < json_array_size(calls); i++) {
        char id[40];
        make_id(s, seed, i, id);
        json_t *call = json_array_get(calls, i);
        json_t *ordered = json_pack("{s:s, s:O, s:O}", "id", id, "type", json_object_get(call, "type"), "function",
                                    json_object_get(call, "function"));
        if (ordered) json_array_set_new(calls, i, ordered);
    }
}

/* ---- content ---- */

/* Appends text[0, n) to the content, trailing whitespace cut, separated from what is there by a
 * newline; whitespace-only pieces add nothing. */
static int append_content(ToolParse *p, const char *text, size_t n) {
    while (n > 0 && is_space(text[n - 1])) n--;
    size_t first = 0;
    while (first < n && is_space(text[first])) first++;
    if (first == n) return 0;
    if (p->content) text += first, n -= first; /* the first piece keeps its leading text: it may have streamed */
    size_t sep = p->content ? 1 : 0;
    char *grown = realloc(p->content, p->content_len + sep + n + 1);
    if (!grown) return -1;
    if (sep) grown[p->content_len] = '\n';
    memcpy(grown + p->content_len + sep, text, n);
    p->content = grown;
    p->content_len += sep + n;
    p->content[p->content_len] = '\0';
    return 0;
}

static int set_whole_content(ToolParse *p, const char *text, size_t len) {
    free(p->content);
    if (!(p->content = malloc(len + 1))) return -1;
    memcpy(p->content, text, len);
    p->content[len] = '\0';
    p->content_len = len;
    return 0;
}

/* ---- per syntax ---- */

static json_t *load_json(const char *text, size_t len) {
    while (len > 0 && is_space(*text)) text++, len--;
    while (len > 0 && is_space(text[len - 1])) len--;
    return len ? json_loadb(text, len, 0, NULL) : NULL;
}

/* A reply that is nothing but call objects separated by ';' or whitespace, after an optional
 * <|python_tag|> and inside optional ``` fences. False (calls left empty) when it is anything else. */
static bool parse_bare_calls(const char *text, size_t len, json_t *calls, const char *args_key, const char *alt_key) {
    size_t at = 0;
    while (at < len && is_space(text[at])) at++;
    while (len > at && is_space(text[len - 1])) len--;
    if (len - at >= strlen(PYTHON_TAG) && memcmp(text + at, PYTHON_TAG, strlen(PYTHON_TAG)) == 0) at += strlen(PYTHON_TAG);
    if (len - at >= 6 && memcmp(text + at, "```", 3) == 0 && memcmp(text + len - 3, "```", 3) == 0) {
        at += 3;
        while (at < len && text[at] != '\n') at++; /* the fence's language tag */
        len -= 3;
    }
    bool ok = true;
    while (ok) {
        while (at < len && (is_space(text[at]) || text[at] == ';')) at++;
        if (at == len) break;
        json_error_t jerr;
        json_t *obj = text[at] == '{' ? json_loadb(text + at, len - at, JSON_DISABLE_EOF_CHECK, &jerr) : NULL;
        ok = json_is_object(obj) && json_object_get(obj, "name") && (json_object_get(obj, args_key) || json_object_get(obj, alt_key)) &&
             add_call(calls, obj, args_key, alt_key);
        if (obj) at += (size_t)jerr.position;
        json_decref(obj);
    }
    if (ok && json_array_size(calls) > 0) return true;
    json_array_clear(calls);
    return false;
}

static int parse_hermes(const char *text, size_t len, json_t *calls, ToolParse *p) {
    /* Some Hermes-style models (Qwen2.5-Coder among them) write a call's JSON without the tags: a
     * reply that is only call objects is read as calls. */
    if (!find(text, len, HERMES_OPEN) && parse_bare_calls(text, len, calls, "arguments", "parameters")) return 0;
    size_t at = 0;
    while (at < len) {
        const char *open = find(text + at, len - at, HERMES_OPEN);
        size_t before = open ? (size_t)(open - text) : len;
        if (append_content(p, text + at, before - at)) return -1;
        if (!open) break;
        size_t body = before + strlen(HERMES_OPEN);
        const char *close = find(text + body, len - body, HERMES_CLOSE);
        size_t end = close ? (size_t)(close - text) : len; /* an unclosed block (max_tokens) may still hold a whole call */
        json_t *obj = load_json(text + body, end - body);
        bool ok = json_is_object(obj) && add_call(calls, obj, "arguments", "parameters");
        json_decref(obj);
        size_t next = close ? end + strlen(HERMES_CLOSE) : len;
        if (!ok && append_content(p, text + before, next - before)) return -1;
        at = next;
    }
    return 0;
}

static int parse_mistral(const char *text, size_t len, json_t *calls, ToolParse *p) {
    const char *mark = find(text, len, MISTRAL_MARK);
    size_t before = mark ? (size_t)(mark - text) : len;
    if (append_content(p, text, before)) return -1;
    if (!mark) return 0;
    size_t body = before + strlen(MISTRAL_MARK);
    json_t *list = load_json(text + body, len - body);
    bool ok = json_is_array(list) || json_is_object(list);
    if (json_is_object(list)) ok = add_call(calls, list, "arguments", "parameters");
    for (size_t i = 0; json_is_array(list) && ok && i < json_array_size(list); i++)
        ok = json_is_object(json_array_get(list, i)) && add_call(calls, json_array_get(list, i), "arguments", "parameters");
    json_decref(list);
    if (!ok) {
        json_array_clear(calls);
        return append_content(p, text + before, len - before);
    }
    return 0;
}

static int parse_llama3(const char *text, size_t len, json_t *calls, ToolParse *p) {
    return parse_bare_calls(text, len, calls, "parameters", "arguments") ? 0 : set_whole_content(p, text, len);
}

static int parse_generic(const char *text, size_t len, json_t *calls, ToolParse *p) {
    json_t *obj = load_json(text, len);
    const json_t *list = json_object_get(obj, "tool_calls"), *response = json_object_get(obj, "response");
    bool ok = json_is_array(list) && json_array_size(list) > 0;
    for (size_t i = 0; ok && i < json_array_size(list); i++)
        ok = json_is_object(json_array_get(list, i)) && add_call(calls, json_array_get(list, i), "arguments", "parameters");
    int rc = 0;
    if (!ok) {
        json_array_clear(calls);
        if (json_is_string(response)) {
            rc = set_whole_content(p, json_string_value(response), json_string_length(response));
        } else if (response) {
            char *dumped = json_dumps(response, JSON_COMPACT | JSON_ENCODE_ANY);
            rc = dumped ? set_whole_content(p, dumped, strlen(dumped)) : -1;
            free(dumped);
        } else {
            rc = set_whole_content(p, text, len); /* not the agreed shape (cut short?): the text as it is */
        }
    }
    json_decref(obj);
    return rc;
}

int tool_parse(ToolSyntax s, const char *text, size_t len, int max_calls, uint64_t id_seed, ToolParse *out) {
    memset(out, 0, sizeof *out);
    json_t *calls = json_array();
    if (!calls) return -1;
    int rc;
    switch (s) {
    case TOOL_SYNTAX_HERMES: rc = parse_hermes(text, len, calls, out); break;
    case TOOL_SYNTAX_MISTRAL: rc = parse_mistral(text, len, calls, out); break;
    case TOOL_SYNTAX_LLAMA3: rc = parse_llama3(text, len, calls, out); break;
    default: rc = parse_generic(text, len, calls, out); break;
    }
    if (rc == 0 && json_array_size(calls) == 0) {
        /* No call: the answer is the text exactly as a request without tools would get it. */
        json_decref(calls);
        if (s != TOOL_SYNTAX_GENERIC || !out->content) rc = set_whole_content(out, text, len);
        return rc;
    }
    if (rc) {
        json_decref(calls);
        tool_parse_free(out);
        return -1;
    }
    finish_calls(s, calls, max_calls, id_seed);
    out->calls = calls;
    return 0;
}

void tool_parse_free(ToolParse *p) {
    free(p->content);
    json_decref(p->calls);
    memset(p, 0, sizeof *p);
}

/* ---- streaming ---- */

/* Where a marker starts in text, or where a suffix that could still grow into it starts. */
static size_t marker_limit(const char *text, size_t len, const char *marker) {
    const char *hit = find(text, len, marker);
    if (hit) return (size_t)(hit - text);
    size_t m = strlen(marker);
    for (size_t k = m - 1; k > 0; k--)
        if (k <= len && memcmp(text + len - k, marker, k) == 0) return len - k;
    return len;
}

/* Cut back to the last non-whitespace byte; 0 when there is none (whitespace alone is held). */
static size_t trim_back(const char *text, size_t n) {
    while (n > 0 && is_space(text[n - 1])) n--;
    return n;
}

size_t tool_parse_streamable(ToolSyntax s, const char *text, size_t len) {
    switch (s) {
    case TOOL_SYNTAX_HERMES: {
        /* A reply opening like a bare call (Qwen2.5-Coder) is held to the end. */
        size_t at = 0;
        while (at < len && is_space(text[at])) at++;
        if (at == len || text[at] == '{' || text[at] == '`') return 0;
        return trim_back(text, marker_limit(text, len, HERMES_OPEN));
    }
    case TOOL_SYNTAX_MISTRAL: return trim_back(text, marker_limit(text, len, MISTRAL_MARK));
    case TOOL_SYNTAX_LLAMA3: {
        size_t at = 0;
        while (at < len && is_space(text[at])) at++;
        if (at == len || text[at] == '{') return 0;
        size_t rest = len - at, tag = strlen(PYTHON_TAG);
        if (memcmp(text + at, PYTHON_TAG, rest < tag ? rest : tag) == 0) return 0;
        return len; /* plain text from its first byte: the reply is not a call */
    }
    default: return 0; /* generic: the whole reply is one JSON object, parsed at the end */
    }
}
