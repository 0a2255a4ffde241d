#include "coord/http/http_api.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include "common/log.h"
#include "coord/http/http_front_door.h"
#include "coord/auto_splice.h"
#include "coord/http/http_generate.h"
#include "coord/explicit_caches.h"
#include "coord/http/http_caches.h"
#include "coord/http/http_lora.h"
#include "coord/http/http_internal.h"
#include "coord/http/http_manifest.h"
#include "coord/http/http_messages.h"
#include "coord/key_limiter.h"
#include "common/timeutil.h"

struct HttpApi {
    HttpApiConfig cfg;
    HttpGenerateContext generate; /* what the completion endpoints borrow of cfg */
    struct MHD_Daemon *daemon;
    FrontDoor *front_door; /* owns the listening socket; hands complete request lines to daemon */
    pthread_mutex_t mu;
    int open_requests; /* requests whose response is not completely sent yet */
    _Atomic uint64_t seed_counter; /* makes every unseeded request's seed distinct (api_request_sampling_seed) */
    KeyLimiter *limiter;           /* the keys' max_concurrent= / rate= (key_limiter.h); NULL without keys */
    HttpLora *lora_admin;          /* adapters at run time (http_lora.h); NULL: out of memory at start (503) */
};

/* The body of one request, collected across MHD's upload callbacks. */
typedef struct {
    char *data;
    size_t len, cap;
    bool too_large;
    size_t header_bytes; /* request line and headers, as received */
    int limit_slot;      /* the key whose limiter slot this request holds (auth_key_index), -1 none */
} RequestBody;

static enum MHD_Result send_text(struct MHD_Connection *conn, int status, const char *type, char *body) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* 200 while the cluster serves ("ready", or "degraded" when some instances died), else 503; each
 * instance's state, why a dead one died, and how often it was restarted (--restart-instances). */
static enum MHD_Result handle_health(HttpApi *api, struct MHD_Connection *conn) {
    const char *state = coordinator_state(api->cfg.coord);
    bool serving = strcmp(state, "ready") == 0 || strcmp(state, "degraded") == 0;
    int n = api->cfg.coord->cfg.n_instances;
    InstanceStatus *status = calloc((size_t)(n > 0 ? n : 1), sizeof *status);
    json_t *list = json_array();
    int alive = status ? coordinator_instances(api->cfg.coord, status, n) : 0;
    for (int i = 0; status && list && i < n; i++) {
        json_t *one = json_pack("{s:i, s:s}", "instance", i, "state", instance_state_name(status[i].state));
        if (one && status[i].state == INSTANCE_DEAD) json_object_set_new(one, "reason", json_string(status[i].reason));
        if (one && status[i].restarts > 0) json_object_set_new(one, "restarts", json_integer(status[i].restarts));
        json_array_append_new(list, one);
    }
    free(status);
    /* Requests the progress watchdog had to answer: each one an instance lost (or held stuck). */
    double watchdog_s;
    uint64_t past_watchdog, last_past;
    coordinator_watchdog_status(api->cfg.coord, &watchdog_s, &past_watchdog, &last_past);
    json_t *watchdog = json_pack("{s:f, s:I}", "timeout_s", watchdog_s, "requests_past_watchdog", (json_int_t)past_watchdog);
    if (watchdog && last_past) json_object_set_new(watchdog, "last_request_id", json_integer((json_int_t)last_past));
    return http_send_json(conn, serving ? 200 : 503,
                          dump(json_pack("{s:s, s:i, s:i, s:o*, s:I, s:o*}", "status", state, "instances", n, "instances_alive", alive,
                                         "instance_states", list, "requests_past_watchdog", (json_int_t)past_watchdog,
                                         "request_watchdog", watchdog)));
}

/* max_model_len is what one request (prompt + max_tokens) may reach: the context, or the KV pool
 * when that holds less, the same limit the completion endpoints enforce. */
