/* The cluster's pure pieces: control-message encodings (SUBMIT with the identity names, FINISH
 * and STATS with per-tier counters, KV_EVENTS batches, PREDICT forecasts) and step-plan encodings (round trip with cache
 * operations, truncated and corrupt input),
 * the router's per-instance block index and its choices, streamed text with stop strings and
 * split UTF-8, and the tensor-parallel shard ranges. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coord/block_index.h"
#include "coord/move_plan.h"
#include "coord/router.h"
#include "coord/text_stream.h"
#include "model/gguf.h"
#include "test_paths.h"
#include "model/weight_shard.h"
#include "model/tensor_types.h"
#include "transport/control_msg.h"
#include "transport/move_msg.h"
#include "worker/step_msg.h"

static void test_submit_round_trip(void **state) {
    (void)state;
    int32_t toks[] = {5, 6, 7, 8}, context[] = {5, 9, 9, 8};
    /* With cache directives: a splice's context and runs, a pin and a share naming tenants. */
    CacheSpliceRun runs[] = {{.dst = 0, .src = 0, .len = 1, .index = -1}, {.dst = 3, .src = 3, .len = 1, .index = 0}};
    char *with[] = {"t1", "t2"};
    CacheHint hints[] = {{.op = CACHE_HINT_PIN, .index = 1, .start = 0, .end = 4, .ttl_s = 300},
                         {.op = CACHE_HINT_SHARE, .index = 2, .start = 0, .end = 2, .n_with = 2, .with = with}};
    CacheDirectives d = {.splice_mode = CACHE_SPLICE_AMORTIZE, .first_edit = 1, .context = context, .n_context = 4, .runs = runs,
                         .n_runs = 2, .hints = hints, .n_hints = 2};
    MsgSubmit in = {.req_id = 42, .max_tokens = 9, .temperature = 0.5f, .top_p = 0.9f, .top_k = 3, .seed = 77, .ignore_eos = 1,
                    .tenant = "acme \xC3\xA9", .adapter = "lora-7", .workflow = "wf", .agent = "coder", .tokens = toks, .n_tokens = 4,
                    .directives = d, .pull_rank = 3, .pull_blocks = 17};
    WireBuf b = {0};
    msg_submit_encode(&b, &in);
    MsgSubmit out;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(msg_submit_decode(&r, &out), 0);
    assert_true(out.req_id == 42 && out.max_tokens == 9 && out.top_k == 3 && out.seed == 77 && out.ignore_eos == 1);
    assert_true(out.pull_rank == 3 && out.pull_blocks == 17); /* the KV move hint */
    /* The identity arrives as the exact names, not a hash of them. */
    assert_string_equal(out.tenant, "acme \xC3\xA9");
    assert_string_equal(out.adapter, "lora-7");
    assert_string_equal(out.workflow, "wf");
    assert_string_equal(out.agent, "coder");
    assert_int_equal(out.n_tokens, 4);
    assert_memory_equal(out.tokens, toks, sizeof toks);
    assert_int_equal(out.directives.splice_mode, CACHE_SPLICE_AMORTIZE);
    assert_int_equal(out.directives.n_context, 4);
    assert_memory_equal(out.directives.context, context, sizeof context);
    assert_int_equal(out.directives.n_runs, 2);
    assert_memory_equal(out.directives.runs, runs, sizeof runs);
    assert_int_equal(out.directives.n_hints, 2);
    assert_true(out.directives.hints[0].op == CACHE_HINT_PIN && out.directives.hints[0].ttl_s == 300 && out.directives.hints[0].end == 4);
    assert_true(out.directives.hints[1].n_with == 2 && strcmp(out.directives.hints[1].with[1], "t2") == 0);
    msg_submit_free(&out);
    /* Absent names travel as empty strings. */
    WireBuf nb = {0};
    msg_submit_encode(&nb, &(MsgSubmit){.req_id = 1, .tokens = toks, .n_tokens = 1});
    WireReader nr = wire_reader(nb.data, nb.len);
    assert_int_equal(msg_submit_decode(&nr, &out), 0);
    assert_true(out.tenant && !out.tenant[0] && out.adapter && !out.adapter[0] && out.workflow && !out.workflow[0]);
    msg_submit_free(&out);
    wire_buf_free(&nb);
    /* Every truncation, and one byte too many, is refused rather than misread. */
    for (size_t cut = 0; cut < b.len; cut++) {
        WireReader t = wire_reader(b.data, cut);
        assert_int_equal(msg_submit_decode(&t, &out), -1);
    }
    wire_put_u8(&b, 0);
    WireReader extra = wire_reader(b.data, b.len);
    assert_int_equal(msg_submit_decode(&extra, &out), -1);
    wire_buf_free(&b);
}

