#!/usr/bin/env bash
# Integration test: each instance is a failure domain (issue 22, point 1). Real mpirun ranks, real HTTP.
#   tests/integration/test_instance_failure.sh BRAID_BINARY MODEL
# 1. 1 + 2x1 ranks under load (12 concurrent requests, half streamed, 160 tokens each): kill -9 of
#    instance 1's rank while it runs a stream that has sent text and a whole answer (chosen by
#    instance_failure_load.py, which watches --events; on a slow machine it tries up to three rounds).
#    Every request gets an HTTP answer (200, or a JSON 5xx; a stream ends with data: [DONE]); no
#    connection drops or hangs. Whole (non-streamed) answers running on instance 1 start over on
#    instance 0, so they are 200 with every token; its streams that had sent text end with an error event. /health says "degraded" and names the dead
#    instance, /metrics counts it (braid_instances_alive 1, braid_instance_up{instance="1"} 0,
#    braid_instance_failures_total 1), --events logs it; new requests succeed; SIGTERM still drains,
#    exits 0 (no rank waits in MPI_Finalize for the dead one) and leaves no process.
# 2. 1 + 2x2 ranks: kill -9 of instance 1's TP peer (rank 4). Its leader (rank 3), which would wait
#    for the dead peer forever, is gone too; instance 0 serves on; the exit is clean.
# 3. 1 + 2x1 ranks with --instance-timeout 5: SIGSTOP of instance 1's leader. It is declared dead
#    by its silence, killed, and instance 0 serves on.
# 4. 1 + 1x1 ranks: the only instance dies: /health 503 "failed", a new request a JSON 503. Then
#    kill -9 of the coordinator: braid-local stops the job and leaves no process.
# 5. --restart-instances 1 (refused with --tp 2): kill -9 of instance 1's rank: it comes back
#    (spawned leader; its re-warm: test_instance_rewarm.sh) within 60 s, /health "ready" with 2
#    alive, /metrics counts the restart, concurrent requests all succeed and some are computed by
#    the new leader; killed again past its limit it stays dead; SIGTERM still drains, exits 0, leaves no process.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"

health_field() {  # health_field PYTHON_EXPR_ON_h -> its value, from GET /health
  curl -s "$url/health" | python3 -c "import json, sys; h = json.load(sys.stdin); print($1)" 2> /dev/null
}
gone() { ! kill -0 "$1" 2> /dev/null; }
completes() {  # completes PROMPT [TAG]: a new request gets 200 with its completion (TAG: its own body file, for concurrent ones)
  local code body="$work/new${2:-}.body"
  code=$(curl -s --max-time 120 -o "$body" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$1\", \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}")
  [ "$code" = 200 ] && python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["usage"]["completion_tokens"] == 8' "$body"
}

# request I STREAM: one long request in the background; its status, curl's exit code and body land in $work/req.I.*
request() {
  local i=$1 stream=$2
  ( curl -s -N --max-time 300 -o "$work/req.$i.body" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"Story number $i: once upon a time, in a land far away,\", \"max_tokens\": 160, \"ignore_eos\": true, \"temperature\": 0, \"stream\": $stream}" \
      > "$work/req.$i.code"
    echo $? > "$work/req.$i.exit" ) &
  request_pids+=($!)
}
request_pids=()

# answered I STREAM: request I got a complete HTTP answer: 200 with a whole completion or a stream
# ending in [DONE] (its last event may be an error object), or a 5xx with a JSON error.
answered() {
  python3 - "$work/req.$1" "$2" << 'EOF'
import json, sys
base, stream = sys.argv[1], sys.argv[2] == "true"
code, curl_exit, body = open(base + ".code").read().strip(), open(base + ".exit").read().strip(), open(base + ".body").read()
assert curl_exit == "0", f"curl exit {curl_exit} (connection dropped or timed out)"
if code.startswith("5"):
    assert json.loads(body)["error"]["message"], body
    print("5xx")
    sys.exit(0)
assert code == "200", code
if not stream:
    assert json.loads(body)["usage"]["completion_tokens"] == 160, body[-300:]
    print("200")
    sys.exit(0)
events = [l[6:] for l in body.split("\n") if l.startswith("data: ")]
assert events and events[-1] == "[DONE]", body[-300:]
last = json.loads(events[-2])
if "error" in last:
    assert "instance 1 failed" in last["error"]["message"], last
    print("stream-error")
else:
    assert last["choices"][0]["finish_reason"] == "length", last
    print("200")
EOF
}

