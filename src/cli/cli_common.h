/*
 * cli_common.h — helpers shared by the subcommands: the default model path, thread setup, number
 * parsing with range checks, reading all of stdin, and the cache flags `braid batch` and `braid
 * serve` share (--policy / --list-policies, --host-kv-blocks / --host-kv-gib).
 * Errors are printed on stderr, prefixed "braid <command>: ".
 */
#ifndef BRAID_CLI_CLI_COMMON_H
#define BRAID_CLI_CLI_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "cache/evict_policy.h"
#include "cache/kv_cache.h"
#include "model/model.h"

#define BRAID_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* --model if given, else $BRAID_MODEL, else the default path. */
const char *cli_model_path(const char *flag_value);
/* Applies --threads (<= 0: all cores) to OpenMP and OpenBLAS; returns the count used. */
int cli_set_threads(int requested);
/* Strict number parsing: the whole string must parse and lie in [lo, hi]; else prints an error
 * naming the flag and returns -1. */
int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out);
int cli_parse_float(const char *flag, const char *text, double lo, double hi, double *out);
/* Reads stdin to a malloc'd buffer (NUL-terminated; *len excludes the NUL). NULL on failure. */
char *cli_read_stdin(size_t *len);

/* ---- --chat-template FILE (generate, batch, serve) ---- */

#define CLI_CHAT_TEMPLATE_USAGE \
    "  --chat-template FILE     a Jinja chat template to use instead of the model's own (tokenizer.chat_template)\n"

/* With path: replaces the model's chat template with the one in the file (keeping its BOS/EOS text
 * and BOS handling). Without: checks that the model's own template compiled. Prints "braid CMD: ..."
 * naming the file or tokenizer.chat_template, the construct and the line, and returns -1, when the
 * file cannot be read or a template does not compile (printed when verbose: under mpirun every rank
 * loads, rank 0 speaks). A model without any template passes (its chat renders fail clearly). */
int cli_apply_chat_template(const char *cmd, BraidModel *model, const char *path, bool verbose);

/* ---- cache flags ---- */

#define CLI_CACHE_FLAGS_USAGE                                                                                        \
    "  --policy NAME            eviction policy of both cache tiers (default lru; see --list-policies)\n"         \
    "  --list-policies          print the eviction policies (name and description) and exit\n"                    \
    "  --host-kv-blocks N       host-memory KV tier in blocks (the pool, like --kv-blocks); 0 turns it off\n"     \
    "  --host-kv-gib G          the host tier by size instead: G GiB of host memory per worker rank\n"            \
    "                           (default: 4x --kv-blocks, capped to 25% of MemAvailable in /proc/meminfo;\n"      \
    "                           more than MemAvailable is refused at startup)\n"

#define CLI_SEGMENT_FLAGS_USAGE                                                                                      \
    "  --segment-reuse M        reuse chunks of other cached prompts at other offsets (tool schemas, preambles,\n"   \
    "                           documents): off; exact (default: only where the whole left context matches too,\n"   \
    "                           so outputs equal a full prefill); approx (also chunks whose last --approx-window\n"  \
    "                           tokens of left context match: keys re-positioned by delta-RoPE, K/V approximate)\n" \
    "  --approx-window W        tokens of left context that must match in approx mode (default 64; 0 = none)\n"

#define CLI_SEGMENT_LSH_USAGE                                                                                        \
    "  --segment-lsh M          approx mode also finds near-duplicate chunks (a few tokens changed) by MinHash/LSH\n" \
    "                           over canonical token text (lowercased, trimmed, numbers masked), per tenant and\n"  \
    "                           adapter; only their equal tokens are reused, the rest computed. off (default);\n"   \
    "                           on (only past a request's first approximate span); anywhere (also before it)\n"     \
    "  --segment-tau-seg T      least estimated Jaccard similarity of a near-duplicate chunk (default 0.5)\n"       \
    "  --segment-tau-ctx T      least similarity of its 64-token left context (default 0.5)\n"

#define CLI_DEFAULT_APPROX_WINDOW 64

#define CLI_OCCUPANCY_FLAGS_USAGE                                                                                    \
    "  --occupancy-log FILE     JSONL pool-occupancy samples per tier ({\"t\", \"instance\", \"tier\", \"total\",\n"        \
    "                           \"free\", \"cached\", \"in_use\"}) when the counts change, at most every\n"                \
    "                           --occupancy-interval seconds (default 1.0); braid-bench plot --occupancy draws it\n"

/* --segment-reuse's value into *mode; -1 after an error message (when verbose) when unknown. */
int cli_parse_segment_reuse(const char *cmd, const char *text, SegmentReuseMode *mode, bool verbose);

