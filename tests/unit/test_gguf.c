/*
 * GGUF reader: every metadata value type, nested arrays, alignment, tensor infos and data, and a
 * clear error (never a crash) for every kind of corruption, including truncation at every length.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "gguf_writer.h"
#include "model/gguf.h"
#include "model/tensor_types.h"
#include "test_paths.h"

static uint8_t *build_full_file(size_t *size, size_t alignment) {
    GgufWriter w;
    gw_init(&w);
    w.alignment = alignment;
    gw_kv_str(&w, "general.architecture", "llama");
    if (alignment != 32) gw_kv_u32(&w, "general.alignment", (uint32_t)alignment);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    gw_kv_array_begin(&w, "dummy", 0, 0); /* empty uint8 array */
    GgufWriter *wp = &w;
    /* scalar types written raw: key, type, value */
    struct { const char *key; uint32_t type; const void *v; size_t n; } raw[] = {
        {"t.u8", 0, &u8, 1}, {"t.i8", 1, &i8, 1}, {"t.u16", 2, &u16, 2}, {"t.i16", 3, &i16, 2},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        uint64_t len = strlen(raw[i].key);
        gw_raw(wp, &len, 8);
        gw_raw(wp, raw[i].key, len);
        gw_raw(wp, &raw[i].type, 4);
        gw_raw(wp, raw[i].v, raw[i].n);
        w.n_kv++;
    }
    gw_kv_u32(&w, "t.u32", 4000000000u);
    gw_kv_i32(&w, "t.i32", -2000000000);
    gw_kv_f32(&w, "t.f32", 1.5f);
    gw_kv_bool(&w, "t.bool", 1);
    gw_kv_str(&w, "t.str", "hello");
    gw_kv_u64(&w, "t.u64", 18000000000000000000ull);
    gw_kv_f64(&w, "t.f64", -2.25);
    gw_kv_array_begin(&w, "t.arr_i32", 5, 3);
    gw_arr_i32(&w, 7); gw_arr_i32(&w, -8); gw_arr_i32(&w, 9);
    gw_kv_array_begin(&w, "t.arr_f32", 6, 2);
    gw_arr_f32(&w, 0.25f); gw_arr_f32(&w, -4.0f);
    gw_kv_array_begin(&w, "t.arr_str", 8, 3);
    gw_arr_str(&w, "a"); gw_arr_str(&w, ""); gw_arr_str(&w, "ccc");
    gw_kv_array_begin(&w, "t.nested", 9, 2); /* array of arrays */
    gw_arr_array_begin(&w, 8, 2); gw_arr_str(&w, "x"); gw_arr_str(&w, "yy");
    gw_arr_array_begin(&w, 5, 1); gw_arr_i32(&w, 42);
    float f32[4] = {1, 2, 3, 4};
    uint64_t ne1[1] = {4};
    gw_tensor(&w, "vec", TENSOR_F32, 1, ne1, f32, sizeof f32);
    BlockQ8_0 q8[2] = {{.d = 0x3C00}, {.d = 0x4000}};
    for (int i = 0; i < 32; i++) { q8[0].qs[i] = (int8_t)i; q8[1].qs[i] = (int8_t)-i; }
    uint64_t ne2[2] = {32, 2};
    gw_tensor(&w, "mat", TENSOR_Q8_0, 2, ne2, q8, sizeof q8);
    uint16_t h[2 * 3 * 4] = {0};
    uint64_t ne3[3] = {2, 3, 4};
    gw_tensor(&w, "cube", TENSOR_F16, 3, ne3, h, sizeof h);
    uint64_t ne4[4] = {2, 1, 1, 2};
    gw_tensor(&w, "hyper", TENSOR_BF16, 4, ne4, h, 8);
    return gw_finish(&w, size);
}