static void test_tokens_finish_stats(void **state) {
    (void)state;
    uint64_t ids[] = {1, 2, 3};
    int32_t toks[] = {10, 20, 30};
    WireBuf b = {0};
    msg_tokens_encode(&b, &(MsgTokens){.n = 3, .req_ids = ids, .tokens = toks});
    MsgTokens t;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(msg_tokens_decode(&r, &t), 0);
    assert_int_equal(t.n, 3);
    assert_true(t.req_ids[2] == 3 && t.tokens[1] == 20);
    msg_tokens_free(&t);
    wire_buf_free(&b);

    msg_finish_encode(&b, &(MsgFinish){.req_id = 7, .reason = FINISH_LENGTH, .prompt_tokens = 30, .cached_tokens = 16,
                                       .cached_tokens_host = 12, .cached_tokens_remote = 7, .completion_tokens = 5, .preemptions = 1, .error = ""});
    MsgFinish f;
    r = wire_reader(b.data, b.len);
    assert_int_equal(msg_finish_decode(&r, &f), 0);
    assert_true(f.req_id == 7 && f.reason == FINISH_LENGTH && f.prompt_tokens == 30 && f.cached_tokens == 16 &&
                f.cached_tokens_host == 12 && f.cached_tokens_remote == 7 && f.completion_tokens == 5 && f.preemptions == 1);
    assert_string_equal(finish_reason_name(f.reason), "length");
    msg_finish_free(&f);
    for (size_t cut = 0; cut < b.len; cut++) {
        WireReader t = wire_reader(b.data, cut);
        assert_int_equal(msg_finish_decode(&t, &f), -1);
    }
    wire_buf_free(&b);

    /* STATS: every per-tier counter survives, in its own field; a short or long body is refused. */
    MsgStats st = {.waiting = 1, .running = 2, .pool_used_blocks = 3, .pool_total_blocks = 4, .host_used_blocks = 5,
                   .host_total_blocks = 6, .cached_prompt_tokens_device = 7, .cached_prompt_tokens_host = 8,
                   .computed_prompt_tokens = 9, .demoted_blocks = 10, .loaded_blocks = 11, .host_evicted_blocks = 12,
                   .device_evicted_blocks = 13, .preemptions = 14, .generated_tokens = 1ULL << 40,
                   .segment_lsh_candidates = 15, .segment_lsh_admitted = 16, .segment_lsh_reused_tokens = 17,
                   .segment_probes_ok = 18, .segment_probes_rejected = 19};
    msg_stats_encode(&b, &st);
    MsgStats sd;
    r = wire_reader(b.data, b.len);
    assert_int_equal(msg_stats_decode(&r, &sd), 0);
    assert_true(sd.waiting == 1 && sd.running == 2 && sd.pool_used_blocks == 3 && sd.pool_total_blocks == 4 &&
                sd.host_used_blocks == 5 && sd.host_total_blocks == 6);
    assert_true(sd.cached_prompt_tokens_device == 7 && sd.cached_prompt_tokens_host == 8 && sd.computed_prompt_tokens == 9 &&
                sd.demoted_blocks == 10 && sd.loaded_blocks == 11 && sd.host_evicted_blocks == 12 &&
                sd.device_evicted_blocks == 13 && sd.preemptions == 14 && sd.generated_tokens == 1ULL << 40);
    assert_true(sd.segment_lsh_candidates == 15 && sd.segment_lsh_admitted == 16 && sd.segment_lsh_reused_tokens == 17 &&
                sd.segment_probes_ok == 18 && sd.segment_probes_rejected == 19);
    r = wire_reader(b.data, b.len - 1);
    assert_int_equal(msg_stats_decode(&r, &sd), -1);
    wire_put_u8(&b, 0);
    r = wire_reader(b.data, b.len);
    assert_int_equal(msg_stats_decode(&r, &sd), -1);
    wire_buf_free(&b);

}

/* KV_EVENTS: a batch of full events (kind, tier, reason, hashes, parent, names, tiers after, block
 * size and an insert's token ids)
 * survives the trip, empty names included; every cut, a trailing byte, a count the bytes cannot
 * hold and an unknown kind or tier are refused; an unknown reason reads as "other". */
