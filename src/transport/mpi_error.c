#include "transport/mpi_error.h"

#include <mpi.h>

int mpi_check(int rc, const char *what, BraidError *err) {
    if (rc == MPI_SUCCESS) return 0;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
    text[len] = '\0';
    return braid_error_set(err, "mpi: %s: %s", what, len ? text : "unknown error");
}
