/* braid serve — the cluster under mpirun: rank 0 coordinates (HTTP API), the rest form instances. */
#include <arpa/inet.h>
#include <getopt.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_common.h"
#include "cli/cli_span_guard.h"
#include "cli/cli_lora.h"
#include "cli/commands.h"
#include "common/log.h"
#include "coord/auth.h"
#include "coord/coordinator.h"
#include "coord/instance_join.h"
#include "coord/explicit_caches.h"
#include "coord/http/http_api.h"
#include "coord/manifest_recorder.h"
#include "coord/metrics.h"
#include "coord/warm_start.h"
#include "model/model.h"
#include "predict/agent_predictor.h"
#include "transport/control_msg.h"
#include "transport/mpi_error.h"
#include "transport/rank_directory.h"
#include "transport/wire.h"
#include "worker/instance_leader.h"
#include "worker/kv_pool.h"
#include "worker/occupancy_log.h"
#include "worker/rank_binding.h"

static const char serve_usage[] =
    "usage: mpirun -n 1+I*T braid serve [options]   (or launch/braid-local, which runs mpirun for you)\n"
    "Rank 0 serves the OpenAI-compatible HTTP API; ranks 1.. form I instances of T tensor-parallel ranks.\n"
    "  --model PATH             GGUF file (default: $BRAID_MODEL or " BRAID_DEFAULT_MODEL ")\n"
    "                           or synthetic:NAME[:TOKENIZER.gguf] (llama3-8b, llama3-1b, smollm2-135m): that\n"
    "                           shape with generated weights and the default model's tokenizer (benchmarks)\n"
    CLI_CHAT_TEMPLATE_USAGE
    "  --tp T                   ranks per instance (default 1); I = (ranks - 1) / T. With --device cuda the ranks'\n"
    "                           all-reduces use NCCL on distinct GPUs, host-staged MPI when ranks share a GPU\n"
    "  --host ADDR              HTTP bind address (default 127.0.0.1); without --api-keys, a non-loopback address\n"
    "                           gets a start-up warning: anyone who reaches the port may call the API as any tenant\n"
    "  --api-keys FILE          require 'Authorization: Bearer KEY' (401 otherwise; GET /health stays open). One key\n"
    "                           a line: KEY tenant=NAME [adapters=A,B|*] [shares=NS,...]; # starts a comment. A\n"
    "                           request runs in its key's tenant (a different tenant, unless shared, is a 403) and may\n"
    "                           name only the listed adapters; the word admin lets a key load/unload adapters at run\n"
    "                           time (POST /v1/load_lora_adapter). A malformed file stops the server, naming the line\n"
    "  --tls-cert FILE, --tls-key FILE  serve HTTPS only, with this PEM certificate (chain) and private key\n"
    "  --port P                 HTTP port (default 8000)\n"
    "  --served-model-name NAME the model id clients use (default: the GGUF file name without .gguf)\n"
    "  --kv-blocks N            KV pool per instance, in blocks (default 512)\n"
    "  --block-size B           tokens per block (default 16)\n"
    "  --max-batch-tokens T     token budget per step (default 512)\n"
    "  --max-running N          most sequences in flight per instance (default 64)\n"
    "  --max-pending N          accepted unfinished requests before new ones get 429 (default 256)\n"
    "  --max-body-bytes N       largest request body; more gets 413 (default 8388608)\n"
    "  --max-connections N      connections still before their request line, in all (default 1024; the oldest is\n"
    "                           closed past it); the HTTP server holds at most 2N connections\n"
    "  --max-connections-per-client N  the same per client address (default 64); the server holds at most 4N\n"
    "  --http-timeout S         seconds a connection has to send its request line (default 10); an idle connection\n"
    "                           is closed after 3S\n"
    "  --cache radix|off        prefix cache (default radix)\n"
    CLI_CACHE_FLAGS_USAGE
    CLI_SEGMENT_FLAGS_USAGE
    CLI_SPAN_GUARD_USAGE
    "                           (served: approx is only what a request may ask for with \"segment_reuse\": \"approx\";\n"
    "                           requests without the field get exact)\n"
    CLI_SEGMENT_LSH_USAGE
    "  --pin-budget TOKENS      cache directives: the most prompt tokens one tenant may keep pinned on each\n"
    "                           instance (\"pin\" directives and cache_control); default a quarter of the KV pool;\n"
    "                           pins never take more than half of the pool, and give way when a request could\n"
    "                           not be admitted otherwise\n"
    "  --prefetch on|off        load host-tier blocks the policy expects the next calls to use into free device\n"
    "                           blocks on pure-decode steps (PBKV's conservative prefetch; never evicts for it;\n"
    "                           default on when the policy can value them: pbkv)\n"
    CLI_PBKV_FLAGS_USAGE
    "                           serve: --host-kv-blocks counts an instance's blocks (each of its T ranks holds a\n"
    "                           1/T share of every block), --host-kv-gib is per rank, and the default's 25% and\n"
    "                           the MemAvailable check cover all the worker ranks of a machine together\n"
    "  --route-slack N          router: skip an instance with N more requests than the least loaded (default 8)\n"
    "  --router cost|cache|balanced|round-robin  cost (default): the instance with the smallest estimated time\n"
    "                           to first token = queue ahead + prefill of what it lacks + moving in what another\n"
    "                           instance holds (rates start at --move-gbps / --move-prefill-tps and are learned\n"
    "                           from finished requests). Baselines: cache, the instance holding the longest cached\n"
    "                           prefix within the load slack; balanced (for --kv-moves on): the least loaded\n"
    "                           instance, ties to the one caching the most, the rest of the prefix moved in;\n"
    "                           round-robin: each request to the next live instance\n"
    "  --kv-moves on|off        on (default): when the chosen instance holds less of a prompt's prefix than\n"
    "                           another, it reads the missing KV blocks from that instance over UCX instead of\n"
    "                           recomputing them, if the cost model below says that is cheaper (CPU instances,\n"
    "                           rank by rank with --tp > 1; CUDA instances log why they take no part).\n"
    "                           UCX_TLS etc. pick the transport (one machine: TCP over loopback)\n"
    "  --move-gbps G            cost model: bandwidth of one move in GB/s (default 1.0; --router cost: its start)\n"
    "  --move-prefill-tps R     cost model: an instance's prefill rate in tokens/s (default 1000; --router cost: its start)\n"
    "  --move-timeout S         a move not done in S seconds is abandoned and the prefix recomputed (default 5)\n"
    "  --events PATH            JSONL log of routing decisions and of every instance's KV events (vLLM's\n"
    "                           BlockStored / BlockRemoved / AllBlocksCleared, per tier, with the instance)\n"
    "  --kv-events-endpoint EP  also publish every instance's KV events in vLLM's format (msgpack KVEventBatch,\n"
    "                           instance = data_parallel_rank) on a ZeroMQ PUB socket bound to EP, e.g.\n"
    "                           tcp://*:5557 (default off)\n"
    "  --kv-events-replay-endpoint EP  ROUTER socket that re-sends kept batches from a requested sequence\n"
    "                           number (the last 10000 batches), e.g. tcp://*:5558\n"
    "  --kv-events-topic T      first frame of every published message (default empty)\n"
    "  --manifest-capacity N    chunks the coordinator counts for GET /v1/cache/manifest (default 16384; the least\n"
    "                           counted is forgotten when full; 0 = no recording, the endpoint answers 404)\n"
    "  --manifest-out FILE      also append each chunk to FILE when first seen (one flushed line each: a valid\n"
    "                           manifest even after an abrupt stop; its counts are 1)\n"
    "  --warm-start FILE        prefill the prompt heads of a manifest (braid manifest export) once the instances\n"
    "                           are up, before the server reports ready (/health: \"warming\", 503); bad or stale\n"
    "                           lines are skipped with a logged reason; progress goes to the log\n"
    "  --warm-start-pin TTL     attach the directive {\"op\": \"pin\", \"ttl\": TTL} to each warm-start request\n"
    "  --warm-start-heads K     the start-up warm start prefills at most K heads (default 512; 0 = no bound); the\n"
    "                           server is ready once the bound is reached, the rest skipped and counted\n"
    "                           (/metrics: braid_warm_start_heads_total{outcome=\"left_out\"}). With --api-keys, lines\n"
    "                           of a tenant no key runs in are refused; skipped lines are summarised by reason\n"
    "  --warm-start-tokens M    ... and at most M prompt tokens (default 262144; 0 = no bound)\n"
    CLI_OCCUPANCY_FLAGS_USAGE
    "                           serve: every instance's leader appends its samples to FILE (\"instance\" names it)\n"
    "  --trace-out PATH         replayable trace of served requests and workflow ends, for braid sim; workflow\n"
    "                           calls carry their prefill hidden state (training data for --kind graph)\n"
    "  --predictor FILE         next-agent predictor trained by braid train-predictor; rank 0 forecasts each\n"
    "                           workflow's next agents with it and sends the forecasts to the instances' policy\n"
    "                           (pbkv, kvflow). A graph predictor trained with hidden states forecasts again when\n"
    "                           the instance returns the call's prefill hidden state with its first token.\n"
    "                           Default: a Markov predictor that learns online from the traffic\n"
    "  --predictor-learn        keep a --predictor file learning online too (default: frozen; a graph predictor\n"
    "                           learns only its Markov counts online, for first calls)\n"
    "  --markov 1|2             order of the online predictor when there is no --predictor (default 1)\n"
    "  --horizon K              forecast steps: PBKV's lookahead K (default 4, at most 64); --pbkv-k K is the same\n"
    "  --workflow-idle-timeout S  a workflow with no request in flight or arriving for S seconds is retired,\n"
    "                           as if it had ended\n"
    "                           (default 600; 0 = only POST /v1/workflows/{id}/end retires one)\n"
    "  --max-workflows N        workflows the tracker remembers (default 65536; retired ones go first)\n"
    "  --pid-file PATH          rank 0 writes its pid here (launch/braid-local signals it to drain)\n"
    "  --exit-status-file PATH  rank 0 writes the server's exit status here as it exits (launch/braid-local exits\n"
    "                           with it: under mpirun --enable-recovery, mpirun's own status is 0 whatever ranks return)\n"
    "  --restart-instances N    bring a dead instance back, at most N times each (default 0: never; --tp 1 only):\n"
    "                           rank 0 spawns a new leader (MPI_Comm_spawn) after 1, 2, 4 ... s (at most 30 s);\n"
    "                           once ready it rejoins routing and is re-warmed in the background: the hot prompt\n"
    "                           heads the coordinator recorded (chunks seen at least twice, most seen first), then\n"
    "                           --warm-start's, are prefilled on it (/metrics: braid_instance_restarts_total,\n"
    "                           braid_instance_rewarm_heads_total, braid_instance_rewarms_total). It lends and\n"
    "                           borrows KV blocks like the others: with this option every leader's move\n"
    "                           messages go through the coordinator (the blocks still go leader to leader)\n"
    "  --join-slots K           K more instances that have no rank in this job: each starts dead and is filled (or\n"
    "                           filled again, after its node was lost) by a leader that joins from its own MPI job\n"
    "                           (`mpirun -n 1 --ompi-server file:URI braid serve --join-instance I ...` on the\n"
    "                           returning node; this job's mpirun needs the same --ompi-server). --tp 1 only. Open\n"
    "                           MPI 4.1 connects only jobs whose ranks all run on their own mpirun's node: start\n"
    "                           this job's mpirun on the coordinator's node with all its ranks there. A job that\n"
    "                           accepts joins ends without MPI_Finalize. Joined instances lend and borrow KV blocks\n"
    "                           like the others (UCX between the leaders; the move messages relayed by the\n"
    "                           coordinator)\n"
    "  --join-instance I        join a running coordinator (--join-slots) as its instance I (0-based), then serve\n"
    "                           it like a restarted leader: re-warmed, routed to once ready\n"
    "  --join-service NAME      the name the coordinator publishes its port under in ompi-server (default braid-join)\n"
    "  --coordinator-timeout S  a joined instance (--join-instance) that hears nothing from its coordinator for S\n"
    "                           seconds (it is told it is alive every second) says so and exits 1 (default 10;\n"
    "                           0 = never). A joiner also waits at most S for the answer to its join (0: 10)\n"
    "  --rewarm-heads K         a restarted instance is re-warmed with at most K heads (default 64; 0 = it comes\n"
    "                           back cold)\n"
    "  --rewarm-tokens M        ... and at most M prompt tokens (default 16384)\n"
    "  --fair-share on|off      weighted fair sharing between tenants on each instance (default off): the least\n"
    "                           served tenant's request is admitted first, and while several tenants have work\n"
    "                           each gets its weighted part of a step's prefill budget (--api-keys weight=W,\n"
    "                           default 1); off = first come, first served (see bench/RESULTS.md)\n"
    "  --fair-step-tokens N     with --fair-share on, the most prompt tokens a step takes while several tenants\n"
    "                           have had work on the instance in the last 256 steps (default 64): one tenant's long\n"
    "                           prompts then lengthen the steps another's tokens wait for less; one tenant alone\n"
    "                           gets all of --max-batch-tokens. Smaller: shorter waits, less throughput on the CPU;\n"
    "                           on a GPU, where big steps cost little more than small ones, set it higher (512)\n"
    "  --admit-output off|auto|N\n"
    "                           output-aware admission on each instance: admit a request only when the KV pool,\n"
    "                           once its prompt's blocks are held, still has room for the expected rest of the output\n"
    "                           of every running request and its own (min(max_tokens, E) tokens each; auto: E = the\n"
    "                           mean output of the requests the instance has finished, max_tokens until one has; N:\n"
    "                           E = N), so decode growth does not preempt; off (default): admit on the prompt alone\n"
    "  --request-watchdog-s S   a request that gets no token while its instance's queue stands still for S seconds\n"
    "                           (the instance lost it) is answered 500, logged and counted (/metrics:\n"
    "                           braid_requests_watchdog_total; /health: requests_past_watchdog); default 300, 0 = off\n"
    "  --instance-timeout S     an instance whose leader sends nothing for S seconds is dead (default 60; 0 = only\n"
    "                           a rank's process exiting, seen on rank 0's host, counts). Each instance is a failure\n"
    "                           domain: the others keep serving, /health says \"degraded\". Needs mpirun\n"
    "                           --enable-recovery (launch/braid-local passes it); without it mpirun ends the job\n"
    CLI_LORA_FLAGS_USAGE
    "                           serve: /v1/models lists each adapter; a request names one with \"adapter\",\n"
    "                           X-Braid-Adapter or \"model\": NAME (an unknown one gets a 404)\n"
    "  --cache-create-rate R    explicit caches a tenant may create or renew (POST /v1/caches, PATCH) per second,\n"
    "                           after a burst of 16; past it 429 with Retry-After (default 1; 0 = no limit)\n"
    "  --state-dir DIR          keep the explicit-cache registry in DIR/explicit_caches.json (rewritten atomically\n"
    "                           on every change), so caches survive a restart of braid serve (default: memory only)\n"
    "  --allow-runtime-lora     without --api-keys, let anyone POST /v1/load_lora_adapter and /v1/unload_lora_adapter\n"
    "                           (with --api-keys only a key whose line says admin may; without either, both are 403)\n"
    "  --threads N              CPU threads per worker rank (default: the hardware threads of its --bind slice; all\n"
    "                           of the machine's when not bound)\n"
    "  --bind auto|none         auto (default): hwloc binds each worker rank to its own slice of its machine's cores\n"
    "                           (near its GPU on CUDA) and their NUMA memory, printed at start-up and in /metrics\n"
    "                           (braid_rank_binding_info); more worker ranks than cores on a machine binds nothing\n"
    "  --device D               cpu, cuda or auto (default auto)\n"
    "  --cpu-matmul M           CPU arithmetic: int8 (default; integer dot products on activations rounded to\n"
    "                           8 bits per 32 values, as llama.cpp does: several times the batched decode\n"
    "                           throughput of fp32, top-1 agreement with transformers at llama.cpp's level) or\n"
    "                           fp32 (the closest to the transformers reference; the golden tests hold it to 5e-2).\n"
    "                           With int8, --tp > 1 rounds its partial sums differently from --tp 1, so greedy\n"
    "                           outputs can part at near-ties\n"
    "SIGINT / SIGTERM to rank 0 drains: new requests get 503, in-flight ones finish, then every rank exits.\n";

