/*
 * bench_registry — what the coordinator's content-hash registry (the router's per-instance block
 * indexes, src/coord/block_index.h) costs at 10^5 and 10^6 blocks: nanoseconds per insert (KV
 * event BlockStored), per remove (BlockRemoved), per prefix lookup (the router scoring every
 * instance against a request's block chain), and bytes per block held.
 *   bench_registry [--blocks 100000,1000000] [--instances 1,4,16] [--chain 32] [--repeats 3]
 * The blocks are spread evenly over the instances and stored as chains of --chain blocks (one
 * KV event each, as an instance reports a prompt). Lookups: router_pick over a request whose first
 * --chain blocks are a stored chain (hit) and over one that matches nothing (miss); ns per lookup
 * counts all instances scored. Also the full-index case: 2x the bound stored into one instance
 * bounded at --blocks, every insert past the bound evicting the least recently stored block.
 * Prints one JSON line per measurement; each time is the best of --repeats passes.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mix64.h"
#include "common/timeutil.h"
#include "coord/block_index.h"
#include "coord/router.h"

#include "bench_list_arg.h"

#define MAX_LIST BENCH_LIST_MAX


typedef struct {
    double insert_ns, remove_ns, hit_ns, miss_ns, bytes_per_block;
} RegistryCosts;

/* Chain c of the layout: blocks c*chain .. c*chain+chain-1, on instance c % instances. */
static void chain_hashes(long c, int chain, uint64_t *out) {
    for (int j = 0; j < chain; j++) out[j] = mix64((uint64_t)c * (uint64_t)chain + (uint64_t)j);
}

static int measure(long blocks, int instances, int chain, int repeats, RegistryCosts *out) {
    long chains = blocks / chain;
    uint64_t *h = malloc((size_t)chain * sizeof *h), *miss = malloc((size_t)chain * sizeof *miss);
    if (!h || !miss) return -1;
    for (int j = 0; j < chain; j++) miss[j] = mix64((uint64_t)blocks * 4 + (uint64_t)j);
    *out = (RegistryCosts){1e30, 1e30, 1e30, 1e30, 0};
    const long lookups = 200000;
    for (int r = 0; r < repeats; r++) {
        Router rt;
        if (router_init(&rt, instances, 1 << 20)) return -1;
        double t0 = braid_now_seconds();
        for (long c = 0; c < chains; c++) {
            chain_hashes(c, chain, h);
            router_stored(&rt, (int)(c % instances), h, chain);
        }
        double t_insert = (braid_now_seconds() - t0) * 1e9 / (double)(chains * chain);
        unsigned long long held, bytes, evicted;
        router_registry_size(&rt, &held, &bytes, &evicted);
        if (held != (unsigned long long)(chains * chain) || evicted) {
            fprintf(stderr, "bench_registry: registry holds %llu of %ld blocks\n", held, chains * chain);
            return -1;
        }
        out->bytes_per_block = (double)bytes / (double)held;

        int matched = 0;
        t0 = braid_now_seconds();
        for (long q = 0; q < lookups; q++) {
            chain_hashes((long)(mix64((uint64_t)q) % (uint64_t)chains), chain, h);
            matched += router_pick(&rt, h, chain, NULL).matched_blocks;
        }
        double t_hit = (braid_now_seconds() - t0) * 1e9 / (double)lookups;
        if (matched != (int)lookups * chain) {
            fprintf(stderr, "bench_registry: lookups matched %d of %ld blocks\n", matched, lookups * chain);
            return -1;
        }
        t0 = braid_now_seconds();
        for (long q = 0; q < lookups; q++) matched += router_pick(&rt, miss, chain, NULL).matched_blocks;
        double t_miss = (braid_now_seconds() - t0) * 1e9 / (double)lookups;

        t0 = braid_now_seconds();
        for (long c = 0; c < chains; c++) {
            chain_hashes(c, chain, h);
            router_evicted(&rt, (int)(c % instances), h, chain);
        }
        double t_remove = (braid_now_seconds() - t0) * 1e9 / (double)(chains * chain);
        router_registry_size(&rt, &held, &bytes, &evicted);
        router_free(&rt);
        if (held) return -1;
        if (t_insert < out->insert_ns) out->insert_ns = t_insert;
        if (t_remove < out->remove_ns) out->remove_ns = t_remove;
        if (t_hit < out->hit_ns) out->hit_ns = t_hit;
        if (t_miss < out->miss_ns) out->miss_ns = t_miss;
    }
    free(h);
    free(miss);
    return 0;
}

