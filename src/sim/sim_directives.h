/*
 * sim_directives.h — Leyline's cache directives in `braid sim` (docs/TRACE_FORMAT.md, "directives"):
 * a trace request may carry pin, unpin, decay, evict, share and splice, and the replay applies them
 * through the same cache calls the live scheduler makes (src/cache/kv_hints.c via kv_cache.h), at
 * the same points of a request's life (worker/sched_directives.c, worker/scheduler.c):
 *
 *   before the match  splice "forget": the context's cache from the first edit on is evicted;
 *   after the match   another tenant's shared prefix is copied (kv_cache_plan_shared), then an
 *                     amortized splice's runs are copied from the context's cached path
 *                     (kv_cache_plan_splice); copied tokens count as hits, the edits' replacement
 *                     tokens (and whatever of the runs was not cached) as computed;
 *   after placing     an amortized splice decays the context past the first edit (the edited
 *                     conversation replaces it);
 *   after the commit  the hints act on the request's cached blocks: pin (within a per-tenant budget,
 *                     until t + ttl_s in trace time), unpin, decay, evict, share.
 *
 * A replay with directives runs the tree on the prompts' token ids (every request needs "tokens"),
 * as segment reuse does: sharing looks another tenant's namespace up with the viewer's own tokens,
 * and a splice names its context by request id, whose tokens are the context C.
 *
 * Positions are prompt-token positions. A splice edit {start, end, tokens} replaces C[start, end)
 * with `tokens` new tokens; the request's prompt is the edited C (plus anything appended). Not
 * thread-safe; everything belongs to one trace or one sim_run.
 */
#ifndef BRAID_SIM_SIM_DIRECTIVES_H
#define BRAID_SIM_SIM_DIRECTIVES_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/cache_directive.h"
#include "cache/kv_cache.h"
#include "common/error.h"
#include "sim/trace.h"

struct json_t;

typedef struct {
    int32_t start, end, tokens; /* C[start, end) replaced by `tokens` new tokens */
} SimSpliceEdit;

/* One request's directives as the trace line gives them. */
typedef struct SimDirectives {
    CacheHint *hints;          /* positions: prompt tokens; SHARE's tenant names owned here */
    int n_hints;
    uint8_t splice_mode;       /* CacheSpliceMode; NONE without a splice */
    char *context_id;          /* the request whose prompt is the context C */
    SimSpliceEdit *edits;      /* sorted, disjoint */
    int n_edits;
} SimDirectives;

/* Parses a line's "directives" array (prompt_tokens: the request's prompt length, for range checks).
 * *out is NULL for an empty array. Errors name the directive. */
int sim_directives_parse(const struct json_t *array, int prompt_tokens, SimDirectives **out, BraidError *err);
void sim_directives_free(SimDirectives *d);

/* Directive effects of one replay, from the cache's counters and the replay's own. */
typedef struct {
    int requests;              /* requests that carried directives */
    uint64_t directive_hit_tokens; /* prompt tokens admitted requests copied by directives (in cached_tokens) */
    uint64_t spliced_tokens;   /* prompt tokens planned from a splice's context (hits) */
    uint64_t splice_edit_tokens; /* the edits' replacement tokens (computed) */
    uint64_t shared_tokens;    /* prompt tokens planned from another tenant's shared prefix (hits) */
    uint64_t forgot_blocks;    /* splice forget: blocks of the context dropped */
    uint64_t pins, pin_expired_blocks, pin_revoked_blocks, unpinned_blocks, decayed_blocks, evicted_blocks;
    uint64_t hints_accepted, hints_clipped, hints_deferred, hints_rejected;
} SimDirectiveStats;

/* True when some request of the trace carries directives. */
bool sim_trace_has_directives(const Trace *t);

/* The replay's directive state: each request's context (index of the request whose id its splice
 * names; -1 without), the pin budget in blocks, and the scratch CacheDirectives of the request
 * being served. */
typedef struct {
    int *context_of;
    int pin_budget_blocks;
    int block_size;
    CacheDirectives cur;       /* runs and hints of the request being served (context not owned) */
    int cap_runs;
    SimDirectiveStats stats;
} SimDirectiveReplay;

/* Resolves every splice's context (a request with that id arriving earlier, both with token ids);
 * pin_budget_tokens per tenant (0 = a quarter of kv_tokens, as braid serve's default). */
int sim_directives_begin(SimDirectiveReplay *dr, const Trace *t, int kv_tokens, int pin_budget_tokens, BraidError *err);
void sim_directives_end(SimDirectiveReplay *dr);
/* The replay's cache clock: the trace's time reaches the cache through kv_cache_step and pin TTLs
 * (a pin's deadline is its request's t + ttl_s), so the cache's own clock stands still. */
double sim_directives_clock(void);

/* Hooks, in the order the replay calls them for request index i (all no-ops without directives). */
/* The request's conversation scope, as the scheduler sets it: an amortized splice's approximate
 * blocks are its workflow's, and its later turns keep matching them (segment_reuse: SegmentReuseMode). */
void sim_directives_identity(const TraceRequest *r, int segment_reuse, CacheIdentity *id);
/* Before the match: builds the request's CacheDirectives; a forget splice evicts its context from the first edit. */
int sim_directives_before(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const Trace *t, int i, BraidError *err);
/* After the cached prefix (from = its tokens): plans shared copies, then an amortized splice's runs
 * or else the segments segment_reuse admits, into plan (reset first), as the scheduler's
 * plan_copies. Returns the tokens planned (*directive_tokens of them by directives), -1 on error. */
int sim_directives_plan(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const Trace *t, int i, int from, int segment_reuse,
                        KvSegmentPlan *plan, int *directive_tokens, BraidError *err);
/* The plan was placed: an amortized splice decays its context from the first edit on. */
int sim_directives_placed(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, BraidError *err);
/* After the commit: the hints act on the request's cached blocks (tokens: the request's prompt). */
int sim_directives_after(SimDirectiveReplay *dr, KvCache *c, const CacheIdentity *id, const Trace *t, int i, BraidError *err);
/* Copies the cache's directive counters into dr->stats. */
void sim_directives_collect(SimDirectiveReplay *dr, const KvCache *c);

/* Reporting (braid sim): one "[sim] directives: ..." line, and the same figures as a JSON object
 * (a new reference; NULL when out of memory). prompt_tokens: the replay's, for percentages. */
void sim_directives_print(const SimDirectiveStats *s, uint64_t prompt_tokens, bool ignored);
struct json_t *sim_directives_json(const SimDirectiveStats *s, bool ignored);

#endif