typedef struct {
    const char *model, *host, *served_name, *events_path, *pid_file, *trace_path, *predictor_path, *api_keys_path, *tls_cert, *tls_key;
    const char *exit_status_file;
    const char *chat_template; /* --chat-template FILE; NULL: the model's own */
    const char *manifest_out, *warm_start, *warm_start_pin, *occupancy_log;
    long manifest_capacity;
    double occupancy_interval;
    const char *kv_events_endpoint, *kv_events_replay_endpoint, *kv_events_topic;
    long tp, port, kv_blocks, block_size, max_batch_tokens, max_running, max_pending, max_body, threads, route_slack;
    long max_connections, max_connections_per_client, http_timeout;
    long markov, horizon, max_workflows; /* markov 0: not given */
    double idle_timeout, instance_timeout;
    double request_watchdog; /* --request-watchdog-s (request_watchdog.h); 0 = off */
    double cache_create_rate; /* --cache-create-rate (explicit_caches.h); 0 = no limit */
    const char *state_dir;    /* --state-dir: where the explicit-cache registry persists; NULL = memory only */
    bool fair_share;         /* --fair-share: weighted fair sharing between tenants on each instance (sched_fair.h) */
    long fair_step_tokens;   /* --fair-step-tokens: a step's prefill tokens while tenants share (0 = default) */
    int admit_output;        /* --admit-output (sched_admit.h): output-aware admission; 0 = off */
    long warm_start_heads, warm_start_tokens; /* bounds of the start-up warm start (0 = none) */
    bool kv_moves;
    RouterMode router_mode;
    double move_gbps, move_prefill_tps, move_timeout;
    bool cache, predictor_learn;
    CpuMatmulMath cpu_matmul;
    BackendKind device;
    const EvictPolicy *policy;
    CliHostTier host_tier;
    int prefetch; /* -1: on when the policy has prefetch_value; 0 off; 1 on */
    long prefetch_blocks; /* --prefetch-blocks; 0 = the scheduler's default */
    bool prefetch_copies_thread; /* --prefetch-copies thread: the CPU backend's copy thread (worker/backend.h) */
    double pbkv_gamma;    /* --pbkv-gamma; 0 = the policy's default */
    int pbkv_future;      /* --pbkv-future: 1 on, -1 off, 0 = the policy's default (on) */
    RankBindMode bind;
    SegmentReuseMode segment_reuse;
    long approx_window;
    bool segment_lsh, segment_lsh_anywhere; /* --segment-lsh on / anywhere */
    double segment_tau_seg, segment_tau_ctx;
    SpanGuardConfig span_guard; /* --segment-probe-tokens, --segment-probe-min-cos, --approx-window-deep */
    long pin_budget; /* tokens per tenant per instance; 0 = a quarter of the pool */
    CliLora lora;
    bool allow_runtime_lora;  /* --allow-runtime-lora: adapters at run time without an admin key */
    long restart_instances;   /* --restart-instances: restarts per instance (0: none) */
    long rewarm_heads, rewarm_tokens; /* bounds of a restarted instance's re-warm (warm_start.h) */
    long respawned_instance;  /* set by the coordinator on a spawned leader: its instance (-1: not one) */
    long respawn_host_blocks; /* with it: the host tier the job's rank 0 decided */
    long join_slots;          /* --join-slots: instances that only join from their own MPI job (rank 0) */
    long join_instance;       /* --join-instance: this process joins a running coordinator as that instance (-1: no) */
    const char *join_service; /* --join-service: the name both sides use in ompi-server */
    double coordinator_timeout; /* --coordinator-timeout: a joined leader's coordinator is gone after this silence (0: never) */
} ServeArgs;

