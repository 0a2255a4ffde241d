#!/usr/bin/env bash
# Integration test of the Slurm launch (launch/braid.sbatch -> launch/braid-slurm -> mpirun).
#   tests/integration/test_slurm.sh BRAID_BINARY MODEL
# 1. Without Slurm: braid-slurm --dry-run on made-up allocations lays instances out whole per node
#    (one mpirun context per node) and refuses a layout that does not fit, naming the allocation.
# 2. Against a real Slurm on this machine (started with ../shared/slurm/local-slurm.sh, or
#    $BRAID_LOCAL_SLURM, when none is running; stopped again afterwards): a job asking for more
#    instances than its tasks hold fails with that message; sbatch launch/braid.sbatch with two
#    small instances prints the API URL, answers a completion and a chat completion through it
#    (200, sane JSON), exports the rank binding in /metrics; kill -9 of instance 1's rank ends only
#    that instance (mpirun --enable-recovery): the job stays, /health says "degraded" naming
#    instance 1 dead, and a completion is still served by instance 0; after scancel the job leaves
#    the queue with no braid process behind. Exits 77 (skipped) only when Slurm cannot be started here (not root,
#    no local-slurm.sh, daemons that do not come up); part 1 has run by then.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
local_slurm=${BRAID_LOCAL_SLURM:-$root/../shared/slurm/local-slurm.sh}
# An ASan build's leak report at exit would turn MPI's own allocations into a failed exit status.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
work=$(mktemp -d)
chmod 755 "$work"  # slurmd writes the job's output here
failures=0 started_slurm=0 job="" port=""
trap 'cleanup' EXIT

cleanup() {
  [ -n "$job" ] && scancel "$job" 2> /dev/null
  [ "$started_slurm" = 1 ] && "$local_slurm" stop > /dev/null 2>&1
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

# A free port in 18200-18299 (the range this project's test servers use).
free_port() {
  python3 -c '
import random, socket
for p in random.sample(range(18200, 18300), 100):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p)); print(p); break
    except OSError:
        pass
    finally:
        s.close()'
}

# --- 1. layouts, no Slurm needed -------------------------------------------------------------
dry() { env SLURM_JOB_ID=1 SLURM_JOB_NODELIST="$1" SLURM_TASKS_PER_NODE="$2" BRAID_BIN="$braid" "$root/launch/braid-slurm" --dry-run "${@:3}"; }
out=$(dry "n[1-2]" "4(x2)" --tp 2 2> "$work/dry.err")
check "dry run: 3 instances of 2 over n1 (coordinator + 1) and n2 (2), one mpirun context each" \
  bash -c '[[ $1 == *"-n 3 --host n1 "*" : -n 4 --host n2 "* ]]' _ "$out"
check "dry run: the layout line names the nodes" grep -q "3 instance(s) x 2 rank(s) = 7 ranks on 2 node(s)" "$work/dry.err"
dry "n[1-2]" "3(x2)" --tp 2 --instances 3 > /dev/null 2> "$work/dry.err"; status=$?
check "dry run: 3 instances of 2 in 2x3 tasks is refused with status 2 (got $status)" [ "$status" = 2 ]
check "dry run: the refusal names the allocation" grep -q "does not fit this allocation: 6 task(s) on 2 node(s) (n1: 3, n2: 3)" "$work/dry.err"
env -u SLURM_JOB_ID "$root/launch/braid-slurm" > /dev/null 2> "$work/dry.err"; status=$?
check "outside an allocation: status 2 and a message (got $status)" bash -c "[ $status = 2 ] && grep -q 'not inside a Slurm allocation' '$work/dry.err'"

# --- 2. a real Slurm ---------------------------------------------------------------------------
slurm_up() { sinfo -h -o %T 2> /dev/null | grep -qE 'idle|mix|alloc'; }
skip() { echo "skipped: $* (the dry-run layout checks above ran: $failures failure(s))"; [ "$failures" = 0 ] && exit 77; exit 1; }
if ! command -v sbatch > /dev/null || ! slurm_up; then
  [ "$(id -u)" = 0 ] || skip "no Slurm is running and starting one needs root"
  [ -x "$local_slurm" ] || skip "no Slurm is running and $local_slurm is not there to start one"
  echo "starting a local Slurm: $local_slurm start"
  started_slurm=1
  timeout 150 "$local_slurm" start > "$work/slurm-start.log" 2>&1
  slurm_up || { cat "$work/slurm-start.log"; skip "the local Slurm did not come up"; }
fi

# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"  # rank_pid R (the job runs $braid, on $port)

# wait_until SECONDS COMMAND...: polls every 0.5 s until COMMAND succeeds.
wait_until() {
  local i limit=$1; shift
  for ((i = 0; i < limit * 2; i++)); do "$@" && return 0; sleep 0.5; done
  return 1
}

