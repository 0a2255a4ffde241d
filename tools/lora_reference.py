"""peft + transformers reference logits for LoRA adapters read back from their GGUF files.

    .venv-tools/bin/python tools/lora_reference.py --model M.gguf --adapters DIR --out GOLDEN_DIR
        [--roles planner,coder,tester,summarizer] [--threads 1] [--make-random STD] [--kv-fp16]

Writes GOLDEN_DIR/lora/lora_logits.jsonl in the layout of tests/golden/lora (what test_golden_lora
reads): the base model's records first, then each adapter's, on tools/train_lora.py's three golden
prompts. Unlike train_lora.py's own fixture, the adapters come from the files Braid loads (lora_a /
lora_b read with gguf-py, Q/K rows put back into transformers' order), so a wrong export — row order,
transposition, alpha — shows up as a mismatch. Greedy steps reuse transformers' KV cache (cheap on a
0.5B model). Point test_golden_lora at another model with

    BRAID_TEST_MODEL=M.gguf BRAID_TEST_ADAPTER_DIR=DIR BRAID_TEST_GOLDEN_DIR=GOLDEN_DIR build/tests/test_golden_lora

--kv-fp16 rounds every K and V (K after RoPE) to IEEE half before attention reads them, as Braid's KV
cache stores them (kernels/cpu/attention.h: fp16 cache, fp32 arithmetic), so the reference differs from
Braid by arithmetic order only and not by the cache's rounding. Without it (transformers' fp32 K/V) a
Qwen2.5 prompt position can differ by 0.285 in a logit (issue 36: the first "\n" after <|im_end|> of
SmolLM's chat text; 2e-3 with --kv-fp16): the LoRA check would be measuring the cache's precision.

--make-random STD first writes DIR/ROLE.gguf itself with train_lora.py's exporter: rank-16 adapters on
q/k/v/o (alpha 32) with peft's initial A and B drawn from N(0, STD), rounded to fp16 — no training, so
Braid's LoRA path on a base model (say qwen2) can be checked against peft in minutes, where training
would take an hour of CPU.

Nothing is fetched from a hub.
"""
import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
import peft  # noqa: E402

import train_lora  # noqa: E402  (same folder: chat format, prompts, base loading, row order)

KV_FP16_ATTENTION = "braid_kv_fp16"


def kv_fp16_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention over K and V rounded to IEEE half (round to nearest even, +-inf past
    65504), as Braid's cpu_kv_store writes them; the arithmetic stays in the model's dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key.half().to(key.dtype), value.half().to(value.dtype), attention_mask, **kwargs)


def use_kv_fp16(model):
    from transformers import AttentionInterface
    AttentionInterface.register(KV_FP16_ATTENTION, kv_fp16_attention)
    model.set_attn_implementation(KV_FP16_ATTENTION)


def inverse_row_order(w, n_head, arch):
    """GGUF Q/K row order -> transformers' (the inverse of train_lora.row_order)."""
    if arch != "llama":
        return w
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_adapter(path):
    reader = gguf.GGUFReader(path)
    alpha = float(reader.fields["adapter.lora.alpha"].parts[-1][0])
    tensors = {}
    for t in reader.tensors:
        # gguf-py gives numpy arrays in row-major (ne reversed) order: lora_a (rank, in), lora_b (out, rank)
        tensors[t.name] = np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
    return alpha, tensors


def attach(model, role, path, arch):
    alpha, tensors = read_adapter(path)
    rank = tensors["blk.0.attn_q.weight.lora_a"].shape[0]
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(train_lora.TARGETS), bias="none")
    lm = peft.get_peft_model(model, config, adapter_name=role)
    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    with torch.no_grad():
        for i, layer in enumerate(lm.base_model.model.model.layers):
            for proj_name, stem in train_lora.TARGETS.items():
                proj = getattr(layer.self_attn, proj_name)
                a = tensors[f"blk.{i}.{stem}.weight.lora_a"]
                b = tensors[f"blk.{i}.{stem}.weight.lora_b"]
                if stem in heads:
                    b = inverse_row_order(b, heads[stem], arch)
                proj.lora_A[role].weight.copy_(torch.from_numpy(np.ascontiguousarray(a)))
                proj.lora_B[role].weight.copy_(torch.from_numpy(np.ascontiguousarray(b)))
    lm.eval()
    return lm


