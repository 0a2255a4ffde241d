/*
 * kv_mover.c — the UCX data plane of KV block moves (contract in kv_mover.h).
 *
 * One UCP context (RMA; WAKEUP too where UCX offers it, so the progress thread can sleep on the
 * worker's event fd when no peer reads) and one single-threaded worker per mover. Registered regions keep their
 * memory handle and packed remote key; a description is
 *   u64 magic, u64 address length, worker address, u64 region count,
 *   per region: u64 base, u64 length, u64 key length, packed key
 * (wire.h, host byte order). A peer is an endpoint (peer error handling) plus its unpacked keys.
 * A batch issues ucp_get_nbx per read, at most KV_MAX_IN_FLIGHT at a time (the rest queue in the
 * batch and go out as reads land); reads UCX finishes at once cost nothing more, the others are
 * kept as requests whose completion callback counts them, so polling costs O(1) plus the reads it
 * issues, however many reads a batch holds. No read lands after kv_mover_batch_end, kv_mover_disconnect or kv_mover_destroy
 * returns: UCX cannot cancel an RMA request, so those wait (briefly) for the reads and, past a
 * grace period, force-close the endpoint, which completes every request on it.
 */
#include "transport/kv_mover.h"

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>

#include "common/log.h"
#include "common/timeutil.h"

#define KV_DESC_MAGIC 0x31564f4d564b5242ull /* "BRKVMOV1" */
/* How long kv_mover_batch_end waits for reads in flight before it force-closes the endpoint, and
 * how long any wait for a closing endpoint may take. */
#define KV_DRAIN_GRACE_S 0.5
#define KV_CLOSE_WAIT_S 2.0
/* Worker progress calls per poll at most (each handles a bounded amount of completions). */
#define KV_PROGRESS_SPINS 64
/* Reads of one batch in flight at most; the rest wait in the batch and go out (in kv_mover_poll)
 * as reads land. Too many outstanding reads slow UCX down: over TCP here a batch of 15 360 reads of
 * 6 KiB ran at 0.35-0.42 GB/s all outstanding, 0.6-0.9 GB/s with 1 024-4 096 (bench_kv_move);
 * ucx_perftest ucp_get shows the same (-O 16384 at 0.6x the rate of -O 4096). */
#define KV_MAX_IN_FLIGHT ((size_t)2048)

typedef struct {
    void *base;
    size_t len;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
} LocalRegion;

typedef struct {
    uint64_t base, len;
    ucp_rkey_h rkey;
} RemoteRegion;

typedef struct {
    KvMover *m;
    int handle, key;
    ucp_ep_h ep;
    bool broken;                /* the endpoint failed (error callback) or was force-closed */
    char broken_why[160];
    uint8_t *desc;              /* the description it was connected with (byte-compared on reconnect) */
    size_t desc_len;
    RemoteRegion *regions;
    int n_regions;
    char *transports;           /* kv_mover_peer_transports, computed once */
} Peer;

typedef struct {
    void *req;                  /* the UCX request (freed when the batch completes or ends) */
    int region;
    uint64_t offset, len;
} PendingGet;

typedef struct {
    int region;
    uint64_t offset, len;
    void *dst;
} QueuedGet;

struct KvMoveBatch {
    KvMover *m;
    int peer;                   /* handle; -1 once the peer was disconnected */
    PendingGet *pending;        /* reads UCX did not finish at once */
    size_t n_pending, cap_pending, n_done;
    QueuedGet *queued;          /* reads not issued yet (KV_MAX_IN_FLIGHT), from queue_head on */
    size_t n_queued, cap_queued, queue_head;
    size_t n_gets, bytes;
    bool failed;
    char why[320];              /* the first failure */
    KvMoveBatch *prev, *next;   /* the mover's live batches */
};

