/*
 * cli_span_guard.h — the approximate-span guard flags shared by `braid batch` and `braid serve`
 * (worker/sched_span_guard.h): --segment-probe-tokens, --segment-probe-min-cos,
 * --approx-window-deep. cli_span_guard_defaults gives the CLI's defaults (guards on);
 * cli_span_guard_parse handles one of the flags (by name) and returns 0, or 2 after printing why.
 */
#ifndef BRAID_CLI_SPAN_GUARD_H
#define BRAID_CLI_SPAN_GUARD_H

#include "worker/sched_span_guard.h"

#define CLI_SPAN_GUARD_USAGE                                                                                         \
    "  --segment-probe-tokens K approx mode: before reusing a span, recompute its first K tokens with the true\n"  \
    "                           left context and compare their keys with the cached ones per layer; reject the\n"   \
    "                           span (recompute it) when a layer's mean cosine is below --segment-probe-min-cos\n" \
    "                           (default 4; 0 = no probe)\n"                                                        \
    "  --segment-probe-min-cos C least per-layer mean key cosine a probed span needs (default 0.99)\n"            \
    "  --approx-window-deep W   depth-aware window: the top layer needs W matching tokens before a reused token\n" \
    "                           (the bottom one --approx-window), so each approximate span's first W - window\n"   \
    "                           tokens are recomputed (default 0 = off)\n"

#define CLI_SPAN_GUARD_OPTIONS(code_tokens, code_cos, code_deep)                                                     \
    {"segment-probe-tokens", required_argument, 0, code_tokens}, {"segment-probe-min-cos", required_argument, 0, code_cos}, \
        {"approx-window-deep", required_argument, 0, code_deep}

SpanGuardConfig cli_span_guard_defaults(void);
int cli_span_guard_parse(const char *flag, const char *text, SpanGuardConfig *g);

#endif
