/*
 * http_manifest.h — GET /v1/cache/manifest: the coordinator's hot chunks as a JSONL manifest
 * (manifest_line.h), most counted first.
 *
 * Query: min_count=N (default 1: every recorded chunk; N must be a positive integer, else 400) and,
 * without API keys, tenant=NAME to keep one tenant's lines ("" = requests that named none). With
 * API keys a key sees only its own tenant's lines (tenant isolation: the chunks are other tenants'
 * prompt text); a tenant= naming another tenant is a 403. Answered as application/x-ndjson.
 * Called by http_api.c on the connection's thread, after it authenticated the request; recorder
 * NULL (recording off) is a 404 saying how to turn it on.
 */
#ifndef BRAID_COORD_HTTP_MANIFEST_H
#define BRAID_COORD_HTTP_MANIFEST_H

#include <microhttpd.h>

#include "coord/auth.h"
#include "coord/manifest_recorder.h"
#include "coord/metrics.h"

/* key: the request's API key, NULL when the server has none. */
enum MHD_Result http_manifest(struct MHD_Connection *conn, ManifestRecorder *recorder, const AuthKey *key, Metrics *metrics);

#endif
