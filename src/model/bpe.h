/*
 * bpe.h — the merge loop shared by byte-level BPE (gpt2) and SentencePiece BPE (llama).
 *
 * Starting from initial symbols (contiguous byte ranges of `text`), repeatedly merges the adjacent
 * pair with the best priority (lowest value; leftmost on ties) until no pair is mergeable. The
 * caller's rank function decides whether a pair merges and with what priority. A heap keeps this
 * O(n log n) even for very long words.
 * Thread-safe; memory returned in *symbols is owned by the caller (free()).
 */
#ifndef BRAID_MODEL_BPE_H
#define BRAID_MODEL_BPE_H

#include <stddef.h>

typedef struct {
    size_t start, len; /* byte range of the symbol in text */
    int prev, next;    /* neighbours in the live list; -1 at the ends */
} BpeSymbol;

/* Returns 1 and sets *priority when left+right (adjacent byte ranges of text) may merge. */
typedef int (*BpeRankFn)(void *user, const char *text, size_t start, size_t left_len, size_t right_len, double *priority);

/* bounds: n_initial + 1 byte offsets delimiting the initial symbols. On success returns 0 and an
 * array of n_initial symbols in *symbols; the live ones are reached from index 0 through `next`
 * (index 0 is always live). Returns -1 when out of memory. */
int bpe_merge(const char *text, const size_t *bounds, int n_initial, BpeRankFn rank, void *user, BpeSymbol **symbols);

#endif
