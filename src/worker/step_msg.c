#include "worker/step_msg.h"

#include <stdlib.h>
#include <string.h>

static int blocks_for(int n_ctx, int block_size) { return (n_ctx + block_size - 1) / block_size; }

#define OP_WIRE_BYTES 19 /* kind u8, src, dst, delta i32, src_slot, dst_slot, n_slots i16 */

static void encode_ops(WireBuf *b, const CacheOpList *ops) {
    int n = ops ? ops->n : 0;
    wire_put_i32(b, n);
    for (int i = 0; i < n; i++) {
        const CacheOp *op = &ops->ops[i];
        wire_put_u8(b, op->kind);
        wire_put_i32(b, op->src);
        wire_put_i32(b, op->dst);
        wire_put_i32(b, op->delta);
        wire_put(b, &op->src_slot, sizeof op->src_slot);
        wire_put(b, &op->dst_slot, sizeof op->dst_slot);
        wire_put(b, &op->n_slots, sizeof op->n_slots);
    }
}

void step_msg_encode(WireBuf *b, StepKind kind, const ForwardBatch *fb, const CacheOpList *ops, int block_size) {
    wire_put_u8(b, (uint8_t)kind);
    if (kind != STEP_FORWARD) return;
    wire_put_i32s(b, fb->tokens, fb->n_tokens);
    wire_put_i32s(b, fb->positions, fb->n_tokens);
    wire_put_i32s(b, fb->slot_mapping, fb->n_tokens);
    wire_put_i32s(b, fb->seq_start, fb->n_seqs + 1);
    wire_put_i32s(b, fb->seq_n_ctx, fb->n_seqs);
    int total = 0;
    for (int s = 0; s < fb->n_seqs; s++) total += blocks_for(fb->seq_n_ctx[s], block_size);
    wire_put_i32(b, total);
    for (int s = 0; s < fb->n_seqs; s++)
        wire_put(b, fb->block_tables[s], (size_t)blocks_for(fb->seq_n_ctx[s], block_size) * sizeof(int32_t));
    encode_ops(b, ops);
}

/* The operation list; -1 when its count does not fit the bytes left, a kind is unknown, or memory runs out. */
static int decode_ops(WireReader *r, CacheOpList *ops) {
    int n = wire_get_i32(r);
    if (r->failed || n < 0 || (size_t)n > (r->len - r->off) / OP_WIRE_BYTES) return -1;
    for (int i = 0; i < n; i++) {
        uint8_t kind = wire_get_u8(r);
        int32_t src = wire_get_i32(r), dst = wire_get_i32(r), delta = wire_get_i32(r);
        int16_t slots[3];
        wire_get(r, slots, sizeof slots);
        if (r->failed || kind < CACHE_OP_COPY || kind > CACHE_OP_COPY_SLOTS) return -1;
        if (cache_ops_push(ops, (CacheOpKind)kind, src, dst, delta)) return -1;
        ops->ops[ops->n - 1].src_slot = slots[0];
        ops->ops[ops->n - 1].dst_slot = slots[1];
        ops->ops[ops->n - 1].n_slots = slots[2];
    }
    return 0;
}

/* Checks the decoded arrays agree with each other before the forward pass trusts them. */
static int consistent(const StepMsg *m, int n_tok, int n_pos, int n_slots, int n_start, int n_ctx) {
    if (n_tok <= 0 || n_pos != n_tok || n_slots != n_tok || n_start < 2 || n_ctx != n_start - 1) return 0;
    if (m->seq_start[0] != 0 || m->seq_start[n_ctx] != n_tok) return 0;
    for (int s = 0; s < n_ctx; s++)
        if (m->seq_start[s + 1] < m->seq_start[s] || m->seq_ctx[s] < 1) return 0;
    return 1;
}

void step_msg_encode_move(WireBuf *b, const CacheOpList *ops, const StepMove *mv) {
    wire_put_u8(b, STEP_MOVE);
    encode_ops(b, ops);
    wire_put_u64(b, mv->xfer_id);
    wire_put_i32(b, mv->lender_rank);
    wire_put_i32(b, mv->pool_blocks[0]);
    wire_put_i32(b, mv->pool_blocks[1]);
    wire_put_u64(b, mv->desc_len);
    wire_put(b, mv->desc, mv->desc_len);
    wire_put_i32(b, mv->n_runs);
    for (int i = 0; i < mv->n_runs; i++) {
        wire_put_u8(b, mv->runs[i].tier);
        wire_put_i32(b, mv->runs[i].src);
        wire_put_i32(b, mv->runs[i].dst);
        wire_put_i32(b, mv->runs[i].count);
    }
    wire_put_f64(b, mv->timeout_s);
}