static void test_all_value_types(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = build_full_file(&size, 32);
    GgufFile *f;
    BraidError err;
    assert_int_equal(gguf_open_memory(buf, size, &f, &err), 0);
    int64_t i;
    double d;
    bool b;
    GgufString s;
    assert_int_equal(gguf_get_int(f, "t.u8", &i), 0); assert_int_equal(i, 200);
    assert_int_equal(gguf_get_int(f, "t.i8", &i), 0); assert_int_equal(i, -100);
    assert_int_equal(gguf_get_int(f, "t.u16", &i), 0); assert_int_equal(i, 60000);
    assert_int_equal(gguf_get_int(f, "t.i16", &i), 0); assert_int_equal(i, -30000);
    assert_int_equal(gguf_get_int(f, "t.u32", &i), 0); assert_int_equal(i, 4000000000ll);
    assert_int_equal(gguf_get_int(f, "t.i32", &i), 0); assert_int_equal(i, -2000000000ll);
    assert_int_equal(gguf_get_float(f, "t.f32", &d), 0); assert_true(d == 1.5);
    assert_int_equal(gguf_get_float(f, "t.f64", &d), 0); assert_true(d == -2.25);
    assert_int_equal(gguf_get_float(f, "t.i32", &d), 0); assert_true(d == -2000000000.0); /* ints widen to float */
    assert_int_equal(gguf_get_bool(f, "t.bool", &b), 0); assert_true(b);
    assert_int_equal(gguf_get_string(f, "t.str", &s), 0); assert_true(gguf_string_equals(s, "hello"));
    /* u64 beyond INT64_MAX does not fit the integer getter; wrong types are refused */
    assert_int_equal(gguf_get_int(f, "t.u64", &i), -1);
    assert_int_equal(gguf_find(f, "t.u64")->u64, 18000000000000000000ull);
    assert_int_equal(gguf_get_int(f, "t.str", &i), -1);
    assert_int_equal(gguf_get_string(f, "t.u32", &s), -1);
    assert_int_equal(gguf_get_bool(f, "t.i8", &b), -1);
    assert_int_equal(gguf_get_int(f, "no.such.key", &i), -1);
    assert_null(gguf_find(f, "no.such.key"));

    const GgufValue *a = gguf_find(f, "t.arr_i32");
    assert_int_equal(a->type, GGUF_TYPE_ARRAY);
    assert_int_equal(a->arr.count, 3);
    assert_int_equal(gguf_array_get_int(a, 0), 7);
    assert_int_equal(gguf_array_get_int(a, 1), -8);
    assert_int_equal(gguf_array_get_int(a, 2), 9);
    a = gguf_find(f, "t.arr_f32");
    assert_true(gguf_array_get_float(a, 0) == 0.25 && gguf_array_get_float(a, 1) == -4.0);
    a = gguf_find(f, "t.arr_str");
    assert_int_equal(a->arr.count, 3);
    assert_true(gguf_string_equals(a->arr.strings[0], "a"));
    assert_true(gguf_string_equals(a->arr.strings[1], ""));
    assert_true(gguf_string_equals(a->arr.strings[2], "ccc"));
    a = gguf_find(f, "t.nested");
    assert_int_equal(a->arr.elem_type, GGUF_TYPE_ARRAY);
    assert_int_equal(a->arr.count, 2);
    assert_true(gguf_string_equals(a->arr.items[0].arr.strings[1], "yy"));
    assert_int_equal(gguf_array_get_int(&a->arr.items[1], 0), 42);
    assert_int_equal(gguf_find(f, "dummy")->arr.count, 0);

    assert_int_equal(f->n_tensors, 4);
    const GgufTensor *t = gguf_find_tensor(f, "vec");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->ne[0], 4);
    assert_int_equal(t->ne[1], 1);
    assert_int_equal(t->nbytes, 16);
    assert_true(((const float *)t->data)[3] == 4.0f);
    t = gguf_find_tensor(f, "mat");
    assert_int_equal(t->type, TENSOR_Q8_0);
    assert_int_equal(t->nbytes, 2 * sizeof(BlockQ8_0));
    assert_int_equal(((const BlockQ8_0 *)t->data)[1].qs[5], -5);
    assert_int_equal((uintptr_t)((const uint8_t *)t->data - buf) % 32, 0);
    t = gguf_find_tensor(f, "cube");
    assert_int_equal(t->n_dims, 3);
    assert_int_equal(t->ne[2], 4);
    assert_int_equal(t->nbytes, 2 * 3 * 4 * 2);
    t = gguf_find_tensor(f, "hyper");
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->nbytes, 8);
    assert_null(gguf_find_tensor(f, "nope"));
    gguf_close(f);
    free(buf);
}

static void test_custom_alignment_and_version2(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = build_full_file(&size, 64);
    GgufFile *f;
    BraidError err;
    assert_int_equal(gguf_open_memory(buf, size, &f, &err), 0);
    assert_int_equal(f->alignment, 64);
    assert_int_equal(f->data_offset % 64, 0);
    for (uint64_t i = 0; i < f->n_tensors; i++) assert_int_equal(f->tensors[i].offset % 64, 0);
    gguf_close(f);
    buf[4] = 2; /* version 2 has the same layout */
    assert_int_equal(gguf_open_memory(buf, size, &f, &err), 0);
    assert_int_equal(f->version, 2);
    gguf_close(f);
    free(buf);
}

