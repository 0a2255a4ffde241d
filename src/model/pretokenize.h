/*
 * pretokenize.h — splits text into the words that byte-level BPE merges within, following the
 * pre-tokenizer a GGUF file names in tokenizer.ggml.pre. Each splitter is a hand-written matcher
 * equivalent to the regular expression it is named after (leftmost alternative first, greedy, with
 * the (?!\S) lookahead), so no regex engine is needed.
 *   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   smollm  every \p{N} code point is its own word, the rest split as gpt2
 *   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *           \s*[\r\n]+|\s+(?!\S)|\s+
 *   qwen2   llama3 with single digits: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (Qwen2, Qwen2.5, Qwen3)
 * Pure functions, thread-safe.
 */
#ifndef BRAID_MODEL_PRETOKENIZE_H
#define BRAID_MODEL_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PRETOKENIZER_GPT2, PRETOKENIZER_SMOLLM, PRETOKENIZER_LLAMA3, PRETOKENIZER_QWEN2 } PreTokenizerKind;

/* Maps a tokenizer.ggml.pre name to a splitter; returns -1 for names Braid does not know. */
int pretokenizer_from_name(const char *name, PreTokenizerKind *kind);
const char *pretokenizer_name(PreTokenizerKind kind);

/* Called for each word, as a byte range of the input. Returns 0 to go on, non-zero to stop. */
typedef int (*PretokenizeWordFn)(void *user, const char *word, size_t len);

/* Splits text[0..len) into words; returns the callback's first non-zero result, or 0. */
int pretokenize(PreTokenizerKind kind, const char *text, size_t len, PretokenizeWordFn fn, void *user);

#endif
