/*
 * test_move_relay — MSG_KV_RELAY's envelope (transport/move_msg.h, move_msg_relay_*): the move
 * message between a joined instance's leader and another leader that the coordinator forwards.
 * Round trip with a body (the body borrowed, byte for byte), an empty body, and the refusals: a
 * truncated envelope and ranks below 1 (rank 0 is the coordinator, never a leader).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "transport/control_msg.h"
#include "transport/move_msg.h"

static void test_round_trip(void **state) {
    (void)state;
    const uint8_t body[] = {1, 2, 3, 250, 0, 7};
    WireBuf b = {0};
    move_msg_relay_encode(&b, 3, 1, MSG_KV_EXPORT, body, sizeof body);
    assert_false(b.failed);
    MsgKvRelay m;
    assert_int_equal(move_msg_relay_decode(b.data, b.len, &m), 0);
    assert_int_equal(m.from_rank, 3);
    assert_int_equal(m.to_rank, 1);
    assert_int_equal(m.type, MSG_KV_EXPORT);
    assert_int_equal(m.body_len, sizeof body);
    assert_memory_equal(m.body, body, sizeof body);
    assert_ptr_equal(m.body, b.data + b.len - sizeof body); /* borrowed, not copied */
    wire_buf_free(&b);
}

static void test_empty_body(void **state) {
    (void)state;
    WireBuf b = {0};
    move_msg_relay_encode(&b, 1, 2, MSG_KV_RELEASE, NULL, 0);
    MsgKvRelay m;
    assert_int_equal(move_msg_relay_decode(b.data, b.len, &m), 0);
    assert_int_equal(m.body_len, 0);
    assert_int_equal(m.type, MSG_KV_RELEASE);
    wire_buf_free(&b);
}

static void test_refusals(void **state) {
    (void)state;
    const uint8_t body[] = {9};
    WireBuf b = {0};
    move_msg_relay_encode(&b, 2, 1, MSG_KV_EXPORTED, body, sizeof body);
    MsgKvRelay m;
    for (size_t cut = 0; cut < 12; cut++) assert_int_equal(move_msg_relay_decode(b.data, cut, &m), -1); /* the 3 ints cut short */
    wire_buf_free(&b);
    WireBuf z = {0};
    move_msg_relay_encode(&z, 0, 1, MSG_KV_EXPORT, body, sizeof body); /* from the coordinator's rank: not a leader */
    assert_int_equal(move_msg_relay_decode(z.data, z.len, &m), -1);
    wire_buf_free(&z);
    WireBuf t = {0};
    move_msg_relay_encode(&t, 1, -4, MSG_KV_EXPORT, body, sizeof body);
    assert_int_equal(move_msg_relay_decode(t.data, t.len, &m), -1);
    wire_buf_free(&t);
}

static void test_names(void **state) {
    (void)state;
    assert_string_equal(msg_type_name(MSG_KV_RELAY), "kv_relay");
    assert_string_equal(msg_type_name(MSG_COORD_ALIVE), "coord_alive");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty_body),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