static void test_kv_events_round_trip(void **state) {
    (void)state;
    uint64_t h0[] = {0x1111222233334444ull, 0x5555, 0xffffffffffffffffull}, h1[] = {0x77};
    int32_t tokens0[] = {1, 2, 3, 4, 5, -6}; /* 3 blocks of 2 tokens */
    MsgKvEvent in[] = {
        {.kind = KV_EVENT_STORED, .tier = KV_TIER_DEVICE, .reason = KV_REASON_INSERT, .tiers_after = KV_ON_DEVICE,
         .parent_hash = 0, .tenant = "acme \"q\" \xC3\xA9", .adapter = "lora-a", .n_blocks = 3, .hashes = h0,
         .block_size = 2, .n_tokens = 6, .tokens = tokens0},
        {.kind = KV_EVENT_STORED, .tier = KV_TIER_HOST, .reason = KV_REASON_DEMOTE, .tiers_after = KV_ON_DEVICE | KV_ON_HOST,
         .parent_hash = 0x5555, .tenant = "acme", .adapter = NULL, .n_blocks = 1, .hashes = h1},
        {.kind = KV_EVENT_REMOVED, .tier = KV_TIER_HOST, .reason = KV_REASON_HOST_EVICT, .tiers_after = 0,
         .parent_hash = 0xabcdef, .tenant = "", .adapter = "", .n_blocks = 1, .hashes = h1},
        {.kind = KV_EVENT_CLEARED, .reason = KV_REASON_CLEAR},
    };
    const int n_in = (int)(sizeof in / sizeof in[0]);
    WireBuf b = {0};
    msg_kv_events_encode(&b, in, n_in);
    assert_false(b.failed);
    MsgKvEvents m;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(msg_kv_events_decode(&r, &m), 0);
    assert_int_equal(m.n, n_in);
    for (int i = 0; i < n_in; i++) {
        const MsgKvEvent *got = &m.events[i], *want = &in[i];
        assert_true(got->kind == want->kind && got->tier == want->tier && got->reason == want->reason &&
                    got->tiers_after == want->tiers_after && got->parent_hash == want->parent_hash);
        assert_string_equal(got->tenant, want->tenant ? want->tenant : "");
        assert_string_equal(got->adapter, want->adapter ? want->adapter : "");
        assert_int_equal(got->n_blocks, want->n_blocks);
        if (want->n_blocks) assert_memory_equal(got->hashes, want->hashes, (size_t)want->n_blocks * sizeof *want->hashes);
        assert_int_equal(got->block_size, want->block_size);
        assert_int_equal(got->n_tokens, want->n_tokens);
        if (want->n_tokens) assert_memory_equal(got->tokens, want->tokens, (size_t)want->n_tokens * sizeof *want->tokens);
    }
    msg_kv_events_free(&m);
    assert_null(m.events);

    /* Batched as the events happen, the bytes are the same. */
    WireBuf inc = {0};
    msg_kv_events_begin(&inc);
    for (int i = 0; i < n_in; i++) msg_kv_event_append(&inc, &in[i]);
    msg_kv_events_finish(&inc, n_in);
    assert_int_equal(inc.len, b.len);
    assert_memory_equal(inc.data, b.data, b.len);
    wire_buf_free(&inc);

    /* Every cut short of the whole message, and one byte too many, is refused with nothing to free. */
    for (size_t cut = 0; cut < b.len; cut++) {
        r = wire_reader(b.data, cut);
        assert_int_equal(msg_kv_events_decode(&r, &m), -1);
        assert_null(m.events);
    }
    wire_put_u8(&b, 0);
    r = wire_reader(b.data, b.len);
    assert_int_equal(msg_kv_events_decode(&r, &m), -1);
    b.len--;

    /* Counts the bytes cannot hold: the event count, and the first event's hash count. */
    const size_t names_at = 4 + 4 + 8, hashes_at = names_at + 4 + strlen(in[0].tenant) + 4 + strlen(in[0].adapter);
    int32_t bogus[] = {1000, 1 << 30, -1};
    for (int i = 0; i < 3; i++) {
        size_t at[] = {0, hashes_at, names_at};
        for (int j = 0; j < 3; j++) {
            int32_t saved;
            memcpy(&saved, b.data + at[j], 4);
            memcpy(b.data + at[j], &bogus[i], 4);
            r = wire_reader(b.data, b.len);
            assert_int_equal(msg_kv_events_decode(&r, &m), -1);
            memcpy(b.data + at[j], &saved, 4);
        }
    }
    /* An unknown kind, tier or tier bit is refused; an unknown reason reads as "other". */
    const size_t field_at[] = {4, 5, 7};
    const uint8_t bad[] = {9, 2, 4};
    for (int i = 0; i < 3; i++) {
        uint8_t saved = b.data[field_at[i]];
        b.data[field_at[i]] = bad[i];
        r = wire_reader(b.data, b.len);
        assert_int_equal(msg_kv_events_decode(&r, &m), -1);
        b.data[field_at[i]] = saved;
    }
    b.data[6] = 200;
    r = wire_reader(b.data, b.len);
    assert_int_equal(msg_kv_events_decode(&r, &m), 0);
    assert_int_equal(m.events[0].reason, KV_REASON_OTHER);
    assert_string_equal(kv_reason_name(m.events[0].reason), "other");
    msg_kv_events_free(&m);
    wire_buf_free(&b);

    /* An empty batch is a valid message. */
    msg_kv_events_encode(&b, NULL, 0);
    r = wire_reader(b.data, b.len);
    assert_int_equal(msg_kv_events_decode(&r, &m), 0);
    assert_int_equal(m.n, 0);
    msg_kv_events_free(&m);
    wire_buf_free(&b);

    /* The names the cache uses map to codes and back; the kinds to vLLM's event names. */
    const char *reasons[] = {"insert", "demote", "load", "evict", "host_evict", "clear"};
    for (int i = 0; i < 6; i++) assert_string_equal(kv_reason_name(kv_reason_code(reasons[i])), reasons[i]);
    assert_int_equal(kv_reason_code("something new"), KV_REASON_OTHER);
    assert_int_equal(kv_reason_code(NULL), KV_REASON_OTHER);
    assert_string_equal(kv_event_type_name(KV_EVENT_STORED), "BlockStored");
    assert_string_equal(kv_event_type_name(KV_EVENT_REMOVED), "BlockRemoved");
    assert_string_equal(kv_event_type_name(KV_EVENT_CLEARED), "AllBlocksCleared");
}

