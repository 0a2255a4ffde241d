#include "worker/scheduler.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "cache/radix_tree.h"
#include "common/grow.h"
#include "grammar/grammar.h"
#include "worker/sched_directives.h"
#include "worker/sched_forkkv.h"

#include "common/json_text.h"
#include "common/log.h"
#include "common/timeutil.h"

static void event(Scheduler *s, const char *kind, const SchedRequest *r, const char *fmt, int a, int b) {
    if (!s->events) return;
    fprintf(s->events, "{\"t\":%.6f,\"event\":\"%s\",\"req\":", s->clock(), kind);
    json_text_string(s->events, r ? r->id : "");
    fputc(',', s->events);
    fprintf(s->events, fmt, a, b);
    fprintf(s->events, "}\n");
}

/* One JSONL line per cache event, in the shape of vLLM's KV events (BlockStored, BlockRemoved,
 * AllBlocksCleared) plus the tier ("medium") and why it happened. */
static void log_cache_event(Scheduler *s, const KvCache *cache, const char *pool, const CacheEvent *ev) {
    static const char *const kinds[] = {"", "BlockStored", "BlockRemoved", "AllBlocksCleared"};
    fprintf(s->events, "{\"t\":%.6f,\"event\":\"kv\",\"type\":\"%s\",\"reason\":\"%s\"", s->clock(), kinds[ev->kind], ev->reason);
    if (pool) fprintf(s->events, ",\"pool\":\"%s\"", pool);
    if (ev->kind != CACHE_EVENT_CLEARED) {
        fprintf(s->events, ",\"medium\":\"%s\",\"blocks\":%d,\"block_hashes\":[", ev->tier == CACHE_TIER_HOST ? "host" : "device", ev->n_blocks);
        for (int i = 0; i < ev->n_blocks; i++) fprintf(s->events, "%s\"%016llx\"", i ? "," : "", (unsigned long long)ev->hashes[i]);
        fprintf(s->events, "],\"parent_block_hash\":\"%016llx\",\"tenant\":", (unsigned long long)ev->parent_hash);
        json_text_string(s->events, kv_cache_name(cache, CACHE_NAME_TENANT, ev->tenant));
        fputs(",\"adapter\":", s->events);
        json_text_string(s->events, kv_cache_name(cache, CACHE_NAME_ADAPTER, ev->adapter));
        fprintf(s->events, ",\"on_device\":%s,\"on_host\":%s", ev->tiers_after & CACHE_ON_DEVICE ? "true" : "false",
                ev->tiers_after & CACHE_ON_HOST ? "true" : "false");
    }
    fprintf(s->events, "}\n");
}

static void on_cache_event(void *ctx, const CacheEvent *ev) {
    Scheduler *s = ctx;
    if (s->events) log_cache_event(s, &s->cache, s->forkkv ? "base" : NULL, ev);
    sched_forkkv_on_event(s, ev, false);
    if (s->observer.on_cache_event) s->observer.on_cache_event(s->observer.ctx, ev);
}

/* ForkKV residual blocks: logged beside the base blocks ("pool":"residual"); the router's index
 * (the observer) follows the base tree only, the one that decides where a prefix is cached. */
static void on_residual_event(void *ctx, const CacheEvent *ev) {
    Scheduler *s = ctx;
    if (s->events) log_cache_event(s, &s->residual.tree, "residual", ev);
    sched_forkkv_on_event(s, ev, true);
}

int sched_init(Scheduler *s, const SchedConfig *cfg, BraidError *err) {
    memset(s, 0, sizeof *s);
    s->block_size = cfg->block_size;
    s->max_batch_tokens = cfg->max_batch_tokens;
    s->max_running = cfg->max_running;
    s->cache_enabled = cfg->cache_enabled;
    s->prefetch = cfg->prefetch && cfg->cache_enabled && cfg->host_blocks > 1 && cfg->policy && cfg->policy->prefetch_value;
    s->prefetch_max_blocks = cfg->prefetch_max_blocks > 0 ? cfg->prefetch_max_blocks : SCHED_PREFETCH_MAX_BLOCKS_PER_STEP;
    s->clock = braid_now_seconds;
    s->flops_per_token = cfg->flops_per_token;
    s->span_guard = cfg->span_guard;
    s->span_guard.window = cfg->approx_window;
    s->pin_budget_blocks = cfg->pin_budget_blocks > 0 ? cfg->pin_budget_blocks : (cfg->device_blocks - 1) / 4;
    s->fair_share = cfg->fair_share;
    s->fair_step_tokens = cfg->fair_step_tokens;
    s->admit.output_tokens = cfg->admit_output;
    KvCacheConfig cc = {.block_size = cfg->block_size, .device_blocks = cfg->device_blocks,
                        .host_blocks = cfg->cache_enabled ? cfg->host_blocks : 0, .policy = cfg->policy,
                        .policy_options = cfg->policy_options, .clock = braid_now_seconds,
                        .segments = cfg->segments && cfg->cache_enabled, .anchor_tokens = cfg->anchor_tokens,
                        .n_anchor_tokens = cfg->n_anchor_tokens, .approx_window = cfg->approx_window, .model_seed = cfg->model_seed,
                        .segment_lsh = cfg->segment_lsh, .segment_lsh_anywhere = cfg->segment_lsh_anywhere, .segment_tau_seg = cfg->segment_tau_seg,
                        .segment_tau_ctx = cfg->segment_tau_ctx, .segment_canon = cfg->segment_canon,
                        .n_segment_canon = cfg->n_segment_canon};
    if (kv_cache_init(&s->cache, &cc, err)) return -1;
    kv_cache_set_observer(&s->cache, on_cache_event, s);
    if (cfg->lora_shared) {
        if (residual_cache_init(&s->residual, cfg->residual_blocks, cfg->block_size, NULL, braid_now_seconds, err)) {
            kv_cache_free(&s->cache);
            return -1;
        }
        s->forkkv = true;
        /* auto: the unified pool (cache/residual_cache.h): residuals borrow base blocks, so memory
         * a separate request needs is never held back for residuals. */
        int kv_dim = cfg->model_kv_heads * cfg->model_head_dim, per_carrier = cfg->lora_rank > 0 ? kv_dim / cfg->lora_rank : 0;
        if (cfg->lora_auto && residual_cache_unify(&s->residual, &s->cache, per_carrier > 0 ? per_carrier : 1, err)) {
            residual_cache_free(&s->residual);
            kv_cache_free(&s->cache);
            return -1;
        }
        residual_cache_set_observer(&s->residual, on_residual_event, s);
        if (cfg->lora_auto && sched_forkkv_auto_init(s, cfg, err)) {
            residual_cache_free(&s->residual);
            kv_cache_free(&s->cache);
            return -1;
        }
    }
    return 0;
}

