/*
 * grammar.h — structured outputs: a grammar spec (JSON Schema + literals) compiled to a grammar,
 * matched byte by byte, and turned into a per-step mask over a model's vocabulary.
 *
 * A grammar spec is a JSON text:
 *   {"schema": <JSON Schema object, or true = any JSON value>,
 *    "prefix": "literal before the value" (default ""), "suffix": "literal after it" (default ""),
 *    "min_items": 1, "max_items": 1 (at most GRAMMAR_MAX_ITEMS), "separator": "literal between items" (default ""),
 *    "trigger": "optional literal"}
 * The constrained output is (prefix value suffix) repeated min_items..max_items times, joined by
 * separator. Once it is complete only end-of-generation tokens may follow. With "trigger", the text
 * is free until the trigger's bytes appear; from there the grammar applies: when prefix starts with
 * the trigger, the trigger counts as the start of the first prefix (the rest of it must follow);
 * otherwise the first prefix is skipped and the value follows the trigger directly. Repetitions
 * after the first always need their full prefix.
 *
 * JSON Schema subset (anything else is refused, naming the keyword and where it is):
 *   type (object, array, string, number, integer, boolean, null, or a list of them), properties,
 *   required, additionalProperties (false, true or a schema), enum, const, items (schema or false),
 *   prefixItems, minItems/maxItems, minLength/maxLength, pattern (regex subset below), anyOf and
 *   oneOf (both as anyOf), allOf with one element, $ref to "#", "#/$defs/NAME" or
 *   "#/definitions/NAME" (recursion allowed; output nesting is bounded by GRAMMAR_MAX_DEPTH),
 *   $defs/definitions; ignored annotations: description, title, default, examples, $schema, $id,
 *   $comment, deprecated, readOnly, writeOnly, strict. format: date, time, date-time, uuid and
 *   ipv4 are enforced as patterns; any other format is an annotation (not enforced), as JSON
 *   Schema validators treat format by default.
 * Choices made for generated output:
 *   - objects with "properties" emit them in the schema's order, required ones always and optional
 *     ones possibly skipped; additionalProperties defaults to false there (only listed properties:
 *     what strict structured outputs mean). An object without "properties" takes any keys unless
 *     additionalProperties is false. Extra keys (additionalProperties true/schema) come after the
 *     listed ones and are not checked against the listed names.
 *   - whitespace between JSON tokens is bounded: none, one space, or a newline followed by at most
 *     GRAMMAR_MAX_INDENT spaces, so a model can never loop on whitespace; numbers are bounded too
 *     (an integer part of at most 20 digits, a fraction of at most 20, an exponent of at most 3).
 *   - strings are UTF-8; escapes \" \\ \/ \b \f \n \r \t \uXXXX are allowed except in
 *     pattern-constrained strings, whose characters are all plain (a pattern's '"', '\\' and control
 *     characters can therefore never be produced). minLength/maxLength count characters (an escape
 *     is one character); maxLength above GRAMMAR_MAX_STRING_UNROLL is refused.
 *   - a value position may open at most GRAMMAR_MAX_ALTERNATIVES alternatives at once: an enum's
 *     values, or an anyOf/oneOf's branches summed (an enum inside a branch counts its values, also
 *     through $ref); more is refused, since the matcher would exceed its bounded closure mid-output.
 *   - pattern: a regex subset — literals, escapes (\d \w \s \D \W \S and escaped punctuation), '.',
 *     classes [..] with ranges and negation (ASCII members; a negated class also takes any non-ASCII
 *     character), groups (..) and (?:..), '|', quantifiers * + ? {n} {n,} {n,m}; '^' / '$' only at
 *     the ends (an unanchored side may have any text); no lookaround, backreferences or lazy
 *     quantifiers. Not combinable with minLength/maxLength.
 *
 * Token masks: a GrammarVocab holds a model vocabulary (each token's bytes and kind) in a trie,
 * built once and shared read-only by every matcher. A GrammarMatcher follows one sequence: a set of
 * pushdown stacks over the grammar's rules. grammar_matcher_fill_mask() sets bit t of the mask when
 * token t keeps the output a valid prefix: for each live stack the tokens that stay inside its top
 * rule are cached per grammar state on first use (context-independent, as in XGrammar), and only
 * tokens that finish the top rule are checked against the rest of the stack. TEXT tokens are
 * matched by their bytes (user-defined tokens like "<tool_call>" by their text); NEVER tokens
 * (control tokens) are never allowed; END tokens (EOS, end of turn) only when the output is
 * complete (or before a lazy grammar's trigger).
 *
 * Ownership: grammar_compile returns a Grammar the caller frees with grammar_free; a matcher
 * borrows its Grammar and GrammarVocab (both must outlive it) unless made by
 * grammar_matcher_create_from_spec, which owns the Grammar it compiled.
 * Thread-safety: Grammar and GrammarVocab are read-only once made and may be shared across threads;
 * a matcher belongs to one thread. No global state.
 * Errors: every failing call returns -1 or NULL and writes a message to why (why_len > 0).
 */
#ifndef BRAID_GRAMMAR_GRAMMAR_H
#define BRAID_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_SPEC_MAX_BYTES (1u << 20) /* longest spec text accepted */
#define GRAMMAR_MAX_ITEMS 64              /* most repetitions (max_items) */
#define GRAMMAR_MAX_DEPTH 128             /* deepest rule nesting of one output (recursive schemas) */
#define GRAMMAR_MAX_INDENT 32             /* most spaces after a newline between JSON tokens */
#define GRAMMAR_MAX_STRING_UNROLL 2000    /* largest minLength / maxLength / minItems / maxItems */
#define GRAMMAR_MAX_ALTERNATIVES 4096     /* most alternatives at one value position (enum values, anyOf/oneOf branches) */

