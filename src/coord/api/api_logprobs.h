/*
 * api_logprobs.h — OpenAI `logprobs` objects from generated token ids and their TokenLogprobs.
 *
 * Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
 * Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
 * A token's text is its own bytes (tokenizer_token_bytes); `token` strings are those bytes as valid
 * UTF-8 (invalid sequences become U+FFFD), `bytes` the raw byte values, so a character split over
 * two tokens can be put back together. text_offset counts bytes of the completion's text.
 * Rendering is incremental, for streaming: a cursor remembers how many tokens were rendered and the
 * text offset reached; each call renders the next tokens whose text starts before `text_limit` (the
 * text already sent), so a token cut off by a stop string is never reported.
 *
 * Thread-safety: pure; the cursor belongs to one response.
 */
#ifndef BRAID_COORD_API_LOGPROBS_H
#define BRAID_COORD_API_LOGPROBS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/token_logprob.h"
#include "coord/api/api_request.h"
#include "model/tokenizer.h"

typedef struct {
    int done;      /* tokens rendered so far */
    size_t offset; /* text bytes those tokens cover */
} LogprobCursor;

/* The logprobs object for tokens[cur->done, n) whose text starts before text_limit (SIZE_MAX: all),
 * advancing cur. Returns a new reference (an object with empty lists when no token qualifies), or
 * NULL when out of memory. */
json_t *api_logprobs_render(ApiKind kind, const Tokenizer *tok, const int32_t *tokens, const TokenLogprob *logprobs, int n,
                            size_t text_limit, LogprobCursor *cur);

/* Whether render would produce at least one token now (so a stream need not send an empty one). */
bool api_logprobs_pending(int n, size_t text_limit, const LogprobCursor *cur);

#endif
