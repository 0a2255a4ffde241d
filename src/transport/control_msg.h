/*
 * control_msg.h — the typed control-plane messages between the coordinator and instance leaders.
 *
 * coordinator → leader: SUBMIT (a tokenized request), CANCEL, WORKFLOW_END, SHUTDOWN (drain done),
 * PREDICT (a workflow's K-step next-agent forecast, for the cache's eviction policy; sent before
 * the SUBMIT of the call that produced it).
 * leader → coordinator: READY (model loaded, pool size; or the load error), TOKENS (every token a
 * step sampled, for all its requests at once), FINISH (a request's end and usage, cached tokens
 * split by tier), STATS (periodic absolute counters, per cache tier; never ratios), KV_EVENTS (a
 * batch of the cache's events in vLLM's shape, BlockStored / BlockRemoved / AllBlocksCleared per
 * tier with reason, chained content hashes, parent hash, tenant and adapter names and where the
 * blocks are afterwards; they feed the router's per-instance index and the --events stream),
 * HIDDEN (a request's prefill hidden state, for the workflow predictor, sent once after the step that
 * sampled its first token, when its SUBMIT asked for it).
 * A request's identity travels as its names (tenant, adapter, workflow, agent), exact strings:
 * the leader's cache interns them, and content hashes are seeded by content_hash_namespace().
 * Each message is one MPI message whose tag is its type; the body is a wire.h encoding.
 * encode/decode are pure; decoded strings and arrays are malloc'd and freed by the *_free helpers.
 */
#ifndef BRAID_TRANSPORT_CONTROL_MSG_H
#define BRAID_TRANSPORT_CONTROL_MSG_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/cache_directive.h"
#include "common/token_logprob.h"
#include "transport/wire.h"

typedef enum {
    MSG_SUBMIT = 1,
    MSG_CANCEL,
    MSG_WORKFLOW_END,
    MSG_SHUTDOWN, /* u8 lost_ranks: 1 when a rank of the job died; every rank then exits without
                     MPI_Finalize, whose fence over the whole job may wait for the dead one forever */
    MSG_READY,
    MSG_TOKENS,
    MSG_FINISH,
    MSG_STATS,
    MSG_KV_EVENTS,
    MSG_PREDICT,
    MSG_HIDDEN,
    MSG_REJOIN, /* u64 pid, u64 start ticks: a respawned leader (--restart-instances) names its process
                   first thing, so the coordinator can watch it as the rank directory watches ranks */
    /* Leader to leader (KV block moves, move_msg.h): a prefix asked for, the blocks that hold it
     * (under a lease), the lease returned. */
    MSG_KV_EXPORT,
    MSG_KV_EXPORTED,
    MSG_KV_RELEASE,
    /* Adapters at run time (coord/lora_admin.h): LORA_LOAD (str name, str path) and LORA_UNLOAD
     * (str name) to a leader; it answers LORA_RESULT (u8 ok, str name, str error). */
    MSG_LORA_LOAD,
    MSG_LORA_UNLOAD,
    MSG_LORA_RESULT,
    /* A leader-to-leader move message (EXPORT/EXPORTED/RELEASE) for a leader the sender cannot reach
     * on its own communicator (a joined instance, --join-instance): sent to the coordinator, which
     * forwards it unchanged to the leader it names (move_msg.h, move_msg_relay_*). */
    MSG_KV_RELAY,
    /* Coordinator to a leader in another MPI job (joined, or spawned): empty, every second, so a
     * joined leader can tell its coordinator is gone by the silence (--coordinator-timeout). */
    MSG_COORD_ALIVE,
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
    uint8_t want_hidden;      /* send HIDDEN after the prefill (the coordinator's predictor reads it) */
    uint8_t segment_mode;     /* segment reuse (kv_cache.h SegmentReuseMode: 0 off, 1 exact, 2 approx) */
    uint8_t want_logprobs;    /* TOKENS carry each token's logprob and logprobs_top alternatives */
    int32_t logprobs_top;     /* 0..TOKEN_LOGPROB_MAX_TOP (decoding refuses others) */
    char *tenant, *adapter;   /* cache namespace; may be empty (= none) */
    char *workflow, *agent;   /* may be empty */
    int32_t *tokens;
    int n_tokens;
    CacheDirectives directives; /* splice and hints, resolved to token positions (none: zeroed) */
    /* A KV move the router chose (kv_moves.h): the leader rank of the instance that holds a longer
     * cached prefix of the prompt than this one, and how many blocks of it (0 blocks = no move). */
    int32_t pull_rank, pull_blocks;
    /* Structured output: a grammar spec (grammar/grammar.h; JSON text the coordinator checked with
     * grammar_spec_check), NULL or "" = unconstrained. The leader compiles it against its
     * vocabulary; one that does not compile finishes the request with FINISH_ERROR and the reason. */
    char *grammar;
    /* The tenant's weight in the instance's fair sharing (the key file's weight=; sched_fair.h);
     * <= 0 or not finite reads as 1. */
    float tenant_weight;
} MsgSubmit;

