/*
 * auth.c — the --api-keys file and bearer-key lookup; the contract and file format are in auth.h.
 *
 * Parsing reads the text line by line into a growing array of AuthKey; each field has its own small
 * reader that fails with "SOURCE line N: ..." in err. Messages name the line and the field, never
 * the key itself, since the file's whole point is that keys stay secret.
 */
#include "coord/auth.h"

#include "cache/kv_cache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/grow.h"

#define AUTH_MAX_NAME_BYTES 256 /* tenant, adapter and shared names: API_MAX_LABEL_BYTES, as in requests */
#define AUTH_MAX_FILE_BYTES (16 << 20)

struct AuthKey {
    unsigned char key[AUTH_MAX_KEY_BYTES]; /* zero-padded, so every comparison reads the same bytes */
    size_t key_len;
    int line;
    char *tenant;
    char **adapters; /* NULL-terminated; NULL when none */
    bool any_adapter;
    char **shares;   /* NULL-terminated; NULL when none */
    int segment_reuse; /* segment_reuse=: the tenant's opt-in (0 off, 1 exact, 2 approx); -1 when not given */
    int auto_splice;   /* auto_splice=: the tenant's default (CacheSpliceMode; 0 off); -1 when not given */
    int index;         /* position in the file's keys (auth_key_index) */
    int max_concurrent; /* max_concurrent=: requests in flight at once; 0 = no limit */
    double rate;       /* rate=: requests per second; 0 = no limit */
    double weight;     /* weight=: share in the instances' fair scheduling (default 1) */
    bool admin;        /* the bare word `admin`: may load and unload adapters at run time */
};

struct AuthKeys {
    AuthKey *keys;
    int n, cap;
};

/* ---- parsing ---- */

/* One line being parsed: where it came from, for messages. */
typedef struct {
    const char *source;
    int line;
    BraidError *err;
} LineCtx;

static bool is_b64token_char(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("-._~+/=", c) != NULL;
}

static int check_key(const LineCtx *l, const char *s, size_t n) {
    if (n < AUTH_MIN_KEY_BYTES || n > AUTH_MAX_KEY_BYTES)
        return braid_error_set(l->err, "api-keys %s line %d: the key is %zu characters; keys must have %d to %d", l->source,
                               l->line, n, AUTH_MIN_KEY_BYTES, AUTH_MAX_KEY_BYTES);
    size_t padding = 0; /* trailing '=' */
    while (padding < n && s[n - 1 - padding] == '=') padding++;
    for (size_t i = 0; i < n; i++)
        if (!is_b64token_char((unsigned char)s[i]) || (s[i] == '=' && i < n - padding))
            return braid_error_set(l->err,
                                   "api-keys %s line %d: the key's character %zu is not allowed (keys use A-Z a-z 0-9 - . _ ~ + / "
                                   "and may end in =)",
                                   l->source, l->line, i + 1);
    return 0;
}

/* A tenant, adapter or shared name: printable, no blanks (they separate fields) and no commas
 * (they separate list items), as long as a request label may be. */
static int check_name(const LineCtx *l, const char *field, const char *s, size_t n) {
    if (n == 0 || n > AUTH_MAX_NAME_BYTES)
        return braid_error_set(l->err, "api-keys %s line %d: a name in %s= must be 1 to %d bytes, got %zu", l->source, l->line, field,
                               AUTH_MAX_NAME_BYTES, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || s[i] == 0x7f || s[i] == ',')
            return braid_error_set(l->err, "api-keys %s line %d: %s= holds a control character, blank or misplaced comma",
                                   l->source, l->line, field);
    return 0;
}

static void free_list(char **list) {
    for (char **p = list; p && *p; p++) free(*p);
    free(list);
}

