/*
 * api_directives.h — the `directives` field of a completion request (Leyline cache directives)
 * and the `cache_control` marker of a message or content part, parsed and checked for shape only.
 *
 *   directives: [{"op": "splice", "span": [start, end] | {"match": "<text>", "occurrence": n},
 *                 "replacement": "<text>", "mode": "amortize" | "forget"},
 *                {"op": "pin", "span": …(optional), "ttl": "5m" | "1h" | "90s" | seconds},
 *                {"op": "decay" | "evict" | "unpin", "span": …(optional)},
 *                {"op": "share", "span": …(optional), "with": ["tenant", …] | "all"}]
 * A span in token positions of the prompt as sent (end exclusive), or the occurrence-th (from 1)
 * occurrence of a text in the rendered prompt. Without a span a hint covers the whole prompt. A
 * splice needs a span and a replacement. Unknown keys in a directive, wrong types, an unknown op or
 * mode, a ttl outside 1 s .. 24 h, and more than CACHE_DIRECTIVE_MAX directives are a 400 naming
 * `directives[i].field`. Whether spans fit the prompt is checked later (directive_plan.h).
 * conversation_id: "<label>" names the conversation whose later turns keep matching the K/V an
 * amortized splice left approximate (default: the workflow_id's).
 * cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"} (the Anthropic convention; ttl
 * optional, 5 minutes by default).
 * Thread-safety: none needed (pure). Strings are malloc'd and owned by the directive.
 */
#ifndef BRAID_COORD_API_DIRECTIVES_H
#define BRAID_COORD_API_DIRECTIVES_H

#include <jansson.h>
#include <stdbool.h>

#include "coord/api/api_request.h"

#define API_DIRECTIVE_SPLICE 0 /* else the op is a CacheHintOp */
#define API_DEFAULT_PIN_TTL_S 300.0

typedef struct ApiDirective {
    int op;
    bool has_span;
    int start, end;     /* token span, when has_span */
    char *match;        /* text span (NULL when none) */
    int occurrence;     /* of match, from 1 */
    char *replacement;  /* splice */
    int mode;           /* splice: CacheSpliceMode (amortize or forget) */
    double ttl_s;       /* pin */
    bool share_all;     /* share */
    char **with;
    int n_with;
} ApiDirective;

/* Parses body.directives (absent or null: none). 0, or -1 with err. */
int api_directives_parse(const json_t *value, ApiDirective **out, int *n_out, ApiError *err);
/* Parses a cache_control object; *ttl_s gets its TTL in seconds. param names it in errors. */
int api_cache_control_parse(const json_t *value, const char *param, double *ttl_s, ApiError *err);
/* Parses body.auto_splice: "amortize" | "forget" | "off" (absent or null: -1, the tenant's default
 * applies). *mode gets a CacheSpliceMode (NONE for "off"). The server then plans the splice itself
 * from the conversation's previous prompt (coord/auto_splice.h). 0, or -1 with err (400). */
int api_auto_splice_parse(const json_t *value, int *mode, ApiError *err);
void api_directives_free(ApiDirective *d, int n);

#endif
