/* braid sim --tenants: the three arms side by side; the contract is in sim_tenants_report.h. */
#include "cli/sim_tenants_report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int run_arm(const Trace *trace, SimTenantsConfig cfg, bool fair, const char *only, SimTenantsResult *r) {
    BraidError err;
    cfg.fair_share = fair;
    cfg.only_tenant = only;
    if (sim_tenants_run(trace, &cfg, r, &err) == 0) return 0;
    fprintf(stderr, "braid sim: %s\n", err.msg);
    return -1;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static void print_json(const SimTenantsResult *fcfs, const SimTenantsResult *fair, const SimTenantsResult *alone) {
    printf("{\"tenants\":[");
    for (int i = 0; i < fcfs->n_tenants; i++) {
        const SimTenantStats *f = &fcfs->tenants[i], *w = sim_tenants_find(fair, f->tenant), *a = &alone[i].tenants[0];
        printf("%s{\"tenant\":\"%s\",\"requests\":%d,\"alone_median_s\":%.4f,\"fcfs_median_s\":%.4f,\"fair_median_s\":%.4f,"
               "\"fcfs_slowdown\":%.3f,\"fair_slowdown\":%.3f,\"fcfs_ttft_s\":%.4f,\"fair_ttft_s\":%.4f}",
               i ? "," : "", f->tenant, f->requests, a->median_latency_s, f->median_latency_s, w->median_latency_s,
               ratio(f->median_latency_s, a->median_latency_s), ratio(w->median_latency_s, a->median_latency_s), f->median_ttft_s,
               w->median_ttft_s);
    }
    printf("],\"fcfs_tokens_per_s\":%.3f,\"fair_tokens_per_s\":%.3f,\"throughput_ratio\":%.4f,\"fcfs_steps\":%llu,\"fair_steps\":%llu}\n",
           fcfs->tokens_per_s, fair->tokens_per_s, ratio(fair->tokens_per_s, fcfs->tokens_per_s), (unsigned long long)fcfs->steps,
           (unsigned long long)fair->steps);
}

static void print_text(const SimTenantsConfig *cfg, const SimTenantsResult *fcfs, const SimTenantsResult *fair,
                       const SimTenantsResult *alone) {
    printf("tenants sharing one instance: %d requests, steps of %d tokens (%d shared with fair sharing), %d running;\n"
           "cost %.2f ms a step + %.2f ms a prompt token + %.2f ms a decoding sequence\n",
           fcfs->requests, cfg->max_batch_tokens, cfg->fair_step_tokens, cfg->max_running, cfg->step_s * 1e3,
           cfg->prefill_s_per_token * 1e3, cfg->decode_s_per_token * 1e3);
    printf("%-16s %8s %12s %12s %12s %10s %10s\n", "tenant", "requests", "alone p50 s", "fcfs p50 s", "fair p50 s", "fcfs x", "fair x");
    for (int i = 0; i < fcfs->n_tenants; i++) {
        const SimTenantStats *f = &fcfs->tenants[i], *w = sim_tenants_find(fair, f->tenant), *a = &alone[i].tenants[0];
        printf("%-16s %8d %12.3f %12.3f %12.3f %10.2f %10.2f\n", f->tenant[0] ? f->tenant : "(none)", f->requests,
               a->median_latency_s, f->median_latency_s, w->median_latency_s, ratio(f->median_latency_s, a->median_latency_s),
               ratio(w->median_latency_s, a->median_latency_s));
    }
    printf("throughput: fcfs %.2f, fair %.2f completion tokens per modeled s (fair/fcfs %.3f); steps %llu vs %llu\n",
           fcfs->tokens_per_s, fair->tokens_per_s, ratio(fair->tokens_per_s, fcfs->tokens_per_s), (unsigned long long)fcfs->steps,
           (unsigned long long)fair->steps);
}

int sim_tenants_report(const Trace *trace, const SimTenantsConfig *cfg, bool json) {
    SimTenantsResult fcfs, fair, *alone = NULL;
    int rc = run_arm(trace, *cfg, false, NULL, &fcfs);
    if (rc == 0) rc = run_arm(trace, *cfg, true, NULL, &fair);
    else memset(&fair, 0, sizeof fair);
    int n_alone = 0;
    if (rc == 0 && !(alone = calloc((size_t)(fcfs.n_tenants > 0 ? fcfs.n_tenants : 1), sizeof *alone))) {
        fprintf(stderr, "braid sim: out of memory\n");
        rc = -1;
    }
    for (; rc == 0 && n_alone < fcfs.n_tenants; n_alone++)
        if (run_arm(trace, *cfg, false, fcfs.tenants[n_alone].tenant, &alone[n_alone])) rc = -1;
    for (int i = 0; rc == 0 && i < fcfs.n_tenants; i++)
        if (alone[i].n_tenants != 1 || !sim_tenants_find(&fair, fcfs.tenants[i].tenant)) {
            fprintf(stderr, "braid sim: tenant %s has no finished request\n", fcfs.tenants[i].tenant);
            rc = -1;
        }
    if (rc == 0) {
        print_text(cfg, &fcfs, &fair, alone);
        if (json) print_json(&fcfs, &fair, alone);
    }
    for (int i = 0; i < n_alone; i++) sim_tenants_result_free(&alone[i]);
    free(alone);
    sim_tenants_result_free(&fcfs);
    sim_tenants_result_free(&fair);
    return rc ? 1 : 0;
}