/* "a,b,c" into a NULL-terminated list of copies. */
static int parse_list(const LineCtx *l, const char *field, const char *s, size_t n, char ***out) {
    size_t items = 1;
    for (size_t i = 0; i < n; i++) items += s[i] == ',';
    char **list = calloc(items + 1, sizeof *list);
    if (!list) return braid_error_set(l->err, "api-keys %s line %d: out of memory", l->source, l->line);
    size_t at = 0;
    for (size_t k = 0; k < items; k++) {
        const char *comma = memchr(s + at, ',', n - at); /* the token is not NUL-terminated */
        size_t len = comma ? (size_t)(comma - (s + at)) : n - at;
        int rc = check_name(l, field, s + at, len);
        if (rc == 0 && !(list[k] = strndup(s + at, len)))
            rc = braid_error_set(l->err, "api-keys %s line %d: out of memory", l->source, l->line);
        if (rc) {
            free_list(list);
            return -1;
        }
        at += len + 1;
    }
    *out = list;
    return 0;
}

/* weight= (0.01 .. 1000), rate= (requests per second, 0.001 .. 1e6) or max_concurrent= (1 .. 1e6). */
static int parse_limit(const LineCtx *l, AuthKey *k, const char *name, size_t name_len, const char *value, size_t value_len) {
    char text[32] = "", *end = NULL;
    if (value_len > 0 && value_len < sizeof text) memcpy(text, value, value_len);
    double v = text[0] ? strtod(text, &end) : 0;
    bool number = text[0] && end && *end == '\0';
    if (name_len == 6) { /* weight */
        if (k->weight > 0) return braid_error_set(l->err, "api-keys %s line %d: weight= given twice", l->source, l->line);
        if (!number || !(v >= 0.01 && v <= 1000)) return braid_error_set(l->err, "api-keys %s line %d: weight= must be a number in [0.01, 1000]", l->source, l->line);
        k->weight = v;
    } else if (name_len == 4) { /* rate */
        if (k->rate > 0) return braid_error_set(l->err, "api-keys %s line %d: rate= given twice", l->source, l->line);
        if (!number || !(v >= 0.001 && v <= 1e6))
            return braid_error_set(l->err, "api-keys %s line %d: rate= must be requests per second in [0.001, 1e6]", l->source, l->line);
        k->rate = v;
    } else {
        if (k->max_concurrent > 0) return braid_error_set(l->err, "api-keys %s line %d: max_concurrent= given twice", l->source, l->line);
        if (!number || !(v >= 1 && v <= 1e6) || v != (double)(int)v)
            return braid_error_set(l->err, "api-keys %s line %d: max_concurrent= must be a whole number in [1, 1000000]", l->source, l->line);
        k->max_concurrent = (int)v;
    }
    (void)name;
    return 0;
}