/* Wire form: i32 n, n x u64 request ids, n x i32 tokens, then per token a u8 flag and, when it is
 * 1, f32 logprob, i32 n_top, n_top x i32 ids, n_top x f32 logprobs (for requests that asked). */
typedef struct {
    int n;
    uint64_t *req_ids;
    int32_t *tokens;
    uint8_t *has_logprob;   /* (n) or NULL when encoding none */
    TokenLogprob *logprobs; /* (n); entry i meaningful where has_logprob[i] */
} MsgTokens;

typedef enum { FINISH_STOP = 0, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR } FinishReason;

/* The link a KV move went over (worker/kv_moves.h), for the router's per-pair rates. */
typedef enum { MOVE_LINK_NONE = 0, MOVE_LINK_HOST, MOVE_LINK_CUDA_IPC, MOVE_LINK_CUDA_STAGED } MoveLink;
/* "none", "host_ucx", "cuda_ipc", "cuda_staged"; "unknown" for anything else (logs, events). */
const char *move_link_name(int link);

typedef struct {
    uint64_t req_id;
    uint8_t reason;           /* FinishReason */
    int32_t prompt_tokens;
    int32_t cached_tokens;      /* prompt tokens served from the cache, device and host tiers together */
    int32_t cached_tokens_host; /* of those, the ones loaded back from the host tier */
    int32_t cached_tokens_remote; /* of those, the ones moved in from another instance for this request */
    int32_t reused_tokens;      /* prompt tokens whose K/V came from reused segments (not in cached_tokens) */
    int32_t completion_tokens, preemptions;
    char *error;              /* empty unless FINISH_ERROR */
    char *directive_outcomes; /* JSON array, one object per directive (sched_directives.h); empty when none */
    double move_s;            /* the KV move's measured time, reads queued to landed (0: no move landed) */
    uint8_t move_link;        /* MoveLink of that move */
} MsgFinish;

typedef struct {
    uint8_t ok;
    int32_t n_blocks, block_size, context_length;
    uint8_t kv_moves;         /* the instance can lend and take KV blocks (kv_moves.h) */
    uint64_t block_bytes;     /* one block's K/V bytes across layers (the move cost model's unit) */
    char *error;              /* why loading failed, when !ok */
    int32_t n_layers;         /* the model's layer count: a busy leader answers a move's ask between two of them (0: unknown) */
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
    uint64_t prefilled_tokens; /* prompt tokens its steps computed, chunk by chunk (SchedCounters.prefilled_tokens) */
    uint64_t move_declines;    /* KvMoveCounters.move_declines */
    uint64_t move_followers;   /* requests that waited behind an import in flight (worker/import_followers.h) */
    uint64_t prefetched_blocks, prefetch_hit_blocks, prefetch_wasted_blocks; /* PBKV's prefetch: loaded ahead, then used / evicted unused */
    /* Segment reuse: prompt tokens reused (of the computed ones' share), chunks found in the index,
     * admitted exactly / approximately, rejected for left context / window; prefill FLOPs saved. */
    uint64_t segment_reused_tokens, segment_candidates, segments_exact, segments_approx;
    uint64_t segments_rejected_context, segments_rejected_window, segment_flops_saved;
    /* Cache directives: requests that carried any, pins taken, pinned blocks expired / released
     * early, tokens copied by amortized splices / from other tenants' shared prefixes, blocks evicted
     * on request; pinned device blocks now (a gauge). */
    uint64_t directive_requests, pins, pin_expired_blocks, pin_revoked_blocks, spliced_tokens, shared_hit_tokens, directive_evicted_blocks;
    int32_t pinned_blocks;
    /* ForkKV (--lora-cache shared): residual pool blocks held / usable (gauges); prompt tokens whose
     * residual was cached, forked (base cached, residual computed), partially hit (residual cached,
     * base recomputed); residual blocks evicted. */
    int32_t residual_used_blocks, residual_total_blocks;
    uint64_t residual_hit_tokens, fork_tokens, partial_hit_tokens, residual_evicted_blocks;
    /* KV moves (kv_moves.h): blocks and bytes moved in from other instances, moves that failed or
     * timed out (the request then recomputed), blocks lent to other instances. */
    uint64_t moved_in_blocks, moved_in_bytes, move_failures, lent_blocks;
    /* Approximate segment guards (issue 35): near-duplicate chunks the LSH found a candidate for /
     * admitted (reused >= 1 token) and the tokens they reused; online probes that admitted /
     * rejected their span. */
    uint64_t segment_lsh_candidates, segment_lsh_admitted, segment_lsh_reused_tokens;
    uint64_t segment_probes_ok, segment_probes_rejected;
} MsgStats;

/* KV_EVENTS. The values mirror the cache's (kv_cache.h: CacheEventKind, CacheTier, the tier bits
 * of tiers_after, the reason strings) without this module depending on the cache. */
