/*
 * Leyline manifests and occupancy telemetry (issue 18), on token ids (no model):
 * - a manifest line formats and parses back equal (with and without adapter); every malformed
 *   shape is refused with a reason (not JSON, missing key, wrong type, bad hex, empty tokens,
 *   prev_hash present exactly when position is not 0);
 * - the recorder counts a prompt's chunks per (tenant, adapter): two prompts sharing a system
 *   message give that message's chunks count 2 with their positions and chain, a min_count export
 *   keeps only them, most counted first, and a tenant filter keeps one tenant's lines; its hashes
 *   are the segment index's (chunker_hash seeded by namespace ^ model seed);
 * - the table stays within its capacity (least counted evicted first; a hot chunk survives churn);
 * - --manifest-out: each chunk is on disk, one valid line, as soon as it is first seen;
 * - reading a manifest back: chains re-assemble the exact prompts; a malformed, a stale, an
 *   out-of-vocabulary line are skipped, a repeat counted as duplicate, a line whose predecessor is
 *   missing counted as unchained;
 * - the occupancy log writes a sample per tier at open, only changed counts later (no more often
 *   than the interval), a last sample at close, with free + cached + in_use == total.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/chunker.h"
#include "cache/content_hash.h"
#include "cache/kv_cache.h"
#include "coord/manifest_heads.h"
#include "coord/manifest_line.h"
#include "coord/manifest_recorder.h"
#include "worker/occupancy_log.h"

#define ANCHOR 1
#define SEED 0x5eedull
#define VOCAB 100000

static const int32_t anchors[] = {ANCHOR};

/* A message: the anchor, then n tokens from seed (distinct, never the anchor). */
static int message(int32_t *out, int seed, int n) {
    out[0] = ANCHOR;
    for (int i = 0; i < n; i++) out[1 + i] = 100 + seed * 1000 + i;
    return n + 1;
}

/* A shared system message of 40 tokens, then a question of its own. */
static int prompt(int32_t *out, int question) {
    int n = message(out, 1, 40);
    return n + message(out + n, 10 + question, 12);
}

static ManifestRecorder *recorder(int capacity, const char *out_path) {
    BraidError err;
    ManifestRecorderConfig cfg = {.capacity = capacity, .anchors = anchors, .n_anchors = 1, .model_seed = SEED, .out_path = out_path};
    ManifestRecorder *r = manifest_recorder_create(&cfg, &err);
    if (!r) fail_msg("%s", err.msg);
    return r;
}

/* The export's lines parsed; *n their number. */
static ManifestLine *export_lines(ManifestRecorder *r, long long min_count, const char *tenant, int *n) {
    char *text = manifest_recorder_export(r, min_count, tenant), why[256];
    assert_non_null(text);
    ManifestLine *lines = calloc(1024, sizeof *lines);
    *n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (manifest_line_parse(line, strlen(line), &lines[*n], why, sizeof why)) fail_msg("%s: %s", why, line);
        (*n)++;
    }
    free(text);
    return lines;
}

static void free_lines(ManifestLine *lines, int n) {
    for (int i = 0; i < n; i++) manifest_line_free(&lines[i]);
    free(lines);
}

