#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/int8_pack.h"
#include "kernels/cpu/matmul_int8.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_int8.h"
#include "model/tensor_types.h"

/* Dequantized panels are bounded so the output head (vocab × dim) never needs a full fp32 copy. */
#define PANEL_MAX_FLOATS (4u << 20)

void cpu_scratch_free(CpuScratch *s) {
    free(s->panel);
    free(s->x_block_sums);
    s->panel = s->x_block_sums = NULL;
    s->panel_cap = s->x_block_sums_cap = 0;
    act_quant_free(&s->acts);
}

static int ensure_capacity(float **buf, size_t *cap, size_t need) {
    if (*cap >= need) return 0;
    float *p = realloc(*buf, need * sizeof **buf);
    if (!p) return -1;
    *buf = p;
    *cap = need;
    return 0;
}

void cpu_matrix_row(const WeightMatrix *w, int64_t index, float *out) {
    if (w->layout == WEIGHT_LAYOUT_ROWS8) int8_pack_dequantize_row(w, index, out);
    else quant_dequantize_row(w->type, w->data + (size_t)index * w->row_bytes, out, w->cols);
}

static int matmul_by_rows(const WeightMatrix *w, const float *x, int n_tokens, float *y, CpuScratch *s) {
    int64_t cols = w->cols, rows = w->rows, nb = cols / 32;
    if (ensure_capacity(&s->x_block_sums, &s->x_block_sums_cap, (size_t)(n_tokens * nb + 1))) return -1;
    for (int t = 0; t < n_tokens; t++) quant_block_sums(x + t * cols, cols, s->x_block_sums + t * nb);
    const float *xs = s->x_block_sums;
    /* Rows go in groups; within a group each chunk of up to four tokens stays in L1 while the
     * group's rows pass over it (re-reading a ~1 KB weight row from L2 is cheaper than re-reading
     * every token's activations for every row). Each row is widened once per chunk. */
    const int64_t group = 32;
#pragma omp parallel for schedule(static)
    for (int64_t r0 = 0; r0 < rows; r0 += group) {
        int64_t r_end = r0 + group < rows ? r0 + group : rows;
        for (int t0 = 0; t0 < n_tokens; t0 += 4) {
            int nt = n_tokens - t0 < 4 ? n_tokens - t0 : 4;
            for (int64_t r = r0; r < r_end; r++) {
                float out[4];
                quant_dot_row_tokens(w->type, w->data + (size_t)r * w->row_bytes, x + (size_t)t0 * cols, (size_t)cols,
                                     xs + (size_t)t0 * nb, (size_t)nb, nt, cols, out);
                for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * rows + r] = out[t];
            }
        }
    }
    return 0;
}

