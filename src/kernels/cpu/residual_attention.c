#include "kernels/cpu/residual_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "model/lora_adapter.h"

/* Query tokens per work item: the K tile of a block is rebuilt once per tile, so a prefill chunk
 * pays the reconstruction n_tokens / TILE_QUERIES times, a decode step once. */
#define TILE_QUERIES 16

/* dst (n) = src (n) halves as fp32 (exact), eight at a time with F16C. */
static void widen(float *dst, const uint16_t *src, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = vec_half_to_float(src[i]);
}

/* y (n) += a · x (n); the compiler vectorizes it. */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void narrow(uint16_t *dst, const float *src, int n) {
    for (int i = 0; i < n; i++) dst[i] = vec_float_to_half(src[i]);
}

void cpu_residual_store(const ResidualLayerView *res, const int32_t *slot_mapping, const float *k_res, const float *v_res,
                        int rank_in, int n_tokens) {
    for (int t = 0; t < n_tokens; t++) {
        int32_t slot = slot_mapping[t];
        if (slot < 0) continue;
        size_t at = (size_t)slot * res->rank;
        narrow(res->k + at, k_res + (size_t)t * rank_in, rank_in);
        narrow(res->v + at, v_res + (size_t)t * rank_in, rank_in);
        memset(res->k + at + rank_in, 0, (size_t)(res->rank - rank_in) * sizeof *res->k);
        memset(res->v + at + rank_in, 0, (size_t)(res->rank - rank_in) * sizeof *res->v);
    }
}

/* What one (KV head, query tile) work item needs besides its inputs. */
typedef struct {
    float *k_tile, *v_tile; /* (block_size, head_dim) the block's full keys, its base values */
    float *vres_tile;       /* (block_size, rank) the block's V residuals */
    float *lora_k;          /* (head_dim) one rebuilt key residual */
    float *kres_tile;       /* (block_size, rank) the block's K residuals */
    float *bt_k;            /* (rank, head_dim) scale · B_k of the work item's KV head, transposed */
    float *acc, *acc_res;   /* (rows, head_dim), (rows, rank) */
    float *m, *l, *scores;  /* (rows), (rows), (block_size) */
} TileScratch;

typedef struct {
    const KvLayerView *kv;
    const int32_t *block_table;
    const ResidualLayerView *res;
    const int32_t *res_block_table;
    int n_ctx;
    const ResidualAdapter *ad;
    const RopeTable *rope;
    const float *q;
    const int32_t *q_pos;
    int n_heads, group;
    /* The context's keys rebuilt once for the call ((n_kv_heads, context blocks, block_size,
     * head_dim)), or NULL: each (KV head, query tile) work item rebuilds its blocks' keys itself. */
    const float *keys;
} ResidualJob;

static int scratch_alloc(TileScratch *s, int bs, int hd, int rank, int rows) {
    s->k_tile = malloc((size_t)bs * hd * sizeof(float));
    s->v_tile = malloc((size_t)bs * hd * sizeof(float));
    s->vres_tile = malloc((size_t)bs * (rank > 0 ? rank : 1) * sizeof(float));
    s->lora_k = malloc((size_t)hd * sizeof(float));
    s->kres_tile = malloc((size_t)bs * (rank > 0 ? rank : 1) * sizeof(float));
    s->bt_k = malloc((size_t)(rank > 0 ? rank : 1) * hd * sizeof(float));
    s->acc = malloc((size_t)rows * hd * sizeof(float));
    s->acc_res = malloc((size_t)rows * (rank > 0 ? rank : 1) * sizeof(float));
    s->m = malloc((size_t)rows * sizeof(float));
    s->l = malloc((size_t)rows * sizeof(float));
    s->scores = malloc((size_t)bs * sizeof(float));
    return s->k_tile && s->v_tile && s->vres_tile && s->lora_k && s->kres_tile && s->bt_k && s->acc && s->acc_res && s->m && s->l && s->scores ? 0 : -1;
}

static void scratch_free(TileScratch *s) {
    free(s->k_tile); free(s->v_tile); free(s->vres_tile); free(s->lora_k); free(s->kres_tile); free(s->bt_k);
    free(s->acc); free(s->acc_res); free(s->m); free(s->l); free(s->scores);
}

/* RoPE of one fp32 row in place: the rotation cpu_rope_apply does, eight lanes at a time for the
 * interleaved pairing (neighbours swapped, sin negated in even lanes) when the build has AVX2. */
