/*
 * rank_directory.h — who every rank of the job is, as an operating-system process: its pid, the
 * start time that makes a pid unambiguous (pids are reused), and whether it runs on rank 0's host.
 *
 * rank_directory_gather is collective over the communicator (every rank calls it once, at start-up,
 * before any rank may fail); rank 0 gets the whole table, the other ranks an empty directory. The
 * coordinator uses it to see a worker process die (rank_directory_alive) and to fence what is left
 * of a dead instance (rank_directory_kill), neither of which MPI itself reports without ULFM.
 * Owns its arrays; rank_directory_free releases them. Not thread-safe (one owner thread).
 */
#ifndef BRAID_TRANSPORT_RANK_DIRECTORY_H
#define BRAID_TRANSPORT_RANK_DIRECTORY_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/error.h"

typedef struct {
    int n_ranks;
    pid_t *pid;             /* (n_ranks) */
    uint64_t *start_ticks;  /* (n_ranks) /proc/<pid>/stat field 22; 0 when unknown */
    bool *local;            /* (n_ranks) same host as rank 0: its process can be looked at and signalled */
} RankDirectory;

/* Collective. Fills *dir on rank 0; elsewhere leaves it empty (n_ranks 0). */
int rank_directory_gather(MPI_Comm comm, RankDirectory *dir, BraidError *err);
void rank_directory_free(RankDirectory *dir);

/* This process's own entry (pid and start time), for tests and for the gather. */
int rank_directory_self(pid_t *pid, uint64_t *start_ticks);
/* The start time of process pid from /proc, or 0 when it has none (gone, or /proc unreadable);
 * *zombie is set when it has exited but not yet been reaped. */
uint64_t rank_directory_start_ticks(pid_t pid, bool *zombie);

typedef enum { RANK_ALIVE, RANK_GONE, RANK_UNKNOWN } RankLiveness;
/* RANK_GONE when rank's process has exited (or its pid now names another process);
 * RANK_UNKNOWN for a rank on another host. */
RankLiveness rank_directory_alive(const RankDirectory *dir, int rank);
/* SIGKILL to rank's process when it is local and still the same process; 0 when sent or already gone. */
int rank_directory_kill(const RankDirectory *dir, int rank);

#endif
