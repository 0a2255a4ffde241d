/*
 * Hidden states as text (src/common/float_b64) and in traces (src/sim/trace, trace_writer):
 * base64 round trips bit for bit at every length; padding, alphabet, non-finite values and
 * partial floats are refused; a trace line written with a hidden state reads back equal; a
 * hidden-state file attaches by id, counts its matches, and refuses mixed widths and bad lines
 * naming the line.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/float_b64.h"
#include "sim/trace.h"
#include "sim/trace_writer.h"

static void test_b64_round_trip(void **state) {
    (void)state;
    float v[40];
    for (int i = 0; i < 40; i++) v[i] = (float)(i * 0.37 - 5.0) * (i % 3 ? 1.0f : -1e-20f);
    for (int n = 0; n <= 40; n++) {
        char *text = float_b64_encode(v, n);
        assert_non_null(text);
        assert_int_equal(strlen(text) % 4, 0);
        int got;
        float *back = float_b64_decode(text, 64, &got);
        assert_non_null(back);
        assert_int_equal(got, n);
        if (n) assert_memory_equal(back, v, (size_t)n * sizeof *v);
        free(back);
        free(text);
    }
}

static void expect_bad(const char *text, int max_n) {
    int n = -1;
    float *v = float_b64_decode(text, max_n, &n);
    if (v) fail_msg("accepted '%s'", text);
    assert_int_equal(n, 0);
}

static void test_b64_refuses(void **state) {
    (void)state;
    float one = 1.0f, inf = INFINITY;
    char *ok = float_b64_encode(&one, 1), *bad = float_b64_encode(&inf, 1);
    expect_bad(bad, 8);          /* not finite */
    expect_bad(ok, 0);           /* more values than allowed */
    expect_bad("AAA", 8);        /* not a multiple of 4 characters */
    expect_bad("AA==", 8);       /* one byte: not a whole float */
    expect_bad("AA*A", 8);       /* outside the alphabet */
    expect_bad("A=AA", 8);       /* padding in the middle */
    free(ok);
    free(bad);
}

static void temp_path(char *path) {
    strcpy(path, "/tmp/braid_hidden_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Two requests, the first with an inline hidden state of 3 values. */
static void write_trace(const char *path) {
    FILE *f = fopen(path, "w");
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = i + 1;
    float h[3] = {0.5f, -2.0f, 3.25f};
    TraceRecord a = {.seq = 0, .id = "a", .workflow = "w", .agent = "x", .prompt = prompt, .prompt_tokens = 40, .block_size = 16,
                     .hidden = h, .hidden_dim = 3};
    TraceRecord b = {.seq = 1, .t = 1.0, .id = "b", .workflow = "w", .agent = "y", .prompt = prompt, .prompt_tokens = 20, .block_size = 16};
    assert_int_equal(trace_write_request(f, &a), 0);
    assert_int_equal(trace_write_request(f, &b), 0);
    fclose(f);
}

static void test_trace_inline_and_attach(void **state) {
    (void)state;
    char tpath[64], hpath[64];
    temp_path(tpath);
    temp_path(hpath);
    write_trace(tpath);
    Trace t;
    BraidError err;
    assert_int_equal(trace_load(tpath, &t, &err), 0);
    assert_int_equal(t.n, 2);
    assert_int_equal(t.reqs[0].hidden_dim, 3);
    assert_true(t.reqs[0].hidden[1] == -2.0f && t.reqs[0].hidden[2] == 3.25f);
    assert_null(t.reqs[1].hidden);
    assert_int_equal(trace_hidden_dim(&t), 3);
    /* A file with b's state, a replacement for a, and an id the trace lacks. */
    float hb[3] = {1, 2, 3}, ha[3] = {7, 8, 9};
    char *eb = float_b64_encode(hb, 3), *ea = float_b64_encode(ha, 3), line[512];
    snprintf(line, sizeof line, "{\"id\":\"b\",\"hidden\":\"%s\"}\n\n{\"id\":\"a\",\"hidden\":\"%s\"}\n{\"id\":\"zz\",\"hidden\":\"%s\"}\n", eb, ea, ea);
    write_text(hpath, line);
    int matched;
    assert_int_equal(trace_attach_hidden(&t, hpath, &matched, &err), 0);
    assert_int_equal(matched, 2);
    assert_true(t.reqs[1].hidden && t.reqs[1].hidden[2] == 3.0f && t.reqs[0].hidden[0] == 7.0f);
    /* A state of another width, and a line without a hidden string: refused with the line. */
    float h2[2] = {1, 2};
    char *e2 = float_b64_encode(h2, 2);
    snprintf(line, sizeof line, "{\"id\":\"b\",\"hidden\":\"%s\"}\n", e2);
    write_text(hpath, line);
    assert_int_equal(trace_attach_hidden(&t, hpath, &matched, &err), -1);
    assert_non_null(strstr(err.msg, ":1"));
    write_text(hpath, "{\"id\":\"b\",\"hidden\":\"AA==\"}\n");
    assert_int_equal(trace_attach_hidden(&t, hpath, &matched, &err), -1);
    write_text(hpath, "{\"id\":\"a\"}\n");
    assert_int_equal(trace_attach_hidden(&t, hpath, &matched, &err), -1);
    assert_int_equal(trace_attach_hidden(&t, "/nonexistent/h.jsonl", &matched, &err), -1);
    free(eb);
    free(ea);
    free(e2);
    trace_free(&t);
    /* A trace line whose hidden is not valid base64 is a parse error. */
    TraceRequest r;
    int bs = 0;
    assert_int_equal(trace_parse_line("{\"type\":\"request\",\"blocks\":[],\"block_size\":16,\"prompt_tokens\":1,\"output_tokens\":1,"
                                      "\"hidden\":\"#\"}",
                                      &r, &bs, &err),
                     -1);
    unlink(tpath);
    unlink(hpath);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64_round_trip),
        cmocka_unit_test(test_b64_refuses),
        cmocka_unit_test(test_trace_inline_and_attach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
