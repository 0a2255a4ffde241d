#include "transport/control_msg.h"

#include <stdlib.h>
#include <string.h>

static const char *const type_names[MSG_TYPE_END] = {
    [MSG_SUBMIT] = "submit", [MSG_CANCEL] = "cancel", [MSG_WORKFLOW_END] = "workflow_end", [MSG_SHUTDOWN] = "shutdown",
    [MSG_READY] = "ready", [MSG_TOKENS] = "tokens", [MSG_FINISH] = "finish", [MSG_STATS] = "stats",
    [MSG_KV_STORED] = "kv_stored", [MSG_KV_EVICTED] = "kv_evicted"};

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
    wire_put_str(b, m->tenant);
    wire_put_str(b, m->adapter);
    wire_put_str(b, m->workflow);
    wire_put_str(b, m->agent);
    wire_put_i32s(b, m->tokens, m->n_tokens);
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
    m->tenant = wire_get_str(r);
    m->adapter = wire_get_str(r);
    m->workflow = wire_get_str(r);
    m->agent = wire_get_str(r);
    m->tokens = wire_get_i32s(r, &m->n_tokens);
    if (reader_ok(r) || m->n_tokens == 0) {
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
    memset(m, 0, sizeof *m);
}

void msg_tokens_encode(WireBuf *b, const MsgTokens *m) {
    wire_put_i32(b, m->n);
    wire_put(b, m->req_ids, (size_t)m->n * sizeof *m->req_ids);
    wire_put(b, m->tokens, (size_t)m->n * sizeof *m->tokens);
}

int msg_tokens_decode(WireReader *r, MsgTokens *m) {
    memset(m, 0, sizeof *m);
    int32_t n = wire_get_i32(r);
    if (r->failed || n < 0 || (size_t)n * 12 != r->len - r->off) return -1;
    m->req_ids = malloc((size_t)n * sizeof *m->req_ids + 1);
    m->tokens = malloc((size_t)n * sizeof *m->tokens + 1);
    if (!m->req_ids || !m->tokens) {
        msg_tokens_free(m);
        return -1;
    }
    m->n = n;
    wire_get(r, m->req_ids, (size_t)n * sizeof *m->req_ids);
    wire_get(r, m->tokens, (size_t)n * sizeof *m->tokens);
    return reader_ok(r);
}

void msg_tokens_free(MsgTokens *m) {
    free(m->req_ids);
    free(m->tokens);
    memset(m, 0, sizeof *m);
}

void msg_finish_encode(WireBuf *b, const MsgFinish *m) {
    wire_put_u64(b, m->req_id);
    wire_put_u8(b, m->reason);
    wire_put_i32(b, m->prompt_tokens);
    wire_put_i32(b, m->cached_tokens);
    wire_put_i32(b, m->cached_tokens_host);
    wire_put_i32(b, m->completion_tokens);
    wire_put_i32(b, m->preemptions);
    wire_put_str(b, m->error);
}

int msg_finish_decode(WireReader *r, MsgFinish *m) {
    memset(m, 0, sizeof *m);
    m->req_id = wire_get_u64(r);
    m->reason = wire_get_u8(r);
    m->prompt_tokens = wire_get_i32(r);
    m->cached_tokens = wire_get_i32(r);
    m->cached_tokens_host = wire_get_i32(r);
    m->completion_tokens = wire_get_i32(r);
    m->preemptions = wire_get_i32(r);
    m->error = wire_get_str(r);
    if (reader_ok(r)) {
        msg_finish_free(m);
        return -1;
    }
    return 0;
}

void msg_finish_free(MsgFinish *m) {
    free(m->error);
    memset(m, 0, sizeof *m);
}

void msg_ready_encode(WireBuf *b, const MsgReady *m) {
    wire_put_u8(b, m->ok);
    wire_put_i32(b, m->n_blocks);
    wire_put_i32(b, m->block_size);
    wire_put_i32(b, m->context_length);
    wire_put_str(b, m->error);
}

int msg_ready_decode(WireReader *r, MsgReady *m) {
    memset(m, 0, sizeof *m);
    m->ok = wire_get_u8(r);
    m->n_blocks = wire_get_i32(r);
    m->block_size = wire_get_i32(r);
    m->context_length = wire_get_i32(r);
    m->error = wire_get_str(r);
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
                              m->host_total_blocks};
    const uint64_t counters[] = {m->cached_prompt_tokens_device, m->cached_prompt_tokens_host, m->computed_prompt_tokens,
                                 m->demoted_blocks, m->loaded_blocks, m->host_evicted_blocks, m->device_evicted_blocks,
                                 m->preemptions, m->generated_tokens};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++) wire_put_i32(b, gauges[i]);
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) wire_put_u64(b, counters[i]);
}

int msg_stats_decode(WireReader *r, MsgStats *m) {
    memset(m, 0, sizeof *m);
    int32_t *gauges[] = {&m->waiting, &m->running, &m->pool_used_blocks, &m->pool_total_blocks, &m->host_used_blocks,
                         &m->host_total_blocks};
    uint64_t *counters[] = {&m->cached_prompt_tokens_device, &m->cached_prompt_tokens_host, &m->computed_prompt_tokens,
                            &m->demoted_blocks, &m->loaded_blocks, &m->host_evicted_blocks, &m->device_evicted_blocks,
                            &m->preemptions, &m->generated_tokens};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++) *gauges[i] = wire_get_i32(r);
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) *counters[i] = wire_get_u64(r);
    return reader_ok(r);
}

void msg_hashes_encode(WireBuf *b, const MsgHashes *m) {
    wire_put_i32(b, m->n);
    wire_put(b, m->hashes, (size_t)m->n * sizeof *m->hashes);
}

int msg_hashes_decode(WireReader *r, MsgHashes *m) {
    memset(m, 0, sizeof *m);
    int32_t n = wire_get_i32(r);
    if (r->failed || n < 0 || (size_t)n * sizeof(uint64_t) != r->len - r->off) return -1;
    m->hashes = malloc((size_t)n * sizeof *m->hashes + 1);
    if (!m->hashes) return -1;
    m->n = n;
    wire_get(r, m->hashes, (size_t)n * sizeof *m->hashes);
    return reader_ok(r);
}

void msg_hashes_free(MsgHashes *m) {
    free(m->hashes);
    memset(m, 0, sizeof *m);
}
