/* rank_binding.c — hwloc core / NUMA binding of worker ranks; the contract is in rank_binding.h. */
#include "worker/rank_binding.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(BRAID_HAVE_CUDA)
#include <hwloc/cudart.h>
#endif

int rank_binding_parse_mode(const char *text, RankBindMode *mode) {
    if (text && strcmp(text, "auto") == 0) *mode = RANK_BIND_AUTO;
    else if (text && strcmp(text, "none") == 0) *mode = RANK_BIND_NONE;
    else return -1;
    return 0;
}

int rank_binding_partition(int n_units, int local_rank, int local_ranks, int *first, int *count) {
    *first = *count = 0;
    if (n_units < 1 || local_ranks < 1 || local_rank < 0 || local_rank >= local_ranks || local_ranks > n_units) return -1;
    int base = n_units / local_ranks, extra = n_units % local_ranks;
    /* The first `extra` ranks take base + 1 units each, the rest base. */
    *first = local_rank * base + (local_rank < extra ? local_rank : extra);
    *count = base + (local_rank < extra ? 1 : 0);
    return 0;
}

static void binding_init(RankBinding *b, int rank, int local_rank, int local_ranks, const char *state) {
    memset(b, 0, sizeof *b);
    b->rank = rank;
    b->local_rank = local_rank;
    b->local_ranks = local_ranks;
    if (gethostname(b->host, sizeof b->host - 1) != 0) snprintf(b->host, sizeof b->host, "unknown");
    snprintf(b->state, sizeof b->state, "%s", state);
}

/* Units of `type` lying wholly inside `set`. */
static int count_units(hwloc_topology_t topo, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
    int n = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, type, o));) n++;
    return n;
}

/* The union of units [first, first + count) of `type` inside `set`, in logical order, into out. */
static void union_units(hwloc_topology_t topo, hwloc_const_cpuset_t set, hwloc_obj_type_t type, int first, int count,
                        hwloc_cpuset_t out) {
    hwloc_bitmap_zero(out);
    int i = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_obj_inside_cpuset_by_type(topo, set, type, o)); i++)
        if (i >= first && i < first + count) hwloc_bitmap_or(out, out, o->cpuset);
}

/* Narrows `candidates` to the cores near CUDA device `dev` when hwloc can tell which they are and
 * at least `need` cores remain; notes the outcome either way. */
static void narrow_to_gpu(hwloc_topology_t topo, int dev, int need, hwloc_cpuset_t candidates, RankBinding *b) {
    if (dev < 0) return;
    snprintf(b->gpu_note, sizeof b->gpu_note, "cuda device %d: locality unknown", dev);
#if defined(BRAID_HAVE_CUDA)
    hwloc_cpuset_t near = hwloc_bitmap_alloc();
    if (!near) return;
    if (hwloc_cudart_get_device_cpuset(topo, dev, near) == 0) {
        hwloc_bitmap_and(near, near, candidates);
        /* A GPU whose local cores cannot hold this machine's ranks: spread over every core instead. */
        if (count_units(topo, near, HWLOC_OBJ_CORE) >= need) {
            hwloc_bitmap_copy(candidates, near);
            snprintf(b->gpu_note, sizeof b->gpu_note, "near cuda device %d", dev);
        }
    }
    hwloc_bitmap_free(near);
#else
    (void)topo, (void)need, (void)candidates;
#endif
}

/* Cuts this rank's slice out of `candidates`: cores, or PUs when cores are too few. Returns 0 with
 * the slice in `slice`, or -1 when even the PUs are too few (oversubscribed; b says so). */
static int choose_slice(hwloc_topology_t topo, hwloc_const_cpuset_t candidates, RankBinding *b, hwloc_cpuset_t slice) {
    hwloc_obj_type_t type = HWLOC_OBJ_CORE;
    int n = count_units(topo, candidates, type);
    if (n < b->local_ranks) type = HWLOC_OBJ_PU, n = count_units(topo, candidates, type);
    snprintf(b->unit, sizeof b->unit, "%s", type == HWLOC_OBJ_CORE ? "core" : "pu");
    b->cores = n; /* the node's count until the slice is known, for the oversubscribed message */
    int first, count;
    if (rank_binding_partition(n, b->local_rank, b->local_ranks, &first, &count)) {
        snprintf(b->state, sizeof b->state, "oversubscribed");
        return -1;
    }
    union_units(topo, candidates, type, first, count, slice);
    b->cores = count;
    b->pus = hwloc_bitmap_weight(slice);
    return 0;
}

