#include "cache/block_pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

int block_pool_init(BlockPool *p, int n_blocks, BraidError *err) {
    memset(p, 0, sizeof *p);
    /* One block is a valid, empty pool: the null block alone (a tier that is switched off). */
    if (n_blocks < 1) return braid_error_set(err, "block pool: need at least 1 block (the null block), got %d", n_blocks);
    p->n_blocks = n_blocks;
    p->holders = calloc((size_t)n_blocks, sizeof *p->holders);
    p->in_tree = calloc((size_t)n_blocks, sizeof *p->in_tree);
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    if (!p->holders || !p->in_tree || !p->free_list) {
        block_pool_free(p);
        return braid_error_set(err, "block pool: out of memory for %d blocks", n_blocks);
    }
    /* Lowest ids come out first, which keeps test expectations readable. */
    for (int b = n_blocks - 1; b >= 1; b--) p->free_list[p->n_free++] = b;
    return 0;
}

void block_pool_free(BlockPool *p) {
    free(p->holders);
    free(p->in_tree);
    free(p->free_list);
    memset(p, 0, sizeof *p);
}

int block_pool_total(const BlockPool *p) { return p->n_blocks - 1; }

int block_pool_alloc(BlockPool *p, int n, int32_t *out) {
    if (n < 0 || n > p->n_free) return -1;
    for (int i = 0; i < n; i++) {
        int32_t b = p->free_list[--p->n_free];
        assert(p->holders[b] == 0 && !p->in_tree[b]);
        p->holders[b] = 1;
        out[i] = b;
    }
    p->n_in_use += n;
    return 0;
}

void block_pool_hold(BlockPool *p, int32_t b) {
    assert(b > 0 && b < p->n_blocks);
    assert(p->holders[b] > 0 || p->in_tree[b]); /* a free block must be allocated, not held */
    if (p->holders[b]++ == 0) {
        p->n_cached--;
        p->n_in_use++;
    }
}

void block_pool_release(BlockPool *p, int32_t b) {
    assert(b > 0 && b < p->n_blocks && p->holders[b] > 0);
    if (--p->holders[b] > 0) return;
    p->n_in_use--;
    if (p->in_tree[b]) p->n_cached++;
    else p->free_list[p->n_free++] = b;
}

void block_pool_set_in_tree(BlockPool *p, int32_t b, bool owned) {
    assert(b > 0 && b < p->n_blocks && p->in_tree[b] != owned);
    p->in_tree[b] = owned;
    if (p->holders[b] > 0) return; /* in use either way */
    if (owned) {
        /* Only blocks some request holds can enter the tree. */
        assert(!"block_pool_set_in_tree: a block must be held when the tree takes it");
    } else {
        p->n_cached--;
        p->free_list[p->n_free++] = b;
    }
}

int block_pool_check(const BlockPool *p, BraidError *err) {
    int free_count = 0, cached = 0, in_use = 0;
    for (int b = 1; b < p->n_blocks; b++) {
        if (p->holders[b] < 0) return braid_error_set(err, "block pool: block %d has %d holders", b, p->holders[b]);
        if (p->holders[b] > 0) in_use++;
        else if (p->in_tree[b]) cached++;
        else free_count++;
    }
    if (free_count != p->n_free || cached != p->n_cached || in_use != p->n_in_use)
        return braid_error_set(err, "block pool: counters free %d cached %d in use %d, recount %d %d %d", p->n_free, p->n_cached,
                               p->n_in_use, free_count, cached, in_use);
    if (p->n_free + p->n_cached + p->n_in_use != block_pool_total(p))
        return braid_error_set(err, "block pool: free %d + cached %d + in use %d != total %d", p->n_free, p->n_cached,
                               p->n_in_use, block_pool_total(p));
    return 0;
}
