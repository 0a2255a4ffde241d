/*
 * tp_collective.h — the collectives tensor parallelism needs, behind one interface.
 *
 * The forward pass of a TP rank calls tp_allreduce_sum() after its row-parallel projections (O
 * and down) so every rank ends with the full sum. Two implementations share this vtable:
 * MPI_Allreduce over the instance's communicator for the CPU backend (tp_collective_mpi.h); for
 * the CUDA backend, over device buffers, NCCL when the ranks have distinct GPUs
 * (tp_collective_nccl.h) or a host-staged MPI_Allreduce when some share one, which NCCL refuses
 * (tp_collective_staged.h); tp_collective_cuda.h picks.
 * Callers never see MPI or NCCL types, so the kernels and the worker build without either.
 * A collective is entered by every rank of the group in the same order; not thread-safe.
 */
#ifndef BRAID_TRANSPORT_TP_COLLECTIVE_H
#define BRAID_TRANSPORT_TP_COLLECTIVE_H

#include <stddef.h>

#include "common/error.h"

typedef struct TpCollective TpCollective;

typedef struct {
    const char *name;
    /* In-place sum of n fp32 values across the group; buf is host memory (MPI) or device memory (NCCL). */
    int (*allreduce_sum_f32)(TpCollective *c, float *buf, size_t n, BraidError *err);
    void (*destroy)(TpCollective *c);
} TpCollectiveOps;

struct TpCollective {
    const TpCollectiveOps *ops;
    int rank, size;
    void *stream; /* NCCL / host-staged: the cudaStream_t the reduction is ordered on (set by the CUDA backend) */
    int graph_capturable; /* nonzero: the reduction may be captured in a CUDA graph (NCCL); the host-staged
                             one waits on the host, so a CUDA backend using it launches steps directly */
    void *impl;
};

static inline int tp_allreduce_sum_f32(TpCollective *c, float *buf, size_t n, BraidError *err) {
    return c->ops->allreduce_sum_f32(c, buf, n, err);
}

static inline void tp_collective_destroy(TpCollective *c) {
    if (c && c->ops) c->ops->destroy(c);
}

#endif
