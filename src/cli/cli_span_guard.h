/*
 * cli_span_guard.h — the approximate-span guard flags shared by `braid batch` and `braid serve`
 * (worker/sched_span_guard.h): --segment-probe-tokens, --segment-probe-min-cos,
 * --approx-window-deep, --approx-prefix, --segment-probe-values, --segment-min-span, --segment-tail. cli_span_guard_defaults gives the CLI's defaults (guards on);
 * cli_span_guard_parse handles one of the flags (by name) and returns 0, or 2 after printing why.
 */
#ifndef BRAID_CLI_SPAN_GUARD_H
#define BRAID_CLI_SPAN_GUARD_H

#include "worker/sched_span_guard.h"

/* The CLI's --approx-prefix default (cli_span_guard_defaults). */
#define CLI_APPROX_PREFIX_DEFAULT "on"
/* The CLI's span-shape defaults (issue 35, chosen from the drift table in bench/RESULTS.md). */
#define CLI_MIN_SPAN_DEFAULT 0
#define CLI_TAIL_DEFAULT 0
#define CLI_STR_(x) #x
#define CLI_STR(x) CLI_STR_(x)

#define CLI_SPAN_GUARD_USAGE                                                                                         \
    "  --segment-probe-tokens K approx mode: before reusing a span, recompute its first K tokens with the true\n"  \
    "                           left context and compare their keys with the cached ones per layer; reject the\n"   \
    "                           span (recompute it) when a layer's mean cosine is below --segment-probe-min-cos\n" \
    "                           (default 4; 0 = no probe)\n"                                                        \
    "  --segment-probe-min-cos C least per-layer mean key cosine a probed span needs (default 0.99)\n"            \
    "  --approx-window-deep W   depth-aware window: the top layer needs W matching tokens before a reused token\n" \
    "                           (the bottom one --approx-window), so each approximate span's first W - window\n"   \
    "                           tokens are recomputed (default 0 = off)\n"                                       \
    "  --approx-prefix on|off   approx mode: take approximate K/V earlier requests committed, through the prefix\n" \
    "                           cache (on), or match only up to the first approximate block and compute from\n"  \
    "                           there, so each approximate span a request carries is its own, probed (off)\n"   \
    "                           (default " CLI_APPROX_PREFIX_DEFAULT ")\n"                                            \
    "  --segment-probe-values on|off  the probe also compares the values per layer (default off)\n"            \
    "  --segment-min-span N     approx mode: compute approximate spans shorter than N tokens whole (default\n"     \
    "                           " CLI_STR(CLI_MIN_SPAN_DEFAULT) "; 0 = any length)\n"                                                    \
    "  --segment-tail N         approx mode: recompute the last N tokens of each reused approximate span, so\n"  \
    "                           what follows attends to exact K/V there (default " CLI_STR(CLI_TAIL_DEFAULT) ")\n"                    \
    "  --segment-probe-tokens all (diagnostic) probe every approximate span whole: nothing is reused; the\n"     \
    "                           --events file gets a probe_layers line per span (per-layer K/V cosines)\n"

#define CLI_SPAN_GUARD_OPTIONS(code_tokens, code_cos, code_deep, code_prefix, code_values, code_min_span, code_tail)  \
    {"segment-probe-tokens", required_argument, 0, code_tokens}, {"segment-probe-min-cos", required_argument, 0, code_cos}, \
        {"approx-window-deep", required_argument, 0, code_deep}, {"approx-prefix", required_argument, 0, code_prefix},     \
        {"segment-probe-values", required_argument, 0, code_values},                                                     \
        {"segment-min-span", required_argument, 0, code_min_span}, {"segment-tail", required_argument, 0, code_tail}

SpanGuardConfig cli_span_guard_defaults(void);
int cli_span_guard_parse(const char *flag, const char *text, SpanGuardConfig *g);

#endif
