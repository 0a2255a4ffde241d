#include "coord/kv_event_publisher.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "common/log.h"
#include "transport/msgpack.h"

/* One published batch kept for replay. */
typedef struct {
    uint64_t seq;
    uint8_t *payload;
    size_t len;
} ReplayEntry;

struct KvEventPublisher {
    void *ctx, *pub, *replay; /* replay NULL when no replay endpoint */
    char *topic;
    uint64_t next_seq;        /* publishing thread only */
    pthread_mutex_t mu;       /* guards the ring */
    ReplayEntry *ring;
    int ring_cap, ring_len, ring_head; /* ring_head: oldest entry */
    pthread_t replay_thread;
    bool replay_started;
    atomic_bool stop;
};

/* Replay polls this often for the stop flag. */
enum { REPLAY_POLL_MS = 100 };

/* ---- encoding (vLLM's KVEventBatch as msgspec writes array-like tagged structs) ---- */

static const char *medium_name(int tier) { return tier == KV_TIER_HOST ? "CPU" : "GPU"; }

static void put_hashes(WireBuf *b, const MsgKvEvent *e) {
    msgpack_put_array(b, (uint32_t)e->n_blocks);
    for (int i = 0; i < e->n_blocks; i++) msgpack_put_uint(b, e->hashes[i]);
}

static void put_optional_name(WireBuf *b, const char *name) {
    if (name && *name) msgpack_put_cstr(b, name);
    else msgpack_put_nil(b);
}

static void put_block_stored(WireBuf *b, const MsgKvEvent *e) {
    msgpack_put_array(b, 8);
    msgpack_put_cstr(b, "BlockStored");
    put_hashes(b, e);
    if (e->parent_hash) msgpack_put_uint(b, e->parent_hash);
    else msgpack_put_nil(b);
    int n_tokens = e->tokens ? e->n_tokens : 0;
    msgpack_put_array(b, (uint32_t)n_tokens);
    for (int i = 0; i < n_tokens; i++) msgpack_put_int(b, e->tokens[i]);
    msgpack_put_int(b, e->block_size);
    msgpack_put_nil(b); /* lora_id: Braid names adapters, it has no integer ids */
    msgpack_put_cstr(b, medium_name(e->tier));
    put_optional_name(b, e->adapter);
}

static void put_block_removed(WireBuf *b, const MsgKvEvent *e) {
    msgpack_put_array(b, 3);
    msgpack_put_cstr(b, "BlockRemoved");
    put_hashes(b, e);
    msgpack_put_cstr(b, medium_name(e->tier));
}

void kv_event_batch_encode(WireBuf *out, int instance, const MsgKvEvent *events, int n, double ts) {
    msgpack_put_array(out, 3);
    msgpack_put_f64(out, ts);
    msgpack_put_array(out, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        const MsgKvEvent *e = &events[i];
        if (e->kind == KV_EVENT_STORED) put_block_stored(out, e);
        else if (e->kind == KV_EVENT_REMOVED) put_block_removed(out, e);
        else {
            msgpack_put_array(out, 1);
            msgpack_put_cstr(out, "AllBlocksCleared");
        }
    }
    msgpack_put_int(out, instance);
}

/* ---- replay ring ---- */

static void ring_push(KvEventPublisher *p, uint64_t seq, const uint8_t *payload, size_t len) {
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        LOG_WARN("kv-events", "out of memory keeping batch %llu for replay; it cannot be replayed", (unsigned long long)seq);
        return;
    }
    memcpy(copy, payload, len);
    pthread_mutex_lock(&p->mu);
    int slot;
    if (p->ring_len == p->ring_cap) {
        slot = p->ring_head;
        free(p->ring[slot].payload);
        p->ring_head = (p->ring_head + 1) % p->ring_cap;
    } else {
        slot = (p->ring_head + p->ring_len++) % p->ring_cap;
    }
    p->ring[slot] = (ReplayEntry){.seq = seq, .payload = copy, .len = len};
    pthread_mutex_unlock(&p->mu);
}

static void put_seq(uint8_t out[8], int64_t seq) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)seq >> (8 * (7 - i)));
}

