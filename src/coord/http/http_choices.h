/*
 * http_choices.h — the choices of one completion request: one coordinator request per choice
 * (prompts x n), how they are submitted, and what the HTTP thread has seen of each.
 *
 * Building: every prompt is templated / tokenized once (a token-id prompt is checked against the
 * vocabulary: 400), max_tokens is fitted to the context and the KV pool, and each choice gets its
 * own CoordRequest (a copy of the prompt's ids, its block hashes for the router, its seed: seed + i
 * for a seeded request, a fresh draw otherwise). Submitting shares each prompt's KV (n > 1): the
 * prompt's first choice goes alone; once its prefill is done its full prompt blocks are in the
 * instance's prefix cache and its siblings are pinned to that instance, where they match them.
 * Following: a choice copies its request's tokens (and logprobs) under the request's lock, decodes
 * them into text with stop strings (text_stream.h), and renders OpenAI logprobs (api_logprobs.h).
 * Usage counts each prompt once, as its first choice saw it, and every choice's completion tokens.
 *
 * Called by http_generate.c on the connection's thread (or its stream's callbacks). A ChoiceSet
 * owns its choices and their request references; choices_free releases them.
 */
#ifndef BRAID_COORD_HTTP_CHOICES_H
#define BRAID_COORD_HTTP_CHOICES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "coord/api/tool_parse.h"
#include "coord/api/api_logprobs.h"
#include "coord/api/api_request.h"
#include "coord/api/api_response.h"
#include "coord/coord_request.h"
#include "coord/http/http_generate.h"
#include "coord/text_stream.h"

/* What the HTTP thread has seen of a request. */
typedef struct {
    int n_tokens;
    bool finished;
} Progress;

/* One choice: its own sequence on an instance, and what the HTTP thread has made of its tokens. */
typedef struct {
    int index;               /* OpenAI's choice index: prompt * n + j */
    CoordRequest *r;
    bool submitted;
    TextStream ts;
    int32_t *tokens;         /* copies of r's tokens (and logprobs), taken under its lock */
    TokenLogprob *logprobs;
    int cap;
    Progress progress;
    LogprobCursor lp;
    ToolParse parse;         /* with tools: the answer split into content and calls, once done */
    bool parsed;
} Choice;

typedef struct {
    Choice *c;
    int n, per_prompt;       /* n = prompts x per_prompt */
    bool tools;              /* the model is offered tools: answers are parsed for calls (tool_parse.h) */
    ToolSyntax syntax;       /* the served template's tool syntax */
    int max_calls;
} ChoiceSet;

/* Builds every choice of the request (nothing submitted yet). 0, or -1 with e set (4xx / 503);
 * what was built stays in set for choices_free. */
int choices_build(const HttpGenerateContext *ctx, const ApiRequest *a, ChoiceSet *set, ApiError *e);
/* Submits them (siblings after their first choice's prefill; blocks the caller meanwhile). 0, or
 * -1 with e set (429 queue full, 503 draining); submitted ones are then cancelled by choices_free. */
int choices_submit(const HttpGenerateContext *ctx, ChoiceSet *set, ApiError *e);
/* Releases every choice; cancel: cancel the submitted ones first (the client is gone or failed). */
void choices_free(const HttpGenerateContext *ctx, ChoiceSet *set, bool cancel);
/* Cancels every choice and waits for each FINISH (a client that left a whole answer). */
void choices_cancel_all(const HttpGenerateContext *ctx, ChoiceSet *set);

/* Waits (at most about a second) for the choice's next tokens and takes them into its text
 * (always_decode: also when no stop string needs checking, for streaming); a stop string cancels
 * the rest of the choice. */
void choice_advance(const HttpGenerateContext *ctx, const ApiRequest *a, Choice *c, bool always_decode);
bool choice_done(const Choice *c);
/* Whether the choice failed, with its error copied into error (cap bytes) and the HTTP status to
 * answer in *status (503 when its instance died, else 500). */
bool choice_failed(const Choice *c, char *error, size_t cap, int *status);
/* "stop", "length", or "tool_calls" when the answer made calls (after choice_tool_parse). */
const char *choice_finish_reason(const Choice *c);
/* With tools, once the choice is done: its answer split into content and calls (parsed once; NULL
 * when the set has no tools or out of memory). */
const ToolParse *choice_tool_parse(const ChoiceSet *set, Choice *c);
/* With tools, while streaming: how many bytes of the choice's text may go out as content now. */
size_t choice_tool_streamable(const ChoiceSet *set, const Choice *c);
/* While streaming: the next piece of the choice's text the client may have, marked taken (*len 0
 * when nothing new): all that is ready, or with tools only what cannot belong to a call. */
const char *choice_take_text(const ChoiceSet *set, Choice *c, size_t *len);
/* The logprobs object for the choice's tokens whose text starts before text_limit, after those
 * already rendered; NULL when the request asked for none. */
json_t *choice_logprobs(const HttpGenerateContext *ctx, const ApiRequest *a, Choice *c, size_t text_limit);

ApiUsage choices_usage(const ChoiceSet *set);
/* One line in the request metrics for the whole request (answered: it got its answer), and one
 * generation per choice on the instance that ran it for the vLLM-named families (metrics.h). */
void choices_record_metrics(const HttpGenerateContext *ctx, const char *endpoint, const ChoiceSet *set, int status, bool answered);

#endif
