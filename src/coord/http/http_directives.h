/*
 * http_directives.h — a completion request's cache directives and cache_control markers, planned
 * against one of its prompts (directive_plan.h) on the HTTP thread before the request is built.
 * A chat message's cache_control pins the prompt through that message: its end is found by
 * rendering the messages up to it and taking the bytes the rendering shares with the whole prompt.
 * At most API_MAX_CACHE_CONTROL markers (Anthropic allows four breakpoints).
 * With auto_splice (and no splice of the client's) the server plans a splice of its own against
 * the conversation's recent prompts (auto_splice.h). out->conversation is the request's
 * conversation_id scope (cache_conversation_scope; 0 without one).
 */
#ifndef BRAID_COORD_HTTP_DIRECTIVES_H
#define BRAID_COORD_HTTP_DIRECTIVES_H

#include "cache/cache_directive.h"
#include "coord/api/api_request.h"
#include "coord/http/http_generate.h"
#include "model/tokenizer.h"

#define API_MAX_CACHE_CONTROL 4

/* ids: the prompt's tokens (replaced by the prompt the request runs when it has splices). out is
 * left empty when the request has neither directives nor cache_control. 0, or -1 with e (4xx/503). */
int http_plan_directives(const HttpGenerateContext *ctx, const ApiRequest *a, TokenList *ids, CacheDirectives *out, ApiError *e);

#endif