/* The policy registered under name, or NULL after an error that lists the known ones (printed only
 * when verbose: under mpirun every rank parses, rank 0 speaks). */
const EvictPolicy *cli_parse_policy(const char *cmd, const char *name, bool verbose);
/* One line per registered policy: name, then its description. */
void cli_list_policies(FILE *out);

/* PBKV's run-time knobs (batch, serve; sim spells its own). --pbkv-gamma: the lookahead discount;
 * --prefetch-blocks: S_bw, the most blocks one pure-decode step prefetches. */
#define CLI_PBKV_FLAGS_USAGE                                                                                         \
    "  --pbkv-gamma G           PBKV's lookahead discount gamma in (0, 1] (default 0.7, the paper's): a forecast's\n"  \
    "                           step s weighs gamma^(s-1); only with --policy pbkv\n"                                  \
    "  --pbkv-future on|off     PBKV's read for the workflows still to come on a prompt most active workflows\n"  \
    "                           read (an agent's head; default on); off: Eq. 2 alone; only with --policy pbkv\n" \
    "  --prefetch-blocks N|auto S_bw: the most host-tier blocks one pure-decode step prefetches (1 to 65536), or\n"   \
    "                           auto (default): measured host->device copy bandwidth x decode step time / block\n"\
    "                           bytes (8 until both are measured); only with\n"                               \
    "                           prefetch on\n"                                                                        \
    "  --prefetch-copies thread|inline  CPU: the prefetch's host->device copies inline before the forward\n"     \
    "                           (default: a worker's threads take every core of its slice), or on a copy\n"    \
    "                           thread beside it (a machine with a core to spare); CUDA always overlaps\n"

/* --prefetch-copies thread|inline into *thread_copies; -1 after an error message (when verbose). */
int cli_parse_prefetch_copies(const char *cmd, const char *text, bool *thread_copies, bool verbose);
/* --pbkv-gamma's value (in (0, 1]) into *gamma; -1 after an error message (when verbose). */
int cli_parse_pbkv_gamma(const char *cmd, const char *text, double *gamma, bool verbose);
/* --pbkv-gamma given (gamma > 0) with a policy that has no discount: -1 after an error message
 * (when verbose). */
int cli_check_pbkv_gamma(const char *cmd, const EvictPolicy *policy, double gamma, bool verbose);
/* --pbkv-future on|off into *future (1 / -1, EvictPolicyOptions.future); -1 after an error message
 * (when verbose). */
int cli_parse_pbkv_future(const char *cmd, const char *text, int *future, bool verbose);
/* --pbkv-future given (future != 0) with a policy other than pbkv: -1 after an error message (when
 * verbose). */
int cli_check_pbkv_future(const char *cmd, const EvictPolicy *policy, int future, bool verbose);

/* --host-kv-blocks / --host-kv-gib as given (at most one of them). */
typedef struct {
    long blocks;  /* -1 = not given */
    double gib;   /* < 0 = not given */
} CliHostTier;

#define CLI_HOST_TIER_DEFAULT ((CliHostTier){.blocks = -1, .gib = -1})

/* Parses one of the two flags into *h; -1 (after an error message when verbose) on a bad value or
 * when the other one was given already. */
int cli_parse_host_kv_blocks(const char *cmd, const char *text, CliHostTier *h, bool verbose);
int cli_parse_host_kv_gib(const char *cmd, const char *text, CliHostTier *h, bool verbose);

/* --admit-output off|auto|N (sched_admit.h) into *mode; -1 (after an error message naming cmd when
 * verbose) on a bad value. */
int cli_parse_admit_output(const char *cmd, const char *text, int *mode, bool verbose);

/* MemAvailable from /proc/meminfo in bytes, or 0 when it cannot be read. */
unsigned long long cli_mem_available(void);

/* The host tier's pool size (blocks including the null block, the --kv-blocks convention; 0 =
 * off). block_bytes: host memory one block takes on one rank; ranks: worker ranks that share this
 * machine's memory, each holding such a tier. Default (no flag): min(4 x device_blocks, what fits
 * in 25% of MemAvailable over the ranks). A tier whose memory on this machine (ranks x blocks x
 * block_bytes) exceeds MemAvailable is an error: returns -1 with a message naming both sizes in
 * why. An unreadable /proc/meminfo skips the cap and the check. */
int cli_host_tier_blocks(const CliHostTier *h, long device_blocks, size_t block_bytes, int ranks, long *host_blocks, char *why,
                         size_t why_cap);
/* "host KV tier: N blocks (X GiB per rank)" or "host KV tier: off", for the startup line. */
void cli_describe_host_tier(long host_blocks, size_t block_bytes, char *out, size_t cap);

#endif
