/* One manifest line: JSON text <-> ManifestLine (contract in manifest_line.h). */
#include "coord/manifest_line.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/chunker.h"
#include "cache/content_hash.h"

uint64_t manifest_chunk_hash(uint64_t model_seed, const char *tenant, const char *adapter, const int32_t *tokens, int n) {
    return chunker_hash(content_hash_namespace(tenant, adapter) ^ model_seed, tokens, n);
}

static void hex16(uint64_t v, char out[17]) { snprintf(out, 17, "%016" PRIx64, v); }

char *manifest_line_format(const ManifestLine *l) {
    char hash[17], prev[17] = "";
    hex16(l->content_hash, hash);
    if (l->has_prev) hex16(l->prev_hash, prev);
    json_t *tokens = json_array();
    for (int i = 0; tokens && i < l->n_tokens; i++)
        if (json_array_append_new(tokens, json_integer(l->tokens[i]))) json_decref(tokens), tokens = NULL;
    json_t *o = tokens ? json_pack("{s:s, s:o, s:I, s:s, s:i, s:s}", "content_hash", hash, "chunk_tokens", tokens, "count",
                                   (json_int_t)l->count, "tenant", l->tenant ? l->tenant : "", "position", l->position, "prev_hash", prev)
                       : NULL;
    if (o && l->adapter && l->adapter[0] && json_object_set_new(o, "adapter", json_string(l->adapter))) json_decref(o), o = NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return text;
}

static int fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* "" (allowed only when empty_ok) or exactly 16 hex digits. */
static int parse_hash(json_t *v, const char *key, bool empty_ok, uint64_t *out, bool *present, char *why, size_t cap) {
    if (!json_is_string(v)) return fail(why, cap, "\"%s\" must be a string", key);
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    *present = n > 0;
    if (n == 0 && empty_ok) return 0;
    if (n != 16 || strspn(s, "0123456789abcdefABCDEF") != 16) return fail(why, cap, "\"%s\" must be 16 hex digits, got \"%.40s\"", key, s);
    *out = strtoull(s, NULL, 16);
    return 0;
}

static int parse_tokens(json_t *v, ManifestLine *out, char *why, size_t cap) {
    if (!json_is_array(v)) return fail(why, cap, "\"chunk_tokens\" must be an array of token ids");
    size_t n = json_array_size(v);
    if (n == 0 || n > MANIFEST_MAX_CHUNK_TOKENS)
        return fail(why, cap, "\"chunk_tokens\" holds %zu ids; 1 to %d are allowed", n, MANIFEST_MAX_CHUNK_TOKENS);
    if (!(out->tokens = malloc(n * sizeof *out->tokens))) return fail(why, cap, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return fail(why, cap, "\"chunk_tokens\"[%zu] is not a token id (a non-negative integer)", i);
        out->tokens[i] = (int32_t)json_integer_value(t);
    }
    out->n_tokens = (int)n;
    return 0;
}

static int parse_name(json_t *v, const char *key, char **out, char *why, size_t cap) {
    if (!json_is_string(v)) return fail(why, cap, "\"%s\" must be a string", key);
    const char *s = json_string_value(v);
    if (!s[0]) return 0;
    if (strlen(s) > 256) return fail(why, cap, "\"%s\" is longer than 256 bytes", key);
    return (*out = strdup(s)) ? 0 : fail(why, cap, "out of memory");
}

static int parse_object(json_t *o, ManifestLine *out, char *why, size_t cap) {
    static const char *const required[] = {"content_hash", "chunk_tokens", "count", "tenant", "position", "prev_hash"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!json_object_get(o, required[i])) return fail(why, cap, "missing \"%s\"", required[i]);
    bool present;
    if (parse_hash(json_object_get(o, "content_hash"), "content_hash", false, &out->content_hash, &present, why, cap) ||
        parse_hash(json_object_get(o, "prev_hash"), "prev_hash", true, &out->prev_hash, &out->has_prev, why, cap) ||
        parse_tokens(json_object_get(o, "chunk_tokens"), out, why, cap) ||
        parse_name(json_object_get(o, "tenant"), "tenant", &out->tenant, why, cap))
        return -1;
    json_t *adapter = json_object_get(o, "adapter"), *count = json_object_get(o, "count"), *pos = json_object_get(o, "position");
    if (adapter && parse_name(adapter, "adapter", &out->adapter, why, cap)) return -1;
    if (!json_is_integer(count) || json_integer_value(count) < 1) return fail(why, cap, "\"count\" must be a positive integer");
    out->count = json_integer_value(count);
    if (!json_is_integer(pos) || json_integer_value(pos) < 0 || json_integer_value(pos) > INT32_MAX)
        return fail(why, cap, "\"position\" must be a non-negative integer");
    out->position = (int)json_integer_value(pos);
    if ((out->position == 0) == out->has_prev)
        return fail(why, cap, "\"prev_hash\" must be empty exactly at position 0 (position %d)", out->position);
    return 0;
}

int manifest_line_parse(const char *text, size_t len, ManifestLine *out, char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) return fail(why, cap, "not JSON: %s", jerr.text);
    int rc = json_is_object(o) ? parse_object(o, out, why, cap) : fail(why, cap, "not a JSON object");
    json_decref(o);
    if (rc) manifest_line_free(out);
    return rc;
}

void manifest_line_free(ManifestLine *l) {
    free(l->tokens);
    free(l->tenant);
    free(l->adapter);
    memset(l, 0, sizeof *l);
}