static int64_t get_seq(const uint8_t in[8]) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | in[i];
    return (int64_t)v;
}

/* Frames of one replay answer: client id, empty delimiter, seq, payload. */
static int send_replay_frames(void *sock, const void *id, size_t id_len, int64_t seq, const void *payload, size_t len) {
    uint8_t seq_bytes[8];
    put_seq(seq_bytes, seq);
    if (zmq_send(sock, id, id_len, ZMQ_SNDMORE) < 0 || zmq_send(sock, "", 0, ZMQ_SNDMORE) < 0 ||
        zmq_send(sock, seq_bytes, 8, ZMQ_SNDMORE) < 0 || zmq_send(sock, payload, len, 0) < 0)
        return -1;
    return 0;
}

/* Position (0 = oldest) of the first kept batch with seq >= want, ring_len when none. The kept
 * seqs increase from the oldest on, so a binary search finds it. Caller holds mu. */
static int ring_find(const KvEventPublisher *p, uint64_t want) {
    int lo = 0, hi = p->ring_len;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (p->ring[(p->ring_head + mid) % p->ring_cap].seq < want) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Sends every kept batch with seq >= start to the client, then the end marker. Each batch is
 * copied out under the lock and sent without it, so publishing is never held up by a slow client;
 * batches published meanwhile are sent too. */
static void answer_replay(KvEventPublisher *p, const uint8_t *id, size_t id_len, int64_t start) {
    for (uint64_t want = (uint64_t)start;;) {
        pthread_mutex_lock(&p->mu);
        int k = ring_find(p, want);
        ReplayEntry e = {0};
        uint8_t *copy = NULL;
        bool found = k < p->ring_len, copied = false;
        if (found) {
            e = p->ring[(p->ring_head + k) % p->ring_cap];
            if ((copy = malloc(e.len + 1))) {
                memcpy(copy, e.payload, e.len);
                copied = true;
            }
        }
        pthread_mutex_unlock(&p->mu);
        if (!found) break;
        if (!copied) {
            LOG_WARN("kv-events", "out of memory replaying batch %llu; replay cut short", (unsigned long long)e.seq);
            break;
        }
        int rc = send_replay_frames(p->replay, id, id_len, (int64_t)e.seq, copy, e.len);
        free(copy);
        if (rc) {
            LOG_WARN("kv-events", "replay: sending batch %llu failed: %s", (unsigned long long)e.seq, zmq_strerror(zmq_errno()));
            return;
        }
        want = e.seq + 1;
    }
    if (send_replay_frames(p->replay, id, id_len, -1, "", 0))
        LOG_WARN("kv-events", "replay: sending the end marker failed: %s", zmq_strerror(zmq_errno()));
}

/* Reads one request: [id, "", start seq] from a REQ client or [id, start seq] from a DEALER. */
static void serve_one_request(KvEventPublisher *p) {
    uint8_t id[256], frame[16];
    int id_len = zmq_recv(p->replay, id, sizeof id, 0);
    if (id_len < 0) return;
    int64_t start = -1;
    int more = 1;
    size_t more_len = sizeof more;
    while (zmq_getsockopt(p->replay, ZMQ_RCVMORE, &more, &more_len) == 0 && more) {
        int got = zmq_recv(p->replay, frame, sizeof frame, 0);
        if (got == 8) start = get_seq(frame);
    }
    if (id_len > (int)sizeof id || start < 0) {
        LOG_WARN("kv-events", "replay: malformed request ignored (want an 8-byte big-endian start sequence)");
        return;
    }
    answer_replay(p, id, (size_t)id_len, start);
}

static void *replay_main(void *arg) {
    KvEventPublisher *p = arg;
    while (!atomic_load(&p->stop)) {
        zmq_pollitem_t item = {.socket = p->replay, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&item, 1, REPLAY_POLL_MS);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            LOG_WARN("kv-events", "replay socket poll failed: %s; replay stops", zmq_strerror(zmq_errno()));
            break;
        }
        if (rc > 0) serve_one_request(p);
    }
    return NULL;
}

/* ---- life cycle ---- */

