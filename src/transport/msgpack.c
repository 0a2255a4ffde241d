#include "transport/msgpack.h"

#include <string.h>

/* A type byte followed by the low `width` bytes of v, most significant first. */
static void put_tagged(WireBuf *b, uint8_t tag, uint64_t v, int width) {
    uint8_t out[9];
    out[0] = tag;
    for (int i = 0; i < width; i++) out[1 + i] = (uint8_t)(v >> (8 * (width - 1 - i)));
    wire_put(b, out, (size_t)width + 1);
}

void msgpack_put_nil(WireBuf *b) { wire_put(b, &(uint8_t){0xc0}, 1); }

void msgpack_put_bool(WireBuf *b, bool v) { wire_put(b, &(uint8_t){v ? 0xc3 : 0xc2}, 1); }

void msgpack_put_uint(WireBuf *b, uint64_t v) {
    if (v <= 0x7f) wire_put(b, &(uint8_t){(uint8_t)v}, 1);
    else if (v <= UINT8_MAX) put_tagged(b, 0xcc, v, 1);
    else if (v <= UINT16_MAX) put_tagged(b, 0xcd, v, 2);
    else if (v <= UINT32_MAX) put_tagged(b, 0xce, v, 4);
    else put_tagged(b, 0xcf, v, 8);
}

/* Non-negative values take the unsigned forms (what msgspec writes); negatives the shortest signed. */
void msgpack_put_int(WireBuf *b, int64_t v) {
    if (v >= 0) msgpack_put_uint(b, (uint64_t)v);
    else if (v >= -32) wire_put(b, &(uint8_t){(uint8_t)(int8_t)v}, 1);
    else if (v >= INT8_MIN) put_tagged(b, 0xd0, (uint64_t)v, 1);
    else if (v >= INT16_MIN) put_tagged(b, 0xd1, (uint64_t)v, 2);
    else if (v >= INT32_MIN) put_tagged(b, 0xd2, (uint64_t)v, 4);
    else put_tagged(b, 0xd3, (uint64_t)v, 8);
}

void msgpack_put_f64(WireBuf *b, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_tagged(b, 0xcb, bits, 8);
}

void msgpack_put_str(WireBuf *b, const char *s, size_t len) {
    if (len <= 31) wire_put(b, &(uint8_t){(uint8_t)(0xa0 | len)}, 1);
    else if (len <= UINT8_MAX) put_tagged(b, 0xd9, len, 1);
    else if (len <= UINT16_MAX) put_tagged(b, 0xda, len, 2);
    else put_tagged(b, 0xdb, len, 4);
    wire_put(b, s, len);
}

void msgpack_put_cstr(WireBuf *b, const char *s) { msgpack_put_str(b, s, strlen(s)); }

void msgpack_put_bin(WireBuf *b, const void *data, size_t len) {
    if (len <= UINT8_MAX) put_tagged(b, 0xc4, len, 1);
    else if (len <= UINT16_MAX) put_tagged(b, 0xc5, len, 2);
    else put_tagged(b, 0xc6, len, 4);
    wire_put(b, data, len);
}

void msgpack_put_array(WireBuf *b, uint32_t n) {
    if (n <= 15) wire_put(b, &(uint8_t){(uint8_t)(0x90 | n)}, 1);
    else if (n <= UINT16_MAX) put_tagged(b, 0xdc, n, 2);
    else put_tagged(b, 0xdd, n, 4);
}
