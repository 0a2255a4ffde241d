/* The server's own splice planning; the contract is in auto_splice.h. */
#include "coord/auto_splice.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

/* ---- diff ---- */

static uint64_t window_hash(const int32_t *t) { return XXH3_64bits(t, AUTO_SPLICE_ANCHOR * sizeof *t); }

/* C's anchor windows from `from` on, by hash: head[bucket] is the first position, next[i] the
 * following one with the same bucket, in increasing order. */
typedef struct {
    int *head, *next, mask, base;
} WindowIndex;

static int index_build(WindowIndex *x, const int32_t *c, int n_c, int from) {
    int n = n_c - AUTO_SPLICE_ANCHOR + 1 - from;
    memset(x, 0, sizeof *x);
    if (n <= 0) return 0;
    int size = 16;
    while (size < 2 * n) size *= 2;
    x->mask = size - 1;
    x->base = from;
    if (!(x->head = malloc((size_t)size * sizeof *x->head)) || !(x->next = malloc((size_t)n * sizeof *x->next))) return -1;
    for (int b = 0; b < size; b++) x->head[b] = -1;
    for (int i = n - 1; i >= 0; i--) { /* from the back, so chains come out in increasing order */
        int b = (int)(window_hash(c + from + i) & (uint64_t)x->mask);
        x->next[i] = x->head[b];
        x->head[b] = i;
    }
    return 0;
}

static void index_free(WindowIndex *x) {
    free(x->head);
    free(x->next);
}

/* The first position >= at_least of C where P's window at p occurs; -1 when none. */
static int index_find(const WindowIndex *x, const int32_t *c, const int32_t *p, int at_least) {
    if (!x->head) return -1;
    for (int i = x->head[window_hash(p) & (uint64_t)x->mask]; i >= 0; i = x->next[i]) {
        int pos = x->base + i;
        if (pos >= at_least && memcmp(c + pos, p, AUTO_SPLICE_ANCHOR * sizeof *p) == 0) return pos;
    }
    return -1;
}

int auto_splice_diff(const int32_t *c, int n_c, const int32_t *p, int n_p, AutoSpliceDiff *out) {
    memset(out, 0, sizeof *out);
    int a = 0;
    while (a < n_c && a < n_p && c[a] == p[a]) a++;
    out->prefix = out->covered = a;
    out->runs[out->n_runs++] = (CacheSpliceRun){.dst = 0, .src = 0, .len = a, .index = -1};
    if (a == n_c || a == n_p) return 0; /* P extends C, or is a prefix of it: no edit */
    WindowIndex x;
    if (index_build(&x, c, n_c, a)) return index_free(&x), -1;
    int src_end = a, dst_end = a; /* where the last run ended in C and in P */
    for (int j = a; j + AUTO_SPLICE_ANCHOR <= n_p && out->n_runs < AUTO_SPLICE_MAX_RUNS;) {
        int i = index_find(&x, c, p + j, src_end);
        if (i < 0) {
            j++;
            continue;
        }
        int lo = 0, hi = AUTO_SPLICE_ANCHOR;
        while (i - lo - 1 >= src_end && j - lo - 1 >= dst_end && c[i - lo - 1] == p[j - lo - 1]) lo++;
        while (i + hi < n_c && j + hi < n_p && c[i + hi] == p[j + hi]) hi++;
        out->runs[out->n_runs++] = (CacheSpliceRun){.dst = j - lo, .src = i - lo, .len = lo + hi, .index = 0};
        out->covered += lo + hi;
        src_end = i + hi;
        dst_end = j = j + hi;
    }
    index_free(&x);
    return 0;
}

int auto_splice_plan(const int32_t *c, int n_c, const AutoSpliceDiff *diff, int n_p, int mode, int index, CacheDirectives *out) {
    memset(out, 0, sizeof *out);
    if (diff->prefix >= n_c || diff->prefix >= n_p || diff->n_runs < 2 || diff->covered - diff->prefix < AUTO_SPLICE_MIN_REUSE) return 0;
    if (!(out->context = malloc((size_t)n_c * sizeof *out->context)) || !(out->runs = malloc((size_t)diff->n_runs * sizeof *out->runs))) {
        cache_directives_free(out);
        return -1;
    }
    memcpy(out->context, c, (size_t)n_c * sizeof *c);
    out->n_context = n_c;
    for (int k = 0; k < diff->n_runs; k++) {
        out->runs[k] = diff->runs[k];
        if (k > 0) out->runs[k].index = index;
    }
    out->n_runs = diff->n_runs;
    out->splice_mode = (uint8_t)mode;
    out->first_edit = diff->prefix;
    out->auto_splice = 1;
    return 1;
}

/* ---- the store ---- */

typedef struct {
    int32_t *ids;
    int n;
} Prompt;

typedef struct {
    char *key;
    Prompt recent[AUTO_SPLICE_RECENT]; /* newest first */
    uint64_t last_used;
} Conversation;

