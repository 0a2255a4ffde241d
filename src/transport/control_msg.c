#include "transport/control_msg.h"
#include "transport/directive_wire.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[MSG_TYPE_END] = {
    [MSG_SUBMIT] = "submit", [MSG_CANCEL] = "cancel", [MSG_WORKFLOW_END] = "workflow_end", [MSG_SHUTDOWN] = "shutdown",
    [MSG_READY] = "ready", [MSG_TOKENS] = "tokens", [MSG_FINISH] = "finish", [MSG_STATS] = "stats",
    [MSG_KV_EVENTS] = "kv_events", [MSG_PREDICT] = "predict", [MSG_HIDDEN] = "hidden",
    [MSG_REJOIN] = "rejoin", [MSG_KV_EXPORT] = "kv_export", [MSG_KV_EXPORTED] = "kv_exported",
    [MSG_KV_RELEASE] = "kv_release", [MSG_LORA_LOAD] = "lora_load", [MSG_LORA_UNLOAD] = "lora_unload",
    [MSG_LORA_RESULT] = "lora_result", [MSG_KV_RELAY] = "kv_relay", [MSG_COORD_ALIVE] = "coord_alive"};

const char *msg_type_name(int type) { return type > 0 && type < MSG_TYPE_END ? type_names[type] : "unknown"; }

const char *finish_reason_name(int reason) {
    static const char *const names[] = {"stop", "length", "cancelled", "error"};
    return reason >= 0 && reason <= FINISH_ERROR ? names[reason] : "error";
}

/* A decoder's verdict: 0 when every field was there and nothing was left over. */
static int reader_ok(const WireReader *r) { return r->failed || r->off != r->len ? -1 : 0; }

void msg_submit_encode(WireBuf *b, const MsgSubmit *m) {
    wire_put_u64(b, m->req_id);
    wire_put_i32(b, m->max_tokens);
    wire_put_f32(b, m->temperature);
    wire_put_f32(b, m->top_p);
    wire_put_i32(b, m->top_k);
    wire_put_u64(b, m->seed);
    wire_put_u8(b, m->ignore_eos);
    wire_put_u8(b, m->want_hidden);
    wire_put_u8(b, m->segment_mode);
    wire_put_u8(b, m->want_logprobs);
    wire_put_i32(b, m->logprobs_top);
    wire_put_str(b, m->tenant);
    wire_put_str(b, m->adapter);
    wire_put_str(b, m->workflow);
    wire_put_str(b, m->agent);
    wire_put_i32s(b, m->tokens, m->n_tokens);
    wire_put_directives(b, &m->directives);
    wire_put_i32(b, m->pull_rank);
    wire_put_i32(b, m->pull_blocks);
    wire_put_str(b, m->grammar);
    wire_put_f32(b, m->tenant_weight);
}

int msg_submit_decode(WireReader *r, MsgSubmit *m) {
    memset(m, 0, sizeof *m);
    m->req_id = wire_get_u64(r);
    m->max_tokens = wire_get_i32(r);
    m->temperature = wire_get_f32(r);
    m->top_p = wire_get_f32(r);
    m->top_k = wire_get_i32(r);
    m->seed = wire_get_u64(r);
    m->ignore_eos = wire_get_u8(r);
    m->want_hidden = wire_get_u8(r);
    m->segment_mode = wire_get_u8(r);
    m->want_logprobs = wire_get_u8(r);
    m->logprobs_top = wire_get_i32(r);
    m->tenant = wire_get_str(r);
    m->adapter = wire_get_str(r);
    m->workflow = wire_get_str(r);
    m->agent = wire_get_str(r);
    m->tokens = wire_get_i32s(r, &m->n_tokens);
    if (wire_get_directives(r, &m->directives)) r->failed = true;
    m->pull_rank = wire_get_i32(r);
    m->pull_blocks = wire_get_i32(r);
    m->grammar = wire_get_str(r);
    m->tenant_weight = wire_get_f32(r);
    if (!(m->tenant_weight > 0 && m->tenant_weight < 1e30f)) m->tenant_weight = 1.0f;
    if (reader_ok(r) || m->n_tokens == 0 || m->logprobs_top < 0 || m->logprobs_top > TOKEN_LOGPROB_MAX_TOP) {
        msg_submit_free(m);
        return -1;
    }
    return 0;
}