static void rope_row(float *x, int head_dim, int rope_dim, RopePairing pairing, const float *cos_v, const float *sin_v) {
#if defined(__AVX2__) && defined(__FMA__)
    if (pairing == ROPE_PAIRING_INTERLEAVED && rope_dim % 8 == 0) {
        const __m256 even_sign = _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f);
        for (int d = 0; d < rope_dim; d += 8) {
            __m256 v = _mm256_loadu_ps(x + d);
            __m128 c4 = _mm_loadu_ps(cos_v + d / 2), s4 = _mm_loadu_ps(sin_v + d / 2);
            __m256 c = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
            __m256 sn = _mm256_xor_ps(_mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4)), even_sign);
            _mm256_storeu_ps(x + d, _mm256_fmadd_ps(_mm256_permute_ps(v, 0xB1), sn, _mm256_mul_ps(v, c)));
        }
        return;
    }
#endif
    cpu_rope_apply(x, 1, head_dim, rope_dim, pairing, cos_v, sin_v);
}

/* out (head_dim) = Σ_i kr[i] · bt[i] (bt: (rank, head_dim)). A 64-wide head keeps the sum in eight
 * registers over the rank (the common case; the loop is the kernel's hottest); others go through memory. */
static void lora_key(const float *kr, const float *bt, int r, int hd, float *out) {
#if defined(__AVX2__) && defined(__FMA__)
    if (hd == 64) {
        __m256 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
        for (int i = 0; i < r; i++) {
            __m256 x = _mm256_set1_ps(kr[i]);
            const float *row = bt + (size_t)i * 64;
            for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(row + 8 * k), a[k]);
        }
        for (int k = 0; k < 8; k++) _mm256_storeu_ps(out + 8 * k, a[k]);
        return;
    }
#endif
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int i = 0; i < r; i++) axpy(out, kr[i], bt + (size_t)i * hd, hd);
}

/* scale · B_k rows of KV head g, transposed to (rank, head_dim) so a key residual is rank axpys. */
static void transpose_bk(const ResidualJob *job, int g, TileScratch *s) {
    const ResidualAdapter *ad = job->ad;
    int hd = job->kv->head_dim, r = ad->rank;
    if (!ad->b_k) return;
    for (int d = 0; d < hd; d++)
        for (int i = 0; i < r; i++) s->bt_k[(size_t)i * hd + d] = ad->scale * ad->b_k[((size_t)g * hd + d) * r + i];
}

/* Stage 1 of Algorithm 1, keys, for one block and KV head g: keys (n_slots, head_dim) =
 * K_base + RoPE_pos(scale·B_k·K_res). s->bt_k must hold KV head g's transposed B_k (transpose_bk). */
static void build_keys(const ResidualJob *job, int g, int block_index, int n_slots, TileScratch *s, float *keys) {
    const KvLayerView *kv = job->kv;
    const ResidualAdapter *ad = job->ad;
    int bs = kv->block_size, hd = kv->head_dim, r = ad->rank, pool_rank = job->res->rank, half = job->rope->rope_dim / 2;
    int32_t blk = job->block_table[block_index], rblk = job->res_block_table[block_index];
    size_t base_at = ((size_t)blk * kv->n_kv_heads + g) * bs * hd; /* a KV head's slots of a block are contiguous */
    widen(keys, kv->k + base_at, n_slots * hd);
    if (!ad->b_k || r == 0) return;
    for (int j = 0; j < n_slots; j++) widen(s->kres_tile + (size_t)j * r, job->res->k + ((size_t)rblk * bs + j) * pool_rank, r);
    for (int j = 0; j < n_slots; j++) {
        lora_key(s->kres_tile + (size_t)j * r, s->bt_k, r, hd, s->lora_k);
        int32_t pos = kv->slot_pos[(size_t)blk * bs + j];
        if (pos < 0) pos = 0;
        if (pos >= job->rope->n_positions) pos = job->rope->n_positions - 1;
        rope_row(s->lora_k, hd, job->rope->rope_dim, job->rope->pairing, job->rope->cos + (size_t)pos * half,
                 job->rope->sin + (size_t)pos * half);
        axpy(keys + (size_t)j * hd, 1.0f, s->lora_k, hd);
    }
}

