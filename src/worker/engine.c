#include "worker/engine.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/timeutil.h"
#include "grammar/grammar.h"
#include "model/token_canon.h"
#include "worker/engine_probe.h"
#include "worker/grammar_tokens.h"
#include "worker/sched_forkkv.h"

CpuMatmulMath engine_cpu_matmul(const EngineConfig *cfg) { return cfg->cpu_matmul_fp32 ? CPU_MATMUL_FP32 : CPU_MATMUL_INT8; }

int engine_init(Engine *e, const BraidModel *model, const EngineConfig *cfg, BraidError *err) {
    memset(e, 0, sizeof *e);
    e->model = model;
    e->cfg = *cfg;
    const ModelConfig *mc = &model->weights.cfg;
    SchedConfig sc = {.device_blocks = cfg->n_blocks, .host_blocks = cfg->host_blocks, .block_size = cfg->block_size,
                      .max_batch_tokens = cfg->max_batch_tokens, .max_running = cfg->max_running,
                      .cache_enabled = cfg->cache_enabled, .policy = cfg->policy, .policy_options = cfg->policy_options,
                      .prefetch = cfg->prefetch, .prefetch_max_blocks = cfg->prefetch_max_blocks,
                      .segments = cfg->segment_reuse != SEGMENT_REUSE_OFF, .anchor_tokens = model->tokenizer.special_ids,
                      .n_anchor_tokens = model->tokenizer.n_special, .approx_window = cfg->approx_window,
                      .span_guard = cfg->span_guard, .model_seed = engine_model_seed(mc), .flops_per_token = engine_prefill_flops_per_token(mc),
                      .pin_budget_blocks = cfg->pin_budget_blocks, .lora_shared = cfg->lora_shared,
                      .residual_blocks = cfg->residual_blocks, .fair_share = cfg->fair_share,
                      .fair_step_tokens = cfg->fair_step_tokens, .admit_output = cfg->admit_output,
                      .lora_auto = cfg->lora_shared && cfg->lora_auto, .model_layers = mc->n_layers, .model_heads = mc->n_heads,
                      .model_kv_heads = mc->n_kv_heads, .model_head_dim = mc->head_dim,
                      .lora_rank = cfg->lora_shared ? lora_set_max_rank(cfg->lora) : 0};
    if (cfg->segment_lsh && cfg->segment_reuse == SEGMENT_REUSE_APPROX) {
        if (token_canon_build(&model->tokenizer, &e->segment_canon, err)) return -1;
        sc.segment_lsh = true;
        sc.segment_lsh_anywhere = cfg->segment_lsh_anywhere;
        sc.segment_tau_seg = cfg->segment_tau_seg;
        sc.segment_tau_ctx = cfg->segment_tau_ctx;
        sc.segment_canon = e->segment_canon;
        sc.n_segment_canon = model->tokenizer.n_vocab;
    }
    if (sched_init(&e->sched, &sc, err)) {
        free(e->segment_canon);
        return -1;
    }
    BackendConfig bc = backend_config_default(cfg->device, &model->weights.cfg, cfg->n_blocks, cfg->block_size,
                                              cfg->max_batch_tokens);
    bc.max_seqs = cfg->max_running > 0 && cfg->max_running < cfg->max_batch_tokens ? cfg->max_running : cfg->max_batch_tokens;
    bc.cuda_graphs = !cfg->cuda_graphs_off;
    bc.cpu_matmul = engine_cpu_matmul(cfg);
    bc.tp = cfg->tp;
    bc.lora = cfg->lora;
    if (cfg->lora_shared) {
        bc.residual_blocks = cfg->residual_blocks;
        bc.residual_rank = lora_set_max_rank(cfg->lora);
    }
    /* The host tier holds evicted cache; with caching off there is nothing to put there. */
    bc.host_blocks = cfg->cache_enabled ? cfg->host_blocks : 0;
    bc.sync_copies = cfg->sync_copies;
    bc.step_pulse = cfg->step_pulse;
    bc.step_pulse_ctx = cfg->step_pulse_ctx;
    if (backend_create(&e->backend, cfg->shard ? cfg->shard : &model->weights, &bc, err)) {
        sched_free(&e->sched);
        free(e->segment_canon);
        return -1;
    }
    prefetch_budget_init(&e->prefetch_budget, e->backend.kv_bytes / (size_t)(cfg->n_blocks > 0 ? cfg->n_blocks : 1),
                         cfg->prefetch_max_blocks, SCHED_PREFETCH_MAX_BLOCKS_PER_STEP);
    return 0;
}

