/*
 * bench_list_arg.h — the comma-separated positive numbers the standalone micro-benchmarks take as
 * arguments ("16,64,256"). Header-only: each benchmark is one program.
 */
#ifndef BRAID_BENCH_LIST_ARG_H
#define BRAID_BENCH_LIST_ARG_H

#include <stdlib.h>

#define BENCH_LIST_MAX 8

/* Parses up to BENCH_LIST_MAX positive integers into out; their count, or -1 on a malformed list. */
static inline int bench_parse_list(const char *s, long *out) {
    int n = 0;
    for (char *end; *s && n < BENCH_LIST_MAX; s = *end ? end + 1 : end) {
        out[n] = strtol(s, &end, 10);
        if (end == s || out[n] <= 0) return -1;
        n++;
    }
    return n;
}

#endif
