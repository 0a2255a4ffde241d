#include "transport/tp_collective_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

#include "transport/mpi_error.h"

typedef struct {
    ncclComm_t comm;
} NcclCollective;

static int nccl_check(ncclResult_t rc, const char *what, BraidError *err) {
    if (rc == ncclSuccess) return 0;
    return braid_error_set(err, "nccl: %s: %s", what, ncclGetErrorString(rc));
}

static int nccl_allreduce_sum(TpCollective *c, float *buf, size_t n, BraidError *err) {
    NcclCollective *m = c->impl;
    return nccl_check(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, m->comm, (cudaStream_t)c->stream), "all-reduce", err);
}

static void nccl_destroy(TpCollective *c) {
    NcclCollective *m = c->impl;
    if (m) ncclCommDestroy(m->comm);
    free(m);
    c->impl = NULL;
}

static const TpCollectiveOps nccl_ops = {.name = "nccl", .allreduce_sum_f32 = nccl_allreduce_sum, .destroy = nccl_destroy};

int tp_collective_nccl_create(TpCollective *c, MPI_Comm comm, int cuda_device, BraidError *err) {
    int rank, size;
    if (mpi_check(MPI_Comm_rank(comm, &rank), "tp comm rank", err) || mpi_check(MPI_Comm_size(comm, &size), "tp comm size", err))
        return -1;
    ncclUniqueId id;
    if (rank == 0 && nccl_check(ncclGetUniqueId(&id), "unique id", err)) return -1;
    if (mpi_check(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm), "broadcast of the NCCL id", err)) return -1;
    cudaError_t ce = cudaSetDevice(cuda_device);
    if (ce != cudaSuccess) return braid_error_set(err, "nccl: cudaSetDevice(%d): %s", cuda_device, cudaGetErrorString(ce));
    NcclCollective *m = calloc(1, sizeof *m);
    if (!m) return braid_error_set(err, "nccl: out of memory");
    if (nccl_check(ncclCommInitRank(&m->comm, size, id, rank), "communicator init", err)) {
        free(m);
        return -1;
    }
    *c = (TpCollective){.ops = &nccl_ops, .rank = rank, .size = size, .impl = m};
    return 0;
}