/* A PREDICT body written field by field, for the refusals an encoder cannot produce. */
static void predict_body(WireBuf *b, const char *workflow, int32_t k, int32_t n, int names, int probs, float value) {
    wire_put_str(b, workflow);
    wire_put_str(b, "coder");
    wire_put_i32(b, k);
    wire_put_i32(b, n);
    for (int i = 0; i < names; i++) wire_put_str(b, "a");
    for (int i = 0; i < probs; i++) wire_put_f32(b, value);
}

static int predict_decodes(const WireBuf *b) {
    MsgPredict m;
    WireReader r = wire_reader(b->data, b->len);
    int rc = msg_predict_decode(&r, &m);
    if (rc == 0) msg_predict_free(&m);
    else assert_null(m.agents); /* nothing left to free after a refusal */
    return rc;
}

static void test_predict_round_trip(void **state) {
    (void)state;
    char *agents[] = {"planner", "coder", "reviewer \xC3\xA9"};
    float prob[] = {0.1f, 0.7f, 0.2f, /* step 2 */ 0.3f, 0.1f, 0.4f};
    MsgPredict in = {.workflow = "wf-9", .agent = "planner", .k = 2, .n_agents = 3, .agents = agents, .prob = prob};
    WireBuf b = {0};
    msg_predict_encode(&b, &in);
    assert_false(b.failed);
    assert_string_equal(msg_type_name(MSG_PREDICT), "predict");
    MsgPredict out;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(msg_predict_decode(&r, &out), 0);
    assert_string_equal(out.workflow, "wf-9");
    assert_string_equal(out.agent, "planner");
    assert_int_equal(out.k, 2);
    assert_int_equal(out.n_agents, 3);
    for (int i = 0; i < 3; i++) assert_string_equal(out.agents[i], agents[i]);
    assert_memory_equal(out.prob, prob, sizeof prob);
    msg_predict_free(&out);
    /* Every truncation, and one byte too many, is refused rather than misread. */
    for (size_t cut = 0; cut < b.len; cut++) {
        WireReader t = wire_reader(b.data, cut);
        assert_int_equal(msg_predict_decode(&t, &out), -1);
    }
    wire_put_u8(&b, 0);
    WireReader extra = wire_reader(b.data, b.len);
    assert_int_equal(msg_predict_decode(&extra, &out), -1);
    wire_buf_free(&b);

    /* Edges that are fine: no agents known yet, the largest k and n. */
    predict_body(&b, "wf", 1, 0, 0, 0, 0);
    assert_int_equal(predict_decodes(&b), 0);
    wire_buf_free(&b);
    predict_body(&b, "wf", MSG_PREDICT_MAX_K, 2, 2, 2 * MSG_PREDICT_MAX_K, 0.5f);
    assert_int_equal(predict_decodes(&b), 0);
    wire_buf_free(&b);
    predict_body(&b, "wf", 1, MSG_PREDICT_MAX_AGENTS, MSG_PREDICT_MAX_AGENTS, MSG_PREDICT_MAX_AGENTS, 1.0f);
    assert_int_equal(predict_decodes(&b), 0);
    wire_buf_free(&b);
    /* Bad k or n, an empty workflow, counts the bytes do not match, probabilities that are not. */
    const struct {
        const char *workflow;
        int32_t k, n;
        int names, probs;
        float value;
    } bad[] = {
        {"wf", 0, 1, 1, 0, 0.5f},                                     /* k = 0 */
        {"wf", -3, 1, 1, 3, 0.5f},                                    /* negative k */
        {"wf", MSG_PREDICT_MAX_K + 1, 1, 1, MSG_PREDICT_MAX_K + 1, 0.5f}, /* k too large */
        {"wf", 1, -1, 0, 0, 0.5f},                                    /* negative n */
        {"wf", 1, MSG_PREDICT_MAX_AGENTS + 1, MSG_PREDICT_MAX_AGENTS + 1, MSG_PREDICT_MAX_AGENTS + 1, 0.5f}, /* n too large */
        {"wf", 2, 1000, 2, 4, 0.5f},                                  /* n the bytes cannot hold */
        {"wf", 2, 2, 2, 3, 0.5f},                                     /* one probability short */
        {"wf", 2, 2, 2, 5, 0.5f},                                     /* one probability over */
        {"wf", 1, 2, 1, 4, 0.5f},                                     /* a name short (the bytes reread as one) */
        {"", 1, 1, 1, 1, 0.5f},                                       /* no workflow */
        {"wf", 1, 1, 1, 1, NAN},                                      /* not a number */
        {"wf", 1, 1, 1, 1, -0.25f},                                   /* negative */
        {"wf", 1, 1, 1, 1, 1.5f},                                     /* above 1 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        predict_body(&b, bad[i].workflow, bad[i].k, bad[i].n, bad[i].names, bad[i].probs, bad[i].value);
        if (predict_decodes(&b) != -1) fail_msg("bad predict body %zu was accepted", i);
        wire_buf_free(&b);
    }
}

static void test_step_round_trip(void **state) {
    (void)state;
    /* Two sequences: a 3-token prefill chunk over 2 blocks of 2 and a 1-token decode. */
    int32_t tokens[] = {1, 2, 3, 4}, pos[] = {0, 1, 2, 5}, slots[] = {10, 11, 12, 31}, start[] = {0, 3, 4}, ctx[] = {3, 6};
    int32_t t0[] = {5, 6}, t1[] = {13, 14, 15};
    const int32_t *tables[] = {t0, t1};
    ForwardBatch fb = {.n_tokens = 4, .tokens = tokens, .positions = pos, .slot_mapping = slots, .n_seqs = 2, .seq_start = start,
                       .block_tables = tables, .seq_n_ctx = ctx};
    WireBuf b = {0};
    step_msg_encode(&b, STEP_FORWARD, &fb, NULL, 2);
    StepMsg m;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(step_msg_decode(&r, 2, &m), 0);
    assert_int_equal(m.kind, STEP_FORWARD);
    assert_int_equal(m.batch.n_tokens, 4);
    assert_int_equal(m.batch.n_seqs, 2);
    assert_int_equal(m.batch.n_logits, 0);
    assert_memory_equal(m.batch.slot_mapping, slots, sizeof slots);
    assert_memory_equal(m.batch.block_tables[1], t1, sizeof t1);
    assert_int_equal(m.ops.n, 0);
    step_msg_free(&m);
    /* Decoded with a different block size the table lengths disagree: refused. */
    r = wire_reader(b.data, b.len);
    assert_int_equal(step_msg_decode(&r, 4, &m), -1);
    wire_buf_free(&b);
    step_msg_encode(&b, STEP_STOP, NULL, NULL, 2);
    r = wire_reader(b.data, b.len);
    assert_int_equal(step_msg_decode(&r, 2, &m), 0);
    assert_int_equal(m.kind, STEP_STOP);
    wire_buf_free(&b);
    /* The stop that tells a TP peer its job lost ranks (exit without MPI_Finalize) survives the wire. */
    step_msg_encode(&b, STEP_STOP_LOST_RANKS, NULL, NULL, 2);
    r = wire_reader(b.data, b.len);
    assert_int_equal(step_msg_decode(&r, 2, &m), 0);
    assert_int_equal(m.kind, STEP_STOP_LOST_RANKS);
    wire_buf_free(&b);
}

/* The step's cache operations travel after the block tables; a cut message or a bad kind is refused. */
static void test_step_cache_ops(void **state) {
    (void)state;
    int32_t tokens[] = {9}, pos[] = {4}, slots[] = {10}, start[] = {0, 1}, ctx[] = {5}, t0[] = {3, 5, 7};
    const int32_t *tables[] = {t0};
    ForwardBatch fb = {.n_tokens = 1, .tokens = tokens, .positions = pos, .slot_mapping = slots, .n_seqs = 1, .seq_start = start,
                       .block_tables = tables, .seq_n_ctx = ctx};
    CacheOpList ops = {0};
    assert_int_equal(cache_ops_push(&ops, CACHE_OP_STORE, 3, 12, 0), 0);
    assert_int_equal(cache_ops_push(&ops, CACHE_OP_LOAD, 12, 5, 0), 0);
    assert_int_equal(cache_ops_push(&ops, CACHE_OP_COPY, 5, 7, 0), 0);
    assert_int_equal(cache_ops_push(&ops, CACHE_OP_ROTATE, 7, 0, -42), 0);
    assert_int_equal(cache_ops_push_slots(&ops, 7, 1, 3, 0, 1, 17), 0);
    WireBuf b = {0};
    step_msg_encode(&b, STEP_FORWARD, &fb, &ops, 2);
    assert_false(b.failed);
    StepMsg m;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(step_msg_decode(&r, 2, &m), 0);
    assert_int_equal(m.ops.n, 5);
    for (int i = 0; i < 5; i++) {
        const CacheOp *got = &m.ops.ops[i], *want = &ops.ops[i];
        assert_true(got->kind == want->kind && got->src == want->src && got->dst == want->dst && got->delta == want->delta);
        assert_true(got->src_slot == want->src_slot && got->dst_slot == want->dst_slot && got->n_slots == want->n_slots);
    }
    assert_int_equal(m.ops.ops[4].kind, CACHE_OP_COPY_SLOTS);
    assert_int_equal(m.ops.ops[4].src_slot, 1);
    assert_int_equal(m.ops.ops[4].n_slots, 1);
    assert_memory_equal(m.batch.block_tables[0], t0, sizeof t0);
    step_msg_free(&m);
    /* Every cut short of the whole message is refused (and leaves nothing to free). */
    for (size_t len = 0; len < b.len; len++) {
        r = wire_reader(b.data, len);
        assert_int_equal(step_msg_decode(&r, 2, &m), -1);
        assert_null(m.ops.ops);
    }
    /* An operation count larger than the bytes that follow, a negative one, an unknown kind. */
    size_t count_at = b.len - 5 * 19 - 4, kind_at = count_at + 4;
    int32_t bogus[] = {6, 1 << 30, -1};
    for (int i = 0; i < 3; i++) {
        int32_t saved;
        memcpy(&saved, b.data + count_at, 4);
        memcpy(b.data + count_at, &bogus[i], 4);
        r = wire_reader(b.data, b.len);
        assert_int_equal(step_msg_decode(&r, 2, &m), -1);
        memcpy(b.data + count_at, &saved, 4);
    }
    b.data[kind_at] = 9;
    r = wire_reader(b.data, b.len);
    assert_int_equal(step_msg_decode(&r, 2, &m), -1);
    wire_buf_free(&b);
    cache_ops_free(&ops);
}

static void test_block_index(void **state) {
    (void)state;
    BlockIndex ix;
    block_index_init(&ix, 0);
    for (uint64_t h = 0; h < 5000; h++) assert_int_equal(block_index_add(&ix, h * 0x9E3779B97F4A7C15ull), 0);
    assert_int_equal(ix.count, 5000);
    for (uint64_t h = 0; h < 5000; h += 2) block_index_remove(&ix, h * 0x9E3779B97F4A7C15ull);
    assert_int_equal(ix.count, 2500);
    assert_false(block_index_has(&ix, 0));
    assert_true(block_index_has(&ix, 1 * 0x9E3779B97F4A7C15ull));
    uint64_t chain[] = {1 * 0x9E3779B97F4A7C15ull, 3 * 0x9E3779B97F4A7C15ull, 4 * 0x9E3779B97F4A7C15ull, 5 * 0x9E3779B97F4A7C15ull};
    assert_int_equal(block_index_prefix(&ix, chain, 4), 2); /* stops at the first absent block */
    block_index_free(&ix);
}

static void test_router(void **state) {
    (void)state;
    Router r;
    assert_int_equal(router_init(&r, 3, 4), 0);
    uint64_t prompt[] = {11, 12, 13, 14};
    RouteDecision d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 0); /* nothing cached, equal load: lowest index */
    assert_string_equal(d.reason, "load");
    router_stored(&r, 2, prompt, 3);
    router_stored(&r, 1, prompt, 1);
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 2);
    assert_int_equal(d.matched_blocks, 3);
    assert_string_equal(d.reason, "cache");
    /* Badly unbalanced: instance 2 carries 5 more requests than the idlest, so the cache loses. */
    for (int i = 0; i < 5; i++) router_assigned(&r, 2, NULL);
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 1);
    for (int i = 0; i < 5; i++) router_finished(&r, 2);
    /* Eviction reports shrink the index. */
    router_evicted(&r, 2, prompt + 1, 2);
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.matched_blocks, 1);
    /* Workflow affinity breaks ties between equally good instances. */
    uint64_t other[] = {99};
    router_assigned(&r, 1, "wf-a");
    router_finished(&r, 1);
    d = router_pick(&r, other, 1, "wf-a");
    assert_int_equal(d.instance, 1);
    assert_string_equal(d.reason, "affinity");
    router_workflow_ended(&r, "wf-a"); /* an ended workflow keeps no affinity */
    d = router_pick(&r, other, 1, "wf-a");
    assert_string_equal(d.reason, "load");
    /* A cleared cache (AllBlocksCleared) empties that instance's index only. */
    router_cleared(&r, 2);
    assert_int_equal(r.index[2].count, 0);
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 1);
    assert_int_equal(d.matched_blocks, 1);
    router_free(&r);
}

