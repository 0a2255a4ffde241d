/*
 * Pre-tokenizers: hand-worked splits for the gpt2, smollm, llama3 and qwen2 patterns (leftmost
 * alternative, greedy runs, the (?!\S) lookahead), and lossless splitting of arbitrary bytes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/pretokenize.h"

typedef struct {
    char words[64][64];
    size_t lens[64];
    int n;
    char joined[4096];
    size_t joined_len;
} Collected;

static int collect(void *user, const char *word, size_t len) {
    Collected *c = user;
    if (c->n < 64 && len < 64) {
        memcpy(c->words[c->n], word, len);
        c->words[c->n][len] = '\0';
        c->lens[c->n] = len;
    }
    c->n++;
    if (c->joined_len + len <= sizeof c->joined) memcpy(c->joined + c->joined_len, word, len);
    c->joined_len += len;
    return 0;
}

/* expected: words separated by '|' */
static void expect_split(PreTokenizerKind kind, const char *text, const char *expected) {
    Collected c = {0};
    assert_int_equal(pretokenize(kind, text, strlen(text), collect, &c), 0);
    char got[1024] = "";
    for (int i = 0; i < c.n; i++) {
        if (i) strcat(got, "|");
        strcat(got, c.words[i]);
    }
    if (strcmp(got, expected) != 0) fail_msg("%s split of \"%s\": got \"%s\", expected \"%s\"", pretokenizer_name(kind), text, got, expected);
}

static void test_gpt2(void **state) {
    (void)state;
    expect_split(PRETOKENIZER_GPT2, "Hello world", "Hello| world");
    expect_split(PRETOKENIZER_GPT2, "  a", " | a");
    expect_split(PRETOKENIZER_GPT2, "a  ", "a|  ");
    expect_split(PRETOKENIZER_GPT2, "a   b", "a|  | b");
    expect_split(PRETOKENIZER_GPT2, "don't", "don|'t");
    expect_split(PRETOKENIZER_GPT2, "we'll they're I've", "we|'ll| they|'re| I|'ve");
    expect_split(PRETOKENIZER_GPT2, "I'LL", "I|'|LL");
    expect_split(PRETOKENIZER_GPT2, "x\n\ny", "x|\n|\n|y");
    expect_split(PRETOKENIZER_GPT2, "x \ny", "x| |\n|y"); /* only a plain space joins the next word */
    expect_split(PRETOKENIZER_GPT2, " 123 45", " 123| 45");
    expect_split(PRETOKENIZER_GPT2, "abc123def", "abc|123|def");
    expect_split(PRETOKENIZER_GPT2, "f(x) = y;", "f|(|x|)| =| y|;");
    expect_split(PRETOKENIZER_GPT2, "café 中文", "café| 中文");
    expect_split(PRETOKENIZER_GPT2, "a🙂b", "a|🙂|b");
    expect_split(PRETOKENIZER_GPT2, "\t\tx", "\t|\t|x");
    expect_split(PRETOKENIZER_GPT2, "end  ", "end|  ");
    expect_split(PRETOKENIZER_GPT2, "Привет мир", "Привет| мир");
}

static void test_smollm_digits(void **state) {
    (void)state;
    expect_split(PRETOKENIZER_SMOLLM, "a 12", "a| |1|2");
    expect_split(PRETOKENIZER_SMOLLM, "v1.2.3", "v|1|.|2|.|3");
    expect_split(PRETOKENIZER_SMOLLM, "Hello world", "Hello| world");
    expect_split(PRETOKENIZER_SMOLLM, "x½y", "x|½|y"); /* \p{N} includes other numbers */
    expect_split(PRETOKENIZER_SMOLLM, "2026-11-22", "2|0|2|6|-|1|1|-|2|2");
}

static void test_llama3(void **state) {
    (void)state;
    expect_split(PRETOKENIZER_LLAMA3, "12345", "123|45");
    expect_split(PRETOKENIZER_LLAMA3, "I'LL", "I|'LL");
    expect_split(PRETOKENIZER_LLAMA3, "Hello world", "Hello| world");
    expect_split(PRETOKENIZER_LLAMA3, "a\n\nb", "a|\n\n|b");
    expect_split(PRETOKENIZER_LLAMA3, "!!!\n\nabc", "!!!\n\n|abc");
    expect_split(PRETOKENIZER_LLAMA3, "(hello)", "(hello|)");
    expect_split(PRETOKENIZER_LLAMA3, "x = 1000000", "x| =| |100|000|0");
    expect_split(PRETOKENIZER_LLAMA3, "a  \n b", "a|  \n| b");
}

/* qwen2: llama3's expression with single-digit numbers (Qwen2 / Qwen2.5 / Qwen3). */
static void test_qwen2(void **state) {
    (void)state;
    expect_split(PRETOKENIZER_QWEN2, "12345", "1|2|3|4|5");
    expect_split(PRETOKENIZER_QWEN2, "x = 1000", "x| =| |1|0|0|0");
    expect_split(PRETOKENIZER_QWEN2, "I'LL do it's", "I|'LL| do| it|'s");
    expect_split(PRETOKENIZER_QWEN2, "!!!\n\nabc", "!!!\n\n|abc");
    expect_split(PRETOKENIZER_QWEN2, "v1.2", "v|1|.|2");
}

static void test_lossless_on_random_bytes(void **state) {
    (void)state;
    uint64_t seed = 5;
    const char *pieces[] = {"a", "Z", " ", "  ", "\n", "\t", "1", "é", "中", "🙂", "'", "'s", "!", "\xff", "\xc3", "\x80", "½", "\r\n"};
    for (int iter = 0; iter < 3000; iter++) {
        char text[512];
        size_t len = 0;
        int parts = (int)(seed % 40);
        for (int p = 0; p < parts; p++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const char *s = pieces[(seed >> 33) % (sizeof pieces / sizeof pieces[0])];
            memcpy(text + len, s, strlen(s));
            len += strlen(s);
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        for (PreTokenizerKind k = PRETOKENIZER_GPT2; k <= PRETOKENIZER_QWEN2; k++) {
            Collected c = {0};
            assert_int_equal(pretokenize(k, text, len, collect, &c), 0);
            assert_int_equal(c.joined_len, len);
            assert_memory_equal(c.joined, text, len);
            for (int i = 0; i < c.n && i < 64; i++) assert_true(c.lens[i] > 0);
        }
    }
}

static void test_names(void **state) {
    (void)state;
    PreTokenizerKind k;
    assert_int_equal(pretokenizer_from_name("smollm", &k), 0); assert_int_equal(k, PRETOKENIZER_SMOLLM);
    assert_int_equal(pretokenizer_from_name("llama-bpe", &k), 0); assert_int_equal(k, PRETOKENIZER_LLAMA3);
    assert_int_equal(pretokenizer_from_name("default", &k), 0); assert_int_equal(k, PRETOKENIZER_GPT2);
    assert_int_equal(pretokenizer_from_name("qwen2", &k), 0); assert_int_equal(k, PRETOKENIZER_QWEN2);
    assert_string_equal(pretokenizer_name(PRETOKENIZER_QWEN2), "qwen2");
    assert_int_equal(pretokenizer_from_name("qwen35", &k), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2), cmocka_unit_test(test_smollm_digits), cmocka_unit_test(test_llama3), cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_lossless_on_random_bytes), cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
