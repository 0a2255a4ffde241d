#include "model/tensor_types.h"

#include <string.h>

typedef struct {
    uint32_t id;
    const char *name;
    size_t block_elems, block_bytes;
    int supported;
} TensorTypeInfo;

_Static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes in GGUF");
_Static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes in GGUF");

static const TensorTypeInfo type_table[] = {
    {0, "F32", 1, 4, 1},
    {1, "F16", 1, 2, 1},
    {2, "Q4_0", QK4_0, sizeof(BlockQ4_0), 1},
    {3, "Q4_1", QK4_1, sizeof(BlockQ4_1), 1},
    {6, "Q5_0", QK5_0, sizeof(BlockQ5_0), 1},
    {7, "Q5_1", 0, 0, 0},
    {8, "Q8_0", QK8_0, sizeof(BlockQ8_0), 1},
    {9, "Q8_1", 0, 0, 0},
    {10, "Q2_K", 0, 0, 0},
    {11, "Q3_K", 0, 0, 0},
    {12, "Q4_K", QK_K, sizeof(BlockQ4_K), 1},
    {13, "Q5_K", QK_K, sizeof(BlockQ5_K), 1},
    {14, "Q6_K", QK_K, sizeof(BlockQ6_K), 1},
    {15, "Q8_K", 0, 0, 0},
    {16, "IQ2_XXS", 0, 0, 0},
    {17, "IQ2_XS", 0, 0, 0},
    {18, "IQ3_XXS", 0, 0, 0},
    {19, "IQ1_S", 0, 0, 0},
    {20, "IQ4_NL", 0, 0, 0},
    {21, "IQ3_S", 0, 0, 0},
    {22, "IQ2_S", 0, 0, 0},
    {23, "IQ4_XS", 0, 0, 0},
    {24, "I8", 0, 0, 0},
    {25, "I16", 0, 0, 0},
    {26, "I32", 0, 0, 0},
    {27, "I64", 0, 0, 0},
    {28, "F64", 0, 0, 0},
    {29, "IQ1_M", 0, 0, 0},
    {30, "BF16", 1, 2, 1},
    {34, "TQ1_0", 0, 0, 0},
    {35, "TQ2_0", 0, 0, 0},
    {39, "MXFP4", 0, 0, 0},
};

static const TensorTypeInfo *type_info(uint32_t type) {
    for (size_t i = 0; i < sizeof type_table / sizeof type_table[0]; i++)
        if (type_table[i].id == type) return &type_table[i];
    return NULL;
}

const char *tensor_type_name(uint32_t type) {
    const TensorTypeInfo *t = type_info(type);
    return t ? t->name : "unknown";
}

int tensor_type_supported(uint32_t type) {
    const TensorTypeInfo *t = type_info(type);
    return t && t->supported;
}

size_t tensor_type_block_elems(uint32_t type) {
    const TensorTypeInfo *t = type_info(type);
    return t && t->supported ? t->block_elems : 0;
}

size_t tensor_type_block_bytes(uint32_t type) {
    const TensorTypeInfo *t = type_info(type);
    return t && t->supported ? t->block_bytes : 0;
}

size_t tensor_row_bytes(uint32_t type, uint64_t n) {
    size_t be = tensor_type_block_elems(type);
    if (be == 0 || n % be != 0) return 0;
    return (size_t)(n / be) * tensor_type_block_bytes(type);
}

float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    /* NaN stays NaN, quieted, with the top ten payload bits: what F16C's VCVTPS2PH gives. */
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)half;
}

float bf16_to_fp32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t fp32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu)) return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
