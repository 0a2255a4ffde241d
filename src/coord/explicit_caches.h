/*
 * explicit_caches.h — the registry of explicit caches (POST /v1/caches; the Gemini cachedContents
 * idea in Braid's terms): named, tenant-owned prompt heads that were prefilled and pinned, and that
 * a chat or completion request names with `cache_id` to start from.
 *
 * Also: a per-tenant prefill bucket (explicit_caches_take_prefill) and, with a state directory,
 * the registry's file (explicit_caches_open_state), both below.
 * Owns: each cache's id, tenant, content (a copy of its OpenAI-style messages array, or its prompt
 * text), token count, TTL and expiry, and the pin outcome its prefill reported. The routes
 * (http_caches.h) prefill and pin through the normal request path; this module only keeps the
 * books and answers lookups. Bounded: at most EXPLICIT_CACHES_PER_TENANT live caches per tenant and
 * EXPLICIT_CACHES_MAX in all (a reservation counts from the moment the prefill starts). Ids that
 * were deleted or expired are remembered (the last EXPLICIT_CACHES_TOMBSTONES of them) so a request
 * naming one gets a 404 that says which, never a silent miss.
 *
 * Tenancy: every lookup names the caller's tenant ("" = no tenant); another tenant's cache is
 * answered exactly like one that does not exist (404), so ids leak nothing.
 *
 * For the dialect parsers: explicit_caches_resolve is the one call that turns a cache_id into its
 * content (the OpenAI chat/completions path uses explicit_caches_apply, built on it; the
 * Anthropic Messages parser may call resolve and prepend the messages itself).
 *
 * Thread-safety: every function but create/destroy may be called from any HTTP thread; one mutex
 * guards the table, held for table work only (never across a prefill). Memory: returned json_t and
 * strings belong to the caller.
 */
#ifndef BRAID_COORD_EXPLICIT_CACHES_H
#define BRAID_COORD_EXPLICIT_CACHES_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "coord/api/api_request.h"

#define EXPLICIT_CACHES_PER_TENANT 16
#define EXPLICIT_CACHES_MAX 1024
#define EXPLICIT_CACHES_TOMBSTONES 256
#define EXPLICIT_CACHE_ID_BYTES 32       /* "cache_" + 16 hex digits, with room to spare */
#define EXPLICIT_CACHE_MAX_TTL_S 86400.0 /* a pin lasts at most 24 h (api_directives.h) */
#define EXPLICIT_CACHE_DEFAULT_TTL_S 3600.0

typedef struct ExplicitCaches ExplicitCaches;

/* One cache as the routes show it (a snapshot; content is the caller's to free). */
typedef struct {
    char id[EXPLICIT_CACHE_ID_BYTES];
    char tenant[API_MAX_LABEL_BYTES + 1];
    json_t *messages;   /* the messages array (chat caches), or NULL */
    char *prompt;       /* the prompt text (completion caches), or NULL */
    bool ready;         /* prefilled (a reservation is not: requests naming it get a 409) */
    int tokens;         /* prompt tokens of the prefill */
    double created_at, expires_at, ttl_s;
    char *pin_outcome;  /* the instance's directive outcome JSON for the pin, or NULL */
} ExplicitCacheInfo;

void explicit_cache_info_free(ExplicitCacheInfo *c);

/* Wall-clock seconds (Unix time): the `now` every call below takes, so created_at / expires_at are dates. */
double explicit_caches_now(void);

ExplicitCaches *explicit_caches_create(void);
void explicit_caches_destroy(ExplicitCaches *r);

/* Prefills per tenant (`braid serve --cache-create-rate R`): each cache creation or TTL change runs a
 * prefill on an instance, so a tenant gets a token bucket refilled at R per second that holds at
 * most EXPLICIT_CACHES_PER_TENANT (its first caches go at once), full at first. R <= 0: no limit (the
 * default of a registry). The table tracks EXPLICIT_CACHES_RATE_TENANTS tenants; a full bucket
 * carries no state, so one is forgotten to make room, and when every tracked bucket is short a new
 * tenant is refused until one refills (bounded memory, never unbounded). */
