#!/usr/bin/env python3
"""Top-1 agreement with HF transformers on the golden prompts (tests/golden/logits.jsonl).

For every golden prompt the sequence is the prompt followed by the reference's greedy
continuation (teacher-forced). An engine command reads `n_prompt n_total ids…` lines on stdin
and prints, per line, the argmax at every position: the prompt in one prefill, then one decode
step per continuation token (bench/bench_argmax is Braid's; any engine with the same I/O fits).
A position agrees when the engine's argmax is the reference's top-1 there. Positions are also
split by the reference's top-2 margin, since near-ties flip under any change of rounding.

    bench/golden_agreement.py [--golden tests/golden/logits.jsonl] [--tie 0.05] \
        NAME=COMMAND [NAME=COMMAND ...]
e.g. bench/golden_agreement.py "braid fp32=build/bench_argmax --cpu-matmul fp32" \
                               "braid int8=build/bench_argmax --cpu-matmul int8"
Prints a markdown table.
"""
import argparse
import json
import shlex
import subprocess
import sys


def load_reference(path):
    """(sequences, expected top-1 per position, margin per position), one entry per prompt."""
    cases = []
    for line in open(path):
        p = json.loads(line)
        ids, greedy = p["ids"], p["greedy"]
        tokens = ids + greedy[:-1]
        # position i predicts token i+1: the prompt's top-1 up to the last prompt position, whose
        # top-1 is the first greedy token, then one greedy token per decode step
        expected = [top[0] for top in p["top_ids"][:-1]] + greedy
        margins = [v[0] - v[1] for v in p["top_logits"][:-1]] + p["greedy_margins"]
        cases.append((p["name"], len(ids), tokens, expected, margins))
    return cases


def run_engine(command, cases):
    lines = "".join(f"{n_prompt} {len(tokens)} {' '.join(map(str, tokens))}\n" for _, n_prompt, tokens, _, _ in cases)
    out = subprocess.run(shlex.split(command), input=lines, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"golden_agreement: `{command}` failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    rows = [list(map(int, l.split())) for l in out.stdout.splitlines() if l.strip()]
    if len(rows) != len(cases) or any(len(r) != len(c[2]) for r, c in zip(rows, cases)):
        sys.exit(f"golden_agreement: `{command}` printed {len(rows)} lines of the wrong shape")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", default="tests/golden/logits.jsonl")
    ap.add_argument("--tie", type=float, default=0.05, help="top-2 margin under which a position counts as a near-tie")
    ap.add_argument("engines", nargs="+", help="NAME=COMMAND")
    args = ap.parse_args()
    cases = load_reference(args.golden)
    n_all = sum(len(c[3]) for c in cases)
    n_clear = sum(m >= args.tie for c in cases for m in c[4])
    print(f"| engine | top-1 agreement, all {n_all} positions | clear (margin ≥ {args.tie}), {n_clear} | "
          f"near-ties, {n_all - n_clear} | greedy steps, {sum(len(c[3]) - c[1] + 1 for c in cases)} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for spec in args.engines:
        name, _, command = spec.partition("=")
        rows = run_engine(command, cases)
        agree = clear = clear_agree = decode = decode_agree = 0
        for row, (_, n_prompt, _, expected, margins) in zip(rows, cases):
            for pos, (got, want, margin) in enumerate(zip(row, expected, margins)):
                ok = got == want
                agree += ok
                if margin >= args.tie:
                    clear += 1
                    clear_agree += ok
                if pos >= n_prompt - 1:
                    decode += 1
                    decode_agree += ok
        print(f"| {name} | {agree}/{n_all} ({100 * agree / n_all:.2f}%) | {clear_agree}/{clear} | "
              f"{agree - clear_agree}/{n_all - clear} | {decode_agree}/{decode} |")


if __name__ == "__main__":
    main()
