#include "transport/kv_mover.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ucp/api/ucp.h>

#include "common/grow.h"

/* A batch issues at most this many reads before it makes UCX progress, so the send queues of a
 * transport never hold thousands of requests at once. */
#define KV_MOVER_INFLIGHT 1024

typedef struct {
    void *base;
    size_t len;
    ucp_mem_h memh;
} Region;

typedef struct {
    uint64_t base, len;
    ucp_rkey_h rkey;
} RemoteRegion;

typedef struct {
    bool used, broken;
    int key;
    uint8_t *desc; /* the description connected to, to tell a reconnect from a new owner */
    size_t desc_len;
    ucp_ep_h ep;
    RemoteRegion *regions;
    int n_regions;
    char transports[128];
} Peer;

struct KvMover {
    ucp_context_h ctx;
    ucp_worker_h worker;
    /* The progress thread: transports that emulate RMA with messages (TCP, and shared memory for
     * small reads) need the lender's worker to progress, and a leader's loop only comes round between
     * engine steps (hundreds of ms on a CPU). */
    pthread_t progress_thread;
    bool have_thread;
    atomic_bool stop;
    Region *regions;
    int n_regions, cap_regions;
    Peer *peers;
    int n_peers, cap_peers;
};

/* One queued read, until UCX completes it. */
typedef struct {
    int region;
    uint64_t raddr;
    void *dst;
    size_t len;
} PendingGet;

struct KvMoveBatch {
    KvMover *m;
    int peer;
    PendingGet *gets;
    int n_gets, cap_gets;
    int next;              /* the next get to issue */
    void **inflight;       /* UCX requests not yet completed (NULL slots are done) */
    int n_inflight;
    size_t bytes;
    bool failed;
    char why[160];
};

static int ucx_error(BraidError *err, const char *what, ucs_status_t st) {
    return braid_error_set(err, "UCX: %s: %s", what, ucs_status_string(st));
}

/* Progresses the worker; naps 50 us while traffic is recent, 1 ms once it has been quiet 10 ms. */
static void *progress_loop(void *arg) {
    KvMover *m = arg;
    int quiet = 0;
    while (!atomic_load(&m->stop)) {
        if (ucp_worker_progress(m->worker)) {
            quiet = 0;
            continue;
        }
        struct timespec ts = {0, quiet < 200 ? 50000 : 1000000};
        quiet++;
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int kv_mover_create(KvMover **out, BraidError *err) {
    *out = NULL;
    KvMover *m = calloc(1, sizeof *m);
    if (!m) return braid_error_set(err, "kv mover: out of memory");
    ucp_config_t *config;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        free(m);
        return ucx_error(err, "reading the configuration", st);
    }
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED, .features = UCP_FEATURE_RMA,
                           .mt_workers_shared = 1};
    st = ucp_init(&params, config, &m->ctx);
    ucp_config_release(config);
    if (st != UCS_OK) {
        free(m);
        return ucx_error(err, "ucp_init", st);
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_MULTI};
    if ((st = ucp_worker_create(m->ctx, &wp, &m->worker)) != UCS_OK) {
        ucp_cleanup(m->ctx);
        free(m);
        return ucx_error(err, "ucp_worker_create", st);
    }
    ucp_worker_attr_t attr = {.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE};
    if ((st = ucp_worker_query(m->worker, &attr)) != UCS_OK || attr.thread_mode != UCS_THREAD_MODE_MULTI) {
        kv_mover_destroy(m);
        return braid_error_set(err, "UCX: this build gives no multi-threaded worker (needed for the progress thread)");
    }
    atomic_init(&m->stop, false);
    if (pthread_create(&m->progress_thread, NULL, progress_loop, m)) {
        kv_mover_destroy(m);
        return braid_error_set(err, "kv mover: could not start the progress thread");
    }
    m->have_thread = true;
    *out = m;
    return 0;
}

