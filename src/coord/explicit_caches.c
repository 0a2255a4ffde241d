/* The explicit-cache registry; the contract is in explicit_caches.h. */
#include "coord/explicit_caches.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    ExplicitCacheInfo info;
    bool used;
    uint64_t seq; /* creation order (times can tie) */
} Slot;

typedef struct {
    char id[EXPLICIT_CACHE_ID_BYTES];
    char tenant[API_MAX_LABEL_BYTES + 1];
    bool expired; /* else deleted */
    double at;
} Tombstone;

typedef struct {
    char tenant[API_MAX_LABEL_BYTES + 1];
    bool used;
    double tokens, at; /* the bucket's level at time `at` */
} Bucket;

struct ExplicitCaches {
    pthread_mutex_t mu;
    char *state_path; /* DIR/explicit_caches.json, or NULL: not persisted */
    double create_rate; /* prefills per second per tenant; <= 0: no limit */
    Bucket buckets[EXPLICIT_CACHES_RATE_TENANTS];
    Slot slots[EXPLICIT_CACHES_MAX];
    Tombstone tombs[EXPLICIT_CACHES_TOMBSTONES];
    int next_tomb;
    uint64_t counter; /* salts ids when the kernel gives no randomness */
    uint64_t next_seq;
};

double explicit_caches_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void explicit_cache_info_free(ExplicitCacheInfo *c) {
    if (!c) return;
    json_decref(c->messages);
    free(c->prompt);
    free(c->pin_outcome);
    memset(c, 0, sizeof *c);
}

ExplicitCaches *explicit_caches_create(void) {
    ExplicitCaches *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_mutex_init(&r->mu, NULL)) return free(r), NULL;
    return r;
}

