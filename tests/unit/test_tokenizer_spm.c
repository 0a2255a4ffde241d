/*
 * Tokenizer models on small vocabularies built here: SentencePiece BPE (scores, ▁, byte fallback,
 * BOS, special tokens in text) and byte-level BPE (merge ranks, any bytes round-trip); plus the
 * real model's tokenizer on thousands of random strings.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_paths.h"

#define SP "\xE2\x96\x81" /* ▁ */

typedef struct {
    const char *piece;
    float score;
} Piece;

static const Piece spm_pieces[] = {
    {SP "hello", 6}, {SP "world", 1}, {"ll", 10}, {SP "h", 9}, {SP "he", 8}, {SP "hell", 7},
    {SP "w", 5}, {SP "wo", 4}, {SP "wor", 3}, {SP "worl", 2}, {SP, -1}, {"h", -2}, {"e", -2},
    {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
};
enum { SPM_FIRST_PIECE = 3 + 256 };

static int32_t spm_id(const char *piece) {
    for (size_t i = 0; i < sizeof spm_pieces / sizeof spm_pieces[0]; i++)
        if (strcmp(spm_pieces[i].piece, piece) == 0) return SPM_FIRST_PIECE + (int32_t)i;
    return -1;
}

static uint8_t *build_spm(size_t *size) {
    size_t n = SPM_FIRST_PIECE + sizeof spm_pieces / sizeof spm_pieces[0];
    GgufWriter w;
    gw_init(&w);
    gw_kv_str(&w, "tokenizer.ggml.model", "llama");
    gw_kv_array_begin(&w, "tokenizer.ggml.tokens", 8, n);
    gw_arr_str(&w, "<unk>"); gw_arr_str(&w, "<s>"); gw_arr_str(&w, "</s>");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        gw_arr_str(&w, name);
    }
    for (size_t i = 0; i < sizeof spm_pieces / sizeof spm_pieces[0]; i++) gw_arr_str(&w, spm_pieces[i].piece);
    gw_kv_array_begin(&w, "tokenizer.ggml.scores", 6, n);
    for (int i = 0; i < SPM_FIRST_PIECE; i++) gw_arr_f32(&w, 0);
    for (size_t i = 0; i < sizeof spm_pieces / sizeof spm_pieces[0]; i++) gw_arr_f32(&w, spm_pieces[i].score);
    gw_kv_array_begin(&w, "tokenizer.ggml.token_type", 5, n);
    gw_arr_i32(&w, 2); gw_arr_i32(&w, 3); gw_arr_i32(&w, 3);
    for (int b = 0; b < 256; b++) gw_arr_i32(&w, 6);
    for (size_t i = 0; i < sizeof spm_pieces / sizeof spm_pieces[0]; i++) gw_arr_i32(&w, 1);
    gw_kv_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    gw_kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    gw_kv_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
    return gw_finish(&w, size);
}

static void encode(const Tokenizer *tok, const char *text, bool special, bool bos, TokenList *out) {
    BraidError err;
    out->n = 0;
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), special, bos, out, &err), 0);
}

static void expect_roundtrip(const Tokenizer *tok, const char *text, size_t len, bool special) {
    TokenList ids = {0};
    BraidError err;
    assert_int_equal(tokenizer_encode(tok, text, len, special, false, &ids, &err), 0);
    size_t out_len;
    char *out = tokenizer_decode(tok, ids.ids, ids.n, &out_len);
    assert_non_null(out);
    if (out_len != len || memcmp(out, text, len) != 0) {
        fprintf(stderr, "input  (%zu):", len);
        for (size_t i = 0; i < len; i++) fprintf(stderr, " %02x", (uint8_t)text[i]);
        fprintf(stderr, "\noutput (%zu):", out_len);
        for (size_t i = 0; i < out_len; i++) fprintf(stderr, " %02x", (uint8_t)out[i]);
        fprintf(stderr, "\nids:");
        for (int i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
        fprintf(stderr, "\n");
        fail_msg("round trip of %zu bytes failed", len);
    }
    free(out);
    free(ids.ids);
}

static void test_spm(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = build_spm(&size);
    GgufFile *f;
    Tokenizer tok;
    BraidError err;
    assert_int_equal(gguf_open_memory(buf, size, &f, &err), 0);
    if (tokenizer_load(f, &tok, &err)) fail_msg("%s", err.msg);
    assert_int_equal(tok.kind, TOKENIZER_SPM);
    assert_true(tok.add_bos && tok.add_space_prefix); /* the SentencePiece defaults */
    TokenList ids = {0};
    /* highest score merges first: ll, ▁h, ▁he, ▁hell, ▁hello, then ▁w … ▁world */
    encode(&tok, "hello world", false, true, &ids);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[0], 1);
    assert_int_equal(ids.ids[1], spm_id(SP "hello"));
    assert_int_equal(ids.ids[2], spm_id(SP "world"));
    /* characters outside the vocabulary fall back to their UTF-8 bytes */
    encode(&tok, "hé", false, false, &ids);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[0], spm_id(SP "h"));
    assert_int_equal(ids.ids[1], 3 + 0xC3);
    assert_int_equal(ids.ids[2], 3 + 0xA9);
    /* special tokens in text only when asked */
    encode(&tok, "hello<s>", true, false, &ids);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.ids[1], 1);
    encode(&tok, "hello<s>", false, false, &ids);
    assert_int_equal(ids.n, 4);
    assert_int_equal(ids.ids[1], 3 + '<');
    size_t len;
    char *text = tokenizer_decode(&tok, ids.ids, ids.n, &len);
    assert_string_equal(text, "hello<s>");
    free(text);
    const char *samples[] = {"hello world", "hé", "  two leading", "中文 and more", "tabs\tand\nnewlines", "x", ""};
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) expect_roundtrip(&tok, samples[i], strlen(samples[i]), false);
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(f);
    free(buf);
}