void msg_submit_free(MsgSubmit *m) {
    free(m->tenant);
    free(m->adapter);
    free(m->workflow);
    free(m->agent);
    free(m->tokens);
    free(m->grammar);
    cache_directives_free(&m->directives);
    memset(m, 0, sizeof *m);
}

void msg_tokens_encode(WireBuf *b, const MsgTokens *m) {
    wire_put_i32(b, m->n);
    wire_put(b, m->req_ids, (size_t)m->n * sizeof *m->req_ids);
    wire_put(b, m->tokens, (size_t)m->n * sizeof *m->tokens);
    for (int i = 0; i < m->n; i++) {
        bool has = m->has_logprob && m->has_logprob[i];
        wire_put_u8(b, has);
        if (!has) continue;
        const TokenLogprob *lp = &m->logprobs[i];
        int n_top = lp->n_top < 0 ? 0 : lp->n_top > TOKEN_LOGPROB_MAX_TOP ? TOKEN_LOGPROB_MAX_TOP : lp->n_top;
        wire_put_f32(b, lp->logprob);
        wire_put_i32(b, n_top);
        for (int k = 0; k < n_top; k++) wire_put_i32(b, lp->top_ids[k]);
        for (int k = 0; k < n_top; k++) wire_put_f32(b, lp->top_logprobs[k]);
    }
}

static int decode_logprob(WireReader *r, TokenLogprob *lp) {
    lp->logprob = wire_get_f32(r);
    lp->n_top = wire_get_i32(r);
    if (r->failed || lp->n_top < 0 || lp->n_top > TOKEN_LOGPROB_MAX_TOP) return -1;
    for (int k = 0; k < lp->n_top; k++) lp->top_ids[k] = wire_get_i32(r);
    for (int k = 0; k < lp->n_top; k++) lp->top_logprobs[k] = wire_get_f32(r);
    return r->failed ? -1 : 0;
}

int msg_tokens_decode(WireReader *r, MsgTokens *m) {
    memset(m, 0, sizeof *m);
    int32_t n = wire_get_i32(r);
    /* 13 bytes per token at least: id, token, logprob flag. */
    if (r->failed || n < 0 || (size_t)n * 13 > r->len - r->off) return -1;
    m->req_ids = malloc((size_t)n * sizeof *m->req_ids + 1);
    m->tokens = malloc((size_t)n * sizeof *m->tokens + 1);
    m->has_logprob = calloc((size_t)n + 1, 1);
    m->logprobs = NULL;
    if (!m->req_ids || !m->tokens || !m->has_logprob) {
        msg_tokens_free(m);
        return -1;
    }
    m->n = n;
    wire_get(r, m->req_ids, (size_t)n * sizeof *m->req_ids);
    wire_get(r, m->tokens, (size_t)n * sizeof *m->tokens);
    for (int i = 0; i < n; i++) {
        uint8_t has = wire_get_u8(r);
        if (r->failed || has > 1) return msg_tokens_free(m), -1;
        if (!has) continue;
        if (!m->logprobs && !(m->logprobs = calloc((size_t)n, sizeof *m->logprobs))) return msg_tokens_free(m), -1;
        m->has_logprob[i] = 1;
        if (decode_logprob(r, &m->logprobs[i])) return msg_tokens_free(m), -1;
    }
    if (reader_ok(r)) return msg_tokens_free(m), -1;
    return 0;
}