static int parse_args(int argc, char **argv, ServeArgs *a, bool verbose) {
    enum { O_MODEL = 256, O_CHAT_TEMPLATE, O_TP, O_HOST, O_PORT, O_NAME, O_BLOCKS, O_BS, O_MBT, O_RUN, O_PENDING, O_BODY, O_CACHE, O_POLICY,
           O_SLACK, O_EVENTS, O_PID, O_THREADS, O_DEVICE, O_TRACE, O_CPU_MATMUL, O_LIST_POLICIES, O_HOST_BLOCKS, O_HOST_GIB,
           O_PREDICTOR, O_PREDICTOR_LEARN, O_MARKOV, O_HORIZON, O_IDLE, O_MAX_WORKFLOWS, O_PREFETCH, O_BIND, O_API_KEYS, O_TLS_CERT,
           O_TLS_KEY, O_SEGMENTS, O_WINDOW, O_SEG_LSH, O_TAU_SEG, O_TAU_CTX, O_PIN_BUDGET, O_INSTANCE_TIMEOUT, O_EXIT_STATUS, O_MAX_CONN, O_MAX_CONN_CLIENT, O_HTTP_TIMEOUT,
           O_KV_EVENTS_EP, O_KV_EVENTS_REPLAY, O_KV_EVENTS_TOPIC, O_LORA, O_LORA_CACHE, O_RESIDUAL_BLOCKS, O_MANIFEST_OUT, O_MANIFEST_CAPACITY,
           O_WARM_START, O_WARM_START_PIN, O_OCCUPANCY, O_OCCUPANCY_INTERVAL,
           O_RESTARTS, O_RESPAWNED, O_RESPAWN_HOST, O_REWARM_HEADS, O_REWARM_TOKENS, O_KV_MOVES, O_ROUTER, O_MOVE_GBPS,
           O_MOVE_PREFILL, O_MOVE_TIMEOUT, O_WATCHDOG, O_WARM_HEADS, O_WARM_TOKENS, O_FAIR_SHARE, O_FAIR_STEP, O_PBKV_GAMMA, O_PBKV_FUTURE, O_PBKV_K, O_PREFETCH_BLOCKS, O_PREFETCH_COPIES, O_ALLOW_RUNTIME_LORA, O_CACHE_CREATE_RATE, O_STATE_DIR,
           O_PROBE_TOKENS, O_PROBE_COS, O_WINDOW_DEEP, O_APPROX_PREFIX, O_PROBE_VALUES, O_MIN_SPAN, O_SPAN_TAIL, O_JOIN_SLOTS, O_JOIN_INSTANCE, O_JOIN_SERVICE, O_COORD_TIMEOUT, O_ADMIT_OUTPUT };
    static const struct option opts[] = {
        CLI_SPAN_GUARD_OPTIONS(O_PROBE_TOKENS, O_PROBE_COS, O_WINDOW_DEEP, O_APPROX_PREFIX, O_PROBE_VALUES, O_MIN_SPAN, O_SPAN_TAIL),
        {"model", required_argument, 0, O_MODEL}, {"chat-template", required_argument, 0, O_CHAT_TEMPLATE},
        {"tp", required_argument, 0, O_TP}, {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT}, {"served-model-name", required_argument, 0, O_NAME},
        {"kv-blocks", required_argument, 0, O_BLOCKS}, {"block-size", required_argument, 0, O_BS},
        {"max-batch-tokens", required_argument, 0, O_MBT}, {"max-running", required_argument, 0, O_RUN},
        {"max-pending", required_argument, 0, O_PENDING}, {"max-body-bytes", required_argument, 0, O_BODY},
        {"cache", required_argument, 0, O_CACHE}, {"policy", required_argument, 0, O_POLICY},
        {"route-slack", required_argument, 0, O_SLACK}, {"events", required_argument, 0, O_EVENTS},
        {"trace-out", required_argument, 0, O_TRACE},
        {"pid-file", required_argument, 0, O_PID}, {"threads", required_argument, 0, O_THREADS},
        {"device", required_argument, 0, O_DEVICE}, {"cpu-matmul", required_argument, 0, O_CPU_MATMUL},
        {"list-policies", no_argument, 0, O_LIST_POLICIES}, {"host-kv-blocks", required_argument, 0, O_HOST_BLOCKS},
        {"host-kv-gib", required_argument, 0, O_HOST_GIB}, {"predictor", required_argument, 0, O_PREDICTOR},
        {"predictor-learn", no_argument, 0, O_PREDICTOR_LEARN}, {"markov", required_argument, 0, O_MARKOV},
        {"horizon", required_argument, 0, O_HORIZON}, {"workflow-idle-timeout", required_argument, 0, O_IDLE},
        {"max-workflows", required_argument, 0, O_MAX_WORKFLOWS}, {"prefetch", required_argument, 0, O_PREFETCH},
        {"bind", required_argument, 0, O_BIND}, {"api-keys", required_argument, 0, O_API_KEYS},
        {"tls-cert", required_argument, 0, O_TLS_CERT}, {"tls-key", required_argument, 0, O_TLS_KEY},
        {"segment-reuse", required_argument, 0, O_SEGMENTS}, {"approx-window", required_argument, 0, O_WINDOW},
        {"segment-lsh", required_argument, 0, O_SEG_LSH}, {"segment-tau-seg", required_argument, 0, O_TAU_SEG},
        {"segment-tau-ctx", required_argument, 0, O_TAU_CTX},
        {"pin-budget", required_argument, 0, O_PIN_BUDGET},
        {"instance-timeout", required_argument, 0, O_INSTANCE_TIMEOUT}, {"exit-status-file", required_argument, 0, O_EXIT_STATUS},
        {"max-connections", required_argument, 0, O_MAX_CONN}, {"max-connections-per-client", required_argument, 0, O_MAX_CONN_CLIENT},
        {"http-timeout", required_argument, 0, O_HTTP_TIMEOUT},
        {"kv-events-endpoint", required_argument, 0, O_KV_EVENTS_EP},
        {"kv-events-replay-endpoint", required_argument, 0, O_KV_EVENTS_REPLAY},
        {"kv-events-topic", required_argument, 0, O_KV_EVENTS_TOPIC},
        {"lora", required_argument, 0, O_LORA}, {"lora-cache", required_argument, 0, O_LORA_CACHE},
        {"residual-blocks", required_argument, 0, O_RESIDUAL_BLOCKS}, {"allow-runtime-lora", no_argument, 0, O_ALLOW_RUNTIME_LORA},
        {"cache-create-rate", required_argument, 0, O_CACHE_CREATE_RATE}, {"state-dir", required_argument, 0, O_STATE_DIR},
        {"manifest-out", required_argument, 0, O_MANIFEST_OUT}, {"manifest-capacity", required_argument, 0, O_MANIFEST_CAPACITY},
        {"warm-start", required_argument, 0, O_WARM_START}, {"warm-start-pin", required_argument, 0, O_WARM_START_PIN},
        {"occupancy-log", required_argument, 0, O_OCCUPANCY}, {"occupancy-interval", required_argument, 0, O_OCCUPANCY_INTERVAL},
        {"restart-instances", required_argument, 0, O_RESTARTS},
        {"rewarm-heads", required_argument, 0, O_REWARM_HEADS}, {"rewarm-tokens", required_argument, 0, O_REWARM_TOKENS},
        {"respawned-instance", required_argument, 0, O_RESPAWNED}, {"respawn-host-blocks", required_argument, 0, O_RESPAWN_HOST},
        {"join-slots", required_argument, 0, O_JOIN_SLOTS}, {"join-instance", required_argument, 0, O_JOIN_INSTANCE},
        {"join-service", required_argument, 0, O_JOIN_SERVICE}, {"coordinator-timeout", required_argument, 0, O_COORD_TIMEOUT},
        {"kv-moves", required_argument, 0, O_KV_MOVES}, {"router", required_argument, 0, O_ROUTER},
        {"move-gbps", required_argument, 0, O_MOVE_GBPS}, {"move-prefill-tps", required_argument, 0, O_MOVE_PREFILL},
        {"move-timeout", required_argument, 0, O_MOVE_TIMEOUT},
        {"request-watchdog-s", required_argument, 0, O_WATCHDOG}, {"warm-start-heads", required_argument, 0, O_WARM_HEADS},
        {"warm-start-tokens", required_argument, 0, O_WARM_TOKENS}, {"fair-share", required_argument, 0, O_FAIR_SHARE},
        {"fair-step-tokens", required_argument, 0, O_FAIR_STEP}, {"admit-output", required_argument, 0, O_ADMIT_OUTPUT},
        {"pbkv-gamma", required_argument, 0, O_PBKV_GAMMA}, {"pbkv-k", required_argument, 0, O_PBKV_K},
        {"pbkv-future", required_argument, 0, O_PBKV_FUTURE},
        {"prefetch-blocks", required_argument, 0, O_PREFETCH_BLOCKS}, {"prefetch-copies", required_argument, 0, O_PREFETCH_COPIES},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (ServeArgs){.host = "127.0.0.1", .tp = 1, .port = 8000, .kv_blocks = 512, .block_size = 16, .max_batch_tokens = 512,
                     .max_running = 64, .max_pending = 256, .max_body = 8 << 20, .route_slack = 8, .cache = true,
                     .policy = &evict_policy_lru, .device = backend_cuda_available() ? BACKEND_CUDA : BACKEND_CPU,
                     .cpu_matmul = CPU_MATMUL_DEFAULT, .host_tier = CLI_HOST_TIER_DEFAULT, .horizon = 4, .max_workflows = 65536,
                     .idle_timeout = 600, .instance_timeout = 60, .prefetch = -1, .bind = RANK_BIND_AUTO,
                     .segment_reuse = SEGMENT_REUSE_EXACT, .approx_window = CLI_DEFAULT_APPROX_WINDOW, .span_guard = cli_span_guard_defaults(), .max_connections = 1024,
                     .max_connections_per_client = 64, .http_timeout = 10, .cache_create_rate = EXPLICIT_CACHES_DEFAULT_CREATE_RATE,
                     .manifest_capacity = MANIFEST_RECORDER_DEFAULT_CAPACITY, .occupancy_interval = 1.0,
                     .respawned_instance = -1, .join_instance = -1, .join_service = JOIN_DEFAULT_SERVICE, .rewarm_heads = WARM_START_DEFAULT_REWARM_HEADS,
                     .rewarm_tokens = WARM_START_DEFAULT_REWARM_TOKENS, .kv_moves = true, .router_mode = ROUTER_COST,
                     .move_gbps = MOVE_DEFAULT_LINK_GBPS, .move_prefill_tps = MOVE_DEFAULT_PREFILL_TPS, .move_timeout = 5.0, .coordinator_timeout = 10.0,
                     .request_watchdog = REQUEST_WATCHDOG_DEFAULT_S, .warm_start_heads = WARM_START_DEFAULT_HEADS,
                     .warm_start_tokens = WARM_START_DEFAULT_TOKENS, .fair_share = false};
    int c;
    BraidError err;
    optind = 1;
    opterr = verbose;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        long *target = NULL, lo = 1, hi = 1 << 24;
        const char *flag = NULL;
        switch (c) {
        case O_MODEL: a->model = optarg; break;
        case O_CHAT_TEMPLATE: a->chat_template = optarg; break;
        case O_HOST: a->host = optarg; break;
        case O_NAME: a->served_name = optarg; break;
        case O_EVENTS: a->events_path = optarg; break;
        case O_TRACE: a->trace_path = optarg; break;
        case O_PID: a->pid_file = optarg; break;
        case O_EXIT_STATUS: a->exit_status_file = optarg; break;
        case O_KV_EVENTS_EP: a->kv_events_endpoint = optarg; break;
        case O_KV_EVENTS_REPLAY: a->kv_events_replay_endpoint = optarg; break;
        case O_KV_EVENTS_TOPIC: a->kv_events_topic = optarg; break;
        case O_MANIFEST_OUT: a->manifest_out = optarg; break;
        case O_WARM_START: a->warm_start = optarg; break;
        case O_WARM_START_PIN: a->warm_start_pin = optarg; break;
        case O_OCCUPANCY: a->occupancy_log = optarg; break;
        case O_MANIFEST_CAPACITY: target = &a->manifest_capacity, flag = "--manifest-capacity", lo = 0; break;
        case O_OCCUPANCY_INTERVAL:
            if (verbose ? cli_parse_float("--occupancy-interval", optarg, 0.001, 3600, &a->occupancy_interval)
                        : (a->occupancy_interval = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_TP: target = &a->tp, flag = "--tp", hi = 64; break;
        case O_PORT: target = &a->port, flag = "--port", hi = 65535; break;
        case O_BLOCKS: target = &a->kv_blocks, flag = "--kv-blocks", lo = 2; break;
        case O_BS: target = &a->block_size, flag = "--block-size", hi = 1024; break;
        case O_MBT: target = &a->max_batch_tokens, flag = "--max-batch-tokens", hi = 1 << 20; break;
        case O_RUN: target = &a->max_running, flag = "--max-running", hi = 1 << 16; break;
        case O_FAIR_STEP: target = &a->fair_step_tokens, flag = "--fair-step-tokens", hi = 1 << 20; break;
        case O_PENDING: target = &a->max_pending, flag = "--max-pending"; break;
        case O_BODY: target = &a->max_body, flag = "--max-body-bytes", lo = 1024, hi = 1L << 30; break;
        case O_MAX_CONN: target = &a->max_connections, flag = "--max-connections", hi = 1 << 20; break;
        case O_MAX_CONN_CLIENT: target = &a->max_connections_per_client, flag = "--max-connections-per-client", hi = 1 << 20; break;
        case O_HTTP_TIMEOUT: target = &a->http_timeout, flag = "--http-timeout", hi = 3600; break;
        case O_SLACK: target = &a->route_slack, flag = "--route-slack", lo = 0; break;
        case O_THREADS: target = &a->threads, flag = "--threads", hi = 1024; break;
        case O_RESTARTS: target = &a->restart_instances, flag = "--restart-instances", lo = 0, hi = 1000; break;
        case O_REWARM_HEADS: target = &a->rewarm_heads, flag = "--rewarm-heads", lo = 0, hi = 1 << 20; break;
        case O_REWARM_TOKENS: target = &a->rewarm_tokens, flag = "--rewarm-tokens", hi = 1L << 30; break;
        case O_WARM_HEADS: target = &a->warm_start_heads, flag = "--warm-start-heads", lo = 0, hi = 1 << 24; break;
        case O_WARM_TOKENS: target = &a->warm_start_tokens, flag = "--warm-start-tokens", lo = 0, hi = 1L << 40; break;
        case O_WATCHDOG:
            if (verbose ? cli_parse_float("--request-watchdog-s", optarg, 0, 1e7, &a->request_watchdog)
                        : (a->request_watchdog = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_RESPAWNED: target = &a->respawned_instance, flag = "--respawned-instance", lo = 0, hi = 1 << 20; break;
        case O_RESPAWN_HOST: target = &a->respawn_host_blocks, flag = "--respawn-host-blocks", lo = 0, hi = 1L << 40; break;
        case O_JOIN_SLOTS: target = &a->join_slots, flag = "--join-slots", lo = 0, hi = 1 << 16; break;
        case O_JOIN_INSTANCE: target = &a->join_instance, flag = "--join-instance", lo = 0, hi = 1 << 20; break;
        case O_PREDICTOR: a->predictor_path = optarg; break;
        case O_API_KEYS: a->api_keys_path = optarg; break;
        case O_TLS_CERT: a->tls_cert = optarg; break;
        case O_TLS_KEY: a->tls_key = optarg; break;
        case O_PREDICTOR_LEARN: a->predictor_learn = true; break;
        case O_MARKOV: target = &a->markov, flag = "--markov", hi = 2; break;
        case O_HORIZON: target = &a->horizon, flag = "--horizon", hi = 64; break;
        case O_MAX_WORKFLOWS: target = &a->max_workflows, flag = "--max-workflows"; break;
        case O_PBKV_K: target = &a->horizon, flag = "--pbkv-k", hi = 64; break;
        case O_PREFETCH_COPIES:
            if (cli_parse_prefetch_copies("serve", optarg, &a->prefetch_copies_thread, verbose)) return 2;
            break;
        case O_PREFETCH_BLOCKS:
            if (strcmp(optarg, "auto") == 0) { /* S_bw measured (worker/prefetch_budget.h) */
                a->prefetch_blocks = 0;
                break;
            }
            target = &a->prefetch_blocks, flag = "--prefetch-blocks", hi = 65536;
            break;
        case O_PBKV_GAMMA: if (cli_parse_pbkv_gamma("serve", optarg, &a->pbkv_gamma, verbose)) return 2; break;
        case O_PBKV_FUTURE: if (cli_parse_pbkv_future("serve", optarg, &a->pbkv_future, verbose)) return 2; break;
        case O_IDLE:
            if (verbose ? cli_parse_float("--workflow-idle-timeout", optarg, 0, 1e9, &a->idle_timeout)
                        : (a->idle_timeout = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_INSTANCE_TIMEOUT:
            if (verbose ? cli_parse_float("--instance-timeout", optarg, 0, 1e6, &a->instance_timeout)
                        : (a->instance_timeout = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_DEVICE:
            if (backend_parse_kind(optarg, &a->device, &err)) {
                if (verbose) fprintf(stderr, "braid serve: --device: %s\n", err.msg);
                return 2;
            }
            break;
        case O_CPU_MATMUL:
            if (cpu_matmul_math_parse(optarg, &a->cpu_matmul)) {
                if (verbose) fprintf(stderr, "braid serve: --cpu-matmul expects int8 or fp32, got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_CACHE:
            if (strcmp(optarg, "radix") && strcmp(optarg, "off")) {
                if (verbose) fprintf(stderr, "braid serve: --cache expects radix or off, got '%s'\n", optarg);
                return 2;
            }
            a->cache = strcmp(optarg, "radix") == 0;
            break;
        case O_POLICY:
            if (!(a->policy = cli_parse_policy("serve", optarg, verbose))) return 2;
            break;
        case O_LIST_POLICIES: if (verbose) cli_list_policies(stdout); return 1;
        case O_SEGMENTS: if (cli_parse_segment_reuse("serve", optarg, &a->segment_reuse, verbose)) return 2; break;
        case O_WINDOW: target = &a->approx_window, flag = "--approx-window", lo = 0, hi = 1 << 20; break;
        case O_SEG_LSH:
            if (strcmp(optarg, "on") && strcmp(optarg, "off") && strcmp(optarg, "anywhere")) {
                if (verbose) fprintf(stderr, "braid serve: --segment-lsh expects on, anywhere or off, got '%s'\n", optarg);
                return 2;
            }
            a->segment_lsh = strcmp(optarg, "off") != 0;
            a->segment_lsh_anywhere = strcmp(optarg, "anywhere") == 0;
            break;
        case O_TAU_SEG:
            if (cli_parse_float("--segment-tau-seg", optarg, 0, 1, &a->segment_tau_seg)) return 2;
            break;
        case O_TAU_CTX:
            if (cli_parse_float("--segment-tau-ctx", optarg, 0, 1, &a->segment_tau_ctx)) return 2;
            break;
        case O_PROBE_TOKENS: if (cli_span_guard_parse("segment-probe-tokens", optarg, &a->span_guard)) return 2; break;
        case O_PROBE_COS: if (cli_span_guard_parse("segment-probe-min-cos", optarg, &a->span_guard)) return 2; break;
        case O_WINDOW_DEEP: if (cli_span_guard_parse("approx-window-deep", optarg, &a->span_guard)) return 2; break;
        case O_APPROX_PREFIX: if (cli_span_guard_parse("approx-prefix", optarg, &a->span_guard)) return 2; break;
        case O_PROBE_VALUES: if (cli_span_guard_parse("segment-probe-values", optarg, &a->span_guard)) return 2; break;
        case O_MIN_SPAN: if (cli_span_guard_parse("segment-min-span", optarg, &a->span_guard)) return 2; break;
        case O_SPAN_TAIL: if (cli_span_guard_parse("segment-tail", optarg, &a->span_guard)) return 2; break;
        case O_PIN_BUDGET: target = &a->pin_budget, flag = "--pin-budget", lo = 0, hi = 1 << 30; break;
        case O_HOST_BLOCKS: if (cli_parse_host_kv_blocks("serve", optarg, &a->host_tier, verbose)) return 2; break;
        case O_HOST_GIB: if (cli_parse_host_kv_gib("serve", optarg, &a->host_tier, verbose)) return 2; break;
        case O_ADMIT_OUTPUT: if (cli_parse_admit_output("serve", optarg, &a->admit_output, verbose)) return 2; break;
        case O_FAIR_SHARE:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                if (verbose) fprintf(stderr, "braid serve: --fair-share expects on or off, got '%s'\n", optarg);
                return 2;
            }
            a->fair_share = strcmp(optarg, "on") == 0;
            break;
        case O_KV_MOVES:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                if (verbose) fprintf(stderr, "braid serve: --kv-moves expects on or off, got '%s'\n", optarg);
                return 2;
            }
            a->kv_moves = strcmp(optarg, "on") == 0;
            break;
        case O_ROUTER:
            if (router_mode_parse(optarg) < 0) {
                if (verbose) fprintf(stderr, "braid serve: --router expects " ROUTER_MODE_CHOICES ", got '%s'\n", optarg);
                return 2;
            }
            a->router_mode = (RouterMode)router_mode_parse(optarg);
            break;
        case O_MOVE_GBPS:
            if (verbose ? cli_parse_float("--move-gbps", optarg, 1e-6, 1e6, &a->move_gbps) : (a->move_gbps = strtod(optarg, NULL), 0)) return 2;
            break;
        case O_MOVE_PREFILL:
            if (verbose ? cli_parse_float("--move-prefill-tps", optarg, 1e-3, 1e12, &a->move_prefill_tps)
                        : (a->move_prefill_tps = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_MOVE_TIMEOUT:
            if (verbose ? cli_parse_float("--move-timeout", optarg, 0.01, 3600, &a->move_timeout) : (a->move_timeout = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_COORD_TIMEOUT:
            if (verbose ? cli_parse_float("--coordinator-timeout", optarg, 0, 86400, &a->coordinator_timeout)
                        : (a->coordinator_timeout = strtod(optarg, NULL), 0))
                return 2;
            break;
        case O_PREFETCH:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                if (verbose) fprintf(stderr, "braid serve: --prefetch expects on or off, got '%s'\n", optarg);
                return 2;
            }
            a->prefetch = strcmp(optarg, "on") == 0;
            break;
        case O_BIND:
            if (rank_binding_parse_mode(optarg, &a->bind)) {
                if (verbose) fprintf(stderr, "braid serve: --bind expects auto or none, got '%s'\n", optarg);
                return 2;
            }
            break;
        case O_LORA: if (cli_parse_lora("serve", optarg, &a->lora, verbose)) return 2; break;
        case O_LORA_CACHE: if (cli_parse_lora_cache("serve", optarg, &a->lora, verbose)) return 2; break;
        case O_RESIDUAL_BLOCKS: if (cli_parse_residual_blocks("serve", optarg, &a->lora, verbose)) return 2; break;
        case O_ALLOW_RUNTIME_LORA: a->allow_runtime_lora = true; break;
        case O_JOIN_SERVICE: a->join_service = optarg; break;
        case O_STATE_DIR: a->state_dir = optarg; break;
        case O_CACHE_CREATE_RATE:
            if (verbose ? cli_parse_float("--cache-create-rate", optarg, 0, 1e6, &a->cache_create_rate)
                        : (a->cache_create_rate = strtod(optarg, NULL), 0))
                return 2;
            break;
        case 'h': if (verbose) fputs(serve_usage, stdout); return 1;
        default: if (verbose) fputs(serve_usage, stderr); return 2;
        }
        if (target && (verbose ? cli_parse_int(flag, optarg, lo, hi, target) : (*target = strtol(optarg, NULL, 10), 0))) return 2;
    }
    if (optind < argc) {
        if (verbose) fprintf(stderr, "braid serve: unexpected argument '%s'\n%s", argv[optind], serve_usage);
        return 2;
    }
    if (a->prefetch == 1 && !a->policy->prefetch_value) {
        if (verbose)
            fprintf(stderr, "braid serve: --prefetch on needs a policy that values host-tier blocks (pbkv); %s does not\n",
                    a->policy->name);
        return 2;
    }
    if (a->prefetch < 0) a->prefetch = a->policy->prefetch_value != NULL;
    if (cli_check_pbkv_gamma("serve", a->policy, a->pbkv_gamma, verbose)) return 2;
    if (cli_check_pbkv_future("serve", a->policy, a->pbkv_future, verbose)) return 2;
    if (a->prefetch_blocks > 0 && !a->prefetch) {
        if (verbose) fprintf(stderr, "braid serve: --prefetch-blocks caps the prefetch, which is off (policy %s)\n", a->policy->name);
        return 2;
    }
    if ((a->join_slots > 0 || a->join_instance >= 0) && a->tp > 1) {
        if (verbose) fprintf(stderr, "braid serve: --join-slots / --join-instance need --tp 1: a joining instance is one process\n");
        return 2;
    }
    if (a->restart_instances > 0 && a->tp > 1) {
        if (verbose)
            fprintf(stderr, "braid serve: --restart-instances needs --tp 1: a restarted instance is one process spawned by rank 0 "
                            "and joined over its own intercommunicator; its TP peers would need a communicator of their own "
                            "(not done)\n");
        return 2;
    }
    if (cli_check_lora("serve", &a->lora, verbose)) return 2;
    if (a->lora.n > 0 && a->tp > 1) {
        if (verbose) fprintf(stderr, "braid serve: --lora needs --tp 1: LoRA adapters are not sharded for tensor parallelism yet\n");
        return 2;
    }
    if (!a->tls_cert != !a->tls_key) {
        if (verbose)
            fprintf(stderr, "braid serve: --tls-cert and --tls-key go together (got only %s)\n", a->tls_cert ? "--tls-cert" : "--tls-key");
        return 2;
    }
    if (a->warm_start_pin && !a->warm_start) {
        if (verbose) fprintf(stderr, "braid serve: --warm-start-pin needs --warm-start (the manifest whose heads it pins)\n");
        return 2;
    }
    if (a->manifest_out && a->manifest_capacity == 0) {
        if (verbose) fprintf(stderr, "braid serve: --manifest-out needs recording on (--manifest-capacity > 0)\n");
        return 2;
    }
    if (!a->kv_events_endpoint && (a->kv_events_replay_endpoint || a->kv_events_topic)) {
        if (verbose)
            fprintf(stderr, "braid serve: %s needs --kv-events-endpoint (the PUB socket it belongs to)\n",
                    a->kv_events_replay_endpoint ? "--kv-events-replay-endpoint" : "--kv-events-topic");
        return 2;
    }
    if (verbose && a->predictor_path && a->markov)
        fprintf(stderr, "braid serve: --markov is ignored: the --predictor file has its own order\n");
    if (verbose && !a->predictor_path && a->predictor_learn)
        fprintf(stderr, "braid serve: --predictor-learn is ignored without --predictor (the online predictor always learns)\n");
    return 0;
}

/* Collective: rank 0 loads --predictor and tells everyone whether it could, so that a bad file
 * stops every rank cleanly. Returns 0 (with *p the predictor on rank 0, NULL elsewhere or without
 * --predictor) or -1 on every rank. */
static int load_predictor(const ServeArgs *a, int rank, AgentPredictor **p) {
    int ok = 1;
    *p = NULL;
    if (rank == 0 && a->predictor_path) {
        BraidError err;
        if (agent_predictor_load(p, a->predictor_path, &err)) {
            fprintf(stderr, "braid serve: --predictor: %s\n", err.msg);
            ok = 0;
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return ok ? 0 : -1;
}

static bool is_loopback(const char *host) {
    struct in_addr addr;
    return inet_pton(AF_INET, host, &addr) == 1 && (ntohl(addr.s_addr) >> 24) == 127;
}

/* What rank 0 needs to admit clients: the API keys and the TLS certificate and key (PEM text). */
typedef struct {
    AuthKeys *keys;
    char *tls_cert, *tls_key;
} AccessConfig;

static void access_config_free(AccessConfig *ac) {
    auth_keys_free(ac->keys);
    free(ac->tls_cert);
    if (ac->tls_key) memset(ac->tls_key, 0, strlen(ac->tls_key)); /* a private key does not linger in freed memory */
    free(ac->tls_key);
    memset(ac, 0, sizeof *ac);
}

/* A PEM file's text (at most 1 MiB), or NULL with a message naming the flag and the path. */
static char *read_pem(const char *flag, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return fprintf(stderr, "braid serve: %s %s: cannot open it\n", flag, path), NULL;
    enum { MAX_PEM = 1 << 20 };
    char *text = malloc(MAX_PEM + 1);
    size_t n = text ? fread(text, 1, MAX_PEM + 1, f) : 0;
    bool bad = !text || ferror(f) || n == 0 || n > MAX_PEM || memchr(text, '\0', n);
    fclose(f);
    if (bad) {
        fprintf(stderr, "braid serve: %s %s: %s\n", flag, path,
                !text ? "out of memory" : n == 0 ? "empty or unreadable" : n > MAX_PEM ? "larger than 1 MiB" : "not a PEM text file");
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

/* Collective, like load_predictor: rank 0 reads --api-keys and the TLS files, and every rank learns
 * whether it could. Says how many keys (never which), and warns when the API is reachable from
 * other machines with nobody's identity checked, or with keys crossing the network in clear. */
static int load_access(const ServeArgs *a, int rank, AccessConfig *ac) {
    int ok = 1;
    memset(ac, 0, sizeof *ac);
    if (rank == 0) {
        BraidError err;
        if (a->api_keys_path && !(ac->keys = auth_keys_load(a->api_keys_path, &err))) {
            fprintf(stderr, "braid serve: --api-keys: %s\n", err.msg);
            ok = 0;
        }
        if (ok && a->tls_cert) {
            ac->tls_cert = read_pem("--tls-cert", a->tls_cert);
            ac->tls_key = ac->tls_cert ? read_pem("--tls-key", a->tls_key) : NULL;
            if (!ac->tls_key) ok = 0;
        }
        bool remote = !is_loopback(a->host);
        if (ok && ac->keys)
            fprintf(stderr, "braid serve: API keys: %d from %s; every endpoint but /health needs 'Authorization: Bearer KEY'\n",
                    auth_keys_count(ac->keys), a->api_keys_path);
        if (ok && remote && !ac->keys)
            fprintf(stderr, "braid serve: warning: --host %s is reachable from other machines and there is no --api-keys file: "
                            "anyone who reaches port %ld may use the API and name any tenant (and so probe its cache)\n",
                    a->host, a->port);
        else if (ok && remote && !ac->tls_cert)
            fprintf(stderr, "braid serve: warning: --host %s is reachable from other machines and there is no --tls-cert: "
                            "API keys cross the network in clear text\n",
                    a->host);
        if (!ok) access_config_free(ac);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return ok ? 0 : -1;
}

/* One line on rank 0 naming the predictor and what its forecasts feed. */
static void describe_forecasts(const ServeArgs *a, const AgentPredictor *p) {
    char what[768];
    if (p)
        snprintf(what, sizeof what, "predictor %s (%s, %d agents, %llu transitions, %s)", a->predictor_path,
                 agent_predictor_kind(p) == PREDICTOR_GRAPH ? "graph" : agent_predictor_kind(p) == PREDICTOR_MARKOV2 ? "Markov-2" : "Markov-1",
                 agent_predictor_n_agents(p), (unsigned long long)agent_predictor_n_transitions(p),
                 a->predictor_learn ? "learning online" : "frozen");
    else snprintf(what, sizeof what, "Markov-%ld predictor learning online (no --predictor)", a->markov ? a->markov : 1);
    char idle[64];
    if (a->idle_timeout > 0) snprintf(idle, sizeof idle, "idle timeout %g s", a->idle_timeout);
    else snprintf(idle, sizeof idle, "no idle timeout");
    fprintf(stderr, "braid serve: workflow forecasts: %s, horizon %ld, %s, at most %ld workflows; %s%s%s\n", what, a->horizon, idle,
            a->max_workflows, a->policy->on_prediction ? "sent to the instances' policy " : "not sent (policy ", a->policy->name,
            a->policy->on_prediction ? "" : " takes no predictions)");
}

/* "dir/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct.Q4_1" */
static void default_served_name(const char *path, char *out, size_t cap) {
    const char *base = strrchr(path, '/');
    snprintf(out, cap, "%s", base ? base + 1 : path);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".gguf") == 0) out[n - 5] = '\0';
}

/* --warm-start, and the re-warm of instances --restart-instances brings back: heads go through the
 * request path the HTTP API uses. NULL when it cannot start (then the server is ready at once,
 * without the warm-up, and restarted instances come back cold). */
static WarmStart *start_warm_start(const ServeArgs *a, Coordinator *coord, const BraidModel *model, const char *served_name,
                                   const LoraSet *lora, ManifestRecorder *recorder, Metrics *metrics, const AuthKeys *keys) {
    WarmStartConfig wc = {.path = a->warm_start, .pin_ttl = a->warm_start_pin,
                          .generate = {.coord = coord, .model = model, .served_model = served_name, .lora = lora,
                                       .segment_reuse = (int)a->segment_reuse},
                          .recorder = recorder, .metrics = metrics,
                          .rewarm_max_heads = a->restart_instances > 0 || a->join_slots > 0 ? (int)a->rewarm_heads : 0,
                          .rewarm_max_tokens = a->rewarm_tokens, .max_heads = a->warm_start_heads,
                          .max_tokens = a->warm_start_tokens, .keys = keys};
    BraidError err;
    WarmStart *warm = warm_start_begin(&wc, &err);
    if (!warm) {
        fprintf(stderr, "braid serve: %s; starting without it\n", err.msg);
        coordinator_warming_done(coord);
    }
    return warm;
}

/* Coordinator on_drain: the first stop signal refuses new connections at once. */
static void stop_accepting(void *http) { http_api_stop_accepting(http); }

/* Takes *predictor over (NULL afterwards); borrows the access configuration. */
static int run_coordinator(const ServeArgs *a, const BraidModel *model, const LoraSet *lora, int n_instances, const sigset_t *stop,
                           AgentPredictor **predictor, const char *binding_metrics, const AccessConfig *access, const RankDirectory *ranks,
                           const char *const *respawn_args, bool *lost_ranks) {
    char name[256], ready_line[512];
    if (a->served_name) snprintf(name, sizeof name, "%s", a->served_name);
    else default_served_name(cli_model_path(a->model), name, sizeof name);
    FILE *events = NULL;
    if (a->events_path && !(events = fopen(a->events_path, "w")))
        fprintf(stderr, "braid serve: cannot write %s; routing events are not logged\n", a->events_path);
    FILE *trace = NULL;
    if (a->trace_path && !(trace = fopen(a->trace_path, "w")))
        fprintf(stderr, "braid serve: cannot write %s; no trace is recorded\n", a->trace_path);
    snprintf(ready_line, sizeof ready_line, "braid: serving %s at %s://%s:%ld/v1 (%d instance%s x %ld rank%s)", name,
             access->tls_cert ? "https" : "http", a->host,
             a->port, n_instances, n_instances == 1 ? "" : "s", a->tp, a->tp == 1 ? "" : "s");
    Metrics *metrics = metrics_create(n_instances, name);
    if (metrics && binding_metrics && metrics_set_static_text(metrics, binding_metrics))
        fprintf(stderr, "braid serve: out of memory; /metrics goes without braid_rank_binding_info\n");
    Coordinator coord;
    BraidError err;
    KvEventPublisher *kv_publisher = NULL;
    if (a->kv_events_endpoint) {
        KvEventPublisherConfig pc = {.endpoint = a->kv_events_endpoint, .replay_endpoint = a->kv_events_replay_endpoint,
                                     .topic = a->kv_events_topic};
        if (!(kv_publisher = kv_event_publisher_new(&pc, &err))) {
            fprintf(stderr, "braid serve: %s\n", err.msg);
            MPI_Abort(MPI_COMM_WORLD, 1); /* the workers wait for a coordinator that will not come */
            return 1;
        }
        printf("braid: publishing KV events on %s%s%s\n", a->kv_events_endpoint,
               a->kv_events_replay_endpoint ? ", replay on " : "", a->kv_events_replay_endpoint ? a->kv_events_replay_endpoint : "");
        fflush(stdout);
    }
    ManifestRecorder *manifest = NULL;
    if (a->manifest_capacity > 0) {
        ManifestRecorderConfig mc = {.capacity = (int)a->manifest_capacity, .anchors = model->tokenizer.special_ids,
                                     .n_anchors = model->tokenizer.n_special, .model_seed = engine_model_seed(&model->weights.cfg),
                                     .out_path = a->manifest_out};
        if (!(manifest = manifest_recorder_create(&mc, &err))) {
            fprintf(stderr, "braid serve: %s\n", err.msg);
            kv_event_publisher_free(kv_publisher);
            MPI_Abort(MPI_COMM_WORLD, 1); /* the workers wait for a coordinator that will not come */
            return 1;
        }
    }
    describe_forecasts(a, *predictor);
    CoordinatorConfig cc = {.n_instances = n_instances, .tp = (int)a->tp, .max_pending = (int)a->max_pending,
                            .load_slack = (int)a->route_slack, .router_mode = a->router_mode,
                            .moves = {.enabled = a->kv_moves, .link_bytes_per_s = a->move_gbps * 1e9, .latency_s = MOVE_DEFAULT_LATENCY_S,
                                      .prefill_tokens_per_s = a->move_prefill_tps, .min_blocks = MOVE_DEFAULT_MIN_BLOCKS,
                                      .lender_step_tokens = (int)a->max_batch_tokens, .timeout_s = a->move_timeout}, .events = events, .trace = trace, .ready_line = ready_line,
                            .forecast = {.predictor = *predictor, .kind = a->markov == 2 ? PREDICTOR_MARKOV2 : PREDICTOR_MARKOV1,
                                         .learn = a->predictor_learn, .horizon = (int)a->horizon,
                                         .max_workflows = (int)a->max_workflows, .idle_timeout_s = a->idle_timeout},
                            .send_forecasts = a->policy->on_prediction != NULL, .ranks = ranks,
                            .instance_timeout_s = a->instance_timeout, .kv_publisher = kv_publisher,
                            .warm_start = a->warm_start != NULL,
                            .max_restarts = (int)a->restart_instances, .respawn_args = respawn_args,
                            .join_first = n_instances - (int)a->join_slots, .join_service = a->join_slots > 0 ? a->join_service : NULL,
                            .request_watchdog_s = a->request_watchdog, .keys = access->keys};
    int rc = 1;
    *predictor = NULL; /* cc.forecast holds it; coordinator_init takes it over, even when it fails */
    if (!metrics) agent_predictor_free(cc.forecast.predictor);
    if (!metrics || coordinator_init(&coord, &cc, MPI_COMM_WORLD, metrics, &err)) {
        fprintf(stderr, "braid serve: %s\n", metrics ? err.msg : "coordinator: out of memory");
        /* The workers still wait for a SHUTDOWN; without a coordinator, mpirun's abort is the only way out. */
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    HttpApiConfig hc = {.coord = &coord, .metrics = metrics, .model = model, .served_model = name, .lora = lora, .host = a->host,
                        .port = (int)a->port, .max_body_bytes = (size_t)a->max_body, .keys = access->keys,
                        .max_connections = (int)a->max_connections, .max_connections_per_client = (int)a->max_connections_per_client,
                        .timeout_s = (int)a->http_timeout,
                        .tls_cert_pem = access->tls_cert, .tls_key_pem = access->tls_key, .segment_reuse = (int)a->segment_reuse,
                        .manifest = manifest, .allow_runtime_lora = a->allow_runtime_lora,
                        .cache_create_rate = a->cache_create_rate, .state_dir = a->state_dir};
    HttpApi *http = http_api_start(&hc, &err);
    if (!http) {
        fprintf(stderr, "braid serve: %s\n", err.msg);
        /* Let the instances load and stop cleanly: drain right away. */
        coord.draining = true;
    } else {
        coordinator_on_drain(&coord, stop_accepting, http); /* a stop signal closes the listening socket at once */
    }
    /* A restarted or (re)joined instance comes back with an empty cache: it is re-warmed. */
    bool rewarms = (a->restart_instances > 0 || a->join_slots > 0) && a->rewarm_heads > 0;
    WarmStart *warm = a->warm_start || rewarms ? start_warm_start(a, &coord, model, name, lora, manifest, metrics, access->keys) : NULL;
    if (coordinator_run(&coord, stop, &err)) fprintf(stderr, "braid serve: %s\n", err.msg);
    else rc = http ? 0 : 1;
    warm_start_end(warm);
    *lost_ranks = coordinator_lost_ranks(&coord);
    /* Every request has finished; let the last answers reach their clients before closing. */
    int unsent = http_api_quiesce(http, 30.0);
    if (unsent) fprintf(stderr, "braid serve: closing with %d responses still being sent\n", unsent);
    http_api_stop(http);
    coordinator_free(&coord);
    kv_event_publisher_free(kv_publisher);
    manifest_recorder_destroy(manifest);
    metrics_destroy(metrics);
    if (events) fclose(events);
    if (trace && fclose(trace)) fprintf(stderr, "braid serve: writing %s failed\n", a->trace_path);
    return rc;
}

/* Worker ranks sharing a machine's memory with each other, the most on any machine (collective). */
static int worker_ranks_per_machine(int rank) {
    MPI_Comm node;
    int here = 1, has_coordinator = rank == 0, coordinator_here = 0, most = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return 1;
    MPI_Comm_size(node, &here);
    MPI_Allreduce(&has_coordinator, &coordinator_here, 1, MPI_INT, MPI_MAX, node);
    MPI_Comm_free(&node);
    int workers = here - coordinator_here;
    MPI_Allreduce(&workers, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return most > 0 ? most : 1;
}

/* Collective: rank 0 sizes the host tier (every rank of an instance must agree on it) and tells
 * everyone; -1 on every rank when the requested tier does not fit (rank 0 says why). */
static long decide_host_blocks(const ServeArgs *a, const BraidModel *model, int rank) {
    int ranks = worker_ranks_per_machine(rank);
    long host_blocks = 0;
    if (rank == 0) {
        char why[512], tier[128];
        size_t block_bytes = kv_pool_block_bytes(&model->weights.cfg, (int)a->block_size) / (size_t)a->tp;
        if (cli_host_tier_blocks(&a->host_tier, a->kv_blocks, block_bytes, ranks, &host_blocks, why, sizeof why)) {
            fprintf(stderr, "braid serve: %s\n", why);
            host_blocks = -1;
        } else {
            if (!a->cache) host_blocks = 0; /* nothing is cached, so nothing is demoted */
            cli_describe_host_tier(host_blocks, block_bytes, tier, sizeof tier);
            fprintf(stderr, "braid serve: %s%s, eviction policy %s, prefetch %s\n", tier, host_blocks > 1 ? " in each instance" : "",
                    a->policy->name, a->prefetch && host_blocks > 1 ? "on" : "off");
        }
    }
    MPI_Bcast(&host_blocks, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    return host_blocks;
}

/* control: the communicator the coordinator is rank 0 of (the world; a spawned leader's parent).
 * move_peers: whether other instances exist to move KV blocks with (a lone instance starts no
 * mover: its UCX progress thread would only take CPU time; a spawned leader is told by rank 0's
 * respawn arguments, --kv-moves off when it would be alone). */
static int run_worker(const ServeArgs *a, const BraidModel *model, const LoraSet *lora, int rank, int tp, MPI_Comm control,
                      MPI_Comm tp_comm, long host_blocks, const RankBinding *binding, bool move_peers, bool *lost_ranks) {
    /* A bound rank's threads stay inside its slice, one per hardware thread of it, unless --threads says otherwise. */
    cli_set_threads(a->threads ? (int)a->threads : binding->pus);
    WorkerRoleConfig cfg = {
        .model = model, .world = control, .tp_comm = tp_comm, .instance = (rank - 1) / tp,
        .engine = {.n_blocks = (int)a->kv_blocks, .block_size = (int)a->block_size, .max_batch_tokens = (int)a->max_batch_tokens,
                   .max_running = (int)a->max_running, .host_blocks = (int)host_blocks, .cache_enabled = a->cache,
                   .policy = a->policy, .policy_options = {.gamma = a->pbkv_gamma, .future = a->pbkv_future}, .prefetch = a->prefetch != 0,
                   .prefetch_max_blocks = (int)a->prefetch_blocks, .sync_copies = !a->prefetch_copies_thread, .device = a->device,
                   .cpu_matmul_fp32 = a->cpu_matmul == CPU_MATMUL_FP32, .segment_reuse = a->segment_reuse,
                   .approx_window = (int)a->approx_window, .span_guard = a->span_guard, .segment_lsh = a->segment_lsh, .segment_lsh_anywhere = a->segment_lsh_anywhere,
                   .segment_tau_seg = a->segment_tau_seg, .segment_tau_ctx = a->segment_tau_ctx, .lora = lora, .lora_shared = a->lora.shared, .lora_auto = a->lora.auto_mode,
                   .residual_blocks = cli_residual_blocks(&a->lora, a->kv_blocks),
                   .pin_budget_blocks = (int)((a->pin_budget + a->block_size - 1) / a->block_size),
                   .fair_share = a->fair_share, .fair_step_tokens = (int)a->fair_step_tokens, .admit_output = a->admit_output},
        .occupancy_log = a->occupancy_log, .occupancy_interval = a->occupancy_interval, .kv_moves = a->kv_moves && move_peers,
        .move_timeout_s = a->move_timeout, .coordinator_timeout_s = a->join_instance >= 0 ? a->coordinator_timeout : 0,
        /* A respawned leader keeps its world rank number but not its place in the world: under
         * --restart-instances every leader sends its move messages through the coordinator. */
        .relay_moves = a->restart_instances > 0};
    int tp_rank = (rank - 1) % tp;
    BraidError err;
    int rc = tp_rank == 0 ? instance_leader_run(&cfg, lost_ranks, &err) : tp_peer_run(&cfg, lost_ranks, &err);
    if (rc) fprintf(stderr, "braid serve: rank %d: %s\n", rank, err.msg);
    return rc ? 1 : 0;
}

/* Collective: every rank maps the model (the coordinator for its tokenizer, the workers for their
 * weights), and every rank learns whether all could; -1 everywhere when one could not (that rank
 * says why). Collective rather than MPI_Abort: under mpirun --enable-recovery an abort ends only the
 * aborting rank and would leave the others waiting in the next collective. */
static int load_model_everywhere(const ServeArgs *a, int rank, BraidModel *model) {
    BraidError err;
    int ok = braid_model_load(cli_model_path(a->model), model, &err) == 0, all_ok = 0;
    if (!ok) fprintf(stderr, "braid serve: rank %d: %s\n", rank, err.msg);
    if (ok && cli_apply_chat_template("serve", model, a->chat_template, rank == 0)) {
        braid_model_free(model);
        ok = 0;
    }
    if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS) all_ok = 0;
    if (ok && !all_ok) braid_model_free(model);
    return all_ok ? 0 : -1;
}

/* Rank 0's exit status for the launcher (mpirun --enable-recovery exits 0 whatever its ranks return). */
static void write_exit_status(const char *path, int status) {
    FILE *f = fopen(path, "w");
    bool ok = f && fprintf(f, "%d\n", status) > 0;
    if (f && fclose(f)) ok = false;
    if (!ok) fprintf(stderr, "braid serve: cannot write --exit-status-file %s\n", path);
}

/* What a spawned leader is started with: `braid` + the serve arguments as given (getopt permutes
 * argv, so they are copied first) + the host tier rank 0 decided (+ --kv-moves off when the
 * cluster has no other instance to move blocks with). */
typedef struct {
    char **args; /* NULL-terminated */
    int n;
    char host_blocks[24];
} RespawnArgs;

static int respawn_args_copy(RespawnArgs *r, int argc, char **argv) {
    memset(r, 0, sizeof *r);
    if (!(r->args = calloc((size_t)argc + 5, sizeof *r->args))) return -1;
    for (r->n = 0; r->n < argc; r->n++) r->args[r->n] = argv[r->n]; /* borrowed: main's argv outlives cmd_serve */
    return 0;
}

/* move_peers: the world's leaders start a mover; a respawned one does too (its move messages go
 * through the coordinator, WorkerRoleConfig.relay_moves), unless it would be alone (the last
 * --kv-moves given is the one getopt keeps). */
static void respawn_args_add_rank0(RespawnArgs *r, long host_blocks, bool move_peers) {
    snprintf(r->host_blocks, sizeof r->host_blocks, "%ld", host_blocks);
    r->args[r->n] = "--respawn-host-blocks";
    r->args[r->n + 1] = r->host_blocks;
    if (!move_peers) r->args[r->n + 2] = "--kv-moves", r->args[r->n + 3] = "off";
}

/* The spawned leader names its process to the coordinator before anything else (MSG_REJOIN). */
static int send_rejoin(MPI_Comm parent, BraidError *err) {
    pid_t pid;
    uint64_t start_ticks;
    char host[256] = "";
    rank_directory_self(&pid, &start_ticks);
    gethostname(host, sizeof host - 1);
    WireBuf b = {0};
    wire_put_u64(&b, (uint64_t)pid);
    wire_put_u64(&b, start_ticks);
    wire_put_str(&b, host);
    int rc = b.failed ? braid_error_set(err, "out of memory")
                      : mpi_check(MPI_Send(b.data, (int)b.len, MPI_BYTE, 0, MSG_REJOIN, parent), "rejoin", err);
    wire_buf_free(&b);
    return rc;
}

/* A leader spawned by rank 0 to replace dead instance I (--restart-instances). Its own
 * MPI_COMM_WORLD holds only itself, so none of the job's start-up collectives apply: it names its
 * process, loads the model and adapters, and leads the instance (tp 1) with the intercommunicator
 * to rank 0 as its control plane. It ends without MPI_Finalize (the job it joined lost a rank). */
static int run_respawned(const ServeArgs *a, MPI_Comm parent) {
    BraidError err;
    MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
    if (send_rejoin(parent, &err)) {
        fprintf(stderr, "braid serve: instance %ld (restarted): %s\n", a->respawned_instance, err.msg);
        return 1;
    }
    BraidModel model;
    if (braid_model_load(cli_model_path(a->model), &model, &err)) {
        fprintf(stderr, "braid serve: instance %ld (restarted): %s\n", a->respawned_instance, err.msg);
        return 1;
    }
    LoraSet lora;
    int rc = 1;
    if (cli_load_lora("serve", &a->lora, &model.weights.cfg, &lora, true) == 0) {
        RankBinding unbound = {0}; /* not bound: its slice of cores may be another rank's */
        bool lost_ranks = true;    /* unused: a spawned leader never calls MPI_Finalize */
        /* It moves KV blocks like the world's leaders, every move message through the coordinator (an
         * intercommunicator reaches no other leader); a lone instance's is given --kv-moves off. */
        rc = run_worker(a, &model, &lora, 1 + (int)a->respawned_instance, 1, parent, MPI_COMM_SELF, a->respawn_host_blocks, &unbound,
                        true, &lost_ranks);
        lora_set_free(&lora);
    }
    braid_model_free(&model);
    return rc;
}

/* Before MPI_Init (which must know the thread level): is --join-slots given with K > 0? */
static bool wants_join_slots(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *v = strncmp(argv[i], "--join-slots=", 13) == 0 ? argv[i] + 13
                        : strcmp(argv[i], "--join-slots") == 0 && i + 1 < argc ? argv[i + 1] : NULL;
        if (v && atol(v) > 0) return true;
    }
    return false;
}

/* A leader that joins a running coordinator from its own MPI job (--join-instance): connected,
 * taken, it runs as a respawned leader of that instance. */
static int run_joining(ServeArgs *a) {
    BraidError err;
    MPI_Comm inter = MPI_COMM_NULL;
    if (join_connect(a->join_service, (int)a->join_instance, a->coordinator_timeout, &inter, &err)) {
        fprintf(stderr, "braid serve: joining as instance %ld: %s\n", a->join_instance, err.msg);
        return 1;
    }
    fprintf(stderr, "braid serve: joined the coordinator as instance %ld\n", a->join_instance);
    a->respawned_instance = a->join_instance;
    return run_respawned(a, inter); /* its moves go through the coordinator (MSG_KV_RELAY) */
}

static int check_layout(int world, long tp, int rank) {
    if (world >= 2 && (world - 1) % tp == 0) return 0;
    if (rank == 0)
        fprintf(stderr, "braid serve: %d ranks cannot form instances of --tp %ld: start 1 + I*%ld ranks "
                        "(rank 0 coordinates), e.g. mpirun -n %ld\n", world, tp, tp, 1 + tp);
    return 2;
}

int cmd_serve(int argc, char **argv) {
    /* Signals are polled by the coordinator's MPI thread; every thread (MPI's, HTTP's) inherits the block. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    int provided = 0, rank = 0, world = 0;
    /* The join acceptor (instance_join.h) calls MPI from its own thread. */
    if (MPI_Init_thread(&argc, &argv, wants_join_slots(argc, argv) ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "braid serve: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    RespawnArgs respawn;
    if (respawn_args_copy(&respawn, argc, argv)) {
        fprintf(stderr, "braid serve: out of memory\n");
        return 1;
    }
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    ServeArgs a;
    AgentPredictor *predictor = NULL; /* rank 0's --predictor until the coordinator takes it */
    AccessConfig access = {0};        /* rank 0's --api-keys and TLS files */
    int rc = parse_args(argc, argv, &a, rank == 0);
    if (rc == 0 && a.join_instance >= 0) { /* its own MPI job: no job start-up, no MPI_Finalize */
        rc = run_joining(&a);
        free(respawn.args);
        return rc;
    }
    if (parent != MPI_COMM_NULL) { /* a restarted instance's leader: no job start-up, no MPI_Finalize */
        rc = rc == 0 ? run_respawned(&a, parent) : rc;
        free(respawn.args);
        return rc;
    }
    bool help = rc == 1;
    if (rc == 0) rc = check_layout(world, a.tp, rank);
    BraidModel model;
    BraidError err;
    MPI_Comm tp_comm = MPI_COMM_NULL;
    RankBinding binding, *bindings = NULL; /* this rank's; every rank's on rank 0 */
    RankDirectory ranks = {0};             /* every rank's process, on rank 0 */
    bool lost_ranks = false;               /* an instance died: MPI_Finalize could wait for it forever */
    char *binding_metrics = NULL;
    if (rc == 0) {
        MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : 1 + (rank - 1) / (int)a.tp, rank, &tp_comm);
        MPI_Comm_set_errhandler(tp_comm, MPI_ERRORS_RETURN);
        if (rank == 0 && a.pid_file) {
            FILE *f = fopen(a.pid_file, "w");
            if (f) fprintf(f, "%ld\n", (long)getpid()), fclose(f);
            else fprintf(stderr, "braid serve: cannot write --pid-file %s\n", a.pid_file);
        }
        /* Emptied before the collectives below, so every leader (which opens it after them) appends to a fresh file. */
        if (rank == 0 && a.occupancy_log && occupancy_log_truncate(a.occupancy_log, &err))
            fprintf(stderr, "braid serve: %s; the leaders will report why they cannot write it\n", err.msg);
        /* Bound before anything is loaded, so the model's pages and the threads start where they stay. */
        if (rank_binding_collective(MPI_COMM_WORLD, a.bind, a.device == BACKEND_CUDA ? 0 : -1, &binding, &bindings, &err))
            fprintf(stderr, "braid serve: rank %d: %s\n", rank, err.msg);
        if (rank == 0 && bindings) binding_metrics = rank_binding_metrics_text(bindings, world);
        /* Without it the coordinator still sees a dead instance, by its silence only. */
        if (rank_directory_gather(MPI_COMM_WORLD, &ranks, &err)) fprintf(stderr, "braid serve: rank %d: %s\n", rank, err.msg);
        /* A bad --predictor or --api-keys file stops every rank before anything heavy is loaded. */
        if (load_predictor(&a, rank, &predictor) || load_access(&a, rank, &access) || load_model_everywhere(&a, rank, &model)) {
            rc = 1;
        } else {
            /* Every rank loads the adapters (workers compute with them, rank 0 checks requests' names);
             * the same files on every rank fail alike, and rank 0 says why. */
            LoraSet lora;
            long host_blocks = cli_load_lora("serve", &a.lora, &model.weights.cfg, &lora, rank == 0) ? -1 : decide_host_blocks(&a, &model, rank);
            bool move_peers = (world - 1) / (int)a.tp + a.join_slots > 1;
            if (rank == 0 && host_blocks >= 0) respawn_args_add_rank0(&respawn, host_blocks, move_peers);
            if (host_blocks < 0) rc = 1;
            else rc = rank == 0 ? run_coordinator(&a, &model, &lora, (world - 1) / (int)a.tp + (int)a.join_slots, &stop, &predictor, binding_metrics, &access,
                                                  &ranks, a.restart_instances > 0 ? (const char *const *)respawn.args : NULL, &lost_ranks)
                                : run_worker(&a, &model, &lora, rank, (int)a.tp, MPI_COMM_WORLD, tp_comm, host_blocks, &binding,
                                             move_peers, &lost_ranks);
            lora_set_free(&lora);
            braid_model_free(&model);
        }
        agent_predictor_free(predictor); /* still here only when the coordinator never took it */
        access_config_free(&access);
        MPI_Comm_free(&tp_comm);
    }
    free(bindings);
    free(binding_metrics);
    rank_directory_free(&ranks);
    free(respawn.args);
    /* A job that lost ranks ends without MPI_Finalize (every survivor was told at SHUTDOWN): its fence
     * over the whole job may wait for the dead rank forever. mpirun --enable-recovery accepts that. */
    if (!lost_ranks) MPI_Finalize();
    int status = help ? 0 : rc;
    if (rank == 0 && a.exit_status_file) write_exit_status(a.exit_status_file, status);
    return status;
}