void sched_free(Scheduler *s) {
    if (s->forkkv) residual_cache_free(&s->residual); /* first: a unified pool gives its blocks back to the base */
    kv_cache_free(&s->cache);
    sched_forkkv_auto_free(s);
    free(s->waiting);
    free(s->running);
    sched_fair_free(&s->fair);
    memset(s, 0, sizeof *s);
}

void plan_free(StepPlan *plan) {
    free(plan->entries);
    cache_ops_free(&plan->ops);
    memset(plan, 0, sizeof *plan);
}

void sched_request_free(SchedRequest *r) {
    free(r->id);
    free(r->tenant);
    free(r->adapter);
    free(r->workflow);
    free(r->agent);
    free(r->hidden);
    free(r->first_logits);
    free(r->logprobs);
    free(r->tokens);
    free(r->blocks);
    free(r->res.blocks);
    kv_cache_segment_plan_free(&r->segments);
    span_guard_free(&r->guard);
    cache_directives_free(&r->directives);
    free(r->splice_reused);
    free(r->directive_outcomes);
    sampler_free(&r->sampler);
    free(r->grammar_spec);
    grammar_matcher_free(r->grammar);
    memset(r, 0, sizeof *r);
}

static int blocks_for(const Scheduler *s, int tokens) { return (tokens + s->block_size - 1) / s->block_size; }

bool sched_idle(const Scheduler *s) { return s->n_waiting == 0 && s->n_running == 0; }

/* sched_add reserves room for every request in flight, so this never needs to grow and a
 * preempted request can never be lost to an allocation failure. */
static void queue_push_front(Scheduler *s, SchedRequest *r) {
    assert(s->n_waiting < s->cap_waiting);
    memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = r;
    s->n_waiting++;
}

/* The request no longer names its workflow (it finished or was refused): the cache may reclaim
 * the workflow's id. Once only. */
static void release_identity(Scheduler *s, SchedRequest *r) {
    kv_cache_identity_release(&s->cache, &r->identity);
    r->identity.workflow = 0;
}

/* The request waits in the queue: its cached prefix is marked as about to be read, so a policy
 * that values uses (pbkv) keeps it while the call waits (the coordinator's forecast, sent at
 * dispatch, is for the calls after this one). LRU order is untouched (kv_cache_note_waiting). */
static void note_waiting(Scheduler *s, SchedRequest *r) {
    if (!s->cache_enabled || r->identity.workflow == 0 || r->waiting_noted) return;
    r->waiting_noted = kv_cache_note_waiting(&s->cache, &r->identity, r->tokens, r->n_tokens) > 0;
}

/* The request left the queue: the mark of note_waiting goes (before its identity does). */
static void unnote_waiting(Scheduler *s, SchedRequest *r) {
    if (!r->waiting_noted) return;
    kv_cache_unnote_waiting(&s->cache, &r->identity, r->tokens, r->n_tokens);
    r->waiting_noted = false;
}

