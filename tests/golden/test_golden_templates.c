/* Chat templates against Hugging Face transformers: every (template, conversation,
 * add_generation_prompt) line of tests/golden/templates/expected.jsonl (written by
 * tools/golden/make_template_golden.py) rendered through chat_template_render_json must equal the
 * reference byte for byte; a reference that raised (raise_exception) must fail with its message, and
 * one that failed otherwise must fail too. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_io.h"
#include "model/chat_template.h"
#include "test_paths.h"

static const json_t *find_case(const json_t *convs, const char *name) {
    size_t i;
    json_t *c;
    json_array_foreach(convs, i, c) if (!strcmp(json_string_value(json_object_get(c, "name")), name)) return c;
    return NULL;
}

static void first_difference(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  want: ...%.80s\n  got:  ...%.80s\n", i, want + from, got + from);
}

static void test_templates_match_transformers(void **state) {
    (void)state;
    char path[1024];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s", test_golden_path("templates/conversations.json"));
    json_t *convs = json_load_file(path, 0, &jerr);
    if (!convs) fail_msg("%s: %s", path, jerr.text);
    json_t *expected = golden_read_jsonl(test_golden_path("templates/expected.jsonl"));
    assert_non_null(expected);
    assert_true(json_array_size(expected) >= 100);
    int failures = 0, outputs = 0, raised = 0;
    size_t i;
    json_t *row;
    json_array_foreach(expected, i, row) {
        const char *name = json_string_value(json_object_get(row, "template"));
        const char *case_name = json_string_value(json_object_get(row, "case"));
        bool agp = json_is_true(json_object_get(row, "add_generation_prompt"));
        const json_t *conv = find_case(convs, case_name);
        assert_non_null(conv);
        char file[256];
        snprintf(file, sizeof file, "templates/%s.jinja", name);
        ChatTemplate t = {0};
        BraidError err;
        if (chat_template_load_file(&t, test_golden_path(file), json_string_value(json_object_get(row, "bos_token")),
                                    json_string_value(json_object_get(row, "eos_token")), &err))
            fail_msg("%s: %s", file, err.msg);
        char *got = chat_template_render_json(&t, json_object_get(conv, "messages"), json_object_get(conv, "tools"), agp, &err);
        const json_t *want = json_object_get(row, "output");
        if (want) {
            outputs++;
            if (!got) {
                fprintf(stderr, "%s / %s / agp=%d: render failed: %s\n", name, case_name, agp, err.msg);
                failures++;
            } else if (strcmp(got, json_string_value(want))) {
                fprintf(stderr, "%s / %s / agp=%d: output differs from transformers\n", name, case_name, agp);
                first_difference(json_string_value(want), got);
                failures++;
            }
        } else {
            const char *msg = json_string_value(json_object_get(row, "error"));
            bool was_raised = json_is_true(json_object_get(row, "raised"));
            raised += was_raised;
            if (got) {
                fprintf(stderr, "%s / %s / agp=%d: rendered, but transformers failed with: %s\n", name, case_name, agp, msg);
                failures++;
            } else if (was_raised && (!strstr(err.msg, "the chat template raised: ") || !strstr(err.msg, msg))) {
                fprintf(stderr, "%s / %s / agp=%d: wrong error\n  want: %s\n  got:  %s\n", name, case_name, agp, msg, err.msg);
                failures++;
            }
        }
        free(got);
        chat_template_free(&t);
    }
    printf("%zu cases: %d rendered, %d raise_exception, %d mismatches\n", json_array_size(expected), outputs, raised, failures);
    assert_true(raised > 0);
    assert_int_equal(failures, 0);
    json_decref(expected);
    json_decref(convs);
}

/* The default model's own template in the committed copy equals the one in the GGUF. */
static void test_model_template_is_the_committed_one(void **state) {
    (void)state;
    GgufFile *f;
    BraidError err;
    if (gguf_open(test_model_path(), &f, &err)) fail_msg("%s", err.msg);
    ChatTemplate t;
    assert_int_equal(chat_template_load(f, &t, &err), 0);
    FILE *in = fopen(test_golden_path("templates/smollm2.jinja"), "rb");
    assert_non_null(in);
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, in);
    fclose(in);
    buf[n] = '\0';
    assert_non_null(chat_template_source(&t));
    assert_string_equal(chat_template_source(&t), buf);
    chat_template_free(&t);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_templates_match_transformers),
        cmocka_unit_test(test_model_template_is_the_committed_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
