/*
 * The ROTATE cache operation (issue 17, first part) on the CPU backend with the real model
 * (SmolLM2-135M: interleaved pairs, base 1e5, no scaling) and with a variant of its weights whose
 * RoPE is half-split (NeoX), partial (48 of 64 dimensions), linearly scaled, with a larger base
 * and llama3-style rope_freqs, so every input of the angle is exercised:
 * - the rotation's own precision: every layer's rotated keys equal an fp64 rotation of the stored
 *   keys to half a storage ulp plus the fp32 angle's rounding;
 * - K computed at position p (a real prefill at offset p) and rotated by Δ equals K computed at
 *   p + Δ within fp16 storage rounding in layer 0, whose pre-RoPE keys do not depend on position;
 *   deeper layers carry the forward's own numeric drift between the two prefills, reported and
 *   bounded loosely; recorded slot positions move by Δ; values never change;
 * - decoding after rotating a prompt's blocks gives the logits of a fresh prefill at the shifted
 *   positions as closely as the forward reproduces itself under a shift of every position (and,
 *   without the rotation, clearly different ones);
 * - COPY_SLOTS lands a prompt's slots at another offset and position of other blocks with the
 *   keys a prefill there computes (same bounds), values copied exactly, other slots untouched;
 * - rotations compose: Δ then -Δ restores the keys to storage rounding; and over many successive
 *   splices (Leyline App. F, issue 36): after k chained signed rotations the keys equal an fp64
 *   rotation by their sum within k storage roundings and k angle errors (drift grows linearly,
 *   reported for k = 1 .. 64), positions exactly;
 * - a list with a bad ROTATE (null block, out of range, a target block, |Δ| >= context) is
 *   refused with a message and changes nothing, even after valid operations;
 * - tensor parallelism: a rank's shard, sent its operation list through the step plan's wire
 *   format, rotates its own KV heads exactly as the whole model's pool rotates those heads.
 * With BRAID_TEST_DEVICE=cuda (ctest: test_rotate_cuda, label gpu) the same checks run on the CUDA
 * backend against bf16 storage bounds (the TP check stays on the CPU); without a GPU that run
 * exits 77, which ctest reports as skipped.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "model/model.h"
#include "model/weight_shard.h"
#include "test_paths.h"
#include "worker/backend.h"
#include "cache_op_asserts.h"
#include "worker/sampler.h"
#include "worker/step_msg.h"

#define BS 16
#define N_TOK 48 /* three full blocks */
#define DEV_BLOCKS 12

static BraidModel model;
static BackendKind kind = BACKEND_CPU; /* BRAID_TEST_DEVICE */
static ModelWeights neox;        /* the real weights under another RoPE (shares their tensors) */
static float neox_factors[32];   /* its rope_freqs */
static int32_t tokens[N_TOK];

static int setup(void **state) {
    (void)state;
    BraidError err;
    if (braid_model_load(test_model_path(), &model, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    const char *text = "You are the planner agent. Break the task into small steps and list them in order. Keep every "
                       "step short, number the steps, and never skip a step even when it looks obvious to you. When "
                       "a step fails, say which one and stop there instead of guessing what should come next.";
    TokenList list = {0};
    if (tokenizer_encode(&model.tokenizer, text, strlen(text), false, false, &list, &err) || list.n < N_TOK) {
        fprintf(stderr, "tokenizing the prompt: %s\n", list.n < N_TOK ? "too short" : err.msg);
        free(list.ids);
        return -1;
    }
    memcpy(tokens, list.ids, sizeof tokens);
    free(list.ids);
    /* NeoX pairing on 48 of 64 dimensions, positions scaled by 1/4, base 5e5, and rope_freqs that
     * leave high frequencies alone and divide low ones by up to 8 (llama3's shape). The function
     * is no longer the trained model's, but RoPE's algebra, which ROTATE relies on, holds for any. */
    neox = model.weights;
    neox.cfg.rope_pairing = ROPE_PAIRING_HALF_SPLIT;
    neox.cfg.rope_dim = 48;
    neox.cfg.rope_position_scale = 0.25f;
    neox.cfg.rope_base = 500000.0f;
    for (int i = 0; i < neox.cfg.rope_dim / 2; i++) neox_factors[i] = i < 8 ? 1.0f : 1.0f + 7.0f * (float)(i - 8) / 15.0f;
    neox.rope_freq_factors = neox_factors;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    braid_model_free(&model);
    return 0;
}

/* Unit roundoff of the pool's storage: fp16 (CPU) keeps 11 significant bits, bf16 (CUDA) 8. */
static double storage_u(void) { return kind == BACKEND_CUDA ? 0x1p-8 : 0x1p-11; }

/* One storage ulp at |x|. */
static double storage_ulp(double x) {
    x = fabs(x);
    if (kind == BACKEND_CUDA) return x < 0x1p-126 ? 0x1p-133 : ldexp(1.0, ilogb(x) - 7);
    return x < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ilogb(x) - 10);
}

static void make_backend_kind(Backend *b, const ModelWeights *w, BackendKind k) {
    BackendConfig cfg = backend_config_default(k, &w->cfg, DEV_BLOCKS, BS, 64);
    BraidError err;
    if (backend_create(b, w, &cfg, &err)) fail_msg("%s", err.msg);
}

static void make_backend(Backend *b, const ModelWeights *w) { make_backend_kind(b, w, kind); }

/* Prefills n tokens at positions offset.. into table's blocks; returns the greedy next token. */
static int32_t prefill_at(Backend *b, const int32_t *ids, int n, int32_t offset, const int32_t *table) {
    int32_t pos[N_TOK], slots[N_TOK], start[] = {0, n}, ctx[] = {n}, row[] = {n - 1}, next;
    for (int t = 0; t < n; t++) pos[t] = offset + t, slots[t] = table[t / BS] * BS + t % BS;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = n, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = &next};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    return next;
}

