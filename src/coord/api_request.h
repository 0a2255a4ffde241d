/*
 * api_request.h — parses and validates the body of an OpenAI chat or completion request.
 *
 * Every problem a client can cause becomes an ApiError with an HTTP status (400 for malformed or
 * out-of-range fields, 404 for an unknown model) and a message naming the field and what was
 * wrong, in OpenAI's error shape. Unknown fields are ignored, as OpenAI-compatible servers do
 * (clients send frequency_penalty, user, logprobs, ...). Invalid UTF-8 is rejected by the JSON
 * parser itself. The HTTP layer enforces the body size (413) before calling here.
 * Memory: every string in an ApiRequest is malloc'd and freed by api_request_free; on failure
 * nothing is left to free. Thread-safety: pure functions; any thread.
 */
#ifndef BRAID_COORD_API_REQUEST_H
#define BRAID_COORD_API_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { API_CHAT = 0, API_COMPLETION = 1 } ApiKind;

typedef struct {
    char *role;
    char *content;
} ApiMessage;

typedef struct {
    ApiKind kind;
    char *model;                 /* NULL when absent */
    ApiMessage *messages;        /* chat only */
    int n_messages;
    char *prompt;                /* completions only */
    int max_tokens;              /* -1 when absent (max_tokens or max_completion_tokens) */
    double temperature, top_p;   /* OpenAI's defaults: 1 and 1 */
    int top_k;                   /* 0 = off (extension) */
    bool has_seed;
    uint64_t seed;
    char **stop;                 /* at most 4 non-empty strings */
    int n_stop;
    bool stream, include_usage;
    bool ignore_eos;             /* extension */
    char *workflow_id, *agent, *tenant, *adapter; /* Braid extensions, NULL when absent */
} ApiRequest;

typedef struct {
    int status;          /* HTTP status */
    char type[48];       /* "invalid_request_error", "server_error", ... */
    char param[64];      /* offending field, "" if none */
    char code[48];       /* "model_not_found", "context_length_exceeded", "" if none */
    char message[320];
} ApiError;

int api_request_parse(const char *body, size_t len, ApiKind kind, const char *served_model, ApiRequest *out, ApiError *err);
void api_request_free(ApiRequest *r);
/* Fills err (type from the status: 4xx invalid_request_error / rate_limit, 5xx server_error); returns -1. */
int api_error_set(ApiError *err, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error":{"message","type","param","code"}} as a malloc'd string (caller frees); NULL when out of memory. */
char *api_error_json(const ApiError *err);
/* X-Braid-Workflow / -Agent / -Tenant / -Adapter header values (NULL = absent) fill the fields the
 * body left unset. A value that is empty, over 256 bytes or has control characters is a 400. */
int api_request_apply_headers(ApiRequest *r, const char *workflow, const char *agent, const char *tenant, const char *adapter,
                              ApiError *err);

#endif
