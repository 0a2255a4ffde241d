/*
 * http_generate.h — the completion endpoints (POST /v1/chat/completions, POST /v1/completions)
 * once http_api.c has routed a request here with its whole body.
 *
 * Dependencies run one way: http_api.c includes this header and calls http_generate(); this half
 * knows nothing of the daemon or of http_api.h. What it needs of the server is the context below,
 * which http_api.c fills from its configuration; replies go through http_internal.h.
 * Per request: parse and validate (4xx), template + tokenize each prompt once (token-id prompts are
 * checked against the vocabulary), build one coordinator request per choice (prompts x n) with the
 * prompt's chained block hashes for the router (content_hash_namespace(tenant, adapter)), submit
 * them — a prompt's first choice alone, its siblings pinned to the same instance once its prefill
 * is done, so they reuse its cached prompt blocks — then answer whole or as SSE (choice after
 * choice), with OpenAI logprobs objects when asked (api_logprobs.h). Runs on the connection's thread; never calls MPI. The context's objects
 * are borrowed and must outlive every connection.
 * With an API key (auth.h) the request runs in the key's tenant: a body or header tenant is allowed
 * only when it is that tenant or one the key shares (403 otherwise), and an adapter only when the
 * key lists it (403). The request runs the base model or a loaded LoRA adapter (adapter_select.h:
 * an unknown adapter or model is a 404). Without a seed, a request samples with a fresh seed of its own.
 */
#ifndef BRAID_COORD_HTTP_GENERATE_H
#define BRAID_COORD_HTTP_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "coord/adapter_select.h"
#include "coord/api/api_request.h"
#include "coord/auth.h"
#include "coord/coordinator.h"
#include "coord/manifest_recorder.h"
#include "coord/metrics.h"
#include "model/model.h"

typedef struct {
    Coordinator *coord;
    Metrics *metrics;
    const BraidModel *model;
    const char *served_model; /* the base model's id */
    const LoraSet *lora;      /* adapters a request may name (coord/adapter_select.h); NULL = none */
    _Atomic uint64_t *seed_counter; /* per server: salts each unseeded request's seed */
    int segment_reuse;        /* the most segment reuse a request may ask for (SegmentReuseMode) */
    ManifestRecorder *manifest; /* counts each submitted prompt's chunks; NULL = off */
    struct AutoSpliceStore *auto_splice; /* conversations' recent prompts (auto_splice.h); NULL = off */
    struct ExplicitCaches *caches; /* POST /v1/caches' registry (explicit_caches.h): what "cache_id" names; NULL = none */
} HttpGenerateContext;

/* key: the request's API key, NULL when the server has none. */
enum MHD_Result http_generate(const HttpGenerateContext *ctx, struct MHD_Connection *conn, ApiKind kind, const AuthKey *key,
                              const char *body, size_t len);
/* What every dialect's endpoint does between parsing a chat request and building its choices: the
 * X-Braid-* headers, the model / adapter choice (adapter_select.h) and the API key's tenant and
 * permissions (see above). 0, or -1 with e (4xx). */
int http_generate_admit(const HttpGenerateContext *ctx, struct MHD_Connection *conn, const AuthKey *key, ApiRequest *a, ApiError *e);
/* Whether the client of a whole (non-streamed) answer has closed its socket meanwhile. */
bool http_generate_client_gone(struct MHD_Connection *conn);
/* The most tokens one request (prompt + max_tokens) may reach: the model's context, or the smallest
 * instance's KV pool when that holds less (the context until the instances are up). */
int http_generate_max_model_len(const HttpGenerateContext *ctx);

#endif
