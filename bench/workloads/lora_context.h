/*
 * lora_context.h — the large shared static context of the ForkKV-style workloads (react-lora,
 * mapreduce-lora): a long reference document that every agent of every workflow reads first,
 * whatever its LoRA adapter, and the prompt cap that goes with it.
 *
 * The text depends only on its size (context_tokens × scale), never on the run seed. Stateless.
 */
#ifndef BRAID_BENCH_WORKLOADS_LORA_CONTEXT_H
#define BRAID_BENCH_WORKLOADS_LORA_CONTEXT_H

#include "common/error.h"
#include "strbuf.h"
#include "workload.h"
#include "wl_rng.h"

/* Estimated tokens a LoRA workload's prompt may add to the context (agent head, history,
 * instruction) at scale 1: with the default 4096-token context, prompts stay under ~6000 tokens. */
#define LORA_DYNAMIC_TOKENS 1500
#define LORA_DYNAMIC_FLOOR 600
/* ForkKV's settings: tool latency, tool reply size and output limit. */
#define LORA_TOOL_DELAY_S 0.1
#define LORA_TOOL_REPLY_TOKENS 100
#define LORA_MAX_OUTPUT_TOKENS 256

/* The document, about context_tokens × scale estimated tokens, in sections "## Section k: …".
 * Returns a malloc'd string, or NULL with err set. *tokens gets its estimated size. */
char *lora_context_build(const WorkloadParams *p, int *tokens, BraidError *err);
/* The estimated-token cap on a prompt over a context of context_tokens (estimated):
 * context_tokens + LORA_DYNAMIC_TOKENS × scale, the added part at least LORA_DYNAMIC_FLOOR (tool
 * replies' labels and counts do not shrink with the scale). */
int lora_prompt_cap(const WorkloadParams *p, int context_tokens);
/* Appends a mock tool reply of about LORA_TOOL_REPLY_TOKENS × scale estimated tokens, drawn from r. */
void lora_tool_reply(StrBuf *out, WlRng *r, const WorkloadParams *p);

#endif
