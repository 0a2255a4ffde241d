#!/usr/bin/env bash
# A joiner whose coordinator takes the connection but never answers the join gives up by itself
# (issue 33 item 3): `braid serve --join-instance I` waits at most --coordinator-timeout seconds
# (JOIN_VERDICT_DEFAULT_S, 10, when that is 0) for the verdict, then says why and exits nonzero.
# One host, no namespaces: ompi-server, a stand-in coordinator (join_silent_coordinator: publishes
# the join port, accepts, reads the hello, never answers — a real coordinator cannot be made to
# stall between the two) in its own `mpirun -n 1`, and the real joiner in another `mpirun -n 1`.
# Checked, for --coordinator-timeout 3 and for 0 (the default bound):
#  - the connection went through and the joiner named its instance (the stand-in got the hello), so
#    what ends the joiner is the unanswered join, not the lookup or the connect;
#  - the joiner's job ends by itself (bounded here by a generous 150 s, never by this test killing it),
#    with a nonzero exit status and the message "did not answer the join within S s";
#  - --coordinator-timeout -1 is refused with a message; --help names the join answer's bound.
# Every exit path kills the processes this test started (their own process groups) and removes its
# directory. Needs mpirun and ompi-server: exits 77 (skipped) without them.
# Usage: test_join_silent_coordinator.sh BRAID_BINARY MODEL_PATH JOIN_SILENT_COORDINATOR_BINARY
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
stand_in=$(realpath "$3")

skip() { echo "skipped: $*"; exit 77; }
for tool in mpirun ompi-server setsid; do command -v "$tool" > /dev/null || skip "$tool not found"; done

work=$(mktemp -d)
pids=()  # process-group leaders this test started (setsid): ompi-server, the stand-in's mpirun, joiners
cleanup() {
  local p
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL -- "-$p" 2> /dev/null; done
  { wait; } 2> /dev/null  # reaped quietly (no "Killed" job notices)
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then cleans up
failures=0
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }
show() { local f; for f in "$@"; do echo "--- $f"; grep -v '^\s*$' "$f" | tail -n 20; done; }
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds, polled every 0.5 s
  local t=$1
  shift
  for _ in $(seq 1 $((2 * t))); do "$@" && return 0; sleep 0.5; done
  return 1
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
service=braid-silent-$$

setsid ompi-server --no-daemonize -r "$work/uri" > "$work/ompi-server.log" 2>&1 &
pids+=($!)
uri_written() { [ -s "$work/uri" ]; }
wait_for 60 uri_written || { show "$work/ompi-server.log"; skip "ompi-server wrote no URI (cannot run here)"; }

setsid mpirun -n 1 --bind-to none --ompi-server "file:$work/uri" "$stand_in" "$service" > "$work/stand-in.out" 2> "$work/stand-in.err" &
pids+=($!)
listening() { grep -q '^listening$' "$work/stand-in.out"; }
if wait_for 90 listening; then ok "the stand-in coordinator published its join port"
else fail "the stand-in coordinator published its join port"; show "$work"/stand-in.*; exit 1; fi

# joiner NAME TIMEOUT: a real joiner as instance 1 with --coordinator-timeout TIMEOUT; its exit
# status in $work/NAME.rc once its job ended by itself.
joiner() {
  local name=$1 timeout=$2 pid status
  setsid mpirun -n 1 --bind-to none --ompi-server "file:$work/uri" "$braid" serve --model "$model" --join-instance 1 \
    --join-service "$service" --coordinator-timeout "$timeout" > "$work/$name.out" 2> "$work/$name.err" &
  pid=$!
  pids+=("$pid")
  ended() { ! kill -0 "$pid" 2> /dev/null; }
  if wait_for 150 ended; then
    wait "$pid"; status=$?
  else
    status=hung
  fi
  echo "$status" > "$work/$name.rc"
}
hellos() { grep -c '^hello from instance 1$' "$work/stand-in.out"; }
nonzero() { local rc; rc=$(cat "$work/$1.rc"); [ "$rc" != hung ] && [ "$rc" != 0 ]; }

# ---------------------------------------------------------------- --coordinator-timeout 3
joiner bounded 3
check "bounded: the stand-in got the joiner's hello (connected, instance named)" [ "$(hellos)" = 1 ]
check "bounded: the joiner's job ended by itself, exit status nonzero ($(cat "$work/bounded.rc"))" nonzero bounded
check "bounded: it says the join was not answered within 3 s" \
  grep -q "joining as instance 1: .*connected, but the coordinator did not answer the join within 3 s" "$work/bounded.err"
[ "$failures" = 0 ] || show "$work"/bounded.* "$work"/stand-in.*

# ---------------------------------------------------------------- --coordinator-timeout 0: the default bound
joiner unbounded 0
check "0: the stand-in got the second joiner's hello" [ "$(hellos)" = 2 ]
check "0: the joiner's job still ended by itself, exit status nonzero ($(cat "$work/unbounded.rc"))" nonzero unbounded
check "0: it waited the default 10 s for the answer" \
  grep -q "connected, but the coordinator did not answer the join within 10 s" "$work/unbounded.err"

# ---------------------------------------------------------------- the option itself
"$braid" serve --model "$model" --coordinator-timeout -1 > /dev/null 2> "$work/bad.err"
bad_rc=$?
check "--coordinator-timeout -1 is refused with exit status 2 ($bad_rc)" [ "$bad_rc" = 2 ]
check "... with a message naming the option" grep -q -- "--coordinator-timeout" "$work/bad.err"
"$braid" serve --help > "$work/help.out" 2>&1
check "--help names the join answer's bound" grep -q "A joiner also waits at most S for the answer to its join" "$work/help.out"

[ "$failures" = 0 ] || show "$work"/*.err
echo "$failures failure(s)"
[ "$failures" = 0 ]
