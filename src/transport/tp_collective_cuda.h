/*
 * tp_collective_cuda.h — the CUDA backend's TP collective, chosen by where the ranks' GPUs are.
 *
 * Collective over the instance's TP communicator: every rank names its GPU (host name + PCI bus
 * id of cuda_device); when all are distinct and this build has NCCL, the group reduces through
 * NCCL (tp_collective_nccl.h); when any two ranks share a GPU (one lent H100 running T = 2), or
 * NCCL is not built, through host-staged MPI (tp_collective_staged.h). Every rank reaches the same
 * choice. Built only with CUDA.
 */
#ifndef BRAID_TRANSPORT_TP_COLLECTIVE_CUDA_H
#define BRAID_TRANSPORT_TP_COLLECTIVE_CUDA_H

#include <mpi.h>
#include <stdbool.h>

#include "transport/tp_collective.h"

/* Where a rank's GPU is: "host/pci-bus-id". */
#define TP_GPU_ID_LEN 192

/* True when two of the n ids (each TP_GPU_ID_LEN bytes, NUL-terminated) are the same GPU. */
bool tp_gpus_shared(const char *ids, int n);
int tp_collective_cuda_create(TpCollective *c, MPI_Comm comm, int cuda_device, BraidError *err);

#endif