static void expect_error(const uint8_t *buf, size_t size, const char *needle) {
    GgufFile *f = (GgufFile *)0x1;
    BraidError err = {{0}};
    int rc = gguf_open_memory(buf, size, &f, &err);
    if (rc != -1 || !strstr(err.msg, needle)) fprintf(stderr, "expected error containing '%s', got rc %d: '%s'\n", needle, rc, err.msg);
    assert_int_equal(rc, -1);
    assert_null(f);
    assert_non_null(strstr(err.msg, needle));
}

static void test_truncation_at_every_length(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = build_full_file(&size, 32);
    for (size_t len = 0; len < size; len++) {
        /* A private copy of exactly len bytes, so ASan catches any read past the end. */
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, buf, len);
        GgufFile *f;
        BraidError err = {{0}};
        assert_int_equal(gguf_open_memory(copy, len, &f, &err), -1);
        assert_true(strstr(err.msg, "truncated") || strstr(err.msg, "not a GGUF") || strstr(err.msg, "extends past"));
        free(copy);
    }
    free(buf);
}

static void test_bad_magic_and_versions(void **state) {
    (void)state;
    size_t size;
    uint8_t *buf = build_full_file(&size, 32);
    buf[0] = 'X';
    expect_error(buf, size, "not a GGUF file");
    buf[0] = 'G';
    buf[4] = 1;
    expect_error(buf, size, "version 1");
    buf[4] = 99;
    expect_error(buf, size, "unsupported GGUF version 99");
    free(buf);
}

/* A header followed by one metadata entry whose bytes the test supplies. */
static uint8_t *one_kv_file(const void *kv_bytes, size_t n, size_t *size) {
    GgufWriter w;
    gw_init(&w);
    gw_raw(&w, kv_bytes, n);
    w.n_kv = 1;
    return gw_finish(&w, size);
}

static void test_hostile_metadata(void **state) {
    (void)state;
    size_t size;
    uint8_t kv[64];
    uint64_t len;
    uint32_t type;
    /* key length far beyond the file */
    len = 1ull << 40;
    memcpy(kv, &len, 8);
    uint8_t *buf = one_kv_file(kv, 8, &size);
    expect_error(buf, size, "truncated");
    free(buf);
    /* array of 2^62 uint32 */
    len = 1; memcpy(kv, &len, 8); kv[8] = 'k';
    type = 9; memcpy(kv + 9, &type, 4);
    type = 4; memcpy(kv + 13, &type, 4);
    len = 1ull << 62; memcpy(kv + 17, &len, 8);
    buf = one_kv_file(kv, 25, &size);
    expect_error(buf, size, "exceeds the file");
    free(buf);
    /* array of 2^62 strings */
    type = 8; memcpy(kv + 13, &type, 4);
    buf = one_kv_file(kv, 25, &size);
    expect_error(buf, size, "exceeds the file");
    free(buf);
    /* invalid value type */
    type = 77; memcpy(kv + 9, &type, 4);
    buf = one_kv_file(kv, 13, &size);
    expect_error(buf, size, "invalid value type");
    free(buf);
    /* invalid array element type */
    type = 9; memcpy(kv + 9, &type, 4);
    type = 200; memcpy(kv + 13, &type, 4);
    len = 1; memcpy(kv + 17, &len, 8);
    buf = one_kv_file(kv, 25, &size);
    expect_error(buf, size, "invalid element type");
    free(buf);
    /* nesting deeper than the limit: array of array of ... */
    GgufWriter w;
    gw_init(&w);
    gw_kv_array_begin(&w, "deep", 9, 1);
    for (int d = 0; d < 20; d++) gw_arr_array_begin(&w, 9, 1);
    gw_arr_array_begin(&w, 5, 0);
    buf = gw_finish(&w, &size);
    expect_error(buf, size, "nested deeper");
    free(buf);
    /* implausible counts in the header */
    gw_init(&w);
    buf = gw_finish(&w, &size);
    uint64_t huge = 1ull << 50;
    memcpy(buf + 8, &huge, 8);
    expect_error(buf, size, "implausible tensor count");
    memset(buf + 8, 0, 8);
    memcpy(buf + 16, &huge, 8);
    expect_error(buf, size, "implausible metadata count");
    free(buf);
    /* bad alignment values */
    gw_init(&w);
    gw_kv_u32(&w, "general.alignment", 48);
    buf = gw_finish(&w, &size);
    expect_error(buf, size, "alignment");
    free(buf);
}

