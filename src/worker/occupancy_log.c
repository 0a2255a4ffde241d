/* Pool-occupancy samples as JSONL (contract in occupancy_log.h). */
#include "worker/occupancy_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"

static const char *const tier_names[CACHE_N_TIERS] = {"device", "host"};

OccupancyCounts occupancy_counts(const KvCache *cache, CacheTier tier) {
    return (OccupancyCounts){.total = kv_cache_total(cache, tier), .free = kv_cache_free_blocks(cache, tier),
                             .cached = kv_cache_cached(cache, tier), .in_use = kv_cache_in_use(cache, tier),
                             .pinned = tier == CACHE_TIER_DEVICE ? kv_cache_pinned(cache) : 0};
}

static bool counts_equal(const OccupancyCounts *a, const OccupancyCounts *b) { return memcmp(a, b, sizeof *a) == 0; }

static double epoch_seconds(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

static void stop_logging(OccupancyLog *log, const char *why) {
    LOG_WARN("occupancy", "instance %d: writing %s failed (%s); occupancy logging stops", log->instance, log->path, why);
    close(log->fd);
    log->fd = -1;
}

/* One tier's sample as one line, in one write(). */
static void write_sample(OccupancyLog *log, CacheTier tier, const OccupancyCounts *c, double t) {
    char line[256];
    int n = snprintf(line, sizeof line, "{\"t\": %.3f, \"instance\": %d, \"tier\": \"%s\", \"total\": %d, \"free\": %d, \"cached\": %d, "
                                        "\"in_use\": %d, \"pinned\": %d}\n",
                     t, log->instance, tier_names[tier], c->total, c->free, c->cached, c->in_use, c->pinned);
    if (n <= 0 || n >= (int)sizeof line) return stop_logging(log, "sample too long");
    ssize_t wrote = write(log->fd, line, (size_t)n);
    if (wrote != n) stop_logging(log, wrote < 0 ? strerror(errno) : "short write");
}

/* Writes every tier present whose counts differ from the last written (all of them when forced). */
static void write_changed(OccupancyLog *log, const KvCache *cache, bool force) {
    double t = epoch_seconds();
    for (int tier = 0; tier < CACHE_N_TIERS && log->fd >= 0; tier++) {
        OccupancyCounts c = occupancy_counts(cache, (CacheTier)tier);
        if (c.total == 0 || (!force && counts_equal(&c, &log->last[tier]))) continue;
        write_sample(log, (CacheTier)tier, &c, t);
        log->last[tier] = c;
    }
    log->last_write = braid_now_seconds();
}

int occupancy_log_truncate(const char *path, BraidError *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return braid_error_set(err, "--occupancy-log %s: %s", path, strerror(errno));
    close(fd);
    return 0;
}

int occupancy_log_open(OccupancyLog *log, const char *path, bool truncate, int instance, double interval_s, const KvCache *cache,
                       BraidError *err) {
    memset(log, 0, sizeof *log);
    log->fd = -1;
    log->instance = instance;
    log->interval_s = interval_s > 0 ? interval_s : 1.0;
    if (!(log->path = strdup(path))) return braid_error_set(err, "--occupancy-log: out of memory");
    log->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | (truncate ? O_TRUNC : 0), 0644);
    if (log->fd < 0) {
        braid_error_set(err, "--occupancy-log %s: %s", path, strerror(errno));
        free(log->path);
        log->path = NULL;
        return -1;
    }
    write_changed(log, cache, true);
    return 0;
}

void occupancy_log_sample(OccupancyLog *log, const KvCache *cache) {
    if (log->fd < 0 || braid_now_seconds() - log->last_write < log->interval_s) return;
    write_changed(log, cache, false);
}

void occupancy_log_close(OccupancyLog *log, const KvCache *cache) {
    if (log->fd >= 0) {
        if (cache) write_changed(log, cache, true);
        if (log->fd >= 0) close(log->fd);
    }
    free(log->path);
    memset(log, 0, sizeof *log);
    log->fd = -1;
}
