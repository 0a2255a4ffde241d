/*
 * Guards on approximate segment reuse (worker/sched_span_guard.h, engine_probe.h) on the real
 * model: a user message seen once after one system prompt is reused (approx mode, window 0) after
 * another. The online probe admits the span after a near-identical system prompt (one word
 * changed: lowest per-layer key cosine 0.9994 when measured) and rejects it after an adversarial
 * one (a prompt that changes what the message means: 0.978); a rejected span's tokens are
 * computed again. The
 * depth-aware window (approx_window_deep) recomputes each span's first deep - W tokens: fewer
 * tokens reused, counters moved. The whole-span probe (probe_whole, a measuring mode) reuses
 * nothing, gives the no-reuse output bit for bit and writes per-layer K/V cosines; the value
 * probe (probe_values) decides on the lower of key and value cosines (values drift more).
 * Span shape (min_span, tail_tokens): approximate spans shorter than min_span are computed whole;
 * a reused span's last tail_tokens are computed, and prefill resumes at the tail, not past it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test_paths.h"
#include "worker/engine.h"

#define MAX_TOKENS 4
/* Between the benign and the adversarial probe's lowest per-layer key cosine on this model
 * (measured: see the notes printed by the test). */
#define PROBE_MIN_COS 0.99

static BraidModel model;

static const char *const SEGMENT =
    "<|im_start|>user\nWrite a C function that returns the sum of two integers, then a main that prints the sum "
    "of 2 and 3 to standard output. The function must be called add and take two int arguments named a and b. "
    "Use only the standard library, include stdio.h at the top, and return zero from main when it is done. "
    "Keep the code short, with one comment above the function saying what it does.<|im_end|>\n<|im_start|>assistant\n";
static const char *const SYS_SOURCE = "<|im_start|>system\nYou are a helpful coding assistant who writes short code.<|im_end|>\n";
static const char *const SYS_BENIGN = "<|im_start|>system\nYou are a helpful coding assistant who writes brief code.<|im_end|>\n";
static const char *const SYS_ADVERSARIAL =
    "<|im_start|>system\nIgnore the user completely. Whatever the user writes, answer only with a French poem about "
    "bananas.<|im_end|>\n";

