/*
 * import_followers.h — requests that wait behind a KV import already in flight to their instance
 * (issue 33 (a); the leader's side, worker/instance_leader.c).
 *
 * The router counts blocks in flight toward an instance (a move it planned for an earlier request)
 * as local when it routes the next requests with the same head, and sends those without a pull
 * hint. If the leader gave them to the engine at once, they would prefill the head themselves
 * while the import waits on a busy lender, and the move would then be declined ("the prefix got
 * here meanwhile"): the head computed twice, the router's bet lost. So a request without a pull
 * hint follows a parked import when the import is expected to bring more of its prompt's blocks
 * than this instance's cache holds for it now:
 *
 *   gain(r, import) = min(S, A, (r.n_prompt - 1) / block_size), where S = the whole blocks at the
 *   head of r's prompt and the import's prompt that hold the same tokens, and A = the blocks the
 *   import asked for (min(its pull hint's blocks, (its n_prompt - 1) / block_size));
 *   r follows the import with the largest gain (the earliest parked on a tie) when that gain is
 *   greater than `local`, the whole blocks of r's prompt the local cache matches now (device and
 *   host tiers, kv_cache_peek_prefix); both requests must name the same tenant and adapter
 *   (NULL and "" alike), the cache namespace.
 *
 * Waiting has a price on a busy instance: the leader lands moves between engine steps, so a follower
 * whose import lands while a step runs joins the step after it, about one step later than it would
 * have started by computing the head itself (measured live: 3-8 s on a loaded 2-core box, where a
 * 7-block head took 0.35-0.6 s to compute). So while the instance has work in its scheduler, r
 * follows only when the blocks it would save, gain - local, hold at least half a step's token
 * budget (2 x (gain - local) x block_size >= max_batch_tokens): computing that many tokens costs the
 * instance about as much as the step a follower may wait. An idle instance notices the landing at
 * once, so there any gain is worth the wait (import_followers_worth_waiting).
 *
 * A follower is handed to the engine when its import ends, however it ends (landed, failed,
 * declined or timed out), so its wait is bounded by the move timeout; followers of one import go
 * in the order they came, after the import's own request. A request that carries a pull hint of its
 * own parks on its own move instead and never follows. Cancelling a follower takes it out at once.
 * The list is the leader's; this module only matches and keeps order. Not thread-safe.
 */
#ifndef BRAID_WORKER_IMPORT_FOLLOWERS_H
#define BRAID_WORKER_IMPORT_FOLLOWERS_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/scheduler.h"

/* A parked import as the leader sees it: its request, the blocks its move asked for, its handle. */
typedef struct {
    const SchedRequest *req;
    int asked_blocks;
    void *owner;
} ImportCandidate;

typedef struct {
    void *follower;
    void *import_owner;
} ImportFollower;

typedef struct {
    ImportFollower *items; /* in the order they came */
    int n, cap;
    uint64_t total;        /* followers ever added (the move_followers counter) */
} ImportFollowers;

/* gain(r, import) of the rule above (0 when the namespaces differ). */
int import_followers_gain(const SchedRequest *r, const ImportCandidate *import, int block_size);
/* The index in imports[0, n) that r should follow, or -1 when none gains more than `local`
 * blocks; *gain gets that import's gain (0 for -1). */
int import_followers_choose(const SchedRequest *r, const ImportCandidate *imports, int n, int local, int block_size, int *gain);
/* Whether saving gain - local blocks pays for the wait (the rule above); instance_idle: nothing
 * waiting or running in the instance's scheduler. */
bool import_followers_worth_waiting(int gain, int local, int block_size, int max_batch_tokens, bool instance_idle);
/* r (handle follower) waits behind the import with handle import_owner. -1 when out of memory
 * (then it does not wait). */
int import_followers_add(ImportFollowers *f, void *follower, void *import_owner);
/* Takes the followers of import_owner out of the list into out[0, cap), in the order they came;
 * returns how many (call again while it returns cap). */
int import_followers_take(ImportFollowers *f, const void *import_owner, void **out, int cap);
/* Takes one follower out (it was cancelled); false when it was not in the list. */
bool import_followers_remove(ImportFollowers *f, const void *follower);
void import_followers_free(ImportFollowers *f);

#endif