/* Logits (caller frees) of `token` decoded at position `pos` after the N_TOK tokens in
 * table[0..2]; it writes slot 0 of table[3]. */
static float *decode_at(Backend *b, int32_t token, int32_t pos, const int32_t *table) {
    int32_t p[] = {pos}, slots[] = {table[3] * BS}, start[] = {0, 1}, ctx[] = {N_TOK + 1}, row[] = {0}, next;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = 1, .tokens = &token, .positions = p, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    float *logits = malloc((size_t)model.weights.cfg.vocab_size * sizeof *logits);
    assert_non_null(logits);
    ForwardOutput out = {.argmax = &next, .logits = logits};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    return logits;
}

static size_t block_keys(const ModelWeights *w) { return (size_t)w->cfg.n_layers * w->cfg.n_kv_heads * BS * w->cfg.head_dim; }

/* Keys (caller frees) and positions of a device block. */
static float *read_keys(Backend *b, int32_t block, int32_t *positions) {
    float *k = malloc(block_keys(b->weights) * sizeof *k);
    assert_non_null(k);
    BraidError err;
    if (backend_read_block(b, block, k, NULL, positions, &err)) fail_msg("%s", err.msg);
    return k;
}

static float *read_values(Backend *b, int32_t block) {
    float *v = malloc(block_keys(b->weights) * sizeof *v);
    assert_non_null(v);
    BraidError err;
    if (backend_read_block(b, block, NULL, v, NULL, &err)) fail_msg("%s", err.msg);
    return v;
}

static void rotate(Backend *b, const int32_t *blocks, int n, int32_t delta) {
    CacheOp ops[8];
    for (int i = 0; i < n; i++) ops[i] = (CacheOp){.kind = CACHE_OP_ROTATE, .src = blocks[i], .dst = 0, .delta = delta};
    BraidError err;
    if (backend_apply_cache_ops(b, ops, n, &err)) fail_msg("%s", err.msg);
}

/* Dimension pair i of a head under the pairing. */
static void pair_dims(const ModelConfig *c, int i, int *a, int *bb) {
    bool inter = c->rope_pairing == ROPE_PAIRING_INTERLEAVED;
    *a = inter ? 2 * i : i;
    *bb = inter ? 2 * i + 1 : i + c->rope_dim / 2;
}

/* Largest angle error of fp32 RoPE arithmetic at |positions| up to `span` (scaled), relative to the
 * pair's length: the product's rounding (2^-24 of the angle per rounding) plus sinf/cosf. */
static double angle_slack(const ModelWeights *w, double span) {
    return 0x1p-23 * span * w->cfg.rope_position_scale + 0x1p-21;
}

/* Max over every layer of |rotated - fp64 rotation of before| minus the allowed error; <= 0 passes.
 * Also checks dimensions past rope_dim kept their bits. */
static double rotation_excess(const ModelWeights *w, const float *before, const float *after, int32_t delta) {
    const ModelConfig *c = &w->cfg;
    size_t rows = block_keys(w) / c->head_dim;
    double worst = -1.0;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double ang = (double)delta * c->rope_position_scale * cpu_rope_inv_freq(i, c->rope_dim, c->rope_base, w->rope_freq_factors);
        double cs = cos(ang), sn = sin(ang), slack = angle_slack(w, fabs((double)delta));
        int a, b;
        pair_dims(c, i, &a, &b);
        for (size_t r = 0; r < rows; r++) {
            const float *x = before + r * c->head_dim, *y = after + r * c->head_dim;
            double r0 = x[a] * cs - x[b] * sn, r1 = x[a] * sn + x[b] * cs, len = hypot(x[a], x[b]);
            double e0 = fabs(y[a] - r0) - (0.5 * storage_ulp(fmax(fabs(r0), fabs(y[a]))) + len * slack);
            double e1 = fabs(y[b] - r1) - (0.5 * storage_ulp(fmax(fabs(r1), fabs(y[b]))) + len * slack);
            worst = fmax(worst, fmax(e0, e1));
        }
    }
    for (size_t r = 0; r < rows; r++)
        for (int d = c->rope_dim; d < c->head_dim; d++) assert_true(before[r * c->head_dim + d] == after[r * c->head_dim + d]);
    return worst;
}

typedef struct {
    double layer0_ratio; /* max of |err| / bound in layer 0 (<= 1 passes) */
    double layer0_max;    /* max |err| in layer 0 */
    double all_rel;       /* max over layers of max |err| / max |K| of that layer */
    double all_max;       /* max |err| over all layers */
} KeyErrors;

