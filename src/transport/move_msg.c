#include "transport/move_msg.h"

#include <stdlib.h>
#include <string.h>

/* The most blocks one move lends: 2^20 blocks is 16 Mi tokens at 16 tokens a block, beyond any
 * context; a larger count is a corrupt message, not a request to allocate it. */
#define MOVE_MSG_MAX_BLOCKS (1 << 20)
/* A mover description is a worker address and a few keys: kilobytes. */
#define MOVE_MSG_MAX_DESC (1 << 20)

static int reader_ok(const WireReader *r) { return r->failed || r->off != r->len ? -1 : 0; }

void move_msg_export_encode(WireBuf *b, const MsgKvExport *m) {
    wire_put_u64(b, m->xfer_id);
    wire_put_str(b, m->tenant);
    wire_put_str(b, m->adapter);
    wire_put_i32s(b, m->tokens, m->n_tokens);
    wire_put_str(b, m->host);
    wire_put_u8(b, m->kv_layout);
}

int move_msg_export_decode(WireReader *r, MsgKvExport *m) {
    memset(m, 0, sizeof *m);
    m->xfer_id = wire_get_u64(r);
    m->tenant = wire_get_str(r);
    m->adapter = wire_get_str(r);
    m->tokens = wire_get_i32s(r, &m->n_tokens);
    m->host = wire_get_str(r);
    m->kv_layout = wire_get_u8(r);
    if (reader_ok(r) || m->n_tokens == 0) {
        move_msg_export_free(m);
        return -1;
    }
    return 0;
}

void move_msg_export_free(MsgKvExport *m) {
    free(m->tenant);
    free(m->adapter);
    free(m->tokens);
    free(m->host);
    memset(m, 0, sizeof *m);
}

const char *move_kv_layout_name(int layout) {
    switch (layout) {
    case MOVE_KV_LAYOUT_FP16: return "fp16 (CPU backend)";
    case MOVE_KV_LAYOUT_BF16: return "bf16 (CUDA backend)";
    default: return "unknown";
    }
}

void move_msg_exported_encode(WireBuf *b, const MsgKvExported *m) {
    wire_put_u64(b, m->xfer_id);
    wire_put_i32(b, m->n_blocks);
    wire_put(b, m->tiers, (size_t)m->n_blocks);
    wire_put(b, m->blocks, (size_t)m->n_blocks * sizeof *m->blocks);
    wire_put_i32(b, m->pool_blocks[0]);
    wire_put_i32(b, m->pool_blocks[1]);
    wire_put_u64(b, m->desc_len);
    wire_put(b, m->desc, m->desc_len);
    wire_put_str(b, m->why ? m->why : "");
}

int move_msg_exported_decode(WireReader *r, MsgKvExported *m) {
    memset(m, 0, sizeof *m);
    m->xfer_id = wire_get_u64(r);
    m->n_blocks = wire_get_i32(r);
    if (r->failed || m->n_blocks < 0 || m->n_blocks > MOVE_MSG_MAX_BLOCKS) return -1;
    m->tiers = malloc((size_t)m->n_blocks + 1);
    m->blocks = malloc(((size_t)m->n_blocks + 1) * sizeof *m->blocks);
    if (!m->tiers || !m->blocks) goto bad;
    wire_get(r, m->tiers, (size_t)m->n_blocks);
    wire_get(r, m->blocks, (size_t)m->n_blocks * sizeof *m->blocks);
    m->pool_blocks[0] = wire_get_i32(r);
    m->pool_blocks[1] = wire_get_i32(r);
    uint64_t desc_len = wire_get_u64(r);
    if (r->failed || desc_len > MOVE_MSG_MAX_DESC || !(m->desc = malloc(desc_len + 1))) goto bad;
    m->desc_len = (size_t)desc_len;
    wire_get(r, m->desc, m->desc_len);
    m->why = wire_get_str(r);
    if (reader_ok(r)) goto bad;
    for (int i = 0; i < m->n_blocks; i++)
        if (m->tiers[i] > 1 || m->blocks[i] < 1 || m->blocks[i] >= m->pool_blocks[m->tiers[i]]) goto bad;
    return 0;
bad:
    move_msg_exported_free(m);
    return -1;
}

void move_msg_exported_free(MsgKvExported *m) {
    free(m->tiers);
    free(m->blocks);
    free(m->desc);
    free(m->why);
    memset(m, 0, sizeof *m);
}

void move_msg_relay_encode(WireBuf *b, int from_rank, int to_rank, int type, const uint8_t *body, size_t body_len) {
    wire_put_i32(b, from_rank);
    wire_put_i32(b, to_rank);
    wire_put_i32(b, type);
    wire_put(b, body, body_len);
}

int move_msg_relay_decode(const uint8_t *data, size_t len, MsgKvRelay *m) {
    WireReader r = wire_reader(data, len);
    memset(m, 0, sizeof *m);
    m->from_rank = wire_get_i32(&r);
    m->to_rank = wire_get_i32(&r);
    m->type = wire_get_i32(&r);
    if (r.failed || m->from_rank < 1 || m->to_rank < 1) return -1;
    m->body = data + r.off;
    m->body_len = len - r.off;
    return 0;
}
