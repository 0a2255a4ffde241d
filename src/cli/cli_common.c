#include "cli/cli_common.h"

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *cli_model_path(const char *flag_value) {
    if (flag_value) return flag_value;
    const char *env = getenv("BRAID_MODEL");
    return env && *env ? env : BRAID_DEFAULT_MODEL;
}

int cli_set_threads(int requested) {
    int n = requested > 0 ? requested : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    return n;
}

int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "braid: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *flag, const char *text, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "braid: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

char *cli_read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) { free(buf); return NULL; }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) { free(buf); return NULL; }
    buf[n] = '\0';
    *len = n;
    return buf;
}
