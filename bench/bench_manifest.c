/*
 * bench_manifest — what manifests cost the coordinator (issue 18): the recorder's work per prompt
 * (chunk + hash + count, on every submitted request's HTTP thread), exporting a full table, and a
 * warm start's reading of that export back into prompt heads.
 *   build/bench_manifest [--prompts N] [--tokens T] [--capacity C] [--shared F]
 * Prompts are synthetic token ids: a control token (chunk cut) every ~120 tokens, the first
 * F x T tokens drawn from a small set of shared system prompts, the rest unique, so the table
 * fills and evicts as a long-running server's would. Best of 3 runs of each figure.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "coord/manifest_heads.h"
#include "coord/manifest_recorder.h"

#define ANCHOR 1
#define SHARED_PROMPTS 16

static uint64_t next_random(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Prompt i: shared head (one of SHARED_PROMPTS), then unique tokens; a control token every ~120. */
static void make_prompt(int32_t *out, int n, int shared, int i) {
    uint64_t shared_seed = 0x9e3779b97f4a7c15ull * (uint64_t)(1 + i % SHARED_PROMPTS), own_seed = 0xd1b54a32d192ed03ull * (uint64_t)(i + 1);
    for (int k = 0; k < n; k++) {
        uint64_t *s = k < shared ? &shared_seed : &own_seed;
        out[k] = k % 120 == 0 ? ANCHOR : 2 + (int32_t)(next_random(s) % 49000);
    }
}

int main(int argc, char **argv) {
    long prompts = 20000, tokens = 2000, capacity = MANIFEST_RECORDER_DEFAULT_CAPACITY;
    double shared_fraction = 0.5;
    static const struct option opts[] = {{"prompts", required_argument, 0, 'p'}, {"tokens", required_argument, 0, 't'},
                                         {"capacity", required_argument, 0, 'c'}, {"shared", required_argument, 0, 's'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'p') prompts = strtol(optarg, NULL, 10);
        else if (c == 't') tokens = strtol(optarg, NULL, 10);
        else if (c == 'c') capacity = strtol(optarg, NULL, 10);
        else if (c == 's') shared_fraction = strtod(optarg, NULL);
        else return fprintf(stderr, "usage: bench_manifest [--prompts N] [--tokens T] [--capacity C] [--shared F]\n"), 2;
    }
    braid_log_set_level(BRAID_LOG_ERROR);
    int32_t *p = malloc((size_t)tokens * sizeof *p);
    const int32_t anchors[] = {ANCHOR};
    double best_observe = 1e30, best_export = 1e30, best_read = 1e30;
    ManifestRecorderStats stats = {0};
    size_t export_bytes = 0;
    int heads = 0, lines = 0;
    for (int run = 0; run < 3; run++) {
        BraidError err;
        ManifestRecorderConfig cfg = {.capacity = (int)capacity, .anchors = anchors, .n_anchors = 1, .model_seed = 42};
        ManifestRecorder *r = manifest_recorder_create(&cfg, &err);
        if (!r || !p) return fprintf(stderr, "bench_manifest: %s\n", r ? "out of memory" : err.msg), 1;
        double t0 = braid_now_seconds();
        for (long i = 0; i < prompts; i++) {
            make_prompt(p, (int)tokens, (int)(shared_fraction * (double)tokens), (int)i);
            manifest_recorder_observe(r, i % 2 ? "acme" : "globex", NULL, p, (int)tokens);
        }
        double observe = braid_now_seconds() - t0;
        /* the prompt generation is timed too; measure it alone and take it out */
        t0 = braid_now_seconds();
        for (long i = 0; i < prompts; i++) make_prompt(p, (int)tokens, (int)(shared_fraction * (double)tokens), (int)i);
        observe -= braid_now_seconds() - t0;
        t0 = braid_now_seconds();
        char *text = manifest_recorder_export(r, 1, NULL);
        double export_s = braid_now_seconds() - t0;
        FILE *f = fmemopen(text, strlen(text), "r");
        ManifestHeads h;
        t0 = braid_now_seconds();
        /* seed 42 is the recorder's, so every line verifies */
        if (!f || manifest_heads_read(f, 50000, 42, &h, &err)) return fprintf(stderr, "bench_manifest: reading back failed\n"), 1;
        double read_s = braid_now_seconds() - t0;
        fclose(f);
        if (observe < best_observe) best_observe = observe;
        if (export_s < best_export) best_export = export_s;
        if (read_s < best_read) best_read = read_s;
        stats = manifest_recorder_stats(r);
        export_bytes = strlen(text);
        heads = h.n_heads;
        lines = h.lines;
        manifest_heads_free(&h);
        free(text);
        manifest_recorder_destroy(r);
    }
    printf("prompts %ld x %ld tokens (%.0f%% shared heads), capacity %ld\n", prompts, tokens, 100 * shared_fraction, capacity);
    printf("observe: %.1f ns per prompt token, %.1f us per prompt (entries %d, evicted %lld)\n", 1e9 * best_observe / ((double)prompts * tokens),
           1e6 * best_observe / (double)prompts, stats.entries, stats.evicted);
    printf("export of the full table: %.1f ms, %zu bytes (%d lines)\n", 1e3 * best_export, export_bytes, lines);
    printf("warm-start read of that export: %.1f ms -> %d prompt heads\n", 1e3 * best_read, heads);
    free(p);
    return 0;
}