/* The index-th NAME=VALUE field after the key. */
static int parse_field(const LineCtx *l, AuthKey *k, int index, const char *s, size_t n) {
    const char *eq = memchr(s, '=', n);
    size_t name_len = eq ? (size_t)(eq - s) : n, value_len = eq ? n - name_len - 1 : 0;
    const char *value = eq ? eq + 1 : NULL;
    if (!eq && n == 5 && strncmp(s, "admin", 5) == 0) { /* a flag, not NAME=VALUE */
        if (k->admin) return braid_error_set(l->err, "api-keys %s line %d: admin given twice", l->source, l->line);
        k->admin = true;
        return 0;
    }
    if (!eq)
        return braid_error_set(l->err, "api-keys %s line %d: field %d is not NAME=VALUE (expected tenant=, adapters=, shares=, segment_reuse=, auto_splice=, weight=, max_concurrent=, rate=, admin)",
                               l->source, l->line, index);
    if (name_len == 6 && strncmp(s, "tenant", 6) == 0) {
        if (k->tenant) return braid_error_set(l->err, "api-keys %s line %d: tenant= given twice", l->source, l->line);
        if (check_name(l, "tenant", value, value_len)) return -1;
        return (k->tenant = strndup(value, value_len)) ? 0 : braid_error_set(l->err, "api-keys: out of memory");
    }
    if (name_len == 8 && strncmp(s, "adapters", 8) == 0) {
        if (k->adapters || k->any_adapter) return braid_error_set(l->err, "api-keys %s line %d: adapters= given twice", l->source, l->line);
        if (value_len == 1 && value[0] == '*') {
            k->any_adapter = true;
            return 0;
        }
        return parse_list(l, "adapters", value, value_len, &k->adapters);
    }
    if (name_len == 13 && strncmp(s, "segment_reuse", 13) == 0) {
        if (k->segment_reuse >= 0) return braid_error_set(l->err, "api-keys %s line %d: segment_reuse= given twice", l->source, l->line);
        char mode[8] = "";
        if (value_len < sizeof mode) memcpy(mode, value, value_len);
        if ((k->segment_reuse = segment_reuse_parse(mode)) < 0)
            return braid_error_set(l->err, "api-keys %s line %d: segment_reuse= must be off, exact or approx", l->source, l->line);
        return 0;
    }
    if (name_len == 11 && strncmp(s, "auto_splice", 11) == 0) {
        if (k->auto_splice >= 0) return braid_error_set(l->err, "api-keys %s line %d: auto_splice= given twice", l->source, l->line);
        if (value_len == 8 && strncmp(value, "amortize", 8) == 0) k->auto_splice = CACHE_SPLICE_AMORTIZE;
        else if (value_len == 6 && strncmp(value, "forget", 6) == 0) k->auto_splice = CACHE_SPLICE_FORGET;
        else if (value_len == 3 && strncmp(value, "off", 3) == 0) k->auto_splice = CACHE_SPLICE_NONE;
        else return braid_error_set(l->err, "api-keys %s line %d: auto_splice= must be amortize, forget or off", l->source, l->line);
        return 0;
    }
    if ((name_len == 6 && strncmp(s, "weight", 6) == 0) || (name_len == 4 && strncmp(s, "rate", 4) == 0) ||
        (name_len == 14 && strncmp(s, "max_concurrent", 14) == 0))
        return parse_limit(l, k, s, name_len, value, value_len);
    if (name_len == 6 && strncmp(s, "shares", 6) == 0) {
        if (k->shares) return braid_error_set(l->err, "api-keys %s line %d: shares= given twice", l->source, l->line);
        return parse_list(l, "shares", value, value_len, &k->shares);
    }
    /* The name is quoted only when it looks like one: a mistyped line could hold part of a key. */
    bool quotable = name_len > 0 && name_len <= 16 && strspn(s, "abcdefghijklmnopqrstuvwxyz_-") >= name_len;
    if (!quotable)
        return braid_error_set(l->err, "api-keys %s line %d: field %d has an unknown name (expected tenant=, adapters=, shares=, segment_reuse=, auto_splice=, weight=, max_concurrent=, rate=, admin)",
                               l->source, l->line, index);
    return braid_error_set(l->err, "api-keys %s line %d: unknown field '%.*s' (expected tenant=, adapters=, shares=, segment_reuse=, auto_splice=, weight=, max_concurrent=, rate=, admin)", l->source,
                           l->line, (int)name_len, s);
}

static void key_free(AuthKey *k) {
    free(k->tenant);
    free_list(k->adapters);
    free_list(k->shares);
    memset(k, 0, sizeof *k);
}

/* Splits off the next blank-separated token of [*at, end); false when none is left. */
static bool next_token(const char **at, const char *end, const char **tok, size_t *len) {
    const char *p = *at;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p == end) return false;
    const char *q = p;
    while (q < end && *q != ' ' && *q != '\t') q++;
    *tok = p;
    *len = (size_t)(q - p);
    *at = q;
    return true;
}