int sched_add(Scheduler *s, SchedRequest *r) {
    r->state = REQ_WAITING;
    r->cached_tokens = -1;
    r->reused_tokens = -1;
    r->approx_from = -1;
    BraidError err;
    /* ForkKV: the base tree is one namespace for all adapters (their own parts are residuals),
     * except for a request --lora-cache auto gives a separate cache. */
    sched_forkkv_choose(s, r);
    const char *base_adapter = s->forkkv && !r->kv_separate ? NULL : r->adapter;
    if (kv_cache_identity(&s->cache, r->tenant, base_adapter, r->workflow, r->agent, &r->identity, &err)) {
        snprintf(r->error, sizeof r->error, "%s", err.msg);
        r->state = REQ_FINISHED;
        r->finish_reason = "error";
        return -1;
    }
    int need = blocks_for(s, r->n_prompt + r->max_tokens), total = kv_cache_total(&s->cache, CACHE_TIER_DEVICE);
    if (need > total) {
        release_identity(s, r);
        snprintf(r->error, sizeof r->error,
                 "request needs %d KV blocks (%d prompt + %d max_tokens tokens) but the pool holds only %d; "
                 "lower max_tokens or start with more --kv-blocks",
                 need, r->n_prompt, r->max_tokens, total);
        r->state = REQ_FINISHED;
        r->finish_reason = "error";
        return -1;
    }
    if (sched_forkkv_add(s, r)) {
        release_identity(s, r);
        r->state = REQ_FINISHED;
        r->finish_reason = "error";
        return -1;
    }
    /* Room for every request in flight to be waiting at once (see queue_push_front). */
    if (braid_grow((void **)&s->waiting, &s->cap_waiting, s->n_waiting + s->n_running + 1, sizeof *s->waiting)) {
        release_identity(s, r);
        snprintf(r->error, sizeof r->error, "out of memory queueing the request");
        r->state = REQ_FINISHED;
        r->finish_reason = "error";
        return -1;
    }
    /* An amortized splice asks for approximate K/V (rotated keys, values from another context).
     * The conversation that made one accepted it: its later turns (same workflow, or the client's
     * conversation id) match the approximate nodes it stamped, and what they compute over them is
     * stamped too; every other request sees them only in approx segment mode. An amortized splice
     * without a conversation may match through any approximate node, as before scopes. */
    uint64_t scope = r->directives.conversation ? r->directives.conversation : cache_workflow_scope(r->workflow);
    bool amortize = r->directives.splice_mode == CACHE_SPLICE_AMORTIZE;
    r->identity.approx_scope = scope;
    r->identity.scope_commits = scope != 0 && r->segment_mode != SEGMENT_REUSE_APPROX;
    /* no_approx_prefix: an approx request carries only its own (probed) approximate spans, never
     * the ones earlier requests committed (opt-in: measured on codegen, it costs prefix hits and
     * leaves agreement where it was, the spans themselves being what drifts). */
    r->identity.approx_ok = (r->segment_mode == SEGMENT_REUSE_APPROX && !s->span_guard.no_approx_prefix) || (amortize && scope == 0);
    if (cache_directives_any(&r->directives)) s->counters.directive_requests++;
    s->waiting[s->n_waiting++] = r;
    note_waiting(s, r);
    return 0;
}

/* Grows r's block table to cover `tokens` slots; the cache evicts or demotes when the pool is short. */
static int ensure_blocks(Scheduler *s, SchedRequest *r, int tokens) {
    int need = blocks_for(s, tokens) - r->n_blocks;
    if (need > 0) {
        if (braid_grow((void **)&r->blocks, &r->cap_blocks, r->n_blocks + need, sizeof *r->blocks)) return -1;
        if (kv_cache_reserve(&s->cache, need, r->blocks + r->n_blocks)) return -1;
        r->n_blocks += need;
        int in_use = kv_cache_in_use(&s->cache, CACHE_TIER_DEVICE);
        if (in_use > s->counters.peak_in_use) s->counters.peak_in_use = in_use;
    }
    BraidError err;
    if (sched_forkkv_ensure(s, r, tokens, &err)) return -1;
    if (s->forkkv && residual_cache_in_use(&s->residual) > s->counters.peak_residual_in_use)
        s->counters.peak_residual_in_use = residual_cache_in_use(&s->residual);
    return 0;
}

/* Inserts r's computed full blocks into the tree. With relock, r's lock moves to the node that
 * ends them, so a running request keeps its cached prefix pinned while others reuse it. */
static void cache_computed_prefix(Scheduler *s, SchedRequest *r, bool relock) {
    int full = r->n_computed / s->block_size;
    r->identity.has_approx = r->approx_from >= 0;
    r->identity.approx_from_block = r->approx_from >= 0 ? r->approx_from / s->block_size : 0;
    if (!s->cache_enabled || full == 0) return;
    BraidError err;
    if (kv_cache_commit(&s->cache, &r->identity, r->tokens, full, r->blocks, &r->locked, relock, &err))
        LOG_WARN("sched", "req %s: cache insert failed: %s", r->id, err.msg);
    sched_forkkv_commit(s, r, full, relock);
}

/* Gives back everything r holds; computed full blocks go into the tree first when caching. */
static void release_request(Scheduler *s, SchedRequest *r) {
    cache_computed_prefix(s, r, false);
    kv_cache_drop_segments(&s->cache, &r->segments);
    r->next_span = 0;
    kv_cache_release(&s->cache, r->locked, r->blocks, r->n_blocks);
    r->n_blocks = 0;
    r->locked = NULL;
    sched_forkkv_release(s, r);
}

static void remove_running(Scheduler *s, SchedRequest *r) {
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == r) {
            memmove(s->running + i, s->running + i + 1, (size_t)(s->n_running - i - 1) * sizeof *s->running);
            s->n_running--;
            return;
        }
}

static void preempt(Scheduler *s, SchedRequest *r) {
    int kept = s->cache_enabled ? r->n_computed / s->block_size * s->block_size : 0;
    release_request(s, r);
    r->n_computed = 0;
    r->state = REQ_WAITING;
    r->preemptions++;
    s->counters.preemptions++;
    remove_running(s, r);
    queue_push_front(s, r);
    note_waiting(s, r); /* back in the queue: what it computed (now in the tree) is about to be read again */
    event(s, "preempt", r, "\"tokens_kept_in_tree\":%d,\"preemptions\":%d", kept, r->preemptions);
    LOG_DEBUG("sched", "req %s: preempted, %d tokens kept in tree", r->id, kept);
}

