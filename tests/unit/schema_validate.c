#include "schema_validate.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool failf(char *why, size_t len, const char *msg, const char *detail) {
    snprintf(why, len, "%s%s%s", msg, detail ? " " : "", detail ? detail : "");
    return false;
}

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static const json_t *resolve(const json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) tok[n++] = *p++;
        tok[n] = 0;
        at = json_is_object(at) ? json_object_get(at, tok) : json_is_array(at) ? json_array_get(at, (size_t)atol(tok)) : NULL;
    }
    return at;
}

static bool type_ok(const json_t *v, const char *t) {
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

bool schema_validate(const json_t *v, const json_t *s, const json_t *root, char *why, size_t wl) {
    if (json_is_true(s)) return true;
    if (json_is_false(s)) return failf(why, wl, "schema false", NULL);
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const json_t *t = resolve(root, json_string_value(x));
        return t ? schema_validate(v, t, root, why, wl) : failf(why, wl, "unresolved $ref", json_string_value(x));
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        for (size_t i = 0; i < json_array_size(x); i++)
            if (schema_validate(v, json_array_get(x, i), root, why, wl)) return true;
        return failf(why, wl, "no anyOf branch matches", NULL);
    }
    if ((x = json_object_get(s, "allOf")))
        for (size_t i = 0; i < json_array_size(x); i++)
            if (!schema_validate(v, json_array_get(x, i), root, why, wl)) return false;
    if ((x = json_object_get(s, "const")) && !json_equal((json_t *)x, (json_t *)v)) return failf(why, wl, "const mismatch", NULL);
    if ((x = json_object_get(s, "enum"))) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(x); i++) found |= json_equal(json_array_get(x, i), (json_t *)v);
        if (!found) return failf(why, wl, "not in enum", NULL);
    }
    if ((x = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(x)) ok = type_ok(v, json_string_value(x));
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++) ok |= type_ok(v, json_string_value(json_array_get(x, i)));
        if (!ok) return failf(why, wl, "wrong type, want", json_is_string(x) ? json_string_value(x) : "(list)");
    }
    if (json_is_string(v)) {
        size_t n = utf8_chars(json_string_value(v), json_string_length(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x)) return failf(why, wl, "string too short", NULL);
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x)) return failf(why, wl, "string too long", NULL);
        if ((x = json_object_get(s, "pattern"))) {
            regex_t re;
            if (regcomp(&re, json_string_value(x), REG_EXTENDED | REG_NOSUB)) return failf(why, wl, "test pattern does not compile", NULL);
            int rc = regexec(&re, json_string_value(v), 0, NULL, 0);
            regfree(&re);
            if (rc) return failf(why, wl, "pattern mismatch on", json_string_value(v));
        }
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if ((x = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(x)) return failf(why, wl, "too few items", NULL);
        if ((x = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(x)) return failf(why, wl, "too many items", NULL);
        const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
        size_t k = json_array_size(prefix);
        for (size_t i = 0; i < n; i++) {
            const json_t *sub = i < k ? json_array_get(prefix, i) : items;
            if (sub && !schema_validate(json_array_get(v, i), sub, root, why, wl)) return false;
        }
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
                     *addl = json_object_get(s, "additionalProperties");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i))))
                return failf(why, wl, "missing required", json_string_value(json_array_get(req, i)));
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) {
            const json_t *sub = props ? json_object_get(props, key) : NULL;
            if (!sub) sub = addl;
            if (!sub) continue;
            if (!schema_validate(val, sub, root, why, wl)) return false;
        }
    }
    return true;
}