# ---------------------------------------------------------------- 1: 1 + 2x1 under load
# instance_failure_load.py sends 12 concurrent requests (half streamed, 160 tokens each) from one
# process and kills instance 1's rank while that instance runs both a stream that has sent text and
# a whole answer; its report says where each request ran and which were still running at the kill.
start_cluster two --instances 2 --events "$work/events.jsonl" || exit 1
check "two instances start without a 'failed to start' error" bash -c "! grep -q 'failed to start' '$work/two.err'"
check "/health before: ready, 2 alive" [ "$(health_field 'h["status"], h["instances_alive"]')" = "ready 2" ]
victim=$(rank_pid 2)
check "rank 2 (instance 1's leader) found" [ -n "$victim" ]
check "instance 1 was killed while running a stream with text and a whole answer" \
  python3 "$root/tests/integration/instance_failure_load.py" "$url" "$work/events.jsonl" "$victim" "$work/load.json"
degraded() { [ "$(health_field 'h["status"]')" = degraded ]; }
check "/health says degraded within 10 s" wait_for 10 degraded
# load_report KIND: a count from the load report. all: requests; answered: those with a whole HTTP
# answer (200 with 160 tokens, a stream ending in [DONE] after 160 tokens or an error event naming
# instance 1, or a JSON 5xx); restarted: whole answers running on instance 1 at the kill;
# restarted_ok: those of them that are 200 with 160 tokens; cut: streams of instance 1 that had sent
# text and were running at the kill; cut_with_error: those of them whose last event is the error.
load_report() {
  python3 - "$work/load.json" "$1" << 'EOF'
import json, sys
report, kind = json.load(open(sys.argv[1])), sys.argv[2]
def events(body): return [l[6:] for l in body.split("\n") if l.startswith("data: ")]
def has_text(body): return '"text":"' in body.replace('"text":""', "")
def last_event(r):
    e = events(r["body"])
    return json.loads(e[-2]) if len(e) >= 2 and e[-1] == "[DONE]" else None
def answered(r):
    if r["status"] is not None and 500 <= r["status"] < 600: return bool(json.loads(r["body"])["error"]["message"])
    if r["status"] != 200: return False
    if not r["stream"]: return json.loads(r["body"])["usage"]["completion_tokens"] == 160
    last = last_event(r)
    if last is None: return False
    if "error" in last: return "instance 1 failed" in last["error"]["message"]
    return last["choices"][0]["finish_reason"] == "length"
on_1 = [r for r in report if r["instance"] == 1 and r["running_at_kill"]]
restarted = [r for r in on_1 if not r["stream"]]
cut = [r for r in on_1 if r["stream"] and has_text(r["body"])]
counts = {"all": len(report), "answered": sum(map(answered, report)), "restarted": len(restarted),
          "restarted_ok": sum(r["status"] == 200 and answered(r) for r in restarted),
          "cut": len(cut), "cut_with_error": sum(bool(last_event(r)) and "error" in last_event(r) for r in cut)}
print(counts[kind])
EOF
}
if [ -f "$work/load.json" ]; then
  check "all $(load_report all) requests got a whole HTTP answer ($(load_report answered))" [ "$(load_report answered)" = "$(load_report all)" ]
  restarted=$(load_report restarted)
  rerouted=$(sed -n 's/.*instance 1: \([0-9]*\) requests\{0,1\} routed again.*/\1/p' "$work/two.err")
  check "whole answers running on the dead instance started over on the other ($(load_report restarted_ok) of $restarted 200 with every token; ${rerouted:-no} routed again)" \
    [ "$restarted" -ge 1 -a "$(load_report restarted_ok)" = "$restarted" -a "${rerouted:-0}" -ge "$restarted" ]
  check "streams of the dead instance that had sent text ended with an error event ($(load_report cut_with_error) of $(load_report cut))" \
    [ "$(load_report cut)" -ge 1 -a "$(load_report cut_with_error)" = "$(load_report cut)" ]