void sched_finish(Scheduler *s, SchedRequest *r, const char *reason) {
    unnote_waiting(s, r);
    release_request(s, r);
    bool completed = strcmp(reason, "stop") == 0 || strcmp(reason, "length") == 0;
    if (cache_directives_any(&r->directives)) sched_directives_finish(s, r, completed);
    if (completed) sched_admit_learn(&s->admit, r->n_tokens - r->n_prompt);
    release_identity(s, r);
    r->state = REQ_FINISHED;
    r->finish_reason = reason;
    r->t_finish = s->clock();
    remove_running(s, r);
}

void sched_cancel(Scheduler *s, SchedRequest *r) {
    if (r->state == REQ_FINISHED) return;
    for (int i = 0; i < s->n_waiting; i++)
        if (s->waiting[i] == r) {
            memmove(s->waiting + i, s->waiting + i + 1, (size_t)(s->n_waiting - i - 1) * sizeof *s->waiting);
            s->n_waiting--;
            break;
        }
    sched_finish(s, r, "cancelled");
    event(s, "cancel", r, "\"generated\":%d,\"preemptions\":%d", r->n_tokens - r->n_prompt, r->preemptions);
}

int sched_append_token(SchedRequest *r, int32_t token) {
    if (braid_grow((void **)&r->tokens, &r->cap_tokens, r->n_tokens + 1, sizeof *r->tokens)) return -1;
    r->tokens[r->n_tokens++] = token;
    return 0;
}

static int plan_add(StepPlan *p, SchedRequest *r, int start, int count, bool sample) {
    if (braid_grow((void **)&p->entries, &p->cap, p->n + 1, sizeof *p->entries)) return -1;
    p->entries[p->n++] = (PlanEntry){r, start, count, sample};
    p->n_tokens += count;
    return 0;
}

static bool in_plan(const StepPlan *p, const SchedRequest *r) {
    for (int i = 0; i < p->n; i++)
        if (p->entries[i].req == r) return true;
    return false;
}

/* The running request with the least work done that this step has not planned yet. */
static SchedRequest *pick_victim(Scheduler *s, const StepPlan *p) {
    SchedRequest *victim = NULL;
    for (int i = 0; i < s->n_running; i++) {
        SchedRequest *r = s->running[i];
        if (in_plan(p, r)) continue;
        if (!victim || r->n_computed < victim->n_computed) victim = r;
    }
    return victim;
}

/* The cached prefix of r: matched, locked, held, its host part loaded back as far as device
 * blocks allow. Fills r->blocks / n_blocks / n_computed; returns the blocks loaded from the host. */
static int take_cached_prefix(Scheduler *s, SchedRequest *r, BraidError *err) {
    KvCacheMatch m;
    if (kv_cache_match(&s->cache, &r->identity, r->tokens, r->n_tokens, &m, err)) return -1;
    r->locked = m.node;
    if (braid_grow((void **)&r->blocks, &r->cap_blocks, m.device_blocks + m.host_blocks + 1, sizeof *r->blocks)) {
        kv_cache_release(&s->cache, r->locked, NULL, 0);
        r->locked = NULL;
        return braid_error_set(err, "sched: out of memory");
    }
    int got = kv_cache_acquire(&s->cache, &m, r->blocks, err);
    if (got < 0) { /* it failed before holding anything */
        kv_cache_release(&s->cache, m.node, NULL, 0);
        r->locked = NULL;
        return -1;
    }
    r->locked = m.node;
    r->n_blocks = got;
    r->n_computed = got * s->block_size;
    if (m.approx_from_block >= 0 && m.approx_from_block < got) r->approx_from = m.approx_from_block * s->block_size;
    return m.host_blocks;
}

/* Prefill jumps over the reused spans (past their guarded heads) that start where it stands;
 * rejected spans are computed, and a probing one waits for its probe (sched_span_guard.h). */
static void skip_reused(SchedRequest *r) {
    const KvSegmentPlan *p = &r->segments;
    while (r->next_span < p->n) {
        bool wait;
        int from = span_guard_reuse_from(&r->guard, p, r->next_span, &wait);
        if (wait) break;
        if (from >= 0 && from != r->n_computed) break;
        if (from >= 0) r->n_computed = span_guard_reuse_end(&r->guard, p, r->next_span);
        r->next_span++;
    }
}

/* The guards' plan for r's spans (sched_span_guard.h): the tokens they take back from reuse are
 * counted as computed at first admission. */
static int guard_spans(Scheduler *s, SchedRequest *r, bool first, BraidError *err) {
    bool guarded = r->segment_mode == SEGMENT_REUSE_APPROX && r->directives.splice_mode != CACHE_SPLICE_AMORTIZE;
    int lost = span_guard_plan(&r->guard, &s->span_guard, &r->segments, guarded);
    if (lost < 0) return braid_error_set(err, "sched: out of memory guarding reused segments");
    if (first && lost > 0) sched_span_guard_uncount(s, r, lost, false);
    return 0;
}

void sched_span_guard_uncount(Scheduler *s, SchedRequest *r, int tokens, bool rejected) {
    if (tokens <= 0) return;
    if (rejected) s->guard_counters.rejected_tokens += (uint64_t)tokens;
    else s->guard_counters.head_tokens += (uint64_t)tokens;
    if (r->reused_tokens < tokens) return; /* not counted at a first admission */
    r->reused_tokens -= tokens;
    s->counters.segment_reused_prompt_tokens -= (uint64_t)tokens;
    s->counters.segment_flops_saved -= s->flops_per_token * tokens;
    s->counters.computed_prompt_tokens += (uint64_t)tokens;
}