static json_t *model_entry(HttpApi *api, const char *id, const char *parent) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", id, "object", "model", "created", (json_int_t)time(NULL), "owned_by",
                          "braid", "max_model_len", http_generate_max_model_len(&api->generate));
    /* vLLM lists a LoRA adapter as a model whose parent is the base model. */
    if (m && parent && json_object_set_new(m, "parent", json_string(parent))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* The base model, then every loaded LoRA adapter. */
static enum MHD_Result handle_models(HttpApi *api, struct MHD_Connection *conn) {
    json_t *data = json_array();
    if (data && json_array_append_new(data, model_entry(api, api->cfg.served_model, NULL))) json_decref(data), data = NULL;
    for (int i = 0; data && api->cfg.lora && i < api->cfg.lora->n; i++)
        if (lora_set_get(api->cfg.lora, i + 1) && json_array_append_new(data, model_entry(api, api->cfg.lora->adapters[i].name, api->cfg.served_model)))
            json_decref(data), data = NULL;
    return http_send_json(conn, 200, dump(data ? json_pack("{s:s, s:o}", "object", "list", "data", data) : NULL));
}

static enum MHD_Result handle_metrics(HttpApi *api, struct MHD_Connection *conn) {
    return send_text(conn, 200, "text/plain; version=0.0.4; charset=utf-8", metrics_render(api->cfg.metrics));
}

/* The tenant whose workflow a POST /v1/workflows/{id}/end ends: with API keys the key's own, or
 * one it shares named by X-Braid-Tenant (403 otherwise); without keys the X-Braid-Tenant header's
 * (the tenant its requests named), else none. *tenant borrows from key or conn. 0, or -1 with e. */
static int workflow_end_tenant(struct MHD_Connection *conn, const AuthKey *key, const char **tenant, ApiError *e) {
    const char *named = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Braid-Tenant");
    if (named && api_request_check_label("tenant", "header X-Braid-Tenant", named, strlen(named), e)) return -1;
    *tenant = named;
    if (!key) return 0;
    if (named && !auth_key_allows_tenant(key, named))
        return api_error_set(e, 403, "tenant", "tenant_not_allowed", "this API key belongs to tenant '%s' and does not share tenant '%.64s'",
                             auth_key_tenant(key), named);
    if (!named) *tenant = auth_key_tenant(key);
    return 0;
}

/* POST /v1/workflows/{id}/end. The id (percent-decoded by libmicrohttpd) is checked like a
 * workflow_id in a body or header; it names a workflow in the caller's tenant's namespace only. */
static enum MHD_Result handle_workflow_end(HttpApi *api, struct MHD_Connection *conn, const char *url, const AuthKey *key) {
    const char *prefix = "/v1/workflows/", *suffix = "/end", *tenant = NULL;
    size_t n = strlen(url) - strlen(prefix) - strlen(suffix);
    ApiError e;
    if (api_request_check_label("workflow_id", "the workflow id in the path", url + strlen(prefix), n, &e) ||
        workflow_end_tenant(conn, key, &tenant, &e))
        return http_send_error(api->cfg.metrics, conn, NULL, &e);
    char *id = strndup(url + strlen(prefix), n);
    if (!id || coordinator_workflow_end(api->cfg.coord, tenant, id)) {
        free(id);
        api_error_set(&e, 503, NULL, NULL, "the server is out of memory");
        return http_send_error(api->cfg.metrics, conn, NULL, &e);
    }
    enum MHD_Result rc = http_send_json(conn, 200, dump(json_pack("{s:s, s:b}", "workflow_id", id, "ended", 1)));
    free(id);
    return rc;
}

static bool has_prefix_suffix(const char *s, const char *prefix, const char *suffix) {
    size_t n = strlen(s), p = strlen(prefix), q = strlen(suffix);
    return n > p + q && strncmp(s, prefix, p) == 0 && strcmp(s + n - q, suffix) == 0;
}

/* With API keys: the key the request presents, or NULL with e set to the 401 (missing or wrong key).
 * Without keys: NULL and e.status 0. The key itself is never logged nor echoed. A key comes as
 * 'Authorization: Bearer KEY' (OpenAI's clients) or 'x-api-key: KEY' (Anthropic's), on any endpoint. */
static const AuthKey *authenticate(HttpApi *api, struct MHD_Connection *conn, ApiError *e) {
    e->status = 0;
    if (!api->cfg.keys) return NULL;
    const char *header = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *api_key = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    const AuthKey *key = auth_keys_authenticate(api->cfg.keys, header);
    if (!key && api_key) key = auth_keys_lookup(api->cfg.keys, api_key);
    if (!key && !header && !api_key)
        api_error_set(e, 401, NULL, "missing_api_key",
                      "You didn't provide an API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
    else if (!key) api_error_set(e, 401, NULL, "invalid_api_key", "Incorrect API key provided");
    return key;
}

/* A completion body must be JSON. No Content-Type at all is read as JSON (some minimal clients send
 * none); any other media type (curl -d sends application/x-www-form-urlencoded) is a 415. */
static int check_content_type(struct MHD_Connection *conn, ApiError *e) {
    const char *type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!type) return 0;
    while (*type == ' ' || *type == '\t') type++;
    size_t n = strcspn(type, ";");
    while (n > 0 && (type[n - 1] == ' ' || type[n - 1] == '\t')) n--;
    if (n == strlen("application/json") && strncasecmp(type, "application/json", n) == 0) return 0;
    return api_error_set(e, 415, NULL, "unsupported_media_type",
                         "Content-Type must be application/json, got '%.*s' (with curl, add -H 'Content-Type: application/json')",
                         (int)(n > 64 ? 64 : n), type);
}

/* The 429 of a key past its own max_concurrent= or rate=. */
static void key_limited_error(const AuthKey *key, KeyLimitResult why, ApiError *e) {
    if (why == KEY_LIMIT_CONCURRENCY)
        api_error_set(e, 429, NULL, "rate_limit_exceeded", "this API key already has %d requests in flight (its max_concurrent=); retry when one ends",
                      auth_key_max_concurrent(key));
    else
        api_error_set(e, 429, NULL, "rate_limit_exceeded", "this API key is over its rate of %g requests per second (its rate=); retry shortly",
                      auth_key_rate(key));
}

/* A key past its own max_concurrent= or rate=: 429 with the Retry-After the limiter computed. */
static enum MHD_Result send_key_limited(HttpApi *api, struct MHD_Connection *conn, const char *endpoint, const AuthKey *key,
                                       KeyLimitResult why, double retry_after_s) {
    ApiError e;
    key_limited_error(key, why, &e);
    return http_send_rate_limited(api->cfg.metrics, conn, endpoint, &e, retry_after_s);
}

/* The Anthropic Messages endpoints: as the completion endpoints below, with every error in
 * Anthropic's shape (http_messages.h). */
static enum MHD_Result route_messages(HttpApi *api, struct MHD_Connection *conn, const char *url, bool post, RequestBody *body,
                                      AnthropicEndpoint which) {
    const char *endpoint = http_messages_endpoint_label(which);
    ApiError e;
    if (!post) return api_error_set(&e, 405, NULL, NULL, "%s expects POST", url), http_messages_send_error(api->cfg.metrics, conn, NULL, &e, NULL);
    const AuthKey *key = authenticate(api, conn, &e);
    if (e.status) return http_messages_send_error(api->cfg.metrics, conn, endpoint, &e, NULL);
    if (body->too_large) {
        api_error_set(&e, 413, NULL, NULL, "request body exceeds %zu bytes", api->cfg.max_body_bytes);
        return http_messages_send_error(api->cfg.metrics, conn, endpoint, &e, NULL);
    }
    if (check_content_type(conn, &e)) return http_messages_send_error(api->cfg.metrics, conn, endpoint, &e, NULL);
    if (key && api->limiter && (auth_key_max_concurrent(key) > 0 || auth_key_rate(key) > 0)) {
        double retry_after;
        KeyLimitResult lim = key_limiter_acquire(api->limiter, auth_key_index(key), auth_key_max_concurrent(key), auth_key_rate(key),
                                                 braid_now_seconds(), &retry_after);
        if (lim != KEY_LIMIT_OK) {
            char retry[32];
            snprintf(retry, sizeof retry, "%.0f", ceil(retry_after > 1 ? retry_after : 1));
            key_limited_error(key, lim, &e);
            return http_messages_send_error(api->cfg.metrics, conn, endpoint, &e, retry);
        }
        body->limit_slot = auth_key_index(key);
    }
    return http_messages(&api->generate, conn, which, key, body->data ? body->data : "", body->len);
}

/* The completion endpoints and POST /v1/workflows/{id}/end. */
static enum MHD_Result route_post(HttpApi *api, struct MHD_Connection *conn, const char *url, bool post, RequestBody *body) {
    ApiError e;
    bool chat = strcmp(url, "/v1/chat/completions") == 0, completions = strcmp(url, "/v1/completions") == 0;
    const char *endpoint = chat ? "chat" : completions ? "completions" : NULL;
    if (!post) return api_error_set(&e, 405, NULL, NULL, "%s expects POST", url), http_send_error(api->cfg.metrics, conn, NULL, &e);
    const AuthKey *key = authenticate(api, conn, &e);
    if (e.status) return http_send_error(api->cfg.metrics, conn, endpoint, &e);
    if (body->too_large) {
        api_error_set(&e, 413, NULL, NULL, "request body exceeds %zu bytes", api->cfg.max_body_bytes);
        return http_send_error(api->cfg.metrics, conn, endpoint, &e);
    }
    if (!endpoint) return handle_workflow_end(api, conn, url, key);
    if (check_content_type(conn, &e)) return http_send_error(api->cfg.metrics, conn, endpoint, &e);
    /* The key's own limits; the slot is released when the answer has been sent (on_completed). */
    if (key && api->limiter && (auth_key_max_concurrent(key) > 0 || auth_key_rate(key) > 0)) {
        double retry_after;
        KeyLimitResult lim = key_limiter_acquire(api->limiter, auth_key_index(key), auth_key_max_concurrent(key), auth_key_rate(key),
                                                 braid_now_seconds(), &retry_after);
        if (lim != KEY_LIMIT_OK) return send_key_limited(api, conn, endpoint, key, lim, retry_after);
        body->limit_slot = auth_key_index(key);
    }
    return http_generate(&api->generate, conn, chat ? API_CHAT : API_COMPLETION, key, body->data ? body->data : "", body->len);
}

/* Which endpoint a path names, and whether the method fits it. */
static enum MHD_Result route(HttpApi *api, struct MHD_Connection *conn, const char *url, const char *method, RequestBody *body) {
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
    ApiError e;
    if (body->header_bytes > HTTP_MAX_HEADER_BYTES) {
        api_error_set(&e, 431, NULL, NULL, "the request line and headers are %zu bytes; at most %d are accepted", body->header_bytes,
                      HTTP_MAX_HEADER_BYTES);
        return http_send_error(api->cfg.metrics, conn, NULL, &e);
    }
    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0 || has_prefix_suffix(url, "/v1/workflows/", "/end"))
        return route_post(api, conn, url, post, body);
    if (strcmp(url, "/v1/messages") == 0) return route_messages(api, conn, url, post, body, ANTHROPIC_MESSAGES);
    if (strcmp(url, "/v1/messages/count_tokens") == 0) return route_messages(api, conn, url, post, body, ANTHROPIC_COUNT_TOKENS);
    if (http_lora_path(url)) { /* adapters at run time (http_lora.h) */
        const AuthKey *key = authenticate(api, conn, &e);
        if (e.status) return http_send_error(api->cfg.metrics, conn, NULL, &e);
        if (!api->lora_admin) return api_error_set(&e, 503, NULL, NULL, "adapters at run time are unavailable"), http_send_error(api->cfg.metrics, conn, NULL, &e);
        return http_lora(api->lora_admin, conn, method, url, key, body->data, body->len, body->too_large, api->cfg.max_body_bytes);
    }
    if (http_caches_path(url)) { /* explicit caches (http_caches.h) */
        const AuthKey *key = authenticate(api, conn, &e);
        if (e.status) return http_send_error(api->cfg.metrics, conn, NULL, &e);
        /* A write runs a prefill: the key's own limits apply to it as to a completion. */
        if (!get && key && api->limiter && (auth_key_max_concurrent(key) > 0 || auth_key_rate(key) > 0)) {
            double retry_after;
            KeyLimitResult lim = key_limiter_acquire(api->limiter, auth_key_index(key), auth_key_max_concurrent(key), auth_key_rate(key),
                                                     braid_now_seconds(), &retry_after);
            if (lim != KEY_LIMIT_OK) return send_key_limited(api, conn, "caches", key, lim, retry_after);
            body->limit_slot = auth_key_index(key);
        }
        return http_caches(&api->generate, conn, method, url, key, body->data, body->len, body->too_large, api->cfg.max_body_bytes);
    }
    bool health = strcmp(url, "/health") == 0, models = strcmp(url, "/v1/models") == 0, metrics = strcmp(url, "/metrics") == 0;
    bool manifest = strcmp(url, "/v1/cache/manifest") == 0;
    if (health || models || metrics || manifest) {
        if (!get) return api_error_set(&e, 405, NULL, NULL, "%s expects GET", url), http_send_error(api->cfg.metrics, conn, NULL, &e);
        if (health) return handle_health(api, conn); /* open to load balancers, key or not */
        const AuthKey *key = authenticate(api, conn, &e);
        if (e.status) return http_send_error(api->cfg.metrics, conn, NULL, &e);
        if (manifest) return http_manifest(conn, api->cfg.manifest, key, api->cfg.metrics);
        return models ? handle_models(api, conn) : handle_metrics(api, conn);
    }
    api_error_set(&e, 404, NULL, NULL, "no endpoint %s %s (see GET /v1/models, POST /v1/chat/completions)", method, url);
    return http_send_error(api->cfg.metrics, conn, NULL, &e);
}

