/* Reply helpers shared by the HTTP front-end's two halves (see http_internal.h). */
#include "coord/http_internal.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result http_send_json(struct MHD_Connection *conn, int status, char *body) {
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result http_send_error(Metrics *metrics, struct MHD_Connection *conn, const char *endpoint, const ApiError *e) {
    if (endpoint && metrics) metrics_record_request(metrics, endpoint, e->status, 0, -1, 0, 0, 0);
    char *body = api_error_json(e);
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (e->status == 429) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (e->status == 405) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, POST");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)e->status, resp);
    MHD_destroy_response(resp);
    return rc;
}