/* The K/V r can copy instead of computing, past its cached prefix and in position order: a prefix
 * another tenant shared with r's, then its amortized splice's runs or else the segments its mode
 * admits. Their source blocks are held. */
static int plan_copies(Scheduler *s, SchedRequest *r, BraidError *err) {
    kv_cache_drop_segments(&s->cache, &r->segments);
    if (!s->cache_enabled) return 0;
    int from = kv_cache_plan_shared(&s->cache, &r->identity, r->tokens, r->n_tokens, r->n_computed, &r->segments, err);
    if (from < 0) return -1;
    r->shared_planned = from - r->n_computed;
    if (r->directives.splice_mode == CACHE_SPLICE_AMORTIZE) {
        int *reused = r->splice_done ? NULL : r->splice_reused;
        if (!r->splice_done) r->splice_from = from;
        return kv_cache_plan_splice(&s->cache, &r->identity, &r->directives, r->n_tokens, from, &r->segments, reused, err);
    }
    if (r->segment_mode == SEGMENT_REUSE_OFF) return 0;
    return kv_cache_find_more_segments(&s->cache, &r->identity, r->tokens, r->n_tokens, from, (SegmentReuseMode)r->segment_mode,
                                       &r->segments, err);
}

/* Reserves blocks for r's tokens with its copies planned (their sources held, so eviction cannot
 * take them); when that does not fit, tries again without them, whose held sources may be what
 * stands in the way. Returns 0 when reserved, 1 when it does not fit. */
static int reserve_with_segments(Scheduler *s, SchedRequest *r, BraidError *err) {
    r->next_span = 0;
    if (plan_copies(s, r, err)) return -1;
    if (ensure_blocks(s, r, r->n_tokens) == 0) return 0;
    if (r->segments.n == 0) return 1;
    kv_cache_drop_segments(&s->cache, &r->segments);
    /* The splice's runs were planned but are not copied: its outcome must not count them. */
    if (!r->splice_done && r->splice_reused) memset(r->splice_reused, 0, (size_t)r->directives.n_runs * sizeof *r->splice_reused);
    return ensure_blocks(s, r, r->n_tokens) == 0 ? 0 : 1;
}

/* Output-aware admission (sched_admit.h): r waits when the pool's room (free + evictable device
 * blocks, with r holding `held` blocks) is below what the running requests and r still need to
 * reach their expected output. Before admit() (held = 0) it is a lower bound on r's need (its
 * growth past the prompt), so a request that would be deferred anyway touches no cache. */
static bool output_room_short(Scheduler *s, const SchedRequest *r, int held) {
    if (!sched_admit_on(&s->admit) || s->n_running == 0) return false;
    int bs = s->block_size, due = sched_admit_blocks_due(&s->admit, r->n_prompt, r->max_tokens, held > 0 ? held : blocks_for(s, r->n_tokens), bs);
    for (int i = 0; i < s->n_running; i++) {
        const SchedRequest *q = s->running[i];
        due += sched_admit_blocks_due(&s->admit, q->n_prompt, q->max_tokens, q->n_blocks, bs);
    }
    int room = kv_cache_total(&s->cache, CACHE_TIER_DEVICE) - kv_cache_in_use(&s->cache, CACHE_TIER_DEVICE);
    if (!sched_admit_defer(&s->admit, room, due, s->n_running)) return false;
    event(s, "admit_wait", r, "\"room_blocks\":%d,\"due_blocks\":%d", room, due);
    return true;
}

static void count_first_admission(Scheduler *s, SchedRequest *r, int loaded) {
    int host = loaded * s->block_size, reused = r->segments.reused_tokens;
    r->cached_tokens = r->n_computed;
    r->cached_tokens_host = host;
    r->reused_tokens = reused;
    r->shared_tokens = r->segments.n > 0 ? r->shared_planned : 0;
    s->counters.cached_prompt_tokens_device += (uint64_t)(r->n_computed - host);
    s->counters.cached_prompt_tokens_host += (uint64_t)host;
    s->counters.computed_prompt_tokens += (uint64_t)(r->n_prompt - r->n_computed - reused);
    s->counters.segment_reused_prompt_tokens += (uint64_t)reused;
    s->counters.segment_flops_saved += s->flops_per_token * reused;
}

/* Admission: the cached prefix, reused segments, then blocks reserved for the rest of the sequence
 * so far. Returns 0 when admitted, 1 when it does not fit now. */
