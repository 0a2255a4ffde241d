#include "cli/cli_common.h"

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/sched_admit.h"

const char *cli_model_path(const char *flag_value) {
    if (flag_value) return flag_value;
    const char *env = getenv("BRAID_MODEL");
    return env && *env ? env : BRAID_DEFAULT_MODEL;
}

int cli_set_threads(int requested) {
    int n = requested > 0 ? requested : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    return n;
}

int cli_parse_int(const char *flag, const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "braid: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_float(const char *flag, const char *text, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "braid: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

char *cli_read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) { free(buf); return NULL; }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) { free(buf); return NULL; }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* ---- cache flags ---- */

int cli_parse_segment_reuse(const char *cmd, const char *text, SegmentReuseMode *mode, bool verbose) {
    int m = segment_reuse_parse(text);
    if (m < 0) {
        if (verbose) fprintf(stderr, "braid %s: --segment-reuse expects off, exact or approx, got '%s'\n", cmd, text);
        return -1;
    }
    *mode = (SegmentReuseMode)m;
    return 0;
}

const EvictPolicy *cli_parse_policy(const char *cmd, const char *name, bool verbose) {
    const EvictPolicy *p = evict_policy_find(name);
    if (p || !verbose) return p;
    const EvictPolicy *const *all;
    int n = evict_policy_list(&all);
    fprintf(stderr, "braid %s: unknown --policy '%s'; registered policies:", cmd, name);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? "," : "", all[i]->name);
    fputs(" (--list-policies describes them)\n", stderr);
    return NULL;
}

int cli_parse_prefetch_copies(const char *cmd, const char *text, bool *thread_copies, bool verbose) {
    if (strcmp(text, "thread") != 0 && strcmp(text, "inline") != 0) {
        if (verbose) fprintf(stderr, "braid %s: --prefetch-copies expects thread or inline, got '%s'\n", cmd, text);
        return -1;
    }
    *thread_copies = strcmp(text, "thread") == 0;
    return 0;
}

int cli_parse_pbkv_gamma(const char *cmd, const char *text, double *gamma, bool verbose) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v > 0 && v <= 1)) {
        if (verbose) fprintf(stderr, "braid %s: --pbkv-gamma expects a discount in (0, 1] (the paper's: 0.7), got '%s'\n", cmd, text);
        return -1;
    }
    *gamma = v;
    return 0;
}

int cli_check_pbkv_gamma(const char *cmd, const EvictPolicy *policy, double gamma, bool verbose) {
    if (gamma > 0 && policy != &evict_policy_pbkv) {
        if (verbose) fprintf(stderr, "braid %s: --pbkv-gamma applies to --policy pbkv only (the policy is %s)\n", cmd, policy->name);
        return -1;
    }
    return 0;
}

int cli_parse_pbkv_future(const char *cmd, const char *text, int *future, bool verbose) {
    if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0) {
        if (verbose) fprintf(stderr, "braid %s: --pbkv-future expects on or off, got '%s'\n", cmd, text);
        return -1;
    }
    *future = strcmp(text, "on") == 0 ? 1 : -1;
    return 0;
}

int cli_check_pbkv_future(const char *cmd, const EvictPolicy *policy, int future, bool verbose) {
    if (future != 0 && policy != &evict_policy_pbkv) {
        if (verbose) fprintf(stderr, "braid %s: --pbkv-future applies to --policy pbkv only (the policy is %s)\n", cmd, policy->name);
        return -1;
    }
    return 0;
}

void cli_list_policies(FILE *out) {
    const EvictPolicy *const *all;
    int n = evict_policy_list(&all);
    for (int i = 0; i < n; i++) fprintf(out, "%-16s %s\n", all[i]->name, all[i]->description ? all[i]->description : "");
}

static int host_flags_exclusive(const char *cmd, const CliHostTier *h, bool blocks, bool verbose) {
    if ((blocks && h->gib >= 0) || (!blocks && h->blocks >= 0)) {
        if (verbose) fprintf(stderr, "braid %s: --host-kv-blocks and --host-kv-gib are mutually exclusive (give one)\n", cmd);
        return -1;
    }
    return 0;
}