/* One non-comment line into *k. */
static int parse_line(const LineCtx *l, const char *s, const char *end, AuthKey *k) {
    const char *tok;
    size_t len;
    memset(k, 0, sizeof *k);
    k->line = l->line;
    k->segment_reuse = -1;
    k->auto_splice = -1;
    if (!next_token(&s, end, &tok, &len) || check_key(l, tok, len)) return -1;
    memcpy(k->key, tok, len);
    k->key_len = len;
    int field = 0;
    while (next_token(&s, end, &tok, &len)) {
        field++;
        if (tok[0] == '#') break; /* a trailing comment */
        if (parse_field(l, k, field, tok, len)) {
            key_free(k);
            return -1;
        }
    }
    if (!k->tenant) {
        key_free(k);
        return braid_error_set(l->err, "api-keys %s line %d: tenant= is missing (every key needs its tenant)", l->source, l->line);
    }
    return 0;
}

/* The line of an earlier key equal to k, or 0. Parsing is not on the request path: a plain
 * comparison is fine here. */
static int duplicate_of(const AuthKeys *keys, const AuthKey *k) {
    for (int i = 0; i < keys->n; i++)
        if (keys->keys[i].key_len == k->key_len && memcmp(keys->keys[i].key, k->key, k->key_len) == 0) return keys->keys[i].line;
    return 0;
}

static int add_line(AuthKeys *keys, const LineCtx *l, const char *s, const char *end) {
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    if (s == end || *s == '#') return 0;
    AuthKey k;
    if (parse_line(l, s, end, &k)) return -1;
    int first = duplicate_of(keys, &k);
    if (first) {
        key_free(&k);
        return braid_error_set(l->err, "api-keys %s line %d: the same key as line %d", l->source, l->line, first);
    }
    if (braid_grow((void **)&keys->keys, &keys->cap, keys->n + 1, sizeof *keys->keys)) {
        key_free(&k);
        return braid_error_set(l->err, "api-keys %s: out of memory", l->source);
    }
    k.index = keys->n;
    if (k.weight <= 0) k.weight = 1.0;
    keys->keys[keys->n++] = k;
    return 0;
}

AuthKeys *auth_keys_parse(const char *text, size_t len, const char *source, BraidError *err) {
    AuthKeys *keys = calloc(1, sizeof *keys);
    if (!keys) return braid_error_set(err, "api-keys %s: out of memory", source), NULL;
    LineCtx l = {.source = source, .line = 0, .err = err};
    const char *end = text + len;
    for (const char *s = text; s < end;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *line_end = nl ? nl : end;
        l.line++;
        size_t n = (size_t)(line_end - s);
        if (n > 0 && s[n - 1] == '\r') n--;
        const char *content_end = s + n;
        if (memchr(s, '\0', n)) {
            braid_error_set(err, "api-keys %s line %d: holds a NUL byte", source, l.line);
            auth_keys_free(keys);
            return NULL;
        }
        if (add_line(keys, &l, s, content_end)) {
            auth_keys_free(keys);
            return NULL;
        }
        s = nl ? nl + 1 : end;
    }
    if (keys->n == 0) {
        braid_error_set(err, "api-keys %s: no keys (one line per key: KEY tenant=NAME [adapters=A,B|*] [shares=NS,...])", source);
        auth_keys_free(keys);
        return NULL;
    }
    return keys;
}

AuthKeys *auth_keys_load(const char *path, BraidError *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return braid_error_set(err, "api-keys %s: cannot open it", path), NULL;
    char *text = malloc(AUTH_MAX_FILE_BYTES + 1);
    size_t n = text ? fread(text, 1, AUTH_MAX_FILE_BYTES + 1, f) : 0;
    bool failed = text && ferror(f);
    fclose(f);
    AuthKeys *keys = NULL;
    if (!text) braid_error_set(err, "api-keys %s: out of memory", path);
    else if (failed) braid_error_set(err, "api-keys %s: read error", path);
    else if (n > AUTH_MAX_FILE_BYTES) braid_error_set(err, "api-keys %s: larger than %d bytes", path, AUTH_MAX_FILE_BYTES);
    else keys = auth_keys_parse(text, n, path, err);
    if (text) memset(text, 0, n); /* the file's keys do not linger in freed memory */
    free(text);
    return keys;
}

