/*
 * copy_thread.c — a background job runner with one job in flight (copy_thread.h).
 */
#include "worker/copy_thread.h"

#include <string.h>

static void *copy_thread_main(void *arg) {
    CopyThread *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && (!t->job || t->held)) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->job && t->stop) break;
        if (t->held) continue; /* stop requested while held: wait for the release */
        CopyJob job = t->job;
        void *ctx = t->ctx;
        t->running_job = true;
        pthread_mutex_unlock(&t->mu);
        job(ctx);
        pthread_mutex_lock(&t->mu);
        t->running_job = false;
        t->job = NULL;
        t->jobs_done++;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int copy_thread_start(CopyThread *t, BraidError *err) {
    memset(t, 0, sizeof *t);
    if (pthread_mutex_init(&t->mu, NULL)) return braid_error_set(err, "copy thread: mutex init failed");
    if (pthread_cond_init(&t->cv, NULL)) {
        pthread_mutex_destroy(&t->mu);
        return braid_error_set(err, "copy thread: condition init failed");
    }
    int rc = pthread_create(&t->thread, NULL, copy_thread_main, t);
    if (rc) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        return braid_error_set(err, "copy thread: pthread_create failed (%s)", strerror(rc));
    }
    t->started = true;
    return 0;
}

static void wait_locked(CopyThread *t) {
    while (t->job) pthread_cond_wait(&t->cv, &t->mu);
}

void copy_thread_submit(CopyThread *t, CopyJob job, void *ctx) {
    pthread_mutex_lock(&t->mu);
    wait_locked(t);
    t->job = job;
    t->ctx = ctx;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void copy_thread_wait(CopyThread *t) {
    if (!t->started) return;
    pthread_mutex_lock(&t->mu);
    wait_locked(t);
    pthread_mutex_unlock(&t->mu);
}

bool copy_thread_busy(CopyThread *t) {
    if (!t->started) return false;
    pthread_mutex_lock(&t->mu);
    bool busy = t->job != NULL;
    pthread_mutex_unlock(&t->mu);
    return busy;
}

void copy_thread_hold(CopyThread *t, bool held) {
    if (!t->started) return;
    pthread_mutex_lock(&t->mu);
    t->held = held;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void copy_thread_stop(CopyThread *t) {
    if (!t->started) return;
    pthread_mutex_lock(&t->mu);
    t->held = false;
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    t->started = false;
}
