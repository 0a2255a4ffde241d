/* Prefilling prompt heads through the request path (contract in warm_heads.h). */
#include "coord/warm_heads.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coord/adapter_select.h"
#include "coord/http/http_choices.h"

/* The completion body of one head; malloc'd JSON text or NULL when out of memory. */
static char *head_body(const ManifestHead *h, const char *pin_ttl) {
    json_t *ids = json_array();
    for (int i = 0; ids && i < h->n_tokens; i++)
        if (json_array_append_new(ids, json_integer(h->tokens[i]))) json_decref(ids), ids = NULL;
    json_t *o = ids ? json_pack("{s:o, s:i, s:i}", "prompt", ids, "max_tokens", 1, "temperature", 0) : NULL;
    if (o && h->tenant && json_object_set_new(o, "tenant", json_string(h->tenant))) json_decref(o), o = NULL;
    if (o && h->adapter && json_object_set_new(o, "adapter", json_string(h->adapter))) json_decref(o), o = NULL;
    if (o && pin_ttl && json_object_set_new(o, "directives", json_pack("[{s:s, s:s}]", "op", "pin", "ttl", pin_ttl)))
        json_decref(o), o = NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

static void wait_finished(CoordRequest *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->finished) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* Prefills one head through the request path; 0, or -1 with why saying what refused it. */
static int warm_head(const WarmHeadsJob *job, const ManifestHead *h, WarmTotals *t, char *why, size_t cap) {
    const HttpGenerateContext *ctx = job->generate;
    char *body = head_body(h, job->pin_ttl);
    if (!body) return snprintf(why, cap, "out of memory"), -1;
    ApiRequest a;
    ApiError e = {0};
    ChoiceSet set = {0};
    int rc = api_request_parse(body, strlen(body), API_COMPLETION, NULL, &a, &e);
    free(body);
    if (rc) return snprintf(why, cap, "%s", e.message), -1;
    rc = adapter_select(&a, ctx->served_model, ctx->lora, &e);
    if (rc == 0) rc = choices_build(ctx, &a, &set, &e);
    if (rc == 0) set.c[0].r->pin_instance = job->pin_instance; /* max_tokens 1, n 1: one choice */
    if (rc == 0) rc = choices_submit(ctx, &set, &e);
    if (rc) snprintf(why, cap, "%d %s", e.status, e.message);
    if (rc == 0) {
        CoordRequest *r = set.c[0].r;
        wait_finished(r);
        pthread_mutex_lock(&r->mu);
        if (r->error[0]) rc = -1, snprintf(why, cap, "%s", r->error);
        else t->prompt_tokens += r->prompt_tokens, t->cached_tokens += r->cached_tokens;
        pthread_mutex_unlock(&r->mu);
    }
    choices_free(ctx, &set, rc != 0);
    api_request_free(&a);
    return rc;
}

static bool progress_due(int done, int total) { return total <= 20 || done == total || done % (total / 10) == 0; }

static bool may_continue(const WarmHeadsJob *job) {
    return !(job->stop && atomic_load(job->stop)) && (!job->keep_going || job->keep_going(job->keep_going_ctx));
}

WarmTotals warm_heads_send(const WarmHeadsJob *job, const ManifestHeads *m) {
    WarmTotals t = {0};
    long long sent_tokens = 0;
    char why[400];
    int i = 0, total = job->max_heads > 0 && job->max_heads < m->n_heads ? job->max_heads : m->n_heads; /* what progress counts to */
    for (; i < m->n_heads && may_continue(job); i++) {
        const ManifestHead *h = &m->heads[i];
        if ((job->max_heads > 0 && i >= job->max_heads) || (job->max_tokens > 0 && sent_tokens + h->n_tokens > job->max_tokens)) break;
        sent_tokens += h->n_tokens;
        if (warm_head(job, h, &t, why, sizeof why) == 0) t.warmed++;
        else {
            t.refused++;
            LOG_WARN("warm-start", "%s: head %d (%d tokens, tenant '%s') not warmed: %s", job->label, i + 1, h->n_tokens,
                     h->tenant ? h->tenant : "", why);
        }
        if (progress_due(i + 1, total))
            LOG_INFO("warm-start", "%s: %d/%d heads, %d skipped, %d refused, %lld prompt tokens sent", job->label, i + 1, total,
                     m->skipped, t.refused, sent_tokens);
    }
    t.left = m->n_heads - i;
    return t;
}