struct KvMover {
    ucp_context_h ctx;
    ucp_worker_h worker;
    /* The progress thread: transports that emulate RMA with messages (TCP) need the owner's worker
     * to progress, and a leader's loop only comes round between engine steps (hundreds of ms on a
     * CPU). It and the caller's thread take turns on the worker under `mu` (recursive: public calls
     * nest), so UCX sees serialized use; completion callbacks run under it too. */
    pthread_mutex_t mu;
    pthread_t progress_thread;
    bool have_thread;
    atomic_bool stop;
    int wake_fd;                /* the worker's event fd (UCP_FEATURE_WAKEUP), or -1 where unsupported */
    ucp_address_t *addr;
    size_t addr_len;
    LocalRegion *regions;
    int n_regions, cap_regions;
    Peer **peers;               /* indexed by handle; NULL once disconnected (handles are not reused) */
    int n_peers, cap_peers;
    KvMoveBatch *batches;
};

static void lock(KvMover *m) { pthread_mutex_lock(&m->mu); }
static void unlock(KvMover *m) { pthread_mutex_unlock(&m->mu); }

static void progress_some(KvMover *m) {
    for (int i = 0; i < KV_PROGRESS_SPINS && ucp_worker_progress(m->worker); i++) {
    }
}

/* Force-closes ep and waits (bounded) until UCX released it; every request on it completes with
 * UCS_ERR_CANCELED (or its error) before this returns, unless the wait runs out. */
static void close_endpoint(KvMover *m, ucp_ep_h ep) {
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(ep, &prm);
    if (req == NULL) return;
    if (UCS_PTR_IS_ERR(req)) {
        LOG_WARN("kv_mover", "closing an endpoint: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        return;
    }
    double deadline = braid_now_seconds() + KV_CLOSE_WAIT_S;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && braid_now_seconds() < deadline)
        ucp_worker_progress(m->worker);
    if (ucp_request_check_status(req) == UCS_INPROGRESS)
        LOG_WARN("kv_mover", "an endpoint did not finish closing in %.1f s; released later", KV_CLOSE_WAIT_S);
    ucp_request_free(req);
}

static Peer *peer_get(KvMover *m, int handle) {
    return handle >= 0 && handle < m->n_peers ? m->peers[handle] : NULL;
}

static void peer_mark_broken(Peer *p, const char *why) {
    if (p->broken) return;
    p->broken = true;
    snprintf(p->broken_why, sizeof p->broken_why, "%s", why);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    Peer *p = arg;
    char why[160];
    snprintf(why, sizeof why, "endpoint failed: %s", ucs_status_string(status));
    if (!p->broken) LOG_WARN("kv_mover", "peer %d (key %d): %s", p->handle, p->key, why);
    peer_mark_broken(p, why);
}

static void batch_fail(KvMoveBatch *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void batch_fail(KvMoveBatch *b, const char *fmt, ...) {
    if (b->failed) return;
    b->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->why, sizeof b->why, fmt, ap);
    va_end(ap);
}

static void on_get_done(void *request, ucs_status_t status, void *user_data) {
    KvMoveBatch *b = user_data;
    b->n_done++;
    if (status == UCS_OK || b->failed) return;
    for (size_t i = 0; i < b->n_pending; i++) {
        if (b->pending[i].req != request) continue;
        const PendingGet *g = &b->pending[i];
        batch_fail(b, "read of %llu bytes at region %d offset %llu: %s", (unsigned long long)g->len, g->region,
                   (unsigned long long)g->offset, ucs_status_string(status));
        return;
    }
    batch_fail(b, "a read: %s", ucs_status_string(status));
}

/* Frees the requests of a batch whose reads have all completed. */
static void batch_release_requests(KvMoveBatch *b) {
    for (size_t i = 0; i < b->n_pending; i++) ucp_request_free(b->pending[i].req);
    b->n_pending = b->n_done = 0;
}

static bool batch_in_flight(const KvMoveBatch *b) { return b->n_done < b->n_pending; }

/* Makes sure no read of b lands after this returns: asks UCX to cancel, progresses for a grace
 * period, then force-closes the peer's endpoint (the peer breaks). Returns false when reads are
 * still outstanding even so (the batch must then not be freed). */