static void test_line_round_trip(void **state) {
    (void)state;
    int32_t tokens[] = {5, 6, 7};
    ManifestLine l = {.content_hash = 0x0123456789abcdefull, .tokens = tokens, .n_tokens = 3, .count = 7, .tenant = "acme",
                      .adapter = "coder", .position = 40, .prev_hash = 0xfedcba9876543210ull, .has_prev = true};
    char *text = manifest_line_format(&l), why[256];
    assert_non_null(text);
    assert_non_null(strstr(text, "\"content_hash\":\"0123456789abcdef\""));
    assert_non_null(strstr(text, "\"prev_hash\":\"fedcba9876543210\""));
    ManifestLine back;
    assert_int_equal(manifest_line_parse(text, strlen(text), &back, why, sizeof why), 0);
    assert_true(back.content_hash == l.content_hash && back.prev_hash == l.prev_hash && back.has_prev);
    assert_int_equal(back.n_tokens, 3);
    assert_memory_equal(back.tokens, tokens, sizeof tokens);
    assert_int_equal(back.count, 7);
    assert_int_equal(back.position, 40);
    assert_string_equal(back.tenant, "acme");
    assert_string_equal(back.adapter, "coder");
    manifest_line_free(&back);
    free(text);
    /* No tenant, no adapter, position 0: "tenant": "", no adapter key, prev_hash "". */
    ManifestLine root = {.content_hash = 1, .tokens = tokens, .n_tokens = 1, .count = 1};
    text = manifest_line_format(&root);
    assert_non_null(strstr(text, "\"tenant\":\"\""));
    assert_null(strstr(text, "adapter"));
    assert_int_equal(manifest_line_parse(text, strlen(text), &back, why, sizeof why), 0);
    assert_true(back.tenant == NULL && back.adapter == NULL && !back.has_prev && back.position == 0);
    manifest_line_free(&back);
    free(text);
}

static void expect_refused(const char *text, const char *reason) {
    ManifestLine l;
    char why[256] = "";
    assert_int_equal(manifest_line_parse(text, strlen(text), &l, why, sizeof why), -1);
    if (!strstr(why, reason)) fail_msg("'%s' refused with '%s', expected '%s'", text, why, reason);
    assert_null(l.tokens);
}

static void test_line_refusals(void **state) {
    (void)state;
    const char *good_tail = "\"count\": 2, \"tenant\": \"t\", \"position\": 0, \"prev_hash\": \"\"}";
    char text[512];
    expect_refused("{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [1,", "not JSON");
    expect_refused("[1, 2]", "not a JSON object");
    expect_refused("{\"chunk_tokens\": [1], \"count\": 2, \"tenant\": \"t\", \"position\": 0, \"prev_hash\": \"\"}", "missing \"content_hash\"");
    snprintf(text, sizeof text, "{\"content_hash\": \"xyz\", \"chunk_tokens\": [1], %s", good_tail);
    expect_refused(text, "16 hex digits");
    snprintf(text, sizeof text, "{\"content_hash\": 5, \"chunk_tokens\": [1], %s", good_tail);
    expect_refused(text, "must be a string");
    snprintf(text, sizeof text, "{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [], %s", good_tail);
    expect_refused(text, "holds 0 ids");
    snprintf(text, sizeof text, "{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [1, \"a\"], %s", good_tail);
    expect_refused(text, "chunk_tokens\"[1] is not a token id");
    snprintf(text, sizeof text, "{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [-3], %s", good_tail);
    expect_refused(text, "chunk_tokens\"[0] is not a token id");
    expect_refused("{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [1], \"count\": \"2\", \"tenant\": \"t\", \"position\": 0, "
                   "\"prev_hash\": \"\"}",
                   "\"count\" must be a positive integer");
    expect_refused("{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [1], \"count\": 2, \"tenant\": \"t\", \"position\": 5, "
                   "\"prev_hash\": \"\"}",
                   "prev_hash\" must be empty exactly at position 0");
    expect_refused("{\"content_hash\": \"0000000000000001\", \"chunk_tokens\": [1], \"count\": 2, \"tenant\": 3, \"position\": 0, "
                   "\"prev_hash\": \"\"}",
                   "\"tenant\" must be a string");
}