void msg_tokens_free(MsgTokens *m) {
    free(m->req_ids);
    free(m->tokens);
    free(m->has_logprob);
    free(m->logprobs);
    memset(m, 0, sizeof *m);
}

const char *move_link_name(int link) {
    switch (link) {
    case MOVE_LINK_NONE: return "none";
    case MOVE_LINK_HOST: return "host_ucx";
    case MOVE_LINK_CUDA_IPC: return "cuda_ipc";
    case MOVE_LINK_CUDA_STAGED: return "cuda_staged";
    default: return "unknown";
    }
}

void msg_finish_encode(WireBuf *b, const MsgFinish *m) {
    wire_put_u64(b, m->req_id);
    wire_put_u8(b, m->reason);
    wire_put_i32(b, m->prompt_tokens);
    wire_put_i32(b, m->cached_tokens);
    wire_put_i32(b, m->cached_tokens_host);
    wire_put_i32(b, m->cached_tokens_remote);
    wire_put_i32(b, m->reused_tokens);
    wire_put_i32(b, m->completion_tokens);
    wire_put_i32(b, m->preemptions);
    wire_put_str(b, m->error);
    wire_put_str(b, m->directive_outcomes);
    wire_put_f64(b, m->move_s);
    wire_put_u8(b, m->move_link);
}

int msg_finish_decode(WireReader *r, MsgFinish *m) {
    memset(m, 0, sizeof *m);
    m->req_id = wire_get_u64(r);
    m->reason = wire_get_u8(r);
    m->prompt_tokens = wire_get_i32(r);
    m->cached_tokens = wire_get_i32(r);
    m->cached_tokens_host = wire_get_i32(r);
    m->cached_tokens_remote = wire_get_i32(r);
    m->reused_tokens = wire_get_i32(r);
    m->completion_tokens = wire_get_i32(r);
    m->preemptions = wire_get_i32(r);
    m->error = wire_get_str(r);
    m->directive_outcomes = wire_get_str(r);
    m->move_s = wire_get_f64(r);
    m->move_link = wire_get_u8(r);
    if (reader_ok(r)) {
        msg_finish_free(m);
        return -1;
    }
    return 0;
}

void msg_finish_free(MsgFinish *m) {
    free(m->error);
    free(m->directive_outcomes);
    memset(m, 0, sizeof *m);
}

void msg_ready_encode(WireBuf *b, const MsgReady *m) {
    wire_put_u8(b, m->ok);
    wire_put_i32(b, m->n_blocks);
    wire_put_i32(b, m->block_size);
    wire_put_i32(b, m->context_length);
    wire_put_u8(b, m->kv_moves);
    wire_put_u64(b, m->block_bytes);
    wire_put_str(b, m->error);
    wire_put_i32(b, m->n_layers);
}

int msg_ready_decode(WireReader *r, MsgReady *m) {
    memset(m, 0, sizeof *m);
    m->ok = wire_get_u8(r);
    m->n_blocks = wire_get_i32(r);
    m->block_size = wire_get_i32(r);
    m->context_length = wire_get_i32(r);
    m->kv_moves = wire_get_u8(r);
    m->block_bytes = wire_get_u64(r);
    m->error = wire_get_str(r);
    m->n_layers = wire_get_i32(r);
    if (reader_ok(r)) {
        msg_ready_free(m);
        return -1;
    }
    return 0;
}

void msg_ready_free(MsgReady *m) {
    free(m->error);
    memset(m, 0, sizeof *m);
}

