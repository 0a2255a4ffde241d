/*
 * control_msg.h — the typed control-plane messages between the coordinator and instance leaders.
 *
 * coordinator → leader: SUBMIT (a tokenized request), CANCEL, WORKFLOW_END, SHUTDOWN (drain done).
 * leader → coordinator: READY (model loaded, pool size; or the load error), TOKENS (every token a
 * step sampled, for all its requests at once), FINISH (a request's end and usage, cached tokens
 * split by tier), STATS (periodic absolute counters, per cache tier; never ratios), KV_STORED /
 * KV_EVICTED (chained content hashes of blocks that entered or entirely left the instance's cache,
 * whatever tier; they feed the router's per-instance index).
 * A request's identity travels as its names (tenant, adapter, workflow, agent), exact strings:
 * the leader's cache interns them, and content hashes are seeded by content_hash_namespace().
 * Each message is one MPI message whose tag is its type; the body is a wire.h encoding.
 * encode/decode are pure; decoded strings and arrays are malloc'd and freed by the *_free helpers.
 */
#ifndef BRAID_TRANSPORT_CONTROL_MSG_H
#define BRAID_TRANSPORT_CONTROL_MSG_H

#include <stdbool.h>
#include <stdint.h>

#include "transport/wire.h"

typedef enum {
    MSG_SUBMIT = 1,
    MSG_CANCEL,
    MSG_WORKFLOW_END,
    MSG_SHUTDOWN,
    MSG_READY,
    MSG_TOKENS,
    MSG_FINISH,
    MSG_STATS,
    MSG_KV_STORED,
    MSG_KV_EVICTED,
    MSG_TYPE_END
} MsgType;

const char *msg_type_name(int type);

typedef struct {
    uint64_t req_id;
    int32_t max_tokens;
    float temperature, top_p;
    int32_t top_k;
    uint64_t seed;
    uint8_t ignore_eos;
    char *tenant, *adapter;   /* cache namespace; may be empty (= none) */
    char *workflow, *agent;   /* may be empty */
    int32_t *tokens;
    int n_tokens;
} MsgSubmit;

typedef struct {
    int n;
    uint64_t *req_ids;
    int32_t *tokens;
} MsgTokens;

typedef enum { FINISH_STOP = 0, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR } FinishReason;

typedef struct {
    uint64_t req_id;
    uint8_t reason;           /* FinishReason */
    int32_t prompt_tokens;
    int32_t cached_tokens;      /* prompt tokens served from the cache, device and host tiers together */
    int32_t cached_tokens_host; /* of those, the ones loaded back from the host tier */
    int32_t completion_tokens, preemptions;
    char *error;              /* empty unless FINISH_ERROR */
} MsgFinish;

typedef struct {
    uint8_t ok;
    int32_t n_blocks, block_size, context_length;
    char *error;              /* why loading failed, when !ok */
} MsgReady;

/* Absolute values since the instance started (gauges: now). Prompt tokens at first admission are
 * device hits + host hits + computed; block counters are the cache's (kv_cache.h). */
typedef struct {
    int32_t waiting, running;
    int32_t pool_used_blocks, pool_total_blocks; /* device tier: in use (held by requests), usable total */
    int32_t host_used_blocks, host_total_blocks; /* host tier: occupied (cached + in use), usable total; 0 = off */
    uint64_t cached_prompt_tokens_device, cached_prompt_tokens_host, computed_prompt_tokens;
    uint64_t demoted_blocks, loaded_blocks, host_evicted_blocks, device_evicted_blocks;
    uint64_t preemptions, generated_tokens;
} MsgStats;

/* KV_STORED and KV_EVICTED: chained block hashes (content_hash.h). */
typedef struct {
    int n;
    uint64_t *hashes;
} MsgHashes;

void msg_submit_encode(WireBuf *b, const MsgSubmit *m);
int msg_submit_decode(WireReader *r, MsgSubmit *m);
void msg_submit_free(MsgSubmit *m);

void msg_tokens_encode(WireBuf *b, const MsgTokens *m);
int msg_tokens_decode(WireReader *r, MsgTokens *m);
void msg_tokens_free(MsgTokens *m);

void msg_finish_encode(WireBuf *b, const MsgFinish *m);
int msg_finish_decode(WireReader *r, MsgFinish *m);
void msg_finish_free(MsgFinish *m);

void msg_ready_encode(WireBuf *b, const MsgReady *m);
int msg_ready_decode(WireReader *r, MsgReady *m);
void msg_ready_free(MsgReady *m);

void msg_stats_encode(WireBuf *b, const MsgStats *m);
int msg_stats_decode(WireReader *r, MsgStats *m);

void msg_hashes_encode(WireBuf *b, const MsgHashes *m);
int msg_hashes_decode(WireReader *r, MsgHashes *m);
void msg_hashes_free(MsgHashes *m);

const char *finish_reason_name(int reason);

#endif
