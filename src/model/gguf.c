#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/tensor_types.h"

#define GGUF_MAX_NESTING 8
/* Bounds that no real model comes near; they stop a hostile header from asking for huge tables. */
#define GGUF_MAX_KV 1000000ull
#define GGUF_MAX_TENSORS 1000000ull

typedef struct {
    const uint8_t *base;
    size_t size, pos;
    BraidError *err;
} Cursor;

static int cursor_need(Cursor *c, uint64_t n, const char *what) {
    if (n > c->size - c->pos)
        return braid_error_set(c->err, "truncated file: need %llu bytes for %s at offset %zu, only %zu left",
                               (unsigned long long)n, what, c->pos, c->size - c->pos);
    return 0;
}

static int cursor_read(Cursor *c, void *dst, size_t n, const char *what) {
    if (cursor_need(c, n, what)) return -1;
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return 0;
}

static int cursor_u32(Cursor *c, uint32_t *v, const char *what) { return cursor_read(c, v, 4, what); }
static int cursor_u64(Cursor *c, uint64_t *v, const char *what) { return cursor_read(c, v, 8, what); }

static int cursor_string(Cursor *c, GgufString *s, const char *what) {
    uint64_t len;
    if (cursor_u64(c, &len, what) || cursor_need(c, len, what)) return -1;
    s->data = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

static size_t scalar_size(GgufValueType t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Decodes one scalar from raw little-endian bytes into a GgufValue. */
static void decode_scalar(GgufValueType t, const uint8_t *p, GgufValue *v) {
    v->type = t;
    switch (t) {
    case GGUF_TYPE_UINT8: v->u64 = p[0]; break;
    case GGUF_TYPE_INT8: v->i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_BOOL: v->b = p[0] != 0; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v->u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v->i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v->u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v->i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v->f64 = x; break; }
    case GGUF_TYPE_UINT64: memcpy(&v->u64, p, 8); break;
    case GGUF_TYPE_INT64: memcpy(&v->i64, p, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&v->f64, p, 8); break;
    default: break;
    }
}

static void value_free(GgufValue *v) {
    if (v->type != GGUF_TYPE_ARRAY) return;
    free(v->arr.strings);
    if (v->arr.items) {
        for (uint64_t i = 0; i < v->arr.count; i++) value_free(&v->arr.items[i]);
        free(v->arr.items);
    }
    v->arr.strings = NULL;
    v->arr.items = NULL;
}

static int read_value(Cursor *c, GgufValueType type, GgufValue *v, int depth);

static int read_array(Cursor *c, GgufValue *v, int depth) {
    uint32_t elem_type;
    uint64_t count;
    if (cursor_u32(c, &elem_type, "array element type") || cursor_u64(c, &count, "array length")) return -1;
    if (elem_type >= GGUF_TYPE_COUNT)
        return braid_error_set(c->err, "array at offset %zu has invalid element type %u", c->pos, elem_type);
    if (depth >= GGUF_MAX_NESTING)
        return braid_error_set(c->err, "arrays nested deeper than %d levels", GGUF_MAX_NESTING);
    v->arr.elem_type = (GgufValueType)elem_type;
    v->arr.count = 0;
    size_t esize = scalar_size((GgufValueType)elem_type);
    if (esize) {
        if (count > (c->size - c->pos) / esize)
            return braid_error_set(c->err, "truncated file: array of %llu %s elements exceeds the file",
                                   (unsigned long long)count, gguf_value_type_name((GgufValueType)elem_type));
        v->arr.raw = c->base + c->pos;
        v->arr.count = count;
        c->pos += count * esize;
        return 0;
    }
    /* Strings need at least 8 bytes each (their length), nested arrays at least 12. */
    size_t min_size = elem_type == GGUF_TYPE_STRING ? 8 : 12;
    if (count > (c->size - c->pos) / min_size)
        return braid_error_set(c->err, "truncated file: array of %llu %s elements exceeds the file",
                               (unsigned long long)count, gguf_value_type_name((GgufValueType)elem_type));
    if (elem_type == GGUF_TYPE_STRING) {
        v->arr.strings = calloc(count ? count : 1, sizeof *v->arr.strings);
        if (!v->arr.strings) return braid_error_set(c->err, "out of memory for a %llu-string array", (unsigned long long)count);
        for (uint64_t i = 0; i < count; i++)
            if (cursor_string(c, &v->arr.strings[i], "array string")) return -1;
        v->arr.count = count;
        return 0;
    }
    v->arr.items = calloc(count ? count : 1, sizeof *v->arr.items);
    if (!v->arr.items) return braid_error_set(c->err, "out of memory for a nested array");
    for (uint64_t i = 0; i < count; i++) {
        v->arr.count = i + 1; /* so value_free sees what was filled */
        if (read_value(c, GGUF_TYPE_ARRAY, &v->arr.items[i], depth + 1)) return -1;
    }
    v->arr.count = count;
    return 0;
}

static int read_value(Cursor *c, GgufValueType type, GgufValue *v, int depth) {
    memset(v, 0, sizeof *v);
    v->type = type;
    if (type == GGUF_TYPE_STRING) return cursor_string(c, &v->str, "string value");
    if (type == GGUF_TYPE_ARRAY) return read_array(c, v, depth);
    size_t n = scalar_size(type);
    if (!n) return braid_error_set(c->err, "invalid value type %d at offset %zu", (int)type, c->pos);
    if (cursor_need(c, n, "scalar value")) return -1;
    decode_scalar(type, c->base + c->pos, v);
    c->pos += n;
    return 0;
}

static char *copy_cstring(GgufString s) {
    char *out = malloc(s.len + 1);
    if (!out) return NULL;
    memcpy(out, s.data, s.len);
    out[s.len] = '\0';
    return out;
}

static int read_header(Cursor *c, GgufFile *f) {
    char magic[4];
    if (cursor_read(c, magic, 4, "magic")) return -1;
    if (memcmp(magic, "GGUF", 4) != 0)
        return braid_error_set(c->err, "not a GGUF file (magic is %02x %02x %02x %02x, expected 'GGUF')",
                               (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
    if (cursor_u32(c, &f->version, "version")) return -1;
    if (f->version != 2 && f->version != 3) {
        if (f->version == 1) return braid_error_set(c->err, "GGUF version 1 is not supported (re-convert the model)");
        return braid_error_set(c->err, "unsupported GGUF version %u (a big-endian file reads as 0x%x)", f->version,
                               f->version);
    }
    if (cursor_u64(c, &f->n_tensors, "tensor count") || cursor_u64(c, &f->n_kv, "metadata count")) return -1;
    if (f->n_tensors > GGUF_MAX_TENSORS) return braid_error_set(c->err, "implausible tensor count %llu", (unsigned long long)f->n_tensors);
    if (f->n_kv > GGUF_MAX_KV) return braid_error_set(c->err, "implausible metadata count %llu", (unsigned long long)f->n_kv);
    return 0;
}

static int read_metadata(Cursor *c, GgufFile *f) {
    f->kvs = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kvs);
    if (!f->kvs) return braid_error_set(c->err, "out of memory for metadata");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        GgufString key;
        uint32_t type;
        if (cursor_string(c, &key, "metadata key")) return braid_error_wrap(c->err, "metadata entry %llu", (unsigned long long)i);
        if (cursor_u32(c, &type, "metadata value type")) return -1;
        f->kvs[i].key = copy_cstring(key);
        if (!f->kvs[i].key) return braid_error_set(c->err, "out of memory for metadata key");
        if (type >= GGUF_TYPE_COUNT)
            return braid_error_set(c->err, "metadata key '%s' has invalid value type %u", f->kvs[i].key, type);
        if (read_value(c, (GgufValueType)type, &f->kvs[i].value, 0))
            return braid_error_wrap(c->err, "metadata key '%s'", f->kvs[i].key);
    }
    return 0;
}

static int read_tensor_info(Cursor *c, GgufTensor *t, uint64_t index) {
    GgufString name;
    if (cursor_string(c, &name, "tensor name")) return braid_error_wrap(c->err, "tensor %llu", (unsigned long long)index);
    t->name = copy_cstring(name);
    if (!t->name) return braid_error_set(c->err, "out of memory for tensor name");
    if (cursor_u32(c, &t->n_dims, "tensor dimension count")) return -1;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return braid_error_set(c->err, "tensor '%s' has %u dimensions (1..%d allowed)", t->name, t->n_dims, GGUF_MAX_DIMS);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (cursor_u64(c, &t->ne[d], "tensor dimension")) return -1;
        if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || elems > (1ull << 42) / t->ne[d])
            return braid_error_set(c->err, "tensor '%s' has an implausible dimension %llu", t->name,
                                   (unsigned long long)t->ne[d]);
        elems *= t->ne[d];
    }
    if (cursor_u32(c, &t->type, "tensor type") || cursor_u64(c, &t->offset, "tensor offset")) return -1;
    if (!tensor_type_supported(t->type))
        return braid_error_set(c->err,
                               "tensor '%s' has type %s (id %u), which Braid does not support "
                               "(supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q5_K Q6_K)",
                               t->name, tensor_type_name(t->type), t->type);
    size_t row = tensor_row_bytes(t->type, t->ne[0]);
    if (row == 0)
        return braid_error_set(c->err, "tensor '%s': row length %llu is not a multiple of the %s block size %zu", t->name,
                               (unsigned long long)t->ne[0], tensor_type_name(t->type), tensor_type_block_elems(t->type));
    t->nbytes = row * (size_t)(elems / t->ne[0]);
    return 0;
}

