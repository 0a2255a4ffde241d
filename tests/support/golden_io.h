/*
 * golden_io.h — reads the JSONL reference files that tools/golden/make_golden.py writes from
 * HF transformers (the .jsonl files in tests/golden). One parsed JSON object per line; caller json_decref()s.
 */
#ifndef BRAID_TEST_GOLDEN_IO_H
#define BRAID_TEST_GOLDEN_IO_H

#include <jansson.h>
#include <stdint.h>

#include "model/model.h"

/* Returns a JSON array of the file's line objects, or NULL (with a message on stderr). */
json_t *golden_read_jsonl(const char *path);
/* Copies a JSON array of integers into a malloc'd int32 array; *n gets the length. */
int32_t *golden_int_array(const json_t *array, int *n);

/* The test model with the logits reference prompts (logits.jsonl), as the model-backed tests use it. */
typedef struct {
    BraidModel model;
    json_t *prompts;
} GoldenModel;

/* Loads both; returns -1 with a message on stderr. */
int golden_model_load(GoldenModel *g);
void golden_model_free(GoldenModel *g);

/* Gap between the largest and second-largest of logits[0..n) (how close greedy is to a tie). */
double golden_top2_gap(const float *logits, int n);

#endif