int kv_mover_register(KvMover *m, void *base, size_t len, int *region, BraidError *err) {
    if (braid_grow((void **)&m->regions, &m->cap_regions, m->n_regions + 1, sizeof *m->regions))
        return braid_error_set(err, "kv mover: out of memory");
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH, .address = base, .length = len};
    Region *r = &m->regions[m->n_regions];
    ucs_status_t st = ucp_mem_map(m->ctx, &mp, &r->memh);
    if (st != UCS_OK) return ucx_error(err, "registering KV memory (ucp_mem_map)", st);
    r->base = base;
    r->len = len;
    *region = m->n_regions++;
    return 0;
}

int kv_mover_describe(KvMover *m, WireBuf *out, BraidError *err) {
    ucp_address_t *addr;
    size_t addr_len;
    ucs_status_t st = ucp_worker_get_address(m->worker, &addr, &addr_len);
    if (st != UCS_OK) return ucx_error(err, "ucp_worker_get_address", st);
    wire_put_u64(out, addr_len);
    wire_put(out, addr, addr_len);
    ucp_worker_release_address(m->worker, addr);
    wire_put_i32(out, m->n_regions);
    for (int i = 0; i < m->n_regions; i++) {
        void *rkey;
        size_t rkey_len;
        if ((st = ucp_rkey_pack(m->ctx, m->regions[i].memh, &rkey, &rkey_len)) != UCS_OK) return ucx_error(err, "ucp_rkey_pack", st);
        wire_put_u64(out, (uint64_t)(uintptr_t)m->regions[i].base);
        wire_put_u64(out, m->regions[i].len);
        wire_put_u64(out, rkey_len);
        wire_put(out, rkey, rkey_len);
        ucp_rkey_buffer_release(rkey);
    }
    return out->failed ? braid_error_set(err, "kv mover: out of memory describing this rank") : 0;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    (void)status;
    ((Peer *)arg)->broken = true;
}

/* Closes the endpoint (forcibly: a broken peer would never answer a flush) and frees the keys. */
static void peer_close(KvMover *m, Peer *p) {
    for (int i = 0; i < p->n_regions; i++)
        if (p->regions[i].rkey) ucp_rkey_destroy(p->regions[i].rkey);
    free(p->regions);
    if (p->ep) {
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = ucp_ep_close_nbx(p->ep, &rp);
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(m->worker);
            ucp_request_free(req);
        }
    }
    free(p->desc);
    memset(p, 0, sizeof *p);
}

/* Parses a description into p's endpoint and keys. */
static int peer_open(KvMover *m, Peer *p, const uint8_t *desc, size_t len, BraidError *err) {
    WireReader r = wire_reader(desc, len);
    uint64_t addr_len = wire_get_u64(&r);
    if (r.failed || addr_len > len) return braid_error_set(err, "kv mover: malformed peer description");
    const uint8_t *addr = desc + r.off;
    r.off += addr_len;
    int n = wire_get_i32(&r);
    if (r.failed || n < 0 || n > 64) return braid_error_set(err, "kv mover: malformed peer description");
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = (const ucp_address_t *)addr, .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = on_ep_error, .arg = p}};
    ucs_status_t st = ucp_ep_create(m->worker, &ep, &p->ep);
    if (st != UCS_OK) return p->ep = NULL, ucx_error(err, "connecting to a lender (ucp_ep_create)", st);
    if (!(p->regions = calloc((size_t)n + 1, sizeof *p->regions))) return braid_error_set(err, "kv mover: out of memory");
    for (int i = 0; i < n; i++) {
        RemoteRegion *rr = &p->regions[i];
        rr->base = wire_get_u64(&r);
        rr->len = wire_get_u64(&r);
        uint64_t rkey_len = wire_get_u64(&r);
        if (r.failed || rkey_len > r.len - r.off) return braid_error_set(err, "kv mover: malformed peer description");
        st = ucp_ep_rkey_unpack(p->ep, desc + r.off, &rr->rkey);
        r.off += rkey_len;
        if (st != UCS_OK) return ucx_error(err, "unpacking a remote key", st);
        p->n_regions = i + 1;
    }
    if (r.off != r.len) return braid_error_set(err, "kv mover: malformed peer description");
    if (!(p->desc = malloc(len))) return braid_error_set(err, "kv mover: out of memory");
    memcpy(p->desc, desc, len);
    p->desc_len = len;
    return 0;
}

