/*
 * wire.h — byte buffers for control-plane messages: a growable writer and a bounds-checked reader.
 *
 * Values are written in host byte order: every rank of a Braid job runs the same binary on the
 * same architecture (x86-64 or aarch64, both little-endian), which mpirun setups assume anyway.
 * A writer that runs out of memory, or a reader that runs past its end, sets `failed` and keeps
 * returning zeros; check it once after a whole message instead of after every field.
 * Memory: WireBuf owns `data` (wire_buf_free); WireReader borrows its bytes. Not thread-safe.
 */
#ifndef BRAID_TRANSPORT_WIRE_H
#define BRAID_TRANSPORT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *data;
    size_t len, cap;
    bool failed;
} WireBuf;

typedef struct {
    const uint8_t *data;
    size_t len, off;
    bool failed;
} WireReader;

void wire_put(WireBuf *b, const void *src, size_t n);
void wire_put_u8(WireBuf *b, uint8_t v);
void wire_put_i32(WireBuf *b, int32_t v);
void wire_put_u64(WireBuf *b, uint64_t v);
void wire_put_f32(WireBuf *b, float v);
void wire_put_f64(WireBuf *b, double v);
/* A length-prefixed string; NULL is written as the empty string. */
void wire_put_str(WireBuf *b, const char *s);
/* A length-prefixed array of int32. */
void wire_put_i32s(WireBuf *b, const int32_t *v, int n);
void wire_buf_free(WireBuf *b);

WireReader wire_reader(const void *data, size_t len);
void wire_get(WireReader *r, void *dst, size_t n);
uint8_t wire_get_u8(WireReader *r);
int32_t wire_get_i32(WireReader *r);
uint64_t wire_get_u64(WireReader *r);
float wire_get_f32(WireReader *r);
double wire_get_f64(WireReader *r);
/* A malloc'd NUL-terminated copy (caller frees), or NULL when the reader failed. */
char *wire_get_str(WireReader *r);
/* A malloc'd array of *n int32 (caller frees; NULL with *n = 0 when empty or failed). */
int32_t *wire_get_i32s(WireReader *r, int *n);

#endif
