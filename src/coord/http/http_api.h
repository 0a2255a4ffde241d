/*
 * http_api.h — the coordinator's HTTP front-end: the OpenAI-compatible API plus Braid's endpoints.
 *
 *   POST /v1/chat/completions, POST /v1/completions   (stream or not; usage with cached tokens)
 *   POST /v1/workflows/{id}/end                        (a workflow finished: its cache may retire)
 *   GET  /v1/models, GET /health, GET /metrics
 *   GET  /v1/cache/manifest                            (hot chunks as a JSONL manifest, http_manifest.h)
 *   POST/GET /v1/caches, GET/PATCH/DELETE /v1/caches/{id}  (explicit caches, http_caches.h)
 * Each connection gets its own thread (libmicrohttpd thread-per-connection), which parses and
 * validates the body (api_request.h; every problem is a 4xx with an OpenAI-style error JSON),
 * applies the chat template, tokenizes, submits to the coordinator and then waits for tokens,
 * writing them as SSE events when streaming. A streaming client that disconnects cancels its
 * request. HTTP threads never call MPI.
 * Inside: http_api.c routes and serves the small endpoints, and hands the completion endpoints to
 * http_generate.h; both reply through http_internal.h. The dependency runs one way (this half
 * includes http_generate.h, never the reverse), so neither header includes the other back.
 * API keys (auth.h): with `keys` set, every endpoint but GET /health needs `Authorization: Bearer
 * KEY` (401 with an OpenAI-style error otherwise; /metrics too, since it shows every tenant's
 * traffic), and the key decides the request's tenant (http_generate.h). Without keys anyone who can
 * reach the port may use the API and name any tenant.
 * Protocol rules enforced here, each answered with a JSON error: request headers over
 * HTTP_MAX_HEADER_BYTES in total → 431; a completion body whose Content-Type is not application/json
 * → 415 (no Content-Type at all is read as JSON); every 503 and 429 carries Retry-After; a body over
 * max_body_bytes → 413, at once and unread when the client sent Expect: 100-continue (otherwise
 * after reading it: closing on a client still sending would reset the answer away).
 * Connections: the listening socket is the front door's (http_front_door.h), which bounds and times
 * out connections that have not sent their request line, answers a malformed one with a JSON
 * 400/505/414, and hands the rest to libmicrohttpd (MHD_add_connection), whose own per-client and
 * total connection limits and idle timeout apply from then on (HttpApiConfig). What libmicrohttpd
 * still answers itself stays its own (HTML) answer: headers too large for its per-connection memory
 * (HTTP_CONNECTION_MEMORY bytes, a few times HTTP_MAX_HEADER_BYTES) → 431.
 * TLS: with a certificate and key the port speaks HTTPS only (libmicrohttpd over GnuTLS).
 * Owns the daemon; borrows the coordinator, metrics, model, keys and PEM text, which must outlive it.
 */
#ifndef BRAID_COORD_HTTP_API_H
#define BRAID_COORD_HTTP_API_H

#include <stddef.h>

#include "common/error.h"
#include "coord/auth.h"
#include "coord/coordinator.h"
#include "coord/manifest_recorder.h"
#include "coord/metrics.h"
#include "model/lora_adapter.h"
#include "model/model.h"

typedef struct {
    Coordinator *coord;
    Metrics *metrics;
    const BraidModel *model;
    const char *served_model; /* the base model's name: /v1/models lists it, then each adapter */
    const LoraSet *lora;      /* the LoRA adapters the instances loaded (borrowed); NULL = none */
    const char *host;         /* bind address, e.g. "127.0.0.1" or "0.0.0.0" */
    int port;
    size_t max_body_bytes;
    const AuthKeys *keys;     /* NULL: no API keys (anyone may call, tenants are self-declared) */
    bool allow_runtime_lora;  /* --allow-runtime-lora: without keys, anyone may load/unload adapters (http_lora.h) */
    double cache_create_rate; /* --cache-create-rate: explicit-cache prefills per tenant per second (explicit_caches.h); 0 = no limit */
    const char *state_dir;    /* --state-dir: the explicit-cache registry persists there (explicit_caches.h); NULL = memory only */
    const char *tls_cert_pem, *tls_key_pem; /* both set: HTTPS only (PEM text, borrowed); both NULL: plain HTTP */
    int segment_reuse;        /* --segment-reuse: the most a request may ask for (SegmentReuseMode; 0 = off) */
    ManifestRecorder *manifest; /* counts every submitted prompt's chunks (borrowed); NULL = recording off */
    /* Connection bounds (0 = the default in brackets). A client is an IP address. Connections still
     * before their request line are the front door's (http_front_door.h): at most
     * max_connections_per_client [64] per client and max_connections [1024] in all, oldest closed
     * first, each given timeout_s [10] to send its request line. Past it, libmicrohttpd holds at most
     * max_connections_per_client x 4 [256] per client and max_connections x 2 [2048] in all, and
     * closes one that stays idle for timeout_s x 3 [30] while sending headers or body, or between
     * requests (never while its answer is being generated). */
    int max_connections, max_connections_per_client;
    int timeout_s;
} HttpApiConfig;

#define HTTP_MAX_HEADER_BYTES (32 * 1024)     /* request line and headers, total; more gets 431 */
#define HTTP_CONNECTION_MEMORY (512 * 1024)   /* libmicrohttpd's per-connection buffer (holds the headers) */

typedef struct HttpApi HttpApi;

HttpApi *http_api_start(const HttpApiConfig *cfg, BraidError *err);
/* Waits up to timeout_s for every response in progress to be completely sent (the drain's last
 * step: requests have finished, their answers may still be on the way). Returns how many remain. */
int http_api_quiesce(HttpApi *api, double timeout_s);
/* Stops accepting and waits for every connection thread to end. */
/* Any thread, idempotent (a drain's first signal; http_api_stop too): closes the listening
 * socket, so new connections are refused at once; connections already accepted are served (a
 * draining coordinator answers their new requests 503). */
void http_api_stop_accepting(HttpApi *api);
void http_api_stop(HttpApi *api);

#endif
