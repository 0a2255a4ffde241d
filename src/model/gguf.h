/*
 * gguf.h — reader for GGUF model files (versions 2 and 3), memory-mapped.
 *
 * Owns: the mapping (or borrowed buffer), the parsed metadata key/values and the tensor infos.
 * Every offset, length and count read from the file is checked against the file's size before
 * use, so a corrupted, truncated or hostile file yields an error naming the problem, never a crash
 * (tests/fuzz/fuzz_gguf.c drives this). Tensors of types Braid cannot compute with are rejected
 * here, naming the tensor and its type.
 * Returned pointers (strings, tensor data) point into the mapping and live until gguf_close().
 * Thread-safety: read-only after gguf_open*(); any number of readers.
 */
#ifndef BRAID_MODEL_GGUF_H
#define BRAID_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} GgufValueType;

typedef struct {
    const char *data; /* not NUL-terminated; points into the file */
    uint64_t len;
} GgufString;

typedef struct GgufValue {
    GgufValueType type;
    union {
        uint64_t u64;  /* unsigned integer types */
        int64_t i64;   /* signed integer types */
        double f64;    /* FLOAT32 and FLOAT64 */
        bool b;
        GgufString str;
        struct {
            GgufValueType elem_type;
            uint64_t count;
            const uint8_t *raw;         /* numeric/bool elements, packed little-endian in the file */
            GgufString *strings;        /* STRING elements (owned array) */
            struct GgufValue *items;    /* ARRAY elements (owned, nested) */
        } arr;
    };
} GgufValue;

typedef struct {
    char *key; /* owned, NUL-terminated copy */
    GgufValue value;
} GgufKv;

#define GGUF_MAX_DIMS 4

typedef struct {
    char *name; /* owned, NUL-terminated copy */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint32_t type;              /* TensorType */
    uint64_t offset;            /* relative to the data section */
    size_t nbytes;
    const void *data;
} GgufTensor;

typedef struct GgufFile {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    GgufKv *kvs;
    GgufTensor *tensors;
    uint64_t alignment;
    size_t data_offset; /* start of the tensor data section within the file */
    const uint8_t *base;
    size_t size;
    int mapped; /* 1 when base is our own mmap */
} GgufFile;

/* Opens and validates a file. On failure returns -1 with err naming path and problem. */
int gguf_open(const char *path, GgufFile **out, BraidError *err);
/* Parses a buffer the caller keeps alive (fuzzing, tests). */
int gguf_open_memory(const void *data, size_t size, GgufFile **out, BraidError *err);
void gguf_close(GgufFile *file);

const GgufValue *gguf_find(const GgufFile *file, const char *key);
const GgufTensor *gguf_find_tensor(const GgufFile *file, const char *name);

/* Typed getters: 0 on success; -1 when the key is absent or has an incompatible type. Integer
 * getters accept any integer type whose value fits; the float getter also accepts integers. */
int gguf_get_int(const GgufFile *file, const char *key, int64_t *out);
int gguf_get_float(const GgufFile *file, const char *key, double *out);
int gguf_get_bool(const GgufFile *file, const char *key, bool *out);
int gguf_get_string(const GgufFile *file, const char *key, GgufString *out);
/* Array element access for numeric arrays (index must be < count). */
int64_t gguf_array_get_int(const GgufValue *array, uint64_t index);
double gguf_array_get_float(const GgufValue *array, uint64_t index);

const char *gguf_value_type_name(GgufValueType type);
int gguf_string_equals(GgufString s, const char *cstr);

#endif