/* Binds memory to the NUMA node(s) under `slice`; records them in b->numa. Only warns on failure:
 * the cores are what matters most, and some sandboxes refuse memory policies. */
static void bind_memory(hwloc_topology_t topo, hwloc_const_cpuset_t slice, RankBinding *b) {
    hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
    if (!nodes) return;
    hwloc_cpuset_to_nodeset(topo, slice, nodes);
    hwloc_bitmap_list_snprintf(b->numa, sizeof b->numa, nodes);
    /* With one NUMA node there is nothing to choose; asking anyway only fails in sandboxes. */
    if (!hwloc_bitmap_iszero(nodes) && hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE) > 1 &&
        hwloc_set_membind(topo, nodes, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET) < 0)
        fprintf(stderr, "braid serve: rank %d: memory not bound to NUMA node %s: %s (cores are)\n", b->rank, b->numa,
                strerror(errno));
    hwloc_bitmap_free(nodes);
}

/* The body of rank_binding_apply, with the topology and two bitmaps already allocated. */
static int apply_with(hwloc_topology_t topo, hwloc_cpuset_t candidates, hwloc_cpuset_t slice, int cuda_device, RankBinding *b,
                      BraidError *err) {
    hwloc_bitmap_copy(candidates, hwloc_topology_get_allowed_cpuset(topo));
    narrow_to_gpu(topo, cuda_device, b->local_ranks, candidates, b);
    if (choose_slice(topo, candidates, b, slice)) return 0;
    /* PROCESS: every thread that exists now and every thread created later (OpenMP's) gets it. */
    char want[sizeof b->cpuset];
    hwloc_bitmap_list_snprintf(want, sizeof want, slice);
    if (hwloc_set_cpubind(topo, slice, HWLOC_CPUBIND_PROCESS) < 0)
        return braid_error_set(err, "hwloc: binding rank %d to cpuset %s failed: %s", b->rank, want, strerror(errno));
    snprintf(b->cpuset, sizeof b->cpuset, "%s", want);
    snprintf(b->state, sizeof b->state, "bound");
    bind_memory(topo, slice, b);
    return 0;
}

int rank_binding_apply(int rank, int local_rank, int local_ranks, int cuda_device, RankBinding *out, BraidError *err) {
    binding_init(out, rank, local_rank, local_ranks, "failed");
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) < 0) return braid_error_set(err, "hwloc: topology init failed: %s", strerror(errno));
    if (hwloc_topology_load(topo) < 0) {
        int e = errno;
        hwloc_topology_destroy(topo);
        return braid_error_set(err, "hwloc: loading this machine's topology failed: %s", strerror(e));
    }
    hwloc_cpuset_t candidates = hwloc_bitmap_alloc(), slice = hwloc_bitmap_alloc();
    int rc = candidates && slice ? apply_with(topo, candidates, slice, cuda_device, out, err)
                                 : braid_error_set(err, "hwloc: out of memory");
    if (rc) snprintf(out->state, sizeof out->state, "failed");
    hwloc_bitmap_free(candidates);
    hwloc_bitmap_free(slice);
    hwloc_topology_destroy(topo);
    return rc;
}

void rank_binding_describe(const RankBinding *b, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "rank %d (worker %d of %d on %s): ", b->rank, b->local_rank + 1, b->local_ranks, b->host);
    size_t used = n > 0 && (size_t)n < cap ? (size_t)n : cap;
    char *p = buf + used;
    size_t left = cap - used;
    const char *gpu = b->gpu_note[0] ? ", " : "";
    if (strcmp(b->state, "bound") == 0)
        snprintf(p, left, "bound to %d %s%s, cpuset %s, NUMA node %s%s%s", b->cores, b->unit, b->cores == 1 ? "" : "s", b->cpuset,
                 b->numa[0] ? b->numa : "?", gpu, b->gpu_note);
    else if (strcmp(b->state, "oversubscribed") == 0)
        snprintf(p, left, "not bound: %d worker ranks on %d %ss here (oversubscribed; ranks share every core)", b->local_ranks,
                 b->cores, b->unit);
    else if (strcmp(b->state, "disabled") == 0) snprintf(p, left, "not bound (--bind none)");
    else snprintf(p, left, "not bound (%s)", b->state);
}

