/*
 * manifest_recorder.h — the coordinator's record of hot chunks, for manifests (paper 004, App. S).
 *
 * The coordinator tokenizes every prompt; the recorder cuts it into the segment index's chunks
 * (chunker.h: the same anchors, the same namespace-and-model seed, so the hashes are the ones an
 * instance's segment index uses) and counts each (tenant, adapter, chunk hash) it sees. The table
 * has a fixed capacity: when full, a new chunk replaces the least-counted entry (the oldest of
 * those), so memory stays bounded (capacity x at most CHUNKER_MAX_TOKENS ids). Each entry keeps
 * the tokens, and where the chunk sat when first seen (position, previous chunk's hash) so a warm
 * start can re-assemble prompt heads.
 * With an output path, each chunk is appended to that file when first seen (one complete line per
 * write, flushed), so the file is a valid manifest even after an abrupt stop; its counts are 1
 * (the count when written). A write error is logged once and recording to the file stops; requests
 * never fail because of the recorder.
 * Thread-safety: every function may be called from any thread (one mutex inside).
 */
#ifndef BRAID_COORD_MANIFEST_RECORDER_H
#define BRAID_COORD_MANIFEST_RECORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define MANIFEST_RECORDER_DEFAULT_CAPACITY 16384

typedef struct ManifestRecorder ManifestRecorder;

typedef struct {
    int capacity;            /* chunks kept; <= 0: MANIFEST_RECORDER_DEFAULT_CAPACITY */
    const int32_t *anchors;  /* the tokenizer's control tokens (chunk cuts), copied */
    int n_anchors;
    uint64_t model_seed;     /* engine_model_seed of the served model */
    const char *out_path;    /* append new chunks here as they are first seen; NULL = none */
} ManifestRecorderConfig;

/* NULL with err set when out of memory or the output file cannot be opened. */
ManifestRecorder *manifest_recorder_create(const ManifestRecorderConfig *cfg, BraidError *err);
void manifest_recorder_destroy(ManifestRecorder *r);

/* Counts the chunks of one prompt in its namespace (tenant, adapter: NULL or "" = none). -1 only
 * when out of memory (nothing half-counted matters: counts are advisory). */
int manifest_recorder_observe(ManifestRecorder *r, const char *tenant, const char *adapter, const int32_t *tokens, int n);

/* The entries with count >= min_count, most counted first (ties: first seen first), as JSONL text
 * (malloc'd, "" when none; NULL when out of memory). only_tenant: restrict to that tenant's lines
 * (NULL = every tenant; "" = the requests that named none). */
char *manifest_recorder_export(ManifestRecorder *r, long long min_count, const char *only_tenant);

typedef struct {
    int entries, capacity;
    long long evicted;        /* entries replaced because the table was full */
    long long lines_written;  /* lines appended to the output file */
} ManifestRecorderStats;
ManifestRecorderStats manifest_recorder_stats(ManifestRecorder *r);

#endif