/* Field by field (not the struct's bytes), so padding never travels and the order is explicit. */
void msg_stats_encode(WireBuf *b, const MsgStats *m) {
    const int32_t gauges[] = {m->waiting, m->running, m->pool_used_blocks, m->pool_total_blocks, m->host_used_blocks,
                              m->host_total_blocks, m->pinned_blocks, m->residual_used_blocks, m->residual_total_blocks};
    const uint64_t counters[] = {m->cached_prompt_tokens_device, m->cached_prompt_tokens_host, m->computed_prompt_tokens,
                                 m->demoted_blocks, m->loaded_blocks, m->host_evicted_blocks, m->device_evicted_blocks,
                                 m->preemptions, m->generated_tokens, m->prefetched_blocks, m->prefetch_hit_blocks,
                                 m->prefetch_wasted_blocks, m->segment_reused_tokens, m->segment_candidates, m->segments_exact,
                                 m->segments_approx, m->segments_rejected_context, m->segments_rejected_window,
                                 m->segment_flops_saved, m->directive_requests, m->pins, m->pin_expired_blocks,
                                 m->pin_revoked_blocks, m->spliced_tokens, m->shared_hit_tokens, m->directive_evicted_blocks,
                                 m->residual_hit_tokens, m->fork_tokens, m->partial_hit_tokens, m->residual_evicted_blocks,
                                 m->moved_in_blocks, m->moved_in_bytes, m->move_failures, m->lent_blocks,
                                 m->segment_lsh_candidates, m->segment_lsh_admitted, m->segment_lsh_reused_tokens,
                                 m->segment_probes_ok, m->segment_probes_rejected, m->prefilled_tokens,
                                 m->move_declines, m->move_followers};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++) wire_put_i32(b, gauges[i]);
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) wire_put_u64(b, counters[i]);
}

int msg_stats_decode(WireReader *r, MsgStats *m) {
    memset(m, 0, sizeof *m);
    int32_t *gauges[] = {&m->waiting, &m->running, &m->pool_used_blocks, &m->pool_total_blocks, &m->host_used_blocks,
                         &m->host_total_blocks, &m->pinned_blocks, &m->residual_used_blocks, &m->residual_total_blocks};
    uint64_t *counters[] = {&m->cached_prompt_tokens_device, &m->cached_prompt_tokens_host, &m->computed_prompt_tokens,
                            &m->demoted_blocks, &m->loaded_blocks, &m->host_evicted_blocks, &m->device_evicted_blocks,
                            &m->preemptions, &m->generated_tokens, &m->prefetched_blocks, &m->prefetch_hit_blocks,
                            &m->prefetch_wasted_blocks, &m->segment_reused_tokens, &m->segment_candidates,
                            &m->segments_exact, &m->segments_approx, &m->segments_rejected_context,
                            &m->segments_rejected_window, &m->segment_flops_saved, &m->directive_requests, &m->pins,
                            &m->pin_expired_blocks, &m->pin_revoked_blocks, &m->spliced_tokens, &m->shared_hit_tokens,
                            &m->directive_evicted_blocks, &m->residual_hit_tokens, &m->fork_tokens, &m->partial_hit_tokens,
                            &m->residual_evicted_blocks, &m->moved_in_blocks, &m->moved_in_bytes, &m->move_failures,
                            &m->lent_blocks, &m->segment_lsh_candidates, &m->segment_lsh_admitted,
                            &m->segment_lsh_reused_tokens, &m->segment_probes_ok, &m->segment_probes_rejected,
                            &m->prefilled_tokens, &m->move_declines, &m->move_followers};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++) *gauges[i] = wire_get_i32(r);
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) *counters[i] = wire_get_u64(r);
    return reader_ok(r);
}

static const char *const reason_names[KV_REASON_END] = {
    [KV_REASON_INSERT] = "insert", [KV_REASON_DEMOTE] = "demote", [KV_REASON_LOAD] = "load", [KV_REASON_EVICT] = "evict",
    [KV_REASON_HOST_EVICT] = "host_evict", [KV_REASON_CLEAR] = "clear", [KV_REASON_OTHER] = "other"};

const char *kv_reason_name(int reason) { return reason >= 0 && reason < KV_REASON_END ? reason_names[reason] : "other"; }

int kv_reason_code(const char *name) {
    for (int i = 0; name && i < KV_REASON_OTHER; i++)
        if (strcmp(name, reason_names[i]) == 0) return i;
    return KV_REASON_OTHER;
}