void engine_free(Engine *e) {
    backend_destroy(&e->backend);
    sched_free(&e->sched);
    free(e->segment_canon);
    plan_free(&e->plan);
    free(e->tokens); free(e->positions); free(e->slots); free(e->res_slots); free(e->res_tables); free(e->seq_start); free(e->seq_ctx); free(e->logit_rows);
    free(e->seq_adapter); free(e->tables); free(e->logits); free(e->argmax); free(e->want_logits); free(e->want_hidden); free(e->hidden);
    grammar_cache_free(e->grammar_cache); /* matchers still held by requests free the rest */
    grammar_vocab_free(e->grammar_vocab);
    free(e->masks); free(e->want_mask); free(e->masked_row);
    memset(e, 0, sizeof *e);
}

double engine_prefill_flops_per_token(const ModelConfig *c) {
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double per_layer = c->dim * (q + 2 * kv) + q * c->dim + 3.0 * c->dim * c->ff_dim;
    return 2.0 * per_layer * c->n_layers;
}

uint64_t engine_model_seed(const ModelConfig *c) {
    const double fields[] = {c->n_layers, c->dim, c->ff_dim, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
                             c->rope_dim, c->rope_base, c->rope_position_scale, c->rope_pairing};
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the fields' bytes */
    const unsigned char *p = (const unsigned char *)fields;
    for (size_t i = 0; i < sizeof fields; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Finishes a request that cannot run with `why` as its error; returns -1. */
static int refuse(SchedRequest *r, const char *why) {
    snprintf(r->error, sizeof r->error, "%s", why);
    r->state = REQ_FINISHED;
    r->finish_reason = "error";
    return -1;
}

/* Compiled grammar specs an engine keeps (with their mask caches) for requests that repeat them. */
#define ENGINE_GRAMMAR_CACHE 64

/* Compiles the request's grammar spec against the model's vocabulary (made on first use). */
static int attach_grammar(Engine *e, SchedRequest *r, char *why, size_t why_len) {
    if (!e->grammar_vocab) {
        BraidError err;
        if (!(e->grammar_vocab = grammar_vocab_from_tokenizer(&e->model->tokenizer, &err))) {
            snprintf(why, why_len, "%s", err.msg);
            return -1;
        }
        e->mask_words = grammar_mask_words(grammar_vocab_size(e->grammar_vocab));
        if (!(e->grammar_cache = grammar_cache_create(e->grammar_vocab, ENGINE_GRAMMAR_CACHE))) {
            snprintf(why, why_len, "grammar: out of memory");
            return -1;
        }
    }
    char msg[400];
    r->grammar = grammar_cache_matcher(e->grammar_cache, r->grammar_spec, strlen(r->grammar_spec), msg, sizeof msg);
    if (!r->grammar) {
        snprintf(why, why_len, "grammar: %s", msg);
        return -1;
    }
    return 0;
}

int engine_submit(Engine *e, SchedRequest *r) {
    if (r->segment_mode > e->cfg.segment_reuse) r->segment_mode = (uint8_t)e->cfg.segment_reuse;
    int context = e->model->weights.cfg.context_length;
    char why[sizeof r->error];
    if (r->n_prompt + r->max_tokens > context) r->max_tokens = context - r->n_prompt;
    if (r->max_tokens < 1) {
        snprintf(why, sizeof why, "prompt of %d tokens leaves no room in the model's context of %d", r->n_prompt, context);
        return refuse(r, why);
    }
    if ((r->lora_id = lora_set_find(e->cfg.lora, r->adapter)) < 0) {
        snprintf(why, sizeof why, "unknown LoRA adapter '%.200s' (load it with --lora NAME=PATH)", r->adapter);
        return refuse(r, why);
    }
    if (sampler_init(&r->sampler, e->model->weights.cfg.vocab_size, r->sampling.seed)) return refuse(r, "out of memory");
    if (r->grammar_spec && r->grammar_spec[0] && !r->grammar && attach_grammar(e, r, why, sizeof why)) return refuse(r, why);
    return sched_add(&e->sched, r);
}

static int reserve(Engine *e, int n_tokens, int n_seqs, BraidError *err) {
    if (n_tokens > e->cap_tokens) {
        free(e->tokens); free(e->positions); free(e->slots); free(e->res_slots);
        e->res_slots = malloc((size_t)n_tokens * sizeof *e->res_slots);
        e->tokens = malloc((size_t)n_tokens * sizeof *e->tokens);
        e->positions = malloc((size_t)n_tokens * sizeof *e->positions);
        e->slots = malloc((size_t)n_tokens * sizeof *e->slots);
        e->cap_tokens = n_tokens;
    }
    if (n_seqs > e->cap_seqs) {
        free(e->seq_start); free(e->seq_ctx); free(e->logit_rows); free(e->seq_adapter); free(e->tables); free(e->logits);
        free(e->res_tables);
        e->res_tables = malloc((size_t)n_seqs * sizeof *e->res_tables);
        free(e->argmax); free(e->want_logits); free(e->want_hidden); free(e->hidden);
        e->seq_start = malloc((size_t)(n_seqs + 1) * sizeof *e->seq_start);
        e->seq_ctx = malloc((size_t)n_seqs * sizeof *e->seq_ctx);
        e->logit_rows = malloc((size_t)n_seqs * sizeof *e->logit_rows);
        e->seq_adapter = malloc((size_t)n_seqs * sizeof *e->seq_adapter);
        e->tables = malloc((size_t)n_seqs * sizeof *e->tables);
        e->logits = malloc((size_t)n_seqs * e->model->weights.cfg.vocab_size * sizeof *e->logits);
        e->argmax = malloc((size_t)n_seqs * sizeof *e->argmax);
        e->want_logits = malloc((size_t)n_seqs);
        e->want_hidden = malloc((size_t)n_seqs);
        e->hidden = malloc((size_t)n_seqs * e->model->weights.cfg.dim * sizeof *e->hidden);
        e->cap_seqs = n_seqs;
    }
    if (!e->tokens || !e->positions || !e->slots || !e->res_slots || !e->res_tables || !e->seq_start || !e->seq_ctx || !e->logit_rows || !e->seq_adapter || !e->tables || !e->logits ||
        !e->argmax || !e->want_logits || !e->want_hidden || !e->hidden)
        return braid_error_set(err, "engine: out of memory for a step of %d tokens", n_tokens);
    return 0;
}

/* Flattens the plan into a ForwardBatch; returns the number of logit rows. */
static int build_batch(Engine *e, ForwardBatch *b) {
    const StepPlan *p = &e->plan;
    int bs = e->cfg.block_size, t = 0, n_logits = 0;
    bool any_forked = false;
    for (int i = 0; i < p->n; i++) {
        const PlanEntry *pe = &p->entries[i];
        const SchedRequest *r = pe->req;
        bool forked = sched_forked(&e->sched, r);
        any_forked |= forked;
        e->seq_start[i] = t;
        for (int k = 0; k < pe->count; k++, t++) {
            int pos = pe->start + k;
            e->tokens[t] = r->tokens[pos];
            e->positions[t] = pos;
            /* A forked request reads, never writes, the shared base K/V and its own residuals that were cached. */
            e->slots[t] = forked && pos < r->base_write_from ? -1 : r->blocks[pos / bs] * bs + pos % bs;
            e->res_slots[t] = !forked || pos < r->res.matched_tokens ? -1 : r->res.blocks[pos / bs] * bs + pos % bs;
        }
        e->tables[i] = r->blocks;
        e->res_tables[i] = forked ? r->res.blocks : NULL;
        e->seq_ctx[i] = pe->start + pe->count;
        e->seq_adapter[i] = pe->req->lora_id;
        if (pe->sample) {
            /* Greedy requests need only the device's argmax; others need their logits on the host. */
            bool first = pe->req->n_tokens == pe->req->n_prompt;
            e->want_logits[n_logits] = pe->req->sampling.temperature > 0.0f || pe->req->want_logprobs ||
                                       (pe->req->want_first_logits && first);
            /* The prompt's last token: its hidden state, when the request wants it. */
            e->want_hidden[n_logits] = pe->req->want_hidden && !pe->req->hidden && pe->req->n_tokens == pe->req->n_prompt;
            if (e->want_mask) e->want_mask[n_logits] = pe->req->grammar != NULL;
            e->logit_rows[n_logits++] = t - 1;
        }
    }
    e->seq_start[p->n] = t;
    *b = (ForwardBatch){
        .n_tokens = t, .tokens = e->tokens, .positions = e->positions, .slot_mapping = e->slots,
        .n_seqs = p->n, .seq_start = e->seq_start, .block_tables = e->tables, .seq_n_ctx = e->seq_ctx,
        .n_logits = n_logits, .logit_rows = e->logit_rows,
        .seq_adapter = e->cfg.lora && e->cfg.lora->n > 0 ? e->seq_adapter : NULL,
        .res_block_tables = any_forked ? e->res_tables : NULL, .res_slot_mapping = any_forked ? e->res_slots : NULL,
    };
    return n_logits;
}

/* Keeps the row's hidden state on the request when the forward copied one for it. Out of memory
 * only loses the state (a forecast without it), never the request. */
static void keep_hidden(Engine *e, SchedRequest *r, int row) {
    if (!e->want_hidden[row]) return;
    size_t dim = (size_t)e->model->weights.cfg.dim;
    if ((r->hidden = malloc(dim * sizeof *r->hidden))) memcpy(r->hidden, e->hidden + row * dim, dim * sizeof *r->hidden);
}

/* Keeps the first token's logits on the request when it asked for them (out of memory loses them). */
static void keep_first_logits(Engine *e, SchedRequest *r, int row) {
    if (!r->want_first_logits || r->first_logits || r->n_tokens != r->n_prompt) return;
    size_t vocab = (size_t)e->model->weights.cfg.vocab_size;
    if ((r->first_logits = malloc(vocab * sizeof *r->first_logits)))
        memcpy(r->first_logits, e->logits + (size_t)row * vocab, vocab * sizeof *r->first_logits);
}

/* Records the logprobs of the token about to be appended (index = tokens generated so far), for a
 * request that wants them. Out of memory fails the request: a client asked for logprobs, and an
 * answer silently without some of them would be wrong. */
static int record_logprobs(SchedRequest *r, const float *logits, int vocab, int32_t token) {
    if (!r->want_logprobs) return 0;
    int at = r->n_tokens - r->n_prompt;
    if (braid_grow((void **)&r->logprobs, &r->cap_logprobs, at + 1, sizeof *r->logprobs)) return -1;
    sampler_logprobs(logits, vocab, token, r->logprobs_top, &r->logprobs[at]);
    return 0;
}

/* Room for one mask per sampled row (grammar requests only make masks). */
static int reserve_masks(Engine *e, int rows, BraidError *err) {
    if (rows <= e->cap_mask_rows) return 0;
    free(e->masks);
    free(e->want_mask);
    e->masks = malloc((size_t)rows * e->mask_words * sizeof *e->masks);
    e->want_mask = calloc((size_t)rows, 1);
    if (!e->masked_row) e->masked_row = malloc((size_t)e->model->weights.cfg.vocab_size * sizeof *e->masked_row);
    if (!e->masks || !e->want_mask || !e->masked_row) {
        free(e->masks);
        free(e->want_mask);
        e->masks = NULL;
        e->want_mask = NULL;
        e->cap_mask_rows = 0;
        return braid_error_set(err, "engine: out of memory for %d grammar masks", rows);
    }
    e->cap_mask_rows = rows;
    return 0;
}

/* Fills the mask of every sampled row of a request with a grammar. A matcher that cannot go on (no
 * token allowed, an internal limit) clears the row's flag and leaves its message in the request's
 * error; the request then ends with it after the forward. */
static void fill_masks(Engine *e, int n_logits) {
    for (int i = 0, row = 0; i < e->plan.n && row < n_logits; i++) {
        PlanEntry *pe = &e->plan.entries[i];
        if (!pe->sample) continue;
        SchedRequest *r = pe->req;
        if (e->want_mask[row]) {
            int allowed = grammar_matcher_fill_mask(r->grammar, e->masks + (size_t)row * e->mask_words);
            if (allowed <= 0) {
                e->want_mask[row] = 0;
                snprintf(r->error, sizeof r->error, "%s",
                         allowed < 0 ? grammar_matcher_error(r->grammar) : "grammar: no token of the vocabulary can continue the output");
            }
        }
        row++;
    }
}

/* The token a constrained row takes: the backend's masked argmax (greedy), or a draw from the
 * masked logits; a draw that lands on a disallowed token (rounding at the end of the
 * distribution) falls back to the masked argmax. */
static int32_t sample_masked(Engine *e, SchedRequest *r, int row, bool sampled) {
    const uint32_t *mask = e->masks + (size_t)row * e->mask_words;
    int vocab = e->model->weights.cfg.vocab_size;
    if (!sampled) return e->argmax[row];
    const float *raw = e->logits + (size_t)row * vocab;
    memcpy(e->masked_row, raw, (size_t)vocab * sizeof *raw);
    sampler_apply_mask(e->masked_row, vocab, mask);
    int32_t token = sampler_sample(&r->sampler, e->masked_row, &r->sampling);
    return sampler_mask_allows(mask, token) ? token : sampler_argmax_masked(raw, vocab, mask);
}

static void after_sample(Engine *e, SchedRequest *r, int32_t token) {
    Scheduler *s = &e->sched;
    if (r->n_tokens == r->n_prompt) r->t_first_token = s->clock();
    if ((!r->ignore_eos || r->grammar) && tokenizer_is_stop(&e->model->tokenizer, token)) {
        sched_finish(s, r, "stop");
        return;
    }
    if (r->grammar && grammar_matcher_accept_token(r->grammar, token)) {
        snprintf(r->error, sizeof r->error, "grammar: the sampled token %d does not continue the output%s%s", (int)token,
                 grammar_matcher_error(r->grammar)[0] ? ": " : "", grammar_matcher_error(r->grammar));
        sched_finish(s, r, "error");
        return;
    }
    if (sched_append_token(r, token)) {
        snprintf(r->error, sizeof r->error, "out of memory");
        sched_finish(s, r, "error");
        return;
    }
    e->generated_tokens++;
    if (r->grammar) e->constrained_tokens++;
    /* A complete output that nothing but end-of-generation may follow ends here: the step that
     * would only sample EOS is saved. */
    if (r->grammar && grammar_matcher_is_terminated(r->grammar)) sched_finish(s, r, "stop");
    else if (r->n_tokens - r->n_prompt >= r->max_tokens) sched_finish(s, r, "length");
}

/* S_bw for the coming step (a fixed --prefetch-blocks stays as the scheduler has it). */
static void set_prefetch_budget(Engine *e) {
    if (e->sched.prefetch && e->prefetch_budget.fixed_blocks == 0) e->sched.prefetch_max_blocks = prefetch_budget_blocks(&e->prefetch_budget);
}

/* The step's LOADs the backend timed, into the bandwidth average (after backend_sync). */
static void observe_copies(Engine *e) {
    double bytes = e->backend.load_bytes - e->seen_load_bytes, seconds = e->backend.load_seconds - e->seen_load_seconds;
    prefetch_budget_observe_copy(&e->prefetch_budget, bytes, seconds);
    e->seen_load_bytes = e->backend.load_bytes;
    e->seen_load_seconds = e->backend.load_seconds;
}

int engine_step(Engine *e, BraidError *err) {
    set_prefetch_budget(e);
    int n = sched_plan(&e->sched, &e->plan, err);
    if (n <= 0) return n;
    if (reserve(e, e->plan.n_tokens, e->plan.n, err)) return -1;
    bool constrained = false;
    for (int i = 0; i < e->plan.n; i++) constrained |= e->plan.entries[i].sample && e->plan.entries[i].req->grammar;
    if (constrained && reserve_masks(e, e->plan.n, err)) return -1;
    ForwardBatch batch;
    uint8_t *want_mask = e->want_mask;
    if (!constrained) e->want_mask = NULL; /* build_batch flags no rows */
    int n_logits = build_batch(e, &batch);
    e->want_mask = want_mask;
    double t_grammar = constrained ? braid_now_seconds() : 0.0;
    if (constrained) fill_masks(e, n_logits);
    if (constrained) e->grammar_seconds += braid_now_seconds() - t_grammar;
    ForwardOutput out = {.argmax = e->argmax, .logits = e->logits, .want_logits = e->want_logits, .hidden = e->hidden,
                         .want_hidden = e->want_hidden, .mask = constrained ? e->masks : NULL,
                         .want_mask = constrained ? e->want_mask : NULL, .mask_words = e->mask_words};
    /* The plan's block operations come before its forward (a LOAD feeds it, a STORE saves a block it
     * may overwrite). Applied here first, so a list this backend refuses never reaches the peers. */
    if (backend_apply_cache_ops(&e->backend, e->plan.ops.ops, e->plan.n_sync_ops, err))
        return braid_error_wrap(err, "engine: cache operations of a step");
    /* The prefetch's copies run beside the forward (PBKV §4.3); backend_sync below ends them. */
    if (backend_apply_cache_ops_overlapped(&e->backend, e->plan.ops.ops + e->plan.n_sync_ops, e->plan.ops.n - e->plan.n_sync_ops, err))
        return braid_error_wrap(err, "engine: prefetch operations of a step");
    if (e->cfg.before_forward && e->cfg.before_forward(e->cfg.before_forward_ctx, &batch, &e->plan.ops, err)) return -1;
    if (engine_probe_before(e, err)) return -1; /* approximate spans' cached keys, before the forward overwrites them */
    double t_forward = e->sched.fork_auto ? forkkv_cost_clock() : 0.0, t_step = braid_now_seconds();
    if (backend_forward(&e->backend, &batch, &out, err)) return -1;
    if (e->plan.pure_decode) prefetch_budget_observe_step(&e->prefetch_budget, braid_now_seconds() - t_step);
    if (e->sched.fork_auto) { /* --lora-cache auto prices a computed token from the live steps */
        int n_decode = 0;
        for (int i = 0; i < e->plan.n; i++) n_decode += e->plan.entries[i].count == 1;
        sched_forkkv_observe_step(&e->sched, batch.n_tokens, n_decode, forkkv_cost_clock() - t_forward);
    }
    if (engine_probe_after(e, err)) return -1; /* their probes decide before the commit skips past them */
    sched_commit(&e->sched, &e->plan);
    size_t vocab = (size_t)e->model->weights.cfg.vocab_size;
    for (int i = 0, row = 0; i < e->plan.n && row < n_logits; i++) {
        PlanEntry *pe = &e->plan.entries[i];
        if (!pe->sample) continue;
        SchedRequest *r = pe->req;
        if (r->grammar && !(constrained && e->want_mask[row])) { /* its matcher could not go on */
            sched_finish(&e->sched, r, "error");
            row++;
            continue;
        }
        bool sampled = r->sampling.temperature > 0.0f;
        double t0 = r->grammar ? braid_now_seconds() : 0.0;
        int32_t token = r->grammar ? sample_masked(e, r, row, sampled)
                        : sampled ? sampler_sample(&r->sampler, e->logits + (size_t)row * vocab, &r->sampling)
                                  : e->argmax[row];
        keep_hidden(e, r, row);
        keep_first_logits(e, r, row);
        if (record_logprobs(r, e->logits + (size_t)row * vocab, (int)vocab, token)) {
            snprintf(r->error, sizeof r->error, "out of memory recording logprobs");
            sched_finish(&e->sched, r, "error");
            row++;
            continue;
        }
        row++;
        after_sample(e, r, token);
        if (t0 > 0.0) e->grammar_seconds += braid_now_seconds() - t0;
    }
    /* Nothing stays in flight between steps (KV moves read the pools then). */
    if (backend_sync(&e->backend, err)) return -1;
    observe_copies(e);
#ifndef NDEBUG
    /* Debug builds verify the pool accounting and the tree after every step. */
    if (sched_check(&e->sched, err)) return -1;
#endif
    return n;
}
