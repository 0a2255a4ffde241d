#include "coord/http/http_lora.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coord/http/http_internal.h"

struct HttpLora {
    HttpLoraConfig cfg;
    pthread_mutex_t mu; /* one load or unload at a time: the name checks and the install agree */
};

HttpLora *http_lora_create(const HttpLoraConfig *cfg) {
    HttpLora *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->cfg = *cfg;
    pthread_mutex_init(&h->mu, NULL);
    return h;
}

void http_lora_destroy(HttpLora *h) {
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    free(h);
}

bool http_lora_path(const char *url) {
    return strcmp(url, "/v1/load_lora_adapter") == 0 || strcmp(url, "/v1/unload_lora_adapter") == 0;
}

/* Copies a required, non-empty string field without control characters into out (cap bytes). */
static int take_string(const json_t *o, const char *field, char *out, size_t cap, ApiError *e) {
    const json_t *v = json_object_get(o, field);
    if (!v) return api_error_set(e, 400, field, "missing_field", "'%s' is required", field);
    if (!json_is_string(v)) return api_error_set(e, 400, field, "invalid_type", "'%s' must be a string", field);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0) return api_error_set(e, 400, field, "invalid_value", "'%s' must not be empty", field);
    if (n >= cap) return api_error_set(e, 400, field, "invalid_value", "'%s' is longer than %zu bytes", field, cap - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return api_error_set(e, 400, field, "invalid_value", "'%s' holds a control character", field);
    memcpy(out, s, n + 1);
    return 0;
}

int http_lora_parse(const char *body, size_t len, bool unload, char name[HTTP_LORA_MAX_NAME + 1],
                    char path[HTTP_LORA_MAX_PATH + 1], ApiError *e) {
    name[0] = path[0] = '\0';
    json_error_t jerr;
    json_t *o = body && len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    int rc = 0;
    if (!o || !json_is_object(o))
        rc = api_error_set(e, 400, NULL, "invalid_json",
                           unload ? "the body must be a JSON object: {\"lora_name\": \"NAME\"}"
                                  : "the body must be a JSON object: {\"lora_name\": \"NAME\", \"lora_path\": \"/path/adapter.gguf\"}");
    if (rc == 0) rc = take_string(o, "lora_name", name, HTTP_LORA_MAX_NAME + 1, e);
    if (rc == 0 && !unload) rc = take_string(o, "lora_path", path, HTTP_LORA_MAX_PATH + 1, e);
    json_decref(o);
    return rc;
}

int http_lora_check_caller(const AuthKeys *keys, const AuthKey *key, bool allow_open, ApiError *e) {
    if (keys && !auth_key_admin(key))
        return api_error_set(e, 403, NULL, "permission_denied",
                             "loading and unloading adapters needs an admin key (the word admin on its line of the --api-keys file)");
    if (!keys && !allow_open)
        return api_error_set(e, 403, NULL, "permission_denied",
                             "adapters at run time are off: start braid serve with --api-keys and an admin key, or with --allow-runtime-lora");
    return 0;
}

