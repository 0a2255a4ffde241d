/*
 * golden_io.h — reads the JSONL reference files that tools/golden/make_golden.py writes from
 * HF transformers (the .jsonl files in tests/golden). One parsed JSON object per line; caller json_decref()s.
 */
#ifndef BRAID_TEST_GOLDEN_IO_H
#define BRAID_TEST_GOLDEN_IO_H

#include <jansson.h>
#include <stdint.h>

/* Returns a JSON array of the file's line objects, or NULL (with a message on stderr). */
json_t *golden_read_jsonl(const char *path);
/* Copies a JSON array of integers into a malloc'd int32 array; *n gets the length. */
int32_t *golden_int_array(const json_t *array, int *n);

#endif
