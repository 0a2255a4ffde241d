#!/usr/bin/env python3
"""Writes tiny synthetic qwen2 / qwen3 models and their HF transformers reference logits.

For each variant below: random weights (seeded) in a transformers Qwen2/Qwen3 model, the same
weights written as a GGUF in llama.cpp's tensor layout (no Q/K permutation: qwen2/qwen3 use NEOX
RoPE), and transformers' fp32 logits on a few token-id prompts. Quantized variants are quantized
first, and transformers runs on the de-quantized values, so both sides compute with the same
weights: Q8_0 / Q5_0 by gguf-py's quantizer, Q5_K by quantize_q5_k below (gguf-py only
de-quantizes K-quants), whose output is decoded back by gguf-py's own Q5_K de-quantizer.

tests/golden/arch/<variant>.gguf   the model (well under 1 MB each)
tests/golden/arch/<variant>.jsonl  per prompt: {"name", "ids", "top_ids", "top_logits", "greedy",
                                   "greedy_margins"} as tests/golden/logits.jsonl (top-20 logits
                                   at every prompt position, then greedy tokens with the top-1 /
                                   top-2 margin of each)
tests/golden/arch/meta.json        versions and how the files were made

Also tests/golden/arch/pretokenize_qwen2.jsonl: {"text", "words"} for the tokenizer corpus of
make_golden.py, words being HF tokenizers' split of each text by the Qwen2 pre-tokenizer regex
(as Qwen2's tokenizer.json configures it), before the byte-level mapping.

  .venv-tools/bin/python tools/golden/make_arch_golden.py   (tools/setup_tools_venv.sh builds it)
"""
import datetime
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import gguf  # noqa: E402
from gguf import quants  # noqa: E402
from tokenizers import Regex, pre_tokenizers  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden", "arch")
TOP_K = 20
GREEDY_TOKENS = 16
QT = gguf.GGMLQuantizationType

# The Qwen2 pre-tokenizer expression (tokenizer.json of Qwen2 / Qwen2.5 / Qwen3; llama.cpp's "qwen2").
QWEN2_PRE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                   r"\s*[\r\n]+|\s+(?!\S)|\s+")

# name, arch, hidden, ff, heads, kv heads, head_dim, layers, matrix type, embedding type, output type
# (None: tied to the embedding, as Qwen2.5-0.5B's)
VARIANTS = [
    ("qwen2-tiny-f32", "qwen2", 64, 160, 4, 2, 16, 2, QT.F32, QT.F32, None),
    # head_dim 64 != 64 / 4 (and one the CUDA kernels take)
    ("qwen3-tiny-f16", "qwen3", 64, 128, 4, 2, 64, 2, QT.F16, QT.F16, QT.F16),
    ("qwen3-tiny-q8_0", "qwen3", 64, 128, 4, 1, 64, 2, QT.Q8_0, QT.Q8_0, QT.Q8_0),  # the int8 kernels' type
    # K-quant superblocks need 256 columns; V and the head in Q8_0, the embedding in Q5_0, as Q4_K_M files mix them
    ("qwen2-tiny-q5_k", "qwen2", 256, 256, 4, 2, 64, 2, QT.Q5_K, QT.Q5_0, QT.Q8_0),
]

