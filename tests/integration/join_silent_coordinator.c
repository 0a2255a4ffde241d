/*
 * join_silent_coordinator.c — a stand-in coordinator for test_join_silent_coordinator.sh: it takes a
 * joiner's connection and its hello, and never answers the join.
 *
 *   mpirun -n 1 --ompi-server file:URI join_silent_coordinator SERVICE
 *
 * It opens an MPI port, publishes it under SERVICE in the name service (as braid serve --join-slots
 * does, coord/instance_join.c), prints "listening" once published, then, for every joiner that
 * connects, reads its instance number (JOIN_TAG_HELLO) and prints "hello from instance N" — and
 * never sends a verdict (JOIN_TAG_VERDICT); it runs until it is killed. A real coordinator cannot be made to stall there
 * (its verdict is sent on its MPI thread right after the accept thread queues the hello), so the test
 * uses this; the joiner under test is the real braid serve --join-instance. Exit 1 when MPI fails.
 */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

#include "coord/instance_join.h"

static int fail(const char *what, int rc) {
    fprintf(stderr, "join_silent_coordinator: %s failed (MPI error %d)\n", what, rc);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: join_silent_coordinator SERVICE\n");
        return 2;
    }
    int rc = MPI_Init(&argc, &argv);
    if (rc != MPI_SUCCESS) return fail("MPI_Init", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    char port[MPI_MAX_PORT_NAME];
    if ((rc = MPI_Open_port(MPI_INFO_NULL, port)) != MPI_SUCCESS) return fail("MPI_Open_port", rc);
    if ((rc = MPI_Publish_name(argv[1], MPI_INFO_NULL, port)) != MPI_SUCCESS) return fail("MPI_Publish_name", rc);
    printf("listening\n");
    fflush(stdout);
    for (;;) { /* each joiner's intercommunicator is kept (never freed): silence, not a disconnect */
        MPI_Comm inter = MPI_COMM_NULL;
        if ((rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter)) != MPI_SUCCESS) {
            fprintf(stderr, "join_silent_coordinator: MPI_Comm_accept failed (MPI error %d); accepting again\n", rc);
            sleep(1); /* Open MPI 4.1 ends an accept nobody connects to after about a minute */
            continue;
        }
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
        int instance = -1;
        if ((rc = MPI_Recv(&instance, 1, MPI_INT, 0, JOIN_TAG_HELLO, inter, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return fail("MPI_Recv (hello)", rc);
        printf("hello from instance %d\n", instance);
        fflush(stdout);
    }
}