/* Adds one header's share to the running total (MHD_KeyValueIterator). */
static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

/* Whether the request carries Expect: 100-continue (RFC 9110 10.1.1: the client waits before its body). */
static bool expects_continue(struct MHD_Connection *conn) {
    const char *expect = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return expect && strcasecmp(expect, "100-continue") == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    HttpApi *api = cls;
    RequestBody *body = *con_cls;
    if (!body) {
        /* First call: headers only. An announced body over the limit is refused (unread when the client waits for 100-continue). */
        if (!(body = calloc(1, sizeof *body))) return MHD_NO;
        body->limit_slot = -1;
        pthread_mutex_lock(&api->mu);
        api->open_requests++;
        pthread_mutex_unlock(&api->mu);
        const char *declared = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (declared && strtoull(declared, NULL, 10) > api->cfg.max_body_bytes) body->too_large = true;
        body->header_bytes = strlen(method) + strlen(url) + strlen(version) + 4;
        MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &body->header_bytes);
        *con_cls = body;
        /* A client that sent Expect: 100-continue waits for a go-ahead before its body: it gets the
         * answer now (413, or what the route says first: 401, 404, 405) instead of "100 Continue" and
         * an upload of everything it announced, which was read only to be dropped; libmicrohttpd then
         * skips the upload and closes the connection (POST and PUT). Without Expect the body is on
         * its way: it is read (and dropped) first, since closing on a client still sending resets
         * the connection, and the client sees a broken pipe instead of the 413. */
        if (body->too_large && expects_continue(conn) && (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0))
            return route(api, conn, url, method, body);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!body->too_large && body->len + *upload_size > api->cfg.max_body_bytes) body->too_large = true;
        if (!body->too_large) {
            if (body->len + *upload_size + 1 > body->cap) {
                size_t cap = (body->len + *upload_size + 1) * 2;
                char *grown = realloc(body->data, cap);
                if (!grown) return MHD_NO;
                body->data = grown;
                body->cap = cap;
            }
            memcpy(body->data + body->len, upload, *upload_size);
            body->len += *upload_size;
            body->data[body->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* The request is in: from here the server, not the client, is slow (a long prefill, a stream
     * between tokens), so the idle timeout is off until the answer is sent (on_completed). A client
     * that leaves meanwhile is noticed by http_generate.c. */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    return route(api, conn, url, method, body);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode code) {
    (void)code;
    HttpApi *api = cls;
    /* Between requests a kept-alive connection is the client's to use: the idle timeout is back. */
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)(api->cfg.timeout_s * 3));
    RequestBody *body = *con_cls;
    if (body) {
        if (body->limit_slot >= 0) key_limiter_release(api->limiter, body->limit_slot);
        free(body->data);
        pthread_mutex_lock(&api->mu);
        api->open_requests--;
        pthread_mutex_unlock(&api->mu);
    }
    free(body);
    *con_cls = NULL;
}

