/* Parsing of request directives and cache_control; the contract is in api_directives.h. */
#include "coord/api/api_directives.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_directive.h"

static int bad(ApiError *err, int i, const char *field, const char *fmt, const char *what) {
    char param[64];
    if (field) snprintf(param, sizeof param, "directives[%d].%s", i, field);
    else snprintf(param, sizeof param, "directives[%d]", i);
    return api_error_set(err, 400, param, NULL, fmt, param, what ? what : "");
}

/* "90s", "5m", "1h" or a number of seconds. -1 when malformed. */
static double parse_ttl(const json_t *v) {
    if (json_is_number(v)) return json_number_value(v);
    if (!json_is_string(v)) return -1;
    const char *s = json_string_value(v);
    char *end;
    double x = strtod(s, &end);
    if (end == s || !isfinite(x)) return -1;
    if (strcmp(end, "s") == 0 || *end == '\0') return x;
    if (strcmp(end, "m") == 0) return x * 60;
    if (strcmp(end, "h") == 0) return x * 3600;
    return -1;
}

static int read_ttl(const json_t *v, const char *param, double *ttl_s, ApiError *err) {
    double ttl = parse_ttl(v);
    if (!(ttl >= 1 && ttl <= 86400))
        return api_error_set(err, 400, param, NULL, "%s must be a duration from 1 s to 24 h (\"90s\", \"5m\", \"1h\" or seconds)", param);
    *ttl_s = ttl;
    return 0;
}

int api_cache_control_parse(const json_t *value, const char *param, double *ttl_s, ApiError *err) {
    const json_t *type = json_is_object(value) ? json_object_get(value, "type") : NULL;
    if (!json_is_string(type) || strcmp(json_string_value(type), "ephemeral") != 0)
        return api_error_set(err, 400, param, NULL, "%s must be {\"type\": \"ephemeral\"} with an optional \"ttl\"", param);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)value, key, v) {
        if (strcmp(key, "type") != 0 && strcmp(key, "ttl") != 0)
            return api_error_set(err, 400, param, NULL, "%s holds only type and ttl; '%.40s' is not supported", param, key);
    }
    const json_t *ttl = json_object_get(value, "ttl");
    *ttl_s = API_DEFAULT_PIN_TTL_S;
    if (!ttl || json_is_null(ttl)) return 0;
    char p[96];
    snprintf(p, sizeof p, "%s.ttl", param);
    return read_ttl(ttl, p, ttl_s, err);
}

static int read_span(const json_t *span, int i, ApiDirective *d, ApiError *err) {
    if (json_is_array(span)) {
        const json_t *a = json_array_get(span, 0), *b = json_array_get(span, 1);
        if (json_array_size(span) != 2 || !json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < json_integer_value(a) || json_integer_value(b) > (1 << 24))
            return bad(err, i, "span", "%s must be [start, end] token positions with 0 <= start <= end%s", NULL);
        d->start = (int)json_integer_value(a);
        d->end = (int)json_integer_value(b);
        d->has_span = true;
        return 0;
    }
    const json_t *match = json_is_object(span) ? json_object_get(span, "match") : NULL;
    if (!json_is_string(match) || json_string_length(match) == 0)
        return bad(err, i, "span", "%s must be [start, end] or {\"match\": \"<non-empty text>\", \"occurrence\": n}%s", NULL);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)span, key, v) {
        if (strcmp(key, "match") != 0 && strcmp(key, "occurrence") != 0) return bad(err, i, "span", "%s holds only match and occurrence%s", NULL);
    }
    const json_t *occ = json_object_get(span, "occurrence");
    d->occurrence = 1;
    if (occ && !json_is_null(occ)) {
        if (!json_is_integer(occ) || json_integer_value(occ) < 1 || json_integer_value(occ) > 100000)
            return bad(err, i, "span.occurrence", "%s must be a positive integer%s", NULL);
        d->occurrence = (int)json_integer_value(occ);
    }
    return (d->match = strdup(json_string_value(match))) ? 0 : api_error_set(err, 503, NULL, NULL, "the server is out of memory");
}

static int read_with(const json_t *with, int i, ApiDirective *d, ApiError *err) {
    if (json_is_string(with) && strcmp(json_string_value(with), "all") == 0) return d->share_all = true, 0;
    size_t n = json_is_array(with) ? json_array_size(with) : 0;
    if (n == 0 || n > CACHE_SHARE_MAX_TENANTS)
        return bad(err, i, "with", "%s must be \"all\" or a list of 1 to 16 tenant names%s", NULL);
    if (!(d->with = calloc(n, sizeof *d->with))) return api_error_set(err, 503, NULL, NULL, "the server is out of memory");
    for (size_t k = 0; k < n; k++) {
        const json_t *t = json_array_get(with, k);
        if (!json_is_string(t) || json_string_length(t) == 0 || json_string_length(t) > API_MAX_LABEL_BYTES)
            return bad(err, i, "with", "%s must list non-empty tenant names%s", NULL);
        if (!(d->with[d->n_with++] = strdup(json_string_value(t)))) return api_error_set(err, 503, NULL, NULL, "the server is out of memory");
    }
    return 0;
}