const char *kv_event_type_name(int kind) {
    switch (kind) {
    case KV_EVENT_STORED: return "BlockStored";
    case KV_EVENT_REMOVED: return "BlockRemoved";
    case KV_EVENT_CLEARED: return "AllBlocksCleared";
    default: return "unknown";
    }
}

/* The smallest encoded event: four u8, the parent hash, two empty strings, an empty hash list, the
 * block size and an empty token list. */
enum { KV_EVENT_MIN_BYTES = 4 + 8 + 4 + 4 + 4 + 4 + 4 };

void msg_kv_events_begin(WireBuf *b) { wire_put_i32(b, 0); }

void msg_kv_event_append(WireBuf *b, const MsgKvEvent *e) {
    wire_put_u8(b, e->kind);
    wire_put_u8(b, e->tier);
    wire_put_u8(b, e->reason);
    wire_put_u8(b, e->tiers_after);
    wire_put_u64(b, e->parent_hash);
    wire_put_str(b, e->tenant);
    wire_put_str(b, e->adapter);
    int n = e->n_blocks > 0 ? e->n_blocks : 0;
    wire_put_i32(b, n);
    wire_put(b, e->hashes, (size_t)n * sizeof *e->hashes);
    wire_put_i32(b, e->block_size);
    wire_put_i32s(b, e->tokens, e->tokens ? e->n_tokens : 0);
}

void msg_kv_events_finish(WireBuf *b, int n) {
    int32_t count = n;
    if (!b->failed && b->len >= sizeof count) memcpy(b->data, &count, sizeof count);
}

void msg_kv_events_encode(WireBuf *b, const MsgKvEvent *events, int n) {
    msg_kv_events_begin(b);
    for (int i = 0; i < n; i++) msg_kv_event_append(b, &events[i]);
    msg_kv_events_finish(b, n);
}

static int kv_event_decode(WireReader *r, MsgKvEvent *e) {
    e->kind = wire_get_u8(r);
    e->tier = wire_get_u8(r);
    e->reason = wire_get_u8(r);
    e->tiers_after = wire_get_u8(r);
    e->parent_hash = wire_get_u64(r);
    if (r->failed || e->kind < KV_EVENT_STORED || e->kind > KV_EVENT_CLEARED || e->tier > KV_TIER_HOST ||
        (e->tiers_after & ~(KV_ON_DEVICE | KV_ON_HOST)))
        return -1;
    if (e->reason >= KV_REASON_END) e->reason = KV_REASON_OTHER;
    e->tenant = wire_get_str(r);
    e->adapter = wire_get_str(r);
    int32_t n = wire_get_i32(r);
    if (r->failed || n < 0 || (size_t)n > (r->len - r->off) / sizeof(uint64_t)) return -1;
    e->hashes = malloc((size_t)n * sizeof *e->hashes + 1);
    if (!e->hashes) return -1;
    e->n_blocks = n;
    wire_get(r, e->hashes, (size_t)n * sizeof *e->hashes);
    e->block_size = wire_get_i32(r);
    e->tokens = wire_get_i32s(r, &e->n_tokens);
    return r->failed || e->block_size < 0 ? -1 : 0;
}

int msg_kv_events_decode(WireReader *r, MsgKvEvents *m) {
    memset(m, 0, sizeof *m);
    int32_t n = wire_get_i32(r);
    if (r->failed || n < 0 || (size_t)n > (r->len - r->off) / KV_EVENT_MIN_BYTES) return -1;
    m->events = calloc((size_t)n + 1, sizeof *m->events);
    if (!m->events) return -1;
    m->n = n;
    for (int i = 0; i < n; i++) {
        if (kv_event_decode(r, &m->events[i])) {
            msg_kv_events_free(m);
            return -1;
        }
    }
    if (reader_ok(r)) {
        msg_kv_events_free(m);
        return -1;
    }
    return 0;
}

