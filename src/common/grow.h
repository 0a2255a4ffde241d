/* grow.h — growing a malloc'd array to hold at least `need` elements (doubling). Thread-safe. */
#ifndef BRAID_COMMON_GROW_H
#define BRAID_COMMON_GROW_H

#include <stddef.h>

/* Returns 0 with *array holding room for need elements of elem bytes (capacity in *cap), or -1
 * when out of memory (the old array is left intact). */
int braid_grow(void **array, int *cap, int need, size_t elem);

#endif
