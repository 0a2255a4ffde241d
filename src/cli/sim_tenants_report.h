/*
 * sim_tenants_report.h — braid sim --tenants: replays the trace through one instance's scheduler
 * (sim/sim_tenants.h) three ways — each tenant alone, all tenants first come first served, and all
 * with weighted fair sharing — and prints per tenant the median latency of each arm and its
 * slowdown against alone, and the throughput of both shared arms and their ratio (and one JSON
 * line with json). Returns the exit status.
 */
#ifndef BRAID_CLI_SIM_TENANTS_REPORT_H
#define BRAID_CLI_SIM_TENANTS_REPORT_H

#include <stdbool.h>

#include "sim/sim_tenants.h"

int sim_tenants_report(const Trace *trace, const SimTenantsConfig *cfg, bool json);

#endif