void explicit_caches_destroy(ExplicitCaches *r) {
    if (!r) return;
    for (int i = 0; i < EXPLICIT_CACHES_MAX; i++)
        if (r->slots[i].used) explicit_cache_info_free(&r->slots[i].info);
    free(r->state_path);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static const char *tenant_or_empty(const char *tenant) { return tenant ? tenant : ""; }

void explicit_caches_set_create_rate(ExplicitCaches *r, double per_s) {
    pthread_mutex_lock(&r->mu);
    r->create_rate = per_s;
    pthread_mutex_unlock(&r->mu);
}

/* The bucket's level now (refilled since it was last touched, capped at the burst). */
static double bucket_level(const ExplicitCaches *r, const Bucket *b, double now) {
    double level = b->tokens + (now > b->at ? now - b->at : 0) * r->create_rate;
    return level < EXPLICIT_CACHES_PER_TENANT ? level : EXPLICIT_CACHES_PER_TENANT;
}

/* tenant's bucket, or a free (or full, hence stateless) one taken for it; NULL when every bucket is
 * tracked and short. */
static Bucket *bucket_of(ExplicitCaches *r, const char *tenant, double now) {
    Bucket *spare = NULL;
    for (int i = 0; i < EXPLICIT_CACHES_RATE_TENANTS; i++) {
        Bucket *b = &r->buckets[i];
        if (b->used && strcmp(b->tenant, tenant) == 0) return b;
        if (!spare && (!b->used || bucket_level(r, b, now) >= EXPLICIT_CACHES_PER_TENANT)) spare = b;
    }
    if (spare) {
        snprintf(spare->tenant, sizeof spare->tenant, "%s", tenant);
        spare->used = true;
        spare->tokens = EXPLICIT_CACHES_PER_TENANT;
        spare->at = now;
    }
    return spare;
}

int explicit_caches_take_prefill(ExplicitCaches *r, const char *tenant, double now, double *retry_after_s, ApiError *e) {
    tenant = tenant_or_empty(tenant);
    *retry_after_s = 0;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->create_rate > 0) {
        Bucket *b = bucket_of(r, tenant, now);
        double level = b ? bucket_level(r, b, now) : 0;
        if (b && level >= 1) {
            b->tokens = level - 1;
            b->at = now;
        } else {
            *retry_after_s = (1 - level) / r->create_rate;
            rc = api_error_set(e, 429, NULL, "cache_rate_limited",
                               "this tenant creates or renews caches faster than the server allows (%.3g per second, --cache-create-rate); retry in %.0f s",
                               r->create_rate, *retry_after_s < 1 ? 1.0 : *retry_after_s + 0.5);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* ---- under the lock ---- */

static void bury(ExplicitCaches *r, Slot *s, bool expired, double at) {
    Tombstone *t = &r->tombs[r->next_tomb];
    r->next_tomb = (r->next_tomb + 1) % EXPLICIT_CACHES_TOMBSTONES;
    snprintf(t->id, sizeof t->id, "%s", s->info.id);
    snprintf(t->tenant, sizeof t->tenant, "%s", s->info.tenant);
    t->expired = expired;
    t->at = at;
    explicit_cache_info_free(&s->info);
    s->used = false;
}

/* Caches past their expiry leave (remembered as expired). */
static void expire(ExplicitCaches *r, double now) {
    for (int i = 0; i < EXPLICIT_CACHES_MAX; i++) {
        Slot *s = &r->slots[i];
        if (s->used && s->info.ready && now >= s->info.expires_at) bury(r, s, true, s->info.expires_at);
    }
}

static Slot *find(ExplicitCaches *r, const char *tenant, const char *id) {
    for (int i = 0; i < EXPLICIT_CACHES_MAX; i++) {
        Slot *s = &r->slots[i];
        if (s->used && strcmp(s->info.id, id) == 0 && strcmp(s->info.tenant, tenant) == 0) return s;
    }
    return NULL;
}

/* The 404 for an id that names no live cache of tenant: deleted, expired or unknown. */
static int not_found(const ExplicitCaches *r, const char *tenant, const char *id, double now, const char *param, ApiError *e) {
    for (int k = 0; k < EXPLICIT_CACHES_TOMBSTONES; k++) {
        const Tombstone *t = &r->tombs[k];
        if (!t->id[0] || strcmp(t->id, id) != 0 || strcmp(t->tenant, tenant) != 0) continue;
        return api_error_set(e, 404, param, "cache_not_found", "cache '%.40s' %s %.0f s ago; create it again with POST /v1/caches", id,
                             t->expired ? "expired" : "was deleted", now > t->at ? now - t->at : 0.0);
    }
    return api_error_set(e, 404, param, "cache_not_found", "no cache '%.64s' in this tenant (see GET /v1/caches)", id);
}

/* find, with the expired and unknown cases answered. */
static Slot *find_live(ExplicitCaches *r, const char *tenant, const char *id, double now, const char *param, ApiError *e) {
    expire(r, now);
    Slot *s = find(r, tenant, id);
    if (!s) not_found(r, tenant, id, now, param, e);
    return s;
}

static int copy_info(const ExplicitCacheInfo *src, ExplicitCacheInfo *dst, ApiError *e) {
    *dst = *src;
    dst->messages = NULL, dst->prompt = NULL, dst->pin_outcome = NULL;
    if ((src->messages && !(dst->messages = json_deep_copy(src->messages))) || (src->prompt && !(dst->prompt = strdup(src->prompt))) ||
        (src->pin_outcome && !(dst->pin_outcome = strdup(src->pin_outcome)))) {
        explicit_cache_info_free(dst);
        return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    }
    return 0;
}

/* ---- persistence (under the lock) ---- */

static Slot *find_any_tenant(ExplicitCaches *r, const char *id);

static json_t *slot_state(const Slot *s) {
    json_t *o = json_pack("{s:s, s:s, s:i, s:f, s:f, s:f, s:I}", "id", s->info.id, "tenant", s->info.tenant, "tokens", s->info.tokens,
                          "created_at", s->info.created_at, "expires_at", s->info.expires_at, "ttl_s", s->info.ttl_s, "seq",
                          (json_int_t)s->seq);
    if (o && s->info.messages && json_object_set(o, "messages", s->info.messages)) json_decref(o), o = NULL;
    if (o && s->info.prompt && json_object_set_new(o, "prompt", json_string(s->info.prompt))) json_decref(o), o = NULL;
    return o;
}

/* Rewrites the state file with every ready cache: temporary file, fsync, rename. Failures are
 * logged by the caller's absence of a file only; the registry in memory stays right. */
static void persist(ExplicitCaches *r) {
    if (!r->state_path) return;
    json_t *list = json_array();
    for (int i = 0; list && i < EXPLICIT_CACHES_MAX; i++) {
        const Slot *s = &r->slots[i];
        if (!s->used || !s->info.ready) continue;
        json_t *o = slot_state(s);
        if (!o || json_array_append_new(list, o)) json_decref(list), list = NULL;
    }
    size_t n = strlen(r->state_path) + 8;
    char *tmp = list ? malloc(n) : NULL;
    if (tmp) snprintf(tmp, n, "%s.tmp", r->state_path);
    FILE *f = tmp ? fopen(tmp, "w") : NULL;
    bool ok = f && json_dumpf(list, f, JSON_COMPACT) == 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, r->state_path) != 0) ok = false;
    if (!ok && tmp) unlink(tmp);
    if (!ok) fprintf(stderr, "[caches] warn: could not write %s; the explicit caches survive no coordinator restart until it can be\n", r->state_path);
    free(tmp);
    json_decref(list);
}

/* One cache of the state file into a free slot; false when it is malformed or expired. */
static bool restore(ExplicitCaches *r, const json_t *o, double now) {
    const char *id = json_string_value(json_object_get(o, "id")), *tenant = json_string_value(json_object_get(o, "tenant"));
    const json_t *messages = json_object_get(o, "messages"), *prompt = json_object_get(o, "prompt");
    double expires = json_number_value(json_object_get(o, "expires_at"));
    if (!id || !tenant || strlen(id) >= EXPLICIT_CACHE_ID_BYTES || strlen(tenant) > API_MAX_LABEL_BYTES || !(expires > now) ||
        (messages ? !json_is_array(messages) || prompt : !json_is_string(prompt)) || find_any_tenant(r, id))
        return false;
    Slot *s = NULL;
    for (int i = 0; i < EXPLICIT_CACHES_MAX && !s; i++)
        if (!r->slots[i].used) s = &r->slots[i];
    if (!s) return false;
    memset(s, 0, sizeof *s);
    snprintf(s->info.id, sizeof s->info.id, "%s", id);
    snprintf(s->info.tenant, sizeof s->info.tenant, "%s", tenant);
    s->info.messages = messages ? json_deep_copy(messages) : NULL;
    s->info.prompt = prompt ? strdup(json_string_value(prompt)) : NULL;
    if (!s->info.messages && !s->info.prompt) return explicit_cache_info_free(&s->info), false;
    s->info.ready = true;
    s->info.tokens = (int)json_integer_value(json_object_get(o, "tokens"));
    s->info.created_at = json_number_value(json_object_get(o, "created_at"));
    s->info.expires_at = expires;
    s->info.ttl_s = json_number_value(json_object_get(o, "ttl_s"));
    json_int_t seq = json_integer_value(json_object_get(o, "seq"));
    s->seq = seq > 0 ? (uint64_t)seq : ++r->next_seq;
    if (s->seq > r->next_seq) r->next_seq = s->seq;
    s->used = true;
    return true;
}

int explicit_caches_open_state(ExplicitCaches *r, const char *dir, double now, char *why, size_t cap) {
    size_t n = strlen(dir) + sizeof EXPLICIT_CACHES_STATE_FILE + 2;
    char *path = malloc(n);
    if (!path) return snprintf(why, cap, "out of memory"), -1;
    snprintf(path, n, "%s/%s", dir, EXPLICIT_CACHES_STATE_FILE);
    pthread_mutex_lock(&r->mu);
    free(r->state_path);
    r->state_path = path;
    int rc = 0, restored = 0;
    json_error_t jerr;
    FILE *f = fopen(path, "r");
    if (!f && errno != ENOENT) rc = -1, snprintf(why, cap, "%s: %s", path, strerror(errno));
    json_t *list = f ? json_loadf(f, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (f && !json_is_array(list)) rc = -1, snprintf(why, cap, "%s: not a JSON array of caches (%s); starting empty", path, list ? "wrong type" : jerr.text);
    if (f) fclose(f);
    for (size_t i = 0; rc == 0 && i < json_array_size(list); i++) restored += restore(r, json_array_get(list, i), now);
    json_decref(list);
    persist(r); /* the directory is writable now, or the warning says so at once */
    pthread_mutex_unlock(&r->mu);
    if (rc == 0) snprintf(why, cap, "%d cache(s) restored from %s", restored, path);
    return rc;
}

/* ---- the operations ---- */

static void new_id(ExplicitCaches *r, char id[EXPLICIT_CACHE_ID_BYTES]) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) v = 0x9e3779b97f4a7c15ull * ++r->counter ^ (uint64_t)(uintptr_t)r;
    snprintf(id, EXPLICIT_CACHE_ID_BYTES, "cache_%016llx", (unsigned long long)v);
}