/* rotated (keys at p turned by delta) against ref (keys computed at p + delta). */
static KeyErrors compare_to_recomputed(const ModelWeights *w, const float *rotated, const float *ref, int32_t p, int32_t delta) {
    const ModelConfig *c = &w->cfg;
    size_t layer = block_keys(w) / c->n_layers, rows = layer / c->head_dim;
    KeyErrors e = {0};
    double span = fabs((double)p) + fabs((double)delta) + fabs((double)p + delta);
    for (int l = 0; l < c->n_layers; l++) {
        double kmax = 0.0, emax = 0.0;
        for (size_t i = 0; i < layer; i++) {
            kmax = fmax(kmax, fabs(ref[l * layer + i]));
            emax = fmax(emax, fabs((double)rotated[l * layer + i] - ref[l * layer + i]));
        }
        e.all_max = fmax(e.all_max, emax);
        e.all_rel = fmax(e.all_rel, emax / fmax(kmax, 1e-30));
    }
    /* Layer 0: three storage roundings (stored at p, after the turn, stored at p + delta), each at
     * most u of the pair's length, plus the fp32 angles' rounding at both positions. */
    for (int i = 0; i < c->rope_dim / 2; i++) {
        int a, b;
        pair_dims(c, i, &a, &b);
        for (size_t r = 0; r < rows; r++) {
            const float *x = ref + r * c->head_dim, *y = rotated + r * c->head_dim;
            double len = hypot(x[a], x[b]), bound = len * (3 * storage_u() + angle_slack(w, span)) + 0x1p-23;
            double err = fmax(fabs((double)y[a] - x[a]), fabs((double)y[b] - x[b]));
            e.layer0_max = fmax(e.layer0_max, err);
            e.layer0_ratio = fmax(e.layer0_ratio, err / bound);
        }
    }
    return e;
}

/* Raises, per layer, the largest |key| of ref and the largest |rotated - ref| seen so far. */
static void layer_extremes(const ModelWeights *w, const float *rotated, const float *ref, double *kmax, double *emax) {
    size_t layer = block_keys(w) / w->cfg.n_layers;
    for (int l = 0; l < w->cfg.n_layers; l++)
        for (size_t i = 0; i < layer; i++) {
            kmax[l] = fmax(kmax[l], fabs(ref[l * layer + i]));
            emax[l] = fmax(emax[l], fabs((double)rotated[l * layer + i] - ref[l * layer + i]));
        }
}

/* Prefills at p, rotates by delta, checks against a prefill at p + delta; returns the errors. */
static KeyErrors check_shift(const ModelWeights *w, int32_t p, int32_t delta) {
    Backend b;
    make_backend(&b, w);
    const int32_t moved[] = {1, 2, 3}, fresh[] = {5, 6, 7};
    prefill_at(&b, tokens, N_TOK, p, moved);
    prefill_at(&b, tokens, N_TOK, p + delta, fresh);
    KeyErrors worst = {0};
    float *before[3], *values[3];
    for (int k = 0; k < 3; k++) before[k] = read_keys(&b, moved[k], NULL), values[k] = read_values(&b, moved[k]);
    rotate(&b, moved, 3, delta);
    for (int k = 0; k < 3; k++) {
        int32_t pos_rot[BS], pos_ref[BS];
        float *rot = read_keys(&b, moved[k], pos_rot), *ref = read_keys(&b, fresh[k], pos_ref);
        assert_memory_equal(pos_rot, pos_ref, sizeof pos_rot);
        assert_int_equal(pos_rot[0], p + delta + k * BS);
        float *v_after = read_values(&b, moved[k]);
        assert_memory_equal(values[k], v_after, block_keys(w) * sizeof *v_after);
        free(v_after);
        free(values[k]);
        double excess = rotation_excess(w, before[k], rot, delta);
        if (excess > 0) fail_msg("block %d: rotation by %d off an fp64 rotation by %g beyond its bound", k, delta, excess);
        KeyErrors e = compare_to_recomputed(w, rot, ref, p, delta);
        worst.layer0_ratio = fmax(worst.layer0_ratio, e.layer0_ratio);
        worst.layer0_max = fmax(worst.layer0_max, e.layer0_max);
        worst.all_rel = fmax(worst.all_rel, e.all_rel);
        worst.all_max = fmax(worst.all_max, e.all_max);
        free(rot);
        free(ref);
        free(before[k]);
    }
    fprintf(stderr, "%s p=%d delta=%+d: layer 0 max |err| %.3g (%.2f of the storage bound); all layers max |err| %.3g, %.2e of max |K|\n",
            rope_pairing_name(w->cfg.rope_pairing), p, delta, worst.layer0_max, worst.layer0_ratio, worst.all_max,
            worst.all_rel);
    backend_destroy(&b);
    return worst;
}

/* Deeper layers see their inputs through attention at other absolute positions: fp32 angles and
 * stored keys round differently there, so their pre-RoPE keys drift by a few storage ulps (CPU,
 * fp16: measured at most 2.9e-3 of the layer's largest key, about 6 u; the bound is 20 u). */
static double deep_layer_rel_tolerance(void) { return 20 * storage_u(); }

static void check_shifts(const ModelWeights *w) {
    static const int32_t cases[][2] = {{0, 1}, {0, 37}, {3, 1000}, {3000, -2990}, {100, 4096}, {0, 8191 - N_TOK}, {8000, -8000}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        KeyErrors e = check_shift(w, cases[i][0], cases[i][1]);
        if (e.layer0_ratio > 1) fail_msg("layer 0 off the recomputed keys by %.2f times the storage bound", e.layer0_ratio);
        assert_true(e.all_rel <= deep_layer_rel_tolerance());
    }
}

