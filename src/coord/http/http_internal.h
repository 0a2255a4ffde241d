/*
 * http_internal.h — the reply helpers both halves of the HTTP front-end use. Not a public interface.
 *
 * The front-end is split one way: http_api.c (daemon, routing, the small endpoints) calls into
 * http_generate.c (the completion endpoints, http_generate.h) and never the reverse. Both write
 * their answers through the helpers below (http_internal.c), which depend on neither of them: this
 * header includes neither http_api.h nor http_generate.h, so no include or link cycle is possible.
 * Thread-safety: callable from any connection thread (they only queue a response on `conn`).
 */
#ifndef BRAID_COORD_HTTP_INTERNAL_H
#define BRAID_COORD_HTTP_INTERNAL_H

#include <microhttpd.h>

#include "coord/api/api_request.h"
#include "coord/metrics.h"

/* Queues a JSON body (takes ownership of `body`, a malloc'd string; NULL = out of memory, MHD_NO)
 * with the given status. */
enum MHD_Result http_send_json(struct MHD_Connection *conn, int status, char *body);
/* Seconds a 503 asks clients to wait: a draining server is gone by then, a loading one nearly up. */
#define HTTP_RETRY_AFTER_UNAVAILABLE_S "5"

/* Queues an OpenAI-style error (Retry-After on 429 and 503, Allow on 405, WWW-Authenticate on 401)
 * and counts it in `metrics` under `endpoint` (NULL endpoint or metrics: not counted). */
enum MHD_Result http_send_error(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e);
/* A 429 whose Retry-After says when the caller's own limit lets it in again (whole seconds, at
 * least 1), counted like http_send_error. */
enum MHD_Result http_send_rate_limited(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e,
                                       double retry_after_s);

#endif
