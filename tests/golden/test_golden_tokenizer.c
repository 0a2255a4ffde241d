/*
 * Tokenizer against HF transformers' tokenizer for the same GGUF (tests/golden/tokenize.jsonl):
 * identical ids for every corpus string (special tokens recognized), and decode(encode(s)) == s.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_io.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_paths.h"

typedef struct {
    GgufFile *gguf;
    Tokenizer tok;
    json_t *corpus;
} Fixture;

static int setup(void **state) {
    static Fixture fx;
    BraidError err;
    if (gguf_open(test_model_path(), &fx.gguf, &err) || tokenizer_load(fx.gguf, &fx.tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    fx.corpus = golden_read_jsonl(test_golden_path("tokenize.jsonl"));
    if (!fx.corpus) return -1;
    *state = &fx;
    return 0;
}

static int teardown(void **state) {
    Fixture *fx = *state;
    json_decref(fx->corpus);
    tokenizer_free(&fx->tok);
    gguf_close(fx->gguf);
    return 0;
}

static void print_ids(const char *label, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", label);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

static void test_ids_match_reference(void **state) {
    Fixture *fx = *state;
    size_t n_lines = json_array_size(fx->corpus), mismatches = 0;
    assert_true(n_lines >= 60);
    for (size_t i = 0; i < n_lines; i++) {
        json_t *line = json_array_get(fx->corpus, i);
        const char *text = json_string_value(json_object_get(line, "text"));
        size_t len = json_string_length(json_object_get(line, "text"));
        int n_ref;
        int32_t *ref = golden_int_array(json_object_get(line, "ids"), &n_ref);
        TokenList got = {0};
        BraidError err;
        assert_int_equal(tokenizer_encode(&fx->tok, text, len, true, false, &got, &err), 0);
        if (got.n != n_ref || (n_ref && memcmp(got.ids, ref, (size_t)n_ref * sizeof *ref) != 0)) {
            fprintf(stderr, "mismatch on corpus line %zu: %s\n", i + 1, json_dumps(json_object_get(line, "text"), JSON_ENCODE_ANY));
            print_ids("reference", ref, n_ref);
            print_ids("braid    ", got.ids, got.n);
            mismatches++;
        }
        free(ref);
        free(got.ids);
    }
    fprintf(stderr, "tokenizer golden: %zu strings, %zu mismatches\n", n_lines, mismatches);
    assert_int_equal(mismatches, 0);
}

static void test_roundtrip(void **state) {
    Fixture *fx = *state;
    for (size_t i = 0; i < json_array_size(fx->corpus); i++) {
        json_t *line = json_array_get(fx->corpus, i);
        const char *text = json_string_value(json_object_get(line, "text"));
        size_t len = json_string_length(json_object_get(line, "text"));
        TokenList ids = {0};
        BraidError err;
        assert_int_equal(tokenizer_encode(&fx->tok, text, len, true, false, &ids, &err), 0);
        size_t out_len;
        char *out = tokenizer_decode(&fx->tok, ids.ids, ids.n, &out_len);
        assert_non_null(out);
        if (out_len != len || memcmp(out, text, len) != 0) fprintf(stderr, "roundtrip failed on corpus line %zu\n", i + 1);
        assert_int_equal(out_len, len);
        assert_memory_equal(out, text, len);
        free(out);
        free(ids.ids);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_match_reference),
        cmocka_unit_test(test_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
