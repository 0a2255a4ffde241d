/* Summary statistics; the contract is in stats.h. */
#include "stats.h"

#include <stdlib.h>
#include <string.h>

double stats_mean(const double *x, int n) {
    if (n <= 0) return 0;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    return sum / n;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double stats_percentile(const double *x, int n, double p) {
    if (n <= 0) return 0;
    double *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return 0;
    memcpy(sorted, x, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_doubles);
    double rank = p / 100.0 * (n - 1);
    int lo = (int)rank;
    if (lo >= n - 1) lo = n - 1;
    double frac = rank - lo, v = lo + 1 < n ? sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]) : sorted[lo];
    free(sorted);
    return v;
}
