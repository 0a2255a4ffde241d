/*
 * braid sim with cache directives (sim_directives.h): each directive's effect on a small cache
 * (block size 4), against the same trace replayed with --directives off:
 *   pin     a pinned prompt survives the pressure that evicts it without the pin; unpin and an
 *           expired TTL give it back to the policy;
 *   decay   a decayed prompt is evicted before an older one, under lru and pbkv;
 *   evict   drops the prompt from the span on (the prefix before it still hits);
 *   share   another tenant named copies the shared prefix (a hit); one not named does not;
 *   splice  amortize: the prefix before the edit and the runs after it are hits, the edit's
 *           replacement tokens computed; the next turn of the conversation hits the spliced
 *           prompt; forget: only the prefix before the edit hits, the context's rest is dropped;
 * and the trace parser's errors for malformed directives.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim/simulator.h"
#include "sim/trace.h"

enum { BS = 4 };

typedef struct {
    char path[64];
    FILE *f;
    int seq;
} TraceFile;

static void trace_open(TraceFile *tf) {
    strcpy(tf->path, "/tmp/braid_simdir_XXXXXX");
    int fd = mkstemp(tf->path);
    assert_true(fd >= 0);
    tf->f = fdopen(fd, "w");
    assert_non_null(tf->f);
    tf->seq = 0;
}

/* One request line: tokens[i] given, block hashes (unused in token replay) one per full block. */
static void put_request(TraceFile *tf, double t, const char *id, const char *tenant, const char *workflow, const int32_t *tokens, int n,
                        const char *directives) {
    fprintf(tf->f, "{\"type\":\"request\",\"seq\":%d,\"t\":%g,\"id\":\"%s\",\"tenant\":\"%s\",\"workflow\":\"%s\",\"prompt_tokens\":%d,"
                   "\"output_tokens\":0,\"block_size\":%d,\"blocks\":[",
            tf->seq++, t, id, tenant, workflow, n, BS);
    for (int b = 0; b < n / BS; b++) fprintf(tf->f, "%s\"%016x\"", b ? "," : "", b + 1);
    fprintf(tf->f, "],\"tokens\":[");
    for (int i = 0; i < n; i++) fprintf(tf->f, "%s%d", i ? "," : "", tokens[i]);
    fprintf(tf->f, "]%s%s}\n", directives ? ",\"directives\":" : "", directives ? directives : "");
}

/* Prompt `content` of n tokens: ids no other content shares. */
static void content(int32_t *out, int content_id, int n) {
    for (int i = 0; i < n; i++) out[i] = content_id * 1000 + i + 1;
}

static void put_content(TraceFile *tf, double t, const char *id, const char *tenant, int content_id, const char *directives) {
    int32_t tok[33];
    content(tok, content_id, 33); /* 8 full blocks and one token */
    put_request(tf, t, id, tenant, "", tok, 33, directives);
}

static Trace load(TraceFile *tf) {
    fclose(tf->f);
    Trace t;
    BraidError err;
    if (trace_load(tf->path, &t, &err)) fail_msg("%s", err.msg);
    unlink(tf->path);
    return t;
}

/* Replays t; the per-request cached tokens come back in hits (trace order). */
static SimResult replay(const Trace *t, const char *policy, int kv_tokens, bool directives, int *hits) {
    SimConfig cfg = sim_config_default();
    cfg.kv_tokens = kv_tokens;
    cfg.policy = policy;
    cfg.ignore_directives = !directives;
    cfg.pin_budget_tokens = kv_tokens;
    cfg.timeline = true;
    cfg.check_invariants = true;
    SimResult r;
    BraidError err;
    if (sim_run(t, &cfg, &r, &err)) fail_msg("%s", err.msg);
    for (int i = 0; hits && i < r.n_timeline; i++) hits[i] = r.timeline[i].cached_tokens;
    sim_result_free(&r);
    return r;
}

/* 24 blocks: A, B, C fill it; D evicts the least recently used (A) unless A is pinned. */
static void test_pin_survives_pressure(void **state) {
    (void)state;
    TraceFile tf;
    trace_open(&tf);
    put_content(&tf, 0, "a", "t", 1, "[{\"op\":\"pin\",\"end\":32,\"ttl_s\":100}]");
    put_content(&tf, 1, "b", "t", 2, NULL);
    put_content(&tf, 2, "c", "t", 3, NULL);
    put_content(&tf, 3, "d", "t", 4, NULL);
    put_content(&tf, 4, "a2", "t", 1, NULL);
    Trace t = load(&tf);
    int on[5], off[5];
    SimResult r = replay(&t, "lru", 24 * BS, true, on);
    replay(&t, "lru", 24 * BS, false, off);
    assert_int_equal(on[4], 32);      /* the pinned prompt stayed */
    assert_true(off[4] < 32);         /* the same pressure evicts it without the pin */
    assert_int_equal(r.directives.pins, 1);
    assert_int_equal(r.directives.hints_accepted, 1);
    trace_free(&t);
}

