/*
 * api_request.h — parses and validates the body of an OpenAI-compatible chat or completion request.
 *
 * Owns: the translation of an untrusted HTTP body (and the X-Braid-* headers) into an ApiRequest,
 * and OpenAI's error shape for everything a client can get wrong. Every problem becomes an ApiError
 * with an HTTP status (400 for a malformed or out-of-range field, 404 for a model this server does
 * not serve) and a message naming the field and what was wrong. No field is silently ignored: every
 * top-level field is either honoured, accepted only at the value that changes nothing (a
 * frequency_penalty of 0, echo false, ...), or a 400 naming it (unknown fields); `user` is accepted
 * as the opaque end-user label it is in OpenAI's API. Tools, tool_choice and response_format are
 * read by api_tools.h. Inside a message role, content, name, tool_calls and tool_call_id are read,
 * and any other non-null field is a 400 naming it.
 * Invalid UTF-8 is rejected by the JSON parser, so every string in an ApiRequest is valid UTF-8
 * without embedded NULs. The body-size limit (413) is the HTTP layer's job, not this module's.
 *
 * Called by: the coordinator's HTTP front-end (http_generate.c) on its request threads, and by the
 * unit tests and the fuzz target.
 *
 * Thread-safety: no shared state; any thread may call any function, on its own ApiRequest/ApiError.
 *
 * Memory: every string in an ApiRequest is malloc'd and owned by it; api_request_free releases them.
 * When api_request_parse fails, *out is left zeroed: there is nothing to free (freeing it anyway is
 * harmless). api_error_json returns a malloc'd string the caller frees. err must not be NULL.
 */
#ifndef BRAID_COORD_API_REQUEST_H
#define BRAID_COORD_API_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Limits a request body must respect (exported so the tests and docs can quote them). */
#define API_MAX_MESSAGES 4096     /* chat turns in one request */
#define API_MAX_STOPS 4           /* stop strings, as in OpenAI */
#define API_MAX_LABEL_BYTES 256   /* workflow_id, agent, tenant, adapter */
#define API_MAX_TOKENS_LIMIT (1 << 24) /* far above any context; keeps prompt + max_tokens inside an int */
#define API_MAX_N 16              /* choices per prompt (n) */
#define API_MAX_PROMPTS 64        /* prompts in one completion request (a list of prompts) */
#define API_MAX_CHOICES 64        /* n x prompts */
#define API_MAX_TOP_LOGPROBS 20   /* top_logprobs (chat) / logprobs (completions), as OpenAI and vLLM */

typedef enum { API_CHAT = 0, API_COMPLETION = 1 } ApiKind;

typedef struct {
    char *role;    /* one of system, developer, user, assistant, tool */
    char *content; /* never NULL: a null assistant content reads as "" */
    bool content_null;  /* the client sent no content (an assistant turn that only called tools) */
    double cache_ttl_s; /* cache_control on the message or one of its parts: pin through it for this long; 0 = none */
    /* Tool calling (api_tools.h): an assistant turn's calls, normalized to [{id, type: "function",
     * function: {name, arguments}}] with arguments parsed into a JSON object, as chat templates read
     * them (a reference the message owns, NULL when none); a tool turn's tool_call_id; the optional
     * participant / function name. */
    json_t *tool_calls;
    char *tool_call_id, *name;
} ApiMessage;

/* tool_choice: what the model may do with the request's tools. */
typedef enum { API_TOOL_CHOICE_NONE = 0, API_TOOL_CHOICE_AUTO, API_TOOL_CHOICE_REQUIRED, API_TOOL_CHOICE_NAMED } ApiToolChoice;

/* response_format: free text, any JSON object, or JSON following a schema. */
typedef enum { API_FORMAT_TEXT = 0, API_FORMAT_JSON_OBJECT, API_FORMAT_JSON_SCHEMA } ApiResponseFormat;

/* One completion prompt: text, or token ids (then text is NULL). Ids are only checked to be
 * non-negative here; the caller checks them against its vocabulary. */
typedef struct {
    char *text;
    int32_t *ids;
    int n_ids;
} ApiPrompt;

struct ApiDirective; /* api_directives.h */