static int admit(Scheduler *s, SchedRequest *r, BraidError *err) {
    int loaded = 0;
    r->n_blocks = 0;
    r->n_computed = 0;
    r->approx_from = -1;
    CacheIdentity before = r->identity;
    if (sched_forkkv_rechoose(s, r) && r->waiting_noted) { /* the queue mark follows r to its new namespace */
        kv_cache_unnote_waiting(&s->cache, &before, r->tokens, r->n_tokens);
        r->waiting_noted = false;
        note_waiting(s, r);
    }
    if (sched_directives_admit(s, r, err)) return -1;
    if (s->cache_enabled && (loaded = take_cached_prefix(s, r, err)) < 0) return -1;
    int base_tokens = r->n_computed;
    if (sched_forkkv_admit(s, r, err)) {
        release_request(s, r);
        r->n_computed = 0;
        return -1;
    }
    if (braid_grow((void **)&r->blocks, &r->cap_blocks, blocks_for(s, r->n_tokens) + 1, sizeof *r->blocks)) {
        release_request(s, r);
        return braid_error_set(err, "sched: out of memory");
    }
    /* A forked request's copies would need residuals too: it computes instead. */
    int rc = sched_forked(s, r) ? (ensure_blocks(s, r, r->n_tokens) == 0 ? 0 : 1) : reserve_with_segments(s, r, err);
    if (rc == 0 && r->segments.n > 0 && kv_cache_place_segments(&s->cache, &r->segments, r->blocks, err)) rc = -1;
    if (rc == 0 && output_room_short(s, r, r->n_blocks)) rc = 1;
    if (rc != 0) {
        release_request(s, r);
        r->n_computed = 0;
        return rc;
    }
    if (r->segments.inexact && (r->approx_from < 0 || r->segments.first_inexact < r->approx_from))
        r->approx_from = r->segments.first_inexact;
    bool first = r->cached_tokens < 0;
    if (first) {
        count_first_admission(s, r, loaded);
        sched_forkkv_count_first(s, r, base_tokens);
    }
    if (!r->splice_done) sched_directives_placed(s, r);
    r->splice_done = true;
    if (r->n_computed > 0)
        event(s, "hit", r, "\"tokens\":%d,\"prompt\":%d", r->n_computed, r->n_tokens);
    if (loaded > 0) event(s, "load", r, "\"blocks\":%d,\"tokens\":%d", loaded, loaded * s->block_size);
    if (r->segments.n > 0)
        event(s, "segments", r, "\"spans\":%d,\"tokens\":%d", r->segments.n, r->segments.reused_tokens);
    if (r->segments.lsh_tokens > 0) /* of those, from near-duplicate chunks (segment_lsh.h) */
        event(s, "segments_lsh", r, "\"tokens\":%d,\"of\":%d", r->segments.lsh_tokens, r->segments.reused_tokens);
    if (guard_spans(s, r, first, err)) return -1;
    skip_reused(r);
    return 0;
}

static int plan_decodes(Scheduler *s, StepPlan *p, int *budget) {
    for (int i = 0; i < s->n_running && *budget > 0; i++) {
        SchedRequest *r = s->running[i];
        if (r->n_computed != r->n_tokens - 1 || in_plan(p, r)) continue; /* still prefilling */
        while (ensure_blocks(s, r, r->n_tokens)) {
            SchedRequest *victim = pick_victim(s, p);
            if (!victim) return 0;
            int self = victim == r;
            preempt(s, victim);
            i = -1; /* the running list changed: rescan (planned requests are skipped) */
            if (self) break;
        }
        if (r->state != REQ_RUNNING) continue;
        if (plan_add(p, r, r->n_computed, 1, true)) return -1;
        (*budget)--;
    }
    return 0;
}

/* The next prefill of r under the budget: from n_computed up to the next reused span, then past it
 * to the next, and so on — one plan entry per gap, all in this step. The forward writes every
 * entry's K/V before any attends (layer by layer), so a later gap sees the earlier ones; only the
 * entry that reaches the end of the sequence samples. A step holds at most max_running entries
 * (the backend's sequence limit); gaps that do not fit wait for the next step. */
static int plan_prefill_chunk(const Scheduler *s, StepPlan *p, SchedRequest *r, int *budget) {
    const KvSegmentPlan *seg = &r->segments;
    int at = r->n_computed, span = r->next_span;
    while (*budget > 0 && at < r->n_tokens && p->n < s->max_running) {
        bool wait = false;
        int end = r->n_tokens;
        for (; span < seg->n; span++) { /* the next span reused now, or probing (then up to its head's end) */
            int from = span_guard_reuse_from(&r->guard, seg, span, &wait);
            if (wait) end = span_guard_head_end(&r->guard, seg, span);
            if (wait || from >= 0) {
                if (!wait) end = from;
                break;
            }
        }
        int chunk = end - at < *budget ? end - at : *budget;
        if (chunk > 0 && plan_add(p, r, at, chunk, at + chunk == r->n_tokens)) return -1;
        *budget -= chunk;
        if (at + chunk < end || end == r->n_tokens || wait) break;
        at = span_guard_reuse_end(&r->guard, seg, span); /* past the reused span (its recomputed tail is next) */
        span++;
    }
    return 0;
}

/* PBKV's S = min(S_a, S_bw): the blocks the running requests still need to reach max_tokens stay
 * free (so a prefetch never forces a decode to evict); the cache finds the rest of S_a (free
 * blocks beyond those, and retired cache); the per-step copy volume caps it. */
static int prefetch_keep_free(const Scheduler *s) {
    int need = 0;
    for (int i = 0; i < s->n_running; i++) {
        const SchedRequest *r = s->running[i];
        int more = blocks_for(s, r->n_prompt + r->max_tokens) - r->n_blocks;
        if (more > 0) need += more;
    }
    return need;
}

static void prefetch(Scheduler *s) {
    int budget = s->prefetch_max_blocks, loaded = 0;
    if (budget <= 0) return;
    if (kv_cache_prefetch(&s->cache, budget, prefetch_keep_free(s), &loaded)) LOG_WARN("sched", "prefetch stopped: out of memory");
    if (loaded > 0) {
        s->counters.prefetch_steps++;
        event(s, "prefetch", NULL, "\"blocks\":%d,\"budget\":%d", loaded, budget);
    }
}