static bool batch_drain(KvMoveBatch *b) {
    KvMover *m = b->m;
    b->n_queued = b->queue_head = 0; /* never issued: nothing to wait for */
    if (batch_in_flight(b)) {
        for (size_t i = 0; i < b->n_pending; i++)
            if (ucp_request_check_status(b->pending[i].req) == UCS_INPROGRESS)
                ucp_request_cancel(m->worker, b->pending[i].req);
        double deadline = braid_now_seconds() + KV_DRAIN_GRACE_S;
        while (batch_in_flight(b) && braid_now_seconds() < deadline) ucp_worker_progress(m->worker);
    }
    if (batch_in_flight(b)) {
        Peer *p = peer_get(m, b->peer);
        if (p && p->ep) {
            LOG_WARN("kv_mover", "peer %d (key %d): %zu reads still in flight after %.1f s; closing the endpoint",
                     p->handle, p->key, b->n_pending - b->n_done, KV_DRAIN_GRACE_S);
            peer_mark_broken(p, "endpoint closed to abandon reads in flight");
            close_endpoint(m, p->ep);
            p->ep = NULL;
        }
        double deadline = braid_now_seconds() + KV_CLOSE_WAIT_S;
        while (batch_in_flight(b) && braid_now_seconds() < deadline) ucp_worker_progress(m->worker);
    }
    if (batch_in_flight(b)) return false;
    batch_release_requests(b);
    return true;
}

static void batch_unlink(KvMoveBatch *b) {
    if (b->prev) b->prev->next = b->next;
    else b->m->batches = b->next;
    if (b->next) b->next->prev = b->prev;
    b->prev = b->next = NULL;
}

static void batch_free(KvMoveBatch *b) {
    if (!batch_drain(b)) {
        /* UCX still holds requests whose callbacks point at b: keeping it is the only safe choice. */
        LOG_ERROR("kv_mover", "a batch's reads never completed; its memory is kept (leaked)");
        batch_unlink(b);
        return;
    }
    batch_unlink(b);
    free(b->pending);
    free(b->queued);
    free(b);
}

static void peer_free(KvMover *m, Peer *p) {
    /* The batches reading from p fail, and their reads in flight complete (cancelled) when the
     * endpoint closes; after that the keys are unused. */
    for (KvMoveBatch *b = m->batches; b; b = b->next)
        if (b->peer == p->handle) batch_fail(b, "peer %d (key %d) was disconnected", p->handle, p->key);
    if (p->ep) close_endpoint(m, p->ep);
    p->ep = NULL;
    for (KvMoveBatch *b = m->batches; b; b = b->next)
        if (b->peer == p->handle) b->peer = -1;
    for (int i = 0; i < p->n_regions; i++)
        if (p->regions[i].rkey) ucp_rkey_destroy(p->regions[i].rkey);
    free(p->regions);
    free(p->desc);
    free(p->transports);
    free(p);
}

/* Sleeps until the worker has something to progress (its event fd), at most WAKE_POLL_MS; false
 * when it cannot (no event fd, events already pending, or arming failed), so the caller naps instead. */
#define WAKE_POLL_MS 100
static bool wait_for_traffic(KvMover *m) {
    if (m->wake_fd < 0) return false;
    lock(m);
    ucs_status_t st = ucp_worker_arm(m->worker);
    unlock(m);
    if (st != UCS_OK) return false; /* UCS_ERR_BUSY: events arrived meanwhile; a nap, then progress (never a spin) */
    struct pollfd pfd = {.fd = m->wake_fd, .events = POLLIN};
    poll(&pfd, 1, WAKE_POLL_MS);
    return true;
}

/* Progresses the worker: naps 50 us while traffic is recent; once it has been quiet ~10 ms it
 * sleeps on the worker's event fd (no CPU time at all while no peer reads: on a machine whose
 * cores the engine's threads use, a thread waking every millisecond costs them), or where the
 * transports give no event fd, naps 1 ms. */