typedef struct Grammar Grammar;
typedef struct GrammarVocab GrammarVocab;
typedef struct GrammarMatcher GrammarMatcher;

/* Validates a spec without a vocabulary (the coordinator answers 400s with it). Returns 0, or -1
 * with why naming the offending place and keyword, e.g. "schema.properties.a: keyword
 * 'patternProperties' is not supported". Paths start at "schema" (or the spec field's name). */
int grammar_spec_check(const char *spec_json, size_t len, char *why, size_t why_len);
/* Compiles a spec; NULL with why on a bad spec or one past the size limits. */
Grammar *grammar_compile(const char *spec_json, size_t len, char *why, size_t why_len);
void grammar_free(Grammar *g);

/* The spec for an OpenAI response_format object: {"type":"json_object"} -> {"schema":{"type":"object"}};
 * {"type":"json_schema","json_schema":{"name":..,"schema":S,"strict":..}} -> {"schema":S};
 * {"type":"text"} -> NULL with *why empty (unconstrained). Returns a malloc'd NUL-terminated spec, or
 * NULL with why set when the object is malformed (the schema itself is checked by grammar_compile). */
char *grammar_spec_from_response_format(const char *json, size_t len, char *why, size_t why_len);

typedef enum {
    GRAMMAR_TOKEN_TEXT = 0,  /* matched by its bytes */
    GRAMMAR_TOKEN_NEVER = 1, /* never allowed while constrained (control tokens, empty tokens) */
    GRAMMAR_TOKEN_END = 2    /* ends generation: allowed only when the output is complete */
} GrammarTokenKind;

/* A vocabulary of n tokens: bytes[i] (lens[i] bytes, not NUL-terminated) and kinds[i]. Copies what
 * it needs. */
GrammarVocab *grammar_vocab_create(int n, const char *const *bytes, const uint32_t *lens, const uint8_t *kinds, char *why,
                                   size_t why_len);
void grammar_vocab_free(GrammarVocab *v);
int grammar_vocab_size(const GrammarVocab *v);
/* 32-bit words of a mask over n tokens: bit t of word t / 32 is token t. */
static inline int grammar_mask_words(int n_vocab) { return (n_vocab + 31) / 32; }

/* A matcher at the start of the output. vocab may be NULL (only accept_bytes then). */
GrammarMatcher *grammar_matcher_create(const Grammar *g, const GrammarVocab *vocab, char *why, size_t why_len);
/* Compiles spec and makes a matcher that owns the compiled grammar. */
GrammarMatcher *grammar_matcher_create_from_spec(const char *spec_json, size_t len, const GrammarVocab *vocab, char *why,
                                                 size_t why_len);
void grammar_matcher_free(GrammarMatcher *m);

/* A cache of compiled grammars for one thread of control (an engine): requests with the same spec
 * text compile once and share one mask cache, so each grammar state's token walk is paid once,
 * not once per request. Holds up to `capacity` grammars; the least recently used one no matcher
 * holds is dropped for a new one (with all held, the new one goes uncached). Matchers may outlive
 * grammar_cache_free (the last one frees what is left); not thread-safe: the cache and all its
 * matchers belong to one thread (they share mutable caches). */
typedef struct GrammarCache GrammarCache;
GrammarCache *grammar_cache_create(const GrammarVocab *vocab, int capacity);
void grammar_cache_free(GrammarCache *c);
/* A matcher for spec (compiled on a miss); NULL with why when the spec does not compile. */
GrammarMatcher *grammar_cache_matcher(GrammarCache *c, const char *spec_json, size_t len, char *why, size_t why_len);
/* Advances by one token. Returns 0, or -1 (state unchanged) when the token is not allowed; an END
 * token is allowed only when complete (the matcher then accepts nothing more). */
int grammar_matcher_accept_token(GrammarMatcher *m, int32_t token);
/* Advances by raw bytes (tests, forced text). Returns 0, or -1 (state unchanged) when rejected. */
int grammar_matcher_accept_bytes(GrammarMatcher *m, const char *bytes, size_t len);
/* Whether accept_bytes(bytes) would succeed now; the state never changes (tests, verification). */
bool grammar_matcher_would_accept(GrammarMatcher *m, const char *bytes, size_t len);
/* Fills mask (grammar_mask_words(vocab size) words) with the tokens allowed next. Returns how many
 * are allowed (0 means nothing can continue: the caller ends the sequence with an error), or -1
 * with grammar_matcher_error() set on an internal limit (more than 8192 parse alternatives at
 * once). Nesting past GRAMMAR_MAX_DEPTH is simply not allowed (those tokens are masked out). */
int grammar_matcher_fill_mask(GrammarMatcher *m, uint32_t *mask);
/* The output so far is a complete match (end-of-generation may come now). */
bool grammar_matcher_is_complete(const GrammarMatcher *m);
/* Complete, and nothing but end-of-generation can follow (the caller may stop right away). */
bool grammar_matcher_is_terminated(const GrammarMatcher *m);
const char *grammar_matcher_error(const GrammarMatcher *m);

#endif
