/*
 * rank_binding.h — binds each worker rank of `braid serve` to its own set of cores (and the NUMA
 * node(s) under them) with hwloc, so ranks sharing a machine do not fight over cores and their
 * memory stays local.
 *
 * Owns: the partition of a machine's cores among the worker ranks placed on it, the hwloc calls
 * that apply it to the whole process (every thread, OpenMP's included, inherits it), and the
 * report of it (a start-up line per rank, and `braid_rank_binding_info` lines for /metrics).
 *
 * Policy (`--bind auto`): the candidate cores are the machine's allowed cores (a Slurm or cgroup
 * cpuset is honoured), narrowed to the cores near the rank's GPU when the rank runs on CUDA and
 * hwloc can tell which those are (hwloc/cudart.h; falls back to every core). The worker ranks of a
 * machine, numbered by their node-local index, take consecutive slices of those cores in hwloc's
 * logical order (which keeps a slice inside one NUMA node whenever it fits), as even as possible:
 * rank_binding_partition. When the machine holds more worker ranks than candidate cores, it tries
 * hardware threads (PUs); when those are too few as well the rank is *oversubscribed*: it says so
 * and binds nothing (sharing the cores is then the kernel's business). The coordinator (rank 0)
 * is never bound: it is mostly idle and must stay responsive wherever it lands.
 * Memory is bound to the NUMA node(s) under the slice (HWLOC_MEMBIND_BIND) on machines with more
 * than one NUMA node; a failure there (some containers forbid it) is a warning, not an error.
 *
 * Callers: `braid serve` (src/cli/cmd_serve.c) calls rank_binding_collective once on every rank,
 * before loading the model, and hands rank 0's metrics text to the coordinator's metrics.
 * Thread-safety: call from the rank's main thread before it starts other threads that must not be
 * moved; the functions keep no state between calls. rank_binding_partition is pure.
 * Memory: RankBinding is a plain value; rank_binding_metrics_text returns a malloc'd string.
 */
#ifndef BRAID_WORKER_RANK_BINDING_H
#define BRAID_WORKER_RANK_BINDING_H

#include <mpi.h>
#include <stdbool.h>

#include "common/error.h"

typedef enum { RANK_BIND_AUTO, RANK_BIND_NONE } RankBindMode;

/* Parses "auto" or "none". Returns 0, or -1 for anything else. */
int rank_binding_parse_mode(const char *text, RankBindMode *mode);

/* What one rank ended up with. cpuset and numa are hwloc list strings of OS indices ("0-3,8"),
 * the same notation as Cpus_allowed_list in /proc/<pid>/status; empty when nothing was bound. */
typedef struct {
    int rank, local_rank, local_ranks; /* world rank; index among the machine's worker ranks, and their number */
    int cores;                         /* cores (or PUs, see `unit`) in the slice; when oversubscribed, on the machine */
    int pus;                           /* hardware threads in the slice (the default thread count); 0 when not bound */
    char host[64];
    char unit[8];                      /* "core" or "pu": what the slice was cut from */
    char state[24];                    /* "bound", "disabled" (--bind none), "oversubscribed", "coordinator", "failed" */
    char cpuset[128], numa[64];
    char gpu_note[48];                 /* "near cuda device 0", "cuda device 0: locality unknown", or "" */
} RankBinding;

/* Pure: the slice of n_units units (cores) that worker `local_rank` of `local_ranks` gets, as
 * [*first, *first + *count). Slices are consecutive, disjoint, cover every unit, and differ in size
 * by at most one (the first n_units % local_ranks ranks get the extra unit). Returns 0, or -1 when
 * local_ranks > n_units (oversubscribed) or an argument is out of range (n_units < 1,
 * local_rank outside [0, local_ranks)); *first and *count are 0 then. */
int rank_binding_partition(int n_units, int local_rank, int local_ranks, int *first, int *count);

/* Binds the calling process (all its threads) as `auto` says for worker `local_rank` of
 * `local_ranks` on this machine; cuda_device >= 0 asks for cores near that CUDA device. Fills *out
 * (rank fields included). Returns 0 when bound, not bound because oversubscribed, or memory-only
 * warnings happened (out->state says which); -1 with err filled when hwloc itself failed (the
 * process is then left as it was and out->state is "failed"). */
int rank_binding_apply(int rank, int local_rank, int local_ranks, int cuda_device, RankBinding *out, BraidError *err);

/* Collective over `world` (every rank calls it; rank 0 is the coordinator and is not bound):
 * finds each worker's node-local index with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), binds it
 * when mode is AUTO, fills *mine with this rank's outcome, gathers every rank's RankBinding on rank
 * 0 into *all (malloc'd, world size entries, index = rank; NULL elsewhere; caller frees), and rank
 * 0 prints one line per worker rank on stderr ("braid serve: rank 1 (worker 1 of 2 on host): bound
 * to 1 core, cpuset 0, NUMA node 0").
 * Returns 0; -1 with err filled only when MPI fails (a binding that hwloc cannot make is reported
 * and the rank runs unbound). */
int rank_binding_collective(MPI_Comm world, RankBindMode mode, int cuda_device, RankBinding *mine, RankBinding **all,
                            BraidError *err);

/* One Prometheus family (HELP, TYPE, then one line per worker rank):
 * braid_rank_binding_info{rank="1",host="h",state="bound",cpuset="0",numa="0"} 1. entries[0] (the
 * coordinator) is skipped. Returns a malloc'd string, NULL on out of memory. */
char *rank_binding_metrics_text(const RankBinding *entries, int n);

/* The start-up line's text for one rank (no newline) into buf. */
void rank_binding_describe(const RankBinding *b, char *buf, size_t cap);

#endif
