#include "coord/coord_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "common/timeutil.h"
#include "transport/control_msg.h"

CoordRequest *coord_request_create(void) {
    CoordRequest *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->instance = -1;
    r->pin_instance = -1;
    r->pull_source = -1;
    return r;
}

void coord_request_retain(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

void coord_request_release(CoordRequest *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free(r->grammar);
    free(r->hidden);
    free(r->block_hashes);
    free(r->workflow);
    free(r->workflow_key);
    free(r->agent);
    free(r->tenant);
    free(r->cache_key);
    free(r->adapter);
    free(r->tokens);
    free(r->logprobs);
    free(r->directive_outcomes);
    cache_directives_free(&r->directives);
    free(r);
}

int coord_request_push_token(CoordRequest *r, int32_t token, const TokenLogprob *logprob, double now) {
    pthread_mutex_lock(&r->mu);
    int rc = braid_grow((void **)&r->tokens, &r->cap_tokens, r->n_tokens + 1, sizeof *r->tokens);
    if (rc == 0 && r->want_logprobs) {
        rc = braid_grow((void **)&r->logprobs, &r->cap_logprobs, r->n_tokens + 1, sizeof *r->logprobs);
        if (rc == 0) r->logprobs[r->n_tokens] = logprob ? *logprob : (TokenLogprob){0};
    }
    if (rc == 0) {
        if (r->n_tokens == 0) r->t_first_token = now;
        r->tokens[r->n_tokens++] = token;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void coord_request_restart(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    r->n_tokens = 0;
    r->t_first_token = 0;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void coord_request_finish(CoordRequest *r, int reason, const CoordUsage *u, const char *error) {
    double now = braid_now_seconds();
    pthread_mutex_lock(&r->mu);
    /* A request whose first sampled token ended it (EOS) streams no token: the finish is the first
     * token's arrival, and without it the request would be missing from the TTFT histogram. */
    if (r->t_first_token <= 0 && (reason == FINISH_STOP || reason == FINISH_LENGTH)) r->t_first_token = now;
    r->finished = true;
    r->finish_reason = reason;
    r->prompt_tokens = u->prompt_tokens;
    r->cached_tokens = u->cached_tokens;
    r->cached_tokens_host = u->cached_tokens_host;
    r->cached_tokens_remote = u->cached_tokens_remote;
    r->reused_tokens = u->reused_tokens;
    r->completion_tokens = u->completion_tokens;
    r->preemptions = u->preemptions;
    free(r->directive_outcomes);
    r->directive_outcomes = u->directive_outcomes && u->directive_outcomes[0] ? strdup(u->directive_outcomes) : NULL;
    snprintf(r->error, sizeof r->error, "%s", error ? error : "");
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
