/*
 * sim_cluster_report.h — braid sim --instances: runs the cluster replay (sim/sim_cluster.h) and
 * prints its summary on stdout (and one JSON line with json). Returns the exit status.
 */
#ifndef BRAID_CLI_SIM_CLUSTER_REPORT_H
#define BRAID_CLI_SIM_CLUSTER_REPORT_H

#include <stdbool.h>

#include "sim/sim_cluster.h"

int sim_cluster_report(const Trace *trace, const SimClusterConfig *cfg, bool json);

#endif
