/*
 * mpi_error.h — turns an MPI return code into a BraidError naming the operation.
 * The communicators Braid creates use MPI_ERRORS_RETURN, so failures come back here instead of
 * aborting the job.
 */
#ifndef BRAID_TRANSPORT_MPI_ERROR_H
#define BRAID_TRANSPORT_MPI_ERROR_H

#include "common/error.h"

/* 0 when rc is MPI_SUCCESS, else -1 with "mpi: <what>: <MPI's error string>". */
int mpi_check(int rc, const char *what, BraidError *err);

#endif
