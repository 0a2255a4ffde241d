#include "kernels/cpu/matmul_int8.h"

#include <string.h>

#include "kernels/cpu/int8_pack.h"
#include "kernels/cpu/quant_int8.h"

/* Rows per unit of parallel work: a group's weights stay in L1 while a token chunk passes over it. */
#define ROW_GROUP 16
/* A remainder of at least this many tokens (fewer than 8) still goes through the 8-lane kernel with
 * padding lanes (measured: from three tokens on it beats taking them one at a time); shorter ones
 * are taken one token at a time. */
#define GROUP_MIN_TOKENS 3

/* The tokens one kernel call takes, starting at `first`: sixteen or eight through the lane kernel,
 * or the last one or two one at a time. */
typedef struct {
    int first, count;
    int n_groups; /* 0 = one token at a time */
} TokenChunk;

static TokenChunk next_chunk(int first, int n_tokens) {
    int left = n_tokens - first;
    if (left >= 2 * ACT_QUANT_GROUP) return (TokenChunk){first, 2 * ACT_QUANT_GROUP, 2};
    if (left >= GROUP_MIN_TOKENS) return (TokenChunk){first, left < ACT_QUANT_GROUP ? left : ACT_QUANT_GROUP, 1};
    return (TokenChunk){first, left, 0};
}

/* Asks for the weights of the `count` rows from r into L2: the row groups this thread most likely
 * takes next (the schedule hands out runs of consecutive groups). The weights stream from DRAM once
 * per step and the hardware prefetcher alone leaves the kernel waiting on them: measured with 16
 * tokens, the Q8_0 vocabulary head took 30% less time with this, the Q4_1 layers 10% less. */
static void prefetch_rows(const WeightMatrix *w, int64_t r, int64_t count) {
    if (r >= w->rows) return;
    if (r + count > w->rows) count = w->rows - r;
    const char *p = (const char *)w->data + (size_t)r * w->row_bytes;
    for (size_t off = 0, n = (size_t)count * w->row_bytes; off < n; off += 64) __builtin_prefetch(p + off, 0, 2);
}

/* Values of a row group for one token chunk, (row − r0, token − first), written to y a token at a
 * time: a token's rows are contiguous in y, so the group's values fill whole cache lines at once.
 * Column-wise stores touch a line per token per row, and with a wide output such as the
 * vocabulary head (tokens 196 KB apart) those lines share cache sets and evict each other before
 * they fill (measured with 16 tokens: the head 20% faster this way, once prefetch_rows feeds it). */
typedef struct {
    float v[ROW_GROUP][QUANT_INT8_MAX_GROUPS * ACT_QUANT_GROUP];
} ChunkTile;

static void store_tile(const ChunkTile *tile, float *y, int64_t rows, int64_t r0, int64_t n_rows, const TokenChunk *c) {
    for (int i = 0; i < c->count; i++) {
        float *dst = y + (size_t)(c->first + i) * (size_t)rows + (size_t)r0;
        for (int64_t r = 0; r < n_rows; r++) dst[r] = tile->v[r][i];
    }
}

static Int8Row gguf_row(const WeightMatrix *w, int64_t r) { return quant_int8_row(w->type, w->data + (size_t)r * w->row_bytes); }

/* One or two tokens against GGUF rows [r0, r1): eight rows per kernel call with the rows in the
 * lanes (gathering their blocks), and any last rows short of eight one at a time. */
static void few_tokens(const WeightMatrix *w, const Int8Activations *a, int64_t r0, int64_t r1, const TokenChunk *c,
                       ChunkTile *tile) {
    float lanes[8];
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8)
        for (int i = 0; i < c->count; i++) {
            quant_int8_dot_rows8(w->type, w->data + (size_t)r * w->row_bytes, w->row_bytes, a, c->first + i, lanes);
            for (int k = 0; k < 8; k++) tile->v[r - r0 + k][i] = lanes[k];
        }
    for (; r < r1; r++) quant_int8_dot_tokens(w->type, w->data + (size_t)r * w->row_bytes, a, c->first, c->count, tile->v[r - r0]);
}

/* Every token against the packed groups holding rows [r0, r1): a token's eight values come out
 * contiguous, so they are stored straight into y (a padded last group through a small buffer). */
