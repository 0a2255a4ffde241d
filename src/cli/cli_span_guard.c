/*
 * cli_span_guard.c — parsing of the approximate-span guard flags (cli_span_guard.h).
 */
#include "cli/cli_span_guard.h"

#include <string.h>

#include "cli/cli_common.h"

SpanGuardConfig cli_span_guard_defaults(void) {
    return (SpanGuardConfig){.probe_tokens = SPAN_GUARD_DEFAULT_PROBE_TOKENS, .min_cos = SPAN_GUARD_DEFAULT_MIN_COS};
}

int cli_span_guard_parse(const char *flag, const char *text, SpanGuardConfig *g) {
    long v;
    double d;
    if (strcmp(flag, "segment-probe-tokens") == 0) {
        if (cli_parse_int("--segment-probe-tokens", text, 0, 256, &v)) return 2;
        g->probe_tokens = (int)v;
    } else if (strcmp(flag, "segment-probe-min-cos") == 0) {
        if (cli_parse_float("--segment-probe-min-cos", text, -1, 1, &d)) return 2;
        g->min_cos = d;
    } else if (strcmp(flag, "approx-window-deep") == 0) {
        if (cli_parse_int("--approx-window-deep", text, 0, 1 << 20, &v)) return 2;
        g->deep_window = (int)v;
    }
    return 0;
}
