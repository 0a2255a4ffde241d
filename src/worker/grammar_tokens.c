#include "worker/grammar_tokens.h"

#include <stdlib.h>

GrammarVocab *grammar_vocab_from_tokenizer(const Tokenizer *tok, BraidError *err) {
    int n = tok->n_vocab;
    char **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *kinds = calloc((size_t)n, 1);
    GrammarVocab *v = NULL;
    if (!bytes || !lens || !kinds) {
        braid_error_set(err, "grammar: out of memory for the vocabulary");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int type = tok->types ? tok->types[i] : TOKEN_TYPE_NORMAL;
        if (tokenizer_is_stop(tok, i)) kinds[i] = GRAMMAR_TOKEN_END;
        else if (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNUSED || type == TOKEN_TYPE_UNKNOWN) kinds[i] = GRAMMAR_TOKEN_NEVER;
        else kinds[i] = GRAMMAR_TOKEN_TEXT;
        if (kinds[i] != GRAMMAR_TOKEN_TEXT) continue;
        size_t len = tokenizer_token_bytes(tok, i, NULL, 0);
        if (len == 0 || len > 1u << 16) {
            kinds[i] = GRAMMAR_TOKEN_NEVER;
            continue;
        }
        if (!(bytes[i] = malloc(len))) {
            braid_error_set(err, "grammar: out of memory for the vocabulary");
            goto out;
        }
        lens[i] = (uint32_t)tokenizer_token_bytes(tok, i, bytes[i], len);
    }
    char why[256];
    if (!(v = grammar_vocab_create(n, (const char *const *)bytes, lens, kinds, why, sizeof why))) braid_error_set(err, "%s", why);
out:
    for (int i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(kinds);
    return v;
}
