/*
 * unicode.h — the bits of Unicode the tokenizers need: UTF-8 decoding that never fails, and the
 * \p{L} / \p{N} / \s classes used by the BPE pre-tokenizer patterns.
 * Tables come from tools/gen_unicode_tables.py. Pure functions, thread-safe.
 */
#ifndef BRAID_MODEL_UNICODE_H
#define BRAID_MODEL_UNICODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t lo, hi;
} UnicodeRange;

extern const UnicodeRange unicode_letter_ranges[];
extern const size_t unicode_letter_ranges_count;
extern const UnicodeRange unicode_number_ranges[];
extern const size_t unicode_number_ranges_count;

typedef enum { UCLASS_LETTER, UCLASS_NUMBER, UCLASS_SPACE, UCLASS_OTHER } UnicodeClass;

UnicodeClass unicode_class(uint32_t cp);
int unicode_is_whitespace(uint32_t cp);

/* Decodes one code point from s[0..len) (len >= 1). Returns the bytes consumed (1..4). Invalid or
 * truncated sequences consume one byte and yield U+FFFD, so every byte belongs to exactly one
 * code point and byte offsets stay exact. */
int utf8_decode(const uint8_t *s, size_t len, uint32_t *cp);
/* Writes cp as UTF-8 into out (4 bytes room); returns the length. */
int utf8_encode(uint32_t cp, char *out);
/* 1 when s[0..len) is well-formed UTF-8. */
int utf8_is_valid(const char *s, size_t len);

#endif
