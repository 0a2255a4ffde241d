#include "cache/content_hash.h"

#include <xxhash.h>

static uint32_t label_hash(const char *s) {
    if (!s || !*s) return 0;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

uint64_t content_hash_namespace(const char *tenant, const char *adapter) {
    return ((uint64_t)label_hash(tenant) << 32) | label_hash(adapter);
}

void content_hash_blocks(uint64_t ns, const int32_t *tokens, int n_blocks, int block_size, uint64_t *chained, uint64_t *chunk) {
    uint64_t seed = ns;
    for (int b = 0; b < n_blocks; b++) {
        const int32_t *block = tokens + (size_t)b * block_size;
        size_t bytes = (size_t)block_size * sizeof *block;
        seed = chained[b] = XXH3_64bits_withSeed(block, bytes, seed);
        if (chunk) chunk[b] = XXH3_64bits_withSeed(block, bytes, ns);
    }
}
