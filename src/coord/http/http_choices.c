/* The choices of one completion request; the contract is in http_choices.h. */
#include "cache/kv_cache.h"
#include "coord/http/http_choices.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/content_hash.h"
#include "coord/adapter_select.h"
#include "coord/api/api_tools.h"
#include "coord/api/chat_render.h"
#include "coord/cache_key_affinity.h"
#include "coord/http/http_directives.h"
#include "common/timeutil.h"
#include "transport/control_msg.h"

/* ---- building the requests ---- */

/* A token-id prompt goes to the model as it is; ids outside the vocabulary are the client's error. */
static int copy_prompt_ids(const BraidModel *m, const ApiPrompt *p, const char *param, TokenList *ids, ApiError *e) {
    int vocab = m->weights.cfg.vocab_size;
    for (int i = 0; i < p->n_ids; i++)
        if (p->ids[i] >= vocab)
            return api_error_set(e, 400, "prompt", NULL, "%s[%d] is token id %d, outside the vocabulary [0, %d)", param, i, p->ids[i],
                                 vocab);
    if (!(ids->ids = malloc((size_t)p->n_ids * sizeof *ids->ids))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    memcpy(ids->ids, p->ids, (size_t)p->n_ids * sizeof *ids->ids);
    ids->n = ids->cap = p->n_ids;
    return 0;
}

/* The token ids of prompt `which` (completions) or of the rendered chat. */
static int tokenize_prompt(const BraidModel *m, const ApiRequest *a, ToolSyntax syntax, int which, TokenList *ids, ApiError *e) {
    BraidError err;
    if (a->kind == API_COMPLETION) {
        const ApiPrompt *p = &a->prompts[which];
        char param[32];
        if (a->n_prompts > 1) snprintf(param, sizeof param, "prompt[%d]", which);
        else snprintf(param, sizeof param, "prompt");
        if (!p->text) return copy_prompt_ids(m, p, param, ids, e);
        if (tokenizer_encode(&m->tokenizer, p->text, strlen(p->text), false, m->tokenizer.add_bos, ids, &err))
            return api_error_set(e, 400, "prompt", NULL, "cannot tokenize %s: %s", param, err.msg);
        return 0;
    }
    char *text = api_chat_render(&m->chat, syntax, a, a->n_messages, e);
    if (!text) return -1;
    int rc = tokenizer_encode(&m->tokenizer, text, strlen(text), true, m->tokenizer.add_bos, ids, &err);
    free(text);
    if (rc) return api_error_set(e, 400, "messages", NULL, "cannot tokenize the messages: %s", err.msg);
    return 0;
}


/* Fits max_tokens to the context and the KV pool, or says why the request cannot run. */
static int resolve_max_tokens(const HttpGenerateContext *ctx, const ApiRequest *a, int n_prompt, int *max_tokens, ApiError *e) {
    int context = ctx->model->weights.cfg.context_length, limit = http_generate_max_model_len(ctx);
    const char *what = limit < context ? "the KV pool" : "the model's context";
    if (n_prompt >= limit)
        return api_error_set(e, 400, a->kind == API_CHAT ? "messages" : "prompt", "context_length_exceeded",
                             "the prompt is %d tokens; %s holds %d, leaving no room to generate", n_prompt, what, limit);
    if (a->max_tokens < 0) {
        *max_tokens = limit - n_prompt;
        return 0;
    }
    if (n_prompt + a->max_tokens > limit)
        return api_error_set(e, 400, "max_tokens", "context_length_exceeded",
                             "max_tokens = %d plus the prompt's %d tokens exceeds %s (%d tokens); lower max_tokens",
                             a->max_tokens, n_prompt, what, limit);
    *max_tokens = a->max_tokens;
    return 0;
}

/* The request's segment reuse: what it asked for, if the server allows that much; else exact (or
 * off when the server has it off). Approximate reuse is never on unless both ask for it. */
static int resolve_segment_reuse(const HttpGenerateContext *ctx, const ApiRequest *a, int *mode, ApiError *e) {
    int server = ctx->segment_reuse;
    if (a->segment_reuse < 0) {
        *mode = server < SEGMENT_REUSE_EXACT ? server : SEGMENT_REUSE_EXACT;
        return 0;
    }
    if (a->segment_reuse > server)
        return api_error_set(e, 400, "segment_reuse", NULL, "segment_reuse \"%s\" is not enabled on this server (it allows \"%s\"; "
                             "start it with --segment-reuse approx to allow approximate reuse)",
                             segment_reuse_name((SegmentReuseMode)a->segment_reuse), segment_reuse_name((SegmentReuseMode)server));
    *mode = a->segment_reuse;
    return 0;
}

/* The request for choice `index`, owning a copy of the prompt's ids. */
static CoordRequest *build_request(const HttpGenerateContext *ctx, const ApiRequest *a, const TokenList *ids, int max_tokens,
                                   int segment_mode, const CacheDirectives *directives, const char *grammar, int index, ApiError *e) {
    CoordRequest *r = coord_request_create();
    if (r && (cache_directives_copy(&r->directives, directives) || (grammar && !(r->grammar = strdup(grammar))))) {
        coord_request_release(r);
        r = NULL;
    }
    int pool, block;
    coordinator_pool(ctx->coord, &pool, &block);
    int n_blocks = block > 0 ? ids->n / block : 0;
    uint64_t *chunk = malloc(((size_t)n_blocks + 1) * sizeof *chunk);
    if (r) r->block_hashes = malloc(((size_t)n_blocks + 1) * sizeof *r->block_hashes);
    if (r) r->prompt = malloc((size_t)ids->n * sizeof *r->prompt);
    if (r && chunk && r->block_hashes && r->prompt && (!a->workflow_id || (r->workflow = strdup(a->workflow_id))) &&
        (!a->agent || (r->agent = strdup(a->agent))) && (!a->tenant || (r->tenant = strdup(a->tenant))) &&
        (!a->adapter || (r->adapter = strdup(adapter_cache_name(a)))) && /* what the instance's cache keys it by */
        (!a->prompt_cache_key || (r->cache_key = cache_key_affinity_scoped(a->tenant, a->prompt_cache_key)))) {
        memcpy(r->prompt, ids->ids, (size_t)ids->n * sizeof *r->prompt);
        r->n_prompt = ids->n;
        r->max_tokens = max_tokens;
        r->temperature = (float)a->temperature;
        r->top_p = (float)a->top_p;
        r->top_k = a->top_k;
        /* A seeded request's choice i samples with seed + i: reproducible, and the choices differ. */
        r->seed = a->has_seed ? a->seed + (uint64_t)index : api_request_sampling_seed(a, atomic_fetch_add(ctx->seed_counter, 1));
        r->ignore_eos = a->ignore_eos;
        r->want_logprobs = a->logprobs >= 0;
        r->logprobs_top = a->logprobs >= 0 ? a->logprobs : 0;
        r->segment_mode = (uint8_t)segment_mode;
        /* A whole answer without stop strings reads its tokens only at the finish, so if its instance
         * dies it can start over on another one (coordinator.c: the failure domain). */
        r->restartable = !a->stream && a->n_stop == 0;
        /* The same seed the instance's cache uses, so the router's index and the prompt agree. */
        content_hash_blocks(content_hash_namespace(a->tenant, adapter_cache_name(a)), r->prompt, n_blocks, block, r->block_hashes, chunk);
        r->n_hashes = n_blocks;
        free(chunk);
        return r;
    }
    free(chunk);
    coord_request_release(r);
    api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    return NULL;
}

/* ---- the choices of one HTTP request ---- */

void choices_free(const HttpGenerateContext *ctx, ChoiceSet *set, bool cancel) {
    for (int i = 0; i < set->n; i++) {
        Choice *c = &set->c[i];
        if (cancel && c->submitted) coordinator_cancel(ctx->coord, c->r->id);
        coord_request_release(c->r);
        text_stream_free(&c->ts);
        free(c->tokens);
        free(c->logprobs);
        tool_parse_free(&c->parse);
    }
    free(set->c);
    memset(set, 0, sizeof *set);
}

static int build_choices(const HttpGenerateContext *ctx, const ApiRequest *a, int prompts, int segment_mode, const char *grammar,
                         ChoiceSet *set, ApiError *e) {
    set->per_prompt = a->n;
    if (!(set->c = calloc((size_t)prompts * (size_t)a->n, sizeof *set->c))) return api_error_set(e, 503, NULL, NULL, "the server is out of memory");
    for (int p = 0; p < prompts; p++) {
        TokenList ids = {0};
        CacheDirectives directives = {0};
        int max_tokens = 0, rc = tokenize_prompt(ctx->model, a, set->syntax, p, &ids, e);
        if (rc == 0 && ids.n == 0) rc = api_error_set(e, 400, a->kind == API_CHAT ? "messages" : "prompt", NULL, "the prompt is empty");
        if (rc == 0) rc = http_plan_directives(ctx, a, &ids, &directives, e);
        if (rc == 0) rc = resolve_max_tokens(ctx, a, ids.n, &max_tokens, e);
        for (int j = 0; rc == 0 && j < a->n; j++) {
            Choice *c = &set->c[set->n];
            c->index = p * a->n + j;
            if (!(c->r = build_request(ctx, a, &ids, max_tokens, segment_mode, &directives, grammar, c->index, e))) rc = -1;
            else set->n++;
        }
        cache_directives_free(&directives);
        free(ids.ids);
        if (rc) return -1;
    }
    return 0;
}

/* Tokenizes every prompt once and builds n requests for each. */
int choices_build(const HttpGenerateContext *ctx, const ApiRequest *a, ChoiceSet *set, ApiError *e) {
    int prompts = a->kind == API_CHAT ? 1 : a->n_prompts, segment_mode = 0;
    if (resolve_segment_reuse(ctx, a, &segment_mode, e)) return -1;
    char *grammar = NULL;
    if (a->kind == API_CHAT) {
        set->syntax = api_chat_tool_syntax(&ctx->model->chat);
        /* Answers are parsed for calls when calls are allowed; in generic mode always, since the
         * reply is the agreed JSON object even when it may only answer. */
        set->tools = api_tools_offered(a) && (a->tool_choice != API_TOOL_CHOICE_NONE || set->syntax == TOOL_SYNTAX_GENERIC);
        set->max_calls = a->parallel_tool_calls ? TOOL_MAX_PARALLEL_CALLS : 1;
        if (tool_format_grammar(set->syntax, a, &grammar, e)) return -1;
    }
    int rc = build_choices(ctx, a, prompts, segment_mode, grammar, set, e);
    free(grammar);
    return rc;
}

static int submit_one(const HttpGenerateContext *ctx, Choice *c, ApiError *e) {
    SubmitResult sr = coordinator_submit(ctx->coord, c->r);
    if (sr == SUBMIT_OK) return c->submitted = true, 0;
    if (sr == SUBMIT_BUSY) return api_error_set(e, 429, NULL, "rate_limit_exceeded", "the server's queue is full; retry shortly");
    return api_error_set(e, 503, NULL, NULL, "the server is %s and takes no new requests", coordinator_state(ctx->coord));
}

/* Waits until the request's prefill is done (a first token or its finish), so its prompt blocks
 * are in the instance's prefix cache. */
static void wait_prefilled(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->finished && r->n_tokens == 0) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* n > 1 shares each prompt's KV: the prompt's first choice is submitted alone; once its prefill is
 * done its full prompt blocks sit in the instance's prefix cache, and the prompt's other choices go
 * to that same instance, where admission matches them against the cache and computes only the
 * partial last block. (The alternative, a fork of the sequence inside the scheduler, would save
 * that block too, at the cost of a new scheduler operation.) */
int choices_submit(const HttpGenerateContext *ctx, ChoiceSet *set, ApiError *e) {
    for (int i = 0; i < set->n; i += set->per_prompt)
        if (submit_one(ctx, &set->c[i], e)) return -1;
    for (int i = 0; i < set->n; i += set->per_prompt) {
        if (set->per_prompt == 1) continue;
        Choice *first = &set->c[i];
        wait_prefilled(first->r);
        pthread_mutex_lock(&first->r->mu);
        int instance = first->r->instance;
        pthread_mutex_unlock(&first->r->mu);
        for (int j = 1; j < set->per_prompt; j++) {
            set->c[i + j].r->pin_instance = instance;
            if (submit_one(ctx, &set->c[i + j], e)) return -1;
        }
    }
    return 0;
}

/* ---- following a choice ---- */

/* Waits until the choice's request has more tokens than seen, has finished, or a second has passed
 * (so the caller can check on its client); copies its tokens (and logprobs) into the choice. */
static void wait_progress(Choice *c) {
    CoordRequest *r = c->r;
    int seen = c->progress.n_tokens;
    pthread_mutex_lock(&r->mu);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    while (!r->finished && r->n_tokens == seen)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) == ETIMEDOUT) break;
    Progress p = {.n_tokens = r->n_tokens, .finished = r->finished};
    if (p.n_tokens > c->cap) {
        int cap = p.n_tokens * 2;
        int32_t *tokens = realloc(c->tokens, (size_t)cap * sizeof *tokens);
        if (tokens) c->tokens = tokens;
        TokenLogprob *lps = tokens && r->want_logprobs ? realloc(c->logprobs, (size_t)cap * sizeof *lps) : NULL;
        if (lps) c->logprobs = lps;
        if (tokens && (lps || !r->want_logprobs)) c->cap = cap;
        else p.n_tokens = c->cap, p.finished = false; /* keep what fits; the next wait picks up the rest */
    }
    if (p.n_tokens > 0) { /* before the first token both buffers may still be NULL */
        memcpy(c->tokens, r->tokens, (size_t)p.n_tokens * sizeof *c->tokens);
        if (r->want_logprobs) memcpy(c->logprobs, r->logprobs, (size_t)p.n_tokens * sizeof *c->logprobs);
    }
    pthread_mutex_unlock(&r->mu);
    c->progress = p;
}

