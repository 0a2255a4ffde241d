/*
 * grammar_tokens.h — a model's vocabulary as the grammar module sees it (grammar/grammar.h).
 *
 * Each token's bytes come from the tokenizer (byte-level BPE and SentencePiece alike, through
 * tokenizer_token_bytes); its kind: EOS / end-of-turn tokens (the tokenizer's stop ids) are END,
 * other control tokens and unused / unknown ones are NEVER (never produced inside a constrained
 * output), everything else (normal, byte and user-defined tokens such as "<tool_call>") is TEXT and
 * matched by its bytes.
 * Owns nothing; the returned vocabulary is the caller's (grammar_vocab_free). Thread-safe.
 */
#ifndef BRAID_WORKER_GRAMMAR_TOKENS_H
#define BRAID_WORKER_GRAMMAR_TOKENS_H

#include "common/error.h"
#include "grammar/grammar.h"
#include "model/tokenizer.h"

GrammarVocab *grammar_vocab_from_tokenizer(const Tokenizer *tok, BraidError *err);

#endif
