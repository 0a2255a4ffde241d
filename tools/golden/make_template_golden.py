#!/usr/bin/env python3
"""Writes Braid's chat-template golden references with Hugging Face transformers' own renderer.

For every template in TEMPLATES and every conversation in tests/golden/templates/conversations.json,
with add_generation_prompt false and true, renders the prompt with
transformers.utils.chat_template_utils.render_jinja_template (what
tokenizer.apply_chat_template(..., tokenize=False) calls, with bos_token/eos_token passed the way
the tokenizer passes its special tokens) and writes one JSON line to
tests/golden/templates/expected.jsonl:

  {"template", "case", "add_generation_prompt", "bos_token", "eos_token", "output"}       rendered
  {"template", "case", "add_generation_prompt", "bos_token", "eos_token", "error", "raised"}  failed
                                         (raised: the template called raise_exception(error))

A template taken from a GGUF (its tokenizer.chat_template, BOS/EOS token text from
tokenizer.ggml.tokens) is also written next to the others as NAME.jinja, so the C test needs only the
directory. To add a model's template, add one line to TEMPLATES, e.g.
    ("qwen2_5", "gguf:models/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", None, None),
and rerun:  .venv-tools/bin/pip install transformers jinja2 && .venv-tools/bin/python tools/golden/make_template_golden.py
No torch and no network are needed. The outputs are committed; CI never runs this.
"""
import json
import os
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jinja2  # noqa: E402
import transformers  # noqa: E402
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "tests", "golden", "templates")

# (name, source, bos_token, eos_token): source is "file:NAME.jinja" (in OUT_DIR) or "gguf:PATH"
# (relative to the repository); None for bos/eos takes them from the GGUF.
TEMPLATES = [
    ("smollm2", "gguf:models/SmolLM2-135M-Instruct.Q4_1.gguf", None, None),
    ("hermes_tools", "file:hermes_tools.jinja", "", "<|im_end|>"),
    ("llama31_tools", "file:llama31_tools.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("mistral_tools", "file:mistral_tools.jinja", "<s>", "</s>"),
    ("qwen3_reasoning", "file:qwen3_reasoning.jinja", "", "<|im_end|>"),
    ("qwen2_5_coder", "gguf:models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", None, None),  # scripts/fetch-model.sh qwen
    ("constructs", "file:constructs.jinja", "<s>", "</s>"),
    ("whitespace", "file:whitespace.jinja", "<s>", "</s>"),
]

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path):
    """The key/value section of a GGUF file (v2/v3), enough to find the chat template and tokens."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        (version,) = struct.unpack("<I", f.read(4))
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        _n_tensors, n_kv = struct.unpack("<QQ", f.read(16))

        def read_str():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", errors="surrogateescape")

        def read_value(t):
            if t in GGUF_SCALARS:
                fmt = GGUF_SCALARS[t]
                return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
            if t == 8:
                return read_str()
            if t == 9:
                item_type, n = struct.unpack("<IQ", f.read(12))
                return [read_value(item_type) for _ in range(n)]
            raise ValueError(f"{path}: unknown GGUF value type {t}")

        meta = {}
        for _ in range(n_kv):
            key = read_str()
            (t,) = struct.unpack("<I", f.read(4))
            meta[key] = read_value(t)
        return meta


def load_template(name, source, bos, eos):
    kind, _, where = source.partition(":")
    if kind == "file":
        with open(os.path.join(OUT_DIR, where), encoding="utf-8") as f:
            return f.read(), bos, eos
    tokens_file = os.path.join(OUT_DIR, f"{name}.tokens.json")
    if not os.path.exists(os.path.join(ROOT, where)) and os.path.exists(tokens_file):
        # The model is optional: without it, reuse the template and token text extracted before.
        print(f"{where} not found: using the committed {name}.jinja", file=sys.stderr)
        with open(os.path.join(OUT_DIR, f"{name}.jinja"), encoding="utf-8", newline="") as f:
            text = f.read()
        with open(tokens_file, encoding="utf-8") as f:
            tok = json.load(f)
        return text, tok["bos_token"], tok["eos_token"]
    meta = read_gguf_metadata(os.path.join(ROOT, where))
    text = meta["tokenizer.chat_template"]
    tokens = meta.get("tokenizer.ggml.tokens", [])
    if bos is None:
        bos_id = meta.get("tokenizer.ggml.bos_token_id")
        bos = tokens[bos_id] if bos_id is not None and bos_id < len(tokens) else ""
    if eos is None:
        eos_id = meta.get("tokenizer.ggml.eos_token_id")
        eos = tokens[eos_id] if eos_id is not None and eos_id < len(tokens) else ""
    with open(os.path.join(OUT_DIR, f"{name}.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    with open(tokens_file, "w", encoding="utf-8") as f:
        json.dump({"source": where, "bos_token": bos, "eos_token": eos}, f, ensure_ascii=False)
        f.write("\n")
    return text, bos, eos


def main():
    with open(os.path.join(OUT_DIR, "conversations.json"), encoding="utf-8") as f:
        conversations = json.load(f)
    lines = []
    for name, source, bos, eos in TEMPLATES:
        text, bos, eos = load_template(name, source, bos, eos)
        for conv in conversations:
            for agp in (False, True):
                row = {"template": name, "case": conv["name"], "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=text,
                        add_generation_prompt=agp, bos_token=bos, eos_token=eos, **conv.get("extra", {}))
                    row["output"] = rendered[0]
                except Exception as e:  # noqa: BLE001 -- every failure is recorded, raised ones by message
                    row["error"] = str(e)
                    row["raised"] = type(e) is jinja2.exceptions.TemplateError
                lines.append(row)
    with open(os.path.join(OUT_DIR, "expected.jsonl"), "w", encoding="utf-8") as f:
        for row in lines:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    meta = {"transformers": transformers.__version__, "jinja2": jinja2.__version__, "python": sys.version.split()[0],
            "renderer": "transformers.utils.chat_template_utils.render_jinja_template",
            "templates": [t[0] for t in TEMPLATES], "cases": len(lines)}
    with open(os.path.join(OUT_DIR, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    errors = sum(1 for r in lines if "error" in r)
    print(f"wrote {len(lines)} cases ({errors} errors) to {os.path.relpath(OUT_DIR, ROOT)}/expected.jsonl")


if __name__ == "__main__":
    main()