/* GPT-2's byte -> code point alphabet, written here from its definition. */
static void byte_piece(int b, char *out) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++) {
            int p = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
            n += !p;
        }
        cp = 256 + n;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
    else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0; }
}

static void test_byte_level_bpe(void **state) {
    (void)state;
    GgufWriter w;
    gw_init(&w);
    gw_kv_str(&w, "tokenizer.ggml.model", "gpt2");
    gw_kv_str(&w, "tokenizer.ggml.pre", "gpt2");
    gw_kv_array_begin(&w, "tokenizer.ggml.tokens", 8, 256 + 4);
    for (int b = 0; b < 256; b++) {
        char piece[4];
        byte_piece(b, piece);
        gw_arr_str(&w, piece);
    }
    gw_arr_str(&w, "\xC4\xA0t"); /* Ġt 256 */
    gw_arr_str(&w, "he");       /* 257 */
    gw_arr_str(&w, "\xC4\xA0the"); /* 258 */
    gw_arr_str(&w, "th");       /* 259 */
    gw_kv_array_begin(&w, "tokenizer.ggml.merges", 8, 4);
    gw_arr_str(&w, "\xC4\xA0 t");
    gw_arr_str(&w, "h e");
    gw_arr_str(&w, "\xC4\xA0t he");
    gw_arr_str(&w, "t h"); /* lower priority than "h e" */
    size_t size;
    uint8_t *buf = gw_finish(&w, &size);
    GgufFile *f;
    Tokenizer tok;
    BraidError err;
    assert_int_equal(gguf_open_memory(buf, size, &f, &err), 0);
    if (tokenizer_load(f, &tok, &err)) fail_msg("%s", err.msg);
    assert_false(tok.add_bos);
    TokenList ids = {0};
    encode(&tok, " the", false, false, &ids);
    assert_int_equal(ids.n, 1);
    assert_int_equal(ids.ids[0], 258);
    encode(&tok, "the", false, false, &ids); /* "h e" (rank 1) beats "t h" (rank 3) */
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.ids[0], 't');
    assert_int_equal(ids.ids[1], 257);
    encode(&tok, "th", false, false, &ids);
    assert_int_equal(ids.n, 1);
    assert_int_equal(ids.ids[0], 259);
    const char bytes[] = "\x00\x01 \xff\xfe invalid \xc3 utf8 \xe4\xb8 and NUL";
    expect_roundtrip(&tok, bytes, sizeof bytes - 1, false);
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(f);
    free(buf);
}

static void test_real_model_random_roundtrip(void **state) {
    (void)state;
    GgufFile *f;
    Tokenizer tok;
    BraidError err;
    if (gguf_open(test_model_path(), &f, &err) || tokenizer_load(f, &tok, &err)) fail_msg("%s", err.msg);
    const char *pieces[] = {"a", "Hello", " ", "   ", "\n", "\t", "\r\n", "42", "½", "é", "中文", "Привет", "🙂", "👨‍👩‍👧",
                            "'s", "<|im_start|>", "\xc3", "\x80\x80", "!?", "ﬁ", "\xe2\x96\x81"};
    /* Every byte here has a token; bytes SmolLM2 has none for are covered below. */
    uint64_t seed = 77;
    for (int iter = 0; iter < 2000; iter++) {
        char text[1024];
        size_t len = 0;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int parts = (int)((seed >> 33) % 30);
        for (int p = 0; p < parts; p++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const char *s = pieces[(seed >> 33) % (sizeof pieces / sizeof pieces[0])];
            memcpy(text + len, s, strlen(s));
            len += strlen(s);
        }
        expect_roundtrip(&tok, text, len, false);
    }
    TokenList ids = {0};
    /* Bytes without a token (0x04, 0x1d, 0xff in SmolLM2) are dropped, as HF does: it encodes
     * "a\x04b" as [81, 82] ("a", "b": the control byte still separates the words). */
    encode(&tok, "a\x04" "b\x1d\xff", false, false, &ids);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.ids[0], 81);
    assert_int_equal(ids.ids[1], 82);
    encode(&tok, "<|im_start|>user\nHi<|im_end|>", true, false, &ids);
    assert_true(ids.n >= 4);
    assert_int_equal(ids.ids[0], 1);
    assert_int_equal(ids.ids[ids.n - 1], 2);
    assert_true(tokenizer_is_stop(&tok, 2));
    assert_false(tokenizer_is_stop(&tok, 1));
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm),
        cmocka_unit_test(test_byte_level_bpe),
        cmocka_unit_test(test_real_model_random_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