# wait_gone JOB SECONDS: the job has left the queue within SECONDS.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 2; i++)); do
    [ -z "$(squeue -h -j "$1" 2> /dev/null)" ] && return 0
    sleep 0.5
  done
  return 1
}
submit() { (cd "$root" && BRAID_BIN=$braid sbatch --parsable --overcommit -o "$work/job-%j.out" "$@"); }

# A layout that does not fit: 2 tasks cannot hold 2 instances. The job says why and ends.
bad=$(submit --ntasks=2 launch/braid.sbatch --model "$model" --instances 2)
check "misfit job: ends by itself" wait_gone "$bad" 30
sleep 1  # the output file is flushed when the step ends
check "misfit job: says the layout does not fit" grep -q "does not fit this allocation: 2 task(s) on 1 node(s)" "$work/job-$bad.out"

port=$(free_port)
job=$(submit --ntasks=3 launch/braid.sbatch --model "$model" --kv-blocks 32 --host-kv-blocks 0 --port "$port")
echo "submitted job $job (port $port)"
url=""
for _ in $(seq 1 180); do
  url=$(grep -o 'API URL http://[^ ]*/v1' "$work/job-$job.out" 2> /dev/null | head -1 | cut -d' ' -f3)
  [ -n "$url" ] && break
  [ -n "$(squeue -h -j "$job" 2> /dev/null)" ] || break
  sleep 0.5
done
if [ -z "$url" ]; then
  fail "job $job never printed its API URL"; cat "$work/job-$job.out" 2> /dev/null
else
  ok "job printed the API URL $url"
  check "URL names rank 0's node and the port" bash -c "[[ '$url' == http://$(squeue -h -j "$job" -o %N):$port/v1 ]]"
  code=$(curl -s -o "$work/completion" -w '%{http_code}' "$url/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}')
  check "completion through the job: 200 (got $code)" [ "$code" = 200 ]
  check "completion: sane JSON" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["object"] == "text_completion" and isinstance(d["choices"][0]["text"], str) and d["choices"][0]["text"], d
assert d["usage"]["completion_tokens"] > 0 and d["usage"]["prompt_tokens"] > 0, d' "$work/completion"
  code=$(curl -s -o "$work/chat" -w '%{http_code}' "$url/chat/completions" -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}')
  check "chat completion through the job: 200 (got $code)" [ "$code" = 200 ]
  check "chat completion: sane JSON" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
m = d["choices"][0]["message"]
assert d["object"] == "chat.completion" and m["role"] == "assistant" and isinstance(m["content"], str), d
assert d["usage"]["completion_tokens"] > 0, d' "$work/chat"
  check "/metrics exports rank 1's binding" bash -c "curl -s '${url%/v1}/metrics' | grep -q '^braid_rank_binding_info{rank=\"1\"'"
  check "job output has the binding line" grep -q 'braid serve: rank 1 (worker 1 of 2 on ' "$work/job-$job.out"
  # A failure domain per instance under Slurm too: instance 1's only rank (rank 2) killed.
  victim=$(rank_pid 2)
  if [ -z "$victim" ]; then
    fail "no process is rank 2 of the job"
  else
    kill -KILL "$victim"
    degraded() { curl -s "${url%/v1}/health" | python3 -c '
import json, sys
h = json.load(sys.stdin)
assert h["status"] == "degraded" and h["instances_alive"] == 1, h
assert any(s["instance"] == 1 and s["state"] == "dead" for s in h["instance_states"]), h' 2> /dev/null; }
    check "kill -9 of rank 2: /health degraded, instance 1 dead" wait_until 30 degraded
    # Without --enable-recovery mpirun would abort the whole job a few seconds after the death
    # (measured: within 12 s); the checks below come after that.
    sleep 12
    check "kill -9 of rank 2: still degraded 12 s later (the coordinator answers)" degraded
    check "kill -9 of rank 2: the job is still running" bash -c "[ -n \"\$(squeue -h -j $job 2> /dev/null)\" ]"
    code=$(curl -s -o "$work/after" -w '%{http_code}' "$url/completions" -H 'Content-Type: application/json' \
      -d '{"prompt": "One, two,", "max_tokens": 4, "temperature": 0}')
    check "kill -9 of rank 2: a completion is still served (got $code)" [ "$code" = 200 ]
  fi
fi

scancel "$job"
check "scancel: the job leaves the queue" wait_gone "$job" 60
sleep 1
check "scancel: no braid process left" bash -c "! pgrep -f '[b]raid serve .*--port $port( |\$)' > /dev/null"
job=""

echo "$failures failure(s)"
[ "$failures" = 0 ]
