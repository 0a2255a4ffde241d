/*
 * manifest_heads.h — reading a manifest for a warm start: each line checked against the served
 * model, then chained back into the prompt heads they were cut from.
 *
 * A line is skipped when it is not a valid manifest line (manifest_line.h), names a token outside
 * the vocabulary, is stale (its content_hash is not the hash this model gives its tokens in its
 * tenant's and adapter's namespace: another model, another chunker, edited tokens), or, with a
 * tenant filter, belongs to a tenant the filter refuses (one no API key runs in). Skipped lines are
 * counted by reason, with the first line of each reason and why; one summary line goes to the log
 * ([warm-start] tag), never one line per skipped line (a manifest of 10^5 stale lines logs one). A repeated (tenant, adapter, hash) keeps its
 * first line. Chains: a line extends the line its prev_hash names (same tenant and adapter) when it
 * starts where that one ends (position = prev position + prev length); lines that chain back to
 * position 0 form prompt heads, one per chain end (a line no other valid line extends). Lines whose
 * chain does not reach position 0 (their predecessor was skipped, filtered out by --min-count, or
 * never written) are counted as unchained and not warmed. Never fatal: a bad line costs only
 * itself. Pure apart from logging; thread-safe; the result owns its memory.
 */
#ifndef BRAID_COORD_MANIFEST_HEADS_H
#define BRAID_COORD_MANIFEST_HEADS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

typedef struct {
    int32_t *tokens; /* (n_tokens) the chained chunks' tokens, position 0 on */
    int n_tokens;
    char *tenant, *adapter; /* NULL = none */
    int n_chunks;
    long long count; /* its last chunk's count: how often the head was seen */
} ManifestHead;

typedef enum { MANIFEST_SKIP_INVALID, MANIFEST_SKIP_VOCAB, MANIFEST_SKIP_STALE, MANIFEST_SKIP_TENANT, MANIFEST_SKIP_REASONS } ManifestSkipReason;

typedef struct {
    int count;
    int first_line;  /* line number of the first one (1-based) */
    char first_why[160];
} ManifestSkips;

/* Which tenants' lines may be warmed (NULL: all). allows(ctx, tenant) with tenant NULL for a line
 * without one. */
typedef struct {
    bool (*allows)(void *ctx, const char *tenant);
    void *ctx;
} ManifestTenantFilter;

typedef struct {
    ManifestHead *heads;
    int n_heads;
    int lines, valid, skipped, duplicates, unchained; /* lines = non-blank lines read */
    ManifestSkips skips[MANIFEST_SKIP_REASONS];     /* skipped, by reason */
} ManifestHeads;

/* Reads every line of f (model: vocab_size, model_seed = engine_model_seed). 0, or -1 with err set
 * only when out of memory or f cannot be read. */
int manifest_heads_read(FILE *f, int vocab_size, uint64_t model_seed, ManifestHeads *out, BraidError *err);
/* The same, with the lines of tenants the filter refuses skipped (filter NULL: none). */
int manifest_heads_read_filtered(FILE *f, int vocab_size, uint64_t model_seed, const ManifestTenantFilter *filter, ManifestHeads *out,
                                 BraidError *err);
/* "12 stale (first: line 3, ...); 1 invalid (first: line 9, ...)" into buf: the skipped lines by
 * reason; "" when none was skipped. */
void manifest_heads_skip_summary(const ManifestHeads *h, char *buf, size_t cap);
void manifest_heads_free(ManifestHeads *h);

#endif
