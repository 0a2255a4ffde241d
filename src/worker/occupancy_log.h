/*
 * occupancy_log.h — pool-occupancy telemetry (paper 004, App. U): JSONL samples of a KV cache's
 * blocks per tier, for `--occupancy-log FILE` (braid serve: every instance's leader; braid batch).
 *
 *   {"t": 1764063512.031, "instance": 0, "tier": "device", "total": 511, "free": 380, "cached": 96, "in_use": 35}
 *
 * t is wall-clock seconds since the Unix epoch (comparable across ranks and hosts; plots subtract
 * the first). free + cached + in_use = total (the cache's public counters, kv_cache.h). The host
 * tier is sampled when the cache has one. A sample of every tier is written at open, then whenever
 * a tier's counts changed, at most once per interval, and a last one at close, so an idle server
 * writes nothing. Each line goes out in one write() on a descriptor opened O_APPEND, so several
 * instances may share one file (each line names its instance). A write error is logged once and
 * ends logging; serving never fails because of it.
 * pinned: device blocks pinned by cache directives (kv_cache_pinned; a part of cached + in_use; 0 on the host).
 * One log per engine; not thread-safe (the engine's loop calls it).
 */
#ifndef BRAID_WORKER_OCCUPANCY_LOG_H
#define BRAID_WORKER_OCCUPANCY_LOG_H

#include <stdbool.h>

#include "cache/kv_cache.h"
#include "common/error.h"

typedef struct {
    int total, free, cached, in_use, pinned;
} OccupancyCounts;

typedef struct {
    int fd;                 /* -1: logging off (never opened, or a write failed) */
    char *path;
    int instance;
    double interval_s;
    double last_write;      /* braid_now_seconds of the last sample written */
    OccupancyCounts last[CACHE_N_TIERS];
} OccupancyLog;

/* truncate: start the file empty (braid batch; braid serve's rank 0 truncates before the leaders
 * open it). interval_s <= 0 takes 1.0. 0, or -1 with err set when the file cannot be opened. */
int occupancy_log_open(OccupancyLog *log, const char *path, bool truncate, int instance, double interval_s, const KvCache *cache,
                       BraidError *err);
/* After a step: writes the tiers whose counts changed, when the interval has passed. */
void occupancy_log_sample(OccupancyLog *log, const KvCache *cache);
/* Writes a last sample of every tier and closes (safe on a log never opened). */
void occupancy_log_close(OccupancyLog *log, const KvCache *cache);

OccupancyCounts occupancy_counts(const KvCache *cache, CacheTier tier);
/* Empties (or creates) path, so appending writers start from nothing; -1 with err when it cannot. */
int occupancy_log_truncate(const char *path, BraidError *err);

#endif