static void *progress_loop(void *arg) {
    KvMover *m = arg;
    int quiet = 0;
    while (!atomic_load(&m->stop)) {
        lock(m);
        unsigned events = ucp_worker_progress(m->worker);
        unlock(m);
        if (events) {
            quiet = 0;
            continue;
        }
        if (quiet >= 200 && wait_for_traffic(m)) continue;
        struct timespec ts = {0, quiet < 200 ? 50000 : 1000000};
        quiet++;
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static int start_progress_thread(KvMover *m) {
    pthread_mutexattr_t attr;
    if (pthread_mutexattr_init(&attr) || pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE) || pthread_mutex_init(&m->mu, &attr))
        return -1;
    pthread_mutexattr_destroy(&attr);
    atomic_init(&m->stop, false);
    if (pthread_create(&m->progress_thread, NULL, progress_loop, m)) {
        pthread_mutex_destroy(&m->mu);
        return -1;
    }
    m->have_thread = true;
    return 0;
}

int kv_mover_create(KvMover **out, BraidError *err) {
    *out = NULL;
    KvMover *m = calloc(1, sizeof *m);
    if (!m) return braid_error_set(err, "kv_mover: out of memory");
    ucp_config_t *config;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        free(m);
        return braid_error_set(err, "kv_mover: reading the UCX configuration: %s", ucs_status_string(st));
    }
    /* With WAKEUP the progress thread can sleep on an event fd; a UCX without it still moves blocks. */
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
    st = ucp_init(&params, config, &m->ctx);
    if (st != UCS_OK) {
        params.features = UCP_FEATURE_RMA;
        st = ucp_init(&params, config, &m->ctx);
    }
    bool wakeup = st == UCS_OK && (params.features & UCP_FEATURE_WAKEUP);
    ucp_config_release(config);
    if (st != UCS_OK) {
        free(m);
        return braid_error_set(err, "kv_mover: ucp_init (RMA): %s", ucs_status_string(st));
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    st = ucp_worker_create(m->ctx, &wp, &m->worker);
    if (st != UCS_OK) {
        ucp_cleanup(m->ctx);
        free(m);
        return braid_error_set(err, "kv_mover: ucp_worker_create: %s", ucs_status_string(st));
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS};
    st = ucp_worker_query(m->worker, &wa);
    if (st != UCS_OK) {
        ucp_worker_destroy(m->worker);
        ucp_cleanup(m->ctx);
        free(m);
        return braid_error_set(err, "kv_mover: querying the worker address: %s", ucs_status_string(st));
    }
    m->addr = wa.address;
    m->addr_len = wa.address_length;
    m->wake_fd = -1;
    if (wakeup && ucp_worker_get_efd(m->worker, &m->wake_fd) != UCS_OK) m->wake_fd = -1;
    if (start_progress_thread(m)) {
        ucp_worker_release_address(m->worker, m->addr);
        ucp_worker_destroy(m->worker);
        ucp_cleanup(m->ctx);
        free(m);
        return braid_error_set(err, "kv_mover: could not start the progress thread");
    }
    *out = m;
    return 0;
}

void kv_mover_destroy(KvMover *m) {
    if (!m) return;
    if (m->have_thread) { /* from here on this thread alone uses the worker */
        atomic_store(&m->stop, true);
        if (m->wake_fd >= 0) {
            lock(m);
            ucp_worker_signal(m->worker); /* out of its poll now rather than at the next timeout */
            unlock(m);
        }
        pthread_join(m->progress_thread, NULL);
        pthread_mutex_destroy(&m->mu);
        m->have_thread = false;
    }
    while (m->batches) batch_free(m->batches);
    for (int i = 0; i < m->n_peers; i++)
        if (m->peers[i]) peer_free(m, m->peers[i]);
    free(m->peers);
    for (int i = 0; i < m->n_regions; i++) {
        ucp_rkey_buffer_release(m->regions[i].rkey_buf);
        ucs_status_t st = ucp_mem_unmap(m->ctx, m->regions[i].memh);
        if (st != UCS_OK) LOG_WARN("kv_mover", "unregistering region %d: %s", i, ucs_status_string(st));
    }
    free(m->regions);
    ucp_worker_release_address(m->worker, m->addr);
    ucp_worker_destroy(m->worker);
    ucp_cleanup(m->ctx);
    free(m);
}

static int register_unlocked(KvMover *m, void *base, size_t len, int *region, BraidError *err) {
    if (!base || len == 0) return braid_error_set(err, "kv_mover: registering an empty region (base %p, %zu bytes)", base, len);
    if (m->n_regions == m->cap_regions) {
        int cap = m->cap_regions ? 2 * m->cap_regions : 4;
        LocalRegion *r = realloc(m->regions, (size_t)cap * sizeof *r);
        if (!r) return braid_error_set(err, "kv_mover: out of memory");
        m->regions = r;
        m->cap_regions = cap;
    }
    LocalRegion *r = &m->regions[m->n_regions];
    *r = (LocalRegion){.base = base, .len = len};
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = base, .length = len};
    ucs_status_t st = ucp_mem_map(m->ctx, &mp, &r->memh);
    if (st != UCS_OK)
        return braid_error_set(err, "kv_mover: registering %zu bytes at %p: %s", len, base, ucs_status_string(st));
    st = ucp_rkey_pack(m->ctx, r->memh, &r->rkey_buf, &r->rkey_len);
    if (st != UCS_OK) {
        ucp_mem_unmap(m->ctx, r->memh);
        return braid_error_set(err, "kv_mover: packing the remote key of %zu bytes at %p: %s", len, base,
                               ucs_status_string(st));
    }
    *region = m->n_regions++;
    return 0;
}