static uint8_t *one_tensor_file(uint32_t type, uint32_t n_dims, const uint64_t *ne, size_t data_bytes, size_t *size) {
    GgufWriter w;
    gw_init(&w);
    uint8_t *data = calloc(1, data_bytes ? data_bytes : 1);
    gw_tensor(&w, "t", type, n_dims, ne, data, data_bytes);
    free(data);
    return gw_finish(&w, size);
}

static void test_hostile_tensors(void **state) {
    (void)state;
    size_t size;
    uint64_t ne[5] = {32, 2, 1, 1, 1};
    uint8_t *buf = one_tensor_file(13, 2, ne, 2 * 176, &size); /* Q5_K */
    expect_error(buf, size, "Q5_K");
    free(buf);
    buf = one_tensor_file(200, 2, ne, 64, &size);
    expect_error(buf, size, "does not support");
    free(buf);
    buf = one_tensor_file(TENSOR_F32, 0, ne, 0, &size);
    expect_error(buf, size, "dimensions");
    free(buf);
    buf = one_tensor_file(TENSOR_F32, 5, ne, 256, &size);
    expect_error(buf, size, "dimensions");
    free(buf);
    uint64_t zero[2] = {0, 4};
    buf = one_tensor_file(TENSOR_F32, 2, zero, 0, &size);
    expect_error(buf, size, "implausible dimension");
    free(buf);
    uint64_t odd[2] = {33, 1};
    buf = one_tensor_file(TENSOR_Q4_0, 2, odd, 18, &size);
    expect_error(buf, size, "not a multiple");
    free(buf);
    uint64_t huge[2] = {1ull << 39, 1ull << 39};
    buf = one_tensor_file(TENSOR_F32, 2, huge, 0, &size);
    expect_error(buf, size, "implausible dimension");
    free(buf);
    /* data shorter than the shape needs */
    uint64_t big[2] = {32, 64};
    buf = one_tensor_file(TENSOR_F32, 2, big, 64, &size);
    expect_error(buf, size, "extends past the end");
    free(buf);
    /* misaligned offset: header (24 bytes) + name (8 + 1) + n_dims (4) + dims (16) + type (4), then the offset */
    buf = one_tensor_file(TENSOR_F32, 2, ne, 256, &size);
    uint64_t misaligned = 4;
    memcpy(buf + 24 + 9 + 4 + 16 + 4, &misaligned, 8);
    expect_error(buf, size, "not aligned");
    free(buf);
    /* duplicate names */
    GgufWriter w;
    gw_init(&w);
    float data[32] = {0};
    uint64_t ne1[1] = {32};
    gw_tensor(&w, "same", TENSOR_F32, 1, ne1, data, sizeof data);
    gw_tensor(&w, "same", TENSOR_F32, 1, ne1, data, sizeof data);
    buf = gw_finish(&w, &size);
    expect_error(buf, size, "duplicate tensor name");
    free(buf);
}

static void test_open_errors_name_the_path(void **state) {
    (void)state;
    GgufFile *f;
    BraidError err;
    assert_int_equal(gguf_open("/nonexistent/dir/model.gguf", &f, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/dir/model.gguf"));
    assert_int_equal(gguf_open("/tmp", &f, &err), -1);
    assert_non_null(strstr(err.msg, "/tmp"));
}

static void test_real_model(void **state) {
    (void)state;
    GgufFile *f;
    BraidError err;
    if (gguf_open(test_model_path(), &f, &err)) fail_msg("%s", err.msg);
    assert_int_equal(f->version, 3);
    assert_int_equal(f->n_tensors, 272);
    GgufString arch;
    assert_int_equal(gguf_get_string(f, "general.architecture", &arch), 0);
    assert_true(gguf_string_equals(arch, "llama"));
    int64_t layers;
    assert_int_equal(gguf_get_int(f, "llama.block_count", &layers), 0);
    assert_int_equal(layers, 30);
    const GgufTensor *t = gguf_find_tensor(f, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, TENSOR_Q8_0);
    assert_int_equal(t->ne[0], 576);
    assert_int_equal(t->ne[1], 49152);
    assert_int_equal(gguf_find(f, "tokenizer.ggml.tokens")->arr.count, 49152);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_value_types),
        cmocka_unit_test(test_custom_alignment_and_version2),
        cmocka_unit_test(test_truncation_at_every_length),
        cmocka_unit_test(test_bad_magic_and_versions),
        cmocka_unit_test(test_hostile_metadata),
        cmocka_unit_test(test_hostile_tensors),
        cmocka_unit_test(test_open_errors_name_the_path),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