/* The pin ends: by an unpin on the same prefix, or by its TTL passing in trace time. */
static void test_unpin_and_ttl_release_the_pin(void **state) {
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        TraceFile tf;
        trace_open(&tf);
        put_content(&tf, 0, "a", "t", 1, variant == 0 ? "[{\"op\":\"pin\",\"end\":32,\"ttl_s\":100}]" : "[{\"op\":\"pin\",\"end\":32,\"ttl_s\":0.5}]");
        put_content(&tf, 0.5, "a-unpin", "t", 1, variant == 0 ? "[{\"op\":\"unpin\",\"end\":32}]" : NULL);
        put_content(&tf, 1, "b", "t", 2, NULL);
        put_content(&tf, 2, "c", "t", 3, NULL);
        put_content(&tf, 3, "d", "t", 4, NULL);
        put_content(&tf, 4, "a2", "t", 1, NULL);
        Trace t = load(&tf);
        int on[6];
        SimResult r = replay(&t, "lru", 24 * BS, true, on);
        assert_true(on[5] < 32); /* evicted as if never pinned */
        if (variant == 0) assert_int_equal(r.directives.unpinned_blocks, 8);
        else assert_int_equal(r.directives.pin_expired_blocks, 8);
        trace_free(&t);
    }
}

/* A (older) and B (decayed) cached; C needs one block more than is free. */
static void check_decay_goes_first(const char *policy) {
    TraceFile tf;
    trace_open(&tf);
    put_content(&tf, 0, "a", "t", 1, NULL);
    put_content(&tf, 1, "b", "t", 2, "[{\"op\":\"decay\",\"start\":0,\"end\":32}]");
    put_content(&tf, 2, "c", "t", 3, NULL);
    put_content(&tf, 3, "a2", "t", 1, NULL);
    Trace t = load(&tf);
    int on[4], off[4];
    SimResult r = replay(&t, policy, 17 * BS, true, on);
    replay(&t, policy, 17 * BS, false, off);
    fprintf(stderr, "decay %s: a2 hits %d with decay, %d without\n", policy, on[3], off[3]);
    assert_int_equal(on[3], 32); /* the decayed prompt went instead of the older one */
    assert_int_equal(r.directives.decayed_blocks, 8);
    if (!strcmp(policy, "lru")) assert_true(off[3] < 32);
    trace_free(&t);
}

static void test_decay_goes_first_lru(void **state) {
    (void)state;
    check_decay_goes_first("lru");
}

static void test_decay_goes_first_pbkv(void **state) {
    (void)state;
    check_decay_goes_first("pbkv");
}

static void test_evict_drops_from_the_span_on(void **state) {
    (void)state;
    TraceFile tf;
    trace_open(&tf);
    put_content(&tf, 0, "a", "t", 1, "[{\"op\":\"evict\",\"start\":16}]");
    put_content(&tf, 1, "a2", "t", 1, NULL);
    Trace t = load(&tf);
    int on[2], off[2];
    SimResult r = replay(&t, "lru", 64 * BS, true, on);
    replay(&t, "lru", 64 * BS, false, off);
    assert_int_equal(on[1], 16);
    assert_int_equal(off[1], 32);
    assert_int_equal(r.directives.evicted_blocks, 4);
    trace_free(&t);
}

static void test_share_admits_named_tenants(void **state) {
    (void)state;
    TraceFile tf;
    trace_open(&tf);
    put_content(&tf, 0, "x", "t0", 1, "[{\"op\":\"share\",\"end\":32,\"with\":[\"t1\"]}]");
    put_content(&tf, 1, "y", "t1", 1, NULL);
    put_content(&tf, 2, "z", "t2", 1, NULL);
    Trace t = load(&tf);
    int on[3], off[3];
    SimResult r = replay(&t, "lru", 64 * BS, true, on);
    replay(&t, "lru", 64 * BS, false, off);
    assert_int_equal(on[1], 32);  /* copied from t0's shared prefix */
    assert_int_equal(on[2], 0);   /* t2 was not named */
    assert_int_equal(off[1], 0);  /* tenants never see each other's cache unshared */
    assert_int_equal(r.directives.shared_tokens, 32);
    assert_int_equal(r.directives.directive_hit_tokens, 32);
    assert_int_equal(r.cached_tokens, 32);
    trace_free(&t);
}