static int describe_unlocked(KvMover *m, WireBuf *out, BraidError *err) {
    wire_put_u64(out, KV_DESC_MAGIC);
    wire_put_u64(out, m->addr_len);
    wire_put(out, m->addr, m->addr_len);
    wire_put_u64(out, (uint64_t)m->n_regions);
    for (int i = 0; i < m->n_regions; i++) {
        const LocalRegion *r = &m->regions[i];
        wire_put_u64(out, (uint64_t)(uintptr_t)r->base);
        wire_put_u64(out, r->len);
        wire_put_u64(out, r->rkey_len);
        wire_put(out, r->rkey_buf, r->rkey_len);
    }
    if (out->failed) return braid_error_set(err, "kv_mover: out of memory writing the description");
    return 0;
}

/* The next n bytes of r, borrowed (NULL and r->failed when fewer remain). */
static const uint8_t *wire_take(WireReader *r, uint64_t n) {
    if (r->failed || n > r->len - r->off) {
        r->failed = true;
        return NULL;
    }
    const uint8_t *p = r->data + r->off;
    r->off += n;
    return p;
}

/* Creates the endpoint and unpacks the keys of desc into p. */
static int peer_open(KvMover *m, Peer *p, const uint8_t *desc, size_t len, BraidError *err) {
    WireReader r = wire_reader(desc, len);
    uint64_t magic = wire_get_u64(&r);
    if (r.failed || magic != KV_DESC_MAGIC)
        return braid_error_set(err, "kv_mover: not a mover description (%zu bytes, bad magic)", len);
    uint64_t addr_len = wire_get_u64(&r);
    const uint8_t *addr = wire_take(&r, addr_len);
    uint64_t n_regions = wire_get_u64(&r);
    if (r.failed || addr_len == 0) return braid_error_set(err, "kv_mover: description truncated in the worker address");
    if (n_regions > (r.len - r.off) / 24)
        return braid_error_set(err, "kv_mover: description claims %llu regions in %zu bytes", (unsigned long long)n_regions,
                               r.len - r.off);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = (const ucp_address_t *)addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = on_ep_error, .arg = p}};
    ucs_status_t st = ucp_ep_create(m->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        p->ep = NULL;
        return braid_error_set(err, "kv_mover: creating an endpoint to the owner: %s", ucs_status_string(st));
    }
    p->regions = calloc(n_regions ? n_regions : 1, sizeof *p->regions);
    if (!p->regions) return braid_error_set(err, "kv_mover: out of memory");
    for (uint64_t i = 0; i < n_regions; i++) {
        RemoteRegion *rr = &p->regions[i];
        rr->base = wire_get_u64(&r);
        rr->len = wire_get_u64(&r);
        uint64_t key_len = wire_get_u64(&r);
        const uint8_t *key = wire_take(&r, key_len);
        if (r.failed || key_len == 0)
            return braid_error_set(err, "kv_mover: description truncated in region %llu", (unsigned long long)i);
        if (rr->base + rr->len < rr->base)
            return braid_error_set(err, "kv_mover: region %llu wraps the address space", (unsigned long long)i);
        st = ucp_ep_rkey_unpack(p->ep, key, &rr->rkey);
        if (st != UCS_OK) {
            rr->rkey = NULL;
            return braid_error_set(err, "kv_mover: unpacking the remote key of region %llu: %s", (unsigned long long)i,
                                   ucs_status_string(st));
        }
        p->n_regions = (int)i + 1;
    }
    if (r.off != r.len)
        return braid_error_set(err, "kv_mover: %zu stray bytes after the description", r.len - r.off);
    p->desc = malloc(len);
    if (!p->desc) return braid_error_set(err, "kv_mover: out of memory");
    memcpy(p->desc, desc, len);
    p->desc_len = len;
    return 0;
}

