/*
 * Every cache path of the CUDA backend against the CPU backend (the oracle) on the same inputs, on
 * the real default model. Skips (exit 77) without a GPU.
 * Each case runs one script — prefills, a cache-operation list, a decode — on a CPU backend and on
 * a CUDA backend of the same geometry, then checks:
 *  - the decode's logits agree within the bf16 tolerance of test_cuda_backend (max |diff| <= 1.0,
 *    mean <= 0.1), and the greedy token agrees wherever the CPU's top-2 margin exceeds that noise;
 *  - the operation mattered: on the CPU, the same decode without the operation (the control) is
 *    further from the operated logits than the CUDA run is, so a CUDA operation that did nothing
 *    (or the wrong thing) fails;
 *  - the slots' recorded positions read back equal on both backends (exact integers).
 * Cases (the cache paths of issue 34, item 3):
 *  - host tier: STORE device blocks to the host tier, a prefill at once overwriting them on the
 *    device (the copy stream must read them first: no host sync in between), LOAD them back into
 *    other blocks, decode over those;
 *  - COPY_SLOTS + ROTATE (Leyline splice): a 32-token segment prefilled on its own at positions
 *    0..31 is ROTATEd by +48 in place and decoded after a 48-token context, and another copy of it
 *    lands by COPY_SLOTS (whole blocks, delta +48) in other blocks;
 *  - segment reuse: the segment's slots 3..31 land unaligned at positions 48..76 of a context
 *    (COPY_SLOTS runs split at block boundaries, as kv_segments.c emits them, delta +45);
 *  - device COPY of whole blocks (segment reuse's exact mode and copy-on-write forks).
 * Prints one line per case with the measured differences for the notes.
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

#include "golden_io.h"
#include "model/model.h"
#include "test_paths.h"
#include "worker/backend.h"

#define BS 16
#define N_BLOCKS 24
#define HOST_BLOCKS 8
#define CTX 48 /* the context prefix: three blocks */
#define SEG 32 /* the segment: two blocks */
#define LOGIT_MAX_TOLERANCE 1.0
#define LOGIT_MEAN_TOLERANCE 0.1

typedef struct {
    GoldenModel golden;
    int32_t *ids; /* >= CTX + SEG tokens of the longest golden prompt */
    int n_ids;
} Fixture;

static int setup(void **state) {
    static Fixture fx;
    if (golden_model_load(&fx.golden)) return -1;
    json_t *longest = json_array_get(fx.golden.prompts, 0);
    for (size_t i = 0; i < json_array_size(fx.golden.prompts); i++)
        if (json_array_size(json_object_get(json_array_get(fx.golden.prompts, i), "ids")) >
            json_array_size(json_object_get(longest, "ids")))
            longest = json_array_get(fx.golden.prompts, i);
    fx.ids = golden_int_array(json_object_get(longest, "ids"), &fx.n_ids);
    if (!fx.ids || fx.n_ids < CTX + SEG) return -1;
    *state = &fx;
    return 0;
}

static int teardown(void **state) {
    Fixture *fx = *state;
    free(fx->ids);
    golden_model_free(&fx->golden);
    return 0;
}

static void make_backend(const Fixture *fx, BackendKind kind, Backend *b) {
    BackendConfig cfg = backend_config_default(kind, &fx->golden.model.weights.cfg, N_BLOCKS, BS, 64);
    cfg.host_blocks = HOST_BLOCKS;
    BraidError err;
    if (backend_create(b, &fx->golden.model.weights, &cfg, &err)) fail_msg("%s backend: %s", backend_kind_name(kind), err.msg);
}

/* n tokens at positions pos0.. of a sequence whose blocks are table (covering pos0 + n slots). */
static void prefill(Backend *b, const int32_t *ids, int n, int pos0, const int32_t *table) {
    int32_t pos[64], slots[64], start[] = {0, n}, ctx[] = {pos0 + n}, row[] = {n - 1}, next;
    assert_true(n <= 64);
    for (int t = 0; t < n; t++) pos[t] = pos0 + t, slots[t] = table[(pos0 + t) / BS] * BS + (pos0 + t) % BS;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = n, .tokens = ids, .positions = pos, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    ForwardOutput out = {.argmax = &next};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
}

/* Logits (caller frees) of `token` decoded at position pos over table. */
static float *decode(Backend *b, int32_t token, int pos, const int32_t *table) {
    int vocab = b->weights->cfg.vocab_size;
    int32_t p[] = {pos}, slots[] = {table[pos / BS] * BS + pos % BS}, start[] = {0, 1}, ctx[] = {pos + 1}, row[] = {0}, next;
    const int32_t *tables[] = {table};
    ForwardBatch fb = {.n_tokens = 1, .tokens = &token, .positions = p, .slot_mapping = slots, .n_seqs = 1,
                       .seq_start = start, .block_tables = tables, .seq_n_ctx = ctx, .n_logits = 1, .logit_rows = row};
    float *logits = malloc((size_t)vocab * sizeof *logits);
    assert_non_null(logits);
    ForwardOutput out = {.argmax = &next, .logits = logits};
    BraidError err;
    if (backend_forward(b, &fb, &out, &err)) fail_msg("%s", err.msg);
    return logits;
}

