/*
 * api_response.h — OpenAI response bodies: complete answers, streaming chunks, usage.
 *
 * Pure formatting with jansson; every function returns a malloc'd compact JSON string the caller
 * frees (NULL when out of memory). `text` must be valid UTF-8 (text_stream.h guarantees it).
 */
#ifndef BRAID_COORD_API_RESPONSE_H
#define BRAID_COORD_API_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "coord/api/api_request.h"

typedef struct {
    ApiKind kind;
    const char *id;      /* "chatcmpl-…" / "cmpl-…" */
    const char *model;
    time_t created;
} ApiResponseHead;

/* usage.prompt_tokens_details: cached_tokens (OpenAI's field) counts every prompt token served from
 * the cache, whichever tier held it; Braid adds cached_tokens_device and cached_tokens_host, which
 * sum to it, cached_tokens_remote: of those, the ones moved in from another instance's cache for this
 * request (KV block moves; they landed on the device, so cached_tokens_device counts them too), and
 * segment_reused_tokens: prompt tokens past the cached prefix whose K/V came from
 * chunks cached elsewhere (segment reuse) instead of prefill. */
typedef struct {
    int prompt_tokens, completion_tokens;
    int cached_tokens;      /* device + host */
    int cached_tokens_host; /* of those, loaded back from the host tier */
    int cached_tokens_remote; /* of those, moved in from another instance */
    int segment_reused_tokens; /* not in cached_tokens: prompt tokens whose K/V came from reused segments */
    const char *directive_outcomes; /* the instance's JSON array, or NULL: becomes the top-level
                                       "directive_outcomes" of the answer / usage chunk */
} ApiUsage;

/* One choice of an answer or chunk. logprobs is a reference the call takes over (NULL: null). */
typedef struct {
    int index;
    const char *text;        /* may be empty; NULL (chat): the message's content is null (only tool calls) */
    size_t len;
    const char *finish_reason; /* NULL = not yet (chunks) */
    json_t *logprobs;
    const json_t *tool_calls;  /* chat: [{id, type, function: {name, arguments}}] (borrowed), NULL = none;
                                  a chunk sends them as deltas with their index */
} ApiChoice;

/* The whole answer with n choices (each choice's logprobs reference is taken over). */
char *api_response_full(const ApiResponseHead *h, const ApiChoice *choices, int n, const ApiUsage *u);
/* One chunk of one choice: role (chat, the choice's first chunk only), text, finish_reason. */
char *api_response_chunk(const ApiResponseHead *h, bool with_role, const ApiChoice *c);
/* The closing usage chunk (stream_options.include_usage): empty choices plus usage. */
char *api_response_usage_chunk(const ApiResponseHead *h, const ApiUsage *u);

#endif