int kv_mover_connect(KvMover *m, int key, const uint8_t *desc, size_t len, int *peer, BraidError *err) {
    int at = -1, free_slot = -1;
    for (int i = 0; i < m->n_peers; i++) {
        if (m->peers[i].used && m->peers[i].key == key) at = i;
        else if (!m->peers[i].used && free_slot < 0) free_slot = i;
    }
    if (at >= 0) {
        Peer *p = &m->peers[at];
        if (!p->broken && p->desc_len == len && memcmp(p->desc, desc, len) == 0) return *peer = at, 0;
        peer_close(m, p); /* the owner restarted, or its endpoint broke: connect afresh */
        free_slot = at;
    }
    if (free_slot < 0) {
        if (braid_grow((void **)&m->peers, &m->cap_peers, m->n_peers + 1, sizeof *m->peers))
            return braid_error_set(err, "kv mover: out of memory");
        free_slot = m->n_peers++;
        memset(&m->peers[free_slot], 0, sizeof m->peers[free_slot]);
    }
    Peer *p = &m->peers[free_slot];
    if (peer_open(m, p, desc, len, err)) {
        peer_close(m, p);
        return -1;
    }
    p->used = true;
    p->key = key;
    *peer = free_slot;
    return 0;
}

void kv_mover_disconnect(KvMover *m, int peer) {
    if (peer >= 0 && peer < m->n_peers && m->peers[peer].used) peer_close(m, &m->peers[peer]);
}

int kv_mover_batch_begin(KvMover *m, int peer, KvMoveBatch **out, BraidError *err) {
    *out = NULL;
    if (peer < 0 || peer >= m->n_peers || !m->peers[peer].used) return braid_error_set(err, "kv mover: no such peer %d", peer);
    KvMoveBatch *b = calloc(1, sizeof *b);
    if (!b || !(b->inflight = calloc(KV_MOVER_INFLIGHT, sizeof *b->inflight))) {
        free(b);
        return braid_error_set(err, "kv mover: out of memory");
    }
    b->m = m;
    b->peer = peer;
    *out = b;
    return 0;
}

int kv_mover_get(KvMoveBatch *b, int region, size_t offset, void *dst, size_t len, BraidError *err) {
    const Peer *p = &b->m->peers[b->peer];
    if (region < 0 || region >= p->n_regions) return braid_error_set(err, "kv mover: the lender has no region %d", region);
    const RemoteRegion *rr = &p->regions[region];
    if (offset > rr->len || len > rr->len - offset)
        return braid_error_set(err, "kv mover: read of %zu bytes at %zu is outside the lender's region %d (%llu bytes)", len, offset, region,
                               (unsigned long long)rr->len);
    if (braid_grow((void **)&b->gets, &b->cap_gets, b->n_gets + 1, sizeof *b->gets)) return braid_error_set(err, "kv mover: out of memory");
    b->gets[b->n_gets++] = (PendingGet){.region = region, .raddr = rr->base + offset, .dst = dst, .len = len};
    b->bytes += len;
    return 0;
}

static void fail_batch(KvMoveBatch *b, const char *what, ucs_status_t st) {
    if (b->failed) return;
    b->failed = true;
    snprintf(b->why, sizeof b->why, "%s: %s", what, ucs_status_string(st));
}

/* Retires completed requests; the slots of finished ones become NULL. */
static void reap(KvMoveBatch *b) {
    int live = 0;
    for (int i = 0; i < b->n_inflight; i++) {
        void *req = b->inflight[i];
        ucs_status_t st = ucp_request_check_status(req);
        if (st == UCS_INPROGRESS) {
            b->inflight[live++] = req;
            continue;
        }
        if (st != UCS_OK) fail_batch(b, "a read failed", st);
        ucp_request_free(req);
    }
    b->n_inflight = live;
}

