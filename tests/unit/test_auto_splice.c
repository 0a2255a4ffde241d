/*
 * auto_splice (issue 36: Leyline's Policy.transform in the server), on token ids (no model):
 * - the diff finds the common prefix and, in order, the stretches of the earlier prompt that
 *   reappear in the new one (one replaced span, two removed spans, a repetitive context);
 * - the plan is a splice of the earlier prompt whose runs map it onto the new one, marked auto and
 *   naming the given index; nothing when the new prompt only extends the earlier one, equals it, or
 *   the edit leaves less than AUTO_SPLICE_MIN_REUSE tokens after it to reuse;
 * - the store plans against the best of a conversation's recent prompts, keeps conversations apart
 *   by key (tenant, adapter, conversation or workflow), and forgets the least recently used one;
 * - auto_splice_request (what the server and `braid batch` call) fills only out's splice fields.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "coord/auto_splice.h"

static void seq(int32_t *t, int n, int base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

/* dst <- a[0, na) + b[0, nb); returns na + nb. */
static int cat(int32_t *dst, const int32_t *a, int na, const int32_t *b, int nb) {
    memcpy(dst, a, (size_t)na * sizeof *a);
    memcpy(dst + na, b, (size_t)nb * sizeof *b);
    return na + nb;
}

static void assert_run(const CacheSpliceRun *r, int dst, int src, int len) {
    assert_int_equal(r->dst, dst);
    assert_int_equal(r->src, src);
    assert_int_equal(r->len, len);
}

static void test_one_replaced_span(void **state) {
    (void)state;
    int32_t c[100], p[120], rep[3] = {9000, 9001, 9002}, tail[10];
    seq(c, 100, 1);
    seq(tail, 10, 7000);
    int n = cat(p, c, 30, rep, 3);
    n = cat(p, p, n, c + 35, 65);
    n = cat(p, p, n, tail, 10);
    AutoSpliceDiff d;
    assert_int_equal(auto_splice_diff(c, 100, p, n, &d), 0);
    assert_int_equal(d.prefix, 30);
    assert_int_equal(d.n_runs, 2);
    assert_run(&d.runs[0], 0, 0, 30);
    assert_run(&d.runs[1], 33, 35, 65);
    assert_int_equal(d.covered, 95);
    CacheDirectives out;
    assert_int_equal(auto_splice_plan(c, 100, &d, n, CACHE_SPLICE_AMORTIZE, 4, &out), 1);
    assert_int_equal(out.splice_mode, CACHE_SPLICE_AMORTIZE);
    assert_int_equal(out.first_edit, 30);
    assert_int_equal(out.n_context, 100);
    assert_memory_equal(out.context, c, sizeof c);
    assert_int_equal(out.n_runs, 2);
    assert_int_equal(out.runs[0].index, -1);
    assert_int_equal(out.runs[1].index, 4);
    assert_true(out.auto_splice);
    cache_directives_free(&out);
}

static void test_two_removed_spans(void **state) {
    (void)state;
    int32_t c[200], p[200];
    seq(c, 200, 1);
    int n = cat(p, c, 20, c + 40, 60);
    n = cat(p, p, n, c + 120, 80);
    AutoSpliceDiff d;
    assert_int_equal(auto_splice_diff(c, 200, p, n, &d), 0);
    assert_int_equal(d.n_runs, 3);
    assert_run(&d.runs[1], 20, 40, 60);
    assert_run(&d.runs[2], 80, 120, 80);
    assert_int_equal(d.covered, n);
}

static void test_repetitive_context(void **state) {
    (void)state;
    int32_t c[100], p[101];
    for (int i = 0; i < 100; i++) c[i] = 5;
    p[0] = 6;
    memcpy(p + 1, c, sizeof c);
    AutoSpliceDiff d;
    assert_int_equal(auto_splice_diff(c, 100, p, 101, &d), 0);
    assert_int_equal(d.prefix, 0);
    assert_int_equal(d.n_runs, 2);
    assert_run(&d.runs[1], 1, 0, 100);
}