#define EXPLICIT_CACHES_RATE_TENANTS 256
#define EXPLICIT_CACHES_DEFAULT_CREATE_RATE 1.0
void explicit_caches_set_create_rate(ExplicitCaches *r, double per_s);
/* Persistence (`braid serve --state-dir DIR`): the registry keeps DIR/explicit_caches.json, rewritten
 * after every change (a cache ready, a TTL changed, a cache deleted) by writing a temporary file,
 * fsync and rename, so a crash leaves the old or the new file, never a torn one. Opening loads the
 * file's caches that have not expired (ready, their pin outcome unknown: the K/V is not there until
 * a request computes it again or a PATCH re-pins it). 0, or -1 with why set: a file that cannot be
 * read or parsed (the registry then starts empty and keeps writing the file). */
#define EXPLICIT_CACHES_STATE_FILE "explicit_caches.json"
int explicit_caches_open_state(ExplicitCaches *r, const char *dir, double now, char *why, size_t cap);

/* Takes one prefill of tenant's bucket. 0, or -1 with e set (429, code cache_rate_limited) and
 * *retry_after_s: when the next one is due. */
int explicit_caches_take_prefill(ExplicitCaches *r, const char *tenant, double now, double *retry_after_s, ApiError *e);

/* Reserves an id for a new cache of tenant with this content (messages: borrowed, deep-copied;
 * prompt: copied) and TTL. 0 with id set, or -1 with e set: 429 when the tenant (or the server) is
 * at its bound, 503 out of memory. */
int explicit_caches_reserve(ExplicitCaches *r, const char *tenant, const json_t *messages, const char *prompt, double ttl_s, double now,
                            char id[EXPLICIT_CACHE_ID_BYTES], ApiError *e);
/* The reservation's prefill finished: token count and pin outcome (copied; NULL = none). The TTL
 * counts from now. */
void explicit_caches_commit(ExplicitCaches *r, const char *id, int tokens, const char *pin_outcome, double now);
/* The prefill failed: the reservation goes, without a tombstone. */
void explicit_caches_abandon(ExplicitCaches *r, const char *id);

/* A copy of tenant's cache `id`. 0, or -1 with e set: 404 (never existed for this tenant, deleted,
 * expired: the message says which; param names `param`), 409 (still being prefilled). */
int explicit_caches_get(ExplicitCaches *r, const char *tenant, const char *id, double now, const char *param, ExplicitCacheInfo *out,
                        ApiError *e);
/* The tenant's live caches, oldest first (a JSON array of explicit_cache_json objects). NULL when out of memory. */
json_t *explicit_caches_list(ExplicitCaches *r, const char *tenant, double now);
/* New TTL from now. 0, or -1 with e set as explicit_caches_get. */
int explicit_caches_set_ttl(ExplicitCaches *r, const char *tenant, const char *id, double ttl_s, double now, ApiError *e);
/* Removes the cache (its id is remembered as deleted). 0, or -1 with e set as explicit_caches_get. */
int explicit_caches_delete(ExplicitCaches *r, const char *tenant, const char *id, double now, ApiError *e);

/* The content a request naming cache_id starts from: copies of its messages or prompt. 0, or -1
 * with e set as explicit_caches_get (param "cache_id"). */
int explicit_caches_resolve(ExplicitCaches *r, const char *tenant, const char *cache_id, double now, json_t **messages, char **prompt,
                            ApiError *e);

/* A request parsed from `body` that names a->cache_id (in a->tenant) starts from the cache: a chat
 * request's messages become the cache's followed by its own, a completion's string prompt the
 * cache's prompt followed by its own. Everything else in *a (labels, headers, key, adapter) stays.
 * No cache_id: nothing happens. 0, or -1 with e set: the resolve errors, 400 when the kinds do not
 * match (a messages cache with /v1/completions or the reverse, a token-id or list prompt), or
 * whatever parsing the combined request says. */
int explicit_caches_apply(ExplicitCaches *r, ApiRequest *a, const char *body, size_t len, double now, ApiError *e);

/* The cache's JSON object as the routes answer it. NULL when out of memory. */
json_t *explicit_cache_json(const ExplicitCacheInfo *c);

#endif