static int check_tensor_layout(Cursor *c, GgufFile *f) {
    if (f->data_offset > c->size && f->n_tensors > 0)
        return braid_error_set(c->err, "truncated file: tensor data section starts at %zu beyond the file size %zu",
                               f->data_offset, c->size);
    size_t data_size = f->data_offset <= c->size ? c->size - f->data_offset : 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        GgufTensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            return braid_error_set(c->err, "tensor '%s' data offset %llu is not aligned to %llu", t->name,
                                   (unsigned long long)t->offset, (unsigned long long)f->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return braid_error_set(c->err, "truncated file: tensor '%s' (%zu bytes at data offset %llu) extends past the end",
                                   t->name, t->nbytes, (unsigned long long)t->offset);
        t->data = c->base + f->data_offset + t->offset;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(f->tensors[j].name, t->name) == 0)
                return braid_error_set(c->err, "duplicate tensor name '%s'", t->name);
    }
    return 0;
}

static int parse(GgufFile *f, BraidError *err) {
    Cursor c = {.base = f->base, .size = f->size, .pos = 0, .err = err};
    if (read_header(&c, f) || read_metadata(&c, f)) return -1;
    f->alignment = 32;
    int64_t align;
    if (gguf_find(f, "general.alignment")) {
        if (gguf_get_int(f, "general.alignment", &align) || align <= 0 || (align & (align - 1)) || align > (1 << 20))
            return braid_error_set(err, "general.alignment must be a power of two integer up to 1 MiB");
        f->alignment = (uint64_t)align;
    }
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->tensors) return braid_error_set(err, "out of memory for tensor infos");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (read_tensor_info(&c, &f->tensors[i], i)) return -1;
    f->data_offset = (c.pos + f->alignment - 1) / f->alignment * f->alignment;
    return check_tensor_layout(&c, f);
}