static int connect_unlocked(KvMover *m, int key, const uint8_t *desc, size_t len, int *peer, BraidError *err) {
    for (int i = 0; i < m->n_peers; i++) {
        Peer *old = m->peers[i];
        if (!old || old->key != key) continue;
        if (!old->broken && old->desc_len == len && memcmp(old->desc, desc, len) == 0) {
            *peer = i;
            return 0;
        }
        m->peers[i] = NULL;
        peer_free(m, old);
        break;
    }
    if (m->n_peers == m->cap_peers) {
        int cap = m->cap_peers ? 2 * m->cap_peers : 8;
        Peer **ps = realloc(m->peers, (size_t)cap * sizeof *ps);
        if (!ps) return braid_error_set(err, "kv_mover: out of memory");
        m->peers = ps;
        m->cap_peers = cap;
    }
    Peer *p = calloc(1, sizeof *p);
    if (!p) return braid_error_set(err, "kv_mover: out of memory");
    p->m = m;
    p->handle = m->n_peers;
    p->key = key;
    if (peer_open(m, p, desc, len, err)) {
        peer_free(m, p);
        return braid_error_wrap(err, "connecting to key %d", key);
    }
    m->peers[m->n_peers++] = p;
    *peer = p->handle;
    return 0;
}

static void disconnect_unlocked(KvMover *m, int peer) {
    Peer *p = peer_get(m, peer);
    if (!p) return;
    m->peers[peer] = NULL;
    peer_free(m, p);
}

static int batch_begin_unlocked(KvMover *m, int peer, KvMoveBatch **out, BraidError *err) {
    *out = NULL;
    Peer *p = peer_get(m, peer);
    if (!p) return braid_error_set(err, "kv_mover: no peer %d", peer);
    if (p->broken) return braid_error_set(err, "kv_mover: peer %d (key %d) is broken (%s)", peer, p->key, p->broken_why);
    KvMoveBatch *b = calloc(1, sizeof *b);
    if (!b) return braid_error_set(err, "kv_mover: out of memory");
    b->m = m;
    b->peer = peer;
    b->next = m->batches;
    if (m->batches) m->batches->prev = b;
    m->batches = b;
    *out = b;
    return 0;
}

/* Issues one read to UCX (room for its request made first: a request UCX returns must never go
 * untracked). -1 with b failed and err when UCX refuses it or memory runs out. */
static int issue_get(KvMoveBatch *b, Peer *p, int region, uint64_t offset, void *dst, uint64_t len, BraidError *err) {
    if (b->n_pending == b->cap_pending) {
        size_t cap = b->cap_pending ? 2 * b->cap_pending : 64;
        PendingGet *pg = realloc(b->pending, cap * sizeof *pg);
        if (!pg) {
            batch_fail(b, "out of memory");
            return braid_error_set(err, "kv_mover: out of memory");
        }
        b->pending = pg;
        b->cap_pending = cap;
    }
    const RemoteRegion *rr = &p->regions[region];
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb = {.send = on_get_done}, .user_data = b};
    ucs_status_ptr_t req = ucp_get_nbx(p->ep, dst, len, rr->base + offset, rr->rkey, &prm);
    if (UCS_PTR_IS_ERR(req)) {
        batch_fail(b, "read of %llu bytes at region %d offset %llu: %s", (unsigned long long)len, region,
                   (unsigned long long)offset, ucs_status_string(UCS_PTR_STATUS(req)));
        return braid_error_set(err, "kv_mover: get from peer %d (key %d): %s", p->handle, p->key, b->why);
    }
    if (req != NULL) b->pending[b->n_pending++] = (PendingGet){.req = req, .region = region, .offset = offset, .len = len};
    return 0;
}

