/*
 * chunker.h — content-defined chunks of a token sequence: the unit of segment reuse (cross-query
 * KV reuse at shifted positions, paper 003 § 3.1; chunking conventions of paper 004).
 *
 * Boundaries, scanning left to right:
 *   - before every anchor token (the chat template's control tokens: turn starts and ends, tool
 *     output delimiters), so a message always starts a chunk whatever precedes it;
 *   - inside long stretches, after a token where a rolling hash of the last few tokens has its low
 *     bits all zero, once the chunk has min_tokens; forced at max_tokens.
 * A boundary depends only on the tokens near it and the distance to the previous boundary, and
 * anchors reset that distance, so the same message content chunks the same way at any offset.
 * Each chunk carries a position-independent hash: XXH3 of its tokens seeded by the namespace
 * (model, tenant, adapter: see content_hash.h), so a chunk never matches across namespaces.
 * Pure functions over caller memory; a config is read-only after chunker_config_init.
 */
#ifndef BRAID_CACHE_CHUNKER_H
#define BRAID_CACHE_CHUNKER_H

#include <stdint.h>

#include "common/error.h"

#define CHUNKER_MIN_TOKENS 8
#define CHUNKER_MAX_TOKENS 256
#define CHUNKER_HASH_MASK 15u /* ~16 tokens past the minimum between content boundaries */

typedef struct {
    int32_t *anchors; /* sorted, distinct (owned) */
    int n_anchors;
    int min_tokens, max_tokens;
    uint32_t mask;
} ChunkerConfig;

typedef struct {
    int start, len;
    uint64_t hash; /* position-independent: the tokens and the namespace only */
} Chunk;

/* Copies and sorts the anchors (may be none); min/max/mask 0 take the defaults above. */
int chunker_config_init(ChunkerConfig *cfg, const int32_t *anchors, int n_anchors, int min_tokens, int max_tokens, uint32_t mask,
                        BraidError *err);
void chunker_config_free(ChunkerConfig *cfg);

/* Splits tokens[0..n) into chunks (*out grown as needed, *cap its capacity). Returns the number of
 * chunks (covering [0, n) in order), or -1 when out of memory. */
int chunker_split(const ChunkerConfig *cfg, uint64_t ns, const int32_t *tokens, int n, Chunk **out, int *cap, BraidError *err);

/* The hash of a chunk's tokens as chunker_split computes it. */
uint64_t chunker_hash(uint64_t ns, const int32_t *tokens, int n);

#endif
