/*
 * key_limiter.h — per-key request limits from the API key file (auth.h: max_concurrent=, rate=):
 * a key past its own limit gets 429 with Retry-After; other keys are never affected.
 *
 * max_concurrent: requests of the key in flight at once (accepted, answer not completely sent).
 * rate: a token bucket per key, refilled at `rate` requests per second and holding at most
 * max(1, rate) (one second's worth, at least one request), full at start; each request takes one.
 * A refused request takes nothing. Retry-After: for the rate, when the next token is due; for
 * concurrency, 1 s (a slot frees when one of the key's answers ends, which cannot be foreseen).
 *
 * Callers: the HTTP threads (http_api.c) acquire before serving a completion and release when its
 * answer has been sent (or the client left). Times come from the caller. Thread-safe (one mutex).
 * Owns its arrays; indexed by auth_key_index.
 */
#ifndef BRAID_COORD_KEY_LIMITER_H
#define BRAID_COORD_KEY_LIMITER_H

typedef struct KeyLimiter KeyLimiter;

typedef enum { KEY_LIMIT_OK = 0, KEY_LIMIT_CONCURRENCY, KEY_LIMIT_RATE } KeyLimitResult;

/* n_keys: the key file's keys. NULL when out of memory. */
KeyLimiter *key_limiter_create(int n_keys);
void key_limiter_destroy(KeyLimiter *l);

/* Takes a slot (and a rate token) for a request of key `index` with these limits (0 = none).
 * KEY_LIMIT_OK: taken, release it later. Otherwise nothing is taken and *retry_after_s says when
 * to come back. An index out of range is never limited (nothing taken; releasing it is a no-op). */
KeyLimitResult key_limiter_acquire(KeyLimiter *l, int index, int max_concurrent, double rate, double now, double *retry_after_s);
void key_limiter_release(KeyLimiter *l, int index);
/* Requests of key `index` in flight now (for tests and logs). */
int key_limiter_inflight(KeyLimiter *l, int index);

#endif
