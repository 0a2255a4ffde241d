#include "transport/tp_collective_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "transport/mpi_error.h"
#include "transport/tp_collective_staged.h"
#ifdef BRAID_HAVE_NCCL
#include "transport/tp_collective_nccl.h"
#endif

bool tp_gpus_shared(const char *ids, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strncmp(ids + (size_t)i * TP_GPU_ID_LEN, ids + (size_t)j * TP_GPU_ID_LEN, TP_GPU_ID_LEN) == 0) return true;
    return false;
}

static int my_gpu_id(int cuda_device, char *out, BraidError *err) {
    char host[64] = "", bus[64] = "";
    gethostname(host, sizeof host - 1);
    cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, cuda_device);
    if (e != cudaSuccess) return braid_error_set(err, "tp: PCI bus id of CUDA device %d: %s", cuda_device, cudaGetErrorString(e));
    snprintf(out, TP_GPU_ID_LEN, "%s/%s", host, bus);
    return 0;
}

int tp_collective_cuda_create(TpCollective *c, MPI_Comm comm, int cuda_device, BraidError *err) {
    int size = 0, rank = 0;
    if (mpi_check(MPI_Comm_size(comm, &size), "tp comm size", err) || mpi_check(MPI_Comm_rank(comm, &rank), "tp comm rank", err))
        return -1;
    char mine[TP_GPU_ID_LEN] = "";
    char *all = calloc((size_t)size, TP_GPU_ID_LEN);
    if (!all) return braid_error_set(err, "tp: out of memory");
    /* Every rank enters the gather even when its own id failed, so none is left waiting. */
    int id_rc = my_gpu_id(cuda_device, mine, err), all_ok = 0, ok = id_rc == 0;
    int rc = mpi_check(MPI_Allgather(mine, TP_GPU_ID_LEN, MPI_CHAR, all, TP_GPU_ID_LEN, MPI_CHAR, comm), "tp: gathering GPU ids", err);
    if (rc == 0) rc = mpi_check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm), "tp: agreeing on GPU ids", err);
    if (rc == 0 && !all_ok) rc = id_rc ? -1 : braid_error_set(err, "tp: another rank could not name its GPU");
    bool shared = rc == 0 && tp_gpus_shared(all, size);
    free(all);
    if (rc) return -1;
#ifdef BRAID_HAVE_NCCL
    if (!shared) {
        if (tp_collective_nccl_create(c, comm, cuda_device, err)) return -1;
        c->graph_capturable = 1;
        if (rank == 0) LOG_INFO("tp", "%d ranks on distinct GPUs: NCCL all-reduce", size);
        return 0;
    }
#endif
    if (rank == 0)
        LOG_INFO("tp", "%d ranks, %s: host-staged MPI all-reduce", size, shared ? "some sharing a GPU" : "no NCCL in this build");
    return tp_collective_staged_create(c, comm, err);
}