/* FrontDoorConfig.hand_over: the connection joins libmicrohttpd, which closes it when it cannot. */
static int add_connection(void *ctx, int fd, const struct sockaddr *addr, socklen_t len) {
    HttpApi *api = ctx;
    return MHD_add_connection(api->daemon, fd, addr, len) == MHD_YES ? 0 : -1;
}

/* The bounds with their defaults filled in (http_api.h). */
static void fill_limits(HttpApiConfig *c) {
    if (c->max_connections <= 0) c->max_connections = 1024;
    if (c->max_connections_per_client <= 0) c->max_connections_per_client = 64;
    if (c->timeout_s <= 0) c->timeout_s = 10;
}

/* Every connection is a descriptor: lift the soft open-file limit to the hard one, so the bounds
 * above, not EMFILE at 1024, decide who is refused. */
static void raise_fd_limit(void) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &lim)) LOG_WARN("http", "cannot raise the open-file limit: %s", strerror(errno));
    }
}

static struct MHD_Daemon *start_daemon(HttpApi *api, bool tls) {
    const HttpApiConfig *cfg = &api->cfg;
    /* TLS options go in an array: MHD_start_daemon's variadic list cannot hold them conditionally. */
    struct MHD_OptionItem tls_options[] = {
        {tls ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, (void *)cfg->tls_key_pem},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)cfg->tls_cert_pem},
        {MHD_OPTION_END, 0, NULL},
    };
    /* No listening socket of its own: the front door accepts and hands connections over. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_NO_LISTEN_SOCKET |
                     MHD_USE_ITC | (tls ? MHD_USE_TLS : 0);
    return MHD_start_daemon(flags, 0, NULL, NULL, on_request, api, MHD_OPTION_ARRAY, tls_options, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, api, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(cfg->timeout_s * 3),
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections * 2), MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(cfg->max_connections_per_client * 4),
                            /* Room for headers past HTTP_MAX_HEADER_BYTES, so that route() rather than
                             * libmicrohttpd's HTML page answers most oversized ones (with JSON). */
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_CONNECTION_MEMORY, MHD_OPTION_END);
}