/* The router names the instance that could lend a longer prefix; round-robin ignores caches. */
static void test_router_move_source(void **state) {
    (void)state;
    Router r;
    assert_int_equal(router_init(&r, 3, 2), 0);
    uint64_t prompt[] = {21, 22, 23, 24};
    router_stored(&r, 2, prompt, 4);
    router_stored(&r, 1, prompt, 1);
    RouteDecision d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 2);
    assert_int_equal(d.source, -1); /* nobody holds more than the chosen one */
    for (int i = 0; i < 3; i++) router_assigned(&r, 2, NULL); /* overloaded: the cache-best loses */
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 1);
    assert_int_equal(d.matched_blocks, 1);
    assert_int_equal(d.source, 2);
    assert_int_equal(d.source_blocks, 4);
    router_instance_down(&r, 2); /* a dead instance lends nothing */
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.source, -1);
    router_free(&r);

    assert_int_equal(router_init(&r, 3, 2), 0);
    r.mode = ROUTER_ROUND_ROBIN;
    router_stored(&r, 0, prompt, 3);
    int seen[3] = {0};
    for (int i = 0; i < 6; i++) {
        d = router_pick(&r, prompt, 4, NULL);
        seen[d.instance]++;
        assert_string_equal(d.reason, "round-robin");
        assert_int_equal(d.source, d.instance == 0 ? -1 : 0);
        if (d.instance != 0) assert_int_equal(d.source_blocks, 3);
    }
    assert_true(seen[0] == 2 && seen[1] == 2 && seen[2] == 2);
    router_instance_down(&r, 1);
    for (int i = 0; i < 4; i++) assert_int_not_equal(router_pick(&r, prompt, 4, NULL).instance, 1);
    router_free(&r);

    /* Balanced: the least loaded wins and borrows the prefix; at equal load, the one caching most. */
    assert_int_equal(router_init(&r, 3, 8), 0);
    r.mode = ROUTER_BALANCED;
    router_stored(&r, 2, prompt, 4);
    router_stored(&r, 1, prompt, 2);
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 2);
    assert_int_equal(d.source, -1);
    router_assigned(&r, 2, NULL); /* one request more than the others: slack does not protect it */
    d = router_pick(&r, prompt, 4, NULL);
    assert_int_equal(d.instance, 1);
    assert_int_equal(d.matched_blocks, 2);
    assert_int_equal(d.source, 2);
    assert_int_equal(d.source_blocks, 4);
    router_free(&r);
}

