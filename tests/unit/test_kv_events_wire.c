/*
 * KV events on the wire the ecosystem reads: the msgpack encoder against byte strings written out
 * from the MessagePack specification, the KVEventBatch encoding against vLLM's array-like tagged
 * layout, and the publisher over real ZeroMQ sockets (PUB framing, sequence numbers, replay from a
 * bounded ring that has wrapped).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "coord/kv_event_publisher.h"
#include "transport/msgpack.h"

/* Runs put on a fresh buffer and checks the bytes. */
#define EXPECT_BYTES(call, ...)                                                                 \
    do {                                                                                        \
        static const uint8_t want_[] = {__VA_ARGS__};                                           \
        WireBuf b_ = {0};                                                                    \
        WireBuf *b = &b_;                                                                    \
        call;                                                                                   \
        assert_false(b_.failed);                                                                \
        assert_int_equal(b_.len, sizeof want_);                                                 \
        assert_memory_equal(b_.data, want_, sizeof want_);                                      \
        wire_buf_free(&b_);                                                                  \
    } while (0)

static void test_msgpack_scalars(void **state) {
    (void)state;
    EXPECT_BYTES(msgpack_put_nil(b), 0xc0);
    EXPECT_BYTES(msgpack_put_bool(b, true), 0xc3);
    EXPECT_BYTES(msgpack_put_bool(b, false), 0xc2);
    EXPECT_BYTES(msgpack_put_uint(b, 0), 0x00);
    EXPECT_BYTES(msgpack_put_uint(b, 127), 0x7f);
    EXPECT_BYTES(msgpack_put_uint(b, 128), 0xcc, 0x80);
    EXPECT_BYTES(msgpack_put_uint(b, 255), 0xcc, 0xff);
    EXPECT_BYTES(msgpack_put_uint(b, 256), 0xcd, 0x01, 0x00);
    EXPECT_BYTES(msgpack_put_uint(b, 65535), 0xcd, 0xff, 0xff);
    EXPECT_BYTES(msgpack_put_uint(b, 65536), 0xce, 0x00, 0x01, 0x00, 0x00);
    EXPECT_BYTES(msgpack_put_uint(b, 4294967296ull), 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00);
    EXPECT_BYTES(msgpack_put_uint(b, UINT64_MAX), 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff);
    EXPECT_BYTES(msgpack_put_int(b, 5), 0x05);
    EXPECT_BYTES(msgpack_put_int(b, 200), 0xcc, 0xc8); /* non-negative: the unsigned forms */
    EXPECT_BYTES(msgpack_put_int(b, -1), 0xff);
    EXPECT_BYTES(msgpack_put_int(b, -32), 0xe0);
    EXPECT_BYTES(msgpack_put_int(b, -33), 0xd0, 0xdf);
    EXPECT_BYTES(msgpack_put_int(b, -128), 0xd0, 0x80);
    EXPECT_BYTES(msgpack_put_int(b, -129), 0xd1, 0xff, 0x7f);
    EXPECT_BYTES(msgpack_put_int(b, -32769), 0xd2, 0xff, 0xff, 0x7f, 0xff);
    EXPECT_BYTES(msgpack_put_int(b, INT64_MIN), 0xd3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00);
    EXPECT_BYTES(msgpack_put_f64(b, 1.5), 0xcb, 0x3f, 0xf8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00);
    EXPECT_BYTES(msgpack_put_f64(b, -2.0), 0xcb, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00);
}

