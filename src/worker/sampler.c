#include "worker/sampler.h"

#include <math.h>
#include <stdlib.h>

SamplingParams sampling_params_default(void) {
    SamplingParams p = {.temperature = 0.0f, .top_p = 1.0f, .top_k = 0, .seed = 0};
    return p;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
static uint64_t rng_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 24 random bits. */
static float rng_uniform(uint64_t s[4]) { return (float)(rng_next(s) >> 40) / 16777216.0f; }

int sampler_init(Sampler *s, int vocab_size, uint64_t seed) {
    s->vocab_size = vocab_size;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->ids = malloc((size_t)vocab_size * sizeof *s->ids);
    s->probs = malloc((size_t)vocab_size * sizeof *s->probs);
    if (!s->ids || !s->probs) {
        sampler_free(s);
        return -1;
    }
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->ids);
    free(s->probs);
    s->ids = NULL;
    s->probs = NULL;
}

int32_t sampler_argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int32_t sampler_argmax_masked(const float *logits, int n, const uint32_t *allow) {
    int32_t best = -1;
    int words = (n + 31) / 32;
    for (int w = 0; w < words; w++)
        for (uint32_t bits = allow[w]; bits; bits &= bits - 1) {
            int32_t t = w * 32 + __builtin_ctz(bits);
            if (t < n && (best < 0 || logits[t] > logits[best])) best = t;
        }
    return best;
}

void sampler_apply_mask(float *logits, int n, const uint32_t *allow) {
    for (int i = 0; i < n; i++)
        if (!(allow[i >> 5] >> (i & 31) & 1u)) logits[i] = -INFINITY;
}

/* Sorts candidates [0, n) by descending probability (insertion into a max-heap order is overkill
 * for the few hundred candidates that survive the filters below). */
static void sort_candidates(int32_t *ids, float *probs, int n) {
    for (int i = 1; i < n; i++) {
        int32_t id = ids[i];
        float p = probs[i];
        int j = i - 1;
        while (j >= 0 && (probs[j] < p || (probs[j] == p && ids[j] > id))) {
            ids[j + 1] = ids[j];
            probs[j + 1] = probs[j];
            j--;
        }
        ids[j + 1] = id;
        probs[j + 1] = p;
    }
}

/* Keeps the k largest logits among [0, n) in the first k entries (quickselect-free: k is small in
 * practice, so a bounded insertion keeps it linear in n). Returns the count kept. */
static int keep_top_k(const float *scaled, int n, int k, int32_t *ids, float *vals) {
    int kept = 0;
    for (int i = 0; i < n; i++) {
        float v = scaled[i];
        if (kept == k && v <= vals[kept - 1]) continue;
        int j = kept < k ? kept++ : k - 1;
        while (j > 0 && vals[j - 1] < v) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = v;
        ids[j] = i;
    }
    return kept;
}

void sampler_logprobs(const float *logits, int n, int32_t token, int n_top, TokenLogprob *out) {
    float max = -INFINITY;
    for (int i = 0; i < n; i++) max = logits[i] > max ? logits[i] : max;
    /* log-sum-exp in double: the sum runs over the whole vocabulary. */
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    float log_z = max + (float)log(sum);
    out->logprob = logits[token] - log_z;
    int k = n_top < 0 ? 0 : n_top > TOKEN_LOGPROB_MAX_TOP ? TOKEN_LOGPROB_MAX_TOP : n_top;
    k = k > n ? n : k;
    float vals[TOKEN_LOGPROB_MAX_TOP];
    out->n_top = k > 0 ? keep_top_k(logits, n, k, out->top_ids, vals) : 0;
    for (int i = 0; i < out->n_top; i++) out->top_logprobs[i] = vals[i] - log_z;
}

int32_t sampler_sample(Sampler *s, const float *logits, const SamplingParams *p) {
    int n = s->vocab_size;
    if (p->temperature <= 0.0f) return sampler_argmax(logits, n);
    float inv_t = 1.0f / p->temperature;
    int count;
    if (p->top_k > 0 && p->top_k < n && p->top_k <= 1024) {
        float *scaled = s->probs; /* reuse: probs gets overwritten by keep_top_k's values below */
        float vals[1024];
        for (int i = 0; i < n; i++) scaled[i] = logits[i] * inv_t;
        count = keep_top_k(scaled, n, p->top_k, s->ids, vals);
        for (int i = 0; i < count; i++) s->probs[i] = vals[i];
    } else {
        count = n;
        for (int i = 0; i < n; i++) {
            s->ids[i] = i;
            s->probs[i] = logits[i] * inv_t;
        }
    }
    float max = -INFINITY, sum = 0.0f;
    for (int i = 0; i < count; i++) max = s->probs[i] > max ? s->probs[i] : max;
    for (int i = 0; i < count; i++) sum += (s->probs[i] = expf(s->probs[i] - max));
    for (int i = 0; i < count; i++) s->probs[i] /= sum;
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        /* Tokens below (1 - top_p) / (count - 1) can never be inside the nucleus; dropping them
         * first keeps the sort small. */
        float cutoff = count > 1 ? (1.0f - p->top_p) / (float)(count - 1) : 0.0f;
        int m = 0;
        for (int i = 0; i < count; i++)
            if (s->probs[i] >= cutoff) {
                s->ids[m] = s->ids[i];
                s->probs[m++] = s->probs[i];
            }
        sort_candidates(s->ids, s->probs, m);
        float cum = 0.0f;
        int last = m - 1;
        for (int i = 0; i < m; i++) {
            cum += s->probs[i];
            if (cum >= p->top_p) {
                last = i;
                break;
            }
        }
        count = last + 1;
        sum = 0.0f;
        for (int i = 0; i < count; i++) sum += s->probs[i];
        for (int i = 0; i < count; i++) s->probs[i] /= sum;
    }
    float r = rng_uniform(s->rng), cdf = 0.0f;
    for (int i = 0; i < count; i++) {
        cdf += s->probs[i];
        if (r < cdf) return s->ids[i];
    }
    return s->ids[count - 1];
}
