/*
 * msgpack.h — a small MessagePack encoder (the subset the KV event publisher writes: nil, bool,
 * unsigned and signed integers, float64, str, bin, array headers), appending to a WireBuf.
 *
 * Every value is written in its shortest form as the MessagePack specification requires (positive
 * and negative fixint, uint8..uint64, int8..int64, fixstr/str8/16/32, fixarray/array16/32), so the
 * bytes equal what msgspec and msgpack-python produce for the same values. Big-endian, as the
 * spec says (unlike the rest of the WireBuf's users, which write host order). A failed allocation
 * sets the buffer's `failed`, as every wire_put does; check it once at the end. Not thread-safe.
 */
#ifndef BRAID_TRANSPORT_MSGPACK_H
#define BRAID_TRANSPORT_MSGPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/wire.h"

void msgpack_put_nil(WireBuf *b);
void msgpack_put_bool(WireBuf *b, bool v);
void msgpack_put_uint(WireBuf *b, uint64_t v);
void msgpack_put_int(WireBuf *b, int64_t v);
void msgpack_put_f64(WireBuf *b, double v);
void msgpack_put_str(WireBuf *b, const char *s, size_t len);
void msgpack_put_cstr(WireBuf *b, const char *s);
void msgpack_put_bin(WireBuf *b, const void *data, size_t len);
/* The header of an array of n elements; the caller then writes the n elements. */
void msgpack_put_array(WireBuf *b, uint32_t n);

#endif