int cli_parse_admit_output(const char *cmd, const char *text, int *mode, bool verbose) {
    if (sched_admit_output_parse(text, mode) == 0) return 0;
    if (verbose) fprintf(stderr, "braid %s: --admit-output expects off, auto or a token count in [1, 1048576], got '%s'\n", cmd, text);
    return -1;
}

int cli_parse_host_kv_blocks(const char *cmd, const char *text, CliHostTier *h, bool verbose) {
    if (host_flags_exclusive(cmd, h, true, verbose)) return -1;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 0 || v > (1L << 30) || v == 1) {
        if (verbose)
            fprintf(stderr, "braid %s: --host-kv-blocks expects 0 (off) or a block count in [2, %ld], got '%s'\n", cmd, 1L << 30,
                    text);
        return -1;
    }
    h->blocks = v;
    return 0;
}

int cli_parse_host_kv_gib(const char *cmd, const char *text, CliHostTier *h, bool verbose) {
    if (host_flags_exclusive(cmd, h, false, verbose)) return -1;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= 0 && v <= 1e9)) {
        if (verbose) fprintf(stderr, "braid %s: --host-kv-gib expects a size in GiB in [0, 1e9] (0 = off), got '%s'\n", cmd, text);
        return -1;
    }
    h->gib = v;
    return 0;
}

unsigned long long cli_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return kib * 1024ULL;
}

#define GIB (1024.0 * 1024.0 * 1024.0)

int cli_host_tier_blocks(const CliHostTier *h, long device_blocks, size_t block_bytes, int ranks, long *host_blocks, char *why,
                         size_t why_cap) {
    if (ranks < 1) ranks = 1;
    if (block_bytes == 0) block_bytes = 1;
    unsigned long long avail = cli_mem_available();
    long blocks;
    const char *given = NULL;
    char given_text[96];
    if (h->blocks >= 0) {
        blocks = h->blocks;
        snprintf(given_text, sizeof given_text, "--host-kv-blocks %ld", h->blocks);
        given = given_text;
    } else if (h->gib >= 0) {
        double n = h->gib * GIB / (double)block_bytes;
        blocks = n >= (double)(1L << 30) ? 1L << 30 : (long)n;
        if (blocks == 1) blocks = 2; /* 1 would be the null block alone */
        snprintf(given_text, sizeof given_text, "--host-kv-gib %g", h->gib);
        given = given_text;
    } else {
        blocks = 4 * device_blocks;
        if (avail) {
            unsigned long long fit = avail / 4 / (unsigned long long)ranks / block_bytes;
            if ((unsigned long long)blocks > fit) blocks = (long)fit;
        }
        if (blocks < 2) blocks = 0;
    }
    double need = (double)blocks * (double)block_bytes * ranks;
    if (given && avail && blocks > 0 && need > (double)avail) {
        snprintf(why, why_cap,
                 "%s asks for a %.2f GiB host KV tier (%ld blocks of %zu bytes%s), more than the %.2f GiB of "
                 "MemAvailable; lower it or give 0 to turn the tier off",
                 given, need / GIB, blocks, block_bytes, ranks > 1 ? ", on every worker rank of this machine" : "",
                 (double)avail / GIB);
        return -1;
    }
    *host_blocks = blocks;
    return 0;
}

void cli_describe_host_tier(long host_blocks, size_t block_bytes, char *out, size_t cap) {
    if (host_blocks <= 1) snprintf(out, cap, "host KV tier: off");
    else snprintf(out, cap, "host KV tier: %ld blocks (%.2f GiB per rank)", host_blocks - 1,
                  (double)(host_blocks - 1) * (double)block_bytes / GIB);
}

int cli_apply_chat_template(const char *cmd, BraidModel *model, const char *path, bool verbose) {
    BraidError err;
    if (path ? chat_template_load_file(&model->chat, path, NULL, NULL, &err) : chat_template_check(&model->chat, &err)) {
        if (verbose) fprintf(stderr, "braid %s: %s%s\n", cmd, path ? "--chat-template: " : "", err.msg);
        return -1;
    }
    return 0;
}
