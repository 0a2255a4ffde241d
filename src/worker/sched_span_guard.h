/*
 * sched_span_guard.h — guards on approximate segment reuse (paper 003 §3.4, "calibrated
 * approximate mode"): a depth-aware head and an online probe, per reused span of a request.
 *
 * Cached K/V of a span were shaped by the source's left context in every layer past the first;
 * only the approx_window tokens before the chunk are known to match. Token j of a span has W + j
 * matching tokens before it (the window and the span's own tokens). The paper's depth-aware guard
 * asks for a window W(ℓ) that grows with depth; Braid reuses the full stack of a token (Regime A:
 * no boundary state is stored, so upper layers cannot be recomputed without the lower ones), so a
 * token may be reused only when W + j >= W(L-1) = deep_window: the span's first deep_window - W
 * tokens (its head) are recomputed with the true left context.
 * The probe: the first probe_tokens of the head are computed by the forward while the span's
 * cached, rotated keys sit in their slots; the engine reads both and compares them per layer
 * (cosine); the span is rejected (recomputed) when a layer's mean cosine over the probe tokens is
 * below min_cos, else the rest of the span past the head is reused.
 *
 * States per span (SchedRequest.guard): PLAIN (exact, or guards off: reused whole), PROBING (head
 * being computed; prefill stops at the head's end until the engine decides), ACCEPTED (the head is
 * computed, the rest reused), REJECTED (computed whole). Only approximate spans of a request in
 * approx segment mode are guarded (an amortized splice is the client's explicit choice).
 * Not thread-safe (the scheduler's thread).
 */
#ifndef BRAID_WORKER_SCHED_SPAN_GUARD_H
#define BRAID_WORKER_SCHED_SPAN_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/kv_cache.h"

typedef enum { SPAN_PLAIN = 0, SPAN_PROBING = 1, SPAN_ACCEPTED = 2, SPAN_REJECTED = 3 } SpanGuardState;

/* Defaults: 4 probe tokens, cosine 0.99 per layer; deep window 0 = no depth-aware head; no span
 * shape limits (the CLI's defaults are in cli_span_guard.h). */
#define SPAN_GUARD_DEFAULT_PROBE_TOKENS 4
#define SPAN_GUARD_DEFAULT_MIN_COS 0.99

typedef struct {
    int probe_tokens;   /* 0 = no probe */
    double min_cos;     /* a layer's mean key cosine below this rejects the span */
    int window;         /* the cache's approx_window, W(0) */
    int deep_window;    /* W(L-1); <= window = no head */
    /* Diagnostic (issue 35's per-layer cosine table): every approximate span is probed over all
     * its tokens, so nothing of it is reused but each token's cached and fresh K and V are compared
     * (the engine writes a "probe_layers" event per span). */
    bool probe_whole;
    /* Approximate K/V that earlier requests committed to the tree are not taken through the prefix
     * cache: a request in approx mode matches only up to the first approximate node and computes
     * from there (so its own approximate spans are the only ones it carries, each one probed).
     * Zero value: taken, as before. */
    bool no_approx_prefix;
    /* The probe also compares the values: a layer's mean value cosine below min_cos rejects the
     * span too (measured: values drift several times more than keys in the upper layers). */
    bool probe_values;
    /* Span shape (issue 35, third pass): an approximate span shorter than min_span tokens is computed
     * whole (its boundary tokens are most of it, and they drift most); the last tail_tokens of an
     * approximate span that is reused are recomputed, so the tokens after it attend to exact K/V for
     * the span's most recent tokens (the ones they attend to most). 0 = off (the zero value). */
    int min_span;
    int tail_tokens;
} SpanGuardConfig;

/* One request's guard state (owned by SchedRequest; zero value = empty). */
typedef struct {
    uint8_t *state;
    int *head;          /* tokens at each span's start computed instead of reused */
    int *tail;          /* tokens at each span's end computed instead of reused */
    int cap;
    /* The probe in progress (span `probing`, -1 none): per layer, the sum of the probe tokens'
     * key cosines and their count; cached keys of the probe slots read before the forward. */
    int probing;
    double *cos_sum;
    int n_layers, cos_count;
    float *cached;      /* (probe tokens, n_layers, kv_dim) */
    int cached_lo, cached_n, kv_dim;
    /* The same for the values, and per layer the least key / value cosine of one probe token and the
     * value cosines' sum (for the "probe_layers" event); cap_tokens: probe tokens the buffers hold. */
    float *cached_v;
    double *vcos_sum, *kcos_min, *vcos_min;
    int cap_tokens;
    double last_min_cos;
    int last_min_layer;
} SpanGuard;

typedef struct {
    uint64_t probes_ok, probes_rejected;
    uint64_t head_tokens;      /* span tokens recomputed as depth-aware heads or probes */
    uint64_t rejected_tokens;  /* span tokens recomputed because their span was rejected */
} SpanGuardCounters;

void span_guard_free(SpanGuard *g);
/* Sets each span's state and head for a new plan. Returns the span tokens no longer reused
 * (heads and spans whose head covers them), or -1 when out of memory. */
int span_guard_plan(SpanGuard *g, const SpanGuardConfig *cfg, const KvSegmentPlan *plan, bool guard_inexact);
/* Where span i's reused part starts (dst_start + head), or -1 when the span is not reused now
 * (rejected) or must wait for its probe (probing; *wait set). */
int span_guard_reuse_from(const SpanGuard *g, const KvSegmentPlan *plan, int i, bool *wait);
/* Where span i's reused part ends (its end less the recomputed tail); meaningful when
 * span_guard_reuse_from gave a position. */
int span_guard_reuse_end(const SpanGuard *g, const KvSegmentPlan *plan, int i);
/* The end of span i's head (where prefill stops while it probes). */
int span_guard_head_end(const SpanGuard *g, const KvSegmentPlan *plan, int i);
/* The probe's result for span i: accept (true) or reject. Returns the span tokens that are now
 * computed instead of reused (0 when accepted). */
int span_guard_decide(SpanGuard *g, const KvSegmentPlan *plan, int i, bool accept);
/* Per-layer key cosine (a·b / |a||b|, 1 when both are zero) over n floats. */
double span_guard_cosine(const float *a, const float *b, int n);

#endif