static int decode_move(WireReader *r, StepMsg *m) {
    StepMove *mv = &m->move;
    if (decode_ops(r, &m->ops)) return -1;
    mv->xfer_id = wire_get_u64(r);
    mv->lender_rank = wire_get_i32(r);
    mv->pool_blocks[0] = wire_get_i32(r);
    mv->pool_blocks[1] = wire_get_i32(r);
    uint64_t desc_len = wire_get_u64(r);
    if (r->failed || desc_len > r->len - r->off || !(mv->desc = malloc(desc_len + 1))) return -1;
    mv->desc_len = (size_t)desc_len;
    wire_get(r, mv->desc, mv->desc_len);
    mv->n_runs = wire_get_i32(r);
    if (r->failed || mv->n_runs < 0 || (size_t)mv->n_runs > (r->len - r->off) / 13) return -1;
    if (!(mv->runs = malloc(((size_t)mv->n_runs + 1) * sizeof *mv->runs))) return -1;
    for (int i = 0; i < mv->n_runs; i++) {
        MoveRun *run = &mv->runs[i];
        run->tier = wire_get_u8(r);
        run->src = wire_get_i32(r);
        run->dst = wire_get_i32(r);
        run->count = wire_get_i32(r);
        if (run->tier > 1 || run->count < 1 || run->src < 1 || run->dst < 1 || run->src > mv->pool_blocks[run->tier] - run->count)
            return -1;
    }
    mv->timeout_s = wire_get_f64(r);
    return r->failed || r->off != r->len ? -1 : 0;
}

int step_msg_decode(WireReader *r, int block_size, StepMsg *m) {
    memset(m, 0, sizeof *m);
    m->kind = (StepKind)wire_get_u8(r);
    if (r->failed) return -1;
    if (m->kind == STEP_STOP || m->kind == STEP_STOP_LOST_RANKS) return r->off == r->len ? 0 : -1;
    if (m->kind == STEP_MOVE) {
        if (decode_move(r, m) == 0) return 0;
        step_msg_free(m);
        return -1;
    }
    if (m->kind != STEP_FORWARD) return -1;
    int n_tok, n_pos, n_slots, n_start, n_ctx;
    m->tokens = wire_get_i32s(r, &n_tok);
    m->positions = wire_get_i32s(r, &n_pos);
    m->slots = wire_get_i32s(r, &n_slots);
    m->seq_start = wire_get_i32s(r, &n_start);
    m->seq_ctx = wire_get_i32s(r, &n_ctx);
    if (r->failed || !consistent(m, n_tok, n_pos, n_slots, n_start, n_ctx)) goto bad;
    int total = wire_get_i32(r), want = 0;
    for (int s = 0; s < n_ctx; s++) want += blocks_for(m->seq_ctx[s], block_size);
    if (r->failed || total != want) goto bad;
    m->table_data = malloc((size_t)total * sizeof *m->table_data + 1);
    m->tables = malloc((size_t)n_ctx * sizeof *m->tables);
    if (!m->table_data || !m->tables) goto bad;
    wire_get(r, m->table_data, (size_t)total * sizeof *m->table_data);
    if (r->failed || decode_ops(r, &m->ops) || r->off != r->len) goto bad;
    for (int s = 0, off = 0; s < n_ctx; off += blocks_for(m->seq_ctx[s], block_size), s++) m->tables[s] = m->table_data + off;
    m->batch = (ForwardBatch){.n_tokens = n_tok, .tokens = m->tokens, .positions = m->positions, .slot_mapping = m->slots,
                              .n_seqs = n_ctx, .seq_start = m->seq_start, .block_tables = (const int32_t *const *)m->tables,
                              .seq_n_ctx = m->seq_ctx};
    return 0;
bad:
    step_msg_free(m);
    return -1;
}

void step_msg_free(StepMsg *m) {
    free(m->tokens);
    free(m->positions);
    free(m->slots);
    free(m->seq_start);
    free(m->seq_ctx);
    free(m->table_data);
    free(m->tables);
    cache_ops_free(&m->ops);
    free(m->move.desc);
    free(m->move.runs);
    memset(m, 0, sizeof *m);
}
