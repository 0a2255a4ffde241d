/*
 * sampler.h — next-token choice from fp32 logits: greedy, or temperature + top-k + top-p, seeded.
 *
 * Order (as in HF transformers): divide logits by the temperature, keep the top_k largest, softmax,
 * keep the smallest set whose probability reaches top_p, draw. temperature <= 0 means greedy
 * (argmax, lowest id on ties). A given seed and logits sequence always give the same tokens.
 * Grammar-constrained sequences mask the logits first (sampler_argmax_masked / sampler_apply_mask below).
 * Owns: candidate buffers sized to the vocabulary. One Sampler per sequence; not thread-safe.
 */
#ifndef BRAID_WORKER_SAMPLER_H
#define BRAID_WORKER_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/token_logprob.h"

typedef struct {
    float temperature; /* <= 0: greedy */
    float top_p;       /* (0, 1]; 1 disables */
    int top_k;         /* <= 0 disables */
    uint64_t seed;
} SamplingParams;

typedef struct {
    uint64_t rng[4];
    int vocab_size;
    int32_t *ids;
    float *probs;
} Sampler;

SamplingParams sampling_params_default(void);
int sampler_init(Sampler *s, int vocab_size, uint64_t seed);
void sampler_free(Sampler *s);
int32_t sampler_sample(Sampler *s, const float *logits, const SamplingParams *params);
int32_t sampler_argmax(const float *logits, int n);
/* Grammar masks (grammar/grammar.h; bit t of allow[t / 32] = token t may come next). Masks are
 * applied before sampling: greedy takes the argmax over allowed tokens only (lowest id on ties;
 * -1 when none is allowed), sampled requests sample from logits whose disallowed entries were set
 * to -inf by sampler_apply_mask (so temperature, top-k and top-p act on the allowed tokens alone).
 * Logprobs (sampler_logprobs) stay those of the raw model: the engine computes them from the
 * unmasked logits. */
int32_t sampler_argmax_masked(const float *logits, int n, const uint32_t *allow);
void sampler_apply_mask(float *logits, int n, const uint32_t *allow);
static inline bool sampler_mask_allows(const uint32_t *allow, int32_t token) {
    return token >= 0 && (allow[token >> 5] >> (token & 31) & 1u);
}
/* The sampled token's log-probability under the raw model distribution (log-softmax of the logits
 * over the whole vocabulary, before temperature / top-k / top-p: what the model predicts, not what
 * the sampler's filters made of it) and the n_top (clamped to [0, TOKEN_LOGPROB_MAX_TOP]) most
 * likely tokens with theirs, most likely first, lowest id first on ties. */
void sampler_logprobs(const float *logits, int n, int32_t token, int n_top, TokenLogprob *out);

#endif