/* C: 41 tokens. P: C with [8, 12) replaced by 4 new tokens. F: P and 8 more tokens (the next turn). */
static Trace splice_trace(const char *mode) {
    int32_t c[41], p[41], f[49];
    content(c, 1, 41);
    memcpy(p, c, sizeof c);
    for (int i = 8; i < 12; i++) p[i] = 9000 + i;
    memcpy(f, p, sizeof p);
    content(f + 41, 2, 8);
    char d[160];
    snprintf(d, sizeof d, "[{\"op\":\"splice\",\"context\":\"c\",\"start\":8,\"end\":12,\"tokens\":4,\"mode\":\"%s\"}]", mode);
    TraceFile tf;
    trace_open(&tf);
    put_request(&tf, 0, "c", "t", "w", c, 41, NULL);
    put_request(&tf, 1, "p", "t", "w", p, 41, d);
    put_request(&tf, 2, "f", "t", "w", f, 49, NULL);
    return load(&tf);
}

static void test_splice_amortize_hit_accounting(void **state) {
    (void)state;
    Trace t = splice_trace("amortize");
    int on[3], off[3];
    SimResult r = replay(&t, "lru", 64 * BS, true, on);
    SimResult plain = replay(&t, "lru", 64 * BS, false, off);
    /* 8 cached before the edit + [12, 40) copied (the last token is always computed) */
    assert_int_equal(on[1], 8 + 28);
    assert_int_equal(off[1], 8);
    assert_int_equal(r.directives.spliced_tokens, 28);
    assert_int_equal(r.directives.splice_edit_tokens, 4);
    assert_int_equal(plain.computed_tokens - r.computed_tokens, 28); /* the copied runs were not computed */
    /* the next turn of the conversation keeps hitting the spliced prompt (its 10 full blocks) */
    assert_int_equal(on[2], 40);
    assert_int_equal(off[2], 40);
    trace_free(&t);
}

static void test_splice_forget_drops_the_context(void **state) {
    (void)state;
    Trace t = splice_trace("forget");
    int on[3];
    SimResult r = replay(&t, "lru", 64 * BS, true, on);
    assert_int_equal(on[1], 8); /* only the prefix before the edit */
    assert_int_equal(r.directives.forgot_blocks, 8);
    assert_int_equal(r.directives.spliced_tokens, 0);
    trace_free(&t);
}

static void test_parse_errors(void **state) {
    (void)state;
    const char *bad[] = {
        "[{\"op\":\"pin\",\"end\":4}]",                                  /* no ttl */
        "[{\"op\":\"fold\"}]",                                           /* unknown op */
        "[{\"op\":\"share\",\"end\":4}]",                                /* no audience */
        "[{\"op\":\"splice\",\"start\":0,\"end\":4}]",                   /* no context */
        "[{\"op\":\"decay\",\"start\":8,\"end\":4}]",                    /* end before start */
        "[{\"op\":\"splice\",\"context\":\"c\",\"start\":0,\"end\":4,\"mode\":\"x\"}]",
        "{\"op\":\"pin\"}",                                              /* not an array */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char line[512];
        snprintf(line, sizeof line,
                 "{\"type\":\"request\",\"id\":\"r\",\"prompt_tokens\":9,\"output_tokens\":0,\"block_size\":4,\"blocks\":[],\"directives\":%s}",
                 bad[i]);
        TraceRequest r;
        int bs = 0;
        BraidError err;
        assert_int_equal(trace_parse_line(line, &r, &bs, &err), -1);
    }
    /* a splice naming a context no earlier request has fails at replay */
    TraceFile tf;
    trace_open(&tf);
    put_content(&tf, 0, "a", "t", 1, "[{\"op\":\"splice\",\"context\":\"later\",\"start\":0,\"end\":4,\"tokens\":2}]");
    Trace t = load(&tf);
    SimConfig cfg = sim_config_default();
    SimResult res;
    BraidError err;
    assert_int_equal(sim_run(&t, &cfg, &res, &err), -1);
    assert_non_null(strstr(err.msg, "later"));
    sim_result_free(&res);
    trace_free(&t);
    /* a splice whose prompt is not its context edited as it says */
    trace_open(&tf);
    put_content(&tf, 0, "c", "t", 1, NULL);
    put_content(&tf, 1, "p", "t", 2, "[{\"op\":\"splice\",\"context\":\"c\",\"start\":8,\"end\":12,\"tokens\":4}]");
    t = load(&tf);
    assert_int_equal(sim_run(&t, &cfg, &res, &err), -1);
    assert_non_null(strstr(err.msg, "unchanged"));
    sim_result_free(&res);
    trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_survives_pressure),       cmocka_unit_test(test_unpin_and_ttl_release_the_pin),
        cmocka_unit_test(test_decay_goes_first_lru),        cmocka_unit_test(test_decay_goes_first_pbkv),
        cmocka_unit_test(test_evict_drops_from_the_span_on), cmocka_unit_test(test_share_admits_named_tenants),
        cmocka_unit_test(test_splice_amortize_hit_accounting), cmocka_unit_test(test_splice_forget_drops_the_context),
        cmocka_unit_test(test_parse_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
