#!/usr/bin/env bash
# fair_share_rounds.sh — bench/fair_share.py for first come, first served and fair sharing in
# interleaved rounds (off, on, off, on, ...), each line of output one run's JSON with the mode,
# the round and the load average before it (issue 37). The cluster runs at the priority this
# script runs at: on a shared machine start it with `nice -n -10` (as root) so that other work
# does not take the cores from the benchmark mid-run.
#
#   nice -n -10 bench/fair_share_rounds.sh BRAID MODEL ROUNDS [fair_share.py args...] > out.jsonl
set -euo pipefail
braid=$1 model=$2 rounds=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
for round in $(seq 1 "$rounds"); do
  for mode in off on; do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    line=$(python3 "$here/fair_share.py" --braid "$braid" --model "$model" --serve-args "--fair-share $mode" "$@" | tail -1)
    echo "{\"round\": $round, \"mode\": \"$mode\", \"load_before\": \"$load\", \"load_after\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"run\": $line}"
  done
done