static void test_recorder_counts_and_chains(void **state) {
    (void)state;
    ManifestRecorder *r = recorder(64, NULL);
    int32_t a[128], b[128];
    int na = prompt(a, 1), nb = prompt(b, 2);
    assert_int_equal(manifest_recorder_observe(r, "t", NULL, a, na), 0);
    assert_int_equal(manifest_recorder_observe(r, "t", NULL, b, nb), 0);
    assert_int_equal(manifest_recorder_observe(r, "u", NULL, a, na), 0);
    /* The system message's chunks, as the segment index cuts and hashes them. */
    ChunkerConfig cc;
    BraidError err;
    assert_int_equal(chunker_config_init(&cc, anchors, 1, 0, 0, 0, &err), 0);
    Chunk *chunks = NULL;
    int cap = 0, n_sys = chunker_split(&cc, content_hash_namespace("t", NULL) ^ SEED, a, 41, &chunks, &cap, &err);
    assert_true(n_sys >= 2);
    int n;
    ManifestLine *hot = export_lines(r, 2, "t", &n);
    assert_int_equal(n, n_sys);
    for (int i = 0; i < n; i++) {
        assert_int_equal(hot[i].count, 2);
        assert_string_equal(hot[i].tenant, "t");
        assert_true(hot[i].content_hash == chunks[i].hash);
        assert_true(hot[i].content_hash == manifest_chunk_hash(SEED, "t", NULL, hot[i].tokens, hot[i].n_tokens));
        assert_int_equal(hot[i].position, chunks[i].start);
        assert_int_equal(hot[i].has_prev, i > 0);
        if (i > 0) assert_true(hot[i].prev_hash == hot[i - 1].content_hash);
    }
    free_lines(hot, n);
    /* min_count 1: the questions' chunks too, after the hot ones; every tenant without a filter. */
    ManifestLine *all = export_lines(r, 1, NULL, &n);
    assert_true(n > 2 * n_sys);
    for (int i = 1; i < n; i++) assert_true(all[i - 1].count >= all[i].count);
    int u_lines = 0;
    for (int i = 0; i < n; i++) u_lines += all[i].tenant && strcmp(all[i].tenant, "u") == 0;
    free_lines(all, n);
    ManifestLine *only_u = export_lines(r, 1, "u", &n);
    assert_int_equal(n, u_lines);
    for (int i = 0; i < n; i++) assert_string_equal(only_u[i].tenant, "u");
    free_lines(only_u, n);
    ManifestLine *none = export_lines(r, 1, "nobody", &n);
    assert_int_equal(n, 0);
    free(none);
    free(chunks);
    chunker_config_free(&cc);
    manifest_recorder_destroy(r);
}

static void test_recorder_bounded(void **state) {
    (void)state;
    ManifestRecorder *r = recorder(8, NULL);
    int32_t hot[16], cold[16];
    int n_hot = message(hot, 7, 6);
    for (int round = 0; round < 200; round++) {
        assert_int_equal(manifest_recorder_observe(r, "t", NULL, hot, n_hot), 0);
        int n_cold = message(cold, 20 + round, 6);
        assert_int_equal(manifest_recorder_observe(r, "t", NULL, cold, n_cold), 0);
        ManifestRecorderStats s = manifest_recorder_stats(r);
        assert_true(s.entries <= 8 && s.capacity == 8);
    }
    ManifestRecorderStats s = manifest_recorder_stats(r);
    assert_int_equal(s.entries, 8);
    assert_true(s.evicted >= 200 - 8);
    int n;
    ManifestLine *top = export_lines(r, 1, NULL, &n);
    assert_int_equal(n, 8);
    assert_int_equal(top[0].count, 200); /* the hot chunk survived 200 rounds of churn */
    assert_memory_equal(top[0].tokens, hot, (size_t)n_hot * sizeof *hot);
    free_lines(top, n);
    manifest_recorder_destroy(r);
}

