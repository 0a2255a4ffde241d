#!/usr/bin/env bash
# PBKV's run-time knobs and missing arms in the simulator (issue 35), on the issue's sweep traces
# (400 workflows, concurrency 72; seed 21 replayed, seed 2 for training the graph predictor):
#   arms     lru / kvflow / pbkv-lae (lifecycle only) / pbkv / belady per device budget;
#   k        PBKV's lookahead K = 1..K_MAX (braid sim --pbkv-k) with graph predictors trained for
#            K_MAX steps and for 4 (the default predictor's head), and with the online Markov-1;
#   gamma    the discount (braid sim --pbkv-gamma) at GAMMA_K;
#   prefetch pbkv with a host tier (HOST_FACTOR x the device) and --prefetch, the per-gap budget
#            (--prefetch-blocks) at PREFETCH_CAPS;
#   concurrency (Fig. 5a; not in the default PARTS) lru / pbkv-lae / pbkv / belady at CONC_KV tokens on
#            traces of the same 400 workflows (seed 21) run CONCURRENCIES at a time, predictor as above;
#   trainsize (App. C.1; not in the default PARTS) pbkv at TRAIN_KV tokens with graph predictors trained
#            on seed-2 traces of TRAIN_SIZES workflows (braid-bench gen --workflows N --seed 2);
#   aggressive (App. E; not in the default PARTS) pbkv + host tier: PBKV-HE (no prefetch), conservative
#            prefetch, and the aggressive variant at AGGR_RHOS (braid sim --prefetch-rho), at
#            AGGR_BUDGETS tokens, per-gap cap AGGR_CAP (0 = none), prediction noise AGGR_NOISE; against
#            device-only belady at the same tokens.
# Hit rates are exact replays (the cache code itself); the latency is the modeled one.
#   bench/pbkv_knobs_study.sh [OUT_DIR]
# Environment: PARTS (default "arms k gamma prefetch"), WORKLOADS (codegen factcheck), BUDGETS
# (tokens, "40000 80000 160000"), K_MAX (6), GAMMAS ("0.3 0.5 0.7 0.9 1"), GAMMA_K (3),
# PREFETCH_BUDGETS ("40000 80000"), PREFETCH_CAPS ("8 32 0"; 0 = no cap), HOST_FACTOR (4),
# CONCURRENCIES ("24 48 72"), CONC_KV (80000), TRAIN_SIZES ("10 25 50 100 200 400"), TRAIN_KV (80000),
# AGGR_BUDGETS ("80000 160000"), AGGR_RHOS ("0.05 0.1 0.2 0.4"), AGGR_CAP (0), AGGR_NOISE ("0"),
# BRAID / BRAID_BENCH (binaries, default build/braid, build/braid-bench), BRAID_MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-pbkv-knobs}
mkdir -p "$out"
braid=${BRAID:-build/braid} bench=${BRAID_BENCH:-build/braid-bench}
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck"} budgets=${BUDGETS:-"40000 80000 160000"}
kmax=${K_MAX:-6} gammas=${GAMMAS:-"0.3 0.5 0.7 0.9 1"} gamma_k=${GAMMA_K:-3} hf=${HOST_FACTOR:-4}
parts=${PARTS:-"arms k gamma prefetch"}
has_part() { [[ " $parts " == *" $1 "* ]]; }

echo "# bench/pbkv_knobs_study.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

for w in $workloads; do
  for seed in 21 2; do
    t=$out/$w.s$seed.jsonl
    [ -s "$t" ] || "$bench" gen --workload "$w" --workflows 400 --concurrency 72 --seed "$seed" --model "$model" --out "$t" 2> /dev/null
  done
  for k in 4 "$kmax"; do
    p=$out/$w.graph.k$k.bin
    [ -s "$p" ] || "$braid" train-predictor --traces "$out/$w.s2.jsonl" --out "$p" --kind graph --k "$k" \
      --eval "$out/$w.s21.jsonl" > /dev/null 2> "$p.log"
  done
done

# sim TRACE KV [args] -> the --json line's "hit_rate mean_workflow_latency_s"
sim() {
  local trace=$1 kv=$2; shift 2
  "$braid" sim --trace "$trace" --kv-tokens "$kv" --json "$@" 2> /dev/null | tail -1 |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print("%.1f%% (%.1f s)" % (100 * r["hit_rate"], r["mean_workflow_latency_s"]))'
}

if has_part arms; then
  echo
  echo "## Arms: hit rate (modeled mean workflow latency); kvflow and pbkv take the graph predictor (K = 4 head)"
  echo
  echo "| workload | tokens | lru | kvflow | pbkv-lae (lifecycle only) | pbkv | belady |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for w in $workloads; do
    t=$out/$w.s21.jsonl pred=$out/$w.graph.k4.bin
    for b in $budgets; do
      echo "| $w | $b | $(sim "$t" "$b" --policy lru) | $(sim "$t" "$b" --policy kvflow --predictor "$pred") |" \
        "$(sim "$t" "$b" --policy pbkv-lae) | $(sim "$t" "$b" --policy pbkv --predictor "$pred") | $(sim "$t" "$b" --policy belady) |"
    done
  done
