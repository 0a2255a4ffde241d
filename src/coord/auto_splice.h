/*
 * auto_splice.h — Leyline's Policy.transform in the server (issue 36): a request with
 * "auto_splice": "amortize" | "forget" (or whose API key's tenant has auto_splice= as its default)
 * sends its conversation as it is now, edits and all; the server diffs the prompt's tokens against
 * the conversation's recent prompts and, when the difference is an edit inside an earlier prompt
 * (not only new turns at its end), plans the splice itself: the CacheDirectives that splice
 * directives written by the client would have given (cache/cache_directive.h), reported as a
 * directive outcome with "auto": true.
 *
 * Diff (pure, auto_splice_diff): the prompt P against an earlier prompt C. First their common
 * prefix, then, greedily and in order, the stretches of C's remaining tokens that reappear in P:
 * each found by a window of AUTO_SPLICE_ANCHOR tokens of P that occurs in C at or after the end of
 * the previous stretch, then widened both ways while the tokens agree. Each stretch is a run
 * P[dst, dst + len) == C[src, src + len); what lies between runs was replaced, removed or added.
 * Its score is the tokens of P the runs cover (the prefix included).
 *
 * Plan (auto_splice_plan): among the conversation's recent prompts the one with the best score;
 * nothing when that one is a prefix of P (P only extends it: the prefix cache serves it), when the
 * runs past the common prefix cover fewer than AUTO_SPLICE_MIN_REUSE tokens, or when P is C.
 * Whatever is planned is safe: the instance copies only what it still caches of C's tokens
 * (kv_cache_plan_splice) and computes the rest, so a stale or evicted C costs reuse, never output.
 *
 * Store: per conversation key (tenant, adapter, and the request's conversation_id or else its
 * workflow_id: auto_splice_key), the last AUTO_SPLICE_RECENT prompts planned, newest first; at
 * most max_conversations conversations, the least recently used forgotten first; prompts longer
 * than max_tokens are not kept. Thread-safe: one mutex around each call.
 */
#ifndef BRAID_COORD_AUTO_SPLICE_H
#define BRAID_COORD_AUTO_SPLICE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/cache_directive.h"

#define AUTO_SPLICE_ANCHOR 16     /* tokens a reappearing stretch is found by (one KV block) */
#define AUTO_SPLICE_MIN_REUSE 16  /* tokens past the common prefix a plan must reuse */
#define AUTO_SPLICE_RECENT 4      /* prompts kept per conversation */
/* Runs one plan may hold: the wire's bound (directive_wire.h), the prefix run included. */
#define AUTO_SPLICE_MAX_RUNS (2 * CACHE_DIRECTIVE_MAX + 1)

typedef struct {
    int prefix;      /* common prefix of P and C */
    int covered;     /* tokens of P the runs cover, the prefix included (the score) */
    int n_runs;      /* runs[0] is the prefix (dst = src = 0) */
    CacheSpliceRun runs[AUTO_SPLICE_MAX_RUNS];
} AutoSpliceDiff;

/* The diff of P against C (index fields of the runs: -1 for the prefix, 0 after). -1 when out of memory. */
int auto_splice_diff(const int32_t *c, int n_c, const int32_t *p, int n_p, AutoSpliceDiff *out);

/* Fills out (left empty otherwise) with a splice of mode (CACHE_SPLICE_AMORTIZE or _FORGET) of
 * context C turning it into P as the diff says; its runs after the prefix carry `index` (the
 * outcome's) and out->auto_splice is set. 1 when planned, 0 when the diff is no edit worth one
 * (see above), -1 when out of memory. */
int auto_splice_plan(const int32_t *c, int n_c, const AutoSpliceDiff *diff, int n_p, int mode, int index, CacheDirectives *out);

typedef struct AutoSpliceStore AutoSpliceStore;

AutoSpliceStore *auto_splice_store_create(int max_conversations, int max_tokens);
void auto_splice_store_free(AutoSpliceStore *s);

/* The conversation key of a request (malloc'd): NULL with *oom false when it names neither a
 * conversation nor a workflow (no conversation to diff against), NULL with *oom true when out of
 * memory. tenant and adapter may be NULL. */
char *auto_splice_key(const char *tenant, const char *adapter, const char *conversation_id, const char *workflow_id, bool *oom);

/* Plans P against the key's recent prompts (auto_splice_plan, with the best one), then records P
 * as the key's newest prompt. 1 planned, 0 not, -1 out of memory (nothing planned; P may not be
 * recorded). */
int auto_splice_apply(AutoSpliceStore *s, const char *key, const int32_t *p, int n_p, int mode, int index, CacheDirectives *out);

/* What both front ends (the HTTP server, `braid batch`) do for a request whose directives hold no
 * splice: its conversation key (auto_splice_key of tenant, adapter, conversation_id, workflow_id),
 * then auto_splice_apply of P with mode and index, and what was planned moved into out's splice
 * fields (splice_mode, first_edit, context, runs, auto_splice; the rest of out untouched, its
 * context and runs then owned by out). 1 planned, 0 not (no conversation to diff against, or no
 * edit worth a splice), -1 out of memory (out untouched). */
int auto_splice_request(AutoSpliceStore *s, const char *tenant, const char *adapter, const char *conversation_id,
                        const char *workflow_id, const int32_t *p, int n_p, int mode, int index, CacheDirectives *out);

#endif