int gguf_open_memory(const void *data, size_t size, GgufFile **out, BraidError *err) {
    *out = NULL;
    GgufFile *f = calloc(1, sizeof *f);
    if (!f) return braid_error_set(err, "out of memory");
    f->base = data;
    f->size = size;
    if (parse(f, err)) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(const char *path, GgufFile **out, BraidError *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return braid_error_set(err, "gguf: cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return braid_error_set(err, "gguf: cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        return braid_error_set(err, "gguf: '%s' is not a non-empty regular file", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return braid_error_set(err, "gguf: cannot map '%s': %s", path, strerror(errno));
    if (gguf_open_memory(map, (size_t)st.st_size, out, err)) {
        munmap(map, (size_t)st.st_size);
        return braid_error_wrap(err, "gguf: %s", path);
    }
    (*out)->mapped = 1;
    return 0;
}

void gguf_close(GgufFile *f) {
    if (!f) return;
    if (f->kvs) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free(f->kvs[i].key);
            value_free(&f->kvs[i].value);
        }
        free(f->kvs);
    }
    if (f->tensors) {
        for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
        free(f->tensors);
    }
    if (f->mapped) munmap((void *)f->base, f->size);
    free(f);
}

const GgufValue *gguf_find(const GgufFile *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kvs[i].key && strcmp(f->kvs[i].key, key) == 0) return &f->kvs[i].value;
    return NULL;
}

