/* Bounded string copy; the contract is in text_copy.h. */
#include "text_copy.h"

#include <string.h>

void text_copy(char *dst, size_t cap, const char *src) {
    if (cap == 0) return;
    size_t n = src ? strnlen(src, cap - 1) : 0;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}
