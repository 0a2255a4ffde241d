/* text_copy.h — bounded copy of a C string into a fixed-size field (cut at cap - 1 bytes, always
 * terminated); for error messages and labels whose sources may be longer. Stateless; any thread. */
#ifndef BRAID_BENCH_DRIVER_TEXT_COPY_H
#define BRAID_BENCH_DRIVER_TEXT_COPY_H

#include <stddef.h>

void text_copy(char *dst, size_t cap, const char *src);

#endif