/* The node-local index of this worker among the machine's worker ranks, and their number. The
 * coordinator (world rank 0, hence node rank 0 where it is) is not a worker. */
static int local_worker_index(MPI_Comm world, int rank, int *local_rank, int *local_ranks, BraidError *err) {
    MPI_Comm node;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return braid_error_set(err, "rank binding: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
    int node_rank = 0, node_size = 1, is_coordinator = rank == 0, coordinator_here = 0;
    int rc = MPI_Comm_rank(node, &node_rank) | MPI_Comm_size(node, &node_size) |
             MPI_Allreduce(&is_coordinator, &coordinator_here, 1, MPI_INT, MPI_MAX, node);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) return braid_error_set(err, "rank binding: finding the ranks on this machine failed");
    *local_rank = node_rank - coordinator_here;
    *local_ranks = node_size - coordinator_here;
    return 0;
}

int rank_binding_collective(MPI_Comm world, RankBindMode mode, int cuda_device, RankBinding *mine, RankBinding **all,
                            BraidError *err) {
    int rank = 0, size = 1, local_rank = 0, local_ranks = 1;
    *all = NULL;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    binding_init(mine, rank, -1, 0, "failed");
    if (local_worker_index(world, rank, &local_rank, &local_ranks, err)) return -1;
    BraidError why;
    if (rank == 0) binding_init(mine, rank, -1, local_ranks, "coordinator");
    else if (mode == RANK_BIND_NONE) binding_init(mine, rank, local_rank, local_ranks, "disabled");
    else if (rank_binding_apply(rank, local_rank, local_ranks, cuda_device, mine, &why))
        fprintf(stderr, "braid serve: rank %d runs unbound: %s\n", rank, why.msg);
    RankBinding *gathered = rank == 0 ? malloc((size_t)size * sizeof *gathered) : NULL;
    /* Rank 0 says first whether it has room, so an out-of-memory rank 0 never receives into NULL. */
    int ok = rank != 0 || gathered != NULL;
    if (MPI_Bcast(&ok, 1, MPI_INT, 0, world) != MPI_SUCCESS) ok = -1;
    if (ok == 1 && MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, gathered, (int)sizeof *mine, MPI_BYTE, 0, world) != MPI_SUCCESS)
        ok = -1;
    if (ok != 1) {
        free(gathered);
        return braid_error_set(err, "rank binding: %s", ok ? "gathering the bindings on rank 0 failed" : "out of memory on rank 0");
    }
    for (int r = 1; gathered && r < size; r++) {
        char line[512];
        rank_binding_describe(&gathered[r], line, sizeof line);
        fprintf(stderr, "braid serve: %s\n", line);
    }
    *all = gathered;
    return 0;
}

/* Appends `value` as a Prometheus label value (backslash, quote and newline escaped). */
static size_t put_label(char *out, size_t at, size_t cap, const char *value) {
    for (const char *s = value; *s && at + 2 < cap; s++) {
        if (*s == '\\' || *s == '"') out[at++] = '\\', out[at++] = *s;
        else if (*s == '\n') out[at++] = '\\', out[at++] = 'n';
        else out[at++] = *s;
    }
    out[at] = '\0';
    return at;
}

char *rank_binding_metrics_text(const RankBinding *entries, int n) {
    static const char head[] = "# HELP braid_rank_binding_info Where each worker rank is bound (hwloc, --bind); the value is always 1.\n"
                               "# TYPE braid_rank_binding_info gauge\n";
    enum { LINE_MAX_BYTES = 1024 };
    size_t cap = sizeof head + (size_t)(n > 0 ? n : 0) * LINE_MAX_BYTES;
    char *out = malloc(cap);
    if (!out) return NULL;
    size_t at = (size_t)snprintf(out, cap, "%s", head);
    for (int r = 1; r < n; r++) {
        const RankBinding *b = &entries[r];
        const char *names[] = {"host", "state", "cpuset", "numa"};
        const char *values[] = {b->host, b->state, b->cpuset, b->numa};
        at += (size_t)snprintf(out + at, cap - at, "braid_rank_binding_info{rank=\"%d\"", b->rank);
        for (int k = 0; k < 4; k++) {
            at += (size_t)snprintf(out + at, cap - at, ",%s=\"", names[k]);
            at = put_label(out, at, cap, values[k]);
            at += (size_t)snprintf(out + at, cap - at, "\"");
        }
        at += (size_t)snprintf(out + at, cap - at, "} 1\n");
    }
    return out;
}