static void test_no_plan(void **state) {
    (void)state;
    int32_t c[100], p[140], tail[40];
    seq(c, 100, 1);
    seq(tail, 40, 5000);
    CacheDirectives out;
    AutoSpliceDiff d;
    /* P extends C: the prefix cache's job. */
    int n = cat(p, c, 100, tail, 40);
    assert_int_equal(auto_splice_diff(c, 100, p, n, &d), 0);
    assert_int_equal(d.prefix, 100);
    assert_int_equal(auto_splice_plan(c, 100, &d, n, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    assert_null(out.context);
    /* P is C. */
    assert_int_equal(auto_splice_diff(c, 100, c, 100, &d), 0);
    assert_int_equal(auto_splice_plan(c, 100, &d, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    /* An edit 10 tokens before C's end: too little after it to reuse. */
    n = cat(p, c, 90, tail, 1);
    n = cat(p, p, n, c + 91, 9);
    assert_int_equal(auto_splice_diff(c, 100, p, n, &d), 0);
    assert_int_equal(auto_splice_plan(c, 100, &d, n, CACHE_SPLICE_FORGET, 0, &out), 0);
    /* P's whole tail is new: nothing of C after the edit comes back. */
    n = cat(p, c, 50, tail, 40);
    assert_int_equal(auto_splice_diff(c, 100, p, n, &d), 0);
    assert_int_equal(d.n_runs, 1);
    assert_int_equal(auto_splice_plan(c, 100, &d, n, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
}

static void test_store(void **state) {
    (void)state;
    AutoSpliceStore *s = auto_splice_store_create(2, 1000);
    assert_non_null(s);
    bool oom;
    assert_null(auto_splice_key("t", NULL, NULL, NULL, &oom));
    assert_false(oom);
    char *w = auto_splice_key("t", NULL, NULL, "wf", &oom), *cv = auto_splice_key("t", NULL, "wf", NULL, &oom);
    char *other = auto_splice_key("u", NULL, NULL, "wf", &oom);
    assert_string_not_equal(w, cv);
    assert_string_not_equal(w, other);
    int32_t unrelated[80], c[100], p[100];
    seq(unrelated, 80, 50000);
    seq(c, 100, 1);
    memcpy(p, c, sizeof c);
    p[40] = 9999; /* one token edited */
    CacheDirectives out;
    /* Nothing recorded yet: no plan; then C and an unrelated prompt are the conversation's recent ones. */
    assert_int_equal(auto_splice_apply(s, w, c, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    assert_int_equal(auto_splice_apply(s, w, unrelated, 80, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    /* Another tenant's conversation of the same workflow name knows nothing of C. */
    assert_int_equal(auto_splice_apply(s, other, p, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    /* The edited prompt is planned against C, the best of the recent ones. */
    assert_int_equal(auto_splice_apply(s, w, p, 100, CACHE_SPLICE_AMORTIZE, 2, &out), 1);
    assert_int_equal(out.n_context, 100);
    assert_memory_equal(out.context, c, sizeof c);
    assert_int_equal(out.first_edit, 40);
    assert_int_equal(out.n_runs, 2);
    assert_run(&out.runs[1], 41, 41, 59);
    cache_directives_free(&out);
    /* A third conversation (capacity 2): the least recently used one (other) goes, w stays. */
    assert_int_equal(auto_splice_apply(s, cv, c, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    c[50] = 8888;
    assert_int_equal(auto_splice_apply(s, w, c, 100, CACHE_SPLICE_FORGET, 0, &out), 1);
    assert_int_equal(out.splice_mode, CACHE_SPLICE_FORGET);
    cache_directives_free(&out);
    assert_int_equal(auto_splice_apply(s, other, c, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0); /* forgotten: nothing to diff */
    free(w);
    free(cv);
    free(other);
    auto_splice_store_free(s);
}

/* The front ends' entry (auto_splice_request): no key, nothing planned and out untouched; a plan
 * lands in out's splice fields only, the rest of out (a pin hint, the conversation scope) kept. */
static void test_request(void **state) {
    (void)state;
    AutoSpliceStore *s = auto_splice_store_create(4, 1000);
    assert_non_null(s);
    int32_t c[100], p[100];
    seq(c, 100, 1);
    memcpy(p, c, sizeof c);
    p[30] = 7777;
    CacheHint pin = {.op = CACHE_HINT_PIN, .end = 10, .ttl_s = 60};
    CacheDirectives out = {.conversation = 42, .hints = &pin, .n_hints = 1};
    assert_int_equal(auto_splice_request(s, "t", NULL, NULL, NULL, c, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0); /* no conversation */
    assert_int_equal(auto_splice_request(s, "t", "lora", "conv", NULL, c, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0); /* recorded */
    assert_int_equal(out.splice_mode, CACHE_SPLICE_NONE);
    assert_null(out.runs);
    /* The same conversation under another adapter is another conversation: nothing to diff. */
    assert_int_equal(auto_splice_request(s, "t", NULL, "conv", NULL, p, 100, CACHE_SPLICE_AMORTIZE, 0, &out), 0);
    assert_int_equal(auto_splice_request(s, "t", "lora", "conv", NULL, p, 100, CACHE_SPLICE_AMORTIZE, 3, &out), 1);
    assert_int_equal(out.splice_mode, CACHE_SPLICE_AMORTIZE);
    assert_int_equal(out.auto_splice, 1);
    assert_int_equal(out.first_edit, 30);
    assert_int_equal(out.n_context, 100);
    assert_memory_equal(out.context, c, sizeof c);
    assert_int_equal(out.n_runs, 2);
    assert_run(&out.runs[1], 31, 31, 69);
    assert_int_equal(out.runs[1].index, 3);
    assert_int_equal(out.conversation, 42);
    assert_ptr_equal(out.hints, &pin);
    assert_int_equal(out.n_hints, 1);
    out.hints = NULL, out.n_hints = 0; /* the pin is on the stack */
    cache_directives_free(&out);
    auto_splice_store_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_replaced_span), cmocka_unit_test(test_two_removed_spans), cmocka_unit_test(test_repetitive_context),
        cmocka_unit_test(test_no_plan),           cmocka_unit_test(test_store),
        cmocka_unit_test(test_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
