#include "model/weight_convert.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "model/tensor_types.h"

int weight_to_bf16(const WeightMatrix *m, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols, uint16_t *out,
                   BraidError *err) {
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > m->rows || col0 < 0 || n_cols < 0 || col0 + n_cols > m->cols)
        return braid_error_set(err, "%s: rows [%lld, +%lld) x cols [%lld, +%lld) leave its %lld x %lld shape", m->name,
                               (long long)row0, (long long)n_rows, (long long)col0, (long long)n_cols, (long long)m->rows,
                               (long long)m->cols);
    float *row = malloc((size_t)m->cols * sizeof *row);
    if (!row) return braid_error_set(err, "%s: out of memory converting to bf16", m->name);
    for (int64_t r = 0; r < n_rows; r++) {
        quant_dequantize_row(m->type, m->data + (size_t)(row0 + r) * m->row_bytes, row, m->cols);
        uint16_t *dst = out + (size_t)r * n_cols;
        for (int64_t c = 0; c < n_cols; c++) dst[c] = fp32_to_bf16(row[col0 + c]);
    }
    free(row);
    return 0;
}