fi

if has_part k; then
  echo
  echo "## K sweep (Fig. 5c): pbkv hit rate (modeled mean workflow latency) at --pbkv-k K, gamma 0.7"
  for w in $workloads; do
    t=$out/$w.s21.jsonl
    for pred in "graph.k$kmax" graph.k4 markov1; do
      echo
      echo "$w, predictor: $pred"
      echo
      hdr="| tokens |" sep="| ---: |"
      for k in $(seq 1 "$kmax"); do hdr="$hdr K = $k |" sep="$sep ---: |"; done
      echo "$hdr"
      echo "$sep"
      for b in $budgets; do
        row="| $b |"
        for k in $(seq 1 "$kmax"); do
          if [ "$pred" = graph.k4 ] && [ "$k" -gt 4 ]; then row="$row — |"; continue; fi
          args=(--policy pbkv --pbkv-k "$k")
          [ "$pred" = markov1 ] || args+=(--predictor "$out/$w.$pred.bin")
          row="$row $(sim "$t" "$b" "${args[@]}") |"
        done
        echo "$row"
      done
    done
  done
fi

if has_part gamma; then
  echo
  echo "## gamma sweep (App. D): pbkv hit rate (modeled mean workflow latency) at K = $gamma_k, graph predictor (K = 4 head)"
  echo
  hdr="| workload | tokens |" sep="| --- | ---: |"
  for g in $gammas; do hdr="$hdr gamma $g |" sep="$sep ---: |"; done
  echo "$hdr"
  echo "$sep"
  for w in $workloads; do
    t=$out/$w.s21.jsonl
    for b in $budgets; do
      row="| $w | $b |"
      for g in $gammas; do row="$row $(sim "$t" "$b" --policy pbkv --predictor "$out/$w.graph.k4.bin" --pbkv-k "$gamma_k" --pbkv-gamma "$g") |"; done
      echo "$row"
    done
  done
fi

if has_part prefetch; then
  echo
  echo "## Prefetch budget: pbkv + host tier ($hf x the device) + --prefetch, per-gap cap --prefetch-blocks (0 = none); graph predictor"
  echo
  echo "| workload | device tokens | cap | hit rate (device hits) | mean workflow latency | prefetched | used | wasted |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for w in $workloads; do
    t=$out/$w.s21.jsonl
    for d in ${PREFETCH_BUDGETS:-40000 80000}; do
      for cap in ${PREFETCH_CAPS:-8 32 0}; do
        args=(--policy pbkv --predictor "$out/$w.graph.k4.bin" --host-kv-tokens $((hf * d)) --prefetch)
        [ "$cap" = 0 ] || args+=(--prefetch-blocks "$cap")
        "$braid" sim --trace "$t" --kv-tokens "$d" --json "${args[@]}" 2> /dev/null | tail -1 | python3 -c '
import json, sys
r = json.load(sys.stdin); p = r["prompt_tokens"] or 1; pf = r["prefetched_blocks"]
print("| %s | %s | %s | %.1f%% (%.1f%%) | %.1f s | %d | %d (%.0f%%) | %d |" % (sys.argv[1], sys.argv[2], sys.argv[3], 100 * r["hit_rate"],
      100 * r["device_cached_tokens"] / p, r["mean_workflow_latency_s"], pf, r["prefetch_hit_blocks"],
      100.0 * r["prefetch_hit_blocks"] / pf if pf else 0, r["prefetch_wasted_blocks"]))' "$w" "$d" "$cap"
      done
    done
  done
fi

if has_part aggressive; then
  acap=${AGGR_CAP:-0}
  echo
  echo "## Aggressive vs conservative prefetch (App. E): pbkv + host tier ($hf x the device), graph predictor (K = 4 head), per-gap cap $acap (0 = none)"
  echo
  echo "| workload | tokens | λ | arm | hit rate (device + host) | device hits | device hits / belady | prefetched | used (share) | wasted | active blocks displaced | modeled latency |"
  echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for w in $workloads; do
    t=$out/$w.s21.jsonl
    for d in ${AGGR_BUDGETS:-80000 160000}; do
      bel=$("$braid" sim --trace "$t" --kv-tokens "$d" --policy belady --json 2> /dev/null | tail -1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["hit_rate"])')
      for lam in ${AGGR_NOISE:-0}; do
        for arm in he conservative ${AGGR_RHOS:-0.05 0.1 0.2 0.4}; do
          args=(--policy pbkv --predictor "$out/$w.graph.k4.bin" --host-kv-tokens $((hf * d)) --prediction-noise "$lam")
          case $arm in
            he) ;;
            conservative) args+=(--prefetch) ;;
            *) args+=(--prefetch --prefetch-rho "$arm") ;;
          esac
          [ "$arm" = he ] || [ "$acap" = 0 ] || args+=(--prefetch-blocks "$acap")
          "$braid" sim --trace "$t" --kv-tokens "$d" --json "${args[@]}" 2> /dev/null | tail -1 | python3 -c '