const char *choice_finish_reason(const Choice *c) {
    if (c->parsed && c->parse.calls) return "tool_calls";
    if (c->ts.stopped) return "stop";
    return c->r->finish_reason == FINISH_LENGTH ? "length" : "stop";
}

/* Usage over all choices: each prompt's tokens (and cache hits) once, as its first choice saw them
 * (the other choices reuse that prefill), and every choice's completion tokens. */
ApiUsage choices_usage(const ChoiceSet *set) {
    ApiUsage u = {0};
    for (int i = 0; i < set->n; i++) {
        const Choice *c = &set->c[i];
        u.completion_tokens += c->progress.n_tokens;
        if (i % set->per_prompt) continue;
        u.prompt_tokens += c->r->n_prompt;
        u.cached_tokens += c->r->cached_tokens;
        u.cached_tokens_host += c->r->cached_tokens_host;
        u.cached_tokens_remote += c->r->cached_tokens_remote;
        u.segment_reused_tokens += c->r->reused_tokens;
        if (i == 0) u.directive_outcomes = c->r->directive_outcomes;
    }
    return u;
}

/* Seconds from submission to the first token. A request that finished sets its first token's time at
 * the latest with the finish (coord_request_finish), so `otherwise` is only a backstop for an
 * answered request without one, counted rather than dropped from the TTFT histogram. */