/* The replay socket queues a whole answer without a high-water mark: a ROUTER drops what goes past
 * its mark, and one answer is bounded by the ring anyway. */
static void *bound_socket(KvEventPublisher *p, int type, const char *endpoint, BraidError *err) {
    void *s = zmq_socket(p->ctx, type);
    int linger = 0, unlimited = 0;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
        (type == ZMQ_ROUTER && zmq_setsockopt(s, ZMQ_SNDHWM, &unlimited, sizeof unlimited)) || zmq_bind(s, endpoint)) {
        braid_error_set(err, "kv events: cannot bind %s socket to %s: %s", type == ZMQ_PUB ? "PUB" : "ROUTER", endpoint,
                        zmq_strerror(zmq_errno()));
        if (s) zmq_close(s);
        return NULL;
    }
    return s;
}

KvEventPublisher *kv_event_publisher_new(const KvEventPublisherConfig *cfg, BraidError *err) {
    KvEventPublisher *p = calloc(1, sizeof *p);
    if (!p) {
        braid_error_set(err, "kv events: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    p->ring_cap = cfg->replay_batches > 0 ? cfg->replay_batches : KV_EVENT_REPLAY_DEFAULT;
    p->ring = calloc((size_t)p->ring_cap, sizeof *p->ring);
    p->topic = strdup(cfg->topic ? cfg->topic : "");
    p->ctx = zmq_ctx_new();
    if (!p->ring || !p->topic || !p->ctx) {
        braid_error_set(err, "kv events: out of memory");
        kv_event_publisher_free(p);
        return NULL;
    }
    if (!(p->pub = bound_socket(p, ZMQ_PUB, cfg->endpoint, err)) ||
        (cfg->replay_endpoint && !(p->replay = bound_socket(p, ZMQ_ROUTER, cfg->replay_endpoint, err)))) {
        kv_event_publisher_free(p);
        return NULL;
    }
    if (p->replay) {
        if (pthread_create(&p->replay_thread, NULL, replay_main, p)) {
            braid_error_set(err, "kv events: cannot start the replay thread");
            kv_event_publisher_free(p);
            return NULL;
        }
        p->replay_started = true;
    }
    return p;
}

void kv_event_publisher_free(KvEventPublisher *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    if (p->replay_started) pthread_join(p->replay_thread, NULL);
    if (p->replay) zmq_close(p->replay);
    if (p->pub) zmq_close(p->pub);
    if (p->ctx) zmq_ctx_term(p->ctx);
    for (int k = 0; p->ring && k < p->ring_len; k++) free(p->ring[(p->ring_head + k) % p->ring_cap].payload);
    free(p->ring);
    free(p->topic);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static double wall_clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sends one encoded batch under the next sequence number and keeps it for replay. */
static int publish_encoded(KvEventPublisher *p, int instance, int n, const WireBuf *buf) {
    if (buf->failed) {
        LOG_WARN("kv-events", "instance %d: out of memory encoding a batch of %d events; batch dropped", instance, n);
        return -1;
    }
    uint8_t seq_bytes[8];
    put_seq(seq_bytes, (int64_t)p->next_seq);
    if (zmq_send(p->pub, p->topic, strlen(p->topic), ZMQ_SNDMORE) < 0 || zmq_send(p->pub, seq_bytes, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(p->pub, buf->data, buf->len, 0) < 0) {
        LOG_WARN("kv-events", "instance %d: publishing a batch failed: %s", instance, zmq_strerror(zmq_errno()));
        return -1;
    }
    if (p->replay) ring_push(p, p->next_seq, buf->data, buf->len);
    p->next_seq++;
    return 0;
}

int kv_event_publisher_publish(KvEventPublisher *p, int instance, const MsgKvEvent *events, int n) {
    if (n <= 0) return 0;
    WireBuf buf = {0};
    kv_event_batch_encode(&buf, instance, events, n, wall_clock_seconds());
    int rc = publish_encoded(p, instance, n, &buf);
    wire_buf_free(&buf);
    return rc;
}

uint64_t kv_event_publisher_sent(const KvEventPublisher *p) { return p->next_seq; }
