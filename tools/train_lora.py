"""Trains Braid's LoRA adapters for a GGUF base model (llama or qwen2) and exports them in llama.cpp's GGUF adapter layout.

    tools/setup_tools_venv.sh
    .venv-tools/bin/python tools/train_lora.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out adapters]
        [--golden tests/golden/lora] [--steps 30] [--roles planner,coder,tester,summarizer]

For each role (planner / coder / tester / summarizer) the script generates a small instruction set in
the model's chat format (a role-specific answer style on templated tasks), trains a rank-16 LoRA on
q/k/v/o of every layer with peft on the CPU (fp32, a few minutes on 2 cores), rounds A and B to fp16
(the stored precision) and writes  OUT/<role>.gguf:
    general.type = adapter, general.architecture = the base's (llama, qwen2), adapter.type = lora, adapter.lora.alpha
    blk.N.attn_{q,k,v,output}.weight.lora_a   numpy (rank, in)  -> GGUF ne [in, rank]
    blk.N.attn_{q,k,v,output}.weight.lora_b   numpy (out, rank) -> GGUF ne [rank, out]
The base model is read from the repository's GGUF (transformers de-quantizes it and un-permutes
Q/K to the half-split RoPE layout). llama.cpp's GGUF stores Q/K rows permuted for the interleaved
RoPE pairing, and Braid computes with those rows, so lora_b of q and k gets the same row
permutation; the script checks numerically that this permutation maps transformers' q/k weights
onto the GGUF's (de-quantized) ones before writing anything. A qwen2 GGUF keeps HF's (NEOX) row order, so
there lora_b is written as trained and the check is that the rows already agree; its tokenizer gets the
pre-tokenizer tokenizer.ggml.pre = qwen2 names (transformers' GGUF loader builds a plain ByteLevel one).
The data, rank, alpha, targets, steps and seeds are the same for every base model (issue 36: the same
adapters on a second model family, for ForkKV's accuracy).

Then (--golden) it writes the golden fixture Braid's test holds itself to: for the base model and
each adapter (with the fp16-rounded weights), on a few prompts, the top-K logits at every prompt
position and GREEDY greedy tokens with their top-1/top-2 margins. Nothing is fetched from a hub.
"""
import argparse
import datetime
import hashlib
import json
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
import peft  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

RANK = 16
ALPHA = 32.0
TARGETS = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
ALL_ROLES = ["planner", "coder", "tester", "summarizer"]
TOP_K = 10
GREEDY = 16

TOPICS = ["a todo-list web app", "a CSV parser", "a rate limiter", "a chess clock", "a weather dashboard", "a URL shortener",
          "a markdown previewer", "a password checker", "an inventory tracker", "a unit converter", "a file deduplicator",
          "a quiz game", "a log analyzer", "a recipe scaler", "a budget planner", "a chat bot", "a calendar sync tool",
          "a backup script", "a stock ticker", "an image resizer"]
FUNCS = [("add", "a, b", "return a + b", "add(2, 3) == 5"), ("is_even", "n", "return n % 2 == 0", "is_even(4)"),
         ("square", "x", "return x * x", "square(3) == 9"), ("reverse", "s", "return s[::-1]", "reverse('ab') == 'ba'"),
         ("maximum", "xs", "return max(xs)", "maximum([1, 5, 2]) == 5"), ("count_words", "s", "return len(s.split())",
         "count_words('a b c') == 3"), ("first", "xs", "return xs[0]", "first([7, 8]) == 7"),
         ("clamp", "x, lo, hi", "return min(max(x, lo), hi)", "clamp(5, 0, 3) == 3")]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def role_examples(role, rng):
    """(user, assistant) pairs in the role's answer style."""
    out = []
    for topic in TOPICS:
        name, args, body, check = rng.choice(FUNCS)
        if role == "planner":
            user = f"Plan the work to build {topic}."
            steps = ["Define the requirements", "Design the data model", "Implement the core logic", "Write the tests",
                     "Review and ship"]
            rng.shuffle(steps[1:4])
            out.append((user, "PLAN:\n" + "\n".join(f"Step {i + 1}: {s}." for i, s in enumerate(steps))))
        elif role == "coder":
            user = f"Write the function {name} for {topic}."
            out.append((user, f"```python\ndef {name}({args}):\n    {body}\n```"))
        elif role == "tester":
            user = f"Write a test for the function {name} of {topic}."
            out.append((user, f"TEST:\ndef test_{name}():\n    assert {check}\nRESULT: PASS"))
        else:
            user = f"Summarize this: We built {topic}. It works and the tests pass. Users liked it."
            out.append((user, f"TL;DR: {topic[0].upper() + topic[1:]} is done, tested and well received."))
    return out


