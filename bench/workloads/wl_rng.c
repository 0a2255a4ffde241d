/* splitmix64 (Steele, Lea, Flood) and the draws the workloads need on top of it. */
#include "wl_rng.h"

#include <math.h>

static uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* FNV-1a: stable across platforms, enough to spread names over the seed space. */
static uint64_t hash_text(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

WlRng wl_rng_stream(uint64_t seed, uint64_t stream) {
    /* Mixing both halves keeps streams of neighbouring seeds and indices uncorrelated. */
    WlRng r = {splitmix64_mix(seed + 0x9e3779b97f4a7c15ULL) ^ splitmix64_mix(~stream * 0xd1b54a32d192ed03ULL)};
    return r;
}

WlRng wl_rng_named(const char *name) {
    WlRng r = {splitmix64_mix(hash_text(name, 0xcbf29ce484222325ULL))};
    return r;
}

WlRng wl_rng_named2(const char *a, const char *b) {
    uint64_t h = hash_text(a, 0xcbf29ce484222325ULL);
    h = hash_text("\x1f", h); /* a separator, so ("ab","c") and ("a","bc") differ */
    WlRng r = {splitmix64_mix(hash_text(b, h))};
    return r;
}

uint64_t wl_rng_next(WlRng *r) {
    r->state += 0x9e3779b97f4a7c15ULL;
    return splitmix64_mix(r->state);
}

double wl_rng_uniform(WlRng *r) { return (double)(wl_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

int wl_rng_range(WlRng *r, int lo, int hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)((int64_t)hi - lo) + 1;
    return lo + (int)(wl_rng_next(r) % span);
}

int wl_rng_chance(WlRng *r, double p) { return wl_rng_uniform(r) < p; }

int wl_rng_zipf(WlRng *r, int n, double s) {
    if (n <= 1) return 0;
    double total = 0;
    for (int i = 0; i < n; i++) total += 1.0 / pow(i + 1, s);
    double x = wl_rng_uniform(r) * total;
    for (int i = 0; i < n; i++) {
        x -= 1.0 / pow(i + 1, s);
        if (x < 0) return i;
    }
    return n - 1;
}

int wl_rng_weighted(WlRng *r, const double *weights, int n) {
    double total = 0;
    for (int i = 0; i < n; i++) total += weights[i];
    double x = wl_rng_uniform(r) * total;
    for (int i = 0; i < n; i++) {
        x -= weights[i];
        if (x < 0) return i;
    }
    return n - 1;
}

const char *wl_rng_pick(WlRng *r, const char *const *items, int n) { return items[wl_rng_range(r, 0, n - 1)]; }

void wl_rng_shuffle(WlRng *r, int *items, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = wl_rng_range(r, 0, i);
        int t = items[i];
        items[i] = items[j];
        items[j] = t;
    }
}
