/*
 * grammar_vocab.h — internal: a model vocabulary as a byte trie, for grammar token masks.
 *
 * Nodes are laid out in depth-first preorder, so a node's subtree is the contiguous range
 * [node, node + size) and its children are found by hopping from node + 1 by each child's size.
 * Node 0 is the root (the empty string). Each node lists the TEXT tokens whose bytes end there.
 * Made once per vocabulary (grammar_vocab_create) and read-only after: shared by all matchers.
 */
#ifndef BRAID_GRAMMAR_VOCAB_H
#define BRAID_GRAMMAR_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

typedef struct {
    int32_t size;      /* nodes in the subtree, this one included */
    int32_t tok_begin; /* into GrammarVocab.tok_ids */
    int32_t n_tok;
    int32_t depth;     /* bytes from the root */
    uint8_t byte;      /* the byte that leads here from the parent */
} GrammarVocabNode;

/* Tokens read entirely inside one grammar state's rule (grammar_matcher.c). */
typedef struct {
    uint32_t *bits;    /* as a mask, or NULL when listed */
    int32_t *list;
    int n_list;
    int32_t *returns;  /* trie nodes where the rule can finish */
    int n_returns;
} GrammarCiInfo;

struct GrammarVocab {
    int n_vocab;
    GrammarVocabNode *nodes;
    int n_nodes;
    int32_t *tok_ids;  /* TEXT tokens in byte order */
    int n_text;
    uint32_t *text_mask; /* all TEXT tokens (a lazy grammar's free phase) */
    int32_t *end_ids;  /* END tokens */
    int n_end;
    uint8_t *kinds;    /* (n_vocab) GrammarTokenKind */
    uint8_t *text;     /* every token's bytes, concatenated */
    uint32_t *offset;  /* (n_vocab + 1) token t is text[offset[t], offset[t + 1]) */
    int max_len;       /* longest TEXT token */
    /* Precomputed caches of the plain-string rule's states (grammar_build_plain_string), shared
     * by every matcher on this vocabulary. */
    GrammarCiInfo **plain_ci;
    int n_plain;
    /* Bounded strings (GrammarBoundedPos): the plain-string content state's tokens by how many
     * string characters each starts — upto[c] (c <= chars_cap) is the mask of those starting at
     * most c, tokens starting more are listed in over_* — and the characters before the closing
     * quote of each of its return nodes (return_chars, parallel to its returns). */
    int plain_content;          /* offset of the content state in the plain-string rule */
    uint32_t **upto;
    int chars_cap;
    int32_t *over_tokens, *over_chars;
    int n_over;
    int32_t *return_chars;
};

/* Fills v->plain_ci (grammar_matcher.c). */
int grammar_vocab_precompute(GrammarVocab *v, char *why, size_t why_len);
void grammar_ci_free(GrammarCiInfo *ci);

#endif
