/*
 * Directive resolution (issue 18, src/coord/directive_plan.c) with the real tokenizer:
 * - a text-matched splice replaces exactly the matched words: the planned prompt equals the
 *   tokenized edited text around the edit, every token outside the span is the context's own, and
 *   the runs name exactly those stretches (dst = src before the edit, shifted by delta after);
 * - a token span splice with an empty replacement removes the span; two splices apply left to right;
 * - hint spans move with the edits, a hint without a span covers the whole new prompt, a
 *   cache_control pin ends within its message's bytes;
 * - all-or-none: overlapping splices, a span outside the prompt, a match that does not occur, a hint
 *   cutting into a splice, mixed modes each fail with the prompt untouched.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/directive_plan.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_paths.h"

typedef struct {
    GgufFile *gguf;
    Tokenizer tok;
} Fixture;

static int setup(void **state) {
    static Fixture fx;
    BraidError err;
    if (gguf_open(test_model_path(), &fx.gguf, &err) || tokenizer_load(fx.gguf, &fx.tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    *state = &fx;
    return 0;
}

static int teardown(void **state) {
    Fixture *fx = *state;
    tokenizer_free(&fx->tok);
    gguf_close(fx->gguf);
    return 0;
}

static TokenList encode(const Tokenizer *tok, const char *text) {
    TokenList t = {0};
    BraidError err;
    if (tokenizer_encode(tok, text, strlen(text), false, tok->add_bos, &t, &err)) fail_msg("%s", err.msg);
    return t;
}

static const char *CONTEXT = "The committee met in Lisbon on Tuesday. It approved the budget for the new bridge, "
                             "and the mayor thanked the engineers. Next week the committee meets in Porto to discuss the railway.";

static void check_runs(const TokenList *c, const TokenList *p, const CacheDirectives *d) {
    int covered = 0;
    for (int i = 0; i < d->n_runs; i++) {
        const CacheSpliceRun *r = &d->runs[i];
        assert_true(r->dst + r->len <= p->n && r->src + r->len <= c->n);
        assert_memory_equal(p->ids + r->dst, c->ids + r->src, (size_t)r->len * sizeof *p->ids);
        covered += r->len;
    }
    assert_true(covered <= c->n);
}

static void test_text_splice(void **state) {
    Fixture *fx = *state;
    TokenList c = encode(&fx->tok, CONTEXT), p = encode(&fx->tok, CONTEXT);
    ApiDirective d[] = {{.op = API_DIRECTIVE_SPLICE, .match = "Lisbon", .occurrence = 1, .replacement = "Coimbra", .mode = CACHE_SPLICE_AMORTIZE},
                        {.op = CACHE_HINT_PIN, .has_span = true, .start = c.n - 3, .end = c.n, .ttl_s = 60}};
    CacheDirectives out;
    ApiError e;
    assert_int_equal(directive_plan(&fx->tok, false, &p, d, 2, NULL, 0, &out, &e), 0);
    /* The planned prompt tokenizes like the edited text would (the edit sits between whole words). */
    char *edited = malloc(strlen(CONTEXT) + 16);
    const char *at = strstr(CONTEXT, "Lisbon");
    sprintf(edited, "%.*sCoimbra%s", (int)(at - CONTEXT), CONTEXT, at + 6);
    TokenList want = encode(&fx->tok, edited);
    assert_int_equal(p.n, want.n);
    assert_memory_equal(p.ids, want.ids, (size_t)p.n * sizeof *p.ids);
    assert_int_equal(out.splice_mode, CACHE_SPLICE_AMORTIZE);
    assert_int_equal(out.n_runs, 2);
    assert_int_equal(out.runs[0].dst, 0);
    assert_int_equal(out.runs[0].index, -1);
    assert_int_equal(out.runs[1].index, 0);
    assert_int_equal(out.runs[0].len, out.first_edit);
    assert_int_equal(out.runs[1].dst + out.runs[1].len, p.n);
    assert_int_equal(out.runs[1].src + out.runs[1].len, c.n);
    check_runs(&c, &p, &out);
    assert_int_equal(out.n_context, c.n);
    /* The pin on the context's last three tokens is now on the new prompt's last three. */
    assert_int_equal(out.n_hints, 1);
    assert_int_equal(out.hints[0].start, p.n - 3);
    assert_int_equal(out.hints[0].end, p.n);
    cache_directives_free(&out);
    free(edited);
    free(want.ids);
    free(p.ids);
    free(c.ids);
}

