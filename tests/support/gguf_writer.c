#include "gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void append(uint8_t **buf, size_t *len, size_t *cap, const void *bytes, size_t n) {
    if (*len + n > *cap) {
        *cap = (*len + n) * 2 + 64;
        *buf = realloc(*buf, *cap);
        if (!*buf) {
            fprintf(stderr, "gguf_writer: out of memory\n");
            abort();
        }
    }
    if (n) memcpy(*buf + *len, bytes, n);
    *len += n;
}

#define META(w, p, n) append(&(w)->meta, &(w)->meta_len, &(w)->meta_cap, (p), (n))

void gw_init(GgufWriter *w) {
    memset(w, 0, sizeof *w);
    w->version = 3;
    w->alignment = 32;
}

static void put_string(uint8_t **buf, size_t *len, size_t *cap, const char *s) {
    uint64_t n = strlen(s);
    append(buf, len, cap, &n, 8);
    append(buf, len, cap, s, n);
}

static void key_header(GgufWriter *w, const char *key, uint32_t type) {
    put_string(&w->meta, &w->meta_len, &w->meta_cap, key);
    META(w, &type, 4);
    w->n_kv++;
}

void gw_kv_u32(GgufWriter *w, const char *key, uint32_t v) { key_header(w, key, 4); META(w, &v, 4); }
void gw_kv_i32(GgufWriter *w, const char *key, int32_t v) { key_header(w, key, 5); META(w, &v, 4); }
void gw_kv_u64(GgufWriter *w, const char *key, uint64_t v) { key_header(w, key, 10); META(w, &v, 8); }
void gw_kv_f32(GgufWriter *w, const char *key, float v) { key_header(w, key, 6); META(w, &v, 4); }
void gw_kv_f64(GgufWriter *w, const char *key, double v) { key_header(w, key, 12); META(w, &v, 8); }
void gw_kv_bool(GgufWriter *w, const char *key, int v) { uint8_t b = (uint8_t)(v != 0); key_header(w, key, 7); META(w, &b, 1); }
void gw_kv_str(GgufWriter *w, const char *key, const char *v) {
    key_header(w, key, 8);
    put_string(&w->meta, &w->meta_len, &w->meta_cap, v);
}

void gw_kv_array_begin(GgufWriter *w, const char *key, uint32_t elem_type, uint64_t count) {
    key_header(w, key, 9);
    META(w, &elem_type, 4);
    META(w, &count, 8);
}

void gw_arr_u8(GgufWriter *w, uint8_t v) { META(w, &v, 1); }
void gw_arr_i32(GgufWriter *w, int32_t v) { META(w, &v, 4); }
void gw_arr_f32(GgufWriter *w, float v) { META(w, &v, 4); }
void gw_arr_str(GgufWriter *w, const char *v) { put_string(&w->meta, &w->meta_len, &w->meta_cap, v); }
void gw_arr_array_begin(GgufWriter *w, uint32_t elem_type, uint64_t count) {
    META(w, &elem_type, 4);
    META(w, &count, 8);
}
void gw_raw(GgufWriter *w, const void *bytes, size_t n) { META(w, bytes, n); }

void gw_tensor(GgufWriter *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne, const void *data,
               size_t nbytes) {
    static const uint8_t zeros[256] = {0};
    while (w->data_len % w->alignment) append(&w->data, &w->data_len, &w->data_cap, zeros, 1);
    uint64_t offset = w->data_len;
    put_string(&w->infos, &w->infos_len, &w->infos_cap, name);
    append(&w->infos, &w->infos_len, &w->infos_cap, &n_dims, 4);
    append(&w->infos, &w->infos_len, &w->infos_cap, ne, 8 * (size_t)n_dims);
    append(&w->infos, &w->infos_len, &w->infos_cap, &type, 4);
    append(&w->infos, &w->infos_len, &w->infos_cap, &offset, 8);
    append(&w->data, &w->data_len, &w->data_cap, data, nbytes);
    w->n_tensors++;
}

uint8_t *gw_finish(GgufWriter *w, size_t *size) {
    uint8_t *out = NULL;
    size_t len = 0, cap = 0;
    append(&out, &len, &cap, "GGUF", 4);
    append(&out, &len, &cap, &w->version, 4);
    append(&out, &len, &cap, &w->n_tensors, 8);
    append(&out, &len, &cap, &w->n_kv, 8);
    append(&out, &len, &cap, w->meta, w->meta_len);
    append(&out, &len, &cap, w->infos, w->infos_len);
    static const uint8_t zeros[256] = {0};
    while (len % w->alignment) append(&out, &len, &cap, zeros, 1);
    append(&out, &len, &cap, w->data, w->data_len);
    free(w->meta);
    free(w->infos);
    free(w->data);
    memset(w, 0, sizeof *w);
    *size = len;
    return out;
}
