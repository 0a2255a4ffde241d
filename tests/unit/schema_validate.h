/*
 * schema_validate.h — test helper: validates a JSON value against a JSON Schema of the subset
 * grammar/grammar.h supports (type, properties, required, additionalProperties, enum, const,
 * items, prefixItems, minItems, maxItems, anyOf, oneOf (as anyOf), allOf, $ref to "#...",
 * minLength, maxLength, pattern via POSIX extended regexes (so test patterns avoid \d and friends),
 * format ignored). Written independently of the grammar compiler, as its oracle.
 */
#ifndef BRAID_TEST_SCHEMA_VALIDATE_H
#define BRAID_TEST_SCHEMA_VALIDATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* True when value is valid under schema (root: the document $refs resolve in). why gets the first
 * failure. */
bool schema_validate(const json_t *value, const json_t *schema, const json_t *root, char *why, size_t why_len);

#endif
