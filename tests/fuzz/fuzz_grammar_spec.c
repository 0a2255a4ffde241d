/*
 * Fuzz target for grammar specs (src/grammar: grammar_spec_check, the JSON Schema compiler, the
 * regex subset, the matcher and its masks). Each input is checked as a spec: a refusal must leave a
 * non-empty message; an accepted spec is compiled into a matcher over a small fixed vocabulary and
 * driven for a few steps, each mask holding exactly the tokens the matcher would accept (END only
 * when complete, the control token never), and the input's own bytes are fed to a byte matcher.
 * Any broken promise calls abort(). Replayed over corpus_grammar_spec/ plus mutations in every CI
 * run (fuzz_grammar_spec_replay).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const TOKENS[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\n  ", "a", "b", "ab", "x\"", "\":", "\",", "\"}",
                                     "{\"", "\": ", "0", "1", "12", "-", ".", "e", "true", "false", "null", "\\", "n", "u", "00",
                                     "\xc3", "\xa9", "\xc3\xa9", "<tool_call>", "\n</tool_call>", "name", "get_weather", "2024-01-02"};
#define N_TEXT (sizeof TOKENS / sizeof TOKENS[0])
#define N_VOCAB (N_TEXT + 2)

static void drive(const char *spec, size_t len, const uint8_t *data, size_t size) {
    const char *bytes[N_VOCAB];
    uint32_t lens[N_VOCAB];
    uint8_t kinds[N_VOCAB];
    for (size_t i = 0; i < N_TEXT; i++) bytes[i] = TOKENS[i], lens[i] = (uint32_t)strlen(TOKENS[i]), kinds[i] = GRAMMAR_TOKEN_TEXT;
    bytes[N_TEXT] = "<eos>", lens[N_TEXT] = 5, kinds[N_TEXT] = GRAMMAR_TOKEN_END;
    bytes[N_TEXT + 1] = "<ctl>", lens[N_TEXT + 1] = 5, kinds[N_TEXT + 1] = GRAMMAR_TOKEN_NEVER;
    char why[512];
    GrammarVocab *v = grammar_vocab_create((int)N_VOCAB, bytes, lens, kinds, why, sizeof why);
    if (!v) abort();
    GrammarMatcher *m = grammar_matcher_create_from_spec(spec, len, v, why, sizeof why);
    if (!m) abort(); /* grammar_spec_check accepted it */
    uint32_t mask[(N_VOCAB + 31) / 32];
    uint64_t pick = 0x9e3779b97f4a7c15ull ^ size;
    for (int step = 0; step < 24; step++) {
        int allowed = grammar_matcher_fill_mask(m, mask);
        if (allowed < 0) break; /* an internal limit, reported with a message */
        int count = 0;
        for (size_t t = 0; t < N_VOCAB; t++) {
            int bit = (int)(mask[t >> 5] >> (t & 31) & 1);
            count += bit;
            int want = kinds[t] == GRAMMAR_TOKEN_TEXT  ? grammar_matcher_would_accept(m, bytes[t], lens[t])
                       : kinds[t] == GRAMMAR_TOKEN_END ? grammar_matcher_is_complete(m)
                                                       : 0;
            if (bit != want) abort();
        }
        if (count != allowed) abort();
        if (allowed == 0) break;
        pick = pick * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((pick >> 33) % (uint64_t)allowed), token = -1;
        for (size_t t = 0; t < N_VOCAB && token < 0; t++)
            if ((mask[t >> 5] >> (t & 31) & 1) && k-- == 0) token = (int)t;
        if (grammar_matcher_accept_token(m, token)) abort();
        if (kinds[token] == GRAMMAR_TOKEN_END || grammar_matcher_is_terminated(m)) break;
    }
    grammar_matcher_free(m);
    grammar_vocab_free(v);
    /* The input's bytes through a byte matcher: accepted or refused, never a crash. */
    m = grammar_matcher_create_from_spec(spec, len, NULL, why, sizeof why);
    if (!m) abort();
    size_t half = size / 2;
    if (grammar_matcher_accept_bytes(m, (const char *)data + half, size - half) == 0)
        (void)grammar_matcher_is_complete(m);
    grammar_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char why[512];
    why[0] = 0;
    int rc = grammar_spec_check((const char *)data, size, why, sizeof why);
    if (rc != 0 && rc != -1) abort();
    if (rc == -1 && (why[0] == 0 || strlen(why) >= sizeof why)) abort();
    if (rc == 0) drive((const char *)data, size, data, size);
    /* response_format objects share the input */
    char *spec = grammar_spec_from_response_format((const char *)data, size, why, sizeof why);
    if (spec) {
        if (grammar_spec_check(spec, strlen(spec), why, sizeof why) == 0) drive(spec, strlen(spec), data, size);
        free(spec);
    }
    return 0;
}