/* The cost model moves when reading is cheaper than recomputing, and only between instances that
 * take part. */
static void test_move_plan(void **state) {
    (void)state;
    MoveCostModel m = move_cost_model_default();
    bool can[2] = {true, true};
    uint64_t bytes[2] = {368640, 368640}; /* SmolLM2-135M: 16 tokens x 30 layers x K,V x 192 halves */
    RouteDecision d = {.instance = 1, .matched_blocks = 2, .source = 0, .source_blocks = 10};
    MovePlan p = move_plan(&m, &d, can, bytes, 16);
    assert_int_equal(p.source, 0);
    assert_int_equal(p.blocks, 10);
    assert_true(p.move_s < p.recompute_s);
    m.prefill_tokens_per_s = 1e9; /* a prefill faster than the link: recompute */
    assert_int_equal(move_plan(&m, &d, can, bytes, 16).source, -1);
    m = move_cost_model_default();
    can[0] = false; /* the lender takes no part (TP > 1, CUDA, ...) */
    assert_int_equal(move_plan(&m, &d, can, bytes, 16).source, -1);
    can[0] = true;
    m.enabled = false;
    assert_int_equal(move_plan(&m, &d, can, bytes, 16).source, -1);
    m = move_cost_model_default();
    m.min_blocks = 9; /* a gain of 8 blocks is below the threshold */
    assert_int_equal(move_plan(&m, &d, can, bytes, 16).source, -1);
    d.source = -1;
    m = move_cost_model_default();
    assert_int_equal(move_plan(&m, &d, can, bytes, 16).source, -1);
}

