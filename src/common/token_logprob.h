/*
 * token_logprob.h — one generated token's log-probability and its most likely alternatives.
 *
 * The worker's sampler fills it from the model's logits; the control plane carries it to the
 * coordinator, which renders OpenAI's logprobs objects from it. Values are natural-log
 * probabilities of the raw model distribution (log-softmax of the logits before temperature,
 * top-k or top-p), as vLLM reports them by default. Plain data; no functions.
 */
#ifndef BRAID_COMMON_TOKEN_LOGPROB_H
#define BRAID_COMMON_TOKEN_LOGPROB_H

#include <stdint.h>

#define TOKEN_LOGPROB_MAX_TOP 20 /* OpenAI's top_logprobs limit */

typedef struct {
    float logprob;                            /* of the sampled token */
    int32_t n_top;                            /* 0..TOKEN_LOGPROB_MAX_TOP alternatives, most likely first */
    int32_t top_ids[TOKEN_LOGPROB_MAX_TOP];
    float top_logprobs[TOKEN_LOGPROB_MAX_TOP];
} TokenLogprob;

#endif