static void test_keys_match_recomputed(void **state) {
    (void)state;
    check_shifts(&model.weights);
}

static void test_keys_match_recomputed_neox(void **state) {
    (void)state;
    check_shifts(&neox);
}

/* COPY_SLOTS (segment reuse): the prompt's slots, prefilled at p in blocks 1-3, land 5 slots into
 * blocks 5-8 at positions p + delta. Every copied key equals the key a prefill at p + delta
 * computes (blocks 9-11) within the layer-0 storage bound; values are copied bit for bit;
 * positions are p + delta + t; the slots before and after the range are untouched. */
static void check_copy_slots(const ModelWeights *w, int32_t p, int32_t delta) {
    enum { SKEW = 5 };
    Backend b;
    make_backend(&b, w);
    const int32_t src[] = {1, 2, 3}, dst[] = {5, 6, 7, 8}, fresh[] = {9, 10, 11};
    prefill_at(&b, tokens, N_TOK, p, src);
    prefill_at(&b, tokens, N_TOK, p + delta, fresh);
    float *untouched = read_keys(&b, dst[0], NULL);
    CacheOpList ops = {0};
    for (int t = 0; t < N_TOK;) { /* one operation per overlap of a source and a target block */
        int d = t + SKEW, run = N_TOK - t;
        if (run > BS - t % BS) run = BS - t % BS;
        if (run > BS - d % BS) run = BS - d % BS;
        assert_int_equal(cache_ops_push_slots(&ops, src[t / BS], t % BS, dst[d / BS], d % BS, run, delta), 0);
        t += run;
    }
    apply_ok(&b, ops.ops, ops.n);
    cache_ops_free(&ops);
    const ModelConfig *c = &w->cfg;
    size_t layer = block_keys(w) / c->n_layers, hd = (size_t)c->head_dim;
    float *got_k[4], *got_v[4], *ref_k[3], *ref_v[3], *src_v[3];
    int32_t got_pos[4][BS];
    for (int k = 0; k < 4; k++) got_k[k] = read_keys(&b, dst[k], got_pos[k]), got_v[k] = read_values(&b, dst[k]);
    for (int k = 0; k < 3; k++) ref_k[k] = read_keys(&b, fresh[k], NULL), ref_v[k] = read_values(&b, fresh[k]), src_v[k] = read_values(&b, src[k]);
    float *row_ref = malloc(block_keys(w) * sizeof *row_ref), *row_got = malloc(block_keys(w) * sizeof *row_got);
    assert_non_null(row_ref);
    assert_non_null(row_got);
    KeyErrors worst = {0};
    /* The deep-layer error relative to the largest key of the whole span, per layer, as the ROTATE
     * check measures it per block: one token's row alone can have a small largest key, and the
     * ratio would then measure that row's size rather than the copy. */
    double *kmax = calloc((size_t)c->n_layers, sizeof *kmax), *emax = calloc((size_t)c->n_layers, sizeof *emax);
    assert_true(kmax && emax);
    for (int t = 0; t < N_TOK; t++) {
        int d = t + SKEW;
        assert_int_equal(got_pos[d / BS][d % BS], p + delta + t);
        /* Token t's rows, every layer and head, gathered into block-shaped buffers at slot 0. */
        memset(row_ref, 0, block_keys(w) * sizeof *row_ref);
        memset(row_got, 0, block_keys(w) * sizeof *row_got);
        for (size_t l = 0; l < (size_t)c->n_layers; l++)
            for (int h = 0; h < c->n_kv_heads; h++) {
                size_t at = l * layer + (size_t)h * BS * hd, from_t = at + (size_t)(t % BS) * hd, from_d = at + (size_t)(d % BS) * hd;
                memcpy(row_ref + at, ref_k[t / BS] + from_t, hd * sizeof *row_ref);
                memcpy(row_got + at, got_k[d / BS] + from_d, hd * sizeof *row_got);
                assert_memory_equal(got_v[d / BS] + from_d, src_v[t / BS] + from_t, hd * sizeof(float));
            }
        KeyErrors e = compare_to_recomputed(w, row_got, row_ref, p + t, delta);
        worst.layer0_ratio = fmax(worst.layer0_ratio, e.layer0_ratio);
        layer_extremes(w, row_got, row_ref, kmax, emax);
    }
    for (int l = 0; l < c->n_layers; l++) worst.all_rel = fmax(worst.all_rel, emax[l] / fmax(kmax[l], 1e-30));
    free(kmax);
    free(emax);
    /* Slots 0..SKEW-1 of the first target block were never written. */
    for (size_t l = 0; l < (size_t)c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            size_t at = l * layer + (size_t)h * BS * hd;
            assert_memory_equal(got_k[0] + at, untouched + at, SKEW * hd * sizeof(float));
        }
    fprintf(stderr, "copy_slots %s p=%d delta=%+d: layer 0 at %.2f of the storage bound, all layers %.2e of max |K|\n",
            rope_pairing_name(c->rope_pairing), p, delta, worst.layer0_ratio, worst.all_rel);
    if (worst.layer0_ratio > 1) fail_msg("copied keys off the recomputed ones by %.2f times the storage bound", worst.layer0_ratio);
    assert_true(worst.all_rel <= deep_layer_rel_tolerance());
    for (int k = 0; k < 4; k++) free(got_k[k]), free(got_v[k]);
    for (int k = 0; k < 3; k++) free(ref_k[k]), free(ref_v[k]), free(src_v[k]);
    free(row_ref);
    free(row_got);
    free(untouched);
    backend_destroy(&b);
}

