/*
 * manifest_line.h — one line of a Leyline cache manifest (paper 004, App. S): a hot chunk of some
 * prompt, with what a warm start needs to prefill it again.
 *
 *   {"content_hash": "<16 hex>", "chunk_tokens": [ids...], "count": N, "tenant": "t",
 *    "position": P, "prev_hash": "<16 hex or empty>"[, "adapter": "a"]}
 *
 * content_hash is the chunk's position-independent hash as the segment index computes it
 * (chunker_hash seeded by content_hash_namespace(tenant, adapter) ^ the model seed), so a line
 * written for another model, tenant or adapter, or with edited tokens, does not verify. position is
 * where the chunk sat in the prompt it was first seen in and prev_hash the hash of the chunk before
 * it there ("" at position 0): following prev_hash back to position 0 re-assembles a prompt head.
 * Other keys are ignored (room for later fields such as a pin). Who calls it: the manifest recorder
 * and `braid manifest export` (writing), the warm start (reading). Pure functions; thread-safe.
 */
#ifndef BRAID_COORD_MANIFEST_LINE_H
#define BRAID_COORD_MANIFEST_LINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MANIFEST_MAX_CHUNK_TOKENS 4096 /* a line with more is malformed (chunks are at most 256) */

typedef struct {
    uint64_t content_hash;
    int32_t *tokens; /* (n_tokens), owned */
    int n_tokens;
    long long count;
    char *tenant;    /* owned; NULL = no tenant ("" in the file) */
    char *adapter;   /* owned; NULL = the base model (key absent) */
    int position;
    uint64_t prev_hash;
    bool has_prev;   /* false at position 0: prev_hash is "" */
} ManifestLine;

/* The line's JSON text, without the newline; malloc'd (NULL when out of memory). */
char *manifest_line_format(const ManifestLine *line);

/* Parses one line into *out (owning its copies). 0, or -1 with why (cap bytes) saying what is
 * wrong: not JSON, a missing key, a wrong type, a bad hex hash, an empty or oversized chunk. */
int manifest_line_parse(const char *text, size_t len, ManifestLine *out, char *why, size_t cap);

void manifest_line_free(ManifestLine *line);

/* The content hash the segment index gives these tokens in this namespace. */
uint64_t manifest_chunk_hash(uint64_t model_seed, const char *tenant, const char *adapter, const int32_t *tokens, int n);

#endif