static void packed_rows(const WeightMatrix *w, const Int8Activations *a, int64_t r0, int64_t r1, float *y) {
    for (int64_t r = r0; r < r1; r += INT8_PACK_ROWS) {
        const uint8_t *group = int8_pack_group(w, r);
        if (r + INT8_PACK_ROWS <= w->rows) {
            quant_int8_dot_packed8(w->type, group, a, 0, a->n_tokens, y + r, (size_t)w->rows);
            continue;
        }
        float part[INT8_PACK_ROWS];
        for (int t = 0; t < a->n_tokens; t++) {
            quant_int8_dot_packed8(w->type, group, a, t, 1, part, INT8_PACK_ROWS);
            memcpy(y + (size_t)t * (size_t)w->rows + r, part, (size_t)(w->rows - r) * sizeof *part);
        }
    }
}

/* Eight or sixteen tokens (one or two lane groups) against GGUF rows [r0, r1), two rows at a time:
 * the pair shares the activation loads (measured ~10% faster per row). */
static void token_groups(const WeightMatrix *w, const Int8Activations *a, int64_t r0, int64_t r1, const TokenChunk *c,
                         ChunkTile *tile) {
    int g = c->first / ACT_QUANT_GROUP;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2)
        quant_int8_dot_groups_rows2(w->type, gguf_row(w, r), gguf_row(w, r + 1), a, g, c->n_groups, tile->v[r - r0],
                                    tile->v[r + 1 - r0]);
    if (r < r1) quant_int8_dot_groups(w->type, gguf_row(w, r), a, g, c->n_groups, tile->v[r - r0]);
}

/* y[t, r] for rows [r0, r1) (at most ROW_GROUP, r0 a multiple of it) and every token. */
static void row_group(const WeightMatrix *w, const Int8Activations *a, int64_t r0, int64_t r1, float *y) {
    ChunkTile tile;
    /* One or two tokens pass over the weights faster than the prefetches pay (measured slower). */
    if (a->n_tokens >= ACT_QUANT_GROUP) prefetch_rows(w, r1, 2 * (r1 - r0));
    if (w->layout == WEIGHT_LAYOUT_ROWS8) {
        packed_rows(w, a, r0, r1, y);
        return;
    }
    for (int t = 0; t < a->n_tokens;) {
        TokenChunk c = next_chunk(t, a->n_tokens);
        if (c.n_groups) token_groups(w, a, r0, r1, &c, &tile);
        else few_tokens(w, a, r0, r1, &c, &tile);
        store_tile(&tile, y, w->rows, r0, r1 - r0, &c);
        t += c.count;
    }
}

int matmul_int8(const WeightMatrix *const *ws, float *const *ys, int count, const float *x, int n_tokens,
                Int8Activations *acts) {
    bool all_packed = true;
    for (int i = 0; i < count; i++) all_packed = all_packed && ws[i]->layout == WEIGHT_LAYOUT_ROWS8;
    /* Packed matrices read the tokens' rows only: no interleaved copy, no padding tokens. */
    if ((all_packed ? act_quant_reserve_rows : act_quant_reserve)(acts, n_tokens, (int)ws[0]->cols)) return -1;
    int padded_tokens = all_packed ? n_tokens : acts->n_groups * ACT_QUANT_GROUP;
    int64_t n_units = 0;
    for (int i = 0; i < count; i++) n_units += (ws[i]->rows + ROW_GROUP - 1) / ROW_GROUP;
    /* One parallel region: the tokens are quantized, then (after the loop's barrier) the row groups
     * of every matrix are shared out, so Q, K and V together cost one fork/join. Guided
     * scheduling hands out big shares first and small ones at the end, so a core slowed by a
     * neighbour (this runs on shared VMs) does not leave the other waiting at the barrier. */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int t = 0; t < padded_tokens; t++) act_quant_token(acts, x, t);
#pragma omp for schedule(guided)
        for (int64_t u = 0; u < n_units; u++) {
            int i = 0;
            int64_t r0 = u * ROW_GROUP;
            while (r0 >= ws[i]->rows) {
                r0 -= (ws[i]->rows + ROW_GROUP - 1) / ROW_GROUP * ROW_GROUP;
                i++;
            }
            row_group(ws[i], acts, r0, r0 + ROW_GROUP < ws[i]->rows ? r0 + ROW_GROUP : ws[i]->rows, ys[i]);
        }
    }
    return 0;
}
