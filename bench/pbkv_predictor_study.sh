#!/usr/bin/env bash
# Next-agent accuracy of PBKV's predictors on the workload generators: Markov-1, Markov-2 and the
# graph predictor (GraphSAGE + attention + K-step head, trained in C by braid train-predictor),
# trained on one seed's traces and scored on another's, at steps K = 1..4.
#   Part 1 (full-size traces, agent order only): WORKFLOWS (400) at concurrency 72.
#   Part 2 (the prefill's hidden state): small traces (--scale $SCALE, $HID_TRAIN + $HID_EVAL
#   workflows) run through the real model by `braid batch --hidden-out` (max_tokens 1: only the
#   prefill matters), then the graph predictor with and without the hidden states.
#   Part 3 (App. E, clean vs noisy): part 1's three predictors on the same workloads generated with
#   and without their noise (braid-bench gen --noise on|off: wrong difficulty labels, flaky tests,
#   double-checks, give-ups), each trained and scored on traces of the same kind.
#   bench/pbkv_predictor_study.sh [OUT_DIR]
# Environment: WORKLOADS ("codegen factcheck"), WORKFLOWS (400), SCALE (0.25), HID_TRAIN (60),
# HID_EVAL (40), PART (all | 1 | 2 | 3).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-predictor-study}
mkdir -p "$out"
workloads=${WORKLOADS:-"codegen factcheck"}
wf=${WORKFLOWS:-400} scale=${SCALE:-0.25} htrain=${HID_TRAIN:-60} heval=${HID_EVAL:-40} part=${PART:-all}

echo "# bench/pbkv_predictor_study.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

acc() {  # acc LOG -> the held-out accuracies s=1..4
  grep 'held-out accuracy' "$1" | sed -E 's/.*s=1 ([0-9.]+).*s=2 ([0-9.]+).*s=3 ([0-9.]+).*s=4 ([0-9.]+).*/\1 \/ \2 \/ \3 \/ \4/'
}

trace() {  # trace WORKLOAD SEED NOISE -> the path of its full-size trace, generated once
  local t=$out/$1.s$2.jsonl
  [ "$3" = off ] && t=$out/$1.clean.s$2.jsonl
  [ -s "$t" ] || build/braid-bench gen --workload "$1" --workflows "$wf" --concurrency 72 --seed "$2" --noise "$3" --out "$t" 2> /dev/null
  echo "$t"
}

accuracy_cells() {  # accuracy_cells WORKLOAD NOISE NAME -> " | m1 | m2 | graph": trained on seed 2, scored on seed 1
  local train eval cells=""
  train=$(trace "$1" 2 "$2") eval=$(trace "$1" 1 "$2")
  for kind in markov1 markov2 graph; do
    build/braid train-predictor --traces "$train" --eval "$eval" --kind $kind --out "$out/$3.$kind.bin" > /dev/null 2> "$out/$3.$kind.log"
    cells="$cells | $(acc "$out/$3.$kind.log")"
  done
  echo "$cells"
}

if [ "$part" = all ] || [ "$part" = 1 ]; then
  echo
  echo "## Held-out top-1 accuracy at K = 1 / 2 / 3 / 4 ($wf workflows, concurrency 72; train seed 2, eval seed 1)"
  echo
  echo "| workload | Markov-1 | Markov-2 | graph (agent order) |"
  echo "|---|---|---|---|"
  for w in $workloads; do
    echo "| $w$(accuracy_cells "$w" on "$w") |"
  done
fi

if [ "$part" = all ] || [ "$part" = 3 ]; then
  echo
  echo "## Clean vs noisy workloads (App. E): held-out top-1 at K = 1 / 2 / 3 / 4 ($wf workflows, train seed 2, eval seed 1)"
  echo
  echo "| workload | noise | Markov-1 | Markov-2 | graph (agent order) |"
  echo "|---|---|---|---|---|"
  for w in $workloads; do
    for noise in off on; do
      name=$w.noise-$noise
      [ "$noise" = on ] && name=$w
      echo "| $w | $noise$(accuracy_cells "$w" "$noise" "$name") |"
    done
  done
fi

if [ "$part" = all ] || [ "$part" = 2 ]; then
  echo
  echo "## With the prefill's hidden state (--scale $scale; $htrain training workflows seed 2, $heval held out seed 1)"
  echo
  echo "| workload | Markov-2 | graph (agent order) | graph + hidden state |"
  echo "|---|---|---|---|"
  for w in $workloads; do
    for pair in "2 $htrain" "1 $heval"; do
      set -- $pair
      base=$out/$w.h$1
      [ -s "$base.jsonl" ] || build/braid-bench gen --workload "$w" --workflows "$2" --concurrency 8 --seed "$1" --scale "$scale" \
        --out "$base.jsonl" --batch-out "$base.batch.jsonl" 2> /dev/null
      if [ ! -s "$base.hidden.jsonl" ]; then
        start=$(date +%s)
        build/braid batch --input "$base.batch.jsonl" --output "$base.out.jsonl" --hidden-out "$base.hidden.jsonl" \
          --kv-blocks 8192 --max-running 8 --host-kv-blocks 0 2> "$base.batch.log"
        echo "  ($w seed $1: $(wc -l < "$base.hidden.jsonl") prefills in $(( $(date +%s) - start )) s)" >&2
      fi
    done
    tr=$out/$w.h2 ev=$out/$w.h1
    build/braid train-predictor --traces "$tr.jsonl" --eval "$ev.jsonl" --kind markov2 --out "$out/$w.h.markov2.bin" \
      > /dev/null 2> "$out/$w.h.markov2.log"
    build/braid train-predictor --traces "$tr.jsonl" --eval "$ev.jsonl" --kind graph --out "$out/$w.h.graph.bin" \
      > /dev/null 2> "$out/$w.h.graph.log"
    build/braid train-predictor --traces "$tr.jsonl" --hidden "$tr.hidden.jsonl" --eval "$ev.jsonl" --eval-hidden "$ev.hidden.jsonl" \
      --kind graph --out "$out/$w.h.graph-hidden.bin" > /dev/null 2> "$out/$w.h.graph-hidden.log"
    echo "| $w | $(acc "$out/$w.h.markov2.log") | $(acc "$out/$w.h.graph.log") | $(acc "$out/$w.h.graph-hidden.log") |"
  done
fi