/* 2 x bound distinct blocks into one index bounded at `bound`: ns per insert past the bound (each
 * evicts one block) and the bytes per block at the bound. */
static int measure_full(long bound, int repeats, double *evicting_ns, double *bytes_per_block) {
    *evicting_ns = 1e30;
    for (int r = 0; r < repeats; r++) {
        BlockIndex ix;
        block_index_init(&ix, (size_t)bound);
        for (long i = 0; i < bound; i++)
            if (block_index_add(&ix, mix64((uint64_t)i))) return -1;
        double t0 = braid_now_seconds();
        for (long i = bound; i < 2 * bound; i++)
            if (block_index_add(&ix, mix64((uint64_t)i))) return -1;
        double t = (braid_now_seconds() - t0) * 1e9 / (double)bound;
        if (ix.count != (size_t)bound || ix.evicted != (uint64_t)bound) return -1;
        *bytes_per_block = (double)block_index_bytes(&ix) / (double)bound;
        block_index_free(&ix);
        if (t < *evicting_ns) *evicting_ns = t;
    }
    return 0;
}

int main(int argc, char **argv) {
    long blocks[MAX_LIST] = {100000, 1000000}, instances[MAX_LIST] = {1, 4, 16};
    int n_blocks = 2, n_instances = 3, chain = 32, repeats = 3;
    static const struct option opts[] = {{"blocks", required_argument, 0, 'b'}, {"instances", required_argument, 0, 'i'},
                                         {"chain", required_argument, 0, 'c'}, {"repeats", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': n_blocks = bench_parse_list(optarg, blocks); break;
        case 'i': n_instances = bench_parse_list(optarg, instances); break;
        case 'c': chain = atoi(optarg); break;
        case 'r': repeats = atoi(optarg); break;
        default:
            fputs("usage: bench_registry [--blocks 100000,1000000] [--instances 1,4,16] [--chain 32] [--repeats 3]\n",
                  c == 'h' ? stdout : stderr);
            return c == 'h' ? 0 : 2;
        }
    }
    if (n_blocks <= 0 || n_instances <= 0 || chain < 1 || chain > 4096 || repeats < 1) {
        fputs("bench_registry: bad --blocks, --instances, --chain or --repeats\n", stderr);
        return 2;
    }
    for (int b = 0; b < n_blocks; b++) {
        for (int i = 0; i < n_instances; i++) {
            RegistryCosts k;
            if (measure(blocks[b], (int)instances[i], chain, repeats, &k)) {
                fprintf(stderr, "bench_registry: %ld blocks over %ld instances failed\n", blocks[b], instances[i]);
                return 1;
            }
            printf("{\"blocks\":%ld,\"instances\":%ld,\"chain\":%d,\"insert_ns\":%.1f,\"remove_ns\":%.1f,"
                   "\"lookup_hit_ns\":%.1f,\"lookup_miss_ns\":%.1f,\"bytes_per_block\":%.1f}\n",
                   blocks[b], instances[i], chain, k.insert_ns, k.remove_ns, k.hit_ns, k.miss_ns, k.bytes_per_block);
        }
        double evicting_ns, bytes_per_block;
        if (measure_full(blocks[b], repeats, &evicting_ns, &bytes_per_block)) {
            fprintf(stderr, "bench_registry: full index of %ld blocks failed\n", blocks[b]);
            return 1;
        }
        printf("{\"bound\":%ld,\"insert_evicting_ns\":%.1f,\"bytes_per_block_at_bound\":%.1f}\n", blocks[b], evicting_ns,
               bytes_per_block);
        fflush(stdout);
    }
    return 0;
}