# A small byte-level BPE vocabulary: the 256 GPT-2 byte symbols, a few merges, three specials.
MERGES = ["Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġt he", "r e", "a t", "e n", "Ġ s", "o r"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_symbols():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocabulary():
    tokens = byte_symbols()
    for m in MERGES:
        tokens.append(m.replace(" ", ""))
    types = [1] * len(tokens) + [3] * len(SPECIALS)
    return tokens + SPECIALS, types


# ---- Q5_K quantization (layout: d, dmin fp16; 12 bytes of 6-bit scales / mins as Q4_K; qh[32]; qs[128]) ----
def quantize_q5_k(w):
    rows, cols = w.shape
    assert cols % 256 == 0
    out = bytearray()
    for x in w.reshape(-1, 256).astype(np.float32):
        sub = x.reshape(8, 32)
        lo = np.minimum(sub.min(axis=1), 0.0)
        hi = sub.max(axis=1)
        scale = np.maximum(hi - lo, 1e-8) / 31.0
        mins = -lo
        d = np.float16(scale.max() / 63.0)
        dmin = np.float16(mins.max() / 63.0 if mins.max() > 0 else 0.0)
        sc = np.clip(np.round(scale / np.float32(d)), 1, 63).astype(np.int32)
        mn = np.clip(np.round(mins / np.float32(dmin)), 0, 63).astype(np.int32) if dmin > 0 else np.zeros(8, np.int32)
        q = np.zeros(256, np.int32)
        for j in range(8):
            step = np.float32(d) * sc[j]
            q[32 * j:32 * j + 32] = np.clip(np.round((sub[j] + np.float32(dmin) * mn[j]) / step), 0, 31)
        scales = bytearray(12)
        for j in range(4):
            scales[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
            scales[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
            scales[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4)
        qh = bytearray(32)
        qs = bytearray(128)
        for c in range(4):
            for l in range(32):
                a, b = q[64 * c + l], q[64 * c + 32 + l]
                qs[32 * c + l] = (a & 0xF) | ((b & 0xF) << 4)
                qh[l] |= ((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1))
        out += np.array([d], np.float16).tobytes() + np.array([dmin], np.float16).tobytes() + bytes(scales) + bytes(qh) + bytes(qs)
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(rows, -1)


def store(w, qtype):
    """(bytes for the GGUF, dtype override or None, the values the reference computes with)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == QT.F32:
        return w, None, w
    if qtype == QT.F16:
        h = w.astype(np.float16)
        return h, None, h.astype(np.float32)
    raw = quantize_q5_k(w) if qtype == QT.Q5_K else quants.quantize(w, qtype)
    return raw, qtype, quants.dequantize(raw, qtype).reshape(w.shape).astype(np.float32)


def build_config(arch, hidden, ff, heads, kv, head_dim, layers, vocab, tied):
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=512, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=tied, hidden_act="silu", attention_dropout=0.0,
                  bos_token_id=vocab - 3, eos_token_id=vocab - 1)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, use_sliding_window=False)
    return transformers.Qwen3Config(**common, head_dim=head_dim, attention_bias=False, use_sliding_window=False)


def make_variant(name, arch, hidden, ff, heads, kv, head_dim, layers, mtype, etype, otype):
    rng = np.random.default_rng(sum(map(ord, name)))
    tokens, types = vocabulary()
    vocab = len(tokens)
    cfg = build_config(arch, hidden, ff, heads, kv, head_dim, layers, vocab, otype is None)
    model = (transformers.Qwen2ForCausalLM if arch == "qwen2" else transformers.Qwen3ForCausalLM)(cfg).eval()

    def mat(rows, cols, gain=1.0):
        return rng.standard_normal((rows, cols)).astype(np.float32) * gain / np.sqrt(cols)

    def vec(n, center, spread):
        return (center + spread * rng.standard_normal(n)).astype(np.float32)

    state, tensors = {}, []

    def put(hf_name, gguf_name, w, qtype=None):
        if qtype is None:  # vectors stay F32
            tensors.append((gguf_name, w.astype(np.float32), None))
            state[hf_name] = torch.from_numpy(w.astype(np.float32))
            return
        raw, dtype, used = store(w, qtype)
        tensors.append((gguf_name, raw, dtype))
        state[hf_name] = torch.from_numpy(used)

    put("model.embed_tokens.weight", "token_embd.weight", rng.standard_normal((vocab, hidden)).astype(np.float32), etype)
    q_dim, kv_dim = heads * head_dim, kv * head_dim
    for l in range(layers):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        put(p + "input_layernorm.weight", g + "attn_norm.weight", vec(hidden, 1.0, 0.2))
        put(p + "self_attn.q_proj.weight", g + "attn_q.weight", mat(q_dim, hidden, 2.0), mtype)
        put(p + "self_attn.k_proj.weight", g + "attn_k.weight", mat(kv_dim, hidden, 2.0), mtype)
        put(p + "self_attn.v_proj.weight", g + "attn_v.weight", mat(kv_dim, hidden), mtype if mtype != QT.Q5_K else QT.Q8_0)
        if arch == "qwen2":
            put(p + "self_attn.q_proj.bias", g + "attn_q.bias", vec(q_dim, 0.0, 0.5))
            put(p + "self_attn.k_proj.bias", g + "attn_k.bias", vec(kv_dim, 0.0, 0.5))
            put(p + "self_attn.v_proj.bias", g + "attn_v.bias", vec(kv_dim, 0.0, 0.5))
        else:
            put(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", vec(head_dim, 1.0, 0.3))
            put(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", vec(head_dim, 1.0, 0.3))
        put(p + "self_attn.o_proj.weight", g + "attn_output.weight", mat(hidden, q_dim, 3.0), mtype)
        put(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", vec(hidden, 1.0, 0.2))
        put(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", mat(ff, hidden, 1.5), mtype)
        put(p + "mlp.up_proj.weight", g + "ffn_up.weight", mat(ff, hidden), mtype)
        put(p + "mlp.down_proj.weight", g + "ffn_down.weight", mat(hidden, ff, 3.0), mtype)
    put("model.norm.weight", "output_norm.weight", vec(hidden, 1.0, 0.2))
    if otype is None:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    else:
        put("lm_head.weight", "output.weight", mat(vocab, hidden, 4.0), otype)
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not unexpected and not missing, (missing, unexpected)

    path = os.path.join(OUT, name + ".gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)
    w.add_add_bos_token(False)
    for gname, data, dtype in tensors:
        if dtype is None:
            w.add_tensor(gname, data)
        else:
            w.add_tensor(gname, data, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    prompt_rng = np.random.default_rng(7)
    prompts = [("short", 6), ("medium", 37), ("long", 150)]
    lines = []
    with torch.no_grad():
        for pname, n in prompts:
            ids = [int(t) for t in prompt_rng.integers(0, vocab - 3, n)]
            logits = model(torch.tensor([ids])).logits[0].float()
            top = torch.topk(logits, TOP_K, dim=-1)
            seq, greedy, margins = list(ids), [], []
            for _ in range(GREEDY_TOKENS):
                last = model(torch.tensor([seq])).logits[0, -1].float()
                t2 = torch.topk(last, 2)
                greedy.append(int(t2.indices[0]))
                margins.append(float(t2.values[0] - t2.values[1]))
                seq.append(greedy[-1])
            lines.append({"name": pname, "ids": ids, "top_ids": top.indices.tolist(), "top_logits": top.values.tolist(),
                          "greedy": greedy, "greedy_margins": margins})
    with open(os.path.join(OUT, name + ".jsonl"), "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes), {len(lines)} prompts")
    return {"arch": arch, "hidden": hidden, "ff": ff, "heads": heads, "kv_heads": kv, "head_dim": head_dim, "layers": layers,
            "vocab": vocab, "matrix_type": mtype.name, "embedding_type": etype.name,
            "output_type": otype.name if otype is not None else "tied", "bytes": os.path.getsize(path)}


def write_pretokenize():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_golden import CORPUS  # the tokenizer corpus of the default model's golden files
    split = pre_tokenizers.Split(Regex(QWEN2_PRE_REGEX), behavior="isolated", invert=False)
    extra = ["123456 7890 x1y22", "It's 1.5kg—they'LL say\r\n\r\n  ok", "١٢٣ ٤٥ Ⅻ ½", "a\n\n\tb  \n c"]
    with open(os.path.join(OUT, "pretokenize_qwen2.jsonl"), "w", encoding="utf-8") as f:
        for text in CORPUS + extra:
            words = [w for w, _ in split.pre_tokenize_str(text)]
            f.write(json.dumps({"text": text, "words": words}, ensure_ascii=False) + "\n")
    print(f"wrote pretokenize_qwen2.jsonl: {len(CORPUS) + len(extra)} strings")


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    variants = {v[0]: make_variant(*v) for v in VARIANTS}
    write_pretokenize()
    meta = {"generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "gguf": getattr(gguf, "__version__", "unknown"), "python": sys.version.split()[0],
            "how": "tools/golden/make_arch_golden.py: seeded random weights in transformers Qwen2/Qwen3ForCausalLM (fp32, CPU) "
                   "and the same (quantized, then de-quantized for transformers) weights written with gguf-py; logits from one "
                   "forward pass per prompt, greedy tokens by argmax re-running the full sequence",
            "pre_tokenizer": "tokenizers Split(Regex(Qwen2 expression), isolated)", "variants": variants}
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