/* KV_EXPORT / KV_EXPORTED round trips; truncations and out-of-range block ids are refused. */
static void test_move_msgs(void **state) {
    (void)state;
    int32_t toks[] = {1, 2, 3, 4, 5};
    WireBuf b = {0};
    move_msg_export_encode(&b, &(MsgKvExport){.xfer_id = 9, .tenant = "t", .adapter = "", .tokens = toks, .n_tokens = 5,
                                               .host = "node-b", .kv_layout = MOVE_KV_LAYOUT_BF16});
    MsgKvExport ask;
    WireReader r = wire_reader(b.data, b.len);
    assert_int_equal(move_msg_export_decode(&r, &ask), 0);
    assert_true(ask.xfer_id == 9 && ask.n_tokens == 5 && strcmp(ask.tenant, "t") == 0 && ask.adapter[0] == 0);
    assert_memory_equal(ask.tokens, toks, sizeof toks);
    assert_true(strcmp(ask.host, "node-b") == 0 && ask.kv_layout == MOVE_KV_LAYOUT_BF16);
    move_msg_export_free(&ask);
    for (size_t cut = 0; cut < b.len; cut++) {
        WireReader t = wire_reader(b.data, cut);
        assert_int_equal(move_msg_export_decode(&t, &ask), -1);
    }
    wire_buf_free(&b);

    uint8_t tiers[] = {0, 0, 1};
    int32_t blocks[] = {5, 6, 2};
    uint8_t desc[] = {0xde, 0xad, 0xbe, 0xef};
    MsgKvExported loan = {.xfer_id = 9, .n_blocks = 3, .tiers = tiers, .blocks = blocks, .pool_blocks = {64, 8}, .desc = desc,
                          .desc_len = 4, .why = ""};
    move_msg_exported_encode(&b, &loan);
    MsgKvExported got;
    r = wire_reader(b.data, b.len);
    assert_int_equal(move_msg_exported_decode(&r, &got), 0);
    assert_true(got.xfer_id == 9 && got.n_blocks == 3 && got.pool_blocks[0] == 64 && got.pool_blocks[1] == 8 && got.desc_len == 4);
    assert_memory_equal(got.tiers, tiers, 3);
    assert_memory_equal(got.blocks, blocks, sizeof blocks);
    assert_memory_equal(got.desc, desc, 4);
    move_msg_exported_free(&got);
    for (size_t cut = 0; cut < b.len; cut++) {
        WireReader t = wire_reader(b.data, cut);
        assert_int_equal(move_msg_exported_decode(&t, &got), -1);
    }
    wire_buf_free(&b);
    blocks[2] = 8; /* past the lender's host pool: a corrupt loan */
    move_msg_exported_encode(&b, &loan);
    r = wire_reader(b.data, b.len);
    assert_int_equal(move_msg_exported_decode(&r, &got), -1);
    wire_buf_free(&b);
}

