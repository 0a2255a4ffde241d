/*
 * tensor_types.h — the GGML tensor element types Braid reads from GGUF files, and their block layout.
 *
 * Contract: pure tables, no state. A type is "supported" when Braid can dequantize it and multiply
 * with it (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K); other GGML ids are recognized by name so
 * error messages can say which unsupported type a file uses.
 */
#ifndef BRAID_MODEL_TENSOR_TYPES_H
#define BRAID_MODEL_TENSOR_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TENSOR_F32 = 0,
    TENSOR_F16 = 1,
    TENSOR_Q4_0 = 2,
    TENSOR_Q4_1 = 3,
    TENSOR_Q5_0 = 6,
    TENSOR_Q8_0 = 8,
    TENSOR_Q4_K = 12,
    TENSOR_Q5_K = 13,
    TENSOR_Q6_K = 14,
    TENSOR_BF16 = 30,
} TensorType;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK8_0 32
#define QK_K 256

/* Block layouts exactly as GGUF stores them (little-endian, fp16 scales). */
typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } BlockQ4_0;
typedef struct { uint16_t d; uint16_t m; uint8_t qs[QK4_1 / 2]; } BlockQ4_1;
typedef struct { uint16_t d; int8_t qs[QK8_0]; } BlockQ8_0;
/* Q5_0: element j's low 4 bits are qs[j] low nibble (j < 16) or qs[j-16] high nibble; its 5th bit is
 * bit j of qh (little-endian u32); value = d * (q - 16). */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } BlockQ5_0;
/* Q5_K: Q4_K's d, dmin and 12 bytes of 6-bit scales/mins, then qh (bit i of qh[l] is the 5th bit of
 * element 32i + l) and Q4_K's nibble layout in qs. */
typedef struct { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } BlockQ5_K;
typedef struct { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } BlockQ4_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } BlockQ6_K;

/* Name of a GGML type id ("Q4_1"), or "unknown". Works for unsupported ids too. */
const char *tensor_type_name(uint32_t type);
/* 1 when Braid can compute with this type. */
int tensor_type_supported(uint32_t type);
/* Elements per block and bytes per block; 0 for unsupported types. */
size_t tensor_type_block_elems(uint32_t type);
size_t tensor_type_block_bytes(uint32_t type);
/* Bytes of one row of n elements (n must be a multiple of the block size); 0 if not representable. */
size_t tensor_row_bytes(uint32_t type, uint64_t n);

/* IEEE half and bfloat16 conversions used by dequantization and the CPU KV cache; fp32_to_fp16
 * rounds to nearest even and keeps a NaN's top payload bits, bit for bit what F16C gives. */
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t b);
/* Round-to-nearest-even bf16 bit pattern of f (NaN stays a quiet NaN). */
uint16_t fp32_to_bf16(float f);

#endif
