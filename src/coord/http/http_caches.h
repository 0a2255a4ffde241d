/*
 * http_caches.h — the explicit-cache endpoints (explicit_caches.h keeps the books):
 *
 *   POST   /v1/caches          {"messages": [...] | "prompt": "...", "ttl": "300s" | "5m" | "1h" | seconds,
 *                               "model"?, "tenant"?}  → the cache (id, token count, expiry, pin outcome)
 *   GET    /v1/caches          → {"object": "list", "data": [the tenant's caches, oldest first]}
 *   GET    /v1/caches/{id}     → the cache
 *   PATCH  /v1/caches/{id}     {"ttl": ...} → the cache with its new expiry (its pin ended and set again
 *                               with the new TTL: directives [unpin, pin], so a shorter TTL shortens it)
 *   DELETE /v1/caches/{id}     → {"id", "object": "cache.deleted", "deleted": true, "unpin": outcome}: the
 *                               id goes at once, then the content's pin is ended (directive [unpin]) on
 *                               the instance the router sends the content to ("unpin_error" when none ran)
 *
 * Creating one prefills its content through the normal request path (max_tokens 1, temperature 0)
 * with a pin directive of its TTL, so its blocks stay on the instance that computed them (within
 * the tenant's pin budget: the pin's outcome is part of the answer) and the router's index sends
 * later requests naming it there. A chat or completion request with "cache_id" starts from its
 * content (explicit_caches_apply). ttl: 1 s to 24 h (the pin's range), default 1 h.
 * Tenancy: with an API key, the key's tenant (X-Braid-Tenant / "tenant" may name a tenant the key
 * shares, 403 otherwise); without keys, X-Braid-Tenant or the body's "tenant", else no tenant.
 * Errors: 400 (body, ttl, content), 403, 404 (unknown / deleted / expired id: the message says
 * which), 405 (method), 409 (still being prefilled), 413 (body too large), 429 (per-tenant bound; or
 * cache_rate_limited with Retry-After: a creation or PATCH past the tenant's prefill bucket,
 * explicit_caches_take_prefill, taken after the bound is checked),
 * and whatever the prefill's request path answers (400 context too long, 503 draining) — always
 * OpenAI-shaped JSON. Runs on the connection's thread (blocking on the prefill); never calls MPI.
 */
#ifndef BRAID_COORD_HTTP_CACHES_H
#define BRAID_COORD_HTTP_CACHES_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "coord/auth.h"
#include "coord/http/http_generate.h"

/* Whether url is /v1/caches or under it (http_api.c's route() hands those here). */
bool http_caches_path(const char *url);

/* key: the authenticated key (NULL without keys); body: NULL when too large. */
enum MHD_Result http_caches(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const char *method, const char *url,
                            const AuthKey *key, const char *body, size_t len, bool too_large, size_t max_body_bytes);

#endif
