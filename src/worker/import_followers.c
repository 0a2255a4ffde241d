/* import_followers.c — requests waiting behind a KV import in flight (import_followers.h). */
#include "worker/import_followers.h"

#include <stdlib.h>
#include <string.h>

#include "cache/radix_tree.h"
#include "common/grow.h"

/* NULL and "" both name no tenant / adapter. */
static bool same_name(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

int import_followers_gain(const SchedRequest *r, const ImportCandidate *import, int block_size) {
    const SchedRequest *q = import->req;
    if (block_size <= 0 || !q || !same_name(r->tenant, q->tenant) || !same_name(r->adapter, q->adapter)) return 0;
    int limit = r->n_prompt > 0 ? (r->n_prompt - 1) / block_size : 0; /* a match never covers the whole prompt */
    int gain = radix_shared_blocks(r->tokens, r->n_prompt, q->tokens, q->n_prompt, block_size);
    if (gain > import->asked_blocks) gain = import->asked_blocks;
    return gain < limit ? gain : limit;
}

bool import_followers_worth_waiting(int gain, int local, int block_size, int max_batch_tokens, bool instance_idle) {
    if (gain <= local) return false;
    if (instance_idle) return true;
    return 2LL * (gain - local) * block_size >= max_batch_tokens;
}

int import_followers_choose(const SchedRequest *r, const ImportCandidate *imports, int n, int local, int block_size, int *gain) {
    int best = -1, best_gain = local;
    for (int i = 0; i < n; i++) {
        int g = import_followers_gain(r, &imports[i], block_size);
        if (g > best_gain) best = i, best_gain = g;
    }
    *gain = best >= 0 ? best_gain : 0;
    return best;
}

int import_followers_add(ImportFollowers *f, void *follower, void *import_owner) {
    if (braid_grow((void **)&f->items, &f->cap, f->n + 1, sizeof *f->items)) return -1;
    f->items[f->n++] = (ImportFollower){.follower = follower, .import_owner = import_owner};
    f->total++;
    return 0;
}

int import_followers_take(ImportFollowers *f, const void *import_owner, void **out, int cap) {
    int got = 0, kept = 0;
    for (int i = 0; i < f->n; i++) {
        if (got < cap && f->items[i].import_owner == import_owner) out[got++] = f->items[i].follower;
        else f->items[kept++] = f->items[i]; /* order kept */
    }
    f->n = kept;
    return got;
}

bool import_followers_remove(ImportFollowers *f, const void *follower) {
    for (int i = 0; i < f->n; i++)
        if (f->items[i].follower == follower) {
            memmove(f->items + i, f->items + i + 1, (size_t)(f->n - i - 1) * sizeof *f->items);
            f->n--;
            return true;
        }
    return false;
}

void import_followers_free(ImportFollowers *f) {
    free(f->items);
    memset(f, 0, sizeof *f);
}