static void test_token_splices_and_whole_hint(void **state) {
    Fixture *fx = *state;
    TokenList c = encode(&fx->tok, CONTEXT), p = encode(&fx->tok, CONTEXT);
    /* Given out of order: applied left to right all the same. */
    ApiDirective d[] = {{.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 20, .end = 24, .replacement = "", .mode = CACHE_SPLICE_FORGET},
                        {.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 5, .end = 6, .replacement = " happily", .mode = CACHE_SPLICE_FORGET},
                        {.op = CACHE_HINT_DECAY}};
    CacheDirectives out;
    ApiError e;
    TokenList rep = encode(&fx->tok, " happily");
    int n_rep = rep.n - (fx->tok.add_bos ? 1 : 0);
    assert_int_equal(directive_plan(&fx->tok, false, &p, d, 3, NULL, 0, &out, &e), 0);
    assert_int_equal(p.n, c.n - 4 - 1 + n_rep);
    assert_int_equal(out.first_edit, 5);
    assert_int_equal(out.n_runs, 3);
    assert_int_equal(out.runs[1].index, 1);
    assert_int_equal(out.runs[2].index, 0);
    assert_int_equal(out.runs[2].src, 24);
    assert_int_equal(out.runs[2].dst, 24 - 4 - 1 + n_rep);
    check_runs(&c, &p, &out);
    assert_true(out.n_hints == 1 && out.hints[0].start == 0 && out.hints[0].end == p.n);
    cache_directives_free(&out);
    free(rep.ids);
    free(p.ids);
    free(c.ids);
}

static void reject(Fixture *fx, const ApiDirective *d, int n, const char *param, const char *mention) {
    TokenList p = encode(&fx->tok, CONTEXT);
    TokenList before = encode(&fx->tok, CONTEXT);
    CacheDirectives out;
    ApiError e;
    assert_int_equal(directive_plan(&fx->tok, false, &p, d, n, NULL, 0, &out, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, mention)) fail_msg("message '%s' lacks '%s'", e.message, mention);
    assert_int_equal(p.n, before.n);
    assert_memory_equal(p.ids, before.ids, (size_t)p.n * sizeof *p.ids);
    assert_null(out.runs);
    assert_null(out.hints);
    free(p.ids);
    free(before.ids);
}

static void test_all_or_none(void **state) {
    Fixture *fx = *state;
    ApiDirective overlap[] = {{.op = CACHE_HINT_PIN, .ttl_s = 60},
                              {.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 5, .end = 9, .replacement = "a"},
                              {.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 8, .end = 12, .replacement = "b"}};
    reject(fx, overlap, 3, "directives[2].span", "overlaps directives[1]");
    ApiDirective outside[] = {{.op = CACHE_HINT_EVICT}, {.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 5, .end = 9000, .replacement = "a"}};
    reject(fx, outside, 2, "directives[1].span", "outside the prompt");
    ApiDirective missing[] = {{.op = API_DIRECTIVE_SPLICE, .match = "Madrid", .occurrence = 1, .replacement = "a"}};
    reject(fx, missing, 1, "directives[0].span", "occurs 0 times");
    ApiDirective second[] = {{.op = API_DIRECTIVE_SPLICE, .match = "committee", .occurrence = 3, .replacement = "a"}};
    reject(fx, second, 1, "directives[0].span", "occurs 2 times");
    ApiDirective cut[] = {{.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 5, .end = 9, .replacement = "a"},
                          {.op = CACHE_HINT_PIN, .has_span = true, .start = 7, .end = 20, .ttl_s = 60}};
    reject(fx, cut, 2, "directives[1].span", "cuts into");
    ApiDirective modes[] = {{.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 1, .end = 2, .replacement = "a", .mode = CACHE_SPLICE_AMORTIZE},
                            {.op = API_DIRECTIVE_SPLICE, .has_span = true, .start = 5, .end = 6, .replacement = "b", .mode = CACHE_SPLICE_FORGET}};
    reject(fx, modes, 2, "directives[1].span", "one mode");
}

static void test_cache_control_pin(void **state) {
    Fixture *fx = *state;
    TokenList p = encode(&fx->tok, CONTEXT);
    /* A message ending after "Tuesday." */
    DirectivePin pin = {.end_byte = (size_t)(strstr(CONTEXT, "Tuesday.") + 8 - CONTEXT), .ttl_s = 300, .message = 2};
    CacheDirectives out;
    ApiError e;
    assert_int_equal(directive_plan(&fx->tok, false, &p, NULL, 0, &pin, 1, &out, &e), 0);
    assert_int_equal(out.n_hints, 1);
    assert_int_equal(out.hints[0].index, -3);
    TokenList head = encode(&fx->tok, "The committee met in Lisbon on Tuesday.");
    assert_int_equal(out.hints[0].end, head.n);
    cache_directives_free(&out);
    free(head.ids);
    free(p.ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_splice), cmocka_unit_test(test_token_splices_and_whole_hint),
        cmocka_unit_test(test_all_or_none), cmocka_unit_test(test_cache_control_pin),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