static double first_token_seconds(CoordRequest *r, double otherwise) {
    pthread_mutex_lock(&r->mu);
    double t = r->t_first_token;
    pthread_mutex_unlock(&r->mu);
    return t > 0 ? t - r->t_submit : otherwise;
}

/* Why choice c ended, in vllm:request_success_total's terms. */
static int choice_metrics_reason(const Choice *c, bool answered) {
    if (answered) return strcmp(choice_finish_reason(c), "length") == 0 ? METRICS_FINISHED_LENGTH : METRICS_FINISHED_STOP;
    return c->r->finished && c->r->finish_reason == FINISH_ERROR ? METRICS_FINISHED_ERROR : METRICS_FINISHED_ABORT;
}

/* Each choice is one generation on one instance: the vLLM-named per-engine families. */
static void record_generations(const HttpGenerateContext *ctx, const ChoiceSet *set, bool answered, double now) {
    for (int i = 0; i < set->n; i++) {
        const Choice *c = &set->c[i];
        double first = first_token_seconds(c->r, -1);
        MetricsGeneration g = {.instance = c->r->instance, .finished_reason = choice_metrics_reason(c, answered),
                               .e2e_s = now - c->r->t_submit, .ttft_s = first,
                               .decode_s = first >= 0 ? now - (c->r->t_submit + first) : 0, .generation_tokens = c->progress.n_tokens};
        metrics_record_generation(ctx->metrics, &g);
    }
}