static void apply(Backend *b, const CacheOp *ops, int n) {
    BraidError err;
    if (n > 0 && backend_apply_cache_ops(b, ops, n, &err)) fail_msg("%s", err.msg);
}

static void positions_of(Backend *b, int32_t block, int32_t *out) {
    BraidError err;
    if (backend_read_block(b, block, NULL, NULL, out, &err)) fail_msg("%s", err.msg);
}

/* One case's script, run the same on either backend: setup prefills, then (when `operate`) the
 * operations, then the decode; `check_blocks` (0-terminated) get their positions read back. */
typedef struct {
    const char *name;
    void (*prepare)(Backend *b, const Fixture *fx);
    const CacheOp *ops;
    int n_ops;
    const int32_t *table; /* the decode's blocks */
    int decode_pos;
    const int32_t *check_blocks;
} Script;

typedef struct {
    float *logits;
    int32_t positions[8][BS];
} Outcome;

static Outcome run_script(const Fixture *fx, BackendKind kind, const Script *s, bool operate) {
    Backend b;
    make_backend(fx, kind, &b);
    s->prepare(&b, fx);
    if (operate) apply(&b, s->ops, s->n_ops);
    Outcome o = {.logits = decode(&b, fx->ids[CTX + SEG], s->decode_pos, s->table)};
    for (int i = 0; s->check_blocks && s->check_blocks[i] && i < 8; i++) positions_of(&b, s->check_blocks[i], o.positions[i]);
    backend_destroy(&b);
    return o;
}

static int argmax(const float *x, int n, float *margin) {
    int best = 0, second = -1;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) second = best, best = i;
        else if (second < 0 || x[i] > x[second]) second = i;
    *margin = x[best] - x[second];
    return best;
}

static void compare(const Fixture *fx, const Script *s) {
    int vocab = fx->golden.model.weights.cfg.vocab_size;
    Outcome cpu = run_script(fx, BACKEND_CPU, s, true), cuda = run_script(fx, BACKEND_CUDA, s, true);
    Outcome control = run_script(fx, BACKEND_CPU, s, false);
    double worst = 0, sum = 0, moved = 0;
    for (int i = 0; i < vocab; i++) {
        double d = fabs((double)cpu.logits[i] - cuda.logits[i]);
        worst = fmax(worst, d), sum += d;
        moved = fmax(moved, fabs((double)cpu.logits[i] - control.logits[i]));
    }
    float margin, cuda_margin;
    int cpu_top = argmax(cpu.logits, vocab, &margin), cuda_top = argmax(cuda.logits, vocab, &cuda_margin);
    fprintf(stderr, "%s: cuda vs cpu max |diff| %.4f mean %.5f; without the operations (cpu) %.4f; greedy cpu %d cuda %d (margin %.3f)\n",
            s->name, worst, sum / vocab, moved, cpu_top, cuda_top, margin);
    assert_true(worst <= LOGIT_MAX_TOLERANCE);
    assert_true(sum / vocab <= LOGIT_MEAN_TOLERANCE);
    assert_true(moved > 2 * worst); /* the operations changed the answer more than the backends differ */
    if (margin > 2 * worst) assert_int_equal(cpu_top, cuda_top);
    for (int i = 0; s->check_blocks && s->check_blocks[i] && i < 8; i++)
        assert_memory_equal(cpu.positions[i], cuda.positions[i], sizeof cpu.positions[i]);
    free(cpu.logits), free(cuda.logits), free(control.logits);
}

/* ---- host tier: STORE, an overwrite queued at once, LOAD elsewhere ---- */

static const int32_t CTX_BLOCKS[] = {1, 2, 3};

static void prepare_host_tier(Backend *b, const Fixture *fx) {
    prefill(b, fx->ids, CTX, 0, CTX_BLOCKS);
    const CacheOp store[] = {{CACHE_OP_STORE, 1, 3, 0, 0, 0, 0}, {CACHE_OP_STORE, 2, 4, 0, 0, 0, 0}, {CACHE_OP_STORE, 3, 5, 0, 0, 0, 0}};
    apply(b, store, 3);
    /* Queued right behind the STOREs: the copy stream must have read the blocks before this writes them. */
    prefill(b, fx->ids + CTX, CTX < SEG ? CTX : SEG, 0, CTX_BLOCKS);
}

