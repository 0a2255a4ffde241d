/*
 * content_hash.h — content hashes of KV blocks (XXH3-64), the keys that traces, the coordinator's
 * registry and the simulator use to name cached content without token ids.
 *   chained hash of block i  = XXH3(tokens of block i, seed = chained hash of block i-1, or the
 *                              namespace for block 0): identifies the whole prefix through block i.
 *   chunk hash of block i    = XXH3(tokens of block i, seed = namespace): the block's content alone,
 *                              independent of position (for later cross-query reuse).
 * Pure functions, thread-safe.
 */
#ifndef BRAID_CACHE_CONTENT_HASH_H
#define BRAID_CACHE_CONTENT_HASH_H

#include <stdint.h>

/* The seed of a namespace's chains, from its tenant and adapter names (NULL or "" = none). Every
 * producer of content hashes (the cache, the coordinator's router, traces) uses this one mapping so
 * the same names always give the same hashes. A hash, so two namespaces may collide here: the
 * cache's tree is keyed by interned ids instead, and never relies on this for isolation. */
uint64_t content_hash_namespace(const char *tenant, const char *adapter);

/* Fills chained[0..n_blocks) and, when non-NULL, chunk[0..n_blocks) for the first n_blocks full
 * blocks of tokens. */
void content_hash_blocks(uint64_t ns, const int32_t *tokens, int n_blocks, int block_size, uint64_t *chained, uint64_t *chunk);

#endif