import json, sys
r = json.load(sys.stdin); p = r["prompt_tokens"] or 1; pf = r["prefetched_blocks"]; dev = r["device_cached_tokens"] / p
w, d, lam, arm, bel = sys.argv[1:6]
name = {"he": "PBKV-HE (no prefetch)", "conservative": "conservative"}.get(arm, "aggressive ρ = " + arm)
print("| %s | %s | %s | %s | %.2f%% | %.2f%% | %.0f%% | %d | %d (%.1f%%) | %d | %d | %.1f s |" % (w, d, lam, name, 100 * r["hit_rate"], 100 * dev,
      100 * dev / float(bel), pf, r["prefetch_hit_blocks"], 100.0 * r["prefetch_hit_blocks"] / pf if pf else 0,
      r["prefetch_wasted_blocks"], r.get("prefetch_displaced_blocks", 0), r["mean_workflow_latency_s"]))' "$w" "$d" "$lam" "$arm" "$bel"
        done
      done
    done
  done
fi

if has_part concurrency; then
  ckv=${CONC_KV:-80000}
  echo
  echo "## Concurrency (Fig. 5a): hit rate (modeled mean workflow latency) at $ckv tokens, 400 workflows (seed 21) C at a time"
  echo
  echo "| workload | concurrency | lru | pbkv-lae | pbkv | belady | pbkv / lru | pbkv / belady |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for w in $workloads; do
    for conc in ${CONCURRENCIES:-24 48 72}; do
      t=$out/$w.s21.jsonl
      if [ "$conc" != 72 ]; then
        t=$out/$w.c$conc.s21.jsonl
        [ -s "$t" ] || "$bench" gen --workload "$w" --workflows 400 --concurrency "$conc" --seed 21 --model "$model" --out "$t" 2> /dev/null
      fi
      rates=()
      for p in "lru" "pbkv-lae" "pbkv --predictor $out/$w.graph.k4.bin" "belady"; do
        # shellcheck disable=SC2086 # p is a policy and its arguments
        rates+=("$("$braid" sim --trace "$t" --kv-tokens "$ckv" --json --policy $p 2> /dev/null | tail -1 |
          python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["hit_rate"], r["mean_workflow_latency_s"])')")
      done
      python3 - "$w" "$conc" "${rates[@]}" <<'PY'
import sys
w, conc = sys.argv[1], sys.argv[2]
v = [tuple(map(float, x.split())) for x in sys.argv[3:]]
cell = lambda x: "%.1f%% (%.1f s)" % (100 * x[0], x[1])
print("| %s | %s | %s | %s | %s | %s | %.2fx | %.0f%% |" % (w, conc, cell(v[0]), cell(v[1]), cell(v[2]), cell(v[3]),
      v[2][0] / v[0][0] if v[0][0] else 0, 100 * v[2][0] / v[3][0] if v[3][0] else 0))
PY
    done
  done
fi

if has_part trainsize; then
  tkv=${TRAIN_KV:-80000}
  echo
  echo "## Training-set size (App. C.1): pbkv at $tkv tokens, graph predictor (K = 4 head) trained on a seed-2 trace of N workflows"
  echo
  hdr="| workload | lru |" sep="| --- | ---: |"
  for n in ${TRAIN_SIZES:-10 25 50 100 200 400}; do hdr="$hdr N = $n: step-1 acc., hit rate |" sep="$sep ---: |"; done
  echo "$hdr"
  echo "$sep"
  for w in $workloads; do
    row="| $w | $(sim "$out/$w.s21.jsonl" "$tkv" --policy lru) |"
    for n in ${TRAIN_SIZES:-10 25 50 100 200 400}; do
      tr=$out/$w.train$n.jsonl p=$out/$w.graph.n$n.bin
      [ "$n" = 400 ] && tr=$out/$w.s2.jsonl
      [ -s "$tr" ] || "$bench" gen --workload "$w" --workflows "$n" --concurrency 72 --seed 2 --model "$model" --out "$tr" 2> /dev/null
      [ -s "$p" ] || "$braid" train-predictor --traces "$tr" --out "$p" --kind graph --k 4 --eval "$out/$w.s21.jsonl" > /dev/null 2> "$p.log"
      acc=$(grep 'held-out accuracy' "$p.log" | sed 's/.*s=1 \([0-9.]*\).*/\1/')
      row="$row $acc, $(sim "$out/$w.s21.jsonl" "$tkv" --policy pbkv --predictor "$p") |"
    done
    echo "$row"
  done
fi
