/*
 * directive_plan.h — turns a request's directives (api_directives.h) and cache_control pins into
 * what the instance acts on (cache/cache_directive.h): the prompt the request runs and token
 * positions, checked as a whole before anything happens (a turn's directives apply all or none).
 *
 * The prompt as sent is the cached context C. A span is token positions of C, or the n-th
 * occurrence of a text in C's bytes (the tokens' pieces concatenated: for a chat request the
 * rendered template), widened to whole tokens; the replacement is tokenized with the bytes the
 * widening took in, so the tokens outside the spans are exactly C's. Splices must not overlap and
 * must share one mode; they apply left to right and give the prompt P the request runs, with
 * `runs` naming the stretches of P that are C unchanged. Hint spans must not cut into a splice and
 * are moved to P's positions; a hint without a span covers all of P. A cache_control pin ends
 * with the last token wholly inside its message's bytes and gets index -(message + 1) so its outcome names the
 * message. Errors are 400s naming `directives[i]` (span outside the prompt, match not found,
 * overlapping splices, mixed modes, a splice that changes nothing).
 * Pure; thread-safe.
 */
#ifndef BRAID_COORD_DIRECTIVE_PLAN_H
#define BRAID_COORD_DIRECTIVE_PLAN_H

#include <stdbool.h>

#include "cache/cache_directive.h"
#include "coord/api/api_directives.h"
#include "coord/api/api_request.h"
#include "model/tokenizer.h"

typedef struct {
    size_t end_byte; /* where the message ends in the rendered prompt text (BOS not counted) */
    double ttl_s;
    int message;   /* messages[message] carried the cache_control */
} DirectivePin;

/* prompt: C (n_prompt tokens, moved: on success *prompt is P, which may be C itself); parse_special:
 * how the prompt's text was tokenized (replacements are tokenized the same way). out is filled
 * (nothing to do: left empty). 0, or -1 with e set and prompt untouched. */
int directive_plan(const Tokenizer *tok, bool parse_special, TokenList *prompt, const ApiDirective *d, int n, const DirectivePin *pins,
                   int n_pins, CacheDirectives *out, ApiError *e);

#endif