int explicit_caches_reserve(ExplicitCaches *r, const char *tenant, const json_t *messages, const char *prompt, double ttl_s, double now,
                            char id[EXPLICIT_CACHE_ID_BYTES], ApiError *e) {
    tenant = tenant_or_empty(tenant);
    pthread_mutex_lock(&r->mu);
    expire(r, now);
    int mine = 0, free_slot = -1;
    for (int i = 0; i < EXPLICIT_CACHES_MAX; i++) {
        if (!r->slots[i].used) {
            if (free_slot < 0) free_slot = i;
        } else if (strcmp(r->slots[i].info.tenant, tenant) == 0) mine++;
    }
    int rc = 0;
    if (mine >= EXPLICIT_CACHES_PER_TENANT)
        rc = api_error_set(e, 429, NULL, "cache_limit_reached", "this tenant holds %d caches, the most it may; delete one first (DELETE /v1/caches/{id})",
                           mine);
    else if (free_slot < 0)
        rc = api_error_set(e, 429, NULL, "cache_limit_reached", "the server holds %d caches, the most it may; retry later", EXPLICIT_CACHES_MAX);
    if (rc == 0) {
        Slot *s = &r->slots[free_slot];
        memset(s, 0, sizeof *s);
        do new_id(r, s->info.id); while (find(r, tenant, s->info.id) && s->info.id[0]);
        snprintf(s->info.tenant, sizeof s->info.tenant, "%s", tenant);
        s->info.messages = messages ? json_deep_copy(messages) : NULL;
        s->info.prompt = prompt ? strdup(prompt) : NULL;
        s->info.ttl_s = ttl_s;
        s->info.created_at = now;
        s->seq = ++r->next_seq;
        if ((messages && !s->info.messages) || (prompt && !s->info.prompt)) {
            explicit_cache_info_free(&s->info);
            rc = api_error_set(e, 503, NULL, NULL, "the server is out of memory");
        } else {
            s->used = true;
            snprintf(id, EXPLICIT_CACHE_ID_BYTES, "%s", s->info.id);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static Slot *find_any_tenant(ExplicitCaches *r, const char *id) {
    for (int i = 0; i < EXPLICIT_CACHES_MAX; i++)
        if (r->slots[i].used && strcmp(r->slots[i].info.id, id) == 0) return &r->slots[i];
    return NULL;
}

void explicit_caches_commit(ExplicitCaches *r, const char *id, int tokens, const char *pin_outcome, double now) {
    pthread_mutex_lock(&r->mu);
    Slot *s = find_any_tenant(r, id);
    if (s) {
        s->info.ready = true;
        s->info.tokens = tokens;
        s->info.expires_at = now + s->info.ttl_s;
        free(s->info.pin_outcome);
        s->info.pin_outcome = pin_outcome ? strdup(pin_outcome) : NULL; /* out of memory: the outcome is just not shown */
        persist(r);
    }
    pthread_mutex_unlock(&r->mu);
}

void explicit_caches_abandon(ExplicitCaches *r, const char *id) {
    pthread_mutex_lock(&r->mu);
    Slot *s = find_any_tenant(r, id);
    if (s) explicit_cache_info_free(&s->info), s->used = false;
    pthread_mutex_unlock(&r->mu);
}

int explicit_caches_get(ExplicitCaches *r, const char *tenant, const char *id, double now, const char *param, ExplicitCacheInfo *out,
                        ApiError *e) {
    memset(out, 0, sizeof *out);
    tenant = tenant_or_empty(tenant);
    pthread_mutex_lock(&r->mu);
    Slot *s = find_live(r, tenant, id, now, param, e);
    int rc = s ? copy_info(&s->info, out, e) : -1;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

json_t *explicit_caches_list(ExplicitCaches *r, const char *tenant, double now) {
    tenant = tenant_or_empty(tenant);
    json_t *list = json_array();
    if (!list) return NULL;
    pthread_mutex_lock(&r->mu);
    expire(r, now);
    /* Oldest first: a selection over creation order, at most EXPLICIT_CACHES_PER_TENANT of them. */
    uint64_t after = 0;
    for (int n = 0; n < EXPLICIT_CACHES_PER_TENANT; n++) {
        const Slot *next = NULL;
        for (int i = 0; i < EXPLICIT_CACHES_MAX; i++) {
            const Slot *s = &r->slots[i];
            if (!s->used || strcmp(s->info.tenant, tenant) != 0 || s->seq <= after) continue;
            if (!next || s->seq < next->seq) next = s;
        }
        if (!next) break;
        after = next->seq;
        json_t *o = explicit_cache_json(&next->info);
        if (!o || json_array_append_new(list, o)) {
            json_decref(list);
            list = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return list;
}

int explicit_caches_set_ttl(ExplicitCaches *r, const char *tenant, const char *id, double ttl_s, double now, ApiError *e) {
    tenant = tenant_or_empty(tenant);
    pthread_mutex_lock(&r->mu);
    Slot *s = find_live(r, tenant, id, now, "id", e);
    if (s) {
        s->info.ttl_s = ttl_s;
        if (s->info.ready) s->info.expires_at = now + ttl_s;
        persist(r);
    }
    pthread_mutex_unlock(&r->mu);
    return s ? 0 : -1;
}

int explicit_caches_delete(ExplicitCaches *r, const char *tenant, const char *id, double now, ApiError *e) {
    tenant = tenant_or_empty(tenant);
    pthread_mutex_lock(&r->mu);
    Slot *s = find_live(r, tenant, id, now, "id", e);
    if (s) bury(r, s, false, now), persist(r);
    pthread_mutex_unlock(&r->mu);
    return s ? 0 : -1;
}

int explicit_caches_resolve(ExplicitCaches *r, const char *tenant, const char *cache_id, double now, json_t **messages, char **prompt,
                            ApiError *e) {
    *messages = NULL;
    *prompt = NULL;
    ExplicitCacheInfo c;
    if (explicit_caches_get(r, tenant, cache_id, now, "cache_id", &c, e)) return -1;
    if (!c.ready) {
        explicit_cache_info_free(&c);
        return api_error_set(e, 409, "cache_id", "cache_not_ready", "cache '%.40s' is still being prefilled; retry when POST /v1/caches has answered",
                             cache_id);
    }
    *messages = c.messages, *prompt = c.prompt;
    c.messages = NULL, c.prompt = NULL;
    explicit_cache_info_free(&c);
    return 0;
}

/* body with the cache's content in front of its own, and without cache_id; NULL with e set. */
static char *combined_body(const char *body, size_t len, ApiKind kind, json_t *messages, const char *prompt, const char *id, ApiError *e) {
    json_t *root = json_loadb(body, len, 0, NULL); /* parsed once already: it is a JSON object */
    if (!root) return api_error_set(e, 503, NULL, NULL, "the server is out of memory"), NULL;
    int rc = 0;
    if (kind == API_CHAT) {
        json_t *own = json_object_get(root, "messages");
        if (!messages) rc = api_error_set(e, 400, "cache_id", NULL, "cache '%.40s' holds a prompt, not messages: use it with /v1/completions", id);
        else if (json_array_extend(messages, own) || json_object_set(root, "messages", messages)) rc = -2;
    } else {
        json_t *own = json_object_get(root, "prompt");
        if (!prompt) rc = api_error_set(e, 400, "cache_id", NULL, "cache '%.40s' holds messages, not a prompt: use it with /v1/chat/completions", id);
        else if (!json_is_string(own))
            rc = api_error_set(e, 400, "prompt", NULL, "with cache_id the prompt must be one string (the cache's text goes in front of it)");
        else {
            size_t a = strlen(prompt), b = json_string_length(own);
            char *joined = malloc(a + b + 1);
            if (!joined) rc = -2;
            else {
                memcpy(joined, prompt, a);
                memcpy(joined + a, json_string_value(own), b);
                joined[a + b] = '\0';
                if (json_object_set_new(root, "prompt", json_stringn(joined, a + b))) rc = -2;
                free(joined);
            }
        }
    }
    json_object_del(root, "cache_id");
    char *out = rc == 0 ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (rc == -2 || (rc == 0 && !out)) api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return out;
}

int explicit_caches_apply(ExplicitCaches *r, ApiRequest *a, const char *body, size_t len, double now, ApiError *e) {
    if (!a->cache_id) return 0;
    if (!r) return api_error_set(e, 404, "cache_id", "cache_not_found", "this server keeps no explicit caches");
    json_t *messages;
    char *prompt;
    if (explicit_caches_resolve(r, a->tenant, a->cache_id, now, &messages, &prompt, e)) return -1;
    char *joined = combined_body(body, len, a->kind, messages, prompt, a->cache_id, e);
    json_decref(messages);
    free(prompt);
    if (!joined) return -1;
    ApiRequest b;
    int rc = api_request_parse(joined, strlen(joined), a->kind, NULL, &b, e);
    free(joined);
    if (rc) return -1;
    /* Only the content differs: swap it in, keep everything the headers, key and adapter set. */
    ApiMessage *m = a->messages;
    int n_m = a->n_messages;
    ApiPrompt *p = a->prompts;
    int n_p = a->n_prompts;
    a->messages = b.messages, a->n_messages = b.n_messages, a->prompts = b.prompts, a->n_prompts = b.n_prompts;
    b.messages = m, b.n_messages = n_m, b.prompts = p, b.n_prompts = n_p;
    api_request_free(&b);
    return 0;
}

json_t *explicit_cache_json(const ExplicitCacheInfo *c) {
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:I, s:I, s:f, s:{s:i}}", "id", c->id, "object", "cache", "kind",
                          c->messages ? "messages" : "prompt", "ready", c->ready, "created_at", (json_int_t)c->created_at, "expires_at",
                          (json_int_t)(c->ready ? c->expires_at : c->created_at + c->ttl_s), "ttl_seconds", c->ttl_s, "usage",
                          "total_tokens", c->tokens);
    if (o && c->tenant[0]) json_object_set_new(o, "tenant", json_string(c->tenant));
    json_t *pin = c->pin_outcome ? json_loads(c->pin_outcome, 0, NULL) : NULL;
    if (o && pin) json_object_set_new(o, "pin", pin);
    else json_decref(pin);
    return o;
}
