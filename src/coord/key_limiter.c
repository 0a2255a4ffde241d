/* Per-key concurrency and rate limits; the contract is in key_limiter.h. */
#include "coord/key_limiter.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct {
    int inflight;
    double tokens;  /* rate bucket */
    double updated; /* when tokens was last refilled */
    bool started;   /* the bucket was filled once */
} KeyState;

struct KeyLimiter {
    pthread_mutex_t mu;
    KeyState *keys;
    int n;
};

KeyLimiter *key_limiter_create(int n_keys) {
    KeyLimiter *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->n = n_keys > 0 ? n_keys : 0;
    if (!(l->keys = calloc((size_t)(l->n > 0 ? l->n : 1), sizeof *l->keys))) {
        free(l);
        return NULL;
    }
    pthread_mutex_init(&l->mu, NULL);
    return l;
}

void key_limiter_destroy(KeyLimiter *l) {
    if (!l) return;
    pthread_mutex_destroy(&l->mu);
    free(l->keys);
    free(l);
}

KeyLimitResult key_limiter_acquire(KeyLimiter *l, int index, int max_concurrent, double rate, double now, double *retry_after_s) {
    *retry_after_s = 0;
    if (!l || index < 0 || index >= l->n) return KEY_LIMIT_OK;
    pthread_mutex_lock(&l->mu);
    KeyState *k = &l->keys[index];
    KeyLimitResult rc = KEY_LIMIT_OK;
    double burst = rate > 1 ? rate : 1;
    if (rate > 0) {
        if (!k->started) k->tokens = burst, k->updated = now, k->started = true;
        if (now > k->updated) {
            k->tokens += (now - k->updated) * rate;
            if (k->tokens > burst) k->tokens = burst;
            k->updated = now;
        }
    }
    if (max_concurrent > 0 && k->inflight >= max_concurrent) {
        rc = KEY_LIMIT_CONCURRENCY;
        *retry_after_s = 1;
    } else if (rate > 0 && k->tokens < 1) {
        rc = KEY_LIMIT_RATE;
        *retry_after_s = (1 - k->tokens) / rate;
    } else {
        if (rate > 0) k->tokens -= 1;
        k->inflight++;
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void key_limiter_release(KeyLimiter *l, int index) {
    if (!l || index < 0 || index >= l->n) return;
    pthread_mutex_lock(&l->mu);
    if (l->keys[index].inflight > 0) l->keys[index].inflight--;
    pthread_mutex_unlock(&l->mu);
}

int key_limiter_inflight(KeyLimiter *l, int index) {
    if (!l || index < 0 || index >= l->n) return 0;
    pthread_mutex_lock(&l->mu);
    int n = l->keys[index].inflight;
    pthread_mutex_unlock(&l->mu);
    return n;
}