HttpApi *http_api_start(const HttpApiConfig *cfg, BraidError *err) {
    HttpApi *api = calloc(1, sizeof *api);
    if (!api) return braid_error_set(err, "http: out of memory"), NULL;
    api->cfg = *cfg;
    fill_limits(&api->cfg);
    api->generate = (HttpGenerateContext){.coord = cfg->coord, .metrics = cfg->metrics, .model = cfg->model,
                                          .served_model = cfg->served_model, .lora = cfg->lora, .seed_counter = &api->seed_counter,
                                          .segment_reuse = cfg->segment_reuse, .manifest = cfg->manifest};
    /* auto_splice's recent prompts: at most 256 conversations x AUTO_SPLICE_RECENT prompts of at
     * most 32K tokens (128 MiB at worst; the least recently used conversation goes first). */
    if (!(api->generate.auto_splice = auto_splice_store_create(256, 32768))) {
        free(api);
        return braid_error_set(err, "http: out of memory"), NULL;
    }
    if (!(api->generate.caches = explicit_caches_create())) {
        auto_splice_store_free(api->generate.auto_splice);
        free(api);
        return braid_error_set(err, "http: out of memory"), NULL;
    }
    explicit_caches_set_create_rate(api->generate.caches, cfg->cache_create_rate);
    if (cfg->state_dir) {
        char why[600];
        if (explicit_caches_open_state(api->generate.caches, cfg->state_dir, explicit_caches_now(), why, sizeof why))
            LOG_WARN("http", "--state-dir: %s", why);
        else
            LOG_INFO("http", "--state-dir: %s", why);
    }
    pthread_mutex_init(&api->mu, NULL);
    if (cfg->keys && !(api->limiter = key_limiter_create(auth_keys_count(cfg->keys)))) {
        pthread_mutex_destroy(&api->mu);
        auto_splice_store_free(api->generate.auto_splice);
        explicit_caches_destroy(api->generate.caches);
        free(api);
        return braid_error_set(err, "http: out of memory"), NULL;
    }
    bool tls = cfg->tls_cert_pem && cfg->tls_key_pem;
    if (tls && !MHD_is_feature_supported(MHD_FEATURE_TLS)) {
        key_limiter_destroy(api->limiter);
        auto_splice_store_free(api->generate.auto_splice);
        explicit_caches_destroy(api->generate.caches);
        free(api);
        return braid_error_set(err, "http: --tls-cert/--tls-key given, but this libmicrohttpd was built without TLS"), NULL;
    }
    /* The coordinator's set is written only by http_lora, under its lock; readers tolerate it (lora_adapter.h). */
    HttpLoraConfig lc = {.coord = cfg->coord, .set = (LoraSet *)cfg->lora, .base = cfg->model ? &cfg->model->weights.cfg : NULL,
                         .served_model = cfg->served_model, .keys = cfg->keys, .allow_open = cfg->allow_runtime_lora, .metrics = cfg->metrics};
    if (cfg->lora && cfg->model && !(api->lora_admin = http_lora_create(&lc))) LOG_WARN("http", "out of memory: adapters at run time are off");
    raise_fd_limit();
    if (!(api->daemon = start_daemon(api, tls))) {
        http_lora_destroy(api->lora_admin);
        key_limiter_destroy(api->limiter);
        auto_splice_store_free(api->generate.auto_splice);
        explicit_caches_destroy(api->generate.caches);
        free(api);
        return braid_error_set(err, "http: cannot start the HTTP server%s",
                               tls ? " (the --tls-cert / --tls-key PEM was refused, or they do not match)" : ""),
               NULL;
    }
    FrontDoorConfig fc = {.host = cfg->host, .port = cfg->port, .inspect_request_line = !tls,
                          .max_pending_per_client = api->cfg.max_connections_per_client, .max_pending = api->cfg.max_connections,
                          .line_timeout_s = api->cfg.timeout_s, .hand_over = add_connection, .hand_over_ctx = api};
    if (!(api->front_door = front_door_start(&fc, err))) {
        MHD_stop_daemon(api->daemon);
        http_lora_destroy(api->lora_admin);
        key_limiter_destroy(api->limiter);
        auto_splice_store_free(api->generate.auto_splice);
        explicit_caches_destroy(api->generate.caches);
        free(api);
        return NULL;
    }
    return api;
}

int http_api_quiesce(HttpApi *api, double timeout_s) {
    if (!api) return 0;
    int open = 0;
    for (double waited = 0; waited <= timeout_s; waited += 0.01) {
        pthread_mutex_lock(&api->mu);
        open = api->open_requests;
        pthread_mutex_unlock(&api->mu);
        if (open == 0) break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return open;
}

void http_api_stop_accepting(HttpApi *api) {
    if (!api) return;
    pthread_mutex_lock(&api->mu);
    FrontDoor *d = api->front_door;
    api->front_door = NULL;
    pthread_mutex_unlock(&api->mu);
    front_door_stop(d); /* closes the listening socket: new connections are refused */
}

void http_api_stop(HttpApi *api) {
    if (!api) return;
    http_api_stop_accepting(api); /* no new connections; then the daemon ends the open ones */
    MHD_stop_daemon(api->daemon);
    http_lora_destroy(api->lora_admin);
    key_limiter_destroy(api->limiter);
    auto_splice_store_free(api->generate.auto_splice);
    explicit_caches_destroy(api->generate.caches);
    pthread_mutex_destroy(&api->mu);
    free(api);
}
