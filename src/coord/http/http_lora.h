/*
 * http_lora.h — LoRA adapters at run time, vLLM's endpoints and bodies:
 *
 *   POST /v1/load_lora_adapter    {"lora_name": "NAME", "lora_path": "/path/adapter.gguf"}
 *   POST /v1/unload_lora_adapter  {"lora_name": "NAME"}
 *
 * Success is 200 with a short plain-text line, as vLLM answers ("Success: LoRA adapter 'NAME' added
 * successfully."). Who may call: with --api-keys, a key whose line says `admin` (others 403, no key
 * 401); without keys, nobody unless braid serve ran with --allow-runtime-lora (403 otherwise), so an
 * open server never loads files on a stranger's say-so.
 *
 * Load: the coordinator loads the file itself first (the same checks as --lora at start-up: a bad
 * path or a malformed file is a 400 naming the file and the problem, sent to no instance), then every
 * live instance's leader loads it (coordinator_lora); only when all of them did is the name
 * registered here, so /v1/models lists it and requests may name it, on every instance at once. If an
 * instance refuses (say the CUDA backend, or a rank above the --lora-cache shared residual pool's),
 * the adapter is unloaded from those that took it and the answer is a 400 naming the instance and
 * its reason. A name already loaded is a 409. A name unloaded earlier loads again as its next
 * generation (model/lora_adapter.h lora_cache_name): its K/V live in a namespace of their own, so
 * nothing the old weights computed can serve it. Names holding a control character are refused
 * (400), which keeps cache names (name, separator, generation) apart from every adapter name.
 * Unload: 404 for a name not loaded; 409 while requests of the adapter are in flight (refused, not
 * waited for: retry when they are done). Every instance then drops the adapter's cache namespaces
 * at once (worker/leader_lora.h): its pins end and its blocks are freed. Instances restarted later
 * get every loaded run-time adapter again before they take requests (coord/lora_roster.h).
 * Every error is OpenAI-shaped JSON. Runs on the connection's thread (blocking on the instances'
 * answers, at most HTTP_LORA_TIMEOUT_S); one load or unload at a time.
 */
#ifndef BRAID_COORD_HTTP_LORA_H
#define BRAID_COORD_HTTP_LORA_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

#include "coord/api/api_request.h"
#include "coord/auth.h"
#include "coord/coordinator.h"
#include "coord/metrics.h"
#include "model/lora_adapter.h"

#define HTTP_LORA_TIMEOUT_S 60.0
#define HTTP_LORA_MAX_NAME 256
#define HTTP_LORA_MAX_PATH 4096

typedef struct {
    Coordinator *coord;
    LoraSet *set;             /* the coordinator's adapters (adapter_select and /v1/models read it) */
    const ModelConfig *base;  /* what a file is checked against */
    const char *served_model; /* an adapter may not take the base model's name */
    const AuthKeys *keys;     /* NULL: no keys */
    bool allow_open;          /* --allow-runtime-lora: without keys, anyone may call */
    Metrics *metrics;
} HttpLoraConfig;

typedef struct HttpLora HttpLora;

HttpLora *http_lora_create(const HttpLoraConfig *cfg);
void http_lora_destroy(HttpLora *h);

/* Whether url is one of the two endpoints (http_api.c's route() hands those here). */
bool http_lora_path(const char *url);

/* Parses a load (unload = false) or unload body into name / path (path unused on unload). -1 with
 * e set to a 400 for a body that is not a JSON object, lacks lora_name (or lora_path on load), has
 * them of the wrong type, empty, too long, or with control characters. Pure. */
int http_lora_parse(const char *body, size_t len, bool unload, char name[HTTP_LORA_MAX_NAME + 1],
                    char path[HTTP_LORA_MAX_PATH + 1], ApiError *e);

/* 0 when the caller may load / unload: with keys, `key` (already authenticated) says admin; without
 * keys, allow_open (--allow-runtime-lora). Otherwise -1 with e set to a 403 saying what is needed. Pure. */
int http_lora_check_caller(const AuthKeys *keys, const AuthKey *key, bool allow_open, ApiError *e);

/* key: the authenticated key (NULL without keys); body NULL or too_large when it did not fit. */
enum MHD_Result http_lora(HttpLora *h, struct MHD_Connection *conn, const char *method, const char *url, const AuthKey *key,
                          const char *body, size_t len, bool too_large, size_t max_body_bytes);

#endif
