/*
 * manifest_heads.h — reading a manifest for a warm start: each line checked against the served
 * model, then chained back into the prompt heads they were cut from.
 *
 * A line is skipped, with its line number and reason logged ([warm-start] tag), when it is not a
 * valid manifest line (manifest_line.h), names a token outside the vocabulary, or is stale: its
 * content_hash is not the hash this model gives its tokens in its tenant's and adapter's namespace
 * (another model, another chunker, edited tokens). A repeated (tenant, adapter, hash) keeps its
 * first line. Chains: a line extends the line its prev_hash names (same tenant and adapter) when it
 * starts where that one ends (position = prev position + prev length); lines that chain back to
 * position 0 form prompt heads, one per chain end (a line no other valid line extends). Lines whose
 * chain does not reach position 0 (their predecessor was skipped, filtered out by --min-count, or
 * never written) are counted as unchained and not warmed. Never fatal: a bad line costs only
 * itself. Pure apart from logging; thread-safe; the result owns its memory.
 */
#ifndef BRAID_COORD_MANIFEST_HEADS_H
#define BRAID_COORD_MANIFEST_HEADS_H

#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

typedef struct {
    int32_t *tokens; /* (n_tokens) the chained chunks' tokens, position 0 on */
    int n_tokens;
    char *tenant, *adapter; /* NULL = none */
    int n_chunks;
} ManifestHead;

typedef struct {
    ManifestHead *heads;
    int n_heads;
    int lines, valid, skipped, duplicates, unchained; /* lines = non-blank lines read */
} ManifestHeads;

/* Reads every line of f (model: vocab_size, model_seed = engine_model_seed). 0, or -1 with err set
 * only when out of memory or f cannot be read. */
int manifest_heads_read(FILE *f, int vocab_size, uint64_t model_seed, ManifestHeads *out, BraidError *err);
void manifest_heads_free(ManifestHeads *h);

#endif
