"""Copies LoRA adapter GGUFs with one deliberate change: a defect for the negative half of a golden check, or B = 0.

    .venv-tools/bin/python tools/lora_corrupt.py --in DIR --out DIR [--roles planner,coder,tester,summarizer]
        (--alpha-scale F | --drop-targets attn_v,attn_output | --b-scale F)

--alpha-scale F writes adapter.lora.alpha times F (a wrong LoRA scale); --drop-targets leaves out the
named modules' lora_a / lora_b (a LoRA applied to fewer target modules); --b-scale 0 zeroes every lora_b
(an adapter that computes exactly the base model, in the adapter's shape: bench_forkkv_accuracy uses it
as the adapter that prefilled a shared context, issue 36). Everything else (arch, type,
name, the other tensors, fp16) is copied unchanged. tests/golden/test_golden_lora_qwen.sh loads these
into Braid against peft's reference logits for the intact adapters and requires the check to FAIL:
proof that its tolerance catches a wrong scale or a missing target, not only that the good case passes.
"""
import argparse
import os

import numpy as np
import gguf


def field_string(reader, key):
    f = reader.fields[key]
    return bytes(f.parts[f.data[0]]).decode()


def corrupt(src, dst, alpha_scale, drop, b_scale=1.0):
    reader = gguf.GGUFReader(src)
    arch = field_string(reader, "general.architecture")
    alpha = float(reader.fields["adapter.lora.alpha"].parts[-1][0])
    writer = gguf.GGUFWriter(dst, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string("adapter.type", field_string(reader, "adapter.type"))
    writer.add_float32("adapter.lora.alpha", alpha * alpha_scale)
    if "general.name" in reader.fields:
        writer.add_string("general.name", field_string(reader, "general.name") + "-corrupt")
    kept = 0
    for t in reader.tensors:
        stem = t.name.split(".")[2]  # blk.N.<stem>.weight.lora_x
        if stem in drop:
            continue
        # gguf-py's data is row-major with ne reversed: (rank, in) for lora_a, (out, rank) for lora_b
        data = np.array(t.data).reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith(".lora_b") and b_scale != 1.0:
            data = (data.astype(np.float32) * b_scale).astype(data.dtype)
        writer.add_tensor(t.name, np.ascontiguousarray(data))
        kept += 1
    if kept == 0:
        raise SystemExit(f"lora_corrupt: --drop-targets {sorted(drop)} leaves no tensor in {src}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return kept


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="src", required=True, help="folder holding ROLE.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--roles", default="planner,coder,tester,summarizer")
    ap.add_argument("--alpha-scale", type=float, default=1.0)
    ap.add_argument("--b-scale", type=float, default=1.0, help="multiplies every lora_b (0: the base model)")
    ap.add_argument("--drop-targets", default="", help="comma-separated: attn_q, attn_k, attn_v, attn_output")
    args = ap.parse_args()
    drop = {s for s in args.drop_targets.split(",") if s}
    unknown = drop - {"attn_q", "attn_k", "attn_v", "attn_output"}
    if unknown:
        raise SystemExit(f"lora_corrupt: unknown target(s) {sorted(unknown)}")
    if args.alpha_scale == 1.0 and args.b_scale == 1.0 and not drop:
        raise SystemExit("lora_corrupt: nothing to change (give --alpha-scale, --b-scale or --drop-targets)")
    os.makedirs(args.out, exist_ok=True)
    for role in args.roles.split(","):
        dst = os.path.join(args.out, role + ".gguf")
        kept = corrupt(os.path.join(args.src, role + ".gguf"), dst, args.alpha_scale, drop, args.b_scale)
        print(f"wrote {dst} ({kept} tensors, alpha x {args.alpha_scale}, B x {args.b_scale}, dropped {sorted(drop) or 'none'})",
              flush=True)


if __name__ == "__main__":
    main()