static enum MHD_Result send_success(struct MHD_Connection *conn, const char *text) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Under h->mu. 0 with the adapter registered, or -1 with e set. */
static int load_adapter(HttpLora *h, const char *name, const char *path, ApiError *e) {
    if (h->cfg.served_model && strcmp(name, h->cfg.served_model) == 0)
        return api_error_set(e, 400, "lora_name", "invalid_value", "'%.64s' is the base model's name; choose another adapter name", name);
    if (lora_set_find(h->cfg.set, name) > 0)
        return api_error_set(e, 409, "lora_name", "adapter_exists", "adapter '%.64s' is already loaded (unload it first)", name);
    /* A name unloaded before loads again as its next generation: a cache namespace of its own
     * (lora_cache_name), so no block the old weights computed can serve it. */
    unsigned generation = lora_set_next_generation(h->cfg.set, name);
    BraidError err;
    LoraAdapter ad;
    if (lora_adapter_load(path, name, h->cfg.base, &ad, &err)) /* the start-up checks, before any instance */
        return api_error_set(e, 400, "lora_path", "invalid_adapter", "%s", err.msg);
    ad.generation = generation;
    char why[640];
    int ok = 0, status = coordinator_lora(h->cfg.coord, false, name, path, (int)generation, HTTP_LORA_TIMEOUT_S, &ok, why, sizeof why);
    if (status == 0 && lora_set_install(h->cfg.set, &ad, NULL, &err)) status = 500, snprintf(why, sizeof why, "%s", err.msg);
    if (status == 0) return 0;
    lora_adapter_free(&ad);
    if (ok > 0 || status == 503 || status == 500) { /* take it back from the instances that took it */
        char undo_why[640];
        if (coordinator_lora(h->cfg.coord, true, name, NULL, 0, HTTP_LORA_TIMEOUT_S, NULL, undo_why, sizeof undo_why))
            LOG_WARN("http", "adapter '%s': undoing a partial load: %s", name, undo_why);
    }
    return api_error_set(e, status, status == 400 ? "lora_path" : NULL, status == 400 ? "invalid_adapter" : NULL,
                         "adapter '%.64s' not loaded: %s", name, why);
}

/* Under h->mu. 0 with the adapter retired everywhere, or -1 with e set. */
static int unload_adapter(HttpLora *h, const char *name, ApiError *e) {
    if (lora_set_find(h->cfg.set, name) <= 0)
        return api_error_set(e, 404, "lora_name", "adapter_not_found", "adapter '%.64s' is not loaded", name);
    char why[640];
    int ok = 0, status = coordinator_lora(h->cfg.coord, true, name, NULL, 0, HTTP_LORA_TIMEOUT_S, &ok, why, sizeof why);
    if (status == 0) {
        lora_set_retire(h->cfg.set, name);
        return 0;
    }
    if (ok > 0) { /* gone from some instances: no request may name it any more */
        lora_set_retire(h->cfg.set, name);
        return api_error_set(e, 500, NULL, "partial_unload", "adapter '%.64s' was unloaded from %d instance(s) but not all (%s); it is no longer served",
                             name, ok, why);
    }
    if (status == 400) status = 409; /* an instance still held a request of it */
    return api_error_set(e, status, NULL, status == 409 ? "adapter_busy" : NULL, "adapter '%.64s' not unloaded: %s", name, why);
}

enum MHD_Result http_lora(HttpLora *h, struct MHD_Connection *conn, const char *method, const char *url, const AuthKey *key,
                          const char *body, size_t len, bool too_large, size_t max_body_bytes) {
    bool unload = strcmp(url, "/v1/unload_lora_adapter") == 0;
    const char *endpoint = unload ? "unload_lora_adapter" : "load_lora_adapter";
    ApiError e;
    char name[HTTP_LORA_MAX_NAME + 1], path[HTTP_LORA_MAX_PATH + 1];
    int rc = strcmp(method, "POST") != 0 ? api_error_set(&e, 405, NULL, NULL, "%s expects POST", url) : 0;
    if (rc == 0) rc = http_lora_check_caller(h->cfg.keys, key, h->cfg.allow_open, &e);
    if (rc == 0 && too_large) rc = api_error_set(&e, 413, NULL, NULL, "request body exceeds %zu bytes", max_body_bytes);
    if (rc == 0) rc = http_lora_parse(body, len, unload, name, path, &e);
    if (rc == 0) {
        pthread_mutex_lock(&h->mu);
        rc = unload ? unload_adapter(h, name, &e) : load_adapter(h, name, path, &e);
        pthread_mutex_unlock(&h->mu);
    }
    if (rc) return http_send_error(h->cfg.metrics, conn, endpoint, &e);
    LOG_INFO("http", "adapter '%s' %s at run time%s%s", name, unload ? "unloaded" : "loaded", unload ? "" : " from ", unload ? "" : path);
    char text[400];
    snprintf(text, sizeof text, "Success: LoRA adapter '%.256s' %s successfully.", name, unload ? "removed" : "added");
    return send_success(conn, text);
}