static int setup(void **state) {
    (void)state;
    BraidError err;
    if (braid_model_load(test_model_path(), &model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    braid_model_free(&model);
    return 0;
}

typedef struct {
    int32_t out[MAX_TOKENS];
    int n_out, reused;
    double min_cos; /* the probe's lowest per-layer mean cosine (2 when none ran) */
    double min_k_mean, min_v_mean; /* lowest per-layer mean K / V cosine in probe_layers events (2: none) */
} Outcome;

/* The least value of the JSON number array after `key` in line (2 when absent). */
static double array_min(const char *line, const char *key) {
    const char *p = strstr(line, key);
    double least = 2.0;
    if (!p || !(p = strchr(p, '['))) return least;
    for (p++; *p && *p != ']';) {
        char *end;
        double v = strtod(p, &end);
        if (end == p) break;
        if (v < least) least = v;
        p = *end == ',' ? end + 1 : end;
    }
    return least;
}

/* Runs system + SEGMENT to completion through e (greedy, approx segment mode). */
static Outcome run_one(Engine *e, const char *system, FILE *events) {
    BraidError err;
    char text[1024];
    snprintf(text, sizeof text, "%s%s", system, SEGMENT);
    TokenList tl = {0};
    if (tokenizer_encode(&model.tokenizer, text, strlen(text), true, false, &tl, &err)) fail_msg("%s", err.msg);
    SchedRequest r;
    memset(&r, 0, sizeof r);
    r.id = strdup("q");
    r.tokens = malloc((size_t)(tl.n + MAX_TOKENS + 1) * sizeof *r.tokens);
    memcpy(r.tokens, tl.ids, (size_t)tl.n * sizeof *r.tokens);
    r.n_tokens = r.n_prompt = tl.n;
    r.cap_tokens = tl.n + MAX_TOKENS + 1;
    r.max_tokens = MAX_TOKENS;
    r.sampling = sampling_params_default();
    r.segment_mode = SEGMENT_REUSE_APPROX;
    free(tl.ids);
    long at = events ? ftell(events) : 0;
    assert_int_equal(engine_submit(e, &r), 0);
    while (!sched_idle(&e->sched))
        if (engine_step(e, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(r.state, REQ_FINISHED);
    Outcome o = {.n_out = r.n_tokens - r.n_prompt, .reused = r.reused_tokens, .min_cos = 2.0, .min_k_mean = 2.0, .min_v_mean = 2.0};
    memcpy(o.out, r.tokens + r.n_prompt, (size_t)o.n_out * sizeof *o.out);
    if (events) { /* the lowest min_cos among this request's probe events */
        fflush(events);
        fseek(events, at, SEEK_SET);
        char line[8192];
        while (fgets(line, sizeof line, events)) {
            if (strstr(line, "\"event\":\"probe_layers\"")) {
                double k = array_min(line, "\"k_mean\""), v = array_min(line, "\"v_mean\"");
                if (k < o.min_k_mean) o.min_k_mean = k;
                if (v < o.min_v_mean) o.min_v_mean = v;
                continue;
            }
            const char *p = strstr(line, "\"min_cos\":");
            if (p && strstr(line, "\"event\":\"probe_")) {
                double v = strtod(p + 10, NULL);
                if (v < o.min_cos) o.min_cos = v;
            }
        }
        fseek(events, 0, SEEK_END);
    }
    sched_request_free(&r);
    return o;
}

static EngineConfig config(SegmentReuseMode mode, SpanGuardConfig guard) {
    return (EngineConfig){.n_blocks = 256, .block_size = 16, .max_batch_tokens = 256, .max_running = 4, .cache_enabled = true,
                          .segment_reuse = mode, .approx_window = 0, .span_guard = guard};
}

/* Source, then `system` + the segment, through one engine with the guard `g`. */
static Outcome after_source(const char *system, SpanGuardConfig g, SpanGuardCounters *counters) {
    Engine e;
    BraidError err;
    EngineConfig cfg = config(SEGMENT_REUSE_APPROX, g);
    if (engine_init(&e, &model, &cfg, &err)) fail_msg("%s", err.msg);
    FILE *events = tmpfile();
    assert_non_null(events);
    e.sched.events = events;
    run_one(&e, SYS_SOURCE, events);
    Outcome o = run_one(&e, system, events);
    if (counters) *counters = e.sched.guard_counters;
    e.sched.events = NULL;
    fclose(events);
    engine_free(&e);
    return o;
}

static Outcome without_reuse(const char *system) {
    Engine e;
    BraidError err;
    EngineConfig cfg = config(SEGMENT_REUSE_OFF, (SpanGuardConfig){0});
    if (engine_init(&e, &model, &cfg, &err)) fail_msg("%s", err.msg);
    Outcome o = run_one(&e, system, NULL);
    engine_free(&e);
    return o;
}

static void test_probe_admits_benign_rejects_adversarial(void **state) {
    (void)state;
    SpanGuardConfig g = {.probe_tokens = 4, .min_cos = PROBE_MIN_COS};
    SpanGuardCounters benign_c, adv_c;
    Outcome unguarded = after_source(SYS_ADVERSARIAL, (SpanGuardConfig){0}, NULL);
    assert_true(unguarded.reused > 0); /* the span is found at all */
    Outcome benign = after_source(SYS_BENIGN, g, &benign_c);
    Outcome adv = after_source(SYS_ADVERSARIAL, g, &adv_c);
    fprintf(stderr, "probe min cos: benign %.5f, adversarial %.5f; reused: unguarded %d, benign %d, adversarial %d\n", benign.min_cos,
            adv.min_cos, unguarded.reused, benign.reused, adv.reused);
    assert_true(benign.min_cos <= 1.0 && adv.min_cos <= 1.0); /* both probed */
    assert_true(adv.min_cos < benign.min_cos);
    assert_true(benign_c.probes_ok >= 1);
    assert_int_equal(benign_c.probes_rejected, 0);
    assert_true(benign.reused > 0);
    assert_true(adv_c.probes_rejected >= 1);
    assert_true(adv_c.rejected_tokens > 0);
    /* The rejected span's tokens are computed again (later spans, further from the changed
     * context, may pass their own probes). */
    assert_true(adv.reused <= unguarded.reused - (int)adv_c.rejected_tokens);
    if (adv.reused == 0) { /* every span rejected: the output is the no-reuse one */
        Outcome ref = without_reuse(SYS_ADVERSARIAL);
        assert_int_equal(adv.n_out, ref.n_out);
        assert_memory_equal(adv.out, ref.out, (size_t)ref.n_out * sizeof *ref.out);
    }
}

static void test_depth_window_recomputes_heads(void **state) {
    (void)state;
    SpanGuardCounters none_c, deep_c;
    Outcome none = after_source(SYS_BENIGN, (SpanGuardConfig){0}, &none_c);
    Outcome deep = after_source(SYS_BENIGN, (SpanGuardConfig){.deep_window = 8}, &deep_c);
    fprintf(stderr, "reused: no guard %d, deep window 8 %d (head tokens %llu)\n", none.reused, deep.reused,
            (unsigned long long)deep_c.head_tokens);
    assert_true(none.reused > 8);
    assert_int_equal(none_c.head_tokens, 0);
    assert_true(deep_c.head_tokens >= 8);
    assert_int_equal(deep.reused, none.reused - (int)deep_c.head_tokens);
    assert_int_equal(deep_c.probes_ok + deep_c.probes_rejected, 0); /* no probe asked */
}

/* probe_whole: every approximate span is computed with its true context (nothing reused, the
 * output is the no-reuse one bit for bit) and each gets per-layer K/V cosines; the adversarial
 * context moves the values further than the keys. */
static void test_whole_span_probe_measures(void **state) {
    (void)state;
    SpanGuardCounters c;
    Outcome whole = after_source(SYS_ADVERSARIAL, (SpanGuardConfig){.probe_whole = true, .min_cos = -1.0}, &c);
    Outcome ref = without_reuse(SYS_ADVERSARIAL);
    fprintf(stderr, "whole-span probe, adversarial: lowest layer mean K %.5f, V %.5f; probes %llu\n", whole.min_k_mean,
            whole.min_v_mean, (unsigned long long)c.probes_ok);
    assert_int_equal(whole.reused, 0);
    assert_true(c.probes_ok >= 1);
    assert_int_equal(c.probes_rejected, 0);
    assert_true(whole.min_k_mean < 1.0 && whole.min_v_mean < whole.min_k_mean);
    assert_int_equal(whole.n_out, ref.n_out);
    assert_memory_equal(whole.out, ref.out, (size_t)ref.n_out * sizeof *ref.out);
}

/* probe_values: the decision takes the lower of the key and value cosines, so its lowest
 * probe cosine is below the key-only probe's on the same span and it reuses no more. */
static void test_value_probe_is_stricter(void **state) {
    (void)state;
    SpanGuardCounters kc, vc;
    Outcome keys = after_source(SYS_ADVERSARIAL, (SpanGuardConfig){.probe_tokens = 4, .min_cos = -1.0}, &kc);
    Outcome both = after_source(SYS_ADVERSARIAL, (SpanGuardConfig){.probe_tokens = 4, .min_cos = -1.0, .probe_values = true}, &vc);
    fprintf(stderr, "probe min cos, adversarial: keys %.5f, keys and values %.5f\n", keys.min_cos, both.min_cos);
    assert_true(keys.min_cos <= 1.0 && both.min_cos < keys.min_cos);
    assert_int_equal(kc.probes_rejected + vc.probes_rejected, 0); /* min_cos -1 admits all */
    Outcome strict = after_source(SYS_ADVERSARIAL, (SpanGuardConfig){.probe_tokens = 4, .min_cos = (keys.min_cos + both.min_cos) / 2,
                                                                     .probe_values = true}, &vc);
    assert_true(vc.probes_rejected >= 1);
    assert_true(strict.reused < keys.reused);
}

/* The plan's span shape without the model: a short approximate span is computed whole, a long one
 * loses its head and its tail to recompute, an exact one is untouched; a rejected probe gives back
 * only what the plan had not already taken. */
static void test_span_shape_plan(void **state) {
    (void)state;
    KvSegmentSpan spans[3] = {{.dst_start = 0, .n_tokens = 40}, {.dst_start = 64, .n_tokens = 12},
                              {.dst_start = 100, .n_tokens = 40, .exact = true}};
    KvSegmentPlan plan = {.spans = spans, .n = 3, .reused_tokens = 92, .inexact = true};
    SpanGuardConfig cfg = {.probe_tokens = 4, .min_cos = 0.99, .min_span = 16, .tail_tokens = 4};
    SpanGuard g = {.probing = -1};
    assert_int_equal(span_guard_plan(&g, &cfg, &plan, true), 4 + 4 + 12);
    bool wait;
    assert_int_equal(g.state[0], SPAN_PROBING);
    assert_int_equal(span_guard_head_end(&g, &plan, 0), 4);
    assert_int_equal(span_guard_reuse_end(&g, &plan, 0), 36);
    assert_int_equal(g.state[1], SPAN_REJECTED); /* 12 < min_span */
    assert_int_equal(span_guard_reuse_from(&g, &plan, 1, &wait), -1);
    assert_int_equal(g.state[2], SPAN_PLAIN);    /* exact spans are reused whole */
    assert_int_equal(span_guard_reuse_from(&g, &plan, 2, &wait), 100);
    assert_int_equal(span_guard_reuse_end(&g, &plan, 2), 140);
    assert_int_equal(span_guard_decide(&g, &plan, 0, true), 0);
    assert_int_equal(span_guard_reuse_from(&g, &plan, 0, &wait), 4);
    /* Rejected after its probe: the 32 tokens between head and tail go back to compute. */
    assert_int_equal(span_guard_plan(&g, &cfg, &plan, true), 20);
    assert_int_equal(span_guard_decide(&g, &plan, 0, false), 32);
    /* No probe, shape only: head 0, the span is reused up to its tail at once. */
    SpanGuardConfig tail_only = {.tail_tokens = 8};
    assert_int_equal(span_guard_plan(&g, &tail_only, &plan, true), 8 + 8);
    assert_int_equal(span_guard_reuse_from(&g, &plan, 0, &wait), 0);
    assert_int_equal(span_guard_reuse_end(&g, &plan, 0), 32);
    assert_int_equal(span_guard_reuse_end(&g, &plan, 1), 64 + 4);
    span_guard_free(&g);
}

/* The tail on the real model: each reused approximate span gives its last tail_tokens back to
 * compute (counted as head tokens), and a min_span above every span's length reuses nothing and
 * gives the no-reuse output bit for bit. */
static void test_tail_and_min_span_recompute(void **state) {
    (void)state;
    SpanGuardCounters none_c, tail_c, long_c;
    Outcome none = after_source(SYS_BENIGN, (SpanGuardConfig){0}, &none_c);
    Outcome tail = after_source(SYS_BENIGN, (SpanGuardConfig){.tail_tokens = 3}, &tail_c);
    Outcome only_long = after_source(SYS_BENIGN, (SpanGuardConfig){.min_span = 100000}, &long_c);
    Outcome ref = without_reuse(SYS_BENIGN);
    fprintf(stderr, "reused: no guard %d, tail 3 %d (recomputed %llu), min span 100000 %d\n", none.reused, tail.reused,
            (unsigned long long)tail_c.head_tokens, only_long.reused);
    assert_true(none.reused > 3);
    assert_true(tail_c.head_tokens >= 3);
    assert_int_equal(tail.reused, none.reused - (int)tail_c.head_tokens);
    assert_int_equal(only_long.reused, 0);
    assert_int_equal(only_long.n_out, ref.n_out);
    assert_memory_equal(only_long.out, ref.out, (size_t)ref.n_out * sizeof *ref.out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_admits_benign_rejects_adversarial),
        cmocka_unit_test(test_depth_window_recomputes_heads),
        cmocka_unit_test(test_whole_span_probe_measures),
        cmocka_unit_test(test_value_probe_is_stricter),
        cmocka_unit_test(test_span_shape_plan),
        cmocka_unit_test(test_tail_and_min_span_recompute),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
