/*
 * Weight conversion for device backends: bf16 rounding (nearest even, NaN kept), a quantized
 * matrix converted whole and as a tensor-parallel rectangle equals its dequantized values rounded,
 * and bad rectangles fail.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "model/tensor_types.h"
#include "model/weight_convert.h"

static void test_bf16_rounding(void **state) {
    (void)state;
    assert_int_equal(fp32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(fp32_to_bf16(-2.0f), 0xC000);
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0). */
    assert_int_equal(fp32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3F80);
    /* 1 + 3·2^-8 is halfway too: rounds up to the even 1 + 2^-6 pattern 0x3F82. */
    assert_int_equal(fp32_to_bf16(1.0f + 3.0f * ldexpf(1.0f, -8)), 0x3F82);
    assert_int_equal(fp32_to_bf16(1.0f + 1.5f * ldexpf(1.0f, -8)), 0x3F81); /* above half: up */
    assert_true(isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
    assert_true(isinf(bf16_to_fp32(fp32_to_bf16(INFINITY))));
    for (uint32_t b = 0; b < 65536; b++) {
        float f = bf16_to_fp32((uint16_t)b);
        if (!isnan(f)) assert_int_equal(fp32_to_bf16(f), b); /* every bf16 survives the round trip */
    }
}

/* A Q8_0 matrix of 6 rows x 64 columns with varied values. */
static uint8_t q8_data[6 * 2 * 34];
static WeightMatrix make_q8_matrix(void) {
    for (int blk = 0; blk < 12; blk++) {
        uint8_t *b = q8_data + blk * 34;
        uint16_t d = fp32_to_fp16(0.01f * (float)(blk + 1));
        memcpy(b, &d, 2);
        for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)((blk * 37 + i * 11) % 255 - 127);
    }
    return (WeightMatrix){.type = TENSOR_Q8_0, .rows = 6, .cols = 64, .row_bytes = 68, .data = q8_data, .name = "w"};
}

static void test_matrix_and_shard(void **state) {
    (void)state;
    WeightMatrix m = make_q8_matrix();
    float ref[6][64];
    for (int r = 0; r < 6; r++) quant_dequantize_row(TENSOR_Q8_0, q8_data + r * 68, ref[r], 64);
    uint16_t whole[6 * 64], part[2 * 16];
    BraidError err;
    assert_int_equal(weight_to_bf16(&m, 0, 6, 0, 64, whole, &err), 0);
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 64; c++) assert_int_equal(whole[r * 64 + c], fp32_to_bf16(ref[r][c]));
    assert_int_equal(weight_to_bf16(&m, 3, 2, 40, 16, part, &err), 0); /* rows 3-4, cols 40-55 */
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 16; c++) assert_int_equal(part[r * 16 + c], whole[(3 + r) * 64 + 40 + c]);
    assert_int_equal(weight_to_bf16(&m, 5, 2, 0, 64, whole, &err), -1);
    assert_non_null(strstr(err.msg, "leave its 6 x 64 shape"));
    assert_int_equal(weight_to_bf16(&m, 0, 1, 60, 8, whole, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_matrix_and_shard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