static int count_file_lines(const char *path) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void test_recorder_out_file(void **state) {
    (void)state;
    char path[] = "/tmp/braid_manifest_out_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ManifestRecorder *r = recorder(64, path);
    int32_t a[128], b[128];
    int na = prompt(a, 1), nb = prompt(b, 2);
    assert_int_equal(manifest_recorder_observe(r, "t", NULL, a, na), 0);
    int after_a = count_file_lines(path); /* on disk before the recorder is closed */
    assert_true(after_a >= 3);
    assert_int_equal(manifest_recorder_observe(r, "t", NULL, a, na), 0);
    assert_int_equal(count_file_lines(path), after_a); /* nothing new */
    assert_int_equal(manifest_recorder_observe(r, "t", NULL, b, nb), 0);
    int after_b = count_file_lines(path);
    assert_true(after_b > after_a);
    assert_int_equal(manifest_recorder_stats(r).lines_written, after_b);
    FILE *f = fopen(path, "r");
    ManifestHeads heads;
    BraidError err;
    assert_int_equal(manifest_heads_read(f, VOCAB, SEED, &heads, &err), 0);
    fclose(f);
    assert_int_equal(heads.skipped, 0);
    assert_int_equal(heads.valid, after_b);
    manifest_heads_free(&heads);
    manifest_recorder_destroy(r);
    unlink(path);
}

/* Writes text to a temporary file and reads it back as a manifest. */
static void read_heads(const char *text, int vocab, ManifestHeads *heads) {
    FILE *f = tmpfile();
    assert_non_null(f);
    fputs(text, f);
    rewind(f);
    BraidError err;
    if (manifest_heads_read(f, vocab, SEED, heads, &err)) fail_msg("%s", err.msg);
    fclose(f);
}

static const ManifestHead *head_of(const ManifestHeads *h, const int32_t *tokens, int n) {
    for (int i = 0; i < h->n_heads; i++)
        if (h->heads[i].n_tokens == n && memcmp(h->heads[i].tokens, tokens, (size_t)n * sizeof *tokens) == 0) return &h->heads[i];
    return NULL;
}

/* One line for tokens at a position, hashed for this model (prev: the previous chunk's hash or 0). */
static char *line_for(const int32_t *tokens, int n, int position, uint64_t prev, uint64_t *hash) {
    *hash = manifest_chunk_hash(SEED, "t", NULL, tokens, n);
    ManifestLine l = {.content_hash = *hash, .tokens = (int32_t *)tokens, .n_tokens = n, .count = 1, .tenant = "t", .position = position,
                      .prev_hash = prev, .has_prev = position > 0};
    return manifest_line_format(&l);
}

static void test_heads(void **state) {
    (void)state;
    ManifestRecorder *r = recorder(64, NULL);
    int32_t a[128], b[128];
    int na = prompt(a, 1), nb = prompt(b, 2);
    manifest_recorder_observe(r, "t", NULL, a, na);
    manifest_recorder_observe(r, "t", NULL, b, nb);
    char *text = manifest_recorder_export(r, 1, NULL);
    size_t len = strlen(text);
    /* A repeat of the first line, a malformed line, a stale one (a token changed), one out of the
     * vocabulary (hashed right), and one whose predecessor is in no line. */
    char *first = strndup(text, strcspn(text, "\n") + 1);
    int32_t big[] = {VOCAB + 5, 3}, orphan[] = {77, 78, 79}, edited[] = {101, 102};
    uint64_t h, stale_hash;
    char *out_of_vocab = line_for(big, 2, 0, 0, &h), *orphan_line = line_for(orphan, 3, 90, 0x1234, &h);
    char *stale = line_for(edited, 2, 0, 0, &stale_hash);
    stale[strstr(stale, "101") - stale + 2] = '9'; /* 101 -> 109: the hash no longer matches */
    size_t cap = len + 4096;
    char *manifest = malloc(cap);
    snprintf(manifest, cap, "%s%s\n{\"content_hash\": \"00\n%s\n%s\n\n%s\n", text, first, stale, out_of_vocab, orphan_line);
    ManifestHeads heads;
    read_heads(manifest, VOCAB, &heads);
    assert_int_equal(heads.skipped, 3);
    assert_int_equal(heads.duplicates, 1);
    assert_int_equal(heads.unchained, 1);
    assert_int_equal(heads.n_heads, 2);
    const ManifestHead *ha = head_of(&heads, a, na), *hb = head_of(&heads, b, nb);
    assert_non_null(ha);
    assert_non_null(hb);
    assert_string_equal(ha->tenant, "t");
    assert_null(ha->adapter);
    assert_true(ha->n_chunks >= 3);
    manifest_heads_free(&heads);
    /* An empty manifest and blank lines are fine: nothing to warm. */
    read_heads("\n \n", VOCAB, &heads);
    assert_int_equal(heads.n_heads + heads.lines + heads.skipped, 0);
    manifest_heads_free(&heads);
    free(text);
    free(first);
    free(out_of_vocab);
    free(orphan_line);
    free(stale);
    free(manifest);
    manifest_recorder_destroy(r);
}