static int read_op(const json_t *obj, int i, ApiDirective *d, ApiError *err) {
    static const char *const ops[] = {"splice", "pin", "decay", "evict", "share", "unpin"};
    const json_t *op = json_object_get(obj, "op");
    for (int k = 0; json_is_string(op) && k < 6; k++)
        if (strcmp(json_string_value(op), ops[k]) == 0) return d->op = k, 0; /* CacheHintOp values follow splice's 0 */
    return bad(err, i, "op", "%s must be one of \"splice\", \"pin\", \"decay\", \"evict\", \"share\", \"unpin\"%s", NULL);
}

/* The keys each op reads; any other is a 400 naming it. */
static bool key_allowed(int op, const char *key) {
    if (!strcmp(key, "op") || !strcmp(key, "span")) return true;
    if (op == API_DIRECTIVE_SPLICE) return !strcmp(key, "replacement") || !strcmp(key, "mode");
    if (op == CACHE_HINT_PIN) return !strcmp(key, "ttl");
    if (op == CACHE_HINT_SHARE) return !strcmp(key, "with");
    return false;
}

static int read_splice(const json_t *obj, int i, ApiDirective *d, ApiError *err) {
    if (!d->has_span && !d->match) return bad(err, i, "span", "%s is required for a splice%s", NULL);
    const json_t *rep = json_object_get(obj, "replacement"), *mode = json_object_get(obj, "mode");
    if (!json_is_string(rep)) return bad(err, i, "replacement", "%s must be a string (\"\" removes the span)%s", NULL);
    d->mode = CACHE_SPLICE_AMORTIZE;
    if (mode && !json_is_null(mode)) {
        const char *m = json_is_string(mode) ? json_string_value(mode) : "";
        if (!strcmp(m, "forget")) d->mode = CACHE_SPLICE_FORGET;
        else if (strcmp(m, "amortize") != 0) return bad(err, i, "mode", "%s must be \"amortize\" or \"forget\"%s", NULL);
    }
    return (d->replacement = strdup(json_string_value(rep))) ? 0 : api_error_set(err, 503, NULL, NULL, "the server is out of memory");
}

static int read_directive(const json_t *obj, int i, ApiDirective *d, ApiError *err) {
    if (!json_is_object(obj)) return bad(err, i, NULL, "%s must be an object with an \"op\"%s", NULL);
    if (read_op(obj, i, d, err)) return -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (!key_allowed(d->op, key)) {
            char param[96];
            snprintf(param, sizeof param, "directives[%d].%.40s", i, key);
            return api_error_set(err, 400, param, NULL, "%s is not a field of a %s directive", param, json_string_value(json_object_get(obj, "op")));
        }
    }
    const json_t *span = json_object_get(obj, "span");
    if (span && !json_is_null(span) && read_span(span, i, d, err)) return -1;
    if (d->op == API_DIRECTIVE_SPLICE) return read_splice(obj, i, d, err);
    if (d->op == CACHE_HINT_SHARE) return read_with(json_object_get(obj, "with"), i, d, err);
    if (d->op == CACHE_HINT_PIN) {
        const json_t *ttl = json_object_get(obj, "ttl");
        d->ttl_s = API_DEFAULT_PIN_TTL_S;
        if (ttl && !json_is_null(ttl)) {
            char param[48];
            snprintf(param, sizeof param, "directives[%d].ttl", i);
            return read_ttl(ttl, param, &d->ttl_s, err);
        }
    }
    return 0;
}

int api_directives_parse(const json_t *value, ApiDirective **out, int *n_out, ApiError *err) {
    *out = NULL;
    *n_out = 0;
    if (!value || json_is_null(value)) return 0;
    if (!json_is_array(value)) return api_error_set(err, 400, "directives", NULL, "directives must be an array of directive objects");
    size_t n = json_array_size(value);
    if (n > CACHE_DIRECTIVE_MAX)
        return api_error_set(err, 400, "directives", NULL, "directives holds %zu entries; at most %d are supported", n, CACHE_DIRECTIVE_MAX);
    if (n == 0) return 0;
    if (!(*out = calloc(n, sizeof **out))) return api_error_set(err, 503, NULL, NULL, "the server is out of memory");
    for (size_t i = 0; i < n; i++) {
        (*n_out)++;
        if (read_directive(json_array_get(value, i), (int)i, &(*out)[i], err)) {
            api_directives_free(*out, *n_out);
            *out = NULL;
            *n_out = 0;
            return -1;
        }
    }
    return 0;
}

int api_auto_splice_parse(const json_t *value, int *mode, ApiError *err) {
    *mode = -1;
    if (!value || json_is_null(value)) return 0;
    const char *m = json_is_string(value) ? json_string_value(value) : "";
    if (!strcmp(m, "amortize")) *mode = CACHE_SPLICE_AMORTIZE;
    else if (!strcmp(m, "forget")) *mode = CACHE_SPLICE_FORGET;
    else if (!strcmp(m, "off")) *mode = CACHE_SPLICE_NONE;
    else return api_error_set(err, 400, "auto_splice", NULL, "auto_splice must be \"amortize\", \"forget\" or \"off\"");
    return 0;
}

void api_directives_free(ApiDirective *d, int n) {
    for (int i = 0; d && i < n; i++) {
        free(d[i].match);
        free(d[i].replacement);
        for (int k = 0; k < d[i].n_with; k++) free(d[i].with[k]);
        free(d[i].with);
    }
    free(d);
}
