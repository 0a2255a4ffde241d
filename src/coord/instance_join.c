#include "coord/instance_join.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "transport/mpi_error.h"

#define JOIN_QUEUE_MAX 16
#define JOIN_IDLE_ACCEPT_S 20.0
#define JOIN_LOOKUP_RETRY_S 30.0

typedef struct {
    int instance;
    MPI_Comm inter;
} JoinArrival;

struct JoinAcceptor {
    char port[MPI_MAX_PORT_NAME];
    char service[256];
    pthread_t thread;
    pthread_mutex_t mu;
    JoinArrival queue[JOIN_QUEUE_MAX]; /* under mu */
    int n_queued;                       /* under mu */
};

/* One joiner: accepted, its instance number read. The read blocks this thread only. */
static bool accept_one(JoinAcceptor *j, JoinArrival *out) {
    MPI_Comm inter = MPI_COMM_NULL;
    double t0 = braid_now_seconds();
    int rc = MPI_Comm_accept(j->port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
    if (rc != MPI_SUCCESS) {
        /* Open MPI 4.1 ends an accept that nobody connects to after about a minute (a PMIx lookup
         * times out): expected while no node is coming back, so only a quick failure is reported. */
        if (braid_now_seconds() - t0 < JOIN_IDLE_ACCEPT_S) {
            LOG_WARN("join", "MPI_Comm_accept failed (MPI error %d); accepting again in 1 s", rc);
            sleep(1);
        }
        return false;
    }
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    int instance = -1;
    if (MPI_Recv(&instance, 1, MPI_INT, 0, JOIN_TAG_HELLO, inter, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        LOG_WARN("join", "a joiner connected but did not name its instance; ignored");
        return false;
    }
    out->instance = instance;
    out->inter = inter;
    return true;
}

static void *accept_loop(void *arg) {
    JoinAcceptor *j = arg;
    for (;;) {
        JoinArrival a;
        if (!accept_one(j, &a)) continue;
        pthread_mutex_lock(&j->mu);
        bool room = j->n_queued < JOIN_QUEUE_MAX;
        if (room) j->queue[j->n_queued++] = a;
        pthread_mutex_unlock(&j->mu);
        if (!room) LOG_WARN("join", "instance %d: too many joiners waiting; this one gets no answer", a.instance);
    }
    return NULL;
}

JoinAcceptor *join_acceptor_start(const char *service, BraidError *err) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        braid_error_set(err, "joining instances need MPI_THREAD_MULTIPLE (this MPI gave level %d)", level);
        return NULL;
    }
    /* Accept errors are raised on MPI_COMM_SELF: they must come back to the accept loop, not abort. */
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    JoinAcceptor *j = calloc(1, sizeof *j);
    if (!j) {
        braid_error_set(err, "join: out of memory");
        return NULL;
    }
    snprintf(j->service, sizeof j->service, "%s", service);
    if (mpi_check(MPI_Open_port(MPI_INFO_NULL, j->port), "opening a port for joiners", err)) {
        free(j);
        return NULL;
    }
    /* A name left by an earlier coordinator that died would make the publish fail: replace it. */
    char old[MPI_MAX_PORT_NAME];
    if (MPI_Lookup_name(j->service, MPI_INFO_NULL, old) == MPI_SUCCESS) MPI_Unpublish_name(j->service, MPI_INFO_NULL, old);
    if (mpi_check(MPI_Publish_name(j->service, MPI_INFO_NULL, j->port), "publishing the join port (is mpirun given --ompi-server?)", err)) {
        MPI_Close_port(j->port);
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    if (pthread_create(&j->thread, NULL, accept_loop, j) != 0) {
        MPI_Unpublish_name(j->service, MPI_INFO_NULL, j->port);
        MPI_Close_port(j->port);
        pthread_mutex_destroy(&j->mu);
        free(j);
        braid_error_set(err, "join: cannot start the accept thread");
        return NULL;
    }
    pthread_detach(j->thread);
    LOG_INFO("join", "instances may join as '%s' (port %s)", j->service, j->port);
    return j;
}

bool join_acceptor_take(JoinAcceptor *j, int *instance, MPI_Comm *inter) {
    if (!j) return false;
    pthread_mutex_lock(&j->mu);
    bool got = j->n_queued > 0;
    if (got) {
        *instance = j->queue[0].instance;
        *inter = j->queue[0].inter;
        memmove(j->queue, j->queue + 1, (size_t)(j->n_queued - 1) * sizeof j->queue[0]);
        j->n_queued--;
    }
    pthread_mutex_unlock(&j->mu);
    return got;
}

int join_verdict(MPI_Comm inter, bool taken, BraidError *err) {
    static const int answers[2] = {0, 1}; /* the send buffer must outlive the non-blocking send */
    MPI_Request req;
    /* Non-blocking: a joiner that died after its hello must not hold the MPI thread. */
    if (mpi_check(MPI_Isend(&answers[taken ? 1 : 0], 1, MPI_INT, 0, JOIN_TAG_VERDICT, inter, &req), "answering a joiner", err)) return -1;
    return mpi_check(MPI_Request_free(&req), "answering a joiner", err);
}

void join_acceptor_stop(JoinAcceptor *j) {
    if (!j) return;
    MPI_Unpublish_name(j->service, MPI_INFO_NULL, j->port);
}

/* The verdict, polled so a coordinator that died after the connect cannot hold the joiner forever. */
static int await_verdict(MPI_Comm inter, double timeout_s, int *verdict, BraidError *err) {
    MPI_Request req;
    if (mpi_check(MPI_Irecv(verdict, 1, MPI_INT, 0, JOIN_TAG_VERDICT, inter, &req), "waiting for the coordinator's answer", err)) return -1;
    double deadline = braid_now_seconds() + timeout_s;
    for (;;) {
        int done = 0;
        if (mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "waiting for the coordinator's answer", err)) return -1;
        if (done) return 0;
        if (braid_now_seconds() > deadline) {
            MPI_Cancel(&req);
            MPI_Request_free(&req);
            return braid_error_set(err, "connected, but the coordinator did not answer the join within %g s (--coordinator-timeout): "
                                        "is it gone or stalled?", timeout_s);
        }
        struct timespec nap = {0, 10 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* The coordinator's port from the name service. A name not there yet (a joiner started before the
 * coordinator published it, or a data server slow to answer on a loaded machine) is looked up again
 * every 0.5 s for up to JOIN_LOOKUP_RETRY_S. */
static int lookup_port(const char *service, char port[MPI_MAX_PORT_NAME], BraidError *err) {
    double deadline = braid_now_seconds() + JOIN_LOOKUP_RETRY_S;
    for (;;) {
        int rc = MPI_Lookup_name(service, MPI_INFO_NULL, port), cls = 0;
        if (rc == MPI_SUCCESS) return 0;
        MPI_Error_class(rc, &cls);
        if (cls != MPI_ERR_NAME || braid_now_seconds() > deadline)
            return mpi_check(rc, "looking up the coordinator (is mpirun given --ompi-server, and does the coordinator run?)", err);
        struct timespec nap = {0, 500 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

int join_connect(const char *service, int instance, double timeout_s, MPI_Comm *inter, BraidError *err) {
    char port[MPI_MAX_PORT_NAME];
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    if (lookup_port(service, port, err)) return braid_error_wrap(err, "join '%s'", service);
    if (mpi_check(MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, inter), "connecting to the coordinator", err))
        return braid_error_wrap(err, "join '%s'", service);
    MPI_Comm_set_errhandler(*inter, MPI_ERRORS_RETURN);
    int verdict = 0;
    if (mpi_check(MPI_Send(&instance, 1, MPI_INT, 0, JOIN_TAG_HELLO, *inter), "naming the instance to join", err) ||
        await_verdict(*inter, timeout_s > 0 ? timeout_s : JOIN_VERDICT_DEFAULT_S, &verdict, err))
        return braid_error_wrap(err, "join '%s'", service);
    if (!verdict)
        return braid_error_set(err, "the coordinator refused instance %d (not a join slot, or that instance is alive or starting)", instance);
    return 0;
}
