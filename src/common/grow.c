#include "common/grow.h"

#include <stdlib.h>

int braid_grow(void **array, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*array, (size_t)cap2 * elem);
    if (!p) return -1;
    *array = p;
    *cap = cap2;
    return 0;
}
