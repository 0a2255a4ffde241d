/*
 * token_canon.h — canonical token classes for near-duplicate indexing (paper 003 § 3.1
 * "Canonicalization for indexing only"): each token id mapped to the smallest id whose text is the
 * same after lowercasing ASCII letters and trimming whitespace (ASCII blanks and the tokenizers'
 * space/newline markers: GPT-2 byte-level "Ġ" "Ċ" "ĉ", SentencePiece "▁"); every token whose
 * trimmed text is all ASCII digits is one class (numbers, ids and timestamps masked). Control,
 * user-defined, unknown and byte tokens keep their own class. The map is only ever used to build
 * index keys (segment_lsh.h): reused K/V always belong to the original ids.
 * Pure: reads the tokenizer, allocates the map.
 */
#ifndef BRAID_MODEL_TOKEN_CANON_H
#define BRAID_MODEL_TOKEN_CANON_H

#include <stdint.h>

#include "common/error.h"
#include "model/tokenizer.h"

/* *out (tok->n_vocab entries, free with free) gets each id's class. 0, or -1 when out of memory. */
int token_canon_build(const Tokenizer *tok, int32_t **out, BraidError *err);

#endif
