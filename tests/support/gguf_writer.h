/*
 * gguf_writer.h — builds GGUF files in memory for tests and fuzz seeds (test code only).
 *
 * Usage: gw_init; add metadata with gw_kv_* (arrays: gw_kv_array_begin + gw_arr_* elements);
 * add tensors with gw_tensor (data copied, offsets aligned); gw_finish returns the file bytes
 * (malloc'd, caller frees) with the header counts filled in. Aborts on out-of-memory (tests only).
 */
#ifndef BRAID_TEST_GGUF_WRITER_H
#define BRAID_TEST_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *meta;   /* key/values */
    size_t meta_len, meta_cap;
    uint8_t *infos;  /* tensor infos */
    size_t infos_len, infos_cap;
    uint8_t *data;   /* tensor data, each aligned */
    size_t data_len, data_cap;
    uint64_t n_kv, n_tensors;
    uint32_t version;
    size_t alignment;
} GgufWriter;

void gw_init(GgufWriter *w);
void gw_kv_u32(GgufWriter *w, const char *key, uint32_t v);
void gw_kv_i32(GgufWriter *w, const char *key, int32_t v);
void gw_kv_u64(GgufWriter *w, const char *key, uint64_t v);
void gw_kv_f32(GgufWriter *w, const char *key, float v);
void gw_kv_f64(GgufWriter *w, const char *key, double v);
void gw_kv_bool(GgufWriter *w, const char *key, int v);
void gw_kv_str(GgufWriter *w, const char *key, const char *v);
/* Writes key, ARRAY type, element type and count; then append exactly count elements with gw_arr_*. */
void gw_kv_array_begin(GgufWriter *w, const char *key, uint32_t elem_type, uint64_t count);
void gw_arr_u8(GgufWriter *w, uint8_t v);
void gw_arr_i32(GgufWriter *w, int32_t v);
void gw_arr_f32(GgufWriter *w, float v);
void gw_arr_str(GgufWriter *w, const char *v);
/* A nested array element header (element type and count); follow with its elements. */
void gw_arr_array_begin(GgufWriter *w, uint32_t elem_type, uint64_t count);
/* Raw bytes appended to the metadata stream (for crafting invalid files). */
void gw_raw(GgufWriter *w, const void *bytes, size_t n);
void gw_tensor(GgufWriter *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne, const void *data,
               size_t nbytes);
uint8_t *gw_finish(GgufWriter *w, size_t *size);

#endif