fi
check "the coordinator logged the death" grep -q "instance 1 died: rank 2 (pid $victim) exited" "$work/two.err"
check "--events has the instance_down line" grep -q '"event":"instance_down","instance":1,"reason":"rank 2 (pid' "$work/events.jsonl"
check "/health: 1 alive, instance 1 dead with its reason" \
  [ "$(health_field 'h["instances_alive"], h["instance_states"][0]["state"], h["instance_states"][1]["state"], "exited" in h["instance_states"][1]["reason"]')" = "1 up dead True" ]
check "/health answers 200 while degraded" [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]
check "/metrics: braid_instances_alive 1" [ "$(metric braid_instances_alive)" = 1 ]
check "/metrics: instance 0 up, instance 1 down" \
  [ "$(metric 'braid_instance_up{instance="0"}') $(metric 'braid_instance_up{instance="1"}')" = "1 0" ]
check "/metrics: braid_instance_failures_total 1" [ "$(metric braid_instance_failures_total)" = 1 ]
check "/metrics: the dead instance runs nothing" [ "$(metric 'braid_instance_running_sequences{instance="1"}')" = 0 ]
for p in "The capital of France is" "Water boils at" "def fibonacci(n):"; do
  check "a new request succeeds on the survivor: '$p'" completes "$p"
done
stop_cluster two

# ---------------------------------------------------------------- 2: 1 + 2x2, a TP peer dies
start_cluster tp --instances 2 --tp 2 || exit 1
leader=$(rank_pid 3)
peer=$(rank_pid 4)
check "ranks 3 and 4 (instance 1) found" [ -n "$leader" -a -n "$peer" ]
for i in 21 22 23 24; do request "$i" true; done
tp_busy() { [ "$(metric 'braid_instance_running_sequences{instance="1"}')" -gt 0 ] 2> /dev/null; }
check "instance 1 runs a request" wait_for 120 tp_busy
kill -KILL "$peer"
check "instance 1's leader, left alone with a dead TP peer, is gone within 10 s" wait_for 10 gone "$leader"
wait "${request_pids[@]}"
request_pids=()
for i in 21 22 23 24; do
  o=$(answered "$i" true 2>&1) || fail "request $i: $o"
done
check "/health: degraded, instance 1 dead" [ "$(health_field 'h["status"], h["instance_states"][1]["state"]')" = "degraded dead" ]
check "a new request succeeds on instance 0" completes "The largest planet is"
stop_cluster tp

# ---------------------------------------------------------------- 3: a hung (not dead) leader
# SIGSTOP: the process exists, so only its silence gives it away (--instance-timeout, the only sign
# from another host); then the coordinator kills it, as it would any leftover of a dead instance.
start_cluster hung --instances 2 --instance-timeout 5 || exit 1
hung_pid=$(rank_pid 2)
kill -STOP "$hung_pid"
check "/health says degraded within 15 s of the leader hanging" wait_for 15 degraded
check "the reason is its silence" [ "$(health_field '"no message" in h["instance_states"][1]["reason"]')" = True ]
check "the hung leader was killed" wait_for 10 gone "$hung_pid"
check "a new request succeeds on instance 0" completes "The three primary colors are"
stop_cluster hung