static int matmul_by_gemm(const WeightMatrix *w, const float *x, int n_tokens, float *y, CpuScratch *s) {
    int64_t cols = w->cols, rows = w->rows;
    int64_t panel_rows = (int64_t)(PANEL_MAX_FLOATS / (size_t)cols);
    if (panel_rows < 1) panel_rows = 1;
    if (panel_rows > rows) panel_rows = rows;
    if (ensure_capacity(&s->panel, &s->panel_cap, (size_t)(panel_rows * cols))) return -1;
    for (int64_t r0 = 0; r0 < rows; r0 += panel_rows) {
        int64_t nr = rows - r0 < panel_rows ? rows - r0 : panel_rows;
        float *panel = s->panel;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < nr; r++) cpu_matrix_row(w, r0 + r, panel + r * cols);
        /* y[:, r0:r0+nr] = x (n_tokens × cols) · panelᵀ (cols × nr) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tokens, (int)nr, (int)cols, 1.0f, x, (int)cols, panel,
                    (int)cols, 0.0f, y + r0, (int)rows);
    }
    return 0;
}

/* Whether W takes the int8 path: in int8 mode every matrix with integer kernels (a type without
 * them keeps the fp32 arithmetic), and a packed matrix always (only the int8 kernels read it; an
 * int8 backend packs its weights). */
bool cpu_matmul_takes_int8(const WeightMatrix *w, CpuMatmulMath math) {
    return w->layout == WEIGHT_LAYOUT_ROWS8 || (math == CPU_MATMUL_INT8 && int8_pack_supported(w));
}

int cpu_matmul(const WeightMatrix *w, const float *x, int n_tokens, float *y, CpuMatmulMath math, CpuScratch *s) {
    if (cpu_matmul_takes_int8(w, math)) return matmul_int8(&w, &y, 1, x, n_tokens, &s->acts);
    if (n_tokens >= CPU_MATMUL_GEMM_MIN_TOKENS) return matmul_by_gemm(w, x, n_tokens, y, s);
    return matmul_by_rows(w, x, n_tokens, y, s);
}

int cpu_matmul_shared_input(const WeightMatrix *const *ws, float *const *ys, int count, const float *x, int n_tokens,
                            CpuMatmulMath math, CpuScratch *s) {
    bool together = true;
    for (int i = 0; i < count; i++) together = together && cpu_matmul_takes_int8(ws[i], math) && ws[i]->cols == ws[0]->cols;
    if (together) return matmul_int8(ws, ys, count, x, n_tokens, &s->acts);
    for (int i = 0; i < count; i++)
        if (cpu_matmul(ws[i], x, n_tokens, ys[i], math, s)) return -1;
    return 0;
}

/* dot(row r of W, x) from the dequantized weights, accumulated in double. */
static double row_dot_exact(const WeightMatrix *w, int64_t r, const float *x) {
    bool packed = w->layout == WEIGHT_LAYOUT_ROWS8;
    int64_t elems = packed ? ACT_QUANT_BLOCK : (int64_t)tensor_type_block_elems(w->type);
    size_t block_bytes = tensor_type_block_bytes(w->type);
    float v[256]; /* the largest block of a supported type: a K-quant superblock */
    double sum = 0.0;
    for (int64_t b = 0; b < w->cols / elems; b++) {
        if (packed) int8_pack_dequantize_block(w, r, b, v);
        else quant_dequantize_row(w->type, w->data + (size_t)r * w->row_bytes + (size_t)b * block_bytes, v, elems);
        for (int64_t j = 0; j < elems; j++) sum += (double)v[j] * (double)x[b * elems + j];
    }
    return sum;
}

/* The indices of the `top` largest values of y[0..n), in no particular order; returns how many
 * (fewer when n is smaller). NaNs are never chosen. */
static int top_indices(const float *y, int64_t n, int top, int64_t *idx) {
    float val[CPU_REFINE_MAX_TOP];
    int k = 0, min_at = 0; /* val[min_at]: the smallest value kept */
    for (int64_t i = 0; i < n; i++) {
        float v = y[i];
        if (v != v) continue;
        if (k < top) {
            if (k == 0 || v < val[min_at]) min_at = k;
            idx[k] = i;
            val[k++] = v;
            continue;
        }
        if (v <= val[min_at]) continue;
        idx[min_at] = i;
        val[min_at] = v;
        for (int j = 0; j < k; j++)
            if (val[j] < val[min_at]) min_at = j;
    }
    return k;
}

void cpu_matmul_refine_top(const WeightMatrix *w, const float *x, int n_tokens, float *y, int top) {
    if (top > CPU_REFINE_MAX_TOP) top = CPU_REFINE_MAX_TOP;
#pragma omp parallel for schedule(static) if (n_tokens >= 4)
    for (int t = 0; t < n_tokens; t++) {
        float *row = y + (size_t)t * (size_t)w->rows;
        int64_t idx[CPU_REFINE_MAX_TOP];
        int k = top_indices(row, w->rows, top, idx);
        for (int i = 0; i < k; i++) row[idx[i]] = (float)row_dot_exact(w, idx[i], x + (size_t)t * (size_t)w->cols);
    }
}

int cpu_matmul_math_parse(const char *text, CpuMatmulMath *math) {
    if (strcmp(text, "fp32") == 0) *math = CPU_MATMUL_FP32;
    else if (strcmp(text, "int8") == 0) *math = CPU_MATMUL_INT8;
    else return -1;
    return 0;
}