/* Stage 1, values: the block's base values and V residuals (the V up-projection waits until the end). */
static void build_values(const ResidualJob *job, int g, int block_index, int n_slots, TileScratch *s) {
    const KvLayerView *kv = job->kv;
    int bs = kv->block_size, hd = kv->head_dim, r = job->ad->rank, pool_rank = job->res->rank;
    int32_t blk = job->block_table[block_index], rblk = job->res_block_table[block_index];
    widen(s->v_tile, kv->v + ((size_t)blk * kv->n_kv_heads + g) * bs * hd, n_slots * hd);
    for (int j = 0; j < n_slots && r > 0; j++) widen(s->vres_tile + (size_t)j * r, job->res->v + ((size_t)rblk * bs + j) * pool_rank, r);
}

/* scores (n) -> exp(score - max) in place, masked (-inf) lanes to exactly 0; returns their sum.
 * Eight lanes at a time with vec_exp256 where the build has AVX2 (a decode step takes ~9 of them
 * per context slot and layer, so a scalar expf would be the kernel's cost). */
static float exp_shifted(float *scores, int n, float max) {
    float sum = 0;
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps(), vmax = _mm256_set1_ps(max), ninf = _mm256_set1_ps(-INFINITY);
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(scores + j);
        __m256 e = _mm256_and_ps(vec_exp256(_mm256_sub_ps(x, vmax)), _mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ));
        _mm256_storeu_ps(scores + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = vec_hsum256(acc);
#endif
    for (; j < n; j++) {
        scores[j] = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
        sum += scores[j];
    }
    return sum;
}

#if defined(__AVX2__) && defined(__FMA__)
/* out[0..8) = q · keys[j] for eight consecutive keys (rows of hd, hd % 8 == 0): eight running
 * sums, then one transposing reduction instead of a horizontal sum per key. */
static void dots8(const float *q, const float *keys, int hd, float *out) {
    __m256 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + (size_t)k * hd + d), a[k]);
    }
    __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31)));
}
#endif

/* acc (width) += Σ_j p[j] · rows[j] (rows: (n, width)). Widths of 64 and 16 (a head, a rank-16
 * residual) keep acc in registers across the block's slots; others go through memory. */
static void accumulate_values(const float *p, int n, const float *rows, int width, float *acc) {
#if defined(__AVX2__) && defined(__FMA__)
    if (width == 64 || width == 16) {
        int nv = width / 8;
        __m256 a[8];
        for (int k = 0; k < nv; k++) a[k] = _mm256_loadu_ps(acc + 8 * k);
        for (int j = 0; j < n; j++) {
            if (p[j] == 0.0f) continue;
            __m256 w = _mm256_set1_ps(p[j]);
            const float *row = rows + (size_t)j * width;
            for (int k = 0; k < nv; k++) a[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * k), a[k]);
        }
        for (int k = 0; k < nv; k++) _mm256_storeu_ps(acc + 8 * k, a[k]);
        return;
    }
#endif
    for (int j = 0; j < n; j++)
        if (p[j] != 0.0f) axpy(acc, p[j], rows + (size_t)j * width, width);
}

/* Stage 2 for one query row over one block: scores, then the online-softmax update of both
 * accumulators. */
static void attend_block(const ResidualJob *job, int blk_slot0, int n_slots, const float *keys, const float *qrow, int32_t qp,
                         float *m, float *l, float *acc, float *acc_res, TileScratch *s) {
    int hd = job->kv->head_dim, r = job->ad->rank;
    const int32_t *slot_pos = job->kv->slot_pos + blk_slot0;
    float inv_sqrt = 1.0f / sqrtf((float)hd), block_max = -INFINITY;
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; hd % 8 == 0 && j + 8 <= n_slots; j += 8) dots8(qrow, keys + (size_t)j * hd, hd, s->scores + j);
#endif
    for (; j < n_slots; j++) s->scores[j] = vec_dot_f32(qrow, keys + (size_t)j * hd, hd);
    for (j = 0; j < n_slots; j++) {
        s->scores[j] = slot_pos[j] > qp ? -INFINITY : s->scores[j] * inv_sqrt;
        if (s->scores[j] > block_max) block_max = s->scores[j];
    }
    if (block_max == -INFINITY) return;
    float m_new = *m > block_max ? *m : block_max;
    if (m_new > *m) { /* rescale only when the running max moved */
        float correction = expf(*m - m_new);
        *l *= correction;
        for (int d = 0; d < hd; d++) acc[d] *= correction;
        for (int i = 0; i < r; i++) acc_res[i] *= correction;
    }
    *l += exp_shifted(s->scores, n_slots, m_new);
    accumulate_values(s->scores, n_slots, s->v_tile, hd, acc);
    accumulate_values(s->scores, n_slots, s->vres_tile, r, acc_res);
    *m = m_new;
}

