/* Counts pre-tokenizer pieces (words, digits, punctuation runs, line breaks) and prices each. */
#include "token_estimate.h"

#include <ctype.h>
#include <string.h>

/* A word with its leading space: one token up to this many letters, then one per extra chunk. */
enum { WORD_ONE_TOKEN_LETTERS = 8, WORD_EXTRA_LETTERS_PER_TOKEN = 4 };

static int is_letter(unsigned char c) { return isalpha(c) || c >= 0x80; }

static int word_tokens(size_t letters) {
    if (letters <= WORD_ONE_TOKEN_LETTERS) return 1;
    return 1 + (int)((letters - WORD_ONE_TOKEN_LETTERS + WORD_EXTRA_LETTERS_PER_TOKEN - 1) / WORD_EXTRA_LETTERS_PER_TOKEN);
}

/* A capitalized word inside a sentence is most likely a name, and names are rarely one token. */
static int is_name(const unsigned char *s, size_t i, unsigned char prev) {
    return isupper(s[i]) && (isalnum(prev) || prev == ',' || prev == ';');
}

int token_estimate(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    int tokens = 0;
    unsigned char prev = '\n'; /* the last character that was not a space */
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        if (is_letter(s[i])) {
            while (j < len && is_letter(s[j])) j++;
            int n = word_tokens(j - i);
            tokens += is_name(s, i, prev) && n < 2 ? 2 : n;
        } else if (isdigit(s[i])) {
            j++;
            tokens++; /* numbers split into single digits */
        } else if (s[i] == ' ') {
            while (j < len && s[j] == ' ') j++;
            /* one space joins the next word; a longer run (indentation) is a token of its own */
            if (j - i > 1 || j == len || !(is_letter(s[j]) || ispunct(s[j]))) tokens++;
        } else if (isspace(s[i])) {
            while (j < len && isspace(s[j]) && s[j] != ' ') j++;
            tokens++;
        } else {
            while (j < len && ispunct(s[j]) && j - i < 3) j++;
            tokens++; /* short punctuation runs merge into one token */
        }
        if (s[j - 1] != ' ') prev = s[j - 1];
        i = j;
    }
    return tokens;
}

int token_estimate_str(const char *text) { return token_estimate(text, strlen(text)); }