static size_t batch_n_in_flight(const KvMoveBatch *b) { return b->n_pending - b->n_done; }

/* Issues queued reads while the batch has room in flight. */
static int batch_issue_queued(KvMoveBatch *b, Peer *p, BraidError *err) {
    while (b->queue_head < b->n_queued && batch_n_in_flight(b) < KV_MAX_IN_FLIGHT) {
        const QueuedGet *q = &b->queued[b->queue_head++];
        if (issue_get(b, p, q->region, q->offset, q->dst, q->len, err)) return -1;
    }
    if (b->queue_head == b->n_queued) b->queue_head = b->n_queued = 0;
    return 0;
}

static int get_unlocked(KvMoveBatch *b, int region, size_t offset, void *dst, size_t len, BraidError *err) {
    KvMover *m = b->m;
    Peer *p = peer_get(m, b->peer);
    if (!p) return braid_error_set(err, "kv_mover: get: the batch's peer was disconnected");
    if (p->broken) return braid_error_set(err, "kv_mover: get: peer %d (key %d) is broken (%s)", p->handle, p->key, p->broken_why);
    if (b->failed) return braid_error_set(err, "kv_mover: get: the batch already failed (%s)", b->why);
    if (region < 0 || region >= p->n_regions)
        return braid_error_set(err, "kv_mover: get: peer %d (key %d) has no region %d (it described %d)", p->handle, p->key,
                               region, p->n_regions);
    const RemoteRegion *rr = &p->regions[region];
    if (offset > rr->len || len > rr->len - offset)
        return braid_error_set(err, "kv_mover: get: %zu bytes at offset %zu run past region %d of peer %d (%llu bytes)", len,
                               offset, region, p->handle, (unsigned long long)rr->len);
    if (len == 0) return 0;
    if (!dst) return braid_error_set(err, "kv_mover: get: no destination for %zu bytes", len);
    if (b->n_queued > b->queue_head || batch_n_in_flight(b) >= KV_MAX_IN_FLIGHT) {
        if (b->n_queued == b->cap_queued) {
            size_t cap = b->cap_queued ? 2 * b->cap_queued : 256;
            QueuedGet *q = realloc(b->queued, cap * sizeof *q);
            if (!q) return braid_error_set(err, "kv_mover: out of memory");
            b->queued = q;
            b->cap_queued = cap;
        }
        b->queued[b->n_queued++] = (QueuedGet){.region = region, .offset = offset, .len = len, .dst = dst};
    } else if (issue_get(b, p, region, offset, dst, len, err)) {
        return -1;
    }
    b->n_gets++;
    b->bytes += len;
    return 0;
}

static int poll_unlocked(KvMoveBatch *b, BraidError *err) {
    KvMover *m = b->m;
    if (batch_in_flight(b)) progress_some(m);
    Peer *p = peer_get(m, b->peer);
    if (!b->failed && p && !p->broken && b->n_queued > b->queue_head) {
        BraidError ignored; /* a refusal fails the batch, reported below */
        batch_issue_queued(b, p, &ignored);
    }
    if (b->failed) {
        if (p) return braid_error_set(err, "kv_mover: batch from peer %d (key %d) failed: %s", p->handle, p->key, b->why);
        return braid_error_set(err, "kv_mover: batch failed: %s", b->why);
    }
    if (!p) return braid_error_set(err, "kv_mover: batch failed: its peer was disconnected");
    if (batch_in_flight(b) || b->n_queued > b->queue_head) {
        if (p->broken)
            return braid_error_set(err, "kv_mover: batch from peer %d (key %d) failed: %s (%zu reads in flight, %zu queued)",
                                   p->handle, p->key, p->broken_why, batch_n_in_flight(b), b->n_queued - b->queue_head);
        return 0;
    }
    batch_release_requests(b);
    return 1;
}