typedef struct {
    ApiKind kind;
    char *model;                 /* NULL when absent */
    ApiMessage *messages;        /* chat only: n_messages >= 1 entries */
    int n_messages;
    ApiPrompt *prompts;          /* completions only: n_prompts >= 1 after a successful parse */
    int n_prompts;
    int n;                       /* choices per prompt, 1..API_MAX_N */
    int logprobs;                /* -1: no logprobs; else how many top alternatives each token lists (0..20) */
    int max_tokens;              /* -1 when absent (max_tokens or max_completion_tokens) */
    double temperature, top_p;   /* OpenAI's defaults: 1 and 1 */
    int top_k;                   /* 0 = off (extension) */
    bool has_seed;
    uint64_t seed;               /* a negative JSON seed is stored as its two's-complement bits */
    char **stop;                 /* at most API_MAX_STOPS non-empty strings */
    int n_stop;
    bool stream, include_usage;  /* include_usage from stream_options.include_usage */
    bool ignore_eos;             /* extension, default false */
    int segment_reuse;           /* extension: -1 absent, else 0 off, 1 exact, 2 approx (kv_cache.h SegmentReuseMode) */
    char *workflow_id, *agent, *tenant, *adapter; /* Braid extensions, NULL when absent */
    /* The adapter's cache name when it is a reloaded one (generation > 1; model/lora_adapter.h
     * lora_cache_name), set by adapter_select; NULL: the cache name is `adapter` itself. */
    char *adapter_cache;
    /* Leyline (api_directives.h): the conversation whose turns share spliced K/V (NULL: the
     * workflow is it); auto_splice: -1 absent, else a CacheSpliceMode the server plans itself. */
    char *conversation_id;
    int auto_splice;
    /* OpenAI's cache parameters: prompt_cache_key routes requests of one key (per tenant) to the
     * instance holding its cache (cache_key_affinity.h); prompt_cache_retention_s: 0 = "in_memory"
     * (or absent), else "24h" in seconds: the prompt is pinned that long (http_directives.c).
     * cache_id: an explicit cache (explicit_caches.h) the request starts from. NULL when absent. */
    char *prompt_cache_key;
    double prompt_cache_retention_s;
    char *cache_id;
    struct ApiDirective *directives; /* cache directives (api_directives.h), n_directives of them */
    int n_directives;
    /* Tools and structured outputs (chat only; api_tools.h). tools: the validated OpenAI tools array
     * (a reference the request owns), NULL when none; tool_choice defaults to auto with tools and
     * none without; tool_choice_name: the function a named tool_choice forces. response_schema: the
     * json_schema's schema (a reference), NULL unless response_format is json_schema. */
    json_t *tools;
    ApiToolChoice tool_choice;
    char *tool_choice_name;
    bool parallel_tool_calls;    /* default true */
    ApiResponseFormat response_format;
    json_t *response_schema;
} ApiRequest;

/* The directive index of prompt_cache_retention's pin (cache_retention.h): its outcome is reported
 * with "source": "prompt_cache_retention" rather than a directive's index. */
#define API_RETENTION_OUTCOME_INDEX (-1000000)

typedef struct {
    int status;          /* HTTP status: 400, 404, 413, 422, 429, 5xx ... */
    char type[48];       /* OpenAI error type: "invalid_request_error", "rate_limit_error", "server_error" */
    char param[64];      /* offending field, "" if none */
    char code[48];       /* "model_not_found", "context_length_exceeded", "" if none */
    char message[320];   /* says exactly what is wrong */
} ApiError;

/* Parses and validates a request body of the given kind. served_model: the name the server answers
 * to; a "model" naming anything else is a 404 model_not_found (NULL accepts any model).
 * Returns 0, or -1 with err filled and *out zeroed. */
int api_request_parse(const char *body, size_t len, ApiKind kind, const char *served_model, ApiRequest *out, ApiError *err);

/* Frees every string the request owns and zeroes it. NULL and zeroed requests are fine. */
void api_request_free(ApiRequest *r);

/* Fills err with a printf-style message; the type follows from the status (429 rate_limit_error,
 * 5xx server_error, any other invalid_request_error). param and code may be NULL. Returns -1, so
 * callers can write `return api_error_set(...)`. */
int api_error_set(ApiError *err, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* {"error":{"message":...,"type":...,"param":...|null,"code":...|null}} as a malloc'd string (caller
 * frees); NULL only when out of memory. Bytes that are not valid UTF-8 (a message may quote a URL
 * or be cut mid-character) are replaced with '?', so the result is always valid JSON. */
char *api_error_json(const ApiError *err);

/* Applies the X-Braid-Workflow / -Agent / -Tenant / -Adapter header values (NULL = header absent)
 * to the fields the body left unset. Every value given is checked: one that is empty, over
 * API_MAX_LABEL_BYTES, not valid UTF-8 or holding a control character is a 400, and so is a header
 * that names a different value from the body's field (the same value twice is fine); then r is left
 * unchanged. Returns 0 or -1. */
int api_request_apply_headers(ApiRequest *r, const char *workflow, const char *agent, const char *tenant, const char *adapter,
                              ApiError *err);

/* The label check the body and the headers get, for a label from elsewhere (a workflow id in a URL
 * path, already percent-decoded): 1..API_MAX_LABEL_BYTES bytes of valid UTF-8 without control
 * characters, else a 400 naming param (what: how the message names the source). 0 or -1. */
int api_request_check_label(const char *param, const char *what, const char *s, size_t n, ApiError *err);

/* The seed the request samples with: its `seed` when it gave one (so it reproduces), else a fresh
 * draw from the OS's entropy (getrandom) mixed with `salt`, which the caller makes distinct per
 * request (a server-wide counter), so that concurrent unseeded requests never share a seed.
 * Thread-safe. */
uint64_t api_request_sampling_seed(const ApiRequest *r, uint64_t salt);

#endif
