/*
 * api_fields.h — which top-level fields of an OpenAI request Braid honours, and the 400 for the rest.
 *
 * The rule (issue 22): a field Braid does not honour is a 400 naming it, never silently ignored.
 * Each known field is one of: read by api_request.c (honoured); accepted only at the value that
 * changes nothing (frequency_penalty 0, logit_bias {}, echo false, suffix "", best_of equal to n,
 * ...), any other value a 400 saying what is supported; or refused outright (functions and
 * function_call, OpenAI's deprecated forms of tools / tool_choice, which are read). Any field not in
 * the table is a 400 "unknown field".
 * `user` is accepted: in OpenAI's API it is an opaque end-user label with no effect on the output.
 *
 * Thread-safety: pure; any thread.
 */
#ifndef BRAID_COORD_API_FIELDS_H
#define BRAID_COORD_API_FIELDS_H

#include <jansson.h>

#include "coord/api/api_request.h"

/* Checks every top-level key of body (a JSON object) for a request of the given kind. Returns 0,
 * or -1 with err set to a 400 whose param is the field. */
int api_fields_check(const json_t *body, ApiKind kind, ApiError *err);

#endif
