#include "transport/tp_collective_staged.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "transport/mpi_error.h"

typedef struct {
    MPI_Comm comm;
    float *host; /* pinned, grown to the largest reduction seen */
    size_t cap;
} StagedCollective;

static int cuda_check(cudaError_t e, const char *what, BraidError *err) {
    return e == cudaSuccess ? 0 : braid_error_set(err, "tp (host-staged): %s: %s", what, cudaGetErrorString(e));
}

static int reserve(StagedCollective *m, size_t n, BraidError *err) {
    if (n <= m->cap) return 0;
    if (m->host) cudaFreeHost(m->host);
    m->host = NULL;
    m->cap = 0;
    if (cuda_check(cudaMallocHost((void **)&m->host, n * sizeof *m->host), "pinned buffer", err)) return -1;
    m->cap = n;
    return 0;
}

static int staged_allreduce_sum(TpCollective *c, float *buf, size_t n, BraidError *err) {
    StagedCollective *m = c->impl;
    cudaStream_t stream = (cudaStream_t)c->stream;
    if (n > (size_t)INT32_MAX) return braid_error_set(err, "tp: all-reduce of %zu floats exceeds MPI's count limit", n);
    if (reserve(m, n, err)) return -1;
    /* The partial sums are ready once the stream has drained up to here; the previous reduction's
     * copy back from the host buffer has too, so the buffer is free. */
    if (cuda_check(cudaMemcpyAsync(m->host, buf, n * sizeof *buf, cudaMemcpyDeviceToHost, stream), "copy to host", err) ||
        cuda_check(cudaStreamSynchronize(stream), "waiting for the partial sums", err))
        return -1;
    if (mpi_check(MPI_Allreduce(MPI_IN_PLACE, m->host, (int)n, MPI_FLOAT, MPI_SUM, m->comm), "tp all-reduce", err)) return -1;
    return cuda_check(cudaMemcpyAsync(buf, m->host, n * sizeof *buf, cudaMemcpyHostToDevice, stream), "copy back", err);
}

static void staged_destroy(TpCollective *c) {
    StagedCollective *m = c->impl;
    if (m && m->host) cudaFreeHost(m->host);
    free(m);
    c->impl = NULL;
}

static const TpCollectiveOps staged_ops = {.name = "host-staged", .allreduce_sum_f32 = staged_allreduce_sum, .destroy = staged_destroy};

int tp_collective_staged_create(TpCollective *c, MPI_Comm comm, BraidError *err) {
    StagedCollective *m = calloc(1, sizeof *m);
    if (!m) return braid_error_set(err, "tp: out of memory");
    m->comm = comm;
    *c = (TpCollective){.ops = &staged_ops, .impl = m};
    if (mpi_check(MPI_Comm_rank(comm, &c->rank), "tp comm rank", err) || mpi_check(MPI_Comm_size(comm, &c->size), "tp comm size", err)) {
        free(m);
        c->impl = NULL;
        return -1;
    }
    return 0;
}
