#include "cache/chunker.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/grow.h"

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int chunker_config_init(ChunkerConfig *cfg, const int32_t *anchors, int n_anchors, int min_tokens, int max_tokens, uint32_t mask,
                        BraidError *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->min_tokens = min_tokens > 0 ? min_tokens : CHUNKER_MIN_TOKENS;
    cfg->max_tokens = max_tokens > 0 ? max_tokens : CHUNKER_MAX_TOKENS;
    cfg->mask = mask ? mask : CHUNKER_HASH_MASK;
    if (cfg->max_tokens < cfg->min_tokens)
        return braid_error_set(err, "chunker: max_tokens %d below min_tokens %d", cfg->max_tokens, cfg->min_tokens);
    if (n_anchors <= 0) return 0;
    cfg->anchors = malloc((size_t)n_anchors * sizeof *cfg->anchors);
    if (!cfg->anchors) return braid_error_set(err, "chunker: out of memory for %d anchor tokens", n_anchors);
    memcpy(cfg->anchors, anchors, (size_t)n_anchors * sizeof *anchors);
    qsort(cfg->anchors, (size_t)n_anchors, sizeof *cfg->anchors, cmp_i32);
    int k = 0;
    for (int i = 0; i < n_anchors; i++)
        if (k == 0 || cfg->anchors[k - 1] != cfg->anchors[i]) cfg->anchors[k++] = cfg->anchors[i];
    cfg->n_anchors = k;
    return 0;
}

void chunker_config_free(ChunkerConfig *cfg) {
    free(cfg->anchors);
    memset(cfg, 0, sizeof *cfg);
}

static bool is_anchor(const ChunkerConfig *cfg, int32_t token) {
    return cfg->n_anchors > 0 && bsearch(&token, cfg->anchors, (size_t)cfg->n_anchors, sizeof token, cmp_i32) != NULL;
}

/* A fixed pseudo-random 64-bit value per token id (splitmix64's finalizer). */
static uint64_t gear(int32_t token) {
    uint64_t z = (uint64_t)(uint32_t)token + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t chunker_hash(uint64_t ns, const int32_t *tokens, int n) {
    return XXH3_64bits_withSeed(tokens, (size_t)n * sizeof *tokens, ns);
}

static int push_chunk(Chunk **out, int *cap, int n_chunks, int start, int end, uint64_t ns, const int32_t *tokens) {
    if (braid_grow((void **)out, cap, n_chunks + 1, sizeof **out)) return -1;
    (*out)[n_chunks] = (Chunk){.start = start, .len = end - start, .hash = chunker_hash(ns, tokens + start, end - start)};
    return 0;
}

int chunker_split(const ChunkerConfig *cfg, uint64_t ns, const int32_t *tokens, int n, Chunk **out, int *cap, BraidError *err) {
    int n_chunks = 0, start = 0;
    uint64_t roll = 0;
    for (int i = 0; i < n; i++) {
        if (i > start && is_anchor(cfg, tokens[i])) { /* a turn or delimiter begins: cut before it */
            if (push_chunk(out, cap, n_chunks++, start, i, ns, tokens)) goto oom;
            start = i;
            roll = 0;
        }
        /* Two bits a token: the mask's low bits see only the last three tokens, so a content
         * boundary depends on the text right there and a shifted copy re-synchronizes at once. */
        roll = (roll << 2) + gear(tokens[i]);
        int len = i + 1 - start;
        bool content_cut = len >= cfg->min_tokens && (roll & cfg->mask) == 0;
        if ((content_cut || len >= cfg->max_tokens) && i + 1 < n) {
            if (push_chunk(out, cap, n_chunks++, start, i + 1, ns, tokens)) goto oom;
            start = i + 1;
        }
    }
    if (n > start && push_chunk(out, cap, n_chunks++, start, n, ns, tokens)) goto oom;
    return n_chunks;
oom:
    braid_error_set(err, "chunker: out of memory splitting %d tokens", n);
    return -1;
}
