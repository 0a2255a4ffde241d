#include "transport/tp_collective_mpi.h"

#include <stdint.h>
#include <stdlib.h>

#include "transport/mpi_error.h"

typedef struct {
    MPI_Comm comm;
} MpiCollective;

static int mpi_allreduce_sum(TpCollective *c, float *buf, size_t n, BraidError *err) {
    MpiCollective *m = c->impl;
    /* MPI counts are ints; the activations of one step are far below 2^31 floats, but say so if not. */
    if (n > (size_t)INT32_MAX) return braid_error_set(err, "tp: all-reduce of %zu floats exceeds MPI's count limit", n);
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, m->comm);
    return mpi_check(rc, "tp all-reduce", err);
}

static void mpi_destroy(TpCollective *c) {
    free(c->impl);
    c->impl = NULL;
}

static const TpCollectiveOps mpi_ops = {.name = "mpi", .allreduce_sum_f32 = mpi_allreduce_sum, .destroy = mpi_destroy};

int tp_collective_mpi_create(TpCollective *c, MPI_Comm comm, BraidError *err) {
    MpiCollective *m = calloc(1, sizeof *m);
    if (!m) return braid_error_set(err, "tp: out of memory");
    m->comm = comm;
    *c = (TpCollective){.ops = &mpi_ops, .impl = m};
    if (mpi_check(MPI_Comm_rank(comm, &c->rank), "tp comm rank", err) || mpi_check(MPI_Comm_size(comm, &c->size), "tp comm size", err)) {
        free(m);
        return -1;
    }
    return 0;
}
