/*
 * api_json.h — reading a client's JSON body the same way in every dialect's parser.
 * Absent and JSON null members read alike (clients send "stop": null to mean no stop), and an
 * error message names a wrong value by its JSON type. Pure functions over jansson values.
 */
#ifndef BRAID_COORD_API_JSON_H
#define BRAID_COORD_API_JSON_H

#include <jansson.h>

/* obj's member key, or NULL when it is absent or null. */
const json_t *api_json_present(const json_t *obj, const char *key);

/* "an object", "an array", "a string", "an integer", "a number", "a boolean", "null"; NULL: "nothing". */
const char *api_json_type_name(const json_t *v);

#endif