/* Stage 3: out = (acc + scale·B_v·acc_res) / l for KV head g's output dims. */
static void finish_row(const ResidualJob *job, int g, const float *acc, const float *acc_res, float l, float *orow) {
    const ResidualAdapter *ad = job->ad;
    int hd = job->kv->head_dim, r = ad->rank;
    float inv_l = l > 0 ? 1.0f / l : 0.0f;
    for (int d = 0; d < hd; d++) {
        float v = acc[d];
        if (ad->b_v && r > 0) {
            const float *brow = ad->b_v + ((size_t)g * hd + d) * r;
            float sum = 0;
            for (int i = 0; i < r; i++) sum += brow[i] * acc_res[i];
            v += ad->scale * sum;
        }
        orow[d] = v * inv_l;
    }
}

static void run_tile(const ResidualJob *job, int g, int t0, int t1, float *out, TileScratch *s) {
    const KvLayerView *kv = job->kv;
    int hd = kv->head_dim, bs = kv->block_size, r = job->ad->rank, group = job->group, rows = (t1 - t0) * group;
    int q_dim = job->n_heads * hd;
    int32_t q_max = job->q_pos[t0];
    for (int t = t0; t < t1; t++)
        if (job->q_pos[t] > q_max) q_max = job->q_pos[t];
    for (int i = 0; i < rows; i++) s->m[i] = -INFINITY, s->l[i] = 0;
    if (!job->keys) transpose_bk(job, g, s);
    memset(s->acc, 0, (size_t)rows * hd * sizeof(float));
    memset(s->acc_res, 0, (size_t)rows * (r > 0 ? r : 1) * sizeof(float));
    int n_blocks = (job->n_ctx + bs - 1) / bs;
    for (int b = 0; b < n_blocks; b++) {
        int n_slots = job->n_ctx - b * bs < bs ? job->n_ctx - b * bs : bs, slot0 = job->block_table[b] * bs;
        int any = 0; /* blocks wholly after every query of the tile are skipped */
        for (int j = 0; j < n_slots && !any; j++) any = kv->slot_pos[slot0 + j] <= q_max;
        if (!any) continue;
        const float *keys = s->k_tile;
        if (job->keys) keys = job->keys + ((size_t)g * n_blocks + b) * bs * hd;
        else build_keys(job, g, b, n_slots, s, s->k_tile);
        build_values(job, g, b, n_slots, s);
        for (int t = t0; t < t1; t++)
            for (int h = 0; h < group; h++) {
                int row = (t - t0) * group + h;
                const float *qrow = job->q + (size_t)t * q_dim + (size_t)(g * group + h) * hd;
                attend_block(job, slot0, n_slots, keys, qrow, job->q_pos[t], &s->m[row], &s->l[row], s->acc + (size_t)row * hd,
                             s->acc_res + (size_t)row * r, s);
            }
    }
    for (int t = t0; t < t1; t++)
        for (int h = 0; h < group; h++) {
            int row = (t - t0) * group + h;
            finish_row(job, g, s->acc + (size_t)row * hd, s->acc_res + (size_t)row * r, s->l[row],
                       out + (size_t)t * q_dim + (size_t)(g * group + h) * hd);
        }
}

/* Runs every (KV head, query tile) work item of job over the cores. -1 when out of memory. */
static int run_tiles(const ResidualJob *job, int n_tokens, float *out) {
    const KvLayerView *kv = job->kv;
    int n_tiles = (n_tokens + TILE_QUERIES - 1) / TILE_QUERIES, n_work = kv->n_kv_heads * n_tiles, failed = 0;
#pragma omp parallel if (n_work > 1)
    {
        TileScratch s;
        int ok = scratch_alloc(&s, kv->block_size, kv->head_dim, job->ad->rank, TILE_QUERIES * job->group) == 0;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int w = 0; w < n_work; w++) {
            if (!ok) continue;
            int g = w % kv->n_kv_heads, tile = w / kv->n_kv_heads;
            int t0 = tile * TILE_QUERIES, t1 = t0 + TILE_QUERIES < n_tokens ? t0 + TILE_QUERIES : n_tokens;
            run_tile(job, g, t0, t1, out, &s);
        }
        scratch_free(&s);
    }
    return failed ? -1 : 0;
}

