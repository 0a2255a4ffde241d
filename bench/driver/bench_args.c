/* Option values; the contract is in bench_args.h. */
#include "bench_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bench_parse_int(const char *cmd, const char *flag, const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "braid-bench %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int bench_parse_float(const char *cmd, const char *flag, const char *text, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "braid-bench %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int bench_parse_on_off(const char *cmd, const char *flag, const char *text, int *on) {
    if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0) {
        fprintf(stderr, "braid-bench %s: %s expects on or off, got '%s'\n", cmd, flag, text);
        return -1;
    }
    *on = strcmp(text, "on") == 0;
    return 0;
}