static void test_utf8(void **state) {
    (void)state;
    const char euro[] = "a\xE2\x82\xAC";
    assert_int_equal(utf8_complete_prefix(euro, 3), 1); /* "a" + 2 of the euro sign's 3 bytes */
    assert_int_equal(utf8_complete_prefix(euro, 4), 4);
    size_t n;
    char *s = utf8_sanitize("ok\xFF!", 4, &n);
    assert_string_equal(s, "ok\xEF\xBF\xBD!");
    free(s);
    s = utf8_sanitize("\xED\xA0\x80", 3, &n); /* a UTF-16 surrogate is not UTF-8 */
    assert_int_equal(n, 9);
    free(s);
}

/* Streaming with the real tokenizer: pieces taken one token at a time concatenate to the text
 * before the stop string, never end inside a UTF-8 character, and never leak a stop-string prefix. */
static void test_text_stream_real_tokenizer(void **state) {
    (void)state;
    GgufFile *f;
    Tokenizer tok;
    BraidError err;
    if (gguf_open(test_model_path(), &f, &err) || tokenizer_load(f, &tok, &err)) fail_msg("%s", err.msg);
    const char *text = "Caf\xC3\xA9 \xF0\x9F\x99\x82 ok END tail";
    TokenList ids = {0};
    if (tokenizer_encode(&tok, text, strlen(text), false, false, &ids, &err)) fail_msg("%s", err.msg);
    const char *expected = "Caf\xC3\xA9 \xF0\x9F\x99\x82 ok";
    char *stops[] = {" END"};
    TextStream ts = {0};
    char sent[256] = "";
    size_t sent_len = 0;
    for (int i = 1; i <= ids.n && !ts.stopped; i++) {
        assert_int_equal(text_stream_update(&ts, &tok, ids.ids, i, stops, 1, i == ids.n), 0);
        size_t n;
        const char *piece = text_stream_take(&ts, &n);
        assert_int_equal(utf8_complete_prefix(piece, n), n);
        memcpy(sent + sent_len, piece, n);
        sent_len += n;
        sent[sent_len] = 0;
        assert_true(sent_len <= strlen(expected) && memcmp(sent, expected, sent_len) == 0);
    }
    assert_true(ts.stopped);
    assert_string_equal(sent, expected);
    text_stream_free(&ts);
    free(ids.ids);
    tokenizer_free(&tok);
    gguf_close(f);
}

static void test_shard_ranges(void **state) {
    (void)state;
    ModelConfig c = {.n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .ff_dim = 1536, .dim = 576};
    TpShardRange r0, r1;
    BraidError err;
    assert_int_equal(tp_shard_range(&c, TENSOR_Q4_1, 0, 2, &r0, &err), 0);
    assert_int_equal(tp_shard_range(&c, TENSOR_Q4_1, 1, 2, &r1, &err), 0);
    /* Whole KV heads with their query groups, covering everything exactly once. */
    assert_true(r0.kv_head_lo == 0 && r0.kv_head_hi == r1.kv_head_lo && r1.kv_head_hi == 3);
    assert_true(r0.head_hi - r0.head_lo == 3 * (r0.kv_head_hi - r0.kv_head_lo));
    assert_true(r0.ff_lo == 0 && r0.ff_hi == r1.ff_lo && r1.ff_hi == 1536 && r0.ff_hi % 32 == 0);
    assert_int_equal(tp_shard_range(&c, TENSOR_Q4_1, 0, 4, &r0, &err), -1); /* 4 ranks > 3 KV heads */
    assert_non_null(strstr(err.msg, "KV heads"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_round_trip), cmocka_unit_test(test_tokens_finish_stats), cmocka_unit_test(test_kv_events_round_trip),
        cmocka_unit_test(test_predict_round_trip), cmocka_unit_test(test_step_round_trip),
        cmocka_unit_test(test_step_cache_ops),
        cmocka_unit_test(test_block_index), cmocka_unit_test(test_router), cmocka_unit_test(test_router_move_source),
        cmocka_unit_test(test_move_plan), cmocka_unit_test(test_move_msgs), cmocka_unit_test(test_utf8), cmocka_unit_test(test_text_stream_real_tokenizer),
        cmocka_unit_test(test_shard_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