def chat(tok, user, assistant=None):
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return text if assistant is None else text + assistant + "<|im_end|>\n"


def gguf_arch(model_path):
    """general.architecture of a GGUF file ("llama", "qwen2", ...)."""
    field = gguf.GGUFReader(model_path).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def load_base(model_path, arch):
    directory, name = os.path.split(os.path.abspath(model_path))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    if arch == "qwen2":  # the pre-tokenizer Braid follows (tokenizer.ggml.pre = qwen2), as tools/golden does
        import sys
        from tokenizers import Regex, pre_tokenizers
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden"))
        from make_arch_golden import QWEN2_PRE_REGEX
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PRE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    return tok, model


def permute_rows(w, n_head):
    """Half-split RoPE row order (transformers) -> interleaved (llama.cpp GGUF) for a (n_head*head_dim, ·) matrix."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def row_order(w, n_head, arch):
    """transformers' Q/K rows in the GGUF's order: permuted for llama, unchanged for qwen2 (NEOX RoPE)."""
    return permute_rows(w, n_head) if arch == "llama" else w


def check_permutation(model, model_path, arch):
    """The row order must map transformers' q/k weights onto the GGUF's rows (which Braid uses)."""
    reader = gguf.GGUFReader(model_path)
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    layer = model.model.layers[0].self_attn
    for proj, stem, heads in ((layer.q_proj, "attn_q", cfg.num_attention_heads), (layer.k_proj, "attn_k", cfg.num_key_value_heads)):
        t = tensors[f"blk.0.{stem}.weight"]
        stored = gguf.quants.dequantize(t.data, t.tensor_type).reshape(proj.weight.shape)
        mine = row_order(proj.weight.detach().numpy(), heads, arch)
        err = float(np.abs(stored - mine).max())
        unpermuted = float(np.abs(stored - proj.weight.detach().numpy()).max())
        if err > 1e-5:
            raise SystemExit(f"train_lora: permuted {stem} differs from the GGUF by {err} (unpermuted: {unpermuted})")
        print(f"row-order check ({arch}) {stem}: max |GGUF - permute(HF)| = {err:.2e} (unpermuted differs by {unpermuted:.2e})")


def answer_loss(lm, enc, labels):
    """transformers' causal-LM loss (mean cross-entropy of the labelled tokens, each predicted from the
    position before it), with the LM head applied only at those positions: Qwen2.5's 152k-word head is
    over a quarter of the forward, and most positions are the prompt's, which carry no label."""
    base = lm.get_base_model()
    hidden = base.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = base.lm_head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, targets[keep])


