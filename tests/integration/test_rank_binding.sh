#!/usr/bin/env bash
# Integration test of hwloc rank binding (braid serve --bind) under real mpirun ranks.
#   tests/integration/test_rank_binding.sh BRAID_BINARY MODEL
# 1. 1 + 2x1 ranks (launch/braid-local), default --bind auto: the start-up lines name two bound
#    worker ranks with disjoint cpusets, the kernel agrees (each slice is the Cpus_allowed_list of
#    one rank process), /metrics has braid_rank_binding_info for both, and a completion works.
# 2. --bind none: the start-up line says not bound, /metrics says state "disabled".
# Needs at least 2 cores for part 1 (skipped with a message otherwise: two ranks would be oversubscribed).
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
# An ASan build's leak report at exit would turn MPI's own allocations into a failed exit status.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
work=$(mktemp -d)
launcher_pid=""
port=""
failures=0
trap 'cleanup' EXIT

cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL -- "-$launcher_pid" 2> /dev/null
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }
# a port below the ephemeral range, so no MPI rank of the job takes it first (free_port.py says why)
free_port() { python3 "$root/tests/integration/free_port.py"; }

# start NAME ARGS...: braid-local in its own session (so cleanup can kill the group); waits for /health.
start() {
  local name=$1; shift
  port=$(free_port)
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --kv-blocks 32 --host-kv-blocks 0 "$@" \
    > "$work/$name.out" 2> "$work/$name.err" &
  launcher_pid=$!
  for _ in $(seq 1 240); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && { ok "$name: ready"; return 0; }
    kill -0 "$launcher_pid" 2> /dev/null || break
    sleep 0.5
  done
  fail "$name: never became ready"; cat "$work/$name.err"; return 1
}

stop() {
  local name=$1 status
  kill -TERM "$launcher_pid"; wait "$launcher_pid"; status=$?; launcher_pid=""
  check "$name: SIGTERM exits 0 (got $status)" [ "$status" = 0 ]
  sleep 0.5
  check "$name: no ranks left" bash -c "! pgrep -f '[b]raid serve .*--port $port ' > /dev/null"
}

# The Cpus_allowed_list of every braid rank process serving $port, one per line.
rank_affinities() {
  for pid in $(pgrep -f "braid serve .*--port $port "); do
    [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = braid ] || continue  # mpirun's own command line matches too
    awk '/^Cpus_allowed_list/ {print $2}' "/proc/$pid/status"
  done
}

if [ "$(nproc)" -lt 2 ]; then
  echo "skipped: part 1 needs 2 cores (this machine has $(nproc))"
else
  start bound --instances 2 || exit 1
  grep 'braid serve: rank [0-9]* (worker' "$work/bound.err" > "$work/lines"
  cat "$work/lines"
  rank_affinities > "$work/affinities"
  curl -s "http://127.0.0.1:$port/metrics" | grep '^braid_rank_binding_info' > "$work/metrics"
  cat "$work/metrics"
  check "bound: two start-up lines, both bound" [ "$(grep -c 'bound to' "$work/lines")" = 2 ]
  # Disjoint slices, each the affinity the kernel reports for exactly one rank process; the metrics agree.
  check "bound: disjoint cpusets, matching the kernel and /metrics" python3 - "$work/lines" "$work/affinities" "$work/metrics" << 'EOF'
import re, sys
def cpus(text):
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out
lines = open(sys.argv[1]).read()
slices = re.findall(r"cpuset ([0-9,-]+), NUMA node [0-9,-]+", lines)
affinities = open(sys.argv[2]).read().split()
metrics = re.findall(r'rank="(\d+)".*state="bound",cpuset="([0-9,-]+)",numa="[0-9,-]+"', open(sys.argv[3]).read())
assert len(slices) == 2, slices
a, b = cpus(slices[0]), cpus(slices[1])
assert a and b and not (a & b), (a, b)
for s in slices:
    assert sum(cpus(x) == cpus(s) for x in affinities) == 1, (s, affinities)
assert sorted(m[1] for m in metrics) == sorted(slices) and sorted(m[0] for m in metrics) == ["1", "2"], metrics
EOF
  code=$(curl -s -o "$work/body" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" -H "Content-Type: application/json" \
    -d '{"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}')
  check "bound: a completion answers 200 (got $code)" [ "$code" = 200 ]
  stop bound
fi

start unbound --instances 1 --bind none || exit 1
check "unbound: start-up line says --bind none" grep -q 'rank 1 (worker 1 of 1 on .*): not bound (--bind none)' "$work/unbound.err"
check "unbound: /metrics says disabled" bash -c "curl -s http://127.0.0.1:$port/metrics | grep -q 'braid_rank_binding_info{rank=\"1\",.*state=\"disabled\",cpuset=\"\"'"
stop unbound

echo "$failures failure(s)"
[ "$failures" = 0 ]
