/*
 * tp_collective_staged.h — TpCollective over device buffers through host memory: the CUDA backend's
 * all-reduce when ranks of one instance share a GPU (NCCL refuses two ranks on one device).
 *
 * Each reduction waits for c->stream (the CUDA backend's compute stream), copies the device buffer
 * into a pinned host buffer, sums it across the group with MPI_Allreduce, and copies the result
 * back on c->stream. The host waits in the middle, so the reduction cannot be captured in a CUDA
 * graph (graph_capturable stays 0). Slower than NCCL by two PCIe copies per reduction; its purpose
 * is that T > 1 runs on one GPU. Built only with CUDA. Not thread-safe.
 */
#ifndef BRAID_TRANSPORT_TP_COLLECTIVE_STAGED_H
#define BRAID_TRANSPORT_TP_COLLECTIVE_STAGED_H

#include <mpi.h>

#include "transport/tp_collective.h"

int tp_collective_staged_create(TpCollective *c, MPI_Comm comm, BraidError *err);

#endif
