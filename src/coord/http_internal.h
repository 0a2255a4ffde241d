/*
 * http_internal.h — what http_api.c (daemon, routing, small endpoints) and http_generate.c (the
 * completion endpoints) share. Not a public interface.
 */
#ifndef BRAID_COORD_HTTP_INTERNAL_H
#define BRAID_COORD_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>

#include "coord/api_request.h"
#include "coord/http_api.h"

struct HttpApi {
    HttpApiConfig cfg;
    struct MHD_Daemon *daemon;
    pthread_mutex_t mu;
    int open_requests; /* requests whose response is not completely sent yet */
};

/* Queues a JSON body (takes ownership of `body`, a malloc'd string) with the given status. */
enum MHD_Result http_send_json(struct MHD_Connection *conn, int status, char *body);
/* Queues an OpenAI-style error and counts it in the metrics under `endpoint` (NULL: not counted). */
enum MHD_Result http_send_error(HttpApi *api, struct MHD_Connection *conn, const char *endpoint, const ApiError *e);
/* POST /v1/chat/completions and /v1/completions once the whole body is in. */
enum MHD_Result http_generate(HttpApi *api, struct MHD_Connection *conn, ApiKind kind, const char *body, size_t len);

#endif
