/*
 * cli_span_guard.c — parsing of the approximate-span guard flags (cli_span_guard.h).
 */
#include "cli/cli_span_guard.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli_common.h"

SpanGuardConfig cli_span_guard_defaults(void) {
    return (SpanGuardConfig){.probe_tokens = SPAN_GUARD_DEFAULT_PROBE_TOKENS, .min_cos = SPAN_GUARD_DEFAULT_MIN_COS,
                             .no_approx_prefix = strcmp(CLI_APPROX_PREFIX_DEFAULT, "off") == 0,
                             .min_span = CLI_MIN_SPAN_DEFAULT, .tail_tokens = CLI_TAIL_DEFAULT};
}

int cli_span_guard_parse(const char *flag, const char *text, SpanGuardConfig *g) {
    long v;
    double d;
    if (strcmp(flag, "segment-probe-tokens") == 0) {
        g->probe_whole = strcmp(text, "all") == 0;
        if (g->probe_whole) return 0;
        if (cli_parse_int("--segment-probe-tokens", text, 0, 256, &v)) return 2;
        g->probe_tokens = (int)v;
    } else if (strcmp(flag, "segment-probe-min-cos") == 0) {
        if (cli_parse_float("--segment-probe-min-cos", text, -1, 1, &d)) return 2;
        g->min_cos = d;
    } else if (strcmp(flag, "approx-window-deep") == 0) {
        if (cli_parse_int("--approx-window-deep", text, 0, 1 << 20, &v)) return 2;
        g->deep_window = (int)v;
    } else if (strcmp(flag, "approx-prefix") == 0) {
        if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0) {
            fprintf(stderr, "--approx-prefix expects on or off, got '%s'\n", text);
            return 2;
        }
        g->no_approx_prefix = strcmp(text, "off") == 0;
    } else if (strcmp(flag, "segment-probe-values") == 0) {
        if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0) {
            fprintf(stderr, "--segment-probe-values expects on or off, got '%s'\n", text);
            return 2;
        }
        g->probe_values = strcmp(text, "on") == 0;
    } else if (strcmp(flag, "segment-min-span") == 0) {
        if (cli_parse_int("--segment-min-span", text, 0, 1 << 20, &v)) return 2;
        g->min_span = (int)v;
    } else if (strcmp(flag, "segment-tail") == 0) {
        if (cli_parse_int("--segment-tail", text, 0, 1 << 20, &v)) return 2;
        g->tail_tokens = (int)v;
    }
    return 0;
}
