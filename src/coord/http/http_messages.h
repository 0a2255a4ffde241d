/*
 * http_messages.h — the Anthropic Messages API endpoints (POST /v1/messages and
 * POST /v1/messages/count_tokens) once http_api.c has routed a request here with its whole body.
 *
 * A Messages request is parsed into the chat ApiRequest (anthropic_request.h) and from there runs
 * exactly as a chat completion does (http_generate_admit: headers, model/adapter, API key; then
 * http_choices.h: template, tool grammar, cache_control pins, submit, follow), one choice. The
 * answer is rendered by anthropic_response.h: whole, or as Anthropic's SSE event sequence
 * (message_start, ping, content_block_start / _delta / _stop per block — text first, then one
 * tool_use block per call —, message_delta with the final usage, message_stop; a ping whenever
 * nothing was sent for 10 s, as during a long prefill). count_tokens
 * renders and tokenizes the prompt as generation would and answers {"input_tokens": n}.
 * Every error is in Anthropic's shape ({"type": "error", "error": {"type", "message"}}).
 *
 * Runs on the connection's thread; never calls MPI. The context's objects are borrowed.
 */
#ifndef BRAID_COORD_HTTP_MESSAGES_H
#define BRAID_COORD_HTTP_MESSAGES_H

#include <stddef.h>

#include <microhttpd.h>

#include "coord/api/anthropic_request.h"
#include "coord/api/api_request.h"
#include "coord/auth.h"
#include "coord/http/http_generate.h"
#include "coord/metrics.h"

/* key: the request's API key, NULL when the server has none. */
enum MHD_Result http_messages(const HttpGenerateContext *ctx, struct MHD_Connection *conn, AnthropicEndpoint endpoint, const AuthKey *key,
                              const char *body, size_t len);

/* Queues e in Anthropic's error shape (Retry-After on 429 / 503, WWW-Authenticate on 401, Allow on
 * 405; retry_after: the Retry-After value, NULL for the default) and counts it in metrics under
 * endpoint (NULL: not counted). */
enum MHD_Result http_messages_send_error(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e,
                                         const char *retry_after);

/* The metrics label of an endpoint: "messages" or "messages_count_tokens". */
const char *http_messages_endpoint_label(AnthropicEndpoint endpoint);

#endif