/* Segment reuse prefills a sequence's gaps as several entries of one step (scheduler.c): the
 * forward stores every entry's K/V before any attends, so the second entry sees the first. The
 * prompt as two entries of one batch (same block table) gives the logits of one entry. */
static double max_abs_diff(const float *a, const float *b, int n);

static void test_two_entries_one_sequence(void **state) {
    (void)state;
    Backend one, two;
    make_backend(&one, &model.weights);
    make_backend(&two, &model.weights);
    const int32_t table[] = {1, 2, 3};
    int32_t pos[N_TOK], slots[N_TOK], next_one, next_two;
    for (int t = 0; t < N_TOK; t++) pos[t] = t, slots[t] = table[t / BS] * BS + t % BS;
    const int32_t *tables[] = {table, table};
    int vocab = model.weights.cfg.vocab_size;
    float *a = malloc((size_t)vocab * sizeof *a), *b = malloc((size_t)vocab * sizeof *b);
    assert_non_null(a);
    assert_non_null(b);
    int32_t start1[] = {0, N_TOK}, ctx1[] = {N_TOK}, row1[] = {N_TOK - 1};
    ForwardBatch whole = {.n_tokens = N_TOK, .tokens = tokens, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                          .seq_start = start1, .block_tables = tables, .seq_n_ctx = ctx1, .n_logits = 1, .logit_rows = row1};
    int32_t start2[] = {0, 20, N_TOK}, ctx2[] = {20, N_TOK}, row2[] = {N_TOK - 1};
    ForwardBatch split = {.n_tokens = N_TOK, .tokens = tokens, .positions = pos, .slot_mapping = slots, .n_seqs = 2,
                          .seq_start = start2, .block_tables = tables, .seq_n_ctx = ctx2, .n_logits = 1, .logit_rows = row2};
    ForwardOutput out_one = {.argmax = &next_one, .logits = a}, out_two = {.argmax = &next_two, .logits = b};
    BraidError err;
    if (backend_forward(&one, &whole, &out_one, &err) || backend_forward(&two, &split, &out_two, &err)) fail_msg("%s", err.msg);
    double diff = max_abs_diff(a, b, vocab);
    fprintf(stderr, "two entries of one sequence vs one: max |logit diff| %.3g\n", diff);
    assert_true(diff < 1e-3);
    assert_int_equal(next_one, next_two);
    free(a);
    free(b);
    backend_destroy(&one);
    backend_destroy(&two);
}

static void test_copy_slots(void **state) {
    (void)state;
    check_copy_slots(&model.weights, 0, 37);
    check_copy_slots(&model.weights, 500, -480);
    check_copy_slots(&model.weights, 7, 0);
    check_copy_slots(&neox, 3, 1000);
}

/* Decode logits over rotated blocks agree with a fresh prefill at the shifted positions as well as
 * the forward agrees with itself under a shift: the same prompt decoded at its own positions is
 * equal to the fresh prefill in exact arithmetic, and its measured difference (the noise) scales
 * the tolerance, capped so a noisy baseline cannot hide a wrong rotation (CPU, these cases and
 * bench_rotate's sweep: rotated 0.004-0.026, noise 0.004-0.019; bf16 (CUDA) is 8x coarser: its cap
 * is test_cuda_backend's CPU-vs-GPU bound). Without the rotation the logits differ by 2.4-19 (CPU). */
static double logit_cap(void) { return kind == BACKEND_CUDA ? 1.0 : 0.05; }
#define UNROTATED_MIN_DIFF 1.0

/* Gap between the best and second-best logit. */
static double top2_margin(const float *x, int n) {
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) b = a, a = x[i];
        else if (x[i] > b) b = x[i];
    }
    return a - b;
}

