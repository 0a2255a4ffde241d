/* GET /v1/cache/manifest (contract in http_manifest.h). */
#include "coord/http/http_manifest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coord/http/http_internal.h"

/* min_count from the query: absent = 1; else a positive integer. */
static int parse_min_count(struct MHD_Connection *conn, long long *min_count, ApiError *e) {
    const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "min_count");
    *min_count = 1;
    if (!v) return 0;
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < 1)
        return api_error_set(e, 400, "min_count", NULL, "min_count must be a positive integer, got '%.32s'", v);
    *min_count = n;
    return 0;
}

/* Whose lines the caller may see: the key's tenant with keys, else the tenant= filter (or all). */
static int resolve_tenant(struct MHD_Connection *conn, const AuthKey *key, const char **tenant, ApiError *e) {
    const char *asked = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "tenant");
    *tenant = asked;
    /* A name no request could carry (invalid UTF-8, control characters, over-long) is a 400, as in a
     * body or header, not an empty 200 that reads as "nothing cached". */
    if (asked && api_request_check_label("tenant", "the query parameter tenant", asked, strlen(asked), e)) return -1;
    if (!key) return 0;
    *tenant = auth_key_tenant(key);
    if (asked && strcmp(asked, *tenant) != 0)
        return api_error_set(e, 403, "tenant", "tenant_not_allowed",
                             "this API key belongs to tenant '%s' and may read only its own manifest", *tenant);
    return 0;
}

enum MHD_Result http_manifest(struct MHD_Connection *conn, ManifestRecorder *recorder, const AuthKey *key, Metrics *metrics) {
    ApiError e;
    long long min_count;
    const char *tenant;
    if (!recorder) {
        api_error_set(&e, 404, NULL, NULL, "manifest recording is off on this server (start it with --manifest-capacity N > 0)");
        return http_send_error(metrics, conn, NULL, &e);
    }
    if (parse_min_count(conn, &min_count, &e) || resolve_tenant(conn, key, &tenant, &e)) return http_send_error(metrics, conn, NULL, &e);
    char *body = manifest_recorder_export(recorder, min_count, tenant);
    if (!body) {
        api_error_set(&e, 503, NULL, NULL, "the server is out of memory");
        return http_send_error(metrics, conn, NULL, &e);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-ndjson");
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}