/* The log's lines, each checked: free + cached + in_use == total. */
static int read_samples(const char *path, json_t **rows, int cap) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        assert_true(n < cap);
        json_error_t jerr;
        rows[n] = json_loads(line, 0, &jerr);
        assert_non_null(rows[n]);
        json_int_t total = json_integer_value(json_object_get(rows[n], "total"));
        assert_int_equal(json_integer_value(json_object_get(rows[n], "free")) + json_integer_value(json_object_get(rows[n], "cached")) +
                             json_integer_value(json_object_get(rows[n], "in_use")),
                         total);
        assert_true(json_real_value(json_object_get(rows[n], "t")) > 1.6e9);
        n++;
    }
    fclose(f);
    return n;
}

static void test_occupancy_log(void **state) {
    (void)state;
    KvCache c;
    BraidError err;
    KvCacheConfig cfg = {.block_size = 4, .device_blocks = 16, .host_blocks = 8};
    assert_int_equal(kv_cache_init(&c, &cfg, &err), 0);
    char path[] = "/tmp/braid_occupancy_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    OccupancyLog log;
    assert_int_equal(occupancy_log_open(&log, path, true, 3, 0.001, &c, &err), 0);
    occupancy_log_sample(&log, &c); /* nothing changed: nothing written */
    int32_t blocks[5];
    assert_int_equal(kv_cache_reserve(&c, 5, blocks), 0);
    usleep(2000);
    occupancy_log_sample(&log, &c); /* the device tier changed: one line */
    occupancy_log_close(&log, &c);  /* a last sample of both tiers */
    json_t *rows[16];
    int n = read_samples(path, rows, 16);
    assert_int_equal(n, 5);
    const char *tiers[] = {"device", "host", "device", "device", "host"};
    int in_use[] = {0, 0, 5, 5, 0};
    for (int i = 0; i < n; i++) {
        assert_string_equal(json_string_value(json_object_get(rows[i], "tier")), tiers[i]);
        assert_int_equal(json_integer_value(json_object_get(rows[i], "in_use")), in_use[i]);
        assert_int_equal(json_integer_value(json_object_get(rows[i], "instance")), 3);
        json_decref(rows[i]);
    }
    /* A long interval holds back a changed sample. */
    assert_int_equal(occupancy_log_open(&log, path, true, 0, 3600, &c, &err), 0);
    kv_cache_release(&c, NULL, blocks, 5);
    occupancy_log_sample(&log, &c);
    occupancy_log_close(&log, NULL);
    n = read_samples(path, rows, 16);
    assert_int_equal(n, 2); /* the opening samples only */
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    /* An unwritable path is an error naming it. */
    assert_int_equal(occupancy_log_open(&log, "/nonexistent-dir/occ.jsonl", true, 0, 1, &c, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/occ.jsonl"));
    kv_cache_free(&c);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_round_trip),     cmocka_unit_test(test_line_refusals), cmocka_unit_test(test_recorder_counts_and_chains),
        cmocka_unit_test(test_recorder_bounded),    cmocka_unit_test(test_recorder_out_file), cmocka_unit_test(test_heads),
        cmocka_unit_test(test_occupancy_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
