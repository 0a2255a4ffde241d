/*
 * grammar_regex.h — internal: JSON Schema "pattern" regexes (the subset grammar.h lists) compiled
 * into grammar states. Called by schema_compile.c; stateless.
 */
#ifndef BRAID_GRAMMAR_REGEX_H
#define BRAID_GRAMMAR_REGEX_H

#include <stddef.h>

#include "grammar/grammar_nfa.h"

/* Emits the string content `pattern` matches (NUL-terminated) into rule from state `from`, as
 * plain JSON string characters. Returns the end state, or -1 with why ("pattern: ...") when the
 * pattern is outside the subset or too large. */
int grammar_regex_emit(GrammarBuilder *b, int rule, int from, const char *pattern, char *why, size_t why_len);

#endif
