/*
 * grammar_vocab.c — the vocabulary trie (grammar_vocab.h).
 */
#include "grammar/grammar_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
} TokenKey;

static int cmp_token(const void *a, const void *b) {
    const TokenKey *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->p, y->p, n) : 0;
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void grammar_vocab_free(GrammarVocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->tok_ids);
    free(v->text_mask);
    free(v->end_ids);
    free(v->kinds);
    free(v->text);
    free(v->offset);
    for (int i = 0; v->plain_ci && i < v->n_plain; i++) grammar_ci_free(v->plain_ci[i]);
    for (int c = 0; v->upto && c <= v->chars_cap; c++) free(v->upto[c]);
    free(v->upto);
    free(v->over_tokens);
    free(v->over_chars);
    free(v->return_chars);
    free(v->plain_ci);
    free(v);
}

int grammar_vocab_size(const GrammarVocab *v) { return v ? v->n_vocab : 0; }

GrammarVocab *grammar_vocab_create(int n, const char *const *bytes, const uint32_t *lens, const uint8_t *kinds, char *why,
                                   size_t why_len) {
    if (n <= 0) {
        snprintf(why, why_len, "grammar: empty vocabulary");
        return NULL;
    }
    GrammarVocab *v = calloc(1, sizeof *v);
    TokenKey *keys = NULL;
    int32_t *path = NULL;
    if (!v) goto oom;
    v->n_vocab = n;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    v->kinds = malloc((size_t)n);
    v->offset = malloc(((size_t)n + 1) * sizeof *v->offset);
    v->text = malloc(total ? total : 1);
    v->tok_ids = malloc((size_t)n * sizeof *v->tok_ids);
    v->end_ids = malloc((size_t)n * sizeof *v->end_ids);
    keys = malloc((size_t)n * sizeof *keys);
    if (!v->kinds || !v->offset || !v->text || !v->tok_ids || !v->end_ids || !keys) goto oom;
    size_t at = 0;
    int n_keys = 0;
    for (int i = 0; i < n; i++) {
        uint8_t k = kinds[i] <= GRAMMAR_TOKEN_END ? kinds[i] : GRAMMAR_TOKEN_NEVER;
        if (k == GRAMMAR_TOKEN_TEXT && lens[i] == 0) k = GRAMMAR_TOKEN_NEVER;
        v->kinds[i] = k;
        v->offset[i] = (uint32_t)at;
        if (lens[i]) memcpy(v->text + at, bytes[i], lens[i]);
        if (k == GRAMMAR_TOKEN_TEXT) {
            keys[n_keys++] = (TokenKey){v->text + at, lens[i], i};
            if ((int)lens[i] > v->max_len) v->max_len = (int)lens[i];
        } else if (k == GRAMMAR_TOKEN_END) {
            v->end_ids[v->n_end++] = i;
        }
        at += lens[i];
    }
    v->offset[n] = (uint32_t)at;
    qsort(keys, (size_t)n_keys, sizeof *keys, cmp_token);
    /* Nodes: at most one per byte of every token, plus the root. */
    size_t max_nodes = 1;
    for (int i = 0; i < n_keys; i++) max_nodes += keys[i].len;
    v->nodes = malloc(max_nodes * sizeof *v->nodes);
    path = malloc(((size_t)v->max_len + 1) * sizeof *path);
    if (!v->nodes || !path) goto oom;
    v->nodes[0] = (GrammarVocabNode){0, 0, 0, 0, 0};
    v->n_nodes = 1;
    path[0] = 0;
    int depth = 0; /* path[0..depth] is the previous token's path */
    const TokenKey *prev = NULL;
    for (int i = 0; i < n_keys; i++) {
        const TokenKey *k = &keys[i];
        uint32_t lcp = 0;
        if (prev)
            while (lcp < prev->len && lcp < k->len && prev->p[lcp] == k->p[lcp]) lcp++;
        while (depth > (int)lcp) { /* close the nodes below the common prefix */
            int node = path[depth--];
            v->nodes[node].size = v->n_nodes - node;
        }
        for (uint32_t d = lcp; d < k->len; d++) {
            int node = v->n_nodes++;
            v->nodes[node] = (GrammarVocabNode){0, 0, 0, (int32_t)d + 1, k->p[d]};
            path[++depth] = node;
        }
        GrammarVocabNode *end = &v->nodes[path[depth]];
        if (end->n_tok == 0) end->tok_begin = i;
        end->n_tok++;
        v->tok_ids[i] = k->id;
        prev = k;
    }
    while (depth > 0) {
        int node = path[depth--];
        v->nodes[node].size = v->n_nodes - node;
    }
    v->nodes[0].size = v->n_nodes;
    v->n_text = n_keys;
    if (!(v->text_mask = calloc((size_t)grammar_mask_words(n), sizeof *v->text_mask))) goto oom;
    for (int i = 0; i < n_keys; i++) v->text_mask[keys[i].id >> 5] |= 1u << (keys[i].id & 31);
    free(keys);
    free(path);
    if (grammar_vocab_precompute(v, why, why_len)) {
        grammar_vocab_free(v);
        return NULL;
    }
    return v;
oom:
    snprintf(why, why_len, "grammar: out of memory for a vocabulary of %d tokens", n);
    free(keys);
    free(path);
    grammar_vocab_free(v);
    return NULL;
}
