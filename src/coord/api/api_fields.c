/* The top-level field audit; the contract is in api_fields.h. */
#include "coord/api/api_fields.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* How a field is treated. */
typedef enum {
    FIELD_READ,     /* api_request.c reads and honours it */
    FIELD_NEUTRAL,  /* accepted only at a value that changes nothing; `neutral` says which */
    FIELD_REFUSED,  /* never honoured: any non-null value is a 400 */
} FieldTreatment;

/* Whether v is the one value of a field that changes nothing. */
typedef bool (*NeutralTest)(const json_t *v, const json_t *body);

typedef struct {
    const char *name;
    unsigned kinds;      /* 1 << ApiKind bits: the endpoints the field belongs to */
    FieldTreatment treatment;
    NeutralTest neutral;
    const char *why;     /* the 400's explanation (what Braid supports instead) */
} FieldRule;

#define CHAT (1u << API_CHAT)
#define COMPLETION (1u << API_COMPLETION)
#define BOTH (CHAT | COMPLETION)

static bool is_zero(const json_t *v, const json_t *body) { return (void)body, json_is_number(v) && json_number_value(v) == 0.0; }
static bool is_one(const json_t *v, const json_t *body) { return (void)body, json_is_number(v) && json_number_value(v) == 1.0; }
static bool is_false(const json_t *v, const json_t *body) { return (void)body, json_is_false(v); }
static bool is_empty_object(const json_t *v, const json_t *body) { return (void)body, json_is_object(v) && json_object_size(v) == 0; }
static bool is_empty_string(const json_t *v, const json_t *body) { return (void)body, json_is_string(v) && json_string_length(v) == 0; }
static bool is_string(const json_t *v, const json_t *body) { return (void)body, json_is_string(v); }

/* best_of = n: one choice per sequence is what Braid does anyway. */
static bool is_best_of_n(const json_t *v, const json_t *body) {
    const json_t *n = json_object_get(body, "n");
    json_int_t want = json_is_integer(n) ? json_integer_value(n) : 1;
    return json_is_integer(v) && json_integer_value(v) == want;
}

static const FieldRule rules[] = {
    {"model", BOTH, FIELD_READ, NULL, NULL},
    {"messages", CHAT, FIELD_READ, NULL, NULL},
    {"prompt", COMPLETION, FIELD_READ, NULL, NULL},
    {"max_tokens", BOTH, FIELD_READ, NULL, NULL},
    {"max_completion_tokens", BOTH, FIELD_READ, NULL, NULL},
    {"temperature", BOTH, FIELD_READ, NULL, NULL},
    {"top_p", BOTH, FIELD_READ, NULL, NULL},
    {"top_k", BOTH, FIELD_READ, NULL, NULL},
    {"seed", BOTH, FIELD_READ, NULL, NULL},
    {"n", BOTH, FIELD_READ, NULL, NULL},
    {"stream", BOTH, FIELD_READ, NULL, NULL},
    {"stream_options", BOTH, FIELD_READ, NULL, NULL},
    {"stop", BOTH, FIELD_READ, NULL, NULL},
    {"ignore_eos", BOTH, FIELD_READ, NULL, NULL},
    {"logprobs", BOTH, FIELD_READ, NULL, NULL},
    {"top_logprobs", CHAT, FIELD_READ, NULL, NULL},
    {"workflow_id", BOTH, FIELD_READ, NULL, NULL},
    {"agent", BOTH, FIELD_READ, NULL, NULL},
    {"tenant", BOTH, FIELD_READ, NULL, NULL},
    {"adapter", BOTH, FIELD_READ, NULL, NULL},
    {"segment_reuse", BOTH, FIELD_READ, NULL, NULL},
    {"directives", BOTH, FIELD_READ, NULL, NULL},
    {"conversation_id", BOTH, FIELD_READ, NULL, NULL},
    {"auto_splice", BOTH, FIELD_READ, NULL, NULL},
    {"prompt_cache_key", BOTH, FIELD_READ, NULL, NULL},
    {"prompt_cache_retention", BOTH, FIELD_READ, NULL, NULL},
    {"cache_id", BOTH, FIELD_READ, NULL, NULL},
    {"user", BOTH, FIELD_NEUTRAL, is_string, "user must be a string"},
    {"frequency_penalty", BOTH, FIELD_NEUTRAL, is_zero, "frequency_penalty is not supported; only 0 is accepted"},
    {"presence_penalty", BOTH, FIELD_NEUTRAL, is_zero, "presence_penalty is not supported; only 0 is accepted"},
    {"repetition_penalty", BOTH, FIELD_NEUTRAL, is_one, "repetition_penalty is not supported; only 1 is accepted"},
    {"logit_bias", BOTH, FIELD_NEUTRAL, is_empty_object, "logit_bias is not supported; only an empty object is accepted"},
    {"response_format", CHAT, FIELD_READ, NULL, NULL},
    {"tool_choice", CHAT, FIELD_READ, NULL, NULL},
    {"parallel_tool_calls", CHAT, FIELD_READ, NULL, NULL},
    {"tools", CHAT, FIELD_READ, NULL, NULL},
    {"functions", CHAT, FIELD_REFUSED, NULL, "functions (deprecated by OpenAI) is not supported; send tools instead"},
    {"function_call", CHAT, FIELD_REFUSED, NULL, "function_call (deprecated by OpenAI) is not supported; send tool_choice instead"},
    {"echo", COMPLETION, FIELD_NEUTRAL, is_false, "echo is not supported; only false is accepted"},
    {"suffix", COMPLETION, FIELD_NEUTRAL, is_empty_string, "suffix is not supported; only an empty suffix is accepted"},
    {"best_of", COMPLETION, FIELD_NEUTRAL, is_best_of_n, "best_of is not supported; only best_of equal to n is accepted"},
};

static const FieldRule *find_rule(const char *name) {
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (strcmp(rules[i].name, name) == 0) return &rules[i];
    return NULL;
}

/* Field names come from the client: quote at most this much, cut at a character boundary. */
static int quoted_name_len(const char *name) {
    size_t n = strnlen(name, 65);
    if (n <= 64) return (int)n;
    n = 64;
    while (n > 0 && ((unsigned char)name[n] & 0xC0) == 0x80) n--;
    return (int)n;
}

static int check_field(const char *name, const json_t *v, const json_t *body, ApiKind kind, ApiError *err) {
    const FieldRule *rule = find_rule(name);
    char param[64];
    snprintf(param, sizeof param, "%.*s", quoted_name_len(name), name);
    if (!rule || !(rule->kinds & (1u << kind)))
        return api_error_set(err, 400, param, NULL, "unknown field '%s' for %s; Braid refuses fields it does not honour", param,
                             kind == API_CHAT ? "a chat completion" : "a completion");
    if (rule->treatment == FIELD_READ || json_is_null(v)) return 0; /* null reads as absent, as in OpenAI's API */
    if (rule->treatment == FIELD_NEUTRAL && rule->neutral(v, body)) return 0;
    return api_error_set(err, 400, param, NULL, "%s", rule->why);
}

int api_fields_check(const json_t *body, ApiKind kind, ApiError *err) {
    const char *name;
    const json_t *v;
    json_object_foreach((json_t *)body, name, v)
        if (check_field(name, v, body, kind, err)) return -1;
    return 0;
}