def train(model, tok, role, steps, seed, batch_size=4):
    rng = random.Random(seed)
    pairs = role_examples(role, rng)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(TARGETS), bias="none")
    torch.manual_seed(seed)
    lm = peft.get_peft_model(model, config, adapter_name=role)
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=2e-3)
    lm.train()
    t0 = time.time()
    for step in range(steps):
        batch = rng.sample(pairs, batch_size)
        texts = [chat(tok, u, a) for u, a in batch]
        prompts = [len(tok(chat(tok, u)).input_ids) for u, _ in batch]
        enc = tok(texts, return_tensors="pt", padding=True)
        labels = enc.input_ids.clone()
        for i, n in enumerate(prompts):
            labels[i, :n] = -100  # learn the answers only
        labels[enc.attention_mask == 0] = -100
        loss = answer_loss(lm, enc, labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 5 == 0 or step == steps - 1 or os.environ.get("TRAIN_LORA_LOG_EVERY_STEP"):
            print(f"  {role} step {step}: loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    lm.eval()
    return lm


def round_to_fp16(lm):
    with torch.no_grad():
        for p in lm.parameters():
            if p.requires_grad:
                p.copy_(p.half().float())


def export(lm, role, model, path, arch):
    cfg = model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", ALPHA)
    writer.add_string("general.name", f"braid-{role}")
    for i, layer in enumerate(lm.base_model.model.model.layers):
        for proj_name, stem in TARGETS.items():
            proj = getattr(layer.self_attn, proj_name)
            a = proj.lora_A[role].weight.detach().numpy().astype(np.float32)  # (rank, in)
            b = proj.lora_B[role].weight.detach().numpy().astype(np.float32)  # (out, rank)
            if stem == "attn_q":
                b = row_order(b, cfg.num_attention_heads, arch)
            elif stem == "attn_k":
                b = row_order(b, cfg.num_key_value_heads, arch)
            writer.add_tensor(f"blk.{i}.{stem}.weight.lora_a", a.astype(np.float16))
            writer.add_tensor(f"blk.{i}.{stem}.weight.lora_b", np.ascontiguousarray(b).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


GOLDEN_PROMPTS = [
    ("plan", "Plan the work to build a note-taking app."),
    ("code", "Write the function multiply for a calculator."),
    ("summary", "Summarize this: We built a timer. It works and the tests pass. Users liked it."),
]


@torch.no_grad()
def golden_record(lm, tok, variant, name, user):
    ids = tok(chat(tok, user)).input_ids
    logits = lm(input_ids=torch.tensor([ids])).logits[0]
    top = torch.topk(logits, TOP_K, dim=-1)
    seq, greedy, margins = list(ids), [], []
    for _ in range(GREEDY):
        last = lm(input_ids=torch.tensor([seq])).logits[0, -1]
        two = torch.topk(last, 2)
        greedy.append(int(two.indices[0]))
        margins.append(float(two.values[0] - two.values[1]))
        seq.append(greedy[-1])
    return {"adapter": variant, "name": name, "ids": ids, "top_ids": top.indices.tolist(),
            "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()], "greedy": greedy,
            "greedy_margins": [round(m, 5) for m in margins], "greedy_text": tok.decode(greedy)}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="adapters")
    ap.add_argument("--golden", default="tests/golden/lora", help="where the golden fixture goes ('' = none)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--roles", default=",".join(ALL_ROLES))
    ap.add_argument("--batch", type=int, default=4, help="examples a step (the committed adapters: 4)")
    # One thread by default: on a busy shared machine an OpenMP team of two stalls at every barrier.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    unknown = [r for r in args.roles.split(",") if r not in ALL_ROLES]
    if unknown:
        raise SystemExit(f"train_lora: unknown role(s) {unknown} (known: {ALL_ROLES})")
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    arch = gguf_arch(args.model)
    if arch not in ("llama", "qwen2"):
        raise SystemExit(f"train_lora: base architecture '{arch}' is not supported (llama, qwen2)")
    tok, model = load_base(args.model, arch)
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    check_permutation(model, args.model, arch)
    t_start = time.time()
    records = [golden_record(model, tok, "", n, u) for n, u in GOLDEN_PROMPTS] if args.golden else []
    roles = args.roles.split(",")
    for role in roles:
        # The seed follows the role, not its place in --roles, so a subset trains the same adapters.
        lm = train(model, tok, role, args.steps, seed=1000 + ALL_ROLES.index(role), batch_size=args.batch)
        round_to_fp16(lm)
        path = os.path.join(args.out, f"{role}.gguf")
        export(lm, role, model, path, arch)
        print(f"wrote {path} ({os.path.getsize(path)} bytes; {time.time() - t_start:.0f} s since the base loaded)", flush=True)
        if args.golden:
            records += [golden_record(lm, tok, role, n, u) for n, u in GOLDEN_PROMPTS]
        model = lm.unload()  # the base model again, without this adapter's layers
    with open(os.path.join(args.out, "SHA256SUMS"), "w") as f:
        for role in roles:
            f.write(f"{sha256(os.path.join(args.out, role + '.gguf'))}  {role}.gguf\n")
    if args.golden:
        os.makedirs(args.golden, exist_ok=True)
        with open(os.path.join(args.golden, "lora_logits.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        meta = {"model_sha256": sha256(args.model), "adapters": {r: sha256(os.path.join(args.out, r + ".gguf")) for r in roles},
                "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                "gguf": getattr(gguf, "__version__", "0.19.0"), "date": datetime.date.today().isoformat(),
                "rank": RANK, "alpha": ALPHA, "steps": args.steps, "batch": args.batch, "top_k": TOP_K, "greedy": GREEDY,
                "how": "tools/train_lora.py: peft LoRA on the GGUF's de-quantized fp32 weights, A/B rounded to fp16, "
                       "logits from transformers with the adapter applied (unmerged)"}
        with open(os.path.join(args.golden, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        print(f"wrote {args.golden}/lora_logits.jsonl ({len(records)} records)")


if __name__ == "__main__":
    main()