/* plan_prefill_chunk within r's tenant's part of the step's budget (sched_fair.h) when sharing is on. */
static int plan_prefill_fair(Scheduler *s, StepPlan *p, SchedRequest *r, int *budget) {
    if (!s->fair_share) return plan_prefill_chunk(s, p, r, budget);
    int allowed = sched_fair_allowance(&s->fair, r, *budget), left = allowed;
    if (allowed <= 0) return 0;
    if (plan_prefill_chunk(s, p, r, &left)) return -1;
    *budget -= allowed - left;
    sched_fair_charge(&s->fair, r, allowed - left, true, s->clock());
    return 0;
}

/* Whether r would read q's committed blocks: the same cache namespace and adapter. */
static bool same_cache_view(const SchedRequest *r, const SchedRequest *q) {
    return r->identity.tenant == q->identity.tenant && r->identity.adapter == q->identity.adapter && r->lora_id == q->lora_id &&
           r->kv_separate == q->kv_separate;
}

/* Issue 33 (b), prompts that share a head reaching an instance together. A step's blocks join the
 * tree only at sched_commit, after its forward, so a request packed into the same step as another
 * with its head (or admitted while that one is still prefilling in chunks) matches none of those
 * blocks and computes the whole head again. So r waits in the queue while a running request q of
 * its cache namespace is still to commit full prompt blocks r shares with it beyond what r could
 * match now; once q committed them, r is admitted as a cache hit. Never starving: r waits only
 * while the step has other work (p->n > 0: q's prefill, or decodes), and only behind a request
 * that is running and still prefilling: one preempted, finished or failed leads nothing. Returns
 * true when r should wait (counted, and logged as a shared_prefill_wait event). */
static bool wait_for_shared_prefill(Scheduler *s, const StepPlan *p, const SchedRequest *r) {
    if (!s->cache_enabled || p->n == 0 || r->n_tokens < 2) return false;
    int bs = s->block_size, limit = (r->n_tokens - 1) / bs, local = -1;
    for (int i = 0; i < s->n_running; i++) {
        const SchedRequest *q = s->running[i];
        if (q->n_computed >= q->n_tokens - 1 || !same_cache_view(r, q)) continue; /* q's prefill is over */
        int prompt_blocks = q->n_prompt / bs; /* what its prefill commits */
        if (q->approx_from >= 0 && q->approx_from / bs < prompt_blocks) prompt_blocks = q->approx_from / bs; /* exact blocks only */
        int shared = radix_shared_blocks(r->tokens, limit * bs, q->tokens, prompt_blocks * bs, bs);
        if (shared <= q->n_computed / bs) continue; /* q committed them already */
        if (local < 0) local = kv_cache_peek_prefix(&s->cache, &r->identity, r->tokens, r->n_tokens);
        if (shared <= local) continue;
        s->counters.shared_prefill_waits++;
        event(s, "shared_prefill_wait", r, "\"shared_blocks\":%d,\"cached_blocks\":%d", shared, local);
        return true;
    }
    return false;
}

/* Admits from the front of the queue (with fair sharing: the front of the least-served tenant's
 * requests) while the budget and the running set allow. */
static int admit_waiting(Scheduler *s, StepPlan *p, int *budget, BraidError *err) {
    while (s->n_waiting > 0 && *budget > 0 && s->n_running < s->max_running) {
        int at = s->fair_share ? sched_fair_pick(&s->fair, s->waiting, s->n_waiting, s->clock()) : 0;
        if (at < 0) break; /* every waiting tenant's part of the step is used */
        SchedRequest *r = s->waiting[at];
        if (wait_for_shared_prefill(s, p, r)) break; /* first come, first served: wait for the shared head's blocks */
        if (output_room_short(s, r, 0)) break; /* first come, first served: wait for the running ones to finish */
        int rc = admit(s, r, err);
        if (rc < 0) return -1;
        if (rc > 0) break; /* first come, first served: wait for blocks */
        /* Room in the running set first, so a failure leaves the request queued, not lost. */
        if (braid_grow((void **)&s->running, &s->cap_running, s->n_running + 1, sizeof *s->running)) {
            release_request(s, r);
            r->n_computed = 0;
            return braid_error_set(err, "sched: out of memory");
        }
        memmove(s->waiting + at, s->waiting + at + 1, (size_t)(s->n_waiting - at - 1) * sizeof *s->waiting);
        s->n_waiting--;
        s->running[s->n_running++] = r;
        r->state = REQ_RUNNING;
        unnote_waiting(s, r);
        if (plan_prefill_fair(s, p, r, budget)) return braid_error_set(err, "sched: out of memory");
    }
    return 0;
}

/* The running requests' next prefill chunks (with fair sharing: least-served tenant first, each
 * within what sched_fair allows; a request already in this step's plan is skipped). */
static int plan_running_prefills(Scheduler *s, StepPlan *p, int *budget) {
    const int *order = s->fair_share ? sched_fair_order(&s->fair, s->running, s->n_running, s->clock()) : NULL;
    for (int k = 0; k < s->n_running && *budget > 0; k++) {
        SchedRequest *r = s->running[order ? order[k] : k];
        if (r->n_computed < r->n_tokens - 1 && !in_plan(p, r) && plan_prefill_fair(s, p, r, budget)) return -1;
    }
    return 0;
}