@torch.no_grad()
def record(lm, tok, variant, name, user):
    ids = tok(train_lora.chat(tok, user)).input_ids
    out = lm(input_ids=torch.tensor([ids]), use_cache=True)
    logits = out.logits[0]
    top = torch.topk(logits, train_lora.TOP_K, dim=-1)
    last, past, greedy, margins = logits[-1], out.past_key_values, [], []
    for _ in range(train_lora.GREEDY):
        two = torch.topk(last, 2)
        greedy.append(int(two.indices[0]))
        margins.append(float(two.values[0] - two.values[1]))
        out = lm(input_ids=torch.tensor([[greedy[-1]]]), past_key_values=past, use_cache=True)
        last, past = out.logits[0, -1], out.past_key_values
    return {"adapter": variant, "name": name, "ids": ids, "top_ids": top.indices.tolist(),
            "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()], "greedy": greedy,
            "greedy_margins": [round(m, 5) for m in margins], "greedy_text": tok.decode(greedy)}


def write_random_adapters(model, roles, folder, arch, std):
    """Random (untrained) adapters through train_lora's exporter; returns the base model again."""
    os.makedirs(folder, exist_ok=True)
    for k, role in enumerate(roles):
        config = peft.LoraConfig(r=train_lora.RANK, lora_alpha=train_lora.ALPHA, lora_dropout=0.0,
                                 target_modules=list(train_lora.TARGETS), bias="none")
        torch.manual_seed(2000 + k)
        lm = peft.get_peft_model(model, config, adapter_name=role)
        with torch.no_grad():
            for name, p in lm.named_parameters():
                if f"lora_B.{role}" in name:
                    p.normal_(0.0, std)
        train_lora.round_to_fp16(lm)
        path = os.path.join(folder, role + ".gguf")
        train_lora.export(lm, role, model, path, arch)
        print(f"wrote random adapter {path} ({os.path.getsize(path)} bytes)", flush=True)
        model = lm.unload()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapters", required=True, help="folder holding ROLE.gguf")
    ap.add_argument("--out", required=True, help="golden folder; writes OUT/lora/lora_logits.jsonl")
    ap.add_argument("--roles", default="planner,coder,tester,summarizer")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--make-random", type=float, default=0.0, metavar="STD",
                    help="first write random adapters (lora_B ~ N(0, STD)) into --adapters")
    ap.add_argument("--kv-fp16", action="store_true", help="round K and V to IEEE half as Braid's KV cache does")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    arch = train_lora.gguf_arch(args.model)
    tok, model = train_lora.load_base(args.model, arch)
    if args.kv_fp16:
        use_kv_fp16(model)
    if args.make_random > 0:
        model = write_random_adapters(model, args.roles.split(","), args.adapters, arch, args.make_random)
    records = [record(model, tok, "", n, u) for n, u in train_lora.GOLDEN_PROMPTS]
    for role in args.roles.split(","):
        lm = attach(model, role, os.path.join(args.adapters, role + ".gguf"), arch)
        records += [record(lm, tok, role, n, u) for n, u in train_lora.GOLDEN_PROMPTS]
        print(f"{role}: {[r['greedy_text'] for r in records[-3:]]}", flush=True)
        model = lm.unload()
    os.makedirs(os.path.join(args.out, "lora"), exist_ok=True)
    with open(os.path.join(args.out, "lora", "lora_logits.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {args.out}/lora/lora_logits.jsonl ({len(records)} records)")


if __name__ == "__main__":
    main()