/* Issues queued reads while there is room in flight. */
static void issue(KvMoveBatch *b) {
    Peer *p = &b->m->peers[b->peer];
    if (!p->ep) fail_batch(b, "the connection to the lender was closed", UCS_ERR_CONNECTION_RESET);
    while (!b->failed && b->next < b->n_gets && b->n_inflight < KV_MOVER_INFLIGHT) {
        const PendingGet *g = &b->gets[b->next++];
        ucp_request_param_t rp = {.op_attr_mask = 0};
        void *req = ucp_get_nbx(p->ep, g->dst, g->len, g->raddr, p->regions[g->region].rkey, &rp);
        if (UCS_PTR_IS_ERR(req)) fail_batch(b, "a read could not start", UCS_PTR_STATUS(req));
        else if (req) b->inflight[b->n_inflight++] = req;
    }
}

int kv_mover_poll(KvMoveBatch *b, BraidError *err) {
    Peer *p = &b->m->peers[b->peer];
    for (int round = 0; round < 4; round++) {
        ucp_worker_progress(b->m->worker);
        if (p->broken) fail_batch(b, "the connection to the lender broke", UCS_ERR_CONNECTION_RESET);
        reap(b);
        issue(b);
        if (b->failed || (b->next == b->n_gets && b->n_inflight == 0)) break;
    }
    if (b->failed) return braid_error_set(err, "kv mover: %s", b->why);
    /* A get's request completes when its bytes are in the local buffer. */
    return b->next < b->n_gets || b->n_inflight > 0 ? 0 : 1;
}

size_t kv_mover_batch_bytes(const KvMoveBatch *b) { return b ? b->bytes : 0; }

/* Progresses until the batch's requests complete, at most `rounds` times; true when none is left. */
static bool drain(KvMoveBatch *b, int rounds) {
    for (int i = 0; i < rounds && b->n_inflight > 0; i++) {
        ucp_worker_progress(b->m->worker);
        reap(b);
    }
    return b->n_inflight == 0;
}

void kv_mover_batch_end(KvMoveBatch *b) {
    if (!b) return;
    for (int i = 0; i < b->n_inflight; i++) ucp_request_cancel(b->m->worker, b->inflight[i]);
    if (!drain(b, 1000)) {
        /* Reads of a silent lender (emulated RMA over TCP waits for its progress) are not cancelled
         * by UCX: closing the endpoint by force completes them with an error, so no late read can
         * land in blocks the caller is about to give back. */
        Peer *p = &b->m->peers[b->peer];
        if (p->ep) {
            ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
            void *req = ucp_ep_close_nbx(p->ep, &rp);
            p->ep = NULL;
            p->broken = true;
            if (UCS_PTR_IS_PTR(req)) {
                while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(b->m->worker);
                ucp_request_free(req);
            }
        }
        drain(b, 1000);
        for (int i = 0; i < b->n_inflight; i++) ucp_request_free(b->inflight[i]); /* released when UCX is done */
    }
    free(b->inflight);
    free(b->gets);
    free(b);
}

void kv_mover_progress(KvMover *m) {
    if (m) ucp_worker_progress(m->worker);
}

const char *kv_mover_peer_transports(KvMover *m, int peer) {
    if (peer < 0 || peer >= m->n_peers || !m->peers[peer].used) return "";
    return m->peers[peer].transports;
}

void kv_mover_destroy(KvMover *m) {
    if (!m) return;
    if (m->have_thread) {
        atomic_store(&m->stop, true);
        pthread_join(m->progress_thread, NULL);
    }
    for (int i = 0; i < m->n_peers; i++)
        if (m->peers[i].used) peer_close(m, &m->peers[i]);
    free(m->peers);
    for (int i = 0; i < m->n_regions; i++) ucp_mem_unmap(m->ctx, m->regions[i].memh);
    free(m->regions);
    if (m->worker) ucp_worker_destroy(m->worker);
    if (m->ctx) ucp_cleanup(m->ctx);
    free(m);
}