const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int is_signed_type(GgufValueType t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}
static int is_unsigned_type(GgufValueType t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}

int gguf_get_int(const GgufFile *f, const char *key, int64_t *out) {
    const GgufValue *v = gguf_find(f, key);
    if (!v) return -1;
    if (is_signed_type(v->type)) { *out = v->i64; return 0; }
    if (is_unsigned_type(v->type) && v->u64 <= (uint64_t)INT64_MAX) { *out = (int64_t)v->u64; return 0; }
    return -1;
}

int gguf_get_float(const GgufFile *f, const char *key, double *out) {
    const GgufValue *v = gguf_find(f, key);
    if (!v) return -1;
    if (v->type == GGUF_TYPE_FLOAT32 || v->type == GGUF_TYPE_FLOAT64) { *out = v->f64; return 0; }
    int64_t i;
    if (gguf_get_int(f, key, &i) == 0) { *out = (double)i; return 0; }
    return -1;
}

int gguf_get_bool(const GgufFile *f, const char *key, bool *out) {
    const GgufValue *v = gguf_find(f, key);
    if (!v || v->type != GGUF_TYPE_BOOL) return -1;
    *out = v->b;
    return 0;
}

int gguf_get_string(const GgufFile *f, const char *key, GgufString *out) {
    const GgufValue *v = gguf_find(f, key);
    if (!v || v->type != GGUF_TYPE_STRING) return -1;
    *out = v->str;
    return 0;
}

int64_t gguf_array_get_int(const GgufValue *a, uint64_t i) {
    GgufValue v = {0};
    decode_scalar(a->arr.elem_type, a->arr.raw + i * scalar_size(a->arr.elem_type), &v);
    if (is_signed_type(v.type)) return v.i64;
    if (v.type == GGUF_TYPE_BOOL) return v.b;
    if (v.type == GGUF_TYPE_FLOAT32 || v.type == GGUF_TYPE_FLOAT64) {
        /* Out-of-range and NaN values would be undefined behaviour to convert. */
        if (!(v.f64 > -9.2e18 && v.f64 < 9.2e18)) return 0;
        return (int64_t)v.f64;
    }
    return (int64_t)v.u64;
}

double gguf_array_get_float(const GgufValue *a, uint64_t i) {
    GgufValue v = {0};
    decode_scalar(a->arr.elem_type, a->arr.raw + i * scalar_size(a->arr.elem_type), &v);
    if (v.type == GGUF_TYPE_FLOAT32 || v.type == GGUF_TYPE_FLOAT64) return v.f64;
    return (double)gguf_array_get_int(a, i);
}

const char *gguf_value_type_name(GgufValueType t) {
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                        "bool", "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "invalid";
}

int gguf_string_equals(GgufString s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.data, cstr, n) == 0;
}