int sched_plan(Scheduler *s, StepPlan *p, BraidError *err) {
    p->n = 0;
    p->n_tokens = 0;
    p->pure_decode = false;
    cache_ops_clear(&p->ops);
    kv_cache_step(&s->cache, s->clock());
    int budget = s->max_batch_tokens;
    if (plan_decodes(s, p, &budget)) return braid_error_set(err, "sched: out of memory");
    int n_decodes = p->n;
    if (s->fair_share) {
        double now = s->clock();
        sched_fair_begin_step(&s->fair, s->running, s->n_running, s->waiting, s->n_waiting, budget, s->fair_step_tokens, now);
        for (int i = 0; i < n_decodes; i++) sched_fair_charge(&s->fair, p->entries[i].req, p->entries[i].count, false, now);
    }
    if (plan_running_prefills(s, p, &budget)) return braid_error_set(err, "sched: out of memory");
    if (admit_waiting(s, p, &budget, err)) return -1;
    /* Fair sharing's second pass: what a tenant's part left unused goes to the others. */
    if (s->fair_share && budget > 0 && sched_fair_release_caps(&s->fair)) {
        if (plan_running_prefills(s, p, &budget)) return braid_error_set(err, "sched: out of memory");
        if (admit_waiting(s, p, &budget, err)) return -1;
    }
    if (p->n == 0 && s->n_waiting > 0 && s->n_running == 0 && kv_cache_pinned(&s->cache) > 0) {
        /* Pins are hints: when they alone keep the head of the queue out, they go (earliest
         * deadline first), so pinned memory never stalls the scheduler. */
        int freed = kv_cache_unpin_for(&s->cache, kv_cache_pinned(&s->cache));
        s->counters.pin_revocations++;
        event(s, "unpin", s->waiting[0], "\"blocks\":%d,\"pinned_left\":%d", freed, kv_cache_pinned(&s->cache));
        if (admit_waiting(s, p, &budget, err)) return -1;
    }
    if (p->n == 0 && s->n_waiting > 0 && s->n_running == 0) {
        /* Nothing runs and the head cannot be admitted: only possible if the tree holds locked
         * blocks, which an idle scheduler never has. Report rather than spin. */
        return braid_error_set(err, "sched: request %s cannot be admitted with an idle pool", s->waiting[0]->id);
    }
    /* Pure decode: no prefill chunk ran and nothing waiting could have been admitted (the running
     * set is full, or nothing waits). Only then does the host tier's bandwidth and the free pool
     * go to prefetching (PBKV §4.3: never against prefill traffic, never by evicting). */
    p->pure_decode = p->n > 0 && p->n == n_decodes && (s->n_waiting == 0 || s->n_running >= s->max_running);
    int sync_ops = s->cache.pending.n; /* what the prefetch adds may overlap the forward */
    if (p->pure_decode) {
        s->counters.pure_decode_steps++;
        if (s->prefetch) prefetch(s);
    }
    /* The cache's block operations run before this plan's forward. A plan with nothing to run
     * leaves them pending for the next one: list order still puts them before any reader. */
    if (p->n > 0 && kv_cache_take_ops(&s->cache, &p->ops)) return braid_error_set(err, "sched: out of memory");
    p->n_sync_ops = p->n > 0 ? sync_ops : 0;
    s->counters.steps++;
    return p->n;
}

void sched_commit(Scheduler *s, const StepPlan *p) {
    for (int i = 0; i < p->n; i++) {
        SchedRequest *r = p->entries[i].req;
        bool prefill = p->entries[i].start < r->n_prompt;
        r->n_computed = p->entries[i].start + p->entries[i].count;
        if (prefill) s->counters.prefilled_tokens += (uint64_t)p->entries[i].count;
        skip_reused(r);
        /* Prefill results are shared at once, so requests admitted in later steps reuse them
         * while this one still runs; decoded blocks join the tree when the request ends. */
        if (prefill) cache_computed_prefix(s, r, true);
    }
}

void sched_span_probe_result(Scheduler *s, SchedRequest *r, bool accept, double min_cos, int layer) {
    int span = r->next_span;
    if (span >= r->segments.n) return;
    const KvSegmentSpan *sp = &r->segments.spans[span];
    int lost = span_guard_decide(&r->guard, &r->segments, span, accept);
    if (accept) s->guard_counters.probes_ok++;
    else s->guard_counters.probes_rejected++;
    sched_span_guard_uncount(s, r, lost, true);
    if (!s->events) return;
    fprintf(s->events, "{\"t\":%.6f,\"event\":\"%s\",\"req\":", s->clock(), accept ? "probe_ok" : "probe_rejected");
    json_text_string(s->events, r->id);
    fprintf(s->events, ",\"span\":%d,\"tokens\":%d,\"min_cos\":%.5f,\"layer\":%d}\n", sp->dst_start, sp->n_tokens, min_cos, layer);
}

void sched_workflow_end(Scheduler *s, const char *workflow) { kv_cache_workflow_end(&s->cache, workflow); }

int sched_predict(Scheduler *s, const char *workflow, const char *agent, int k, int n_agents, const char *const *agents,
                  const float *prob, BraidError *err) {
    return kv_cache_predict(&s->cache, workflow, agent, k, n_agents, agents, prob, err);
}

int sched_check(const Scheduler *s, BraidError *err) {
    if (kv_cache_check(&s->cache, err)) return -1;
    return s->forkkv && residual_cache_check(&s->residual, err) ? braid_error_wrap(err, "residual tree") : 0;
}
