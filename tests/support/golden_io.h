/*
 * golden_io.h — reads the JSONL reference files that tools/golden/make_golden.py writes from
 * HF transformers (the .jsonl files in tests/golden). One parsed JSON object per line; caller json_decref()s.
 */
#ifndef BRAID_TEST_GOLDEN_IO_H
#define BRAID_TEST_GOLDEN_IO_H

#include <jansson.h>
#include <stdint.h>

#include "model/model.h"
#include "worker/sequence.h"

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

/* Compares a reference line's top-k logits ("top_ids", "top_logits": one list per prompt
 * position) with logits (n, vocab); returns the max abs difference and the mean in *mean_out. */
double golden_compare_top_logits(const json_t *p, const float *logits, int n, int vocab, double *mean_out);

/* Greedy steps of a reference line ("greedy", "greedy_margins") checked against the runner,
 * teacher-forced on the reference tokens so a near-tie does not end the comparison. first_logits
 * (vocab) are the logits after the prompt; scratch holds (vocab). A step whose reference top-2
 * margin is under margin_tie counts as a near-tie (in *ties, agreeing ones in *ties_agreeing);
 * returns the mismatches at the other steps (each printed with name) or -1 when the runner fails. */
int golden_greedy_mismatches(SequenceRunner *runner, const json_t *p, const float *first_logits, float *scratch, int vocab,
                             double margin_tie, const char *name, int *ties, int *ties_agreeing);

/* Loads the committed adapters (TEST_ADAPTER_ROLES, ids 1..TEST_N_ADAPTERS) for the model; -1 with a
 * message on stderr. */
int golden_load_adapters(const ModelConfig *cfg, LoraSet *set);
/* The test model and the committed adapters, as the LoRA tests start; -1 with a message on stderr. */
int golden_load_model_and_adapters(BraidModel *model, LoraSet *set);
/* Encodes text with the model's tokenizer (parse_special: chat markers become their tokens; no BOS
 * added); -1 with a message on stderr. */
int golden_encode(const BraidModel *model, const char *text, bool parse_special, TokenList *out);

/* Gap between the largest and second-largest of logits[0..n) (how close greedy is to a tie). */
double golden_top2_gap(const float *logits, int n);

#endif
