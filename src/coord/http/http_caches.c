/* The explicit-cache endpoints; the contract is in http_caches.h. */
#include "coord/http/http_caches.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/explicit_caches.h"
#include "coord/http/http_choices.h"
#include "coord/http/http_internal.h"

#define CACHES_PATH "/v1/caches"

bool http_caches_path(const char *url) {
    size_t n = strlen(CACHES_PATH);
    return strncmp(url, CACHES_PATH, n) == 0 && (url[n] == '\0' || url[n] == '/');
}

static enum MHD_Result send_error(struct MHD_Connection *conn, const ApiError *e) { return http_send_error(NULL, conn, NULL, e); }

/* A 405 whose Allow header names this path's methods (http_send_error's says "GET, POST"). */
static enum MHD_Result send_405(struct MHD_Connection *conn, const char *allow, const char *path) {
    ApiError e;
    api_error_set(&e, 405, NULL, NULL, "%s expects %s", path, allow);
    char *body = api_error_json(&e);
    struct MHD_Response *resp = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) return free(body), MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result rc = MHD_queue_response(conn, 405, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- tenant and body ---- */

/* The caller's tenant ("" = none): the key's, or one it shares named by header / body; without
 * keys whatever header / body name. 0, or -1 with e set (400 bad label, 403 not shared). */
static int resolve_tenant(struct MHD_Connection *conn, const AuthKey *key, const json_t *body, char tenant[API_MAX_LABEL_BYTES + 1],
                          ApiError *e) {
    const char *named = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Braid-Tenant");
    const char *param = "X-Braid-Tenant";
    const json_t *t = body ? json_object_get(body, "tenant") : NULL;
    if (!named && t && !json_is_null(t)) {
        if (!json_is_string(t)) return api_error_set(e, 400, "tenant", NULL, "tenant must be a string");
        named = json_string_value(t);
        param = "tenant";
    }
    if (named && api_request_check_label(param, param, named, strlen(named), e)) return -1;
    if (key && named && !auth_key_allows_tenant(key, named))
        return api_error_set(e, 403, "tenant", "tenant_not_allowed", "this API key belongs to tenant '%s' and does not share tenant '%.64s'",
                             auth_key_tenant(key), named);
    snprintf(tenant, API_MAX_LABEL_BYTES + 1, "%s", named ? named : key ? auth_key_tenant(key) : "");
    return 0;
}

/* The body as a JSON object holding only `allowed` fields; NULL with e set. */
static json_t *load_object(const char *body, size_t len, const char *const *allowed, int n_allowed, ApiError *e) {
    json_error_t jerr;
    json_t *o = len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!o) return api_error_set(e, 400, NULL, NULL, "the body must be a JSON object%s%s", len ? ": " : "", len ? jerr.text : ""), NULL;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool known = false;
        for (int i = 0; i < n_allowed && !known; i++) known = strcmp(k, allowed[i]) == 0;
        if (!known) {
            api_error_set(e, 400, k, NULL, "unknown field '%.48s' (a cache takes messages or prompt, ttl, model and tenant)", k);
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* ttl: seconds as a number, or "<n>s" / "<n>m" / "<n>h" (Gemini writes "300s"); 1 s to 24 h. */
static int read_ttl(const json_t *v, double *ttl_s, ApiError *e) {
    if (!v || json_is_null(v)) return *ttl_s = EXPLICIT_CACHE_DEFAULT_TTL_S, 0;
    double ttl = NAN;
    if (json_is_number(v)) ttl = json_number_value(v);
    else if (json_is_string(v)) {
        char *end;
        const char *s = json_string_value(v);
        double x = strtod(s, &end);
        double unit = strcmp(end, "s") == 0 || *end == '\0' ? 1 : strcmp(end, "m") == 0 ? 60 : strcmp(end, "h") == 0 ? 3600 : NAN;
        if (end != s) ttl = x * unit;
    }
    if (!(ttl >= 1 && ttl <= EXPLICIT_CACHE_MAX_TTL_S))
        return api_error_set(e, 400, "ttl", NULL, "ttl must be 1 s to 24 h: seconds, or a string like \"300s\", \"5m\" or \"1h\"");
    *ttl_s = ttl;
    return 0;
}

/* ---- prefill ---- */

typedef struct {
    int tokens;
    char *pin_outcome; /* the last directive's outcome as JSON text (the pin, or DELETE's unpin), or NULL */
} Prefill;

/* What a prefill does to the content's pin: create pins it, PATCH ends the old pin and pins it
 * again with the new TTL (a pin on its own only ever extends a deadline), DELETE ends the pin. */
typedef enum { PIN_SET, PIN_RESET, PIN_END } PinChange;

static void wait_finished(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->finished) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* The last directive's outcome out of the instance's outcome list (the pin, or DELETE's unpin). */
static char *last_outcome(const char *list_text) {
    json_t *list = list_text && list_text[0] ? json_loads(list_text, 0, NULL) : NULL;
    json_t *first = json_array_size(list) ? json_array_get(list, json_array_size(list) - 1) : NULL;
    if (first) json_object_del(first, "index");
    char *text = first ? json_dumps(first, JSON_COMPACT) : NULL;
    json_decref(list);
    return text;
}

/* Prefills content (messages or prompt) in tenant through the request path with the directives of
 * `change` (ttl_s: the pin's). The instance the router picks is the one holding the content, so an
 * unpin reaches the pin (a copy pinned elsewhere, by a re-warm, keeps its own deadline). */
static int prefill(const HttpGenerateContext *ctx, const char *tenant, const json_t *messages, const char *prompt, double ttl_s, PinChange change,
                   Prefill *out, ApiError *e) {
    memset(out, 0, sizeof *out);
    json_t *dirs = change == PIN_SET    ? json_pack("[{s:s, s:f}]", "op", "pin", "ttl", ttl_s)
                   : change == PIN_END ? json_pack("[{s:s}]", "op", "unpin")
                                       : json_pack("[{s:s}, {s:s, s:f}]", "op", "unpin", "op", "pin", "ttl", ttl_s);
    json_t *o = dirs ? json_pack("{s:i, s:i, s:o}", "max_tokens", 1, "temperature", 0, "directives", dirs) : NULL;
    if (o && messages) json_object_set(o, "messages", (json_t *)messages);
    if (o && prompt) json_object_set_new(o, "prompt", json_string(prompt));
    if (o && tenant[0]) json_object_set_new(o, "tenant", json_string(tenant));
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!body) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    ApiRequest a;
    int rc = api_request_parse(body, strlen(body), messages ? API_CHAT : API_COMPLETION, NULL, &a, e);
    free(body);
    if (rc) return -1; /* the content's own 400, naming its field */
    ChoiceSet set = {0};
    rc = choices_build(ctx, &a, &set, e);
    if (rc == 0) rc = choices_submit(ctx, &set, e);
    if (rc == 0) {
        CoordRequest *r = set.c[0].r;
        wait_finished(r);
        pthread_mutex_lock(&r->mu);
        if (r->error[0]) rc = api_error_set(e, r->error_status ? r->error_status : 500, NULL, NULL, "prefilling the cache failed: %s", r->error);
        else out->tokens = r->prompt_tokens, out->pin_outcome = last_outcome(r->directive_outcomes);
        pthread_mutex_unlock(&r->mu);
        /* Counted once in the manifest: the first request naming the cache makes its head hot, so a
         * restarted instance's re-warm (warm_start.h) prefills it again. Advisory: failure is ignored. */
        if (rc == 0 && ctx->manifest) (void)manifest_recorder_observe(ctx->manifest, a.tenant, a.adapter, r->prompt, r->n_prompt);
    }
    choices_free(ctx, &set, rc != 0);
    api_request_free(&a);
    return rc;
}

/* ---- the routes ---- */

static enum MHD_Result send_cache(struct MHD_Connection *conn, int status, const ExplicitCacheInfo *c) {
    json_t *o = explicit_cache_json(c);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return http_send_json(conn, status, text);
}

static enum MHD_Result create(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const AuthKey *key, const char *body, size_t len) {
    static const char *const allowed[] = {"messages", "prompt", "ttl", "model", "tenant"};
    ApiError e;
    char tenant[API_MAX_LABEL_BYTES + 1], id[EXPLICIT_CACHE_ID_BYTES];
    json_t *o = load_object(body, len, allowed, 5, &e);
    if (!o) return send_error(conn, &e);
    const json_t *messages = json_object_get(o, "messages"), *prompt = json_object_get(o, "prompt"), *model = json_object_get(o, "model");
    double ttl_s = 0;
    int rc = resolve_tenant(conn, key, o, tenant, &e);
    if (rc == 0) rc = read_ttl(json_object_get(o, "ttl"), &ttl_s, &e);
    if (rc == 0 && !messages == !prompt) rc = api_error_set(&e, 400, NULL, NULL, "a cache holds either messages (for chat) or a prompt (for completions): send exactly one");
    if (rc == 0 && messages && !json_is_array(messages)) rc = api_error_set(&e, 400, "messages", NULL, "messages must be an array of chat messages");
    if (rc == 0 && prompt && !json_is_string(prompt)) rc = api_error_set(&e, 400, "prompt", NULL, "prompt must be a string");
    if (rc == 0 && model && !json_is_null(model) && (!json_is_string(model) || strcmp(json_string_value(model), ctx->served_model) != 0))
        rc = api_error_set(&e, 404, "model", "model_not_found", "caches are kept for the base model '%s' only", ctx->served_model);
    if (rc == 0)
        rc = explicit_caches_reserve(ctx->caches, tenant, messages, prompt ? json_string_value(prompt) : NULL, ttl_s, explicit_caches_now(), id, &e);
    /* After the bound: a creation the bound refuses takes no prefill token. */
    double retry_after = 0;
    if (rc == 0 && explicit_caches_take_prefill(ctx->caches, tenant, explicit_caches_now(), &retry_after, &e)) {
        explicit_caches_abandon(ctx->caches, id);
        json_decref(o);
        return http_send_rate_limited(NULL, conn, NULL, &e, retry_after);
    }
    Prefill p;
    if (rc == 0 && (rc = prefill(ctx, tenant, messages, prompt ? json_string_value(prompt) : NULL, ttl_s, PIN_SET, &p, &e)) != 0)
        explicit_caches_abandon(ctx->caches, id);
    json_decref(o);
    if (rc) return send_error(conn, &e);
    explicit_caches_commit(ctx->caches, id, p.tokens, p.pin_outcome, explicit_caches_now());
    free(p.pin_outcome);
    ExplicitCacheInfo c;
    if (explicit_caches_get(ctx->caches, tenant, id, explicit_caches_now(), "id", &c, &e)) return send_error(conn, &e);
    enum MHD_Result r = send_cache(conn, 200, &c);
    explicit_cache_info_free(&c);
    return r;
}

static enum MHD_Result list(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const AuthKey *key) {
    ApiError e;
    char tenant[API_MAX_LABEL_BYTES + 1];
    if (resolve_tenant(conn, key, NULL, tenant, &e)) return send_error(conn, &e);
    json_t *data = explicit_caches_list(ctx->caches, tenant, explicit_caches_now());
    json_t *o = data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return http_send_json(conn, 200, text);
}

/* PATCH: a new TTL from now; the pin is ended and set again with it by prefilling the content again
 * (a cache hit), so a shorter TTL shortens the pin too. */
static enum MHD_Result patch(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const AuthKey *key, const char *id, const char *body,
                             size_t len) {
    static const char *const allowed[] = {"ttl", "tenant"};
    ApiError e;
    char tenant[API_MAX_LABEL_BYTES + 1];
    json_t *o = load_object(body, len, allowed, 2, &e);
    if (!o) return send_error(conn, &e);
    double ttl_s = 0;
    int rc = resolve_tenant(conn, key, o, tenant, &e);
    if (rc == 0 && !json_object_get(o, "ttl")) rc = api_error_set(&e, 400, "ttl", NULL, "PATCH changes a cache's ttl: send {\"ttl\": ...}");
    if (rc == 0) rc = read_ttl(json_object_get(o, "ttl"), &ttl_s, &e);
    json_decref(o);
    ExplicitCacheInfo c = {0};
    if (rc == 0) rc = explicit_caches_get(ctx->caches, tenant, id, explicit_caches_now(), "id", &c, &e);
    if (rc == 0 && !c.ready) rc = api_error_set(&e, 409, "id", "cache_not_ready", "cache '%.40s' is still being prefilled", id);
    double retry_after = 0;
    if (rc == 0 && explicit_caches_take_prefill(ctx->caches, tenant, explicit_caches_now(), &retry_after, &e)) {
        explicit_cache_info_free(&c);
        return http_send_rate_limited(NULL, conn, NULL, &e, retry_after);
    }
    Prefill p = {0};
    if (rc == 0) rc = prefill(ctx, tenant, c.messages, c.prompt, ttl_s, PIN_RESET, &p, &e);
    if (rc == 0) rc = explicit_caches_set_ttl(ctx->caches, tenant, id, ttl_s, explicit_caches_now(), &e);
    if (rc == 0) explicit_caches_commit(ctx->caches, id, c.tokens, p.pin_outcome, explicit_caches_now());
    free(p.pin_outcome);
    explicit_cache_info_free(&c);
    if (rc == 0) rc = explicit_caches_get(ctx->caches, tenant, id, explicit_caches_now(), "id", &c, &e);
    if (rc) return send_error(conn, &e);
    enum MHD_Result r = send_cache(conn, 200, &c);
    explicit_cache_info_free(&c);
    return r;
}

/* DELETE: the id goes at once (requests naming it get a 404 that says it was deleted), then the
 * content's pin is ended on the instance holding it, so its blocks are evictable again and the
 * tenant's pin budget gets them back. The answer carries the unpin's outcome ("unpin"), or why none
 * ran ("unpin_error": the cache was still being prefilled, or the unpin request failed). */
static enum MHD_Result delete_cache(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const char *tenant, const char *id) {
    ApiError e;
    ExplicitCacheInfo c = {0};
    bool have = explicit_caches_get(ctx->caches, tenant, id, explicit_caches_now(), "id", &c, &e) == 0;
    if (!have && e.status != 409) return send_error(conn, &e); /* unknown, deleted, expired: as before */
    if (explicit_caches_delete(ctx->caches, tenant, id, explicit_caches_now(), &e)) {
        explicit_cache_info_free(&c);
        return send_error(conn, &e);
    }
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "object", "cache.deleted", "deleted", 1);
    Prefill p = {0};
    if (have && prefill(ctx, tenant, c.messages, c.prompt, 0, PIN_END, &p, &e) == 0 && p.pin_outcome) {
        json_t *outcome = json_loads(p.pin_outcome, 0, NULL);
        if (o && outcome) json_object_set_new(o, "unpin", outcome);
        else json_decref(outcome);
    } else if (o) {
        json_object_set_new(o, "unpin_error", json_string(!have ? "the cache was still being prefilled; its pin ends at its deadline" : e.message));
    }
    free(p.pin_outcome);
    explicit_cache_info_free(&c);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return http_send_json(conn, 200, text);
}

static enum MHD_Result by_id(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const char *method, const AuthKey *key, const char *id,
                             const char *body, size_t len) {
    ApiError e;
    char tenant[API_MAX_LABEL_BYTES + 1];
    if (strcmp(method, "PATCH") == 0) return patch(ctx, conn, key, id, body, len);
    if (resolve_tenant(conn, key, NULL, tenant, &e)) return send_error(conn, &e);
    if (strcmp(method, "DELETE") == 0) return delete_cache(ctx, conn, tenant, id);
    ExplicitCacheInfo c;
    if (explicit_caches_get(ctx->caches, tenant, id, explicit_caches_now(), "id", &c, &e)) return send_error(conn, &e);
    enum MHD_Result r = send_cache(conn, 200, &c);
    explicit_cache_info_free(&c);
    return r;
}

enum MHD_Result http_caches(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const char *method, const char *url,
                            const AuthKey *key, const char *body, size_t len, bool too_large, size_t max_body_bytes) {
    ApiError e;
    const char *rest = url + strlen(CACHES_PATH);
    bool collection = rest[0] == '\0' || strcmp(rest, "/") == 0;
    const char *id = collection ? NULL : rest + 1;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (!ctx->caches) return api_error_set(&e, 404, NULL, NULL, "this server keeps no explicit caches"), send_error(conn, &e);
    if (id && (strchr(id, '/') || strlen(id) >= EXPLICIT_CACHE_ID_BYTES + 64))
        return api_error_set(&e, 404, NULL, NULL, "no endpoint %s %.80s (caches live at /v1/caches/{id})", method, url), send_error(conn, &e);
    if (collection && !get && strcmp(method, "POST") != 0) return send_405(conn, "GET, POST", "/v1/caches");
    if (!collection && !get && strcmp(method, "PATCH") != 0 && strcmp(method, "DELETE") != 0)
        return send_405(conn, "GET, PATCH, DELETE", "/v1/caches/{id}");
    if (too_large) return api_error_set(&e, 413, NULL, NULL, "request body exceeds %zu bytes", max_body_bytes), send_error(conn, &e);
    if (collection) return get ? list(ctx, conn, key) : create(ctx, conn, key, body ? body : "", len);
    return by_id(ctx, conn, method, key, id, body ? body : "", len);
}