typedef enum { KV_EVENT_STORED = 1, KV_EVENT_REMOVED = 2, KV_EVENT_CLEARED = 3 } KvEventKind;
typedef enum { KV_TIER_DEVICE = 0, KV_TIER_HOST = 1 } KvEventTier;
enum { KV_ON_DEVICE = 1u << KV_TIER_DEVICE, KV_ON_HOST = 1u << KV_TIER_HOST };
typedef enum {
    KV_REASON_INSERT = 0,
    KV_REASON_DEMOTE,
    KV_REASON_LOAD,
    KV_REASON_EVICT,
    KV_REASON_HOST_EVICT,
    KV_REASON_CLEAR,
    KV_REASON_OTHER, /* a reason this build does not know; logged as "other" */
    KV_REASON_END
} KvEventReason;

/* One event. Encoding borrows the strings and hashes; decoding mallocs them (msg_kv_events_free). */
typedef struct {
    uint8_t kind;         /* KvEventKind */
    uint8_t tier;         /* KvEventTier (meaningless for CLEARED) */
    uint8_t reason;       /* KvEventReason */
    uint8_t tiers_after;  /* KV_ON_DEVICE | KV_ON_HOST: where the blocks are afterwards (0 = gone) */
    uint64_t parent_hash; /* chained hash of the block before the first one; 0 at a root */
    char *tenant, *adapter; /* names, "" = none (never NULL once decoded) */
    int n_blocks;
    uint64_t *hashes;     /* (n_blocks) chained content hashes, in sequence order */
    int block_size;       /* tokens per block on the instance */
    int n_tokens;         /* n_blocks * block_size on an insert (vLLM's BlockStored.token_ids), else 0 */
    int32_t *tokens;      /* (n_tokens) the blocks' token ids, or NULL */
} MsgKvEvent;

typedef struct {
    int n;
    MsgKvEvent *events;
} MsgKvEvents;

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

/* Wire form: i32 count, then per event u8 kind, u8 tier, u8 reason, u8 tiers_after, u64 parent
 * hash, str tenant, str adapter, i32 n_blocks, n_blocks x u64 hashes, i32 block_size, i32 n_tokens,
 * n_tokens x i32 tokens. A sender that batches events as they happen writes the count with
 * msg_kv_events_begin, appends each event, then patches the count with msg_kv_events_finish;
 * msg_kv_events_encode does all three for an array. */
void msg_kv_events_begin(WireBuf *b);
void msg_kv_event_append(WireBuf *b, const MsgKvEvent *e);
void msg_kv_events_finish(WireBuf *b, int n);
void msg_kv_events_encode(WireBuf *b, const MsgKvEvent *events, int n);
/* Refuses (-1, nothing to free) a truncated or over-long body, a count or length the bytes cannot
 * hold, an unknown kind or tier, or tier bits beyond device and host. An unknown reason decodes
 * as KV_REASON_OTHER. */
int msg_kv_events_decode(WireReader *r, MsgKvEvents *m);
void msg_kv_events_free(MsgKvEvents *m);
/* "insert", "demote", "load", "evict", "host_evict", "clear" <-> KvEventReason ("other" else). */
const char *kv_reason_name(int reason);
int kv_reason_code(const char *name);
/* "BlockStored", "BlockRemoved", "AllBlocksCleared" (vLLM's event names); "unknown" else. */
const char *kv_event_type_name(int kind);

/* PREDICT: after workflow `workflow` called `agent`, prob[(s - 1) * n_agents + i] is the
 * probability that its s-th next call (s = 1..k) invokes agents[i] (unconditional: what a row
 * lacks of 1 is the chance it ended first), as kv_cache_predict takes it.
 * Wire form: str workflow, str agent, i32 k, i32 n_agents, n_agents x str, k * n_agents x f32.
 * Encoding borrows everything; decoding mallocs (msg_predict_free). */
#define MSG_PREDICT_MAX_K 64
#define MSG_PREDICT_MAX_AGENTS 4096
typedef struct {
    char *workflow, *agent;
    int k, n_agents;
    char **agents; /* (n_agents) */
    float *prob;   /* (k, n_agents) */
} MsgPredict;

/* HIDDEN: the post-norm hidden state of a request's last prompt token. */
#define MSG_HIDDEN_MAX_DIM 65536
typedef struct {
    uint64_t req_id;
    int dim;
    float *values; /* (dim) */
} MsgHidden;

void msg_hidden_encode(WireBuf *b, const MsgHidden *m);
/* Refuses (-1, nothing to free) a truncated or over-long body, dim outside [1, MSG_HIDDEN_MAX_DIM]
 * and values that are not finite. */
int msg_hidden_decode(WireReader *r, MsgHidden *m);
void msg_hidden_free(MsgHidden *m);

void msg_predict_encode(WireBuf *b, const MsgPredict *m);
/* Refuses (-1, nothing to free) a truncated or over-long body, an empty workflow name, k outside
 * [1, MSG_PREDICT_MAX_K], n_agents outside [0, MSG_PREDICT_MAX_AGENTS], counts the bytes cannot
 * hold, and a probability that is not a finite number in [0, 1] (up to 1.001, read as 1: rounding). */
int msg_predict_decode(WireReader *r, MsgPredict *m);
void msg_predict_free(MsgPredict *m);

const char *finish_reason_name(int reason);

#endif
