#include "transport/wire.h"

#include <stdlib.h>
#include <string.h>

void wire_put(WireBuf *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
}

void wire_put_u8(WireBuf *b, uint8_t v) { wire_put(b, &v, sizeof v); }
void wire_put_i32(WireBuf *b, int32_t v) { wire_put(b, &v, sizeof v); }
void wire_put_u64(WireBuf *b, uint64_t v) { wire_put(b, &v, sizeof v); }
void wire_put_f32(WireBuf *b, float v) { wire_put(b, &v, sizeof v); }
void wire_put_f64(WireBuf *b, double v) { wire_put(b, &v, sizeof v); }

void wire_put_str(WireBuf *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    wire_put_i32(b, (int32_t)n);
    wire_put(b, s, n);
}

void wire_put_i32s(WireBuf *b, const int32_t *v, int n) {
    wire_put_i32(b, n);
    wire_put(b, v, (size_t)n * sizeof *v);
}

void wire_buf_free(WireBuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

WireReader wire_reader(const void *data, size_t len) { return (WireReader){.data = data, .len = len}; }

void wire_get(WireReader *r, void *dst, size_t n) {
    if (r->failed || n > r->len - r->off) {
        r->failed = true;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->data + r->off, n);
    r->off += n;
}

uint8_t wire_get_u8(WireReader *r) { uint8_t v; wire_get(r, &v, sizeof v); return v; }
int32_t wire_get_i32(WireReader *r) { int32_t v; wire_get(r, &v, sizeof v); return v; }
uint64_t wire_get_u64(WireReader *r) { uint64_t v; wire_get(r, &v, sizeof v); return v; }
float wire_get_f32(WireReader *r) { float v; wire_get(r, &v, sizeof v); return v; }
double wire_get_f64(WireReader *r) { double v; wire_get(r, &v, sizeof v); return v; }

/* A count read from the wire, checked against what is left so a corrupt length cannot allocate wildly. */
static int checked_count(WireReader *r, size_t elem) {
    int32_t n = wire_get_i32(r);
    if (r->failed || n < 0 || (size_t)n > (r->len - r->off) / elem) {
        r->failed = true;
        return -1;
    }
    return n;
}

char *wire_get_str(WireReader *r) {
    int n = checked_count(r, 1);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) {
        r->failed = true;
        return NULL;
    }
    wire_get(r, s, (size_t)n);
    s[n] = '\0';
    return s;
}

int32_t *wire_get_i32s(WireReader *r, int *n_out) {
    *n_out = 0;
    int n = checked_count(r, sizeof(int32_t));
    if (n <= 0) return NULL;
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        r->failed = true;
        return NULL;
    }
    wire_get(r, v, (size_t)n * sizeof *v);
    *n_out = n;
    return v;
}
