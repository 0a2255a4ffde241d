/*
 * cache_retention.h — OpenAI's `prompt_cache_retention: "24h"` in Braid's terms: a PIN hint
 * through the whole prompt for that long, added to the request's resolved directives.
 *
 * A pin keeps the prompt's blocks on the device (so at least on the host tier too) until its
 * deadline; it is taken within the tenant's pin budget on the instance (--pin-budget, per tenant per
 * instance), so the budget is the tenant's retention budget: past it the pin is clipped or refused,
 * and the outcome is reported to the client under usage.directive_outcomes with
 * "source": "prompt_cache_retention" (hint index API_RETENTION_OUTCOME_INDEX). "in_memory" (or no
 * field) adds nothing: the cache keeps the prompt while it has room, as it always does.
 * Pure; thread-safe.
 */
#ifndef BRAID_COORD_CACHE_RETENTION_H
#define BRAID_COORD_CACHE_RETENTION_H

#include "cache/cache_directive.h"
#include "coord/api/api_request.h"

/* Adds the pin for a prompt of n_prompt tokens to d (hints grow by one). 0, or -1 with e set: out
 * of memory (503), or the request already carries CACHE_DIRECTIVE_MAX directives (400). d is left
 * valid either way (the caller frees it). */
int cache_retention_add_pin(CacheDirectives *d, int n_prompt, double ttl_s, ApiError *e);

#endif
