/* prompt_cache_retention as a pin; the contract is in cache_retention.h. */
#include "coord/cache_retention.h"

#include <stdlib.h>

int cache_retention_add_pin(CacheDirectives *d, int n_prompt, double ttl_s, ApiError *e) {
    if (d->n_hints >= CACHE_DIRECTIVE_MAX)
        return api_error_set(e, 400, "prompt_cache_retention", NULL,
                             "prompt_cache_retention \"24h\" adds a pin, and the request already has %d directives (the most)",
                             CACHE_DIRECTIVE_MAX);
    CacheHint *hints = realloc(d->hints, ((size_t)d->n_hints + 1) * sizeof *hints);
    if (!hints) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    d->hints = hints;
    d->hints[d->n_hints++] = (CacheHint){.op = CACHE_HINT_PIN, .index = API_RETENTION_OUTCOME_INDEX, .start = 0, .end = n_prompt,
                                         .ttl_s = (float)ttl_s};
    return 0;
}