static double max_abs_diff(const float *a, const float *b, int n) {
    double worst = 0.0;
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

static void check_decode_after_rotate(const ModelWeights *w, int32_t p, int32_t delta) {
    int vocab = w->cfg.vocab_size;
    const int32_t table[] = {1, 2, 3, 4};
    Backend rot, ref;
    make_backend(&rot, w);
    make_backend(&ref, w);
    int32_t next = prefill_at(&rot, tokens, N_TOK, p, table);
    /* Each decode writes only slot 0 of block 4, which the next one overwrites. */
    float *own = decode_at(&rot, next, p + N_TOK, table);
    float *unrotated = decode_at(&rot, next, p + delta + N_TOK, table);
    rotate(&rot, table, 3, delta);
    float *rotated = decode_at(&rot, next, p + delta + N_TOK, table);
    prefill_at(&ref, tokens, N_TOK, p + delta, table);
    float *fresh = decode_at(&ref, next, p + delta + N_TOK, table);
    double d_rot = max_abs_diff(rotated, fresh, vocab), d_unrot = max_abs_diff(unrotated, fresh, vocab);
    double noise = max_abs_diff(own, fresh, vocab), tol = fmin(logit_cap(), 2 * noise + 0.01);
    fprintf(stderr, "%s p=%d delta=%+d: decode logits max |diff| vs fresh prefill: rotated %.4f (tolerance %.4f from "
            "shift noise %.4f), not rotated %.4f\n", rope_pairing_name(w->cfg.rope_pairing), p, delta, d_rot, tol, noise, d_unrot);
    assert_true(d_rot <= tol);
    if (top2_margin(fresh, vocab) > 2 * tol) assert_int_equal(sampler_argmax(rotated, vocab), sampler_argmax(fresh, vocab));
    assert_true(d_unrot > UNROTATED_MIN_DIFF);
    free(own);
    free(unrotated);
    free(rotated);
    free(fresh);
    backend_destroy(&rot);
    backend_destroy(&ref);
}

static void test_decode_after_rotate(void **state) {
    (void)state;
    check_decode_after_rotate(&model.weights, 0, 700);
    check_decode_after_rotate(&model.weights, 2000, -1500);
    check_decode_after_rotate(&neox, 0, 700);
    check_decode_after_rotate(&neox, 2000, -1500);
}

/* Δ then -Δ restores the keys to two storage roundings; positions exactly. */
static void test_round_trip(void **state) {
    (void)state;
    Backend b;
    make_backend(&b, &model.weights);
    const int32_t table[] = {1, 2, 3};
    prefill_at(&b, tokens, N_TOK, 10, table);
    int32_t pos0[BS], pos1[BS];
    float *k0 = read_keys(&b, 2, pos0);
    rotate(&b, table, 3, 4321);
    rotate(&b, table, 3, -4321);
    float *k1 = read_keys(&b, 2, pos1);
    assert_memory_equal(pos0, pos1, sizeof pos0);
    /* Each turn rounds to storage once (at most u of the pair's length per element) and carries
     * its fp32 angle's error; the two turns' errors add. */
    const ModelConfig *c = &model.weights.cfg;
    size_t rows = block_keys(&model.weights) / c->head_dim;
    double worst = 0.0;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        int a, bb;
        pair_dims(c, i, &a, &bb);
        for (size_t r = 0; r < rows; r++) {
            const float *x = k0 + r * c->head_dim, *y = k1 + r * c->head_dim;
            double len = hypot(x[a], x[bb]), bound = len * (2 * storage_u() + 2 * angle_slack(&model.weights, 4321)) + 0x1p-23;
            worst = fmax(worst, fmax(fabs((double)y[a] - x[a]), fabs((double)y[bb] - x[bb])) / bound);
        }
    }
    fprintf(stderr, "round trip +4321/-4321: worst error %.2f of its bound\n", worst);
    assert_true(worst <= 1.0);
    free(k0);
    free(k1);
    backend_destroy(&b);
}

/* Max over rotated dimensions of |after - fp64 rotation of before by `delta`| / the pair's length. */
static double relative_drift(const ModelWeights *w, const float *before, const float *after, int64_t delta) {
    const ModelConfig *c = &w->cfg;
    size_t rows = block_keys(w) / c->head_dim;
    double worst = 0.0;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double ang = (double)delta * c->rope_position_scale * cpu_rope_inv_freq(i, c->rope_dim, c->rope_base, w->rope_freq_factors);
        double cs = cos(ang), sn = sin(ang);
        int a, b;
        pair_dims(c, i, &a, &b);
        for (size_t r = 0; r < rows; r++) {
            const float *x = before + r * c->head_dim, *y = after + r * c->head_dim;
            double len = hypot(x[a], x[b]);
            if (len < 0x1p-10) continue; /* near-zero pairs: only absolute error is meaningful, and it is tiny */
            double r0 = x[a] * cs - x[b] * sn, r1 = x[a] * sn + x[b] * cs;
            worst = fmax(worst, fmax(fabs(y[a] - r0), fabs(y[b] - r1)) / len);
        }
    }
    return worst;
}

/* Chained rotations (App. F): 64 successive signed deltas, as 64 splices of one conversation would
 * turn its tail; after k of them the keys must be the fp64 rotation by the deltas' sum within k
 * roundings to storage and k fp32 angle errors (each turn adds at most one of each), so the drift
 * grows at most linearly in k. The figures go to stderr for bench/RESULTS.md. */
static void test_chained_rotation_drift(void **state) {
    (void)state;
    Backend b;
    make_backend(&b, &model.weights);
    const int32_t table[] = {1, 2, 3};
    const int32_t start = 4000, span = b.cfg.max_context - N_TOK - 1;
    prefill_at(&b, tokens, N_TOK, start, table);
    int32_t pos0[BS], pos[BS];
    float *k0 = read_keys(&b, 2, pos0);
    uint64_t lcg = 0x9e3779b97f4a7c15ull;
    int64_t sum = 0;
    int32_t max_delta = 0;
    for (int k = 1; k <= 64; k++) {
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        int32_t delta = (int32_t)((lcg >> 33) % 3001) - 1500; /* signed, |delta| <= 1500 */
        if (start + sum + delta < 0 || start + sum + delta > span) delta = -delta;
        if (abs(delta) > max_delta) max_delta = abs(delta);
        rotate(&b, table, 3, delta);
        sum += delta;
        if ((k & (k - 1)) != 0) continue; /* k = 1, 2, 4, ..., 64 */
        float *kk = read_keys(&b, 2, pos);
        for (int s = 0; s < BS; s++) assert_int_equal(pos[s], pos0[s] + sum);
        double drift = relative_drift(&model.weights, k0, kk, sum);
        /* A turn rounds each element to storage (<= u of the pair's length) and its angle is off
         * by angle_slack; the fp64 reference's own angle for the sum is exact enough. */
        double bound = k * (storage_u() + angle_slack(&model.weights, max_delta + start + fabs((double)sum))) + 0x1p-20;
        fprintf(stderr, "chained rotations: k=%2d sum=%+6lld drift %.3e (bound %.3e, %.3e per turn)\n", k, (long long)sum, drift, bound,
                drift / k);
        assert_true(drift <= bound);
        assert_true(drift > 0.0); /* the measure sees the storage rounding: it is not comparing a thing to itself */
        free(kk);
    }
    free(k0);
    backend_destroy(&b);
}