static void test_msgpack_containers(void **state) {
    (void)state;
    EXPECT_BYTES(msgpack_put_cstr(b, ""), 0xa0);
    EXPECT_BYTES(msgpack_put_cstr(b, "abc"), 0xa3, 'a', 'b', 'c');
    EXPECT_BYTES(msgpack_put_bin(b, "\x01\x02", 2), 0xc4, 0x02, 0x01, 0x02);
    EXPECT_BYTES(msgpack_put_array(b, 0), 0x90);
    EXPECT_BYTES(msgpack_put_array(b, 15), 0x9f);
    EXPECT_BYTES(msgpack_put_array(b, 16), 0xdc, 0x00, 0x10);
    EXPECT_BYTES(msgpack_put_array(b, 65536), 0xdd, 0x00, 0x01, 0x00, 0x00);

    /* String headers switch form at 31/32, 255/256 and 65535/65536 bytes. */
    static char text[70000];
    memset(text, 'x', sizeof text);
    const size_t lens[] = {31, 32, 255, 256, 65535, 65536};
    const size_t header[] = {1, 2, 2, 3, 3, 5};
    const uint8_t first[] = {0xbf, 0xd9, 0xd9, 0xda, 0xda, 0xdb};
    for (int i = 0; i < 6; i++) {
        WireBuf b = {0};
        msgpack_put_str(&b, text, lens[i]);
        assert_false(b.failed);
        assert_int_equal(b.len, header[i] + lens[i]);
        assert_int_equal(b.data[0], first[i]);
        wire_buf_free(&b);
    }
    /* Values follow each other in the buffer. */
    EXPECT_BYTES((msgpack_put_array(b, 2), msgpack_put_uint(b, 7), msgpack_put_cstr(b, "a")), 0x92, 0x07, 0xa1, 'a');
}

/* One batch with each event kind, written out byte by byte as msgspec encodes vLLM's KVEventBatch:
 * [ts, [events], data_parallel_rank], each event [tag, fields...]. */
static void test_kv_event_batch_bytes(void **state) {
    (void)state;
    uint64_t stored[] = {1, 0x1234}, removed[] = {1};
    int32_t tokens[] = {5, 6, 7, 300};
    MsgKvEvent events[] = {
        {.kind = KV_EVENT_STORED, .tier = KV_TIER_DEVICE, .parent_hash = 0x80, .adapter = "lo", .n_blocks = 2,
         .hashes = stored, .block_size = 2, .n_tokens = 4, .tokens = tokens},
        {.kind = KV_EVENT_REMOVED, .tier = KV_TIER_HOST, .adapter = "", .n_blocks = 1, .hashes = removed},
        {.kind = KV_EVENT_CLEARED},
        /* a demotion to the host: a root block, no adapter, no token ids */
        {.kind = KV_EVENT_STORED, .tier = KV_TIER_HOST, .parent_hash = 0, .adapter = "", .n_blocks = 1,
         .hashes = removed, .block_size = 2},
    };
    static const uint8_t want[] = {
        0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, /* [1.5, */
        0x94,                                     /* [4 events: */
        0x98, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x92, 0x01, 0xcd, 0x12, 0x34, 0xcc, 0x80,
        0x94, 0x05, 0x06, 0x07, 0xcd, 0x01, 0x2c, 0x02, 0xc0, 0xa3, 'G', 'P', 'U', 0xa2, 'l', 'o',
        0x93, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0x01, 0xa3, 'C', 'P', 'U',
        0x91, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd',
        0x98, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0x01, 0xc0, 0x90, 0x02, 0xc0,
        0xa3, 'C', 'P', 'U', 0xc0,
        0x03, /* data_parallel_rank] */
    };
    WireBuf b = {0};
    kv_event_batch_encode(&b, 3, events, 4, 1.5);
    assert_false(b.failed);
    assert_int_equal(b.len, sizeof want);
    assert_memory_equal(b.data, want, sizeof want);
    wire_buf_free(&b);
}

/* ---- the publisher over real sockets ---- */

static int64_t seq_of(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return (int64_t)v;
}

static void publish_one(KvEventPublisher *p, uint64_t hash) {
    MsgKvEvent e = {.kind = KV_EVENT_REMOVED, .tier = KV_TIER_DEVICE, .adapter = "", .n_blocks = 1, .hashes = &hash};
    assert_int_equal(kv_event_publisher_publish(p, 1, &e, 1), 0);
}

/* Six batches through a ring of four: the subscriber sees topic, seq 0..5 and the payloads; a
 * replay from seq 0 returns the four kept (2..5) and the end marker, one from seq 4 returns 4, 5. */
