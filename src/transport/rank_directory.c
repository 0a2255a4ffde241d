#include "transport/rank_directory.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/mpi_error.h"

enum { HOST_NAME_BYTES = 256 };

uint64_t rank_directory_start_ticks(pid_t pid, bool *zombie) {
    char path[64], text[1024];
    *zombie = false;
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    /* "pid (comm) S ppid ..." — comm may hold blanks and parentheses, so fields count from the last ')'. */
    const char *p = strrchr(text, ')');
    if (!p) return 0;
    char state = 0;
    unsigned long long start = 0;
    /* after ')': state (field 3), then fields 4..21 skipped, then starttime (field 22) */
    if (sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", &state, &start) != 2)
        return 0;
    *zombie = state == 'Z' || state == 'X';
    return (uint64_t)start;
}

int rank_directory_self(pid_t *pid, uint64_t *start_ticks) {
    bool zombie;
    *pid = getpid();
    *start_ticks = rank_directory_start_ticks(*pid, &zombie);
    return 0;
}

/* What each rank sends rank 0: fixed size, so one MPI_Gather of bytes carries it. */
typedef struct {
    long long pid;
    unsigned long long start_ticks;
    char host[HOST_NAME_BYTES];
} RankEntry;

static int fill_directory(RankDirectory *dir, const RankEntry *all, int size, BraidError *err) {
    dir->pid = calloc((size_t)size, sizeof *dir->pid);
    dir->start_ticks = calloc((size_t)size, sizeof *dir->start_ticks);
    dir->local = calloc((size_t)size, sizeof *dir->local);
    if (!dir->pid || !dir->start_ticks || !dir->local) {
        rank_directory_free(dir);
        return braid_error_set(err, "rank directory: out of memory for %d ranks", size);
    }
    dir->n_ranks = size;
    for (int r = 0; r < size; r++) {
        dir->pid[r] = (pid_t)all[r].pid;
        dir->start_ticks[r] = all[r].start_ticks;
        dir->local[r] = strncmp(all[r].host, all[0].host, HOST_NAME_BYTES) == 0;
    }
    return 0;
}

int rank_directory_gather(MPI_Comm comm, RankDirectory *dir, BraidError *err) {
    memset(dir, 0, sizeof *dir);
    int rank = 0, size = 0;
    if (mpi_check(MPI_Comm_rank(comm, &rank), "rank directory: rank", err) ||
        mpi_check(MPI_Comm_size(comm, &size), "rank directory: size", err))
        return -1;
    RankEntry mine;
    memset(&mine, 0, sizeof mine);
    pid_t pid;
    uint64_t ticks;
    rank_directory_self(&pid, &ticks);
    mine.pid = pid;
    mine.start_ticks = ticks;
    if (gethostname(mine.host, sizeof mine.host - 1)) snprintf(mine.host, sizeof mine.host, "?");
    RankEntry *all = rank == 0 ? calloc((size_t)size, sizeof *all) : NULL;
    int ok = rank != 0 || all != NULL, all_ok = 0;
    /* Every rank learns whether rank 0 could hold the table before anyone enters the gather. */
    int rc = mpi_check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm), "rank directory: agree", err);
    if (rc == 0 && !all_ok) rc = braid_error_set(err, "rank directory: out of memory on rank 0");
    if (rc == 0)
        rc = mpi_check(MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, comm), "rank directory: gather",
                       err);
    if (rc == 0 && rank == 0) rc = fill_directory(dir, all, size, err);
    free(all);
    return rc;
}

void rank_directory_free(RankDirectory *dir) {
    free(dir->pid);
    free(dir->start_ticks);
    free(dir->local);
    memset(dir, 0, sizeof *dir);
}

RankLiveness rank_directory_alive(const RankDirectory *dir, int rank) {
    if (rank < 0 || rank >= dir->n_ranks || !dir->local[rank]) return RANK_UNKNOWN;
    bool zombie;
    uint64_t ticks = rank_directory_start_ticks(dir->pid[rank], &zombie);
    if (ticks == 0 && dir->start_ticks[rank] == 0) {
        /* No /proc: fall back to asking the kernel whether the pid exists at all. */
        return kill(dir->pid[rank], 0) == 0 || errno == EPERM ? RANK_ALIVE : RANK_GONE;
    }
    if (ticks == 0 || zombie || ticks != dir->start_ticks[rank]) return RANK_GONE;
    return RANK_ALIVE;
}

int rank_directory_kill(const RankDirectory *dir, int rank) {
    if (rank_directory_alive(dir, rank) != RANK_ALIVE) return 0;
    if (kill(dir->pid[rank], SIGKILL) == 0 || errno == ESRCH) return 0;
    return -1;
}
