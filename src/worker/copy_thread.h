/*
 * copy_thread.h — one background thread that runs a job beside the caller (the CPU backend's
 * host<->device block copies during a forward, PBKV §4.3: prefetch off the critical path).
 *
 * Contract: one job in flight at a time; copy_thread_submit() first waits for the previous one.
 * copy_thread_wait() returns once no job is in flight: everything the job wrote is visible to
 * the caller after it (the mutex orders the memory). The job must not touch memory the caller
 * uses before its wait; that is the submitter's part (the backend only submits operations on
 * blocks no forward before the wait reads or writes).
 * Tests may hold the thread (copy_thread_hold): a submitted job then does not start until the hold
 * is released, which lets a test see that the caller went on without it.
 * Thread-safe between the owning thread and the copy thread only; one owning thread.
 */
#ifndef BRAID_WORKER_COPY_THREAD_H
#define BRAID_WORKER_COPY_THREAD_H

#include <pthread.h>
#include <stdbool.h>

#include "common/error.h"

typedef void (*CopyJob)(void *ctx);

typedef struct CopyThread {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    CopyJob job; /* in flight (submitted, not finished); NULL = idle */
    void *ctx;
    bool running_job, held, stop, started;
    unsigned long jobs_done;
} CopyThread;

int copy_thread_start(CopyThread *t, BraidError *err);
/* Runs job(ctx) on the thread (after the previous job finished). */
void copy_thread_submit(CopyThread *t, CopyJob job, void *ctx);
/* Blocks until no job is in flight. */
void copy_thread_wait(CopyThread *t);
/* Whether a job is in flight now (submitted and not finished). */
bool copy_thread_busy(CopyThread *t);
/* Tests: while held, a submitted job waits to start. */
void copy_thread_hold(CopyThread *t, bool held);
/* Waits for the job in flight, then ends the thread. Safe on a thread never started. */
void copy_thread_stop(CopyThread *t);

#endif