/* Bad ROTATE operations are refused and nothing in the list is applied. */
static void test_bad_rotate_refused(void **state) {
    (void)state;
    Backend b;
    make_backend(&b, &model.weights);
    const int32_t table[] = {1, 2, 3};
    prefill_at(&b, tokens, N_TOK, 0, table);
    int32_t pos0[BS], pos1[BS];
    float *k0 = read_keys(&b, 1, pos0);
    int ctx = b.cfg.max_context;
    CacheOp list[3] = {{CACHE_OP_ROTATE, 1, 0, 5, 0, 0, 0}, {CACHE_OP_COPY, 1, 8, 0, 0, 0, 0}, {0}};
    struct { CacheOp op; const char *expect; } cases[] = {
        {{CACHE_OP_ROTATE, 0, 0, 5, 0, 0, 0}, "null block"},
        {{CACHE_OP_ROTATE, DEV_BLOCKS, 0, 5, 0, 0, 0}, "out of range"},
        {{CACHE_OP_ROTATE, -2, 0, 5, 0, 0, 0}, "out of range"},
        {{CACHE_OP_ROTATE, 2, 3, 5, 0, 0, 0}, "in place"},
        {{CACHE_OP_ROTATE, 2, 0, ctx, 0, 0, 0}, "context length"},
        {{CACHE_OP_ROTATE, 2, 0, -ctx, 0, 0, 0}, "context length"},
        {{CACHE_OP_ROTATE, 2, 0, INT32_MIN, 0, 0, 0}, "context length"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        list[2] = cases[i].op;
        apply_refused(&b, list, 3, cases[i].expect);
    }
    float *k1 = read_keys(&b, 1, pos1);
    assert_memory_equal(k0, k1, block_keys(&model.weights) * sizeof *k0);
    assert_memory_equal(pos0, pos1, sizeof pos0);
    /* The largest deltas allowed pass, and Δ = 0 changes nothing. */
    const CacheOp edge[] = {{CACHE_OP_ROTATE, 4, 0, ctx - 1, 0, 0, 0}, {CACHE_OP_ROTATE, 4, 0, -(ctx - 1), 0, 0, 0}, {CACHE_OP_ROTATE, 1, 0, 0, 0, 0, 0}};
    BraidError err;
    if (backend_apply_cache_ops(&b, edge, 3, &err)) fail_msg("%s", err.msg);
    float *k2 = read_keys(&b, 1, pos1);
    assert_memory_equal(k0, k2, block_keys(&model.weights) * sizeof *k0);
    assert_memory_equal(pos0, pos1, sizeof pos0);
    BraidError rerr = {{0}};
    assert_int_equal(backend_read_block(&b, 0, k2, NULL, NULL, &rerr), -1);
    free(k0);
    free(k1);
    free(k2);
    backend_destroy(&b);
}

/* A TP rank's shard, sent the list through the step plan's wire format, rotates its own heads as
 * the whole model's pool rotates them. Layer 0's keys need no all-reduce, so a shard run without
 * peers computes them exactly; deeper layers of such a run are partial sums, but ROTATE acts on
 * whatever is stored, so every layer still has to match the fp64 rotation of its own keys. */
static void test_tp_shard_rotates_its_heads(void **state) {
    (void)state;
    if (kind == BACKEND_CUDA) skip(); /* tensor parallelism runs on the CPU backend only */
    const ModelConfig *c = &model.weights.cfg;
    const int tp_size = 2, rank = 1;
    ModelWeights shard;
    TpShardRange range;
    BraidError err;
    if (model_weights_shard(&model.weights, rank, tp_size, &shard, &err) ||
        tp_shard_range(c, model.weights.layers[0].w_gate.type, rank, tp_size, &range, &err))
        fail_msg("%s", err.msg);
    Backend whole, part;
    make_backend(&whole, &model.weights);
    make_backend(&part, &shard);
    const int32_t table[] = {1, 2, 3};
    prefill_at(&whole, tokens, N_TOK, 50, table);
    prefill_at(&part, tokens, N_TOK, 50, table);
    float *part_before = read_keys(&part, 2, NULL);
    /* The leader's list, through the wire, applied by the peer. */
    CacheOpList ops = {0};
    assert_int_equal(cache_ops_push(&ops, CACHE_OP_ROTATE, 2, 0, 2345), 0);
    int32_t tok = 1, pos = 0, slot = -1, start[] = {0, 1}, ctx = 1, blk[] = {1};
    const int32_t *tables[] = {blk};
    ForwardBatch fb = {.n_tokens = 1, .tokens = &tok, .positions = &pos, .slot_mapping = &slot, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = &ctx};
    WireBuf wb = {0};
    step_msg_encode(&wb, STEP_FORWARD, &fb, &ops, BS);
    StepMsg m;
    WireReader r = wire_reader(wb.data, wb.len);
    assert_int_equal(step_msg_decode(&r, BS, &m), 0);
    assert_int_equal(m.ops.n, 1);
    assert_int_equal(m.ops.ops[0].kind, CACHE_OP_ROTATE);
    assert_int_equal(m.ops.ops[0].delta, 2345);
    if (backend_apply_cache_ops(&part, m.ops.ops, m.ops.n, &err) || backend_apply_cache_ops(&whole, ops.ops, ops.n, &err))
        fail_msg("%s", err.msg);
    int32_t pos_part[BS], pos_whole[BS];
    float *kp = read_keys(&part, 2, pos_part), *kw = read_keys(&whole, 2, pos_whole);
    assert_memory_equal(pos_part, pos_whole, sizeof pos_part);
    assert_int_equal(pos_part[0], 50 + BS + 2345);
    assert_true(rotation_excess(&shard, part_before, kp, 2345) <= 0);
    /* Layer 0: the shard's head h is the whole pool's head kv_head_lo + h, bit for bit. */
    size_t head = (size_t)BS * c->head_dim;
    for (int h = 0; h < range.kv_head_hi - range.kv_head_lo; h++)
        assert_memory_equal(kp + h * head, kw + (range.kv_head_lo + h) * head, head * sizeof *kp);
    free(part_before);
    free(kp);
    free(kw);
    step_msg_free(&m);
    wire_buf_free(&wb);
    cache_ops_free(&ops);
    backend_destroy(&whole);
    backend_destroy(&part);
    model_weights_free(&shard);
}

/* cpu_rope_rotate_f16 alone, on rope widths that take its 8-lane path (64; 48 half-split) and its
 * scalar path (62 interleaved; 40 half-split), against an fp64 rotation: within half an fp16 ulp
 * plus fp32 product rounding; dimensions past rope_dim keep their bits. */
static void test_rotate_kernel_paths(void **state) {
    (void)state;
    if (kind == BACKEND_CUDA) skip();
    enum { HD = 64, ROWS = 37 };
    static const struct { RopePairing pairing; int rope_dim; } cases[] = {
        {ROPE_PAIRING_INTERLEAVED, 64}, {ROPE_PAIRING_INTERLEAVED, 62}, {ROPE_PAIRING_HALF_SPLIT, 48}, {ROPE_PAIRING_HALF_SPLIT, 40}};
    uint16_t rows[ROWS * HD], orig[ROWS * HD];
    uint32_t seed = 12345;
    for (int i = 0; i < ROWS * HD; i++) {
        seed = seed * 1664525u + 1013904223u;
        orig[i] = vec_float_to_half(((float)(seed >> 8) / 16777216.0f - 0.5f) * 40.0f);
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int rd = cases[k].rope_dim, half = rd / 2;
        float cs[HD / 2], sn[HD / 2];
        cpu_rope_angles(-3071, rd, 10000.0f, 1.0f, NULL, cs, sn);
        memcpy(rows, orig, sizeof rows);
        cpu_rope_rotate_f16(rows, ROWS, HD, rd, cases[k].pairing, cs, sn);
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < half; i++) {
                int a = cases[k].pairing == ROPE_PAIRING_INTERLEAVED ? 2 * i : i;
                int b = cases[k].pairing == ROPE_PAIRING_INTERLEAVED ? 2 * i + 1 : i + half;
                double x0 = vec_half_to_float(orig[r * HD + a]), x1 = vec_half_to_float(orig[r * HD + b]);
                double r0 = x0 * cs[i] - x1 * sn[i], r1 = x0 * sn[i] + x1 * cs[i], len = hypot(x0, x1);
                double y0 = vec_half_to_float(rows[r * HD + a]), y1 = vec_half_to_float(rows[r * HD + b]);
                assert_true(fabs(y0 - r0) <= 0.5 * storage_ulp(fmax(fabs(r0), fabs(y0))) + len * 0x1p-22);
                assert_true(fabs(y1 - r1) <= 0.5 * storage_ulp(fmax(fabs(r1), fabs(y1))) + len * 0x1p-22);
            }
        for (int r = 0; r < ROWS; r++) assert_memory_equal(rows + r * HD + rd, orig + r * HD + rd, (HD - rd) * sizeof *rows);
    }
}

int main(void) {
    const char *device = getenv("BRAID_TEST_DEVICE");
    if (device && strcmp(device, "cuda") == 0) {
        if (!backend_cuda_available()) {
            fprintf(stderr, "no CUDA backend or GPU here: skipping\n");
            return 77;
        }
        kind = BACKEND_CUDA;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotate_kernel_paths),
        cmocka_unit_test(test_bad_rotate_refused),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_chained_rotation_drift),
        cmocka_unit_test(test_keys_match_recomputed),
        cmocka_unit_test(test_keys_match_recomputed_neox),
        cmocka_unit_test(test_copy_slots),
        cmocka_unit_test(test_two_entries_one_sequence),
        cmocka_unit_test(test_decode_after_rotate),
        cmocka_unit_test(test_tp_shard_rotates_its_heads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
