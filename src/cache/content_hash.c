#include "cache/content_hash.h"

#include <xxhash.h>

void content_hash_blocks(uint64_t ns, const int32_t *tokens, int n_blocks, int block_size, uint64_t *chained, uint64_t *chunk) {
    uint64_t seed = ns;
    for (int b = 0; b < n_blocks; b++) {
        const int32_t *block = tokens + (size_t)b * block_size;
        size_t bytes = (size_t)block_size * sizeof *block;
        seed = chained[b] = XXH3_64bits_withSeed(block, bytes, seed);
        if (chunk) chunk[b] = XXH3_64bits_withSeed(block, bytes, ns);
    }
}