void choices_record_metrics(const HttpGenerateContext *ctx, const char *endpoint, const ChoiceSet *set, int status, bool answered) {
    CoordRequest *first = set->c[0].r;
    double now = braid_now_seconds();
    double latency = now - first->t_submit, ttft = first_token_seconds(first, answered ? latency : -1);
    ApiUsage u = choices_usage(set);
    metrics_record_request(ctx->metrics, endpoint, status, latency, ttft, u.prompt_tokens, u.cached_tokens, u.completion_tokens);
    record_generations(ctx, set, answered, now);
}

/* After a stop-string cancel: the instance's FINISH (with the usage numbers) follows shortly. */
static void wait_finished(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->finished) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* Takes the choice's newest tokens into its text; a stop string cancels the rest of it. */
void choice_advance(const HttpGenerateContext *ctx, const ApiRequest *a, Choice *c, bool always_decode) {
    wait_progress(c);
    if (always_decode || a->n_stop > 0 || c->progress.finished)
        text_stream_update(&c->ts, &ctx->model->tokenizer, c->tokens, c->progress.n_tokens, a->stop, a->n_stop, c->progress.finished);
    if (c->ts.stopped) {
        coordinator_cancel(ctx->coord, c->r->id);
        wait_finished(c->r);
    }
}