static void test_publisher_sockets(void **state) {
    (void)state;
    char pub_ep[128], replay_ep[128];
    snprintf(pub_ep, sizeof pub_ep, "ipc:///tmp/braid-test-kv-pub-%d", (int)getpid());
    snprintf(replay_ep, sizeof replay_ep, "ipc:///tmp/braid-test-kv-replay-%d", (int)getpid());
    BraidError err;
    KvEventPublisherConfig cfg = {.endpoint = pub_ep, .replay_endpoint = replay_ep, .topic = "kv", .replay_batches = 4};
    KvEventPublisher *p = kv_event_publisher_new(&cfg, &err);
    assert_non_null(p);

    void *ctx = zmq_ctx_new();
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    int timeout_ms = 5000, linger = 0;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv", 2);
    assert_int_equal(zmq_connect(sub, pub_ep), 0);
    usleep(300 * 1000); /* the slow-joiner: a PUB drops what it sends before the subscription arrives */

    for (uint64_t i = 0; i < 6; i++) publish_one(p, 100 + i);
    assert_int_equal(kv_event_publisher_sent(p), 6);
    for (int64_t i = 0; i < 6; i++) {
        uint8_t topic[8], seq[8], payload[256];
        assert_int_equal(zmq_recv(sub, topic, sizeof topic, 0), 2);
        assert_memory_equal(topic, "kv", 2);
        assert_int_equal(zmq_recv(sub, seq, sizeof seq, 0), 8);
        assert_int_equal(seq_of(seq), i);
        int n = zmq_recv(sub, payload, sizeof payload, 0);
        assert_true(n > 0);
        WireBuf want = {0};
        uint64_t hash = 100 + (uint64_t)i;
        MsgKvEvent e = {.kind = KV_EVENT_REMOVED, .tier = KV_TIER_DEVICE, .adapter = "", .n_blocks = 1, .hashes = &hash};
        kv_event_batch_encode(&want, 1, &e, 1, 0.0);
        /* Same bytes but the timestamp (bytes 2..9). */
        assert_int_equal(n, want.len);
        assert_memory_equal(payload + 10, want.data + 10, want.len - 10);
        wire_buf_free(&want);
    }

    const int64_t starts[] = {0, 4};
    const int64_t first_back[] = {2, 4};
    for (int t = 0; t < 2; t++) {
        /* DEALER, not REQ: a REQ socket would take only the first of the several replies. */
        void *req = zmq_socket(ctx, ZMQ_DEALER);
        zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
        zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
        assert_int_equal(zmq_connect(req, replay_ep), 0);
        uint8_t start[8];
        for (int i = 0; i < 8; i++) start[i] = (uint8_t)((uint64_t)starts[t] >> (8 * (7 - i)));
        assert_int_equal(zmq_send(req, "", 0, ZMQ_SNDMORE), 0); /* the envelope a REQ client would add */
        assert_int_equal(zmq_send(req, start, 8, 0), 8);
        int64_t expect = first_back[t];
        for (;;) {
            uint8_t seq[8], payload[256];
            assert_int_equal(zmq_recv(req, payload, sizeof payload, 0), 0); /* the empty delimiter */
            assert_int_equal(zmq_recv(req, seq, sizeof seq, 0), 8);
            int n = zmq_recv(req, payload, sizeof payload, 0);
            if (seq_of(seq) == -1) {
                assert_int_equal(n, 0);
                break;
            }
            assert_int_equal(seq_of(seq), expect);
            assert_true(n > 0);
            expect++;
        }
        assert_int_equal(expect, 6);
        zmq_close(req);
    }
    zmq_close(sub);
    zmq_ctx_term(ctx);
    kv_event_publisher_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msgpack_scalars),
        cmocka_unit_test(test_msgpack_containers),
        cmocka_unit_test(test_kv_event_batch_bytes),
        cmocka_unit_test(test_publisher_sockets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
