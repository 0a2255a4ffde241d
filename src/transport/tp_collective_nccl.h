/*
 * tp_collective_nccl.h — TpCollective over NCCL on device buffers (the CUDA backend's).
 *
 * Rank 0 of the TP group creates the NCCL unique id and broadcasts it over the group's MPI
 * communicator, so NCCL needs no launcher of its own. Reductions are enqueued on c->stream (the
 * CUDA backend sets it to its compute stream) and so stay ordered with the kernels around them,
 * including inside captured CUDA graphs. Built only with CUDA and NCCL (BRAID_HAVE_NCCL).
 */
#ifndef BRAID_TRANSPORT_TP_COLLECTIVE_NCCL_H
#define BRAID_TRANSPORT_TP_COLLECTIVE_NCCL_H

#include <mpi.h>

#include "transport/tp_collective.h"

int tp_collective_nccl_create(TpCollective *c, MPI_Comm comm, int cuda_device, BraidError *err);

#endif