void auth_keys_free(AuthKeys *keys) {
    if (!keys) return;
    for (int i = 0; i < keys->n; i++) key_free(&keys->keys[i]);
    free(keys->keys);
    free(keys);
}

int auth_keys_count(const AuthKeys *keys) { return keys ? keys->n : 0; }

/* ---- lookup ---- */

/* 1 when the two padded keys and lengths are equal, 0 otherwise, reading every byte either way. */
static unsigned equal_padded(const unsigned char *a, size_t a_len, const unsigned char *b, size_t b_len) {
    unsigned diff = 0;
    for (size_t i = 0; i < AUTH_MAX_KEY_BYTES; i++) diff |= (unsigned)(a[i] ^ b[i]);
    uint64_t len_diff = (uint64_t)(a_len ^ b_len);
    diff |= (unsigned)(len_diff | (len_diff >> 32));
    /* diff == 0 → 1, else 0, without a branch: (diff - 1) borrows into the top bit only for 0. */
    return (unsigned)(((uint64_t)diff - 1) >> 63);
}

const AuthKey *auth_keys_authenticate(const AuthKeys *keys, const char *authorization) {
    if (!keys || !authorization) return NULL;
    const char *s = authorization;
    while (*s == ' ' || *s == '\t') s++;
    if (strncasecmp(s, "Bearer", 6) != 0 || (s[6] != ' ' && s[6] != '\t')) return NULL;
    return auth_keys_lookup(keys, s + 6);
}

const AuthKey *auth_keys_lookup(const AuthKeys *keys, const char *key) {
    if (!keys || !key) return NULL;
    const char *s = key;
    while (*s == ' ' || *s == '\t') s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    unsigned char presented[AUTH_MAX_KEY_BYTES] = {0};
    memcpy(presented, s, len < AUTH_MAX_KEY_BYTES ? len : AUTH_MAX_KEY_BYTES);
    /* Every key is compared, match or not; the match is picked out arithmetically. */
    size_t found = 0;
    for (int i = 0; i < keys->n; i++) {
        size_t hit = equal_padded(keys->keys[i].key, keys->keys[i].key_len, presented, len);
        found |= hit * (size_t)(i + 1);
    }
    memset(presented, 0, sizeof presented);
    return found ? &keys->keys[found - 1] : NULL;
}

const char *auth_key_tenant(const AuthKey *key) { return key->tenant; }

static bool in_list(char *const *list, const char *name) {
    for (char *const *p = list; p && *p; p++)
        if (strcmp(*p, name) == 0) return true;
    return false;
}

bool auth_key_allows_tenant(const AuthKey *key, const char *tenant) {
    return strcmp(key->tenant, tenant) == 0 || in_list(key->shares, tenant);
}

int auth_key_index(const AuthKey *key) { return key->index; }
int auth_key_max_concurrent(const AuthKey *key) { return key->max_concurrent; }
double auth_key_rate(const AuthKey *key) { return key->rate; }
double auth_key_weight(const AuthKey *key) { return key->weight; }

double auth_keys_tenant_weight(const AuthKeys *keys, const char *tenant) {
    for (int i = 0; keys && tenant && i < keys->n; i++)
        if (strcmp(keys->keys[i].tenant, tenant) == 0) return keys->keys[i].weight;
    return 1.0;
}

bool auth_keys_knows_tenant(const AuthKeys *keys, const char *tenant) {
    for (int i = 0; keys && tenant && i < keys->n; i++)
        if (auth_key_allows_tenant(&keys->keys[i], tenant)) return true;
    return false;
}

bool auth_key_allows_adapter(const AuthKey *key, const char *adapter) { return key->any_adapter || in_list(key->adapters, adapter); }

int auth_key_segment_reuse(const AuthKey *key) { return key->segment_reuse; }
int auth_key_auto_splice(const AuthKey *key) { return key->auto_splice; }

bool auth_key_admin(const AuthKey *key) { return key && key->admin; }