void msg_kv_events_free(MsgKvEvents *m) {
    for (int i = 0; m->events && i < m->n; i++) {
        free(m->events[i].tenant);
        free(m->events[i].adapter);
        free(m->events[i].hashes);
        free(m->events[i].tokens);
    }
    free(m->events);
    memset(m, 0, sizeof *m);
}

void msg_predict_encode(WireBuf *b, const MsgPredict *m) {
    wire_put_str(b, m->workflow);
    wire_put_str(b, m->agent);
    wire_put_i32(b, m->k);
    wire_put_i32(b, m->n_agents);
    for (int i = 0; i < m->n_agents; i++) wire_put_str(b, m->agents[i]);
    for (size_t i = 0; i < (size_t)m->k * (size_t)m->n_agents; i++) wire_put_f32(b, m->prob[i]);
}

int msg_predict_decode(WireReader *r, MsgPredict *m) {
    memset(m, 0, sizeof *m);
    m->workflow = wire_get_str(r);
    m->agent = wire_get_str(r);
    int32_t k = wire_get_i32(r), n = wire_get_i32(r);
    /* Each name takes at least its 4-byte length, each probability 4 bytes. */
    if (r->failed || !m->workflow[0] || k < 1 || k > MSG_PREDICT_MAX_K || n < 0 || n > MSG_PREDICT_MAX_AGENTS ||
        (size_t)n * (4 + 4 * (size_t)k) > r->len - r->off)
        goto bad;
    m->k = k;
    m->agents = calloc((size_t)n + 1, sizeof *m->agents);
    m->prob = malloc((size_t)k * (size_t)n * sizeof *m->prob + 1);
    if (!m->agents || !m->prob) goto bad;
    for (; m->n_agents < n; m->n_agents++)
        if (!(m->agents[m->n_agents] = wire_get_str(r))) goto bad;
    if ((size_t)k * (size_t)n * sizeof *m->prob != r->len - r->off) goto bad;
    for (size_t i = 0; i < (size_t)k * (size_t)n; i++) {
        float p = wire_get_f32(r);
        if (!isfinite(p) || p < 0.0f || p > 1.001f) goto bad; /* a little over 1: float rounding of a sure thing */
        m->prob[i] = p < 1.0f ? p : 1.0f;
    }
    if (reader_ok(r) == 0) return 0;
bad:
    msg_predict_free(m);
    return -1;
}

void msg_predict_free(MsgPredict *m) {
    free(m->workflow);
    free(m->agent);
    for (int i = 0; m->agents && i < m->n_agents; i++) free(m->agents[i]);
    free(m->agents);
    free(m->prob);
    memset(m, 0, sizeof *m);
}

void msg_hidden_encode(WireBuf *b, const MsgHidden *m) {
    wire_put_u64(b, m->req_id);
    wire_put_i32(b, m->dim);
    for (int i = 0; i < m->dim; i++) wire_put_f32(b, m->values[i]);
}

int msg_hidden_decode(WireReader *r, MsgHidden *m) {
    memset(m, 0, sizeof *m);
    m->req_id = wire_get_u64(r);
    int32_t dim = wire_get_i32(r);
    if (r->failed || dim < 1 || dim > MSG_HIDDEN_MAX_DIM || (size_t)dim * 4 != r->len - r->off) return -1;
    if (!(m->values = malloc((size_t)dim * sizeof *m->values))) return -1;
    m->dim = dim;
    for (int i = 0; i < dim; i++) {
        m->values[i] = wire_get_f32(r);
        if (!isfinite(m->values[i])) {
            msg_hidden_free(m);
            return -1;
        }
    }
    if (reader_ok(r)) {
        msg_hidden_free(m);
        return -1;
    }
    return 0;
}

void msg_hidden_free(MsgHidden *m) {
    free(m->values);
    memset(m, 0, sizeof *m);
}