static void test_host_tier(void **state) {
    static const CacheOp load[] = {{CACHE_OP_LOAD, 3, 10, 0, 0, 0, 0}, {CACHE_OP_LOAD, 4, 11, 0, 0, 0, 0}, {CACHE_OP_LOAD, 5, 12, 0, 0, 0, 0}};
    static const int32_t table[] = {10, 11, 12, 13}, check[] = {10, 11, 12, 0};
    /* Without the LOADs the decode reads blocks 10..12 as the pool left them (zeroed). */
    Script s = {.name = "host tier STORE/LOAD", .prepare = prepare_host_tier, .ops = load, .n_ops = 3, .table = table,
                .decode_pos = CTX, .check_blocks = check};
    compare(*state, &s);
}

/* ---- COPY_SLOTS + ROTATE: a segment spliced in after a context ---- */

static void prepare_segment(Backend *b, const Fixture *fx) {
    static const int32_t seg_blocks[] = {4, 5};
    prefill(b, fx->ids, CTX, 0, CTX_BLOCKS);
    prefill(b, fx->ids + CTX, SEG, 0, seg_blocks); /* on its own, at positions 0..31 */
}

static void test_rotate_splice(void **state) {
    static const CacheOp ops[] = {{.kind = CACHE_OP_ROTATE, .src = 4, .delta = CTX}, {.kind = CACHE_OP_ROTATE, .src = 5, .delta = CTX}};
    static const int32_t table[] = {1, 2, 3, 4, 5, 6}, check[] = {4, 5, 0};
    Script s = {.name = "ROTATE (splice in place)", .prepare = prepare_segment, .ops = ops, .n_ops = 2, .table = table,
                .decode_pos = CTX + SEG, .check_blocks = check};
    compare(*state, &s);
}

static void test_copy_slots_splice(void **state) {
    static const CacheOp ops[] = {
        {.kind = CACHE_OP_COPY_SLOTS, .src = 4, .dst = 8, .delta = CTX, .src_slot = 0, .dst_slot = 0, .n_slots = BS},
        {.kind = CACHE_OP_COPY_SLOTS, .src = 5, .dst = 9, .delta = CTX, .src_slot = 0, .dst_slot = 0, .n_slots = BS}};
    static const int32_t table[] = {1, 2, 3, 8, 9, 6}, check[] = {8, 9, 4, 0};
    Script s = {.name = "COPY_SLOTS (splice into other blocks)", .prepare = prepare_segment, .ops = ops, .n_ops = 2, .table = table,
                .decode_pos = CTX + SEG, .check_blocks = check};
    compare(*state, &s);
}

/* ---- segment reuse: unaligned slots, runs split at block boundaries ---- */

#define REUSE_FROM 3 /* the segment's slots 3..31 land at positions 48..76 */

static void test_segment_reuse(void **state) {
    /* Source slots 3..15 of block 4 -> 0..12 of block 8; 16..18 (block 5, 0..2) -> 13..15 of 8;
     * 19..31 (block 5, 3..15) -> 0..12 of block 9. delta = 48 - 3. */
    static const CacheOp ops[] = {
        {.kind = CACHE_OP_COPY_SLOTS, .src = 4, .dst = 8, .delta = CTX - REUSE_FROM, .src_slot = 3, .dst_slot = 0, .n_slots = 13},
        {.kind = CACHE_OP_COPY_SLOTS, .src = 5, .dst = 8, .delta = CTX - REUSE_FROM, .src_slot = 0, .dst_slot = 13, .n_slots = 3},
        {.kind = CACHE_OP_COPY_SLOTS, .src = 5, .dst = 9, .delta = CTX - REUSE_FROM, .src_slot = 3, .dst_slot = 0, .n_slots = 13}};
    static const int32_t table[] = {1, 2, 3, 8, 9}, check[] = {8, 9, 0};
    Script s = {.name = "segment reuse (unaligned COPY_SLOTS)", .prepare = prepare_segment, .ops = ops, .n_ops = 3, .table = table,
                .decode_pos = CTX + SEG - REUSE_FROM, .check_blocks = check};
    compare(*state, &s);
}

/* ---- device COPY of whole blocks ---- */

static void prepare_context(Backend *b, const Fixture *fx) { prefill(b, fx->ids, CTX, 0, CTX_BLOCKS); }

static void test_device_copy(void **state) {
    static const CacheOp ops[] = {{CACHE_OP_COPY, 1, 14, 0, 0, 0, 0}, {CACHE_OP_COPY, 2, 15, 0, 0, 0, 0}, {CACHE_OP_COPY, 3, 16, 0, 0, 0, 0}};
    static const int32_t table[] = {14, 15, 16, 17}, check[] = {14, 15, 16, 0};
    Script s = {.name = "device COPY", .prepare = prepare_context, .ops = ops, .n_ops = 3, .table = table, .decode_pos = CTX,
                .check_blocks = check};
    compare(*state, &s);
}

int main(void) {
    if (!backend_cuda_available()) {
        fprintf(stderr, "no CUDA backend or GPU here: skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_tier),       cmocka_unit_test(test_rotate_splice), cmocka_unit_test(test_copy_slots_splice),
        cmocka_unit_test(test_segment_reuse),   cmocka_unit_test(test_device_copy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
