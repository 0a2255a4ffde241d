/*
 * tp_collective_mpi.h — TpCollective over MPI_Allreduce on host buffers (the CPU backend's).
 * Borrows the communicator (one instance's TP group), which must outlive the collective.
 */
#ifndef BRAID_TRANSPORT_TP_COLLECTIVE_MPI_H
#define BRAID_TRANSPORT_TP_COLLECTIVE_MPI_H

#include <mpi.h>

#include "transport/tp_collective.h"

int tp_collective_mpi_create(TpCollective *c, MPI_Comm comm, BraidError *err);

#endif