struct AutoSpliceStore {
    pthread_mutex_t mu;
    Conversation *conv;
    int n, cap, max_tokens;
    uint64_t tick;
};

AutoSpliceStore *auto_splice_store_create(int max_conversations, int max_tokens) {
    AutoSpliceStore *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cap = max_conversations > 0 ? max_conversations : 1;
    s->max_tokens = max_tokens;
    if (!(s->conv = calloc((size_t)s->cap, sizeof *s->conv))) return free(s), NULL;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

static void conversation_clear(Conversation *v) {
    free(v->key);
    for (int k = 0; k < AUTO_SPLICE_RECENT; k++) free(v->recent[k].ids);
    memset(v, 0, sizeof *v);
}

void auto_splice_store_free(AutoSpliceStore *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) conversation_clear(&s->conv[i]);
    free(s->conv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

char *auto_splice_key(const char *tenant, const char *adapter, const char *conversation_id, const char *workflow_id, bool *oom) {
    *oom = false;
    const char *name = conversation_id ? conversation_id : workflow_id;
    if (!name) return NULL;
    /* The unit separator cannot occur in a label (api_request_check_label refuses control bytes). */
    size_t n = strlen(tenant ? tenant : "") + strlen(adapter ? adapter : "") + strlen(name) + 8;
    char *key = malloc(n);
    if (!key) return *oom = true, NULL;
    snprintf(key, n, "%s\x1f%s\x1f%c:%s", tenant ? tenant : "", adapter ? adapter : "", conversation_id ? 'c' : 'w', name);
    return key;
}

/* The key's conversation, made (the least recently used one giving way when full); NULL when out of memory. */
static Conversation *conversation_of(AutoSpliceStore *s, const char *key) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->conv[i].key, key) == 0) return &s->conv[i];
    Conversation *v = &s->conv[s->n < s->cap ? s->n : 0];
    if (s->n == s->cap) {
        for (int i = 1; i < s->n; i++)
            if (s->conv[i].last_used < v->last_used) v = &s->conv[i];
        conversation_clear(v);
    } else {
        s->n++;
    }
    if (!(v->key = strdup(key))) {
        *v = s->conv[--s->n]; /* give the slot back: the last one moves into it */
        memset(&s->conv[s->n], 0, sizeof s->conv[s->n]);
        return NULL;
    }
    return v;
}

static int remember(Conversation *v, const int32_t *p, int n_p) {
    int32_t *copy = malloc((size_t)(n_p > 0 ? n_p : 1) * sizeof *copy);
    if (!copy) return -1;
    memcpy(copy, p, (size_t)n_p * sizeof *p);
    free(v->recent[AUTO_SPLICE_RECENT - 1].ids);
    memmove(v->recent + 1, v->recent, (AUTO_SPLICE_RECENT - 1) * sizeof *v->recent);
    v->recent[0] = (Prompt){copy, n_p};
    return 0;
}

int auto_splice_apply(AutoSpliceStore *s, const char *key, const int32_t *p, int n_p, int mode, int index, CacheDirectives *out) {
    memset(out, 0, sizeof *out);
    AutoSpliceDiff *diff = malloc(sizeof *diff), *best = malloc(sizeof *best);
    int rc = diff && best ? 0 : -1;
    pthread_mutex_lock(&s->mu);
    Conversation *v = rc == 0 ? conversation_of(s, key) : NULL;
    if (!v) rc = -1;
    const Prompt *from = NULL;
    for (int k = 0; rc == 0 && k < AUTO_SPLICE_RECENT && v->recent[k].ids; k++) {
        const Prompt *c = &v->recent[k];
        if (auto_splice_diff(c->ids, c->n, p, n_p, diff) < 0) rc = -1;
        else if (!from || diff->covered > best->covered) {
            AutoSpliceDiff *t = best;
            best = diff, diff = t, from = c;
        }
    }
    if (rc == 0 && from) rc = auto_splice_plan(from->ids, from->n, best, n_p, mode, index, out);
    if (rc >= 0 && v) {
        v->last_used = ++s->tick;
        if (n_p <= s->max_tokens && remember(v, p, n_p)) {
            cache_directives_free(out);
            rc = -1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(diff);
    free(best);
    return rc;
}

int auto_splice_request(AutoSpliceStore *s, const char *tenant, const char *adapter, const char *conversation_id,
                        const char *workflow_id, const int32_t *p, int n_p, int mode, int index, CacheDirectives *out) {
    bool oom;
    char *key = auto_splice_key(tenant, adapter, conversation_id, workflow_id, &oom);
    if (!key) return oom ? -1 : 0;
    CacheDirectives found;
    int rc = auto_splice_apply(s, key, p, n_p, mode, index, &found);
    free(key);
    if (rc != 1) return rc;
    out->splice_mode = found.splice_mode;
    out->first_edit = found.first_edit;
    out->context = found.context, out->n_context = found.n_context;
    out->runs = found.runs, out->n_runs = found.n_runs;
    out->auto_splice = 1;
    return 1;
}
