#!/usr/bin/env python3
"""Golden references for the optional second real model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF,
arch qwen2; scripts/fetch-model.sh qwen), from HF transformers loading the same GGUF (fp32, CPU;
transformers de-quantizes Q4_K / Q6_K / Q5_0 / Q8_0 with gguf-py).

tests/golden/qwen/tokenize.jsonl  {"text", "ids"} for make_golden.py's corpus (special tokens parsed)
tests/golden/qwen/logits.jsonl    {"name", "text", "ids", "top_ids", "top_logits", "greedy",
                                  "greedy_margins"} as tests/golden/logits.jsonl
tests/golden/qwen/meta.json       versions, model hash, how

transformers' GGUF loader may build a plain ByteLevel pre-tokenizer; the reference installs the
one Qwen2's tokenizer.json configures (Split by the Qwen2 expression, isolated, then ByteLevel
without its own regex), so it follows tokenizer.ggml.pre = qwen2.

  .venv-tools/bin/python tools/golden/make_qwen_golden.py [MODEL.gguf]
"""
import datetime
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from make_arch_golden import QWEN2_PRE_REGEX  # noqa: E402
from make_golden import CORPUS  # noqa: E402

OUT = os.path.join(ROOT, "tests", "golden", "qwen")
TOP_K = 20
GREEDY_TOKENS = 20
SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
PROMPTS = [
    ("france_chat", SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
    ("code_chat", SYSTEM + "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"),
    ("code_raw", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"),
    ("prose", "The history of computing is a story of layered abstractions. Early machines were programmed by rewiring "
              "panels and flipping switches, and every program was tied to the physical structure of the hardware that ran "
              "it. The stored-program concept changed that: instructions became data, kept in the same memory as the numbers "
              "they manipulated, and a machine could load a new program as easily as it loaded a new table of values. "
              "Assemblers came next, replacing numeric opcodes with mnemonics, and then compilers, which"),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    model_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    folder, name = os.path.split(os.path.abspath(model_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "tokenize.jsonl"), "w", encoding="utf-8") as f:
        for text in CORPUS:
            f.write(json.dumps({"text": text, "ids": tok.encode(text, add_special_tokens=False)}, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, "logits.jsonl"), "w", encoding="utf-8") as f, torch.no_grad():
        for pname, text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=False)
            out = model(torch.tensor([ids]), use_cache=True)
            logits = out.logits[0].float()
            top = torch.topk(logits, TOP_K, dim=-1)
            # Greedy steps one token at a time on transformers' own KV cache (fp32).
            greedy, margins, last, past = [], [], logits[-1], out.past_key_values
            for _ in range(GREEDY_TOKENS):
                t2 = torch.topk(last, 2)
                greedy.append(int(t2.indices[0]))
                margins.append(float(t2.values[0] - t2.values[1]))
                out = model(torch.tensor([[greedy[-1]]]), past_key_values=past, use_cache=True)
                last, past = out.logits[0, -1].float(), out.past_key_values
            f.write(json.dumps({"name": pname, "text": text, "ids": ids, "top_ids": top.indices.tolist(),
                                "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()],
                                "greedy": greedy, "greedy_margins": margins,
                                "greedy_text": tok.decode(greedy)}, ensure_ascii=False) + "\n")
            print(f"{pname}: {len(ids)} tokens -> {tok.decode(greedy)!r}", flush=True)
    meta = {"generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model_file": name, "model_sha256": sha256(model_path), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0],
            "how": "tools/golden/make_qwen_golden.py: transformers AutoTokenizer/AutoModelForCausalLM.from_pretrained"
                   "(gguf_file=...), float32 on CPU, Qwen2 pre-tokenizer installed; ids = encode(text, "
                   "add_special_tokens=False); logits from one forward pass; greedy by argmax, one token at a time on "
                   "transformers' fp32 KV cache"}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