/* Blocks of the context per key-building work item: B_k is transposed once per item. */
#define KEY_BLOCKS_PER_ITEM 8

/* Rebuilds, once, the keys of every context block some query can see into keys ((n_kv_heads,
 * n_blocks, block_size, head_dim)), parallel over (KV head, run of blocks), by build_keys: the
 * same arithmetic per key as the per-tile rebuild. Blocks after every query stay unwritten
 * (run_tile skips them too). -1 when out of memory. */
static int build_all_keys(const ResidualJob *job, int32_t q_max, float *keys) {
    const KvLayerView *kv = job->kv;
    int bs = kv->block_size, hd = kv->head_dim, n_blocks = (job->n_ctx + bs - 1) / bs;
    int runs = (n_blocks + KEY_BLOCKS_PER_ITEM - 1) / KEY_BLOCKS_PER_ITEM, n_work = kv->n_kv_heads * runs, failed = 0;
#pragma omp parallel if (n_work > 1)
    {
        TileScratch s;
        int ok = scratch_alloc(&s, bs, hd, job->ad->rank, 1) == 0;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int w = 0; w < n_work; w++) {
            if (!ok) continue;
            int g = w % kv->n_kv_heads, b0 = (w / kv->n_kv_heads) * KEY_BLOCKS_PER_ITEM;
            int b1 = b0 + KEY_BLOCKS_PER_ITEM < n_blocks ? b0 + KEY_BLOCKS_PER_ITEM : n_blocks;
            transpose_bk(job, g, &s);
            for (int b = b0; b < b1; b++) {
                int n_slots = job->n_ctx - b * bs < bs ? job->n_ctx - b * bs : bs, slot0 = job->block_table[b] * bs, any = 0;
                for (int j = 0; j < n_slots && !any; j++) any = kv->slot_pos[slot0 + j] <= q_max;
                if (any) build_keys(job, g, b, n_slots, &s, keys + ((size_t)g * n_blocks + b) * bs * hd);
            }
        }
        scratch_free(&s);
    }
    return failed ? -1 : 0;
}

static int validate(const KvLayerView *kv, const ResidualLayerView *res, const ResidualAdapter *ad, int n_heads) {
    return ad->rank > res->rank || ad->rank > LORA_MAX_RANK || n_heads % kv->n_kv_heads != 0 ? -1 : 0;
}

int cpu_residual_attention_per_tile(const KvLayerView *kv, const int32_t *block_table, const ResidualLayerView *res,
                                    const int32_t *res_block_table, int n_ctx, const ResidualAdapter *ad, const RopeTable *rope,
                                    const float *q, const int32_t *q_pos, int n_tokens, int n_heads, float *out) {
    if (validate(kv, res, ad, n_heads)) return -1;
    ResidualJob job = {kv, block_table, res, res_block_table, n_ctx, ad, rope, q, q_pos, n_heads, n_heads / kv->n_kv_heads, NULL};
    return run_tiles(&job, n_tokens, out);
}

int cpu_residual_attention(const KvLayerView *kv, const int32_t *block_table, const ResidualLayerView *res,
                           const int32_t *res_block_table, int n_ctx, const ResidualAdapter *ad, const RopeTable *rope,
                           const float *q, const int32_t *q_pos, int n_tokens, int n_heads, float *out) {
    if (validate(kv, res, ad, n_heads)) return -1;
    ResidualJob job = {kv, block_table, res, res_block_table, n_ctx, ad, rope, q, q_pos, n_heads, n_heads / kv->n_kv_heads, NULL};
    /* One query tile (a decode step): each KV head's work item rebuilds its keys once anyway. */
    if (n_tokens <= TILE_QUERIES || !ad->b_k || ad->rank == 0) return run_tiles(&job, n_tokens, out);
    int bs = kv->block_size, n_blocks = (n_ctx + bs - 1) / bs;
    float *keys = malloc((size_t)kv->n_kv_heads * n_blocks * bs * kv->head_dim * sizeof *keys);
    if (!keys) return run_tiles(&job, n_tokens, out); /* the per-tile rebuild needs no context-sized buffer */
    int32_t q_max = q_pos[0];
    for (int t = 1; t < n_tokens; t++)
        if (q_pos[t] > q_max) q_max = q_pos[t];
    int rc = build_all_keys(&job, q_max, keys);
    if (rc == 0) {
        job.keys = keys;
        rc = run_tiles(&job, n_tokens, out);
    }
    free(keys);
    return rc;
}
