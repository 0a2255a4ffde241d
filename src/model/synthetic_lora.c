#include "model/synthetic_lora.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mix64.h"

#define SPEC_PREFIX "synthetic:"
#define B_SCALE 0.02 /* B's range relative to a unit-variance map: small deltas, like a trained adapter's */

bool synthetic_lora_spec(const char *path) { return path && strncmp(path, SPEC_PREFIX, strlen(SPEC_PREFIX)) == 0; }

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* splitmix64: a well-mixed stream from any seed, 0 included (mix64 adds the step itself). */
static uint64_t next_u64(uint64_t *state) {
    uint64_t z = mix64(*state);
    *state += 0x9E3779B97F4A7C15ull;
    return z;
}

static float *random_matrix(size_t n, double range, uint64_t *state) {
    float *m = malloc(n * sizeof *m);
    if (!m) return NULL;
    for (size_t i = 0; i < n; i++) m[i] = (float)(((double)(next_u64(state) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * range);
    return m;
}

/* "RANK[:SEED]" after the prefix; seed defaults to a hash of name. */
static int parse_spec(const char *spec, const char *name, int *rank, uint64_t *seed, BraidError *err) {
    const char *p = spec + strlen(SPEC_PREFIX);
    char *end = NULL;
    errno = 0;
    long r = strtol(p, &end, 10);
    if (end == p || errno || r < 1 || r > LORA_MAX_RANK || (*end != '\0' && *end != ':'))
        return braid_error_set(err, "lora '%s': expected synthetic:RANK[:SEED] with 1 <= RANK <= %d", spec, LORA_MAX_RANK);
    *rank = (int)r;
    *seed = fnv1a(name);
    if (*end == ':') {
        const char *s = end + 1;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || errno || *end != '\0') return braid_error_set(err, "lora '%s': SEED must be a non-negative integer", spec);
        *seed = (uint64_t)v;
    }
    return 0;
}

int synthetic_lora_create(const char *spec, const char *name, const ModelConfig *base, LoraAdapter *out, BraidError *err) {
    memset(out, 0, sizeof *out);
    int rank = 0;
    uint64_t state = 0;
    if (parse_spec(spec, name, &rank, &state, err)) return -1;
    out->n_layers = base->n_layers;
    out->rank = rank;
    out->alpha = (float)rank;
    out->scale = 1.0f;
    out->name = strdup(name);
    out->pairs = calloc((size_t)base->n_layers * LORA_PROJ_COUNT, sizeof *out->pairs);
    if (!out->name || !out->pairs) goto oom;
    for (int l = 0; l < base->n_layers; l++)
        for (int p = 0; p < LORA_PROJ_COUNT; p++) {
            int in, dim_out;
            lora_proj_dims(base, (LoraProj)p, &in, &dim_out);
            LoraPair *pair = &out->pairs[(size_t)l * LORA_PROJ_COUNT + p];
            pair->a = random_matrix((size_t)rank * in, sqrt(3.0 / in), &state);
            pair->b = random_matrix((size_t)dim_out * rank, B_SCALE * sqrt(3.0 / rank), &state);
            if (!pair->a || !pair->b) goto oom;
            out->bytes += ((size_t)rank * in + (size_t)dim_out * rank) * sizeof(float);
        }
    return 0;
oom:
    lora_adapter_free(out);
    return braid_error_set(err, "lora '%s' (%s): out of memory for a rank-%d adapter of %d layers", name, spec, rank, base->n_layers);
}
