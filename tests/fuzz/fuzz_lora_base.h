/*
 * fuzz_lora_base.h — the base model the LoRA adapter fuzz target loads adapters against, shared
 * with the seed writer (make_seeds --lora) so the seeds fit it: 2 layers, dim 8, 2 query heads and
 * 1 KV head of 4 (Q and O 8 wide, K and V 4). Small, so a seed is a few hundred bytes and every
 * shape check is reachable by mutation.
 */
#ifndef BRAID_TESTS_FUZZ_LORA_BASE_H
#define BRAID_TESTS_FUZZ_LORA_BASE_H

#include <stdio.h>

#include "model/model_config.h"

static inline ModelConfig fuzz_lora_base(void) {
    ModelConfig c = {.n_layers = 2, .dim = 8, .ff_dim = 16, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .vocab_size = 32};
    snprintf(c.arch, sizeof c.arch, "llama");
    return c;
}

#endif