size_t kv_mover_batch_bytes(const KvMoveBatch *b) { return b->bytes; }

void kv_mover_batch_end(KvMoveBatch *b) {
    if (!b) return;
    KvMover *m = b->m;
    lock(m);
    batch_free(b);
    unlock(m);
}

void kv_mover_progress(KvMover *m) {
    lock(m);
    progress_some(m);
    unlock(m);
}

/* The "tl/dev" of each lane ucp_ep_print_info lists ("lane[0]:  1:tcp/lo.0 md[1] -> ... am rma_bw#0"),
 * without repeats, joined by spaces: "cma/memory tcp/lo". NULL when it cannot be had. */
static char *transports_of(ucp_ep_h ep) {
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (!f) return NULL;
    ucp_ep_print_info(ep, f);
    if (fclose(f) != 0 || !text) {
        free(text);
        return NULL;
    }
    char *out = calloc(1, text_len + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *colon = lane ? strstr(lane, "]:") : NULL;
        if (!colon) continue;
        char *tok = colon + 2;
        while (*tok == ' ') tok++;
        while (*tok >= '0' && *tok <= '9') tok++; /* the resource index "1:" */
        if (*tok == ':') tok++;
        size_t len = strcspn(tok, " ");
        char *dot = memchr(tok, '.', len); /* the path index ".0" */
        if (dot && memchr(tok, '/', (size_t)(dot - tok))) len = (size_t)(dot - tok);
        char name[64];
        if (len == 0 || len >= sizeof name || !memchr(tok, '/', len)) continue;
        memcpy(name, tok, len);
        name[len] = 0;
        bool seen = false;
        for (char *q = out; !seen && (q = strstr(q, name)) != NULL; q++) /* whole names only */
            seen = (q == out || q[-1] == ' ') && (q[len] == ' ' || q[len] == 0);
        if (!seen) n += (size_t)snprintf(out + n, text_len + 1 - n, "%s%s", n ? " " : "", name);
    }
    free(text);
    return out;
}

static const char *peer_transports_unlocked(KvMover *m, int peer) {
    Peer *p = peer_get(m, peer);
    if (!p || !p->ep) return "";
    if (!p->transports) p->transports = transports_of(p->ep);
    return p->transports ? p->transports : "";
}

/* ---- the public calls: each holds the mover's lock (the progress thread takes it too) ---- */

int kv_mover_register(KvMover *m, void *base, size_t len, int *region, BraidError *err) {
    lock(m);
    int rc = register_unlocked(m, base, len, region, err);
    unlock(m);
    return rc;
}

int kv_mover_describe(KvMover *m, WireBuf *out, BraidError *err) {
    lock(m);
    int rc = describe_unlocked(m, out, err);
    unlock(m);
    return rc;
}

int kv_mover_connect(KvMover *m, int key, const uint8_t *desc, size_t len, int *peer, BraidError *err) {
    lock(m);
    int rc = connect_unlocked(m, key, desc, len, peer, err);
    unlock(m);
    return rc;
}

void kv_mover_disconnect(KvMover *m, int peer) {
    lock(m);
    disconnect_unlocked(m, peer);
    unlock(m);
}

int kv_mover_batch_begin(KvMover *m, int peer, KvMoveBatch **out, BraidError *err) {
    lock(m);
    int rc = batch_begin_unlocked(m, peer, out, err);
    unlock(m);
    return rc;
}

int kv_mover_get(KvMoveBatch *b, int region, size_t offset, void *dst, size_t len, BraidError *err) {
    lock(b->m);
    int rc = get_unlocked(b, region, offset, dst, len, err);
    unlock(b->m);
    return rc;
}

int kv_mover_poll(KvMoveBatch *b, BraidError *err) {
    lock(b->m);
    int rc = poll_unlocked(b, err);
    unlock(b->m);
    return rc;
}

const char *kv_mover_peer_transports(KvMover *m, int peer) {
    lock(m);
    const char * rc = peer_transports_unlocked(m, peer);
    unlock(m);
    return rc;
}