bool choice_done(const Choice *c) { return c->ts.stopped || c->progress.finished; }

const ToolParse *choice_tool_parse(const ChoiceSet *set, Choice *c) {
    if (!set->tools) return NULL;
    if (!c->parsed) {
        /* Ids derive from the request's id and sampling seed (a fresh draw unless the client seeded
         * it), so they differ between answers, and between server runs, and are stable within one. */
        uint64_t seed = c->r->seed ^ (c->r->id * 0x100 + (uint64_t)c->index);
        if (tool_parse(set->syntax, c->ts.text ? c->ts.text : "", c->ts.len, set->max_calls, seed, &c->parse)) return NULL;
        c->parsed = true;
    }
    return &c->parse;
}

size_t choice_tool_streamable(const ChoiceSet *set, const Choice *c) {
    if (!set->tools) return c->ts.ready;
    size_t safe = tool_parse_streamable(set->syntax, c->ts.text ? c->ts.text : "", c->ts.ready);
    return safe < c->ts.ready ? safe : c->ts.ready;
}

const char *choice_take_text(const ChoiceSet *set, Choice *c, size_t *len) {
    if (!set->tools) return text_stream_take(&c->ts, len);
    size_t safe = choice_tool_streamable(set, c);
    *len = safe > c->ts.emitted ? safe - c->ts.emitted : 0;
    const char *piece = c->ts.text ? c->ts.text + c->ts.emitted : "";
    c->ts.emitted += *len;
    return piece;
}

/* The choice's logprobs for the tokens whose text starts before text_limit (NULL: none asked). */
json_t *choice_logprobs(const HttpGenerateContext *ctx, const ApiRequest *a, Choice *c, size_t text_limit) {
    if (a->logprobs < 0) return NULL;
    return api_logprobs_render(a->kind, &ctx->model->tokenizer, c->tokens, c->logprobs, c->progress.n_tokens, text_limit, &c->lp);
}

/* Whether the choice failed, with its error copied into error. */
bool choice_failed(const Choice *c, char *error, size_t cap, int *status) {
    pthread_mutex_lock(&c->r->mu);
    bool failed = c->r->finished && c->r->finish_reason == FINISH_ERROR && !c->ts.stopped;
    if (failed) snprintf(error, cap, "%s", c->r->error);
    if (failed) *status = c->r->error_status ? c->r->error_status : 500;
    pthread_mutex_unlock(&c->r->mu);
    return failed;
}

void choices_cancel_all(const HttpGenerateContext *ctx, ChoiceSet *set) {
    for (int i = 0; i < set->n; i++) coordinator_cancel(ctx->coord, set->c[i].r->id);
    for (int i = 0; i < set->n; i++) wait_finished(set->c[i].r);
}
