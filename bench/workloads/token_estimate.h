/*
 * token_estimate.h — a quick estimate of how many tokens a text costs, without a tokenizer: the
 * workloads size prompt parts and cap prompts with it (the dry generator counts real tokens).
 *
 * Modeled on byte-level BPE with GPT-2-style pre-tokenization and single-digit numbers (the
 * default model, SmolLM2): a common word with its leading space is one token, long words and
 * names inside a sentence two or more, every digit one, punctuation runs and line breaks about one
 * each. On the workloads' prompts it is within about 3% of SmolLM2's real count (code alone: 7%
 * high); see bench/workloads/README.md. Other tokenizers differ. Pure function.
 */
#ifndef BRAID_BENCH_WORKLOADS_TOKEN_ESTIMATE_H
#define BRAID_BENCH_WORKLOADS_TOKEN_ESTIMATE_H

#include <stddef.h>

int token_estimate(const char *text, size_t len);
/* token_estimate over a NUL-terminated string. */
int token_estimate_str(const char *text);

#endif
