/*
 * text_gen.h — seeded English-like filler text for prompts, tool outputs and synthetic model
 * outputs: sentences built from word lists (not random bytes), so a real tokenizer gives token
 * counts like those of real text. Sizes are in estimated tokens (token_estimate.h).
 *
 * Every function appends to a caller-owned StrBuf (out-of-memory is the StrBuf's sticky flag) and
 * draws only from the caller's WlRng, so the same generator state gives the same text.
 * Stateless otherwise; the word lists are constant tables.
 */
#ifndef BRAID_BENCH_WORKLOADS_TEXT_GEN_H
#define BRAID_BENCH_WORKLOADS_TEXT_GEN_H

#include "strbuf.h"
#include "wl_rng.h"

typedef enum {
    TEXT_PROSE,        /* explanatory paragraphs */
    TEXT_CODE,         /* Python-like functions */
    TEXT_FINANCE,      /* filing prose with figures and small tables */
    TEXT_ENCYCLOPEDIA, /* article prose with names, places and years */
    TEXT_LOG           /* tool / test output lines */
} TextStyle;

typedef enum {
    WORD_NOUN,
    WORD_VERB,
    WORD_ADJECTIVE,
    WORD_ADVERB,
    WORD_PLACE,
    WORD_SURNAME,
    WORD_FIRST_NAME,
    WORD_TECH
} WordClass;

/* Appends about `tokens` estimated tokens of text, ending at a sentence or line boundary (at least
 * one unit — paragraph, function, table row block, log line — when tokens > 0). */
void text_gen(StrBuf *out, WlRng *r, TextStyle style, int tokens);
/* One sentence of prose, capitalized and ending with a period. */
void text_gen_sentence(StrBuf *out, WlRng *r);
/* A question sentence ending with '?'. */
void text_gen_question(StrBuf *out, WlRng *r);
/* A few capitalized words: "Adaptive Harbor Ledger". */
void text_gen_title(StrBuf *out, WlRng *r, int words);
/* snake_case identifier of 1–3 words. */
void text_gen_identifier(StrBuf *out, WlRng *r);
/* "Marta Okafor" */
void text_gen_person(StrBuf *out, WlRng *r);
const char *text_gen_word(WlRng *r, WordClass cls);

#endif