# ---------------------------------------------------------------- 4: no instance left; the coordinator dies
start_cluster one --instances 1 || exit 1
coordinator=$(rank_pid 0)
kill -KILL "$(rank_pid 1)"
failed() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 503 ]; }
check "/health answers 503 once the only instance died" wait_for 10 failed
check "/health says failed, 0 alive" [ "$(health_field 'h["status"], h["instances_alive"]')" = "failed 0" ]
code=$(curl -s --max-time 30 -o "$work/none.body" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 4}')
check "a new request gets a JSON 503 ($code)" bash -c "[ '$code' = 503 ] && python3 -c 'import json; assert json.load(open(\"$work/none.body\"))[\"error\"][\"message\"]'"
kill -KILL "$coordinator"
launcher_gone() { ! kill -0 "$launcher_pid" 2> /dev/null; }
check "with the coordinator killed, braid-local stops the job within 30 s" wait_for 30 launcher_gone
wait "$launcher_pid" 2> /dev/null; status=$?
launcher_pid=""
check "braid-local exits non-zero after losing its coordinator (got $status)" [ "$status" != 0 ]
sleep 0.5
check "one: no process left" cluster_gone

# ---------------------------------------------------------------- 5: --restart-instances
# A dead instance comes back: rank 0 spawns a new leader (MPI_Comm_spawn) that rejoins routing with
# an empty cache; /health is ready again and /metrics counts the restart. At most N restarts.
out=$("$braid" serve --tp 2 --restart-instances 1 --model "$model" 2>&1); status=$?
check "--restart-instances with --tp 2 is refused with status 2 and a reason ($status)" \
  bash -c "[ $status = 2 ] && grep -q 'needs --tp 1' <<< '$out'"
start_cluster restart --instances 2 --restart-instances 1 || exit 1
kill -KILL "$(rank_pid 2)"
check "/health says degraded once rank 2 died" wait_for 10 degraded
back() { [ "$(health_field 'h["status"], h["instances_alive"], h["instance_states"][1]["state"]')" = "ready 2 up" ]; }
check "instance 1 is back within 60 s: /health ready, 2 alive" wait_for 60 back
check "/metrics: braid_instance_restarts_total 1" [ "$(metric braid_instance_restarts_total)" = 1 ]
check "/metrics: braid_instance_up{instance=\"1\"} 1" [ "$(metric 'braid_instance_up{instance="1"}')" = 1 ]
check "/metrics: braid_instance_failures_total 1" [ "$(metric braid_instance_failures_total)" = 1 ]
restart_pids=()
for i in 1 2 3 4; do
  ( completes "Restart check $i:" ".$i" > /dev/null 2>&1 || touch "$work/restart.$i.failed" ) &
  restart_pids+=($!)
done
wait "${restart_pids[@]}"  # not a bare wait: the launcher is a child too
ok_all=1
for i in 1 2 3 4; do [ -e "$work/restart.$i.failed" ] && ok_all=0; done
check "4 concurrent requests after the restart: all 200" [ "$ok_all" = 1 ]
served_by_new() { [ "$(metric 'braid_instance_computed_prompt_tokens_total{instance="1"}')" -gt 0 ] 2> /dev/null; }
check "the restarted instance computed some of them (it had served nothing before)" wait_for 5 served_by_new
check "the new leader is a spawned process (--respawned-instance 1)" pgrep -f "$braid serve .*--port $port( .*)? --respawned-instance 1" > /dev/null
kill -KILL "$(pgrep -f "$braid serve .*--port $port( .*)? --respawned-instance 1")"
check "killed again past its 1 restart: instance 1 stays dead" wait_for 10 degraded
sleep 3
check "3 s later still degraded (no restart beyond the limit)" degraded
check "the log says it used its restarts" grep -q "instance 1: not restarted again: it used its 1 restarts" "$work/restart.err"
check "a new request succeeds on instance 0" completes "The speed of light is"
stop_cluster restart

echo "$failures failure(s)"
[ "$failures" = 0 ]
