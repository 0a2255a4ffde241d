/* Reply helpers shared by the HTTP front-end's two halves (see http_internal.h). */
#include "coord/http/http_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Queues body (malloc'd, freed here in every case) as a JSON response with up to one extra header. */
static enum MHD_Result queue_json(struct MHD_Connection *conn, int status, char *body, const char *header, const char *value) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (header) MHD_add_response_header(resp, header, value);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result http_send_json(struct MHD_Connection *conn, int status, char *body) { return queue_json(conn, status, body, NULL, NULL); }

enum MHD_Result http_send_error(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e) {
    if (endpoint && metrics) metrics_record_request(metrics, endpoint, e->status, 0, -1, 0, 0, 0);
    /* 429 and 503 (full queue; loading, draining or out of memory) say when to come back, 405 what is
     * allowed, 401 which credentials are expected. */
    const char *header = NULL, *value = NULL;
    switch (e->status) {
    case 429: header = MHD_HTTP_HEADER_RETRY_AFTER, value = "1"; break;
    case 503: header = MHD_HTTP_HEADER_RETRY_AFTER, value = HTTP_RETRY_AFTER_UNAVAILABLE_S; break;
    case 405: header = MHD_HTTP_HEADER_ALLOW, value = "GET, POST"; break;
    case 401: header = MHD_HTTP_HEADER_WWW_AUTHENTICATE, value = "Bearer"; break;
    }
    return queue_json(conn, e->status, api_error_json(e), header, value);
}

enum MHD_Result http_send_rate_limited(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e,
                                       double retry_after_s) {
    if (endpoint && metrics) metrics_record_request(metrics, endpoint, 429, 0, -1, 0, 0, 0);
    char retry[32];
    snprintf(retry, sizeof retry, "%.0f", ceil(retry_after_s > 1 ? retry_after_s : 1));
    return queue_json(conn, 429, api_error_json(e), MHD_HTTP_HEADER_RETRY_AFTER, retry);
}
