/*
 * backend_cuda_stub.c — stands in for the CUDA backend in builds without it (BRAID_CUDA=OFF or no
 * nvcc), so --device cuda fails with a message instead of a link error.
 */
#include "worker/backend.h"

bool backend_cuda_available(void) { return false; }

int backend_cuda_create(Backend *b, BraidError *err) {
    (void)b;
    return braid_error_set(err, "this build of braid has no CUDA backend (configure with -DBRAID_CUDA=ON; needs nvcc)");
}
