/*
 * adapter_select.h — which model a completion request runs: the base model or one of the LoRA
 * adapters the server loaded (--lora), checked before the request is routed.
 *
 * A request picks an adapter with the "adapter" field or the X-Braid-Adapter header (both already
 * folded into ApiRequest.adapter by api_request_apply_headers), or, as vLLM clients do, with
 * "model" set to the adapter's name. Rules:
 *   - model absent or the served base name: the base model, unless adapter names one;
 *   - model an adapter's name: that adapter (an adapter field naming a different one is a 400);
 *   - model anything else: 404 model_not_found (the message lists what is served);
 *   - adapter naming no loaded adapter: 404 adapter_not_found.
 * On success ApiRequest.adapter holds the adapter's name (NULL for the base model) and, for an
 * adapter loaded again after an unload, ApiRequest.adapter_cache its cache name (name + generation):
 * what travels to the instance, seeds the routing hashes and namespaces the prefix cache there, so
 * a reloaded adapter never meets its predecessor's K/V (adapter_cache_name).
 * Thread-safety: pure function of its inputs (the LoraSet is read-only).
 */
#ifndef BRAID_COORD_ADAPTER_SELECT_H
#define BRAID_COORD_ADAPTER_SELECT_H

#include "coord/api/api_request.h"
#include "model/lora_adapter.h"

/* lora may be NULL (no adapters). Returns 0, or -1 with err set (400 / 404). */
int adapter_select(ApiRequest *a, const char *served_model, const LoraSet *lora, ApiError *err);
/* The name the request's K/V are kept under: adapter_cache when set, else adapter (NULL: base). */
static inline const char *adapter_cache_name(const ApiRequest *a) { return a->adapter_cache ? a->adapter_cache : a->adapter; }

#endif
